//! How the trainer keeps data-parallel replicas in step: plain data parallelism, or ZeRO
//! sharding (whose stage 3 runs the model's units between gather and free hooks), and the
//! bytes of model state a rank holds under either.

use std::sync::Arc;

use weft_core::Tensor;
use weft_dist::{DataParallel, ShardedDataParallel};
use weft_nn::optim::Optimizer;
use weft_nn::UnitHooks;

/// The wrapper that averages gradients over the data-parallel group.
pub(crate) enum Replicas {
    /// Every rank holds everything (`parallel.zero = 0`).
    Plain(DataParallel),
    /// ZeRO stage 1, 2 or 3.
    Sharded(Arc<ShardedDataParallel>),
}

impl Replicas {
    /// Whether the wrapper's gradient-ready hooks are registered (a backward with them cannot
    /// be captured as a graph).
    pub(crate) fn hooked(&self) -> bool {
        match self {
            Replicas::Plain(ddp) => ddp.hooked(),
            Replicas::Sharded(zero) => zero.hooked(),
        }
    }

    /// Without hooks: parameter `i` (the trainer's registration order) holds its final gradient
    /// of this backward; the wrapper takes it now, as its hook would.
    pub(crate) fn hand_gradient(&self, i: usize) {
        match self {
            Replicas::Plain(ddp) => ddp.hand_gradient(i),
            Replicas::Sharded(zero) => zero.hand_gradient(i),
        }
    }

    /// Whether a backward's gradients go to the wrapper at once (ZeRO stages 2 and 3, which
    /// reduce-scatter every micro-batch's), or only on the step's last micro-batch.
    pub(crate) fn reduces_every_backward(&self) -> bool {
        matches!(self, Replicas::Sharded(zero) if zero.stage() >= 2)
    }
}

/// Gathers and frees a unit's parameters around its forward (ZeRO stage 3).
pub(crate) struct ZeroUnits(pub Arc<ShardedDataParallel>);

impl UnitHooks for ZeroUnits {
    fn before_forward(&self, unit: &str) -> weft_core::Result<()> {
        self.0.before_unit(unit).map_err(Into::into)
    }

    fn after_forward(&self, unit: &str, output: &Tensor) -> weft_core::Result<()> {
        self.0.after_unit(unit, output).map_err(Into::into)
    }
}

/// Bytes of model state one rank holds: parameters, gradients and optimizer state (each buffer
/// counted once, whatever views it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateBytes {
    pub params: usize,
    pub grads: usize,
    pub optimizer: usize,
}

/// What `params` and their gradients hold, plus the optimizer's state.
pub(crate) fn unsharded_bytes(params: &[Tensor], optimizer: &dyn Optimizer) -> StateBytes {
    let mut distinct = weft_core::storage::DistinctBytes::default();
    let mut bytes = |t: &Tensor| distinct.add(t);
    let params_b = params.iter().map(&mut bytes).sum();
    let grads_b = params.iter().filter_map(|p| p.grad()).map(|g| bytes(&g)).sum();
    StateBytes {
        params: params_b,
        grads: grads_b,
        optimizer: optimizer.state_bytes(),
    }
}
