//! GPU forward of the elementwise family (see `crate::ops::elementwise` for the CPU's): unary
//! math and its backward, broadcasting binary arithmetic and comparisons, the scalar ops
//! (affine, pow, clamp), `where` and casts.
//!
//! Every kernel writes a new contiguous output of the result's shape, one thread per element,
//! and reads each input through a [`Strided`] view of that shape (zero strides on broadcast dims,
//! so neither broadcasting nor a strided input costs a copy). bf16/f16 compute in f32 and f64 in
//! f64, as the CPU does; dtypes and errors follow the CPU's forward.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, PushKernelArg};

use crate::cuda::copy::{buffer, contiguous, empty, gpu_of};
use crate::cuda::kernels::ELEMENTWISE;
use crate::cuda::launch::{for_elements, Strided};
use crate::cuda::runtime::Gpu;
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::layout::Layout;
use crate::op::{BinaryOp, CompareOp, Op, UnaryOp};
use crate::shape::{broadcast_shapes, numel};
use crate::tensor::Tensor;

/// The kernels of `kernels/elementwise.cu` that this family launches (checked by the compile test).
pub const KERNELS: &[&str] = &[
    "unary_f32",
    "unary_f64",
    "unary_bf16",
    "unary_f16",
    "unary_backward_f32",
    "unary_backward_f64",
    "unary_backward_bf16",
    "unary_backward_f16",
    "binary_f32",
    "binary_f64",
    "binary_bf16",
    "binary_f16",
    "binary_i64",
    "binary_i32",
    "binary_u8",
    "affine_f32",
    "affine_f64",
    "affine_bf16",
    "affine_f16",
    "pow_scalar_f32",
    "pow_scalar_f64",
    "pow_scalar_bf16",
    "pow_scalar_f16",
    "clamp_f32",
    "clamp_f64",
    "clamp_bf16",
    "clamp_f16",
    "compare_f32",
    "compare_f64",
    "compare_bf16",
    "compare_f16",
    "compare_i64",
    "compare_i32",
    "compare_u8",
    "compare_bool",
    "where_1",
    "where_2",
    "where_4",
    "where_8",
    "cast_from_f32",
    "cast_from_f64",
    "cast_from_bf16",
    "cast_from_f16",
    "cast_from_i64",
    "cast_from_i32",
    "cast_from_u8",
    "cast_from_bool",
];

/// Queues kernel `$f` on `$g`'s stream with `$cfg` and the arguments in order (each a local that
/// outlives the call: device pointers as `u64`, scalars, [`Strided`] views); a launch failure
/// becomes an error naming `$op`.
macro_rules! launch {
    ($g:expr, $f:expr, $cfg:expr, $op:expr; $($arg:expr),* $(,)?) => {{
        $g.bind()?;
        let mut builder = $g.stream().launch_builder(&$f);
        $(builder.arg(&$arg);)*
        // SAFETY: every caller passes the arguments its kernel declares, in order and with
        // matching types (u64 device pointers, u64/u32 counts and codes, f32/f64 scalars,
        // `Strided` as the prelude's struct); each pointer is to a live buffer on this GPU of
        // at least the elements the kernel touches (outputs sized by `empty` for `n` elements;
        // inputs read at the offsets of views checked against their storage); the kernel runs
        // on the GPU's one stream, ordered before any later use or release of the buffers.
        unsafe { builder.launch($cfg) }.map_err(|e| $g.fail($op, e))?;
    }};
}
pub(crate) use launch;

/// The kernels' suffix for a dtype (`unary_bf16`, `compare_bool`, ...).
pub(crate) fn dtype_suffix(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::I64 => "i64",
        DType::I32 => "i32",
        DType::U8 => "u8",
        DType::Bool => "bool",
    }
}

/// The dtype codes of the cast kernel's `dst` argument (`D_F32` ... in `elementwise.cu`).
fn dtype_code(d: DType) -> u32 {
    match d {
        DType::F32 => 0,
        DType::F64 => 1,
        DType::BF16 => 2,
        DType::F16 => 3,
        DType::I64 => 4,
        DType::I32 => 5,
        DType::U8 => 6,
        DType::Bool => 7,
    }
}

