//! The training loop: steps, callbacks, checkpoints, evaluations, and stopping cleanly when a
//! signal asks for it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use weft_core::Tensor;
use weft_dist::ReduceOp;

use super::{BatchFn, Callback, EvalRecord, StepRecord, Trainer};
use crate::checkpoint::ClaimMode;
use crate::error::{Error, Result};
use crate::job::agree;
use crate::metrics::Progress;

/// What a call of [`Trainer::fit`] did.
#[derive(Debug, Clone, Default)]
pub struct FitSummary {
    /// Steps done when `fit` returned: where a later `fit` (or a resumed run) continues.
    pub steps: usize,
    /// Steps this call ran.
    pub steps_run: usize,
    /// The last step's record.
    pub last: Option<StepRecord>,
    /// The evaluation with the lowest loss in this call, and the last one.
    pub best_eval: Option<EvalRecord>,
    pub last_eval: Option<EvalRecord>,
    /// Steps skipped for a non-finite loss or gradient ([`Trainer::with_skip_nonfinite`]).
    pub skipped_steps: usize,
    /// The signal that stopped the run before its last step, if one did (see
    /// [`crate::stop`]).
    pub stopped_by: Option<i32>,
    /// The newest checkpoint this call wrote (complete when `fit` returns).
    pub checkpoint: Option<PathBuf>,
    /// Wall time of the call.
    pub elapsed: Duration,
}

impl Trainer {
    /// Runs steps `start..end` (`start` steps are done; the records are numbered `start + 1` to
    /// `end`), fetching batches from `batches` (a background thread prepares the next ones;
    /// with [`Trainer::with_grad_accum`]`(K)` step `i` trains on batches `i K .. i K + K`),
    /// calling callbacks, checkpointing and evaluating as configured (a step's checkpoint is
    /// handed to the writer before its evaluation runs).
    ///
    /// Before the first step it claims the checkpoint folder (a fresh run's, unless
    /// [`Trainer::resume`] did) and checks that the trace can be written. After every step it
    /// checks whether a stop was asked ([`crate::stop`]; every rank of the job agrees, so all
    /// stop after the same step): then it writes a checkpoint of the steps done (when it has a
    /// checkpoint folder), waits for it, and returns with [`FitSummary::stopped_by`] set.
    pub fn fit(&mut self, batches: BatchFn, start: usize, end: usize) -> Result<FitSummary> {
        let t0 = Instant::now();
        if let Some(policy) = &self.checkpoints {
            let overwrite = policy.overwrite;
            self.claim_checkpoints(ClaimMode::Fresh { overwrite })?;
        }
        self.check_trace_path()?;
        self.skipped_steps = 0;
        let mut progress = self.progress_display(end);
        let mut summary = FitSummary {
            steps: start,
            ..Default::default()
        };
        // micro-batch j of step i is batch i K + j: a pure function of the step, so a resumed
        // run reads exactly what an uninterrupted one would have
        let k = self.grad_accum;
        let micro_end = end
            .checked_mul(k)
            .ok_or_else(|| Error::Config(format!("{end} steps of {k} micro-batches overflow the batch index")))?;
        let producer = batches.clone();
        let mut prefetch = weft_data::Prefetcher::<(Tensor, Tensor), Error>::new(
            start.saturating_mul(k)..micro_end,
            k.saturating_mul(2).clamp(2, 64),
            move |index| producer(index),
        )?;
        // a signal that came while the run was being set up stops it before its first step
        summary.stopped_by = self.stop_requested()?;
        let mut step = start;
        while step < end && summary.stopped_by.is_none() {
            // each micro-batch is taken when its forward is due
            let record = self.accumulated_step(step, k, &mut |_| {
                prefetch
                    .next()
                    .ok_or_else(|| Error::Run(format!("step {}: the batch producer stopped", step + 1)))?
            })?;
            step += 1;
            if step == start + 1 || step.is_multiple_of(self.log_every) || step == end {
                notify(&mut self.callbacks, &mut progress, |c| c.on_step(&record))?;
            }
            summary.last = Some(record);
            let mut saved = false;
            if let Some(policy) = &self.checkpoints {
                if (policy.every > 0 && step.is_multiple_of(policy.every)) || step == end {
                    summary.checkpoint = self.save(step)?;
                    saved = true;
                }
            }
            if let Some((every, _, _)) = &self.eval {
                if step.is_multiple_of(*every) || step == end {
                    if let Some(e) = self.evaluate(step)? {
                        notify(&mut self.callbacks, &mut progress, |c| c.on_eval(&e))?;
                        if summary.best_eval.as_ref().is_none_or(|b| e.loss < b.loss) {
                            summary.best_eval = Some(e.clone());
                        }
                        summary.last_eval = Some(e);
                    }
                }
            }
            summary.stopped_by = self.stop_requested()?;
            if summary.stopped_by.is_some() && !saved && self.checkpoints.is_some() {
                summary.checkpoint = self.save(step)?;
            }
        }
        drop(prefetch);
        summary.steps = step;
        summary.steps_run = step - start;
        summary.skipped_steps = self.skipped_steps;
        // the last checkpoint is complete before the run is
        self.checkpoint_writer.finish()?;
        summary.elapsed = t0.elapsed();
        notify(&mut self.callbacks, &mut progress, |c| c.on_end(&summary))?;
        // leave the model whole for whatever comes next (sampling, saving, another fit)
        self.gather_parameters()?;
        if let Some(path) = &self.trace {
            weft_dist::trace::gather_and_write(self.job_group(), path)?;
        }
        Ok(summary)
    }

    /// The signal that asked this run to stop, agreed by every rank of the job (the first
    /// signal any of them received; a rank the signal has not reached yet stops too).
    fn stop_requested(&self) -> Result<Option<i32>> {
        let mine = crate::stop::requested();
        let Some(g) = self.job_group().filter(|g| g.size() > 1) else {
            return Ok(mine);
        };
        let t = Tensor::from_vec(vec![mine.unwrap_or(0) as f64], &[1])?;
        g.all_reduce(&t, ReduceOp::Max)?.wait()?;
        let sig = t.to_vec::<f64>()?[0] as i32;
        Ok((sig != 0).then_some(sig))
    }

    /// The progress display of a run ending at `end`, on the logging rank, as
    /// [`Trainer::with_progress`] asks.
    fn progress_display(&self, end: usize) -> Option<Progress> {
        use std::io::IsTerminal;
        let show = self.progress.unwrap_or_else(|| std::io::stderr().is_terminal());
        (show && self.is_logging_rank()).then(|| Progress::new(end))
    }

    /// The trace is written after the last step: its path is checked before the first.
    fn check_trace_path(&self) -> Result<()> {
        let Some(path) = &self.trace else {
            return Ok(());
        };
        let result = if self.is_logging_rank() {
            crate::writable::probe_writable(path, crate::writable::Fifo::Refused)
                .map_err(|e| Error::Config(format!("train.trace: cannot write {}: {e}", path.display())))
        } else {
            Ok(())
        };
        agree(self.job_group(), result, "checking train.trace")
    }
}

/// Calls `f` on every callback, then on the progress display.
fn notify(
    callbacks: &mut [Box<dyn Callback>],
    progress: &mut Option<Progress>,
    f: impl Fn(&mut dyn Callback) -> Result<()>,
) -> Result<()> {
    for c in callbacks.iter_mut() {
        f(c.as_mut())?;
    }
    match progress {
        Some(p) => f(p),
        None => Ok(()),
    }
}
