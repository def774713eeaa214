//! cuBLAS: one handle per GPU (created on first use, bound to the GPU's one stream), and
//! [`gemm`], a row-major product with broadcast batch dims on it.
//!
//! cuBLAS is column-major: a row-major `C [M, N] = A [M, K] B [K, N]` is the column-major
//! `C^T = B^T A^T`, so cuBLAS's first operand is `B` and its second `A`. A row-major matrix read
//! column-major is its transpose (`CUBLAS_OP_N` then gives `B^T`); a transposed view of a
//! row-major matrix is column-major storage (`CUBLAS_OP_T`). Any other view, and batch dims that
//! do not collapse to one stride, are copied dense on the GPU first.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::result::{gemm_ex, gemm_strided_batched_ex, CublasError};
use cudarc::cublas::{sys, CudaBlas};

use crate::cuda::copy::{contiguous, ptr};
use crate::cuda::runtime::Gpu;
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::layout::Layout;
use crate::shape::numel;
use crate::tensor::Tensor;
use crate::Device;

/// The most matrices one strided-batched call multiplies (older cuBLAS versions launch one
/// grid row per matrix, capped at 65535); more are split over several calls.
const MAX_BATCH: usize = 65535;

/// Whether libcublas (and the libcublasLt it links) can be loaded, checked once: cudarc panics
/// when a library it loads lazily is missing, so this comes before any cuBLAS call.
fn cublas_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library (dlopen) and closes it again.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

fn blas_error(g: &Gpu, op: &str, e: CublasError) -> Error {
    Error::Device(format!("{op} on {}: cuBLAS failed: {:?}", g.device(), e.0))
}

/// The cuBLAS handle of `g`, created on first use and kept for the process, on `g`'s stream.
fn handle(g: &Arc<Gpu>) -> Result<Arc<Mutex<CudaBlas>>> {
    if !cublas_present() {
        return Err(Error::Device(
            "cuda: cuBLAS (libcublas.so) could not be loaded; matmul and linear on the GPU need it".to_string(),
        ));
    }
    static HANDLES: OnceLock<Mutex<HashMap<usize, Arc<Mutex<CudaBlas>>>>> = OnceLock::new();
    let mut handles = HANDLES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let ordinal = match g.device() {
        Device::Cuda(n) => n,
        Device::Cpu => 0,
    };
    if let Some(h) = handles.get(&ordinal) {
        return Ok(h.clone());
    }
    g.bind()?;
    let blas = CudaBlas::new(g.stream().clone()).map_err(|e| blas_error(g, "creating the cuBLAS handle", e))?;
    // Split-K partial sums of bf16/f16 products stay in f32 instead of the output type.
    // SAFETY: a live handle; only sets its math mode.
    unsafe {
        sys::cublasSetMathMode(
            *blas.handle(),
            sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
        )
    }
    .result()
    .map_err(|e| blas_error(g, "setting cuBLAS's math mode", e))?;
    let h = Arc::new(Mutex::new(blas));
    handles.insert(ordinal, h.clone());
    Ok(h)
}

/// A product `out [batch..., M, N] = a [..., M, K] @ b [..., K, N]` for [`gemm`].
pub(super) struct Product<'a> {
    /// Named in errors.
    pub op: &'static str,
    /// Any view whose batch dims broadcast to `batch`.
    pub a: &'a Tensor,
    /// Any view whose batch dims broadcast to `batch`, `a`'s dtype.
    pub b: &'a Tensor,
    /// The output's batch dims (may be empty).
    pub batch: &'a [usize],
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// A contiguous tensor of `batch + [M, N]`, in `a`'s dtype, or f32 for bf16/f16 inputs.
    pub out: &'a Tensor,
    /// Whether the product is added to what `out` holds (cuBLAS's beta 1) instead of
    /// overwriting it (beta 0).
    pub accumulate: bool,
}

/// How cuBLAS reads one operand's `[rows, cols]` matrices: stored row-major or column-major
/// with leading dimension `ld`, matrix `i` of the batch `stride * i` elements after the first
/// (0 for a broadcast operand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    col_major: bool,
    ld: i32,
    stride: i64,
}

/// An operand: its first matrix's device address and its [`Geometry`].
struct Operand {
    /// The tensor `ptr` points into (a dense copy when the view could not be read as it is).
    _keep: Tensor,
    ptr: u64,
    geo: Geometry,
}

