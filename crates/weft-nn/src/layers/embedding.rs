use weft_core::{DType, Generator, Result, Tensor};

use crate::init;
use crate::module::Module;
use crate::parallel::{Split, TpGroup, VocabShard};

/// A lookup table `[num_embeddings, dim]` (as `torch.nn.Embedding`), initialised `N(0, 1)`; or,
/// vocab-parallel, one rank's rows of it.
#[derive(Clone, Debug)]
pub struct Embedding {
    pub weight: Tensor,
    /// Which rows this rank holds, when cut across a tensor-parallel group.
    pub shard: Option<VocabShard>,
}

impl Embedding {
    pub fn new(num_embeddings: usize, dim: usize, rng: &mut Generator) -> Result<Self> {
        Ok(Embedding {
            weight: init::normal(&[num_embeddings, dim], 1.0, DType::F32, rng)?,
            shard: None,
        })
    }

    /// # Shapes
    /// I64 ids `[...]` -> `[..., dim]`. Ids out of range are an error naming the id.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        match &self.shard {
            None => self.weight.embedding(ids),
            Some(s) => s.embedding(&self.weight, ids),
        }
    }

    /// An embedding over `weight` (`[num_embeddings, dim]`).
    pub fn from_weight(weight: Tensor) -> Self {
        Embedding { weight, shard: None }
    }

    /// Cuts the table across a tensor-parallel group by rows (the vocabulary, padded with zero
    /// rows to a multiple of the group size). Returns the split of `weight`.
    pub fn make_vocab_parallel(&mut self, group: &TpGroup) -> Result<Vec<(String, Split)>> {
        let shard = VocabShard::new(group.clone(), self.weight.dim(0)?);
        let split = shard.split();
        self.weight = crate::parallel::shard_param(&self.weight, &split, group)?;
        self.shard = Some(shard);
        Ok(vec![("weight".to_string(), split)])
    }
}

impl Module for Embedding {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}
