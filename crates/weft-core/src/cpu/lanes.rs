//! Row reductions written with 16 independent accumulators so that they vectorize (a single
//! running sum is a dependency chain the compiler may not reorder). Used inside the
//! `simd_dispatch!` kernels, where they compile to full-width vector code.

use crate::dtype::Float;

const LANES: usize = 16;

/// Combines the 16 accumulators pairwise (8 + 8, then 4 + 4, ...): a few vector shuffles, where a
/// left-to-right fold is a chain of 16 dependent scalar operations (it dominated attention's
/// softmax on rows of 64 keys).
#[inline(always)]
fn tree<T: Copy>(acc: [T; LANES], f: impl Fn(T, T) -> T) -> T {
    // Opaque to the optimizer: otherwise it plans the accumulators' vector layout around this
    // reduction and compiles the main loop that fills them with narrow vectors.
    let mut acc = std::hint::black_box(acc);
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] = f(acc[i], acc[i + w]);
        }
    }
    acc[0]
}

#[inline(always)]
fn larger<T: Float>(a: T, b: T) -> T {
    if b > a || crate::dtype::is_nan(b) {
        b
    } else {
        a
    }
}

#[inline(always)]
fn smaller<T: Float>(a: T, b: T) -> T {
    if b < a || crate::dtype::is_nan(b) {
        b
    } else {
        a
    }
}

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
    s + tree(acc, |a, b| a + b)
}

/// Largest element (`-inf` for an empty slice; NaN propagates).
#[inline(always)]
pub fn max<T: Float>(x: &[T]) -> T {
    let mut acc = [T::neg_infinity(); LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] = larger(acc[i], c[i]);
        }
    }
    tail.iter().fold(tree(acc, larger), |m, &v| larger(m, v))
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
            acc[i] = smaller(acc[i], c[i]);
        }
    }
    tail.iter().fold(tree(acc, smaller), |m, &v| smaller(m, v))
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
    s + tree(acc, |a, b| a + b)
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
    s + tree(acc, |a, b| a + b)
}

/// `(sum(a * b), sum(a * b * c))` in one pass.
#[inline(always)]
pub fn dot2<T: Float>(a: &[T], b: &[T], c: &[T]) -> (T, T) {
    let mut acc = [T::zero(); LANES];
    let mut acc2 = [T::zero(); LANES];
    let n = a.len().min(b.len()).min(c.len());
    let full = n / LANES * LANES;
    let chunks = a[..full]
        .chunks_exact(LANES)
        .zip(b[..full].chunks_exact(LANES))
        .zip(c[..full].chunks_exact(LANES));
    for ((ca, cb), cc) in chunks {
        for i in 0..LANES {
            let v = ca[i] * cb[i];
            acc[i] += v;
            acc2[i] += v * cc[i];
        }
    }
    let (mut s, mut s2) = (T::zero(), T::zero());
    for i in full..n {
        let v = a[i] * b[i];
        s += v;
        s2 += v * c[i];
    }
    (s + tree(acc, |x, y| x + y), s2 + tree(acc2, |x, y| x + y))
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
                    let e = (cx[i] - m).exp_nonpos();
                    co[i] = e;
                    acc[i] += e;
                }
            }
            for i in full..x.len() {
                let e = (x[i] - m).exp_nonpos();
                out[i] = e;
                s += e;
            }
        }
        None => {
            for cx in x[..full].chunks_exact(LANES) {
                for i in 0..LANES {
                    acc[i] += (cx[i] - m).exp_nonpos();
                }
            }
            for &v in &x[full..] {
                s += (v - m).exp_nonpos();
            }
        }
    }
    s + tree(acc, |a, b| a + b)
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
            let e = (c[i] - m).exp_nonpos();
            c[i] = e;
            acc[i] += e;
        }
    }
    let mut s = T::zero();
    for v in x[full..].iter_mut() {
        *v = (*v - m).exp_nonpos();
        s += *v;
    }
    s + tree(acc, |a, b| a + b)
}

/// Replaces each `x` by `exp(x - m)` (no sum: no reduction chain to wait on).
#[inline(always)]
pub fn exp_sub_in_place<T: Float>(x: &mut [T], m: T) {
    for v in x.iter_mut() {
        *v = (*v - m).exp_nonpos();
    }
}