/// The parameters of one cuBLAS (strided-batched) gemm, in cuBLAS's column-major terms:
/// `C (m x n, ldc) = op_a(A) (m x k) op_b(B) (k x n)`, `op` a transpose when `trans_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Call {
    trans_a: bool,
    trans_b: bool,
    m: i32,
    n: i32,
    k: i32,
    lda: i32,
    ldb: i32,
    ldc: i32,
    stride_a: i64,
    stride_b: i64,
    stride_c: i64,
}

/// The call for the row-major `C [M, N] = A [M, K] B [K, N]` (C contiguous) as the column-major
/// `C^T (N x M, ld N) = B^T A^T`: cuBLAS's first operand is `b`, its second `a`. A row-major
/// matrix read column-major is its transpose, so it goes untransposed; a column-major one is
/// transposed.
fn call(a: Geometry, b: Geometry, m: i32, n: i32, k: i32) -> Call {
    Call {
        trans_a: b.col_major,
        trans_b: a.col_major,
        m: n,
        n: m,
        k,
        lda: b.ld,
        ldb: a.ld,
        ldc: n,
        stride_a: b.stride,
        stride_b: a.stride,
        stride_c: m as i64 * n as i64,
    }
}

/// The distance between consecutive matrices when batch dims `shape` with `strides` collapse
/// to one stride (size-1 dims ignored); `None` when they do not.
fn batch_stride(shape: &[usize], strides: &[usize]) -> Option<usize> {
    let (mut stride, mut expect) = (None, None);
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n == 1 {
            continue;
        }
        match expect {
            None => stride = Some(s),
            Some(e) if e == s => {}
            Some(_) => return None,
        }
        expect = Some(s.checked_mul(n)?);
    }
    Some(stride.unwrap_or(0))
}

/// The geometry of the `[.., rows, cols]` view `l` when cuBLAS can read it in place.
fn geometry(l: &Layout, rows: usize, cols: usize) -> Option<Geometry> {
    let r = l.rank();
    let (rs, cs) = (l.strides[r - 2], l.strides[r - 1]);
    let (col_major, ld) = if (cols == 1 || cs == 1) && (rows == 1 || rs >= cols) {
        (false, if rows == 1 { cols } else { rs })
    } else if (rows == 1 || rs == 1) && (cols == 1 || cs >= rows) {
        (true, if cols == 1 { rows } else { cs })
    } else {
        return None;
    };
    let ld = i32::try_from(ld.max(1)).ok()?;
    let stride = i64::try_from(batch_stride(&l.shape[..r - 2], &l.strides[..r - 2])?).ok()?;
    Some(Geometry { col_major, ld, stride })
}

/// `t` broadcast to `batch + [rows, cols]`, as cuBLAS reads it (copied dense first when its
/// view cannot be read in place).
fn operand(op: &'static str, t: &Tensor, batch: &[usize], rows: usize, cols: usize) -> Result<Operand> {
    let mut shape = batch.to_vec();
    shape.extend_from_slice(&[rows, cols]);
    let view = t.with_layout(t.layout().expand(&shape)?);
    let view = match geometry(view.layout(), rows, cols) {
        Some(_) => view,
        None => contiguous(&view)?,
    };
    let geo = geometry(view.layout(), rows, cols).ok_or_else(|| {
        invalid(
            op,
            format!("a [{rows}, {cols}] matrix is too large for cuBLAS (32-bit leading dimension)"),
        )
    })?;
    Ok(Operand {
        ptr: ptr(&view)?,
        _keep: view,
        geo,
    })
}

fn cuda_type(dtype: DType) -> sys::cudaDataType {
    match dtype {
        DType::F64 => sys::cudaDataType::CUDA_R_64F,
        DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        _ => sys::cudaDataType::CUDA_R_32F,
    }
}

