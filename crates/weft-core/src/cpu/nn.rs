//! Fused row kernels: softmax / log-softmax, layer and RMS norm, cross-entropy, with their backward
//! kernels. Rows are independent and run in parallel blocks; within a row the reductions use the
//! multi-accumulator helpers of `lanes.rs`, and the f32 instantiations are compiled for the widest
//! vector unit (`simd_dispatch!`).

use super::elementwise::simd_dispatch;
use super::f32_view::{as_f32, as_f32_mut, as_f32_uninit};
use super::lanes;
use super::pool::{self, Chunks};
use crate::dtype::Float;
use std::mem::MaybeUninit;

fn rows_per_task(len: usize) -> usize {
    (super::PARALLEL_THRESHOLD / len.max(1)).max(1)
}

// ---------------------------------------------------------------- softmax

#[inline(always)]
fn softmax_rows<T: Float>(x: &[T], y: &mut [T], len: usize, log: bool) {
    for (x, y) in x.chunks(len).zip(y.chunks_mut(len)) {
        let m = lanes::max(x);
        if log {
            let lse = m + lanes::sum_exp(x, m, None).ln();
            for (o, &v) in y.iter_mut().zip(x) {
                *o = v - lse;
            }
        } else {
            let inv = T::from_f64(1.0) / lanes::sum_exp(x, m, Some(y));
            for o in y.iter_mut() {
                *o *= inv;
            }
        }
    }
}

#[inline(always)]
fn softmax_backward_rows<T: Float>(y: &[T], g: &[T], dx: &mut [MaybeUninit<T>], len: usize, log: bool) {
    for ((y, g), dx) in y.chunks(len).zip(g.chunks(len)).zip(dx.chunks_mut(len)) {
        if log {
            let s = lanes::sum(g);
            for ((d, &y), &g) in dx.iter_mut().zip(y).zip(g) {
                d.write(g - y.exp_nonpos() * s);
            }
        } else {
            let dot = lanes::dot(y, g);
            for ((d, &y), &g) in dx.iter_mut().zip(y).zip(g) {
                d.write(y * (g - dot));
            }
        }
    }
}

simd_dispatch!(softmax_rows_f32(x: &[f32], y: &mut [f32], len: usize, log: bool) {
    softmax_rows(x, y, len, log)
});

simd_dispatch!(softmax_backward_rows_f32(y: &[f32], g: &[f32], dx: &mut [MaybeUninit<f32>], len: usize, log: bool) {
    softmax_backward_rows(y, g, dx, len, log)
});

/// Softmax (or log-softmax) of each row of length `len`.
pub fn softmax<T: Float>(x: &[T], y: &mut [MaybeUninit<T>], len: usize, log: bool) {
    let chunk = rows_per_task(len) * len;
    pool::for_each_chunk(y, chunk, |i, y| {
        let y = super::zeroed(y);
        let x = &x[i * chunk..][..y.len()];
        match (as_f32(x), as_f32_mut(y)) {
            (Some(xf), Some(yf)) => softmax_rows_f32(xf, yf, len, log),
            _ => softmax_rows(x, y, len, log),
        }
    });
}

/// Gradient of [`softmax`] given its output `y` and the output gradient `g`.
pub fn softmax_backward<T: Float>(y: &[T], g: &[T], dx: &mut [MaybeUninit<T>], len: usize, log: bool) {
    let chunk = rows_per_task(len) * len;
    pool::for_each_chunk(dx, chunk, |i, d| {
        let (y, g) = (&y[i * chunk..][..d.len()], &g[i * chunk..][..d.len()]);
        match (as_f32(y), as_f32(g), as_f32_uninit(d)) {
            (Some(yf), Some(gf), Some(df)) => softmax_backward_rows_f32(yf, gf, df, len, log),
            _ => softmax_backward_rows(y, g, d, len, log),
        }
    });
}

// ---------------------------------------------------------------- layer / RMS norm

/// Per-call constants of a norm kernel.
#[derive(Clone, Copy)]
pub struct NormSpec<'a, T> {
    pub weight: Option<&'a [T]>,
    pub bias: Option<&'a [T]>,
    pub len: usize,
    pub eps: T,
    pub rms: bool,
}

