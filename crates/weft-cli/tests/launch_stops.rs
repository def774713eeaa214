//! How `weft launch` ends: huge stop timeouts refused in one line; processes the workers started
//! and left behind stopped before the launcher exits (after success and after a failure); node 0
//! of an elastic job not waiting forever for a node whose launcher died or fell silent; and
//! workers stopped by a
//! SIGTERM or SIGINT sent to them (not to the launcher) not restarted nor signalled again.

mod common;
mod launcher;

use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::free_port;
use launcher::*;

/// The pids of the processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline.windows(marker.len()).any(|w| w == marker.as_bytes()) {
            found.push(pid);
        }
    }
    found
}

/// `60.<digits unique to this test process and call>`: a `sleep` argument that finds its
/// processes in /proc.
fn unique_seconds() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("60.{}{nanos:09}", std::process::id())
}

#[test]
fn huge_stop_timeouts_are_refused_in_one_line() {
    for v in ["1e19", "1.9e19", "31536001"] {
        refused(
            &["--nproc-per-node", "2", "--stop-timeout", v, "--", "false"],
            &[],
            &format!(
                "--stop-timeout {} is above the limit of 31536000 s (a year)",
                v.parse::<f64>().unwrap()
            ),
        );
    }
    refused(
        &["--rdzv-last-call", "1e10", "--", "true"],
        &[],
        "--rdzv-last-call 10000000000 is above the limit of 31536000 s (a year)",
    );
    refused(
        &["--nnodes", "2", "--master-port", "0", "--", "true"],
        &[("WEFT_JOB_TOKEN", "tok-port-0")],
        "--master-port 0 with --nnodes above 1",
    );
}

#[test]
fn processes_left_behind_by_the_workers_are_stopped() {
    for code in [0, 1] {
        let seconds = unique_seconds();
        let script = format!("sleep {seconds} & echo started; exit {code}");
        let r = run(sh_job(&["--nproc-per-node", "2", "--stop-timeout", "20"], &script, &[]));
        let left = processes_with(&seconds);
        for &pid in &left {
            // SAFETY: kill has no memory effects; these are the test's own leftovers.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        assert_eq!(r.code, Some(code), "{}", r.show());
        assert!(
            left.is_empty(),
            "worker exit {code}: left behind {left:?}\n{}",
            r.show()
        );
        // stopped with SIGTERM, not waited out
        assert!(r.elapsed < Duration::from_secs(15), "{}", r.show());
        assert!(r.stderr.contains("left processes running in"), "{}", r.show());
    }
}

#[test]
fn node_0_does_not_wait_for_a_node_whose_launcher_died() {
    node_0_with_node_1_ended(
        |b| {
            b.kill().unwrap();
            b.wait().unwrap();
        },
        // the default: a loaded machine cannot delay node 1's heartbeats past it
        "60",
        "went away (its launcher's connection to the store closed)",
    );
}

#[test]
fn node_0_does_not_wait_for_a_node_that_fell_silent() {
    // a stopped launcher keeps its connection open, as a node cut off the network does
    let r = node_0_with_node_1_ended(
        |b| {
            // SAFETY: kill has no memory effects; b is this test's child
            unsafe { libc::kill(b.id() as i32, libc::SIGSTOP) };
        },
        "3",
        // (the round numbers nodes in the order they joined: the stopped one may be node 0)
        "of rendezvous round 0 has not been heard from for 3 s (its launcher says it is alive every 0.6 s",
    );
    assert!(r.elapsed < Duration::from_secs(45), "{}", r.show());
}

#[test]
fn heartbeat_timeouts_out_of_range_are_refused() {
    refused(
        &["--rdzv-heartbeat-timeout", "0.5", "--", "true"],
        &[],
        "--rdzv-heartbeat-timeout 0.5 is below the shortest, 1 s",
    );
    refused(
        &["--rdzv-heartbeat-timeout", "1e10", "--", "true"],
        &[],
        "--rdzv-heartbeat-timeout 10000000000 is above the limit of 31536000 s (a year)",
    );
}

/// A two-node elastic job (heartbeat timeout `heartbeat_timeout` seconds) whose node 0 is done
/// at once while node 1's worker would run a minute; `end` ends node 1's launcher once it is in
/// the round. Node 0 must exit 1 saying `why`, and node 1's worker be gone.
fn node_0_with_node_1_ended(end: impl FnOnce(&mut std::process::Child), heartbeat_timeout: &str, why: &str) -> Run {
    let flags = ["--rdzv-last-call", "60", "--rdzv-heartbeat-timeout", heartbeat_timeout];
    two_nodes_with_node_1_ended(|_| "exit 0".into(), &flags, end, 1, why)
}

/// While both nodes' workers run, node 1's launcher stops (SIGSTOP, as a node cut off the
/// network): node 0's launcher notices its silence within the heartbeat timeout, stops its own
/// workers and goes on alone in the next round (before, its workers' collectives would have
/// waited out WEFT_DIST_TIMEOUT, and workers that do not talk to node 1 waited forever).
#[test]
fn a_node_that_falls_silent_while_the_workers_run_is_left_behind() {
    let r = two_nodes_with_node_1_ended(
        |seconds| format!("if [ \"$WEFT_RESTART_COUNT\" = 1 ]; then exit 0; fi; exec sleep {seconds}"),
        &[
            // long enough for node 1 to join round 0 on a loaded machine (node 0 goes on alone
            // in round 1 after it)
            "--rdzv-last-call",
            "10",
            "--rdzv-heartbeat-timeout",
            "3",
            "--max-restarts",
            "1",
        ],
        |b| {
            // SAFETY: kill has no memory effects; b is this test's child
            unsafe { libc::kill(b.id() as i32, libc::SIGSTOP) };
        },
        0,
        "of rendezvous round 0 has not been heard from for 3 s",
    );
    assert!(
        r.stderr.contains("restarting all workers: rendezvous round 1"),
        "{}",
        r.show()
    );
    assert!(r.stderr.contains("rendezvous round 1: 1 node(s)"), "{}", r.show());
    assert!(r.elapsed < Duration::from_secs(60), "{}", r.show());
}

/// A two-node elastic job (`flags` added to each launcher's) whose node 0 runs
/// `node0_script(seconds)` and node 1 `exec sleep <seconds>` (a minute, and a marker to find the
/// process by); `end` ends node 1's launcher once it is in the round. Node 0 must exit
/// `expect_code` saying `why`, and the workers of both be gone.
fn two_nodes_with_node_1_ended(
    node0_script: impl Fn(&str) -> String,
    flags: &[&str],
    end: impl FnOnce(&mut std::process::Child),
    expect_code: i32,
    why: &str,
) -> Run {
    let port = free_port().to_string();
    let seconds = unique_seconds();
    let node = |rank: &str, script: &str| {
        let mut cmd = launcher();
        cmd.args(["--nnodes", "1:2", "--node-rank", rank, "--master-port", &port])
            .args(["--stop-timeout", "2"])
            .args(flags)
            .args(["--", "sh", "-c", script])
            .env("WEFT_JOB_TOKEN", "tok-dead-node");
        cmd.spawn().expect("weft launch starts")
    };
    let started = Instant::now();
    let mut a = node("0", &node0_script(&seconds));
    let mut b = node("1", &format!("exec sleep {seconds}"));
    let (a_out, a_err) = (reader(a.stdout.take().unwrap()), reader(a.stderr.take().unwrap()));
    let _b_out = reader(b.stdout.take().unwrap());
    let (tx, b_lines) = mpsc::channel();
    let b_err = b.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(b_err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // node 1 is in the round (which closes once both joined): its launcher is then killed
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|l: &String| l.contains("rendezvous round 0: 2 node(s)"))
    {
        match b_lines.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => seen.push(l),
            Err(_) => {
                let _ = (a.kill(), b.kill(), a.wait(), b.wait());
                panic!("node 1 never joined: {seen:?}");
            }
        }
    }
    end(&mut b);
    let r = finish(a, started, a_out, a_err);
    let _ = (b.kill(), b.wait());
    assert_eq!(r.code, Some(expect_code), "{}", r.show());
    assert!(r.stderr.contains(why), "{}", r.show());
    // node 0's workers were stopped or done; node 1's died with its launcher
    assert!(
        common::wait_for(10, || processes_with(&seconds).is_empty()),
        "{}",
        r.show()
    );
    r
}

