//! Pointwise ops: unary math, broadcasting binary arithmetic, comparisons, scalar affine/pow/clamp,
//! `where`, and casts.

use std::mem::MaybeUninit;

use half::{bf16, f16};

use super::{apply, expect_float, to_compute};
use crate::cpu::elementwise as k;
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::layout::Layout;
use crate::op::{BinaryOp, CompareOp, Op, UnaryOp};
use crate::shape::{broadcast_shapes, numel};
use crate::storage::{CpuStorage, StorageElement};
use crate::tensor::Tensor;

macro_rules! unary_methods {
    ($($name:ident => $op:ident, $doc:literal;)*) => {
        impl Tensor {
            $(
                #[doc = $doc]
                pub fn $name(&self) -> Result<Tensor> {
                    self.unary(UnaryOp::$op)
                }
            )*
        }
    };
}

unary_methods! {
    neg => Neg, "`-x`.";
    exp => Exp, "`e^x`.";
    log => Log, "Natural logarithm.";
    sqrt => Sqrt, "Square root.";
    rsqrt => Rsqrt, "`1 / sqrt(x)`.";
    abs => Abs, "`|x|`.";
    tanh => Tanh, "Hyperbolic tangent.";
    sigmoid => Sigmoid, "`1 / (1 + e^-x)`.";
    relu => Relu, "`max(x, 0)`.";
    gelu => Gelu, "Exact GELU, `x Φ(x)` (PyTorch's `approximate='none'`).";
    gelu_tanh => GeluTanh, "Tanh-approximated GELU (PyTorch's `approximate='tanh'`).";
    silu => Silu, "`x * sigmoid(x)`.";
}

macro_rules! binary_methods {
    ($($name:ident => $op:ident, $doc:literal;)*) => {
        impl Tensor {
            $(
                #[doc = $doc]
                pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> {
                    self.binary(BinaryOp::$op, rhs)
                }
            )*
        }
    };
}

binary_methods! {
    add => Add, "`self + rhs`, broadcasting.";
    sub => Sub, "`self - rhs`, broadcasting.";
    mul => Mul, "`self * rhs`, broadcasting.";
    div => Div, "`self / rhs`, broadcasting.";
    pow => Pow, "`self ^ rhs`, broadcasting.";
    maximum => Maximum, "Elementwise max, broadcasting.";
    minimum => Minimum, "Elementwise min, broadcasting.";
}

macro_rules! compare_methods {
    ($($name:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                #[doc = concat!("Elementwise `", stringify!($name), "` comparison, broadcasting; returns Bool.")]
                pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> {
                    self.compare(CompareOp::$op, rhs)
                }
            )*
        }
    };
}

compare_methods! { eq => Eq; ne => Ne; lt => Lt; le => Le; gt => Gt; ge => Ge; }

