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

/// `checkpoint consolidate CKPT --format hf -o OUT`.
fn hf_export_args<'a>(ckpt: &'a str, out: &'a str) -> [&'a str; 7] {
    ["checkpoint", "consolidate", ckpt, "--format", "hf", "-o", out]
}

/// The first loss the run of [`one_step_run`] in `dir` logged is the one transformers' logits
/// of fixture `name` (vocabulary `vocab`) give, within 1e-5 relative.
fn assert_first_loss_is_transformers(dir: &Path, name: &str, vocab: usize) {
    let (ids, logits) = expected(name);
    let targets: Vec<i64> = ids.iter().flat_map(|r| r[1..].iter().chain(&r[..1]).copied()).collect();
    let want = cross_entropy(&logits, &targets, vocab);
    let got = read_metrics(&dir.join("metrics.jsonl"))[0]["loss"].as_f64().unwrap();
    assert!(
        (got - want).abs() <= 1e-5 * want,
        "{name}: loss {got}, transformers' logits give {want}"
    );
}

/// `weft train --config run` over the earlier run's checkpoints.
fn train_again(run: &Path) {
    weft_ok(&[
        "train",
        "--config",
        run.to_str().unwrap(),
        "--set",
        "train.overwrite=true",
    ]);
}

#[test]
fn a_run_starts_from_a_gpt2_folder_with_its_config() {
    let dir = temp_dir("hf-init-gpt2");
    let run = one_step_run(&dir, &hf_fixture("gpt2"), "", "gpt2");
    weft_ok(&["train", "--config", run.to_str().unwrap()]);
    assert_first_loss_is_transformers(&dir, "gpt2", 61);

    // a [model] that agrees may be given; one that disagrees is named
    let agrees = "[model]\nkind = \"gpt\"\nn_head = 4\nvocab_size = 61\nblock_size = 16\nn_layer = 2\n\
                  n_embd = 32\nbias = true\ndropout = 0.0\nactivation = \"gelu_tanh\"";
    let run = one_step_run(&dir, &hf_fixture("gpt2"), agrees, "gpt2");
    train_again(&run);
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

/// A Llama 3.1-style folder (rope scaling "llama3" in `rope_parameters`): the run's first loss is
/// the one transformers' logits give, and a `[model]` given beside it must agree on the scaling
/// key by key (numbers by value).
#[test]
fn a_run_starts_from_a_llama_folder_with_rope_scaling() {
    let dir = temp_dir("hf-init-llama3");
    let name = "llama_rope_llama3";
    let run = one_step_run(&dir, &hf_fixture(name), "", name);
    weft_ok(&["train", "--config", run.to_str().unwrap()]);
    assert_first_loss_is_transformers(&dir, name, 41);
    let agrees = "[model]\nkind = \"llama\"\nvocab_size = 41\nblock_size = 128\nn_layer = 2\nn_head = 4\n\
                  n_kv_head = 2\nn_embd = 32\nintermediate_size = 40\ntie_embeddings = true\nnorm_eps = 1e-5\n\
                  rope_scaling = { rope_type = \"llama3\", factor = 4, low_freq_factor = 1.0, high_freq_factor = 4.0, \
                  original_max_position_embeddings = 64 }";
    let run = one_step_run(&dir, &hf_fixture(name), agrees, name);
    train_again(&run);
    let run = one_step_run(
        &dir,
        &hf_fixture(name),
        &agrees.replace("factor = 4,", "factor = 8.0,"),
        name,
    );
    fails_with(
        &["train", "--config", run.to_str().unwrap()],
        &["model.rope_scaling:", "here, but", "config.json"],
    );
    // a [model] that leaves keys out takes config.json's (the scaling, and the rotary base):
    // the same loss, where the defaults would have given another
    let partial = agrees.split("tie_embeddings").next().unwrap();
    let run = one_step_run(&dir, &hf_fixture(name), partial, name);
    train_again(&run);
    assert_first_loss_is_transformers(&dir, name, 41);
    // a scaling weft does not compute, or a key it does not know, is named
    let run = one_step_run(
        &dir,
        &hf_fixture("llama_tied"),
        "[model]\nkind = \"llama\"\nvocab_size = 47\nblock_size = 16\nn_layer = 2\nn_head = 3\nn_kv_head = 3\n\
         n_embd = 24\nintermediate_size = 40\ntie_embeddings = true\nrope_scaling = { rope_type = \"yarn\", factor = 2.0 }",
        "llama_tied",
    );
    fails_with(
        &["train", "--config", run.to_str().unwrap()],
        &["model.rope_scaling", "yarn"],
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
    std::fs::write(folder.join("config.json"), &config).unwrap();
    let bytes = std::fs::read(folder.join("model.safetensors")).unwrap();
    std::fs::write(folder.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    fails_with(&["train", "--config", run.to_str().unwrap()], &["model.safetensors"]);
    // a config.json wider than its weights: named from the weights' shapes, before a model of
    // the config's size is built (one of n_embd 2048 was built first, about 1 GB, to fail after)
    std::fs::copy(hf_fixture("gpt2/model.safetensors"), folder.join("model.safetensors")).unwrap();
    std::fs::write(
        folder.join("config.json"),
        config.replace("\"n_embd\": 32", "\"n_embd\": 2048"),
    )
    .unwrap();
    fails_with(
        &["train", "--config", run.to_str().unwrap()],
        &[
            "gpt2: model config: model.n_embd: 2048",
            "transformer.wte.weight has shape [61, 32]",
        ],
    );
    // a size past weft's bounds is config.json's (it was blamed on the run config, which has
    // no [model])
    std::fs::write(
        folder.join("config.json"),
        config.replace("\"n_layer\": 2", "\"n_layer\": 1000000000"),
    )
    .unwrap();
    fails_with(
        &["train", "--config", run.to_str().unwrap()],
        &["config.json: gives model.n_layer = 1000000000, outside the 0 to 65536"],
    );
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
    weft_ok(&hf_export_args(ckpt.to_str().unwrap(), out.to_str().unwrap()));
    // trained on recorded batches: no tokenizer, so none is written
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
        &hf_export_args(nobias.to_str().unwrap(), dir.join("x").to_str().unwrap()),
        &["model.bias"],
    );
    assert!(!dir.join("x").exists());
}

/// A `tokenizer.json` (a BPE without merges, so one character is one token) whose vocabulary is
/// `chars`, character `i` as id `i`, decoded by joining the tokens.
fn char_tokenizer_json(chars: &[char]) -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = chars
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), i.into()))
        .collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    })
    .to_string()
}

