//! Hugging Face `config.json` to weft's `[model]` keys and back, for `GPT2LMHeadModel` and
//! `LlamaForCausalLM`. Only what weft's models compute is accepted: a key that asks for
//! something else (rope scaling, biases in llama, another activation) is an error naming it.

use serde_json::{json, Map, Value};
use weft_core::{Error, Result};

use crate::gpt::GptConfig;
use crate::llama::LlamaConfig;

/// transformers' `LlamaConfig` default `rms_norm_eps`, for a config.json without the key.
const TRANSFORMERS_RMS_NORM_EPS: f64 = 1e-6;

/// The architectures weft reads and writes.
pub const ARCHITECTURES: [&str; 2] = ["GPT2LMHeadModel", "LlamaForCausalLM"];

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
        _ => llama_keys(c, source),
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

fn llama_keys(c: &Map<String, Value>, source: &str) -> Result<Map<String, Value>> {
    let n_embd = usize_key(c, "hidden_size", source)?;
    let n_head = usize_key(c, "num_attention_heads", source)?;
    let n_kv_head = match c.get("num_key_value_heads") {
        None | Some(Value::Null) => n_head,
        Some(_) => usize_key(c, "num_key_value_heads", source)?,
    };
    if let Some(hd) = c.get("head_dim").filter(|v| !v.is_null()) {
        if !n_embd.is_multiple_of(n_head) || hd.as_u64() != Some((n_embd / n_head) as u64) {
            return Err(bad(
                source,
                "head_dim",
                format!("{hd}: weft's llama has heads of hidden_size / num_attention_heads"),
            ));
        }
    }
    match c.get("hidden_act").and_then(Value::as_str).unwrap_or("silu") {
        "silu" => {}
        other => return Err(bad(source, "hidden_act", format!("{other:?}: weft's llama uses silu"))),
    }
    if let Some(s) = c.get("rope_scaling").filter(|v| !v.is_null()) {
        return Err(bad(
            source,
            "rope_scaling",
            format!("{s} is not supported (plain rotary embeddings only)"),
        ));
    }
    // transformers 5 writes `rope_parameters` ({rope_theta, rope_type}); earlier versions a
    // top-level `rope_theta`
    let rope_theta = match c.get("rope_parameters").filter(|v| !v.is_null()) {
        Some(Value::Object(p)) => {
            match p.get("rope_type").and_then(Value::as_str).unwrap_or("default") {
                "default" => {}
                other => {
                    return Err(bad(
                        source,
                        "rope_parameters.rope_type",
                        format!("{other:?} is not supported (plain rotary embeddings only)"),
                    ))
                }
            }
            f64_key(
                p,
                "rope_theta",
                LlamaConfig::DEFAULT_ROPE_THETA,
                &format!("{source}: rope_parameters"),
            )?
        }
        Some(other) => {
            return Err(bad(
                source,
                "rope_parameters",
                format!("expected an object, got {other}"),
            ))
        }
        None => f64_key(c, "rope_theta", LlamaConfig::DEFAULT_ROPE_THETA, source)?,
    };
    for key in ["attention_bias", "mlp_bias"] {
        if bool_key(c, key, false, source)? {
            return Err(bad(source, key, "true: weft's llama has no biases"));
        }
    }
    let mut m = Map::new();
    m.insert("kind".into(), json!("llama"));
    m.insert("vocab_size".into(), json!(usize_key(c, "vocab_size", source)?));
    m.insert(
        "block_size".into(),
        json!(usize_key(c, "max_position_embeddings", source)?),
    );
    m.insert("n_layer".into(), json!(usize_key(c, "num_hidden_layers", source)?));
    m.insert("n_head".into(), json!(n_head));
    m.insert("n_kv_head".into(), json!(n_kv_head));
    m.insert("n_embd".into(), json!(n_embd));
    m.insert(
        "intermediate_size".into(),
        json!(usize_key(c, "intermediate_size", source)?),
    );
    m.insert("rope_theta".into(), json!(rope_theta));
    m.insert(
        "norm_eps".into(),
        json!(f64_key(c, "rms_norm_eps", TRANSFORMERS_RMS_NORM_EPS, source)?),
    );
    m.insert(
        "tie_embeddings".into(),
        json!(bool_key(c, "tie_word_embeddings", false, source)?),
    );
    Ok(m)
}

/// The `config.json` of weft `[model]` keys (a gpt or llama), as `transformers` writes one for
/// `GPT2LMHeadModel` or `LlamaForCausalLM`. Errors for a model it cannot express.
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
        Some("llama") => Ok(json!({
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
            "rope_scaling": null,
            "initializer_range": 0.02,
            "torch_dtype": "float32",
        })),
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
