//! Hugging Face `config.json` to weft's `[model]` keys and back, for `GPT2LMHeadModel` and
//! `LlamaForCausalLM` (and `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MistralForCausalLM` and
//! `Phi3ForCausalLM`, which compute a llama). Only what weft's models compute is accepted: a key that asks for something
//! else (a rope scaling other than linear and llama3, biases on Llama's o_proj or MLP, another
//! activation) is an error naming it.

use serde_json::{json, Map, Value};
use weft_core::{Error, Result};

use crate::gpt::GptConfig;
use crate::llama::{LlamaConfig, RopeScaling};

/// transformers' `LlamaConfig` default `rms_norm_eps`, for a config.json without the key.
const TRANSFORMERS_RMS_NORM_EPS: f64 = 1e-6;

/// The architectures weft reads (and writes: a model read from a Mistral or Phi-3 folder is
/// written as the `LlamaForCausalLM` it computes, unless its width does not divide by its heads,
/// which transformers' `LlamaConfig` refuses: then as a Mistral without a sliding window).
pub const ARCHITECTURES: [&str; 6] = [
    "GPT2LMHeadModel",
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
    "Phi3ForCausalLM",
];

/// transformers' `Qwen3Config` default `head_dim` (fixed, not `hidden_size / num_attention_heads`).
const QWEN3_HEAD_DIM: usize = 128;

fn bad(source: &str, key: &str, msg: impl std::fmt::Display) -> Error {
    Error::Io(format!("{source}: {key}: {msg}"))
}

/// Reads a `config.json` as weft's `[model]` keys (with `kind`), naming `source` in errors.
pub fn to_weft_keys(text: &str, source: &str) -> Result<Map<String, Value>> {
    let v: Value = serde_json::from_str(text).map_err(|e| Error::Io(format!("{source}: not JSON: {e}")))?;
    let c = v
        .as_object()
        .ok_or_else(|| Error::Io(format!("{source}: expected a JSON object")))?;
    let arch = architecture(c, source)?;
    match arch.as_str() {
        "GPT2LMHeadModel" => gpt2_keys(c, source),
        other => llama_keys(c, source, other),
    }
}

/// The one architecture `config.json` names (`architectures`, else `model_type`).
fn architecture(c: &Map<String, Value>, source: &str) -> Result<String> {
    let named: Vec<String> = match c.get("architectures") {
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_str().map(String::from)).collect(),
        Some(other) => {
            return Err(bad(
                source,
                "architectures",
                format!("expected a list of names, got {other}"),
            ))
        }
        None => match c.get("model_type").and_then(Value::as_str) {
            Some("gpt2") => vec!["GPT2LMHeadModel".into()],
            Some("llama") => vec!["LlamaForCausalLM".into()],
            Some("qwen2") => vec!["Qwen2ForCausalLM".into()],
            Some("qwen3") => vec!["Qwen3ForCausalLM".into()],
            Some("mistral") => vec!["MistralForCausalLM".into()],
            Some("phi3") => vec!["Phi3ForCausalLM".into()],
            Some(t) => vec![t.to_string()],
            None => Vec::new(),
        },
    };
    match named.as_slice() {
        [one] if ARCHITECTURES.contains(&one.as_str()) => Ok(one.clone()),
        _ => Err(bad(
            source,
            "architectures",
            format!(
                "{named:?} is not a supported architecture (weft reads {})",
                ARCHITECTURES.join(", ")
            ),
        )),
    }
}

fn usize_key(c: &Map<String, Value>, key: &str, source: &str) -> Result<usize> {
    match c.get(key) {
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| bad(source, key, format!("expected a positive integer, got {v}"))),
        None => Err(bad(source, key, "missing")),
    }
}

fn f64_key(c: &Map<String, Value>, key: &str, default: f64, source: &str) -> Result<f64> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| bad(source, key, format!("expected a number, got {v}"))),
    }
}

fn bool_key(c: &Map<String, Value>, key: &str, default: bool, source: &str) -> Result<bool> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| bad(source, key, format!("expected true or false, got {v}"))),
    }
}

