//! The tree-structured Parzen estimator (Bergstra et al., NeurIPS 2011, section 4).
//!
//! After `startup` random trials, the ended trials are ranked (see [`super::ranked_indices`])
//! and split: the best `n_good = ceil(gamma n)` (`gamma`: 0.1 unless the sweep says, at most
//! 25, at least 1) make `l(x)`, the rest `g(x)`, each side in trial order (the estimators
//! weigh older trials less past 25), one estimator of each per parameter ([`Parzen`] for
//! numeric parameters, [`Categorical`] for listed values). Expected improvement is monotone in
//! `l(x) / g(x)` (the paper's equation 3 onward), so each parameter takes, among `CANDIDATES`
//! draws from its `l`, the one with the largest `log l(x) - log g(x)`. The parameters are
//! independent, as in the paper's flat spaces (Optuna's `multivariate=False`; its default
//! before Optuna 5).
//!
//! Multivariate (`[sweep] multivariate = true`): `l` and `g` are each one joint estimator over
//! every parameter ([`JointParzen`]); `CANDIDATES` whole points are drawn from `l` and the one
//! with the largest `log l(x) - log g(x)` is taken, so correlated parameters (a learning rate
//! and its momentum) are suggested together.

use super::joint::{Dim, JointParzen};
use super::{random, ranked_indices, Categorical, Observation, Outcome, Parzen, Sampler};
use crate::rng::Rng;
use crate::space::{Param, Space, Value};

/// Draws from `l` scored per parameter (Optuna's `n_ei_candidates` default).
const CANDIDATES: usize = 24;
/// The quantile of trials counted good, unless the sweep says (`[sweep] gamma`).
pub const GAMMA: f64 = 0.1;
/// The most trials counted good.
const MAX_GOOD: usize = 25;

/// TPE with `startup` random trials first.
#[derive(Debug, Clone)]
pub struct Tpe {
    seed: u64,
    startup: usize,
    multivariate: bool,
    gamma: f64,
}

impl Tpe {
    /// Independent estimators per parameter.
    pub fn new(seed: u64, startup: usize) -> Tpe {
        Tpe {
            seed,
            startup,
            multivariate: false,
            gamma: GAMMA,
        }
    }

    /// The quantile of trials counted good (in `(0, 1]`).
    pub fn with_gamma(self, gamma: f64) -> Tpe {
        Tpe { gamma, ..self }
    }

    /// One joint estimator over all parameters (multivariate TPE).
    pub fn multivariate(seed: u64, startup: usize) -> Tpe {
        Tpe {
            multivariate: true,
            ..Tpe::new(seed, startup)
        }
    }
}

/// How many of `n` ranked trials count as good with quantile `gamma`.
pub fn n_good(n: usize, gamma: f64) -> usize {
    ((gamma * n as f64).ceil() as usize).clamp(1, MAX_GOOD)
}

impl Sampler for Tpe {
    fn suggest(&mut self, trial: u64, space: &Space, history: &[Observation]) -> Option<Vec<Value>> {
        let mut rng = Rng::stream(self.seed, trial);
        let usable: Vec<Observation> = history
            .iter()
            .filter(|o| o.values.len() == space.params.len())
            .cloned()
            .collect();
        // trials still running (the constant liar) do not count towards the random start
        let ended = usable.iter().filter(|o| o.outcome != Outcome::Running).count();
        if ended < self.startup.max(2) {
            return Some(space.params.iter().map(|p| random::draw(p, &mut rng)).collect());
        }
        // the split by rank; each side in trial order (the history's), oldest first, which the
        // estimators weigh by
        let order = ranked_indices(&usable);
        let split = n_good(order.len(), self.gamma);
        let in_trial_order = |idx: &[usize]| -> Vec<&Observation> {
            let mut idx = idx.to_vec();
            idx.sort_unstable();
            idx.into_iter().map(|i| &usable[i]).collect()
        };
        let (good, bad) = (in_trial_order(&order[..split]), in_trial_order(&order[split..]));
        let (good, bad) = (good.as_slice(), bad.as_slice());
        if self.multivariate {
            return Some(suggest_joint(space, good, bad, &mut rng));
        }
        Some(
            space
                .params
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let column = |set: &[&Observation]| -> Vec<Value> { set.iter().map(|o| o.values[i]).collect() };
                    suggest_one(p, &column(good), &column(bad), &mut rng)
                })
                .collect(),
        )
    }
}

