//! `weft generate` through the binary: the sampling flags, generation from a checkpoint folder
//! and from the file `weft checkpoint consolidate` writes, and every bad input (flag, prompt,
//! checkpoint whose config does not match its tensors) refused with one line, exit 1.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{consolidate_ok, path_set, temp_dir, weft, weft_ok};
use weft_core::io::safetensors;

/// Trains a small gpt (one block, width 32, block_size 16) for 3 steps on the built-in corpus,
/// checkpointing into `dir/ckpt`, which it returns.
fn train_tiny(dir: &Path) -> PathBuf {
    let ckpt = dir.join("ckpt");
    let set = path_set("train.checkpoint_dir", &ckpt);
    #[rustfmt::skip]
    weft_ok(&["train", "--quiet", "--set", "train.steps=3", "--set", "model.n_layer=1",
        "--set", "model.n_embd=32", "--set", "model.n_head=2", "--set", "model.block_size=16",
        "--set", "train.eval_every=0", "--set", "train.sample_tokens=0", "--set", &set]);
    ckpt
}

fn generate(from: &Path, flags: &[&str]) -> Output {
    let mut args = vec!["generate", "--checkpoint", from.to_str().unwrap()];
    args.extend(flags);
    weft(&args)
}

/// The text `weft generate` printed (without the newline it ends its output with).
fn text(from: &Path, flags: &[&str]) -> String {
    let out = generate(from, flags);
    assert!(
        out.status.success(),
        "generate {flags:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    stdout.strip_suffix('\n').expect("a final newline").to_string()
}

/// Runs `weft generate` from `from` with `flags`, checks that it failed with exit 1 and one line
/// `weft: error: ...` holding every needle; returns the line.
fn refused(from: &Path, flags: &[&str], needles: &[&str]) -> String {
    let out = generate(from, flags);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        out.status.code(),
        Some(1),
        "exit status of generate {flags:?} (a panic exits 101, an abort 134): {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line for {flags:?}, got:\n{stderr}");
    assert!(lines[0].starts_with("weft: error: "), "{stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "{flags:?}: {:?} should name {n:?}", lines[0]);
    }
    assert!(out.stdout.is_empty(), "no text for {flags:?}");
    lines[0].to_string()
}

