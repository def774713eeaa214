use weft_core::{Result, Tensor};

use crate::context::Context;
use crate::module::Module;

/// Inverted dropout with probability `p`, active in training mode only (as `torch.nn.Dropout`).
/// Draws from its context's random stream.
#[derive(Clone, Debug)]
pub struct Dropout {
    pub p: f64,
    ctx: Context,
}

impl Dropout {
    pub fn new(p: f64, ctx: &Context) -> Self {
        Dropout { p, ctx: ctx.clone() }
    }

    /// Whether the model is in training mode.
    pub fn training(&self) -> bool {
        self.ctx.training()
    }

    /// Whether `forward` changes its input (training mode and `p > 0`).
    pub fn active(&self) -> bool {
        self.ctx.training() && self.p != 0.0
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.active() {
            return Ok(x.clone());
        }
        self.ctx.with_rng(|g| x.dropout(self.p, true, g))
    }
}

impl Module for Dropout {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}
