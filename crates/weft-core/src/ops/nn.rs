//! Fused neural-network ops: softmax / log_softmax, layer_norm / rms_norm, cross_entropy, dropout.

use super::elementwise::back_to;
use super::{apply, apply_multi, expect_dtype, expect_float, to_compute};
use crate::cpu::nn as k;
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::op::Op;
use crate::rng::{self, Generator};
use crate::shape::resolve_dim;
use crate::tensor::Tensor;

impl Tensor {
    /// Softmax along `dim`.
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl(dim, false)
    }

    /// Log-softmax along `dim`.
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl(dim, true)
    }

    fn softmax_impl(&self, dim: isize, log: bool) -> Result<Tensor> {
        expect_float("softmax", self)?;
        if crate::autocast::autocast_dtype().is_some() && self.dtype() != DType::F32 && self.dtype() != DType::F64 {
            return crate::autocast::high(self)?.softmax_impl(dim, log);
        }
        if self.rank() == 0 {
            return Err(invalid("softmax", "needs at least one dim"));
        }
        let d = resolve_dim("softmax", dim, self.rank())?;
        let last = self.rank() - 1;
        if d == last {
            return apply(Op::Softmax { log }, &[self]);
        }
        self.transpose(d as isize, last as isize)?
            .softmax_impl(-1, log)?
            .transpose(d as isize, last as isize)
    }

    /// Layer norm over the last dim (as `torch.nn.functional.layer_norm` with
    /// `normalized_shape = [C]`): `(x - mean) / sqrt(var + eps) * weight + bias`, biased variance.
    /// # Shapes
    /// x `[..., C]`, weight and bias `[C]`.
    pub fn layer_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        self.norm_impl(weight, bias, eps, false)
    }

    /// RMS norm over the last dim: `x / sqrt(mean(x^2) + eps) * weight`.
    pub fn rms_norm(&self, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        self.norm_impl(weight, None, eps, true)
    }

    fn norm_impl(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64, rms: bool) -> Result<Tensor> {
        let op = if rms { "rms_norm" } else { "layer_norm" };
        expect_float(op, self)?;
        if crate::autocast::autocast_dtype().is_some() {
            use crate::autocast::high;
            let low = |t: &Tensor| matches!(t.dtype(), DType::BF16 | DType::F16);
            if low(self) || weight.is_some_and(low) || bias.is_some_and(low) {
                let (w, b) = (weight.map(high).transpose()?, bias.map(high).transpose()?);
                return high(self)?.norm_impl(w.as_ref(), b.as_ref(), eps, rms);
            }
        }
        let c = *self
            .shape()
            .last()
            .ok_or_else(|| invalid(op, "needs at least one dim"))?;
        let mut inputs = vec![self];
        for p in [weight, bias].into_iter().flatten() {
            if p.shape() != [c] {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: self.shape().to_vec(),
                    rhs: p.shape().to_vec(),
                });
            }
            if p.dtype() != self.dtype() {
                return Err(Error::DTypeMismatch {
                    op,
                    lhs: self.dtype(),
                    rhs: p.dtype(),
                });
            }
            inputs.push(p);
        }
        apply(
            Op::Norm {
                eps,
                rms,
                has_weight: weight.is_some(),
                has_bias: bias.is_some(),
            },
            &inputs,
        )
    }

    /// Mean cross-entropy of `logits` `[N, C]` against I64 class ids `targets` `[N]` (any leading
    /// dims are flattened), skipping rows whose target is `ignore_index`, with PyTorch's label
    /// smoothing: `(1 - ε) * nll + ε * mean_j(-log p_j)`. All rows ignored gives NaN, as in PyTorch.
    pub fn cross_entropy(&self, targets: &Tensor, ignore_index: i64, label_smoothing: f64) -> Result<Tensor> {
        expect_float("cross_entropy", self)?;
        if crate::autocast::autocast_dtype().is_some() && matches!(self.dtype(), DType::BF16 | DType::F16) {
            return crate::autocast::high(self)?.cross_entropy(targets, ignore_index, label_smoothing);
        }
        expect_dtype("cross_entropy", targets, DType::I64)?;
        if self.rank() < 1 || !(0.0..=1.0).contains(&label_smoothing) {
            return Err(invalid(
                "cross_entropy",
                format!(
                    "bad logits shape {:?} or label_smoothing {label_smoothing}",
                    self.shape()
                ),
            ));
        }
        let c = self.shape()[self.rank() - 1];
        if targets.shape() != &self.shape()[..self.rank() - 1] {
            return Err(Error::ShapeMismatch {
                op: "cross_entropy",
                lhs: self.shape().to_vec(),
                rhs: targets.shape().to_vec(),
            });
        }
        let logits = self.reshape(&[-1, c as isize])?;
        let targets = targets.reshape(&[-1])?;
        apply(
            Op::CrossEntropy {
                ignore_index,
                label_smoothing,
            },
            &[&logits, &targets],
        )
    }

    /// Inverted dropout: in training, zeroes each element with probability `p` and scales the
    /// rest by `1 / (1 - p)`; the identity when `!train` or `p == 0`.
    pub fn dropout(&self, p: f64, train: bool, generator: &mut Generator) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&p) {
            return Err(invalid("dropout", format!("probability {p} outside [0, 1]")));
        }
        if !train || p == 0.0 {
            return Ok(self.clone());
        }
        expect_float("dropout", self)?;
        let (seed, offset) = generator.take(self.numel());
        apply(Op::Dropout { p, seed, offset }, &[self])
    }
}

