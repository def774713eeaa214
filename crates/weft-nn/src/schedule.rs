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
    /// Linear warmup from 0, then linear decay to `min_lr` at `decay_steps`, then `min_lr`
    /// (Hugging Face's `get_linear_schedule_with_warmup` when `min_lr = 0` and `decay_steps` is
    /// the number of training steps):
    ///
    /// ```text
    /// step <  warmup_steps:  lr (step / warmup_steps)
    /// step >= decay_steps:   min_lr
    /// otherwise:             min_lr + (lr - min_lr) ((decay_steps - step) / (decay_steps - warmup_steps))
    /// ```
    ///
    /// The first step (0) trains at rate 0 when there is warmup, as `LambdaLR` does.
    Linear {
        /// The peak learning rate, reached at `warmup_steps`.
        lr: f64,
        /// Steps of linear warmup.
        warmup_steps: usize,
        /// The step at which the decay reaches `min_lr`, counted from step 0.
        decay_steps: usize,
        /// The final learning rate.
        min_lr: f64,
    },
    /// Warmup-stable-decay: linear warmup from 0 as [`Schedule::Linear`], the constant rate
    /// `lr`, then a decay to `min_lr` over the last `decay_steps` steps before `total_steps`,
    /// then `min_lr`. With `start = total_steps - decay_steps` and `p = (step - start) /
    /// decay_steps`:
    ///
    /// ```text
    /// step <  warmup_steps:  lr (step / warmup_steps)
    /// step <  start:         lr
    /// step <  total_steps:   min_lr + (lr - min_lr) shape(p)
    /// otherwise:             min_lr
    /// ```
    ///
    /// Hugging Face's `get_wsd_schedule` when `min_lr = 0`.
    Wsd {
        /// The rate of the stable phase.
        lr: f64,
        /// Steps of linear warmup.
        warmup_steps: usize,
        /// Steps of decay, ending at `total_steps`.
        decay_steps: usize,
        /// The step at which the decay ends (the run's length by default).
        total_steps: usize,
        /// The final learning rate.
        min_lr: f64,
        /// The decay's shape.
        shape: DecayShape,
    },
}

/// The shape of [`Schedule::Wsd`]'s decay: the fraction of `lr - min_lr` left at progress
/// `p` in `[0, 1)` through the decay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DecayShape {
    /// `1 - p`.
    #[default]
    Linear,
    /// `0.5 (1 + cos(π p))`.
    Cosine,
    /// `1 - sqrt(p)` (Hugging Face's `"1-sqrt"`).
    Sqrt,
}

impl DecayShape {
    /// The shape named `name` (`"linear"`, `"cosine"` or `"sqrt"`).
    pub fn parse(name: &str) -> Option<DecayShape> {
        match name {
            "linear" => Some(DecayShape::Linear),
            "cosine" => Some(DecayShape::Cosine),
            "sqrt" => Some(DecayShape::Sqrt),
            _ => None,
        }
    }

    /// The fraction left at progress `p`.
    pub fn factor(self, p: f64) -> f64 {
        match self {
            DecayShape::Linear => 1.0 - p,
            DecayShape::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * p).cos()),
            DecayShape::Sqrt => 1.0 - p.sqrt(),
        }
    }
}

/// The warmup of [`Schedule::Linear`] and [`Schedule::Wsd`]: `lr (step / warmup_steps)`.
fn warmup(lr: f64, step: usize, warmup_steps: usize) -> f64 {
    lr * (step as f64 / warmup_steps as f64)
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
            Schedule::Linear {
                lr,
                warmup_steps,
                decay_steps,
                min_lr,
            } => {
                if step < warmup_steps {
                    return warmup(lr, step, warmup_steps);
                }
                if step >= decay_steps {
                    return min_lr;
                }
                let left = (decay_steps - step) as f64 / (decay_steps - warmup_steps) as f64;
                min_lr + (lr - min_lr) * left
            }
            Schedule::Wsd {
                lr,
                warmup_steps,
                decay_steps,
                total_steps,
                min_lr,
                shape,
            } => {
                if step < warmup_steps {
                    return warmup(lr, step, warmup_steps);
                }
                let start = total_steps - decay_steps;
                if step < start {
                    return lr;
                }
                if step >= total_steps {
                    return min_lr;
                }
                let p = (step - start) as f64 / decay_steps as f64;
                min_lr + (lr - min_lr) * shape.factor(p)
            }
        }
    }

    /// Checks the schedule: rates finite, `lr >= 0` (Constant); `lr >= min_lr >= 0` and
    /// `warmup_steps <= decay_steps` (Cosine, Linear); `lr >= min_lr >= 0` and `warmup_steps +
    /// decay_steps <= total_steps` (Wsd). Errors name the offending key.
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
            }
            | Schedule::Linear {
                lr,
                warmup_steps,
                decay_steps,
                min_lr,
            } => {
                let kind = if matches!(self, Schedule::Cosine { .. }) {
                    "cosine"
                } else {
                    "linear"
                };
                check_rates(kind, lr, min_lr)?;
                if warmup_steps > decay_steps {
                    return bad(format!(
                        "{kind} schedule: warmup_steps {warmup_steps} must be <= decay_steps {decay_steps}"
                    ));
                }
            }
            Schedule::Wsd {
                lr,
                warmup_steps,
                decay_steps,
                total_steps,
                min_lr,
                ..
            } => {
                check_rates("wsd", lr, min_lr)?;
                if warmup_steps.checked_add(decay_steps).is_none_or(|n| n > total_steps) {
                    return bad(format!(
                        "wsd schedule: warmup_steps {warmup_steps} + decay_steps {decay_steps} must be <= \
                         total_steps {total_steps}"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `lr` and `min_lr` finite with `lr >= min_lr >= 0`, for the schedule named `kind`.
fn check_rates(kind: &str, lr: f64, min_lr: f64) -> Result<()> {
    if !(lr.is_finite() && min_lr.is_finite() && 0.0 <= min_lr && min_lr <= lr) {
        return Err(Error::Invalid {
            op: "Schedule::validate",
            msg: format!("{kind} schedule: need finite lr >= min_lr >= 0, got lr {lr}, min_lr {min_lr}"),
        });
    }
    Ok(())
}