/// The op code of `unary_value`/`unary_derivative` in `elementwise.cu`.
fn unary_code(u: UnaryOp) -> u32 {
    match u {
        UnaryOp::Neg => 0,
        UnaryOp::Exp => 1,
        UnaryOp::Log => 2,
        UnaryOp::Sqrt => 3,
        UnaryOp::Rsqrt => 4,
        UnaryOp::Abs => 5,
        UnaryOp::Tanh => 6,
        UnaryOp::Sigmoid => 7,
        UnaryOp::Relu => 8,
        UnaryOp::Gelu => 9,
        UnaryOp::GeluTanh => 10,
        UnaryOp::Silu => 11,
    }
}

/// The op code of the binary kernels.
fn binary_code(b: BinaryOp) -> u32 {
    match b {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
        BinaryOp::Pow => 4,
        BinaryOp::Maximum => 5,
        BinaryOp::Minimum => 6,
    }
}

/// The op code of the compare kernels.
fn compare_code(c: CompareOp) -> u32 {
    match c {
        CompareOp::Eq => 0,
        CompareOp::Ne => 1,
        CompareOp::Lt => 2,
        CompareOp::Le => 3,
        CompareOp::Gt => 4,
        CompareOp::Ge => 5,
    }
}

/// `layout` with size-1 dims dropped and adjacent dims merged where one stride steps over the
/// other (a contiguous layout becomes one dim): the same elements in the same row-major order,
/// cheaper for the kernels to index, and within the kernels' rank limit more often.
pub(crate) fn coalesce(layout: &Layout) -> (Vec<usize>, Vec<usize>) {
    let (mut shape, mut strides): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
    for (&n, &s) in layout.shape.iter().zip(&layout.strides) {
        if n == 1 {
            continue;
        }
        if let (Some(ln), Some(ls)) = (shape.last_mut(), strides.last_mut()) {
            if *ls == s * n {
                *ln *= n;
                *ls = s;
                continue;
            }
        }
        shape.push(n);
        strides.push(s);
    }
    (shape, strides)
}

/// The view a kernel reads `t` through for an output of `shape` (`t` broadcast to it): element
/// `i` of the row-major output is at `strided_offset(view, i)` in `t`'s buffer.
pub(crate) fn view_of(op: &'static str, t: &Tensor, shape: &[usize]) -> Result<Strided> {
    let l = t.layout().expand(shape)?;
    let (s, st) = coalesce(&l);
    Strided::new(op, &s, &st, l.offset)
}

/// The buffer address of `t`'s element 0 of storage (views add their offset in [`Strided`]).
fn base(t: &Tensor) -> Result<u64> {
    Ok(buffer(t)?.ptr())
}

/// The kernel `name` of the elementwise module.
fn kernel(g: &Arc<Gpu>, name: &str) -> Result<CudaFunction> {
    g.function(&ELEMENTWISE, name)
}

pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let out = match op {
        Op::Unary(u) => unary(inputs[0], *u)?,
        Op::UnaryBackward(u) => unary_backward(inputs[0], inputs[1], *u)?,
        Op::Binary(b) => binary(inputs[0], inputs[1], *b)?,
        Op::Compare(c) => compare(inputs[0], inputs[1], *c)?,
        Op::Affine { mul, add } => scalar_op(op, inputs[0], "affine", *mul, *add)?,
        Op::PowScalar(e) => scalar_op(op, inputs[0], "pow_scalar", *e, 0.0)?,
        Op::Clamp { min, max } => scalar_op(op, inputs[0], "clamp", *min, *max)?,
        Op::Where => where_cond(inputs[0], inputs[1], inputs[2])?,
        Op::Cast(d) => cast(inputs[0], *d)?,
        _ => unreachable!("elementwise::forward called with {op:?}"),
    };
    Ok(vec![out])
}

/// The error of a float-only op on another dtype (the ops layer refuses these first).
fn expect_float(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType { op, dtype: t.dtype() })
    }
}

/// `op(x)` elementwise (float dtypes), shape of `x`.
fn unary(x: &Tensor, u: UnaryOp) -> Result<Tensor> {
    expect_float("unary", x)?;
    let g = gpu_of(x)?;
    let out = empty(&g, "unary", x.dtype(), x.shape())?;
    let n = x.numel();
    if n == 0 {
        return Ok(out);
    }
    let f = kernel(&g, &format!("unary_{}", dtype_suffix(x.dtype())))?;
    let sx = view_of("unary", x, x.shape())?;
    let (o, i, n64, code) = (base(&out)?, base(x)?, n as u64, unary_code(u));
    launch!(g, f, for_elements(n), "unary"; o, i, sx, n64, code);
    Ok(out)
}

