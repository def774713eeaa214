//! Hugging Face checkpoint folders through the binary: `[init] from` a folder (its config.json
//! giving or checking `[model]`), and `weft checkpoint consolidate --format hf`.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use weft_core::io::safetensors;
use weft_core::Tensor;

fn hf_fixture(name: &str) -> PathBuf {
    repo().join("crates/weft-models/tests/fixtures/hf").join(name)
}

/// The ids and flattened logits transformers computed for a fixture.
fn expected(name: &str) -> (Vec<Vec<i64>>, Vec<f64>) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(hf_fixture("expected.json")).unwrap()).unwrap();
    (
        serde_json::from_value(v[name]["ids"].clone()).unwrap(),
        serde_json::from_value(v[name]["logits"].clone()).unwrap(),
    )
}

/// Mean cross-entropy of `logits` (`[rows, vocab]`, flattened) against `targets`, in f64.
fn cross_entropy(logits: &[f64], targets: &[i64], vocab: usize) -> f64 {
    let mut total = 0.0;
    for (row, &t) in logits.chunks(vocab).zip(targets) {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        total += lse - row[t as usize];
    }
    total / targets.len() as f64
}

/// A run of one step at lr 0 from `init` on the fixture's ids (targets: the ids rolled by one),
/// with `model` as its `[model]` section ("" for none). Returns the config's path.
fn one_step_run(dir: &Path, init: &Path, model: &str, name: &str) -> PathBuf {
    let (ids, _) = expected(name);
    let t = ids[0].len();
    let inputs: Vec<i64> = ids.concat();
    let targets: Vec<i64> = ids.iter().flat_map(|r| r[1..].iter().chain(&r[..1]).copied()).collect();
    let x = Tensor::from_vec(inputs, &[1, 2, t]).unwrap();
    let y = Tensor::from_vec(targets, &[1, 2, t]).unwrap();
    safetensors::save(
        &dir.join("batches.safetensors"),
        [("inputs", &x), ("targets", &y)],
        &BTreeMap::new(),
    )
    .unwrap();
    let config = format!(
        "{model}\n[init]\nfrom = {init:?}\n[data]\nkind = \"batches\"\npath = \"batches.safetensors\"\n\
         [optim]\nkind = \"sgd\"\nlr = 0.0\n[train]\nsteps = 1\nlog_every = 1\nmetrics = \"metrics.jsonl\"\n"
    );
    let path = dir.join("run.toml");
    std::fs::write(&path, config).unwrap();
    path
}

#[test]
fn a_run_starts_from_a_gpt2_folder_with_its_config() {
    let dir = temp_dir("hf-init-gpt2");
    let run = one_step_run(&dir, &hf_fixture("gpt2"), "", "gpt2");
    weft_ok(&["train", "--config", run.to_str().unwrap()]);
    let (ids, logits) = expected("gpt2");
    let targets: Vec<i64> = ids.iter().flat_map(|r| r[1..].iter().chain(&r[..1]).copied()).collect();
    let want = cross_entropy(&logits, &targets, 61);
    let got = read_metrics(&dir.join("metrics.jsonl"))[0]["loss"].as_f64().unwrap();
    assert!(
        (got - want).abs() <= 1e-5 * want,
        "loss {got}, transformers' logits give {want}"
    );

    // a [model] that agrees may be given; one that disagrees is named
    let agrees = "[model]\nkind = \"gpt\"\nn_head = 4\nvocab_size = 61\nblock_size = 16\nn_layer = 2\n\
                  n_embd = 32\nbias = true\ndropout = 0.0\nactivation = \"gelu_tanh\"";
    let run = one_step_run(&dir, &hf_fixture("gpt2"), agrees, "gpt2");
    weft_ok(&[
        "train",
        "--config",
        run.to_str().unwrap(),
        "--set",
        "train.overwrite=true",
    ]);
    let run = one_step_run(
        &dir,
        &hf_fixture("gpt2"),
        &agrees.replace("n_head = 4", "n_head = 2"),
        "gpt2",
    );
    fails_with(
        &["train", "--config", run.to_str().unwrap()],
        &["model.n_head: 2 here, but 4 in", "config.json"],
    );
    let run = one_step_run(&dir, &hf_fixture("gpt2"), &agrees.replace("gelu_tanh", "gelu"), "gpt2");
    fails_with(
        &["train", "--config", run.to_str().unwrap()],
        &["model.activation", "config.json"],
    );
}

