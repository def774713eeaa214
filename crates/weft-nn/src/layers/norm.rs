use weft_core::{DType, Result, Tensor};

use crate::init;
use crate::module::Module;

/// Layer norm over the last dim (as `torch.nn.LayerNorm(dim, eps, bias=...)`): weight ones, bias
/// zeros (or no bias).
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub eps: f64,
}

impl LayerNorm {
    pub fn new(dim: usize, bias: bool, eps: f64) -> Result<Self> {
        let weight = init::constant(&[dim], 1.0, DType::F32)?;
        let bias = if bias {
            Some(init::constant(&[dim], 0.0, DType::F32)?)
        } else {
            None
        };
        Ok(LayerNorm { weight, bias, eps })
    }

    /// # Shapes
    /// `[..., dim] -> [..., dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(Some(&self.weight), self.bias.as_ref(), self.eps)
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
}

impl RmsNorm {
    pub fn new(dim: usize, eps: f64) -> Result<Self> {
        Ok(RmsNorm {
            weight: init::constant(&[dim], 1.0, DType::F32)?,
            eps,
        })
    }

    /// # Shapes
    /// `[..., dim] -> [..., dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.rms_norm(Some(&self.weight), self.eps)
    }
}

impl Module for RmsNorm {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}
