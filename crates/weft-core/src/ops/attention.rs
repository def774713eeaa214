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
        if crate::autocast::autocast_dtype().is_some() && [q, k, v].iter().any(|t| t.dtype() == crate::DType::F32) {
            use crate::autocast::low;
            return Tensor::scaled_dot_product_attention(&low(q)?, &low(k)?, &low(v)?, causal, scale);
        }
        same_dtypes(q, k, v)?;
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

    /// Grouped-query attention (`F.scaled_dot_product_attention(..., enable_gqa=True)`): `k` and
    /// `v` have `Hkv` heads, fewer than `q`'s `H` (`H % Hkv == 0`), and query head `h` attends
    /// with key/value head `h / (H / Hkv)`. Equal to repeating each key/value head `H / Hkv`
    /// times (transformers' `repeat_kv`) and calling [`Tensor::scaled_dot_product_attention`],
    /// without the copies on CPU: the kernel reads the shared heads in place, and its backward
    /// sums their gradients over each group (in order of the query heads). On other devices k
    /// and v are repeated first. `scale` defaults to `1 / sqrt(D)`.
    /// # Shapes
    /// q `[..., H, T, D]`, k `[..., Hkv, S, D]`, v `[..., Hkv, S, Dv]` -> `[..., H, T, Dv]`.
    pub fn grouped_query_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f64>,
    ) -> Result<Tensor> {
        let r = q.rank();
        let shapes_ok = r >= 3
            && k.rank() == r
            && v.rank() == r
            && q.shape()[..r - 3] == k.shape()[..r - 3]
            && k.shape()[..r - 1] == v.shape()[..r - 1]
            && q.shape()[r - 3] > 0
            && k.shape()[r - 3] > 0
            && q.shape()[r - 3].is_multiple_of(k.shape()[r - 3]);
        if !shapes_ok {
            return Err(invalid(
                "grouped_query_attention",
                format!(
                    "expected q [..., H, T, D], k [..., Hkv, S, D], v [..., Hkv, S, Dv] with H a \
                     positive multiple of Hkv, got {:?} {:?} {:?}",
                    q.shape(),
                    k.shape(),
                    v.shape()
                ),
            ));
        }
        let (h, hkv) = (q.shape()[r - 3], k.shape()[r - 3]);
        if h == hkv {
            return Tensor::scaled_dot_product_attention(q, k, v, causal, scale);
        }
        if [q, k, v].iter().any(|t| t.device() != crate::Device::Cpu) {
            // repeat each key/value head (the kernels of other devices take equal heads)
            let repeat = |z: &Tensor| -> Result<Tensor> {
                let mut wide = z.shape().to_vec();
                wide.insert(r - 2, h / hkv);
                let mut merged: Vec<isize> = z.shape().iter().map(|&d| d as isize).collect();
                merged[r - 3] = h as isize;
                z.unsqueeze((r - 2) as isize)?.expand(&wide)?.reshape(&merged)
            };
            return Tensor::scaled_dot_product_attention(q, &repeat(k)?, &repeat(v)?, causal, scale);
        }
        expect_float("attention", q)?;
        if crate::autocast::autocast_dtype().is_some() && [q, k, v].iter().any(|t| t.dtype() == crate::DType::F32) {
            use crate::autocast::low;
            return Tensor::grouped_query_attention(&low(q)?, &low(k)?, &low(v)?, causal, scale);
        }
        same_dtypes(q, k, v)?;
        if q.shape()[r - 1] != k.shape()[r - 1] {
            return Err(invalid(
                "grouped_query_attention",
                format!("q and k head dims differ: {:?} {:?}", q.shape(), k.shape()),
            ));
        }
        let scale = scale.unwrap_or(1.0 / (q.shape()[r - 1] as f64).sqrt());
        apply(Op::Attention { causal, scale }, &[q, k, v])
    }

    /// Multi-head self-attention on a fused projection (nanoGPT's `c_attn` output): `self` is
    /// `[B, T, 3C]` with q, k and v side by side, each split into `heads` heads of `C / heads`.
    /// Returns `[B, T, C]` with head `h` in columns `h * C / heads..`: the same as splitting,
    /// viewing each third as `[B, heads, T, C / heads]`, [`Tensor::scaled_dot_product_attention`]
    /// and merging the heads back, without materializing the split, and with one gradient for
    /// `qkv` instead of three added together. `scale` defaults to `1 / sqrt(C / heads)`.
    pub fn qkv_attention(&self, heads: usize, causal: bool, scale: Option<f64>) -> Result<Tensor> {
        expect_float("qkv_attention", self)?;
        if crate::autocast::autocast_dtype().is_some() && self.dtype() == crate::DType::F32 {
            return crate::autocast::low(self)?.qkv_attention(heads, causal, scale);
        }
        let s = self.shape();
        if self.rank() != 3 || heads == 0 || !s[2].is_multiple_of(3 * heads) {
            return Err(invalid(
                "qkv_attention",
                format!(
                    "expected [B, T, 3 * C] with C divisible by heads = {heads}, got {:?}",
                    s
                ),
            ));
        }
        let hd = s[2] / 3 / heads;
        let scale = scale.unwrap_or(1.0 / (hd as f64).sqrt());
        apply(Op::QkvAttention { heads, causal, scale }, &[self])
    }
}

