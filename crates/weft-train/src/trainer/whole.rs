//! The trainer's collectives over the layout of a parallel run: the gradient norm across
//! shards, stages and tensor-parallel parts, the whole parameters (for sampling after a run),
//! and the cutting of a checkpoint's whole tensors for this rank on resume.

use std::collections::BTreeMap;

use weft_core::Tensor;
use weft_dist::{ProcessGroup, ReduceOp};
use weft_nn::clip::grad_norm;
use weft_nn::parallel::Split;

use super::Trainer;

/// The tensor-parallel group a model is cut across, and how each cut parameter is cut.
pub(super) struct TensorParallel {
    pub group: ProcessGroup,
    pub splits: BTreeMap<String, Split>,
}

/// The parameter an optimizer state key (`"{param}.{field}"`) belongs to.
pub(super) fn param_of(key: &str) -> &str {
    key.rsplit_once('.').map_or("", |(p, _)| p)
}
use crate::error::Result;

impl Trainer {
    /// The global gradient norm when gradients are cut: ZeRO pieces (each element on exactly
    /// one data-parallel rank) summed over the data-parallel group, tensor-parallel parts
    /// summed over the tensor-parallel group (parameters whole on every tensor-parallel rank
    /// counted on its rank 0 only), stages summed over the pipeline (a tied weight counted on
    /// the first stage only).
    pub(super) fn sharded_grad_norm(&self) -> Result<f64> {
        let tp = self.tensor_parallel.as_ref();
        let mut local = 0.0;
        for (name, p) in self.groups.iter().flat_map(|g| g.params.iter()) {
            let in_tp = tp.is_none_or(|tp| tp.group.rank() == 0 || tp.splits.contains_key(name));
            let in_pp = self.pipeline.as_ref().is_none_or(|pp| pp.counts_in_norm(name));
            if in_tp && in_pp {
                let n = grad_norm(std::slice::from_ref(p))?;
                local += n * n;
            }
        }
        if self.zero().is_some() {
            local = self.sum_over_ranks(vec![local])?[0];
        }
        let groups = [tp.map(|tp| &tp.group), self.pipeline.as_ref().map(|p| p.group())];
        for g in groups.into_iter().flatten() {
            let t = Tensor::from_vec(vec![local], &[1])?;
            g.all_reduce(&t, ReduceOp::Sum)?.wait()?;
            local = t.to_vec::<f64>()?[0];
        }
        Ok(local.sqrt())
    }

    /// Collective (every rank of the job): the model's whole parameters by name (ZeRO stage 3
    /// gathered, each taken from the pipeline stage that trains it, tensor-parallel parts put
    /// together).
    pub fn whole_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        self.gather_parameters()?;
        self.model
            .parameters()
            .into_iter()
            .map(|(name, p)| {
                // the stage that trains it has its value
                let p = match &self.pipeline {
                    Some(pp) => {
                        let t = p.detach().contiguous_copy()?;
                        pp.group().broadcast(&t, pp.owner(&name)?)?.wait()?;
                        t
                    }
                    None => p,
                };
                let whole = self.whole_of(&name, p)?;
                Ok((name, whole))
            })
            .collect()
    }

    /// Collective over the tensor-parallel group: the whole of `t`, this rank's part of
    /// parameter `param` (or of a tensor of its shape, such as a moment); `t` itself when the
    /// parameter is not cut, or `t` is a scalar (a step count).
    fn whole_of(&self, param: &str, t: Tensor) -> Result<Tensor> {
        match &self.tensor_parallel {
            Some(tp) if t.rank() > 0 => match tp.splits.get(param) {
                Some(split) => Ok(weft_dist::tensor_parallel::gather_whole(&tp.group, split, &t)?),
                None => Ok(t),
            },
            _ => Ok(t),
        }
    }

    /// This rank's tensor-parallel part of each whole tensor of `tensors` whose name (or, with
    /// `by_param`, whose key's parameter prefix) names a cut parameter.
    pub(super) fn tensor_parallel_parts(&self, tensors: &mut BTreeMap<String, Tensor>, by_param: bool) -> Result<()> {
        let Some(tp) = &self.tensor_parallel else {
            return Ok(());
        };
        for (key, t) in tensors.iter_mut() {
            let param = if by_param { param_of(key) } else { key.as_str() };
            if let (Some(split), true) = (tp.splits.get(param), t.rank() > 0) {
                *t = split.shard(t, tp.group.rank(), tp.group.size())?;
            }
        }
        Ok(())
    }
}
