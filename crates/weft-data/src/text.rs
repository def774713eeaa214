//! A tokenized text (characters by default, or any [`Tokenizer`]) split into train and val, sampled as random windows (nanoGPT's
//! `get_batch`), with each batch a pure function of `(seed, step)`.

use std::path::Path;

use weft_core::Tensor;

use crate::error::{invalid, Result};
use crate::tokenizer::{CharTokenizer, Tokenizer};
use crate::{check_val_fraction, scaled_index, train_len, Split};

/// A token stream and its train/val split: train is the first `floor(n * (1 - val_fraction))` tokens,
/// val the rest (as nanoGPT's `prepare.py`).
#[derive(Debug, Clone)]
pub struct TextDataset {
    tokenizer: Tokenizer,
    tokens: Vec<i64>,
    n_train: usize,
}

impl TextDataset {
    /// Reads a UTF-8 text file and builds its vocabulary and split (see [`TextDataset::from_text`]).
    /// Errors name the path; a path that is not a regular file (a directory, `/dev/zero`) is
    /// refused before reading ([`crate::files::read_to_string`]).
    pub fn from_file(path: impl AsRef<Path>, val_fraction: f64) -> Result<TextDataset> {
        let text = crate::files::read_to_string(path.as_ref())?;
        Self::from_text(&text, val_fraction)
    }

    /// Tokenizes `text` with its own character vocabulary ([`CharTokenizer::from_text`]) and splits
    /// it. `val_fraction` must be in `[0, 1)`.
    pub fn from_text(text: &str, val_fraction: f64) -> Result<TextDataset> {
        Self::with_tokenizer(text, CharTokenizer::from_text(text), val_fraction)
    }

    /// Tokenizes `text` with a given tokenizer (a character vocabulary such as the one stored in a
    /// checkpoint, GPT-2's BPE, a `tokenizer.json`) and splits it. Errors if `text` has a character
    /// outside a character vocabulary or `val_fraction` is not in `[0, 1)`.
    pub fn with_tokenizer(text: &str, tokenizer: impl Into<Tokenizer>, val_fraction: f64) -> Result<TextDataset> {
        check_val_fraction(val_fraction)?;
        let tokenizer = tokenizer.into();
        let tokens: Vec<i64> = tokenizer.encode(text)?.into_iter().map(i64::from).collect();
        let n_train = train_len(tokens.len(), val_fraction);
        Ok(TextDataset {
            tokenizer,
            tokens,
            n_train,
        })
    }

