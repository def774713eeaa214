//! GPU forward of the conv family (see `crate::ops::conv` for the CPU's): 2-D convolution and
//! max / average pooling, NCHW, by the direct kernels of `kernels/conv.cu`.
//!
//! Outputs mirror the CPU exactly: `Conv2d` -> `[y]`; `Conv2dBackward` -> `[dx, dweight]`;
//! `MaxPool2d` -> `[y, indices]` (I64, the flat `iy * w + ix` position of each window's max in
//! its input plane); `MaxPool2dBackward` and `AvgPool2dBackward` -> `[dx]`. Every input is made
//! contiguous on the GPU first; float tensors keep their dtype (f32, f64, bf16, f16), computed in
//! f32 (f64 for f64) as on the CPU.

use std::sync::Arc;

use cudarc::driver::{DeviceRepr, PushKernelArg};

use crate::cpu::conv::out_size;
use crate::cuda::copy::{dense, empty, gpu_of, ptr};
use crate::cuda::dispatch::not_on_gpu;
use crate::cuda::kernels::CONV;
use crate::cuda::launch::{for_elements, for_rows};
use crate::cuda::runtime::Gpu;
use crate::dtype::DType;
use crate::error::{invalid, Result};
use crate::op::{Conv2dParams, Op, Pool2dParams};
use crate::tensor::Tensor;

/// The kernels of this family's module that it launches (checked by the compile test).
pub const KERNELS: &[&str] = &[
    "conv2d_f32",
    "conv2d_f64",
    "conv2d_bf16",
    "conv2d_f16",
    "conv2d_dx_f32",
    "conv2d_dx_f64",
    "conv2d_dx_bf16",
    "conv2d_dx_f16",
    "conv2d_dw_f32",
    "conv2d_dw_f64",
    "conv2d_dw_bf16",
    "conv2d_dw_f16",
    "max_pool2d_f32",
    "max_pool2d_f64",
    "max_pool2d_bf16",
    "max_pool2d_f16",
    "max_pool2d_backward_f32",
    "max_pool2d_backward_f64",
    "max_pool2d_backward_bf16",
    "max_pool2d_backward_f16",
    "avg_pool2d_f32",
    "avg_pool2d_f64",
    "avg_pool2d_bf16",
    "avg_pool2d_f16",
    "avg_pool2d_backward_f32",
    "avg_pool2d_backward_f64",
    "avg_pool2d_backward_bf16",
    "avg_pool2d_backward_f16",
];

/// Threads per block of the weight-gradient reduction (a multiple of 32, as `block_sum` needs).
const DW_THREADS: u32 = 256;

/// A convolution's sizes as the kernels read them (`struct ConvGeom` in `kernels/conv.cu`, same
/// field order, all i64): x `[n, c, h, w]`, weight `[o, c / groups, kh, kw]`, y `[n, o, oh, ow]`;
/// strides `sh, sw`, paddings `ph, pw` and dilations `dh, dw` in elements.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ConvGeom {
    n: i64,
    c: i64,
    h: i64,
    w: i64,
    o: i64,
    kh: i64,
    kw: i64,
    oh: i64,
    ow: i64,
    sh: i64,
    sw: i64,
    ph: i64,
    pw: i64,
    dh: i64,
    dw: i64,
    groups: i64,
}

// SAFETY: plain `repr(C)` data of i64s, laid out as the kernels' `struct ConvGeom`.
unsafe impl DeviceRepr for ConvGeom {}

/// A pooling's sizes as the kernels read them (`struct PoolGeom` in `kernels/conv.cu`):
/// `planes = n * c` planes of `h x w` pooled to `oh x ow` by `kh x kw` windows with strides
/// `sh, sw` and paddings `ph, pw`, in elements.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct PoolGeom {
    planes: i64,
    h: i64,
    w: i64,
    oh: i64,
    ow: i64,
    kh: i64,
    kw: i64,
    sh: i64,
    sw: i64,
    ph: i64,
    pw: i64,
}

