//! GPU forward of the matmul family (see `crate::ops::matmul` and `crate::ops::linear` for the
//! CPU's): the products run on cuBLAS ([`blas`]), linear's bias, activation and residual in a
//! kernel of `kernels/linear.cu` after it ([`linear`]).
//!
//! f32, bf16 and f16 products accumulate in f32 (`CUBLAS_COMPUTE_32F`: no TF32 unless
//! [`set_allow_tf32`] says so), f64 in f64; the integer dtypes are refused as on the CPU.

mod blas;
mod linear;

use std::sync::atomic::{AtomicBool, Ordering};

use crate::cuda::copy::{empty, full, gpu_of};
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::op::Op;
use crate::shape::broadcast_shapes;
use crate::tensor::Tensor;

/// The kernels of `kernels/linear.cu` that this family launches (checked by the compile test).
pub const KERNELS: &[&str] = &[
    "linear_epilogue_f32",
    "linear_epilogue_f64",
    "linear_epilogue_bf16",
    "linear_epilogue_f16",
];

static ALLOW_TF32: AtomicBool = AtomicBool::new(false);

/// Lets f32 products on the GPU use TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`: inputs
/// rounded to 10 mantissa bits, about 1e-3 relative error) for the whole process; off by
/// default, so f32 products match the CPU's to about 1e-6. bf16, f16 and f64 are not affected.
pub fn set_allow_tf32(allow: bool) {
    ALLOW_TF32.store(allow, Ordering::Relaxed);
}

/// Whether f32 products on the GPU may use TF32 (see [`set_allow_tf32`]).
pub fn allow_tf32() -> bool {
    ALLOW_TF32.load(Ordering::Relaxed)
}

pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    match op {
        Op::Matmul => Ok(vec![matmul(inputs[0], inputs[1], None)?]),
        Op::WideMatmul => Ok(vec![matmul(inputs[0], inputs[1], Some(DType::F32))?]),
        Op::Linear { act, bias: true, .. } => linear::forward(inputs, *act),
        Op::Linear { act, bias: false, .. } => {
            // the epilogue kernel takes a bias: zeros (the CPU makes bias-less ones; this
            // keeps a captured one runnable here)
            let n = inputs[1].shape().first().copied().unwrap_or(0);
            let zeros = crate::cuda::copy::full(inputs[0].device(), &[n], 0.0, inputs[0].dtype())?;
            let mut with_bias = inputs.to_vec();
            with_bias.insert(2, &zeros);
            linear::forward(&with_bias, *act)
        }
        _ => unreachable!("matmul::forward called with {op:?}"),
    }
}

/// The float dtypes cuBLAS multiplies; any other is refused as the CPU refuses it.
fn expect_gemm_dtype(op: &'static str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 => Ok(()),
        d => Err(Error::UnsupportedDType { op, dtype: d }),
    }
}

/// `[..., M, K] @ [..., K, N] -> [..., M, N]` (batch dims broadcast; both ranks at least 2, as
/// `Tensor::matmul` makes them), in the inputs' dtype, or in `wide` (f32, `Op::WideMatmul`).
fn matmul(a: &Tensor, b: &Tensor, wide: Option<DType>) -> Result<Tensor> {
    let dtype = a.dtype();
    let out_dtype = match wide {
        Some(w) if dtype != DType::F64 => w,
        _ => dtype,
    };
    expect_gemm_dtype("matmul", dtype)?;
    if b.dtype() != dtype {
        return Err(Error::DTypeMismatch {
            op: "matmul",
            lhs: dtype,
            rhs: b.dtype(),
        });
    }
    let (ra, rb) = (a.rank(), b.rank());
    if ra < 2 || rb < 2 {
        return Err(invalid(
            "matmul",
            format!("operands of rank 2 or more, got {:?} @ {:?}", a.shape(), b.shape()),
        ));
    }
    let (m, k, n) = (a.shape()[ra - 2], a.shape()[ra - 1], b.shape()[rb - 1]);
    if b.shape()[rb - 2] != k {
        return Err(Error::ShapeMismatch {
            op: "matmul",
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        });
    }
    let batch = broadcast_shapes("matmul", &a.shape()[..ra - 2], &b.shape()[..rb - 2])?;
    let mut shape = batch.clone();
    shape.extend_from_slice(&[m, n]);
    let g = gpu_of(a)?;
    if m == 0 || n == 0 || batch.contains(&0) {
        return empty(&g, "matmul", out_dtype, &shape);
    }
    if k == 0 {
        // an empty sum: zeros, as on the CPU
        return full(a.device(), &shape, 0.0, out_dtype);
    }
    let out = empty(&g, "matmul", out_dtype, &shape)?;
    blas::gemm(
        &g,
        &blas::Product {
            op: "matmul",
            a,
            b,
            batch: &batch,
            m,
            k,
            n,
            out: &out,
            accumulate: false,
        },
    )?;
    Ok(out)
}

/// `dst [M, N] += a [M, K] @ b [K, N]` in place, one cuBLAS call with beta 1 (gradient
/// accumulation fusion, `crate::ops::accumulate`): `dst` contiguous f32 (operands f32, bf16 or
/// f16) or f64 (operands f64), the operands 2-D views on `dst`'s GPU; the caller checks those.
pub(crate) fn add_product_into(dst: &Tensor, a: &Tensor, b: &Tensor) -> Result<bool> {
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let g = gpu_of(dst)?;
    blas::gemm(
        &g,
        &blas::Product {
            op: "gradient accumulation",
            a,
            b,
            batch: &[],
            m,
            k,
            n,
            out: dst,
            accumulate: true,
        },
    )?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tf32_is_off_until_allowed() {
        assert!(!super::allow_tf32());
        super::set_allow_tf32(true);
        assert!(super::allow_tf32());
        super::set_allow_tf32(false);
        assert!(!super::allow_tf32());
    }
}
