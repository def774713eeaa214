//! GPU forward of the index family (see `crate::ops::index` for the CPU's): index_select,
//! index_add, gather, scatter_add and one_hot, with the kernels of `kernels/index.cu`.
//!
//! As on the CPU, every index value is range-checked before anything is computed: the index
//! tensor is copied to the host and read there, so each of these ops waits for the GPU's queued
//! work (a sync point). The kernels then read indices unchecked.
//!
//! index_select and gather move elements by size, for every dtype. index_add and scatter_add
//! (float `x`; `src` of any dtype, converted as the CPU's cast converts it) accumulate with
//! `atomicAdd` in the compute type, f32 for f32/bf16/f16 and f64 for f64: the output starts as a
//! copy of `x` (in an f32 scratch buffer for bf16/f16, rounded to the dtype at the end). The
//! order of the additions is not fixed, so f32 sums may differ from the CPU's in the last bits.

use cudarc::driver::PushKernelArg;

use crate::cuda::copy::{buffer, dense, empty, gpu_of, ptr};
use crate::cuda::kernels::INDEX;
use crate::cuda::launch::{for_elements, Strided};
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::op::Op;
use crate::shape::contiguous_strides;
use crate::tensor::Tensor;

/// The kernels of `kernels/index.cu` that this family launches (checked by the compile test).
pub const KERNELS: &[&str] = &[
    "index_select_1",
    "index_select_2",
    "index_select_4",
    "index_select_8",
    "index_gather_1",
    "index_gather_2",
    "index_gather_4",
    "index_gather_8",
    "index_load_f32",
    "index_load_f64",
    "index_load_bf16",
    "index_load_f16",
    "index_store_bf16",
    "index_store_f16",
    "index_add_f32_f32",
    "index_add_f64_f32",
    "index_add_bf16_f32",
    "index_add_f16_f32",
    "index_add_i64_f32",
    "index_add_i32_f32",
    "index_add_u8_f32",
    "index_add_f32_f64",
    "index_add_f64_f64",
    "index_add_bf16_f64",
    "index_add_f16_f64",
    "index_add_i64_f64",
    "index_add_i32_f64",
    "index_add_u8_f64",
    "scatter_add_f32_f32",
    "scatter_add_f64_f32",
    "scatter_add_bf16_f32",
    "scatter_add_f16_f32",
    "scatter_add_i64_f32",
    "scatter_add_i32_f32",
    "scatter_add_u8_f32",
    "scatter_add_f32_f64",
    "scatter_add_f64_f64",
    "scatter_add_bf16_f64",
    "scatter_add_f16_f64",
    "scatter_add_i64_f64",
    "scatter_add_i32_f64",
    "scatter_add_u8_f64",
    "one_hot",
];

pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let out = match op {
        Op::IndexSelect { dim } => index_select(inputs[0], inputs[1], *dim)?,
        Op::IndexAdd { dim } => accumulate(op, inputs[0], inputs[1], inputs[2], *dim)?,
        Op::Gather { dim } => gather(inputs[0], inputs[1], *dim)?,
        Op::ScatterAdd { dim } => accumulate(op, inputs[0], inputs[1], inputs[2], *dim)?,
        Op::OneHot { num_classes } => one_hot(inputs[0], *num_classes)?,
        _ => unreachable!("index::forward called with {op:?}"),
    };
    Ok(vec![out])
}

/// Errors as the CPU does when an element of `index` (I64) is outside `0..size`, naming the first
/// such element in row-major order. Reads `index` on the host: waits for the GPU's queue.
fn check_indices(op: &'static str, index: &Tensor, size: usize) -> Result<()> {
    if index.dtype() != DType::I64 {
        return Err(Error::DTypeMismatch {
            op,
            lhs: index.dtype(),
            rhs: DType::I64,
        });
    }
    let v = index.to_vec::<i64>()?;
    match v.iter().find(|&&i| i < 0 || i as u64 >= size as u64) {
        Some(&bad) => Err(Error::IndexOutOfRange { op, index: bad, size }),
        None => Ok(()),
    }
}

/// Launches kernel `$name` of the index module over `$n` elements with the locals `$arg` as its
/// arguments (each must match the kernel's parameter, and point into buffers that hold every
/// element the kernel addresses).
macro_rules! launch {
    ($g:expr, $op:expr, $name:expr, $n:expr; $($arg:ident),* $(,)?) => {{
        let f = $g.function(&INDEX, $name)?;
        $g.bind()?;
        let mut b = $g.stream().launch_builder(&f);
        $(b.arg(&$arg);)*
        // SAFETY: the arguments match the kernel's parameters (see each kernel in index.cu) and
        // are locals that outlive the launch; views were checked against their storage when
        // built, outputs hold the elements the kernel writes, and every index value was checked
        // against the dim it indexes before the launch.
        unsafe { b.launch(for_elements($n)) }.map_err(|e| $g.fail($op, e))?;
    }};
}

