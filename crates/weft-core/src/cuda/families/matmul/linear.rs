//! Linear on the GPU: the product `x weight^T` on cuBLAS, then one kernel of
//! `kernels/linear.cu` that adds the bias, applies the activation and adds the residual.
//!
//! f32 and f64: the product is written into the buffer that becomes the pre-activation (with an
//! `act`) or the result (without), and the epilogue works on it in place. bf16 and f16: the
//! product is written in f32 and every output is rounded once, after the epilogue's f32 math, as
//! the CPU computes them (all inputs in f32, results rounded at the end).

use cudarc::driver::PushKernelArg;

use super::blas::{gemm, Product};
use crate::cuda::copy::{dense, empty, full, gpu_of, ptr};
use crate::cuda::kernels::LINEAR;
use crate::cuda::launch::for_elements;
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::op::UnaryOp;
use crate::tensor::Tensor;

/// The activation's code in `linear.cu` (0: none).
fn act_code(act: Option<UnaryOp>) -> u32 {
    match act {
        None => 0,
        Some(UnaryOp::Neg) => 1,
        Some(UnaryOp::Exp) => 2,
        Some(UnaryOp::Log) => 3,
        Some(UnaryOp::Sqrt) => 4,
        Some(UnaryOp::Rsqrt) => 5,
        Some(UnaryOp::Abs) => 6,
        Some(UnaryOp::Tanh) => 7,
        Some(UnaryOp::Sigmoid) => 8,
        Some(UnaryOp::Relu) => 9,
        Some(UnaryOp::Gelu) => 10,
        Some(UnaryOp::GeluTanh) => 11,
        Some(UnaryOp::Silu) => 12,
    }
}

/// Inputs `(x [M, K], weight [N, K], bias [N], residual [M, N]?)`, one dtype; outputs
/// `act(x weight^T + bias) (+ residual)` `[M, N]` and, with an `act`, the pre-activation
/// `x weight^T + bias` `[M, N]`, both in the inputs' dtype.
pub(super) fn forward(inputs: &[&Tensor], act: Option<UnaryOp>) -> Result<Vec<Tensor>> {
    let (x, w, bias) = (inputs[0], inputs[1], inputs[2]);
    let residual = inputs.get(3).copied();
    let dtype = x.dtype();
    super::expect_gemm_dtype("linear", dtype)?;
    for t in &inputs[1..] {
        if t.dtype() != dtype {
            return Err(Error::DTypeMismatch {
                op: "linear",
                lhs: dtype,
                rhs: t.dtype(),
            });
        }
    }
    if x.rank() != 2 || w.rank() != 2 || bias.rank() != 1 {
        return Err(invalid(
            "linear",
            format!(
                "x [M, K], weight [N, K] and bias [N], got {:?}, {:?} and {:?}",
                x.shape(),
                w.shape(),
                bias.shape()
            ),
        ));
    }
    let (m, k, n) = (x.shape()[0], x.shape()[1], w.shape()[0]);
    let mismatch = |lhs: &Tensor, rhs: &Tensor| Error::ShapeMismatch {
        op: "linear",
        lhs: lhs.shape().to_vec(),
        rhs: rhs.shape().to_vec(),
    };
    if w.shape()[1] != k {
        return Err(mismatch(x, w));
    }
    if bias.shape()[0] != n {
        return Err(mismatch(w, bias));
    }
    if let Some(r) = residual {
        if r.shape() != [m, n] {
            return Err(mismatch(x, r));
        }
    }
    let g = gpu_of(x)?;
    let half = matches!(dtype, DType::BF16 | DType::F16);
    let prod_dtype = if half { DType::F32 } else { dtype };
    let prod = if m == 0 || n == 0 || k == 0 {
        // no product to run: zeros, so that the bias (and the rest) come out as on the CPU
        full(x.device(), &[m, n], 0.0, prod_dtype)?
    } else {
        let p = empty(&g, "linear", prod_dtype, &[m, n])?;
        let wt = w.with_layout(w.layout().permute(&[1, 0])?);
        gemm(
            &g,
            &Product {
                op: "linear",
                a: x,
                b: &wt,
                batch: &[],
                m,
                k,
                n,
                out: &p,
                accumulate: false,
            },
        )?;
        p
    };
    // where the result and the pre-activation go: in place in the product when the dtypes allow
    let (out, pre) = match (act, half) {
        (None, false) => (prod.clone(), None),
        (Some(_), false) => (empty(&g, "linear", dtype, &[m, n])?, Some(prod.clone())),
        (None, true) => (empty(&g, "linear", dtype, &[m, n])?, None),
        (Some(_), true) => (
            empty(&g, "linear", dtype, &[m, n])?,
            Some(empty(&g, "linear", dtype, &[m, n])?),
        ),
    };
    let total = m * n;
    if total > 0 {
        let bias = dense(bias)?;
        let residual = residual.map(dense).transpose()?;
        let name = match dtype {
            DType::F64 => "linear_epilogue_f64",
            DType::BF16 => "linear_epilogue_bf16",
            DType::F16 => "linear_epilogue_f16",
            _ => "linear_epilogue_f32",
        };
        let f = g.function(&LINEAR, name)?;
        let (pp, bp, op) = (ptr(&prod)?, ptr(&bias)?, ptr(&out)?);
        let rp = match &residual {
            Some(r) => ptr(r)?,
            None => 0u64,
        };
        let prep = match &pre {
            Some(p) => ptr(p)?,
            None => 0u64,
        };
        let (code, cols, n64) = (act_code(act), n as u64, total as u64);
        g.bind()?;
        // SAFETY: `prod`, `out` and `pre` (when not null) hold M * N contiguous elements of their
        // dtypes, `bias` N and `residual` (when not null) M * N; the kernel reads element i of
        // `prod` before the same thread writes element i of `out` or `pre`, which may be `prod`.
        unsafe {
            g.stream()
                .launch_builder(&f)
                .arg(&pp)
                .arg(&bp)
                .arg(&rp)
                .arg(&op)
                .arg(&prep)
                .arg(&code)
                .arg(&cols)
                .arg(&n64)
                .launch(for_elements(total))
        }
        .map_err(|e| g.fail("linear", e))?;
    }
    Ok(match pre {
        Some(p) => vec![out, p],
        None => vec![out],
    })
}