#[inline(always)]
fn norm_rows<T: Float>(s: NormSpec<'_, T>, x: &[T], y: &mut [MaybeUninit<T>], mean: &mut [T], rstd: &mut [T]) {
    let n = T::from_usize(s.len);
    let one = T::from_f64(1.0);
    // Per group of rows, the statistics of every row first, then the outputs: a row's
    // statistics are a chain of dependent reductions (~100 cycles on rows of 128); in a loop of
    // their own the chains of successive rows overlap, where written row by row each waited for
    // the one before. Groups of 16 rows keep the rows in L1 for the second pass.
    const GROUP: usize = 16;
    let rows = mean.len();
    for g0 in (0..rows).step_by(GROUP) {
        let g = GROUP.min(rows - g0);
        let x = &x[g0 * s.len..][..g * s.len];
        let y = &mut y[g0 * s.len..][..g * s.len];
        let (mean, rstd) = (&mut mean[g0..g0 + g], &mut rstd[g0..g0 + g]);
        for ((x, m), r) in x.chunks(s.len).zip(mean.iter_mut()).zip(rstd.iter_mut()) {
            let mu = if s.rms { T::zero() } else { lanes::sum(x) / n };
            *m = mu;
            *r = one / (lanes::sum_sq_centered(x, mu) / n + s.eps).sqrt();
        }
        for (((x, y), &mu), &rs) in x
            .chunks(s.len)
            .zip(y.chunks_mut(s.len))
            .zip(mean.iter())
            .zip(rstd.iter())
        {
            // zipped iterators (not indices) so the loops carry no bounds checks and vectorize
            match (s.weight, s.bias) {
                (Some(w), Some(b)) => {
                    for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
                        y.write((x - mu) * rs * w + b);
                    }
                }
                (Some(w), None) => {
                    for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
                        y.write((x - mu) * rs * w);
                    }
                }
                (None, Some(b)) => {
                    for ((y, &x), &b) in y.iter_mut().zip(x).zip(b) {
                        y.write((x - mu) * rs + b);
                    }
                }
                (None, None) => {
                    for (y, &x) in y.iter_mut().zip(x) {
                        y.write((x - mu) * rs);
                    }
                }
            }
        }
    }
}

simd_dispatch!(norm_rows_f32(s: NormSpec<'_, f32>, x: &[f32], y: &mut [MaybeUninit<f32>], mean: &mut [f32], rstd: &mut [f32]) {
    norm_rows(s, x, y, mean, rstd)
});

fn norm_spec_f32<T: 'static>(s: NormSpec<'_, T>) -> Option<NormSpec<'_, f32>> {
    let eps = as_f32(std::slice::from_ref(&s.eps))?[0];
    Some(NormSpec {
        weight: s.weight.map(|w| as_f32(w).expect("same T")),
        bias: s.bias.map(|b| as_f32(b).expect("same T")),
        len: s.len,
        eps,
        rms: s.rms,
    })
}

/// Layer norm (or RMS norm) of each row: writes `y`, and per row `mean` (0 for RMS) and `rstd`.
pub fn norm<T: Float>(
    s: NormSpec<'_, T>,
    x: &[T],
    y: &mut [MaybeUninit<T>],
    mean: &mut [MaybeUninit<T>],
    rstd: &mut [MaybeUninit<T>],
) {
    let rows = rows_per_task(s.len);
    let (ys, means, rstds) = (
        Chunks::new(y, rows * s.len),
        Chunks::new(mean, rows),
        Chunks::new(rstd, rows),
    );
    pool::run(means.count(), |i| {
        // SAFETY: `run` calls each block of rows once.
        let (y, mean, rstd) = unsafe { (ys.take(i), means.take(i), rstds.take(i)) };
        let (mean, rstd) = (super::zeroed(mean), super::zeroed(rstd));
        let x = &x[i * rows * s.len..][..y.len()];
        match (
            norm_spec_f32(s),
            as_f32(x),
            as_f32_uninit(y),
            as_f32_mut(mean),
            as_f32_mut(rstd),
        ) {
            (Some(sf), Some(xf), Some(yf), Some(mf), Some(rf)) => norm_rows_f32(sf, xf, yf, mf, rf),
            _ => norm_rows(s, x, y, mean, rstd),
        }
    });
}

