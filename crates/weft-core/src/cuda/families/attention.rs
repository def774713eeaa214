//! GPU forward of the attention family (see `crate::ops::attention` for the CPU's), with the
//! kernels of `kernels/attention.cu`.
//!
//! Each op reads its inputs where they lie (any strides, broadcast dims included, and the q, k,
//! v thirds of a fused projection in place): every `[..., rows, cols]` operand is passed as a
//! [`Mat`], its leading dims flattened into `bh` problems. Outputs match the CPU's list: the
//! result in the input's dtype, then the per-row log-sum-exp in the compute dtype (f32, f64 for
//! f64) for the forward ops; dq, dk, dv (or dqkv) for the backward ones.

use std::sync::Arc;

use cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};

use crate::cuda::copy::{buffer, dense, empty, gpu_of};
use crate::cuda::dispatch::not_on_gpu;
use crate::cuda::kernels::ATTENTION;
use crate::cuda::launch::Strided;
use crate::cuda::runtime::Gpu;
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::layout::Layout;
use crate::op::Op;
use crate::shape::numel;
use crate::tensor::Tensor;

/// The kernels of this family's module that it launches (checked by the compile test).
pub const KERNELS: &[&str] = &[
    "attention_forward_f32",
    "attention_forward_f64",
    "attention_forward_bf16",
    "attention_forward_f16",
    "attention_backward_dq_f32",
    "attention_backward_dq_f64",
    "attention_backward_dq_bf16",
    "attention_backward_dq_f16",
    "attention_backward_dkdv_f32",
    "attention_backward_dkdv_f64",
    "attention_backward_dkdv_bf16",
    "attention_backward_dkdv_f16",
];

/// Warps per block of every attention kernel (`ATTN_WARPS` in the module): one warp per row.
const WARPS: u32 = 4;

/// A batch of matrices in one buffer, as the kernels read it (`struct Mat` in
/// `kernels/attention.cu`, same field order and sizes): matrix `b` starts at
/// `strided_offset(lead, b)` and its element `(r, c)` lies `r * row + c * col` past that, in
/// elements.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Mat {
    lead: Strided,
    row: u64,
    col: u64,
}

// SAFETY: plain `repr(C)` data of fixed-size integers (`Strided` is one too), laid out as the
// kernels' `struct Mat`.
unsafe impl DeviceRepr for Mat {}

impl Mat {
    /// A `[..., rows, cols]` view as `numel(lead dims)` matrices.
    fn of(op: &'static str, l: &Layout) -> Result<Mat> {
        let r = l.rank();
        debug_assert!(r >= 2);
        Ok(Mat {
            lead: Strided::new(op, &l.shape[..r - 2], &l.strides[..r - 2], l.offset)?,
            row: l.strides[r - 2] as u64,
            col: l.strides[r - 1] as u64,
        })
    }

    /// The `[B, heads, T, hd]` view of columns `first..first + heads * hd` of a `[B, T, W]`
    /// layout: head `h` is columns `first + h * hd..` (the q, k or v third of a fused
    /// projection, or a `[B, T, C]` attention output).
    fn heads(op: &'static str, l: &Layout, heads: usize, hd: usize, first: usize) -> Result<Mat> {
        let (s, st) = (&l.shape, &l.strides);
        Ok(Mat {
            lead: Strided::new(op, &[s[0], heads], &[st[0], hd * st[2]], l.offset + first * st[2])?,
            row: st[1] as u64,
            col: st[2] as u64,
        })
    }
}

/// Sizes of one call, as the kernels read them (`struct AttnDims` in `kernels/attention.cu`):
/// `bh` problems of `t` queries and `s` keys, head dims `d` (q, k) and `dv` (v, out); `scale`
/// multiplies the dot products; `causal` is 0 or 1 (query `i` sees keys `j <= i`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Dims {
    bh: u64,
    t: u64,
    s: u64,
    d: u64,
    dv: u64,
    scale: f64,
    causal: u32,
    pad: u32,
}

// SAFETY: plain `repr(C)` numbers, laid out as the kernels' `struct AttnDims`.
unsafe impl DeviceRepr for Dims {}

impl Dims {
    fn new(bh: usize, t: usize, s: usize, d: usize, dv: usize, causal: bool, scale: f64) -> Dims {
        Dims {
            bh: bh as u64,
            t: t as u64,
            s: s as u64,
            d: d as u64,
            dv: dv as u64,
            scale,
            causal: causal as u32,
            pad: 0,
        }
    }

    /// The sizes of a `scaled_dot_product_attention` call: q `[..., T, D]`, k `[..., S, D]`,
    /// v `[..., S, Dv]`.
    fn of(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: f64) -> Dims {
        let r = q.rank();
        Dims::new(
            numel(&q.shape()[..r - 2]),
            q.shape()[r - 2],
            k.shape()[r - 2],
            q.shape()[r - 1],
            v.shape()[r - 1],
            causal,
            scale,
        )
    }
}

