//! Checking a checkpoint folder as a model before it is handed on (`weft models register`,
//! `weft checkpoint consolidate`): what its `index.json` records beside the tensors (the model
//! config, the tokenizer) against the tensors' shapes, and its files against the index.

use std::collections::BTreeMap;
use std::path::Path;

use weft_data::Tokenizer;

use super::{read_index, Files, Index, INDEX};
use crate::config::ModelConfig;
use crate::error::{Error, Result};

/// Checks what `index` (of the checkpoint folder `dir`) records beside its tensors, before the
/// checkpoint is copied or registered as a model that would then fail to load: the model config
/// parses and agrees with the shapes of the tensors the index lists (every kind: a gpt's or
/// llama's counts and widths, an mlp's `hidden`, ...), as `weft generate` and `weft serve` check
/// it before they build the model, and, with `tokenizer`, the tokenizer loads and fits the
/// model's vocabulary. `index.json` has no checksum of its own, so both are claims. Without a
/// model config, nothing is checked. The error names `index.json`, the key and the value.
pub fn check_recorded(dir: &Path, index: &Index, tokenizer: bool) -> Result<()> {
    let extra = &index.state.extra;
    let source = dir.join(INDEX).display().to_string();
    let bad = |msg: String| Error::Io(format!("{source}: {msg}"));
    if extra["model"].is_null() {
        return Ok(());
    }
    let model: ModelConfig = serde_json::from_value(extra["model"].clone())
        .map_err(|e| bad(format!("the model config does not parse: {e}")))?;
    let shapes: BTreeMap<String, Vec<usize>> = index
        .model
        .iter()
        .map(|(n, rec)| (n.clone(), rec.shape.clone()))
        .collect();
    model.check_shapes(&shapes).map_err(|e| bad(e.to_string()))?;
    let tok = &extra["tokenizer"];
    if tokenizer && !tok.is_null() {
        let text = tok
            .as_str()
            .ok_or_else(|| bad("state.extra.tokenizer: expected the tokenizer's JSON as a string".into()))?;
        let tok = Tokenizer::from_json(text).map_err(|e| bad(format!("state.extra.tokenizer: {e}")))?;
        if let Some((vocab, _)) = model.language_model_sizes() {
            if tok.vocab_size() > vocab {
                return Err(bad(format!(
                    "state.extra.tokenizer knows {} tokens, more than model.vocab_size = {vocab}",
                    tok.vocab_size()
                )));
            }
        }
    }
    Ok(())
}

/// Checks checkpoint folder `ckpt` as a model to load (what `weft models register` checks):
/// its index (format, every tensor covered by its pieces once), a model config recorded and
/// agreeing with the model tensors' shapes, and the tokenizer ([`check_recorded`]); every
/// piece's file there and holding the piece at the index's size and dtype (headers only, which
/// finds a truncated or replaced file); and, with `checksums`, every model piece's values
/// against its checksum, read one piece at a time (the optimizer's state, which loading a model
/// never reads, is checked by its headers only). Returns the index.
pub fn verify_model(ckpt: &Path, checksums: bool) -> Result<Index> {
    let index = read_index(ckpt)?;
    let source = ckpt.join(INDEX);
    if index.state.extra["model"].is_null() {
        return Err(Error::Io(format!(
            "{}: records no model config (state.extra.model): it cannot be loaded as a model",
            source.display()
        )));
    }
    if index.model.is_empty() {
        return Err(Error::Io(format!(
            "{}: lists no model tensors: it cannot be loaded as a model",
            source.display()
        )));
    }
    check_recorded(ckpt, &index, true)?;
    let mut files = Files::new(ckpt);
    for (records, read) in [(&index.model, checksums), (&index.optimizer, false)] {
        for (name, rec) in records {
            for piece in &rec.pieces {
                files.check_piece(name, piece, &rec.dtype, read)?;
            }
        }
    }
    Ok(index)
}