/// dx of one block of rows, accumulating dweight and dbias partial sums.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn norm_backward_rows<T: Float>(
    s: NormSpec<'_, T>,
    x: &[T],
    g: &[T],
    mean: &[T],
    rstd: &[T],
    dx: &mut [MaybeUninit<T>],
    dw: &mut [T],
    db: &mut [T],
) {
    let n = T::from_usize(s.len);
    // In groups of rows, as the forward: first, per row, xhat (into dx) and the two row
    // reductions (dependent chains that overlap across rows in a loop of their own); then the
    // dweight/dbias partial sums, four rows per pass over them; then the gradients, with the
    // group's rows still in L1.
    const GROUP: usize = 16;
    let rows = mean.len();
    let (mut mean_gw, mut mean_gwx) = ([T::zero(); GROUP], [T::zero(); GROUP]);
    for g0 in (0..rows).step_by(GROUP) {
        let k = GROUP.min(rows - g0);
        let x = &x[g0 * s.len..][..k * s.len];
        let g = &g[g0 * s.len..][..k * s.len];
        let (mean, rstd) = (&mean[g0..g0 + k], &rstd[g0..g0 + k]);
        let dx = &mut dx[g0 * s.len..][..k * s.len];
        for (d, (x, (&mu, &rs))) in dx.chunks_mut(s.len).zip(x.chunks(s.len).zip(mean.iter().zip(rstd))) {
            // zipped iterators (not indices) so that the loops carry no bounds checks and
            // vectorize
            for (d, &x) in d.iter_mut().zip(x) {
                d.write((x - mu) * rs);
            }
        }
        // SAFETY: every element of the group's dx was written just above.
        let dx = unsafe { &mut *(dx as *mut [MaybeUninit<T>] as *mut [T]) };
        for (((g, dx), a), b) in g
            .chunks(s.len)
            .zip(dx.chunks(s.len))
            .zip(mean_gw.iter_mut())
            .zip(mean_gwx.iter_mut())
        {
            let (sum_gw, sum_gwx) = match s.weight {
                Some(w) => lanes::dot2(g, w, dx),
                None => (lanes::sum(g), lanes::dot(g, dx)),
            };
            *a = if s.rms { T::zero() } else { sum_gw / n };
            *b = sum_gwx / n;
        }
        let (mut g4, mut x4) = (g.chunks_exact(4 * s.len), dx.chunks_exact(4 * s.len));
        for (g, xh) in (&mut g4).zip(&mut x4) {
            let l = s.len;
            let (dw, db) = (&mut dw[..l], &mut db[..l]);
            let (g0, g1, g2, g3) = (&g[..l], &g[l..2 * l], &g[2 * l..3 * l], &g[3 * l..4 * l]);
            let (x0, x1, x2, x3) = (&xh[..l], &xh[l..2 * l], &xh[2 * l..3 * l], &xh[3 * l..4 * l]);
            for i in 0..l {
                dw[i] += (g0[i] * x0[i] + g1[i] * x1[i]) + (g2[i] * x2[i] + g3[i] * x3[i]);
                db[i] += (g0[i] + g1[i]) + (g2[i] + g3[i]);
            }
        }
        for (g, xh) in g4.remainder().chunks(s.len).zip(x4.remainder().chunks(s.len)) {
            for (((w, b), &g), &xh) in dw.iter_mut().zip(db.iter_mut()).zip(g).zip(xh) {
                *w += g * xh;
                *b += g;
            }
        }
        for ((((g, &rs), dx), &mean_gw), &mean_gwx) in g
            .chunks(s.len)
            .zip(rstd)
            .zip(dx.chunks_mut(s.len))
            .zip(&mean_gw)
            .zip(&mean_gwx)
        {
            match s.weight {
                Some(w) => {
                    for ((d, &g), &w) in dx.iter_mut().zip(g).zip(w) {
                        *d = rs * (g * w - mean_gw - *d * mean_gwx);
                    }
                }
                None => {
                    for (d, &g) in dx.iter_mut().zip(g) {
                        *d = rs * (g - mean_gw - *d * mean_gwx);
                    }
                }
            }
        }
    }
}

