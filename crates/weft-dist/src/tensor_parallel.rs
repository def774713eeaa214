//! Tensor parallelism over a process group: [`TpProcessGroup`] gives `weft_nn::parallel`'s
//! layers (column- and row-parallel `Linear`, vocab-parallel `Embedding` and cross-entropy)
//! their group, and [`gather_whole`] puts a cut parameter back together.

use std::sync::Arc;

use weft_core::Tensor;
use weft_nn::parallel::{GroupReduce, Split, TensorParallelGroup, TpGroup};
use weft_nn::sequence_parallel::DeferredSums;

use crate::error::Result;
use crate::group::ProcessGroup;
use crate::reduce::ReduceOp;

/// A process group as a tensor-parallel group; `sequence_parallel` as
/// [`TensorParallelGroup::sequence_parallel`] says, `deferred` as
/// [`TensorParallelGroup::deferred_sums`].
pub struct TpProcessGroup {
    pub pg: ProcessGroup,
    pub sequence_parallel: bool,
    pub deferred: Option<Arc<DeferredSums>>,
}

impl TpProcessGroup {
    /// `pg` as the shared handle the layers take.
    pub fn handle(pg: &ProcessGroup) -> TpGroup {
        Self::with_sequence_parallel(pg, false)
    }

    /// `pg` as the shared handle the layers take, sequence-parallel when `sequence_parallel`.
    pub fn with_sequence_parallel(pg: &ProcessGroup, sequence_parallel: bool) -> TpGroup {
        Self::with_deferred_sums(pg, sequence_parallel, None)
    }

    /// As [`TpProcessGroup::with_sequence_parallel`], the gradients of parameters whole on
    /// every rank left in `deferred` to be summed once a step where it is given.
    pub fn with_deferred_sums(
        pg: &ProcessGroup,
        sequence_parallel: bool,
        deferred: Option<Arc<DeferredSums>>,
    ) -> TpGroup {
        Arc::new(TpProcessGroup {
            pg: pg.clone(),
            sequence_parallel,
            deferred,
        })
    }
}

impl TensorParallelGroup for TpProcessGroup {
    fn rank(&self) -> usize {
        self.pg.rank()
    }

    fn size(&self) -> usize {
        self.pg.size()
    }

    fn all_reduce(&self, t: &Tensor, op: GroupReduce) -> weft_core::Result<()> {
        let op = match op {
            GroupReduce::Sum => ReduceOp::Sum,
            GroupReduce::Max => ReduceOp::Max,
        };
        self.pg.all_reduce(t, op).and_then(|w| w.wait()).map_err(Into::into)
    }

    fn all_gather(&self, output: &Tensor, input: &Tensor) -> weft_core::Result<()> {
        self.pg
            .all_gather(output, input)
            .and_then(|w| w.wait())
            .map_err(Into::into)
    }

    fn reduce_scatter(&self, output: &Tensor, input: &Tensor) -> weft_core::Result<()> {
        self.pg
            .reduce_scatter(output, input, ReduceOp::Sum)
            .and_then(|w| w.wait())
            .map_err(Into::into)
    }

    fn sequence_parallel(&self) -> bool {
        self.sequence_parallel
    }

    fn deferred_sums(&self) -> Option<&DeferredSums> {
        self.deferred.as_deref()
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
