//! Reduction kernels for contiguous float data: over trailing dims (rows) or leading dims
//! (columns). Other dim sets are handled by permuting first (`ops/reduce.rs`).

use super::elementwise::simd_dispatch;
use super::lanes;
use super::pool;
use crate::dtype::Float;
use crate::op::ReduceOp;

#[inline(always)]
fn rows<T: Float>(op: ReduceOp, x: &[T], len: usize, out: &mut [T]) {
    for (o, r) in out.iter_mut().zip(x.chunks(len)) {
        *o = match op {
            ReduceOp::Sum => T::from_f64(lanes::sum_blocked(r)),
            ReduceOp::Mean => T::from_f64(lanes::sum_blocked(r) / len as f64),
            ReduceOp::Max => lanes::max(r),
            ReduceOp::Min => lanes::min(r),
        };
    }
}

simd_dispatch!(rows_f32(op: ReduceOp, x: &[f32], len: usize, out: &mut [f32]) {
    rows(op, x, len, out)
});

/// Reduces each row of length `len` (`out.len()` rows).
pub fn reduce_rows<T: Float>(op: ReduceOp, x: &[T], len: usize, out: &mut [T]) {
    let per_task = (super::PARALLEL_THRESHOLD / len.max(1)).max(1);
    pool::for_each_chunk(out, per_task, |i, o| {
        let x = &x[i * per_task * len..][..o.len() * len];
        if let (Some(xf), Some(of)) = (super::f32_view::as_f32(x), super::f32_view::as_f32_mut(o)) {
            rows_f32(op, xf, len, of)
        } else {
            rows(op, x, len, o)
        }
    });
}

#[inline(always)]
fn columns<T: Float>(op: ReduceOp, x: &[T], inner: usize, acc: &mut [T]) {
    for r in x.chunks(inner) {
        match op {
            ReduceOp::Sum | ReduceOp::Mean => {
                for (a, &v) in acc.iter_mut().zip(r) {
                    *a += v;
                }
            }
            ReduceOp::Max => {
                for (a, &v) in acc.iter_mut().zip(r) {
                    *a = if v > *a || crate::dtype::is_nan(v) { v } else { *a };
                }
            }
            ReduceOp::Min => {
                for (a, &v) in acc.iter_mut().zip(r) {
                    *a = if v < *a || crate::dtype::is_nan(v) { v } else { *a };
                }
            }
        }
    }
}

simd_dispatch!(columns_f32(op: ReduceOp, x: &[f32], inner: usize, acc: &mut [f32]) {
    columns(op, x, inner, acc)
});

/// Rows per block of the column reduction.
pub(crate) const COLUMN_BLOCK_ROWS: usize = 256;

/// The column reduction's starting value.
fn column_init<T: Float>(op: ReduceOp) -> T {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => T::zero(),
        ReduceOp::Max => T::neg_infinity(),
        ReduceOp::Min => -T::neg_infinity(),
    }
}

/// One block of [`reduce_columns`]: the rows of `x` (`[rows, inner]`) reduced in order into a new
/// `[inner]` partial. For kernels that produce a block themselves and reduce it in cache.
pub(crate) fn block_partial<T: Float>(op: ReduceOp, x: &[T], inner: usize) -> Vec<T> {
    let mut acc = vec![column_init(op); inner];
    if let (Some(xf), Some(af)) = (super::f32_view::as_f32(x), super::f32_view::as_f32_mut(&mut acc)) {
        columns_f32(op, xf, inner, af);
    } else {
        columns(op, x, inner, &mut acc);
    }
    acc
}

/// The blocks' partials combined in block order (before Mean's scaling).
pub(crate) fn combine_partials<T: Float>(op: ReduceOp, partials: &[Vec<T>], inner: usize) -> Vec<T> {
    let mut acc = vec![column_init(op); inner];
    for p in partials {
        columns(op, p, inner, &mut acc);
    }
    acc
}

/// Reduces the middle dim of `x` (`[outer, mid, inner]`) into `out` (`[outer, inner]`): each
/// `[mid, inner]` slice as [`reduce_columns`] reduces its rows (blocks of rows combined in
/// order), the slices in parallel. The sum of a gradient over the heads an `expand` repeated.
pub fn reduce_middle<T: Float>(op: ReduceOp, x: &[T], mid: usize, inner: usize, out: &mut [T]) {
    let slice = mid * inner;
    let per_task = (crate::cpu::PARALLEL_THRESHOLD / slice.max(1)).max(1);
    let scale = if op == ReduceOp::Mean {
        T::from_f64(1.0 / mid as f64)
    } else {
        T::from_f64(1.0)
    };
    pool::for_each_chunk(out, per_task * inner, |c, o| {
        for (j, o) in o.chunks_mut(inner).enumerate() {
            let xs = &x[(c * per_task + j) * slice..][..slice];
            let block_len = (COLUMN_BLOCK_ROWS * inner).max(1);
            let partials: Vec<Vec<T>> = xs.chunks(block_len).map(|b| block_partial(op, b, inner)).collect();
            for (o, a) in o.iter_mut().zip(combine_partials(op, &partials, inner)) {
                *o = a * scale;
            }
        }
    });
}

/// Reduces the leading `outer` rows of `x` (`[outer, inner]`) into `out` (`[inner]`). Each task
/// reduces a block of rows into its own accumulator; blocks combine at the end.
pub fn reduce_columns<T: Float>(op: ReduceOp, x: &[T], outer: usize, inner: usize, out: &mut [T]) {
    // Fixed blocks of rows, combined in block order: the result depends neither on the thread
    // count nor on scheduling.
    let block_len = (COLUMN_BLOCK_ROWS * inner).max(1);
    let partials = pool::map(x.len().div_ceil(block_len), |i| {
        block_partial(op, &x[i * block_len..x.len().min((i + 1) * block_len)], inner)
    });
    let acc = combine_partials(op, &partials, inner);
    let scale = if op == ReduceOp::Mean {
        T::from_f64(1.0 / outer as f64)
    } else {
        T::from_f64(1.0)
    };
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a * scale;
    }
}
