//! `weft pipeline` stopped by a signal: SIGTERM is passed on to each step's process group and
//! the pipeline says how to go on; after SIGKILL the step processes it started get SIGTERM from
//! the kernel.

mod common;

use common::{alive, pids_with, temp_dir};

/// A signal to a running pipeline stops its step processes: SIGTERM is passed on to each step's
/// process group (a command's shell and what it started) and the pipeline says how to go on;
/// after SIGKILL, which it cannot catch, its step processes get SIGTERM from the kernel. Both
/// ran on, unsupervised, before.
#[test]
fn a_signal_to_the_pipeline_stops_its_steps() {
    use std::io::{BufRead, BufReader};
    for (sig, name) in [(libc::SIGTERM, "term"), (libc::SIGKILL, "kill")] {
        let dir = temp_dir(&format!("pipeline-signal-{name}"));
        let runs = dir.join("runs");
        // durations no other process uses: they name this test's processes
        let nested = format!("{}.{}1", 60 + sig, std::process::id());
        let bare = format!("{}.{}2", 60 + sig, std::process::id());
        let text = format!(
            "[[step]]\nname = \"nested\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"sleep {nested}; true\"]\n\n\
             [[step]]\nname = \"bare\"\nkind = \"command\"\nargv = [\"sleep\", \"{bare}\"]\n"
        );
        let file = dir.join("slow.toml");
        std::fs::write(&file, text).unwrap();
        let mut pipeline = common::weft_command(&["pipeline", "run", file.to_str().unwrap()])
            .env("WEFT_TRACK_DIR", &runs)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let since = std::time::Instant::now();
        let started = |d: &str| pids_with(d).into_iter().any(alive);
        while !(started(&nested) && started(&bare)) {
            assert!(
                since.elapsed() < std::time::Duration::from_secs(30),
                "the steps did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        // SAFETY: kill with the pid of a child this test started and has not reaped.
        unsafe { libc::kill(pipeline.id() as i32, sig) };
        let since = std::time::Instant::now();
        while pipeline.try_wait().unwrap().is_none() {
            assert!(
                since.elapsed() < std::time::Duration::from_secs(30),
                "signal {sig}: the pipeline still runs"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        if sig == libc::SIGKILL {
            // what a step process started holds the pipeline's output open
            for p in pids_with(&nested) {
                // SAFETY: kill of a leftover this test's pipeline started
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
        let mut stdout = Vec::new();
        BufReader::new(pipeline.stdout.take().unwrap())
            .lines()
            .for_each(|l| stdout.push(l.unwrap_or_default()));
        let out = pipeline.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if sig == libc::SIGTERM {
            assert_eq!(out.status.code(), Some(1), "{stdout:?}\n{stderr}");
            assert!(stdout.iter().any(|l| l.contains("stopping on signal 15")), "{stdout:?}");
            assert!(stderr.contains("stopped by signal 15"), "{stderr}");
            assert!(stderr.contains("goes on"), "{stderr}");
        }
        // SIGKILL reaches the step processes the pipeline started, not what they started
        let left = |d: &str| pids_with(d).into_iter().filter(|&p| alive(p)).count();
        let watched: Vec<&String> = if sig == libc::SIGTERM {
            vec![&nested, &bare]
        } else {
            vec![&bare]
        };
        let since = std::time::Instant::now();
        while watched.iter().any(|d| left(d) > 0) && since.elapsed() < std::time::Duration::from_secs(20) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        for d in watched {
            assert_eq!(left(d), 0, "signal {sig}: sleep {d} runs on after the pipeline ended");
        }
    }
}