fn gpt2_keys(c: &Map<String, Value>, source: &str) -> Result<Map<String, Value>> {
    let n_embd = usize_key(c, "n_embd", source)?;
    if let Some(inner) = c.get("n_inner").filter(|v| !v.is_null()) {
        // checked: an n_embd of 2^62 or more has no MLP width (4 x n_embd wrapped around to 0)
        let width = n_embd
            .checked_mul(4)
            .ok_or_else(|| bad(source, "n_embd", format!("{n_embd}: the MLP's 4 x n_embd overflows")))?;
        if inner.as_u64() != u64::try_from(width).ok() {
            return Err(bad(
                source,
                "n_inner",
                format!("{inner}: weft's gpt has an MLP of 4 x n_embd = {width}"),
            ));
        }
    }
    let activation = match c
        .get("activation_function")
        .and_then(Value::as_str)
        .unwrap_or("gelu_new")
    {
        "gelu_new" | "gelu_pytorch_tanh" => "gelu_tanh",
        "gelu" => "gelu",
        other => {
            return Err(bad(
                source,
                "activation_function",
                format!("{other:?} is not one of gelu_new, gelu_pytorch_tanh, gelu"),
            ))
        }
    };
    let eps = f64_key(c, "layer_norm_epsilon", GptConfig::LAYER_NORM_EPS, source)?;
    if eps != GptConfig::LAYER_NORM_EPS {
        return Err(bad(
            source,
            "layer_norm_epsilon",
            format!("{eps}: weft's gpt uses {}", GptConfig::LAYER_NORM_EPS),
        ));
    }
    if !bool_key(c, "tie_word_embeddings", true, source)? {
        return Err(bad(
            source,
            "tie_word_embeddings",
            "false: weft's gpt ties its output layer to the token embedding",
        ));
    }
    for key in [
        "scale_attn_by_inverse_layer_idx",
        "reorder_and_upcast_attn",
        "add_cross_attention",
    ] {
        if bool_key(c, key, false, source)? {
            return Err(bad(source, key, "true is not supported"));
        }
    }
    if !bool_key(c, "scale_attn_weights", true, source)? {
        return Err(bad(source, "scale_attn_weights", "false is not supported"));
    }
    let mut m = Map::new();
    m.insert("kind".into(), json!("gpt"));
    m.insert("vocab_size".into(), json!(usize_key(c, "vocab_size", source)?));
    m.insert("block_size".into(), json!(usize_key(c, "n_positions", source)?));
    m.insert("n_layer".into(), json!(usize_key(c, "n_layer", source)?));
    m.insert("n_head".into(), json!(usize_key(c, "n_head", source)?));
    m.insert("n_embd".into(), json!(n_embd));
    m.insert("bias".into(), json!(true));
    m.insert("activation".into(), json!(activation));
    Ok(m)
}

