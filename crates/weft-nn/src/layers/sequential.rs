use weft_core::{Result, Tensor};

use super::{Activation, Conv2d, Dropout, Embedding, LayerNorm, Linear, MaxPool2d, Mlp, RmsNorm};
use crate::module::{prefixed, Module};

/// A layer with a single-input forward, so it can sit in a [`Sequential`].
pub trait Forward: Module + Send + Sync {
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
}

macro_rules! forward_impl {
    ($($t:ty),*) => {
        $(impl Forward for $t {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                <$t>::forward(self, x)
            }
        })*
    };
}
forward_impl!(Linear, Embedding, LayerNorm, RmsNorm, Dropout, Conv2d, MaxPool2d, Activation, Mlp);

/// Layers applied in order (as `torch.nn.Sequential`); parameters are named `{index}.{name}`.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Forward>>,
}

impl Sequential {
    pub fn new() -> Self {
        Sequential { layers: Vec::new() }
    }

    /// Appends a layer (builder style).
    pub fn push(mut self, layer: impl Forward + 'static) -> Self {
        self.layers.push(Box::new(layer));
        self
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = x.clone();
        for l in &self.layers {
            y = l.forward(&y)?;
        }
        Ok(y)
    }
}

impl Module for Sequential {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| prefixed(&i.to_string(), l.parameters()))
            .collect()
    }
}

impl Forward for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Sequential::forward(self, x)
    }
}
