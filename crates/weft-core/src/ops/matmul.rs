//! Matrix multiplication with broadcast batch dims, and `linear` built on it.

use super::{apply, to_compute};
use crate::cpu::matmul::{gemm_parallel, gemm_parallel_then, Block, MatMut, MatRef};
use crate::dtype::{DType, Float};
use crate::error::{invalid, Error, Result};
use crate::op::{Op, UnaryOp};
use crate::shape::{broadcast_shapes, numel};
use crate::storage::StorageElement;
use crate::tensor::Tensor;

impl Tensor {
    /// Matrix product (as `torch.matmul`): `[..., M, K] @ [..., K, N] -> [..., M, N]` with batch
    /// dims broadcast; a 1-D operand is treated as a row (left) or column (right) vector.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(invalid(
                "matmul",
                format!("scalars cannot be multiplied: {:?} @ {:?}", self.shape(), rhs.shape()),
            ));
        }
        if self.rank() == 1 {
            return self.unsqueeze(0)?.matmul(rhs)?.squeeze(-2);
        }
        if rhs.rank() == 1 {
            return self.matmul(&rhs.unsqueeze(1)?)?.squeeze(-1);
        }
        if self.dtype() != rhs.dtype() {
            return Err(Error::DTypeMismatch {
                op: "matmul",
                lhs: self.dtype(),
                rhs: rhs.dtype(),
            });
        }
        super::expect_float("matmul", self)?;
        let k = self.shape()[self.rank() - 1];
        let (k2, n) = (rhs.shape()[rhs.rank() - 2], rhs.shape()[rhs.rank() - 1]);
        if k != k2 {
            return Err(Error::ShapeMismatch {
                op: "matmul",
                lhs: self.shape().to_vec(),
                rhs: rhs.shape().to_vec(),
            });
        }
        broadcast_shapes(
            "matmul",
            &self.shape()[..self.rank() - 2],
            &rhs.shape()[..rhs.rank() - 2],
        )?;
        // [B..., M, K] @ [K, N]: one big gemm over the flattened rows.
        if rhs.rank() == 2 && self.rank() > 2 && self.is_contiguous() {
            let mut out_shape: Vec<isize> = self.shape()[..self.rank() - 1].iter().map(|&d| d as isize).collect();
            out_shape.push(n as isize);
            return self.reshape(&[-1, k as isize])?.matmul(rhs)?.reshape(&out_shape);
        }
        apply(Op::Matmul, &[self, rhs])
    }

    /// `x @ weight^T + bias` with PyTorch's Linear layout: weight `[out, in]`, bias `[out]`.
    /// # Shapes
    /// `[..., in] -> [..., out]`.
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.linear_with(weight, bias, None)
    }

    /// `act(x @ weight^T + bias)` as one op: the activation is applied to each block of the
    /// product right after it is computed (while the block is in cache), instead of in a pass of
    /// its own; the results are those of [`Tensor::linear`] followed by [`Tensor::unary`].
    /// # Shapes
    /// `[..., in] -> [..., out]`.
    pub fn linear_act(&self, weight: &Tensor, bias: Option<&Tensor>, act: UnaryOp) -> Result<Tensor> {
        self.linear_with(weight, bias, Some(act))
    }

    fn linear_with(&self, weight: &Tensor, bias: Option<&Tensor>, act: Option<UnaryOp>) -> Result<Tensor> {
        let then_act = |y: Tensor| match act {
            Some(a) => y.unary(a),
            None => Ok(y),
        };
        // the fused op only pays off with a bias; a plain product goes to matmul
        let Some(bias) = bias else {
            return then_act(self.matmul(&weight.t()?)?);
        };
        let fused = self.rank() >= 1
            && weight.rank() == 2
            && self.dtype().is_float()
            && weight.dtype() == self.dtype()
            && bias.dtype() == self.dtype()
            && self.shape()[self.rank() - 1] == weight.shape()[1]
            && bias.shape() == [weight.shape()[0]]
            // a half-precision activation is applied to the rounded output, as the unfused ops do
            && (act.is_none() || matches!(self.dtype(), DType::F32 | DType::F64));
        if !fused {
            // the unfused ops report whichever shape or dtype is wrong
            return then_act(self.matmul(&weight.t()?)?.add(bias)?);
        }
        let (k, n) = (weight.shape()[1] as isize, weight.shape()[0]);
        let y = apply(Op::Linear { act }, &[&self.reshape(&[-1, k])?, weight, bias])?;
        let mut out: Vec<isize> = self.shape()[..self.rank() - 1].iter().map(|&d| d as isize).collect();
        out.push(n as isize);
        y.reshape(&out)
    }
}

pub(super) fn forward(inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let (a, b) = (inputs[0], inputs[1]);
    let out = match a.dtype() {
        DType::F32 => matmul_typed::<f32>(a, b, 1.0)?,
        DType::F64 => matmul_typed::<f64>(a, b, 1.0)?,
        DType::BF16 | DType::F16 => {
            let r = matmul_typed::<f32>(&to_compute(a)?, &to_compute(b)?, 1.0)?;
            super::elementwise::back_to(r, a.dtype())?
        }
        d => return Err(Error::UnsupportedDType { op: "matmul", dtype: d }),
    };
    Ok(vec![out])
}

