//! Fused scaled-dot-product attention (see `cpu/attention.rs` for the tiling).

use super::elementwise::back_to;
use super::{apply, apply_multi, expect_float, to_compute};
use crate::cpu::attention::{self as k, AttnDims};
use crate::error::{invalid, Error, Result};
use crate::op::Op;
use crate::shape::numel;
use crate::tensor::Tensor;

impl Tensor {
    /// `softmax(q k^T * scale + mask) v` (as `F.scaled_dot_product_attention`), with the causal
    /// mask keeping key `j <= i` for query `i`. `scale` defaults to `1 / sqrt(D)`.
    /// # Shapes
    /// q `[..., T, D]`, k `[..., S, D]`, v `[..., S, Dv]` with equal leading dims -> `[..., T, Dv]`.
    pub fn scaled_dot_product_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Tensor> {
        expect_float("attention", q)?;
        for t in [k, v] {
            if t.dtype() != q.dtype() {
                return Err(Error::DTypeMismatch {
                    op: "attention",
                    lhs: q.dtype(),
                    rhs: t.dtype(),
                });
            }
        }
        let r = q.rank();
        if r < 2 || k.rank() != r || v.rank() != r {
            return Err(invalid(
                "attention",
                format!(
                    "q, k, v must share a rank >= 2: {:?} {:?} {:?}",
                    q.shape(),
                    k.shape(),
                    v.shape()
                ),
            ));
        }
        let lead_ok = q.shape()[..r - 2] == k.shape()[..r - 2] && k.shape()[..r - 2] == v.shape()[..r - 2];
        if !lead_ok || q.shape()[r - 1] != k.shape()[r - 1] || k.shape()[r - 2] != v.shape()[r - 2] {
            return Err(invalid(
                "attention",
                format!(
                    "incompatible shapes q {:?}, k {:?}, v {:?}",
                    q.shape(),
                    k.shape(),
                    v.shape()
                ),
            ));
        }
        let scale = scale.unwrap_or(1.0 / (q.shape()[r - 1] as f64).sqrt());
        apply(Op::Attention { causal, scale }, &[q, k, v])
    }
}

fn dims_of(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> AttnDims {
    let r = q.rank();
    AttnDims {
        bh: numel(&q.shape()[..r - 2]),
        t: q.shape()[r - 2],
        s: k.shape()[r - 2],
        d: q.shape()[r - 1],
        dv: v.shape()[r - 1],
        causal,
    }
}

/// A `[..., rows, cols]` tensor as `bh` strided matrices over its storage (no copy) when its last
/// dim is contiguous; else over a contiguous copy. Holds the storage read lock.
struct MatView<'a, T> {
    guard: std::sync::RwLockReadGuard<'a, crate::storage::CpuStorage>,
    offsets: Vec<usize>,
    row_stride: usize,
    _t: std::marker::PhantomData<T>,
}

impl<'a, T: crate::storage::StorageElement> MatView<'a, T> {
    fn new(t: &'a Tensor) -> Result<Self> {
        let l = t.layout();
        let r = l.rank();
        debug_assert!(r >= 2 && l.strides[r - 1] == 1);
        let lead = crate::layout::Layout {
            shape: l.shape[..r - 2].to_vec(),
            strides: l.strides[..r - 2].to_vec(),
            offset: l.offset,
        };
        let guard = t.storage().read();
        if T::slice(&guard).is_none() {
            return Err(Error::DTypeMismatch {
                op: "attention",
                lhs: t.dtype(),
                rhs: T::DTYPE,
            });
        }
        Ok(MatView {
            guard,
            offsets: lead.offsets(),
            row_stride: l.strides[r - 2],
            _t: std::marker::PhantomData,
        })
    }

    fn mats(&self) -> k::Mats<'_, T> {
        k::Mats {
            data: T::slice(&self.guard).expect("checked"),
            offsets: &self.offsets,
            row_stride: self.row_stride,
        }
    }
}

/// `t` in the compute dtype with a contiguous last dim (a copy only when needed).
fn strided_input(t: &Tensor) -> Result<Tensor> {
    let c = to_compute(t)?;
    let r = c.rank();
    if c.strides()[r - 1] == 1 || c.shape()[r - 1] <= 1 {
        Ok(c)
    } else {
        c.contiguous_copy()
    }
}

