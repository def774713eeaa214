//! The median stopping rule (Golovin et al., "Google Vizier", KDD 2017, section 3.2.2; Optuna's
//! `MedianPruner`): from `min_steps` on, a trial stops when its value at a step is worse than
//! the median of the other trials' values reported at that same step. Trials with no value at
//! that step do not count; with none, the trial goes on.

use std::collections::BTreeMap;

use super::{Decision, Pruner};

/// Every trial's reported values, by step.
#[derive(Debug, Clone, Default)]
pub struct Median {
    min_steps: u64,
    /// step -> trial -> value.
    at: BTreeMap<u64, BTreeMap<u64, f64>>,
}

impl Median {
    pub fn new(min_steps: u64) -> Median {
        Median {
            min_steps,
            at: BTreeMap::new(),
        }
    }
}

impl Pruner for Median {
    fn report(&mut self, trial: u64, step: u64, value: f64) -> Decision {
        let row = self.at.entry(step).or_default();
        row.insert(trial, value);
        if step < self.min_steps {
            return Decision::Continue;
        }
        let mut others: Vec<f64> = row.iter().filter(|(t, _)| **t != trial).map(|(_, v)| *v).collect();
        if others.is_empty() {
            return Decision::Continue;
        }
        others.sort_by(f64::total_cmp);
        let n = others.len();
        let median = if n % 2 == 1 {
            others[n / 2]
        } else {
            0.5 * (others[n / 2 - 1] + others[n / 2])
        };
        if value > median || value.is_nan() {
            Decision::Prune(format!(
                "step {step}: {value} is worse than the median {median} of {n} other trials there"
            ))
        } else {
            Decision::Continue
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trial_worse_than_the_median_at_a_step_stops() {
        let c = Decision::Continue;
        let mut m = Median::new(2);
        // before min_steps nothing stops, however bad
        assert_eq!(m.report(0, 1, 1.0), c);
        assert_eq!(m.report(1, 1, 9.0), c);
        // at step 2: trial 0 alone goes on; trial 1 (2.0) against trial 0 alone (1.0) stops
        assert_eq!(m.report(0, 2, 1.0), c);
        assert!(matches!(m.report(1, 2, 2.0), Decision::Prune(_)));
        // trial 2 at 1.5: others 1.0 and 2.0, median 1.5 -> not worse, goes on
        assert_eq!(m.report(2, 2, 1.5), c);
        // trial 3 at 1.6: others 1.0, 2.0, 1.5 -> median 1.5 -> stops
        assert!(matches!(m.report(3, 2, 1.6), Decision::Prune(w) if w.contains("median 1.5 of 3")));
        // a step nobody else reported: goes on
        assert_eq!(m.report(3, 7, 99.0), c);
    }
}
