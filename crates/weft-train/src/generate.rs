//! Sampling text from a trained gpt: after training (`train.sample_tokens`) and from a
//! checkpoint (`weft generate`).

use std::path::Path;

use weft_core::{Generator, Tensor};
use weft_models::gpt::Gpt;
use weft_models::Model;
use weft_nn::state_dict;

use crate::checkpoint;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::run::build_gpt;

pub(crate) fn sample_text(
    gpt: &Gpt,
    tok: &weft_data::CharTokenizer,
    prompt: &str,
    n: usize,
    seed: u64,
) -> Result<String> {
    let ids = tok.encode(prompt)?;
    if ids.is_empty() {
        return Err(Error::Config("the prompt is empty".into()));
    }
    let len = ids.len();
    gpt.context().set_training(false);
    let out = gpt.generate(
        &Tensor::from_vec(ids, &[1, len])?,
        n,
        0.8,
        Some(40),
        Some(tok.vocab_size()),
        &mut Generator::new(seed),
    )?;
    let out = out.to_vec::<i64>()?;
    Ok(tok.decode(&out)?)
}

/// `weft generate`: loads a gpt checkpoint folder (or the newest checkpoint inside a
/// checkpoint directory) and continues `prompt` by `tokens` characters.
pub fn generate(checkpoint_path: &Path, prompt: &str, tokens: usize, seed: u64) -> Result<String> {
    let ckpt = checkpoint::resolve(checkpoint_path)?;
    let (index, params) = checkpoint::read_params(&ckpt)?;
    let state = index.state;
    let model_cfg: ModelConfig = serde_json::from_value(state.extra["model"].clone()).map_err(|e| {
        Error::Io(format!(
            "{}: index.json has no usable model config: {e}",
            ckpt.display()
        ))
    })?;
    if !matches!(model_cfg, ModelConfig::Gpt(_)) {
        return Err(Error::Config(format!(
            "{}: generate needs a gpt checkpoint",
            ckpt.display()
        )));
    }
    let tok_json = state.extra["tokenizer"].as_str().ok_or_else(|| {
        Error::Io(format!(
            "{}: the checkpoint has no tokenizer (was it trained on text data?)",
            ckpt.display()
        ))
    })?;
    let tok = weft_data::CharTokenizer::from_json(tok_json)?;
    let gpt = build_gpt(&model_cfg, 0)?;
    let source = ckpt.display().to_string();
    state_dict::load_state_dict(&gpt, &params, gpt.aliases(), &source)?;
    sample_text(&gpt, &tok, prompt, tokens, seed)
}
