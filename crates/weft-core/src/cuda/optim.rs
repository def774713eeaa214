//! Fused optimizer updates and gradient-clipping reductions on the GPU (`kernels/optim.cu`), for
//! weft-nn's optimizers: each is one kernel over a parameter, rounding as the CPU's update does.

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use super::copy::{buffer, empty, gpu_of, ptr};
use super::kernels::OPTIM;
use super::launch::{for_elements, BLOCK};
use crate::dtype::DType;
use crate::error::{invalid, Result};
use crate::tensor::Tensor;

/// The kernels of `kernels/optim.cu` launched here (checked by the compile test).
pub const KERNELS: &[&str] = &[
    "adam_f32",
    "adam_f64",
    "sgd_f32",
    "sgd_f64",
    "sum_sq_f32",
    "sum_sq_f64",
    "sum_sq_bf16",
    "sum_sq_f16",
    "sum_partials",
    "scale_f32",
    "scale_f64",
    "scale_bf16",
    "scale_f16",
];

pub use super::scalars::{AdamScalars, SgdScalars};

/// `AdamScalars<T>` of the kernels (same field order).
#[repr(C)]
#[derive(Clone, Copy)]
struct AdamArgs<T> {
    l2: T,
    decay: T,
    lerp_w: T,
    lerp_w_minus_one: T,
    beta2: T,
    one_minus_beta2: T,
    bias_correction2_sqrt: T,
    eps: T,
    neg_step_size: T,
    has_l2: i32,
    has_decay: i32,
    lerp_small: i32,
    pad: i32,
}
// SAFETY: repr(C) plain numbers, laid out as the kernels' `AdamScalars<T>` for T = f32 or f64.
unsafe impl DeviceRepr for AdamArgs<f32> {}
// SAFETY: as above.
unsafe impl DeviceRepr for AdamArgs<f64> {}

/// `SgdScalars<T>` of the kernels (same field order).
#[repr(C)]
#[derive(Clone, Copy)]
struct SgdArgs<T> {
    weight_decay: T,
    momentum: T,
    one_minus_dampening: T,
    neg_lr: T,
    has_weight_decay: i32,
    nesterov: i32,
    first: i32,
    pad: i32,
}
// SAFETY: repr(C) plain numbers, laid out as the kernels' `SgdScalars<T>` for T = f32 or f64.
unsafe impl DeviceRepr for SgdArgs<f32> {}
// SAFETY: as above.
unsafe impl DeviceRepr for SgdArgs<f64> {}

/// Checks that the update's tensors are contiguous GPU tensors of `param`'s shape and float dtype.
fn check(op: &'static str, param: &Tensor, others: &[&Tensor]) -> Result<()> {
    if !matches!(param.dtype(), DType::F32 | DType::F64) {
        return Err(invalid(
            op,
            format!("parameters of dtype {} (f32 or f64 only)", param.dtype().name()),
        ));
    }
    for t in std::iter::once(param).chain(others.iter().copied()) {
        buffer(t)?;
        if !t.is_contiguous()
            || t.shape() != param.shape()
            || t.dtype() != param.dtype()
            || t.device() != param.device()
        {
            return Err(invalid(
                op,
                format!(
                    "a tensor of shape {:?} ({}, {}, contiguous: {}) beside a parameter of shape {:?} ({}, {})",
                    t.shape(),
                    t.dtype().name(),
                    t.device(),
                    t.is_contiguous(),
                    param.shape(),
                    param.dtype().name(),
                    param.device()
                ),
            ));
        }
    }
    Ok(())
}

/// One Adam/AdamW step in place on `param`, `exp_avg`, `exp_avg_sq` from `grad`.
pub fn adam_step(param: &Tensor, exp_avg: &Tensor, exp_avg_sq: &Tensor, grad: &Tensor, s: &AdamScalars) -> Result<()> {
    const OP: &str = "Adam::step";
    check(OP, param, &[exp_avg, exp_avg_sq, grad])?;
    if param.numel() == 0 {
        return Ok(());
    }
    let (p, m, v, gr) = (ptr(param)?, ptr(exp_avg)?, ptr(exp_avg_sq)?, ptr(grad)?);
    macro_rules! args {
        ($t:ty) => {
            AdamArgs::<$t> {
                l2: s.l2.unwrap_or(0.0) as $t,
                decay: s.decay.unwrap_or(1.0) as $t,
                lerp_w: s.lerp_w as $t,
                lerp_w_minus_one: s.lerp_w_minus_one as $t,
                beta2: s.beta2 as $t,
                one_minus_beta2: s.one_minus_beta2 as $t,
                bias_correction2_sqrt: s.bias_correction2_sqrt as $t,
                eps: s.eps as $t,
                neg_step_size: s.neg_step_size as $t,
                has_l2: s.l2.is_some() as i32,
                has_decay: s.decay.is_some() as i32,
                lerp_small: s.lerp_small as i32,
                pad: 0,
            }
        };
    }
    // the four tensors are contiguous GPU tensors of `n` elements of the kernel's type (checked
    // above)
    launch_update(OP, "adam", param, &[p, m, v, gr], &args!(f32), &args!(f64))
}

