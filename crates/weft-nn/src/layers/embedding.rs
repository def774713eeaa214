use weft_core::{DType, Generator, Result, Tensor};

use crate::init;
use crate::module::Module;

/// A lookup table `[num_embeddings, dim]` (as `torch.nn.Embedding`), initialised `N(0, 1)`.
#[derive(Clone, Debug)]
pub struct Embedding {
    pub weight: Tensor,
}

impl Embedding {
    pub fn new(num_embeddings: usize, dim: usize, rng: &mut Generator) -> Result<Self> {
        Ok(Embedding {
            weight: init::normal(&[num_embeddings, dim], 1.0, DType::F32, rng)?,
        })
    }

    /// # Shapes
    /// I64 ids `[...]` -> `[..., dim]`. Ids out of range are an error naming the id.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.weight.embedding(ids)
    }
}

impl Module for Embedding {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}
