//! `weft train` with `[parallel] dp = N`, started through `weft launch` (one process per rank):
//! the PyTorch fixtures' loss curves are reproduced within 1e-4 relative at dp = 2 and 4, and
//! equal the single-process run's; a layout that does not match the job stops every rank with
//! one message.

mod common;

use std::path::Path;

use common::{check_against_pytorch, fixtures, launch_train, launch_train_ok, path_set, read_metrics, temp_dir, weft};

/// Runs fixture `case` on `dp` ranks and returns the metrics file.
fn train_dp(case: &str, dp: usize, out: &std::path::Path) -> std::path::PathBuf {
    let metrics = out.join(format!("metrics-dp{dp}.jsonl"));
    let config = fixtures().join(case).join("run.toml");
    launch_train_ok(
        dp,
        Some(&config),
        &[],
        &[path_set("train.metrics", &metrics), format!("parallel.dp={dp}")],
    );
    metrics
}

fn check_case(case: &str) {
    let out = temp_dir(&format!("dp-{case}"));
    let mut curves = Vec::new();
    for dp in [2, 4] {
        let metrics = train_dp(case, dp, &out);
        let worst = check_against_pytorch(case, &metrics);
        eprintln!("{case} dp={dp}: max relative loss difference to PyTorch {worst:.2e}");
        curves.push(read_metrics(&metrics));
    }
    // the data-parallel runs agree with each other as closely as with PyTorch
    for (a, b) in curves[0].iter().zip(&curves[1]) {
        let (x, y) = (a["loss"].as_f64().unwrap(), b["loss"].as_f64().unwrap());
        assert!(
            (x - y).abs() <= 1e-5 * x.abs(),
            "{case} step {}: dp=2 {x} vs dp=4 {y}",
            a["step"]
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// Two data-parallel ranks sharing one GPU (`train.device = "cuda"` gives each launched rank
/// `cuda:(LOCAL_RANK mod count)`; the collectives go through host memory) reproduce PyTorch's
/// losses as the one-process run does. Skipped, in one line, without a CUDA device.
#[test]
fn gpt_adamw_at_dp_2_on_one_gpu() {
    if !common::cuda_or_skip("gpt_adamw_at_dp_2_on_one_gpu") {
        return;
    }
    let out = temp_dir("dp-gpu");
    let metrics = out.join("metrics.jsonl");
    let config = fixtures().join("gpt_adamw").join("run.toml");
    launch_train_ok(
        2,
        Some(&config),
        &[],
        &[
            path_set("train.metrics", &metrics),
            "parallel.dp=2".to_string(),
            "train.device=\"cuda\"".to_string(),
        ],
    );
    check_against_pytorch("gpt_adamw", &metrics);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn gpt_adamw_with_clipping_at_dp_2_and_4() {
    check_case("gpt_adamw");
}

#[test]
fn mlp_sgd_at_dp_2_and_4() {
    check_case("mlp_sgd");
}

#[test]
fn convnet_adam_at_dp_2_and_4() {
    check_case("convnet_adam");
}

#[test]
fn without_parallel_dp_every_rank_of_the_job_is_data_parallel() {
    // what torchrun users expect of `weft launch --nproc-per-node 2 -- weft train`
    let out = temp_dir("dp-from-job");
    let metrics = out.join("m.jsonl");
    let config = fixtures().join("gpt_adamw/run.toml");
    let run = launch_train_ok(2, Some(&config), &[], &[path_set("train.metrics", &metrics)]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("[rank0]: weft: 2 ranks: dp = 2 x tp = 1 x pp = 1") && err.contains("the job's ranks"),
        "the first line says what was chosen: {err}"
    );
    check_against_pytorch("gpt_adamw", &metrics);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_layout_that_does_not_match_the_job_is_refused() {
    let config = fixtures().join("gpt_adamw/run.toml");
    let config = config.to_str().unwrap();
    // dp = 2 in one process
    let out = weft(&["train", "--config", config, "--quiet", "--set", "parallel.dp=2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("dp x tp x pp = 2 x 1 x 1 = 2") && err.contains("single process"),
        "{err}"
    );
    // 2 ranks with dp = 1: each says so before connecting to anything (started by hand, as
    // Slurm would, so that no launcher stops one when the other fails first)
    let bin = env!("CARGO_BIN_EXE_weft");
    for r in 0..2 {
        let out = std::process::Command::new(bin)
            .args(["train", "--config", config, "--quiet", "--set", "parallel.dp=1"])
            .env("WEFT_TRACK_DIR", common::test_runs_dir())
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", "2")
            .env("LOCAL_RANK", r.to_string())
            .env("LOCAL_WORLD_SIZE", "2")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", "9")
            .env("WEFT_NUM_THREADS", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains(&format!("this job has 2 ranks (this is rank {r})")),
            "{err}"
        );
    }
    // the fixture's global batch of 4 rows does not split across 3 ranks
    let out = launch_train(3, Some(Path::new(config)), &[], &["parallel.dp=3"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("4 rows does not split evenly across dp = 3"), "{err}");
}

#[test]
fn the_trace_shows_every_rank_computing_and_reducing() {
    let out = temp_dir("dp-trace");
    let trace = out.join("trace.json");
    let config = fixtures().join("gpt_adamw/run.toml");
    launch_train_ok(
        2,
        Some(&config),
        &[],
        &["parallel.dp=2".to_string(), path_set("train.trace", &trace)],
    );
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    for rank in 0..2 {
        let names: Vec<&str> = events
            .iter()
            .filter(|e| e["pid"] == rank && e["ph"] == "X")
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(names.iter().filter(|n| **n == "backward").count(), 40, "rank {rank}");
        assert!(
            names.iter().any(|n| n.starts_with("all_reduce(avg, f32")),
            "rank {rank}: {names:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}
