//! Hugging Face checkpoint folders: `config.json` plus `model.safetensors` (or shards listed in
//! `model.safetensors.index.json`), for `GPT2LMHeadModel` and `LlamaForCausalLM`, read into
//! weft's `[model]` keys and parameter names, and written back from them.
//!
//! Names: llama's are Hugging Face's already. GPT-2 checkpoints name tensors with or without
//! `transformer.` (as `GPT2LMHeadModel` or `GPT2Model` saved them) and store the weights of its
//! `Conv1D` layers (`attn.c_attn`, `attn.c_proj`, `mlp.c_fc`, `mlp.c_proj`) as `[in, out]`: they
//! are transposed into weft's `[out, in]`. The attention-mask buffers older GPT-2 files hold
//! (`attn.bias`, `attn.masked_bias`) and llama's `rotary_emb.inv_freq` are not parameters and are
//! dropped. Tied output layers are not written (as `transformers` saves them).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};
use weft_core::io::safetensors;
use weft_core::{Error, Result, Tensor};

mod config;
pub use config::{from_weft_keys, to_weft_keys, ARCHITECTURES};

/// The single-file weights of a checkpoint folder.
pub const WEIGHTS: &str = "model.safetensors";
/// The index of sharded weights.
pub const WEIGHTS_INDEX: &str = "model.safetensors.index.json";

/// A Hugging Face checkpoint read into weft's terms.
pub struct HfCheckpoint {
    /// weft's `[model]` keys, with `kind`.
    pub model: Map<String, Value>,
    /// The parameters, by weft name, in weft's layout.
    pub tensors: BTreeMap<String, Tensor>,
}

/// Whether `dir` is a Hugging Face checkpoint folder (it holds a `config.json`).
pub fn is_checkpoint_folder(dir: &Path) -> bool {
    dir.is_dir() && dir.join("config.json").is_file()
}

/// Reads the checkpoint folder `dir`: its config and all its weights, checked against each
/// other (every file the index names exists and holds what it says).
pub fn read_folder(dir: &Path) -> Result<HfCheckpoint> {
    let config_path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&config_path).map_err(|e| Error::Io(format!("{}: {e}", config_path.display())))?;
    let model = to_weft_keys(&text, &config_path.display().to_string())?;
    let raw = read_weights(dir)?;
    let tensors = match model.get("kind").and_then(Value::as_str) {
        Some("gpt") => gpt2_to_weft(raw, &dir.display().to_string())?,
        _ => raw
            .into_iter()
            .filter(|(n, _)| !n.ends_with("rotary_emb.inv_freq"))
            .collect(),
    };
    Ok(HfCheckpoint { model, tensors })
}

/// The tensors of `model.safetensors`, or of every shard `model.safetensors.index.json` lists.
fn read_weights(dir: &Path) -> Result<BTreeMap<String, Tensor>> {
    let single = dir.join(WEIGHTS);
    let index = dir.join(WEIGHTS_INDEX);
    if !index.is_file() {
        if !single.is_file() {
            return Err(Error::Io(format!(
                "{}: holds neither {WEIGHTS} nor {WEIGHTS_INDEX}",
                dir.display()
            )));
        }
        return Ok(safetensors::load(&single)?.tensors);
    }
    let source = index.display().to_string();
    let text = std::fs::read_to_string(&index).map_err(|e| Error::Io(format!("{source}: {e}")))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| Error::Io(format!("{source}: not JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::Io(format!("{source}: weight_map: missing, or not an object")))?;
    let mut by_file: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, file) in map {
        let file = file
            .as_str()
            .filter(|f| !f.is_empty() && !f.contains('/') && !f.contains('\\') && *f != "." && *f != "..")
            .ok_or_else(|| {
                Error::Io(format!(
                    "{source}: weight_map.{name}: {file} is not a file name in the folder"
                ))
            })?;
        by_file.entry(file).or_default().push(name);
    }
    let mut out = BTreeMap::new();
    for (file, names) in by_file {
        let mut shard = safetensors::load(&dir.join(file))?.tensors;
        for name in names {
            let t = shard.remove(name).ok_or_else(|| {
                Error::Io(format!(
                    "{source}: weight_map puts {name:?} in {file}, which does not hold it"
                ))
            })?;
            out.insert(name.to_string(), t);
        }
    }
    Ok(out)
}

/// GPT-2 `Conv1D` weights (stored `[in, out]`), by their name after `h.{i}.`.
const CONV1D: [&str; 4] = [
    "attn.c_attn.weight",
    "attn.c_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
];

fn is_conv1d(name: &str) -> bool {
    name.starts_with("transformer.h.") && CONV1D.iter().any(|c| name.ends_with(&format!(".{c}")))
}

/// A GPT-2 state dict in weft's names and layout (see the module's notes).
fn gpt2_to_weft(raw: BTreeMap<String, Tensor>, source: &str) -> Result<BTreeMap<String, Tensor>> {
    let mut out = BTreeMap::new();
    let mut head = None;
    for (name, t) in raw {
        if name == "lm_head.weight" {
            head = Some(t);
            continue;
        }
        let bare = name.strip_prefix("transformer.").unwrap_or(&name);
        if bare.ends_with(".attn.bias") && t.rank() == 4 || bare.ends_with(".attn.masked_bias") {
            continue; // mask buffers
        }
        let weft = format!("transformer.{bare}");
        let t = if is_conv1d(&weft) { t.t()?.contiguous()? } else { t };
        out.insert(weft, t);
    }
    if let (Some(head), Some(wte)) = (head, out.get("transformer.wte.weight")) {
        // compared in place (a GPT-2 head is 50257 x 768: no f64 copies of it)
        let same = head.shape() == wte.shape()
            && head.dtype() == wte.dtype()
            && head.sub(wte)?.abs()?.sum_all()?.item()? == 0.0;
        if !same {
            return Err(Error::Io(format!(
                "{source}: lm_head.weight differs from transformer.wte.weight; weft's gpt ties them"
            )));
        }
    }
    Ok(out)
}

/// Writes weft parameters `tensors` of a model with `[model]` keys `model` into `dir` as a
/// Hugging Face checkpoint folder (`config.json`, `model.safetensors` with `format: pt`),
/// loadable by `transformers`' `from_pretrained`. `aliases` (`(alternative, canonical)` names
/// of tied weights) are left out, as `transformers` leaves them out.
pub fn write_folder(
    dir: &Path,
    model: &Map<String, Value>,
    tensors: &BTreeMap<String, Tensor>,
    aliases: &[(&str, &str)],
) -> Result<()> {
    let config = from_weft_keys(model)?;
    let gpt = model.get("kind").and_then(Value::as_str) == Some("gpt");
    let mut out: Vec<(String, Tensor)> = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if aliases.iter().any(|(alt, _)| alt == name) {
            continue;
        }
        let t = if gpt && is_conv1d(name) {
            t.t()?.contiguous()?
        } else {
            t.clone()
        };
        out.push((name.clone(), t));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
    let text = serde_json::to_string_pretty(&config).map_err(|e| Error::Io(format!("config.json: {e}")))?;
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    safetensors::save(&dir.join(WEIGHTS), out.iter().map(|(n, t)| (n.as_str(), t)), &meta)?;
    // the config last: a folder without it is not taken for a checkpoint
    weft_core::io::atomic::write(&dir.join("config.json"), text.as_bytes())
}
