//! `weft evaluate` reads a checkpoint's model only: a config whose `[optim]` is not the training
//! run's (SGD for an AdamW checkpoint) gives the same `val_loss` as the training run's own config,
//! and the `val_loss` the run logged at that step.

mod common;

use common::{path_set, read_metrics, temp_dir, weft_ok};

/// A small gpt on the built-in text, trained with AdamW and evaluated at its last step.
const CONFIG: &str = r#"
[model]
kind = "gpt"
vocab_size = 128
block_size = 32
n_layer = 2
n_head = 2
n_embd = 32
bias = true
dropout = 0.0

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
steps = 6
seed = 1337
log_every = 1
eval_every = 6
eval_batches = 2
sample_tokens = 0

[track]
enabled = false
"#;

/// `weft evaluate --json` of `ckpt` with the config and `args`; its `val_loss`.
fn val_loss(config: &str, ckpt: &str, args: &[&str]) -> f64 {
    let mut all = vec!["evaluate", "--config", config, "--checkpoint", ckpt, "--json"];
    all.extend(args);
    let out = weft_ok(&all);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["step"], 6, "{v}");
    v["val_loss"].as_f64().unwrap()
}

#[test]
fn evaluate_does_not_need_the_training_runs_optimizer() {
    let out = temp_dir("evaluate-other-optimizer");
    let config = out.join("run.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let config = config.to_str().unwrap();
    let (ckpt, metrics) = (out.join("ckpt"), out.join("metrics.jsonl"));
    let sets = [
        path_set("train.checkpoint_dir", &ckpt),
        path_set("train.metrics", &metrics),
    ];
    weft_ok(&[
        "train", "--quiet", "--config", config, "--set", &sets[0], "--set", &sets[1],
    ]);
    let logged = read_metrics(&metrics)
        .iter()
        .find_map(|r| r["val_loss"].as_f64().filter(|_| r["step"] == 6))
        .expect("the run logs val_loss at step 6");
    let ckpt = ckpt.to_str().unwrap();
    let adamw = val_loss(config, ckpt, &[]);
    assert_eq!(
        adamw, logged,
        "evaluate with the training config vs the run's own evaluation"
    );
    #[rustfmt::skip]
    let sgd = val_loss(config, ckpt, &["--set", "optim.kind=\"sgd\"", "--unset", "optim.betas", "--set", "optim.lr=0.1"]);
    assert_eq!(
        sgd, adamw,
        "evaluate with an SGD config vs the AdamW config that trained it"
    );
    let _ = std::fs::remove_dir_all(&out);
}