#[test]
fn sampling_flags_are_checked_naming_the_flag() {
    let dir = temp_dir("gen-flags");
    let ckpt = train_tiny(&dir);
    for (flag, value) in [
        ("--temperature", "-1"),
        ("--temperature", "-0.5"),
        ("--temperature", "nan"),
        ("--temperature", "inf"),
        ("--temperature", "warm"),
        ("--top-k", "-1"),
        ("--top-k", "2.5"),
        ("--top-p", "0"),
        ("--top-p", "-0.1"),
        ("--top-p", "1.5"),
        ("--top-p", "NaN"),
        ("--tokens", "-1"),
        ("--tokens", "1e3"),
        ("--seed", "-1"),
    ] {
        refused(&ckpt, &["--prompt", "a", flag, value], &[flag]);
    }
    // the edges of each range are accepted
    for flags in [
        ["--temperature", "0"],
        ["--top-k", "0"],
        ["--top-k", "100000"],
        ["--top-p", "1"],
        ["--top-p", "0.001"],
    ] {
        let t = text(&ckpt, &[&["--prompt", "a", "--tokens", "5"], &flags[..]].concat());
        assert_eq!(t.chars().count(), 6, "{flags:?}: {t:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn temperature_top_k_and_top_p_reach_the_sampler() {
    let dir = temp_dir("gen-sampling");
    let ckpt = train_tiny(&dir);
    let run = |flags: &[&str]| text(&ckpt, &[&["--prompt", "The ", "--tokens", "60"], flags].concat());
    let greedy = run(&["--temperature", "0", "--seed", "1"]);
    assert!(greedy.starts_with("The ") && greedy.chars().count() == 64, "{greedy:?}");
    // greedy ignores the seed; sampling does not
    assert_eq!(run(&["--temperature", "0", "--seed", "2"]), greedy);
    assert_ne!(run(&["--seed", "1"]), run(&["--seed", "2"]));
    // one candidate left by top-k or top-p is greedy, at any temperature and seed
    assert_eq!(run(&["--temperature", "1.5", "--top-k", "1", "--seed", "3"]), greedy);
    assert_eq!(run(&["--temperature", "1.5", "--top-p", "1e-9", "--seed", "4"]), greedy);
    // the defaults are temperature 0.8, top-k 40, top-p off
    assert_eq!(
        run(&["--seed", "5"]),
        run(&["--seed", "5", "--temperature", "0.8", "--top-k", "40", "--top-p", "1"])
    );
    // each flag changes the draws
    let base = run(&["--seed", "5"]);
    for flags in [["--temperature", "1.3"], ["--top-k", "3"], ["--top-p", "0.5"]] {
        assert_ne!(run(&[&["--seed", "5"], &flags[..]].concat()), base, "{flags:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn prompts_and_token_counts_give_one_line_each() {
    let dir = temp_dir("gen-prompts");
    let ckpt = train_tiny(&dir);
    refused(&ckpt, &["--prompt", "café"], &["'é'", "position 3", "vocabulary"]);
    refused(&ckpt, &["--prompt", ""], &["prompt is empty"]);
    refused(
        &ckpt,
        &["--prompt", "a", "--tokens", "0"],
        &["--tokens", "0 generates nothing"],
    );
    refused(
        &ckpt,
        &["--prompt", "a", "--tokens", "1000000000000"],
        &["--tokens", "1000000000000", "1000000"],
    );
    refused(
        &ckpt,
        &["--prompt", "a", "--tokens", "99999999999999999999999"],
        &["--tokens"],
    );
    // past block_size (16) the context is cropped; a prompt longer than block_size is kept whole
    let prompt = "weft generate continues a prompt longer than the block";
    let t = text(&ckpt, &["--prompt", prompt, "--tokens", "100"]);
    assert!(
        t.starts_with(prompt) && t.chars().count() == prompt.chars().count() + 100,
        "{t:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tensors and metadata of safetensors file `path`.
fn read_file(path: &Path) -> (BTreeMap<String, weft_core::Tensor>, BTreeMap<String, String>) {
    let f = safetensors::load(path).unwrap();
    (f.tensors, f.metadata)
}

fn write_file(path: &Path, tensors: &BTreeMap<String, weft_core::Tensor>, metadata: &BTreeMap<String, String>) {
    safetensors::save(path, tensors.iter().map(|(n, t)| (n.as_str(), t)), metadata).unwrap();
}

#[test]
fn a_consolidated_file_generates_what_its_checkpoint_generates() {
    let dir = temp_dir("gen-consolidated");
    let ckpt = train_tiny(&dir);
    let file = dir.join("model.safetensors");
    consolidate_ok(&ckpt, &file);
    let (tensors, meta) = read_file(&file);
    assert_eq!(meta["format"], "pt");
    assert_eq!(meta["weft.step"], "3");
    let model: serde_json::Value = serde_json::from_str(&meta["weft.model"]).unwrap();
    assert_eq!(
        (model["kind"].as_str(), model["block_size"].as_u64()),
        (Some("gpt"), Some(16))
    );
    let tok: serde_json::Value = serde_json::from_str(&meta["weft.tokenizer"]).unwrap();
    assert!(tok["vocab"].as_str().unwrap().contains("abc"), "{tok}");
    for flags in [
        &["--prompt", "The ", "--tokens", "80", "--seed", "7"][..],
        &[
            "--prompt",
            "a",
            "--tokens",
            "40",
            "--seed",
            "3",
            "--temperature",
            "1.2",
            "--top-k",
            "20",
            "--top-p",
            "0.9",
        ],
        &["--prompt", "x", "--tokens", "30", "--temperature", "0"],
    ] {
        let (from_folder, from_file) = (text(&ckpt, flags), text(&file, flags));
        assert_eq!(from_folder, from_file, "{flags:?}");
    }
    // a state dict without weft's metadata, as PyTorch's `save_file` writes it (with and
    // without `format: pt`), is refused saying what is missing and how to get it
    let bare = dir.join("bare.safetensors");
    for metadata in [
        BTreeMap::from([("format".to_string(), "pt".to_string())]),
        BTreeMap::new(),
    ] {
        write_file(&bare, &tensors, &metadata);
        refused(
            &bare,
            &["--prompt", "a"],
            &[
                "bare.safetensors",
                "no model config",
                "weft.model",
                "weft checkpoint consolidate",
            ],
        );
    }
    // without the tokenizer
    let mut no_tok = meta.clone();
    no_tok.remove("weft.tokenizer");
    write_file(&bare, &tensors, &no_tok);
    refused(&bare, &["--prompt", "a"], &["bare.safetensors", "no tokenizer"]);
    // a file that is not safetensors
    std::fs::write(&bare, "not a model").unwrap();
    refused(&bare, &["--prompt", "a"], &["bare.safetensors"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `model` with `key` set to `value` (JSON).
fn with_key(model: &serde_json::Value, key: &str, value: serde_json::Value) -> serde_json::Value {
    let mut m = model.clone();
    m[key] = value;
    m
}

/// The claims a forged config makes, with what the refusal must name.
fn forged_configs(model: &serde_json::Value) -> Vec<(serde_json::Value, Vec<&'static str>)> {
    use serde_json::json;
    vec![
        (
            with_key(model, "block_size", json!(1_000_000_000u64)),
            vec!["model.block_size: 1000000000", "transformer.wpe.weight", "[16, 32]"],
        ),
        (
            with_key(model, "vocab_size", json!(1_000_000_000u64)),
            vec!["model.vocab_size: 1000000000", "transformer.wte.weight", "[128, 32]"],
        ),
        (
            with_key(model, "n_layer", json!(1_000_000_000u64)),
            vec!["model.n_layer: 1000000000", "transformer.h.1.*", "holds 1 block)"],
        ),
        (
            with_key(&with_key(model, "n_embd", json!(64)), "n_head", json!(4)),
            vec!["model.n_embd: 64", "transformer.wte.weight", "[128, 32]"],
        ),
        (with_key(model, "n_head", json!(3)), vec!["model.n_embd", "n_head = 3"]),
        (
            with_key(model, "bias", json!(false)),
            vec!["model.bias: false", "transformer.ln_f.bias"],
        ),
        (with_key(model, "n_layer", json!(1.5)), vec!["n_layer"]),
        (with_key(model, "kind", json!("mlp")), vec!["model config"]),
    ]
}

#[test]
fn a_config_that_does_not_match_the_tensors_is_refused_before_building_the_model() {
    let dir = temp_dir("gen-forged");
    let ckpt = train_tiny(&dir);
    let index_path = ckpt.join("step-00000003/index.json");
    let original = std::fs::read_to_string(&index_path).unwrap();
    let index: serde_json::Value = serde_json::from_str(&original).unwrap();
    let model = index["state"]["extra"]["model"].clone();
    // the index has no checksum of its own: the claims reach the reader as they are
    for (forged, needles) in forged_configs(&model) {
        let mut edited = index.clone();
        edited["state"]["extra"]["model"] = forged;
        std::fs::write(&index_path, serde_json::to_string(&edited).unwrap()).unwrap();
        let line = refused(&ckpt, &["--prompt", "a", "--tokens", "5"], &needles);
        assert!(line.contains("index.json"), "{line}");
    }
    // a tokenizer that knows more characters than the vocabulary
    let mut edited = index.clone();
    edited["state"]["extra"]["model"]["vocab_size"] = serde_json::json!(10);
    std::fs::write(&index_path, serde_json::to_string(&edited).unwrap()).unwrap();
    refused(&ckpt, &["--prompt", "a"], &["model.vocab_size: 10"]);
    std::fs::write(&index_path, &original).unwrap();
    // the same claims in a consolidated file's metadata
    let file = dir.join("model.safetensors");
    consolidate_ok(&ckpt, &file);
    let (tensors, meta) = read_file(&file);
    let forged_file = dir.join("forged.safetensors");
    for (forged, needles) in forged_configs(&model) {
        let mut m = meta.clone();
        m.insert("weft.model".into(), forged.to_string());
        write_file(&forged_file, &tensors, &m);
        let line = refused(&forged_file, &["--prompt", "a", "--tokens", "5"], &needles);
        assert!(line.contains("forged.safetensors"), "{line}");
    }
    let mut m = meta.clone();
    m.insert("weft.model".into(), "{not json".into());
    write_file(&forged_file, &tensors, &m);
    refused(
        &forged_file,
        &["--prompt", "a"],
        &["forged.safetensors", "weft.model", "not JSON"],
    );
    // a tensor of another shape than its config says
    let mut t = tensors.clone();
    t.insert(
        "transformer.h.0.mlp.c_fc.weight".into(),
        weft_core::Tensor::zeros(&[100, 32], weft_core::DType::F32).unwrap(),
    );
    write_file(&forged_file, &t, &meta);
    refused(
        &forged_file,
        &["--prompt", "a"],
        &[
            "model.n_embd: 32",
            "transformer.h.0.mlp.c_fc.weight has shape [100, 32]",
        ],
    );
    // the untouched checkpoint and file still generate
    text(&ckpt, &["--prompt", "a", "--tokens", "5"]);
    text(&file, &["--prompt", "a", "--tokens", "5"]);
    let _ = std::fs::remove_dir_all(&dir);
}