// SAFETY: plain `repr(C)` data of i64s, laid out as the kernels' `struct PoolGeom`.
unsafe impl DeviceRepr for PoolGeom {}

pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let Some(suffix) = suffix(inputs[0].dtype()) else {
        return Err(not_on_gpu(op, inputs));
    };
    match op {
        Op::Conv2d(p) => Ok(vec![conv2d(inputs[0], inputs[1], *p, suffix)?]),
        Op::Conv2dBackward(p) => {
            let (dx, dw) = conv2d_backward(inputs[0], inputs[1], inputs[2], *p, suffix)?;
            Ok(vec![dx, dw])
        }
        Op::MaxPool2d(p) => {
            let (y, idx) = max_pool2d(inputs[0], *p, suffix)?;
            Ok(vec![y, idx])
        }
        Op::MaxPool2dBackward(p) => Ok(vec![max_pool2d_backward(inputs[0], inputs[1], inputs[2], *p, suffix)?]),
        Op::AvgPool2d(p) => Ok(vec![avg_pool2d(inputs[0], *p, suffix)?]),
        Op::AvgPool2dBackward(p) => Ok(vec![avg_pool2d_backward(inputs[0], inputs[1], *p, suffix)?]),
        _ => unreachable!("conv::forward called with {op:?}"),
    }
}

/// The kernel-name suffix of a float dtype (`None` for the others, which the ops layer refuses).
fn suffix(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F32 => Some("f32"),
        DType::F64 => Some("f64"),
        DType::BF16 => Some("bf16"),
        DType::F16 => Some("f16"),
        _ => None,
    }
}

/// `t` contiguous on the GPU in `dtype` (a gradient of another float dtype is cast to it, which
/// the CPU does implicitly by computing in f32).
fn dense_as(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        dense(t)
    } else {
        crate::no_grad(|| dense(&t.cast(dtype)?))
    }
}

/// The geometry of `x [n, c, h, w]` convolved with `w [o, c / groups, kh, kw]`, re-checked here
/// because the kernels index by it (the ops layer checked it already).
fn conv_geom(op: &'static str, x: &Tensor, w: &Tensor, p: Conv2dParams) -> Result<ConvGeom> {
    let bad = || {
        invalid(
            op,
            format!(
                "input {:?} and weight {:?} do not fit {p:?} (or dtypes {:?} and {:?})",
                x.shape(),
                w.shape(),
                x.dtype(),
                w.dtype()
            ),
        )
    };
    if x.rank() != 4 || w.rank() != 4 || x.dtype() != w.dtype() {
        return Err(bad());
    }
    let (n, c, h, wd) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let (o, cg, kh, kw) = (w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]);
    let g = p.groups;
    let zero = [p.stride.0, p.stride.1, p.dilation.0, p.dilation.1, g, kh, kw].contains(&0);
    if zero || c % g != 0 || o % g != 0 || cg != c / g {
        return Err(bad());
    }
    let (Some(oh), Some(ow)) = (
        out_size(h, kh, p.stride.0, p.padding.0, p.dilation.0),
        out_size(wd, kw, p.stride.1, p.padding.1, p.dilation.1),
    ) else {
        return Err(bad());
    };
    let i = |v: usize| v as i64;
    Ok(ConvGeom {
        n: i(n),
        c: i(c),
        h: i(h),
        w: i(wd),
        o: i(o),
        kh: i(kh),
        kw: i(kw),
        oh: i(oh),
        ow: i(ow),
        sh: i(p.stride.0),
        sw: i(p.stride.1),
        ph: i(p.padding.0),
        pw: i(p.padding.1),
        dh: i(p.dilation.0),
        dw: i(p.dilation.1),
        groups: i(g),
    })
}

