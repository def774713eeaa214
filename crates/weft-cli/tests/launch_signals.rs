//! `weft launch` and signals: SIGTERM forwarded to the workers, SIGTERM while the workers are
//! still being started (every one started is stopped, none is left), a signal while an elastic
//! node waits for the store, and the limit on workers checked before any starts.

mod common;
mod launcher;

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::free_port;
use launcher::*;

#[test]
fn more_workers_than_one_launcher_can_run_are_refused_at_once() {
    let r = refused(
        &["--nproc-per-node", "100000", "--", "true"],
        &[],
        "--nproc-per-node 100000 is above the limit of ",
    );
    // the limit is 1024 unless `ulimit -n` or `ulimit -u` leave room for fewer
    assert!(r.stderr.contains("1024") || r.stderr.contains("ulimit"), "{}", r.show());
    assert!(r.elapsed < Duration::from_secs(10), "{}", r.show());
}

#[test]
fn sigterm_to_the_launcher_is_forwarded_to_the_workers() {
    let dir = TempDir::new("sigterm");
    let script = "trap 'touch \"$MARK_DIR/term.$RANK\"; exit 0' TERM; echo ready; sleep 60 & wait";
    let mut cmd = sh_job(&["--nproc-per-node", "2"], script, &[]);
    cmd.env("MARK_DIR", &dir.0);
    let started = Instant::now();
    let mut child = cmd.spawn().expect("weft launch starts");
    let err = reader(child.stderr.take().unwrap());
    // read stdout line by line until both ranks are ready, then collect the rest
    let (tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    while !(seen.contains(&"[rank0]: ready".to_string()) && seen.contains(&"[rank1]: ready".to_string())) {
        match lines.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => seen.push(l),
            Err(_) => {
                let _ = child.kill();
                panic!("workers not ready: {seen:?}");
            }
        }
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let (tx2, out) = mpsc::channel();
    std::thread::spawn(move || {
        let rest: Vec<String> = lines.iter().collect();
        let _ = tx2.send(rest.join("\n").into_bytes());
    });
    let r = finish(child, started, out, err);
    assert_eq!(r.code, Some(143), "{}", r.show());
    for rank in 0..2 {
        assert!(
            dir.0.join(format!("term.{rank}")).exists(),
            "rank {rank} did not get SIGTERM\n{}",
            r.show()
        );
    }
    assert!(r.stderr.contains("SIGTERM"), "{}", r.show());
}

/// Whether `pid` is stopped (SIGSTOP), by /proc.
fn is_stopped(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // the state follows the command name's closing parenthesis
    stat.rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
}

/// The processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline.windows(marker.len()).any(|w| w == marker.as_bytes()) {
            found.push(format!(
                "{name}: {}",
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            ));
        }
    }
    found
}

/// Sends `sig` to `pid`.
fn signal(pid: u32, sig: i32) {
    // SAFETY: kill has no memory effects; the pid is our own child.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0, "kill({pid}, {sig})");
}

#[test]
fn sigterm_while_the_workers_start_stops_those_started() {
    // 200 workers of `sleep 60.<digits unique to this test>`, which finds them in /proc later
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let seconds = format!("60.{}{nanos:09}", std::process::id());
    let mut cmd = launcher();
    cmd.args([
        "--nproc-per-node",
        "200",
        "--stop-timeout",
        "5",
        "--",
        "sleep",
        &seconds,
    ]);
    let started = Instant::now();
    let mut child = cmd.spawn().expect("weft launch starts");
    let out = reader(child.stdout.take().unwrap());
    let err = reader(child.stderr.take().unwrap());
    let pid = child.id();
    // the signal lands while the workers are being started whatever the machine's speed: the
    // launcher is frozen (SIGSTOP) as soon as its first worker exists, signalled, and thawed
    let children = format!("/proc/{pid}/task/{pid}/children");
    while std::fs::read_to_string(&children).unwrap_or_default().trim().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(60), "no worker started");
        std::thread::sleep(Duration::from_micros(200));
    }
    signal(pid, libc::SIGSTOP);
    while !is_stopped(pid) {
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(pid, libc::SIGTERM);
    let signalled = Instant::now();
    signal(pid, libc::SIGCONT);
    let r = finish(child, started, out, err);
    assert_eq!(r.code, Some(143), "{}", r.show());
    // the stop timeout is 5 s, and `sleep` exits on SIGTERM at once
    assert!(signalled.elapsed() < Duration::from_secs(20), "{}", r.show());
    let line = r
        .stderr
        .lines()
        .find(|l| l.contains("received SIGTERM while starting the workers ("))
        .unwrap_or_else(|| panic!("the launcher started every worker first\n{}", r.show()));
    let count: usize = line
        .split('(')
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(count < 200, "{line}");
    // every worker it started is gone
    let left = processes_with(&seconds);
    assert!(left.is_empty(), "left behind: {left:?}\n{}", r.show());
}

#[test]
fn a_signal_while_waiting_for_the_store_ends_the_launcher() {
    // node 1 of an elastic job whose node 0 never comes: it waits for the store
    let port = free_port().to_string();
    let mut cmd = launcher();
    cmd.args([
        "--nnodes",
        "1:2",
        "--node-rank",
        "1",
        "--master-port",
        &port,
        "--",
        "true",
    ])
    .env("WEFT_JOB_TOKEN", "tok-no-store");
    let started = Instant::now();
    let mut child = cmd.spawn().expect("weft launch starts");
    let out = reader(child.stdout.take().unwrap());
    let err = reader(child.stderr.take().unwrap());
    std::thread::sleep(Duration::from_millis(1500));
    signal(child.id(), libc::SIGTERM);
    let signalled = Instant::now();
    let r = finish(child, started, out, err);
    assert_eq!(r.code, Some(143), "{}", r.show());
    assert!(signalled.elapsed() < Duration::from_secs(10), "{}", r.show());
    assert!(
        r.stderr.contains("received SIGTERM while waiting for the store"),
        "{}",
        r.show()
    );
}
