//! The joint Parzen estimator of multivariate TPE: one product kernel per observed point (over
//! every parameter at once) plus a prior component, so that the candidates drawn from `l(x)`
//! and their scores keep the correlations between parameters that the independent estimators
//! of [`super::Parzen`] lose (Falkner, Klein and Hutter, "BOHB", ICML 2018, section 3.1; Optuna's
//! `TPESampler`, whose default it is for one objective since Optuna 5).
//!
//! A numeric dimension's kernel is a Gaussian truncated to the range. Its bandwidth is the
//! neighbour rule of the independent estimator, per dimension, as Optuna 5 computes it: each
//! point's deviation is the larger distance to its neighbours among the points' values in that
//! dimension, the range's ends counting as neighbours only while there is one point (the
//! outermost of two or more take the distance to the point inside them), clipped to
//! `[range / min(100, n + 2), range]` for `n` points. (BOHB, and Optuna before version 5, took
//! Scott's rule instead, one deviation for every point.) The prior component sits in the middle
//! of the range with the whole range as its deviation. A listed parameter's kernel puts weight
//! 1 on the observed choice plus `1 / (n + 1)` on every choice, normalised (the prior:
//! uniform). The points' kernels weigh by trial order ([`super::parzen::trial_weights`]), the
//! prior's 1. Values are on each parameter's internal scale (the log for `log_uniform`; a
//! choice's index).

use super::normal_cdf;
use crate::rng::Rng;

/// One dimension of the space.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dim {
    /// A numeric parameter on `[lo, hi]` (internal scale).
    Numeric { lo: f64, hi: f64 },
    /// One of `n` listed values.
    Choice { n: usize },
}

/// A mixture of product kernels over the dimensions `dims`.
#[derive(Debug, Clone)]
pub struct JointParzen {
    dims: Vec<Dim>,
    /// Component `c`'s centre in each dimension (a choice's index for listed parameters).
    centres: Vec<Vec<f64>>,
    /// Component `c`'s deviation in each numeric dimension (unused for listed ones).
    sigmas: Vec<Vec<f64>>,
    /// Component `c`'s mass inside each numeric dimension's range.
    mass: Vec<Vec<f64>>,
    /// Whether component `c` is the prior.
    prior: Vec<bool>,
    /// The points the estimator holds (its components but the prior).
    points: usize,
    /// Component `c`'s weight in the mixture: the points' by trial order
    /// ([`super::parzen::trial_weights`]), the prior's 1.
    weights: Vec<f64>,
}

impl JointParzen {
    /// The estimator of `points` (each one value per dimension of `dims`, internal scale).
    pub fn new(points: &[Vec<f64>], dims: &[Dim]) -> JointParzen {
        let n = points.len();
        let mut out = JointParzen {
            dims: dims.to_vec(),
            centres: Vec::with_capacity(n + 1),
            sigmas: Vec::with_capacity(n + 1),
            mass: Vec::with_capacity(n + 1),
            prior: Vec::with_capacity(n + 1),
            points: n,
            weights: super::parzen::trial_weights(n).into_iter().chain([1.0]).collect(),
        };
        let centre_of = |p: &Vec<f64>| -> Vec<f64> {
            dims.iter()
                .zip(p)
                .map(|(dim, &x)| match *dim {
                    Dim::Numeric { lo, hi } => x.clamp(lo, hi),
                    Dim::Choice { n } => x.round().clamp(0.0, n as f64 - 1.0),
                })
                .collect()
        };
        let centres: Vec<Vec<f64>> = points.iter().map(centre_of).collect();
        // each numeric dimension's deviations, point by point
        let by_dim: Vec<Vec<f64>> = dims
            .iter()
            .enumerate()
            .map(|(k, dim)| match *dim {
                Dim::Numeric { lo, hi } => {
                    super::parzen::neighbour_sigmas(&centres.iter().map(|c| c[k]).collect::<Vec<_>>(), lo, hi)
                }
                Dim::Choice { .. } => vec![0.0; n],
            })
            .collect();
        let mut push = |centre: Vec<f64>, point: Option<usize>| {
            let mut sigmas = Vec::with_capacity(dims.len());
            let mut mass = Vec::with_capacity(dims.len());
            for (k, dim) in dims.iter().enumerate() {
                match *dim {
                    Dim::Numeric { lo, hi } => {
                        let s = point.map_or(hi - lo, |i| by_dim[k][i]);
                        let mu = centre[k];
                        sigmas.push(s);
                        mass.push((normal_cdf((hi - mu) / s) - normal_cdf((lo - mu) / s)).max(1e-300));
                    }
                    Dim::Choice { .. } => {
                        sigmas.push(0.0);
                        mass.push(1.0);
                    }
                }
            }
            out.centres.push(centre);
            out.sigmas.push(sigmas);
            out.mass.push(mass);
            out.prior.push(point.is_none());
        };
        for (i, centre) in centres.into_iter().enumerate() {
            push(centre, Some(i));
        }
        let middle = dims
            .iter()
            .map(|dim| match *dim {
                Dim::Numeric { lo, hi } => 0.5 * (lo + hi),
                Dim::Choice { .. } => 0.0,
            })
            .collect();
        push(middle, None);
        out
    }

