//! Fused scaled-dot-product attention, forward and backward, tiled over blocks of queries.
//!
//! Per (batch, head) and per block of queries (`BLOCK_Q`, or `BLOCK_Q_CAUSAL` with the causal
//! mask), scores against the keys the block may see are computed with one small product
//! (`small_gemm.rs`, on the keys transposed once per problem), softmaxed in place and multiplied
//! into V with another; only the per-row log-sum-exp is kept for the backward, which recomputes the
//! probabilities block by block (as FlashAttention does). Scratch memory per task: a block of
//! scores and the transposed keys (and values), linear in T.

use super::elementwise::simd_dispatch;
use super::f32_view::{as_f32, as_f32_mut};
use super::lanes;
use super::pool;
use super::small_gemm::{product, Lhs, Out, Rhs};
use crate::dtype::Float;

/// Queries per tile, at most (and the rule's tile without the causal mask). Causal attention uses
/// tiles of [`BLOCK_Q_CAUSAL`] by rule, so that less of each tile's scores lies above the
/// diagonal (computed, then masked); an autotuning search may choose 16, 32 or 64 for a shape
/// ([`crate::tune`], kernel `attention`). Each row's softmax runs over its own visible keys
/// (rounded up to 16), whatever the tile.
pub const BLOCK_Q: usize = 64;
pub const BLOCK_Q_CAUSAL: usize = 16;

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
    /// Consecutive problems per parallel task (at least 1). Problems whose outputs interleave in
    /// memory (the heads of one batch element in a `[B, T, H * D]` output: 128-byte pieces of each
    /// row, unaligned to cache lines) go to one task, or two cores would write the same lines.
    /// The backward rounds it up to a multiple of `kv_group` (a task alone writes a group's
    /// key and value gradients).
    pub group: usize,
    /// Query problems per key/value problem (grouped-query attention; 1 without): problem `b`
    /// reads keys and values `b / kv_group`, and the backward sums the `kv_group` problems'
    /// gradients of them, in order of `b`.
    pub kv_group: usize,
}

impl AttnDims {
    /// Queries per tile of this problem for `pass` (`"forward"` or `"backward"`): the rule's, or
    /// a tuned choice. Called on the thread that runs the op (a search forces variants there).
    fn tile<T>(&self, pass: &str) -> usize {
        let variant = crate::tune::pick(crate::tune::Kernel::Attention, || {
            format!(
                "{} {pass} bh={} t={} s={} d={} dv={} causal={} threads={}",
                std::any::type_name::<T>(),
                self.bh,
                self.t,
                self.s,
                self.d,
                self.dv,
                self.causal,
                super::threads::num_threads()
            )
        });
        let tile = match variant {
            1 => 16,
            2 => 32,
            3 => 64,
            _ if self.causal => BLOCK_Q_CAUSAL,
            _ => BLOCK_Q,
        };
        // never more queries than there are (variants that come to the same tile are one choice)
        let tile = tile.min(self.t.next_multiple_of(16).max(16));
        crate::tune::plan(|| format!("{tile} queries per tile"));
        tile
    }

