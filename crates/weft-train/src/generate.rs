//! Sampling text from a trained language model (gpt, llama): after training (`train.sample_tokens`), and from a
//! checkpoint folder or a consolidated safetensors file (`weft generate`).
//!
//! A consolidated file (`weft checkpoint consolidate`) carries what generation needs besides
//! the tensors in its header's `__metadata__` (string to string): the model config as JSON
//! under [`MODEL_KEY`], the tokenizer's JSON under [`TOKENIZER_KEY`], the step under
//! [`STEP_KEY`], and `format: pt` for PyTorch's loaders.

use std::collections::BTreeMap;
use std::path::Path;

use weft_core::io::safetensors;
use weft_core::{Generator, Tensor};
use weft_data::Tokenizer;
pub use weft_models::gpt::Sampling;
use weft_models::LanguageModel;
use weft_nn::state_dict;

use crate::checkpoint::{self, CheckpointState};
use crate::config::ModelConfig;
use crate::error::{Error, Result};

/// Metadata key of a consolidated file: the model config (the `[model]` section) as JSON.
pub const MODEL_KEY: &str = "weft.model";
/// Metadata key of a consolidated file: the tokenizer's JSON (`{"type": "char", ...}`).
pub const TOKENIZER_KEY: &str = "weft.tokenizer";
/// Metadata key of a consolidated file: the checkpoint's step (the next step to run).
pub const STEP_KEY: &str = "weft.step";

/// The most new tokens one [`generate`] call produces. Each is one forward pass of the model;
/// a million is hours of sampling for the smallest models, and the count a typo such as
/// `--tokens 10000000000` would otherwise spend days (and the ids' memory) on.
pub const MAX_TOKENS: usize = 1_000_000;

/// What to generate, and how.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// The text to continue: at least one character, each in the checkpoint's vocabulary.
    pub prompt: String,
    /// New tokens (characters) to generate, 1 to [`MAX_TOKENS`].
    pub tokens: usize,
    /// Seed of the draws (unused by greedy decoding).
    pub seed: u64,
    pub sampling: Sampling,
    /// Where the model runs (checked before the checkpoint is read).
    pub device: weft_core::Device,
    /// Generate all `tokens`, also past an end-of-sequence token (see [`generate`]).
    pub ignore_eos: bool,
}

/// The `__metadata__` of a consolidated file of a checkpoint whose state is `state`: `format:
/// pt`, the step, the model config and (for a model trained on text) the tokenizer.
pub fn consolidated_metadata(state: &CheckpointState) -> BTreeMap<String, String> {
    let mut meta = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        (STEP_KEY.to_string(), state.step.to_string()),
    ]);
    let model = &state.extra["model"];
    if !model.is_null() {
        meta.insert(MODEL_KEY.to_string(), model.to_string());
    }
    if let Some(tok) = state.extra["tokenizer"].as_str() {
        meta.insert(TOKENIZER_KEY.to_string(), tok.to_string());
    }
    meta
}

/// `prompt`'s ids, checked: not empty, every character known to `tok`.
pub fn encode_prompt(tok: &Tokenizer, prompt: &str) -> Result<Vec<i64>> {
    if prompt.is_empty() {
        return Err(Error::Run(
            "the prompt is empty: give at least one character to continue (the default is a newline)".into(),
        ));
    }
    let ids = tok.encode(prompt).map_err(|e| {
        let known = match tok {
            Tokenizer::Char(c) => {
                let vocab: String = c.chars().iter().collect();
                if vocab.chars().count() <= 200 {
                    format!("{} characters: {vocab:?}", c.vocab_size())
                } else {
                    format!("{} characters", c.vocab_size())
                }
            }
            other => format!("{}, {} tokens", other.kind(), other.vocab_size()),
        };
        Error::Run(format!("the prompt's {e} of the checkpoint's tokenizer ({known})"))
    })?;
    if ids.is_empty() {
        return Err(Error::Run(format!(
            "the prompt {prompt:?} encodes to no tokens with the checkpoint's tokenizer"
        )));
    }
    Ok(ids.into_iter().map(i64::from).collect())
}

/// `ids` continued by `n` tokens drawn by `sampling` from `seed`, decoded.
fn continue_ids(
    gpt: &dyn LanguageModel,
    tok: &Tokenizer,
    ids: Vec<i64>,
    n: usize,
    sampling: &Sampling,
    seed: u64,
    stop: &[i64],
) -> Result<String> {
    let len = ids.len();
    gpt.context().set_training(false);
    let out = gpt.generate_until(
        &Tensor::from_vec(ids, &[1, len])?,
        n,
        sampling,
        Some(tok.vocab_size()),
        stop,
        &mut Generator::new(seed),
    )?;
    // the ids are below the tokenizer's vocabulary (vocab_limit), so they fit in u32
    let ids: Vec<u32> = out.to_vec::<i64>()?.into_iter().map(|t| t as u32).collect();
    Ok(tok.decode(&ids)?)
}

