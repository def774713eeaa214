//! Llama's cached forward for generation ([`crate::kv_cache`]).

use weft_core::{Result, Tensor};

use super::Llama;
use crate::kv_cache::{self, CachedTokens};

impl Llama {
    /// Runs the new tokens of several sequences through the model against their caches,
    /// appending their (rotated) keys and values; the logits of each sequence's last new token,
    /// `[sequences, vocab_size]`. Without tensor parallelism.
    pub fn forward_cached(&self, seqs: &mut [CachedTokens]) -> Result<Tensor> {
        if !self.splits.is_empty() {
            return Err(crate::sampling::invalid(
                "a cached forward needs the whole model, not a tensor-parallel part of it",
            ));
        }
        let (ids, _) = kv_cache::stacked_ids("llama", seqs, self.config.vocab_size, self.layers.len())?;
        let mut x = self.embed_tokens.forward(&ids.to(self.embed_tokens.weight.device())?)?;
        for (layer, l) in self.layers.iter().enumerate() {
            let a = &l.self_attn;
            let (heads, kv_heads, hd) = (a.n_head, a.n_kv_head, a.head_dim);
            let xn = l.input_layernorm.forward(&x)?;
            // [1, N, heads * hd] and [1, N, kv_heads * hd]
            let (q, k, v) = (a.q_proj.forward(&xn)?, a.k_proj.forward(&xn)?, a.v_proj.forward(&xn)?);
            let y = kv_cache::per_sequence(seqs, |seq, start, t| {
                let offset = seq.cache.len();
                // this sequence's rows as [heads, t, hd]; q and k through their head norms (when
                // the layer has them) and rotated by their positions
                let rows = |z: &Tensor, h: usize, head: Option<bool>| -> Result<Tensor> {
                    let z = z
                        .narrow(1, start, t)?
                        .reshape(&[1, t as isize, h as isize, hd as isize])?;
                    let z = match head {
                        Some(key) => self.rope.apply_at(&a.norm_heads(z, key)?, offset)?,
                        None => z,
                    };
                    z.reshape(&[t as isize, h as isize, hd as isize])?.transpose(0, 1)
                };
                kv_cache::attend(
                    &rows(&q, heads, Some(false))?,
                    &rows(&k, kv_heads, Some(true))?,
                    &rows(&v, kv_heads, None)?,
                    seq.cache,
                    layer,
                )
            })?;
            x = a.o_proj.forward_add(&y, &x)?;
            x = l.mlp.forward_residual(&l.post_attention_layernorm.forward(&x)?, &x)?;
        }
        // the caches move on only once nothing can fail any more
        let last = kv_cache::last_rows(&x, seqs)?;
        let logits = self.logits(&last)?;
        kv_cache::advance_all(seqs);
        Ok(logits)
    }
}
