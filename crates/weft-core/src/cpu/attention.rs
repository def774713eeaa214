//! Fused scaled-dot-product attention, forward and backward, tiled over blocks of queries.
//!
//! Per (batch, head) and per block of `BLOCK_Q` queries, scores against the keys the block may see
//! are computed with one gemm, softmaxed in place and multiplied into V with another; only the
//! per-row log-sum-exp is kept for the backward, which recomputes the probabilities block by block
//! (as FlashAttention does). Scratch memory is `BLOCK_Q x T` per task: linear in T per query row.

use rayon::prelude::*;

use super::elementwise::simd_dispatch;
use super::f32_view::{as_f32, as_f32_mut};
use super::lanes;
use super::matmul::{gemm, mat, mat_t, MatMut};
use crate::dtype::Float;

/// Queries per tile.
pub const BLOCK_Q: usize = 64;

/// Sizes of one attention call: `bh` (batch x heads) independent problems of `t` queries, `s`
/// keys, head dim `d` (queries and keys) and `dv` (values).
#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    pub bh: usize,
    pub t: usize,
    pub s: usize,
    pub d: usize,
    pub dv: usize,
    pub causal: bool,
}

impl AttnDims {
    /// Keys visible to query row `i`.
    #[inline]
    fn visible(&self, i: usize) -> usize {
        if self.causal {
            (i + 1).min(self.s)
        } else {
            self.s
        }
    }
}

fn out<T>(p: &mut [T], row_stride: usize, accumulate: bool) -> MatMut<T> {
    MatMut {
        ptr: p.as_mut_ptr(),
        row_stride: row_stride as isize,
        accumulate,
    }
}

/// Turns a block of raw scores (`rows x kv`, already scaled) into probabilities over each row's
/// visible keys (0 beyond). Without `have_lse` the softmax is computed and each row's log-sum-exp
/// stored in `lse`; with it, probabilities are `exp(score - lse)` (the backward's recomputation).
#[inline(always)]
fn probs_in_place<T: Float>(
    dims: AttnDims,
    q0: usize,
    rows: usize,
    kv: usize,
    p: &mut [T],
    lse: &mut [T],
    have_lse: bool,
) {
    let one = T::from_f64(1.0);
    for r in 0..rows {
        let vis = dims.visible(q0 + r);
        let row = &mut p[r * kv..(r + 1) * kv];
        if have_lse {
            lanes::exp_in_place(&mut row[..vis], lse[r]);
        } else {
            let m = lanes::max(&row[..vis]);
            let sum = lanes::exp_in_place(&mut row[..vis], m);
            let inv = one / sum;
            for x in row[..vis].iter_mut() {
                *x *= inv;
            }
            lse[r] = m + sum.ln();
        }
        for x in row[vis..].iter_mut() {
            *x = T::zero();
        }
    }
}

simd_dispatch!(probs_in_place_f32(dims: AttnDims, q0: usize, rows: usize, kv: usize, p: &mut [f32], lse: &mut [f32], have_lse: bool) {
    probs_in_place(dims, q0, rows, kv, p, lse, have_lse)
});

/// Probabilities of a query block (see [`probs_in_place`]): one gemm for the scores, then the
/// row softmax.
#[allow(clippy::too_many_arguments)]
fn block_probs<T: Float + Default>(
    dims: &AttnDims,
    q: &[T],
    q_stride: usize,
    k: &[T],
    k_stride: usize,
    q0: usize,
    rows: usize,
    kv: usize,
    scale: T,
    p: &mut [T],
    lse: &mut [T],
    have_lse: bool,
) {
    let one = T::from_f64(1.0);
    // SAFETY: q holds rows x d and k holds kv x d at their strides; p holds rows x kv.
    unsafe {
        gemm(
            rows,
            kv,
            dims.d,
            out(p, kv, false),
            mat(q, q_stride),
            mat_t(k, k_stride),
            one,
            scale,
            false,
        )
    };
    match (as_f32_mut(p), as_f32_mut(lse)) {
        (Some(pf), Some(lf)) => probs_in_place_f32(*dims, q0, rows, kv, pf, lf, have_lse),
        _ => probs_in_place(*dims, q0, rows, kv, p, lse, have_lse),
    }
}