/// `prompt` continued by `n` characters with the default sampling (temperature 0.8, top-k 40):
/// the sample printed after training.
pub(crate) fn sample_text(
    gpt: &dyn LanguageModel,
    tok: &Tokenizer,
    prompt: &str,
    n: usize,
    seed: u64,
) -> Result<String> {
    let ids = encode_prompt(tok, prompt)?;
    continue_ids(gpt, tok, ids, n, &Sampling::default(), seed, &[])
}

/// What generation (and export) reads from a checkpoint folder or a consolidated file.
pub struct Trained {
    /// Where the model config and tokenizer were read (in messages).
    pub source: String,
    /// The model config's JSON, when there is one.
    pub model: Option<serde_json::Value>,
    /// The tokenizer's JSON, when the model was trained on text.
    pub tokenizer: Option<String>,
    /// The end-of-sequence ids a Hugging Face folder's configs give (`None` for weft's own
    /// checkpoints, whose tokenizer says).
    pub eos: Option<Vec<u32>>,
    /// The weights: held (a checkpoint folder's pieces, assembled; a Hugging Face folder's,
    /// converted), or a file's read a tensor at a time when they are loaded.
    pub params: Box<dyn state_dict::TensorSource + Send + Sync>,
}

/// A checkpoint folder, a checkpoint directory (its newest checkpoint), a consolidated
/// safetensors file or a Hugging Face checkpoint folder, read whole and checked.
pub fn read_trained(path: &Path) -> Result<Trained> {
    if weft_models::hf::is_checkpoint_folder(path) {
        read_hf_folder(path)
    } else if path.is_file() {
        read_file(path)
    } else {
        read_folder(path)
    }
}

/// A Hugging Face checkpoint folder (`config.json` and its weights, docs/hugging-face.md), with
/// the folder's `tokenizer.json` as the tokenizer when it holds one.
fn read_hf_folder(dir: &Path) -> Result<Trained> {
    let mut hf = weft_models::hf::open_folder(dir)?;
    // config.json does not set a gpt's dropout; inference runs without it (as `[init] from` a
    // folder does when the run has no `[model]`)
    if hf.model.get("kind").and_then(serde_json::Value::as_str) == Some("gpt") {
        hf.model.insert("dropout".into(), 0.0.into());
    }
    let tok_path = dir.join("tokenizer.json");
    // one that is there but no file (a folder, a FIFO, a device) is refused by name
    let tokenizer = if tok_path.exists() {
        // (its errors name the file)
        let tok = weft_data::HfTokenizer::from_file(&tok_path).map_err(|e| Error::Io(e.to_string()))?;
        Some(Tokenizer::Hf(tok).to_json())
    } else {
        None
    };
    Ok(Trained {
        source: dir.join("config.json").display().to_string(),
        model: Some(serde_json::Value::Object(hf.model)),
        tokenizer,
        eos: Some(weft_models::hf::eos_ids(dir)?),
        params: Box::new(hf.weights),
    })
}

/// A checkpoint folder (or the newest one in a checkpoint directory), every piece checked.
fn read_folder(path: &Path) -> Result<Trained> {
    let ckpt = checkpoint::resolve(path)?;
    let (index, params) = checkpoint::read_params(&ckpt)?;
    let extra = &index.state.extra;
    Ok(Trained {
        source: ckpt.join(checkpoint::INDEX).display().to_string(),
        model: Some(extra["model"].clone()).filter(|m| !m.is_null()),
        tokenizer: extra["tokenizer"].as_str().map(str::to_string),
        eos: None,
        params: Box::new(params),
    })
}

/// A safetensors file, which must carry weft's metadata.
fn read_file(path: &Path) -> Result<Trained> {
    // the header first: a file without weft's metadata is refused before any tensor is made
    let file = safetensors::SafeTensorsFile::open(path)?;
    let source = path.display().to_string();
    let Some(model) = file.metadata().get(MODEL_KEY) else {
        return Err(Error::Io(format!(
            "{source}: the file holds tensors but no model config (no {MODEL_KEY:?} in its safetensors \
             metadata, as in a state dict saved by PyTorch): generate from a checkpoint folder, or from the \
             file `weft checkpoint consolidate CHECKPOINT -o FILE` writes"
        )));
    };
    let model: serde_json::Value = serde_json::from_str(model)
        .map_err(|e| Error::Io(format!("{source}: metadata {MODEL_KEY:?} is not JSON: {e}")))?;
    Ok(Trained {
        source,
        model: Some(model),
        tokenizer: file.metadata().get(TOKENIZER_KEY).cloned(),
        eos: None,
        params: Box::new(file),
    })
}

