//! Dynamic axes from concrete traces: the same computation traced at a base size of every axis
//! and once more with each axis changed, so that every dimension of every value (and every
//! size-like attribute) can be written as `coef × Π axis_k^e_k`, e.g. `3 × batch × seq` for a
//! flattened `[batch · seq, 3C]`.

/// A dimension as a product of the axes: `coef × Π axis_k^exps[k]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SymDim {
    pub coef: i64,
    pub exps: Vec<u32>,
}

impl SymDim {
    /// A dimension that does not change with the axes.
    pub(crate) fn fixed(v: i64, axes: usize) -> SymDim {
        SymDim {
            coef: v,
            exps: vec![0; axes],
        }
    }

    /// Whether it does not change with the axes.
    pub(crate) fn is_fixed(&self) -> bool {
        self.exps.iter().all(|&e| e == 0)
    }
}

/// The axes' sizes in the traces: `base[k]` in the first trace, `varied[k]` in trace `k + 1`
/// (where every other axis keeps its base size).
pub(crate) struct AxisSizes {
    pub base: Vec<usize>,
    pub varied: Vec<usize>,
}

/// The largest power an axis may appear with (a dimension of `batch²` is unusual already).
const MAX_EXP: u32 = 2;

impl AxisSizes {
    /// `at_base` (a dimension in the first trace) and `at_varied[k]` (the same dimension in
    /// trace `k + 1`) as a [`SymDim`]; `None` when no product of the axes explains them (a
    /// dimension such as `seq - 1`).
    pub(crate) fn solve(&self, at_base: usize, at_varied: &[usize]) -> Option<SymDim> {
        let n = self.base.len();
        if at_base == 0 {
            return at_varied.iter().all(|&v| v == 0).then(|| SymDim::fixed(0, n));
        }
        let mut exps = Vec::with_capacity(n);
        let mut div: u128 = 1;
        for ((&s0, &s1), &v1) in self.base.iter().zip(&self.varied).zip(at_varied) {
            let (s0, s1) = (s0 as u128, s1 as u128);
            let (v0, v1) = (at_base as u128, v1 as u128);
            // v1 / v0 == (s1 / s0)^e
            let e = (0..=MAX_EXP).find(|&e| v0 * s1.pow(e) == v1 * s0.pow(e))?;
            exps.push(e);
            div *= s0.pow(e);
        }
        let v0 = at_base as u128;
        v0.is_multiple_of(div).then(|| SymDim {
            coef: (v0 / div) as i64,
            exps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dimensions_are_solved_as_products_of_the_axes() {
        // batch 2 -> 3, seq 4 -> 7
        let s = AxisSizes {
            base: vec![2, 4],
            varied: vec![3, 7],
        };
        assert_eq!(s.solve(128, &[128, 128]), Some(SymDim::fixed(128, 2)));
        assert_eq!(
            s.solve(2, &[3, 2]),
            Some(SymDim {
                coef: 1,
                exps: vec![1, 0]
            })
        );
        assert_eq!(
            s.solve(4, &[4, 7]),
            Some(SymDim {
                coef: 1,
                exps: vec![0, 1]
            })
        );
        // [B*T, 3C] with C = 16
        assert_eq!(
            s.solve(8, &[12, 14]),
            Some(SymDim {
                coef: 1,
                exps: vec![1, 1]
            })
        );
        assert_eq!(
            s.solve(48 * 8, &[48 * 12, 48 * 14]),
            Some(SymDim {
                coef: 48,
                exps: vec![1, 1]
            })
        );
        // a causal mask's T x T
        assert_eq!(
            s.solve(16, &[16, 49]),
            Some(SymDim {
                coef: 1,
                exps: vec![0, 2]
            })
        );
        // seq - 1 is no product
        assert_eq!(s.solve(3, &[3, 6]), None);
        assert_eq!(s.solve(0, &[0, 0]), Some(SymDim::fixed(0, 2)));
        assert_eq!(s.solve(0, &[1, 0]), None);
    }
}