#[test]
fn a_damaged_folder_is_refused_before_training() {
    let dir = temp_dir("hf-init-damaged");
    let folder = dir.join("gpt2");
    std::fs::create_dir_all(&folder).unwrap();
    let config = std::fs::read_to_string(hf_fixture("gpt2/config.json")).unwrap();
    std::fs::write(
        folder.join("config.json"),
        config.replace("GPT2LMHeadModel", "GPT2ForQuestionAnswering"),
    )
    .unwrap();
    std::fs::copy(hf_fixture("gpt2/model.safetensors"), folder.join("model.safetensors")).unwrap();
    let run = one_step_run(&dir, &folder, "", "gpt2");
    fails_with(
        &["train", "--config", run.to_str().unwrap()],
        &["config.json", "architectures", "GPT2ForQuestionAnswering"],
    );
    std::fs::write(folder.join("config.json"), config).unwrap();
    let bytes = std::fs::read(folder.join("model.safetensors")).unwrap();
    std::fs::write(folder.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    fails_with(&["train", "--config", run.to_str().unwrap()], &["model.safetensors"]);
    assert!(!dir.join("metrics.jsonl").exists());
}

#[test]
fn consolidate_as_hf_writes_a_folder_a_run_can_start_from() {
    let dir = temp_dir("hf-consolidate");
    let ckpt = dir.join("ckpt");
    weft_ok(&[
        "train",
        "--config",
        &gpt_fixture(),
        "--set",
        "train.steps=3",
        "--set",
        &path_set("train.checkpoint_dir", &ckpt),
        "--set",
        &path_set("train.metrics", &dir.join("first.jsonl")),
    ]);
    let out = dir.join("hf");
    weft_ok(&[
        "checkpoint",
        "consolidate",
        ckpt.to_str().unwrap(),
        "--format",
        "hf",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(names(&out), ["config.json", "model.safetensors"]);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"], serde_json::json!(["GPT2LMHeadModel"]));
    assert_eq!(config["activation_function"], "gelu");
    // the same tensors as the safetensors consolidation, Conv1D weights stored [in, out]
    consolidate_ok(&ckpt, &dir.join("one.safetensors"));
    let one = safetensors::load(&dir.join("one.safetensors")).unwrap().tensors;
    let hf = safetensors::load(&out.join("model.safetensors")).unwrap().tensors;
    assert!(!hf.contains_key("lm_head.weight"));
    for (name, t) in &hf {
        let want =
            if name.ends_with("attn.c_attn.weight") || name.ends_with("c_proj.weight") || name.ends_with("c_fc.weight")
            {
                one[name].t().unwrap().contiguous().unwrap()
            } else {
                one[name].clone()
            };
        assert_eq!(t.shape(), want.shape(), "{name}");
        assert_eq!(t.to_vec_f64(), want.to_vec_f64(), "{name}");
    }
    // a run from the folder takes the model from config.json and starts where the run stopped:
    // its first loss is the fourth step's of the run from the start
    let whole = dir.join("whole.jsonl");
    weft_ok(&[
        "train",
        "--config",
        &gpt_fixture(),
        "--set",
        "train.steps=4",
        "--set",
        &path_set("train.metrics", &whole),
    ]);
    let from = dir.join("from.toml");
    let fixture = fixtures().join("gpt_adamw");
    std::fs::write(
        &from,
        format!(
            "[init]\nfrom = {out:?}\n[data]\nkind = \"batches\"\npath = {:?}\n[optim]\nkind = \"sgd\"\nlr = 0.0\n\
             [train]\nsteps = 4\nlog_every = 1\nmetrics = \"from.jsonl\"\n",
            fixture.join("batches.safetensors")
        ),
    )
    .unwrap();
    weft_ok(&["train", "--config", from.to_str().unwrap()]);
    // batch i mod S: the fourth step of the whole run used batch 3; this run's fourth step too
    let a = read_metrics(&whole)[3]["loss"].as_f64().unwrap();
    let b = read_metrics(&dir.join("from.jsonl"))[3]["loss"].as_f64().unwrap();
    // lr 0 keeps the step-3 weights for all four steps, so step 4's loss is on the same weights
    assert!((a - b).abs() <= 1e-6 * a, "{a} vs {b}");
    // a gpt without biases has no GPT-2 form
    let nobias = dir.join("nobias");
    weft_ok(&[
        "train",
        "--config",
        fixtures().join("gpt_nobias_adamw/run.toml").to_str().unwrap(),
        "--set",
        "train.steps=1",
        "--set",
        &path_set("train.checkpoint_dir", &nobias),
    ]);
    fails_with(
        &[
            "checkpoint",
            "consolidate",
            nobias.to_str().unwrap(),
            "--format",
            "hf",
            "-o",
            dir.join("x").to_str().unwrap(),
        ],
        &["model.bias"],
    );
    assert!(!dir.join("x").exists());
}
