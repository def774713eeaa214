//! Asynchronous successive halving (Li et al., "A System for Massively Parallel Hyperparameter
//! Tuning", MLSys 2020, algorithm 2), in its stopping form (as Ray Tune's ASHA and Optuna's
//! `SuccessiveHalvingPruner` run it).
//!
//! Rung `k` sits at `min_steps * eta^k` training steps (`eta`: the reduction factor), for every
//! such step below `max_steps`. A trial's value at a rung is the first value it reports at a
//! step at or past the rung. When a trial reaches a rung, its value joins those recorded there
//! (by every trial, pruned ones included) and it goes on only if it is in the top `1/eta` of
//! them: fewer than `max(1, floor(n / eta))` of the `n` values are strictly better. Asynchronous:
//! each trial is judged once per rung, against the trials that got there before it.

use std::collections::{BTreeMap, BTreeSet};

use super::{Decision, Pruner};

/// ASHA's rungs and the values recorded at them.
#[derive(Debug, Clone)]
pub struct Asha {
    min_steps: u64,
    eta: u64,
    max_steps: u64,
    /// Per rung: trial -> its value there.
    rungs: Vec<BTreeMap<u64, f64>>,
    /// Trials already judged at each rung.
    seen: Vec<BTreeSet<u64>>,
}

impl Asha {
    /// Rungs at `min_steps * eta^k` below `max_steps` (`min_steps >= 1`, `eta >= 2`).
    pub fn new(min_steps: u64, eta: u64, max_steps: u64) -> Asha {
        let mut n = 0;
        let mut at = min_steps.max(1);
        while at < max_steps {
            n += 1;
            at = match at.checked_mul(eta.max(2)) {
                Some(a) => a,
                None => break,
            };
        }
        Asha {
            min_steps: min_steps.max(1),
            eta: eta.max(2),
            max_steps,
            rungs: vec![BTreeMap::new(); n],
            seen: vec![BTreeSet::new(); n],
        }
    }

    /// The training step of rung `k`.
    pub fn rung_step(&self, k: usize) -> u64 {
        self.min_steps.saturating_mul(self.eta.saturating_pow(k as u32))
    }

    /// How many rungs there are (those below `max_steps`).
    pub fn rungs(&self) -> usize {
        self.rungs.len()
    }

    /// The values recorded at rung `k`, by trial.
    pub fn recorded(&self, k: usize) -> &BTreeMap<u64, f64> {
        &self.rungs[k]
    }
}

impl Pruner for Asha {
    fn report(&mut self, trial: u64, step: u64, value: f64) -> Decision {
        for k in 0..self.rungs.len() {
            let at = self.rung_step(k);
            if step < at || self.seen[k].contains(&trial) {
                continue;
            }
            self.seen[k].insert(trial);
            self.rungs[k].insert(trial, value);
            let values = &self.rungs[k];
            let n = values.len();
            let keep = (n / self.eta as usize).max(1);
            let better = values.values().filter(|v| **v < value).count();
            if better >= keep || value.is_nan() {
                return Decision::Prune(format!(
                    "rung {k} (step {at} of {}): {value} is not in the top 1/{} of the {n} values there ({better} better, {keep} go on)",
                    self.max_steps, self.eta
                ));
            }
        }
        Decision::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rungs_sit_at_min_steps_times_powers_of_eta_below_the_end() {
        let a = Asha::new(2, 3, 60);
        assert_eq!(a.rungs(), 4);
        assert_eq!(
            (a.rung_step(0), a.rung_step(1), a.rung_step(2), a.rung_step(3)),
            (2, 6, 18, 54)
        );
        assert_eq!(Asha::new(2, 3, 54).rungs(), 3); // 54 is the end
        assert_eq!(Asha::new(1, 4, 64).rungs(), 3); // 1, 4, 16 (64 is the end)
        assert_eq!(Asha::new(100, 2, 50).rungs(), 0);
    }

    #[test]
    fn a_scripted_sequence_promotes_and_stops_as_the_rungs_say() {
        // eta = 2, rungs at steps 1, 2, 4 (8 is the end)
        let mut a = Asha::new(1, 2, 8);
        let c = Decision::Continue;
        let stopped = |d: &Decision| matches!(d, Decision::Prune(_));
        // rung 0: trial 0 alone goes on; trial 1 (worse, n = 2, keep 1) stops; trial 2 (best) goes on
        assert_eq!(a.report(0, 1, 5.0), c);
        assert!(stopped(&a.report(1, 1, 6.0)));
        assert_eq!(a.report(2, 1, 4.0), c);
        // trial 3: n = 4, keep 2, two values better (4, 5) -> stops; trial 4 ties the best -> on
        assert!(stopped(&a.report(3, 1, 5.5)));
        assert_eq!(a.report(4, 1, 4.0), c);
        // a report between rungs decides nothing new
        assert_eq!(a.report(0, 1, 5.0), c);
        // rung 1 (step 2): trial 2 first, then trial 0 is worse -> stops; trial 4 better -> on
        assert_eq!(a.report(2, 2, 3.0), c);
        assert!(stopped(&a.report(0, 2, 3.5)));
        assert_eq!(a.report(4, 2, 2.5), c);
        // a report that jumps past rung 2 (step 4) is judged there with the value it brings
        assert_eq!(a.report(4, 6, 2.0), c);
        assert!(stopped(&a.report(2, 5, 2.9)));
        assert_eq!(a.recorded(0).len(), 5);
        assert_eq!(a.recorded(1).len(), 3);
        assert_eq!(a.recorded(2).keys().copied().collect::<Vec<_>>(), [2, 4]);
        let Decision::Prune(why) = a.report(9, 4, 9.0) else {
            panic!()
        };
        assert!(why.starts_with("rung 0 (step 1 of 8)"), "{why}");
    }

    #[test]
    fn a_trial_stopped_at_a_rung_is_not_recorded_at_the_next() {
        let mut a = Asha::new(1, 2, 100);
        assert_eq!(a.report(0, 1, 1.0), Decision::Continue);
        // trial 1 jumps to step 3 (past rungs 0 and 1), fails rung 0 and stops there
        assert!(matches!(a.report(1, 3, 2.0), Decision::Prune(_)));
        assert!(a.recorded(1).is_empty());
    }
}
