//! What the trainer, the pipeline and generation need of a causal language model beyond
//! [`Model`]: its sizes, its logits, cutting it for tensor and pipeline parallelism, and
//! sampling from it. `gpt` and `llama` implement it.

use weft_core::{DType, Device, Generator, Result, Tensor};
use weft_nn::parallel::TpGroup;

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
    /// Runs without recording gradients; returns I64 `[1, T + max_new_tokens]`.
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
        weft_core::no_grad(|| {
            for step in 0..max_new_tokens {
                let start = tokens.len().saturating_sub(self.block_size());
                let ctx = Tensor::from_vec(tokens[start..].to_vec(), &[1, tokens.len() - start])?.to(self.device())?;
                let logits = self.forward_ids(&ctx)?;
                let last = logits.narrow(1, ctx.shape()[1] - 1, 1)?.reshape(&[-1])?.to_vec_f64();
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
                tokens.push(next as i64);
            }
            let n = tokens.len();
            Tensor::from_vec(tokens, &[1, n])
        })
    }
}
