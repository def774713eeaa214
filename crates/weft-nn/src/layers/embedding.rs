use weft_core::{CompareOp, DType, Generator, Result, Tensor};

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
    /// The id whose lookups give its row no gradient (`torch.nn.Embedding`'s `padding_idx`,
    /// transformers' `pad_token_id`); its row is read as any other. `None`: every row learns.
    pub padding_idx: Option<usize>,
}

impl Embedding {
    pub fn new(num_embeddings: usize, dim: usize, rng: &mut Generator) -> Result<Self> {
        Ok(Embedding {
            weight: init::normal(&[num_embeddings, dim], 1.0, DType::F32, rng)?,
            shard: None,
            padding_idx: None,
        })
    }

    /// # Shapes
    /// I64 ids `[...]` -> `[..., dim]`. Ids out of range are an error naming the id.
    ///
    /// With a `padding_idx`, where autograd records, the rows looked up for that id are taken
    /// from the result outside the graph (`where(ids == padding_idx, y.detach(), y)`): the same
    /// values, and no gradient from those positions reaches the row (nor anything else).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let y = match &self.shard {
            None => self.weight.embedding(ids)?,
            Some(s) => s.embedding(&self.weight, ids)?,
        };
        match self.padding_idx {
            Some(p) if y.requires_grad() => {
                let pad = Tensor::full(&[], p as f64, ids.dtype())?;
                let at_pad = ids.compare(CompareOp::Eq, &pad)?.unsqueeze(-1)?;
                Tensor::where_cond(&at_pad, &y.detach(), &y)
            }
            _ => Ok(y),
        }
    }

    /// An embedding over `weight` (`[num_embeddings, dim]`).
    pub fn from_weight(weight: Tensor) -> Self {
        Embedding {
            weight,
            shard: None,
            padding_idx: None,
        }
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