/// A 2-rank job whose rank 1 ends with `rank1` (having marked that it got there) while rank 0,
/// as a worker writing its stop checkpoint, ends a moment later with exit code `code0`; rank 0
/// marks any SIGTERM it gets. Returns the run and whether rank 0 got a SIGTERM.
fn stopping_job(rank1: &str, code0: i32) -> (Run, bool) {
    let dir = TempDir::new("stopped");
    let script = format!(
        "if [ \"$RANK\" = 1 ]; then touch \"$MARK_DIR/r1\"; {rank1}; fi; \
         trap 'touch \"$MARK_DIR/term\"; exit 9' TERM; \
         while [ ! -e \"$MARK_DIR/r1\" ]; do sleep 0.05; done; sleep 0.5; exit {code0}"
    );
    let mut cmd = sh_job(
        &["--nproc-per-node", "2", "--max-restarts", "1", "--stop-timeout", "30"],
        &script,
        &[],
    );
    cmd.env("MARK_DIR", &dir.0);
    let r = run(cmd);
    let got_term = dir.0.join("term").exists();
    (r, got_term)
}

#[test]
fn workers_stopped_by_a_signal_sent_to_them_are_neither_restarted_nor_signalled_again() {
    for (rank1, code0, want) in [
        // a clean stop on SIGTERM, as `weft train`'s, and one on SIGINT
        ("exit 143", 143, 143),
        ("exit 130", 130, 130),
        // a program killed by the SIGTERM itself
        ("kill -TERM $$", 143, 143),
        // rank 0 fails once rank 1 is gone (its collective would): no restart either
        ("exit 143", 1, 143),
    ] {
        let (r, got_term) = stopping_job(rank1, code0);
        assert_eq!(r.code, Some(want), "{rank1}: {}", r.show());
        assert!(!got_term, "{rank1}: rank 0 got a SIGTERM while stopping\n{}", r.show());
        assert!(!r.stderr.contains("restarting"), "{rank1}: {}", r.show());
        // (rank 0 also stops on the signal's code in the first three: on a loaded machine the
        // launcher may first look after both have ended, and name either)
        let named = if code0 == 1 {
            "weft launch: rank 1 stopped on SIG"
        } else {
            "stopped on SIG"
        };
        assert!(
            r.stderr.contains(named) && r.stderr.contains("not restarted"),
            "{rank1}: {}",
            r.show()
        );
        if code0 == 1 {
            assert!(r.stderr.contains("also ended: rank 0 (exit code 1)"), "{}", r.show());
        }
    }
}
