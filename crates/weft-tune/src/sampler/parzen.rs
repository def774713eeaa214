//! The Parzen estimators of TPE (Bergstra et al., "Algorithms for Hyper-Parameter
//! Optimization", NeurIPS 2011, section 4): a numeric parameter's density is a mixture of
//! Gaussians truncated to its range, one per observed point plus one prior component; a
//! categorical one's is smoothed frequencies.
//!
//! Bandwidths follow the paper's (and hyperopt's) rule: each point's standard deviation is the
//! larger distance to its neighbours among the sorted points and the prior mean, clipped to
//! `[range / min(100, n + 1), range]`; the prior component is centred in the range with the
//! whole range as its standard deviation. All of it on the parameter's internal scale (the log
//! for `log_uniform`).

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
        let prior_mu = 0.5 * (lo + hi);
        let mut mus: Vec<(f64, bool)> = points.iter().map(|p| (p.clamp(lo, hi), false)).collect();
        mus.push((prior_mu, true));
        mus.sort_by(|a, b| a.0.total_cmp(&b.0));
        let n = points.len();
        let min_sigma = range / (100.0f64).min(n as f64 + 1.0);
        let mut out = Parzen {
            lo,
            hi,
            mus: Vec::with_capacity(n + 1),
            sigmas: Vec::with_capacity(n + 1),
            weights: Vec::with_capacity(n + 1),
            mass: Vec::with_capacity(n + 1),
        };
        for (i, &(mu, prior)) in mus.iter().enumerate() {
            let sigma = if prior {
                range
            } else {
                let left = if i > 0 { mu - mus[i - 1].0 } else { mu - lo };
                let right = if i + 1 < mus.len() { mus[i + 1].0 - mu } else { hi - mu };
                left.max(right).clamp(min_sigma, range)
            };
            let mass = normal_cdf((hi - mu) / sigma) - normal_cdf((lo - mu) / sigma);
            out.mus.push(mu);
            out.sigmas.push(sigma);
            out.weights.push(if prior { PRIOR_WEIGHT } else { 1.0 });
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
