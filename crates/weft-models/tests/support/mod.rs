//! Helpers shared by the model tests.

use weft_models::llama::{LlamaConfig, RopeScaling};

/// The llama config of weft `[model]` keys as JSON (a fixture's, or a Hugging Face folder's
/// translated ones); panics naming a missing key.
pub fn llama_config(m: &serde_json::Value) -> LlamaConfig {
    let n = |k: &str| m[k].as_u64().unwrap_or_else(|| panic!("{k}")) as usize;
    let f = |k: &str| m[k].as_f64().unwrap_or_else(|| panic!("{k}"));
    LlamaConfig {
        vocab_size: n("vocab_size"),
        block_size: n("block_size"),
        n_layer: n("n_layer"),
        n_head: n("n_head"),
        n_kv_head: n("n_kv_head"),
        n_embd: n("n_embd"),
        intermediate_size: n("intermediate_size"),
        rope_theta: f("rope_theta"),
        rope_scaling: rope_scaling(&m["rope_scaling"]),
        norm_eps: f("norm_eps"),
        tie_embeddings: m["tie_embeddings"]
            .as_bool()
            .unwrap_or_else(|| panic!("tie_embeddings")),
        qkv_bias: m["qkv_bias"].as_bool().unwrap_or(false),
        head_dim: m["head_dim"].as_u64().map(|h| h as usize),
        qk_norm: m["qk_norm"].as_bool().unwrap_or(false),
        padding_idx: m["padding_idx"].as_u64().map(|p| p as usize),
    }
}

/// A `rope_scaling` table of weft `[model]` keys (`None` when absent); panics naming a missing key.
pub fn rope_scaling(v: &serde_json::Value) -> Option<RopeScaling> {
    if v.is_null() {
        return None;
    }
    let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("rope_scaling.{k}"));
    Some(match v["rope_type"].as_str() {
        Some("linear") => RopeScaling::Linear { factor: f("factor") },
        Some("llama3") => RopeScaling::Llama3 {
            factor: f("factor"),
            low_freq_factor: f("low_freq_factor"),
            high_freq_factor: f("high_freq_factor"),
            original_max_position_embeddings: v["original_max_position_embeddings"]
                .as_u64()
                .unwrap_or_else(|| panic!("rope_scaling.original_max_position_embeddings"))
                as usize,
        },
        other => panic!("rope_scaling.rope_type {other:?}"),
    })
}