/// Runs `p` on `g`'s stream: f64 accumulates in f64, every other dtype in f32 (TF32 for f32 only
/// when [`super::allow_tf32`]). The sizes must be non-zero.
pub(super) fn gemm(g: &Arc<Gpu>, p: &Product) -> Result<()> {
    let dim = |v: usize| {
        i32::try_from(v).map_err(|_| {
            invalid(
                p.op,
                format!(
                    "[{}, {}] @ [{}, {}]: sizes over 2^31 are not supported by cuBLAS",
                    p.m, p.k, p.k, p.n
                ),
            )
        })
    };
    let (m, n, k) = (dim(p.m)?, dim(p.n)?, dim(p.k)?);
    let a = operand(p.op, p.a, p.batch, p.m, p.k)?;
    let b = operand(p.op, p.b, p.batch, p.k, p.n)?;
    let dtype = p.a.dtype();
    let (in_type, out_type) = (cuda_type(dtype), cuda_type(p.out.dtype()));
    let compute = match dtype {
        DType::F64 => sys::cublasComputeType_t::CUBLAS_COMPUTE_64F,
        DType::F32 if super::allow_tf32() => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
        _ => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
    };
    // alpha and beta in the compute type, read from host memory during each call
    let (one64, zero64, one32, zero32) = (1.0f64, 0.0f64, 1.0f32, 0.0f32);
    let (alpha, beta): (*const c_void, *const c_void) = match (dtype == DType::F64, p.accumulate) {
        (true, false) => ((&one64 as *const f64).cast(), (&zero64 as *const f64).cast()),
        (true, true) => ((&one64 as *const f64).cast(), (&one64 as *const f64).cast()),
        (false, false) => ((&one32 as *const f32).cast(), (&zero32 as *const f32).cast()),
        (false, true) => ((&one32 as *const f32).cast(), (&one32 as *const f32).cast()),
    };
    let trans = |t: bool| {
        if t {
            sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            sys::cublasOperation_t::CUBLAS_OP_N
        }
    };
    let c = call(a.geo, b.geo, m, n, k);
    let (in_size, out_size) = (dtype.size_in_bytes() as u64, p.out.dtype().size_in_bytes() as u64);
    let out_ptr = ptr(p.out)?;
    let total = numel(p.batch);
    let h = handle(g)?;
    let blas = h.lock().unwrap_or_else(|e| e.into_inner());
    g.bind()?;
    let mut start = 0;
    while start < total {
        let count = (total - start).min(MAX_BATCH);
        // matrix `start` of each operand (cuBLAS's A is our b, its B our a)
        let skip = |first: u64, stride: i64, size: u64| first + start as u64 * stride as u64 * size;
        let pa = skip(b.ptr, c.stride_a, in_size) as *const c_void;
        let pb = skip(a.ptr, c.stride_b, in_size) as *const c_void;
        let pc = skip(out_ptr, c.stride_c, out_size) as *mut c_void;
        let (ta, tb) = (trans(c.trans_a), trans(c.trans_b));
        let algo = sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT;
        // SAFETY: every matrix the call reads lies inside its operand's buffer (the views were
        // checked against their storage when built, and `ld` and the strides are theirs); `out`
        // holds `total` contiguous [M, N] matrices of its dtype; alpha and beta outlive the
        // call, which is queued on the GPU's one stream after the kernels that wrote the
        // inputs.
        let done = unsafe {
            if count == 1 {
                gemm_ex(
                    *blas.handle(),
                    ta,
                    tb,
                    c.m,
                    c.n,
                    c.k,
                    alpha,
                    pa,
                    in_type,
                    c.lda,
                    pb,
                    in_type,
                    c.ldb,
                    beta,
                    pc,
                    out_type,
                    c.ldc,
                    compute,
                    algo,
                )
            } else {
                gemm_strided_batched_ex(
                    *blas.handle(),
                    ta,
                    tb,
                    c.m,
                    c.n,
                    c.k,
                    alpha,
                    pa,
                    in_type,
                    c.lda,
                    c.stride_a,
                    pb,
                    in_type,
                    c.ldb,
                    c.stride_b,
                    beta,
                    pc,
                    out_type,
                    c.ldc,
                    c.stride_c,
                    count as i32,
                    compute,
                    algo,
                )
            }
        };
        done.map_err(|e| blas_error(g, p.op, e))?;
        start += count;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_dims_collapse_to_one_stride_when_they_can() {
        assert_eq!(batch_stride(&[], &[]), Some(0));
        assert_eq!(batch_stride(&[2, 3], &[60, 20]), Some(20));
        // broadcast: every stride 0
        assert_eq!(batch_stride(&[2, 3], &[0, 0]), Some(0));
        // size-1 dims have any stride
        assert_eq!(batch_stride(&[2, 1, 3], &[60, 7, 20]), Some(20));
        // broadcast in one dim only: no single stride
        assert_eq!(batch_stride(&[2, 3], &[20, 0]), None);
        assert_eq!(batch_stride(&[2, 3], &[0, 20]), None);
        // permuted batch dims
        assert_eq!(batch_stride(&[2, 3], &[20, 40]), None);
    }

    fn layout(shape: &[usize], strides: &[usize]) -> Layout {
        Layout {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset: 0,
        }
    }

    fn geo(l: &Layout, rows: usize, cols: usize) -> Option<(bool, i32, i64)> {
        geometry(l, rows, cols).map(|g| (g.col_major, g.ld, g.stride))
    }

    #[test]
    fn matrices_are_read_in_place_when_row_or_column_major() {
        // contiguous [4, 5]: row-major, ld 5
        assert_eq!(geo(&layout(&[4, 5], &[5, 1]), 4, 5), Some((false, 5, 0)));
        // transposed [5, 4] of a contiguous [4, 5]: column-major, ld 5
        assert_eq!(geo(&layout(&[5, 4], &[1, 5]), 5, 4), Some((true, 5, 0)));
        // a narrowed row-major matrix keeps its row stride
        assert_eq!(geo(&layout(&[4, 3], &[5, 1]), 4, 3), Some((false, 5, 0)));
        // a column vector of any stride; a row of a transposed matrix
        assert_eq!(geo(&layout(&[4, 1], &[7, 9]), 4, 1), Some((false, 7, 0)));
        assert_eq!(geo(&layout(&[1, 4], &[1, 6]), 1, 4), Some((true, 6, 0)));
        // broadcast rows, strided columns: copied
        assert_eq!(geo(&layout(&[4, 5], &[0, 1]), 4, 5), None);
        assert_eq!(geo(&layout(&[4, 5], &[10, 2]), 4, 5), None);
        // batched, one stride
        assert_eq!(geo(&layout(&[3, 4, 5], &[20, 5, 1]), 4, 5), Some((false, 5, 20)));
        assert_eq!(geo(&layout(&[3, 4, 5], &[0, 5, 1]), 4, 5), Some((false, 5, 0)));
    }

    /// What cuBLAS computes for `c` on column-major buffers (the reference semantics of
    /// `cublasGemmStridedBatchedEx` with alpha 1 and beta 0), `count` matrices.
    fn emulate(c: &Call, a: &[f64], a0: usize, b: &[f64], b0: usize, out: &mut [f64], count: usize) {
        let (m, n, k) = (c.m as usize, c.n as usize, c.k as usize);
        let (lda, ldb, ldc) = (c.lda as usize, c.ldb as usize, c.ldc as usize);
        // cuBLAS's rules for the leading dimensions (CUBLAS_STATUS_INVALID_VALUE otherwise)
        assert!(lda >= (if c.trans_a { k } else { m }).max(1), "lda {c:?}");
        assert!(ldb >= (if c.trans_b { n } else { k }).max(1), "ldb {c:?}");
        assert!(ldc >= m.max(1), "ldc {c:?}");
        for bi in 0..count {
            let (pa, pb) = (a0 + bi * c.stride_a as usize, b0 + bi * c.stride_b as usize);
            let pc = bi * c.stride_c as usize;
            for i in 0..m {
                for j in 0..n {
                    let mut sum = 0.0;
                    for l in 0..k {
                        let x = if c.trans_a {
                            a[pa + l + i * lda]
                        } else {
                            a[pa + i + l * lda]
                        };
                        let y = if c.trans_b {
                            b[pb + j + l * ldb]
                        } else {
                            b[pb + l + j * ldb]
                        };
                        sum += x * y;
                    }
                    out[pc + i + j * ldc] = sum;
                }
            }
        }
    }

    /// A view's elements in row-major order (as `copy::contiguous` makes them).
    fn gather(data: &[f64], l: &Layout) -> Vec<f64> {
        l.offsets("test").unwrap().iter().map(|&o| data[o]).collect()
    }

    /// The operand as `operand` hands it to cuBLAS: (buffer, first element, geometry).
    fn prepare(data: &[f64], l: &Layout, batch: &[usize], rows: usize, cols: usize) -> (Vec<f64>, usize, Geometry) {
        let mut shape = batch.to_vec();
        shape.extend_from_slice(&[rows, cols]);
        let l = l.expand(&shape).unwrap();
        match geometry(&l, rows, cols) {
            Some(g) => (data.to_vec(), l.offset, g),
            None => {
                let dense = Layout::contiguous(&shape);
                (gather(data, &l), 0, geometry(&dense, rows, cols).unwrap())
            }
        }
    }

    #[test]
    fn the_cublas_call_computes_the_row_major_product() {
        let data: Vec<f64> = (0..4096).map(|i| ((i * 37 % 101) as f64) / 17.0 - 3.0).collect();
        let c = |shape: &[usize]| Layout::contiguous(shape);
        // (a view, b view) over `data`
        let cases: Vec<(Layout, Layout)> = vec![
            (c(&[5, 7]), c(&[7, 3])),
            // transposed operands
            (
                c(&[7, 5]).permute(&[1, 0]).unwrap(),
                c(&[3, 7]).permute(&[1, 0]).unwrap(),
            ),
            // narrowed (row stride over the row length), with offsets
            (c(&[6, 9]).narrow(1, 2, 7).unwrap(), c(&[8, 4]).narrow(0, 1, 7).unwrap()),
            // narrowed transposes
            (
                c(&[9, 6]).permute(&[1, 0]).unwrap().narrow(1, 1, 7).unwrap(),
                c(&[5, 9]).narrow(1, 2, 7).unwrap().permute(&[1, 0]).unwrap(),
            ),
            // vectors
            (c(&[1, 7]), c(&[7, 1])),
            (c(&[7, 1]), c(&[1, 6])),
            (
                c(&[7]).unsqueeze(0).unwrap(),
                c(&[3, 7]).permute(&[1, 0]).unwrap().narrow(1, 1, 1).unwrap(),
            ),
            // every other column: copied
            (
                c(&[5, 14])
                    .narrow(1, 0, 14)
                    .unwrap()
                    .reshape_view(&[5, 7, 2])
                    .unwrap()
                    .narrow(2, 0, 1)
                    .unwrap()
                    .squeeze(2)
                    .unwrap(),
                c(&[7, 3]),
            ),
            // batched, one stride each
            (c(&[4, 5, 7]), c(&[4, 7, 3])),
            // batched transposes
            (
                c(&[4, 7, 5]).permute(&[0, 2, 1]).unwrap(),
                c(&[4, 3, 7]).permute(&[0, 2, 1]).unwrap(),
            ),
            // broadcast: stride 0, and broadcast over a leading dim (copied)
            (c(&[3, 5, 7]), c(&[1, 7, 3])),
            (c(&[2, 3, 5, 7]), c(&[3, 7, 4])),
            (c(&[4, 1, 5, 7]), c(&[1, 3, 7, 2])),
            // permuted batch dims: copied
            (c(&[5, 3, 7]).permute(&[1, 0, 2]).unwrap(), c(&[7, 4])),
        ];
        for (i, (la, lb)) in cases.iter().enumerate() {
            let (ra, rb) = (la.rank(), lb.rank());
            let (m, k, n) = (la.shape[ra - 2], la.shape[ra - 1], lb.shape[rb - 1]);
            let batch = crate::shape::broadcast_shapes("test", &la.shape[..ra - 2], &lb.shape[..rb - 2]).unwrap();
            let total = numel(&batch);
            let (ba, a0, ga) = prepare(&data, la, &batch, m, k);
            let (bb, b0, gb) = prepare(&data, lb, &batch, k, n);
            let call = call(ga, gb, m as i32, n as i32, k as i32);
            let mut got = vec![f64::NAN; total * m * n];
            emulate(&call, &bb, b0, &ba, a0, &mut got, total);
            // the reference: row-major products of the broadcast views
            let mut sa = batch.clone();
            sa.extend_from_slice(&[m, k]);
            let mut sb = batch.clone();
            sb.extend_from_slice(&[k, n]);
            let (va, vb) = (
                gather(&data, &la.expand(&sa).unwrap()),
                gather(&data, &lb.expand(&sb).unwrap()),
            );
            for t in 0..total {
                for r in 0..m {
                    for col in 0..n {
                        let want: f64 = (0..k)
                            .map(|l| va[t * m * k + r * k + l] * vb[t * k * n + l * n + col])
                            .sum();
                        let g = got[t * m * n + r * n + col];
                        assert!(
                            (g - want).abs() < 1e-9,
                            "case {i}: batch {t} [{r}, {col}]: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
