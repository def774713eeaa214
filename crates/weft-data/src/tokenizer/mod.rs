//! Tokenizers: text to token ids and back.
//!
//! [`Tokenizer`] is one of
//! - `char`: a character vocabulary ([`CharTokenizer`], as nanoGPT's `shakespeare_char`), built
//!   from the corpus itself;
//! - `gpt2`: GPT-2's byte-level BPE, `r50k_base` ([`Gpt2Tokenizer`]);
//! - a Hugging Face `tokenizer.json` file ([`HfTokenizer`]).
//!
//! Every kind has a JSON form (`{"type": "char" | "gpt2" | "hf", ...}`) that checkpoints and token
//! datasets record and read back with [`Tokenizer::from_json`]; the `char` form is
//! [`CharTokenizer::to_json`]'s, unchanged.

mod char;
mod gpt2;
mod hf;
mod hf_export;

use std::path::PathBuf;
use std::str::FromStr;

use serde_json::Value;

pub use self::char::CharTokenizer;
pub use self::gpt2::Gpt2Tokenizer;
pub use self::hf::HfTokenizer;

use crate::error::{invalid, Error, Result};

/// GPT-2's end-of-text id, `<|endoftext|>`.
pub const GPT2_EOT: u32 = gpt2::EOT;

/// A tokenizer of any kind. Cheap to clone; `Send + Sync`, so threads can share one.
#[derive(Debug, Clone)]
pub enum Tokenizer {
    /// A character vocabulary.
    Char(CharTokenizer),
    /// GPT-2's byte-level BPE.
    Gpt2(Gpt2Tokenizer),
    /// A Hugging Face `tokenizer.json`.
    Hf(HfTokenizer),
}

/// What a config or command line names as its tokenizer: `"char"`, `"gpt2"`, or the path of a
/// file (a Hugging Face `tokenizer.json`, or a weft tokenizer JSON form such as a checkpoint's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizerSpec {
    /// A character vocabulary, to be built from the corpus ([`CharTokenizer::from_text`]).
    Char,
    /// GPT-2's byte-level BPE.
    Gpt2,
    /// A file.
    File(PathBuf),
}

impl FromStr for TokenizerSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<TokenizerSpec> {
        match s {
            "" => Err(invalid(
                "tokenizer: expected \"char\", \"gpt2\" or the path of a tokenizer.json, got \"\"",
            )),
            "char" => Ok(TokenizerSpec::Char),
            "gpt2" => Ok(TokenizerSpec::Gpt2),
            path => Ok(TokenizerSpec::File(PathBuf::from(path))),
        }
    }
}

impl TokenizerSpec {
    /// The tokenizer, for specs that need no corpus: `gpt2` or a file. A file holding a JSON object
    /// with a `"type"` key of `"char"`, `"gpt2"` or `"hf"` is read as weft's JSON form, a token
    /// dataset's `index.json` gives its `"tokenizer"`, anything else is read as a Hugging Face
    /// `tokenizer.json`. `char` errors: its vocabulary comes from a corpus
    /// (see [`TokenizerSpec::load_with_corpus`]). Errors name the file, one that is not a regular
    /// file (`/dev/zero`, a directory) refused before reading; a tokenizer.json's later errors of
    /// encode and decode name it too.
    pub fn load(&self) -> Result<Tokenizer> {
        match self {
            TokenizerSpec::Char => Err(invalid(
                "tokenizer \"char\" has no fixed vocabulary: pass a file holding its JSON form \
                 (as an index.json's \"tokenizer\" or a checkpoint records it)",
            )),
            TokenizerSpec::Gpt2 => Ok(Tokenizer::Gpt2(Gpt2Tokenizer::new())),
            TokenizerSpec::File(path) => {
                let text = crate::files::read_to_string(path)?;
                let value: Value =
                    serde_json::from_str(&text).map_err(|e| invalid(format!("{}: not JSON: {e}", path.display())))?;
                let ours =
                    matches!(value.get("type"), Some(Value::String(t)) if ["char", "gpt2", "hf"].contains(&t.as_str()));
                let dataset =
                    matches!(value.get("format"), Some(Value::String(f)) if f == crate::tokens::index::FORMAT);
                let tok = if dataset {
                    value
                        .get("tokenizer")
                        .ok_or_else(|| invalid("a token dataset index without a \"tokenizer\" key"))
                        .and_then(Tokenizer::from_json_value)
                } else if ours {
                    Tokenizer::from_json_value(&value)
                } else {
                    HfTokenizer::from_json_text(&text).map(Tokenizer::Hf)
                };
                tok.map(|t| t.with_origin(path.display().to_string()))
                    .map_err(|e| invalid(format!("{}: {e}", path.display())))
            }
        }
    }