    /// Keys a block of `rows` queries from `q0` sees (its scores' width).
    #[inline]
    fn keys_of_block(&self, q0: usize, rows: usize) -> usize {
        if self.causal {
            (q0 + rows).min(self.s)
        } else {
            self.s
        }
    }

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

/// A scratch buffer with rows `row_stride` apart as a product output.
fn out<T>(p: &mut [T], row_stride: usize) -> Out<T> {
    Out {
        ptr: p.as_mut_ptr(),
        row_stride,
    }
}

/// Masks a block of raw scores (`rows x kv`, `rows <= BLOCK_Q`) for [`softmax_block`] and
/// [`exp_block`]: each row's hidden keys up to the next multiple of 16 get -inf (exp 0), so that
/// the row's exponentials run in whole vectors instead of a scalar tail of up to 15 elements,
/// and the rest of the row is 0. Returns where each row's exponentials end.
#[inline(always)]
fn mask_block<T: Float>(dims: AttnDims, q0: usize, rows: usize, kv: usize, p: &mut [T]) -> [usize; BLOCK_Q] {
    // the per-row arrays of the callers hold BLOCK_Q rows (checked: a longer tile would lose rows)
    assert!(rows <= BLOCK_Q, "attention tile of {rows} rows");
    let mut ends = [0usize; BLOCK_Q];
    for (r, (row, end)) in p.chunks_exact_mut(kv).zip(ends.iter_mut()).take(rows).enumerate() {
        let vis = dims.visible(q0 + r);
        *end = vis.next_multiple_of(16).min(kv);
        row[vis..*end].fill(T::neg_infinity());
        row[*end..].fill(T::zero());
    }
    ends
}

/// The forward's softmax of a block of raw scores (already scaled), in place: probabilities over
/// each row's visible keys (0 beyond), and each row's log-sum-exp into `lse`.
///
/// Each step runs over all rows before the next (masks, maxima, exponentials, scaling): a row's
/// steps form one chain of dependent reductions of a few vectors each, and the chains of
/// different rows only overlap when they sit in a loop of their own.
#[inline(always)]
fn softmax_block<T: Float>(dims: AttnDims, q0: usize, rows: usize, kv: usize, p: &mut [T], lse: &mut [T]) {
    let ends = mask_block(dims, q0, rows, kv, p);
    let (mut max, mut sum) = ([T::zero(); BLOCK_Q], [T::zero(); BLOCK_Q]);
    for ((row, &end), m) in p.chunks_exact(kv).zip(&ends).zip(max.iter_mut()).take(rows) {
        *m = lanes::max(&row[..end]);
    }
    for (((row, &end), &m), s) in p
        .chunks_exact_mut(kv)
        .zip(&ends)
        .zip(&max)
        .zip(sum.iter_mut())
        .take(rows)
    {
        *s = lanes::exp_in_place(&mut row[..end], m);
    }
    let one = T::from_f64(1.0);
    for ((((row, &end), &m), &s), l) in p
        .chunks_exact_mut(kv)
        .zip(&ends)
        .zip(&max)
        .zip(&sum)
        .zip(lse.iter_mut())
        .take(rows)
    {
        let inv = one / s;
        for x in row[..end].iter_mut() {
            *x *= inv;
        }
        *l = m + s.ln();
    }
}

/// The backward's recomputation: probabilities `exp(score - lse)` of a block of raw scores, in
/// place, from the forward's log-sum-exp per row.
#[inline(always)]
fn exp_block<T: Float>(dims: AttnDims, q0: usize, rows: usize, kv: usize, p: &mut [T], lse: &[T]) {
    let ends = mask_block(dims, q0, rows, kv, p);
    for ((row, &end), &l) in p.chunks_exact_mut(kv).zip(&ends).zip(lse).take(rows) {
        lanes::exp_sub_in_place(&mut row[..end], l);
    }
}

simd_dispatch!(softmax_block_f32(dims: AttnDims, q0: usize, rows: usize, kv: usize, p: &mut [f32], lse: &mut [f32]) {
    softmax_block(dims, q0, rows, kv, p, lse)
});

simd_dispatch!(exp_block_f32(dims: AttnDims, q0: usize, rows: usize, kv: usize, p: &mut [f32], lse: &[f32]) {
    exp_block(dims, q0, rows, kv, p, lse)
});

/// The log-sum-exp of a query block's rows: computed (forward) or given (backward).
enum Lse<'a, T> {
    Compute(&'a mut [T]),
    Given(&'a [T]),
}

/// Probabilities of a query block: the scores `scale q kt[:, :kv]` (`kt` is the problem's keys
/// transposed, `[d, s]`), then [`softmax_block`] or [`exp_block`].
#[allow(clippy::too_many_arguments)]
fn block_probs<T: Float + Default>(
    dims: &AttnDims,
    q: &[T],
    q_stride: usize,
    kt: &[T],
    q0: usize,
    rows: usize,
    kv: usize,
    scale: T,
    p: &mut [T],
    lse: Lse<'_, T>,
) {
    let lhs = Lhs::rows(q, q_stride);
    let rhs = Rhs::rows(kt, dims.s);
    // SAFETY: p holds rows x kv, this task's own scratch.
    unsafe { product(rows, kv, dims.d, lhs, rhs, out(p, kv), scale, false) };
    match lse {
        Lse::Compute(l) => match (as_f32_mut(p), as_f32_mut(l)) {
            (Some(pf), Some(lf)) => softmax_block_f32(*dims, q0, rows, kv, pf, lf),
            _ => softmax_block(*dims, q0, rows, kv, p, l),
        },
        Lse::Given(l) => match (as_f32_mut(p), as_f32(l)) {
            (Some(pf), Some(lf)) => exp_block_f32(*dims, q0, rows, kv, pf, lf),
            _ => exp_block(*dims, q0, rows, kv, p, l),
        },
    }
}

/// `ds = p * (dp - D_r)` in place in `dp`, with `D_r = dot(o_r, dout_r)` given per row.
#[inline(always)]
fn softmax_grad_block<T: Float>(rows: usize, kv: usize, di: &[T], p: &[T], dp: &mut [T]) {
    for r in 0..rows {
        let di = di[r];
        for (d, &pv) in dp[r * kv..(r + 1) * kv].iter_mut().zip(&p[r * kv..(r + 1) * kv]) {
            *d = pv * (*d - di);
        }
    }
}

simd_dispatch!(softmax_grad_block_f32(rows: usize, kv: usize, di: &[f32], p: &[f32], dp: &mut [f32]) {
    softmax_grad_block(rows, kv, di, p, dp)
});

/// `kt[c * s + j] = k[j, c]`: one problem's keys (or values) transposed, `[d, s]`.
fn transpose_into<T: Copy + 'static>(k: &[T], row_stride: usize, s: usize, d: usize, kt: &mut [T]) {
    super::transpose::transpose(k, row_stride, s, d, kt, s);
}

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

impl<T: Float> MatsMut<'_, T> {
    /// Matrix `i` from row `r` on, as a product output.
    fn at(&self, i: usize, r: usize) -> Out<T> {
        debug_assert!(self.offsets[i] + r * self.row_stride <= self.len);
        Out {
            ptr: self.ptr.wrapping_add(self.offsets[i] + r * self.row_stride),
            row_stride: self.row_stride,
        }
    }

