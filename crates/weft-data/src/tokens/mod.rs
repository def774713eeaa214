//! Token datasets: shards of token ids plus an `index.json`, as `weft data prepare` writes them,
//! read through an [`ObjectSource`] (a local folder or an object store).
//!
//! A split's stream (its shards in order) is cut into windows of `block_size + 1` tokens at stride
//! `block_size`: window `w` is tokens `[w * block_size, w * block_size + block_size + 1)`, its
//! first `block_size` tokens the inputs and its last `block_size` the targets. With `N` windows,
//! row `row` of the batch at `step` is the global position `p = step * batch_size + row`, which
//! reads window `WindowOrder::new(N, seed, p / N).apply(p % N)`: every epoch visits each window
//! once, in an order that depends on `(seed, epoch)` alone. A batch is therefore a pure function of
//! `(split, step, batch_size, block_size, seed)`, and a data-parallel rank can read only its rows.

pub mod index;
pub mod order;
pub mod prepare;

mod blocks;

use std::ops::Range;
use std::sync::Arc;

use weft_core::Tensor;

use self::blocks::{BlockReader, Stream};
pub use self::index::{
    check_block_bytes, Index, ShardEntry, SplitEntry, TokenDtype, DEFAULT_BLOCK_BYTES, INDEX_NAME, MAX_BLOCK_BYTES,
};
pub use self::order::WindowOrder;
pub use self::prepare::{prepare, PrepareOptions};
use crate::error::{invalid, Result};
use crate::objects::ObjectSource;
use crate::tokenizer::Tokenizer;
use crate::Split;

/// An opened token dataset: its index checked, its shards present and of the right length.
pub struct TokenDataset {
    source: Arc<dyn ObjectSource>,
    index: Index,
    tokenizer: Tokenizer,
    train: Stream,
    val: Stream,
    reader: BlockReader,
}

impl std::fmt::Debug for TokenDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenDataset")
            .field("root", &self.source.describe(""))
            .field("train_tokens", &self.train.len())
            .field("val_tokens", &self.val.len())
            .field("vocab_size", &self.index.vocab_size)
            .finish()
    }
}

/// Threads asking a store for shard lengths at once.
const LENGTH_THREADS: usize = 16;

/// The length of each of `shards` in `source`, asked on up to [`LENGTH_THREADS`] threads: one
/// request after another, a dataset of 20,000 shards in an object store waited 20,000 round
/// trips before its first step.
/// `None` for a shard not asked for (past a failure, or lost with a panicked thread): the caller
/// asks for it when it gets there.
fn lengths(source: &dyn ObjectSource, shards: &[&ShardEntry]) -> Vec<Option<Result<u64>>> {
    let threads = LENGTH_THREADS.min(shards.len());
    if threads <= 1 {
        return shards.iter().map(|_| None).collect();
    }
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    // the lowest shard whose length could not be had: none past it is asked for (a store that
    // fails after the index was read would otherwise be retried for every shard)
    let failed = AtomicUsize::new(usize::MAX);
    let mut out: Vec<(usize, Result<u64>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i > failed.load(Ordering::Relaxed) {
                            break;
                        }
                        let Some(shard) = shards.get(i) else { break };
                        let len = source.len(&shard.name);
                        if len.is_err() {
                            failed.fetch_min(i, Ordering::Relaxed);
                        }
                        mine.push((i, len));
                    }
                    mine
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap_or_default()).collect()
    });
    out.sort_by_key(|(i, _)| *i);
    let mut got: Vec<Option<Result<u64>>> = (0..shards.len()).map(|_| None).collect();
    for (i, r) in out {
        got[i] = Some(r);
    }
    got
}

impl TokenDataset {
    /// Reads and checks `index.json` (see [`Index::parse`]) and checks that every shard exists
    /// with exactly `tokens * width` bytes. Shard contents are verified block by block as they are
    /// read, not here (a multi-GB dataset opens without reading it); [`TokenDataset::verify`]
    /// reads everything. Errors name the file at fault.
    pub fn open(source: Arc<dyn ObjectSource>) -> Result<TokenDataset> {
        let bytes = source.read(INDEX_NAME)?;
        TokenDataset::open_with_index(source, &bytes)
    }

    /// As [`TokenDataset::open`], with the bytes of `index.json` already read by the caller (who
    /// read it from the store itself, say, to name the dataset's version): the index is not read
    /// again through `source`.
    pub fn open_with_index(source: Arc<dyn ObjectSource>, index_bytes: &[u8]) -> Result<TokenDataset> {
        let what = source.describe(INDEX_NAME);
        let (index, tokenizer) = Index::parse(index_bytes, &what)?;
        let shards: Vec<&ShardEntry> = index.splits.values().flat_map(|s| &s.shards).collect();
        let lens = lengths(&*source, &shards);
        for (shard, got) in shards.iter().zip(lens) {
            let want = shard.tokens * index.dtype.width();
            let mut got = match got {
                Some(asked) => asked?,
                None => source.len(&shard.name)?,
            };
            // a length a cache kept from an earlier answer is asked for again
            if got != want && source.forget(&shard.name, 0..0) {
                got = source.len(&shard.name)?;
            }
            if got != want {
                return Err(invalid(format!(
                    "{}: {got} bytes, but {INDEX_NAME} lists {} tokens ({want} bytes)",
                    source.describe(&shard.name),
                    shard.tokens
                )));
            }
        }
        let train = Stream::new(index.splits["train"].shards.clone());
        let val = Stream::new(index.splits["val"].shards.clone());
        let reader = BlockReader::new(source.clone(), index.dtype, index.block_bytes, index.vocab_size);
        Ok(TokenDataset {
            source,
            index,
            tokenizer,
            train,
            val,
            reader,
        })
    }

