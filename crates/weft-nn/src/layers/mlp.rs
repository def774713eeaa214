use weft_core::{Generator, Result, Tensor};

use super::{Dropout, Linear};
use crate::context::Context;
use crate::module::{prefixed, Module};

/// The transformer MLP block (nanoGPT's `MLP`): `c_fc` `C -> 4C`, exact GELU, `c_proj` `4C -> C`,
/// dropout.
#[derive(Clone, Debug)]
pub struct Mlp {
    pub c_fc: Linear,
    pub c_proj: Linear,
    dropout: Dropout,
}

impl Mlp {
    pub fn new(n_embd: usize, bias: bool, dropout: f64, ctx: &Context, rng: &mut Generator) -> Result<Self> {
        Ok(Mlp {
            c_fc: Linear::new(n_embd, 4 * n_embd, bias, rng)?,
            c_proj: Linear::new(4 * n_embd, n_embd, bias, rng)?,
            dropout: Dropout::new(dropout, ctx),
        })
    }

    /// # Shapes
    /// `[..., C] -> [..., C]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.dropout
            .forward(&self.c_proj.forward(&self.c_fc.forward(x)?.gelu()?)?)
    }
}

impl Module for Mlp {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("c_fc", self.c_fc.parameters());
        p.extend(prefixed("c_proj", self.c_proj.parameters()));
        p
    }
}
