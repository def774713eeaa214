use weft_core::{Result, Tensor, UnaryOp};

use crate::module::Module;

/// A parameter-free pointwise layer, for [`Sequential`](super::Sequential) stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Relu,
    /// Exact (erf) GELU.
    Gelu,
    Tanh,
    /// Flattens every dim after the first (`[N, ...] -> [N, prod(...)]`).
    Flatten,
}

impl Activation {
    /// Parses `relu` | `gelu` | `tanh`.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "relu" => Activation::Relu,
            "gelu" => Activation::Gelu,
            "tanh" => Activation::Tanh,
            _ => return None,
        })
    }

    /// The pointwise op this activation is, if it is one (a [`Linear`](super::Linear) can
    /// apply it fused: [`Linear::forward_act`](super::Linear::forward_act)).
    pub fn unary(&self) -> Option<UnaryOp> {
        match self {
            Activation::Relu => Some(UnaryOp::Relu),
            Activation::Gelu => Some(UnaryOp::Gelu),
            Activation::Tanh => Some(UnaryOp::Tanh),
            Activation::Flatten => None,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(),
            Activation::Tanh => x.tanh(),
            Activation::Flatten => x.flatten(1, -1),
        }
    }
}

impl Module for Activation {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}
