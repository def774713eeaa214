//! Row reductions written with 16 independent accumulators so that they vectorize (a single
//! running sum is a dependency chain the compiler may not reorder). Used inside the
//! `simd_dispatch!` kernels, where they compile to full-width vector code.

use crate::dtype::Float;

const LANES: usize = 16;

/// Sum of `x`.
#[inline(always)]
pub fn sum<T: Float>(x: &[T]) -> T {
    let mut acc = [T::zero(); LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += c[i];
        }
    }
    let mut s = T::zero();
    for &v in tail {
        s += v;
    }
    acc.iter().fold(s, |a, &b| a + b)
}

/// Largest element (`-inf` for an empty slice; NaN propagates).
#[inline(always)]
pub fn max<T: Float>(x: &[T]) -> T {
    let mut acc = [T::neg_infinity(); LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] = if c[i] > acc[i] || crate::dtype::is_nan(c[i]) {
                c[i]
            } else {
                acc[i]
            };
        }
    }
    let mut m = T::neg_infinity();
    for &v in tail.iter().chain(acc.iter()) {
        if v > m || crate::dtype::is_nan(v) {
            m = v;
        }
    }
    m
}

/// Smallest element (`+inf` for an empty slice; NaN propagates).
#[inline(always)]
pub fn min<T: Float>(x: &[T]) -> T {
    let inf = -T::neg_infinity();
    let mut acc = [inf; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] = if c[i] < acc[i] || crate::dtype::is_nan(c[i]) {
                c[i]
            } else {
                acc[i]
            };
        }
    }
    let mut m = inf;
    for &v in tail.iter().chain(acc.iter()) {
        if v < m || crate::dtype::is_nan(v) {
            m = v;
        }
    }
    m
}

/// `sum((x - c)^2)`.
#[inline(always)]
pub fn sum_sq_centered<T: Float>(x: &[T], c: T) -> T {
    let mut acc = [T::zero(); LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for ch in chunks {
        for i in 0..LANES {
            let d = ch[i] - c;
            acc[i] += d * d;
        }
    }
    let mut s = T::zero();
    for &v in tail {
        s += (v - c) * (v - c);
    }
    acc.iter().fold(s, |a, &b| a + b)
}

/// `sum(a * b)`.
#[inline(always)]
pub fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::zero(); LANES];
    let n = a.len().min(b.len());
    let full = n / LANES * LANES;
    for (ca, cb) in a[..full].chunks_exact(LANES).zip(b[..full].chunks_exact(LANES)) {
        for i in 0..LANES {
            acc[i] += ca[i] * cb[i];
        }
    }
    let mut s = T::zero();
    for i in full..n {
        s += a[i] * b[i];
    }
    acc.iter().fold(s, |a, &b| a + b)
}

/// `sum(exp(x - m))`, writing each `exp(x - m)` into `out` when given.
#[inline(always)]
pub fn sum_exp<T: Float>(x: &[T], m: T, out: Option<&mut [T]>) -> T {
    let mut acc = [T::zero(); LANES];
    let full = x.len() / LANES * LANES;
    let mut s = T::zero();
    match out {
        Some(out) => {
            for (cx, co) in x[..full].chunks_exact(LANES).zip(out[..full].chunks_exact_mut(LANES)) {
                for i in 0..LANES {
                    let e = (cx[i] - m).fast_exp();
                    co[i] = e;
                    acc[i] += e;
                }
            }
            for i in full..x.len() {
                let e = (x[i] - m).fast_exp();
                out[i] = e;
                s += e;
            }
        }
        None => {
            for cx in x[..full].chunks_exact(LANES) {
                for i in 0..LANES {
                    acc[i] += (cx[i] - m).fast_exp();
                }
            }
            for &v in &x[full..] {
                s += (v - m).fast_exp();
            }
        }
    }
    acc.iter().fold(s, |a, &b| a + b)
}

/// Sum of a long slice: lane sums over blocks of 4096, blocks added in f64 (accurate and fast).
#[inline(always)]
pub fn sum_blocked<T: Float>(x: &[T]) -> f64 {
    x.chunks(4096).map(|b| sum(b).to_f64()).sum()
}

/// Replaces each `x` by `exp(x - m)` and returns their sum.
#[inline(always)]
pub fn exp_in_place<T: Float>(x: &mut [T], m: T) -> T {
    let mut acc = [T::zero(); LANES];
    let full = x.len() / LANES * LANES;
    for c in x[..full].chunks_exact_mut(LANES) {
        for i in 0..LANES {
            let e = (c[i] - m).fast_exp();
            c[i] = e;
            acc[i] += e;
        }
    }
    let mut s = T::zero();
    for v in x[full..].iter_mut() {
        *v = (*v - m).fast_exp();
        s += *v;
    }
    acc.iter().fold(s, |a, &b| a + b)
}