/// `ds = p * (dp - D_r)` in place in `dp`, with `D_r = dot(o_r, dout_r)`.
#[inline(always)]
fn softmax_grad_block<T: Float>(rows: usize, kv: usize, dv: usize, o: &[T], dout: &[T], p: &[T], dp: &mut [T]) {
    for r in 0..rows {
        let di = lanes::dot(&o[r * dv..(r + 1) * dv], &dout[r * dv..(r + 1) * dv]);
        for (d, &pv) in dp[r * kv..(r + 1) * kv].iter_mut().zip(&p[r * kv..(r + 1) * kv]) {
            *d = pv * (*d - di);
        }
    }
}

simd_dispatch!(softmax_grad_block_f32(rows: usize, kv: usize, dv: usize, o: &[f32], dout: &[f32], p: &[f32], dp: &mut [f32]) {
    softmax_grad_block(rows, kv, dv, o, dout, p, dp)
});

/// `bh` matrices inside one buffer: matrix `i` starts at `offsets[i]`, its rows are `row_stride`
/// elements apart and its columns contiguous (a `[.., T, D]` view whose last dim has stride 1).
#[derive(Clone, Copy)]
pub struct Mats<'a, T> {
    pub data: &'a [T],
    pub offsets: &'a [usize],
    pub row_stride: usize,
}

impl<'a, T> Mats<'a, T> {
    /// Matrix `i` from row `r` on.
    #[inline]
    fn at(&self, i: usize, r: usize) -> &'a [T] {
        &self.data[self.offsets[i] + r * self.row_stride..]
    }
}

/// Output matrices written by parallel tasks, each task its own matrix.
pub struct MatsMut<'a, T> {
    pub ptr: *mut T,
    pub len: usize,
    pub offsets: &'a [usize],
    pub row_stride: usize,
}

// SAFETY: tasks write disjoint matrices (distinct offsets, validated by the caller's layout).
unsafe impl<T: Send> Send for MatsMut<'_, T> {}
unsafe impl<T: Send> Sync for MatsMut<'_, T> {}

/// Forward: `o = softmax(scale q k^T (+ causal mask)) v`, and the per-row log-sum-exp.
/// Matrices: q `[t, d]`, k `[s, d]`, v `[s, dv]`, o `[t, dv]` per problem; lse `[bh, t]`
/// contiguous.
pub fn forward<T: Float + Default>(
    dims: AttnDims,
    q: Mats<T>,
    k: Mats<T>,
    v: Mats<T>,
    scale: T,
    o: MatsMut<T>,
    lse: &mut [T],
) {
    super::threads::init();
    let AttnDims { t, s, dv, .. } = dims;
    let one = T::from_f64(1.0);
    let o = &o;
    lse.par_chunks_mut(t.max(1)).enumerate().for_each(|(b, lse)| {
        let mut p = vec![T::zero(); BLOCK_Q * s];
        for q0 in (0..t).step_by(BLOCK_Q) {
            let rows = BLOCK_Q.min(t - q0);
            let kv = if dims.causal { (q0 + rows).min(s) } else { s };
            if kv == 0 {
                continue;
            }
            let p = &mut p[..rows * kv];
            block_probs(
                &dims,
                q.at(b, q0),
                q.row_stride,
                k.at(b, 0),
                k.row_stride,
                q0,
                rows,
                kv,
                scale,
                p,
                &mut lse[q0..q0 + rows],
                false,
            );
            debug_assert!(o.offsets[b] + (q0 + rows - 1) * o.row_stride + dv <= o.len);
            let dst = MatMut {
                ptr: o.ptr.wrapping_add(o.offsets[b] + q0 * o.row_stride),
                row_stride: o.row_stride as isize,
                accumulate: false,
            };
            // SAFETY: p is rows x kv, v holds kv x dv at its stride, dst is this task's rows of o.
            unsafe {
                gemm(
                    rows,
                    dv,
                    kv,
                    dst,
                    mat(p, kv),
                    mat(v.at(b, 0), v.row_stride),
                    one,
                    one,
                    false,
                )
            };
        }
    });
}

