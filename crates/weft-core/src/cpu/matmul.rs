//! Matrix multiply through the `gemm` crate (runtime-dispatched AVX-512/AVX2/scalar kernels),
//! each call single-threaded; [`gemm_parallel`] splits a product across the compute pool.

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

/// `dst[M, N] (=|+=) scale * a[M, K] @ b[K, N]` on the calling thread.
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
) {
    // a few rows against a matrix read down its columns (a linear layer's forward in a decode
    // step): the gemm crate would pack b for every call (skinny.rs)
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
        && m <= super::skinny::MAX_ROWS
        && a.col_stride == 1
        && b.row_stride == 1
        && a.row_stride >= 0
        && b.col_stride >= 0
        && dst.row_stride >= 0
    {
        // SAFETY: T is f32 (checked just above), so the casts are identities; the strides are
        // the caller's, which it vouched for.
        let ran = unsafe {
            super::skinny::product_f32(
                m,
                n,
                k,
                a.ptr.cast::<f32>(),
                a.row_stride as usize,
                b.ptr.cast::<f32>(),
                b.col_stride as usize,
                dst.ptr.cast::<f32>(),
                dst.row_stride as usize,
                dst.accumulate,
                *(&scale as *const T).cast::<f32>(),
            )
        };
        if ran {
            return;
        }
    }
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
        Parallelism::None,
    );
}

struct SyncPtr<I, O>(*mut O, *const I, *const I);
// SAFETY: the pointers are only used for disjoint output blocks (see `for_each_block`).
unsafe impl<I, O> Send for SyncPtr<I, O> {}
unsafe impl<I, O> Sync for SyncPtr<I, O> {}

/// Products of fewer multiply-adds than this run on the calling thread.
const PARALLEL_MIN: usize = 1 << 15;

/// [`gemm`] on the compute pool, splitting the output into one block of rows (or columns, when
/// there are fewer rows than columns) per thread, each block a single-threaded gemm. A small
/// product, or one started inside a pool task (a batch of products already spread over the pool),
/// runs on the calling thread.
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
    gemm_parallel_then(m, n, k, dst, a, b, one, scale, |_| {})
}

/// The block of the output one task of [`gemm_parallel_then`] computed: `rows` rows and columns
/// `col0..col0 + cols`, starting at `ptr` with rows `row_stride` apart.
#[derive(Clone, Copy)]
pub struct Block<T> {
    pub ptr: *mut T,
    pub row_stride: isize,
    pub rows: usize,
    pub col0: usize,
    pub cols: usize,
}

/// [`gemm_parallel`], then `then(block)` on each task's block right after its product, while the
/// block is still in that core's cache (a bias added to the rows of a linear layer's output).
/// `then` may read and write its block's elements only.
///
/// # Safety
/// As [`gemm`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_parallel_then<T: 'static + Copy + Default + Send + Sync>(
    m: usize,
    n: usize,
    k: usize,
    dst: MatMut<T>,
    a: MatRef<T>,
    b: MatRef<T>,
    one: T,
    scale: T,
    then: impl Fn(Block<T>) + Sync,
) {
    let threads = super::threads::num_threads();
    let (along_rows, pieces) = if super::pool::in_task() {
        (true, 1)
    } else {
        let variant = crate::tune::pick(crate::tune::Kernel::Gemm, || {
            // operands read along their rows (n) or down their columns (t): a forward product
            // and a backward one of the same sizes are different calls
            let order = |col_stride: isize| if col_stride == 1 { 'n' } else { 't' };
            format!(
                "{} m={m} n={n} k={k} a={} b={} threads={threads}",
                std::any::type_name::<T>(),
                order(a.col_stride),
                order(b.col_stride)
            )
        });
        match variant {
            1 => (true, 1),
            2 => (true, threads.min(m).max(1)),
            3 => (false, threads.min(n).max(1)),
            // the rule: blocks of the longer side, at least 16 rows or columns each
            _ if m * n * k < PARALLEL_MIN => (true, 1),
            _ => (m >= n, threads.min(m.max(n) / 16).max(1)),
        }
    };
    crate::tune::plan(|| {
        format!(
            "gemm: {pieces} blocks of {}",
            if along_rows { "rows" } else { "columns" }
        )
    });
    let len = if along_rows { m } else { n };
    let chunk = len.div_ceil(pieces);
    // SAFETY: as the caller promises.
    unsafe {
        for_each_block(
            m,
            n,
            dst,
            a,
            b,
            along_rows,
            chunk,
            |rows, cols, d, a, b| gemm(rows, cols, k, d, a, b, one, scale),
            then,
        )
    }
}

/// Runs `product(rows, cols, dst, a, b)` on each block of `chunk` rows of `dst` (of `chunk`
/// columns when not `along_rows`), with `a` and `b` offset to the block, one block per task of
/// the pool, then `then(block)` on the block right after its product.
///
/// # Safety
/// `product` must write only the `rows x cols` block it is handed; `dst` must be valid for an
/// `m x n` matrix at its stride, and `a`/`b` for every strided read of `m` rows and `n` columns.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn for_each_block<I, O>(
    m: usize,
    n: usize,
    dst: MatMut<O>,
    a: MatRef<I>,
    b: MatRef<I>,
    along_rows: bool,
    chunk: usize,
    product: impl Fn(usize, usize, MatMut<O>, MatRef<I>, MatRef<I>) + Sync,
    then: impl Fn(Block<O>) + Sync,
) {
    let len = if along_rows { m } else { n };
    let chunk = chunk.max(1);
    let ptrs = SyncPtr(dst.ptr, a.ptr, b.ptr);
    super::pool::run(len.div_ceil(chunk), |p| {
        let ptrs = &ptrs;
        let start = p * chunk;
        let size = chunk.min(len.saturating_sub(start));
        if size == 0 {
            return;
        }
        // this piece's rows row0..row0 + rows and columns col0..col0 + cols
        let ((row0, rows), (col0, cols)) = if along_rows {
            ((start, size), (0, n))
        } else {
            ((0, m), (start, size))
        };
        // SAFETY: each piece writes a disjoint block of rows (or columns) of dst; the offsets
        // stay inside the operands the caller vouched for.
        let (d, ap, bp) = unsafe {
            (
                MatMut {
                    ptr: ptrs.0.offset(row0 as isize * dst.row_stride + col0 as isize),
                    ..dst
                },
                MatRef {
                    ptr: ptrs.1.offset(row0 as isize * a.row_stride),
                    ..a
                },
                MatRef {
                    ptr: ptrs.2.offset(col0 as isize * b.col_stride),
                    ..b
                },
            )
        };
        let ptr = d.ptr;
        product(rows, cols, d, ap, bp);
        then(Block {
            ptr,
            row_stride: dst.row_stride,
            rows,
            col0,
            cols,
        });
    });
}
