//! Learning-rate schedules: the learning rate as a function of the step index, passed to
//! [`crate::optim::Optimizer::step`] at each step.

use weft_core::{Error, Result};

/// A learning-rate schedule. Rates are in the optimizer's learning-rate units; steps count
/// optimizer updates from 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Schedule {
    /// The same rate `lr` at every step.
    Constant {
        /// The learning rate.
        lr: f64,
    },
    /// nanoGPT's `get_lr`: linear warmup, then cosine decay to `min_lr`, then `min_lr`:
    ///
    /// ```text
    /// step <  warmup_steps:  lr (step + 1) / (warmup_steps + 1)
    /// step >  decay_steps:   min_lr
    /// otherwise:             ratio = (step - warmup_steps) / (decay_steps - warmup_steps)
    ///                        min_lr + 0.5 (1 + cos(π ratio)) (lr - min_lr)
    /// ```
    ///
    /// When `decay_steps == warmup_steps` the cosine part has no length: `ratio` is taken as 1, so
    /// the rate drops to `min_lr` at `warmup_steps` (nanoGPT divides by zero there).
    Cosine {
        /// The peak learning rate, reached at `warmup_steps` (just after warmup).
        lr: f64,
        /// Steps of linear warmup (`lr_warmup_iters`).
        warmup_steps: usize,
        /// The step at which the decay reaches `min_lr` (`lr_decay_iters`, counted from step 0,
        /// not from the end of warmup).
        decay_steps: usize,
        /// The final learning rate.
        min_lr: f64,
    },
}

impl Schedule {
    /// The learning rate at `step` (0-based), in f64 with nanoGPT's order of operations.
    pub fn lr_at(&self, step: usize) -> f64 {
        match *self {
            Schedule::Constant { lr } => lr,
            Schedule::Cosine {
                lr,
                warmup_steps,
                decay_steps,
                min_lr,
            } => {
                if step < warmup_steps {
                    return lr * (step + 1) as f64 / (warmup_steps + 1) as f64;
                }
                if step > decay_steps {
                    return min_lr;
                }
                let ratio = if decay_steps == warmup_steps {
                    1.0
                } else {
                    (step - warmup_steps) as f64 / (decay_steps - warmup_steps) as f64
                };
                let coeff = 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos());
                min_lr + coeff * (lr - min_lr)
            }
        }
    }

    /// Checks the schedule: rates finite, `lr >= 0` (Constant); `lr >= min_lr >= 0` and
    /// `warmup_steps <= decay_steps` (Cosine).
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| {
            Err(Error::Invalid {
                op: "Schedule::validate",
                msg,
            })
        };
        match *self {
            Schedule::Constant { lr } => {
                if !(lr.is_finite() && lr >= 0.0) {
                    return bad(format!("constant learning rate {lr} must be finite and >= 0"));
                }
            }
            Schedule::Cosine {
                lr,
                warmup_steps,
                decay_steps,
                min_lr,
            } => {
                if !(lr.is_finite() && min_lr.is_finite()) {
                    return bad(format!("cosine schedule: lr {lr} and min_lr {min_lr} must be finite"));
                }
                if !(0.0 <= min_lr && min_lr <= lr) {
                    return bad(format!(
                        "cosine schedule: need lr >= min_lr >= 0, got lr {lr}, min_lr {min_lr}"
                    ));
                }
                if warmup_steps > decay_steps {
                    return bad(format!(
                        "cosine schedule: warmup_steps {warmup_steps} must be <= decay_steps {decay_steps}"
                    ));
                }
            }
        }
        Ok(())
    }
}