/// `grad * op'(x)` elementwise (float dtypes; `grad` of `x`'s shape and dtype).
fn unary_backward(x: &Tensor, grad: &Tensor, u: UnaryOp) -> Result<Tensor> {
    expect_float("unary_backward", x)?;
    if grad.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch {
            op: "unary_backward",
            lhs: x.dtype(),
            rhs: grad.dtype(),
        });
    }
    let g = gpu_of(x)?;
    let out = empty(&g, "unary_backward", x.dtype(), x.shape())?;
    let n = x.numel();
    if n == 0 {
        return Ok(out);
    }
    let f = kernel(&g, &format!("unary_backward_{}", dtype_suffix(x.dtype())))?;
    let sx = view_of("unary_backward", x, x.shape())?;
    let sg = view_of("unary_backward", grad, x.shape())?;
    let (o, xi, gi, n64, code) = (base(&out)?, base(x)?, base(grad)?, n as u64, unary_code(u));
    launch!(g, f, for_elements(n), "unary_backward"; o, xi, sx, gi, sg, n64, code);
    Ok(out)
}

/// `a op b` broadcast (same dtype): every op for floats; add, sub, mul, maximum and minimum for
/// integers (wrapping, as the CPU's release build); the CPU's errors for the rest.
fn binary(a: &Tensor, b: &Tensor, op: BinaryOp) -> Result<Tensor> {
    let dt = a.dtype();
    match dt {
        DType::Bool => {
            return Err(Error::UnsupportedDType {
                op: "binary",
                dtype: dt,
            })
        }
        DType::I64 | DType::I32 | DType::U8 if op == BinaryOp::Div => {
            return Err(invalid(
                "div",
                format!("integer division of {dt:?} tensors: cast to a float dtype first"),
            ))
        }
        DType::I64 | DType::I32 | DType::U8 if op == BinaryOp::Pow => {
            return Err(invalid("pow", "pow of tensors needs a float dtype"))
        }
        _ => {}
    }
    if b.dtype() != dt {
        return Err(Error::DTypeMismatch {
            op: "binary",
            lhs: dt,
            rhs: b.dtype(),
        });
    }
    let shape = broadcast_shapes("binary", a.shape(), b.shape())?;
    let g = gpu_of(a)?;
    let out = empty(&g, "binary", dt, &shape)?;
    let n = numel(&shape);
    if n == 0 {
        return Ok(out);
    }
    let f = kernel(&g, &format!("binary_{}", dtype_suffix(dt)))?;
    let (sa, sb) = (view_of("binary", a, &shape)?, view_of("binary", b, &shape)?);
    let (o, ai, bi, n64, code) = (base(&out)?, base(a)?, base(b)?, n as u64, binary_code(op));
    launch!(g, f, for_elements(n), "binary"; o, ai, sa, bi, sb, n64, code);
    Ok(out)
}

/// `a cmp b` broadcast (same dtype, any dtype), as a Bool tensor.
fn compare(a: &Tensor, b: &Tensor, op: CompareOp) -> Result<Tensor> {
    let dt = a.dtype();
    if b.dtype() != dt {
        return Err(Error::DTypeMismatch {
            op: "compare",
            lhs: dt,
            rhs: b.dtype(),
        });
    }
    let shape = broadcast_shapes("compare", a.shape(), b.shape())?;
    let g = gpu_of(a)?;
    let out = empty(&g, "compare", DType::Bool, &shape)?;
    let n = numel(&shape);
    if n == 0 {
        return Ok(out);
    }
    let f = kernel(&g, &format!("compare_{}", dtype_suffix(dt)))?;
    let (sa, sb) = (view_of("compare", a, &shape)?, view_of("compare", b, &shape)?);
    let (o, ai, bi, n64, code) = (base(&out)?, base(a)?, base(b)?, n as u64, compare_code(op));
    launch!(g, f, for_elements(n), "compare"; o, ai, sa, bi, sb, n64, code);
    Ok(out)
}