/// Multivariate: the whole point drawn from the joint `l` (built from `good`) with the largest
/// `l / g`.
fn suggest_joint(space: &Space, good: &[&Observation], bad: &[&Observation], rng: &mut Rng) -> Vec<Value> {
    let dims: Vec<Dim> = space
        .params
        .iter()
        .map(|p| {
            let (lo, hi) = p.bounds();
            if p.is_categorical() {
                Dim::Choice { n: hi as usize }
            } else {
                Dim::Numeric { lo, hi }
            }
        })
        .collect();
    let point = |o: &Observation| -> Vec<f64> {
        space
            .params
            .iter()
            .zip(&o.values)
            .map(|(p, v)| match v {
                Value::Choice(c) => *c as f64,
                _ => p.internal(*v),
            })
            .collect()
    };
    // a recorded value that no longer fits its parameter (a value <= 0 of a parameter made
    // log-scaled since) has no place on its scale: that trial is left out
    let points = |set: &[&Observation]| -> Vec<Vec<f64>> {
        set.iter()
            .map(|o| point(o))
            .filter(|p| p.iter().all(|x| x.is_finite()))
            .collect()
    };
    let l = JointParzen::new(&points(good), &dims);
    let g = JointParzen::new(&points(bad), &dims);
    // a candidate is scored where it lands once rounded to each parameter's steps
    let value = |p: &Param, x: f64| {
        if p.is_categorical() {
            Value::Choice(x.round().max(0.0) as usize)
        } else {
            p.from_internal(x)
        }
    };
    let landed = |x: &[f64]| -> Vec<f64> {
        space
            .params
            .iter()
            .zip(x)
            .map(|(p, &x)| match value(p, x) {
                Value::Choice(c) => c as f64,
                v => p.internal(v),
            })
            .collect()
    };
    let best = (0..CANDIDATES)
        .map(|_| l.sample(rng))
        .map(|x| {
            let at = landed(&x);
            (l.log_pdf(&at) - g.log_pdf(&at), x)
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, x)| x)
        .unwrap_or_default();
    space.params.iter().zip(best).map(|(p, x)| value(p, x)).collect()
}

