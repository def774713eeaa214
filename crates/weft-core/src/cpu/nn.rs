//! Fused row kernels: softmax / log-softmax, layer and RMS norm, cross-entropy, each one pass
//! (or two over a row held in cache) with their backward kernels. Rows are independent and run
//! in parallel; f32 instantiations are compiled for the widest vector unit.

use rayon::prelude::*;

use super::elementwise::simd_dispatch;
use crate::dtype::Float;

fn rows_per_task(len: usize) -> usize {
    (super::PARALLEL_THRESHOLD / len.max(1)).max(1)
}

#[inline(always)]
fn row_max<T: Float>(x: &[T]) -> T {
    x.iter().copied().fold(T::neg_infinity(), |a, b| a.max(b))
}

#[inline(always)]
fn softmax_row<T: Float>(x: &[T], y: &mut [T], log: bool) {
    let m = row_max(x);
    let mut sum = T::zero();
    if log {
        for &v in x {
            sum += (v - m).fast_exp();
        }
        let lse = m + sum.ln();
        for (o, &v) in y.iter_mut().zip(x) {
            *o = v - lse;
        }
    } else {
        for (o, &v) in y.iter_mut().zip(x) {
            let e = (v - m).fast_exp();
            *o = e;
            sum += e;
        }
        let inv = T::from_f64(1.0) / sum;
        for o in y.iter_mut() {
            *o *= inv;
        }
    }
}

#[inline(always)]
fn softmax_backward_row<T: Float>(y: &[T], g: &[T], dx: &mut [T], log: bool) {
    if log {
        let s: T = g.iter().copied().sum();
        for ((d, &y), &g) in dx.iter_mut().zip(y).zip(g) {
            *d = g - y.fast_exp() * s;
        }
    } else {
        let mut dot = T::zero();
        for (&y, &g) in y.iter().zip(g) {
            dot += y * g;
        }
        for ((d, &y), &g) in dx.iter_mut().zip(y).zip(g) {
            *d = y * (g - dot);
        }
    }
}

simd_dispatch!(softmax_rows_f32(x: &[f32], y: &mut [f32], len: usize, log: bool) {
    for (xr, yr) in x.chunks(len).zip(y.chunks_mut(len)) {
        softmax_row(xr, yr, log);
    }
});

simd_dispatch!(softmax_backward_rows_f32(y: &[f32], g: &[f32], dx: &mut [f32], len: usize, log: bool) {
    for ((yr, gr), dr) in y.chunks(len).zip(g.chunks(len)).zip(dx.chunks_mut(len)) {
        softmax_backward_row(yr, gr, dr, log);
    }
});

/// Softmax (or log-softmax) of each row of length `len`.
pub fn softmax<T: Float>(x: &[T], y: &mut [T], len: usize, log: bool) {
    super::threads::init();
    let chunk = rows_per_task(len) * len;
    y.par_chunks_mut(chunk).zip(x.par_chunks(chunk)).for_each(|(y, x)| {
        if let (Some(xf), Some(yf)) = (as_f32(x), as_f32_mut(y)) {
            softmax_rows_f32(xf, yf, len, log);
        } else {
            for (xr, yr) in x.chunks(len).zip(y.chunks_mut(len)) {
                softmax_row(xr, yr, log);
            }
        }
    });
}

/// Gradient of [`softmax`] given its output `y` and the output gradient `g`.
pub fn softmax_backward<T: Float>(y: &[T], g: &[T], dx: &mut [T], len: usize, log: bool) {
    super::threads::init();
    let chunk = rows_per_task(len) * len;
    dx.par_chunks_mut(chunk)
        .zip(y.par_chunks(chunk).zip(g.par_chunks(chunk)))
        .for_each(|(d, (y, g))| {
            if let (Some(yf), Some(gf), Some(df)) = (as_f32(y), as_f32(g), as_f32_mut(d)) {
                softmax_backward_rows_f32(yf, gf, df, len, log);
            } else {
                for ((yr, gr), dr) in y.chunks(len).zip(g.chunks(len)).zip(d.chunks_mut(len)) {
                    softmax_backward_row(yr, gr, dr, log);
                }
            }
        });
}

