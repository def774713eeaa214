//! A data-parallel run survives a worker killed with SIGKILL: `weft launch --max-restarts 1`
//! restarts every worker, `weft train --resume` continues from the newest complete checkpoint,
//! and the last record of every step equals the uninterrupted run's.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{path_set, read_metrics, temp_dir, weft_ok};

/// The built-in run made small: 2 blocks, 40 steps, a checkpoint every 10, on 2 ranks.
fn args(dir: &Path, metrics: &Path) -> Vec<String> {
    let mut a: Vec<String> = ["train", "--quiet", "--resume"].map(String::from).to_vec();
    for s in [
        "train.steps=40",
        "train.log_every=1",
        "train.eval_every=0",
        "train.sample_tokens=0",
        "model.n_layer=2",
        "parallel.dp=2",
        "train.checkpoint_every=10",
    ] {
        a.extend(["--set".into(), s.into()]);
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

#[test]
fn a_killed_worker_is_restarted_and_the_run_ends_as_if_nothing_happened() {
    let out = temp_dir("elastic");
    let bin = env!("CARGO_BIN_EXE_weft");
    // the uninterrupted run
    let whole = out.join("whole.jsonl");
    let whole_args = args(&out.join("ckpt-whole"), &whole);
    let mut launch = vec!["launch", "--nproc-per-node", "2", "--", bin];
    launch.extend(whole_args.iter().map(String::as_str));
    weft_ok(&launch);
    // the same run, rank 1 killed once step 25 is logged
    let metrics = out.join("killed.jsonl");
    let run_args = args(&out.join("ckpt"), &metrics);
    let child = std::process::Command::new(bin)
        .args(["launch", "--nproc-per-node", "2", "--max-restarts", "1", "--", bin])
        .args(&run_args)
        .env("WEFT_NUM_THREADS", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let killed = loop {
        assert!(start.elapsed() < Duration::from_secs(240), "step 25 never came");
        let reached = std::fs::read_to_string(&metrics)
            .map(|s| s.lines().any(|l| l.contains("\"step\":25")))
            .unwrap_or(false);
        if reached {
            if let Some(pid) = worker_pid(child.id(), 1) {
                std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status()
                    .unwrap();
                break pid;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let output = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the restarted job failed:\n{err}");
    assert!(
        err.contains("rank 1 failed (killed by signal 9") && err.contains("restarting all workers"),
        "pid {killed}: {err}"
    );
    // steps from the newest checkpoint (20) were run again after the restart
    let records = read_metrics(&metrics).len();
    assert!(records > 40, "{records} records: no step was run twice");
    let (want, got) = (last_losses(&whole), last_losses(&metrics));
    assert_eq!(want.len(), 40);
    assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
    for (step, w) in &want {
        let g = got[step];
        assert!(
            (g - w).abs() <= 1e-6 * w.abs(),
            "step {step}: {g} after the restart vs {w}"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}