/// The candidate drawn from `l` (built from `good`) with the largest `l / g`.
fn suggest_one(param: &Param, good: &[Value], bad: &[Value], rng: &mut Rng) -> Value {
    if param.is_categorical() {
        let n = param.bounds().1 as usize;
        let index = |v: &Value| match v {
            Value::Choice(c) => (*c).min(n - 1),
            _ => 0,
        };
        let l = Categorical::new(&good.iter().map(index).collect::<Vec<_>>(), n);
        let g = Categorical::new(&bad.iter().map(index).collect::<Vec<_>>(), n);
        let best = (0..CANDIDATES)
            .map(|_| l.sample(rng))
            .max_by(|a, b| (l.log_pmf(*a) - g.log_pmf(*a)).total_cmp(&(l.log_pmf(*b) - g.log_pmf(*b))))
            .unwrap_or(0);
        return Value::Choice(best);
    }
    let (lo, hi) = param.bounds();
    // values that no longer fit the parameter's scale (not finite there) are left out
    let points = |set: &[Value]| -> Vec<f64> {
        set.iter()
            .map(|v| param.internal(*v))
            .filter(|x| x.is_finite())
            .collect()
    };
    let l = Parzen::new(&points(good), lo, hi);
    let g = Parzen::new(&points(bad), lo, hi);
    // a candidate is scored where it lands once rounded to the parameter's steps
    let score = |x: f64| {
        let at = param.internal(param.from_internal(x));
        l.log_pdf(at) - g.log_pdf(at)
    };
    let best = (0..CANDIDATES)
        .map(|_| l.sample(rng))
        .max_by(|a, b| score(*a).total_cmp(&score(*b)))
        .unwrap_or(0.5 * (lo + hi));
    param.from_internal(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::Random;

    fn space(text: &str) -> Space {
        Space::from_toml(&text.parse::<toml::Table>().unwrap(), "s").unwrap()
    }

    /// The best value `sampler` finds of `f` in `budget` sequential trials.
    fn best_of(sampler: &mut dyn Sampler, space: &Space, budget: u64, f: &dyn Fn(&[f64]) -> f64) -> f64 {
        let mut history: Vec<Observation> = Vec::new();
        for trial in 0..budget {
            let values = sampler.suggest(trial, space, &history).unwrap();
            let x: Vec<f64> = values
                .iter()
                .map(|v| match v {
                    Value::Float(x) => *x,
                    Value::Int(i) => *i as f64,
                    Value::Choice(c) => *c as f64,
                })
                .collect();
            history.push(Observation {
                values,
                outcome: Outcome::Finished(f(&x)),
            });
        }
        history
            .iter()
            .map(|o| match o.outcome {
                Outcome::Finished(v) => v,
                Outcome::Pruned { value, .. } => value,
                Outcome::Running => f64::INFINITY,
            })
            .fold(f64::INFINITY, f64::min)
    }

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    /// Seeds [`compare`] runs. The bar is a better median and at least 60% of the seeds
    /// (18): a sampler that beats random search on 70% of seeds clears it with probability
    /// 0.92 (with 9 seeds and 6 wins asked, 0.73: one changed draw could flip the test).
    const SEEDS: u64 = 30;

    /// Over [`SEEDS`] seeds: TPE's median best value, random search's, and the seeds where
    /// TPE's best is at least as good.
    fn compare(space: &Space, budget: u64, f: &dyn Fn(&[f64]) -> f64) -> (f64, f64, usize) {
        let seeds = 0..SEEDS;
        let mut tpe = Vec::new();
        let mut rnd = Vec::new();
        let mut wins = 0;
        for seed in seeds {
            let t = best_of(&mut Tpe::new(seed, 10), space, budget, f);
            let r = best_of(&mut Random::new(seed + 1000), space, budget, f);
            wins += usize::from(t <= r);
            tpe.push(t);
            rnd.push(r);
        }
        (median(tpe), median(rnd), wins)
    }

    #[test]
    fn tpe_beats_random_search_on_a_1d_log_scaled_bowl() {
        // a learning-rate-like optimum at 3e-3 on [1e-5, 1]: (log10 x - log10 3e-3)^2
        let s = space("\"optim.lr\" = { distribution = \"log_uniform\", min = 1e-5, max = 1.0 }");
        let f = |x: &[f64]| (x[0].log10() - 3e-3f64.log10()).powi(2);
        let (tpe, rnd, wins) = compare(&s, 40, &f);
        assert!(tpe < rnd && wins >= 18, "tpe {tpe} random {rnd} wins {wins}/{SEEDS}");
        assert!(tpe < 0.01, "tpe {tpe}");
    }

    /// Branin's space, `[-5, 10] x [0, 15]`.
    fn branin_space() -> Space {
        space(
            "\"a.x\" = { distribution = \"uniform\", min = -5.0, max = 10.0 }\n\
             \"a.y\" = { distribution = \"uniform\", min = 0.0, max = 15.0 }\n",
        )
    }

    /// Branin's function: minimum 0.397887 at three points.
    fn branin(v: &[f64]) -> f64 {
        let (x, y) = (v[0], v[1]);
        let pi = std::f64::consts::PI;
        let b = 5.1 / (4.0 * pi * pi);
        (y - b * x * x + 5.0 / pi * x - 6.0).powi(2) + 10.0 * (1.0 - 1.0 / (8.0 * pi)) * x.cos() + 10.0
    }

    #[test]
    fn tpe_beats_random_search_on_2d_branin() {
        // Branin on [-5, 10] x [0, 15]: minimum 0.397887 at three points
        let s = branin_space();
        let (tpe, rnd, wins) = compare(&s, 60, &branin);
        assert!(tpe < rnd && wins >= 18, "tpe {tpe} random {rnd} wins {wins}/{SEEDS}");
        assert!(tpe < 1.0, "tpe {tpe}");
    }

    #[test]
    fn multivariate_tpe_beats_random_search_on_branin_and_choices() {
        // a good split of a quarter: with the default tenth (6 good trials of 60 at most) the
        // joint estimator still has the better median here (0.546 against 0.712) but wins only
        // 5 of the 9 seeds
        let s = branin_space();
        let (mut joint, mut rnd, mut wins) = (Vec::new(), Vec::new(), 0);
        for seed in 0..9u64 {
            let j = best_of(&mut Tpe::multivariate(seed, 10).with_gamma(0.25), &s, 60, &branin);
            let r = best_of(&mut Random::new(seed + 1000), &s, 60, &branin);
            wins += usize::from(j <= r);
            joint.push(j);
            rnd.push(r);
        }
        let (joint, rnd) = (median(joint), median(rnd));
        eprintln!("branin: multivariate {joint} random {rnd} wins {wins}/9");
        assert!(
            joint < rnd && wins >= 6 && joint < 1.0,
            "multivariate {joint} random {rnd} wins {wins}/9"
        );
        // a listed parameter and an integer, jointly: choice 2 with n = 13 is best
        let s = space(
            "\"m.kind\" = { values = [\"a\", \"b\", \"c\", \"d\"] }\n\
             \"m.n\" = { distribution = \"int_uniform\", min = 1, max = 20 }\n",
        );
        let f = |x: &[f64]| f64::from(x[0] != 2.0) + 0.1 * (x[1] - 13.0).abs();
        let (mut joint, mut rnd) = (Vec::new(), Vec::new());
        for seed in 0..9u64 {
            joint.push(best_of(&mut Tpe::multivariate(seed, 10), &s, 40, &f));
            rnd.push(best_of(&mut Random::new(seed + 1000), &s, 40, &f));
        }
        let (joint, rnd) = (median(joint), median(rnd));
        eprintln!("choices: multivariate {joint} random {rnd}");
        assert!(joint <= rnd && joint <= 0.1, "multivariate {joint} random {rnd}");
    }

    #[test]
    fn tpe_concentrates_on_the_good_choice_and_integer() {
        let s = space(
            "\"m.kind\" = { values = [\"a\", \"b\", \"c\", \"d\"] }\n\
             \"m.n\" = { distribution = \"int_uniform\", min = 1, max = 20 }\n",
        );
        // choice 2 and n = 13 are best
        let f = |x: &[f64]| f64::from(x[0] != 2.0) + 0.1 * (x[1] - 13.0).abs();
        let mut history = Vec::new();
        let mut tpe = Tpe::new(3, 10);
        let mut late = Vec::new();
        for trial in 0..60 {
            let values = tpe.suggest(trial, &s, &history).unwrap();
            let x: Vec<f64> = values
                .iter()
                .map(|v| match v {
                    Value::Int(i) => *i as f64,
                    Value::Choice(c) => *c as f64,
                    Value::Float(x) => *x,
                })
                .collect();
            if trial >= 40 {
                late.push(x.clone());
            }
            history.push(Observation {
                values,
                outcome: Outcome::Finished(f(&x)),
            });
        }
        let right_kind = late.iter().filter(|x| x[0] == 2.0).count();
        let near_n = late.iter().filter(|x| (x[1] - 13.0).abs() <= 2.0).count();
        assert!(right_kind >= 14, "{right_kind}/20 picked the best choice");
        assert!(near_n >= 10, "{near_n}/20 within 2 of the best integer");
    }

    #[test]
    fn the_split_takes_its_quantile_and_pruned_trials_rank_last() {
        assert_eq!(
            (n_good(1, 0.25), n_good(4, 0.25), n_good(5, 0.25), n_good(1000, 0.25)),
            (1, 1, 2, 25)
        );
        // the default, Optuna's split: a tenth
        assert_eq!(GAMMA, 0.1);
        assert_eq!((n_good(20, GAMMA), n_good(21, GAMMA), n_good(1000, GAMMA)), (2, 3, 25));
        let obs = |outcome| Observation {
            values: vec![],
            outcome,
        };
        let h = [
            obs(Outcome::Pruned { step: 4, value: 0.1 }),
            obs(Outcome::Finished(2.0)),
            obs(Outcome::Pruned { step: 16, value: 3.0 }),
            obs(Outcome::Finished(1.0)),
        ];
        let order: Vec<Outcome> = ranked_indices(&h).iter().map(|&i| h[i].outcome).collect();
        assert_eq!(order, [h[3].outcome, h[1].outcome, h[2].outcome, h[0].outcome]);
    }

    #[test]
    fn running_trials_steer_the_next_suggestions_away_from_their_points() {
        let s = space("\"a.x\" = { distribution = \"uniform\", min = 0.0, max = 1.0 }");
        let f = |x: f64| (x - 0.3) * (x - 0.3);
        // 30 ended trials spread over the range
        let history: Vec<Observation> = (0..30)
            .map(|i| {
                let x = (i as f64 + 0.5) / 30.0;
                Observation {
                    values: vec![Value::Float(x)],
                    outcome: Outcome::Finished(f(x)),
                }
            })
            .collect();
        // four trials running at the optimum
        let mut lying = history.clone();
        lying.extend((0..4).map(|_| Observation {
            values: vec![Value::Float(0.3)],
            outcome: Outcome::Running,
        }));
        let near = |h: &[Observation]| {
            let mut tpe = Tpe::new(5, 10);
            (30..130u64)
                .filter(|&t| match tpe.suggest(t, &s, h).unwrap()[0] {
                    Value::Float(x) => (x - 0.3).abs() < 0.02,
                    _ => false,
                })
                .count()
        };
        let (alone, with_liars) = (near(&history), near(&lying));
        assert!(
            alone >= 20,
            "{alone} of 100 suggestions near the optimum without running trials"
        );
        assert!(
            with_liars * 2 < alone,
            "{with_liars} of 100 near the running trials' point, {alone} without them"
        );
        // running trials rank last and do not count towards the random start
        let order: Vec<Outcome> = ranked_indices(&lying).iter().map(|&i| lying[i].outcome).collect();
        assert!(order[30..].iter().all(|o| *o == Outcome::Running));
        let starting: Vec<Observation> = lying[..5].iter().chain(&lying[30..]).cloned().collect();
        let draws: Vec<Vec<Value>> = (0..3)
            .map(|t| Tpe::new(5, 8).suggest(t, &s, &starting).unwrap())
            .collect();
        let random: Vec<Vec<Value>> = (0..3).map(|t| Tpe::new(5, 8).suggest(t, &s, &[]).unwrap()).collect();
        assert_eq!(draws, random, "5 ended + 4 running is still the random start of 8");
    }
}
