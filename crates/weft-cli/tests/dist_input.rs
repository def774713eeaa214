//! A rank's outside input that must be refused in one line, never a panic, an abort or a wait
//! for the timeout: a huge `WEFT_DIST_TIMEOUT`, `weft check collectives --sizes` beyond the
//! machine, `MASTER_PORT=0`; and the error of a rank whose many peers never came stays one short
//! line.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::free_port;

const WEFT: &str = env!("CARGO_BIN_EXE_weft");

/// `weft check collectives ARGS` as rank `rank` of `world` (torchrun's variables, no launcher:
/// rank 0 serves the store), with `extra` variables on top; the variables of an enclosing job
/// are removed.
fn rank(rank: usize, world: usize, args: &[&str], extra: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(WEFT);
    cmd.args(["check", "collectives"]).args(args);
    for v in [
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "WEFT_LAUNCHED",
        "WEFT_RESTART_COUNT",
        "WEFT_ERROR_FILE",
        "WEFT_NUM_THREADS",
        "SLURM_PROCID",
        "OMPI_COMM_WORLD_RANK",
    ] {
        cmd.env_remove(v);
    }
    let port = free_port().to_string();
    cmd.env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", &port)
        .env("WEFT_JOB_TOKEN", "tok-dist-input")
        .env("WEFT_DIST_TIMEOUT", "30")
        .env("WEFT_TRACK_DIR", common::test_runs_dir());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.output().expect("weft runs")
}

/// Checks that `out` is a refusal: exit code 1, one line on stderr holding `want`, no panic.
fn refused(out: &Output, want: &str) {
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(!e.contains("panicked"), "{e}");
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains(want), "want {want:?}:\n{e}");
}

#[test]
fn huge_dist_timeouts_are_refused_in_one_line() {
    for v in ["1e19", "1.9e19", "31536001"] {
        let out = rank(0, 2, &["--sizes", "1"], &[("WEFT_DIST_TIMEOUT", v)]);
        refused(
            &out,
            &format!("WEFT_DIST_TIMEOUT=\"{v}\" is above the limit of 31536000 s (a year)"),
        );
    }
}

#[test]
fn check_sizes_beyond_the_machine_are_refused_before_allocating() {
    // a rank of a launched job whose launcher is gone: it refuses before it looks for the store
    let launched = [
        ("LOCAL_WORLD_SIZE", "2"),
        ("WEFT_LAUNCHED", "1"),
        ("WEFT_DIST_TIMEOUT", "5"),
    ];
    let out = rank(1, 2, &["--sizes", "18446744073709551615"], &launched);
    refused(&out, "--sizes 18446744073709551615: ");
    refused(&out, "more than this machine can address");
    // 2^40 elements per rank: 16 TiB of f64 values, far beyond any machine's free memory
    if std::fs::read_to_string("/proc/meminfo").is_ok_and(|m| m.contains("MemAvailable")) {
        let out = rank(1, 2, &["--sizes", "1,1000000M"], &launched);
        refused(&out, "--sizes 1,1000000M needs ");
        refused(&out, "choose a smaller --sizes");
    }
}

#[test]
fn master_port_0_is_refused_at_once() {
    let started = Instant::now();
    let out = rank(0, 2, &["--sizes", "1"], &[("MASTER_PORT", "0")]);
    refused(&out, "MASTER_PORT=\"0\": the ranks must all know the store's port");
    // refused, not waited out (WEFT_DIST_TIMEOUT is 30 s)
    assert!(started.elapsed() < Duration::from_secs(25));
}

#[test]
fn missing_ranks_are_counted_not_listed() {
    // rank 0 of the largest world weft accepts, alone: the others never connect
    let out = rank(
        0,
        1 << 20,
        &["--sizes", "1"],
        &[("LOCAL_WORLD_SIZE", "1"), ("WEFT_DIST_TIMEOUT", "1")],
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.len() < 300,
        "{} bytes of stderr:\n{}",
        e.len(),
        &e[..e.len().min(2000)]
    );
    assert!(
        e.contains("rank 0: 1048575 ranks (1, 2, 3, 4, 5, 6, 7, 8 and 1048567 more) did not connect within 1 s"),
        "{e}"
    );
}

/// An IPv6 master address, bare (`::1`, as torchrun takes it) or in brackets, reaches the store
/// and the ranks reach each other over TCP: a rank published `::1:PORT`, which no peer could
/// parse, and `[::1]` made the store listen on IPv4 only.
#[test]
fn an_ipv6_master_address_works_bare_or_bracketed() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        eprintln!("skipped: this machine has no IPv6 loopback");
        return;
    }
    for addr in ["::1", "[::1]"] {
        let out = Command::new(WEFT)
            .args(["launch", "--nproc-per-node", "2", "--master-addr", addr, "--"])
            .arg(WEFT)
            .args(["check", "collectives", "--sizes", "1K"])
            .env("WEFT_SHM", "0")
            .env("WEFT_DIST_TIMEOUT", "30")
            .env_remove("WEFT_NUM_THREADS")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "--master-addr {addr}: {text}");
        assert!(text.contains("1 over TCP"), "--master-addr {addr}: {text}");
    }
}

/// A fault asked of a rank the job does not have, or past the check's last collective, is
/// refused (it injected nothing and the check passed).
#[test]
fn an_injected_fault_that_cannot_happen_is_refused() {
    let out = rank(0, 1, &["--sizes", "1", "--inject", "kill", "--inject-rank", "5"], &[]);
    refused(&out, "--inject-rank 5: the job has ranks 0 to 0");
    let out = rank(
        0,
        1,
        &[
            "--sizes",
            "1",
            "--inject",
            "mismatch",
            "--inject-rank",
            "0",
            "--inject-at",
            "100000",
        ],
        &[],
    );
    refused(&out, "--inject-at 100000: the check made");
}