pub(super) fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let dtype = x.dtype();
    let name = op.name();
    let xc = to_compute(name, x)?;
    let last = |t: &Tensor| *t.shape().last().unwrap_or(&1);
    match op {
        Op::Softmax { log } => {
            let len = last(x);
            let y = crate::float_dispatch!(xc.dtype(), T => {
                let mut y = crate::alloc::uninit::<T>(name, x.numel())?;
                k::softmax(&xc.contig::<T>("softmax")?, &mut y, len.max(1), *log);
                // SAFETY: the kernel wrote every row.
                Tensor::from_vec(unsafe { crate::cpu::assume_init(y) }, x.shape())?
            });
            Ok(vec![back_to(name, y, dtype)?])
        }
        Op::SoftmaxBackward { log } => {
            let len = last(x);
            let g = to_compute(name, inputs[1])?;
            let dx = crate::float_dispatch!(xc.dtype(), T => {
                let mut dx = crate::alloc::uninit::<T>(name, x.numel())?;
                k::softmax_backward(&xc.contig::<T>("softmax")?, &g.contig::<T>("softmax")?, &mut dx, len.max(1), *log);
                // SAFETY: the kernel wrote every row.
                Tensor::from_vec(unsafe { crate::cpu::assume_init(dx) }, x.shape())?
            });
            Ok(vec![back_to(name, dx, dtype)?])
        }
        Op::Norm {
            eps,
            rms,
            has_weight,
            has_bias,
        } => {
            let len = last(x);
            let rows = x.numel() / len.max(1);
            let w = if *has_weight {
                Some(to_compute(name, inputs[1])?)
            } else {
                None
            };
            let b = if *has_bias {
                Some(to_compute(name, inputs[1 + *has_weight as usize])?)
            } else {
                None
            };
            crate::float_dispatch!(xc.dtype(), T => {
                let xs = xc.contig::<T>("norm")?;
                let ws = w.as_ref().map(|w| w.contig::<T>("norm")).transpose()?;
                let bs = b.as_ref().map(|b| b.contig::<T>("norm")).transpose()?;
                let spec = k::NormSpec { weight: ws.as_deref(), bias: bs.as_deref(), len: len.max(1), eps: *eps as T, rms: *rms };
                let (mut y, mut mean, mut rstd) = (crate::alloc::uninit::<T>(name, x.numel())?, crate::alloc::uninit::<T>(name, rows)?, crate::alloc::uninit::<T>(name, rows)?);
                k::norm(spec, &xs, &mut y, &mut mean, &mut rstd);
                // SAFETY: the kernel wrote every row and its statistics.
                let (y, mean, rstd) = unsafe { (crate::cpu::assume_init(y), crate::cpu::assume_init(mean), crate::cpu::assume_init(rstd)) };
                let y = back_to(name, Tensor::from_vec(y, x.shape())?, dtype)?;
                Ok(vec![y, Tensor::from_vec(mean, &[rows])?, Tensor::from_vec(rstd, &[rows])?])
            })
        }
        Op::NormBackward {
            rms,
            has_weight,
            has_bias,
        } => {
            let len = last(x);
            let w = if *has_weight {
                Some(to_compute(name, inputs[1])?)
            } else {
                None
            };
            let rest = &inputs[1 + *has_weight as usize..];
            let (g, mean, rstd) = (to_compute(name, rest[0])?, rest[1], rest[2]);
            crate::float_dispatch!(xc.dtype(), T => {
                let xs = xc.contig::<T>("norm_backward")?;
                let ws = w.as_ref().map(|w| w.contig::<T>("norm_backward")).transpose()?;
                let (gs, ms, rs) = (g.contig::<T>("norm_backward")?, mean.contig::<T>("norm_backward")?, rstd.contig::<T>("norm_backward")?);
                let spec = k::NormSpec { weight: ws.as_deref(), bias: None, len: len.max(1), eps: 0 as T, rms: *rms };
                let mut dx = crate::alloc::uninit::<T>(name, x.numel())?;
                let (dw, db) = k::norm_backward(spec, &xs, &gs, &ms, &rs, &mut dx);
                // SAFETY: the kernel wrote every row.
                let dx = unsafe { crate::cpu::assume_init(dx) };
                let mut out = vec![back_to(name, Tensor::from_vec(dx, x.shape())?, dtype)?];
                if *has_weight {
                    out.push(back_to(name, Tensor::from_vec(dw, &[len])?, dtype)?);
                }
                if *has_bias {
                    out.push(back_to(name, Tensor::from_vec(db, &[len])?, dtype)?);
                }
                Ok(out)
            })
        }
        Op::CrossEntropy {
            ignore_index,
            label_smoothing,
        } => {
            let (n, c) = (x.shape()[0], x.shape()[1]);
            let targets = checked_targets(inputs[1], c, *ignore_index)?;
            crate::float_dispatch!(xc.dtype(), T => {
                let spec = k::CrossEntropySpec { classes: c, ignore_index: *ignore_index, smoothing: *label_smoothing as T };
                let mut lse = crate::alloc::filled(name, n, 0 as T)?;
                let loss = k::cross_entropy(spec, &xc.contig::<T>("cross_entropy")?, &targets, &mut lse);
                let valid = targets.iter().filter(|&&t| t != *ignore_index).count();
                let total: f64 = loss.iter().map(|&l| as_f64(l)).sum();
                let mean = Tensor::full(&[], total / valid as f64, dtype)?;
                Ok(vec![mean, Tensor::from_vec(lse, &[n])?])
            })
        }
        Op::CrossEntropyBackward {
            ignore_index,
            label_smoothing,
        } => {
            let c = x.shape()[1];
            let targets = checked_targets(inputs[1], c, *ignore_index)?;
            let valid = targets.iter().filter(|&&t| t != *ignore_index).count();
            let scale = inputs[3].item()? / valid as f64;
            crate::float_dispatch!(xc.dtype(), T => {
                let spec = k::CrossEntropySpec { classes: c, ignore_index: *ignore_index, smoothing: *label_smoothing as T };
                let (xs, lse) = (xc.contig::<T>("cross_entropy")?, inputs[2].contig::<T>("cross_entropy")?);
                let mut dx = crate::alloc::uninit::<T>(name, x.numel())?;
                k::cross_entropy_backward(spec, &xs, &targets, &lse, &mut dx, scale as T);
                // SAFETY: the kernel wrote every row.
                let dx = unsafe { crate::cpu::assume_init(dx) };
                Ok(vec![back_to(name, Tensor::from_vec(dx, x.shape())?, dtype)?])
            })
        }
        Op::Dropout { p, seed, offset } => {
            let (p, seed, offset) = (*p, *seed, *offset);
            let scale = if p >= 1.0 { 0.0 } else { 1.0 / (1.0 - p) };
            crate::float_dispatch!(xc.dtype(), T => {
                let xs = xc.contig::<T>("dropout")?;
                let y: Vec<T> = crate::alloc::collect(name, xs.len(), xs
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| if rng::uniform(seed, offset + i as u64) < p { 0 as T } else { v * scale as T }))?;
                Ok(vec![back_to(name, Tensor::from_vec(y, x.shape())?, dtype)?])
            })
        }
        _ => unreachable!("nn::forward called with {op:?}"),
    }
}