/// Where each (batch, head) problem of a `[B, T, 3C]` fused projection and its `[B, T, C]`
/// output live: offsets of q, k and v in the projection (rows `3C` apart) and of the output
/// (rows `C` apart).
struct QkvLayout {
    dims: AttnDims,
    width: usize,
    c: usize,
    q: Vec<usize>,
    k: Vec<usize>,
    v: Vec<usize>,
    o: Vec<usize>,
}

impl QkvLayout {
    fn new(qkv: &Tensor, heads: usize, causal: bool) -> QkvLayout {
        let (b, t, width) = (qkv.shape()[0], qkv.shape()[1], qkv.shape()[2]);
        let c = width / 3;
        let hd = c / heads;
        let q: Vec<usize> = (0..b * heads)
            .map(|i| (i / heads) * t * width + (i % heads) * hd)
            .collect();
        QkvLayout {
            dims: AttnDims {
                bh: b * heads,
                t,
                s: t,
                d: hd,
                dv: hd,
                causal,
                group: task_group(b, heads),
                kv_group: 1,
            },
            width,
            c,
            k: q.iter().map(|o| o + c).collect(),
            v: q.iter().map(|o| o + 2 * c).collect(),
            o: (0..b * heads).map(|i| (i / heads) * t * c + (i % heads) * hd).collect(),
            q,
        }
    }

    /// q, k and v of every problem in the projection's elements.
    fn qkv<'a, T>(&'a self, data: &'a [T]) -> (k::Mats<'a, T>, k::Mats<'a, T>, k::Mats<'a, T>) {
        let m = |offsets: &'a [usize]| k::Mats {
            data,
            offsets,
            row_stride: self.width,
        };
        (m(&self.q), m(&self.k), m(&self.v))
    }

    /// Every problem's rows in a `[B, T, C]` tensor's elements (the output, its gradient).
    fn out<'a, T>(&'a self, data: &'a [T]) -> k::Mats<'a, T> {
        k::Mats {
            data,
            offsets: &self.o,
            row_stride: self.c,
        }
    }
}

/// `t` in the compute dtype, contiguous (a copy only when needed).
fn dense_input(name: &'static str, t: &Tensor) -> Result<Tensor> {
    let c = to_compute(name, t)?;
    if c.is_contiguous() {
        Ok(c)
    } else {
        c.contiguous_copy_for(name)
    }
}

/// An error unless `k` and `v` have `q`'s dtype.
fn same_dtypes(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
    for t in [k, v] {
        if t.dtype() != q.dtype() {
            return Err(Error::DTypeMismatch {
                op: "attention",
                lhs: q.dtype(),
                rhs: t.dtype(),
            });
        }
    }
    Ok(())
}

/// Problems per attention task for `batches` x `heads` problems whose outputs interleave by head
/// (see `AttnDims::group`): all heads of a batch element, when there are batch elements enough
/// to keep every thread busy.
fn task_group(batches: usize, heads: usize) -> usize {
    if batches >= crate::cpu::threads::num_threads() {
        heads.max(1)
    } else {
        1
    }
}

