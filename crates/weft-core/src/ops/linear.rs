//! `linear` (PyTorch's Linear layout) as one gemm whose tasks finish their own blocks of the
//! output: the bias, an optional activation and an optional residual are applied to each block
//! right after its product, while it is in that core's cache, instead of in passes of their own.

use super::accumulate::{product_or_sink, Sink};
use super::matmul::{strided_slice, SendPtr};
use super::{apply, to_compute};
use crate::cpu::matmul::{gemm_parallel_then, Block, MatMut, MatRef};
use crate::dtype::{DType, Float};
use crate::error::{Error, Result};
use crate::op::{Op, UnaryOp};
use crate::storage::StorageElement;
use crate::tensor::Tensor;

impl Tensor {
    /// `x @ weight^T + bias` with PyTorch's Linear layout: weight `[out, in]`, bias `[out]`.
    /// # Shapes
    /// `[..., in] -> [..., out]`.
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.linear_with(weight, bias, None, None)
    }

    /// `act(x @ weight^T + bias)` as one op: the activation is applied to each block of the
    /// product right after it is computed (while the block is in cache), instead of in a pass of
    /// its own; the results are those of [`Tensor::linear`] followed by [`Tensor::unary`].
    /// # Shapes
    /// `[..., in] -> [..., out]`.
    pub fn linear_act(&self, weight: &Tensor, bias: Option<&Tensor>, act: UnaryOp) -> Result<Tensor> {
        self.linear_with(weight, bias, Some(act), None)
    }

    /// `residual + (x @ weight^T + bias)` as one op (a transformer block's residual connection),
    /// with the results of [`Tensor::linear`] followed by [`Tensor::add`].
    /// # Shapes
    /// `[..., in] -> [..., out]`; `residual` `[..., out]` (a residual of another shape is
    /// broadcast by the unfused ops).
    pub fn linear_add(&self, weight: &Tensor, bias: Option<&Tensor>, residual: &Tensor) -> Result<Tensor> {
        self.linear_with(weight, bias, None, Some(residual))
    }

    /// `act(x @ weight^T + bias) (+ residual)`; under autocast the product (and activation) in
    /// the lower precision and the residual added after (see `crate::autocast`).
    fn linear_with(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        act: Option<UnaryOp>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        if crate::autocast::autocast_dtype().is_some() {
            use crate::autocast::low;
            let b = bias.map(low).transpose()?;
            let y = low(self)?.linear_fused(&low(weight)?, b.as_ref(), act, None)?;
            return match residual {
                Some(r) => r.add(&y),
                None => Ok(y),
            };
        }
        self.linear_fused(weight, bias, act, residual)
    }

    /// [`Tensor::linear_with`] without autocast: one fused op where it pays (always in f32 and
    /// f64 on the CPU; elsewhere with a bias).
    fn linear_fused(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        act: Option<UnaryOp>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        let unfused = |y: Tensor| {
            let y = match act {
                Some(a) => y.unary(a)?,
                None => y,
            };
            match residual {
                Some(r) => r.add(&y),
                None => Ok(y),
            }
        };
        let dtype = self.dtype();
        let wide = matches!(dtype, DType::F32 | DType::F64);
        // without a bias the fused op pays in f32 and f64 on the CPU: it adds the residual in
        // the product's blocks and makes the weight's gradient in the weight's layout (a plain
        // product makes it transposed, to be copied); other dtypes and devices go to matmul
        if bias.is_none() && !(wide && self.device() == crate::Device::Cpu) {
            return unfused(self.matmul(&weight.t()?)?);
        }
        let out_shape = || {
            let mut s = self.shape()[..self.rank().max(1) - 1].to_vec();
            s.push(weight.shape()[0]);
            s
        };
        let fused = self.rank() >= 1
            && weight.rank() == 2
            && dtype.is_float()
            && weight.dtype() == dtype
            && weight.device() == self.device()
            && bias.is_none_or(|b| b.dtype() == dtype && b.shape() == [weight.shape()[0]])
            && self.shape()[self.rank() - 1] == weight.shape()[1]
            // half precision rounds between the unfused ops; the fused op would not
            && ((act.is_none() && residual.is_none()) || wide)
            && residual.is_none_or(|r| r.dtype() == dtype && r.shape() == out_shape());
        if !fused {
            // the unfused ops report whichever shape or dtype is wrong
            let y = self.matmul(&weight.t()?)?;
            return unfused(match bias {
                Some(b) => y.add(b)?,
                None => y,
            });
        }
        // the rows given, not inferred: a -1 cannot be inferred beside a width of 0
        let rows = self.shape()[..self.rank() - 1].iter().product::<usize>() as isize;
        let (k, n) = (weight.shape()[1] as isize, weight.shape()[0] as isize);
        let x = self.reshape(&[rows, k])?;
        let r = residual.map(|r| r.reshape(&[rows, n])).transpose()?;
        let inputs: Vec<&Tensor> = [Some(&x), Some(weight), bias, r.as_ref()]
            .into_iter()
            .flatten()
            .collect();
        let op = Op::Linear {
            act,
            bias: bias.is_some(),
            residual: residual.is_some(),
        };
        let y = apply(op, &inputs)?;
        let out: Vec<isize> = out_shape().iter().map(|&d| d as isize).collect();
        y.reshape(&out)
    }
}

