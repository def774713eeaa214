//! `weft train` with `[model] kind = "llama"` against transformers' `LlamaForCausalLM`: both
//! fixtures (grouped-query attention untied; multi-head tied) at one process, Qwen3's attention
//! (`Qwen3ForCausalLM`: `head_dim`, `qk_norm`) in several layouts, and the GQA one
//! under data parallelism, ZeRO 1-3, tensor and pipeline parallelism and a dp x tp mesh, each
//! within the fixture's tolerances (losses 1e-4 relative, lrs exact, gradient norms 1e-4); a
//! tensor-parallel checkpoint resumed by one process; stop and resume bit for bit; `weft
//! generate` from a llama trained on text; and configs the model cannot take refused with one
//! line, exit 1.

mod common;

use std::path::{Path, PathBuf};

use common::{
    assert_same_curve, check_against_pytorch, fixture_config, losses, path_set, read_metrics, resume_in_one_process,
    temp_dir, train_config, train_fixture, weft, weft_ok,
};

/// Trains fixture `case` on `ranks` ranks (one process when 1) with `sets`; returns the metrics
/// file.
fn train(case: &str, ranks: usize, out: &Path, name: &str, flags: &[&str], sets: &[&str]) -> PathBuf {
    let metrics = out.join(format!("{name}.jsonl"));
    train_fixture(case, ranks, &metrics, flags, sets);
    metrics
}