impl Tensor {
    /// Applies a unary op (float tensors only).
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        expect_float("unary", self)?;
        apply(Op::Unary(op), &[self])
    }

    /// Applies a binary op with broadcasting; both tensors must have the same dtype.
    pub fn binary(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        if crate::autocast::autocast_dtype().is_some() && self.dtype() != rhs.dtype() {
            let (a, b) = crate::autocast::promote(self, rhs)?;
            if a.dtype() == b.dtype() {
                return a.binary(op, &b);
            }
        }
        same_dtype("binary", self, rhs)?;
        broadcast_shapes("binary", self.shape(), rhs.shape())?;
        apply(Op::Binary(op), &[self, rhs])
    }

    /// Compares with broadcasting; returns a Bool tensor.
    pub fn compare(&self, op: CompareOp, rhs: &Tensor) -> Result<Tensor> {
        same_dtype("compare", self, rhs)?;
        broadcast_shapes("compare", self.shape(), rhs.shape())?;
        apply(Op::Compare(op), &[self, rhs])
    }

    /// `self * mul + add` (float tensors).
    pub fn affine(&self, mul: f64, add: f64) -> Result<Tensor> {
        expect_float("affine", self)?;
        apply(Op::Affine { mul, add }, &[self])
    }

    /// `self + v`.
    pub fn add_scalar(&self, v: f64) -> Result<Tensor> {
        self.affine(1.0, v)
    }

    /// `self - v`.
    pub fn sub_scalar(&self, v: f64) -> Result<Tensor> {
        self.affine(1.0, -v)
    }

    /// `self * v`.
    pub fn mul_scalar(&self, v: f64) -> Result<Tensor> {
        self.affine(v, 0.0)
    }

    /// `self / v`.
    pub fn div_scalar(&self, v: f64) -> Result<Tensor> {
        self.affine(1.0 / v, 0.0)
    }

    /// `self ^ exponent`.
    pub fn pow_scalar(&self, exponent: f64) -> Result<Tensor> {
        expect_float("pow_scalar", self)?;
        apply(Op::PowScalar(exponent), &[self])
    }

    /// `1 / self`.
    pub fn recip(&self) -> Result<Tensor> {
        self.pow_scalar(-1.0)
    }

    /// `x * x`.
    pub fn square(&self) -> Result<Tensor> {
        self.pow_scalar(2.0)
    }

    /// Clamps into `[min, max]`; `None` leaves that side open.
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        expect_float("clamp", self)?;
        let (min, max) = (min.unwrap_or(f64::NEG_INFINITY), max.unwrap_or(f64::INFINITY));
        if min > max {
            return Err(invalid("clamp", format!("min {min} > max {max}")));
        }
        apply(Op::Clamp { min, max }, &[self])
    }

    /// `cond ? a : b`, elementwise with broadcasting of all three (as `torch.where`).
    pub fn where_cond(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        if cond.dtype() != DType::Bool {
            return Err(Error::DTypeMismatch {
                op: "where",
                lhs: cond.dtype(),
                rhs: DType::Bool,
            });
        }
        same_dtype("where", a, b)?;
        let s = broadcast_shapes("where", cond.shape(), a.shape())?;
        broadcast_shapes("where", &s, b.shape())?;
        apply(Op::Where, &[cond, a, b])
    }

    /// `value` where `mask` is true, `self` elsewhere (mask broadcasts to `self`).
    pub fn masked_fill(&self, mask: &Tensor, value: f64) -> Result<Tensor> {
        let fill = Tensor::full(&[], value, self.dtype())?;
        let out = Tensor::where_cond(mask, &fill, self)?;
        if out.shape() != self.shape() {
            return Err(Error::ShapeMismatch {
                op: "masked_fill",
                lhs: self.shape().to_vec(),
                rhs: mask.shape().to_vec(),
            });
        }
        Ok(out)
    }

    /// Converts to `dtype` (a no-op returning `self` when it already has it).
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        apply(Op::Cast(dtype), &[self])
    }
}

fn same_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            lhs: a.dtype(),
            rhs: b.dtype(),
        });
    }
    Ok(())
}

/// Runs `$body` with `$T` bound to the Rust type of any numeric (non-Bool) dtype.
macro_rules! numeric_dispatch {
    ($dtype:expr, $op:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::U8 => {
                type $T = u8;
                $body
            }
            d => return Err(Error::UnsupportedDType { op: $op, dtype: d }),
        }
    };
}

/// Row starts of a layout expanded to the output's shape, and its inner stride, for a strided
/// broadcast loop.
fn row_starts(op: &'static str, l: &Layout) -> Result<(Vec<usize>, usize)> {
    let mut starts = crate::alloc::with_capacity(op, l.numel() / l.shape.last().copied().unwrap_or(1).max(1))?;
    let mut stride = 1;
    l.for_each_row(|s, st, _| {
        starts.push(s);
        stride = st;
    });
    Ok((starts, stride))
}

/// Whether `l` is the transpose of a row-major matrix (2-D, strides `[1, s]` with `s` at least
/// its rows; no broadcast dim), which `storage::gather_slice` copies in blocks.
fn is_transposed_matrix(l: &Layout) -> bool {
    matches!((l.shape.as_slice(), l.strides.as_slice()), ([rows, cols], [1, s]) if *rows > 1 && *cols > 1 && *s >= *rows)
}

