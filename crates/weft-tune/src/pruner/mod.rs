//! Pruners: whether a running trial should stop, from the metric values it and the others
//! reported. Values are losses (lower is better; a maximized metric is negated first) reported
//! at training steps; the driver reports each trial's values in step order as they reach the
//! store.

mod asha;
mod hyperband;
mod median;

pub use asha::Asha;
pub use hyperband::Hyperband;
pub use median::Median;

use crate::spec::{PrunerKind, PrunerSpec};

/// A pruner's answer to a report.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Continue,
    /// Stop the trial; why (the rung or step, and the values it was compared with).
    Prune(String),
}

/// Decides, report by report, which trials stop early.
pub trait Pruner {
    /// Trial `trial` reached training step `step` with metric `value` (a loss).
    fn report(&mut self, trial: u64, step: u64, value: f64) -> Decision;
}

/// Never stops a trial (`kind = "none"`).
#[derive(Debug, Clone, Copy)]
pub struct NoPruner;

impl Pruner for NoPruner {
    fn report(&mut self, _trial: u64, _step: u64, _value: f64) -> Decision {
        Decision::Continue
    }
}

/// The pruner `spec` names, for trials of `max_steps` training steps (rungs at or past the end
/// are left out: a trial there has finished).
pub fn from_spec(spec: &PrunerSpec, max_steps: u64) -> Box<dyn Pruner + Send> {
    match spec.kind {
        PrunerKind::Asha => Box::new(Asha::new(spec.min_steps, spec.reduction_factor, max_steps)),
        PrunerKind::Hyperband => Box::new(Hyperband::new(spec.min_steps, spec.reduction_factor, max_steps)),
        PrunerKind::Median => Box::new(Median::new(spec.min_steps)),
        PrunerKind::None => Box::new(NoPruner),
    }
}