/// `x` with dim `dim` replaced by the entries `index` (1-D) of it.
fn index_select(x: &Tensor, index: &Tensor, dim: usize) -> Result<Tensor> {
    const OP: &str = "index_select";
    check_indices(OP, index, x.shape()[dim])?;
    let mut shape = x.shape().to_vec();
    shape[dim] = index.numel();
    let g = gpu_of(x)?;
    let out = empty(&g, OP, x.dtype(), &shape)?;
    let n = out.numel();
    if n == 0 {
        return Ok(out);
    }
    let index = dense(index)?;
    let sel = Strided::new(OP, &shape, &x.layout().strides, x.layout().offset)?;
    let (o, xp, ip, d, n64) = (ptr(&out)?, buffer(x)?.ptr(), ptr(&index)?, dim as u32, n as u64);
    let name = format!("index_select_{}", x.dtype().size_in_bytes());
    launch!(g, OP, &name, n; o, xp, ip, sel, d, n64);
    Ok(out)
}

/// `out` of `index`'s shape: `x` at each element's coordinates with coordinate `dim` replaced by
/// the index there.
fn gather(x: &Tensor, index: &Tensor, dim: usize) -> Result<Tensor> {
    const OP: &str = "gather";
    check_indices(OP, index, x.shape()[dim])?;
    let g = gpu_of(x)?;
    let out = empty(&g, OP, x.dtype(), index.shape())?;
    let n = out.numel();
    if n == 0 {
        return Ok(out);
    }
    let (iv, xv) = (Strided::of(OP, index.layout())?, Strided::of(OP, x.layout())?);
    let (o, xp, ip, d, n64) = (ptr(&out)?, buffer(x)?.ptr(), buffer(index)?.ptr(), dim as u32, n as u64);
    let name = format!("index_gather_{}", x.dtype().size_in_bytes());
    launch!(g, OP, &name, n; o, xp, ip, iv, xv, d, n64);
    Ok(out)
}

/// A dtype's name in the kernel names (bool is read as its byte).
fn kernel_dtype(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::I64 => "i64",
        DType::I32 => "i32",
        DType::U8 | DType::Bool => "u8",
    }
}

/// index_add (`src` rows added at `index` (1-D) along `dim`) or scatter_add (each element of
/// `src` added at its own coordinates with coordinate `dim` replaced by `index`'s element
/// there) into a copy of the float `x`.
fn accumulate(op: &Op, x: &Tensor, index: &Tensor, src: &Tensor, dim: usize) -> Result<Tensor> {
    let scatter = matches!(op, Op::ScatterAdd { .. });
    let name: &'static str = if scatter { "scatter_add" } else { "index_add" };
    let dtype = x.dtype();
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType { op: name, dtype });
    }
    check_indices(name, index, x.shape()[dim])?;
    let g = gpu_of(x)?;
    let acc_dtype = dtype.compute_float();
    let acc = empty(&g, name, acc_dtype, x.shape())?;
    let n = x.numel();
    if n > 0 {
        let xv = Strided::of(name, x.layout())?;
        let (ap, xp, n64) = (ptr(&acc)?, buffer(x)?.ptr(), n as u64);
        launch!(g, name, &format!("index_load_{}", kernel_dtype(dtype)), n; ap, xp, xv, n64);
    }
    let count = if scatter { index.numel() } else { src.numel() };
    if count > 0 {
        let kernel = format!("{name}_{}_{}", kernel_dtype(src.dtype()), kernel_dtype(acc_dtype));
        let ov = Strided::new(name, x.shape(), &contiguous_strides(x.shape()), 0)?;
        let sv = Strided::of(name, src.layout())?;
        let (ap, sp, d, c64) = (ptr(&acc)?, buffer(src)?.ptr(), dim as u32, count as u64);
        if scatter {
            let iv = Strided::of(name, index.layout())?;
            let ip = buffer(index)?.ptr();
            launch!(g, name, &kernel, count; ap, sp, ip, iv, sv, ov, d, c64);
        } else {
            let index = dense(index)?;
            let ip = ptr(&index)?;
            launch!(g, name, &kernel, count; ap, sp, ip, sv, ov, d, c64);
        }
    }
    if acc_dtype == dtype {
        return Ok(acc);
    }
    // bf16/f16: the f32 sums rounded once
    let out = empty(&g, name, dtype, x.shape())?;
    if n > 0 {
        let (outp, ap, n64) = (ptr(&out)?, ptr(&acc)?, n as u64);
        launch!(g, name, &format!("index_store_{}", kernel_dtype(dtype)), n; outp, ap, n64);
    }
    Ok(out)
}

/// I64 class ids `[...]` -> I64 `[..., num_classes]` of zeros with a one at each id.
fn one_hot(ids: &Tensor, num_classes: usize) -> Result<Tensor> {
    const OP: &str = "one_hot";
    check_indices(OP, ids, num_classes)?;
    let n = ids
        .numel()
        .checked_mul(num_classes)
        .ok_or_else(|| invalid(OP, format!("{} ids x {num_classes} classes overflow", ids.numel())))?;
    let mut shape = ids.shape().to_vec();
    shape.push(num_classes);
    let g = gpu_of(ids)?;
    let out = empty(&g, OP, DType::I64, &shape)?;
    if n == 0 {
        return Ok(out);
    }
    let iv = Strided::of(OP, ids.layout())?;
    let (o, ip, c, n64) = (ptr(&out)?, buffer(ids)?.ptr(), num_classes as u64, n as u64);
    launch!(g, OP, "one_hot", n; o, ip, iv, c, n64);
    Ok(out)
}
