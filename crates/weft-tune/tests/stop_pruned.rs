//! A sweep stopped (SIGTERM to its driver) while a pruned trial is still stopping: the trial is
//! not sent a second SIGTERM (which the trainer takes as "stop now", cutting its checkpoint
//! short), the driver waits for it and records it `pruned`, and `--resume` does not run it again.
//!
//! The trials are this test binary run again as a stand-in trainer ([`fake_trial`]): it records a
//! run with the sweep's tags, logs its value as `val_loss` every step, and on SIGTERM waits for
//! the test to let it end (a file), as a trainer writing its checkpoint takes a while; a second
//! signal ends it at once, as it ends the trainer. The driver's steps are ordered by what it
//! says, not by sleeps, so the test does not depend on the machine's speed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use weft_track::{NewRun, RunWriter, Status, Store, WriterOptions};
use weft_tune::driver::{self, Plan};
use weft_tune::trials::{self, TAG_SWEEP, TAG_TRIAL};
use weft_tune::SweepSpec;

static SIGNALS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_term(sig: libc::c_int) {
    if SIGNALS.fetch_add(1, Ordering::SeqCst) > 0 {
        // a second signal: stop now, as `weft train` does
        // SAFETY: signal and raise are async-signal-safe
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

fn var(key: &str) -> String {
    std::env::var(key).unwrap_or_default()
}

/// Not a test of its own: the trial process the sweep below starts (this binary again, with
/// `FAKE_TRIAL_DIR` set). It appends its number to `starts`, makes `stopping-N` once it has
/// seen a SIGTERM and, when it ends, writes the signals it got to `signals-N`.
#[test]
fn fake_trial() {
    let Ok(dir) = std::env::var("FAKE_TRIAL_DIR") else {
        return;
    };
    let dir = PathBuf::from(dir);
    // SAFETY: the handler only touches an atomic, then signal and raise
    unsafe {
        libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t);
    }
    let n = var("FAKE_TRIAL_N");
    let x: f64 = var("FAKE_TRIAL_X").parse().unwrap();
    let mut starts = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("starts"))
        .unwrap();
    std::io::Write::write_all(&mut starts, format!("{n}\n").as_bytes()).unwrap();
    let run = NewRun {
        experiment: "exp".into(),
        name: Some(format!("s-trial-{n}")),
        params: vec![("optim.x".into(), x.to_string())],
        tags: vec![(TAG_SWEEP.into(), "s".into()), (TAG_TRIAL.into(), n.clone())],
        ..Default::default()
    };
    let options = WriterOptions {
        flush_every: Duration::from_millis(20),
        ..Default::default()
    };
    let w = RunWriter::start(&dir.join("runs"), run, options).unwrap();
    let end = |w: RunWriter, status: Status, code: i32| -> ! {
        w.end(status, None).unwrap();
        let got = SIGNALS.load(Ordering::SeqCst).to_string();
        std::fs::write(dir.join(format!("signals-{n}")), got).unwrap();
        std::process::exit(code);
    };
    for step in 1..=20 {
        w.log(step, "val_loss", x);
        std::thread::sleep(Duration::from_millis(30));
        if SIGNALS.load(Ordering::SeqCst) > 0 {
            std::fs::write(dir.join(format!("stopping-{n}")), "").unwrap();
            // "writing its checkpoint": until the test lets it end
            let release = dir.join("release");
            let since = std::time::Instant::now();
            while !release.exists() && since.elapsed() < Duration::from_secs(120) {
                std::thread::sleep(Duration::from_millis(10));
            }
            end(w, Status::Killed, 143);
        }
    }
    end(w, Status::Finished, 0);
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-tune-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn spec() -> SweepSpec {
    SweepSpec::parse(
        "[sweep]\nname = \"s\"\nexperiment = \"exp\"\nbase = \"r.toml\"\nmetric = \"val_loss\"\nmethod = \"grid\"\n\
         [sweep.parameters]\n\"optim.x\" = { values = [1.0, 5.0, 3.0] }\n\
         [sweep.pruner]\nkind = \"asha\"\nmin_steps = 2\nreduction_factor = 2\n",
        "s.toml",
        "s",
        Path::new("."),
    )
    .unwrap()
}

/// Runs the sweep of [`spec`] in `dir` (resumed or not); its lines and its result. `on_line`
/// sees each line as it is said.
fn sweep(dir: &Path, resume: bool, on_line: &mut dyn FnMut(&str)) -> (Vec<String>, Result<(), String>) {
    let spec = spec();
    let exe = std::env::current_exe().unwrap();
    let command = |n: u64, sets: &[(String, String)]| {
        let mut cmd = Command::new(&exe);
        cmd.args(["--exact", "fake_trial", "--nocapture", "--test-threads=1"])
            .env("FAKE_TRIAL_DIR", dir)
            .env("FAKE_TRIAL_N", n.to_string())
            .env("FAKE_TRIAL_X", &sets[0].1);
        cmd
    };
    let plan = Plan {
        spec: &spec,
        store_dir: dir.join("runs"),
        max_steps: 20,
        resume,
        log_dir: dir.join("runs/sweeps/s"),
        poll: Duration::from_millis(20),
        command: &command,
        base_params: Vec::new(),
    };
    let mut lines = Vec::new();
    let result = driver::run(&plan, &mut |l| {
        lines.push(l.to_string());
        on_line(l);
    });
    (lines, result.map(|_| ()).map_err(|e| e.to_string()))
}

#[test]
fn a_sweep_stopped_while_a_pruned_trial_stops_records_the_prune_and_does_not_run_it_again() {
    let dir = temp_dir("stop-pruned");
    let (lines, result) = sweep(&dir, false, &mut |line| {
        if line.starts_with("trial 1: pruned at step") {
            // the sweep is stopped while trial 1 is stopping, once it got its SIGTERM (two
            // signals sent at once can arrive as one)
            let stopping = dir.join("stopping-1");
            std::thread::spawn(move || {
                let since = std::time::Instant::now();
                while !stopping.exists() && since.elapsed() < Duration::from_secs(60) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                // SAFETY: the driver catches SIGTERM while it runs (it records it)
                unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
            });
        }
        if line.starts_with("sweep s: stopping") {
            // trial 1 may end its stop now
            std::fs::write(dir.join("release"), "").unwrap();
        }
    });
    let err = result.unwrap_err();
    assert!(
        err.contains("stopped by signal 15") && err.contains("--resume"),
        "{err}\n{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("trials 1 already stopping (pruned)")),
        "{lines:?}"
    );
    // one SIGTERM, the pruner's: it ended its stop itself, and is recorded pruned
    assert_eq!(
        std::fs::read_to_string(dir.join("signals-1")).unwrap(),
        "1",
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("trial 1: stopped (") && l.contains("marked pruned")),
        "{lines:?}"
    );
    let store = Store::open(&dir.join("runs")).unwrap();
    let t = trials::load(&store, &spec()).unwrap();
    let status: Vec<(u64, &str)> = t.iter().map(|r| (r.number, r.status.as_str())).collect();
    assert_eq!(status, [(0, "finished"), (1, "pruned")], "{lines:?}");
    drop(store);

    // resumed: trial 2 runs, trial 1 does not run again
    let (lines, result) = sweep(&dir, true, &mut |_| {});
    result.unwrap();
    assert!(lines.iter().any(|l| l.starts_with("trial 2: started")), "{lines:?}");
    let starts = std::fs::read_to_string(dir.join("starts")).unwrap();
    assert_eq!(starts, "0\n1\n2\n", "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