/// `out[i] = f(a[i], b[i])` over the broadcast of `a` and `b`, for op `name`.
fn broadcast_zip<T: StorageElement, U: StorageElement>(
    name: &'static str,
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(T, T) -> U + Sync + Send,
) -> Result<Tensor> {
    let shape = broadcast_shapes(name, a.shape(), b.shape())?;
    let (la, lb) = (a.layout().expand(&shape)?, b.layout().expand(&shape)?);
    let (ga, gb) = (a.storage().read(), b.storage().read());
    let sa = T::slice(&ga).ok_or(Error::DTypeMismatch {
        op: name,
        lhs: a.dtype(),
        rhs: T::DTYPE,
    })?;
    let sb = T::slice(&gb).ok_or(Error::DTypeMismatch {
        op: name,
        lhs: b.dtype(),
        rhs: T::DTYPE,
    })?;
    let n = numel(&shape);
    // an operand that is a transposed matrix (a weight's gradient through `x @ w^T`, added to
    // the accumulated one) is copied in 16 x 16 blocks first (`storage::gather_slice`): read
    // one strided element at a time, as below, it took several times as long
    let (copy_a, copy_b);
    let (sa, la) = if is_transposed_matrix(&la) {
        copy_a = crate::storage::gather_slice(name, sa, &la)?;
        (&copy_a[..], Layout::contiguous(&shape))
    } else {
        (sa, la)
    };
    let (sb, lb) = if is_transposed_matrix(&lb) {
        copy_b = crate::storage::gather_slice(name, sb, &lb)?;
        (&copy_b[..], Layout::contiguous(&shape))
    } else {
        (sb, lb)
    };
    let mut out = crate::alloc::uninit::<U>(name, n)?;
    if la.is_contiguous() && lb.is_contiguous() {
        k::zip_map(
            &sa[la.offset..la.offset + n],
            &sb[lb.offset..lb.offset + n],
            &mut out,
            f,
        );
    } else if n > 0 {
        let inner = shape.last().copied().unwrap_or(1);
        let (ra, sta) = row_starts(name, &la)?;
        let (rb, stb) = row_starts(name, &lb)?;
        let rows_per_task = (crate::cpu::PARALLEL_THRESHOLD / inner.max(1)).max(1);
        crate::cpu::pool::for_each_chunk(&mut out, rows_per_task * inner, |c, o| {
            for (r, o) in o.chunks_mut(inner).enumerate() {
                let (oa, ob) = (ra[c * rows_per_task + r], rb[c * rows_per_task + r]);
                if sta == 1 && stb == 1 {
                    for (i, o) in o.iter_mut().enumerate() {
                        o.write(f(sa[oa + i], sb[ob + i]));
                    }
                } else {
                    for (i, o) in o.iter_mut().enumerate() {
                        o.write(f(sa[oa + i * sta], sb[ob + i * stb]));
                    }
                }
            }
        });
    }
    // SAFETY: both paths write every element (the broadcast rows cover the output).
    Tensor::from_vec(unsafe { crate::cpu::assume_init(out) }, &shape)
}

/// `out[i] = f(x[i])` on a float tensor computed in its compute dtype, cast back to its dtype,
/// for op `name`. The `*_fn` must write every element of their output.
fn float_map(
    name: &'static str,
    x: &Tensor,
    f32_fn: impl Fn(&[f32], &mut [MaybeUninit<f32>]),
    f64_fn: impl Fn(&[f64], &mut [MaybeUninit<f64>]),
) -> Result<Tensor> {
    let xc = to_compute(name, x)?;
    let out = if xc.dtype() == DType::F64 {
        let mut out = crate::alloc::uninit(name, x.numel())?;
        f64_fn(&xc.contig::<f64>(name)?, &mut out);
        // SAFETY: the kernel wrote every element.
        Tensor::from_vec(unsafe { crate::cpu::assume_init(out) }, x.shape())?
    } else {
        let mut out = crate::alloc::uninit(name, x.numel())?;
        f32_fn(&xc.contig::<f32>(name)?, &mut out);
        // SAFETY: the kernel wrote every element.
        Tensor::from_vec(unsafe { crate::cpu::assume_init(out) }, x.shape())?
    };
    back_to(name, out, x.dtype())
}

