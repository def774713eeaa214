//! What the trainer, the pipeline and generation need of a causal language model beyond
//! [`Model`]: its sizes, its logits, cutting it for tensor and pipeline parallelism, and
//! sampling from it. `gpt` and `llama` implement it.

use weft_core::{DType, Device, Generator, Result, Tensor};
use weft_nn::parallel::TpGroup;
use weft_nn::sequence_parallel::column_input;

use crate::kv_cache::{CachedTokens, KvCache};
use crate::sampling::{invalid, Sampling};
use crate::{Model, StageCut, StagedModel};

/// A causal language model: I64 ids `[B, T]` in, logits `[B, T, vocab_size]` out, mean
/// cross-entropy against the next ids as its [`Model::loss`].
pub trait LanguageModel: Model + StagedModel {
    /// Tokens the model knows (the logits' last dimension when whole).
    fn vocab_size(&self) -> usize;

    /// The longest sequence it takes (`T <= block_size`).
    fn block_size(&self) -> usize;

    /// The device its parameters live on.
    fn device(&self) -> Device;

    /// # Shapes
    /// I64 ids `[B, T]` -> logits `[B, T, vocab_size]` (tensor-parallel: this rank's columns of
    /// the padded vocabulary).
    fn forward_ids(&self, idx: &Tensor) -> Result<Tensor>;

    /// An empty key/value cache for one sequence of this model ([`LanguageModel::forward_cached`]).
    fn new_cache(&self) -> KvCache;

    /// Runs the new tokens of several sequences against their caches (appending to them) and
    /// returns the logits of each sequence's last new token, `[sequences, vocab_size]`: the
    /// same, within rounding, as the last position of [`LanguageModel::forward_ids`] over each
    /// whole sequence. Errors when a sequence's cached and new tokens pass `block_size`, when
    /// an id is outside the vocabulary, or on a tensor-parallel part of a model.
    fn forward_cached(&self, seqs: &mut [CachedTokens]) -> Result<Tensor>;

    /// Cuts the model in place across a tensor-parallel group (Megatron's layout); parameter
    /// names do not change and [`Model::splits`] says how each was cut.
    fn make_tensor_parallel(&mut self, group: &TpGroup) -> Result<()>;

    /// Sets how the blocks are shared out among pipeline stages.
    fn set_stage_cut(&mut self, cut: StageCut);

    /// Appends `max_new_tokens` tokens to the ids `idx` (I64 `[1, T]`, `T >= 1`), each chosen by
    /// `sampling` from the logits of the last position, conditioning on at most the last
    /// `block_size` tokens (longer sequences are cropped from the left, as nanoGPT does).
    /// `vocab_limit`: only ids below it are chosen (a tokenizer that knows fewer tokens than the
    /// model's vocabulary). Draws one number of `rng` per token when sampling, none when greedy.
    /// Runs without recording gradients, with a key/value cache (one row through the model per
    /// new token); returns I64 `[1, T + max_new_tokens]`.
    ///
    /// Errors before the first step when the sequence does not fit in memory, and at the step
    /// whose logits are not finite (weights holding NaN or infinity).
    fn generate(
        &self,
        idx: &Tensor,
        max_new_tokens: usize,
        sampling: &Sampling,
        vocab_limit: Option<usize>,
        rng: &mut Generator,
    ) -> Result<Tensor> {
        self.generate_until(idx, max_new_tokens, sampling, vocab_limit, &[], rng)
    }

    /// [`LanguageModel::generate`], ending early at the first new token among `stop` (an
    /// end-of-sequence id), which is left out: returns I64 `[1, T + n]`, `n <= max_new_tokens`.
    fn generate_until(
        &self,
        idx: &Tensor,
        max_new_tokens: usize,
        sampling: &Sampling,
        vocab_limit: Option<usize>,
        stop: &[i64],
        rng: &mut Generator,
    ) -> Result<Tensor> {
        if !self.splits().is_empty() {
            return Err(invalid(
                "generation needs the whole model, not a tensor-parallel part of it",
            ));
        }
        sampling.validate()?;
        if idx.dtype() != DType::I64 || idx.rank() != 2 || idx.shape()[0] != 1 || idx.shape()[1] == 0 {
            return Err(invalid(format!(
                "the ids to continue must be I64 [1, T] with T >= 1, got {:?} {:?}",
                idx.dtype(),
                idx.shape()
            )));
        }
        let mut tokens = idx.to_vec::<i64>()?;
        tokens.try_reserve_exact(max_new_tokens).map_err(|_| {
            invalid(format!(
                "{max_new_tokens} new tokens do not fit in memory ({} bytes of ids)",
                (max_new_tokens as u128) * 8
            ))
        })?;
        let vocab = vocab_limit.unwrap_or(self.vocab_size()).min(self.vocab_size());
        let block = self.block_size();
        weft_core::no_grad(|| {
            let mut cache = self.new_cache();
            for step in 0..max_new_tokens {
                // the whole (cropped) context at first and whenever it no longer fits: positions
                // move then, as they do for nanoGPT's crop; otherwise only the newest token
                let new: Vec<i64> = if cache.is_empty() || cache.room() == 0 {
                    cache.clear();
                    tokens[tokens.len().saturating_sub(block)..].to_vec()
                } else {
                    vec![tokens[tokens.len() - 1]]
                };
                let logits = self.forward_cached(&mut [CachedTokens {
                    tokens: &new,
                    cache: &mut cache,
                }])?;
                let last = logits.reshape(&[-1])?.to_vec_f64();
                let u = if sampling.temperature > 0.0 {
                    let (seed, counter) = rng.take(1);
                    weft_core::rng::uniform(seed, counter)
                } else {
                    0.0
                };
                let next = sampling.choose(&last[..vocab.min(last.len())], u).map_err(|e| {
                    invalid(format!(
                        "new token {step}: {e} (do the model's weights hold NaN or infinity?)"
                    ))
                })?;
                if stop.contains(&(next as i64)) {
                    break;
                }
                tokens.push(next as i64);
            }
            let n = tokens.len();
            Tensor::from_vec(tokens, &[1, n])
        })
    }
}

