//! Checkpoints move between layouts: a run stopped at step 10 under one layout and resumed under
//! another continues the uninterrupted single-process run's loss curve (within 1e-5: the layouts
//! sum in different orders), for one process -> tp = 2, tp = 2 x pp = 2 -> dp = 4, and
//! dp = 2 x zero = 3 -> pp = 2.

mod common;

use std::path::Path;

use common::{fixtures, launch_train_ok, losses, path_set, temp_dir};

/// Runs the gpt fixture under `layout` (`--set`s) on `ranks` ranks until `steps`, resuming from
/// `ckpt`; returns the losses it logged.
fn run(ranks: usize, layout: &[&str], ckpt: &Path, steps: usize, metrics: &Path) -> Vec<f64> {
    let _ = std::fs::remove_file(metrics);
    let mut sets = vec![
        path_set("train.checkpoint_dir", ckpt),
        path_set("train.metrics", metrics),
        format!("train.steps={steps}"),
        "train.checkpoint_every=10".to_string(),
    ];
    sets.extend(layout.iter().map(|s| s.to_string()));
    launch_train_ok(
        ranks,
        Some(&fixtures().join("gpt_adamw/run.toml")),
        &["--resume"],
        &sets,
    );
    losses(metrics)
}

#[test]
fn a_checkpoint_resumes_under_another_layout() {
    let out = temp_dir("reshard");
    let whole = run(1, &[], &out.join("whole"), 20, &out.join("whole.jsonl"));
    let cases: [(usize, &[&str], usize, &[&str]); 3] = [
        (1, &[], 2, &["parallel.tp=2"]),
        (
            4,
            &["parallel.tp=2", "parallel.pp=2", "parallel.micro_batches=2"],
            4,
            &["parallel.dp=4"],
        ),
        (2, &["parallel.dp=2", "parallel.zero=3"], 2, &["parallel.pp=2"]),
    ];
    for (i, (from_ranks, from, to_ranks, to)) in cases.into_iter().enumerate() {
        let ckpt = out.join(format!("ckpt{i}"));
        let first = run(from_ranks, from, &ckpt, 10, &out.join(format!("a{i}.jsonl")));
        let then = run(to_ranks, to, &ckpt, 20, &out.join(format!("b{i}.jsonl")));
        assert_eq!((first.len(), then.len()), (10, 10), "{from:?} -> {to:?}");
        for (step, (got, want)) in first.iter().chain(&then).zip(&whole).enumerate() {
            assert!(
                (got - want).abs() <= 1e-5 * want.abs(),
                "{from:?} -> {to:?}, step {step}: {got} vs {want}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}