struct SendPtr<T>(*const T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    fn get(&self) -> *const T {
        self.0
    }
}

fn matmul_typed<T: StorageElement + Default + Send + Sync>(a: &Tensor, b: &Tensor, one: T) -> Result<Tensor> {
    let (ra, rb) = (a.rank(), b.rank());
    let (m, k, n) = (a.shape()[ra - 2], a.shape()[ra - 1], b.shape()[rb - 1]);
    let batch = broadcast_shapes("matmul", &a.shape()[..ra - 2], &b.shape()[..rb - 2])?;
    let mut a_full = batch.clone();
    a_full.extend_from_slice(&[m, k]);
    let mut b_full = batch.clone();
    b_full.extend_from_slice(&[k, n]);
    let la = a.layout().expand(&a_full)?;
    let lb = b.layout().expand(&b_full)?;
    // Offsets of each batch's matrix start.
    let batch_offsets = |l: &crate::layout::Layout| -> Vec<usize> {
        let nb = l.rank() - 2;
        let bl = crate::layout::Layout {
            shape: l.shape[..nb].to_vec(),
            strides: l.strides[..nb].to_vec(),
            offset: l.offset,
        };
        bl.offsets()
    };
    let (oa, ob) = (batch_offsets(&la), batch_offsets(&lb));
    let nbatch = numel(&batch);
    // Every element is written by the gemm (it does not read dst), so the buffer starts
    // uninitialized: zeroing 4 MiB costs ~3% of a 1024^3 product.
    let mut out = crate::cpu::uninit::<T>(nbatch * m * n);
    if m * n * k == 0 {
        out.iter_mut().for_each(|v| *v = std::mem::MaybeUninit::new(T::zero()));
    }
    let ga = a.storage().read();
    let gb = b.storage().read();
    let sa = T::slice(&ga).ok_or(Error::DTypeMismatch {
        op: "matmul",
        lhs: a.dtype(),
        rhs: T::DTYPE,
    })?;
    let sb = T::slice(&gb).ok_or(Error::DTypeMismatch {
        op: "matmul",
        lhs: b.dtype(),
        rhs: T::DTYPE,
    })?;
    check_fits("matmul", a, sa.len())?;
    check_fits("matmul", b, sb.len())?;
    let (pa, pb) = (SendPtr(sa.as_ptr()), SendPtr(sb.as_ptr()));
    let (ars, acs) = (la.strides[la.rank() - 2] as isize, la.strides[la.rank() - 1] as isize);
    let (brs, bcs) = (lb.strides[lb.rank() - 2] as isize, lb.strides[lb.rank() - 1] as isize);
    // each product splits across the pool unless it is small or one of a batch already spread
    // over the pool (`gemm_parallel` decides)
    let run = |i: usize, dst: &mut [std::mem::MaybeUninit<T>]| {
        let d = MatMut {
            ptr: dst.as_mut_ptr() as *mut T,
            row_stride: n as isize,
            accumulate: false,
        };
        // SAFETY: offsets and strides come from layouts validated against the storage sizes.
        unsafe {
            let a = MatRef {
                ptr: pa.get().add(oa[i]),
                row_stride: ars,
                col_stride: acs,
            };
            let b = MatRef {
                ptr: pb.get().add(ob[i]),
                row_stride: brs,
                col_stride: bcs,
            };
            gemm_parallel(m, n, k, d, a, b, one, one)
        }
    };
    if m * n * k == 0 {
        // empty product: zeros, written above
    } else if nbatch > 1 && m * n * k < (1 << 18) {
        crate::cpu::pool::for_each_chunk(&mut out, m * n, run);
    } else {
        out.chunks_mut(m * n).enumerate().for_each(|(i, dst)| run(i, dst));
    }
    // SAFETY: every element was written (by the gemms, or the zero fill of an empty product).
    let out = unsafe { crate::cpu::assume_init(out) };
    let mut shape = batch;
    shape.extend_from_slice(&[m, n]);
    Tensor::from_vec(out, &shape)
}

pub(super) fn backward(inputs: &[Tensor], grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let (a, b) = (&inputs[0], &inputs[1]);
    let ga = grad.matmul(&b.t()?)?.sum_to_shape(a.shape())?;
    let gb = a.t()?.matmul(grad)?.sum_to_shape(b.shape())?;
    Ok(vec![Some(ga), Some(gb)])
}

