//! GPU forward of the nn family (see `crate::ops::nn` for the CPU's): softmax / log-softmax,
//! layer and RMS norm, cross-entropy and dropout, with their backward ops. The outputs match the
//! CPU's one for one (shapes, dtypes, order): the saved statistics (norm's mean and rstd,
//! cross-entropy's lse) are in the compute dtype (f32 for f32/bf16/f16, f64 for f64).
//!
//! Kernels are in `kernels/nn.cu`; row ops run one block per row ([`row_threads`]).

mod cross_entropy;
mod norm;
mod softmax;

use std::sync::Arc;

use cudarc::driver::{CudaFunction, PushKernelArg};

use crate::cuda::copy::{empty, gpu_of, ptr};
use crate::cuda::dispatch::not_on_gpu;
use crate::cuda::kernels::NN;
use crate::cuda::launch::{for_elements, Strided};
use crate::cuda::runtime::Gpu;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::tensor::Tensor;

/// The kernels of this family's module that it launches (checked by the compile test).
pub const KERNELS: &[&str] = &[
    "softmax_f32",
    "softmax_f64",
    "softmax_bf16",
    "softmax_f16",
    "softmax_backward_f32",
    "softmax_backward_f64",
    "softmax_backward_bf16",
    "softmax_backward_f16",
    "norm_f32",
    "norm_f64",
    "norm_bf16",
    "norm_f16",
    "norm_backward_f32",
    "norm_backward_f64",
    "norm_backward_bf16",
    "norm_backward_f16",
    "norm_partials_f32",
    "norm_partials_f64",
    "norm_partials_bf16",
    "norm_partials_f16",
    "norm_colsum_f32",
    "norm_colsum_f64",
    "norm_colsum_bf16",
    "norm_colsum_f16",
    "cross_entropy_f32",
    "cross_entropy_f64",
    "cross_entropy_bf16",
    "cross_entropy_f16",
    "cross_entropy_mean_f32",
    "cross_entropy_mean_f64",
    "cross_entropy_mean_bf16",
    "cross_entropy_mean_f16",
    "cross_entropy_scale_f32",
    "cross_entropy_scale_f64",
    "cross_entropy_scale_bf16",
    "cross_entropy_scale_f16",
    "cross_entropy_backward_f32",
    "cross_entropy_backward_f64",
    "cross_entropy_backward_bf16",
    "cross_entropy_backward_f16",
    "dropout_f32",
    "dropout_f64",
    "dropout_bf16",
    "dropout_f16",
];

pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    match op {
        Op::Softmax { log } => softmax::forward(inputs[0], *log),
        Op::SoftmaxBackward { log } => softmax::backward(inputs[0], inputs[1], *log),
        Op::Norm {
            eps,
            rms,
            has_weight,
            has_bias,
        } => {
            let weight = has_weight.then(|| inputs[1]);
            let bias = has_bias.then(|| inputs[1 + *has_weight as usize]);
            norm::forward(inputs[0], weight, bias, *eps, *rms)
        }
        Op::NormBackward {
            rms,
            has_weight,
            has_bias,
        } => {
            let weight = has_weight.then(|| inputs[1]);
            let rest = &inputs[1 + *has_weight as usize..];
            let saved = norm::Saved {
                grad: rest[0],
                mean: rest[1],
                rstd: rest[2],
            };
            norm::backward(inputs[0], weight, saved, *rms, *has_weight, *has_bias)
        }
        Op::CrossEntropy {
            ignore_index,
            label_smoothing,
        } => cross_entropy::forward(inputs[0], inputs[1], *ignore_index, *label_smoothing),
        Op::CrossEntropyBackward {
            ignore_index,
            label_smoothing,
        } => cross_entropy::backward(
            inputs[0],
            inputs[1],
            inputs[2],
            inputs[3],
            *ignore_index,
            *label_smoothing,
        ),
        Op::Dropout { p, seed, offset } => dropout(inputs[0], *p, *seed, *offset),
        _ => Err(not_on_gpu(op, inputs)),
    }
}

/// The kernel `{base}_{dtype}` of the nn module; an error naming `op` for a dtype without one
/// (the ops layer only sends float tensors here).
fn kernel(g: &Arc<Gpu>, op: &'static str, base: &str, dtype: DType) -> Result<CudaFunction> {
    let suffix = match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => return Err(Error::UnsupportedDType { op, dtype }),
    };
    g.function(&NN, &format!("{base}_{suffix}"))
}

/// Threads per block of the row kernels for rows of `len` elements: `len` rounded up to whole
/// warps, between 32 and 256 (longer rows loop).
fn row_threads(len: usize) -> u32 {
    (len.div_ceil(32) * 32).clamp(32, 256) as u32
}

/// An error naming `op` unless `t` has dtype `want` (the backward ops' saved statistics are in
/// the compute dtype, their gradients in the input's dtype).
fn expect_dtype(op: &'static str, t: &Tensor, want: DType) -> Result<()> {
    if t.dtype() != want {
        return Err(Error::DTypeMismatch {
            op,
            lhs: t.dtype(),
            rhs: want,
        });
    }
    Ok(())
}

/// Inverted dropout of `x` (any view): element `i` (row-major) is zeroed when
/// `rng::uniform(seed, offset + i) < p`, else scaled by `1 / (1 - p)` (0 when `p >= 1`).
/// The result is contiguous, of `x`'s shape and dtype.
fn dropout(x: &Tensor, p: f64, seed: u64, offset: u64) -> Result<Vec<Tensor>> {
    const OP: &str = "dropout";
    let g = gpu_of(x)?;
    let out = empty(&g, OP, x.dtype(), x.shape())?;
    let n = x.numel();
    if n == 0 {
        return Ok(vec![out]);
    }
    let f = kernel(&g, OP, "dropout", x.dtype())?;
    let src = Strided::of(OP, x.layout())?;
    let scale = if p >= 1.0 { 0.0 } else { 1.0 / (1.0 - p) };
    let (xp, yp, n64) = (crate::cuda::copy::buffer(x)?.ptr(), ptr(&out)?, n as u64);
    g.bind()?;
    // SAFETY: `src` selects offsets inside `x`'s buffer (its layout was checked against the
    // storage); `out` holds `n` elements, written once each.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&xp)
            .arg(&src)
            .arg(&yp)
            .arg(&n64)
            .arg(&p)
            .arg(&scale)
            .arg(&seed)
            .arg(&offset)
            .launch(for_elements(n))
    }
    .map_err(|e| g.fail(OP, e))?;
    Ok(vec![out])
}
