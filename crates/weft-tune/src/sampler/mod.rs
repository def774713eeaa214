//! Samplers: what each trial's parameters are, given the space and the trials so far.
//!
//! Trial `n` draws from its own random stream (`Rng::stream(seed, n)`), so a random or grid
//! sweep gives trial `n` the same parameters however many trials run at once, and a resumed
//! sweep gives a re-run trial the parameters it would have had.

mod grid;
mod joint;
mod parzen;
mod random;
mod tpe;

pub use grid::Grid;
pub use parzen::{normal_cdf, Categorical, Parzen};
pub use random::Random;
pub use tpe::{Tpe, GAMMA};

use crate::space::{Space, Value};
use crate::spec::{Method, SweepSpec};

/// How a trial ended, as the samplers see it. Values are losses: lower is better (a maximized
/// metric is negated before it gets here).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// Ran to the end; its metric's last value.
    Finished(f64),
    /// Stopped by the pruner after `step` training steps, its metric then `value`.
    Pruned { step: u64, value: f64 },
    /// Started and not ended yet: counted worse than every ended trial (the "constant liar" of
    /// Ginsbourger et al., as Optuna's `TPESampler(constant_liar=True)`), so that trials started
    /// while others run are steered away from the points those are trying.
    Running,
}

/// A trial that ended, with the values it was given (one per parameter of the space, in order).
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub values: Vec<Value>,
    pub outcome: Outcome,
}

/// Picks the parameters of trial `trial` (0-based).
pub trait Sampler {
    /// The values for trial `trial` (one per parameter, in order), or `None` when the sampler
    /// has nothing left to give (a grid that is done). `history` is in trial order, oldest
    /// first (the driver's: ended trials by number, then the running ones): TPE weighs a long
    /// sweep's older trials less.
    fn suggest(&mut self, trial: u64, space: &Space, history: &[Observation]) -> Option<Vec<Value>>;
}

/// The sampler `spec.method` names.
pub fn from_spec(spec: &SweepSpec) -> Box<dyn Sampler + Send> {
    match spec.method {
        Method::Tpe if spec.multivariate => {
            Box::new(Tpe::multivariate(spec.seed, spec.startup_trials as usize).with_gamma(spec.gamma))
        }
        Method::Tpe => Box::new(Tpe::new(spec.seed, spec.startup_trials as usize).with_gamma(spec.gamma)),
        Method::Random => Box::new(Random::new(spec.seed)),
        Method::Grid => Box::new(Grid),
    }
}

/// The indices of `history`, best first: finished trials by value, then pruned ones, those
/// that got further first and then by value (Optuna ranks pruned trials the same way), then
/// running ones; a tie keeps the earlier trial first.
pub fn ranked_indices(history: &[Observation]) -> Vec<usize> {
    let key = |o: &Observation| match o.outcome {
        Outcome::Finished(v) => (0, 0, v),
        Outcome::Pruned { step, value } => (1, u64::MAX - step, value),
        Outcome::Running => (2, 0, 0.0),
    };
    let mut out: Vec<usize> = (0..history.len()).collect();
    out.sort_by(|&a, &b| {
        let (ka, kb) = (key(&history[a]), key(&history[b]));
        (ka.0, ka.1).cmp(&(kb.0, kb.1)).then(ka.2.total_cmp(&kb.2))
    });
    out
}