fn dims_of(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool) -> AttnDims {
    let r = q.rank();
    let bh = numel(&q.shape()[..r - 2]);
    // grouped-query attention: k and v have fewer heads (dim -3) than q
    let kv_group = bh.checked_div(numel(&k.shape()[..r - 2])).unwrap_or(1).max(1);
    // a rank-4 output is stored [B, T, H, Dv]: its heads interleave
    let group = if r == 4 {
        task_group(q.shape()[0], q.shape()[1])
    } else {
        1
    };
    AttnDims {
        bh,
        t: q.shape()[r - 2],
        s: k.shape()[r - 2],
        d: q.shape()[r - 1],
        dv: v.shape()[r - 1],
        causal,
        // (the backward rounds it up to whole groups of kv_group: a task alone writes their dk
        // and dv; the forward writes each problem's own output and needs no rounding)
        group,
        kv_group,
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
            offsets: lead.offsets("attention")?,
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

/// Offsets of `n` matrices of `size` elements stored back to back.
fn dense_offsets(n: usize, size: usize) -> Vec<usize> {
    (0..n).map(|i| i * size).collect()
}

/// `buf`, which the kernel fills (written through the pointer only), as output matrices at
/// `offsets`, rows `row_stride` apart.
fn mats_out<'a, T>(buf: &mut [std::mem::MaybeUninit<T>], offsets: &'a [usize], row_stride: usize) -> k::MatsMut<'a, T> {
    k::MatsMut {
        ptr: buf.as_mut_ptr() as *mut T,
        len: buf.len(),
        offsets,
        row_stride,
    }
}

/// `t` in the compute dtype with a contiguous last dim (a copy only when needed).
fn strided_input(name: &'static str, t: &Tensor) -> Result<Tensor> {
    let c = to_compute(name, t)?;
    let r = c.rank();
    if c.strides()[r - 1] == 1 || c.shape()[r - 1] <= 1 {
        Ok(c)
    } else {
        c.contiguous_copy_for(name)
    }
}

