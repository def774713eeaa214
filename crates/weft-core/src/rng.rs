//! Counter-based random numbers (Philox4x32-10, Salmon et al., "Parallel Random Numbers: As Easy
//! as 1, 2, 3", SC 2011). Element `i` of a draw depends only on `(seed, offset + i)`, so a seed gives
//! the same numbers whatever the thread count or chunking.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// The Philox4x32 block function with 10 rounds.
#[inline]
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let p0 = (M0 as u64) * (c[0] as u64);
        let p1 = (M1 as u64) * (c[2] as u64);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
    }
    c
}

/// Four random words for counter `index` under `seed`.
#[inline]
pub fn words(seed: u64, index: u64) -> [u32; 4] {
    philox4x32(
        [index as u32, (index >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// A uniform double in `[0, 1)` from element `index` (53 random bits).
#[inline]
pub fn uniform(seed: u64, index: u64) -> f64 {
    let w = words(seed, index);
    let bits = ((w[0] as u64) << 21) ^ (w[1] as u64);
    (bits & ((1u64 << 53) - 1)) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A standard normal from element `index` (Box-Muller on two words of the block).
#[inline]
pub fn normal(seed: u64, index: u64) -> f64 {
    let w = words(seed, index);
    // u1 in (0, 1] so the log is finite
    let u1 = ((w[2] as f64) + 1.0) / 4_294_967_296.0;
    let u2 = (w[3] as f64) / 4_294_967_296.0;
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// A seed plus a running offset: each draw of `n` numbers takes the next `n` counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generator {
    seed: u64,
    offset: u64,
}

impl Generator {
    pub fn new(seed: u64) -> Self {
        Generator { seed, offset: 0 }
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Counters consumed so far (saved in checkpoints to resume the stream).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn set_offset(&mut self, offset: u64) {
        self.offset = offset;
    }

    /// Reserves `n` counters; returns `(seed, first_counter)`.
    pub fn take(&mut self, n: usize) -> (u64, u64) {
        let start = self.offset;
        self.offset += n as u64;
        (self.seed, start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_known_answer() {
        // Known-answer vectors from the Random123 distribution (kat_vectors, philox4x32_10).
        assert_eq!(
            philox4x32([0, 0, 0, 0], [0, 0]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32([0xffff_ffff; 4], [0xffff_ffff; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
    }

    #[test]
    fn uniform_in_range_and_mean() {
        let n = 20000;
        let xs: Vec<f64> = (0..n).map(|i| uniform(7, i)).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = xs.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn normal_moments() {
        let n = 20000;
        let xs: Vec<f64> = (0..n).map(|i| normal(3, i)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "var {var}");
    }
}
