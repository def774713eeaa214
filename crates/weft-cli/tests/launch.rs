//! `weft launch` end to end: the variables each worker gets, prefixed output, failure reports
//! (and the error files that name the rank that caused a failure), restarts, bad flags, and two
//! "nodes" on one machine. Workers are `sh -c` scripts (and `weft check collectives` where a real
//! rendezvous is needed). Signals and the limit on workers are in `launch_signals.rs`.

mod common;
mod launcher;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::free_port;
use launcher::*;

#[test]
fn workers_get_their_variables() {
    for n in [2usize, 4] {
        let r = run(sh_job(&["--nproc-per-node", &n.to_string()], ENV_SCRIPT, &[]));
        assert_eq!(r.code, Some(0), "{}", r.show());
        let env = env_by_rank(&r.stdout);
        assert_eq!(env.len(), n, "{}", r.show());
        let (port, token) = (&env[&0]["MASTER_PORT"], &env[&0]["WEFT_JOB_TOKEN"]);
        assert!(port.parse::<u16>().unwrap() > 0, "{}", r.show());
        assert!(!token.is_empty(), "{}", r.show());
        for (rank, v) in &env {
            let want = [
                ("LOCAL_RANK", rank.to_string()),
                ("WORLD_SIZE", n.to_string()),
                ("LOCAL_WORLD_SIZE", n.to_string()),
                ("GROUP_RANK", "0".into()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.clone()),
                ("WEFT_JOB_TOKEN", token.clone()),
                ("WEFT_LAUNCHED", "1".into()),
                ("WEFT_RESTART_COUNT", "0".into()),
                // not set: each weft worker divides the cores by LOCAL_WORLD_SIZE itself
                ("WEFT_NUM_THREADS", String::new()),
            ];
            for (k, val) in want {
                assert_eq!(v[k], val, "rank {rank}, {k}\n{}", r.show());
            }
        }
        // an error file each, in one private folder that is gone once the launcher is
        let files: Vec<PathBuf> = (0..n)
            .map(|rank| PathBuf::from(&env[&rank]["WEFT_ERROR_FILE"]))
            .collect();
        let folder = files[0].parent().unwrap().to_path_buf();
        assert!(folder.is_absolute(), "{}", r.show());
        for (rank, f) in files.iter().enumerate() {
            assert_eq!(f.parent(), Some(folder.as_path()), "{}", r.show());
            assert!(files[..rank].iter().all(|g| g != f), "{}", r.show());
        }
        assert!(!folder.exists(), "{} was left behind", folder.display());
    }
}

#[test]
fn token_port_and_threads_from_the_launcher_are_passed_on() {
    let port = free_port().to_string();
    let r = run(sh_job(
        &["--nproc-per-node", "2", "--master-port", &port],
        ENV_SCRIPT,
        &[("WEFT_JOB_TOKEN", "tok-from-env"), ("WEFT_NUM_THREADS", "7")],
    ));
    assert_eq!(r.code, Some(0), "{}", r.show());
    let env = env_by_rank(&r.stdout);
    assert_eq!(env.len(), 2, "{}", r.show());
    for v in env.values() {
        assert_eq!(v["WEFT_JOB_TOKEN"], "tok-from-env");
        assert_eq!(v["WEFT_NUM_THREADS"], "7");
        assert_eq!(v["MASTER_PORT"], port);
    }
}

#[test]
fn output_is_forwarded_whole_lines_with_a_rank_prefix() {
    let script = "i=0; while [ $i -lt 200 ]; do echo \"out $i of rank $RANK\"; echo \"err $i of rank $RANK\" >&2; \
                  i=$((i+1)); done; printf 'bad \\377\\376 bytes\\n'; printf 'no newline'";
    let r = run(sh_job(&["--nproc-per-node", "2"], script, &[]));
    assert_eq!(r.code, Some(0), "{}", r.show());
    assert!(!r.stderr.contains("panicked"), "{}", r.show());
    for (text, stream) in [(&r.stdout, "out"), (&r.stderr, "err")] {
        let mut counts = [0usize; 2];
        for line in text.lines() {
            let (prefix, rest) = line
                .split_once("]: ")
                .unwrap_or_else(|| panic!("unprefixed line {line:?}"));
            let rank: usize = prefix.strip_prefix("[rank").unwrap().parse().unwrap();
            if stream == "out" && (rest == "bad \u{FFFD}\u{FFFD} bytes" || rest == "no newline") {
                continue;
            }
            let words: Vec<&str> = rest.split(' ').collect();
            assert_eq!(words.len(), 5, "torn line {line:?}");
            assert_eq!(words[0], stream, "{line:?}");
            assert_eq!(words[4], rank.to_string(), "{line:?} under the wrong prefix");
            counts[rank] += 1;
        }
        assert_eq!(counts, [200, 200], "{stream}:\n{}", r.show());
    }
    for rank in 0..2 {
        for tail in ["bad \u{FFFD}\u{FFFD} bytes", "no newline"] {
            assert!(r.stdout.contains(&format!("[rank{rank}]: {tail}\n")), "{}", r.show());
        }
    }
}

