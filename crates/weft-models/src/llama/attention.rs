//! Grouped-query causal self-attention (transformers' `LlamaAttention`): separate q, k, v and o
//! projections without biases (or with biases on q, k and v, as Qwen2's), optionally an RMSNorm
//! over each query and key head (Qwen3's), rotary embeddings on q and k, `n_kv_head` key/value
//! heads each shared by `n_head / n_kv_head` query heads.

use weft_core::{Generator, Result, Tensor};
use weft_nn::init;
use weft_nn::layers::{Linear, RmsNorm};
use weft_nn::module::{prefixed, Module};
use weft_nn::parallel::{Split, TpGroup};

use super::rope::Rotary;
use crate::config_error;

/// `q_proj` `[n_head * hd, C]`, `k_proj` and `v_proj` `[n_kv_head * hd, C]`, `o_proj`
/// `[C, n_head * hd]`; with `qkv_bias`, biases `[n_head * hd]` and `[n_kv_head * hd]` on q, k
/// and v; with `qk_norm`, `q_norm` and `k_norm` weights `[hd]`.
#[derive(Clone, Debug)]
pub struct LlamaAttention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    /// RMSNorm of each query head before the rotary embedding (Qwen3's `q_norm`).
    pub q_norm: Option<RmsNorm>,
    /// RMSNorm of each key head before the rotary embedding (Qwen3's `k_norm`).
    pub k_norm: Option<RmsNorm>,
    /// Query heads this layer computes (all, or this rank's when tensor-parallel).
    pub n_head: usize,
    /// Key/value heads this layer computes (all, or this rank's).
    pub n_kv_head: usize,
    pub head_dim: usize,
}

/// A bias-free Linear `in -> out` with weights `N(0, std)`.
pub(super) fn linear(in_features: usize, out_features: usize, std: f64, rng: &mut Generator) -> Result<Linear> {
    Ok(Linear {
        weight: init::normal(&[out_features, in_features], std, weft_core::DType::F32, rng)?,
        bias: None,
        parallel: Default::default(),
    })
}

/// [`linear`] with a bias of zeros.
fn biased(in_features: usize, out_features: usize, std: f64, rng: &mut Generator) -> Result<Linear> {
    Ok(Linear {
        bias: Some(init::constant(&[out_features], 0.0, weft_core::DType::F32)?),
        ..linear(in_features, out_features, std, rng)?
    })
}

impl LlamaAttention {
    /// The attention of a layer of `config`: weights `N(0, std)`, biases (with `qkv_bias`) zero,
    /// head norms (with `qk_norm`) ones.
    pub fn new(config: &super::LlamaConfig, std: f64, rng: &mut Generator) -> Result<Self> {
        let (c, hd) = (config.n_embd, config.head_dim());
        let (n_head, n_kv_head) = (config.n_head, config.n_kv_head);
        let qkv = if config.qkv_bias { biased } else { linear };
        let head_norm = || config.qk_norm.then(|| RmsNorm::new(hd, config.norm_eps)).transpose();
        Ok(LlamaAttention {
            q_proj: qkv(c, n_head * hd, std, rng)?,
            k_proj: qkv(c, n_kv_head * hd, std, rng)?,
            v_proj: qkv(c, n_kv_head * hd, std, rng)?,
            o_proj: linear(n_head * hd, c, std, rng)?,
            q_norm: head_norm()?,
            k_norm: head_norm()?,
            n_head,
            n_kv_head,
            head_dim: hd,
        })
    }

    /// Query (`key = false`) or key heads `z` `[B, T, heads, hd]` through their norm, when the
    /// layer has one.
    pub(super) fn norm_heads(&self, z: Tensor, key: bool) -> Result<Tensor> {
        match if key { &self.k_norm } else { &self.q_norm } {
            Some(norm) => norm.forward(&z),
            None => Ok(z),
        }
    }

    /// `residual + o_proj(attention(x))`.
    /// # Shapes
    /// `x`, `residual` `[B, T, C]` -> `[B, T, C]`; causal, scaled by `1/sqrt(head_dim)`.
    /// Across a sequence-parallel group, this rank's `[B, T / tp, C]` in and out.
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor, rope: &Rotary) -> Result<Tensor> {
        // one `f` (or sequence gather) for the three projections, which read the same input
        let x = self.q_proj.column_input(x)?;
        let (b, t, hd) = (x.dim(0)?, x.dim(1)?, self.head_dim);
        let (h, kvh) = (self.n_head, self.n_kv_head);
        // [B, T, heads, hd], rotated, then [B, heads, T, hd] views
        let q = self.norm_heads(self.q_proj.forward_prepared(&x)?.view(&[b, t, h, hd])?, false)?;
        let k = self.norm_heads(self.k_proj.forward_prepared(&x)?.view(&[b, t, kvh, hd])?, true)?;
        let (q, k) = (rope.apply(&q)?, rope.apply(&k)?);
        let v = self.v_proj.forward_prepared(&x)?.view(&[b, t, kvh, hd])?;
        // grouped-query: query head i reads key/value head i / (h / kvh), no repeated copies
        let y = Tensor::grouped_query_attention(
            &q.transpose(1, 2)?,
            &k.transpose(1, 2)?,
            &v.transpose(1, 2)?,
            true,
            None,
        )?;
        let y = y
            .transpose(1, 2)?
            .reshape(&[b as isize, t as isize, (h * hd) as isize])?;
        self.o_proj.forward_add(&y, residual)
    }

    /// Cuts the layer across a tensor-parallel group by heads: q, k and v column-parallel (each
    /// rank its query heads and its key/value heads), o row-parallel; the head norms stay whole,
    /// their gradients summed over the group (each rank normalizes its own heads). `n_kv_head`
    /// (and so `n_head`) must divide by the group size. Returns the parameters' splits by name.
    pub fn make_tensor_parallel(&mut self, group: &TpGroup) -> Result<Vec<(String, Split)>> {
        let tp = group.size();
        if !self.n_kv_head.is_multiple_of(tp) {
            return Err(config_error(
                "n_kv_head",
                format!("{} does not divide by parallel.tp = {tp}", self.n_kv_head),
            ));
        }
        let mut splits = prefixed("q_proj", self.q_proj.make_column_parallel(group, 1)?);
        splits.extend(prefixed("k_proj", self.k_proj.make_column_parallel(group, 1)?));
        splits.extend(prefixed("v_proj", self.v_proj.make_column_parallel(group, 1)?));
        splits.extend(prefixed("o_proj", self.o_proj.make_row_parallel(group)?));
        for norm in [&mut self.q_norm, &mut self.k_norm].into_iter().flatten() {
            norm.make_head_parallel(group);
        }
        self.n_head /= tp;
        self.n_kv_head /= tp;
        Ok(splits)
    }
}

impl Module for LlamaAttention {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("q_proj", self.q_proj.parameters());
        p.extend(prefixed("k_proj", self.k_proj.parameters()));
        p.extend(prefixed("v_proj", self.v_proj.parameters()));
        p.extend(prefixed("o_proj", self.o_proj.parameters()));
        for (name, norm) in [("q_norm", &self.q_norm), ("k_norm", &self.k_norm)] {
            if let Some(norm) = norm {
                p.extend(prefixed(name, norm.parameters()));
            }
        }
        p
    }
}
