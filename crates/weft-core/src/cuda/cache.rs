//! The caching allocator's bookkeeping: freed GPU blocks kept by size class and handed out again
//! (as PyTorch's CUDA caching allocator does), so that a training step, which asks for the same
//! sizes every step, makes no driver allocation after its first steps.
//!
//! This file knows nothing of the driver: [`BlockCache`] maps sizes to free device pointers and
//! counts bytes; `runtime.rs` asks the driver for memory when the cache has none and returns the
//! cache's blocks to the driver when an allocation fails.

use std::collections::HashMap;

/// Smallest block and rounding unit of small requests, in bytes (PyTorch rounds to 512 too).
pub const MIN_BLOCK: usize = 512;
/// Requests up to this many bytes round up to a multiple of [`MIN_BLOCK`].
pub const SMALL: usize = 1 << 20;

/// The block size a request of `bytes` bytes is served with: a multiple of 512 up to 1 MiB, and
/// above it a multiple of an eighth of the next power of two (at most 12.5% unused), so that
/// nearby sizes share a class and a freed block fits the next request of about its size.
/// `None` when the rounded size overflows.
pub fn block_size(bytes: usize) -> Option<usize> {
    let bytes = bytes.max(1);
    let unit = if bytes <= SMALL {
        MIN_BLOCK
    } else {
        (bytes.checked_next_power_of_two()? / 8).max(MIN_BLOCK)
    };
    bytes.checked_next_multiple_of(unit)
}

/// Bytes in use and held, for the metrics (`gpu_mem_bytes` is `peak_allocated`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes of blocks handed out and not yet released.
    pub allocated: u64,
    /// The most `allocated` has been since the process started or since the last
    /// `reset_peak`.
    pub peak_allocated: u64,
    /// Bytes obtained from the driver and not returned: `allocated` plus the cached free blocks.
    pub reserved: u64,
    /// Blocks obtained from the driver (a step that reuses the cache adds none).
    pub driver_allocations: u64,
}

/// Free blocks by size, with the counters of [`MemoryStats`].
#[derive(Debug, Default)]
pub struct BlockCache {
    free: HashMap<usize, Vec<u64>>,
    stats: MemoryStats,
}

impl BlockCache {
    /// A cached block of exactly `size` bytes (a [`block_size`]), counted as allocated.
    pub fn take(&mut self, size: usize) -> Option<u64> {
        let ptr = self.free.get_mut(&size)?.pop()?;
        self.count_allocated(size);
        Some(ptr)
    }

    /// Records a block of `size` bytes just obtained from the driver, counted as allocated.
    pub fn add_new(&mut self, size: usize) {
        self.stats.reserved += size as u64;
        self.stats.driver_allocations += 1;
        self.count_allocated(size);
    }

    fn count_allocated(&mut self, size: usize) {
        self.stats.allocated += size as u64;
        self.stats.peak_allocated = self.stats.peak_allocated.max(self.stats.allocated);
    }

    /// Returns a block handed out by [`BlockCache::take`] or recorded by
    /// [`BlockCache::add_new`] to the cache.
    pub fn put(&mut self, ptr: u64, size: usize) {
        self.stats.allocated -= size as u64;
        self.free.entry(size).or_default().push(ptr);
    }

    /// Empties the cache: every free block with its size, for the caller to return to the driver.
    pub fn drain(&mut self) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        for (size, ptrs) in self.free.drain() {
            self.stats.reserved -= (size * ptrs.len()) as u64;
            out.extend(ptrs.into_iter().map(|p| (p, size)));
        }
        out
    }

    pub fn stats(&self) -> MemoryStats {
        self.stats
    }

    /// Starts the peak over from what is allocated now.
    pub fn reset_peak(&mut self) {
        self.stats.peak_allocated = self.stats.allocated;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_sizes_round_to_512_and_large_to_an_eighth_of_their_octave() {
        assert_eq!(block_size(0), Some(512));
        assert_eq!(block_size(1), Some(512));
        assert_eq!(block_size(512), Some(512));
        assert_eq!(block_size(513), Some(1024));
        assert_eq!(block_size(SMALL), Some(SMALL));
        // 1 MiB + 1 byte: the next power of two is 2 MiB, so the unit is 256 KiB.
        assert_eq!(block_size(SMALL + 1), Some(SMALL + (256 << 10)));
        // 100 MB: unit 16 MiB (next power of two 128 MiB); 6 units = 96 MiB.
        assert_eq!(block_size(100_000_000), Some(96 << 20));
        assert_eq!(block_size(usize::MAX - 3), None);
        for bytes in [1usize, 700, 5000, 1 << 20, 3 << 20, 123_456_789] {
            let b = block_size(bytes).unwrap();
            assert!(
                b >= bytes && (b - bytes) as f64 <= (bytes as f64 * 0.125).max(511.0),
                "{bytes} -> {b}"
            );
        }
    }

    #[test]
    fn freed_blocks_are_handed_out_again_and_counted() {
        let mut c = BlockCache::default();
        assert_eq!(c.take(1024), None);
        c.add_new(1024);
        c.add_new(2048);
        assert_eq!(c.stats().allocated, 3072);
        c.put(0xA000, 1024);
        c.put(0xB000, 2048);
        assert_eq!(c.stats().allocated, 0);
        assert_eq!(c.stats().peak_allocated, 3072);
        assert_eq!(c.stats().reserved, 3072);
        // Same size: reused, no driver allocation.
        assert_eq!(c.take(1024), Some(0xA000));
        assert_eq!(c.take(1024), None);
        assert_eq!(c.stats().driver_allocations, 2);
        c.reset_peak();
        assert_eq!(c.stats().peak_allocated, 1024);
        let drained = c.drain();
        assert_eq!(drained, vec![(0xB000, 2048)]);
        assert_eq!(c.stats().reserved, 1024);
    }
}
