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
        .args(["launch", "--nproc-per-node", "2", "--max-restarts", "1", "--", bin])
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

/// The last record of every step of `metrics` equals `whole`'s (40 steps).
fn assert_same_as_uninterrupted(whole: &Path, metrics: &Path) {
    let (want, got) = (last_losses(whole), last_losses(metrics));
    assert_eq!(want.len(), 40);
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    for (step, w) in &want {
        let g = got[step];
        assert!(
            (g - w).abs() <= 1e-6 * w.abs(),
            "step {step}: {g} after the restart vs {w}"
        );
    }
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
    let reached = || {
        std::fs::read_to_string(&metrics)
            .map(|s| s.lines().any(|l| l.contains("\"step\":25")))
            .unwrap_or(false)
    };
    run_and_kill_rank_1(&args(&out.join("ckpt"), &metrics, &[]), reached);
    // steps from the newest checkpoint (20) were run again after the restart
    let records = read_metrics(&metrics).len();
    assert!(records > 40, "{records} records: no step was run twice");
    assert_same_as_uninterrupted(&whole, &metrics);
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
        err.contains("resuming from step 30") || err.contains("resuming from step 20"),
        "{err}"
    );
    let resumed_at = if err.contains("resuming from step 30") { 30 } else { 20 };
    eprintln!("killed while step 30's checkpoint was being written: resumed from step {resumed_at}");
    assert_same_as_uninterrupted(&whole, &metrics);
    // every checkpoint left loads, and nothing half-written is left
    let kept = weft_train::checkpoint::list(&ckpt).unwrap();
    assert!(!kept.is_empty());
    for (_, dir) in kept {
        weft_train::checkpoint::read(&dir).unwrap();
    }
    for e in std::fs::read_dir(&ckpt).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        assert!(name.starts_with("step-"), "{name} was left behind");
    }
    let _ = std::fs::remove_dir_all(&out);
}
