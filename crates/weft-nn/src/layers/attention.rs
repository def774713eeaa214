use weft_core::{Generator, Result, Tensor};

use super::{Dropout, Linear};
use crate::context::Context;
use crate::module::{prefixed, Module};
use crate::parallel::{Split, TpGroup};

/// Multi-head causal self-attention with a fused q,k,v projection (nanoGPT's
/// `CausalSelfAttention`): `c_attn` `[3C, C]` (q, k, v stacked in that order), `c_proj` `[C, C]`.
#[derive(Clone, Debug)]
pub struct CausalSelfAttention {
    pub c_attn: Linear,
    pub c_proj: Linear,
    /// Heads this layer computes (all of them, or this rank's when tensor-parallel).
    pub n_head: usize,
    attn_dropout: Dropout,
    resid_dropout: Dropout,
}

impl CausalSelfAttention {
    /// `n_embd` must divide by `n_head` (checked by the model config).
    pub fn new(
        n_embd: usize,
        n_head: usize,
        bias: bool,
        dropout: f64,
        ctx: &Context,
        rng: &mut Generator,
    ) -> Result<Self> {
        Ok(CausalSelfAttention {
            c_attn: Linear::new(n_embd, 3 * n_embd, bias, rng)?,
            c_proj: Linear::new(n_embd, n_embd, bias, rng)?,
            n_head,
            attn_dropout: Dropout::new(dropout, ctx),
            resid_dropout: Dropout::new(dropout, ctx),
        })
    }

    /// # Shapes
    /// `[B, T, C] -> [B, T, C]`; attention scaled by `1/sqrt(head_dim)`, key `j <= i` for query
    /// `i`. Tensor-parallel, each rank computes its `n_head` heads.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.resid_dropout.forward(&self.c_proj.forward(&self.heads(x)?)?)
    }

    /// `residual + forward(x)`: a transformer block's residual connection, added inside
    /// `c_proj` when no dropout sits between ([`Linear::forward_add`]).
    /// # Shapes
    /// `[B, T, C] -> [B, T, C]`, `residual` `[B, T, C]`.
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        let y = self.heads(x)?;
        if self.resid_dropout.active() {
            return residual.add(&self.resid_dropout.forward(&self.c_proj.forward(&y)?)?);
        }
        self.c_proj.forward_add(&y, residual)
    }

    /// The heads' outputs side by side, `[B, T, C]` (before the output projection).
    fn heads(&self, x: &Tensor) -> Result<Tensor> {
        let qkv = self.c_attn.forward(x)?;
        // the product's tokens: all of them where `x` holds this rank's part (sequence-parallel)
        let (batch, t) = (qkv.dim(0)?, qkv.dim(1)?);
        let y = if self.attn_dropout.active() {
            // the width of this rank's q (all of q without tensor parallelism)
            let c = qkv.dim(2)? / 3;
            let hd = c / self.n_head;
            // [B, T, 3, H, hd] view of the fused projection; each third is a strided view
            let qkv = qkv.reshape(&[batch as isize, t as isize, 3, self.n_head as isize, hd as isize])?;
            let heads = |i: usize| -> Result<Tensor> {
                qkv.narrow(2, i, 1)?
                    .reshape(&[batch as isize, t as isize, self.n_head as isize, hd as isize])?
                    .transpose(1, 2)
            };
            let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
            // dropout on the attention probabilities needs them materialized
            let scores = q.matmul(&k.t()?)?.mul_scalar(1.0 / (hd as f64).sqrt())?;
            let mask = causal_mask(t)?.to(x.device())?;
            let probs = scores.masked_fill(&mask, f64::NEG_INFINITY)?.softmax(-1)?;
            let y = self.attn_dropout.forward(&probs)?.matmul(&v)?;
            y.transpose(1, 2)?.reshape(&[batch as isize, t as isize, c as isize])?
        } else {
            // one fused op: no split of q, k, v, and one gradient for the projection
            qkv.qkv_attention(self.n_head, true, None)?
        };
        Ok(y)
    }
}

impl CausalSelfAttention {
    /// Cuts the layer across a tensor-parallel group by heads: `c_attn` column-parallel (each
    /// rank takes its heads' rows of q, k and v), `c_proj` row-parallel. `n_head` must divide
    /// by the group size. Returns the parameters' splits by name.
    pub fn make_tensor_parallel(&mut self, group: &TpGroup) -> Result<Vec<(String, Split)>> {
        if !self.n_head.is_multiple_of(group.size()) {
            return Err(weft_core::Error::Invalid {
                op: "tensor parallel",
                msg: format!("n_head = {} does not divide by tp = {}", self.n_head, group.size()),
            });
        }
        let mut splits = prefixed("c_attn", self.c_attn.make_column_parallel(group, 3)?);
        splits.extend(prefixed("c_proj", self.c_proj.make_row_parallel(group)?));
        self.n_head /= group.size();
        Ok(splits)
    }
}

impl Module for CausalSelfAttention {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("c_attn", self.c_attn.parameters());
        p.extend(prefixed("c_proj", self.c_proj.parameters()));
        p
    }
}

/// A Bool `[T, T]` mask, true above the diagonal (the keys causal attention hides).
fn causal_mask(t: usize) -> Result<Tensor> {
    let i = Tensor::arange(0.0, t as f64, 1.0, weft_core::DType::F64)?;
    i.view(&[1, t])?.gt(&i.view(&[t, 1])?)
}
