//! `index.json`, the table of contents of a token dataset: the tokenizer, the token dtype, and per
//! split the shards in stream order with their token counts and block checksums.
//!
//! ```json
//! {"format": "weft-tokens", "version": 1,
//!  "tokenizer": {"type": "gpt2", "encoding": "r50k_base"}, "vocab_size": 50257, "eot": 50256,
//!  "dtype": "u16", "block_bytes": 65536, "val_fraction": 0.1, "val_split": "per_document",
//!  "splits": {"train": {"tokens": 301966, "shards": [{"name": "train-00000.bin", "tokens": 301966,
//!                                                      "crc32": [123, 456, ...]}]},
//!             "val": {...}}}
//! ```
//!
//! A shard holds raw little-endian tokens (`u16` when `vocab_size <= 65536`, else `u32`), so it is
//! `tokens * 2` (or `* 4`) bytes long. `crc32[i]` is the CRC-32 (IEEE) of bytes
//! `[i * block_bytes, min((i + 1) * block_bytes, len))` of the shard: a reader checks any range by
//! reading the blocks that cover it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{invalid, Result};
use crate::tokenizer::{short, Tokenizer};

/// The `format` field.
pub const FORMAT: &str = "weft-tokens";
/// The `version` field this build writes and reads.
pub const VERSION: u64 = 1;
/// The object name of the index.
pub const INDEX_NAME: &str = "index.json";
/// Default checksum block: 64 KiB (a random window of 1,025 u16 tokens reads one or two blocks).
pub const DEFAULT_BLOCK_BYTES: u64 = 64 << 10;

/// Checks a checksum block size in bytes: a positive multiple of 4, so that every block holds
/// whole tokens of either width. The error gives the value and the rule (the caller names the
/// setting).
pub fn check_block_bytes(block_bytes: u64) -> Result<()> {
    check_block_layout(block_bytes)?;
    if block_bytes > MAX_BLOCK_BYTES {
        return Err(invalid(format!(
            "{block_bytes} is over the limit of {MAX_BLOCK_BYTES} (16 MiB): a reader holds whole blocks in memory"
        )));
    }
    Ok(())
}

/// What a dataset's blocks must be to be read at all: a positive multiple of 4 bytes. Datasets
/// written with blocks over [`MAX_BLOCK_BYTES`] (before there was a limit) are still read; their
/// reads reserve memory fallibly, and the reader keeps fewer of their blocks.
fn check_block_layout(block_bytes: u64) -> Result<()> {
    if block_bytes == 0 || !block_bytes.is_multiple_of(4) {
        return Err(invalid(format!("{block_bytes} is not a positive multiple of 4")));
    }
    Ok(())
}

/// The largest checksum block `weft data prepare` writes, in bytes.
pub const MAX_BLOCK_BYTES: u64 = 16 << 20;

/// The width of a stored token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    /// Little-endian `u16` (vocabularies of at most 65,536 tokens).
    U16,
    /// Little-endian `u32`.
    U32,
}

impl TokenDtype {
    /// The dtype for a vocabulary of `vocab_size` tokens.
    pub fn for_vocab(vocab_size: usize) -> TokenDtype {
        if vocab_size <= 1 << 16 {
            TokenDtype::U16
        } else {
            TokenDtype::U32
        }
    }

    /// Bytes per token.
    pub fn width(self) -> u64 {
        match self {
            TokenDtype::U16 => 2,
            TokenDtype::U32 => 4,
        }
    }

    /// Appends `ids` to `out` in this dtype, little-endian (ids must fit).
    pub fn extend_bytes(self, out: &mut Vec<u8>, ids: &[u32]) {
        match self {
            TokenDtype::U16 => ids
                .iter()
                .for_each(|&i| out.extend_from_slice(&(i as u16).to_le_bytes())),
            TokenDtype::U32 => ids.iter().for_each(|&i| out.extend_from_slice(&i.to_le_bytes())),
        }
    }

    /// The tokens of `bytes` (a whole number of tokens).
    pub fn decode(self, bytes: &[u8]) -> Vec<u32> {
        match self {
            TokenDtype::U16 => bytes
                .chunks_exact(2)
                .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            TokenDtype::U32 => bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        }
    }
}

/// One shard: its object name, token count and block checksums.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardEntry {
    /// Object name, relative to the dataset's root.
    pub name: String,
    /// Number of tokens.
    pub tokens: u64,
    /// CRC-32 of each `block_bytes` block, in order.
    pub crc32: Vec<u32>,
}

/// One split: its shards, in stream order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SplitEntry {
    /// Total tokens (the sum over the shards).
    pub tokens: u64,
    /// The shards.
    pub shards: Vec<ShardEntry>,
}

