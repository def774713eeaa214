//! Hyperband (Li et al., "Hyperband: A Novel Bandit-Based Approach to Hyperparameter
//! Optimization", JMLR 2018, algorithm 1) run as brackets of asynchronous successive halving
//! (the ASHA paper's section 3.3, and Optuna's `HyperbandPruner`).
//!
//! With `s_max = floor(log_eta(max_steps / min_steps))`, bracket `b` (0 to `s_max`) is an
//! [`Asha`] whose first rung is at `min_steps * eta^b`: bracket 0 prunes hardest, bracket
//! `s_max` hardly at all. Trials are dealt to brackets in proportion to Hyperband's `n_s =
//! ceil((s_max + 1) eta^s / (s + 1))` configurations per bracket (`s = s_max - b`), by trial
//! number: trial `t` goes to the bracket that owns slot `t mod sum(n_s)`. A trial is compared
//! only with the trials of its own bracket.

use super::{Asha, Decision, Pruner};

/// Brackets of ASHA with different first rungs.
#[derive(Debug, Clone)]
pub struct Hyperband {
    brackets: Vec<Asha>,
    /// Slots per bracket, in bracket order.
    weights: Vec<u64>,
}

impl Hyperband {
    pub fn new(min_steps: u64, eta: u64, max_steps: u64) -> Hyperband {
        let (min_steps, eta) = (min_steps.max(1), eta.max(2));
        let mut s_max = 0u32;
        while min_steps.saturating_mul(eta.saturating_pow(s_max + 1)) <= max_steps {
            s_max += 1;
        }
        let brackets = (0..=s_max)
            .map(|b| Asha::new(min_steps.saturating_mul(eta.saturating_pow(b)), eta, max_steps))
            .collect();
        let weights = (0..=s_max)
            .map(|b| {
                let s = s_max - b;
                ((s_max as f64 + 1.0) * (eta as f64).powi(s as i32) / (s as f64 + 1.0)).ceil() as u64
            })
            .collect();
        Hyperband { brackets, weights }
    }

    /// The bracket trial `trial` belongs to.
    pub fn bracket_of(&self, trial: u64) -> usize {
        let mut slot = trial % self.weights.iter().sum::<u64>();
        for (b, w) in self.weights.iter().enumerate() {
            if slot < *w {
                return b;
            }
            slot -= w;
        }
        self.weights.len() - 1
    }

    /// The brackets, most aggressive first.
    pub fn brackets(&self) -> &[Asha] {
        &self.brackets
    }
}

impl Pruner for Hyperband {
    fn report(&mut self, trial: u64, step: u64, value: f64) -> Decision {
        let b = self.bracket_of(trial);
        match self.brackets[b].report(trial, step, value) {
            Decision::Prune(why) => Decision::Prune(format!("bracket {b}: {why}")),
            Decision::Continue => Decision::Continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_start_at_growing_rungs_and_get_hyperbands_shares() {
        // min 1, eta 3, 27 steps: s_max = 3, brackets' first rungs at 1, 3, 9, 27 (the last has none)
        let h = Hyperband::new(1, 3, 27);
        let firsts: Vec<Option<u64>> = h
            .brackets()
            .iter()
            .map(|a| (a.rungs() > 0).then(|| a.rung_step(0)))
            .collect();
        assert_eq!(firsts, [Some(1), Some(3), Some(9), None]);
        // n_s for s = 3, 2, 1, 0: ceil(4 * 27 / 4), ceil(4 * 9 / 3), ceil(4 * 3 / 2), ceil(4 / 1)
        assert_eq!(h.weights, [27, 12, 6, 4]);
        assert_eq!(
            (
                h.bracket_of(0),
                h.bracket_of(26),
                h.bracket_of(27),
                h.bracket_of(45),
                h.bracket_of(49)
            ),
            (0, 0, 1, 3, 0)
        );
    }

    #[test]
    fn trials_are_judged_only_within_their_bracket() {
        let mut h = Hyperband::new(1, 2, 4); // s_max = 2; brackets' rungs: {1, 2}, {2}, {} (4 is the end)
        assert_eq!(h.weights, [4, 3, 3]);
        // trials 0..3 are bracket 0, 4..6 bracket 1, 7..9 bracket 2
        assert_eq!(h.report(0, 1, 1.0), Decision::Continue);
        assert!(matches!(h.report(1, 1, 2.0), Decision::Prune(w) if w.starts_with("bracket 0: rung 0")));
        // bracket 1's first trial is alone at its rung (step 2), however bad
        assert_eq!(h.report(4, 1, 9.0), Decision::Continue);
        assert_eq!(h.report(4, 2, 9.0), Decision::Continue);
        assert!(matches!(h.report(5, 2, 9.5), Decision::Prune(w) if w.starts_with("bracket 1: rung 0 (step 2")));
        // bracket 2 never prunes
        assert_eq!(h.report(7, 3, 100.0), Decision::Continue);
    }
}
