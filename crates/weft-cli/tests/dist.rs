//! Multi-process tests of the communication runtime: `weft check collectives` (every collective
//! and dtype, checked element by element) under the real launcher, under Slurm's and OpenMPI's
//! variables, and with faults: a killed rank, mismatched collectives (and the launcher naming the
//! rank that caused them), a wrong token. `weft check` and `weft bench collectives` outside a
//! job, and bench sizes too large for the machine. Where the machine allows, two "hosts" in
//! network namespaces joined by a veth pair.

mod common;

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::free_port;

use weft_dist::store::StoreServer;
use weft_dist::Token;

const WEFT: &str = env!("CARGO_BIN_EXE_weft");
const SIZES: &str = "1,1000,70000";

fn launch(nproc: usize, env: &[(&str, &str)], args: &[&str]) -> Output {
    let n = nproc.to_string();
    let mut cmd = Command::new(WEFT);
    cmd.args(["launch", "--nproc-per-node", &n, "--stop-timeout", "5", "--", WEFT])
        .args(args)
        .env("WEFT_TRACK_DIR", common::test_runs_dir());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.env_remove("WEFT_NUM_THREADS");
    cmd.output().expect("weft launch runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn check_collectives_under_the_launcher() {
    for (n, shm) in [(2, "1"), (4, "1"), (2, "0")] {
        let out = launch(n, &[("WEFT_SHM", shm)], &["check", "collectives", "--sizes", SIZES]);
        let (o, e) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "n={n} shm={shm}: {o}\n{e}");
        for r in 0..n {
            assert!(
                o.contains(&format!("[rank{r}]: rank {r} of {n}: ")),
                "n={n}: rank {r} missing:\n{o}"
            );
        }
        let over = if shm == "1" {
            format!("peers: {} over shared memory", n - 1)
        } else {
            "peers: 0 over shared memory".into()
        };
        assert!(o.contains(&over), "n={n} shm={shm}:\n{o}");
        assert!(o.contains("all correct"), "{o}");
    }
}

/// Starts `n` ranks of `weft ARGS` with the variables `vars(rank)`, stderr captured.
fn spawn(n: usize, args: &[&str], vars: impl Fn(usize) -> Vec<(String, String)>) -> Vec<Child> {
    (0..n)
        .map(|r| {
            let mut cmd = Command::new(WEFT);
            cmd.args(args)
                .env("WEFT_NUM_THREADS", "1")
                .env("WEFT_TRACK_DIR", common::test_runs_dir())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for v in [
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
                "WEFT_LAUNCHED",
                "WEFT_JOB_TOKEN",
            ] {
                cmd.env_remove(v);
            }
            for (k, v) in vars(r) {
                cmd.env(k, v);
            }
            cmd.spawn().expect("weft runs")
        })
        .collect()
}