/// The model config `trained` records, parsed; a language model's (gpt, llama) checked against
/// the shapes of its tensors before anything of the config's size is built (a classifier's are
/// checked when its parameters are loaded).
pub fn recorded_model(trained: &Trained) -> Result<ModelConfig> {
    let source = &trained.source;
    let value = trained
        .model
        .clone()
        .ok_or_else(|| Error::Io(format!("{source}: records no model config")))?;
    let model: ModelConfig = serde_json::from_value(value)
        .map_err(|e| Error::Io(format!("{source}: the model config does not parse: {e}")))?;
    let shapes: BTreeMap<String, Vec<usize>> = trained
        .params
        .names()
        .into_iter()
        .filter_map(|n| Some((n.to_string(), trained.params.shape(n)?)))
        .collect();
    model
        .check_shapes(&shapes)
        .map_err(|e| Error::Io(format!("{source}: {e}")))?;
    Ok(model)
}

/// The language model config `trained` records (gpt or llama), checked as
/// [`recorded_model`] does, and its vocabulary size.
fn model_config(trained: &Trained) -> Result<(ModelConfig, usize)> {
    let model = recorded_model(trained)?;
    match model.language_model_sizes() {
        Some((vocab, _)) => Ok((model, vocab)),
        None => Err(Error::Io(format!(
            "{}: generate needs a language model (gpt or llama); this is a model of kind {:?}",
            trained.source,
            model.kind()
        ))),
    }
}

/// `weft generate`: continues `options.prompt` by `options.tokens` tokens with a language
/// model (gpt, llama) read from `path`: a checkpoint folder, a checkpoint directory (its newest
/// checkpoint), a safetensors file written by `weft checkpoint consolidate`, or a Hugging Face
/// folder. Generation ends early at an end-of-sequence token, left out of the text (as
/// transformers' `generate` does), unless `options.ignore_eos`: a Hugging Face folder's
/// `eos_token_id` ([`weft_models::hf::eos_ids`]), else the tokenizer's end-of-text token
/// (gpt2's `<|endoftext|>`; a char vocabulary has none). Everything read is checked before the
/// model is built: the options, the model config against the tensors' shapes, the tokenizer
/// against the vocabulary, and the prompt against the tokenizer.
pub fn generate(path: &Path, options: &GenerateOptions) -> Result<String> {
    if !(1..=MAX_TOKENS).contains(&options.tokens) {
        return Err(Error::Run(format!(
            "tokens: {} is outside 1 to {MAX_TOKENS}, the new tokens one call generates",
            options.tokens
        )));
    }
    options.sampling.validate()?;
    weft_core::cuda::check(options.device).map_err(|e| Error::Config(format!("--device: {e}")))?;
    let trained = read_trained(path)?;
    let source = &trained.source;
    let (cfg, vocab_size) = model_config(&trained)?;
    let tok_json = trained
        .tokenizer
        .as_deref()
        .ok_or_else(|| match path.join("config.json").is_file() {
            true => Error::Io(format!(
                "{}: no tokenizer.json beside config.json, so the prompt cannot be encoded",
                path.display()
            )),
            false => Error::Io(format!(
                "{source}: records no tokenizer (the model was not trained on text data)"
            )),
        })?;
    let tok = Tokenizer::from_json(tok_json).map_err(|e| Error::Io(format!("{source}: {e}")))?;
    if tok.vocab_size() > vocab_size {
        return Err(Error::Io(format!(
            "{source}: the tokenizer knows {} characters, more than model.vocab_size = {vocab_size}",
            tok.vocab_size(),
        )));
    }
    let ids = encode_prompt(&tok, &options.prompt)?;
    let model = weft_nn::init::with_device(options.device, || crate::run::build_language_model(&cfg, 0))?;
    state_dict::load_state_dict(
        model.as_ref(),
        trained.params.as_ref(),
        model.aliases(),
        &path.display().to_string(),
    )?;
    // where generation ends early, as transformers' generate does: a Hugging Face folder's
    // eos_token_id, else the tokenizer's end-of-text token (gpt2's <|endoftext|>; none for char)
    let stop: Vec<i64> = match (options.ignore_eos, &trained.eos) {
        (true, _) => Vec::new(),
        (false, Some(ids)) => ids.iter().map(|&i| i64::from(i)).collect(),
        (false, None) => tok.eot().map(i64::from).into_iter().collect(),
    };
    continue_ids(
        model.as_ref(),
        &tok,
        ids,
        options.tokens,
        &options.sampling,
        options.seed,
        &stop,
    )
}
