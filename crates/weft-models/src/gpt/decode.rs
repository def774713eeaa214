//! The GPT's cached forward for generation ([`crate::kv_cache`]).

use weft_core::Result;
use weft_core::Tensor;

use super::Gpt;
use crate::kv_cache::{self, CachedTokens};

impl Gpt {
    /// Runs the new tokens of several sequences through the model against their caches,
    /// appending their keys and values; the logits of each sequence's last new token,
    /// `[sequences, vocab_size]`. As in eval mode (no dropout), without tensor parallelism.
    pub fn forward_cached(&self, seqs: &mut [CachedTokens]) -> Result<Tensor> {
        if !self.splits.is_empty() {
            return Err(crate::sampling::invalid(
                "a cached forward needs the whole model, not a tensor-parallel part of it",
            ));
        }
        let (ids, pos) = kv_cache::stacked_ids("gpt", seqs, self.config.vocab_size, self.h.len())?;
        let device = self.wte.weight.device();
        let mut x = self
            .wte
            .forward(&ids.to(device)?)?
            .add(&self.wpe.forward(&pos.to(device)?)?)?;
        for (layer, block) in self.h.iter().enumerate() {
            let heads = block.attn.n_head;
            // [1, N, 3C] as [N, 3, heads, hd]: q, k and v of every new token
            let qkv = block.attn.c_attn.forward(&block.ln_1.forward(&x)?)?;
            let (n, hd) = (qkv.dim(1)?, qkv.dim(2)? / (3 * heads));
            let qkv = qkv.reshape(&[n as isize, 3, heads as isize, hd as isize])?;
            let y = kv_cache::per_sequence(seqs, |seq, start, t| {
                let part = qkv.narrow(0, start, t)?;
                // [heads, t, hd] of q (0), k (1) or v (2)
                let third = |i: usize| -> Result<Tensor> {
                    part.narrow(1, i, 1)?
                        .reshape(&[t as isize, heads as isize, hd as isize])?
                        .transpose(0, 1)
                };
                kv_cache::attend(&third(0)?, &third(1)?, &third(2)?, seq.cache, layer)
            })?;
            x = block.attn.c_proj.forward_add(&y, &x)?;
            x = block.mlp.forward_residual(&block.ln_2.forward(&x)?, &x)?;
        }
        // the caches move on only once nothing can fail any more
        let last = kv_cache::last_rows(&x, seqs)?;
        let logits = crate::lm::tied_logits(&self.ln_f.forward(&last)?, &self.wte)?;
        kv_cache::advance_all(seqs);
        Ok(logits)
    }
}