/// One SGD step in place on `param` (and its momentum buffer) from `grad`.
pub fn sgd_step(param: &Tensor, buf: Option<&Tensor>, grad: &Tensor, s: &SgdScalars) -> Result<()> {
    const OP: &str = "Sgd::step";
    let mut others = vec![grad];
    others.extend(buf);
    check(OP, param, &others)?;
    if param.numel() == 0 {
        return Ok(());
    }
    let (p, gr) = (ptr(param)?, ptr(grad)?);
    let bp = match buf {
        Some(b) => ptr(b)?,
        None => 0u64,
    };
    macro_rules! args {
        ($t:ty) => {
            SgdArgs::<$t> {
                weight_decay: s.weight_decay.unwrap_or(0.0) as $t,
                momentum: s.momentum as $t,
                one_minus_dampening: s.one_minus_dampening as $t,
                neg_lr: s.neg_lr as $t,
                has_weight_decay: s.weight_decay.is_some() as i32,
                nesterov: s.nesterov as i32,
                first: s.first as i32,
                pad: 0,
            }
        };
    }
    // as in `adam_step`; a null buffer pointer means no momentum
    launch_update(OP, "sgd", param, &[p, bp, gr], &args!(f32), &args!(f64))
}

/// Launches `{kernel}_f32` or `{kernel}_f64` (by `param`'s dtype) over `param`'s elements with
/// the device pointers `ptrs`, then the per-step scalars (`a32` or `a64`), then the count. The
/// callers check that every pointer holds `param.numel()` elements of the kernel's type.
fn launch_update<A: DeviceRepr, B: DeviceRepr>(
    op: &'static str,
    kernel: &str,
    param: &Tensor,
    ptrs: &[u64],
    a32: &A,
    a64: &B,
) -> Result<()> {
    let g = gpu_of(param)?;
    let n = param.numel();
    let n64 = n as u64;
    let f32 = param.dtype() == DType::F32;
    let f = g.function(&OPTIM, &format!("{kernel}_{}", if f32 { "f32" } else { "f64" }))?;
    g.bind()?;
    let mut b = g.stream().launch_builder(&f);
    for p in ptrs {
        b.arg(p);
    }
    if f32 {
        b.arg(a32);
    } else {
        b.arg(a64);
    }
    b.arg(&n64);
    // SAFETY: see the callers: every pointer holds `n` elements of the kernel's type.
    unsafe { b.launch(for_elements(n)) }.map_err(|e| g.fail(op, e))?;
    Ok(())
}

/// Σ x² over a float GPU tensor, accumulated in f64 (the squared norm that clipping uses).
pub fn sum_of_squares(x: &Tensor) -> Result<f64> {
    const OP: &str = "grad_norm";
    let g = gpu_of(x)?;
    let x = super::copy::dense(x)?;
    let n = x.numel();
    if n == 0 {
        return Ok(0.0);
    }
    let name = match x.dtype() {
        DType::F32 => "sum_sq_f32",
        DType::F64 => "sum_sq_f64",
        DType::BF16 => "sum_sq_bf16",
        DType::F16 => "sum_sq_f16",
        d => {
            return Err(invalid(
                OP,
                format!("a gradient of dtype {} (not a float type)", d.name()),
            ))
        }
    };
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(BLOCK as usize).clamp(1, 1024) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let blocks = cfg.grid_dim.0 as usize;
    let partial = empty(&g, OP, DType::F64, &[blocks])?;
    let total = empty(&g, OP, DType::F64, &[1])?;
    let (pp, xp, tp, n64, b64) = (ptr(&partial)?, ptr(&x)?, ptr(&total)?, n as u64, blocks as u64);
    let f = g.function(&OPTIM, name)?;
    let sum = g.function(&OPTIM, "sum_partials")?;
    g.bind()?;
    // SAFETY: `partial` holds one f64 per block; `x` holds `n` contiguous elements of the
    // kernel's type; `sum_partials` reads `blocks` partials and writes one f64.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&pp)
            .arg(&xp)
            .arg(&n64)
            .launch(cfg)
            .map_err(|e| g.fail(OP, e))?;
        g.stream()
            .launch_builder(&sum)
            .arg(&tp)
            .arg(&pp)
            .arg(&b64)
            .launch(LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1024, 1, 1),
                shared_mem_bytes: 0,
            })
            .map_err(|e| g.fail(OP, e))?;
    }
    total.item()
}

/// `x *= coef` in place on a contiguous float GPU tensor (`coef` rounded to f32 for f32).
pub fn scale_(x: &Tensor, coef: f64) -> Result<()> {
    const OP: &str = "clip_grad_norm";
    let g = gpu_of(x)?;
    if !x.is_contiguous() {
        return Err(invalid(
            OP,
            format!("a non-contiguous gradient of shape {:?} on {}", x.shape(), x.device()),
        ));
    }
    let n = x.numel();
    if n == 0 {
        return Ok(());
    }
    let (xp, n64, c32) = (ptr(x)?, n as u64, coef as f32);
    let name = match x.dtype() {
        DType::F32 => "scale_f32",
        DType::F64 => "scale_f64",
        DType::BF16 => "scale_bf16",
        DType::F16 => "scale_f16",
        d => {
            return Err(invalid(
                OP,
                format!("a gradient of dtype {} (not a float type)", d.name()),
            ))
        }
    };
    let f = g.function(&OPTIM, name)?;
    g.bind()?;
    let mut b = g.stream().launch_builder(&f);
    b.arg(&xp);
    if x.dtype() == DType::F32 {
        b.arg(&c32);
    } else {
        b.arg(&coef);
    }
    b.arg(&n64);
    // SAFETY: `x` holds `n` contiguous elements of the kernel's type.
    unsafe { b.launch(for_elements(n)) }.map_err(|e| g.fail(OP, e))?;
    Ok(())
}