/// A llama's keys from the `config.json` of `arch`: `LlamaForCausalLM`, `Qwen2ForCausalLM`
/// (biases on q, k and v; no sliding-window layers), `Qwen3ForCausalLM` (norms on the query and
/// key heads, its own head width; no sliding-window layers), `MistralForCausalLM` (whose
/// sliding window, when shorter than its positions, is its longest sequence) or
/// `Phi3ForCausalLM` (its window likewise; its fused projections are split by the weights'
/// reader). Dropout is refused, as is a `pad_token_id` that is not a token id.
fn llama_keys(c: &Map<String, Value>, source: &str, arch: &str) -> Result<Map<String, Value>> {
    let n_embd = usize_key(c, "hidden_size", source)?;
    let mut block_size = usize_key(c, "max_position_embeddings", source)?;
    match arch {
        "Qwen2ForCausalLM" | "Qwen3ForCausalLM" => {
            if bool_key(c, "use_sliding_window", false, source)? {
                return Err(bad(
                    source,
                    "use_sliding_window",
                    "true: weft's llama attends to every earlier position",
                ));
            }
            if let Some(types) = c.get("layer_types").filter(|v| !v.is_null()) {
                let all_full = types
                    .as_array()
                    .is_some_and(|a| a.iter().all(|t| t.as_str() == Some("full_attention")));
                if !all_full {
                    return Err(bad(
                        source,
                        "layer_types",
                        format!("{types}: weft's llama has full attention in every layer"),
                    ));
                }
            }
        }
        // absent, transformers' default window (Mistral's 4096, none for Phi-3). Within the
        // window sliding-window attention reads every earlier position, as weft's does: a
        // shorter window than the positions becomes the longest sequence (Mistral 7B v0.1: 4096
        // of 32768; Phi-3-mini-4k: 2047 of 4096)
        "MistralForCausalLM" | "Phi3ForCausalLM" => {
            let default = if arch == "MistralForCausalLM" {
                json!(4096)
            } else {
                Value::Null
            };
            match c.get("sliding_window").unwrap_or(&default) {
                Value::Null => {}
                w => match w.as_u64().and_then(|w| usize::try_from(w).ok()).filter(|&w| w > 0) {
                    Some(w) => block_size = block_size.min(w),
                    None => {
                        return Err(bad(
                            source,
                            "sliding_window",
                            format!("expected a positive integer or null, got {w}"),
                        ))
                    }
                },
            }
        }
        _ => {}
    }
    // weft's llama has no dropout: a config that asks for it would train another model (the
    // residual and embedding dropouts are Phi-3's keys; the other classes ignore them)
    let dropouts: &[&str] = match arch {
        "Phi3ForCausalLM" => &["attention_dropout", "resid_pdrop", "embd_pdrop"],
        _ => &["attention_dropout"],
    };
    for &key in dropouts {
        let p = f64_key(c, key, 0.0, source)?;
        if p != 0.0 {
            return Err(bad(source, key, format!("{p}: weft's llama has no dropout")));
        }
    }
    let n_head = usize_key(c, "num_attention_heads", source)?;
    // absent, transformers' default for the architecture; null, every head its own
    let n_kv_head = match (c.get("num_key_value_heads"), arch) {
        (None, "MistralForCausalLM") => 8,
        (None, "Qwen2ForCausalLM" | "Qwen3ForCausalLM") => 32,
        (None | Some(Value::Null), _) => n_head,
        (Some(_), _) => usize_key(c, "num_key_value_heads", source)?,
    };
    // a head width of its own, kept only where it is not hidden_size / num_attention_heads
    // (absent or null: that, but Qwen3's default, a fixed 128)
    let head_dim = match (c.get("head_dim").filter(|v| !v.is_null()), arch) {
        (Some(_), _) => Some(usize_key(c, "head_dim", source)?),
        (None, "Qwen3ForCausalLM") => Some(QWEN3_HEAD_DIM),
        (None, _) => None,
    }
    .filter(|&hd| !n_embd.is_multiple_of(n_head) || hd != n_embd / n_head);
    match c.get("hidden_act").and_then(Value::as_str).unwrap_or("silu") {
        "silu" => {}
        other => return Err(bad(source, "hidden_act", format!("{other:?}: weft's llama uses silu"))),
    }
    let (rope_theta, rope_scaling) = rope_of(c, source)?;
    for key in ["attention_bias", "mlp_bias"] {
        if bool_key(c, key, false, source)? {
            return Err(bad(
                source,
                key,
                "true: weft's llama has no biases on o_proj or the MLP (biases on q, k and v alone are Qwen2's)",
            ));
        }
    }
    // transformers' embedding gives the row of pad_token_id no gradient (and builds no model
    // whose pad_token_id is not a token)
    let vocab_size = usize_key(c, "vocab_size", source)?;
    let pad = match c.get("pad_token_id").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => match v.as_u64().and_then(|p| usize::try_from(p).ok()) {
            Some(p) if p < vocab_size => Some(p),
            _ => {
                return Err(bad(
                    source,
                    "pad_token_id",
                    format!("{v} is not a token id (vocab_size {vocab_size})"),
                ))
            }
        },
    };
    let mut m = Map::new();
    m.insert("kind".into(), json!("llama"));
    m.insert("vocab_size".into(), json!(vocab_size));
    m.insert("block_size".into(), json!(block_size));
    m.insert("n_layer".into(), json!(usize_key(c, "num_hidden_layers", source)?));
    m.insert("n_head".into(), json!(n_head));
    m.insert("n_kv_head".into(), json!(n_kv_head));
    m.insert("n_embd".into(), json!(n_embd));
    m.insert(
        "intermediate_size".into(),
        json!(usize_key(c, "intermediate_size", source)?),
    );
    m.insert("rope_theta".into(), json!(rope_theta));
    if let Some(scaling) = rope_scaling {
        m.insert("rope_scaling".into(), scaling_keys(&scaling));
    }
    m.insert(
        "norm_eps".into(),
        json!(f64_key(
            c,
            "rms_norm_eps",
            // Phi3Config's default differs from the others'
            if arch == "Phi3ForCausalLM" {
                1e-5
            } else {
                TRANSFORMERS_RMS_NORM_EPS
            },
            source
        )?),
    );
    m.insert(
        "tie_embeddings".into(),
        json!(bool_key(c, "tie_word_embeddings", false, source)?),
    );
    if arch == "Qwen2ForCausalLM" {
        m.insert("qkv_bias".into(), json!(true));
    }
    if let Some(hd) = head_dim {
        m.insert("head_dim".into(), json!(hd));
    }
    if let Some(p) = pad {
        m.insert("padding_idx".into(), json!(p));
    }
    if arch == "Qwen3ForCausalLM" {
        m.insert("qk_norm".into(), json!(true));
    }
    Ok(m)
}

