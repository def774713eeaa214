//! Matrix multiply through the `gemm` crate (runtime-dispatched AVX-512/AVX2/scalar kernels).

use gemm::Parallelism;

/// One strided matrix operand: element `(i, j)` lives at `ptr + i * row_stride + j * col_stride`.
#[derive(Clone, Copy)]
pub struct MatRef<T> {
    pub ptr: *const T,
    pub row_stride: isize,
    pub col_stride: isize,
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
