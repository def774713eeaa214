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

pub(super) fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let (q, kt, v) = (inputs[0], inputs[1], inputs[2]);
    let dtype = q.dtype();
    match op {
        Op::Attention { causal, scale } => {
            let dims = dims_of(q, kt, v, *causal);
            let mut out_shape = q.shape().to_vec();
            *out_shape.last_mut().expect("rank >= 2") = dims.dv;
            let lse_shape = &q.shape()[..q.rank() - 1];
            let (qc, kc, vc) = (to_compute(q)?, to_compute(kt)?, to_compute(v)?);
            crate::float_dispatch!(qc.dtype(), T => {
                let (qs, ks, vs) = (qc.contig::<T>("attention")?, kc.contig::<T>("attention")?, vc.contig::<T>("attention")?);
                let mut o = vec![0 as T; dims.bh * dims.t * dims.dv];
                let mut lse = vec![0 as T; dims.bh * dims.t];
                k::forward(dims, &qs, &ks, &vs, *scale as T, &mut o, &mut lse);
                Ok(vec![back_to(Tensor::from_vec(o, &out_shape)?, dtype)?, Tensor::from_vec(lse, lse_shape)?])
            })
        }
        Op::AttentionBackward { causal, scale } => {
            let (o, lse, g) = (inputs[3], inputs[4], inputs[5]);
            let dims = dims_of(q, kt, v, *causal);
            let (qc, kc, vc, oc, gc) = (
                to_compute(q)?,
                to_compute(kt)?,
                to_compute(v)?,
                to_compute(o)?,
                to_compute(g)?,
            );
            crate::float_dispatch!(qc.dtype(), T => {
                let (qs, ks, vs) = (qc.contig::<T>("attention")?, kc.contig::<T>("attention")?, vc.contig::<T>("attention")?);
                let (os, ls, gs) = (oc.contig::<T>("attention")?, lse.contig::<T>("attention")?, gc.contig::<T>("attention")?);
                let mut dq = vec![0 as T; qs.len()];
                let mut dk = vec![0 as T; ks.len()];
                let mut dv = vec![0 as T; vs.len()];
                k::backward(dims, &qs, &ks, &vs, &os, &ls, &gs, *scale as T, &mut dq, &mut dk, &mut dv);
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
