//! The README's main job (built-in config) and the example configs on the shared data sets, each
//! for a few steps: they run, and the loss falls. Tests on shared data skip when it is absent.

mod common;

use std::path::{Path, PathBuf};

use common::{read_metrics, temp_dir, weft_ok};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn losses(metrics: &Path) -> Vec<f64> {
    read_metrics(metrics)
        .iter()
        .filter_map(|r| r["loss"].as_f64())
        .collect()
}

#[test]
fn builtin_gpt_trains_and_samples() {
    let out = temp_dir("builtin");
    let m = out.join("m.jsonl");
    let run = weft_ok(&[
        "train",
        "--quiet",
        "--set",
        "train.steps=40",
        "--set",
        "train.log_every=1",
        "--set",
        "train.sample_tokens=20",
        "--set",
        "train.eval_every=20",
        "--set",
        &format!("train.metrics={:?}", m.to_str().unwrap()),
        "--set",
        "model.n_layer=1",
    ]);
    let l = losses(&m);
    assert_eq!(l.len(), 40);
    let (first, last) = (l[..5].iter().sum::<f64>() / 5.0, l[35..].iter().sum::<f64>() / 5.0);
    assert!(last < first - 0.5, "the loss falls: {first} -> {last}");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("--- sample (20 characters) ---"), "{stdout}");
    assert!(
        read_metrics(&m).iter().any(|r| r["val_loss"].is_number()),
        "eval lines in the metrics"
    );
}

#[test]
fn an_untrained_gpt_samples_only_characters_the_tokenizer_knows() {
    // vocab_size 128 against the corpus's fewer characters: after 2 steps the ids past the
    // tokenizer still get probability, and must not be drawn
    #[rustfmt::skip]
    let out = weft_ok(&["train", "--quiet", "--set", "train.steps=2", "--set", "train.eval_every=0",
        "--set", "train.sample_tokens=200"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("--- sample (200 characters) ---"), "{stdout}");
}

fn shared(name: &str) -> Option<PathBuf> {
    let p = repo().join("../shared/data").join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping: {} is absent", p.display());
        None
    }
}

#[test]
fn digits_configs_learn() {
    if shared("digits.csv.gz").is_none() {
        return;
    }
    for cfg in ["digits_mlp.toml", "digits_convnet.toml"] {
        let out = temp_dir(cfg);
        let m = out.join("m.jsonl");
        let config = repo().join("examples").join(cfg);
        weft_ok(&[
            "train",
            "--quiet",
            "--config",
            config.to_str().unwrap(),
            "--set",
            "train.steps=150",
            "--set",
            "train.log_every=1",
            "--set",
            &format!("train.metrics={:?}", m.to_str().unwrap()),
        ]);
        let l = losses(&m);
        assert!(
            l[140..].iter().sum::<f64>() / 10.0 < 0.5 * l[..10].iter().sum::<f64>() / 10.0,
            "{cfg}: {l:?}"
        );
    }
}

#[test]
fn shakespeare_config_runs_and_generates() {
    if shared("tinyshakespeare.txt").is_none() {
        return;
    }
    let out = temp_dir("shakespeare");
    let config = repo().join("examples/shakespeare_char.toml");
    let ckpt = out.join("ckpt");
    weft_ok(&[
        "train",
        "--quiet",
        "--config",
        config.to_str().unwrap(),
        "--set",
        "train.steps=3",
        "--set",
        "train.sample_tokens=0",
        "--set",
        "train.eval_every=0",
        "--set",
        &format!("train.metrics={:?}", out.join("m.jsonl").to_str().unwrap()),
        "--set",
        &format!("train.checkpoint_dir={:?}", ckpt.to_str().unwrap()),
    ]);
    let gen = weft_ok(&[
        "generate",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--prompt",
        "ROMEO:",
        "--tokens",
        "10",
    ]);
    let text = String::from_utf8_lossy(&gen.stdout);
    assert!(
        text.starts_with("ROMEO:") && text.trim_end().chars().count() >= 16,
        "{text:?}"
    );
}

#[test]
fn shakespeare_llama_example_prepares_trains_and_generates() {
    let Some(text) = shared("tinyshakespeare.txt") else {
        return;
    };
    let out = temp_dir("shakespeare-llama");
    let shards = out.join("shards");
    weft_ok(&[
        "data",
        "prepare",
        "--tokenizer",
        "gpt2",
        "--input",
        text.to_str().unwrap(),
        "--output",
        shards.to_str().unwrap(),
    ]);
    let config = repo().join("examples/shakespeare_llama.toml");
    let ckpt = out.join("ckpt");
    let m = out.join("m.jsonl");
    #[rustfmt::skip]
    weft_ok(&[
        "train", "--quiet", "--config", config.to_str().unwrap(),
        "--set", &format!("data.path={:?}", shards.to_str().unwrap()),
        "--set", "schedule.total_steps=80", "--set", "train.steps=4", "--set", "train.log_every=1",
        "--set", "train.sample_tokens=0", "--set", "train.eval_every=0",
        "--set", &format!("train.metrics={:?}", m.to_str().unwrap()),
        "--set", &format!("train.checkpoint_dir={:?}", ckpt.to_str().unwrap()),
    ]);
    let l = losses(&m);
    assert_eq!(l.len(), 4);
    assert!(l[0] > 10.0 && l[3] < l[0], "{l:?}");
    let gen = weft_ok(&[
        "generate",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--prompt",
        "ROMEO:",
        "--tokens",
        "5",
    ]);
    let text = String::from_utf8_lossy(&gen.stdout);
    assert!(text.starts_with("ROMEO:") && text.trim_end().len() > 6, "{text:?}");
}