    /// The tokenizer the text was encoded with.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Number of distinct tokens (the model's vocabulary size).
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.vocab_size()
    }

    /// The token ids of one split.
    pub fn tokens(&self, split: Split) -> &[i64] {
        match split {
            Split::Train => &self.tokens[..self.n_train],
            Split::Val => &self.tokens[self.n_train..],
        }
    }

    /// Number of tokens in one split.
    pub fn num_tokens(&self, split: Split) -> usize {
        self.tokens(split).len()
    }

    /// The start offset of each row of the batch at `step`: row `b` starts at
    /// `floor(uniform(seed, step * batch_size + b) * (len - block_size))`, where `len` is the split's
    /// token count, so every window and its next token lie inside the split.
    ///
    /// Errors (naming the split and the sizes) if the split has fewer than `block_size + 1` tokens,
    /// or if `batch_size` or `block_size` is 0.
    pub fn offsets(
        &self,
        split: Split,
        batch_size: usize,
        block_size: usize,
        seed: u64,
        step: usize,
    ) -> Result<Vec<usize>> {
        if batch_size == 0 || block_size == 0 {
            return Err(invalid(format!(
                "text batch: batch_size ({batch_size}) and block_size ({block_size}) must be positive"
            )));
        }
        let len = self.num_tokens(split);
        if len < block_size + 1 {
            return Err(invalid(format!(
                "text batch: the {split} split has {len} tokens, fewer than block_size + 1 = {}",
                block_size + 1
            )));
        }
        let first = (step as u64)
            .checked_mul(batch_size as u64)
            .filter(|f| f.checked_add(batch_size as u64).is_some())
            .ok_or_else(|| {
                invalid(format!(
                    "text batch: step {step} * batch_size {batch_size} overflows u64"
                ))
            })?;
        let range = len - block_size;
        let offsets = (0..batch_size as u64).map(|b| scaled_index(weft_core::rng::uniform(seed, first + b), range));
        Ok(weft_core::alloc::collect("text batch", batch_size, offsets)?)
    }

    /// The batch at `step` of `split`: `(x, y)`, both I64 of shape `[batch_size, block_size]`, where
    /// row `b` of `x` is the `block_size` tokens at [`TextDataset::offsets`]`[b]` and `y` is `x`
    /// shifted left by one token (the next-token targets).
    ///
    /// A pure function of its arguments: the same `(seed, step)` always gives the same batch.
    /// Errors as [`TextDataset::offsets`].
    pub fn batch(
        &self,
        split: Split,
        batch_size: usize,
        block_size: usize,
        seed: u64,
        step: usize,
    ) -> Result<(Tensor, Tensor)> {
        let n = batch_size.checked_mul(block_size).ok_or_else(|| {
            invalid(format!(
                "text batch: batch_size {batch_size} * block_size {block_size} tokens overflow"
            ))
        })?;
        // both buffers are reserved before the offsets are drawn: a batch too large to hold fails
        // before any work
        let mut x = weft_core::alloc::with_capacity("text batch", n)?;
        let mut y = weft_core::alloc::with_capacity("text batch", n)?;
        let offsets = self.offsets(split, batch_size, block_size, seed, step)?;
        let data = self.tokens(split);
        for &o in &offsets {
            x.extend_from_slice(&data[o..o + block_size]);
            y.extend_from_slice(&data[o + 1..o + block_size + 1]);
        }
        let shape = [batch_size, block_size];
        Ok((Tensor::from_vec(x, &shape)?, Tensor::from_vec(y, &shape)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_sizes_follow_val_fraction() {
        let text: String = "abcdefghij".repeat(10);
        let d = TextDataset::from_text(&text, 0.1).unwrap();
        assert_eq!(d.num_tokens(Split::Train), 90);
        assert_eq!(d.num_tokens(Split::Val), 10);
        let val: Vec<i64> = d
            .tokenizer()
            .encode(&text[90..])
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect();
        assert_eq!(d.tokens(Split::Val), &val[..]);
        assert!(TextDataset::from_text(&text, 1.0).is_err());
    }

    #[test]
    fn a_batch_larger_than_memory_is_an_error_naming_the_bytes() {
        let d = TextDataset::from_text("abcdefghij", 0.0).unwrap();
        // 2^40 tokens of i64: 8.8 TB, more than any machine this runs on; refused up front
        if weft_core::alloc::machine_memory().is_some_and(|m| m < 1 << 43) {
            let e = d.batch(Split::Train, 1 << 38, 4, 1, 0).unwrap_err().to_string();
            assert!(
                e.starts_with("text batch: cannot allocate 8.8 TB (8796093022208 bytes)"),
                "{e}"
            );
        }
        let e = d.batch(Split::Train, usize::MAX, 4, 1, 0).unwrap_err().to_string();
        assert!(e.contains("overflow"), "{e}");
    }

    #[test]
    fn smallest_split_that_works() {
        // exactly block_size + 1 tokens: the only window starts at 0
        let d = TextDataset::from_text("abcde", 0.0).unwrap();
        let (x, y) = d.batch(Split::Train, 3, 4, 1, 5).unwrap();
        assert_eq!(x.to_vec::<i64>().unwrap(), [0, 1, 2, 3].repeat(3));
        assert_eq!(y.to_vec::<i64>().unwrap(), [1, 2, 3, 4].repeat(3));
        let e = d.batch(Split::Train, 3, 5, 1, 5).unwrap_err().to_string();
        assert!(e.contains("train") && e.contains("5 tokens") && e.contains("6"), "{e}");
    }
}
