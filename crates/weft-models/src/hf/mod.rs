//! Hugging Face checkpoint folders: `config.json` plus `model.safetensors` (or shards listed in
//! `model.safetensors.index.json`), for `GPT2LMHeadModel`, `LlamaForCausalLM`,
//! `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `MistralForCausalLM` and `Phi3ForCausalLM` (the last
//! four weft's llama), read into weft's `[model]` keys and parameter names, and written back
//! from them (those read from Mistral and Phi-3 folders as `LlamaForCausalLM`).
//!
//! Names: llama's are Hugging Face's already. GPT-2 checkpoints name tensors with or without
//! `transformer.` (as `GPT2LMHeadModel` or `GPT2Model` saved them) and store the weights of its
//! `Conv1D` layers (`attn.c_attn`, `attn.c_proj`, `mlp.c_fc`, `mlp.c_proj`) as `[in, out]`: they
//! are transposed into weft's `[out, in]`. The attention-mask buffers older GPT-2 files hold
//! (`attn.bias`, `attn.masked_bias`) and llama's `rotary_emb.inv_freq` are not parameters and are
//! dropped. Phi-3's fused `qkv_proj` and `gate_up_proj` are read as llama's separate
//! projections, each a range of the stored rows. Tied output layers are not written (as
//! `transformers` saves them).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};
use weft_core::io::atomic::describe;
use weft_core::io::safetensors;
use weft_core::{Error, Result, Tensor};

mod config;
mod weights;
pub use config::{from_weft_keys, to_weft_keys, ARCHITECTURES};
pub use weights::HfWeights;

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

/// A Hugging Face checkpoint opened: its config read, its weights mapped and their names and
/// shapes known in weft's terms, no tensor read yet.
pub struct HfFolder {
    /// weft's `[model]` keys, with `kind`.
    pub model: Map<String, Value>,
    /// The parameters, by weft name, read when asked for.
    pub weights: HfWeights,
}

/// Opens the checkpoint folder `dir`: its config, and its weights checked against each other
/// (every file the index names exists and holds what it says) without reading a tensor but
/// GPT-2's output layer and token embedding (compared: weft ties them).
pub fn open_folder(dir: &Path) -> Result<HfFolder> {
    let config_path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&config_path).map_err(|e| Error::Io(format!("{}: {e}", config_path.display())))?;
    let model = to_weft_keys(&text, &config_path.display().to_string())?;
    let weights = weights::open(dir, &model)?;
    Ok(HfFolder { model, weights })
}

/// Reads the checkpoint folder `dir` whole: [`open_folder`], every tensor read.
pub fn read_folder(dir: &Path) -> Result<HfCheckpoint> {
    let folder = open_folder(dir)?;
    let tensors = folder.weights.read_all()?;
    Ok(HfCheckpoint {
        model: folder.model,
        tensors,
    })
}

/// The longest `generation_config.json` read, in bytes (one is a few hundred).
const MAX_GENERATION_CONFIG: u64 = 1 << 20;

/// The end-of-sequence ids generation stops at, as `transformers`' `generate` takes them: the
/// `eos_token_id` of `generation_config.json` when the folder has one, else of `config.json` (a
/// token id or a list of them; `null` or absent: none). Errors name the file and the key.
pub fn eos_ids(dir: &Path) -> Result<Vec<u32>> {
    for name in ["generation_config.json", "config.json"] {
        let path = dir.join(name);
        if !is_regular_file(&path)? {
            continue;
        }
        let bad = |msg: String| Error::Io(format!("{}: {msg}", path.display()));
        let len = std::fs::metadata(&path).map_err(|e| bad(e.to_string()))?.len();
        if len > MAX_GENERATION_CONFIG {
            return Err(bad(format!("{len} bytes, more than the {MAX_GENERATION_CONFIG} read")));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let id = |x: &Value| x.as_u64().and_then(|n| u32::try_from(n).ok());
        let wrong = |x: &Value| bad(format!("eos_token_id: expected a token id or a list of them, got {x}"));
        return match v.get("eos_token_id") {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(ids)) => ids.iter().map(|x| id(x).ok_or_else(|| wrong(x))).collect(),
            Some(x) => Ok(vec![id(x).ok_or_else(|| wrong(x))?]),
        };
    }
    Ok(Vec::new())
}