/// The geometry of pooling `x [n, c, h, w]` by the window `p`, re-checked as [`conv_geom`].
fn pool_geom(op: &'static str, x: &Tensor, p: Pool2dParams) -> Result<PoolGeom> {
    let bad = || invalid(op, format!("window {p:?} does not fit input {:?}", x.shape()));
    if x.rank() != 4 || [p.kernel.0, p.kernel.1, p.stride.0, p.stride.1].contains(&0) {
        return Err(bad());
    }
    let (h, w) = (x.shape()[2], x.shape()[3]);
    let (Some(oh), Some(ow)) = (
        out_size(h, p.kernel.0, p.stride.0, p.padding.0, 1),
        out_size(w, p.kernel.1, p.stride.1, p.padding.1, 1),
    ) else {
        return Err(bad());
    };
    let i = |v: usize| v as i64;
    Ok(PoolGeom {
        planes: i(x.shape()[0] * x.shape()[1]),
        h: i(h),
        w: i(w),
        oh: i(oh),
        ow: i(ow),
        kh: i(p.kernel.0),
        kw: i(p.kernel.1),
        sh: i(p.stride.0),
        sw: i(p.stride.1),
        ph: i(p.padding.0),
        pw: i(p.padding.1),
    })
}

/// The pooled shape `[n, c, oh, ow]` of `x`.
fn pooled_shape(x: &Tensor, d: &PoolGeom) -> [usize; 4] {
    [x.shape()[0], x.shape()[1], d.oh as usize, d.ow as usize]
}

/// An error naming `op` when `t`'s shape is not `want`.
fn expect_shape(op: &'static str, what: &str, t: &Tensor, want: &[usize]) -> Result<()> {
    if t.shape() != want {
        return Err(invalid(
            op,
            format!("{what} has shape {:?}, expected {want:?}", t.shape()),
        ));
    }
    Ok(())
}

/// The kernel `name` + `_` + `suffix` of the conv module.
fn kernel(g: &Arc<Gpu>, name: &str, suffix: &str) -> Result<cudarc::driver::CudaFunction> {
    g.function(&CONV, &format!("{name}_{suffix}"))
}

/// `x [n, c, h, w]` convolved with `w [o, c / groups, kh, kw]` -> `[n, o, oh, ow]` (no bias: the
/// ops layer adds it). One thread per output element.
fn conv2d(x: &Tensor, w: &Tensor, p: Conv2dParams, suffix: &str) -> Result<Tensor> {
    const OP: &str = "conv2d";
    let d = conv_geom(OP, x, w, p)?;
    let g = gpu_of(x)?;
    let shape = [x.shape()[0], w.shape()[0], d.oh as usize, d.ow as usize];
    let y = empty(&g, OP, x.dtype(), &shape)?;
    if y.numel() == 0 {
        return Ok(y);
    }
    let (xd, wd) = (dense(x)?, dense(w)?);
    let f = kernel(&g, "conv2d", suffix)?;
    let (yp, xp, wp) = (ptr(&y)?, ptr(&xd)?, ptr(&wd)?);
    let cfg = for_elements(y.numel());
    g.bind()?;
    // SAFETY: y holds n*o*oh*ow elements and is written in full; x and w are contiguous with the
    // shapes `d` describes (checked above), and every tap read is bounds-checked in the kernel.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&yp)
            .arg(&xp)
            .arg(&wp)
            .arg(&d)
            .launch(cfg)
    }
    .map_err(|e| g.fail(OP, e))?;
    Ok(y)
}