/// The inputs of an `Op::Linear` by role: `(x, weight, bias, residual)`.
fn roles<'a>(inputs: &[&'a Tensor], bias: bool) -> (&'a Tensor, &'a Tensor, Option<&'a Tensor>, Option<&'a Tensor>) {
    let b = if bias { Some(inputs[2]) } else { None };
    let r = inputs.get(2 + usize::from(bias)).copied();
    (inputs[0], inputs[1], b, r)
}

/// Inputs `(x [M, K], weight [N, K], bias [N]?, residual [M, N]?)` (the bias with `bias`);
/// outputs the result and, with an `act`, the pre-activation.
pub(super) fn forward(inputs: &[&Tensor], act: Option<UnaryOp>, bias: bool) -> Result<Vec<Tensor>> {
    let (x, _, b, residual) = roles(inputs, bias);
    let outs = match x.dtype() {
        // bf16 operands read as they are where the CPU multiplies bf16 pairs natively; the bias
        // is added in f32 and the sum rounded once, as below
        DType::BF16 if crate::cpu::bf16_gemm::available() && act.is_none() && residual.is_none() => {
            let row = b.map(|b| to_compute("linear", b)).transpose()?;
            let row = row.as_ref().map(|b| b.contig::<f32>("linear")).transpose()?;
            let y =
                linear_with::<half::bf16, f32>(x, inputs[1], row.as_deref(), None, None, |m, n, k, d, a, b, post| {
                    // SAFETY: the kernel is available (checked above); `linear_with` hands over
                    // operands and an output valid for these sizes and strides.
                    unsafe { crate::cpu::bf16_gemm::gemm_parallel_then(m, n, k, d, a, b, post) }
                })?;
            y.into_iter()
                .map(|t| super::elementwise::back_to("linear", t, DType::BF16))
                .collect::<Result<_>>()?
        }
        DType::F32 => linear_typed::<f32>(inputs, act, bias)?,
        DType::F64 => linear_typed::<f64>(inputs, act, bias)?,
        DType::BF16 | DType::F16 => {
            let inputs = inputs
                .iter()
                .map(|t| to_compute("linear", t))
                .collect::<Result<Vec<_>>>()?;
            let inputs: Vec<&Tensor> = inputs.iter().collect();
            linear_typed::<f32>(&inputs, act, bias)?
                .into_iter()
                .map(|t| super::elementwise::back_to("linear", t, x.dtype()))
                .collect::<Result<_>>()?
        }
        d => return Err(Error::UnsupportedDType { op: "linear", dtype: d }),
    };
    Ok(outs)
}

