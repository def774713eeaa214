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

/// The layouts checkpoints move between: (ranks, `--set`s).
const LAYOUTS: [(usize, &[&str]); 5] = [
    (1, &[]),
    (2, &["parallel.dp=2", "parallel.zero=3"]),
    (4, &["parallel.tp=2", "parallel.pp=2"]),
    (4, &["parallel.dp=4"]),
    (2, &["parallel.tp=2"]),
];

/// Trains the gpt fixture for 6 steps under `layout` into `ckpt`, or, with `from`, only loads
/// that checkpoint (6 steps already done) and saves it again into `ckpt` under `layout`.
fn save_under(layout: (usize, &[&str]), ckpt: &Path, from: Option<&Path>) {
    let mut sets = vec![path_set("train.checkpoint_dir", ckpt), "train.steps=6".to_string()];
    sets.extend(layout.1.iter().map(|s| s.to_string()));
    let from = from.map(|f| f.to_str().unwrap().to_string());
    let mut flags = vec![];
    if let Some(f) = &from {
        flags.extend(["--resume-from", f.as_str()]);
    }
    launch_train_ok(layout.0, Some(&fixtures().join("gpt_adamw/run.toml")), &flags, &sets);
}

#[test]
fn saving_a_loaded_checkpoint_under_any_other_layout_gives_it_back_bit_for_bit() {
    let out = temp_dir("reshard-round-trip");
    for (a, from) in LAYOUTS.iter().enumerate() {
        let saved = out.join(format!("layout{a}"));
        save_under(*from, &saved, None);
        let want = weft_train::checkpoint::read(&saved.join("step-00000006")).unwrap();
        assert_eq!(want.state.step, 6);
        for (b, to) in LAYOUTS.iter().enumerate().filter(|(b, _)| *b != a) {
            let again = out.join(format!("layout{a}-to-{b}"));
            save_under(*to, &again, Some(&saved));
            let got = weft_train::checkpoint::read(&again.join("step-00000006")).unwrap();
            let what = format!("{:?} -> {:?}", from.1, to.1);
            assert_eq!(
                (got.state.step, got.state.rng_offset),
                (want.state.step, want.state.rng_offset),
                "{what}"
            );
            for (kind, w, g) in [
                ("model", &want.params, &got.params),
                ("optimizer", &want.optimizer, &got.optimizer),
            ] {
                assert_eq!(
                    w.keys().collect::<Vec<_>>(),
                    g.keys().collect::<Vec<_>>(),
                    "{what}: {kind} names"
                );
                for (name, t) in w {
                    let u = &g[name];
                    assert_eq!((u.shape(), u.dtype()), (t.shape(), t.dtype()), "{what}: {name}");
                    let same = t
                        .to_vec_f64()
                        .iter()
                        .zip(u.to_vec_f64())
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{what}: {kind} tensor {name} changed");
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}
