//! 2-D convolution and pooling (NCHW).

use super::elementwise::back_to;
use super::{apply, apply_multi, expect_float, to_compute};
use crate::cpu::conv::{self as k, out_size, ConvDims, PoolDims};
use crate::error::{invalid, Error, Result};
use crate::op::{Conv2dParams, Op, Pool2dParams};
use crate::tensor::Tensor;

impl Tensor {
    /// 2-D convolution (as `F.conv2d`).
    /// # Shapes
    /// x `[N, C, H, W]`, weight `[O, C / groups, KH, KW]`, bias `[O]` -> `[N, O, OH, OW]` with
    /// `OH = (H + 2 pad - dil (KH - 1) - 1) / stride + 1`.
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, params: Conv2dParams) -> Result<Tensor> {
        if crate::autocast::autocast_dtype().is_some()
            && (self.dtype() == crate::DType::F32 || weight.dtype() == crate::DType::F32)
        {
            use crate::autocast::low;
            let b = bias.map(low).transpose()?;
            return low(self)?.conv2d(&low(weight)?, b.as_ref(), params);
        }
        conv_dims(self, weight, params)?;
        let y = apply(Op::Conv2d(params), &[self, weight])?;
        match bias {
            Some(b) => {
                if b.shape() != [weight.shape()[0]] {
                    return Err(Error::ShapeMismatch {
                        op: "conv2d",
                        lhs: weight.shape().to_vec(),
                        rhs: b.shape().to_vec(),
                    });
                }
                y.add(&b.view(&[1, weight.shape()[0], 1, 1])?)
            }
            None => Ok(y),
        }
    }

    /// Max pooling over `kernel` windows (padding counts as -inf).
    pub fn max_pool2d(&self, params: Pool2dParams) -> Result<Tensor> {
        pool_dims(self, params)?;
        apply(Op::MaxPool2d(params), &[self])
    }

    /// Average pooling over `kernel` windows, dividing by the full window size
    /// (`count_include_pad=True`, PyTorch's default).
    pub fn avg_pool2d(&self, params: Pool2dParams) -> Result<Tensor> {
        pool_dims(self, params)?;
        apply(Op::AvgPool2d(params), &[self])
    }
}

impl Conv2dParams {
    /// Stride 1, no padding, dilation 1, one group.
    pub fn new() -> Self {
        Conv2dParams {
            stride: (1, 1),
            padding: (0, 0),
            dilation: (1, 1),
            groups: 1,
        }
    }
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Self::new()
    }
}

impl Pool2dParams {
    /// A square `k x k` window with stride `k` and no padding (PyTorch's default stride).
    pub fn square(k: usize) -> Self {
        Pool2dParams {
            kernel: (k, k),
            stride: (k, k),
            padding: (0, 0),
        }
    }
}

fn conv_dims(x: &Tensor, w: &Tensor, p: Conv2dParams) -> Result<ConvDims> {
    expect_float("conv2d", x)?;
    if w.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch {
            op: "conv2d",
            lhs: x.dtype(),
            rhs: w.dtype(),
        });
    }
    if x.rank() != 4 || w.rank() != 4 {
        return Err(Error::ShapeMismatch {
            op: "conv2d",
            lhs: x.shape().to_vec(),
            rhs: w.shape().to_vec(),
        });
    }
    let (n, c, h, wd) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let (o, cg, kh, kw) = (w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]);
    let zero = p.stride.0 == 0
        || p.stride.1 == 0
        || p.dilation.0 == 0
        || p.dilation.1 == 0
        || p.groups == 0
        || kh == 0
        || kw == 0;
    if zero || c % p.groups != 0 || o % p.groups != 0 || cg != c / p.groups {
        return Err(invalid(
            "conv2d",
            format!(
                "input {:?} and weight {:?} do not fit groups={} (or a zero stride/dilation/kernel)",
                x.shape(),
                w.shape(),
                p.groups
            ),
        ));
    }
    let oh = out_size(h, kh, p.stride.0, p.padding.0, p.dilation.0);
    let ow = out_size(wd, kw, p.stride.1, p.padding.1, p.dilation.1);
    let (Some(oh), Some(ow)) = (oh, ow) else {
        return Err(invalid(
            "conv2d",
            format!("kernel {kh}x{kw} larger than padded input {:?}", x.shape()),
        ));
    };
    Ok(ConvDims {
        n,
        c,
        h,
        w: wd,
        o,
        kh,
        kw,
        oh,
        ow,
        p,
    })
}