    /// Sets `rows` rows of `cols` elements of matrix `i` to zero.
    ///
    /// # Safety
    /// The rows must lie inside the buffer and belong to the calling task.
    unsafe fn zero(&self, i: usize, rows: usize, cols: usize) {
        for r in 0..rows {
            let o = self.at(i, r);
            // SAFETY: as the caller promises.
            unsafe { std::slice::from_raw_parts_mut(o.ptr, cols) }.fill(T::zero());
        }
    }
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
    let AttnDims { t, s, d, dv, .. } = dims;
    let one = T::from_f64(1.0);
    let o = &o;
    let group = dims.group.max(1);
    let kv_group = dims.kv_group.max(1);
    let block = dims.tile::<T>("forward");
    pool::for_each_chunk(lse, t.max(1) * group, |task, lse_group| {
        let mut p = vec![T::zero(); block * s];
        let mut kt = vec![T::zero(); d * s];
        let mut kt_of = None;
        for (i, lse) in lse_group.chunks_mut(t.max(1)).enumerate() {
            let b = task * group + i;
            let kb = b / kv_group;
            if kt_of != Some(kb) {
                // the problems of a group share their keys: transposed once
                transpose_into(k.at(kb, 0), k.row_stride, s, d, &mut kt);
                kt_of = Some(kb);
            }
            for q0 in (0..t).step_by(block) {
                let rows = block.min(t - q0);
                let kv = dims.keys_of_block(q0, rows);
                if kv == 0 {
                    // no visible key: zero output (as the softmax of nothing times v)
                    // SAFETY: this task's rows of o.
                    unsafe { o.zero(b, rows, dv) };
                    continue;
                }
                let p = &mut p[..rows * kv];
                block_probs(
                    &dims,
                    q.at(b, q0),
                    q.row_stride,
                    &kt,
                    q0,
                    rows,
                    kv,
                    scale,
                    p,
                    Lse::Compute(&mut lse[q0..q0 + rows]),
                );
                let lhs = Lhs::rows(&*p, kv);
                let rhs = Rhs::rows(v.at(kb, 0), v.row_stride);
                // SAFETY: rows q0.. of this task's matrix of o.
                unsafe { product(rows, dv, kv, lhs, rhs, o.at(b, q0), one, false) };
            }
        }
    });
}