/// Gradients of [`conv2d`] given `dy [n, o, oh, ow]`: `dx` (x's shape; one thread per input
/// element gathering the outputs that read it) and `dweight` (w's shape; one block per weight
/// element reducing over `n * oh * ow`).
fn conv2d_backward(x: &Tensor, w: &Tensor, dy: &Tensor, p: Conv2dParams, suffix: &str) -> Result<(Tensor, Tensor)> {
    const OP: &str = "conv2d_backward";
    let d = conv_geom(OP, x, w, p)?;
    let want = [x.shape()[0], w.shape()[0], d.oh as usize, d.ow as usize];
    expect_shape(OP, "the output gradient", dy, &want)?;
    let g = gpu_of(x)?;
    let dx = empty(&g, OP, x.dtype(), x.shape())?;
    let dw = empty(&g, OP, w.dtype(), w.shape())?;
    let (xd, wd, dyd) = (dense(x)?, dense(w)?, dense_as(dy, x.dtype())?);
    let (xp, wp, dyp) = (ptr(&xd)?, ptr(&wd)?, ptr(&dyd)?);
    if dx.numel() > 0 {
        let f = kernel(&g, "conv2d_dx", suffix)?;
        let dxp = ptr(&dx)?;
        let cfg = for_elements(dx.numel());
        g.bind()?;
        // SAFETY: dx holds n*c*h*w elements, written in full; dy and w are contiguous with the
        // shapes `d` describes, and only in-range output positions are read.
        unsafe {
            g.stream()
                .launch_builder(&f)
                .arg(&dxp)
                .arg(&dyp)
                .arg(&wp)
                .arg(&d)
                .launch(cfg)
        }
        .map_err(|e| g.fail(OP, e))?;
    }
    if dw.numel() > 0 {
        let f = kernel(&g, "conv2d_dw", suffix)?;
        let dwp = ptr(&dw)?;
        let cfg = for_rows(dw.numel(), DW_THREADS);
        g.bind()?;
        // SAFETY: dw holds o*(c/groups)*kh*kw elements, each written once by its block (the grid
        // strides over them); dy and x are contiguous with the shapes `d` describes, and only
        // in-range input positions are read. The kernel's shared memory is static.
        unsafe {
            g.stream()
                .launch_builder(&f)
                .arg(&dwp)
                .arg(&dyp)
                .arg(&xp)
                .arg(&d)
                .launch(cfg)
        }
        .map_err(|e| g.fail(OP, e))?;
    }
    Ok((dx, dw))
}

/// Max pooling of `x [n, c, h, w]` -> `(y [n, c, oh, ow], indices)` with `indices` (I64, same
/// shape) the flat `iy * w + ix` position of each window's max in its plane, as the CPU's (first
/// max on ties, a NaN wins). One thread per output element.
fn max_pool2d(x: &Tensor, p: Pool2dParams, suffix: &str) -> Result<(Tensor, Tensor)> {
    const OP: &str = "max_pool2d";
    let d = pool_geom(OP, x, p)?;
    let g = gpu_of(x)?;
    let shape = pooled_shape(x, &d);
    let y = empty(&g, OP, x.dtype(), &shape)?;
    let idx = empty(&g, OP, DType::I64, &shape)?;
    if y.numel() == 0 {
        return Ok((y, idx));
    }
    let xd = dense(x)?;
    let f = kernel(&g, "max_pool2d", suffix)?;
    let (yp, ip, xp) = (ptr(&y)?, ptr(&idx)?, ptr(&xd)?);
    let cfg = for_elements(y.numel());
    g.bind()?;
    // SAFETY: y and idx hold planes*oh*ow elements each, written in full; x is contiguous with
    // the shape `d` describes and every window read is bounds-checked in the kernel.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&yp)
            .arg(&ip)
            .arg(&xp)
            .arg(&d)
            .launch(cfg)
    }
    .map_err(|e| g.fail(OP, e))?;
    Ok((y, idx))
}

