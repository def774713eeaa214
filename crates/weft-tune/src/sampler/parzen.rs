//! The Parzen estimators of TPE (Bergstra et al., "Algorithms for Hyper-Parameter
//! Optimization", NeurIPS 2011, section 4): a numeric parameter's density is a mixture of
//! Gaussians truncated to its range, one per observed point plus one prior component; a
//! categorical one's a mixture of smoothed kernels, one per observed choice plus a uniform one.
//! The observations' kernels are weighted by [`trial_weights`] (all 1 up to 25 of them; past
//! that the older ones less), the prior's by 1, as in Optuna 5.
//!
//! Bandwidths follow the neighbour rule as Optuna 5 computes it
//! ([`neighbour_sigmas`]): each point's standard deviation is the larger distance
//! to its neighbours among the sorted points, the range's ends counting as neighbours only
//! while there is one point (the outermost of two or more take the distance to the point inside
//! them), clipped to `[range / min(100, n + 2), range]` for `n` points (`n + 1` kernels with
//! the prior's); the prior component is centred in the range with the whole range as its
//! standard deviation. (hyperopt, the paper's code, also counts the prior's centre as a
//! neighbour.) All of it on the parameter's internal scale (the log for `log_uniform`).

use crate::rng::Rng;

/// Weight of the prior component relative to one observation.
const PRIOR_WEIGHT: f64 = 1.0;

/// Φ, the standard normal CDF (erfc after Numerical Recipes' Chebyshev fit: relative error
/// below 1.2e-7 everywhere).
pub fn normal_cdf(z: f64) -> f64 {
    let x = -z / std::f64::consts::SQRT_2;
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.5 * a);
    let poly = -a * a - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    0.5 * if x >= 0.0 { erfc } else { 2.0 - erfc }
}

/// Each of `values`' deviation by the neighbour rule on `[lo, hi]`: the larger distance to its
/// neighbours among the sorted values, the ends `lo` and `hi` counting as neighbours only when
/// there is a single value, clipped to `[range / min(100, n + 2), range]`.
pub(super) fn neighbour_sigmas(values: &[f64], lo: f64, hi: f64) -> Vec<f64> {
    let (n, range) = (values.len(), hi - lo);
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let sorted: Vec<f64> = order.iter().map(|&i| values[i]).collect();
    let min_sigma = range / (100.0f64).min(n as f64 + 2.0);
    let mut out = vec![range; n];
    for (rank, &i) in order.iter().enumerate() {
        let left = if rank > 0 {
            sorted[rank] - sorted[rank - 1]
        } else {
            sorted[rank] - lo
        };
        let right = if rank + 1 < n {
            sorted[rank + 1] - sorted[rank]
        } else {
            hi - sorted[rank]
        };
        let sigma = match (n, rank) {
            (1, _) => left.max(right),
            (_, 0) => right,
            (_, r) if r + 1 == n => left,
            _ => left.max(right),
        };
        out[i] = sigma.clamp(min_sigma, range);
    }
    out
}

/// The weights of `n` observations in trial order, oldest first (Optuna's `default_weights`):
/// all 1 up to 25; past that the newest 25 weigh 1 and the older ones rise evenly from `1 / n`
/// (the oldest) towards 1, so that a long sweep's early trials count for less.
pub(super) fn trial_weights(n: usize) -> Vec<f64> {
    if n < 25 {
        return vec![1.0; n];
    }
    let ramp = n - 25;
    let (first, last) = (1.0 / n as f64, 1.0);
    let mut w: Vec<f64> = (0..ramp)
        .map(|i| match ramp {
            1 => first,
            _ => first + (last - first) * i as f64 / (ramp - 1) as f64,
        })
        .collect();
    w.extend(std::iter::repeat_n(1.0, 25));
    w
}

/// A truncated Gaussian mixture on `[lo, hi]`.
#[derive(Debug, Clone)]
pub struct Parzen {
    lo: f64,
    hi: f64,
    mus: Vec<f64>,
    sigmas: Vec<f64>,
    weights: Vec<f64>,
    /// Each component's mass inside `[lo, hi]`.
    mass: Vec<f64>,
}