/// The kernels' name suffix of a dtype; `None` for dtypes the family does not take.
fn suffix(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F32 => Some("f32"),
        DType::F64 => Some("f64"),
        DType::BF16 => Some("bf16"),
        DType::F16 => Some("f16"),
        _ => None,
    }
}

/// One warp per row for `rows` rows (a grid-stride loop covers any excess).
fn for_warps(rows: u64) -> LaunchConfig {
    let blocks = rows.div_ceil(WARPS as u64).clamp(1, i32::MAX as u64) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (WARPS * 32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The device address of `t`'s buffer (element 0: the [`Mat`]s carry the views' offsets).
fn base(t: &Tensor) -> Result<u64> {
    Ok(buffer(t)?.ptr())
}

/// An error unless `t` has `shape` and `dtype` (a saved tensor or gradient handed to a backward
/// op: the kernels read it as `dtype`).
fn expect_operand(op: &'static str, what: &str, t: &Tensor, shape: &[usize], dtype: DType) -> Result<()> {
    if t.dtype() != dtype {
        return Err(Error::DTypeMismatch {
            op,
            lhs: t.dtype(),
            rhs: dtype,
        });
    }
    if t.shape() != shape {
        return Err(invalid(
            op,
            format!("{what} of shape {:?}, expected {shape:?}", t.shape()),
        ));
    }
    Ok(())
}

/// The saved log-sum-exp `[bh * t]` elements in the compute dtype of `dtype`, contiguous.
fn lse_input(op: &'static str, lse: &Tensor, dtype: DType, rows: usize) -> Result<Tensor> {
    let want = dtype.compute_float();
    if lse.dtype() != want {
        return Err(Error::DTypeMismatch {
            op,
            lhs: lse.dtype(),
            rhs: want,
        });
    }
    if lse.numel() != rows {
        return Err(invalid(
            op,
            format!("a log-sum-exp of {} elements, expected {rows}", lse.numel()),
        ));
    }
    dense(lse)
}

pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let Some(sfx) = suffix(inputs[0].dtype()) else {
        return Err(not_on_gpu(op, inputs));
    };
    match op {
        Op::Attention { causal, scale } => attention(op.name(), sfx, inputs, *causal, *scale),
        Op::AttentionBackward { causal, scale } => attention_backward(op.name(), sfx, inputs, *causal, *scale),
        Op::QkvAttention { heads, causal, scale } => qkv_attention(op.name(), sfx, inputs[0], *heads, *causal, *scale),
        Op::QkvAttentionBackward { heads, causal, scale } => {
            qkv_attention_backward(op.name(), sfx, inputs, *heads, *causal, *scale)
        }
        _ => unreachable!("attention::forward called with {op:?}"),
    }
}

/// The kernels take k and v with q's leading dims: grouped-query attention repeats the key/value
/// heads before it reaches a GPU (`Tensor::grouped_query_attention`).
fn equal_heads(name: &'static str, q: &Tensor, k: &Tensor) -> Result<()> {
    let r = q.rank();
    if k.rank() != r || q.shape()[..r - 2] != k.shape()[..r - 2] {
        return Err(invalid(
            name,
            format!(
                "k's leading dims {:?} differ from q's {:?} (grouped-query attention runs with repeated heads on GPUs)",
                &k.shape()[..k.rank().saturating_sub(2)],
                &q.shape()[..r - 2]
            ),
        ));
    }
    Ok(())
}

/// q `[..., T, D]`, k `[..., S, D]`, v `[..., S, Dv]` -> out `[..., T, Dv]` (input dtype; a
/// rank-4 result is stored `[B, T, H, Dv]` and returned as its `[B, H, T, Dv]` view, as on the
/// CPU) and lse `[..., T]` (compute dtype).
fn attention(name: &'static str, sfx: &str, inputs: &[&Tensor], causal: bool, scale: f64) -> Result<Vec<Tensor>> {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    equal_heads(name, q, k)?;
    let g = gpu_of(q)?;
    let r = q.rank();
    let n = Dims::of(q, k, v, causal, scale);
    let (store_shape, perm): (Vec<usize>, Vec<usize>) = if r == 4 {
        let s = q.shape();
        (vec![s[0], s[2], s[1], v.shape()[3]], vec![0, 2, 1, 3])
    } else {
        let mut s = q.shape().to_vec();
        s[r - 1] = v.shape()[r - 1];
        (s, (0..r).collect())
    };
    let stored = empty(&g, name, q.dtype(), &store_shape)?;
    let out = stored.with_layout(Layout::contiguous(&store_shape).permute(&perm)?);
    let lse = empty(&g, name, q.dtype().compute_float(), &q.shape()[..r - 1])?;
    let mats = [
        Mat::of(name, q.layout())?,
        Mat::of(name, k.layout())?,
        Mat::of(name, v.layout())?,
        Mat::of(name, out.layout())?,
    ];
    launch_forward(&g, name, sfx, [q, k, v, &out, &lse], mats, n)?;
    Ok(vec![out, lse])
}