/// A copy of fixture `name`'s folder under `dir`.
fn fixture_copy(dir: &Path, name: &str) -> PathBuf {
    let folder = dir.join(name);
    std::fs::create_dir_all(&folder).unwrap();
    for entry in std::fs::read_dir(hf_fixture(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), folder.join(entry.file_name())).unwrap();
    }
    folder
}

/// The tokenizer a checkpoint records goes into its Hugging Face folder as `tokenizer.json`
/// (with a `tokenizer_config.json` naming `PreTrainedTokenizerFast`): generating from the folder
/// gives the text generating from the checkpoint gives. A `tokenizer.json` already in the folder
/// with other content is kept, with one line saying so; one that is not a file is refused
/// before anything is written.
#[test]
fn consolidate_as_hf_writes_the_checkpoints_tokenizer() {
    let dir = temp_dir("hf-tokenizer");
    let ckpt = dir.join("ckpt");
    let run = dir.join("run.toml");
    std::fs::write(
        &run,
        "[model]\nkind = \"gpt\"\nvocab_size = 128\nblock_size = 16\nn_layer = 1\nn_head = 2\nn_embd = 16\n\
         bias = true\ndropout = 0.0\n[data]\nkind = \"text\"\npath = \"builtin\"\nbatch_size = 4\n\
         [optim]\nkind = \"adamw\"\nlr = 0.01\n[train]\nsteps = 3\nlog_every = 3\neval_every = 0\nsample_tokens = 0\n",
    )
    .unwrap();
    weft_ok(&[
        "train",
        "--config",
        run.to_str().unwrap(),
        "--quiet",
        "--set",
        &path_set("train.checkpoint_dir", &ckpt),
    ]);
    let consolidate = |out: &Path| weft(&hf_export_args(ckpt.to_str().unwrap(), out.to_str().unwrap()));
    let out = dir.join("hf");
    let done = consolidate(&out);
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    assert!(String::from_utf8_lossy(&done.stdout).contains("tokenizer.json: char"));
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(config["tokenizer_class"], "PreTrainedTokenizerFast");
    let generate = |from: &Path| {
        let o = weft_ok(&[
            "generate",
            "--checkpoint",
            from.to_str().unwrap(),
            "--prompt",
            "ab",
            "--tokens",
            "12",
            "--temperature",
            "0",
        ]);
        String::from_utf8(o.stdout).unwrap()
    };
    let text = generate(&ckpt);
    assert_eq!(generate(&out), text);
    std::fs::copy(out.join("tokenizer.json"), dir.join("hf-first-tokenizer.json")).unwrap();
    // a second export over the first leaves its (same) tokenizer.json without a word
    let again = consolidate(&out);
    assert!(again.status.success());
    assert!(!String::from_utf8_lossy(&again.stderr).contains("kept"));
    // a user's own tokenizer.json stays, said in one line
    std::fs::write(out.join("tokenizer.json"), "{\"mine\": true}").unwrap();
    let kept = consolidate(&out);
    assert!(kept.status.success());
    let err = String::from_utf8_lossy(&kept.stderr);
    assert!(err.contains("kept") && err.contains("tokenizer.json"), "{err}");
    assert_eq!(
        std::fs::read_to_string(out.join("tokenizer.json")).unwrap(),
        "{\"mine\": true}"
    );
    // a tokenizer.json that is a symlink is followed: to the same tokenizer, taken without a
    // word; to a folder, refused
    let linked = dir.join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    let same = dir.join("same-tokenizer.json");
    std::fs::copy(dir.join("hf-first-tokenizer.json"), &same).unwrap();
    std::os::unix::fs::symlink(&same, linked.join("tokenizer.json")).unwrap();
    let through = consolidate(&linked);
    assert!(through.status.success(), "{}", String::from_utf8_lossy(&through.stderr));
    assert!(!String::from_utf8_lossy(&through.stderr).contains("kept"));
    assert_eq!(generate(&linked), text);
    let to_dir = dir.join("to-dir");
    std::fs::create_dir_all(&to_dir).unwrap();
    std::os::unix::fs::symlink(dir.join("ckpt"), to_dir.join("tokenizer.json")).unwrap();
    fails_with(
        &hf_export_args(ckpt.to_str().unwrap(), to_dir.to_str().unwrap()),
        &["tokenizer.json", "not a file"],
    );
    assert!(!to_dir.join("config.json").exists());
    // a tokenizer.json that is a folder is refused, and no config.json is written
    let other = dir.join("other");
    std::fs::create_dir_all(other.join("tokenizer.json")).unwrap();
    fails_with(
        &hf_export_args(ckpt.to_str().unwrap(), other.to_str().unwrap()),
        &["tokenizer.json", "not a file"],
    );
    assert!(!other.join("config.json").exists());
    // a model without a Hugging Face form is refused before its tokenizer is written
    let nobias = dir.join("nobias");
    weft_ok(&[
        "train",
        "--config",
        run.to_str().unwrap(),
        "--quiet",
        "--set",
        "model.bias=false",
        "--set",
        &path_set("train.checkpoint_dir", &nobias),
    ]);
    let out = dir.join("nobias-hf");
    fails_with(
        &hf_export_args(nobias.to_str().unwrap(), out.to_str().unwrap()),
        &["model.bias"],
    );
    assert!(!out.exists(), "{:?}", std::fs::read_dir(&out).map(|d| d.count()));
}