    /// A draw: a component by weight, then each dimension from its kernel.
    pub fn sample(&self, rng: &mut Rng) -> Vec<f64> {
        let c = rng.weighted(&self.weights);
        self.dims
            .iter()
            .enumerate()
            .map(|(k, dim)| match *dim {
                Dim::Numeric { lo, hi } => {
                    let (mu, s) = (self.centres[c][k], self.sigmas[c][k]);
                    // redrawn until inside the range (clamped after 100 misses, which the
                    // masses make vanishingly rare)
                    for _ in 0..100 {
                        let x = mu + s * rng.normal();
                        if (lo..=hi).contains(&x) {
                            return x;
                        }
                    }
                    mu.clamp(lo, hi)
                }
                Dim::Choice { n } => rng.weighted(&self.choice_weights(c, self.centres[c][k], n)) as f64,
            })
            .collect()
    }

    /// Component `c`'s weights over the `n` choices of a listed dimension where its centre is
    /// `centre`: `1 / (points + 1)` on each, 1 more on the centre (the prior: uniform).
    fn choice_weights(&self, c: usize, centre: f64, n: usize) -> Vec<f64> {
        let mut w = vec![1.0 / (self.points + 1) as f64; n];
        if !self.prior[c] {
            w[(centre as usize).min(n - 1)] += 1.0;
        }
        w
    }