#[test]
fn llama_gqa_adamw() {
    let out = temp_dir("llama-gqa");
    check_against_pytorch("llama_gqa_adamw", &train("llama_gqa_adamw", 1, &out, "one", &[], &[]));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn llama_tied_adamw() {
    let out = temp_dir("llama-tied");
    check_against_pytorch("llama_tied_adamw", &train("llama_tied_adamw", 1, &out, "one", &[], &[]));
    let _ = std::fs::remove_dir_all(&out);
}

/// The fixtures with `train.device = "cuda"` (f32): transformers' CPU losses within the same
/// tolerances (on a GPU, grouped-query attention repeats the key/value heads before the kernel).
/// Skipped, one line each, without a CUDA device; tools/cuda/device-check.sh runs them.
mod on_gpu {
    use super::*;

    fn on_cuda(case: &str) {
        if !common::cuda_or_skip(&format!("on_gpu::{case}")) {
            return;
        }
        let out = temp_dir(&format!("{case}-gpu"));
        check_against_pytorch(case, &train(case, 1, &out, "gpu", &[], &["train.device=\"cuda\""]));
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn llama_gqa_adamw() {
        on_cuda("llama_gqa_adamw");
    }

    #[test]
    fn llama_tied_adamw() {
        on_cuda("llama_tied_adamw");
    }

    #[test]
    fn llama_qwen3_adamw() {
        on_cuda("llama_qwen3_adamw");
    }
}

#[test]
fn data_parallel_and_every_zero_stage_reproduce_transformers() {
    let out = temp_dir("llama-dp");
    for zero in 0..=3 {
        let z = format!("parallel.zero={zero}");
        let metrics = train(
            "llama_gqa_adamw",
            2,
            &out,
            &format!("dp2-zero{zero}"),
            &[],
            &["parallel.dp=2", &z],
        );
        let worst = check_against_pytorch("llama_gqa_adamw", &metrics);
        eprintln!("llama dp=2 zero={zero}: max relative loss difference {worst:.2e}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn tensor_and_pipeline_parallel_layouts_reproduce_transformers() {
    let out = temp_dir("llama-tp-pp");
    let pipeline = [
        "parallel.pp=2",
        "parallel.schedule=\"1f1b\"",
        "parallel.micro_batches=2",
    ];
    for (case, ranks, name, sets) in [
        ("llama_gqa_adamw", 2, "tp2", vec!["parallel.tp=2"]),
        ("llama_gqa_adamw", 2, "pp2-1f1b-m2", pipeline.to_vec()),
        ("llama_gqa_adamw", 4, "dp2-tp2", vec!["parallel.dp=2", "parallel.tp=2"]),
        // sequence parallelism: each rank holds half the tokens between the tensor-parallel
        // regions, alone, with data parallelism and across pipeline stages
        (
            "llama_gqa_adamw",
            2,
            "tp2-sp",
            vec!["parallel.tp=2", "parallel.sequence_parallel=true"],
        ),
        (
            "llama_gqa_adamw",
            4,
            "dp2-tp2-sp",
            vec!["parallel.dp=2", "parallel.tp=2", "parallel.sequence_parallel=true"],
        ),
        (
            "llama_tied_adamw",
            4,
            "tied-tp2-pp2-sp",
            [&pipeline[..], &["parallel.tp=2", "parallel.sequence_parallel=true"]].concat(),
        ),
        // the tied embedding is held by the first and the last stage
        ("llama_tied_adamw", 2, "tied-pp2-1f1b-m2", pipeline.to_vec()),
    ] {
        let metrics = train(case, ranks, &out, name, &[], &sets);
        let worst = check_against_pytorch(case, &metrics);
        eprintln!("{case} {name}: max relative loss difference {worst:.2e}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// Qwen3's attention (heads of width 12 where `n_embd / n_head` is 8, an RMSNorm over each query
/// and key head) against transformers' `Qwen3ForCausalLM`: one process; tensor parallelism, where
/// each rank normalizes its own heads with the whole norm weights and their gradients are summed
/// over the group (without that sum the ranks' weights drift apart and the losses leave the
/// reference), also sequence-parallel; a pipeline; and data parallelism with ZeRO 3.
#[test]
fn qwen3_attention_reproduces_transformers_in_every_layout() {
    let case = "llama_qwen3_adamw";
    let out = temp_dir("llama-qwen3");
    let pipeline = vec![
        "parallel.pp=2",
        "parallel.schedule=\"1f1b\"",
        "parallel.micro_batches=2",
    ];
    for (ranks, name, sets) in [
        (1, "one", vec![]),
        (2, "tp2", vec!["parallel.tp=2"]),
        (2, "tp2-sp", vec!["parallel.tp=2", "parallel.sequence_parallel=true"]),
        (2, "pp2-1f1b-m2", pipeline),
        (2, "dp2-zero3", vec!["parallel.dp=2", "parallel.zero=3"]),
    ] {
        let metrics = train(case, ranks, &out, name, &[], &sets);
        let worst = check_against_pytorch(case, &metrics);
        eprintln!("{case} {name}: max relative loss difference {worst:.2e}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_tensor_parallel_checkpoint_is_whole_and_resumes_in_one_process() {
    let case = "llama_gqa_adamw";
    let out = temp_dir("llama-tp-ckpt");
    let ckpt = out.join("ckpt");
    let dir = path_set("train.checkpoint_dir", &ckpt);
    let whole = losses(&train(case, 1, &out, "whole", &[], &[]));
    train(case, 2, &out, "first", &[], &["parallel.tp=2", &dir, "train.steps=20"]);
    let step20 = ckpt.join("step-00000020");
    let loaded = weft_train::checkpoint::read(&step20).unwrap();
    // whole tensors under transformers' names, the vocabulary's padding cut away
    assert_eq!(loaded.params["model.embed_tokens.weight"].shape(), [65, 32]);
    assert_eq!(loaded.params["lm_head.weight"].shape(), [65, 32]);
    assert_eq!(
        loaded.params["model.layers.0.self_attn.k_proj.weight"].shape(),
        [16, 32]
    );
    assert_eq!(loaded.params["model.layers.1.mlp.down_proj.weight"].shape(), [32, 64]);
    let one = resume_in_one_process(&fixture_config(case), &step20, &out.join("one"));
    assert_same_curve(&whole[20..], &one, 1e-5, "llama tp=2 checkpoint resumed by one process");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn stop_and_resume_reproduce_the_uninterrupted_run_bit_for_bit() {
    let case = "llama_tied_adamw";
    let out = temp_dir("llama-resume");
    let full = read_metrics(&train(case, 1, &out, "full", &[], &[]));
    let dir = path_set("train.checkpoint_dir", &out.join("ckpt"));
    let sets = [dir.as_str(), "train.checkpoint_every=10"];
    let first: Vec<&str> = sets.iter().copied().chain(["train.steps=25"]).collect();
    let part = train(case, 1, &out, "part", &[], &first);
    // the second run appends to the same metrics file
    let metrics = path_set("train.metrics", &part);
    let config = fixture_config(case);
    #[rustfmt::skip]
    weft_ok(&["train", "--config", config.to_str().unwrap(), "--quiet", "--resume", "--set", &metrics,
        "--set", sets[0], "--set", sets[1]]);
    let resumed = read_metrics(&part);
    assert_eq!(resumed.len(), full.len());
    for (x, y) in full.iter().zip(&resumed) {
        assert_eq!(x["step"], y["step"]);
        assert_eq!(x["loss"].as_f64(), y["loss"].as_f64(), "step {}", x["step"]);
        assert_eq!(x["grad_norm"].as_f64(), y["grad_norm"].as_f64(), "step {}", x["step"]);
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// A tiny llama on the built-in corpus (characters), 5 steps, its `[model]` section completed by
/// `model` (at least `n_kv_head` and `n_embd`), then `parallel` (a `[parallel]` section or
/// nothing).
fn text_config(dir: &Path, model: &str, parallel: &str) -> PathBuf {
    let path = dir.join("llama.toml");
    let text = format!(
        r#"
[model]
kind = "llama"
vocab_size = 128
block_size = 16
n_layer = 2
n_head = 4
intermediate_size = 64
{model}

[data]
kind = "text"
path = "builtin"
batch_size = 4
val_fraction = 0.1

[optim]
kind = "adamw"
lr = 0.003
weight_decay = 0.1
grad_clip = 1.0

[train]
steps = 5
seed = 7
log_every = 5
eval_every = 0
sample_tokens = 20

{parallel}
"#
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A llama with biases on q, k and v (Qwen2's attention): the biases are parameters that train
/// (named as transformers names them), and tensor parallelism cuts them with their weights: two
/// ranks at `tp = 2` give the losses of one process.
#[test]
fn qkv_biases_train_and_cut_with_tensor_parallelism() {
    let out = temp_dir("llama-qkv-bias");
    let config = text_config(&out, "n_kv_head = 2\nn_embd = 32\nqkv_bias = true", "");
    let (one, tp, ckpt) = (out.join("one.jsonl"), out.join("tp.jsonl"), out.join("ckpt"));
    train_config(&config, 1, &one, &[], &[path_set("train.checkpoint_dir", &ckpt)]);
    train_config(&config, 2, &tp, &[], &["parallel.tp=2"]);
    common::assert_same_curve(&losses(&one), &losses(&tp), 1e-5, "tp = 2 against one process");
    // the checkpoint holds the biases, moved away from their zero start
    let w = weft_core::io::safetensors::load(&ckpt.join("step-00000005").join("model-rank-00000.safetensors")).unwrap();
    let b = &w.tensors["model.layers.0.self_attn.k_proj.bias"];
    assert_eq!(b.shape(), [16]);
    assert!(b.to_vec_f64().iter().any(|x| *x != 0.0), "k_proj.bias did not train");
    let _ = std::fs::remove_dir_all(&out);
}

/// Heads of their own width where `n_embd` (30) does not divide by `n_head` (4), with Qwen3's
/// head norms: the run trains (its loss falls), checkpoints the norms at `[head_dim]`, and
/// `weft generate` samples from the checkpoint through the key/value cache.
#[test]
fn a_llama_with_its_own_head_width_trains_and_generates() {
    let out = temp_dir("llama-head-dim");
    let config = text_config(&out, "n_kv_head = 2\nn_embd = 30\nhead_dim = 8\nqk_norm = true", "");
    let (ckpt, metrics) = (out.join("ckpt"), out.join("m.jsonl"));
    let sets = [
        path_set("train.checkpoint_dir", &ckpt),
        "train.steps=20".into(),
        "train.log_every=1".into(),
    ];
    train_config(&config, 1, &metrics, &[], &sets);
    let l = losses(&metrics);
    assert!(l[19] < l[0] - 0.3, "{l:?}");
    let w = weft_core::io::safetensors::load(&ckpt.join("step-00000020").join("model-rank-00000.safetensors")).unwrap();
    assert_eq!(w.tensors["model.layers.1.self_attn.k_norm.weight"].shape(), [8]);
    assert_eq!(w.tensors["model.layers.0.self_attn.q_proj.weight"].shape(), [32, 30]);
    assert_eq!(w.tensors["model.layers.0.self_attn.o_proj.weight"].shape(), [30, 32]);
    let text = generate_from(&ckpt, "12", "3");
    assert!(text.starts_with("The ") && text.chars().count() >= 16, "{text:?}");
    let _ = std::fs::remove_dir_all(&out);
}

/// `weft generate` of `tokens` characters after "The " from the checkpoint folder `ckpt`, drawn
/// with `seed`: its stdout.
fn generate_from(ckpt: &Path, tokens: &str, seed: &str) -> String {
    let out = weft_ok(&[
        "generate",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--prompt",
        "The ",
        "--tokens",
        tokens,
        "--seed",
        seed,
    ]);
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_llama_trained_on_text_samples_and_generates_from_its_checkpoint() {
    let out = temp_dir("llama-generate");
    let config = text_config(&out, "n_kv_head = 2\nn_embd = 32\nrope_theta = 1000.0", "");
    let ckpt = out.join("ckpt");
    let run = weft_ok(&[
        "train",
        "--config",
        config.to_str().unwrap(),
        "--quiet",
        "--set",
        &path_set("train.checkpoint_dir", &ckpt),
    ]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("--- sample (20 characters) ---"), "{stdout}");
    let generate = |seed: &str| generate_from(&ckpt, "30", seed);
    let a = generate("1");
    assert!(a.starts_with("The "), "{a:?}");
    assert_eq!(a.trim_end_matches('\n').chars().count(), 4 + 30, "{a:?}");
    assert_eq!(a, generate("1"), "the same seed generates the same text");
    // a config whose sizes the tensors do not have is refused before the model is built
    let step = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("step-"))
        .unwrap();
    let index_path = step.join(weft_train::checkpoint::INDEX);
    let mut index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    assert_eq!(index["state"]["extra"]["model"]["kind"], "llama");
    index["state"]["extra"]["model"]["n_kv_head"] = serde_json::json!(4);
    std::fs::write(&index_path, serde_json::to_string(&index).unwrap()).unwrap();
    let r = weft(&["generate", "--checkpoint", ckpt.to_str().unwrap(), "--tokens", "3"]);
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("model.n_kv_head: 4") && stderr.contains("k_proj.weight"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn configs_the_model_cannot_take_are_refused_with_one_line() {
    let out = temp_dir("llama-bad");
    let cases: [(&str, &str, &[&str]); 7] = [
        (
            "n_kv_head = 3\nn_embd = 32",
            "",
            &["model.n_head: 4 does not divide by n_kv_head = 3"],
        ),
        (
            "n_kv_head = 1\nn_embd = 32",
            "[parallel]\ntp = 2",
            &["model.n_kv_head", "1 does not divide by parallel.tp = 2"],
        ),
        (
            "n_kv_head = 2\nn_embd = 12",
            "",
            &["model.n_embd", "head dim of 3", "even"],
        ),
        ("n_kv_head = 2\nn_embd = 32\nrope_scaling = 2.0", "", &["rope_scaling"]),
        (
            "n_kv_head = 2\nn_embd = 32\nhead_dim = 7",
            "",
            &["model.head_dim: 7: rotary embeddings need a positive, even head dim"],
        ),
        (
            "n_kv_head = 2\nn_embd = 32\nhead_dim = 0",
            "",
            &["model.head_dim: 0: rotary embeddings need a positive, even head dim"],
        ),
        // with a head width of its own, n_embd need not divide by n_head, but n_head by n_kv_head
        (
            "n_kv_head = 3\nn_embd = 30\nhead_dim = 8\nqk_norm = true",
            "",
            &["model.n_head: 4 does not divide by n_kv_head = 3"],
        ),
    ];
    for (i, (model, parallel, needles)) in cases.iter().enumerate() {
        let dir = out.join(format!("case{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = text_config(&dir, model, parallel);
        let r = weft(&["train", "--config", config.to_str().unwrap(), "--quiet"]);
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(1), "{model:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{model:?}: one line, got {stderr}");
        assert!(stderr.starts_with("weft: error: "), "{stderr}");
        for n in *needles {
            assert!(stderr.contains(n), "{model:?}: {n:?} in {stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}