#[test]
fn a_failing_rank_stops_the_others_and_is_reported() {
    let script = "if [ \"$RANK\" = 1 ]; then echo 'first words' >&2; echo 'last words of rank 1' >&2; exit 3; fi; \
                  sleep 60";
    let r = run(sh_job(&["--nproc-per-node", "2"], script, &[]));
    assert_eq!(r.code, Some(1), "{}", r.show());
    // rank 0 sleeps 60 s: it must have been stopped
    assert!(r.elapsed < Duration::from_secs(40), "{}", r.show());
    let report = r
        .stderr
        .lines()
        .find(|l| l.contains("failed first"))
        .unwrap_or_else(|| panic!("no report\n{}", r.show()));
    assert!(
        report.contains("rank 1 ") && report.contains("exit code 3") && report.contains("pid "),
        "{report}"
    );
    let after = &r.stderr[r.stderr.find("failed first").unwrap()..];
    assert!(after.contains("    last words of rank 1"), "{}", r.show());
    assert!(after.contains("stopped by the launcher: rank 0"), "{}", r.show());
}

#[test]
fn a_rank_killed_by_a_signal_is_reported_with_the_signal() {
    let script = "if [ \"$RANK\" = 1 ]; then kill -9 $$; fi; sleep 60";
    let r = run(sh_job(&["--nproc-per-node", "2"], script, &[]));
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert!(r.elapsed < Duration::from_secs(40), "{}", r.show());
    assert!(
        r.stderr
            .lines()
            .any(|l| l.contains("rank 1 ") && l.contains("killed by signal 9 (SIGKILL)")),
        "{}",
        r.show()
    );
}

#[test]
fn error_files_name_the_rank_that_caused_the_failure() {
    // rank 1 writes that it failed on its own, then takes its time to exit; rank 0 then writes
    // that rank 1 failed it, and exits at once: first, so exit order alone would blame it
    let dir = TempDir::new("error-files");
    let script = "record() { printf '{\"rank\":%s,\"time\":%s,\"message\":\"%s\",\"caused_by\":%s}' \"$RANK\" \
                  \"$(date +%s.%N)\" \"$1\" \"$2\" > \"$WEFT_ERROR_FILE\"; }; \
                  if [ \"$RANK\" = 1 ]; then record 'disk full' null; touch \"$MARK_DIR/written\"; sleep 1; exit 4; fi; \
                  while [ ! -e \"$MARK_DIR/written\" ]; do sleep 0.05; done; record 'rank 1 gave up' 1; exit 3";
    let mut cmd = sh_job(&["--nproc-per-node", "2", "--stop-timeout", "5"], script, &[]);
    cmd.env("MARK_DIR", &dir.0);
    let r = run(cmd);
    assert_eq!(r.code, Some(1), "{}", r.show());
    let report = r
        .stderr
        .lines()
        .find(|l| l.contains("job failed"))
        .unwrap_or_else(|| panic!("no report\n{}", r.show()));
    assert!(
        report.contains("job failed: rank 1 (local rank 1 on node 0, pid ") && report.contains("caused the failure"),
        "{}",
        r.show()
    );
    // what rank 1 wrote to its error file is in the report, and rank 0 is still listed
    assert!(
        r.stderr.contains("weft launch: rank 1's error: disk full"),
        "{}",
        r.show()
    );
    assert!(
        r.stderr
            .contains("also failed: rank 0 (exit code 3, because of rank 1)"),
        "{}",
        r.show()
    );
}