/// Casts a result of `op` computed in f32 back to the storage dtype (bf16/f16), without
/// recording.
pub(crate) fn back_to(op: &'static str, t: Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        Ok(t)
    } else {
        Ok(Tensor::from_storage(t.cast_storage(op, dtype)?, t.shape()))
    }
}

/// `broadcast_zip` with the closure of `op`, monomorphized per op so the loops vectorize.
macro_rules! binary_zip {
    ($x:expr, $y:expr, $op:expr, $T:ty) => {
        match $op {
            BinaryOp::Add => broadcast_zip("binary", $x, $y, |a: $T, b: $T| a + b)?,
            BinaryOp::Sub => broadcast_zip("binary", $x, $y, |a: $T, b: $T| a - b)?,
            BinaryOp::Mul => broadcast_zip("binary", $x, $y, |a: $T, b: $T| a * b)?,
            BinaryOp::Div => broadcast_zip("binary", $x, $y, |a: $T, b: $T| a / b)?,
            BinaryOp::Maximum => broadcast_zip("binary", $x, $y, |a: $T, b: $T| if b > a { b } else { a })?,
            BinaryOp::Minimum => broadcast_zip("binary", $x, $y, |a: $T, b: $T| if b < a { b } else { a })?,
            BinaryOp::Pow => return Err(invalid("pow", "pow of tensors needs a float dtype")),
        }
    };
}

fn compare_fn<T: PartialOrd>(op: CompareOp) -> fn(T, T) -> bool {
    match op {
        CompareOp::Eq => |a, b| a == b,
        CompareOp::Ne => |a, b| a != b,
        CompareOp::Lt => |a, b| a < b,
        CompareOp::Le => |a, b| a <= b,
        CompareOp::Gt => |a, b| a > b,
        CompareOp::Ge => |a, b| a >= b,
    }
}

