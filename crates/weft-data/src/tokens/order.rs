//! The order of windows within an epoch: a keyed bijection of `0..n`, computed one index at a time
//! in O(1) memory, so a split of billions of windows needs no permutation table.
//!
//! A balanced Feistel network over `2^(2h)` values (`2^(2h) >= n`, so at most four times `n`)
//! permutes that power of four; indices that land at or past `n` are fed through again
//! ("cycle walking") until they land inside `0..n`, which keeps the map a bijection of `0..n`.
//! The round keys come from `weft_core::rng::words(seed, epoch * ROUNDS + round)`.

/// Feistel rounds (six rounds of a good mixer are far past what shuffling needs).
const ROUNDS: usize = 6;

/// A permutation of `0..n` keyed by `(seed, epoch)`.
#[derive(Debug, Clone)]
pub struct WindowOrder {
    n: u64,
    half_bits: u32,
    keys: [u64; ROUNDS],
}

impl WindowOrder {
    /// The permutation of `0..n` for this seed and epoch.
    pub fn new(n: u64, seed: u64, epoch: u64) -> WindowOrder {
        let bits = if n <= 1 { 0 } else { 64 - (n - 1).leading_zeros() };
        let half_bits = bits.div_ceil(2).max(1);
        let mut keys = [0u64; ROUNDS];
        for (r, k) in keys.iter_mut().enumerate() {
            let w = weft_core::rng::words(seed, epoch.wrapping_mul(ROUNDS as u64).wrapping_add(r as u64));
            *k = u64::from(w[0]) | (u64::from(w[1]) << 32);
        }
        WindowOrder { n, half_bits, keys }
    }

    /// Number of items permuted.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether there is nothing to permute.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The image of `i` (`i < n`; panics otherwise, an internal bug).
    pub fn apply(&self, i: u64) -> u64 {
        assert!(i < self.n, "window index {i} out of 0..{}", self.n);
        let mut x = i;
        loop {
            x = self.feistel(x);
            if x < self.n {
                return x;
            }
        }
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & mask);
        for &k in &self.keys {
            let f = mix(r ^ k) & mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half_bits) | r
    }
}

/// SplitMix64's finalizer: a bijective avalanche mix of 64 bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(n: u64, seed: u64, epoch: u64) -> Vec<u64> {
        let o = WindowOrder::new(n, seed, epoch);
        (0..n).map(|i| o.apply(i)).collect()
    }

    #[test]
    fn is_a_bijection_for_awkward_sizes() {
        for n in [1u64, 2, 3, 4, 5, 7, 16, 17, 255, 1000, 4097] {
            let mut p = all(n, 42, 3);
            p.sort_unstable();
            assert_eq!(p, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
    }

    #[test]
    fn depends_on_seed_and_epoch_only() {
        let a = all(1000, 1, 0);
        assert_eq!(a, all(1000, 1, 0));
        assert_ne!(a, all(1000, 2, 0));
        assert_ne!(a, all(1000, 1, 1));
        // shuffled, not near the identity: few fixed points, and no long runs of i -> i + 1
        let fixed = a.iter().enumerate().filter(|&(i, &p)| p == i as u64).count();
        assert!(fixed < 10, "{fixed} fixed points");
        let steps = a.windows(2).filter(|w| w[1] == w[0] + 1).count();
        assert!(steps < 20, "{steps} consecutive pairs");
    }

    #[test]
    fn huge_domains_cost_nothing_to_build() {
        let n = 3_000_000_000_000u64;
        let o = WindowOrder::new(n, 7, 0);
        let xs: Vec<u64> = (0..1000).map(|i| o.apply(i * 2_999_999_999)).collect();
        assert!(xs.iter().all(|&x| x < n));
        let mut d = xs.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), xs.len());
    }
}
