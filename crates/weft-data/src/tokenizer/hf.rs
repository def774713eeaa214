//! A Hugging Face `tokenizer.json` (BPE, WordPiece, WordLevel or Unigram, with its normalizer,
//! pre-tokenizer and decoder), through the `tokenizers` crate.
//!
//! Text is encoded without the post-processor's added special tokens (`add_special_tokens =
//! false`, so no BOS/CLS is prepended); special tokens written inside the text (such as
//! `<|endoftext|>` when the file declares it) are still matched, as the Python package does.
//! Decoding keeps special tokens and is as lossy as the file's decoder (byte-level decoders replace
//! invalid UTF-8 with U+FFFD).
//!
//! The file's `padding` and `truncation` settings are not applied: weft tokenizes whole documents,
//! so padding would insert pad ids (a `Fixed` length of 10^9 would allocate without bound) and
//! truncation would silently cut every document. They are kept in the recorded JSON form (which is
//! the file as read) and dropped again whenever it is loaded.
//!
//! The JSON form embeds the whole `tokenizer.json`, so a checkpoint or a token dataset can rebuild
//! the tokenizer without the original file.
//!
//! The `tokenizers` crate panics on some damaged files (a BPE merge longer than any token, a
//! `Precompiled` normalizer whose charsmap does not parse, a `Strip` decoder that strips more than
//! a token holds): every call into it goes through [`contained`], which turns a panic into an error
//! naming the tokenizer file, without the panic's message on stderr.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::error::{invalid, Result};

/// The `"type"` field of the JSON form.
pub(crate) const JSON_TYPE: &str = "hf";

/// Names tried, in order, for the end-of-text token.
const EOT_NAMES: [&str; 5] = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>"];

/// What errors call a tokenizer whose file is not known (one built from a JSON form).
const NO_ORIGIN: &str = "tokenizer.json";

/// Runs `f` (a call into the `tokenizers` crate), turning a panic inside it into an error that
/// says `doing` failed and quotes the panic's message ([`crate::contain::contained`]; the
/// crate's rayon pool serves only the batch methods, which weft does not call, so encoding and
/// decoding panic, if at all, on the calling thread). A tokenizer a panic left half-updated (a
/// cache, a lock poisoned) is only ever called through this function again.
fn contained<T>(doing: &str, f: impl FnOnce() -> T) -> Result<T> {
    crate::contain::contained(f).map_err(|msg| {
        invalid(format!(
            "{doing}: the tokenizers library failed on this tokenizer (it panicked: {msg}); the file is damaged or \
             uses a setting the library cannot handle"
        ))
    })
}

/// A tokenizer read from a `tokenizer.json`. Cheap to clone.
#[derive(Clone)]
pub struct HfTokenizer {
    inner: Arc<tokenizers::Tokenizer>,
    /// The `tokenizer.json` content, as parsed.
    json: Arc<Value>,
    vocab_size: usize,
    eot: Option<u32>,
    /// Where it was read from, for the errors of encode and decode: the file's path, or
    /// [`NO_ORIGIN`].
    origin: Arc<str>,
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
    /// Reads a `tokenizer.json` file. Errors name the file (one that is not a regular file, such
    /// as `/dev/zero`, is refused before reading), and so do later errors of encode and decode.
    pub fn from_file(path: &std::path::Path) -> Result<HfTokenizer> {
        let text = crate::files::read_to_string(path)?;
        Self::from_json_text(&text)
            .map(|t| t.with_origin(path.display().to_string()))
            .map_err(|e| invalid(format!("{}: {e}", path.display())))
    }

    /// The same tokenizer, naming `origin` (its file, say) in the errors of encode and decode.
    pub fn with_origin(mut self, origin: impl Into<String>) -> HfTokenizer {
        self.origin = Arc::from(origin.into());
        self
    }

    /// Builds the tokenizer from the content of a `tokenizer.json`.
    pub fn from_json_text(text: &str) -> Result<HfTokenizer> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| invalid(format!("tokenizer.json does not parse: {e}")))?;
        Self::from_value(value)
    }

    fn from_value(value: Value) -> Result<HfTokenizer> {
        let Some(fields) = value.as_object() else {
            return Err(invalid("tokenizer.json must be a JSON object"));
        };
        // padding and truncation are not applied (module docs): removed before the crate sees
        // them, so neither can take effect, nor fail to parse
        let mut used = fields.clone();
        used.remove("padding");
        used.remove("truncation");
        let text = Value::Object(used).to_string();
        let (inner, vocab_size, eot) = contained("cannot load", || {
            let inner: tokenizers::Tokenizer = text
                .parse()
                .map_err(|e| invalid(format!("not a Hugging Face tokenizer.json: {e}")))?;
            let vocab = inner.get_vocab(true);
            let vocab_size = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
            let eot = EOT_NAMES.iter().find_map(|name| inner.token_to_id(name));
            Ok::<_, crate::Error>((inner, vocab_size, eot))
        })??;
        if vocab_size == 0 {
            return Err(invalid("tokenizer.json has an empty vocabulary"));
        }
        Ok(HfTokenizer {
            inner: Arc::new(inner),
            json: Arc::new(value),
            vocab_size,
            eot,
            origin: Arc::from(NO_ORIGIN),
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

    /// The ids of `text` (no post-processor special tokens added). Errors name the tokenizer's
    /// file.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let origin = &*self.origin;
        let enc = contained(&format!("{origin}: cannot encode"), || {
            self.inner.encode_fast(text, false)
        })?
        .map_err(|e| invalid(format!("{origin}: cannot encode: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens kept. Errors with `TokenOutOfRange` on the first id
    /// `>= vocab_size()`; other errors name the tokenizer's file.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        super::check_ids(ids, self.vocab_size)?;
        let origin = &*self.origin;
        contained(&format!("{origin}: cannot decode"), || self.inner.decode(ids, false))?
            .map_err(|e| invalid(format!("{origin}: cannot decode: {e}")))
    }

    /// The first of `ids` below [`HfTokenizer::vocab_size`] that no token has, with its
    /// position: a tokenizer.json may leave ids out of its vocabulary, and decoding drops those.
    pub fn first_gap(&self, ids: &[u32]) -> Option<(usize, u32)> {
        ids.iter()
            .enumerate()
            .find(|&(_, &id)| (id as usize) < self.vocab_size && self.inner.id_to_token(id).is_none())
            .map(|(i, &id)| (i, id))
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
