//! weft's datasets.
//!
//! - [`Tokenizer`]: char, GPT-2 BPE or a Hugging Face `tokenizer.json`, with a JSON form for
//!   checkpoints ([`CharTokenizer`]: the character-level vocabulary, as nanoGPT's `shakespeare_char`).
//! - [`TokenDataset`]: token shards plus `index.json` (written by [`tokens::prepare()`]), read as
//!   windows in a keyed order through an [`ObjectSource`].
//! - [`TextDataset`]: a token stream split into train/val, sampled as random windows.
//! - [`CsvDataset`]: numeric features plus an integer class label, from `.csv` or `.csv.gz`.
//! - [`BatchesDataset`]: pre-made batches from a safetensors file, cycled.
//! - [`Prefetcher`]: produces batches a few steps ahead on a background thread.
//! - [`files`]: reading the files a config names, regular files only (never `/dev/zero`).
//!
//! The rule every dataset follows: **a batch is a pure function of its arguments** (`seed`, `split`,
//! `step`), with all randomness drawn from `weft_core::rng::uniform(seed, counter)`. There is no
//! iterator state to save, so a run resumed at step `k` sees exactly the batches the uninterrupted run
//! saw from step `k` on, and any number of workers can build batches in any order.
//!
//! ```
//! use weft_data::{Split, TextDataset};
//!
//! let data = TextDataset::from_text("to be or not to be, that is the question", 0.1)?;
//! let (x, y) = data.batch(Split::Train, 4, 8, 1337, 10)?; // I64 [4, 8] each
//! assert_eq!(x.shape(), &[4, 8]);
//! // the same (seed, step) gives the same batch, in this process or any other
//! let (x2, _) = data.batch(Split::Train, 4, 8, 1337, 10)?;
//! assert_eq!(x.to_vec::<i64>()?, x2.to_vec::<i64>()?);
//! # let _ = y;
//! # Ok::<(), weft_data::Error>(())
//! ```

#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod batches;
mod contain;
pub mod csv;
pub mod error;
pub mod files;
pub mod objects;
pub mod prefetch;
pub mod store;
pub mod text;
pub mod tokenizer;
pub mod tokens;

pub use batches::BatchesDataset;
pub use csv::{CsvDataset, LabelColumn};
pub use error::{Error, Result};
pub use objects::{LocalFolder, ObjectSink, ObjectSource};
pub use prefetch::Prefetcher;
pub use text::TextDataset;
pub use tokenizer::{CharTokenizer, Gpt2Tokenizer, HfTokenizer, Tokenizer, TokenizerSpec};
pub use tokens::{PrepareOptions, TokenDataset};

/// Which part of a dataset to draw from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// The training part.
    Train,
    /// The held-out validation part.
    Val,
}

impl Split {
    /// `"train"` or `"val"`.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
        }
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Checks that `val_fraction` is a finite number in `[0, 1)`.
pub(crate) fn check_val_fraction(val_fraction: f64) -> Result<()> {
    if !(0.0..1.0).contains(&val_fraction) {
        return Err(error::invalid(format!(
            "val_fraction must be in [0, 1), got {val_fraction}"
        )));
    }
    Ok(())
}

/// Number of items that go to the train split: `floor(n * (1 - val_fraction))` (nanoGPT's
/// `int(n * 0.9)` for `val_fraction = 0.1`); the rest go to val.
pub(crate) fn train_len(n: usize, val_fraction: f64) -> usize {
    (((n as f64) * (1.0 - val_fraction)).floor() as usize).min(n)
}

/// `floor(u * n)` for `u` in `[0, 1)`, clamped to `n - 1` against rounding (`n >= 1`).
pub(crate) fn scaled_index(u: f64, n: usize) -> usize {
    ((u * n as f64) as usize).min(n - 1)
}

/// Fisher-Yates shuffle of `0..n` driven by `uniform(seed, base + i)` for `i` in `1..n`.
pub(crate) fn permutation(n: usize, seed: u64, base: u64) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = scaled_index(weft_core::rng::uniform(seed, base + i as u64), i + 1);
        p.swap(i, j);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_permutation_and_depends_on_seed() {
        let p = permutation(100, 7, 0);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
        assert_eq!(p, permutation(100, 7, 0));
        assert_ne!(p, permutation(100, 8, 0));
        assert_ne!(p, permutation(100, 7, 1 << 40));
        assert!(permutation(0, 1, 0).is_empty());
        assert_eq!(permutation(1, 1, 0), vec![0]);
    }

    #[test]
    fn train_len_matches_nanogpt() {
        assert_eq!(train_len(1000, 0.1), 900);
        assert_eq!(train_len(1797, 0.1), 1617);
        assert_eq!(train_len(10, 0.0), 10);
        assert!(check_val_fraction(1.0).is_err());
        assert!(check_val_fraction(-0.1).is_err());
        assert!(check_val_fraction(f64::NAN).is_err());
        assert!(check_val_fraction(0.0).is_ok());
    }
}