/// The rotary base and scaling a llama `config.json` gives: transformers 5 writes
/// `rope_parameters` (`rope_type`, `rope_theta` and the scaling's keys), earlier versions a
/// top-level `rope_theta` and `rope_scaling` (its kind under `rope_type`, or `type` in older
/// files). Kinds weft computes: `default`, `linear` and `llama3`; a `llama3` without
/// `original_max_position_embeddings` takes the model's `max_position_embeddings`, and a top-level
/// `original_max_position_embeddings` comes first, as transformers reads them.
fn rope_of(c: &Map<String, Value>, source: &str) -> Result<(f64, Option<RopeScaling>)> {
    let given = |key: &str| c.get(key).filter(|v| !v.is_null());
    let (key, params) = match (given("rope_parameters"), given("rope_scaling")) {
        (Some(_), Some(_)) => {
            return Err(bad(
                source,
                "rope_scaling",
                "given beside rope_parameters: give one of them",
            ))
        }
        (Some(p), None) => ("rope_parameters", Some(p)),
        (None, Some(p)) => ("rope_scaling", Some(p)),
        (None, None) => ("rope_parameters", None),
    };
    let params = match params {
        None => None,
        Some(Value::Object(p)) => Some(p),
        Some(other) => return Err(bad(source, key, format!("expected an object, got {other}"))),
    };
    let inner = format!("{source}: {key}");
    let rope_theta = match params.filter(|p| p.get("rope_theta").is_some_and(|v| !v.is_null())) {
        Some(p) => f64_key(p, "rope_theta", LlamaConfig::DEFAULT_ROPE_THETA, &inner)?,
        None => f64_key(c, "rope_theta", LlamaConfig::DEFAULT_ROPE_THETA, source)?,
    };
    for (at, map) in [(source.to_string(), Some(c)), (inner.clone(), params)] {
        if let Some(map) = map {
            let partial = f64_key(map, "partial_rotary_factor", 1.0, &at)?;
            if partial != 1.0 {
                return Err(bad(
                    &at,
                    "partial_rotary_factor",
                    format!("{partial}: weft's llama rotates the whole head"),
                ));
            }
        }
    }
    let Some(p) = params else {
        return Ok((rope_theta, None));
    };
    // transformers' per-layer-type form ({"full_attention": {...}, "sliding_attention": {...}})
    if let Some((k, _)) = p.iter().find(|(_, v)| v.is_object()) {
        return Err(bad(
            &inner,
            k,
            "rope parameters by layer type are not supported (weft's llama has one rotary embedding)",
        ));
    }
    let kind = match p.get("rope_type").filter(|v| !v.is_null()).or(p.get("type")) {
        None | Some(Value::Null) => "default",
        Some(Value::String(t)) => t.as_str(),
        Some(other) => return Err(bad(&inner, "rope_type", format!("expected a name, got {other}"))),
    };
    let number = |k: &str| match p.get(k) {
        None | Some(Value::Null) => Err(bad(&inner, k, format!("missing (rope_type {kind:?} needs it)"))),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| bad(&inner, k, format!("expected a number, got {v}"))),
    };
    let scaling = match kind {
        "default" => None,
        "linear" => Some(RopeScaling::Linear {
            factor: number("factor")?,
        }),
        "llama3" => {
            let original = if c.get("original_max_position_embeddings").is_some_and(|v| !v.is_null()) {
                usize_key(c, "original_max_position_embeddings", source)?
            } else if p.get("original_max_position_embeddings").is_some_and(|v| !v.is_null()) {
                usize_key(p, "original_max_position_embeddings", &inner)?
            } else {
                usize_key(c, "max_position_embeddings", source)?
            };
            Some(RopeScaling::Llama3 {
                factor: number("factor")?,
                low_freq_factor: number("low_freq_factor")?,
                high_freq_factor: number("high_freq_factor")?,
                original_max_position_embeddings: original,
            })
        }
        other => {
            return Err(bad(
                &inner,
                "rope_type",
                format!("{other:?} is not supported (weft's llama computes \"default\", \"linear\" and \"llama3\")"),
            ))
        }
    };
    if let Some(s) = &scaling {
        s.check().map_err(|(k, msg)| bad(&inner, k, msg))?;
    }
    Ok((rope_theta, scaling))
}

