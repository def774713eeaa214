//! A Hugging Face `tokenizer.json` (BPE, WordPiece, WordLevel or Unigram, with its normalizer,
//! pre-tokenizer and decoder), through the `tokenizers` crate.
//!
//! Text is encoded without the post-processor's added special tokens (`add_special_tokens =
//! false`, so no BOS/CLS is prepended); special tokens written inside the text (such as
//! `<|endoftext|>` when the file declares it) are still matched, as the Python package does.
//! Decoding keeps special tokens and is as lossy as the file's decoder (byte-level decoders replace
//! invalid UTF-8 with U+FFFD).
//!
//! The JSON form embeds the whole `tokenizer.json`, so a checkpoint or a token dataset can rebuild
//! the tokenizer without the original file.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::{invalid, Result};

/// The `"type"` field of the JSON form.
pub(crate) const JSON_TYPE: &str = "hf";

/// Names tried, in order, for the end-of-text token.
const EOT_NAMES: [&str; 5] = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>"];

/// A tokenizer read from a `tokenizer.json`. Cheap to clone.
#[derive(Clone)]
pub struct HfTokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// The `tokenizer.json` content, as parsed.
    json: Arc<Value>,
    vocab_size: usize,
    eot: Option<u32>,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("eot", &self.eot)
            .finish()
    }
}

impl HfTokenizer {
    /// Reads a `tokenizer.json` file. Errors name the file.
    pub fn from_file(path: &std::path::Path) -> Result<HfTokenizer> {
        let text = std::fs::read_to_string(path).map_err(|source| crate::Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_text(&text).map_err(|e| invalid(format!("{}: {e}", path.display())))
    }

    /// Builds the tokenizer from the content of a `tokenizer.json`.
    pub fn from_json_text(text: &str) -> Result<HfTokenizer> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| invalid(format!("tokenizer.json does not parse: {e}")))?;
        Self::from_value(value)
    }

    fn from_value(value: Value) -> Result<HfTokenizer> {
        if !value.is_object() {
            return Err(invalid("tokenizer.json must be a JSON object"));
        }
        let inner: tokenizers::Tokenizer = value
            .to_string()
            .parse()
            .map_err(|e| invalid(format!("not a Hugging Face tokenizer.json: {e}")))?;
        let vocab = inner.get_vocab(true);
        let vocab_size = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
        if vocab_size == 0 {
            return Err(invalid("tokenizer.json has an empty vocabulary"));
        }
        let eot = EOT_NAMES.iter().find_map(|name| inner.token_to_id(name));
        Ok(HfTokenizer {
            inner: Arc::new(inner),
            json: Arc::new(value),
            vocab_size,
            eot,
        })
    }

    /// Ids run `0..vocab_size()` (one past the largest id, added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The id of the first of `<|endoftext|>`, `<|end_of_text|>`, `</s>`, `<eos>`, `<|eos|>` that
    /// the vocabulary has.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// The ids of `text` (no post-processor special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| invalid(format!("tokenizer.json: cannot encode: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens kept. Errors with `TokenOutOfRange` on the first id
    /// `>= vocab_size()`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        super::check_ids(ids, self.vocab_size)?;
        self.inner
            .decode(ids, false)
            .map_err(|e| invalid(format!("tokenizer.json: cannot decode: {e}")))
    }

    /// `{"type": "hf", "tokenizer": <the tokenizer.json content>}`.
    pub fn to_json_value(&self) -> Value {
        json!({ "type": JSON_TYPE, "tokenizer": *self.json })
    }

    pub(crate) fn from_json_value(obj: &serde_json::Map<String, Value>) -> Result<HfTokenizer> {
        match obj.get("tokenizer") {
            Some(v @ Value::Object(_)) => Self::from_value(v.clone()),
            Some(other) => Err(invalid(format!(
                "tokenizer JSON key \"tokenizer\": expected an object, got {}",
                super::short(other)
            ))),
            None => Err(invalid("tokenizer JSON: missing key \"tokenizer\"")),
        }
    }
}