/// Reinterprets a generic slice as f32 when `T` is f32.
#[inline(always)]
fn as_f32<T: 'static>(x: &[T]) -> Option<&[f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        // SAFETY: T is f32 (checked above), so the layout is identical.
        .then(|| unsafe { std::slice::from_raw_parts(x.as_ptr() as *const f32, x.len()) })
}

#[inline(always)]
fn as_f32_mut<T: 'static>(x: &mut [T]) -> Option<&mut [f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        // SAFETY: T is f32 (checked above), so the layout is identical.
        .then(|| unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut f32, x.len()) })
}

/// Layer norm (or RMS norm when `rms`) of each row of length `len`, with optional affine.
/// Writes `y` and per-row `mean` (0 for RMS) and `rstd`.
#[allow(clippy::too_many_arguments)]
pub fn norm<T: Float>(
    x: &[T],
    w: Option<&[T]>,
    b: Option<&[T]>,
    y: &mut [T],
    mean: &mut [T],
    rstd: &mut [T],
    len: usize,
    eps: T,
    rms: bool,
) {
    super::threads::init();
    let rows = rows_per_task(len);
    y.par_chunks_mut(rows * len)
        .zip(x.par_chunks(rows * len))
        .zip(mean.par_chunks_mut(rows).zip(rstd.par_chunks_mut(rows)))
        .for_each(|((y, x), (mean, rstd))| {
            for (((xr, yr), m), r) in x
                .chunks(len)
                .zip(y.chunks_mut(len))
                .zip(mean.iter_mut())
                .zip(rstd.iter_mut())
            {
                norm_row(xr, w, b, yr, m, r, eps, rms);
            }
        });
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn norm_row<T: Float>(x: &[T], w: Option<&[T]>, b: Option<&[T]>, y: &mut [T], m: &mut T, r: &mut T, eps: T, rms: bool) {
    let n = T::from_usize(x.len());
    let mu = if rms {
        T::zero()
    } else {
        x.iter().copied().sum::<T>() / n
    };
    let mut var = T::zero();
    for &v in x {
        let d = v - mu;
        var += d * d;
    }
    let rs = T::from_f64(1.0) / (var / n + eps).sqrt();
    *m = mu;
    *r = rs;
    match (w, b) {
        (Some(w), Some(b)) => {
            for i in 0..x.len() {
                y[i] = (x[i] - mu) * rs * w[i] + b[i];
            }
        }
        (Some(w), None) => {
            for i in 0..x.len() {
                y[i] = (x[i] - mu) * rs * w[i];
            }
        }
        _ => {
            for i in 0..x.len() {
                y[i] = (x[i] - mu) * rs;
            }
        }
    }
}

/// Backward of [`norm`]: writes `dx` and returns `(dweight, dbias)` sums over rows (zeros when
/// the layer has none).
#[allow(clippy::too_many_arguments)]
pub fn norm_backward<T: Float>(
    x: &[T],
    w: Option<&[T]>,
    g: &[T],
    mean: &[T],
    rstd: &[T],
    dx: &mut [T],
    len: usize,
    rms: bool,
) -> (Vec<T>, Vec<T>) {
    super::threads::init();
    let rows = rows_per_task(len).max(8);
    let n = T::from_usize(len);
    let partial = dx
        .par_chunks_mut(rows * len)
        .zip(x.par_chunks(rows * len).zip(g.par_chunks(rows * len)))
        .zip(mean.par_chunks(rows).zip(rstd.par_chunks(rows)))
        .map(|((dx, (x, g)), (mean, rstd))| {
            let mut dw = vec![T::zero(); len];
            let mut db = vec![T::zero(); len];
            let mut gw = vec![T::zero(); len];
            for ((((dxr, xr), gr), &mu), &rs) in dx
                .chunks_mut(len)
                .zip(x.chunks(len))
                .zip(g.chunks(len))
                .zip(mean)
                .zip(rstd)
            {
                let mut sum_gw = T::zero();
                let mut sum_gwx = T::zero();
                for i in 0..len {
                    let xhat = (xr[i] - mu) * rs;
                    dw[i] += gr[i] * xhat;
                    db[i] += gr[i];
                    let v = match w {
                        Some(w) => gr[i] * w[i],
                        None => gr[i],
                    };
                    gw[i] = v;
                    sum_gw += v;
                    sum_gwx += v * xhat;
                }
                let mean_gw = if rms { T::zero() } else { sum_gw / n };
                let mean_gwx = sum_gwx / n;
                for i in 0..len {
                    let xhat = (xr[i] - mu) * rs;
                    dxr[i] = rs * (gw[i] - mean_gw - xhat * mean_gwx);
                }
            }
            (dw, db)
        })
        .reduce(
            || (vec![T::zero(); len], vec![T::zero(); len]),
            |(mut a, mut b), (c, d)| {
                a.iter_mut().zip(c).for_each(|(a, c)| *a += c);
                b.iter_mut().zip(d).for_each(|(b, d)| *b += d);
                (a, b)
            },
        );
    partial
}

/// Cross-entropy of each row of `logits` (`[N, C]`) against `targets`; returns the per-row loss
/// (0 for ignored rows) and writes the per-row log-sum-exp. Targets were range-checked.
pub fn cross_entropy<T: Float>(
    logits: &[T],
    targets: &[i64],
    lse: &mut [T],
    c: usize,
    ignore_index: i64,
    smoothing: T,
) -> Vec<T> {
    super::threads::init();
    let mut loss = vec![T::zero(); targets.len()];
    let rows = rows_per_task(c);
    loss.par_chunks_mut(rows)
        .zip(lse.par_chunks_mut(rows))
        .zip(logits.par_chunks(rows * c).zip(targets.par_chunks(rows)))
        .for_each(|((loss, lse), (x, t))| {
            for (((l, s), xr), &t) in loss.iter_mut().zip(lse.iter_mut()).zip(x.chunks(c)).zip(t) {
                let m = row_max(xr);
                let mut sum = T::zero();
                let mut total = T::zero();
                for &v in xr {
                    sum += (v - m).fast_exp();
                    total += v;
                }
                let lse_row = m + sum.ln();
                *s = lse_row;
                if t == ignore_index {
                    continue;
                }
                let one = T::from_f64(1.0);
                let nll = lse_row - xr[t as usize];
                let smooth = lse_row - total / T::from_usize(c);
                *l = (one - smoothing) * nll + smoothing * smooth;
            }
        });
    loss
}

/// Gradient of the mean cross-entropy: `dx = scale * (softmax - (1 - ε) onehot - ε / C)` on
/// non-ignored rows, 0 on ignored ones; `scale` is `grad_out / n_valid`.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_backward<T: Float>(
    logits: &[T],
    targets: &[i64],
    lse: &[T],
    dx: &mut [T],
    c: usize,
    ignore_index: i64,
    smoothing: T,
    scale: T,
) {
    super::threads::init();
    let rows = rows_per_task(c);
    let one = T::from_f64(1.0);
    let eps_c = smoothing / T::from_usize(c);
    dx.par_chunks_mut(rows * c)
        .zip(
            logits
                .par_chunks(rows * c)
                .zip(targets.par_chunks(rows).zip(lse.par_chunks(rows))),
        )
        .for_each(|(dx, (x, (t, lse)))| {
            for (((dr, xr), &t), &s) in dx.chunks_mut(c).zip(x.chunks(c)).zip(t).zip(lse) {
                if t == ignore_index {
                    dr.iter_mut().for_each(|d| *d = T::zero());
                    continue;
                }
                for (d, &v) in dr.iter_mut().zip(xr) {
                    *d = scale * ((v - s).fast_exp() - eps_c);
                }
                dr[t as usize] -= scale * (one - smoothing);
            }
        });
}