/// Backward: gradients of q, k, v (written contiguous: `[bh, t, d]`, `[bh, s, d]`, `[bh, s, dv]`)
/// from the forward's inputs, output `o`, `lse` and `dout`.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Float + Default>(
    dims: AttnDims,
    q: Mats<T>,
    k: Mats<T>,
    v: Mats<T>,
    o: Mats<T>,
    lse: &[T],
    dout: Mats<T>,
    scale: T,
    dq: &mut [T],
    dk: &mut [T],
    dv_out: &mut [T],
) {
    super::threads::init();
    let AttnDims { t, s, d, dv, .. } = dims;
    let one = T::from_f64(1.0);
    dq.par_chunks_mut(t * d)
        .zip(dk.par_chunks_mut(s * d).zip(dv_out.par_chunks_mut(s * dv)))
        .enumerate()
        .for_each(|(b, (dq, (dk, dvb)))| {
            let mut lse_b = lse[b * t..(b + 1) * t].to_vec();
            dk.iter_mut().for_each(|x| *x = T::zero());
            dvb.iter_mut().for_each(|x| *x = T::zero());
            let mut p = vec![T::zero(); BLOCK_Q * s];
            let mut dp = vec![T::zero(); BLOCK_Q * s];
            // rows of o and dout of this block, gathered contiguous for the row dots
            let mut ob = vec![T::zero(); BLOCK_Q * dv];
            let mut gb = vec![T::zero(); BLOCK_Q * dv];
            for q0 in (0..t).step_by(BLOCK_Q) {
                let rows = BLOCK_Q.min(t - q0);
                let kv = if dims.causal { (q0 + rows).min(s) } else { s };
                if kv == 0 {
                    dq[q0 * d..(q0 + rows) * d].iter_mut().for_each(|x| *x = T::zero());
                    continue;
                }
                let (p, dp) = (&mut p[..rows * kv], &mut dp[..rows * kv]);
                let (qb, qs) = (q.at(b, q0), q.row_stride);
                block_probs(
                    &dims,
                    qb,
                    qs,
                    k.at(b, 0),
                    k.row_stride,
                    q0,
                    rows,
                    kv,
                    scale,
                    p,
                    &mut lse_b[q0..q0 + rows],
                    true,
                );
                for r in 0..rows {
                    ob[r * dv..(r + 1) * dv].copy_from_slice(&o.at(b, q0 + r)[..dv]);
                    gb[r * dv..(r + 1) * dv].copy_from_slice(&dout.at(b, q0 + r)[..dv]);
                }
                let (ob, gb) = (&ob[..rows * dv], &gb[..rows * dv]);
                // SAFETY (all gemms below): operand sizes follow from rows, kv, d, dv as allocated.
                unsafe {
                    // dV[:kv] += P^T dO
                    gemm(
                        kv,
                        dv,
                        rows,
                        out(dvb, dv, true),
                        mat_t(p, kv),
                        mat(gb, dv),
                        one,
                        one,
                        false,
                    );
                    // dP = dO V^T
                    gemm(
                        rows,
                        kv,
                        dv,
                        out(dp, kv, false),
                        mat(gb, dv),
                        mat_t(v.at(b, 0), v.row_stride),
                        one,
                        one,
                        false,
                    );
                }
                match (as_f32(ob), as_f32(gb), as_f32(p), as_f32_mut(dp)) {
                    (Some(of), Some(gf), Some(pf), Some(df)) => softmax_grad_block_f32(rows, kv, dv, of, gf, pf, df),
                    _ => softmax_grad_block(rows, kv, dv, ob, gb, p, dp),
                }
                unsafe {
                    // dQ = scale dS K
                    gemm(
                        rows,
                        d,
                        kv,
                        out(&mut dq[q0 * d..], d, false),
                        mat(dp, kv),
                        mat(k.at(b, 0), k.row_stride),
                        one,
                        scale,
                        false,
                    );
                    // dK[:kv] += scale dS^T Q
                    gemm(
                        kv,
                        d,
                        rows,
                        out(dk, d, true),
                        mat_t(dp, kv),
                        mat(qb, qs),
                        one,
                        scale,
                        false,
                    );
                }
            }
        });
}
