//! A data-parallel run survives a worker killed with SIGKILL: `weft launch --max-restarts 1`
//! restarts every worker, `weft train --resume` continues from the newest complete checkpoint,
//! and the last record of every step equals the uninterrupted run's.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{path_set, read_metrics, temp_dir, weft_ok};

/// The built-in run made small: 2 blocks, 40 steps, a checkpoint every 10, on 2 data-parallel
/// ranks, with `layout`'s extra `--set`s.
fn args(dir: &Path, metrics: &Path, layout: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["train", "--quiet", "--resume"].map(String::from).to_vec();
    for s in [
        "train.steps=40",
        "train.log_every=1",
        "train.eval_every=0",
        "train.sample_tokens=0",
        "model.n_layer=2",
        "parallel.dp=2",
        "train.checkpoint_every=10",
    ]
    .iter()
    .chain(layout)
    {
        a.extend(["--set".into(), s.to_string()]);
    }
    a.extend(["--set".into(), path_set("train.checkpoint_dir", dir)]);
    a.extend(["--set".into(), path_set("train.metrics", metrics)]);
    a
}

/// Step -> loss of the last record of each step.
fn last_losses(metrics: &Path) -> BTreeMap<u64, f64> {
    read_metrics(metrics)
        .into_iter()
        .filter_map(|r| Some((r["step"].as_u64()?, r["loss"].as_f64()?)))
        .collect()
}

/// The worker of `launcher` whose environment says `RANK=rank`.
fn worker_pid(launcher: u32, rank: usize) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|&b| b == 0).any(|kv| kv == format!("RANK={rank}").as_bytes()))
                .unwrap_or(false)
        })
}