pub(super) fn linear_forward(inputs: &[&Tensor], act: Option<UnaryOp>) -> Result<Vec<Tensor>> {
    let (x, w, b) = (inputs[0], inputs[1], inputs[2]);
    let outs = match x.dtype() {
        DType::F32 => linear_typed::<f32>(x, w, b, act)?,
        DType::F64 => linear_typed::<f64>(x, w, b, act)?,
        DType::BF16 | DType::F16 => {
            let (xc, wc, bc) = (to_compute(x)?, to_compute(w)?, to_compute(b)?);
            linear_typed::<f32>(&xc, &wc, &bc, act)?
                .into_iter()
                .map(|t| super::elementwise::back_to(t, x.dtype()))
                .collect::<Result<_>>()?
        }
        d => return Err(Error::UnsupportedDType { op: "linear", dtype: d }),
    };
    Ok(outs)
}

/// `act([M, K] x [N, K]^T + bias)` into a new `[M, N]` tensor, followed (with an `act`) by the
/// pre-activation. Each gemm task adds the bias to its block of the product, and applies `act`,
/// right after computing it, while the block is in its cache.
fn linear_typed<T: Float + StorageElement + Default + Send + Sync>(
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    act: Option<UnaryOp>,
) -> Result<Vec<Tensor>> {
    let (m, k, n) = (x.shape()[0], x.shape()[1], w.shape()[0]);
    let row = bias.contig::<T>("linear")?;
    let (lx, lw) = (x.layout(), w.layout());
    let (gx, gw) = (x.storage().read(), w.storage().read());
    let sx = T::slice(&gx).ok_or(Error::DTypeMismatch {
        op: "linear",
        lhs: x.dtype(),
        rhs: T::DTYPE,
    })?;
    let sw = T::slice(&gw).ok_or(Error::DTypeMismatch {
        op: "linear",
        lhs: w.dtype(),
        rhs: T::DTYPE,
    })?;
    check_fits("linear", x, sx.len())?;
    check_fits("linear", w, sw.len())?;
    if m * n * k == 0 {
        let mut pre: Vec<T> = Vec::with_capacity(m * n);
        for _ in 0..m {
            pre.extend_from_slice(&row);
        }
        let pre = Tensor::from_vec(pre, &[m, n])?;
        return Ok(match act {
            Some(a) => vec![super::apply_multi(Op::Unary(a), &[&pre])?.remove(0), pre],
            None => vec![pre],
        });
    }
    // Every element is written by the gemm (it does not read dst) or by the activation, so the
    // buffers start uninitialized.
    let mut pre = crate::cpu::uninit::<T>(m * n);
    let mut out = crate::cpu::uninit::<T>(if act.is_some() { m * n } else { 0 });
    let one = T::from_f64(1.0);
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
        let bias = &row[blk.col0..blk.col0 + blk.cols];
        for r in 0..blk.rows {
            // SAFETY: row r of the block, written by its gemm just before; the same element range
            // of `out` belongs to this block alone.
            unsafe {
                let h = blk.ptr.offset(r as isize * blk.row_stride);
                let h = std::slice::from_raw_parts_mut(h, blk.cols);
                for (o, &b) in h.iter_mut().zip(bias) {
                    *o += b;
                }
                if let Some(a) = act {
                    let at = h.as_ptr().offset_from(pre_base.get());
                    let y = out_base.get().offset(at) as *mut std::mem::MaybeUninit<T>;
                    crate::cpu::elementwise::unary_serial(a, h, std::slice::from_raw_parts_mut(y, blk.cols));
                }
            }
        }
    };
    // SAFETY: the layouts describe valid [M, K] and [N, K] views of their storages; dst is M x N.
    unsafe { gemm_parallel_then(m, n, k, dst, a, b, one, one, post) };
    // SAFETY: every element of `pre` was written by the gemm, and of `out` by the activation.
    let pre = Tensor::from_vec(unsafe { crate::cpu::assume_init(pre) }, &[m, n])?;
    Ok(match act {
        Some(_) => vec![Tensor::from_vec(unsafe { crate::cpu::assume_init(out) }, &[m, n])?, pre],
        None => vec![pre],
    })
}

/// With an `act`, `saved` holds the pre-activation: the gradient goes through `act'` first.
pub(super) fn linear_backward(
    inputs: &[Tensor],
    saved: &[Tensor],
    grad: &Tensor,
    act: Option<UnaryOp>,
) -> Result<Vec<Option<Tensor>>> {
    let (x, w) = (&inputs[0], &inputs[1]);
    let grad = match act {
        Some(a) => &super::apply_multi(Op::UnaryBackward(a), &[&saved[0], grad])?.remove(0),
        None => grad,
    };
    let gx = grad.matmul(w)?;
    let gw = grad.t()?.matmul(x)?;
    Ok(vec![Some(gx), Some(gw), Some(grad.sum(&[0], false)?)])
}

/// The raw-pointer kernels read through the layout: refuse a tensor whose storage no longer
/// holds what its layout addresses (a released buffer), rather than read outside it.
fn check_fits(op: &'static str, t: &Tensor, len: usize) -> Result<()> {
    if t.layout().fits(len) {
        return Ok(());
    }
    Err(crate::error::invalid(
        op,
        format!(
            "a tensor of shape {:?} addresses elements beyond its storage of {len} (was the storage released?)",
            t.shape()
        ),
    ))
}