/// Variables as the launcher sets them, for a store this test serves on `port`.
fn launcher_vars(r: usize, n: usize, port: u16, token: &str) -> Vec<(String, String)> {
    [
        ("RANK", r.to_string()),
        ("WORLD_SIZE", n.to_string()),
        ("LOCAL_RANK", r.to_string()),
        ("LOCAL_WORLD_SIZE", n.to_string()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("WEFT_LAUNCHED", "1".into()),
        ("WEFT_JOB_TOKEN", token.into()),
        ("WEFT_DIST_TIMEOUT", "60".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

struct Finished {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn finish(children: Vec<Child>, limit: Duration) -> Vec<Finished> {
    let t0 = Instant::now();
    children
        .into_iter()
        .map(|mut c| {
            let status = loop {
                if let Some(s) = c.try_wait().unwrap() {
                    break s;
                }
                if t0.elapsed() > limit {
                    let _ = c.kill();
                    panic!("a rank did not finish within {limit:?}");
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let (mut o, mut e) = (String::new(), String::new());
            c.stdout.take().unwrap().read_to_string(&mut o).unwrap();
            c.stderr.take().unwrap().read_to_string(&mut e).unwrap();
            Finished {
                ok: status.success(),
                code: status.code(),
                stdout: o,
                stderr: e,
            }
        })
        .collect()
}

#[test]
fn a_killed_rank_makes_the_others_fail_fast_naming_it() {
    let token = "tok-kill";
    let server = StoreServer::start("127.0.0.1:0", Token::new(token).unwrap()).unwrap();
    let port = server.addr().port();
    let args = [
        "check",
        "collectives",
        "--sizes",
        "100",
        "--inject",
        "kill",
        "--inject-rank",
        "1",
        "--inject-at",
        "5",
    ];
    let t0 = Instant::now();
    let done = finish(
        spawn(3, &args, |r| launcher_vars(r, 3, port, token)),
        Duration::from_secs(120),
    );
    // the timeout is 60 s: failing well before it shows the death was detected, not waited out
    assert!(t0.elapsed() < Duration::from_secs(45), "took {:?}", t0.elapsed());
    assert_eq!(done[1].code, None, "rank 1 died by a signal: {}", done[1].stderr);
    for r in [0, 2] {
        let e = &done[r].stderr;
        assert!(!done[r].ok, "rank {r} should fail");
        assert!(e.contains("rank 1"), "rank {r}: {e}");
        assert!(e.contains("#5 of group 0"), "rank {r} names the operation: {e}");
    }
}

#[test]
fn mismatched_collectives_fail_on_every_rank_naming_both() {
    let token = "tok-mismatch";
    let server = StoreServer::start("127.0.0.1:0", Token::new(token).unwrap()).unwrap();
    let port = server.addr().port();
    let args = [
        "check",
        "collectives",
        "--sizes",
        "10",
        "--inject",
        "mismatch",
        "--inject-rank",
        "1",
        "--inject-at",
        "2",
    ];
    let done = finish(
        spawn(2, &args, |r| launcher_vars(r, 2, port, token)),
        Duration::from_secs(120),
    );
    for (r, d) in done.iter().enumerate() {
        assert!(!d.ok, "rank {r} should fail");
        assert!(d.stderr.contains("broadcast(f32 x 10)"), "rank {r}: {}", d.stderr);
        assert!(
            d.stderr.contains("all_reduce(max, f32 x 10) #2"),
            "rank {r}: {}",
            d.stderr
        );
    }
}

#[test]
fn a_wrong_token_is_refused_and_the_job_goes_on() {
    let token = "tok-right";
    let server = StoreServer::start("127.0.0.1:0", Token::new(token).unwrap()).unwrap();
    let port = server.addr().port();
    let args = ["check", "collectives", "--sizes", "1000"];
    let intruder = spawn(1, &args, |_| launcher_vars(0, 2, port, "tok-wrong"));
    let job = spawn(2, &args, |r| launcher_vars(r, 2, port, token));
    let bad = finish(intruder, Duration::from_secs(60));
    assert!(!bad[0].ok);
    assert!(bad[0].stderr.contains("authentication failed"), "{}", bad[0].stderr);
    for (r, d) in finish(job, Duration::from_secs(120)).iter().enumerate() {
        assert!(d.ok, "rank {r}: {}", d.stderr);
        assert!(d.stdout.contains("all correct"), "rank {r}: {}", d.stdout);
    }
}

#[test]
fn slurm_and_openmpi_ranks_start_without_the_launcher() {
    // rank 0 serves the store at MASTER_PORT
    for scheme in ["slurm", "openmpi"] {
        let port = free_port().to_string();
        let vars = |r: usize| -> Vec<(String, String)> {
            let mut v: Vec<(&str, String)> = match scheme {
                "slurm" => vec![
                    ("SLURM_PROCID", r.to_string()),
                    ("SLURM_NTASKS", "2".into()),
                    ("SLURM_LOCALID", r.to_string()),
                    ("SLURM_TASKS_PER_NODE", "2".into()),
                    ("SLURM_JOB_NODELIST", "localhost".into()),
                ],
                _ => vec![
                    ("OMPI_COMM_WORLD_RANK", r.to_string()),
                    ("OMPI_COMM_WORLD_SIZE", "2".into()),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "2".into()),
                ],
            };
            v.push(("MASTER_PORT", port.clone()));
            v.push(("WEFT_JOB_TOKEN", "tok-sched".into()));
            v.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
        };
        let done = finish(
            spawn(2, &["check", "collectives", "--sizes", "1000"], vars),
            Duration::from_secs(120),
        );
        for (r, d) in done.iter().enumerate() {
            assert!(d.ok, "{scheme} rank {r}: {}", d.stderr);
            assert!(d.stdout.contains(&format!("rank {r} of 2")), "{scheme}: {}", d.stdout);
        }
    }
}

#[test]
fn a_killed_rank_under_the_launcher_is_reported() {
    let out = launch(
        2,
        &[("WEFT_DIST_TIMEOUT", "60")],
        &[
            "check",
            "collectives",
            "--sizes",
            "10",
            "--inject",
            "kill",
            "--inject-at",
            "4",
        ],
    );
    let e = text(&out.stderr);
    assert!(!out.status.success());
    assert!(e.contains("rank 1") && e.contains("signal 9"), "{e}");
    // the killed rank wrote nothing; rank 0's error file blames it
    let report = e
        .lines()
        .find(|l| l.contains("job failed"))
        .unwrap_or_else(|| panic!("{e}"));
    assert!(
        report.contains("job failed: rank 1 (") && report.contains("killed by signal 9"),
        "{e}"
    );
}

#[test]
fn the_rank_that_gave_up_is_named_as_the_cause() {
    // rank 1 calls broadcast where the others call another collective: it finds the mismatch,
    // gives up and aborts the others, who may well exit before it does
    for n in [2usize, 3] {
        let out = launch(
            n,
            &[("WEFT_DIST_TIMEOUT", "60")],
            &["check", "collectives", "--sizes", "10", "--inject", "mismatch"],
        );
        let e = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "n={n}: {e}");
        names_rank_1_as_the_cause(&e);
        // the others are still listed: failed because of another rank (rank 1, or a rank that
        // relayed rank 1's abort), or stopped by the launcher
        let rest: Vec<&str> = e
            .lines()
            .filter(|l| l.starts_with("weft launch: also failed") || l.starts_with("weft launch: stopped by"))
            .collect();
        for r in (0..n).filter(|&r| r != 1) {
            assert!(
                rest.iter()
                    .any(|l| l.contains(&format!("rank {r} (exit code 1, because of rank "))
                        || (l.contains("stopped by") && l.contains(&r.to_string()))),
                "n={n}, rank {r}: {e}"
            );
        }
    }
}

/// Checks that the launcher's report in `stderr` names rank 1 as the rank that caused the failure.
fn names_rank_1_as_the_cause(stderr: &str) {
    let report = stderr
        .lines()
        .find(|l| l.contains("job failed"))
        .unwrap_or_else(|| panic!("no report in:\n{stderr}"));
    assert!(
        report.starts_with("weft launch: job failed: rank 1 (local rank 1 on node 0, pid ")
            && report.contains(") caused the failure: "),
        "{stderr}"
    );
}

#[test]
fn the_rank_that_gave_up_is_named_in_elastic_rounds_too() {
    // one node of an elastic job (`--nnodes 1:2`, the round closing at once with it alone)
    let port = free_port().to_string();
    let out = Command::new(WEFT)
        .env("WEFT_TRACK_DIR", common::test_runs_dir())
        .args([
            "launch",
            "--nnodes",
            "1:2",
            "--rdzv-last-call",
            "0",
            "--nproc-per-node",
            "2",
        ])
        .args(["--master-port", &port, "--stop-timeout", "5", "--", WEFT])
        .args(["check", "collectives", "--sizes", "10", "--inject", "mismatch"])
        .env("WEFT_JOB_TOKEN", "tok-elastic-cause")
        .env("WEFT_DIST_TIMEOUT", "60")
        .env_remove("WEFT_NUM_THREADS")
        .output()
        .expect("weft launch runs");
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(e.contains("rendezvous round 0: 1 node(s)"), "{e}");
    names_rank_1_as_the_cause(&e);
}

/// `weft ARGS` with no variables of a launcher, Slurm or OpenMPI.
fn outside_a_job(args: &[&str]) -> Output {
    let mut cmd = Command::new(WEFT);
    cmd.args(args)
        .env("WEFT_NUM_THREADS", "1")
        .env("WEFT_TRACK_DIR", common::test_runs_dir());
    for v in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "WEFT_LAUNCHED",
        "SLURM_PROCID",
        "OMPI_COMM_WORLD_RANK",
    ] {
        cmd.env_remove(v);
    }
    cmd.output().expect("weft runs")
}

#[test]
fn collectives_outside_a_job_say_how_to_start_them() {
    for (cmd, args) in [
        ("check collectives", vec!["check", "collectives", "--sizes", "10"]),
        (
            "bench collectives",
            vec!["bench", "collectives", "--max-bytes", "4K", "--budget-ms", "1"],
        ),
    ] {
        let out = outside_a_job(&args);
        let (o, e) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{cmd}: {o}\n{e}");
        assert!(o.is_empty(), "{cmd} printed results:\n{o}");
        assert_eq!(e.trim().lines().count(), 1, "{cmd}: {e}");
        assert!(
            e.contains(&format!(
                "start it under weft launch, e.g. `weft launch --nproc-per-node 2 -- weft {cmd}`"
            )),
            "{cmd}: {e}"
        );
    }
}

/// This machine's memory in bytes (MemTotal, MemAvailable), from /proc/meminfo.
fn meminfo() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| -> u64 {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap();
        let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib * 1024
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// The lines rank `r` wrote to the launcher's stderr.
fn lines_of(stderr: &str, r: usize) -> Vec<&str> {
    let prefix = format!("[rank{r}]: ");
    stderr.lines().filter(|l| l.starts_with(&prefix)).collect()
}

#[test]
fn bench_sizes_too_large_for_the_machine_are_refused_before_allocating() {
    // 64 GiB, or more than the machine has if it has more: refused before anything is allocated
    // (only that size is asked for, so nothing smaller runs first)
    let gib = (meminfo().0 >> 30).max(63) + 1;
    let size = format!("{gib}G");
    let out = launch(
        2,
        &[],
        &["bench", "collectives", "--min-bytes", &size, "--max-bytes", &size],
    );
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        !e.contains("memory allocation") && !e.contains("SIGABRT") && !e.contains("panicked"),
        "{e}"
    );
    let mut refused = 0;
    for r in 0..2 {
        let lines = lines_of(&e, r);
        assert!(lines.len() <= 1, "rank {r}: {lines:?}");
        if let Some(l) = lines.first() {
            assert!(
                l.starts_with(&format!("[rank{r}]: weft: error: --max-bytes {size} needs "))
                    && l.contains("bytes on this machine (2 rank(s) here")
                    && l.contains("bytes are available"),
                "{l}"
            );
            refused += 1;
        }
    }
    assert!(refused > 0, "{e}");

    // the smallest size above the largest
    let out = launch(
        2,
        &[],
        &["bench", "collectives", "--min-bytes", "1M", "--max-bytes", "4K"],
    );
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains("--min-bytes 1048576 must be positive and at most --max-bytes 4096"),
        "{e}"
    );
}

#[test]
fn the_memory_check_counts_every_rank_on_the_node() {
    // a size one rank's buffers fit in, but not two ranks' (each holds about 4.5 times it at 2
    // ranks): refused by rank 0 of a 2-rank job before it joins (a rank that went on would wait
    // for rank 1, which never comes, and fail on the timeout instead)
    let size = (meminfo().1 / 6).to_string();
    let mut cmd = Command::new(WEFT);
    cmd.args(["bench", "collectives", "--min-bytes", &size, "--max-bytes", &size]);
    for (k, v) in launcher_vars(0, 2, free_port(), "tok-memory") {
        cmd.env(k, v);
    }
    cmd.env("WEFT_DIST_TIMEOUT", "5");
    let out = cmd.output().expect("weft runs");
    let e = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(
        e.contains(&format!("--max-bytes {size} needs ")) && e.contains("(2 rank(s) here"),
        "{e}"
    );
}

/// Runs a command, returning whether it succeeded.
fn sh(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", cmd])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Two network namespaces joined by a veth pair, removed on drop.
struct TwoHosts {
    a: String,
    b: String,
}

impl TwoHosts {
    fn new() -> Option<TwoHosts> {
        let id = std::process::id() % 100_000;
        let (a, b) = (format!("wefta{id}"), format!("weftb{id}"));
        let h = TwoHosts {
            a: a.clone(),
            b: b.clone(),
        };
        let ok = sh(&format!("ip netns add {a}"))
            && sh(&format!("ip netns add {b}"))
            && sh(&format!(
                "ip link add va{id} netns {a} type veth peer name vb{id} netns {b}"
            ))
            && sh(&format!("ip -n {a} addr add 10.231.0.1/24 dev va{id}"))
            && sh(&format!("ip -n {b} addr add 10.231.0.2/24 dev vb{id}"))
            && sh(&format!("ip -n {a} link set va{id} up && ip -n {a} link set lo up"))
            && sh(&format!("ip -n {b} link set vb{id} up && ip -n {b} link set lo up"));
        ok.then_some(h)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        sh(&format!("ip netns del {}", self.a));
        sh(&format!("ip netns del {}", self.b));
    }
}

#[test]
fn two_hosts_over_a_veth_pair() {
    let Some(hosts) = TwoHosts::new() else {
        eprintln!("skipped: network namespaces need root and `ip netns` (not available here)");
        return;
    };
    let node = |ns: &str, rank: usize| {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                WEFT,
                "launch",
                "--nnodes",
                "2",
                "--node-rank",
                &rank.to_string(),
            ])
            .args([
                "--nproc-per-node",
                "2",
                "--master-addr",
                "10.231.0.1",
                "--master-port",
                "29611",
                "--",
            ])
            .args([WEFT, "check", "collectives", "--sizes", SIZES])
            .env("WEFT_JOB_TOKEN", "tok-netns")
            .env("WEFT_DIST_TIMEOUT", "60")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ip netns exec runs")
    };
    let done = finish(vec![node(&hosts.a, 0), node(&hosts.b, 1)], Duration::from_secs(300));
    for (i, d) in done.iter().enumerate() {
        assert!(d.ok, "node {i}: {}\n{}", d.stdout, d.stderr);
    }
    // ranks see one peer over shared memory (same namespace) and two over TCP (the veth pair)
    for r in 0..4 {
        let o = &done[r / 2].stdout;
        assert!(
            o.contains(&format!("rank {r} of 4: ")) && o.contains("peers: 1 over shared memory, 2 over TCP"),
            "{o}"
        );
    }
}
