//! Matrix multiplication with broadcast batch dims.

use super::accumulate::{product_or_sink, Sink};
use super::{apply, to_compute};
use crate::cpu::matmul::{gemm_parallel, MatMut, MatRef};
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::op::Op;
use crate::shape::{broadcast_shapes, checked_numel, numel};
use crate::storage::{CpuStorage, StorageElement};
use crate::tensor::Tensor;

impl Tensor {
    /// Matrix product (as `torch.matmul`): `[..., M, K] @ [..., K, N] -> [..., M, N]` with batch
    /// dims broadcast; a 1-D operand is treated as a row (left) or column (right) vector.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        if crate::autocast::autocast_dtype().is_some() && (self.dtype() == DType::F32 || rhs.dtype() == DType::F32) {
            return crate::autocast::low(self)?.matmul(&crate::autocast::low(rhs)?);
        }
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
}

pub(super) fn forward(inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let (a, b) = (inputs[0], inputs[1]);
    let out = match a.dtype() {
        DType::F32 => matmul_typed::<f32>(a, b, 1.0)?,
        DType::F64 => matmul_typed::<f64>(a, b, 1.0)?,
        // bf16 operands read as they are where the CPU multiplies bf16 pairs natively
        // on AMX tiles, with the inner dimension in one block, each block of sums is rounded to
        // bf16 as it leaves the tiles (no f32 copy of the result)
        DType::BF16 if crate::cpu::amx::rounds_whole(a.shape()[a.rank() - 1]) => {
            matmul_with::<half::bf16, half::bf16>(a, b, |m, n, k, d, a, b| {
                // SAFETY: `rounds_whole(k)` (checked above); `matmul_with` hands over operands
                // and an output valid for these sizes and strides, not accumulated into.
                unsafe { crate::cpu::amx::gemm_parallel_rounded(m, n, k, d, a, b) }
            })?
        }
        DType::BF16 if crate::cpu::bf16_gemm::available() => {
            let r = matmul_with::<half::bf16, f32>(a, b, |m, n, k, d, a, b| {
                // SAFETY: the kernel is available (checked above); `matmul_with` hands over
                // operands and an output valid for these sizes and strides.
                unsafe { crate::cpu::bf16_gemm::gemm_parallel(m, n, k, d, a, b) }
            })?;
            super::elementwise::back_to("matmul", r, DType::BF16)?
        }
        DType::BF16 | DType::F16 => {
            let r = matmul_typed::<f32>(&to_compute("matmul", a)?, &to_compute("matmul", b)?, 1.0)?;
            super::elementwise::back_to("matmul", r, a.dtype())?
        }
        d => return Err(Error::UnsupportedDType { op: "matmul", dtype: d }),
    };
    Ok(vec![out])
}

impl Tensor {
    /// `self [M, K] @ rhs [K, N]` of bf16 or f16 operands as an f32 `[M, N]`, the products
    /// accumulated in f32 and not rounded to the operands' dtype ([`Op::WideMatmul`]); f32
    /// operands give [`Tensor::matmul`]'s result. Not differentiable.
    pub(crate) fn wide_matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        if self.rank() != 2 || rhs.rank() != 2 || self.shape()[1] != rhs.shape()[0] {
            return Err(Error::ShapeMismatch {
                op: "wide_matmul",
                lhs: self.shape().to_vec(),
                rhs: rhs.shape().to_vec(),
            });
        }
        if self.dtype() != rhs.dtype() {
            return Err(Error::DTypeMismatch {
                op: "wide_matmul",
                lhs: self.dtype(),
                rhs: rhs.dtype(),
            });
        }
        match self.dtype() {
            DType::BF16 | DType::F16 | DType::F32 => apply(Op::WideMatmul, &[self, rhs]),
            d => Err(Error::UnsupportedDType {
                op: "wide_matmul",
                dtype: d,
            }),
        }
    }
}

/// [`Op::WideMatmul`] on the CPU: bf16 operands on the native kernel where the CPU has one (its
/// f32 result kept, not rounded back), else both operands widened to f32 (exactly) first.
pub(super) fn wide_forward(inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let (a, b) = (inputs[0], inputs[1]);
    let out = match a.dtype() {
        DType::BF16 if crate::cpu::bf16_gemm::available() => {
            matmul_with::<half::bf16, f32>(a, b, |m, n, k, d, a, b| {
                // SAFETY: the kernel is available (checked above); `matmul_with` hands over
                // operands and an output valid for these sizes and strides.
                unsafe { crate::cpu::bf16_gemm::gemm_parallel(m, n, k, d, a, b) }
            })?
        }
        DType::BF16 | DType::F16 => matmul_typed::<f32>(&to_compute("matmul", a)?, &to_compute("matmul", b)?, 1.0)?,
        DType::F32 => matmul_typed::<f32>(a, b, 1.0)?,
        d => {
            return Err(Error::UnsupportedDType {
                op: "wide_matmul",
                dtype: d,
            })
        }
    };
    Ok(vec![out])
}

pub(super) struct SendPtr<T>(pub(super) *const T);
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    pub(super) fn get(&self) -> *const T {
        self.0
    }
}

fn matmul_typed<T: StorageElement + Default + Send + Sync>(a: &Tensor, b: &Tensor, one: T) -> Result<Tensor> {
    matmul_with::<T, T>(a, b, |m, n, k, d, a, b| {
        // SAFETY: `matmul_with` hands over operands and an output valid for these sizes and
        // strides.
        unsafe { gemm_parallel(m, n, k, d, a, b, one, one) }
    })
}