/// Gradient of [`max_pool2d`]: `dx` (x's shape) gets each output gradient at its window's saved
/// argmax. One thread per input element, gathering over the windows that cover it.
fn max_pool2d_backward(x: &Tensor, idx: &Tensor, dy: &Tensor, p: Pool2dParams, suffix: &str) -> Result<Tensor> {
    const OP: &str = "max_pool2d_backward";
    let d = pool_geom(OP, x, p)?;
    let shape = pooled_shape(x, &d);
    expect_shape(OP, "the output gradient", dy, &shape)?;
    expect_shape(OP, "the indices", idx, &shape)?;
    if idx.dtype() != DType::I64 {
        return Err(invalid(OP, format!("indices of dtype {:?}, expected I64", idx.dtype())));
    }
    let g = gpu_of(x)?;
    let dx = empty(&g, OP, x.dtype(), x.shape())?;
    if dx.numel() == 0 {
        return Ok(dx);
    }
    let (idxd, dyd) = (dense(idx)?, dense_as(dy, x.dtype())?);
    let f = kernel(&g, "max_pool2d_backward", suffix)?;
    let (dxp, ip, dyp) = (ptr(&dx)?, ptr(&idxd)?, ptr(&dyd)?);
    let cfg = for_elements(dx.numel());
    g.bind()?;
    // SAFETY: dx holds planes*h*w elements, written in full; idx and dy are contiguous
    // [planes, oh, ow] and only the in-range windows covering each input element are read.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&dxp)
            .arg(&ip)
            .arg(&dyp)
            .arg(&d)
            .launch(cfg)
    }
    .map_err(|e| g.fail(OP, e))?;
    Ok(dx)
}

/// `1 / (kh * kw)`: average pooling divides by the full window (`count_include_pad=True`).
fn inverse_window(p: Pool2dParams) -> f64 {
    1.0 / (p.kernel.0 * p.kernel.1) as f64
}

/// Average pooling of `x [n, c, h, w]` -> `[n, c, oh, ow]`, padding counted in the divisor. One
/// thread per output element.
fn avg_pool2d(x: &Tensor, p: Pool2dParams, suffix: &str) -> Result<Tensor> {
    const OP: &str = "avg_pool2d";
    let d = pool_geom(OP, x, p)?;
    let g = gpu_of(x)?;
    let y = empty(&g, OP, x.dtype(), &pooled_shape(x, &d))?;
    if y.numel() == 0 {
        return Ok(y);
    }
    let xd = dense(x)?;
    let f = kernel(&g, "avg_pool2d", suffix)?;
    let (yp, xp, inv) = (ptr(&y)?, ptr(&xd)?, inverse_window(p));
    let cfg = for_elements(y.numel());
    g.bind()?;
    // SAFETY: y holds planes*oh*ow elements, written in full; x is contiguous with the shape `d`
    // describes and every window read is bounds-checked in the kernel.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&yp)
            .arg(&xp)
            .arg(&d)
            .arg(&inv)
            .launch(cfg)
    }
    .map_err(|e| g.fail(OP, e))?;
    Ok(y)
}

/// Gradient of [`avg_pool2d`]: `dx` (x's shape), each input element gathering `dy / (kh * kw)`
/// from the windows that cover it. One thread per input element.
fn avg_pool2d_backward(x: &Tensor, dy: &Tensor, p: Pool2dParams, suffix: &str) -> Result<Tensor> {
    const OP: &str = "avg_pool2d_backward";
    let d = pool_geom(OP, x, p)?;
    expect_shape(OP, "the output gradient", dy, &pooled_shape(x, &d))?;
    let g = gpu_of(x)?;
    let dx = empty(&g, OP, x.dtype(), x.shape())?;
    if dx.numel() == 0 {
        return Ok(dx);
    }
    let dyd = dense_as(dy, x.dtype())?;
    let f = kernel(&g, "avg_pool2d_backward", suffix)?;
    let (dxp, dyp, inv) = (ptr(&dx)?, ptr(&dyd)?, inverse_window(p));
    let cfg = for_elements(dx.numel());
    g.bind()?;
    // SAFETY: dx holds planes*h*w elements, written in full; dy is contiguous [planes, oh, ow]
    // and only the in-range windows covering each input element are read.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&dxp)
            .arg(&dyp)
            .arg(&d)
            .arg(&inv)
            .launch(cfg)
    }
    .map_err(|e| g.fail(OP, e))?;
    Ok(dx)
}
