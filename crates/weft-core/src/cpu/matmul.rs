//! Matrix multiply through the `gemm` crate (runtime-dispatched AVX-512/AVX2/scalar kernels).

use gemm::Parallelism;

/// One strided matrix operand: element `(i, j)` lives at `ptr + i * row_stride + j * col_stride`.
#[derive(Clone, Copy)]
pub struct MatRef<T> {
    pub ptr: *const T,
    pub row_stride: isize,
    pub col_stride: isize,
}

/// A row-major matrix at `p` whose rows are `row_stride` elements apart.
pub fn mat<T>(p: &[T], row_stride: usize) -> MatRef<T> {
    MatRef {
        ptr: p.as_ptr(),
        row_stride: row_stride as isize,
        col_stride: 1,
    }
}

/// The transpose of the row-major matrix at `p` (rows `row_stride` apart), read in place.
pub fn mat_t<T>(p: &[T], row_stride: usize) -> MatRef<T> {
    MatRef {
        ptr: p.as_ptr(),
        row_stride: 1,
        col_stride: row_stride as isize,
    }
}

/// Where a product goes: a row-major matrix with `row_stride` between rows, overwritten or, with
/// `accumulate`, added to.
#[derive(Clone, Copy)]
pub struct MatMut<T> {
    pub ptr: *mut T,
    pub row_stride: isize,
    pub accumulate: bool,
}

/// `dst[M, N] (=|+=) scale * a[M, K] @ b[K, N]`.
///
/// # Safety
/// `dst` must be valid for writes of an `m x n` matrix at its stride, and `a`/`b` valid for every
/// strided read of an `m x k` / `k x n` matrix.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm<T: 'static + Copy + Default>(
    m: usize,
    n: usize,
    k: usize,
    dst: MatMut<T>,
    a: MatRef<T>,
    b: MatRef<T>,
    one: T,
    scale: T,
    parallel: bool,
) {
    let par = if parallel && super::threads::num_threads() > 1 {
        Parallelism::Rayon(super::threads::num_threads())
    } else {
        Parallelism::None
    };
    gemm::gemm(
        m,
        n,
        k,
        dst.ptr,
        1,
        dst.row_stride,
        dst.accumulate,
        a.ptr,
        a.col_stride,
        a.row_stride,
        b.ptr,
        b.col_stride,
        b.row_stride,
        if dst.accumulate { one } else { T::default() },
        scale,
        false,
        false,
        false,
        par,
    );
}

struct SyncPtr<T>(*mut T, *const T, *const T);
// SAFETY: the pointers are only used for disjoint output blocks (see `gemm_parallel`).
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

/// [`gemm`] on the whole compute pool, splitting the output into one block of rows (or columns,
/// when there are fewer rows than columns) per thread, each block a single-threaded gemm. The
/// `gemm` crate parallelizes over its own column blocks only, so products with a narrow side
/// (`n` or `m` around 128, common in training: `x @ W` with 128 outputs, `x^T @ g` weight
/// gradients) would otherwise run on one thread.
///
/// # Safety
/// As [`gemm`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_parallel<T: 'static + Copy + Default + Send + Sync>(
    m: usize,
    n: usize,
    k: usize,
    dst: MatMut<T>,
    a: MatRef<T>,
    b: MatRef<T>,
    one: T,
    scale: T,
) {
    let threads = super::threads::num_threads();
    let along_rows = m >= n;
    let len = if along_rows { m } else { n };
    let pieces = threads.min(len / 16).max(1);
    if pieces == 1 {
        return gemm(m, n, k, dst, a, b, one, scale, true);
    }
    let chunk = len.div_ceil(pieces);
    let ptrs = SyncPtr(dst.ptr, a.ptr, b.ptr);
    let (dst_rs, acc) = (dst.row_stride, dst.accumulate);
    rayon::scope(|s| {
        for p in 0..pieces {
            let ptrs = &ptrs;
            s.spawn(move |_| {
                let start = p * chunk;
                let size = chunk.min(len - start);
                if size == 0 {
                    return;
                }
                // SAFETY: each piece writes a disjoint block of rows (or columns) of dst.
                unsafe {
                    if along_rows {
                        let d = MatMut {
                            ptr: ptrs.0.offset(start as isize * dst_rs),
                            row_stride: dst_rs,
                            accumulate: acc,
                        };
                        let ap = MatRef {
                            ptr: ptrs.1.offset(start as isize * a.row_stride),
                            ..a
                        };
                        gemm(size, n, k, d, ap, MatRef { ptr: ptrs.2, ..b }, one, scale, false);
                    } else {
                        let d = MatMut {
                            ptr: ptrs.0.add(start),
                            row_stride: dst_rs,
                            accumulate: acc,
                        };
                        let bp = MatRef {
                            ptr: ptrs.2.offset(start as isize * b.col_stride),
                            ..b
                        };
                        gemm(m, size, k, d, MatRef { ptr: ptrs.1, ..a }, bp, one, scale, false);
                    }
                }
            });
        }
    });
}
