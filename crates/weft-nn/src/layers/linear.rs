use weft_core::{DType, Generator, Result, Tensor, UnaryOp};

use crate::init;
use crate::module::Module;
use crate::parallel::{shard_param, Split, TpGroup};
use crate::sequence_parallel::{column_input, row_output, whole_gradient};

/// `y = x W^T + b` (as `torch.nn.Linear`): weight `[out, in]`, bias `[out]`; or, cut across a
/// tensor-parallel group, one rank's part of it (see [`LinearParallel`]).
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub parallel: LinearParallel,
}

/// How a [`Linear`] is cut across a tensor-parallel group of `n` ranks.
#[derive(Clone, Default)]
pub enum LinearParallel {
    /// Whole on every rank.
    #[default]
    None,
    /// Column-parallel: this rank holds some output features (weight `[out/n, in]`, bias
    /// `[out/n]`); the input goes through `f` (whole forward, gradient summed backward) and the
    /// output stays cut.
    Column(TpGroup),
    /// Row-parallel: this rank holds some input features (weight `[out, in/n]`) and takes its
    /// part of the input; the partial products are summed over the group by `g`, then the
    /// (whole, replicated) bias is added.
    Row(TpGroup),
}

impl std::fmt::Debug for LinearParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinearParallel::None => f.write_str("None"),
            LinearParallel::Column(g) => write!(f, "Column({} ranks)", g.size()),
            LinearParallel::Row(g) => write!(f, "Row({} ranks)", g.size()),
        }
    }
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
        Ok(Linear {
            weight,
            bias,
            parallel: LinearParallel::None,
        })
    }

    /// # Shapes
    /// `[..., in] -> [..., out]` (column-parallel: `[..., out/n]`; row-parallel: from
    /// `[..., in/n]`). Across a sequence-parallel group ([`crate::sequence_parallel`]) a
    /// column-parallel layer takes this rank's part of the tokens, `[B, T/n, in]`, and a
    /// row-parallel one gives it.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_prepared(&self.column_input(x)?)
    }

    /// The input as this layer's product reads it: for a column-parallel layer `x` through `f`
    /// (or the sequence gather), otherwise `x` itself. Layers cut across the same group that
    /// read the same input (q, k and v; gate and up) share one, so its gradient is reduced
    /// once: `a.forward_prepared(&a.column_input(x)?)` is `a.forward(x)`.
    pub fn column_input(&self, x: &Tensor) -> Result<Tensor> {
        match &self.parallel {
            LinearParallel::Column(g) => column_input(x, g),
            _ => Ok(x.clone()),
        }
    }

    /// [`Linear::forward`] of an input that went through [`Linear::column_input`].
    pub fn forward_prepared(&self, x: &Tensor) -> Result<Tensor> {
        match &self.parallel {
            LinearParallel::None | LinearParallel::Column(_) => x.linear(&self.weight, self.bias.as_ref()),
            LinearParallel::Row(g) => {
                let y = row_output(&x.linear(&self.weight, None)?, g)?;
                match &self.bias {
                    // applied to this rank's tokens only: each rank holds part of its gradient
                    Some(b) if g.sequence_parallel() => y.add(&whole_gradient(b, g)?),
                    Some(b) => y.add(b),
                    None => Ok(y),
                }
            }
        }
    }

    /// `act(forward(x))`; on a whole or column-parallel layer as one op that applies `act` to
    /// each block of the product while it is in cache ([`Tensor::linear_act`]).
    /// # Shapes
    /// As [`Linear::forward`].
    pub fn forward_act(&self, x: &Tensor, act: UnaryOp) -> Result<Tensor> {
        self.forward_act_prepared(&self.column_input(x)?, act)
    }

    /// [`Linear::forward_act`] of an input that went through [`Linear::column_input`].
    pub fn forward_act_prepared(&self, x: &Tensor, act: UnaryOp) -> Result<Tensor> {
        match &self.parallel {
            LinearParallel::None | LinearParallel::Column(_) => x.linear_act(&self.weight, self.bias.as_ref(), act),
            LinearParallel::Row(_) => self.forward_prepared(x)?.unary(act),
        }
    }

    /// `residual + forward(x)`; on a whole layer as one op that adds the residual to each block
    /// of the product while it is in cache ([`Tensor::linear_add`]).
    /// # Shapes
    /// As [`Linear::forward`]; `residual` has the output's shape.
    pub fn forward_add(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        match &self.parallel {
            LinearParallel::None => x.linear_add(&self.weight, self.bias.as_ref(), residual),
            _ => residual.add(&self.forward(x)?),
        }
    }

    /// Cuts this whole layer column-parallel across `group`: the output features, seen as
    /// `blocks` equal blocks (3 for a fused q,k,v projection), each cut into `n` parts. Returns
    /// the splits of `weight` and `bias`, by parameter name.
    pub fn make_column_parallel(&mut self, group: &TpGroup, blocks: usize) -> Result<Vec<(String, Split)>> {
        let split = Split {
            dim: 0,
            blocks,
            len: self.weight.dim(0)?,
        };
        let mut splits = vec![("weight".to_string(), split.clone())];
        self.weight = shard_param(&self.weight, &split, group)?;
        if let Some(b) = &self.bias {
            self.bias = Some(shard_param(b, &split, group)?);
            splits.push(("bias".to_string(), split));
        }
        self.parallel = LinearParallel::Column(group.clone());
        Ok(splits)
    }

    /// Cuts this whole layer row-parallel across `group` (the input features); the bias stays
    /// whole. Returns the split of `weight`.
    pub fn make_row_parallel(&mut self, group: &TpGroup) -> Result<Vec<(String, Split)>> {
        let split = Split {
            dim: 1,
            blocks: 1,
            len: self.weight.dim(1)?,
        };
        self.weight = shard_param(&self.weight, &split, group)?;
        self.parallel = LinearParallel::Row(group.clone());
        Ok(vec![("weight".to_string(), split)])
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
