//! A pipeline run with dropout (`parallel.pp = 2`, `model.dropout = 0.1`) under `weft launch`,
//! resumed from a mid-run checkpoint at the same layout (`--resume-from` another folder's
//! checkpoint, and `--resume` of its own folder), logs the uninterrupted run's losses bit for
//! bit: each stage advances its dropout stream by its own layers only, so the checkpoint records
//! every rank's stream position and each rank goes on from its own. A checkpoint written before
//! the ranks recorded theirs (one position) still resumes.

mod common;

use std::path::{Path, PathBuf};

use common::{launch_train_ok, losses, path_set, temp_dir};

/// A small gpt on the built-in text with dropout, cut in 2 pipeline stages, checkpointed every 4
/// of its 12 steps.
const CONFIG: &str = r#"
[model]
kind = "gpt"
vocab_size = 128
block_size = 32
n_layer = 2
n_head = 2
n_embd = 32
bias = true
dropout = 0.1

[data]
kind = "text"
path = "builtin"
batch_size = 8
val_fraction = 0.1

[optim]
kind = "adamw"
lr = 0.003
betas = [0.9, 0.95]
weight_decay = 0.1

[train]
steps = 12
seed = 1337
log_every = 1
eval_every = 4
checkpoint_every = 4
keep_checkpoints = 10
eval_batches = 2
sample_tokens = 0

[track]
enabled = false

[parallel]
pp = 2
micro_batches = 2
"#;

/// Runs the config on 2 ranks with checkpoints in `ckpt` and `flags`; returns its losses.
fn train(config: &Path, out: &Path, name: &str, ckpt: &Path, flags: &[&str]) -> Vec<f64> {
    let metrics = out.join(format!("{name}.jsonl"));
    let sets = [
        path_set("train.metrics", &metrics),
        path_set("train.checkpoint_dir", ckpt),
    ];
    launch_train_ok(2, Some(config), flags, &sets);
    losses(&metrics)
}

/// Copies checkpoint folder `step_dir` alone into checkpoint directory `dir`.
fn copy_checkpoint(step_dir: &Path, dir: &Path) -> PathBuf {
    let copy = dir.join(step_dir.file_name().unwrap());
    std::fs::create_dir_all(&copy).unwrap();
    for f in std::fs::read_dir(step_dir).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.join(f.file_name().unwrap())).unwrap();
    }
    copy
}

fn index(step_dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(step_dir.join("index.json")).unwrap()).unwrap()
}

#[test]
fn a_pipeline_run_with_dropout_resumes_bit_for_bit() {
    let out = temp_dir("pp-dropout-resume");
    let config = out.join("run.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let full = out.join("full");
    let whole = train(&config, &out, "whole", &full, &[]);
    assert_eq!(whole.len(), 12, "one loss a step");

    // the stages' streams have moved apart by step 4: the checkpoint records both
    let step4 = full.join("step-00000004");
    let state = &index(&step4)["state"];
    let offsets: Vec<u64> = state["rng_offsets"]
        .as_array()
        .unwrap_or_else(|| panic!("no rng_offsets in {state}"))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(offsets.len(), 2, "{state}");
    assert_eq!(
        Some(offsets[0]),
        state["rng_offset"].as_u64(),
        "rank 0's is the one offset"
    );
    assert_ne!(offsets[0], offsets[1], "the stages' dropout streams differ: {state}");

    // --resume-from another folder's checkpoint
    let from = step4.to_str().unwrap();
    let resumed = train(
        &config,
        &out,
        "resumed-from",
        &out.join("res"),
        &["--resume-from", from],
    );
    assert_eq!(
        &whole[4..],
        &resumed[..],
        "pp=2 with dropout resumed from step 4 vs uninterrupted"
    );

    // --resume of its own folder (a copy of step 8 alone)
    let own = out.join("own");
    copy_checkpoint(&full.join("step-00000008"), &own);
    let resumed = train(&config, &out, "resumed", &own, &["--resume"]);
    assert_eq!(
        &whole[8..],
        &resumed[..],
        "pp=2 with dropout resumed at step 8 vs uninterrupted"
    );

    // a checkpoint with one position for every rank (written before the ranks recorded their
    // own) still resumes, each rank from that position
    let old = copy_checkpoint(&step4, &out.join("old"));
    let mut idx = index(&old);
    idx["state"].as_object_mut().unwrap().remove("rng_offsets");
    std::fs::write(old.join("index.json"), serde_json::to_vec_pretty(&idx).unwrap()).unwrap();
    let resumed = train(&config, &out, "old", &out.join("old"), &["--resume"]);
    assert_eq!(resumed.len(), 8, "steps 5 to 12 from the old checkpoint");
    let _ = std::fs::remove_dir_all(&out);
}