simd_dispatch!(norm_backward_rows_f32(s: NormSpec<'_, f32>, x: &[f32], g: &[f32], mean: &[f32], rstd: &[f32], dx: &mut [MaybeUninit<f32>], dw: &mut [f32], db: &mut [f32]) {
    norm_backward_rows(s, x, g, mean, rstd, dx, dw, db)
});

/// Backward of [`norm`]: writes `dx` and returns the `(dweight, dbias)` sums over rows.
pub fn norm_backward<T: Float>(
    s: NormSpec<'_, T>,
    x: &[T],
    g: &[T],
    mean: &[T],
    rstd: &[T],
    dx: &mut [MaybeUninit<T>],
) -> (Vec<T>, Vec<T>) {
    let len = s.len;
    let rows = rows_per_task(len).max(8);
    // Partial sums per fixed block of rows, added in block order: the result does not depend on
    // how the pool schedules the blocks (bit-for-bit reproducible runs).
    let dxs = Chunks::new(dx, rows * len);
    let partials = pool::map(dxs.count(), |i| {
        // SAFETY: `map` calls each block of rows once.
        let dx = unsafe { dxs.take(i) };
        let (x, g) = (&x[i * rows * len..][..dx.len()], &g[i * rows * len..][..dx.len()]);
        let (mean, rstd) = (&mean[i * rows..][..dx.len() / len], &rstd[i * rows..][..dx.len() / len]);
        let (mut dw, mut db) = (vec![T::zero(); len], vec![T::zero(); len]);
        let f32s = (norm_spec_f32(s), as_f32(x), as_f32(g), as_f32(mean), as_f32(rstd));
        match (f32s, as_f32_uninit(dx), as_f32_mut(&mut dw), as_f32_mut(&mut db)) {
            ((Some(sf), Some(xf), Some(gf), Some(mf), Some(rf)), Some(dxf), Some(dwf), Some(dbf)) => {
                norm_backward_rows_f32(sf, xf, gf, mf, rf, dxf, dwf, dbf)
            }
            _ => norm_backward_rows(s, x, g, mean, rstd, dx, &mut dw, &mut db),
        }
        (dw, db)
    });
    let (mut dw, mut db) = (vec![T::zero(); len], vec![T::zero(); len]);
    for (pw, pb) in partials {
        dw.iter_mut().zip(pw).for_each(|(a, b)| *a += b);
        db.iter_mut().zip(pb).for_each(|(a, b)| *a += b);
    }
    (dw, db)
}

// ---------------------------------------------------------------- cross-entropy

/// Per-call constants of the cross-entropy kernels.
#[derive(Clone, Copy)]
pub struct CrossEntropySpec<T> {
    /// Number of classes (row length).
    pub classes: usize,
    pub ignore_index: i64,
    pub smoothing: T,
}

#[inline(always)]
fn cross_entropy_rows<T: Float>(s: CrossEntropySpec<T>, x: &[T], t: &[i64], loss: &mut [T], lse: &mut [T]) {
    let one = T::from_f64(1.0);
    let c = s.classes;
    for (((x, &t), l), out_lse) in x.chunks(c).zip(t).zip(loss.iter_mut()).zip(lse.iter_mut()) {
        let m = lanes::max(x);
        let lse_row = m + lanes::sum_exp(x, m, None).ln();
        *out_lse = lse_row;
        if t == s.ignore_index {
            *l = T::zero();
            continue;
        }
        let nll = lse_row - x[t as usize];
        *l = if s.smoothing == T::zero() {
            nll
        } else {
            let smooth = lse_row - lanes::sum(x) / T::from_usize(c);
            (one - s.smoothing) * nll + s.smoothing * smooth
        };
    }
}

simd_dispatch!(cross_entropy_rows_f32(s: CrossEntropySpec<f32>, x: &[f32], t: &[i64], loss: &mut [f32], lse: &mut [f32]) {
    cross_entropy_rows(s, x, t, loss, lse)
});