/// weft's `[model] rope_scaling` table of `s`: transformers' names, its kind under `rope_type`.
fn scaling_keys(s: &RopeScaling) -> Value {
    match *s {
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": factor}),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
    }
}

/// The `config.json` of weft `[model]` keys (a gpt or llama), as `transformers` writes one for
/// `GPT2LMHeadModel`, `LlamaForCausalLM`, (a llama with `qkv_bias`) `Qwen2ForCausalLM`, (a
/// llama with `qk_norm`) `Qwen3ForCausalLM` or (a llama whose `n_embd` does not divide by
/// `n_head`, which `LlamaForCausalLM` refuses) `MistralForCausalLM` without a sliding window.
/// Errors for a model it cannot express.
pub fn from_weft_keys(keys: &Map<String, Value>) -> Result<Value> {
    let get = |k: &str| keys.get(k).cloned().unwrap_or(Value::Null);
    let unsupported = |msg: String| Error::Invalid { op: "hf export", msg };
    let num = |k: &str| {
        get(k)
            .as_u64()
            .ok_or_else(|| unsupported(format!("model.{k} is missing or not a whole number")))
    };
    match keys.get("kind").and_then(Value::as_str) {
        Some("gpt") => {
            if get("bias") != json!(true) {
                return Err(unsupported(
                    "model.bias = false: GPT2LMHeadModel has biases in every Linear and LayerNorm".into(),
                ));
            }
            let act = match get("activation").as_str().unwrap_or("gelu") {
                "gelu_tanh" => "gelu_new",
                "gelu" => "gelu",
                other => return Err(unsupported(format!("model.activation = {other:?} has no GPT-2 form"))),
            };
            let n_embd = num("n_embd")?;
            Ok(json!({
                "architectures": ["GPT2LMHeadModel"],
                "model_type": "gpt2",
                "vocab_size": num("vocab_size")?,
                "n_positions": num("block_size")?,
                "n_ctx": num("block_size")?,
                "n_embd": n_embd,
                "n_layer": num("n_layer")?,
                "n_head": num("n_head")?,
                "n_inner": null,
                "activation_function": act,
                "layer_norm_epsilon": GptConfig::LAYER_NORM_EPS,
                "resid_pdrop": 0.0,
                "embd_pdrop": 0.0,
                "attn_pdrop": 0.0,
                "initializer_range": 0.02,
                "tie_word_embeddings": true,
                "bos_token_id": null,
                "eos_token_id": null,
                "torch_dtype": "float32",
            }))
        }
        Some("llama") => {
            // written as transformers 4 writes it (`rope_theta`, `rope_scaling`), which
            // transformers 5 reads too
            let rope_scaling = match keys.get("rope_scaling").filter(|v| !v.is_null()) {
                None => Value::Null,
                Some(v) => {
                    let mut c = Map::new();
                    c.insert("rope_scaling".into(), v.clone());
                    c.insert("max_position_embeddings".into(), json!(num("block_size")?));
                    match rope_of(&c, "model")? {
                        (_, Some(s)) => scaling_keys(&s),
                        (_, None) => Value::Null,
                    }
                }
            };
            let mut c = json!({
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": num("vocab_size")?,
                "max_position_embeddings": num("block_size")?,
                "num_hidden_layers": num("n_layer")?,
                "num_attention_heads": num("n_head")?,
                "num_key_value_heads": num("n_kv_head")?,
                "hidden_size": num("n_embd")?,
                "intermediate_size": num("intermediate_size")?,
                "hidden_act": "silu",
                "rope_theta": get("rope_theta").as_f64().unwrap_or(LlamaConfig::DEFAULT_ROPE_THETA),
                "rms_norm_eps": get("norm_eps").as_f64().unwrap_or(LlamaConfig::DEFAULT_NORM_EPS),
                "tie_word_embeddings": get("tie_embeddings").as_bool().unwrap_or(false),
                "attention_bias": false,
                "mlp_bias": false,
                "rope_scaling": rope_scaling,
                "initializer_range": 0.02,
                "torch_dtype": "float32",
            });
            let (qkv_bias, qk_norm) = (
                get("qkv_bias").as_bool() == Some(true),
                get("qk_norm").as_bool() == Some(true),
            );
            if qkv_bias && qk_norm {
                return Err(unsupported(
                    "model.qkv_bias with model.qk_norm: Qwen3ForCausalLM's attention_bias puts a bias on o_proj too, \
                     which weft's llama does not have"
                        .into(),
                ));
            }
            let (n_embd, n_head) = (num("n_embd")?, num("n_head")?.max(1));
            let head_dim = match keys.get("head_dim").filter(|v| !v.is_null()) {
                Some(hd) => Some(
                    hd.as_u64()
                        .ok_or_else(|| unsupported("model.head_dim is not a whole number".into()))?,
                ),
                // Qwen3's config defaults head_dim to 128, so it is always written
                None => qk_norm.then_some(n_embd / n_head),
            };
            let o = c.as_object_mut().expect("an object");
            if let Some(hd) = head_dim {
                o.insert("head_dim".into(), json!(hd));
            }
            if let Some(p) = keys.get("padding_idx").filter(|v| !v.is_null()) {
                o.insert("pad_token_id".into(), p.clone());
            }
            if qk_norm {
                o.remove("mlp_bias");
                o.insert("architectures".into(), json!(["Qwen3ForCausalLM"]));
                o.insert("model_type".into(), json!("qwen3"));
                o.insert("use_sliding_window".into(), json!(false));
                o.insert("sliding_window".into(), Value::Null);
                o.insert("max_window_layers".into(), json!(num("n_layer")?));
            }
            if !qk_norm && !qkv_bias && !n_embd.is_multiple_of(n_head) {
                // transformers' LlamaConfig refuses a hidden_size that does not divide by the
                // heads, whatever head_dim says; MistralConfig takes it (Mistral NeMo's), and
                // without a sliding window a Mistral is the same computation
                o.remove("attention_bias");
                o.remove("mlp_bias");
                o.insert("architectures".into(), json!(["MistralForCausalLM"]));
                o.insert("model_type".into(), json!("mistral"));
                o.insert("sliding_window".into(), Value::Null);
            }
            if qkv_bias {
                // biases on q, k and v alone are Qwen2's attention (LlamaForCausalLM's
                // attention_bias puts one on o_proj too)
                o.remove("attention_bias");
                o.remove("mlp_bias");
                o.insert("architectures".into(), json!(["Qwen2ForCausalLM"]));
                o.insert("model_type".into(), json!("qwen2"));
                o.insert("use_sliding_window".into(), json!(false));
                o.insert("sliding_window".into(), Value::Null);
                o.insert("max_window_layers".into(), json!(num("n_layer")?));
            }
            Ok(c)
        }
        other => Err(unsupported(format!(
            "model.kind = {other:?}: Hugging Face export writes gpt and llama models only"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt_keys(extra: Value) -> Map<String, Value> {
        let mut keys = json!({"kind": "gpt", "vocab_size": 50, "block_size": 8, "n_layer": 1, "n_head": 2,
            "n_embd": 8, "bias": true});
        keys.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        keys.as_object().unwrap().clone()
    }

    #[test]
    fn export_names_what_it_cannot_write() {
        let c = from_weft_keys(&gpt_keys(json!({"activation": "gelu_tanh"}))).unwrap();
        assert_eq!(c["activation_function"], "gelu_new");
        assert_eq!(c["layer_norm_epsilon"], GptConfig::LAYER_NORM_EPS);
        let err = from_weft_keys(&gpt_keys(json!({"activation": "relu"})))
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"relu\""), "{err}");
        let mut keys = gpt_keys(json!({}));
        keys.remove("n_head");
        let err = from_weft_keys(&keys).unwrap_err().to_string();
        assert!(err.contains("model.n_head"), "{err}");
    }

    /// A llama whose width does not divide by its heads (heads of `head_dim`) is written as a
    /// Mistral without a sliding window, which transformers takes (its LlamaConfig refuses the
    /// width), and reads back as the same keys; with q/k norms or q, k and v biases it is Qwen3's
    /// or Qwen2's, which take it too.
    #[test]
    fn a_width_that_does_not_divide_by_the_heads_is_written_as_transformers_reads_it() {
        let keys = json!({"kind": "llama", "vocab_size": 50, "block_size": 16, "n_layer": 1, "n_head": 4,
            "n_kv_head": 2, "n_embd": 30, "intermediate_size": 40, "head_dim": 8, "rope_theta": 10000.0,
            "norm_eps": 1e-5, "tie_embeddings": false});
        let keys = keys.as_object().unwrap().clone();
        let c = from_weft_keys(&keys).unwrap();
        assert_eq!(c["architectures"], json!(["MistralForCausalLM"]));
        assert_eq!(c["sliding_window"], Value::Null);
        assert_eq!(c["head_dim"], json!(8));
        assert!(c.get("attention_bias").is_none() && c.get("mlp_bias").is_none());
        let back = to_weft_keys(&c.to_string(), "config.json").unwrap();
        assert_eq!(back, keys);
        for (extra, arch) in [("qk_norm", "Qwen3ForCausalLM"), ("qkv_bias", "Qwen2ForCausalLM")] {
            let mut k = keys.clone();
            k.insert(extra.into(), json!(true));
            assert_eq!(from_weft_keys(&k).unwrap()["architectures"], json!([arch]), "{extra}");
        }
        // a width that divides stays a Llama
        let mut k = keys.clone();
        k.insert("n_embd".into(), json!(32));
        assert_eq!(
            from_weft_keys(&k).unwrap()["architectures"],
            json!(["LlamaForCausalLM"])
        );
    }

    /// A GPT-2 config.json's `n_inner` is compared with 4 x `n_embd` without wrapping around: an
    /// `n_embd` of 2^63 made it 0 ("MLP of 4 x n_embd = 0").
    #[test]
    fn gpt2_mlp_width_does_not_wrap_around() {
        let config = |n_embd: u64, n_inner: u64| {
            json!({"architectures": ["GPT2LMHeadModel"], "vocab_size": 50, "n_positions": 8, "n_layer": 1,
                   "n_head": 2, "n_embd": n_embd, "n_inner": n_inner})
            .to_string()
        };
        let err = to_weft_keys(&config(1 << 63, 5), "x/config.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("x/config.json: n_embd: 9223372036854775808: the MLP's 4 x n_embd overflows"),
            "{err}"
        );
        let err = to_weft_keys(&config(1 << 62, 0), "x/config.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("n_embd") && err.contains("overflows"), "{err}");
        let err = to_weft_keys(&config(8, 33), "x/config.json").unwrap_err().to_string();
        assert!(
            err.contains("n_inner: 33: weft's gpt has an MLP of 4 x n_embd = 32"),
            "{err}"
        );
        let keys = to_weft_keys(&config(8, 32), "x/config.json").unwrap();
        assert_eq!(keys["n_embd"], 8);
    }
}