/// `a @ b` with operands of element type `I` into a new tensor of `O`, each matrix of the
/// (broadcast) batch through `product(m, n, k, dst, a, b)`, which overwrites `dst`.
fn matmul_with<I: StorageElement + Send + Sync, O: StorageElement + Send + Sync>(
    a: &Tensor,
    b: &Tensor,
    product: impl Fn(usize, usize, usize, MatMut<O>, MatRef<I>, MatRef<I>) + Sync,
) -> Result<Tensor> {
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
    let batch_offsets = |l: &crate::layout::Layout| -> Result<Vec<usize>> {
        let nb = l.rank() - 2;
        let bl = crate::layout::Layout {
            shape: l.shape[..nb].to_vec(),
            strides: l.strides[..nb].to_vec(),
            offset: l.offset,
        };
        bl.offsets("matmul")
    };
    let (oa, ob) = (batch_offsets(&la)?, batch_offsets(&lb)?);
    let nbatch = numel(&batch);
    let mut shape = batch;
    shape.extend_from_slice(&[m, n]);
    // products of expanded views can have more multiply-adds than a usize holds
    let empty = m == 0 || n == 0 || k == 0;
    let flops = m.saturating_mul(n).saturating_mul(k);
    // Every element is written by the gemm (it does not read dst), so the buffer starts
    // uninitialized: zeroing 4 MiB costs ~3% of a 1024^3 product.
    let mut out = crate::alloc::uninit::<O>("matmul", checked_numel("matmul", &shape)?)?;
    if empty {
        out.iter_mut().for_each(|v| *v = std::mem::MaybeUninit::new(O::zero()));
    }
    let (ga, gb) = (a.storage().read(), b.storage().read());
    let (sa, sb) = (
        strided_slice::<I>("matmul", a, &ga)?,
        strided_slice::<I>("matmul", b, &gb)?,
    );
    let (pa, pb) = (SendPtr(sa.as_ptr()), SendPtr(sb.as_ptr()));
    let (ars, acs) = (la.strides[la.rank() - 2] as isize, la.strides[la.rank() - 1] as isize);
    let (brs, bcs) = (lb.strides[lb.rank() - 2] as isize, lb.strides[lb.rank() - 1] as isize);
    // each product splits across the pool unless it is small or one of a batch already spread
    // over the pool (`gemm_parallel` decides)
    let run = |i: usize, dst: &mut [std::mem::MaybeUninit<O>]| {
        let d = MatMut {
            ptr: dst.as_mut_ptr() as *mut O,
            row_stride: n as isize,
            accumulate: false,
        };
        // SAFETY: offsets and strides come from layouts validated against the storage sizes.
        let (a, b) = unsafe {
            (
                MatRef {
                    ptr: pa.get().add(oa[i]),
                    row_stride: ars,
                    col_stride: acs,
                },
                MatRef {
                    ptr: pb.get().add(ob[i]),
                    row_stride: brs,
                    col_stride: bcs,
                },
            )
        };
        product(m, n, k, d, a, b)
    };
    if empty {
        // empty product: zeros, written above
    } else if nbatch > 1 && flops < (1 << 18) {
        crate::cpu::pool::for_each_chunk(&mut out, m * n, run);
    } else {
        out.chunks_mut(m * n).enumerate().for_each(|(i, dst)| run(i, dst));
    }
    // SAFETY: every element was written (by the gemms, or the zero fill of an empty product).
    let out = unsafe { crate::cpu::assume_init(out) };
    Tensor::from_vec(out, &shape)
}

/// `a @ b`'s gradients, `grad @ b^T` and `a^T @ grad` (summed over broadcast batch dims). Where
/// autograd offers a [`Sink`] for an input of a product without batch dims, its gradient is
/// added there (`None` in the result).
pub(super) fn backward(inputs: &[Tensor], grad: &Tensor, sinks: &[Option<Sink>]) -> Result<Vec<Option<Tensor>>> {
    let (a, b) = (&inputs[0], &inputs[1]);
    let plain = a.rank() == 2 && b.rank() == 2;
    let sink = |i: usize| sinks.get(i).and_then(Option::as_ref).filter(|_| plain);
    let ga = match sink(0) {
        Some(s) => product_or_sink(Some(s), grad, &b.t()?)?,
        None => Some(grad.matmul(&b.t()?)?.sum_to_shape(a.shape())?),
    };
    let gb = match sink(1) {
        Some(s) => product_or_sink(Some(s), &a.t()?, grad)?,
        None => Some(a.t()?.matmul(grad)?.sum_to_shape(b.shape())?),
    };
    Ok(vec![ga, gb])
}

/// `t`'s storage as a `T` slice for a raw-pointer kernel that reads through `t`'s layout: refuses
/// another dtype, and a storage that no longer holds what the layout addresses (a released
/// buffer), rather than read outside it.
pub(super) fn strided_slice<'g, T: StorageElement>(
    op: &'static str,
    t: &Tensor,
    storage: &'g CpuStorage,
) -> Result<&'g [T]> {
    let s = T::slice(storage).ok_or(Error::DTypeMismatch {
        op,
        lhs: t.dtype(),
        rhs: T::DTYPE,
    })?;
    if !t.layout().fits(s.len()) {
        return Err(crate::error::invalid(
            op,
            format!(
                "a tensor of shape {:?} addresses elements beyond its storage of {} (was the storage released?)",
                t.shape(),
                s.len()
            ),
        ));
    }
    Ok(s)
}