/// Runs `run_args` under `weft launch --max-restarts 1` on 2 ranks and SIGKILLs rank 1 as soon
/// as `now()` says so (polled every millisecond); returns the launcher's stderr after checking
/// that it restarted the workers and the job succeeded.
fn run_and_kill_rank_1(run_args: &[String], mut now: impl FnMut() -> bool) -> String {
    let bin = env!("CARGO_BIN_EXE_weft");
    let child = std::process::Command::new(bin)
        .env("WEFT_TRACK_DIR", common::test_runs_dir())
        .args([
            "launch",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "--stop-timeout",
            "5",
            "--",
            bin,
        ])
        .args(run_args)
        .env("WEFT_NUM_THREADS", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut pid = None;
    let killed = loop {
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "the moment to kill never came"
        );
        pid = pid.or_else(|| worker_pid(child.id(), 1));
        if let (Some(pid), true) = (pid, now()) {
            std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status()
                .unwrap();
            break pid;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let output = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(output.status.success(), "the restarted job failed:\n{err}");
    assert!(
        err.contains("rank 1 failed (killed by signal 9") && err.contains("restarting all workers"),
        "pid {killed}: {err}"
    );
    err
}

/// The last record of every step of `metrics` equals `whole`'s (40 steps) within `tol`,
/// relative; the largest relative difference.
fn assert_same_as_uninterrupted(whole: &Path, metrics: &Path, tol: f64) -> f64 {
    let (want, got) = (last_losses(whole), last_losses(metrics));
    assert_eq!(want.len(), 40);
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    let mut worst = 0.0f64;
    for (step, w) in &want {
        let g = got[step];
        assert!(
            (g - w).abs() <= tol * w.abs(),
            "step {step}: {g} after the restart vs {w}"
        );
        worst = worst.max(((g - w) / w).abs());
    }
    worst
}

/// Whether `metrics` holds a record of `step`.
fn logged(metrics: &Path, step: usize) -> bool {
    std::fs::read_to_string(metrics).is_ok_and(|s| s.contains(&format!("\"step\":{step},")))
}

/// Runs the uninterrupted job of `layout`; its metrics file.
fn uninterrupted(out: &Path, layout: &[&str]) -> std::path::PathBuf {
    let whole = out.join("whole.jsonl");
    let mut launch: Vec<String> = ["launch", "--nproc-per-node", "2", "--", env!("CARGO_BIN_EXE_weft")]
        .map(String::from)
        .to_vec();
    launch.extend(args(&out.join("ckpt-whole"), &whole, layout));
    weft_ok(&launch.iter().map(String::as_str).collect::<Vec<_>>());
    whole
}

#[test]
fn a_killed_worker_is_restarted_and_the_run_ends_as_if_nothing_happened() {
    let out = temp_dir("elastic");
    let whole = uninterrupted(&out, &[]);
    // the same run, rank 1 killed once step 25 is logged
    let metrics = out.join("killed.jsonl");
    run_and_kill_rank_1(&args(&out.join("ckpt"), &metrics, &[]), || logged(&metrics, 25));
    // steps after the newest checkpoint (20) were run again after the restart, and their first
    // records removed when it resumed: each step is in the file once
    let steps: Vec<u64> = read_metrics(&metrics)
        .iter()
        .filter_map(|r| r["step"].as_u64())
        .collect();
    assert_eq!(steps, (1..=40).collect::<Vec<_>>(), "each step logged once");
    assert_same_as_uninterrupted(&whole, &metrics, 1e-6);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_worker_killed_while_writing_a_checkpoint_leaves_none_that_loads() {
    let out = temp_dir("elastic-writing");
    // ZeRO-3: both ranks write their shards of every checkpoint
    let layout = ["parallel.zero=3"];
    let whole = uninterrupted(&out, &layout);
    let (ckpt, metrics) = (out.join("ckpt"), out.join("killed.jsonl"));
    // rank 1 killed the moment the temporary folder of step 30's checkpoint appears
    let writing = || {
        std::fs::read_dir(&ckpt).is_ok_and(|entries| {
            entries
                .filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().starts_with(".tmp-step-00000030-"))
        })
    };
    let err = run_and_kill_rank_1(&args(&ckpt, &metrics, &layout), writing);
    // the restart resumed from a complete checkpoint: 30 if it was completed before the kill
    // landed, else 20
    assert!(
        err.contains("resuming after step 30") || err.contains("resuming after step 20"),
        "{err}"
    );
    let resumed_at = if err.contains("resuming after step 30") { 30 } else { 20 };
    eprintln!("killed while step 30's checkpoint was being written: resumed from step {resumed_at}");
    assert_same_as_uninterrupted(&whole, &metrics, 1e-6);
    // every checkpoint left loads, and nothing half-written is left
    let kept = weft_train::checkpoint::list(&ckpt).unwrap();
    assert!(!kept.is_empty());
    for (_, dir) in kept {
        weft_train::checkpoint::read(&dir).unwrap();
    }
    for e in std::fs::read_dir(&ckpt).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        assert!(
            name.starts_with("step-") || name == weft_train::checkpoint::LOCK,
            "{name} was left behind"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_job_that_loses_a_node_goes_on_with_fewer_ranks() {
    let out = temp_dir("elastic-shrink");
    // parallel.dp = 0: as many data-parallel ranks as the job has
    let layout = ["parallel.dp=0"];
    let whole = uninterrupted(&out, &layout);
    let (ckpt, metrics) = (out.join("ckpt"), out.join("shrunk.jsonl"));
    let bin = env!("CARGO_BIN_EXE_weft");
    let port = common::free_port().to_string();
    // two "nodes" on this machine, one rank each, talking over TCP as separate hosts would; the
    // last call (5 s) leaves a loaded machine time to start both before round 0 closes
    let node = |rank: &str, stderr: std::process::Stdio| {
        std::process::Command::new(bin)
            .env("WEFT_TRACK_DIR", common::test_runs_dir())
            .args([
                "launch",
                "--nnodes",
                "1:2",
                "--node-rank",
                rank,
                "--nproc-per-node",
                "1",
            ])
            .args(["--master-port", &port, "--max-restarts", "1", "--rdzv-last-call", "5"])
            .args(["--stop-timeout", "2", "--", bin])
            .args(args(&ckpt, &metrics, &layout))
            .env("WEFT_JOB_TOKEN", "tok-elastic-shrink")
            .env("WEFT_SHM", "0")
            .env("WEFT_DIST_TIMEOUT", "30")
            .env("WEFT_NUM_THREADS", "1")
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap()
    };
    let a = node("0", std::process::Stdio::piped());
    let mut b = node("1", std::process::Stdio::null());
    // node 1 lost (its launcher killed, and with it its worker) once step 25 is logged
    let start = Instant::now();
    while !logged(&metrics, 25) {
        assert!(start.elapsed() < Duration::from_secs(240), "step 25 never came");
        std::thread::sleep(Duration::from_millis(5));
    }
    b.kill().unwrap();
    b.wait().unwrap();
    let output = a.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "node 0 did not finish the job:\n{err}");
    for want in [
        "rendezvous round 0: 2 node(s)",
        "restarting all workers: rendezvous round 1",
        "rendezvous round 1: 1 node(s), this is node 0",
        "resuming after step 20",
    ] {
        assert!(err.contains(want), "{want:?} in:\n{err}");
    }
    // one rank trains the same global batches from step 20 on: the same curve, but for the
    // order of the sums
    let worst = assert_same_as_uninterrupted(&whole, &metrics, 1e-5);
    eprintln!("dp 2 -> 1 after losing a node: max relative loss difference {worst:.2e}");
    let _ = std::fs::remove_dir_all(&out);
}