/// qkv `[B, T, 3C]` -> out `[B, T, C]` (head `h` in columns `h * C / heads..`) and lse
/// `[B, heads, T]` (compute dtype).
fn qkv_attention(
    name: &'static str,
    sfx: &str,
    x: &Tensor,
    heads: usize,
    causal: bool,
    scale: f64,
) -> Result<Vec<Tensor>> {
    let g = gpu_of(x)?;
    let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2] / 3);
    let hd = c / heads;
    let n = Dims::new(b * heads, t, t, hd, hd, causal, scale);
    let out = empty(&g, name, x.dtype(), &[b, t, c])?;
    let lse = empty(&g, name, x.dtype().compute_float(), &[b, heads, t])?;
    let l = x.layout();
    let mats = [
        Mat::heads(name, l, heads, hd, 0)?,
        Mat::heads(name, l, heads, hd, c)?,
        Mat::heads(name, l, heads, hd, 2 * c)?,
        Mat::heads(name, out.layout(), heads, hd, 0)?,
    ];
    launch_forward(&g, name, sfx, [x, x, x, &out, &lse], mats, n)?;
    Ok(vec![out, lse])
}

/// Runs `attention_forward_<sfx>`: `t` = [q, k, v, out, lse] (base addresses; the views are in
/// `m` = [q, k, v, out]; lse contiguous `[bh, t]`).
fn launch_forward(g: &Arc<Gpu>, name: &'static str, sfx: &str, t: [&Tensor; 5], m: [Mat; 4], n: Dims) -> Result<()> {
    let rows = n.bh * n.t;
    if rows == 0 {
        return Ok(());
    }
    let f = g.function(&ATTENTION, &format!("attention_forward_{sfx}"))?;
    let (q, k, v, o, lse) = (base(t[0])?, base(t[1])?, base(t[2])?, base(t[3])?, base(t[4])?);
    let [mq, mk, mv, mo] = m;
    g.bind()?;
    // SAFETY: each Mat describes a view of its tensor's buffer (layouts are checked against their
    // storage when built; the fused projection's thirds and heads lie inside its view), so every
    // element the kernel reads for the `bh` problems of `t` x `s` x `d`/`dv` lies inside; the
    // output and lse are fresh buffers of `bh * t * dv` and `bh * t` elements, written once each.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&q)
            .arg(&k)
            .arg(&v)
            .arg(&o)
            .arg(&lse)
            .arg(&mq)
            .arg(&mk)
            .arg(&mv)
            .arg(&mo)
            .arg(&n)
            .launch(for_warps(rows))
    }
    .map_err(|e| g.fail(name, e))?;
    Ok(())
}

/// (q, k, v, out, lse, grad_out) -> (dq, dk, dv) in the shapes of q, k and v.
fn attention_backward(
    name: &'static str,
    sfx: &str,
    inputs: &[&Tensor],
    causal: bool,
    scale: f64,
) -> Result<Vec<Tensor>> {
    let (q, k, v, o, lse, go) = (inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], inputs[5]);
    equal_heads(name, q, k)?;
    let g = gpu_of(q)?;
    let r = q.rank();
    let n = Dims::of(q, k, v, causal, scale);
    let mut out_shape = q.shape().to_vec();
    out_shape[r - 1] = v.shape()[r - 1];
    expect_operand(name, "an output", o, &out_shape, q.dtype())?;
    expect_operand(name, "an output gradient", go, &out_shape, q.dtype())?;
    let lse = lse_input(name, lse, q.dtype(), (n.bh * n.t) as usize)?;
    let dq = empty(&g, name, q.dtype(), q.shape())?;
    let dk = empty(&g, name, q.dtype(), k.shape())?;
    let dv = empty(&g, name, q.dtype(), v.shape())?;
    let mats = [
        Mat::of(name, q.layout())?,
        Mat::of(name, k.layout())?,
        Mat::of(name, v.layout())?,
        Mat::of(name, o.layout())?,
        Mat::of(name, go.layout())?,
        Mat::of(name, dq.layout())?,
        Mat::of(name, dk.layout())?,
        Mat::of(name, dv.layout())?,
    ];
    launch_backward(&g, name, sfx, [q, k, v, o, go, &lse, &dq, &dk, &dv], mats, n)?;
    Ok(vec![dq, dk, dv])
}