fn ce_spec_f32<T: 'static + Copy>(s: CrossEntropySpec<T>) -> Option<CrossEntropySpec<f32>> {
    let smoothing = as_f32(std::slice::from_ref(&s.smoothing))?[0];
    Some(CrossEntropySpec {
        classes: s.classes,
        ignore_index: s.ignore_index,
        smoothing,
    })
}

/// Per-row cross-entropy of `logits` `[N, C]` (0 for ignored rows) and per-row log-sum-exp.
/// Targets were range-checked by the caller.
pub fn cross_entropy<T: Float>(s: CrossEntropySpec<T>, logits: &[T], targets: &[i64], lse: &mut [T]) -> Vec<T> {
    let mut loss = vec![T::zero(); targets.len()];
    let rows = rows_per_task(s.classes);
    let (losses, lses) = (Chunks::new(&mut loss, rows), Chunks::new(lse, rows));
    pool::run(losses.count(), |i| {
        // SAFETY: `run` calls each block of rows once.
        let (loss, lse) = unsafe { (losses.take(i), lses.take(i)) };
        let t = &targets[i * rows..][..loss.len()];
        let x = &logits[i * rows * s.classes..][..loss.len() * s.classes];
        match (ce_spec_f32(s), as_f32(x), as_f32_mut(loss), as_f32_mut(lse)) {
            (Some(sf), Some(xf), Some(lf), Some(ef)) => cross_entropy_rows_f32(sf, xf, t, lf, ef),
            _ => cross_entropy_rows(s, x, t, loss, lse),
        }
    });
    loss
}

#[inline(always)]
fn cross_entropy_backward_rows<T: Float>(
    s: CrossEntropySpec<T>,
    x: &[T],
    t: &[i64],
    lse: &[T],
    dx: &mut [MaybeUninit<T>],
    scale: T,
) {
    let c = s.classes;
    let eps_c = s.smoothing / T::from_usize(c);
    let hit = scale * (T::from_f64(1.0) - s.smoothing);
    for (((dx, x), &t), &l) in dx.chunks_mut(c).zip(x.chunks(c)).zip(t).zip(lse) {
        if t == s.ignore_index {
            dx.iter_mut().for_each(|d| {
                d.write(T::zero());
            });
            continue;
        }
        for (d, &v) in dx.iter_mut().zip(x) {
            d.write(scale * ((v - l).exp_nonpos() - eps_c));
        }
        // SAFETY: the row was written just above; targets were range-checked by the caller.
        *unsafe { dx[t as usize].assume_init_mut() } -= hit;
    }
}

simd_dispatch!(cross_entropy_backward_rows_f32(s: CrossEntropySpec<f32>, x: &[f32], t: &[i64], lse: &[f32], dx: &mut [MaybeUninit<f32>], scale: f32) {
    cross_entropy_backward_rows(s, x, t, lse, dx, scale)
});

/// Gradient of the mean cross-entropy: `dx = scale * (softmax - (1 - ε) onehot - ε / C)` on
/// non-ignored rows, 0 on ignored ones; `scale` is `grad_out / n_valid`.
pub fn cross_entropy_backward<T: Float>(
    s: CrossEntropySpec<T>,
    logits: &[T],
    targets: &[i64],
    lse: &[T],
    dx: &mut [MaybeUninit<T>],
    scale: T,
) {
    let c = s.classes;
    let rows = rows_per_task(c);
    pool::for_each_chunk(dx, rows * c, |i, dx| {
        let x = &logits[i * rows * c..][..dx.len()];
        let (t, lse) = (&targets[i * rows..][..dx.len() / c], &lse[i * rows..][..dx.len() / c]);
        let scale_f = as_f32(std::slice::from_ref(&scale)).map(|v| v[0]);
        match (ce_spec_f32(s), as_f32(x), as_f32(lse), as_f32_uninit(dx), scale_f) {
            (Some(sf), Some(xf), Some(lf), Some(df), Some(sc)) => {
                cross_entropy_backward_rows_f32(sf, xf, t, lf, df, sc)
            }
            _ => cross_entropy_backward_rows(s, x, t, lse, dx, scale),
        }
    });
}