    /// The tokenizer; for `char`, the vocabulary of the texts `corpus` yields (their distinct
    /// characters, sorted).
    pub fn load_with_corpus<'a>(&self, corpus: impl IntoIterator<Item = &'a str>) -> Result<Tokenizer> {
        match self {
            TokenizerSpec::Char => {
                let mut set = std::collections::BTreeSet::new();
                for text in corpus {
                    set.extend(text.chars());
                }
                Ok(Tokenizer::Char(CharTokenizer::from_chars(set.into_iter().collect())?))
            }
            _ => self.load(),
        }
    }
}

impl Tokenizer {
    /// The ids of `text`. Errors (char only) on a character outside the vocabulary, naming it and
    /// its position.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Char(t) => Ok(t.encode(text)?.into_iter().map(|i| i as u32).collect()),
            Tokenizer::Gpt2(t) => Ok(t.encode(text)),
            Tokenizer::Hf(t) => t.encode(text),
        }
    }

    /// [`Tokenizer::encode`] on weft's compute pool (when `threads` is above 1) where the kind
    /// allows cutting a text
    /// without changing its ids (gpt2: [`Gpt2Tokenizer::encode_parallel`] with 1 MiB pieces);
    /// other kinds encode on this thread.
    pub fn encode_parallel(&self, text: &str, threads: usize) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Gpt2(t) => Ok(t.encode_parallel(text, threads, 1 << 20)),
            _ => self.encode(text),
        }
    }

    /// The text of `ids`. Errors with [`Error::TokenOutOfRange`] on the first id `>=
    /// vocab_size()`. Ids whose bytes are not UTF-8 on their own (part of a multi-byte character)
    /// decode lossily: the broken sequence becomes U+FFFD, as tiktoken's `errors="replace"`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Tokenizer::Char(t) => {
                check_ids(ids, t.vocab_size())?;
                t.decode(&ids.iter().map(|&i| i64::from(i)).collect::<Vec<_>>())
            }
            Tokenizer::Gpt2(t) => t.decode(ids),
            Tokenizer::Hf(t) => t.decode(ids),
        }
    }

    /// [`Tokenizer::decode`] of ids given from outside: also refuses an id below `vocab_size()`
    /// that no token has (a tokenizer.json's vocabulary may skip ids, and decoding would drop
    /// it without a word), naming the id and its position.
    pub fn decode_exact(&self, ids: &[u32]) -> Result<String> {
        check_ids(ids, self.vocab_size())?;
        if let Tokenizer::Hf(t) = self {
            if let Some((position, id)) = t.first_gap(ids) {
                return Err(crate::error::invalid(format!(
                    "token id {id} at position {position} is no token of the tokenizer's vocabulary \
                     (its ids skip it)"
                )));
            }
        }
        self.decode(ids)
    }

    /// Ids run `0..vocab_size()`.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Char(t) => t.vocab_size(),
            Tokenizer::Gpt2(_) => gpt2::VOCAB_SIZE,
            Tokenizer::Hf(t) => t.vocab_size(),
        }
    }

    /// The end-of-text id, when the tokenizer has one: gpt2's `<|endoftext|>` (50256), a
    /// tokenizer.json's `<|endoftext|>`/`</s>`/... (see [`HfTokenizer::eot`]); `None` for char.
    pub fn eot(&self) -> Option<u32> {
        match self {
            Tokenizer::Char(_) => None,
            Tokenizer::Gpt2(_) => Some(gpt2::EOT),
            Tokenizer::Hf(t) => t.eot(),
        }
    }

    /// The same tokenizer, naming `origin` (the file it came from) in the errors of encode and
    /// decode where the kind can fail on its own (a tokenizer.json); other kinds are unchanged.
    pub fn with_origin(self, origin: impl Into<String>) -> Tokenizer {
        match self {
            Tokenizer::Hf(t) => Tokenizer::Hf(t.with_origin(origin)),
            other => other,
        }
    }

    /// `"char"`, `"gpt2"` or `"hf"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Tokenizer::Char(_) => "char",
            Tokenizer::Gpt2(_) => gpt2::JSON_TYPE,
            Tokenizer::Hf(_) => hf::JSON_TYPE,
        }
    }

    /// The JSON form as a value (see [`Tokenizer::to_json`]).
    pub fn to_json_value(&self) -> Value {
        match self {
            Tokenizer::Char(t) => serde_json::from_str(&t.to_json()).expect("the char form is JSON"),
            Tokenizer::Gpt2(t) => t.to_json_value(),
            Tokenizer::Hf(t) => t.to_json_value(),
        }
    }

    /// The JSON form, for checkpoints and index.json: `{"type": "char", "vocab": "..."}`,
    /// `{"type": "gpt2", "encoding": "r50k_base"}` or `{"type": "hf", "tokenizer": {...}}`.
    pub fn to_json(&self) -> String {
        match self {
            Tokenizer::Char(t) => t.to_json(),
            _ => self.to_json_value().to_string(),
        }
    }

    /// Reads any JSON form written by [`Tokenizer::to_json`] (or [`CharTokenizer::to_json`]).
    /// Errors name the key at fault.
    pub fn from_json(text: &str) -> Result<Tokenizer> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| invalid(format!("tokenizer JSON does not parse: {e}")))?;
        Self::from_json_value(&value)
    }

    /// [`Tokenizer::from_json`] of a parsed value.
    pub fn from_json_value(value: &Value) -> Result<Tokenizer> {
        let obj = value
            .as_object()
            .ok_or_else(|| invalid(format!("tokenizer JSON must be an object, got {}", short(value))))?;
        match obj.get("type") {
            Some(Value::String(t)) if t == "char" => CharTokenizer::from_json(&value.to_string()).map(Tokenizer::Char),
            Some(Value::String(t)) if t == gpt2::JSON_TYPE => Gpt2Tokenizer::from_json_value(obj).map(Tokenizer::Gpt2),
            Some(Value::String(t)) if t == hf::JSON_TYPE => HfTokenizer::from_json_value(obj).map(Tokenizer::Hf),
            Some(other) => Err(invalid(format!(
                "tokenizer JSON key \"type\": expected \"char\", \"gpt2\" or \"hf\", got {}",
                short(other)
            ))),
            None => Err(invalid("tokenizer JSON: missing key \"type\"")),
        }
    }
}

impl From<CharTokenizer> for Tokenizer {
    fn from(t: CharTokenizer) -> Tokenizer {
        Tokenizer::Char(t)
    }
}

/// Errors with [`Error::TokenOutOfRange`] on the first id `>= vocab_size`.
pub(crate) fn check_ids(ids: &[u32], vocab_size: usize) -> Result<()> {
    match ids.iter().position(|&id| id as usize >= vocab_size) {
        Some(position) => Err(Error::TokenOutOfRange {
            id: i64::from(ids[position]),
            position,
            vocab_size,
        }),
        None => Ok(()),
    }
}

/// A JSON value for a message, cut to 60 characters.
pub(crate) fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(60) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}