/// (qkv `[B, T, 3C]`, out `[B, T, C]`, lse `[B, heads, T]`, grad_out `[B, T, C]`) -> dqkv
/// `[B, T, 3C]`.
fn qkv_attention_backward(
    name: &'static str,
    sfx: &str,
    inputs: &[&Tensor],
    heads: usize,
    causal: bool,
    scale: f64,
) -> Result<Vec<Tensor>> {
    let (x, o, lse, go) = (inputs[0], inputs[1], inputs[2], inputs[3]);
    let g = gpu_of(x)?;
    let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2] / 3);
    let hd = c / heads;
    let n = Dims::new(b * heads, t, t, hd, hd, causal, scale);
    expect_operand(name, "an output", o, &[b, t, c], x.dtype())?;
    expect_operand(name, "an output gradient", go, &[b, t, c], x.dtype())?;
    let lse = lse_input(name, lse, x.dtype(), b * heads * t)?;
    let dx = empty(&g, name, x.dtype(), x.shape())?;
    let (xl, dl) = (x.layout(), dx.layout());
    let mats = [
        Mat::heads(name, xl, heads, hd, 0)?,
        Mat::heads(name, xl, heads, hd, c)?,
        Mat::heads(name, xl, heads, hd, 2 * c)?,
        Mat::heads(name, o.layout(), heads, hd, 0)?,
        Mat::heads(name, go.layout(), heads, hd, 0)?,
        Mat::heads(name, dl, heads, hd, 0)?,
        Mat::heads(name, dl, heads, hd, c)?,
        Mat::heads(name, dl, heads, hd, 2 * c)?,
    ];
    launch_backward(&g, name, sfx, [x, x, x, o, go, &lse, &dx, &dx, &dx], mats, n)?;
    Ok(vec![dx])
}

/// Runs the two backward kernels: `t` = [q, k, v, out, grad_out, lse, dq, dk, dv] (base
/// addresses; the views are in `m` = [q, k, v, out, grad_out, dq, dk, dv]; lse contiguous
/// `[bh, t]`). The first writes dq and each query's `delta = dot(grad_out, out)`, which the
/// second (queued after it on the one stream) reads for dk and dv.
fn launch_backward(g: &Arc<Gpu>, name: &'static str, sfx: &str, t: [&Tensor; 9], m: [Mat; 8], n: Dims) -> Result<()> {
    let (q, k, v, o, go, lse) = (
        base(t[0])?,
        base(t[1])?,
        base(t[2])?,
        base(t[3])?,
        base(t[4])?,
        base(t[5])?,
    );
    let (dq, dk, dv) = (base(t[6])?, base(t[7])?, base(t[8])?);
    let [mq, mk, mv, mo, mg, mdq, mdk, mdv] = m;
    let delta_t = empty(g, name, t[5].dtype(), &[(n.bh * n.t) as usize])?;
    let delta = base(&delta_t)?;
    let (qrows, krows) = (n.bh * n.t, n.bh * n.s);
    if qrows > 0 {
        let f = g.function(&ATTENTION, &format!("attention_backward_dq_{sfx}"))?;
        g.bind()?;
        // SAFETY: as in `launch_forward`, every Mat is a view inside its tensor's buffer; lse and
        // delta hold `bh * t` elements; dq's view lies in a fresh buffer (or its third of one),
        // each element written once by this kernel alone.
        unsafe {
            g.stream()
                .launch_builder(&f)
                .arg(&q)
                .arg(&k)
                .arg(&v)
                .arg(&o)
                .arg(&go)
                .arg(&lse)
                .arg(&delta)
                .arg(&dq)
                .arg(&mq)
                .arg(&mk)
                .arg(&mv)
                .arg(&mo)
                .arg(&mg)
                .arg(&mdq)
                .arg(&n)
                .launch(for_warps(qrows))
        }
        .map_err(|e| g.fail(name, e))?;
    }
    if krows > 0 {
        let f = g.function(&ATTENTION, &format!("attention_backward_dkdv_{sfx}"))?;
        g.bind()?;
        // SAFETY: as above; dk and dv are disjoint views of fresh buffers (distinct buffers, or
        // distinct thirds of dqkv), each element written once; delta was written by the kernel
        // queued before this one on the same stream (or is empty when t = 0 and never read).
        unsafe {
            g.stream()
                .launch_builder(&f)
                .arg(&q)
                .arg(&k)
                .arg(&v)
                .arg(&go)
                .arg(&lse)
                .arg(&delta)
                .arg(&dk)
                .arg(&dv)
                .arg(&mq)
                .arg(&mk)
                .arg(&mv)
                .arg(&mg)
                .arg(&mdk)
                .arg(&mdv)
                .arg(&n)
                .launch(for_warps(krows))
        }
        .map_err(|e| g.fail(name, e))?;
    }
    drop(delta_t);
    Ok(())
}