/// The ops of one tensor and two scalars (float dtypes), kernel `<kind>_<dtype>`:
/// `affine` (`x * p + q`), `pow_scalar` (`x ^ p`), `clamp` (into `[p, q]`). The scalars reach
/// f32/bf16/f16 kernels as f32 (`as f32`, as the CPU's f32 path converts them).
fn scalar_op(op: &Op, x: &Tensor, kind: &'static str, p: f64, q: f64) -> Result<Tensor> {
    let name = op.name();
    expect_float(name, x)?;
    let g = gpu_of(x)?;
    let out = empty(&g, name, x.dtype(), x.shape())?;
    let n = x.numel();
    if n == 0 {
        return Ok(out);
    }
    let f = kernel(&g, &format!("{kind}_{}", dtype_suffix(x.dtype())))?;
    let sx = view_of(name, x, x.shape())?;
    let (o, i, n64) = (base(&out)?, base(x)?, n as u64);
    let cfg = for_elements(n);
    let wide = x.dtype() == DType::F64;
    let (p32, q32) = (p as f32, q as f32);
    match (kind, wide) {
        ("pow_scalar", true) => launch!(g, f, cfg, name; o, i, sx, n64, p),
        ("pow_scalar", false) => launch!(g, f, cfg, name; o, i, sx, n64, p32),
        (_, true) => launch!(g, f, cfg, name; o, i, sx, n64, p, q),
        (_, false) => launch!(g, f, cfg, name; o, i, sx, n64, p32, q32),
    }
    Ok(out)
}

/// `cond ? a : b` with all three broadcast (cond Bool; a and b of one dtype, any dtype).
fn where_cond(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if cond.dtype() != DType::Bool {
        return Err(Error::DTypeMismatch {
            op: "where",
            lhs: cond.dtype(),
            rhs: DType::Bool,
        });
    }
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op: "where",
            lhs: a.dtype(),
            rhs: b.dtype(),
        });
    }
    let shape = broadcast_shapes("where", &broadcast_shapes("where", cond.shape(), a.shape())?, b.shape())?;
    let g = gpu_of(a)?;
    let out = empty(&g, "where", a.dtype(), &shape)?;
    let n = numel(&shape);
    if n == 0 {
        return Ok(out);
    }
    let f = kernel(&g, &format!("where_{}", a.dtype().size_in_bytes()))?;
    let sc = view_of("where", cond, &shape)?;
    let (sa, sb) = (view_of("where", a, &shape)?, view_of("where", b, &shape)?);
    let (o, ci, ai, bi, n64) = (base(&out)?, base(cond)?, base(a)?, base(b)?, n as u64);
    launch!(g, f, for_elements(n), "where"; o, ci, sc, ai, sa, bi, sb, n64);
    Ok(out)
}

/// `x` converted to `dtype` by `CpuStorage::cast`'s rules (a contiguous copy when `x` has it).
fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if x.dtype() == dtype {
        return contiguous(x);
    }
    let g = gpu_of(x)?;
    let out = empty(&g, "cast", dtype, x.shape())?;
    let n = x.numel();
    if n == 0 {
        return Ok(out);
    }
    let f = kernel(&g, &format!("cast_from_{}", dtype_suffix(x.dtype())))?;
    let sx = view_of("cast", x, x.shape())?;
    let (o, i, n64, dst) = (base(&out)?, base(x)?, n as u64, dtype_code(dtype));
    launch!(g, f, for_elements(n), "cast"; o, i, sx, n64, dst);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesce_merges_what_steps_over() {
        let c = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(coalesce(&c), (vec![24], vec![1]));
        let t = c.permute(&[0, 2, 1]).unwrap();
        assert_eq!(coalesce(&t), (vec![2, 4, 3], vec![12, 1, 4]));
        let b = Layout::contiguous(&[3, 1]).expand(&[2, 3, 5]).unwrap();
        assert_eq!(coalesce(&b), (vec![2, 3, 5], vec![0, 1, 0]));
        let z = Layout::contiguous(&[1, 4]).expand(&[5, 2, 4]).unwrap();
        assert_eq!(coalesce(&z), (vec![10, 4], vec![0, 1]));
        assert_eq!(coalesce(&Layout::contiguous(&[])), (vec![], vec![]));
        let n = Layout::contiguous(&[4, 6]).narrow(1, 1, 3).unwrap();
        assert_eq!(coalesce(&n), (vec![4, 3], vec![6, 1]));
    }
}
