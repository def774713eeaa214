//! Checked reads of a split's token stream: byte ranges rounded out to checksum blocks, each block
//! verified against index.json's CRC-32 and its ids against the vocabulary, recent blocks cached.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::index::{ShardEntry, TokenDtype};
use crate::error::{invalid, Result};
use crate::objects::ObjectSource;

/// Blocks kept in memory: at most this many...
const CACHE_BLOCKS: usize = 128;
/// ...and at most this many bytes of decoded ids (4 bytes a token), the newest block always. At
/// the default 64 KiB of u16 tokens a block decodes to 128 KiB, so the 128 blocks take 16 MiB;
/// larger blocks are kept fewer (with `block_bytes` unbounded, 128 blocks of 1 GiB each could be
/// held).
const CACHE_BYTES: usize = 32 << 20;

/// A split's shards laid end to end as one stream of tokens.
pub(crate) struct Stream {
    pub(crate) shards: Vec<ShardEntry>,
    /// `starts[i]`: the stream offset of shard `i`'s first token; `starts[len]` is the total.
    starts: Vec<u64>,
}

impl Stream {
    pub(crate) fn new(shards: Vec<ShardEntry>) -> Stream {
        let mut starts = Vec::with_capacity(shards.len() + 1);
        let mut at = 0u64;
        for s in &shards {
            starts.push(at);
            at += s.tokens;
        }
        starts.push(at);
        Stream { shards, starts }
    }

    /// Total tokens.
    pub(crate) fn len(&self) -> u64 {
        *self.starts.last().expect("starts has a final entry")
    }
}

/// Reads verified blocks through an [`ObjectSource`], caching the last [`CACHE_BLOCKS`].
pub(crate) struct BlockReader {
    source: Arc<dyn ObjectSource>,
    dtype: TokenDtype,
    block_bytes: u64,
    vocab_size: u64,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    blocks: HashMap<(String, u64), Arc<Vec<u32>>>,
    order: VecDeque<(String, u64)>,
    /// Bytes of the ids in `blocks`.
    bytes: usize,
}

impl BlockReader {
    pub(crate) fn new(
        source: Arc<dyn ObjectSource>,
        dtype: TokenDtype,
        block_bytes: u64,
        vocab_size: u64,
    ) -> BlockReader {
        BlockReader {
            source,
            dtype,
            block_bytes,
            vocab_size,
            cache: Mutex::new(Cache::default()),
        }
    }

    /// Tokens `range` of `stream`, appended to `out`. `range` must lie inside the stream.
    pub(crate) fn read(&self, stream: &Stream, range: Range<u64>, out: &mut Vec<u32>) -> Result<()> {
        debug_assert!(range.end <= stream.len());
        let mut at = range.start;
        while at < range.end {
            // the shard holding token `at`: the last start <= at
            let i = stream.starts.partition_point(|&s| s <= at) - 1;
            let shard = &stream.shards[i];
            let local = at - stream.starts[i];
            let take = (range.end - at).min(shard.tokens - local);
            self.read_shard(shard, local..local + take, out)?;
            at += take;
        }
        Ok(())
    }

    /// Tokens `range` of one shard.
    fn read_shard(&self, shard: &ShardEntry, range: Range<u64>, out: &mut Vec<u32>) -> Result<()> {
        let per_block = self.block_bytes / self.dtype.width();
        let (first, last) = (range.start / per_block, (range.end - 1) / per_block);
        for b in first..=last {
            let block = self.block(shard, b)?;
            let base = b * per_block;
            let lo = range.start.max(base) - base;
            let hi = range.end.min(base + block.len() as u64) - base;
            out.extend_from_slice(&block[lo as usize..hi as usize]);
        }
        Ok(())
    }

    /// Block `b` of `shard`, from the cache or read and verified.
    fn block(&self, shard: &ShardEntry, b: u64) -> Result<Arc<Vec<u32>>> {
        let key = (shard.name.clone(), b);
        if let Some(hit) = self.cache.lock().expect("cache lock").blocks.get(&key) {
            return Ok(hit.clone());
        }
        let block = Arc::new(self.load(shard, b)?);
        let mut cache = self.cache.lock().expect("cache lock");
        if cache.blocks.insert(key.clone(), block.clone()).is_none() {
            cache.order.push_back(key);
            cache.bytes += block.len() * 4;
            while cache.order.len() > CACHE_BLOCKS || (cache.order.len() > 1 && cache.bytes > CACHE_BYTES) {
                let old = cache.order.pop_front().expect("order is not empty");
                if let Some(gone) = cache.blocks.remove(&old) {
                    cache.bytes -= gone.len() * 4;
                }
            }
        }
        Ok(block)
    }

    /// Reads block `b` of `shard`, checks its CRC-32 and that every id is below the vocabulary size.
    pub(crate) fn load(&self, shard: &ShardEntry, b: u64) -> Result<Vec<u32>> {
        let len = shard.tokens * self.dtype.width();
        let start = b * self.block_bytes;
        let end = (start + self.block_bytes).min(len);
        let want = shard.crc32[b as usize];
        let mut bytes = self.source.read_range(&shard.name, start..end)?;
        let mut got = crc32fast::hash(&bytes);
        // what a cache kept (from one bad answer, or damaged on its disk) is read again from
        // the store before the shard is called damaged
        if got != want && self.source.forget(&shard.name, start..end) {
            bytes = self.source.read_range(&shard.name, start..end)?;
            got = crc32fast::hash(&bytes);
        }
        if got != want {
            return Err(invalid(format!(
                "{}: checksum mismatch in bytes {start}..{end} (crc32 {got:08x}, index.json says {want:08x}): the shard is damaged or was rewritten",
                self.source.describe(&shard.name)
            )));
        }
        let ids = self.dtype.decode(&bytes);
        if let Some(p) = ids.iter().position(|&id| u64::from(id) >= self.vocab_size) {
            return Err(invalid(format!(
                "{}: token {} (at token offset {}) is out of range for vocab_size {}",
                self.source.describe(&shard.name),
                ids[p],
                start / self.dtype.width() + p as u64,
                self.vocab_size
            )));
        }
        Ok(ids)
    }
}
