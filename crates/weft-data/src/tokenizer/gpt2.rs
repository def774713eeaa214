//! GPT-2's byte-level BPE (the `r50k_base` ranks, 50,257 tokens), through the `tiktoken-rs` crate,
//! which ships the ranks: nothing is downloaded.
//!
//! Text is encoded as tiktoken's `encode_ordinary`: a `<|endoftext|>` inside the text is plain text
//! (7 ordinary tokens), never the end-of-text id; documents are separated with [`EOT`] by whoever
//! joins them. Decoding is lossy, as tiktoken's `decode(..., errors="replace")`: the bytes of the
//! ids are joined and any sequence that is not UTF-8 becomes U+FFFD.

use serde_json::{json, Value};
use tiktoken_rs::CoreBPE;

use crate::error::{Error, Result};

/// The `"type"` field of the JSON form.
pub(crate) const JSON_TYPE: &str = "gpt2";
/// The encoding named in the JSON form.
const ENCODING: &str = "r50k_base";
/// The end-of-text id, `<|endoftext|>`.
pub const EOT: u32 = 50256;
/// Number of tokens: 50,256 merged byte sequences plus `<|endoftext|>`.
pub const VOCAB_SIZE: usize = 50257;

/// GPT-2's tokenizer. Cheap to clone: the ranks are built once per process and shared.
#[derive(Clone)]
pub struct Gpt2Tokenizer {
    bpe: &'static CoreBPE,
}

impl std::fmt::Debug for Gpt2Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gpt2Tokenizer(r50k_base)")
    }
}

impl Default for Gpt2Tokenizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Gpt2Tokenizer {
    /// The tokenizer (the first call in a process builds the rank tables, ~0.1 s).
    pub fn new() -> Gpt2Tokenizer {
        Gpt2Tokenizer {
            bpe: tiktoken_rs::r50k_base_singleton(),
        }
    }

    /// The ids of `text`, `<|endoftext|>` included as plain text. On a thread of weft's compute
    /// pool (a task of [`Gpt2Tokenizer::encode_parallel`] or of `weft data prepare`), through
    /// that thread's own copy of the tables ([`on_this_thread`]).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        if weft_core::cpu::pool::in_task() {
            if let Some(ids) = on_this_thread(|bpe| bpe.encode_ordinary(text)) {
                return ids;
            }
        }
        self.bpe.encode_ordinary(text)
    }

    /// The ids of `text` as [`Gpt2Tokenizer::encode`], computed on weft's compute pool when
    /// `threads` is above 1 (called from a pool task, on the calling thread alone): the
    /// text is cut into pieces of about `piece_bytes` bytes at spaces that GPT-2's pre-tokenizer
    /// always splits at (a space after an ASCII letter or digit and before an ASCII letter: the
    /// word before ends there and `" word"` starts a new piece), so the ids are exactly those of
    /// the whole text. Text with no such space (most CJK text) stays in one piece.
    pub fn encode_parallel(&self, text: &str, threads: usize, piece_bytes: usize) -> Vec<u32> {
        let pieces = cut_at_word_starts(text, piece_bytes.max(1));
        if threads <= 1 || pieces.len() <= 1 {
            return self.encode(text);
        }
        weft_core::cpu::pool::map(pieces.len(), |i| self.encode(pieces[i])).concat()
    }

    /// The text of `ids`, invalid UTF-8 replaced by U+FFFD. Errors with
    /// [`Error::TokenOutOfRange`] on the first id `>= 50257`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        super::check_ids(ids, VOCAB_SIZE)?;
        let bytes = self.bpe.decode_bytes(ids).map_err(|e| Error::TokenOutOfRange {
            id: i64::from(e.token),
            position: ids.iter().position(|&i| i == e.token).unwrap_or(0),
            vocab_size: VOCAB_SIZE,
        })?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The bytes of every token but `<|endoftext|>`, by id (`r50k_base`'s ranks: token `i` has
    /// rank `i`).
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        (0..EOT)
            .map(|id| {
                self.bpe
                    .decode_bytes(&[id])
                    .expect("every id below <|endoftext|> is a rank")
            })
            .collect()
    }

    /// `{"type": "gpt2", "encoding": "r50k_base"}`.
    pub fn to_json_value(&self) -> Value {
        json!({ "type": JSON_TYPE, "encoding": ENCODING })
    }

    /// Reads the JSON form; `encoding` must be `"r50k_base"` (or absent).
    pub(crate) fn from_json_value(obj: &serde_json::Map<String, Value>) -> Result<Gpt2Tokenizer> {
        match obj.get("encoding") {
            None => {}
            Some(Value::String(e)) if e == ENCODING => {}
            Some(other) => {
                return Err(crate::error::invalid(format!(
                    "tokenizer JSON key \"encoding\": expected \"{ENCODING}\", got {other}"
                )))
            }
        }
        Ok(Gpt2Tokenizer::new())
    }
}

/// `f` of this thread's own `r50k_base` tables, built at its first call on the thread (about
/// 0.1 s); `None` when they do not build (then the shared ones serve). The shared tables' regexes
/// keep one pool of search caches for all the threads using them, which only the thread that
/// made the pool takes from without a lock: with two threads encoding at once, `weft data
/// prepare` took twice the CPU time for the same work and ran no faster than on one thread
/// (docs/data.md, "Throughput"). Used on the compute pool's threads only, so there are at most
/// as many copies as those threads.
fn on_this_thread<R>(f: impl FnOnce(&CoreBPE) -> R) -> Option<R> {
    thread_local! {
        static OWN: std::cell::OnceCell<Option<CoreBPE>> = const { std::cell::OnceCell::new() };
    }
    OWN.with(|own| own.get_or_init(|| tiktoken_rs::r50k_base().ok()).as_ref().map(f))
}

/// `text` cut into consecutive pieces of about `piece_bytes` bytes, each cut at a byte `i` with
/// `text[i] == ' '`, `text[i - 1]` an ASCII letter or digit and `text[i + 1]` an ASCII letter.
fn cut_at_word_starts(text: &str, piece_bytes: usize) -> Vec<&str> {
    let b = text.as_bytes();
    let mut pieces = Vec::new();
    let mut start = 0;
    let mut i = piece_bytes;
    while i + 1 < b.len() {
        if b[i] == b' ' && b[i - 1].is_ascii_alphanumeric() && b[i + 1].is_ascii_alphabetic() {
            // all three are ASCII, so `i` is a char boundary
            pieces.push(&text[start..i]);
            start = i;
            i += piece_bytes;
        } else {
            i += 1;
        }
    }
    pieces.push(&text[start..]);
    pieces
}