    /// The log density at `x` (one value per dimension).
    pub fn log_pdf(&self, x: &[f64]) -> f64 {
        let logs: Vec<f64> = (0..self.centres.len())
            .map(|c| {
                self.dims
                    .iter()
                    .enumerate()
                    .map(|(k, dim)| match *dim {
                        Dim::Numeric { .. } => {
                            let s = self.sigmas[c][k];
                            let z = (x[k] - self.centres[c][k]) / s;
                            -0.5 * z * z - (s * std::f64::consts::TAU.sqrt()).ln() - self.mass[c][k].ln()
                        }
                        Dim::Choice { n } => {
                            let w = self.choice_weights(c, self.centres[c][k], n);
                            let i = (x[k].round().max(0.0) as usize).min(n - 1);
                            (w[i] / w.iter().sum::<f64>()).ln()
                        }
                    })
                    .sum()
            })
            .collect();
        let total: f64 = self.weights.iter().sum();
        let logs: Vec<f64> = logs
            .iter()
            .zip(&self.weights)
            .map(|(l, w)| l + (w / total).ln())
            .collect();
        let top = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = logs.iter().map(|l| (l - top).exp()).sum();
        (top + sum.ln()).max(-690.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each numeric dimension's kernels take that dimension's neighbour-rule deviations (as
    /// Optuna 5 does), not one deviation for all points; the prior the whole range.
    #[test]
    fn each_dimension_takes_its_own_neighbour_rule() {
        let pts = vec![vec![0.9, 2.0], vec![0.02, 8.0], vec![0.6, 4.0], vec![0.3, 6.5]];
        let dims = [Dim::Numeric { lo: 0.0, hi: 1.0 }, Dim::Numeric { lo: 0.0, hi: 10.0 }];
        let p = JointParzen::new(&pts, &dims);
        for k in 0..2 {
            let column: Vec<f64> = pts.iter().map(|q| q[k]).collect();
            let (lo, hi) = [(0.0, 1.0), (0.0, 10.0)][k];
            let want = super::super::parzen::neighbour_sigmas(&column, lo, hi);
            let got: Vec<f64> = p.sigmas[..4].iter().map(|s| s[k]).collect();
            assert_eq!(got, want, "dimension {k}");
            assert_eq!(p.sigmas[4][k], hi - lo);
        }
        // the second dimension by hand: 2 and 8 outermost (2 to the 4 inside, 1.5 to the 6.5
        // raised to 10 / 6), 4 and 6.5 the larger gap (2.5): not the first's in proportion
        let want = [2.0, 10.0 / 6.0, 2.5, 2.5];
        assert!(
            p.sigmas[..4].iter().zip(want).all(|(s, w)| (s[1] - w).abs() < 1e-12),
            "{:?}",
            p.sigmas
        );
    }

    /// The multivariate estimator gives the same deviations and log densities as Optuna 5's
    /// (multivariate, its default), on every case of the fixture: one dimension, two numeric
    /// ones, and a listed one beside a numeric one.
    #[test]
    fn the_joint_estimator_is_optunas() {
        use super::super::parzen::tests::{floats, optuna_cases};
        let cases = optuna_cases();
        for case in &cases {
            let name = case["name"].as_str().unwrap();
            let dims: Vec<Dim> = case["dims"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| match d.get("choices") {
                    Some(n) => Dim::Choice {
                        n: n.as_integer().unwrap() as usize,
                    },
                    None => Dim::Numeric {
                        lo: floats(&d["lo"])[0],
                        hi: floats(&d["hi"])[0],
                    },
                })
                .collect();
            let rows = |key: &str| -> Vec<Vec<f64>> { case[key].as_array().unwrap().iter().map(floats).collect() };
            let p = JointParzen::new(&rows("observations"), &dims);
            // the numeric dimensions' deviations, in the fixture's order
            let numeric: Vec<usize> = (0..dims.len())
                .filter(|&k| matches!(dims[k], Dim::Numeric { .. }))
                .collect();
            for (j, want) in rows("sigmas").iter().enumerate() {
                let got: Vec<f64> = p.sigmas.iter().map(|s| s[numeric[j]]).collect();
                assert_eq!(got.len(), want.len(), "{name}");
                for (g, w) in got.iter().zip(want) {
                    assert!((g - w).abs() <= 1e-12 * w, "{name}: sigma {g} against Optuna's {w}");
                }
            }
            for (x, want) in rows("points").iter().zip(floats(&case["log_pdf"])) {
                let got = p.log_pdf(x);
                assert!(
                    (got - want).abs() < 1e-6,
                    "{name}: log density at {x:?}: {got} against Optuna's {want}"
                );
            }
        }
        assert_eq!(cases.len(), 9);
    }

    #[test]
    fn the_joint_mixture_is_a_density_and_keeps_correlations() {
        // points on the diagonal of the unit square
        let pts: Vec<Vec<f64>> = (0..8).map(|i| vec![0.1 + 0.1 * i as f64; 2]).collect();
        let dims = [Dim::Numeric { lo: 0.0, hi: 1.0 }; 2];
        let p = JointParzen::new(&pts, &dims);
        let n = 200;
        let mut integral = 0.0;
        for i in 0..n {
            for j in 0..n {
                let x = [(i as f64 + 0.5) / n as f64, (j as f64 + 0.5) / n as f64];
                integral += p.log_pdf(&x).exp();
            }
        }
        integral /= (n * n) as f64;
        assert!((integral - 1.0).abs() < 2e-3, "{integral}");
        // on the diagonal far likelier than off it, where independent marginals see no difference
        assert!(p.log_pdf(&[0.3, 0.3]) > p.log_pdf(&[0.3, 0.7]) + 1.0);
        let mut rng = Rng::new(5);
        let draws: Vec<Vec<f64>> = (0..2000).map(|_| p.sample(&mut rng)).collect();
        let near = draws.iter().filter(|x| (x[0] - x[1]).abs() < 0.15).count();
        // the independent estimators of the same points draw each coordinate on its own
        let column: Vec<f64> = pts.iter().map(|p| p[0]).collect();
        let (px, py) = (
            super::super::Parzen::new(&column, 0.0, 1.0),
            super::super::Parzen::new(&column, 0.0, 1.0),
        );
        let apart = (0..2000)
            .filter(|_| (px.sample(&mut rng) - py.sample(&mut rng)).abs() < 0.15)
            .count();
        assert!(
            near > apart + 150,
            "near the diagonal: joint {near}/2000, independent {apart}/2000"
        );
        assert!(draws.iter().flatten().all(|x| (0.0..=1.0).contains(x)));
    }

    #[test]
    fn a_listed_dimension_sums_to_one_and_follows_its_points() {
        let dims = [Dim::Choice { n: 3 }, Dim::Numeric { lo: 0.0, hi: 1.0 }];
        let p = JointParzen::new(&[vec![2.0, 0.2], vec![2.0, 0.25], vec![0.0, 0.9]], &dims);
        let n = 2000;
        let total: f64 = (0..3)
            .map(|c| {
                (0..n)
                    .map(|i| p.log_pdf(&[c as f64, (i as f64 + 0.5) / n as f64]).exp())
                    .sum::<f64>()
                    / n as f64
            })
            .sum();
        assert!((total - 1.0).abs() < 2e-3, "{total}");
        // choice 2 goes with small x, choice 0 with large
        assert!(p.log_pdf(&[2.0, 0.22]) > p.log_pdf(&[0.0, 0.22]));
        assert!(p.log_pdf(&[0.0, 0.9]) > p.log_pdf(&[2.0, 0.9]));
    }
}