#[test]
fn workers_that_ignore_sigterm_are_killed_after_the_stop_timeout() {
    // rank 0 (and its sleep) ignore SIGTERM: only the SIGKILL after --stop-timeout ends them;
    // rank 1 fails once rank 0 has set that up
    let dir = TempDir::new("stop-timeout");
    let script = "if [ \"$RANK\" = 1 ]; then while [ ! -e \"$MARK_DIR/ignoring\" ]; do sleep 0.1; done; exit 3; fi; \
                  trap '' TERM; touch \"$MARK_DIR/ignoring\"; sleep 60";
    let mut cmd = sh_job(&["--nproc-per-node", "2", "--stop-timeout", "1"], script, &[]);
    cmd.env("MARK_DIR", &dir.0);
    let r = run(cmd);
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert!(r.elapsed < Duration::from_secs(40), "{}", r.show());
    assert!(
        r.stderr
            .contains("rank 0 still running 1 s after SIGTERM; killing (SIGKILL)"),
        "{}",
        r.show()
    );
    assert!(r.stderr.contains("exit code 3"), "{}", r.show());
}

#[test]
fn max_restarts_starts_all_workers_again() {
    let script = "echo \"attempt $WEFT_RESTART_COUNT\"; if [ \"$WEFT_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then \
                  exit 5; fi; if [ \"$WEFT_RESTART_COUNT\" = 0 ]; then sleep 60; fi; echo \"ok $RANK $WEFT_RESTART_COUNT\"";
    let r = run(sh_job(&["--nproc-per-node", "2", "--max-restarts", "1"], script, &[]));
    assert_eq!(r.code, Some(0), "{}", r.show());
    // rank 0 may be stopped before it prints anything on the first attempt
    assert!(r.stdout.contains("[rank1]: attempt 0\n"), "{}", r.show());
    for rank in 0..2 {
        assert!(r.stdout.contains(&format!("[rank{rank}]: attempt 1\n")), "{}", r.show());
        assert!(
            r.stdout.contains(&format!("[rank{rank}]: ok {rank} 1\n")),
            "{}",
            r.show()
        );
    }
    let line = r.stderr.lines().find(|l| l.contains("restarting")).unwrap_or("");
    assert!(
        line.contains("rank 1") && line.contains("exit code 5") && line.contains("attempt 2 of 2"),
        "{}",
        r.show()
    );

    // a rank that always fails: one restart, then the report
    let r = run(sh_job(
        &["--nproc-per-node", "2", "--max-restarts", "1"],
        "[ \"$RANK\" = 0 ] || exit 4",
        &[],
    ));
    assert_eq!(r.code, Some(1), "{}", r.show());
    assert_eq!(r.stderr.matches("restarting").count(), 1, "{}", r.show());
    assert!(
        r.stderr.contains("exit code 4") && r.stderr.contains("after 1 restart"),
        "{}",
        r.show()
    );
}

#[test]
fn a_missing_program_is_one_clear_error() {
    refused(
        &[
            "--nproc-per-node",
            "2",
            "--",
            "/nonexistent/weft-no-such-program",
            "--flag",
        ],
        &[],
        "/nonexistent/weft-no-such-program",
    );
    refused(&["--nproc-per-node", "2"], &[], "no worker program");
}

#[test]
fn bad_flags_are_refused() {
    let tok = [("WEFT_JOB_TOKEN", "tok-flags")];
    refused(
        &["--nnodes", "2", "--node-rank", "2", "--", "true"],
        &tok,
        "--node-rank 2",
    );
    refused(&["--nproc-per-node", "0", "--", "true"], &[], "--nproc-per-node");
    refused(&["--nnodes", "0", "--", "true"], &[], "--nnodes");
    refused(&["--nnodes", "2:1", "--", "true"], &[], "1 <= MIN <= MAX");
    refused(&["--rdzv-last-call=-1", "--", "true"], &[], "--rdzv-last-call");
    refused(&["--nnodes", "2", "--", "true"], &[], "WEFT_JOB_TOKEN");
    refused(&["--stop-timeout=-1", "--", "true"], &[], "--stop-timeout");
}

