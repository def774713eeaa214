//! What the trainer reports: a record per step and per evaluation, and the callbacks that
//! receive them (metrics files, progress displays).

use super::FitSummary;
use crate::error::Result;
use crate::replicas::StateBytes;

/// What one optimizer step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    /// The step's number, counted from 1: once it is done, this many steps are, and the
    /// checkpoint taken after it is `step-{step}` (the same numbering as the progress display,
    /// the metrics file and evaluations).
    pub step: usize,
    /// Mean loss of the step's batch (the mean over its micro-batches' losses with gradient
    /// accumulation), computed before the update.
    pub loss: f64,
    /// Learning rate used at this step.
    pub lr: f64,
    /// Global L2 norm of the gradients before clipping.
    pub grad_norm: f64,
    /// Wall time of the whole step (forward, backward, gradient sync, clip, update; not the wait
    /// for data, which is `data_wait_ms`), milliseconds.
    pub step_ms: f64,
    /// Items processed per second: tokens for sequence models, samples otherwise, over every
    /// micro-batch of every data-parallel rank.
    pub items_per_s: f64,
    /// `"tokens_per_s"` or `"samples_per_s"`.
    pub items_key: &'static str,
    /// Model state this rank held when the gradients were ready, before the update.
    pub state_bytes: StateBytes,
    /// With a pipeline: the most activation bytes each stage (in stage order) held at once in
    /// this step.
    pub activation_bytes: Option<Vec<usize>>,
    /// The step's loss or gradients were not finite and it made no update
    /// ([`Trainer::with_skip_nonfinite`](super::Trainer::with_skip_nonfinite)).
    pub skipped: bool,
    /// Steps skipped so far in this run's `fit`, this one included.
    pub skipped_steps: usize,
    /// On a GPU: the most bytes the caching allocator had handed out during the step.
    pub gpu_mem_bytes: Option<u64>,
    /// On the CPU: the most host bytes of tensor storages this process held at once during the
    /// step (`weft_core::memory::max_allocated_bytes`: parameters, optimizer state, gradients,
    /// activations, and batches the data loader made meanwhile).
    pub host_mem_bytes: Option<u64>,
    /// Micro-batches the step accumulated (`train.grad_accum`; 1 without accumulation).
    pub micro_batches: usize,
    /// Milliseconds the training loop waited for the step's batches from the background
    /// producer, summed over its micro-batches (0 when they were ready; not part of `step_ms`).
    pub data_wait_ms: f64,
}

/// What one evaluation found.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalRecord {
    /// Steps done when it ran (the numbering of [`StepRecord::step`]).
    pub step: usize,
    /// Mean loss over the evaluation batches.
    pub loss: f64,
    /// For classifiers: the fraction of evaluation rows whose predicted class was right.
    pub accuracy: Option<f64>,
}

/// Hooks the trainer calls; metrics files and progress bars are callbacks.
pub trait Callback: Send {
    /// After every step whose index is a multiple of the log interval, and after the last.
    fn on_step(&mut self, record: &StepRecord) -> Result<()>;
    /// After an evaluation.
    fn on_eval(&mut self, _record: &EvalRecord) -> Result<()> {
        Ok(())
    }
    /// When [`Trainer::fit`](super::Trainer::fit) returns (finished, or stopped by a signal).
    fn on_end(&mut self, _summary: &FitSummary) -> Result<()> {
        Ok(())
    }
}