#[test]
fn generate_continues_from_a_folder_with_its_tokenizer_json_as_transformers_predicts() {
    let dir = temp_dir("hf-generate");
    // 26 + 26 + 10 characters: at least every fixture's vocabulary
    let alphabet: Vec<char> = ('A'..='Z').chain('a'..='z').chain('0'..='9').collect();
    for (name, vocab) in [
        ("gpt2", 61),
        ("llama_gqa", 53),
        ("llama_tied", 47),
        ("llama_rope_llama3", 41),
        ("llama_head_dim", 45),
        ("qwen3", 39),
        ("phi3", 33),
    ] {
        let folder = fixture_copy(&dir, name);
        let chars = &alphabet[..vocab];
        std::fs::write(folder.join("tokenizer.json"), char_tokenizer_json(chars)).unwrap();
        // the prompt is the first row of ids transformers ran; greedy's one new token is the
        // largest of transformers' logits at its last position
        let (ids, logits) = expected(name);
        let t = ids[0].len();
        let prompt: String = ids[0].iter().map(|&i| chars[i as usize]).collect();
        let last = &logits[(t - 1) * vocab..t * vocab];
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
        assert!(last[order[0]] - last[order[1]] > 1e-3, "{name}: no clear greedy choice");
        let out = weft_ok(&[
            "generate",
            "--checkpoint",
            folder.to_str().unwrap(),
            "--prompt",
            &prompt,
            "--tokens",
            "1",
            "--temperature",
            "0",
        ]);
        let text = String::from_utf8(out.stdout).unwrap();
        // the folder's end-of-sequence id ends generation before it, as in transformers
        let eos = weft_models::hf::eos_ids(&folder).unwrap();
        let want = if eos.contains(&(order[0] as u32)) {
            format!("{prompt}\n")
        } else {
            format!("{prompt}{}\n", chars[order[0]])
        };
        assert_eq!(text, want, "{name}");
    }

    // an end-of-sequence id the greedy choice hits: nothing is added, but with --ignore-eos;
    // generation_config.json's id comes before config.json's
    let name = "llama_tied";
    let folder = fixture_copy(&dir.join("eos"), name);
    let chars = &alphabet[..47];
    std::fs::write(folder.join("tokenizer.json"), char_tokenizer_json(chars)).unwrap();
    let (ids, logits) = expected(name);
    let t = ids[0].len();
    let prompt: String = ids[0].iter().map(|&i| chars[i as usize]).collect();
    let last = &logits[(t - 1) * 47..t * 47];
    let greedy = (0..47).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--checkpoint",
            folder.to_str().unwrap(),
            "--prompt",
            &prompt,
            "--tokens",
            "1",
            "--temperature",
            "0",
        ];
        args.extend(extra);
        String::from_utf8(weft_ok(&args).stdout).unwrap()
    };
    std::fs::write(
        folder.join("generation_config.json"),
        format!("{{\"eos_token_id\": [46, {greedy}]}}"),
    )
    .unwrap();
    assert_eq!(run(&[]), format!("{prompt}\n"));
    assert_eq!(run(&["--ignore-eos"]), format!("{prompt}{}\n", chars[greedy]));
    std::fs::write(folder.join("generation_config.json"), "{\"eos_token_id\": null}").unwrap();
    assert_eq!(run(&[]), format!("{prompt}{}\n", chars[greedy]));
    std::fs::write(folder.join("generation_config.json"), "{\"eos_token_id\": \"two\"}").unwrap();
    fails_with(
        &[
            "generate",
            "--checkpoint",
            folder.to_str().unwrap(),
            "--prompt",
            &prompt,
        ],
        &["generation_config.json: eos_token_id: expected a token id", "\"two\""],
    );

    // without a tokenizer.json, or with a broken one: one line naming the file
    let folder = fixture_copy(&dir.join("bad"), "gpt2");
    let gen = |folder: &Path| {
        weft(&[
            "generate",
            "--checkpoint",
            folder.to_str().unwrap(),
            "--prompt",
            "ab",
            "--tokens",
            "2",
        ])
    };
    for (tokenizer, needles) in [
        (None, &["gpt2", "no tokenizer.json beside config.json"][..]),
        (
            Some("{\"model\": 3}"),
            &["tokenizer.json", "not a Hugging Face tokenizer.json"][..],
        ),
    ] {
        if let Some(text) = tokenizer {
            std::fs::write(folder.join("tokenizer.json"), text).unwrap();
        }
        let out = gen(&folder);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        for n in needles {
            assert!(stderr.contains(n), "{stderr:?} should name {n:?}");
        }
        assert!(out.stdout.is_empty());
        // the file is named once
        let file = folder.join("tokenizer.json").display().to_string();
        assert!(stderr.matches(&file).count() <= 1, "{stderr}");
    }
    // a tokenizer.json that is there but no file is named as such (it read as absent)
    let _ = std::fs::remove_file(folder.join("tokenizer.json"));
    std::fs::create_dir(folder.join("tokenizer.json")).unwrap();
    let out = gen(&folder);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("tokenizer.json: not a file (a directory)"), "{stderr}");
}