pub(super) fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let q = inputs[0];
    let dtype = q.dtype();
    let name = op.name();
    match op {
        Op::Attention { causal, scale } => {
            let (kt, v) = (inputs[1], inputs[2]);
            let dims = dims_of(q, kt, v, *causal);
            let r = q.rank();
            let lse_shape = &q.shape()[..r - 1];
            let (qc, kc, vc) = (
                strided_input(name, q)?,
                strided_input(name, kt)?,
                strided_input(name, v)?,
            );
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
            let o_offsets = lead.offsets(name)?;
            crate::float_dispatch!(qc.dtype(), T => {
                let (qv, kv, vv) = (MatView::<T>::new(&qc)?, MatView::<T>::new(&kc)?, MatView::<T>::new(&vc)?);
                let mut o = crate::alloc::uninit::<T>(name, dims.bh * dims.t * dims.dv)?;
                let mut lse = crate::alloc::filled(name, dims.bh * dims.t, 0 as T)?;
                let om = mats_out(&mut o, &o_offsets, view.strides[r - 2]);
                k::forward(dims, qv.mats(), kv.mats(), vv.mats(), *scale as T, om, &mut lse);
                drop((qv, kv, vv));
                // SAFETY: the kernel writes every row of every problem's output.
                let o = unsafe { crate::cpu::assume_init(o) };
                let out = Tensor::from_vec(o, &store_shape)?.with_layout(view.clone());
                let out = if dtype == qc.dtype() { out } else { back_to(name, out.contiguous_copy_for(name)?, dtype)? };
                Ok(vec![out, Tensor::from_vec(lse, lse_shape)?])
            })
        }
        Op::AttentionBackward { causal, scale } => {
            let (kt, v) = (inputs[1], inputs[2]);
            let (o, lse, g) = (inputs[3], inputs[4], inputs[5]);
            let dims = dims_of(q, kt, v, *causal);
            let (qc, kc, vc) = (
                strided_input(name, q)?,
                strided_input(name, kt)?,
                strided_input(name, v)?,
            );
            let (oc, gc) = (strided_input(name, o)?, strided_input(name, g)?);
            crate::float_dispatch!(qc.dtype(), T => {
                let (qv, kv, vv) = (MatView::<T>::new(&qc)?, MatView::<T>::new(&kc)?, MatView::<T>::new(&vc)?);
                let (ov, gv) = (MatView::<T>::new(&oc)?, MatView::<T>::new(&gc)?);
                let ls = lse.contig::<T>("attention")?;
                let mut dq = crate::alloc::uninit::<T>(name, dims.bh * dims.t * dims.d)?;
                // k and v (and so dk and dv) hold bh / kv_group problems
                let kv_bh = dims.bh / dims.kv_group;
                let mut dk = crate::alloc::uninit::<T>(name, kv_bh * dims.s * dims.d)?;
                let mut dv = crate::alloc::uninit::<T>(name, kv_bh * dims.s * dims.dv)?;
                let (oq, ok, ov_) = (dense_offsets(dims.bh, dims.t * dims.d), dense_offsets(kv_bh, dims.s * dims.d), dense_offsets(kv_bh, dims.s * dims.dv));
                k::backward(
                    dims, qv.mats(), kv.mats(), vv.mats(), ov.mats(), &ls, gv.mats(), *scale as T,
                    mats_out(&mut dq, &oq, dims.d), mats_out(&mut dk, &ok, dims.d), mats_out(&mut dv, &ov_, dims.dv),
                );
                // SAFETY: the kernel writes all of dq (zeros for rows that see no key) and zeroes
                // dk and dv before adding into them.
                let (dq, dk, dv) = unsafe { (crate::cpu::assume_init(dq), crate::cpu::assume_init(dk), crate::cpu::assume_init(dv)) };
                drop((qv, kv, vv, ov, gv));
                Ok(vec![
                    back_to(name, Tensor::from_vec(dq, q.shape())?, dtype)?,
                    back_to(name, Tensor::from_vec(dk, kt.shape())?, dtype)?,
                    back_to(name, Tensor::from_vec(dv, v.shape())?, dtype)?,
                ])
            })
        }
        Op::QkvAttention { heads, causal, scale } => {
            let x = dense_input(name, q)?;
            let l = QkvLayout::new(&x, *heads, *causal);
            let (b, t) = (x.shape()[0], x.shape()[1]);
            crate::float_dispatch!(x.dtype(), T => {
                let xs = x.contig::<T>("qkv_attention")?;
                let mut o = crate::alloc::uninit::<T>(name, b * t * l.c)?;
                let mut lse = crate::alloc::filled(name, l.dims.bh * t, 0 as T)?;
                let (qm, km, vm) = l.qkv(&xs);
                k::forward(l.dims, qm, km, vm, *scale as T, mats_out(&mut o, &l.o, l.c), &mut lse);
                // SAFETY: the kernel writes every row of every head's output.
                let o = unsafe { crate::cpu::assume_init(o) };
                let out = back_to(name, Tensor::from_vec(o, &[b, t, l.c])?, dtype)?;
                Ok(vec![out, Tensor::from_vec(lse, &[b, *heads, t])?])
            })
        }
        Op::QkvAttentionBackward { heads, causal, scale } => {
            let (x, o, g) = (
                dense_input(name, q)?,
                dense_input(name, inputs[1])?,
                dense_input(name, inputs[3])?,
            );
            let lse = inputs[2];
            if x.numel() == 0 {
                // no positions (or no batch): nothing flows back
                return Ok(vec![Tensor::zeros(x.shape(), dtype)?]);
            }
            let l = QkvLayout::new(&x, *heads, *causal);
            crate::float_dispatch!(x.dtype(), T => {
                let (xs, os, gs) = (x.contig::<T>("qkv_attention")?, o.contig::<T>("qkv_attention")?, g.contig::<T>("qkv_attention")?);
                let ls = lse.contig::<T>("qkv_attention")?;
                let mut dx = crate::alloc::uninit::<T>(name, xs.len())?;
                let (qm, km, vm) = l.qkv(&xs);
                let (om, gm) = (l.out(&os), l.out(&gs));
                let (dq, dk) = (mats_out(&mut dx, &l.q, l.width), mats_out(&mut dx, &l.k, l.width));
                let dv = mats_out(&mut dx, &l.v, l.width);
                k::backward(l.dims, qm, km, vm, om, &ls, gm, *scale as T, dq, dk, dv);
                // SAFETY: the kernel writes all of dq (zeros for rows that see no key) and zeroes
                // dk and dv before adding into them; q, k and v fill the whole width.
                let dx = unsafe { crate::cpu::assume_init(dx) };
                Ok(vec![back_to(name, Tensor::from_vec(dx, x.shape())?, dtype)?])
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
    let out = output.detach();
    if let Op::QkvAttention { heads, causal, scale } = op {
        let args = [&inputs[0], &out, &saved[0], grad];
        let op = Op::QkvAttentionBackward {
            heads: *heads,
            causal: *causal,
            scale: *scale,
        };
        return Ok(vec![Some(apply(op, &args)?)]);
    }
    let Op::Attention { causal, scale } = op else {
        unreachable!("attention::backward called with {op:?}")
    };
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
