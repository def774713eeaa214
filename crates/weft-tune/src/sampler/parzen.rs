//! The Parzen estimators of TPE (Bergstra et al., "Algorithms for Hyper-Parameter
//! Optimization", NeurIPS 2011, section 4): a numeric parameter's density is a mixture of
//! Gaussians truncated to its range, one per observed point plus one prior component; a
//! categorical one's is smoothed frequencies.
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
    /// The estimator of `points` (internal-scale values) on `[lo, hi]`.
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
        let kernels = mus.into_iter().zip(sigmas).map(|(mu, sigma)| (mu, sigma, 1.0));
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

/// Smoothed frequencies over `n` choices: each choice's count plus `PRIOR_WEIGHT / n`.
#[derive(Debug, Clone)]
pub struct Categorical {
    weights: Vec<f64>,
}

impl Categorical {
    /// The estimator of the observed `choices` (indices below `n`).
    pub fn new(choices: &[usize], n: usize) -> Categorical {
        let mut weights = vec![PRIOR_WEIGHT / n as f64; n];
        for &c in choices {
            weights[c] += 1.0;
        }
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
mod tests {
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