#[test]
fn two_nodes_on_one_machine() {
    let port = free_port().to_string();
    let node = |rank: &str, script: Option<&str>| {
        let mut cmd = launcher();
        cmd.args(["--nnodes", "2", "--node-rank", rank, "--nproc-per-node", "2"])
            .args(["--master-port", &port, "--"])
            .env("WEFT_JOB_TOKEN", "tok-two-nodes")
            .env("WEFT_DIST_TIMEOUT", "60");
        match script {
            Some(s) => cmd.args(["sh", "-c", s]),
            None => cmd.args([WEFT, "check", "collectives", "--sizes", "1,1000"]),
        };
        let started = Instant::now();
        let mut child = cmd.spawn().expect("weft launch starts");
        let out = reader(child.stdout.take().unwrap());
        let err = reader(child.stderr.take().unwrap());
        (child, started, out, err)
    };
    // the variables: global ranks node * 2 + local
    let (a, b) = (node("0", Some(ENV_SCRIPT)), node("1", Some(ENV_SCRIPT)));
    let runs = [finish(a.0, a.1, a.2, a.3), finish(b.0, b.1, b.2, b.3)];
    for (n, r) in runs.iter().enumerate() {
        assert_eq!(r.code, Some(0), "node {n}: {}", r.show());
        let env = env_by_rank(&r.stdout);
        assert_eq!(env.len(), 2, "node {n}: {}", r.show());
        for local in 0..2 {
            let v = &env[&(n * 2 + local)];
            assert_eq!(v["LOCAL_RANK"], local.to_string());
            assert_eq!(v["GROUP_RANK"], n.to_string());
            assert_eq!(v["WORLD_SIZE"], "4");
            assert_eq!(v["LOCAL_WORLD_SIZE"], "2");
            assert_eq!(v["MASTER_PORT"], port);
            assert_eq!(v["WEFT_JOB_TOKEN"], "tok-two-nodes");
        }
    }
    // a real rendezvous: node 1's workers meet node 0's through the store node 0's launcher serves
    let (a, b) = (node("0", None), node("1", None));
    let runs = [finish(a.0, a.1, a.2, a.3), finish(b.0, b.1, b.2, b.3)];
    for (n, r) in runs.iter().enumerate() {
        assert_eq!(r.code, Some(0), "node {n}: {}", r.show());
        for local in 0..2 {
            let rank = n * 2 + local;
            assert!(
                r.stdout.contains(&format!("[rank{rank}]: rank {rank} of 4: ")),
                "{}",
                r.show()
            );
        }
    }
}

#[test]
fn two_nodes_restart_together() {
    let port = free_port().to_string();
    // rank 3 (node 1's second worker) fails in the first attempt only; every worker prints its
    // variables
    let script = format!("{ENV_SCRIPT}; if [ \"$RANK$WEFT_RESTART_COUNT\" = 30 ]; then exit 3; fi; sleep 0.5");
    let node = |rank: &str| {
        let mut cmd = launcher();
        cmd.args(["--nnodes", "2", "--node-rank", rank, "--nproc-per-node", "2"])
            .args([
                "--master-port",
                &port,
                "--max-restarts",
                "1",
                "--stop-timeout",
                "1",
                "--",
            ])
            .args(["sh", "-c", &script])
            .env("WEFT_JOB_TOKEN", "tok-restart-together");
        let started = Instant::now();
        let mut child = cmd.spawn().expect("weft launch starts");
        let out = reader(child.stdout.take().unwrap());
        let err = reader(child.stderr.take().unwrap());
        (child, started, out, err)
    };
    let (a, b) = (node("0"), node("1"));
    let runs = [finish(a.0, a.1, a.2, a.3), finish(b.0, b.1, b.2, b.3)];
    for r in &runs {
        assert_eq!(r.code, Some(0), "{}", r.show());
        assert!(
            r.stderr.contains("restarting all workers: rendezvous round 1"),
            "{}",
            r.show()
        );
        assert!(r.stderr.contains("rendezvous round 1: 2 node(s)"), "{}", r.show());
        // the second attempt's variables: both nodes again, restart count 1
        let mut second: Vec<usize> = r
            .stdout
            .lines()
            .filter(|l| l.contains("WEFT_RESTART_COUNT=1"))
            .map(|l| {
                assert!(l.contains("WORLD_SIZE=4"), "{l}");
                l.split("RANK=")
                    .nth(1)
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        second.sort();
        assert_eq!(second.len(), 2, "{}", r.show());
    }
    assert!(
        runs.iter().any(|r| r.stderr.contains("rank 3 on node")),
        "{}\n{}",
        runs[0].show(),
        runs[1].show()
    );
}