/// The whole `index.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Index {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`].
    pub version: u64,
    /// The tokenizer's JSON form ([`Tokenizer::to_json_value`]).
    pub tokenizer: Value,
    /// Ids run `0..vocab_size`.
    pub vocab_size: u64,
    /// The end-of-text id that separates documents, if the tokenizer has one.
    pub eot: Option<u32>,
    /// Token width in the shards.
    pub dtype: TokenDtype,
    /// Checksum block size in bytes (a positive multiple of 4).
    pub block_bytes: u64,
    /// The fraction of each document's tokens that went to `val`.
    pub val_fraction: f64,
    /// How `val` was cut: `"per_document"` (the last `val_fraction` of each document).
    pub val_split: String,
    /// `"train"` and `"val"`.
    pub splits: BTreeMap<String, SplitEntry>,
}

impl Index {
    /// Parses and checks an index.json's bytes; `what` names the file in messages. Returns the
    /// index and its tokenizer. Checks: JSON, format and version (before anything else, so a newer
    /// file says so), every field's type, the tokenizer, vocab_size and dtype agreeing, `eot` below
    /// vocab_size, block size, splits present, token counts adding up (without overflow: a count
    /// whose bytes do not fit in 64 bits is refused), one checksum per block.
    pub fn parse(bytes: &[u8], what: &str) -> Result<(Index, Tokenizer)> {
        let bad = |msg: String| invalid(format!("{what}: {msg}"));
        let value: Value = serde_json::from_slice(bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
        match value.get("format") {
            Some(Value::String(f)) if f == FORMAT => {}
            Some(other) => return Err(bad(format!("\"format\" is {}, expected \"{FORMAT}\"", short(other)))),
            None => return Err(bad(format!("no \"format\" key: not a {FORMAT} index"))),
        }
        match value.get("version").and_then(Value::as_u64) {
            Some(VERSION) => {}
            Some(v) => {
                return Err(bad(format!(
                    "version {v} is not supported (this build reads version {VERSION})"
                )))
            }
            None => return Err(bad("\"version\" is missing or not an integer".into())),
        }
        let index: Index = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        let tokenizer = Tokenizer::from_json_value(&index.tokenizer)
            .map_err(|e| bad(e.to_string()))?
            .with_origin(what);
        if tokenizer.vocab_size() as u64 != index.vocab_size {
            return Err(bad(format!(
                "vocab_size {} disagrees with its tokenizer's {}",
                index.vocab_size,
                tokenizer.vocab_size()
            )));
        }
        if index.dtype != TokenDtype::for_vocab(tokenizer.vocab_size()) {
            return Err(bad(format!(
                "dtype {:?} does not fit vocab_size {}",
                index.dtype, index.vocab_size
            )));
        }
        if let Some(eot) = index.eot.filter(|&e| u64::from(e) >= index.vocab_size) {
            return Err(bad(format!(
                "eot {eot} is not a token id: the vocabulary runs 0..{}",
                index.vocab_size
            )));
        }
        check_block_layout(index.block_bytes).map_err(|e| bad(format!("block_bytes: {e}")))?;
        for split in ["train", "val"] {
            let s = index
                .splits
                .get(split)
                .ok_or_else(|| bad(format!("split \"{split}\" is missing")))?;
            let mut sum = 0u64;
            for (i, sh) in s.shards.iter().enumerate() {
                sum = sum.checked_add(sh.tokens).ok_or_else(|| {
                    bad(format!(
                        "splits.{split}.shards[{i}].tokens: {} ({}) takes the split's total past 2^64 - 1",
                        sh.tokens, sh.name
                    ))
                })?;
            }
            if sum != s.tokens {
                return Err(bad(format!(
                    "split \"{split}\" says {} tokens but its shards hold {sum}",
                    s.tokens
                )));
            }
            for (i, sh) in s.shards.iter().enumerate() {
                let bytes = sh.tokens.checked_mul(index.dtype.width()).ok_or_else(|| {
                    bad(format!(
                        "splits.{split}.shards[{i}].tokens: {} ({}) is too large: at {} bytes a token, its length does not fit in 64 bits",
                        sh.tokens,
                        sh.name,
                        index.dtype.width()
                    ))
                })?;
                let want = bytes.div_ceil(index.block_bytes);
                if sh.crc32.len() as u64 != want {
                    return Err(bad(format!(
                        "shard {} lists {} checksums, expected {want} for {} tokens",
                        sh.name,
                        sh.crc32.len(),
                        sh.tokens
                    )));
                }
            }
        }
        if let Some(extra) = index.splits.keys().find(|k| *k != "train" && *k != "val") {
            return Err(bad(format!("unknown split \"{extra}\"")));
        }
        Ok((index, tokenizer))
    }

    /// The JSON text (compact, with a final newline: checksum lists can be long).
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string(self).expect("the index serializes");
        s.push('\n');
        s
    }
}