/// Targets as i64, each in `0..c` or equal to `ignore_index`.
fn checked_targets(t: &Tensor, c: usize, ignore_index: i64) -> Result<Vec<i64>> {
    let v = crate::alloc::copy("cross_entropy", &t.contig::<i64>("cross_entropy")?)?;
    if let Some(&bad) = v.iter().find(|&&t| t != ignore_index && (t < 0 || t as usize >= c)) {
        return Err(Error::IndexOutOfRange {
            op: "cross_entropy",
            index: bad,
            size: c,
        });
    }
    Ok(v)
}

pub(super) fn backward(
    op: &Op,
    inputs: &[Tensor],
    output: &Tensor,
    saved: &[Tensor],
    grad: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    let x = &inputs[0];
    Ok(match op {
        Op::Softmax { log } => vec![Some(
            apply_multi(Op::SoftmaxBackward { log: *log }, &[&output.detach(), grad])?.remove(0),
        )],
        Op::Norm {
            rms,
            has_weight,
            has_bias,
            ..
        } => {
            let mut args: Vec<&Tensor> = vec![x];
            if *has_weight {
                args.push(&inputs[1]);
            }
            args.push(grad);
            args.push(&saved[0]);
            args.push(&saved[1]);
            let mut outs = apply_multi(
                Op::NormBackward {
                    rms: *rms,
                    has_weight: *has_weight,
                    has_bias: *has_bias,
                },
                &args,
            )?
            .into_iter();
            let mut grads = vec![outs.next()];
            if *has_weight {
                grads.push(outs.next());
            }
            if *has_bias {
                grads.push(outs.next());
            }
            grads
        }
        Op::CrossEntropy {
            ignore_index,
            label_smoothing,
        } => {
            let op = Op::CrossEntropyBackward {
                ignore_index: *ignore_index,
                label_smoothing: *label_smoothing,
            };
            vec![
                Some(apply_multi(op, &[x, &inputs[1], &saved[0], grad])?.remove(0)),
                None,
            ]
        }
        Op::Dropout { p, seed, offset } => {
            vec![Some(
                apply_multi(
                    Op::Dropout {
                        p: *p,
                        seed: *seed,
                        offset: *offset,
                    },
                    &[grad],
                )?
                .remove(0),
            )]
        }
        _ => unreachable!("nn::backward called with {op:?}"),
    })
}

/// f32 or f64 as f64 (generic, so the dispatch macro's f64 arm needs no `as` cast).
fn as_f64<T: crate::dtype::Element>(v: T) -> f64 {
    v.to_f64()
}