pub(super) fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let (q, kt, v) = (inputs[0], inputs[1], inputs[2]);
    let dtype = q.dtype();
    match op {
        Op::Attention { causal, scale } => {
            let dims = dims_of(q, kt, v, *causal);
            let r = q.rank();
            let lse_shape = &q.shape()[..r - 1];
            let (qc, kc, vc) = (strided_input(q)?, strided_input(kt)?, strided_input(v)?);
            // The output of a [B, H, T, D] call is stored as [B, T, H, Dv] (and returned as its
            // [B, H, T, Dv] view), so the usual transpose back to [B, T, H * Dv] is free.
            let (store_shape, perm): (Vec<usize>, Vec<usize>) = if r == 4 {
                let s = q.shape();
                (vec![s[0], s[2], s[1], dims.dv], vec![0, 2, 1, 3])
            } else {
                let mut s = q.shape().to_vec();
                *s.last_mut().expect("rank >= 2") = dims.dv;
                (s.clone(), (0..r).collect())
            };
            let store = crate::layout::Layout::contiguous(&store_shape);
            let view = store.permute(&perm)?;
            let lead = crate::layout::Layout {
                shape: view.shape[..r - 2].to_vec(),
                strides: view.strides[..r - 2].to_vec(),
                offset: 0,
            };
            let o_offsets = lead.offsets();
            crate::float_dispatch!(qc.dtype(), T => {
                let (qv, kv, vv) = (MatView::<T>::new(&qc)?, MatView::<T>::new(&kc)?, MatView::<T>::new(&vc)?);
                let mut o = vec![0 as T; dims.bh * dims.t * dims.dv];
                let mut lse = vec![0 as T; dims.bh * dims.t];
                let om = k::MatsMut { ptr: o.as_mut_ptr(), len: o.len(), offsets: &o_offsets, row_stride: view.strides[r - 2] };
                k::forward(dims, qv.mats(), kv.mats(), vv.mats(), *scale as T, om, &mut lse);
                drop((qv, kv, vv));
                let out = Tensor::from_vec(o, &store_shape)?.with_layout(view.clone());
                let out = if dtype == qc.dtype() { out } else { back_to(out.contiguous_copy()?, dtype)? };
                Ok(vec![out, Tensor::from_vec(lse, lse_shape)?])
            })
        }
        Op::AttentionBackward { causal, scale } => {
            let (o, lse, g) = (inputs[3], inputs[4], inputs[5]);
            let dims = dims_of(q, kt, v, *causal);
            let (qc, kc, vc) = (strided_input(q)?, strided_input(kt)?, strided_input(v)?);
            let (oc, gc) = (strided_input(o)?, strided_input(g)?);
            crate::float_dispatch!(qc.dtype(), T => {
                let (qv, kv, vv) = (MatView::<T>::new(&qc)?, MatView::<T>::new(&kc)?, MatView::<T>::new(&vc)?);
                let (ov, gv) = (MatView::<T>::new(&oc)?, MatView::<T>::new(&gc)?);
                let ls = lse.contig::<T>("attention")?;
                let mut dq = vec![0 as T; dims.bh * dims.t * dims.d];
                let mut dk = vec![0 as T; dims.bh * dims.s * dims.d];
                let mut dv = vec![0 as T; dims.bh * dims.s * dims.dv];
                k::backward(dims, qv.mats(), kv.mats(), vv.mats(), ov.mats(), &ls, gv.mats(), *scale as T, &mut dq, &mut dk, &mut dv);
                drop((qv, kv, vv, ov, gv));
                Ok(vec![
                    back_to(Tensor::from_vec(dq, q.shape())?, dtype)?,
                    back_to(Tensor::from_vec(dk, kt.shape())?, dtype)?,
                    back_to(Tensor::from_vec(dv, v.shape())?, dtype)?,
                ])
            })
        }
        _ => unreachable!("attention::forward called with {op:?}"),
    }
}

pub(super) fn backward(
    op: &Op,
    inputs: &[Tensor],
    output: &Tensor,
    saved: &[Tensor],
    grad: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    let Op::Attention { causal, scale } = op else {
        unreachable!("attention::backward called with {op:?}")
    };
    let out = output.detach();
    let args = [&inputs[0], &inputs[1], &inputs[2], &out, &saved[0], grad];
    let grads = apply_multi(
        Op::AttentionBackward {
            causal: *causal,
            scale: *scale,
        },
        &args,
    )?;
    Ok(grads.into_iter().map(Some).collect())
}