/// Checks the token ids a language model `op` (`"gpt"`, `"llama"`) is given: I64 `[B, T]` with
/// `1 <= T <= block_size` and every id in `0..vocab_size` (ids come from data: the error names
/// the first bad one and its flat position). `what` names the ids in the message.
pub(crate) fn check_ids(
    op: &'static str,
    idx: &Tensor,
    block_size: usize,
    vocab_size: usize,
    what: &str,
) -> Result<()> {
    if idx.dtype() != DType::I64 || idx.rank() != 2 || idx.shape()[1] > block_size || idx.shape()[1] == 0 {
        return Err(weft_core::Error::Invalid {
            op,
            msg: format!(
                "{what} must be I64 [B, T] with 1 <= T <= block_size = {block_size}, got {:?} {:?}",
                idx.dtype(),
                idx.shape()
            ),
        });
    }
    let ids = idx.to_vec::<i64>()?;
    if let Some((pos, &bad)) = ids.iter().enumerate().find(|(_, &t)| t < 0 || t as usize >= vocab_size) {
        return Err(weft_core::Error::Invalid {
            op,
            msg: format!(
                "{what}: token id {bad} at flat position {pos} is outside the vocabulary (vocab_size = {vocab_size})"
            ),
        });
    }
    Ok(())
}

/// Mean cross-entropy of `logits` `[B, T, V]` against the next ids `targets` `[B, T]`, ignoring
/// target -1. With `shard` (a tensor-parallel output layer cut as the token embedding is) the
/// logits are this rank's columns of the padded vocabulary and the loss is the vocab-parallel one.
/// `op` (`"gpt loss"`) names a shape mismatch.
pub(crate) fn next_token_loss(
    op: &'static str,
    logits: &Tensor,
    targets: &Tensor,
    shard: Option<&weft_nn::parallel::VocabShard>,
    vocab_size: usize,
) -> Result<Tensor> {
    if logits.rank() != 3 || targets.shape() != &logits.shape()[..2] {
        return Err(weft_core::Error::ShapeMismatch {
            op,
            lhs: logits.shape().to_vec(),
            rhs: targets.shape().to_vec(),
        });
    }
    if let Some(s) = shard {
        let rows = s.rows as isize;
        return s.cross_entropy(&logits.reshape(&[-1, rows])?, &targets.reshape(&[-1])?, -1);
    }
    logits
        .reshape(&[-1, vocab_size as isize])?
        .cross_entropy(&targets.reshape(&[-1])?, -1, 0.0)
}

/// What [`Model::loss`] of a language model checks first: `targets` has the shape of `inputs`
/// (`op` names a mismatch).
pub(crate) fn same_shape_targets(op: &'static str, inputs: &Tensor, targets: &Tensor) -> Result<()> {
    if targets.shape() != inputs.shape() {
        return Err(weft_core::Error::ShapeMismatch {
            op,
            lhs: inputs.shape().to_vec(),
            rhs: targets.shape().to_vec(),
        });
    }
    Ok(())
}

/// Logits `[B, T, V]` of normed activations `x` `[B, T, C]` through an output layer tied to the
/// token embedding `wte` (`x wte^T`). A tensor-parallel embedding cut over the vocabulary makes
/// the layer column-parallel: this rank's vocabulary columns (of all tokens, gathered from
/// the group's when it runs sequence-parallel).
pub(crate) fn tied_logits(x: &Tensor, wte: &weft_nn::layers::Embedding) -> Result<Tensor> {
    match &wte.shard {
        None => x.matmul(&wte.weight.t()?),
        Some(s) => column_input(x, &s.group)?.matmul(&wte.weight.t()?),
    }
}

/// Checks that a sequence-parallel group of `tp` ranks can cut `block_size` positions.
pub(crate) fn check_sequence_parallel(block_size: usize, tp: usize) -> Result<()> {
    if !block_size.is_multiple_of(tp) {
        return Err(crate::config_error(
            "block_size",
            format!(
                "{block_size} does not divide by parallel.tp = {tp} (parallel.sequence_parallel cuts each micro-batch's \
                 tokens into tp parts)"
            ),
        ));
    }
    Ok(())
}

/// Positions of a `t`-long sequence a rank holds between blocks: `t / tp` across a
/// sequence-parallel group, all of them otherwise.
pub(crate) fn held_positions(t: usize, sequence: Option<&TpGroup>) -> usize {
    match sequence {
        Some(g) => t / g.size(),
        None => t,
    }
}