    /// The index as read.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The tokenizer that made the shards.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Ids run `0..vocab_size()`.
    pub fn vocab_size(&self) -> usize {
        self.index.vocab_size as usize
    }

    fn stream(&self, split: Split) -> &Stream {
        match split {
            Split::Train => &self.train,
            Split::Val => &self.val,
        }
    }

    /// Tokens in `split`.
    pub fn tokens(&self, split: Split) -> u64 {
        self.stream(split).len()
    }

    /// Number of windows of `block_size + 1` tokens at stride `block_size` in `split`. Errors,
    /// naming the split and both sizes, when the split has fewer than `block_size + 1` tokens.
    pub fn windows(&self, split: Split, block_size: usize) -> Result<u64> {
        let n = self.tokens(split);
        if block_size == 0 {
            return Err(invalid("token dataset: block_size must be at least 1"));
        }
        if n <= block_size as u64 {
            return Err(invalid(format!(
                "token dataset {}: split \"{split}\" has {n} tokens, too few for one window of block_size {block_size} + 1",
                self.source.describe("")
            )));
        }
        Ok((n - 1) / block_size as u64)
    }

    /// The window that row `row` of the batch at `step` reads (see the module docs).
    pub fn window(
        &self,
        split: Split,
        step: u64,
        batch_size: usize,
        block_size: usize,
        seed: u64,
        row: usize,
    ) -> Result<u64> {
        let n = self.windows(split, block_size)?;
        let p = step
            .checked_mul(batch_size as u64)
            .and_then(|x| x.checked_add(row as u64))
            .ok_or_else(|| {
                invalid(format!(
                    "token batch: step {step} * batch_size {batch_size} overflows u64"
                ))
            })?;
        Ok(WindowOrder::new(n, seed, p / n).apply(p % n))
    }

    /// Tokens `range` of `split`'s stream, verified.
    pub fn read_tokens(&self, split: Split, range: Range<u64>) -> Result<Vec<u32>> {
        let n = self.tokens(split);
        if range.start > range.end || range.end > n {
            return Err(invalid(format!(
                "token dataset: range {}..{} is outside split \"{split}\" (0..{n})",
                range.start, range.end
            )));
        }
        let mut out = Vec::with_capacity((range.end - range.start) as usize);
        self.reader.read(self.stream(split), range, &mut out)?;
        Ok(out)
    }

    /// Rows `rows` of the batch at `step`: `(x, y)`, each I64 `[rows.len(), block_size]`; row `r`
    /// of `x` is the first `block_size` tokens of window [`TokenDataset::window`]`(.., r)` and of
    /// `y` its last `block_size`. `rows` must lie in `0..batch_size`; a data-parallel rank asks for
    /// its own slice of rows. Reads only the blocks those windows touch. Evaluation uses
    /// `Split::Val` with `step` counting evaluation batches.
    pub fn batch(
        &self,
        split: Split,
        step: u64,
        batch_size: usize,
        block_size: usize,
        seed: u64,
        rows: Range<usize>,
    ) -> Result<(Tensor, Tensor)> {
        if rows.start > rows.end || rows.end > batch_size {
            return Err(invalid(format!(
                "token batch: rows {}..{} are not inside the batch's 0..{batch_size}",
                rows.start, rows.end
            )));
        }
        let n = rows.len().checked_mul(block_size).ok_or_else(|| {
            invalid(format!(
                "token batch: {} rows * block_size {block_size} overflow",
                rows.len()
            ))
        })?;
        let mut x: Vec<i64> = weft_core::alloc::with_capacity("token batch", n)?;
        let mut y: Vec<i64> = weft_core::alloc::with_capacity("token batch", n)?;
        let mut window = Vec::with_capacity(block_size + 1);
        let stride = block_size as u64;
        for row in rows.clone() {
            let w = self.window(split, step, batch_size, block_size, seed, row)?;
            window.clear();
            self.reader
                .read(self.stream(split), w * stride..w * stride + stride + 1, &mut window)?;
            x.extend(window[..block_size].iter().map(|&t| i64::from(t)));
            y.extend(window[1..].iter().map(|&t| i64::from(t)));
        }
        let shape = [rows.len(), block_size];
        Ok((Tensor::from_vec(x, &shape)?, Tensor::from_vec(y, &shape)?))
    }

    /// Reads every block of every shard, checking checksums and ids; errors name the shard.
    pub fn verify(&self) -> Result<u64> {
        let mut blocks = 0;
        for split in [&self.train, &self.val] {
            for shard in &split.shards {
                for b in 0..shard.crc32.len() as u64 {
                    self.reader.load(shard, b)?;
                    blocks += 1;
                }
            }
        }
        Ok(blocks)
    }
}