fn pool_dims(x: &Tensor, p: Pool2dParams) -> Result<PoolDims> {
    expect_float("pool2d", x)?;
    if x.rank() != 4 {
        return Err(invalid(
            "pool2d",
            format!("input must be [N, C, H, W], got {:?}", x.shape()),
        ));
    }
    if p.kernel.0 == 0
        || p.kernel.1 == 0
        || p.stride.0 == 0
        || p.stride.1 == 0
        || 2 * p.padding.0 > p.kernel.0
        || 2 * p.padding.1 > p.kernel.1
    {
        return Err(invalid(
            "pool2d",
            format!("bad window {p:?} (padding must be at most half the kernel)"),
        ));
    }
    let (h, w) = (x.shape()[2], x.shape()[3]);
    let (Some(oh), Some(ow)) = (
        out_size(h, p.kernel.0, p.stride.0, p.padding.0, 1),
        out_size(w, p.kernel.1, p.stride.1, p.padding.1, 1),
    ) else {
        return Err(invalid(
            "pool2d",
            format!("window {:?} larger than input {:?}", p.kernel, x.shape()),
        ));
    };
    Ok(PoolDims {
        planes: x.shape()[0] * x.shape()[1],
        h,
        w,
        oh,
        ow,
        p,
    })
}

pub(super) fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let dtype = x.dtype();
    let name = op.name();
    let xc = to_compute(name, x)?;
    match op {
        Op::Conv2d(p) => {
            let d = conv_dims(x, inputs[1], *p)?;
            let wc = to_compute(name, inputs[1])?;
            crate::float_dispatch!(xc.dtype(), T => {
                let (xs, ws) = (xc.contig::<T>(name)?, wc.contig::<T>(name)?);
                let n = crate::shape::checked_numel(name, &[d.n, d.o, d.oh, d.ow])?;
                let mut y = crate::alloc::filled(name, n, 0 as T)?;
                k::conv2d(d, &xs, &ws, &mut y)?;
                Ok(vec![back_to(name, Tensor::from_vec(y, &[d.n, d.o, d.oh, d.ow])?, dtype)?])
            })
        }
        Op::Conv2dBackward(p) => {
            let d = conv_dims(x, inputs[1], *p)?;
            let (wc, gc) = (to_compute(name, inputs[1])?, to_compute(name, inputs[2])?);
            crate::float_dispatch!(xc.dtype(), T => {
                let (xs, ws, gs) = (xc.contig::<T>(name)?, wc.contig::<T>(name)?, gc.contig::<T>(name)?);
                let mut dx = crate::alloc::filled(name, xs.len(), 0 as T)?;
                let mut dw = crate::alloc::filled(name, ws.len(), 0 as T)?;
                k::conv2d_backward(d, &xs, &ws, &gs, &mut dx, &mut dw)?;
                Ok(vec![
                    back_to(name, Tensor::from_vec(dx, x.shape())?, dtype)?,
                    back_to(name, Tensor::from_vec(dw, inputs[1].shape())?, dtype)?,
                ])
            })
        }
        Op::MaxPool2d(p) | Op::AvgPool2d(p) => {
            let d = pool_dims(x, *p)?;
            let shape = [x.shape()[0], x.shape()[1], d.oh, d.ow];
            crate::float_dispatch!(xc.dtype(), T => {
                let xs = xc.contig::<T>(name)?;
                let mut y = crate::alloc::filled(name, crate::shape::checked_numel(name, &shape)?, 0 as T)?;
                if matches!(op, Op::MaxPool2d(_)) {
                    let mut idx = crate::alloc::filled(name, y.len(), 0i64)?;
                    k::max_pool2d(d, &xs, &mut y, &mut idx);
                    Ok(vec![back_to(name, Tensor::from_vec(y, &shape)?, dtype)?, Tensor::from_vec(idx, &shape)?])
                } else {
                    k::avg_pool2d(d, &xs, &mut y);
                    Ok(vec![back_to(name, Tensor::from_vec(y, &shape)?, dtype)?])
                }
            })
        }
        Op::MaxPool2dBackward(p) | Op::AvgPool2dBackward(p) => {
            let d = pool_dims(x, *p)?;
            let g = to_compute(name, inputs[inputs.len() - 1])?;
            crate::float_dispatch!(xc.dtype(), T => {
                let gs = g.contig::<T>(name)?;
                let mut dx = crate::alloc::filled(name, x.numel(), 0 as T)?;
                if matches!(op, Op::MaxPool2dBackward(_)) {
                    k::max_pool2d_backward(d, &inputs[1].to_vec::<i64>()?, &gs, &mut dx);
                } else {
                    k::avg_pool2d_backward(d, &gs, &mut dx);
                }
                Ok(vec![back_to(name, Tensor::from_vec(dx, x.shape())?, dtype)?])
            })
        }
        _ => unreachable!("conv::forward called with {op:?}"),
    }
}

pub(super) fn backward(op: &Op, inputs: &[Tensor], saved: &[Tensor], grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let x = &inputs[0];
    Ok(match op {
        Op::Conv2d(p) => apply_multi(Op::Conv2dBackward(*p), &[x, &inputs[1], grad])?
            .into_iter()
            .map(Some)
            .collect(),
        Op::MaxPool2d(p) => vec![Some(
            apply_multi(Op::MaxPool2dBackward(*p), &[x, &saved[0], grad])?.remove(0),
        )],
        Op::AvgPool2d(p) => vec![Some(apply_multi(Op::AvgPool2dBackward(*p), &[x, grad])?.remove(0))],
        _ => unreachable!("conv::backward called with {op:?}"),
    })
}
