//! The SwiGLU MLP (transformers' `LlamaMLP`): `down(silu(gate(x)) * up(x))`, no biases.

use weft_core::{DType, Device, Generator, Result, Tensor, UnaryOp};
use weft_nn::layers::Linear;
use weft_nn::module::{prefixed, Module};
use weft_nn::parallel::{Split, TpGroup};

use super::attention::linear;
use crate::config_error;

/// `gate_proj`, `up_proj` `[I, C]`, `down_proj` `[C, I]`.
#[derive(Clone, Debug)]
pub struct LlamaMlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl LlamaMlp {
    /// Weights `N(0, std)`.
    pub fn new(n_embd: usize, intermediate: usize, std: f64, rng: &mut Generator) -> Result<Self> {
        Ok(LlamaMlp {
            gate_proj: linear(n_embd, intermediate, std, rng)?,
            up_proj: linear(n_embd, intermediate, std, rng)?,
            down_proj: linear(intermediate, n_embd, std, rng)?,
        })
    }

    /// `residual + down(silu(gate(x)) * up(x))`.
    /// # Shapes
    /// `x`, `residual` `[B, T, C]` -> `[B, T, C]` (across a sequence-parallel group, this
    /// rank's `[B, T / tp, C]`).
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        let w = &self.gate_proj.weight;
        let f32_cpu = w.device() == Device::Cpu
            && w.dtype() == DType::F32
            && x.dtype() == DType::F32
            && weft_core::autocast_dtype().is_none();
        // one `f` (or sequence gather) for gate and up, which read the same input
        let x = self.gate_proj.column_input(x)?;
        let h = if f32_cpu {
            // silu and the product in one pass each way (the same values as below)
            self.gate_proj
                .forward_prepared(&x)?
                .silu_mul(&self.up_proj.forward_prepared(&x)?)?
        } else {
            self.gate_proj
                .forward_act_prepared(&x, UnaryOp::Silu)?
                .mul(&self.up_proj.forward_prepared(&x)?)?
        };
        self.down_proj.forward_add(&h, residual)
    }

    /// Cuts the MLP across a tensor-parallel group on its intermediate dimension: gate and up
    /// column-parallel, down row-parallel. `intermediate_size` must divide by the group size.
    pub fn make_tensor_parallel(&mut self, group: &TpGroup) -> Result<Vec<(String, Split)>> {
        let hidden = self.gate_proj.weight.dim(0)?;
        if !hidden.is_multiple_of(group.size()) {
            return Err(config_error(
                "intermediate_size",
                format!("{hidden} does not divide by parallel.tp = {}", group.size()),
            ));
        }
        let mut splits = prefixed("gate_proj", self.gate_proj.make_column_parallel(group, 1)?);
        splits.extend(prefixed("up_proj", self.up_proj.make_column_parallel(group, 1)?));
        splits.extend(prefixed("down_proj", self.down_proj.make_row_parallel(group)?));
        Ok(splits)
    }
}

impl Module for LlamaMlp {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("gate_proj", self.gate_proj.parameters());
        p.extend(prefixed("up_proj", self.up_proj.parameters()));
        p.extend(prefixed("down_proj", self.down_proj.parameters()));
        p
    }
}