/// Whether `path` is a regular file (symlinks followed): `false` when nothing is there, an
/// error naming it when something else is (a directory, a FIFO, a link to `/dev/zero`), which
/// must not be taken for a missing file (nor be opened: a FIFO waits for a writer forever).
fn is_regular_file(path: &Path) -> Result<bool> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(true),
        Ok(meta) => Err(Error::Io(format!(
            "{}: not a file ({})",
            path.display(),
            describe(&meta.file_type())
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::Io(format!("{}: {e}", path.display()))),
    }
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

/// A GPT-2 `Conv1D` weight `[in, out]` as a Linear weight `[out, in]`, or back (the transpose
/// is its own inverse). A tensor that is not a matrix is an error naming `file`, the tensor's
/// `name` and its shape as given, before anything is transposed.
fn transpose_conv1d(t: &Tensor, name: &str, file: &str) -> Result<Tensor> {
    if t.rank() != 2 {
        return Err(Error::Io(format!(
            "{file}: {name} has shape {:?}, but a GPT-2 Conv1D weight is a matrix ([in, out] in the file)",
            t.shape()
        )));
    }
    t.t()?.contiguous()
}

/// Weights files `transformers` writes or reads besides [`WEIGHTS`], by the start of their
/// names (`pytorch_model.bin`, `pytorch_model-00001-of-00002.bin`, `tf_model.h5`,
/// `flax_model.msgpack`).
const OTHER_WEIGHTS: [&str; 3] = ["pytorch_model", "tf_model", "flax_model"];

/// The most names an error lists of the files in an output folder's way.
const LISTED: usize = 6;

/// Whether a file named `name` in a checkpoint folder holds weights (or indexes them) that a
/// folder written by [`write_folder`] would not replace: shards and indexes
/// (`model-00001-of-00002.safetensors`, `model.safetensors.index.json`), any other
/// `.safetensors` file (a weft checkpoint's too), PyTorch, TensorFlow and Flax weights.
fn is_stale_weights(name: &str) -> bool {
    name != WEIGHTS
        && (name.ends_with(".safetensors")
            || name.ends_with(".index.json")
            || OTHER_WEIGHTS.iter().any(|p| name.starts_with(p)))
}

/// Checks that `dir` (when it exists) can take a written folder: no weights or index there
/// that the write would leave beside the new `model.safetensors` (weft reads the index first,
/// `transformers` `model.safetensors`: the two would load different weights from one folder),
/// and a `config.json` that is a regular file or nothing. The error names the folder and the
/// files in the way.
pub fn check_output_folder(dir: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::Io(format!("{}: {e}", dir.display()))),
    };
    let mut stale = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_stale_weights(&name) {
            stale.push(name);
        }
    }
    if !stale.is_empty() {
        stale.sort();
        let more = stale.len().saturating_sub(LISTED);
        stale.truncate(LISTED);
        let mut listed = stale.join(", ");
        if more > 0 {
            listed.push_str(&format!(" and {more} more"));
        }
        return Err(Error::Io(format!(
            "{}: holds {listed}: weights an export would leave beside its config.json and {WEIGHTS} (weft \
             reads an index first, transformers {WEIGHTS}: they would load different weights); remove them \
             or write to another folder",
            dir.display()
        )));
    }
    let config = dir.join("config.json");
    if let Ok(meta) = std::fs::metadata(&config) {
        if !meta.is_file() {
            return Err(Error::Io(format!(
                "{}: not a file ({}); refusing to replace it",
                config.display(),
                describe(&meta.file_type())
            )));
        }
    }
    Ok(())
}

/// Writes `tokenizer` (the content of a `tokenizer.json`) into `dir` as `tokenizer.json`, and a
/// `tokenizer_config.json` naming `PreTrainedTokenizerFast` where there is none (so that
/// `transformers`' `AutoTokenizer` reads `tokenizer.json` as it is, whatever the model type).
/// A `tokenizer.json` already there with the same content is left; one with other content is
/// kept (it may be the user's), and the returned note names it. A file there that is not a
/// regular file (symlinks followed) is refused naming it, before anything is written. Call before
/// [`write_folder`], whose `config.json` comes last.
pub fn write_tokenizer(dir: &Path, tokenizer: &Value) -> Result<Option<String>> {
    let json_path = dir.join("tokenizer.json");
    let config_path = dir.join("tokenizer_config.json");
    // symlinks are followed, as the writes below follow them: a link to a regular file is that
    // file, a dangling link a file still to write
    for p in [&json_path, &config_path] {
        is_regular_file(p).map_err(|e| Error::Io(format!("{e}; refusing to write beside it")))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
    let mut note = None;
    match std::fs::read(&json_path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let text = serde_json::to_string(tokenizer).map_err(|e| Error::Io(format!("tokenizer.json: {e}")))?;
            weft_core::io::atomic::write(&json_path, text.as_bytes())?;
        }
        Err(e) => return Err(Error::Io(format!("{}: {e}", json_path.display()))),
        Ok(bytes) => {
            if serde_json::from_slice::<Value>(&bytes).ok().as_ref() != Some(tokenizer) {
                note = Some(format!(
                    "kept {}, already there and not the checkpoint's tokenizer (remove it to write the \
                     checkpoint's)",
                    json_path.display()
                ));
            }
        }
    }
    if !is_regular_file(&config_path)? {
        let text = serde_json::json!({"tokenizer_class": "PreTrainedTokenizerFast"}).to_string();
        weft_core::io::atomic::write(&config_path, text.as_bytes())?;
    }
    Ok(note)
}

/// Writes weft parameters `tensors` of a model with `[model]` keys `model` into `dir` as a
/// Hugging Face checkpoint folder (`config.json`, `model.safetensors` with `format: pt`),
/// loadable by `transformers`' `from_pretrained`. `aliases` (`(alternative, canonical)` names
/// of tied weights) are left out, as `transformers` leaves them out. An existing `dir` holding
/// other weights or an index (shards, `model.safetensors.index.json`, PyTorch weights) is
/// refused before anything is written; an earlier `config.json` and `model.safetensors` are
/// replaced.
pub fn write_folder(
    dir: &Path,
    model: &Map<String, Value>,
    tensors: &BTreeMap<String, Tensor>,
    aliases: &[(&str, &str)],
) -> Result<()> {
    let config = from_weft_keys(model)?;
    check_output_folder(dir)?;
    let gpt = model.get("kind").and_then(Value::as_str) == Some("gpt");
    let mut out: Vec<(String, Tensor)> = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if aliases.iter().any(|(alt, _)| alt == name) {
            continue;
        }
        let t = if gpt && is_conv1d(name) {
            transpose_conv1d(t, name, "hf export")?
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