impl Parzen {
    /// The estimator of `points` (internal-scale values, in trial order, oldest first: see
    /// [`trial_weights`]) on `[lo, hi]`.
    pub fn new(points: &[f64], lo: f64, hi: f64) -> Parzen {
        let range = hi - lo;
        let mus: Vec<f64> = points.iter().map(|p| p.clamp(lo, hi)).collect();
        let sigmas = neighbour_sigmas(&mus, lo, hi);
        let n = mus.len();
        let mut out = Parzen {
            lo,
            hi,
            mus: Vec::with_capacity(n + 1),
            sigmas: Vec::with_capacity(n + 1),
            weights: Vec::with_capacity(n + 1),
            mass: Vec::with_capacity(n + 1),
        };
        // the points' kernels, then the prior's: centred, the whole range as its deviation
        let weights = trial_weights(n);
        let kernels = mus
            .into_iter()
            .zip(sigmas)
            .zip(weights)
            .map(|((mu, sigma), w)| (mu, sigma, w));
        for (mu, sigma, weight) in kernels.chain([(0.5 * (lo + hi), range, PRIOR_WEIGHT)]) {
            let mass = normal_cdf((hi - mu) / sigma) - normal_cdf((lo - mu) / sigma);
            out.mus.push(mu);
            out.sigmas.push(sigma);
            out.weights.push(weight);
            out.mass.push(mass.max(1e-300));
        }
        out
    }

    /// A draw: a component by weight, then its Gaussian until a value lands in `[lo, hi]`
    /// (clamped after 100 misses, which the masses above make vanishingly rare).
    pub fn sample(&self, rng: &mut Rng) -> f64 {
        let c = rng.weighted(&self.weights);
        for _ in 0..100 {
            let x = self.mus[c] + self.sigmas[c] * rng.normal();
            if (self.lo..=self.hi).contains(&x) {
                return x;
            }
        }
        self.mus[c].clamp(self.lo, self.hi)
    }

    /// The log density at `x`.
    pub fn log_pdf(&self, x: f64) -> f64 {
        let total: f64 = self.weights.iter().sum();
        let mut p = 0.0;
        for i in 0..self.mus.len() {
            let z = (x - self.mus[i]) / self.sigmas[i];
            let pdf = (-0.5 * z * z).exp() / (self.sigmas[i] * (std::f64::consts::TAU).sqrt());
            p += self.weights[i] * pdf / self.mass[i];
        }
        (p / total).max(1e-300).ln()
    }
}

/// A listed parameter's estimator, as Optuna 5 builds it: a mixture of one kernel per
/// observation (weight 1 on its choice plus `1 / (m + 1)` on every choice, normalised, for `m`
/// observations), weighted by [`trial_weights`], and a prior kernel (uniform) of weight 1.
#[derive(Debug, Clone)]
pub struct Categorical {
    /// The mixture's probability of each choice.
    weights: Vec<f64>,
}

impl Categorical {
    /// The estimator of the observed `choices` (indices below `n`, in trial order, oldest
    /// first).
    pub fn new(choices: &[usize], n: usize) -> Categorical {
        let m = choices.len();
        let spread = PRIOR_WEIGHT / (m + 1) as f64;
        let row_total = 1.0 + spread * n as f64;
        let kernel_weights = trial_weights(m);
        let total = kernel_weights.iter().sum::<f64>() + PRIOR_WEIGHT;
        let mut weights = vec![PRIOR_WEIGHT / n as f64; n];
        for (&c, w) in choices.iter().zip(kernel_weights) {
            let c = c.min(n - 1);
            for (i, p) in weights.iter_mut().enumerate() {
                let hit = if i == c { 1.0 } else { 0.0 };
                *p += w * (hit + spread) / row_total;
            }
        }
        weights.iter_mut().for_each(|p| *p /= total);
        Categorical { weights }
    }

