use weft_core::{DType, Result, Tensor};

use crate::init;
use crate::module::Module;
use crate::parallel::TpGroup;
use crate::sequence_parallel::SequenceGroup;

/// Layer norm over the last dim (as `torch.nn.LayerNorm(dim, eps, bias=...)`): weight ones, bias
/// zeros (or no bias).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub eps: f64,
    /// Set when the norm runs on a sequence-parallel rank's part of the tokens.
    pub sequence: Option<SequenceGroup>,
}

impl LayerNorm {
    pub fn new(dim: usize, bias: bool, eps: f64) -> Result<Self> {
        let weight = init::constant(&[dim], 1.0, DType::F32)?;
        let bias = if bias {
            Some(init::constant(&[dim], 0.0, DType::F32)?)
        } else {
            None
        };
        Ok(LayerNorm {
            weight,
            bias,
            eps,
            sequence: None,
        })
    }

    /// # Shapes
    /// `[..., dim] -> [..., dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = self.sequence.as_ref();
        let bias = self.bias.as_ref().map(|b| SequenceGroup::param(g, b)).transpose()?;
        x.layer_norm(Some(&SequenceGroup::param(g, &self.weight)?), bias.as_ref(), self.eps)
    }

    /// Runs the norm on the tokens a rank of `group` holds when the group is
    /// sequence-parallel (the gradients of weight and bias are then summed over it).
    pub fn make_sequence_parallel(&mut self, group: &TpGroup) {
        self.sequence = SequenceGroup::of(group);
    }
}

impl Module for LayerNorm {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            p.push(("bias".to_string(), b.clone()));
        }
        p
    }
}

/// RMS norm over the last dim (as `torch.nn.RMSNorm(dim, eps)`): weight ones.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f64,
    /// Set when the norm runs on a sequence-parallel rank's part of the tokens, or a
    /// tensor-parallel rank's part of the heads ([`RmsNorm::make_head_parallel`]).
    pub sequence: Option<SequenceGroup>,
}

impl RmsNorm {
    pub fn new(dim: usize, eps: f64) -> Result<Self> {
        Ok(RmsNorm {
            weight: init::constant(&[dim], 1.0, DType::F32)?,
            eps,
            sequence: None,
        })
    }

    /// # Shapes
    /// `[..., dim] -> [..., dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.rms_norm(
            Some(&SequenceGroup::param(self.sequence.as_ref(), &self.weight)?),
            self.eps,
        )
    }

    /// As [`LayerNorm::make_sequence_parallel`].
    pub fn make_sequence_parallel(&mut self, group: &TpGroup) {
        self.sequence = SequenceGroup::of(group);
    }

    /// The norm runs on a tensor-parallel rank's part of the heads (Qwen3's per-head q and k
    /// norms, their weight whole on every rank): its weight's gradient is summed over `group`,
    /// sequence-parallel or not. A group of one rank sums nothing.
    pub fn make_head_parallel(&mut self, group: &TpGroup) {
        self.sequence = (group.size() > 1).then(|| SequenceGroup(group.clone()));
    }
}

impl Module for RmsNorm {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}