/// Backward: gradients of q, k, v from the forward's inputs, output `o`, `lse` and `dout`,
/// written into `dq` `[t, d]`, `dk` `[s, d]` and `dv` `[s, dv]` per problem (any row strides).
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
    dq: MatsMut<T>,
    dk: MatsMut<T>,
    dv_out: MatsMut<T>,
) {
    let AttnDims { t, s, d, dv, .. } = dims;
    let one = T::from_f64(1.0);
    let (dq, dk, dv_out) = (&dq, &dk, &dv_out);
    let kv_group = dims.kv_group.max(1);
    // whole groups per task: it alone writes their dk and dv
    let group = dims.group.max(1).next_multiple_of(kv_group);
    let block = dims.tile::<T>("backward");
    pool::run(dims.bh.div_ceil(group), |task| {
        let mut p = vec![T::zero(); block * s];
        let mut dp = vec![T::zero(); block * s];
        let mut kt = vec![T::zero(); d * s];
        let mut vt = vec![T::zero(); dv * s];
        let mut di = vec![T::zero(); block];
        // the gradients of shared keys and values from a group's later problems, added to the
        // first's once complete (the sum a repeat of k and v would take over the repeats)
        let (mut dk_part, mut dv_part) = if kv_group > 1 {
            (vec![T::zero(); s * d], vec![T::zero(); s * dv])
        } else {
            (Vec::new(), Vec::new())
        };
        for b in task * group..((task + 1) * group).min(dims.bh) {
            let lse_b = &lse[b * t..(b + 1) * t];
            let kb = b / kv_group;
            let first = b.is_multiple_of(kv_group);
            if first {
                // SAFETY: key/value problem kb's gradients belong to this task (its problems
                // include the whole group).
                unsafe {
                    dk.zero(kb, s, d);
                    dv_out.zero(kb, s, dv);
                }
                transpose_into(k.at(kb, 0), k.row_stride, s, d, &mut kt);
                transpose_into(v.at(kb, 0), v.row_stride, s, dv, &mut vt);
            } else {
                dk_part.fill(T::zero());
                dv_part.fill(T::zero());
            }
            // where this problem's dk and dv accumulate
            let (dk_b, dv_b) = if first {
                (dk.at(kb, 0), dv_out.at(kb, 0))
            } else {
                (out(&mut dk_part, d), out(&mut dv_part, dv))
            };
            for q0 in (0..t).step_by(block) {
                let rows = block.min(t - q0);
                let kv = dims.keys_of_block(q0, rows);
                if kv == 0 {
                    unsafe { dq.zero(b, rows, d) };
                    continue;
                }
                let (p, dp) = (&mut p[..rows * kv], &mut dp[..rows * kv]);
                let (qb, qs) = (q.at(b, q0), q.row_stride);
                block_probs(
                    &dims,
                    qb,
                    qs,
                    &kt,
                    q0,
                    rows,
                    kv,
                    scale,
                    p,
                    Lse::Given(&lse_b[q0..q0 + rows]),
                );
                let gb = dout.at(b, q0);
                for (r, di) in di[..rows].iter_mut().enumerate() {
                    *di = lanes::dot(&o.at(b, q0 + r)[..dv], &dout.at(b, q0 + r)[..dv]);
                }
                let g = Lhs::rows(gb, dout.row_stride);
                let g_rows = Rhs::rows(gb, dout.row_stride);
                unsafe {
                    // dV[:kv] += P^T dO
                    let pt = Lhs::transposed(&*p, kv);
                    product(kv, dv, rows, pt, g_rows, dv_b, one, true);
                    // dP = dO V^T
                    let vtr = Rhs::rows(&vt, s);
                    product(rows, kv, dv, g, vtr, out(dp, kv), one, false);
                }
                match (as_f32(&di[..rows]), as_f32(p), as_f32_mut(dp)) {
                    (Some(df), Some(pf), Some(dpf)) => softmax_grad_block_f32(rows, kv, df, pf, dpf),
                    _ => softmax_grad_block(rows, kv, &di[..rows], p, dp),
                }
                unsafe {
                    // dQ = scale dS K
                    let ds = Lhs::rows(&*dp, kv);
                    let kr = Rhs::rows(k.at(kb, 0), k.row_stride);
                    product(rows, d, kv, ds, kr, dq.at(b, q0), scale, false);
                    // dK[:kv] += scale dS^T Q
                    let dst = Lhs::transposed(&*dp, kv);
                    let qr = Rhs::rows(qb, qs);
                    product(kv, d, rows, dst, qr, dk_b, scale, true);
                }
            }
            if !first {
                // SAFETY: key/value problem kb's gradients belong to this task.
                unsafe {
                    add_rows(dk, kb, &dk_part, s, d);
                    add_rows(dv_out, kb, &dv_part, s, dv);
                }
            }
        }
    });
}

/// Adds `part` (`rows x cols`, dense) into matrix `i` of `m`.
///
/// # Safety
/// The rows must lie inside the buffer and belong to the calling task.
unsafe fn add_rows<T: Float>(m: &MatsMut<T>, i: usize, part: &[T], rows: usize, cols: usize) {
    if cols == 0 {
        return;
    }
    for (r, src) in part.chunks_exact(cols).take(rows).enumerate() {
        let o = m.at(i, r);
        // SAFETY: as the caller promises.
        let dst = unsafe { std::slice::from_raw_parts_mut(o.ptr, cols) };
        for (d, &x) in dst.iter_mut().zip(src) {
            *d += x;
        }
    }
}