    pub fn sample(&self, rng: &mut Rng) -> usize {
        rng.weighted(&self.weights)
    }

    /// The log probability of choice `c`.
    pub fn log_pmf(&self, c: usize) -> f64 {
        (self.weights[c] / self.weights.iter().sum::<f64>()).ln()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn the_cdf_matches_known_values() {
        for (z, want) in [
            (0.0, 0.5),
            (1.0, 0.841_344_746),
            (-1.96, 0.024_997_895),
            (3.0, 0.998_650_102),
        ] {
            assert!((normal_cdf(z) - want).abs() < 1e-7, "{z}: {}", normal_cdf(z));
        }
    }

    /// The neighbour rule as Optuna 5 computes it, on `[0, 1]`: one point takes the larger
    /// distance to the range's ends; of two or more, the outermost take the distance to the
    /// point inside them and the others the larger distance to a neighbour; every deviation at
    /// least `1 / (n + 2)` (the prior's kernel counted) and at most the range.
    #[test]
    fn each_point_takes_the_neighbour_rules_deviation() {
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
        // one point: the far end, 0.7 (not the 0.2 to the prior's centre, hyperopt's)
        assert!(close(&neighbour_sigmas(&[0.7], 0.0, 1.0), &[0.7]));
        // one point near the middle: the far end is still at least half the range
        assert!(close(&neighbour_sigmas(&[0.45], 0.0, 1.0), &[0.55]));
        // two points: each the distance between them, at least 1/4
        assert!(close(&neighbour_sigmas(&[0.9, 0.4], 0.0, 1.0), &[0.5, 0.5]));
        assert!(close(&neighbour_sigmas(&[0.5, 0.6], 0.0, 1.0), &[0.25, 0.25]));
        // four points (order kept): the outermost take their inner neighbour's distance, not
        // the range's ends (0.02 and 0.1 away here), the inner ones the larger gap, all at
        // least 1/6
        let got = neighbour_sigmas(&[0.9, 0.02, 0.6, 0.3], 0.0, 1.0);
        assert!(close(&got, &[0.3, 0.28, 0.3, 0.3]), "{got:?}");
        // another range: -1 is outermost (3 to its neighbour, raised to 20 / 5), 2 and 9 have
        // 7 between them
        let got = neighbour_sigmas(&[-1.0, 9.0, 2.0], -5.0, 15.0);
        assert!(close(&got, &[4.0, 7.0, 7.0]), "{got:?}");
        assert!(neighbour_sigmas(&[], 0.0, 1.0).is_empty());
    }

    /// The cases of `tests/fixtures/parzen_optuna.toml` (tools/reference/make_tpe_fixtures.py):
    /// Optuna 5's Parzen estimators, as its TPE sampler builds them.
    pub(in crate::sampler) fn optuna_cases() -> Vec<toml::Table> {
        let text = include_str!("../../tests/fixtures/parzen_optuna.toml");
        let table: toml::Table = text.parse().expect("the fixture is TOML");
        let cases = table["case"].as_array().expect("[[case]]");
        cases.iter().map(|c| c.as_table().expect("a case").clone()).collect()
    }

    /// The numbers of a TOML array (of arrays, flattened).
    pub(in crate::sampler) fn floats(v: &toml::Value) -> Vec<f64> {
        match v {
            toml::Value::Array(a) => a.iter().flat_map(floats).collect(),
            toml::Value::Float(x) => vec![*x],
            toml::Value::Integer(i) => vec![*i as f64],
            other => panic!("not a number: {other}"),
        }
    }

    /// One parameter's estimator gives each kernel the deviation Optuna's does, and the same
    /// log density, on every one-dimensional case of the fixture (one point to 120, where the
    /// clip stops at a hundredth of the range and the older points weigh less), and a listed
    /// parameter's the same probabilities (5 and 30 observations).
    #[test]
    fn the_estimator_is_optunas() {
        let mut checked = 0;
        for case in optuna_cases() {
            let dims = case["dims"].as_array().unwrap();
            if dims.len() != 1 {
                continue;
            }
            if let Some(n) = dims[0].get("choices") {
                // a listed parameter: the same probabilities
                let n = n.as_integer().unwrap() as usize;
                let choices: Vec<usize> = floats(&case["observations"]).iter().map(|&c| c as usize).collect();
                let c = Categorical::new(&choices, n);
                for (x, want) in floats(&case["points"]).iter().zip(floats(&case["log_pdf"])) {
                    let got = c.log_pmf(*x as usize);
                    assert!(
                        (got - want).abs() < 1e-12,
                        "{}: log probability of {x}: {got} against Optuna's {want}",
                        case["name"]
                    );
                }
                checked += 1;
                continue;
            }
            let (lo, hi) = (floats(&dims[0]["lo"])[0], floats(&dims[0]["hi"])[0]);
            let p = Parzen::new(&floats(&case["observations"]), lo, hi);
            let name = case["name"].as_str().unwrap();
            let want = floats(&case["sigmas"]);
            assert_eq!(p.sigmas.len(), want.len(), "{name}");
            for (got, want) in p.sigmas.iter().zip(&want) {
                assert!(
                    (got - want).abs() <= 1e-12 * want,
                    "{name}: sigma {got} against Optuna's {want}"
                );
            }
            for (x, want) in floats(&case["points"]).iter().zip(floats(&case["log_pdf"])) {
                let got = p.log_pdf(*x);
                assert!(
                    (got - want).abs() < 1e-6,
                    "{name}: log density at {x}: {got} against Optuna's {want}"
                );
            }
            checked += 1;
        }
        assert_eq!(checked, 7);
    }

    /// The points' kernels take the neighbour rule's deviations (Optuna 5's), the prior the
    /// whole range at the middle.
    #[test]
    fn the_kernels_take_the_neighbour_rule_and_the_prior_the_range() {
        let p = Parzen::new(&[0.9, 0.02, 0.6, 0.3], 0.0, 1.0);
        assert_eq!(p.mus, vec![0.9, 0.02, 0.6, 0.3, 0.5]);
        let want = [0.3, 0.28, 0.3, 0.3, 1.0];
        assert!(
            p.sigmas.iter().zip(want).all(|(s, w)| (s - w).abs() < 1e-12),
            "{:?}",
            p.sigmas
        );
        // one point: the far end of the range, not the prior's centre
        let one = Parzen::new(&[0.7], 0.0, 1.0);
        assert!((one.sigmas[0] - 0.7).abs() < 1e-12, "{:?}", one.sigmas);
    }

    #[test]
    fn the_mixture_is_a_density_on_its_range_and_peaks_at_its_points() {
        let p = Parzen::new(&[0.2, 0.25, 0.8], 0.0, 1.0);
        let n = 10_000;
        let integral: f64 = (0..n)
            .map(|i| p.log_pdf((i as f64 + 0.5) / n as f64).exp())
            .sum::<f64>()
            / n as f64;
        assert!((integral - 1.0).abs() < 1e-3, "{integral}");
        assert!(p.log_pdf(0.22) > p.log_pdf(0.5));
        let mut rng = Rng::new(1);
        let draws: Vec<f64> = (0..4000).map(|_| p.sample(&mut rng)).collect();
        assert!(draws.iter().all(|x| (0.0..=1.0).contains(x)));
        let near = draws.iter().filter(|x| (0.1..0.35).contains(*x)).count() as f64 / 4000.0;
        let far = draws.iter().filter(|x| (0.45..0.7).contains(*x)).count() as f64 / 4000.0;
        assert!(near > far, "{near} {far}");
        let c = Categorical::new(&[2, 2, 0], 3);
        assert!(c.log_pmf(2) > c.log_pmf(0) && c.log_pmf(0) > c.log_pmf(1));
        let total: f64 = (0..3).map(|i| c.log_pmf(i).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
    }
}