/// `act([M, K] x [N, K]^T + bias) (+ residual)` into a new `[M, N]` tensor, followed (with an
/// `act`) by the pre-activation.
fn linear_typed<T: Float + StorageElement + Default + Send + Sync>(
    inputs: &[&Tensor],
    act: Option<UnaryOp>,
    bias: bool,
) -> Result<Vec<Tensor>> {
    let (x, w, b, residual) = roles(inputs, bias);
    let row = b.map(|b| b.contig::<T>("linear")).transpose()?;
    let one = T::from_f64(1.0);
    linear_with::<T, T>(x, w, row.as_deref(), residual, act, |m, n, k, d, a, b, post| {
        // SAFETY: `linear_with` hands over operands and an output valid for these sizes and
        // strides.
        unsafe { gemm_parallel_then(m, n, k, d, a, b, one, one, post) }
    })
}

/// A block's finishing pass, handed to the product of [`linear_with`].
type Post<'a, T> = &'a (dyn Fn(Block<T>) + Sync);

/// `act(x [M, K] @ w [N, K]^T (+ row)) (+ residual [M, N])`: operands of element type `I`, the
/// product, the bias `row`, the activation and the residual in `T`;
/// `product(m, n, k, dst, a, b, post)` overwrites `dst` and runs `post` on each block it
/// finishes. Returns the result and, with an `act`, the pre-activation.
#[allow(clippy::type_complexity)]
fn linear_with<I: StorageElement + Send + Sync, T: Float + StorageElement + Default + Send + Sync>(
    x: &Tensor,
    w: &Tensor,
    row: Option<&[T]>,
    residual_input: Option<&Tensor>,
    act: Option<UnaryOp>,
    product: impl Fn(usize, usize, usize, MatMut<T>, MatRef<I>, MatRef<I>, Post<'_, T>),
) -> Result<Vec<Tensor>> {
    let (m, k, n) = (x.shape()[0], x.shape()[1], w.shape()[0]);
    let residual = residual_input.map(|r| r.contig::<T>("linear")).transpose()?;
    let (lx, lw) = (x.layout(), w.layout());
    let (gx, gw) = (x.storage().read(), w.storage().read());
    let (sx, sw) = (
        strided_slice::<I>("linear", x, &gx)?,
        strided_slice::<I>("linear", w, &gw)?,
    );
    let mn = crate::shape::checked_numel("linear", &[m, n])?;
    if m == 0 || n == 0 || k == 0 {
        // no product: the bias (and the rest) through the unfused ops
        let mut pre: Vec<T> = crate::alloc::with_capacity("linear", mn)?;
        for _ in 0..m {
            match row {
                Some(row) => pre.extend_from_slice(row),
                None => pre.resize(pre.len() + n, T::default()),
            }
        }
        let pre = Tensor::from_vec(pre, &[m, n])?;
        let y = match act {
            Some(a) => super::apply_multi(Op::Unary(a), &[&pre])?.remove(0),
            None => pre.clone(),
        };
        let y = match residual_input {
            Some(r) => super::apply_multi(Op::Binary(crate::op::BinaryOp::Add), &[&y, r])?.remove(0),
            None => y,
        };
        return Ok(if act.is_some() { vec![y, pre] } else { vec![y] });
    }
    // Every element is written by the gemm (it does not read dst) or by the activation, so the
    // buffers start uninitialized.
    let mut pre = crate::alloc::uninit::<T>("linear", mn)?;
    let mut out = crate::alloc::uninit::<T>("linear", if act.is_some() { mn } else { 0 })?;
    let dst = MatMut {
        ptr: pre.as_mut_ptr() as *mut T,
        row_stride: n as isize,
        accumulate: false,
    };
    // x as [M, K] at its strides; weight^T as [K, N]: element (i, j) is weight[j, i]
    let a = MatRef {
        ptr: sx[lx.offset..].as_ptr(),
        row_stride: lx.strides[0] as isize,
        col_stride: lx.strides[1] as isize,
    };
    let b = MatRef {
        ptr: sw[lw.offset..].as_ptr(),
        row_stride: lw.strides[1] as isize,
        col_stride: lw.strides[0] as isize,
    };
    let (pre_base, out_base) = (SendPtr(dst.ptr), SendPtr(out.as_mut_ptr() as *const T));
    let post = |blk: Block<T>| {
        if row.is_none() && act.is_none() && residual.is_none() {
            return;
        }
        let bias = row.map(|row| &row[blk.col0..blk.col0 + blk.cols]);
        for r in 0..blk.rows {
            // SAFETY: row r of the block, written by its gemm just before; the same element range
            // of `out` belongs to this block alone.
            unsafe {
                let h = blk.ptr.offset(r as isize * blk.row_stride);
                let at = h.offset_from(pre_base.get()) as usize;
                let h = std::slice::from_raw_parts_mut(h, blk.cols);
                if let Some(bias) = bias {
                    for (o, &b) in h.iter_mut().zip(bias) {
                        *o += b;
                    }
                }
                let y = match act {
                    Some(a) => {
                        let y = out_base.get().add(at) as *mut std::mem::MaybeUninit<T>;
                        let y = std::slice::from_raw_parts_mut(y, blk.cols);
                        crate::cpu::elementwise::unary_serial(a, h, y);
                        &mut *(y as *mut [std::mem::MaybeUninit<T>] as *mut [T])
                    }
                    None => h,
                };
                if let Some(res) = &residual {
                    for (o, &r) in y.iter_mut().zip(&res[at..at + blk.cols]) {
                        *o += r;
                    }
                }
            }
        }
    };
    // the layouts describe valid [M, K] and [N, K] views of their storages; dst is M x N
    product(m, n, k, dst, a, b, &post);
    // SAFETY: every element of `pre` was written by the gemm, and of `out` by the activation.
    let pre = Tensor::from_vec(unsafe { crate::cpu::assume_init(pre) }, &[m, n])?;
    Ok(match act {
        Some(_) => vec![Tensor::from_vec(unsafe { crate::cpu::assume_init(out) }, &[m, n])?, pre],
        None => vec![pre],
    })
}

/// With an `act`, `saved` holds the pre-activation: the gradient goes through `act'` first (in
/// the same pass as the bias gradient's column sums). A residual input gets the output's
/// gradient as it is. The weight's gradient is `grad^T x`, made in the weight's own layout; where
/// autograd offers a [`Sink`] for the weight (input 1), it is added there (`None` in the
/// result).
pub(super) fn backward(
    inputs: &[Tensor],
    saved: &[Tensor],
    grad: &Tensor,
    act: Option<UnaryOp>,
    bias: bool,
    sinks: &[Option<Sink>],
) -> Result<Vec<Option<Tensor>>> {
    let (x, w) = (&inputs[0], &inputs[1]);
    let (g, gb) = match act {
        Some(a) => {
            let mut out = super::apply_multi(Op::LinearActBackward(a), &[&saved[0], grad])?;
            let gb = out.pop().expect("two outputs");
            (out.pop().expect("two outputs"), Some(gb))
        }
        None if bias => (grad.clone(), Some(grad.sum(&[0], false)?)),
        None => (grad.clone(), None),
    };
    let gw = product_or_sink(sinks.get(1).and_then(Option::as_ref), &g.t()?, x)?;
    let mut grads = vec![Some(g.matmul(w)?), gw];
    if bias {
        grads.push(gb);
    }
    if inputs.len() > grads.len() {
        // the residual's
        grads.push(Some(grad.clone()));
    }
    Ok(grads)
}

/// [`Op::LinearActBackward`] on the CPU: the gradient through the activation,
/// `grad * act'(pre)` `[M, N]`, and its column sums (the bias gradient) in one pass.
pub(super) fn act_backward(act: UnaryOp, pre: &Tensor, grad: &Tensor) -> Result<Vec<Tensor>> {
    let n = pre.shape()[1];
    crate::float_dispatch!(pre.dtype(), T => {
        let (x, g) = (pre.contig::<T>("linear_backward")?, grad.contig::<T>("linear_backward")?);
        let mut out = crate::alloc::uninit::<T>("linear_backward", x.len())?;
        let sums = crate::cpu::elementwise::unary_backward_column_sums(act, &x, &g, n, &mut out);
        // SAFETY: the kernel wrote every element.
        let out = unsafe { crate::cpu::assume_init(out) };
        Ok(vec![Tensor::from_vec(out, pre.shape())?, Tensor::from_vec(sums, &[n])?])
    })
}
