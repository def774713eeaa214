//! The llama against transformers' `LlamaForCausalLM`: logits, loss and every parameter's
//! gradient of one batch, from fixtures written by tools/reference/make_llama_fixtures.py.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;

use weft_core::Tensor;
use weft_models::llama::{Llama, LlamaConfig};
use weft_models::{LanguageModel, Model};
use weft_nn::Module;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The case's config (from its json) and tensors.
fn load(case: &str) -> (LlamaConfig, BTreeMap<String, Tensor>) {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(&format!("llama_{case}_grads.json"))).unwrap()).unwrap();
    let config = support::llama_config(&json["model"]);
    let tensors = weft_core::io::safetensors::load(&fixture(&format!("llama_{case}_grads.safetensors")))
        .unwrap()
        .tensors;
    (config, tensors)
}

/// Largest `|a - b|` over the largest `|b|` (at least 1e-3).
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_vec_f64(), b.to_vec_f64());
    let scale = b.iter().fold(1e-3f64, |m, x| m.max(x.abs()));
    a.iter().zip(&b).fold(0.0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn check_case(case: &str) {
    let (config, t) = load(case);
    let model = Llama::new(config.clone(), 0).unwrap();
    let params: BTreeMap<String, Tensor> = t
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("param.")?.to_string(), v.clone())))
        .collect();
    weft_nn::state_dict::load_state_dict(&model, &params, model.aliases(), case).unwrap();
    // the names are transformers' exactly, the tied head under the embedding's name
    let ours: Vec<String> = model.parameters().into_iter().map(|(n, _)| n).collect();
    let theirs: Vec<String> = params.keys().cloned().collect();
    let mut sorted = ours.clone();
    sorted.sort();
    assert_eq!(sorted, theirs, "{case}: parameter names");
    assert_eq!(ours.contains(&"lm_head.weight".to_string()), !config.tie_embeddings);

    let logits = model.forward_ids(&t["inputs"]).unwrap();
    let e = rel_err(&logits, &t["logits"]);
    assert!(e < 1e-5, "{case}: logits differ by {e:e}");
    let loss = model.loss(&t["inputs"], &t["targets"]).unwrap();
    let e = rel_err(&loss.reshape(&[1]).unwrap(), &t["loss"]);
    assert!(e < 1e-6, "{case}: loss differs by {e:e}");
    loss.backward().unwrap();
    for (name, p) in model.parameters() {
        let g = p.grad().unwrap_or_else(|| panic!("{case}: no gradient for {name}"));
        let e = rel_err(&g, &t[&format!("grad.{name}")]);
        assert!(e < 1e-5, "{case}: gradient of {name} differs by {e:e}");
    }
}

#[test]
fn grouped_query_attention_matches_transformers() {
    check_case("gqa");
}

#[test]
fn tied_multi_head_matches_transformers() {
    check_case("tied");
}

/// Qwen3's attention: heads of their own width (12, where `n_embd / n_head` is 8) and an RMSNorm
/// over each query and key head, whose weights get their gradients too.
#[test]
fn qwen3_head_norms_and_head_width_match_transformers() {
    check_case("qwen3");
}

/// transformers' `pad_token_id` (weft's `padding_idx`): the embedding row of that id gets no
/// gradient from its lookups; tied, the head's gradient still reaches it. Without the setting
/// the row's gradient differs, so the check can tell.
#[test]
fn a_padding_id_gets_no_gradient_from_its_lookups_as_in_transformers() {
    check_case("pad");
    let (config, t) = load("pad");
    let p = config.padding_idx.expect("the pad case sets padding_idx");
    let row = |g: &Tensor| g.narrow(0, p, 1).unwrap().to_vec_f64();
    let want = row(&t["grad.model.embed_tokens.weight"]);
    let without = Llama::new(
        LlamaConfig {
            padding_idx: None,
            ..config
        },
        0,
    )
    .unwrap();
    let params: BTreeMap<String, Tensor> = t
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("param.")?.to_string(), v.clone())))
        .collect();
    weft_nn::state_dict::load_state_dict(&without, &params, without.aliases(), "pad").unwrap();
    without.loss(&t["inputs"], &t["targets"]).unwrap().backward().unwrap();
    let got = row(&without.embed_tokens.weight.grad().unwrap());
    let gap = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(gap > 1e-3, "{gap}");
    // a new model starts with the row at zero, as transformers initialises it; an id past the
    // vocabulary is refused naming the key
    let fresh = Llama::new(config.clone(), 3).unwrap();
    assert!(row(&fresh.embed_tokens.weight).iter().all(|&x| x == 0.0));
    let other = Llama::new(
        LlamaConfig {
            padding_idx: None,
            ..config.clone()
        },
        3,
    )
    .unwrap();
    assert!(row(&other.embed_tokens.weight).iter().any(|&x| x != 0.0));
    let e = Llama::new(
        LlamaConfig {
            padding_idx: Some(65),
            ..config
        },
        0,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("padding_idx: 65 is not a token id (vocab_size 65)"), "{e}");
}

#[test]
fn the_initialisation_is_transformers() {
    let config = LlamaConfig {
        vocab_size: 300,
        block_size: 8,
        n_layer: 2,
        n_head: 4,
        n_kv_head: 1,
        n_embd: 64,
        intermediate_size: 96,
        rope_theta: 10000.0,
        rope_scaling: None,
        norm_eps: 1e-5,
        tie_embeddings: false,
        qkv_bias: false,
        head_dim: None,
        qk_norm: false,
        padding_idx: None,
    };
    let model = Llama::new(config, 3).unwrap();
    for (name, p) in model.parameters() {
        let v = p.to_vec_f64();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let std = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        if name.ends_with("norm.weight") {
            assert!(v.iter().all(|&x| x == 1.0), "{name}");
        } else {
            assert!(
                p.rank() == 2 && (std - 0.02).abs() < 0.002 && mean.abs() < 0.002,
                "{name}: {mean} {std}"
            );
        }
    }
    // same seed, same weights; another seed, others
    let again = Llama::new(model.config.clone(), 3).unwrap();
    let other = Llama::new(model.config.clone(), 4).unwrap();
    let w = |m: &Llama| m.parameters()[2].1.to_vec_f64();
    assert_eq!(w(&model), w(&again));
    assert_ne!(w(&model), w(&other));
}

#[test]
fn ids_past_block_size_or_the_vocabulary_are_refused() {
    let (config, _) = load("gqa");
    let model = Llama::new(config, 0).unwrap();
    let long = Tensor::from_vec(vec![1i64; 17], &[1, 17]).unwrap();
    let e = model.forward_ids(&long).unwrap_err().to_string();
    assert!(e.contains("block_size = 16"), "{e}");
    let bad = Tensor::from_vec(vec![1i64, 65], &[1, 2]).unwrap();
    let e = model.forward_ids(&bad).unwrap_err().to_string();
    assert!(e.contains("65"), "{e}");
}
