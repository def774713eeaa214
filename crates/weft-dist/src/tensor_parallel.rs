//! Tensor parallelism over a process group: [`TpProcessGroup`] gives `weft_nn::parallel`'s
//! layers (column- and row-parallel `Linear`, vocab-parallel `Embedding` and cross-entropy)
//! their group, and [`gather_whole`] puts a cut parameter back together.

use std::sync::Arc;

use weft_core::Tensor;
use weft_nn::parallel::{GroupReduce, Split, TensorParallelGroup, TpGroup};

use crate::error::Result;
use crate::group::ProcessGroup;
use crate::reduce::ReduceOp;

/// A process group as a tensor-parallel group.
pub struct TpProcessGroup(pub ProcessGroup);

impl TpProcessGroup {
    /// `pg` as the shared handle the layers take.
    pub fn handle(pg: &ProcessGroup) -> TpGroup {
        Arc::new(TpProcessGroup(pg.clone()))
    }
}

impl TensorParallelGroup for TpProcessGroup {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn size(&self) -> usize {
        self.0.size()
    }

    fn all_reduce(&self, t: &Tensor, op: GroupReduce) -> weft_core::Result<()> {
        let op = match op {
            GroupReduce::Sum => ReduceOp::Sum,
            GroupReduce::Max => ReduceOp::Max,
        };
        self.0.all_reduce(t, op).and_then(|w| w.wait()).map_err(Into::into)
    }

    fn all_gather(&self, output: &Tensor, input: &Tensor) -> weft_core::Result<()> {
        self.0
            .all_gather(output, input)
            .and_then(|w| w.wait())
            .map_err(Into::into)
    }
}

/// Collective over `pg`: the whole tensor from every rank's part `local` of a parameter (or of
/// a tensor of its shape, such as an optimizer moment) cut by `split`.
pub fn gather_whole(pg: &ProcessGroup, split: &Split, local: &Tensor) -> Result<Tensor> {
    let local = local.contiguous_copy()?;
    let n = local.numel();
    let flat = Tensor::zeros(&[n * pg.size()], local.dtype())?;
    pg.all_gather(&flat, &local.reshape(&[-1])?)?.wait()?;
    let parts = (0..pg.size())
        .map(|r| flat.narrow(0, r * n, n)?.view(local.shape()))
        .collect::<weft_core::Result<Vec<_>>>()?;
    Ok(split.unshard(&parts)?)
}