pub(super) fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let name = op.name();
    let out = match op {
        Op::Unary(u) => float_map(
            name,
            inputs[0],
            |s, d| k::unary_f32(*u, s, d),
            |s, d| k::unary_f64(*u, s, d),
        )?,
        Op::UnaryBackward(u) => {
            let (x, g) = (to_compute(name, inputs[0])?, to_compute(name, inputs[1])?);
            let n = x.numel();
            let op = "unary_backward";
            // SAFETY (assume_init): the kernels write every element.
            let out = if x.dtype() == DType::F64 {
                let mut out = crate::alloc::uninit(name, n)?;
                k::unary_backward_f64(*u, &x.contig::<f64>(op)?, &g.contig::<f64>(op)?, &mut out);
                Tensor::from_vec(unsafe { crate::cpu::assume_init(out) }, x.shape())?
            } else {
                let mut out = crate::alloc::uninit(name, n)?;
                k::unary_backward_f32(*u, &x.contig::<f32>(op)?, &g.contig::<f32>(op)?, &mut out);
                Tensor::from_vec(unsafe { crate::cpu::assume_init(out) }, x.shape())?
            };
            back_to(name, out, inputs[0].dtype())?
        }
        Op::Binary(b) => {
            let (x, y) = (inputs[0], inputs[1]);
            match x.dtype() {
                // same-shape contiguous bf16 operands in one pass (converted in registers)
                DType::BF16
                    if y.dtype() == DType::BF16 && x.shape() == y.shape() && x.is_contiguous() && y.is_contiguous() =>
                {
                    let (gx, gy) = (x.storage().read(), y.storage().read());
                    let (sx, sy) = (
                        bf16::slice(&gx).ok_or(Error::DTypeMismatch {
                            op: name,
                            lhs: x.dtype(),
                            rhs: DType::BF16,
                        })?,
                        bf16::slice(&gy).ok_or(Error::DTypeMismatch {
                            op: name,
                            lhs: y.dtype(),
                            rhs: DType::BF16,
                        })?,
                    );
                    let (n, ox, oy) = (x.numel(), x.layout().offset, y.layout().offset);
                    let mut out = crate::alloc::uninit(name, n)?;
                    k::binary_bf16(*b, &sx[ox..ox + n], &sy[oy..oy + n], &mut out);
                    // SAFETY: the kernel wrote every element.
                    Tensor::from_vec(unsafe { crate::cpu::assume_init(out) }, x.shape())?
                }
                DType::BF16 | DType::F16 => {
                    let r = forward(op, &[&to_compute(name, x)?, &to_compute(name, y)?])?.remove(0);
                    back_to(name, r, x.dtype())?
                }
                DType::F32 if *b == BinaryOp::Pow => broadcast_zip(name, x, y, |a: f32, b: f32| a.powf(b))?,
                DType::F64 if *b == BinaryOp::Pow => broadcast_zip(name, x, y, |a: f64, b: f64| a.powf(b))?,
                DType::I64 | DType::I32 | DType::U8 if *b == BinaryOp::Div => {
                    return Err(invalid(
                        "div",
                        format!(
                            "integer division of {:?} tensors: cast to a float dtype first",
                            x.dtype()
                        ),
                    ))
                }
                dt => numeric_dispatch!(dt, "binary", T => binary_zip!(x, y, *b, T)),
            }
        }
        Op::Compare(c) => {
            let (x, y) = (inputs[0], inputs[1]);
            match x.dtype() {
                DType::BF16 => broadcast_zip(name, x, y, compare_fn::<bf16>(*c))?,
                DType::F16 => broadcast_zip(name, x, y, compare_fn::<f16>(*c))?,
                DType::Bool => broadcast_zip(name, x, y, compare_fn::<bool>(*c))?,
                dt => numeric_dispatch!(dt, "compare", T => broadcast_zip(name, x, y, compare_fn::<T>(*c))?),
            }
        }
        Op::Affine { mul, add } => {
            let (m, a) = (*mul, *add);
            let (mf, af) = (m as f32, a as f32);
            float_map(
                name,
                inputs[0],
                |s, d| k::map(s, d, |x| x * mf + af),
                |s, d| k::map(s, d, |x| x * m + a),
            )?
        }
        Op::PowScalar(e) => {
            let e = *e;
            let ef = e as f32;
            float_map(
                name,
                inputs[0],
                |s, d| {
                    if ef == 2.0 {
                        k::map(s, d, |x| x * x)
                    } else if ef == -1.0 {
                        k::map(s, d, |x| 1.0 / x)
                    } else {
                        k::map(s, d, |x| x.powf(ef))
                    }
                },
                |s, d| k::map(s, d, |x| x.powf(e)),
            )?
        }
        Op::Clamp { min, max } => {
            let (lo, hi) = (*min, *max);
            let (lof, hif) = (lo as f32, hi as f32);
            float_map(
                name,
                inputs[0],
                |s, d| k::map(s, d, |x| x.max(lof).min(hif)),
                |s, d| k::map(s, d, |x| x.max(lo).min(hi)),
            )?
        }
        Op::Where => where_forward(inputs[0], inputs[1], inputs[2])?,
        Op::Cast(d) => Tensor::from_storage(inputs[0].cast_storage(name, *d)?, inputs[0].shape()),
        _ => unreachable!("elementwise::forward called with {op:?}"),
    };
    Ok(vec![out])
}

