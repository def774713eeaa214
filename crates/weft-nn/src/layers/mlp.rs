use weft_core::{Generator, Result, Tensor, UnaryOp};

use super::{Dropout, Linear};
use crate::context::Context;
use crate::module::{prefixed, Module};
use crate::parallel::{Split, TpGroup};

/// The transformer MLP block (nanoGPT's `MLP`): `c_fc` `C -> 4C`, GELU (exact by default; GPT-2's
/// tanh approximation with [`Mlp::with_activation`]), `c_proj` `4C -> C`, dropout.
#[derive(Clone, Debug)]
pub struct Mlp {
    pub c_fc: Linear,
    pub c_proj: Linear,
    dropout: Dropout,
    act: UnaryOp,
}

impl Mlp {
    pub fn new(n_embd: usize, bias: bool, dropout: f64, ctx: &Context, rng: &mut Generator) -> Result<Self> {
        Ok(Mlp {
            c_fc: Linear::new(n_embd, 4 * n_embd, bias, rng)?,
            c_proj: Linear::new(4 * n_embd, n_embd, bias, rng)?,
            dropout: Dropout::new(dropout, ctx),
            act: UnaryOp::Gelu,
        })
    }

    /// The same block with `act` between `c_fc` and `c_proj`.
    pub fn with_activation(mut self, act: UnaryOp) -> Self {
        self.act = act;
        self
    }

    /// # Shapes
    /// `[..., C] -> [..., C]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.dropout
            .forward(&self.c_proj.forward(&self.c_fc.forward_act(x, self.act)?)?)
    }

    /// `residual + forward(x)`: a transformer block's residual connection, added inside
    /// `c_proj` when no dropout sits between ([`Linear::forward_add`]).
    /// # Shapes
    /// `[..., C] -> [..., C]`, `residual` `[..., C]`.
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        let h = self.c_fc.forward_act(x, self.act)?;
        if self.dropout.active() {
            return residual.add(&self.dropout.forward(&self.c_proj.forward(&h)?)?);
        }
        self.c_proj.forward_add(&h, residual)
    }

    /// Cuts the block across a tensor-parallel group on its hidden dimension: `c_fc`
    /// column-parallel, `c_proj` row-parallel (one `f` in front, one `g` behind). The hidden
    /// size must divide by the group size. Returns the parameters' splits by name.
    pub fn make_tensor_parallel(&mut self, group: &TpGroup) -> Result<Vec<(String, Split)>> {
        let hidden = self.c_fc.weight.dim(0)?;
        if hidden % group.size() != 0 {
            return Err(weft_core::Error::Invalid {
                op: "tensor parallel",
                msg: format!(
                    "the MLP's hidden size {hidden} does not divide by tp = {}",
                    group.size()
                ),
            });
        }
        let mut splits = prefixed("c_fc", self.c_fc.make_column_parallel(group, 1)?);
        splits.extend(prefixed("c_proj", self.c_proj.make_row_parallel(group)?));
        Ok(splits)
    }
}

impl Module for Mlp {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("c_fc", self.c_fc.parameters());
        p.extend(prefixed("c_proj", self.c_proj.parameters()));
        p
    }
}
