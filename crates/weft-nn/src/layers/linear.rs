use weft_core::{DType, Generator, Result, Tensor};

use crate::init;
use crate::module::Module;

/// `y = x W^T + b` (as `torch.nn.Linear`): weight `[out, in]`, bias `[out]`.
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// PyTorch's default initialisation: weight and bias uniform in `±1/sqrt(in)`.
    pub fn new(in_features: usize, out_features: usize, bias: bool, rng: &mut Generator) -> Result<Self> {
        let bound = init::default_bound(in_features);
        let weight = init::uniform(&[out_features, in_features], bound, DType::F32, rng)?;
        let bias = if bias {
            Some(init::uniform(&[out_features], bound, DType::F32, rng)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// # Shapes
    /// `[..., in] -> [..., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.linear(&self.weight, self.bias.as_ref())
    }
}

impl Module for Linear {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            p.push(("bias".to_string(), b.clone()));
        }
        p
    }
}