fn where_forward(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let shape = broadcast_shapes("where", &broadcast_shapes("where", cond.shape(), a.shape())?, b.shape())?;
    let oc = cond.layout().expand(&shape)?.offsets("where")?;
    let oa = a.layout().expand(&shape)?.offsets("where")?;
    let ob = b.layout().expand(&shape)?.offsets("where")?;
    let gc = cond.storage().read();
    let c = bool::slice(&gc).expect("cond is Bool");
    let (ga, gb) = (a.storage().read(), b.storage().read());
    fn pick<T: StorageElement>(
        c: &[bool],
        oc: &[usize],
        a: &CpuStorage,
        oa: &[usize],
        b: &CpuStorage,
        ob: &[usize],
    ) -> Result<CpuStorage> {
        let (a, b) = (T::slice(a).expect("dtype checked"), T::slice(b).expect("dtype checked"));
        let n = oc.len();
        Ok(T::wrap(crate::alloc::collect(
            "where",
            n,
            (0..n).map(|i| if c[oc[i]] { a[oa[i]] } else { b[ob[i]] }),
        )?))
    }
    let data = match a.dtype() {
        DType::F32 => pick::<f32>(c, &oc, &ga, &oa, &gb, &ob),
        DType::F64 => pick::<f64>(c, &oc, &ga, &oa, &gb, &ob),
        DType::BF16 => pick::<bf16>(c, &oc, &ga, &oa, &gb, &ob),
        DType::F16 => pick::<f16>(c, &oc, &ga, &oa, &gb, &ob),
        DType::I64 => pick::<i64>(c, &oc, &ga, &oa, &gb, &ob),
        DType::I32 => pick::<i32>(c, &oc, &ga, &oa, &gb, &ob),
        DType::U8 => pick::<u8>(c, &oc, &ga, &oa, &gb, &ob),
        DType::Bool => pick::<bool>(c, &oc, &ga, &oa, &gb, &ob),
    }?;
    Ok(Tensor::from_storage(data, &shape))
}

pub(super) fn backward(op: &Op, inputs: &[Tensor], output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let x = &inputs[0];
    Ok(match op {
        Op::Unary(u) => vec![Some(super::apply_multi(Op::UnaryBackward(*u), &[x, grad])?.remove(0))],
        Op::Binary(b) => {
            let y = &inputs[1];
            let (gx, gy) = match b {
                BinaryOp::Add => (grad.clone(), grad.clone()),
                BinaryOp::Sub => (grad.clone(), grad.neg()?),
                BinaryOp::Mul => (grad.mul(y)?, grad.mul(x)?),
                BinaryOp::Div => (grad.div(y)?, grad.mul(output)?.div(y)?.neg()?),
                BinaryOp::Pow => {
                    let gx = grad.mul(y)?.mul(&x.pow(&y.sub_scalar(1.0)?)?)?;
                    let gy = grad.mul(output)?.mul(&x.log()?)?;
                    (gx, gy)
                }
                BinaryOp::Maximum | BinaryOp::Minimum => {
                    // Ties split the gradient evenly, as PyTorch does.
                    let wins = if *b == BinaryOp::Maximum { x.gt(y)? } else { x.lt(y)? };
                    let ties = x.eq(y)?;
                    let share = wins.cast(x.dtype())?.add(&ties.cast(x.dtype())?.mul_scalar(0.5)?)?;
                    let gx = grad.mul(&share)?;
                    let gy = grad.sub(&gx)?;
                    (gx, gy)
                }
            };
            vec![Some(gx.sum_to_shape(x.shape())?), Some(gy.sum_to_shape(y.shape())?)]
        }
        Op::Affine { mul, .. } => vec![Some(grad.mul_scalar(*mul)?)],
        Op::PowScalar(e) => vec![Some(grad.mul(&x.pow_scalar(e - 1.0)?.mul_scalar(*e)?)?)],
        Op::Clamp { min, max } => {
            let lo = Tensor::full(&[], *min, x.dtype())?;
            let hi = Tensor::full(&[], *max, x.dtype())?;
            let inside = x.ge(&lo)?.cast(x.dtype())?.mul(&x.le(&hi)?.cast(x.dtype())?)?;
            vec![Some(grad.mul(&inside)?)]
        }
        Op::Where => {
            let (cond, a, b) = (&inputs[0], &inputs[1], &inputs[2]);
            let zero = Tensor::zeros(&[], grad.dtype())?;
            let ga = Tensor::where_cond(cond, grad, &zero)?.sum_to_shape(a.shape())?;
            let gb = Tensor::where_cond(cond, &zero, grad)?.sum_to_shape(b.shape())?;
            vec![None, Some(ga), Some(gb)]
        }
        Op::Cast(_) => vec![Some(grad.cast(x.dtype())?)],
        _ => unreachable!("elementwise::backward called with {op:?}"),
    })
}