/// `consolidate --format hf -o FOLDER` into a folder holding a sharded checkpoint is refused
/// with one line naming the folder and the files in the way, and the folder is left as it was:
/// it wrote model.safetensors and config.json beside the old index and shards, and weft (which
/// reads the index first) and transformers (model.safetensors first) then loaded different
/// weights from one folder. A folder an export wrote before is replaced.
#[test]
fn consolidate_as_hf_refuses_a_folder_holding_other_weights() {
    let dir = temp_dir("hf-consolidate-over");
    let ckpt = dir.join("ckpt");
    #[rustfmt::skip]
    weft_ok(&["train", "--config", &gpt_fixture(), "--set", "train.steps=1",
        "--set", &path_set("train.checkpoint_dir", &ckpt)]);
    let sharded = fixture_copy(&dir, "llama_gqa");
    let before: Vec<(String, Vec<u8>)> = names(&sharded)
        .into_iter()
        .map(|n| (n.clone(), std::fs::read(sharded.join(&n)).unwrap()))
        .collect();
    let export = |out: &Path| weft(&hf_export_args(ckpt.to_str().unwrap(), out.to_str().unwrap()));
    let out = export(&sharded);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "{}: holds model-00001-of-00004.safetensors,",
            sharded.display()
        )) && err.contains("model.safetensors.index.json"),
        "{err}"
    );
    let after: Vec<(String, Vec<u8>)> = names(&sharded)
        .into_iter()
        .map(|n| (n.clone(), std::fs::read(sharded.join(&n)).unwrap()))
        .collect();
    assert!(after == before, "the folder changed: {:?}", names(&sharded));
    // an empty folder, then the same folder again (its config.json and model.safetensors replaced)
    let fresh = dir.join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    for _ in 0..2 {
        let out = export(&fresh);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(names(&fresh), ["config.json", "model.safetensors"]);
    }
}

/// A folder whose index is there but is not a regular file is named as such (it was taken for
/// a missing file: "holds neither model.safetensors nor model.safetensors.index.json").
#[cfg(unix)]
#[test]
fn an_index_that_is_not_a_file_is_named_as_such() {
    let dir = temp_dir("hf-index-not-a-file");
    let folder = fixture_copy(&dir, "llama_gqa");
    let index = folder.join("model.safetensors.index.json");
    std::fs::remove_file(&index).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &index).unwrap();
    #[rustfmt::skip]
    fails_with(&["generate", "--checkpoint", folder.to_str().unwrap(), "--prompt", "ab", "--tokens", "1"],
        &["model.safetensors.index.json: not a file (a character device)"]);
    std::fs::remove_file(&index).unwrap();
    let ok = std::process::Command::new("mkfifo")
        .arg(&index)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo");
    #[rustfmt::skip]
    fails_with(&["generate", "--checkpoint", folder.to_str().unwrap(), "--prompt", "ab", "--tokens", "1"],
        &["model.safetensors.index.json: not a file (a FIFO)"]);
}
