//! Writing a token dataset: tokenize documents in parallel, cut each into train and val, append the
//! pieces to the two splits' streams (each piece followed by the end-of-text id when the tokenizer
//! has one), write the streams as shards, and write `index.json` last.
//!
//! Split rule: the last `val_fraction` of **each document's** tokens goes to `val`
//! (`floor(n * (1 - val_fraction))` tokens stay in train, as nanoGPT's `int(n * 0.9)`), so every
//! document is represented in both splits and a single-file corpus splits exactly as nanoGPT does.
//!
//! Nothing half-written: each shard is put whole through the [`ObjectSink`], and `index.json` only
//! after every shard is in place; a prepare that fails writes no index.json (shards already put
//! stay behind, unreferenced).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::index::{
    check_block_bytes, Index, ShardEntry, SplitEntry, TokenDtype, DEFAULT_BLOCK_BYTES, FORMAT, INDEX_NAME, VERSION,
};
use crate::error::{invalid, Result};
use crate::objects::ObjectSink;
use crate::tokenizer::Tokenizer;

/// Settings of [`prepare`].
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    /// The fraction of each document's tokens that goes to `val`, in `[0, 1)`.
    pub val_fraction: f64,
    /// Tokens per shard (the last shard of a split holds the rest).
    pub shard_tokens: u64,
    /// Checksum block size in bytes, a positive multiple of 4.
    pub block_bytes: u64,
    /// Documents tokenized at once. Above 1 they are tokenized on weft's compute pool (its
    /// threads: `WEFT_NUM_THREADS`); 1 keeps the work on the calling thread.
    pub threads: usize,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        PrepareOptions {
            val_fraction: 0.1,
            shard_tokens: 100_000_000,
            block_bytes: DEFAULT_BLOCK_BYTES,
            threads: 1,
        }
    }
}

/// Tokenizes the text files `inputs` (one document each, in this order) with `tokenizer` and writes
/// the shards and `index.json` through `sink`. `progress` is called with the bytes of each input
/// once it is tokenized (from the calling thread). Errors name the input file or the object.
pub fn prepare(
    tokenizer: &Tokenizer,
    inputs: &[PathBuf],
    sink: &dyn ObjectSink,
    opts: &PrepareOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<Index> {
    crate::check_val_fraction(opts.val_fraction)?;
    if opts.shard_tokens == 0 {
        return Err(invalid("shard_tokens must be at least 1"));
    }
    check_block_bytes(opts.block_bytes).map_err(|e| invalid(format!("block_bytes: {e}")))?;
    if inputs.is_empty() {
        return Err(invalid("prepare: no input files"));
    }
    let dtype = TokenDtype::for_vocab(tokenizer.vocab_size());
    let mut train = ShardWriter::new(sink, "train", dtype, opts);
    let mut val = ShardWriter::new(sink, "val", dtype, opts);
    let eot = tokenizer.eot();
    let threads = opts.threads.max(1);
    for chunk in inputs.chunks(threads * 2) {
        let docs = tokenize_all(tokenizer, chunk, threads)?;
        for (ids, bytes) in docs {
            let keep = crate::train_len(ids.len(), opts.val_fraction);
            for (w, piece) in [(&mut train, &ids[..keep]), (&mut val, &ids[keep..])] {
                if !piece.is_empty() {
                    w.push(piece)?;
                    if let Some(e) = eot {
                        w.push(&[e])?;
                    }
                }
            }
            progress(bytes);
        }
    }
    let mut splits = BTreeMap::new();
    splits.insert("train".to_string(), train.finish()?);
    splits.insert("val".to_string(), val.finish()?);
    let index = Index {
        format: FORMAT.to_string(),
        version: VERSION,
        tokenizer: tokenizer.to_json_value(),
        vocab_size: tokenizer.vocab_size() as u64,
        eot,
        dtype,
        block_bytes: opts.block_bytes,
        val_fraction: opts.val_fraction,
        val_split: "per_document".to_string(),
        splits,
    };
    sink.put(INDEX_NAME, index.to_json().as_bytes())?;
    Ok(index)
}

/// A document's ids and its size in bytes.
type Tokenized = (Vec<u32>, u64);

/// Reads and tokenizes `paths`, on weft's compute pool when `threads` is above 1; returns each
/// document's ids and byte length, in input order (the first error by input order).
fn tokenize_all(tokenizer: &Tokenizer, paths: &[PathBuf], threads: usize) -> Result<Vec<Tokenized>> {
    // fewer documents than threads: gpt2 cuts a document into pieces, so the documents go one
    // after another, each one's pieces over the whole pool; other kinds take one thread a document
    let cuts = matches!(tokenizer, Tokenizer::Gpt2(_));
    if threads <= 1 || (cuts && paths.len() < threads) {
        return paths.iter().map(|p| tokenize_file(tokenizer, p, threads)).collect();
    }
    weft_core::cpu::pool::map(paths.len(), |i| tokenize_file(tokenizer, &paths[i], 1))
        .into_iter()
        .collect()
}

fn tokenize_file(tokenizer: &Tokenizer, path: &Path, threads: usize) -> Result<Tokenized> {
    let bytes = crate::files::read(path)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| invalid(format!("{}: not UTF-8 text ({e})", path.display())))?;
    let ids = tokenizer
        .encode_parallel(text, threads)
        .map_err(|e| invalid(format!("{}: {e}", path.display())))?;
    Ok((ids, bytes.len() as u64))
}

/// Appends tokens to one split, putting a shard every `shard_tokens` tokens.
struct ShardWriter<'a> {
    sink: &'a dyn ObjectSink,
    split: &'static str,
    dtype: TokenDtype,
    shard_tokens: u64,
    block_bytes: u64,
    buf: Vec<u8>,
    shards: Vec<ShardEntry>,
}

impl<'a> ShardWriter<'a> {
    fn new(sink: &'a dyn ObjectSink, split: &'static str, dtype: TokenDtype, opts: &PrepareOptions) -> Self {
        ShardWriter {
            sink,
            split,
            dtype,
            shard_tokens: opts.shard_tokens,
            block_bytes: opts.block_bytes,
            buf: Vec::new(),
            shards: Vec::new(),
        }
    }

    fn buffered(&self) -> u64 {
        self.buf.len() as u64 / self.dtype.width()
    }

    fn push(&mut self, mut ids: &[u32]) -> Result<()> {
        while !ids.is_empty() {
            let room = (self.shard_tokens - self.buffered()) as usize;
            let (now, rest) = ids.split_at(room.min(ids.len()));
            self.dtype.extend_bytes(&mut self.buf, now);
            ids = rest;
            if self.buffered() == self.shard_tokens {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let name = format!("{}-{:05}.bin", self.split, self.shards.len());
        let crc32 = self
            .buf
            .chunks(self.block_bytes as usize)
            .map(crc32fast::hash)
            .collect();
        self.sink.put(&name, &self.buf)?;
        self.shards.push(ShardEntry {
            name,
            tokens: self.buffered(),
            crc32,
        });
        self.buf.clear();
        Ok(())
    }

    fn finish(mut self) -> Result<SplitEntry> {
        self.flush()?;
        Ok(SplitEntry {
            tokens: self.shards.iter().map(|s| s.tokens).sum(),
            shards: self.shards,
        })
    }
}
