//! Stochastic gradient descent with momentum, dampening and Nesterov momentum: `torch.optim.SGD`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use weft_core::cpu::pool::{self, Chunks};
use weft_core::{DType, Function, Result, Tensor};

use crate::step_ops::{node_inputs, read_scalars, UpdateInputs, UpdateItem};

use super::{
    check_loaded_names, check_state_shape, collect_work, copy_moment, fma_dispatch, grad_for_update, invalid,
    like_param, missing_state, split_state, warn_missing_state, FusedFloat, Optimizer, ParamGroup, Work, CHUNK,
    PARALLEL_MIN,
};

/// Hyper-parameters of [`Sgd`] other than the learning rate and weight decay (which come with each
/// step and each [`ParamGroup`]). The defaults are PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// Momentum factor `μ` (dimensionless, >= 0; default 0.0: plain SGD, no momentum buffer).
    pub momentum: f64,
    /// Dampening `τ` of the gradient added to the momentum buffer (dimensionless; default 0.0).
    pub dampening: f64,
    /// Nesterov momentum (default false). Requires `momentum > 0` and `dampening == 0`.
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> Self {
        SgdConfig {
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
        }
    }
}

impl SgdConfig {
    /// Checks the hyper-parameters: `momentum` finite and >= 0, `dampening` finite, and for
    /// Nesterov momentum `momentum > 0` and `dampening == 0` (PyTorch's rules).
    pub fn validate(&self) -> Result<()> {
        let SgdConfig {
            momentum,
            dampening,
            nesterov,
        } = *self;
        if !(momentum.is_finite() && momentum >= 0.0) {
            return Err(invalid(
                "Sgd::new",
                format!("momentum {momentum} must be finite and >= 0"),
            ));
        }
        if !dampening.is_finite() {
            return Err(invalid("Sgd::new", format!("dampening {dampening} must be finite")));
        }
        if nesterov && (momentum <= 0.0 || dampening != 0.0) {
            return Err(invalid(
                "Sgd::new",
                format!("Nesterov momentum requires momentum > 0 and dampening == 0, got {momentum} and {dampening}"),
            ));
        }
        Ok(())
    }
}

/// SGD as `torch.optim.SGD` (`maximize=False`). Per parameter `p` with gradient `∇` and group weight
/// decay `λ`, at learning rate `η`:
///
/// ```text
/// g = ∇ + λ p
/// if μ != 0:  b = g                    on the parameter's first step
///             b = μ b + (1 - τ) g      afterwards
///             g = g + μ b  (Nesterov)  or  g = b
/// p = p - η g
/// ```
///
/// State: the momentum buffer `b` (`"{param}.momentum_buffer"`, the parameter's shape and dtype) when
/// `μ != 0`; no step count (SGD does not need one).
#[derive(Debug)]
pub struct Sgd {
    cfg: SgdConfig,
    buffers: BTreeMap<String, Tensor>,
    /// Parameter names restored by `load_state`, checked against the next step's groups.
    loaded: Option<BTreeSet<String>>,
}

impl Sgd {
    /// An SGD optimizer with no state yet; errors when `cfg` is invalid (see [`SgdConfig::validate`]).
    pub fn new(cfg: SgdConfig) -> Result<Sgd> {
        cfg.validate()?;
        Ok(Sgd {
            cfg,
            buffers: BTreeMap::new(),
            loaded: None,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &SgdConfig {
        &self.cfg
    }
}

/// Per-step scalars, rounded to the parameter's dtype as PyTorch rounds Python floats.
struct Coefs<T> {
    /// `λ`, or `None` when it is 0 (PyTorch skips the add).
    weight_decay: Option<T>,
    momentum: T,
    /// `1 - τ`.
    one_minus_dampening: T,
    nesterov: bool,
    /// The buffer is new: `b = g`.
    first: bool,
    /// `-η`.
    neg_lr: T,
}

impl<T: FusedFloat> Coefs<T> {
    /// `grad.add(param, alpha=λ)`: ATen's `add` with `alpha` is a fused multiply-add.
    #[inline(always)]
    fn decayed(&self, g: T, p: T) -> T {
        match self.weight_decay {
            Some(wd) => p.fma(wd, g),
            None => g,
        }
    }
}

fma_dispatch! {
    /// `p -= η (∇ + λ p)` over one chunk: `param.add_(grad, alpha=-lr)`.
    fn plain_kernel<T>(p: &mut [T], grad: &[T], c: &Coefs<T>) {
        for (p, &g) in p.iter_mut().zip(grad) {
            let g = c.decayed(g, *p);
            *p = g.fma(c.neg_lr, *p);
        }
    }
}

fma_dispatch! {
    /// The momentum update over one chunk (see [`Sgd`]), op by op as `_single_tensor_sgd`.
    fn momentum_kernel<T>(p: &mut [T], buf: &mut [T], grad: &[T], c: &Coefs<T>) {
        for ((p, b), &g) in p.iter_mut().zip(buf.iter_mut()).zip(grad) {
            let g = c.decayed(g, *p);
            // `buf.mul_(momentum).add_(grad, alpha=1 - dampening)`.
            *b = if c.first { g } else { g.fma(c.one_minus_dampening, *b * c.momentum) };
            // `grad.add(buf, alpha=momentum)` or `buf`.
            let d = if c.nesterov { b.fma(c.momentum, g) } else { *b };
            *p = d.fma(c.neg_lr, *p);
        }
    }
}

fn update<T: FusedFloat>(w: &Work, buf: Option<&Tensor>, cfg: &SgdConfig, lr: f64, first: bool) -> Result<()> {
    let c = Coefs {
        weight_decay: (w.weight_decay != 0.0).then(|| T::from_f64(w.weight_decay)),
        momentum: T::from_f64(cfg.momentum),
        one_minus_dampening: T::from_f64(1.0 - cfg.dampening),
        nesterov: cfg.nesterov,
        first,
        neg_lr: T::from_f64(-lr),
    };
    if w.param.device().is_cuda() {
        let f = |x: T| x.to_f64();
        let scalars = weft_core::cuda::optim::SgdScalars {
            weight_decay: c.weight_decay.map(f),
            momentum: f(c.momentum),
            one_minus_dampening: f(c.one_minus_dampening),
            nesterov: c.nesterov,
            first: c.first,
            neg_lr: f(c.neg_lr),
        };
        return weft_core::cuda::optim::sgd_step(w.param, buf, &w.grad, &scalars);
    }
    let parallel = w.param.numel() >= PARALLEL_MIN;
    w.param.with_data_mut::<T, _>(|ps| match buf {
        None => w.grad.with_data::<T, _>(|gs| {
            if parallel {
                pool::for_each_chunk(ps, CHUNK, |i, p| plain_kernel(p, &gs[i * CHUNK..][..p.len()], &c));
            } else {
                plain_kernel(ps, gs, &c);
            }
        }),
        Some(buf) => buf.with_data_mut::<T, _>(|bs| {
            w.grad.with_data::<T, _>(|gs| {
                if parallel {
                    let (pc, bc) = (Chunks::new(ps, CHUNK), Chunks::new(bs, CHUNK));
                    pool::run(pc.count(), |i| {
                        // SAFETY: `run` calls each chunk once.
                        let (p, b) = unsafe { (pc.take(i), bc.take(i)) };
                        momentum_kernel(p, b, &gs[i * CHUNK..][..p.len()], &c)
                    });
                } else {
                    momentum_kernel(ps, bs, gs, &c);
                }
            })
        })?,
    })?
}

const FIELDS: &[&str] = &["momentum_buffer"];

/// SGD's update of several parameters as one graph node: inputs `[lr, loss, norm]` then
/// `[param, grad, step]` per parameter, with its momentum buffer after the gradient when there
/// is momentum; the gradients clipped in place when `max_norm` says so, the parameters and
/// buffers written in place by [`update`] (never a buffer's first step: the node is made once
/// the buffers exist), one parameter after another as [`Sgd::step`]. Its output (0-d f64) is 1
/// when it updated, 0 when the loss or norm was not finite.
struct SgdUpdateFn {
    cfg: SgdConfig,
    weight_decays: Vec<f64>,
    max_norm: Option<f64>,
}

impl Function for SgdUpdateFn {
    fn name(&self) -> &'static str {
        "sgd_update"
    }

    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let Some((lr, coef)) = read_scalars(inputs, self.max_norm)? else {
            return Ok(Tensor::scalar(0.0f64));
        };
        let momentum = self.cfg.momentum != 0.0;
        let per = if momentum { 4 } else { 3 };
        let of = |i: usize| &inputs[3 + per * i..][..per];
        let grads = crate::step_ops::own_gradients((0..self.weight_decays.len()).map(|i| of(i)[1]))?;
        // the eager step clips every gradient first, then updates
        if let Some(c) = coef {
            grads.iter().try_for_each(|g| crate::clip::scale(g, c))?;
        }
        for (i, &weight_decay) in self.weight_decays.iter().enumerate() {
            let x = of(i);
            let (param, grad) = (x[0], &grads[i]);
            let buf = momentum.then(|| x[2]);
            let w = Work {
                name: "",
                param,
                grad: grad_for_update(param, grad)?,
                weight_decay,
            };
            match param.dtype() {
                DType::F32 => update::<f32>(&w, buf, &self.cfg, lr, false)?,
                _ => update::<f64>(&w, buf, &self.cfg, lr, false)?,
            }
        }
        Ok(Tensor::scalar(1.0f64))
    }

    fn backward(&self, _: &[Tensor], _: &Tensor, _: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Err(invalid("sgd_update", "an optimizer update has no gradient"))
    }
}

impl Optimizer for Sgd {
    fn step(&mut self, groups: &[ParamGroup], lr: f64) -> Result<()> {
        const OP: &str = "Sgd::step";
        let (work, names) = collect_work(OP, groups, lr)?;
        let use_momentum = self.cfg.momentum != 0.0;
        if let Some(loaded) = &self.loaded {
            check_loaded_names(OP, loaded, &names)?;
            if use_momentum {
                warn_missing_state(OP, &missing_state(loaded, &names));
            }
        }
        if use_momentum {
            for w in &work {
                if let Some(b) = self.buffers.get(w.name) {
                    check_state_shape(OP, &format!("{}.momentum_buffer", w.name), b, w.name, w.param)?;
                }
            }
        }
        self.loaded = None;
        for w in &work {
            let dtype = w.param.dtype();
            let (buf, first) = if !use_momentum {
                (None, false)
            } else if let Some(b) = self.buffers.get_mut(w.name) {
                *b = like_param(b, w.param)?;
                (Some(b.clone()), false)
            } else {
                let b = Tensor::zeros_like(w.param)?;
                self.buffers.insert(w.name.to_string(), b.clone());
                (Some(b), true)
            };
            match dtype {
                DType::F32 => update::<f32>(w, buf.as_ref(), &self.cfg, lr, first)?,
                DType::F64 => update::<f64>(w, buf.as_ref(), &self.cfg, lr, first)?,
                other => {
                    return Err(invalid(
                        OP,
                        format!("parameter {:?}: unsupported dtype {}", w.name, other.name()),
                    ))
                }
            }
        }
        Ok(())
    }

    fn update_node(&self, items: &[UpdateItem], inputs: &UpdateInputs) -> Result<Option<Tensor>> {
        let mut args = node_inputs(inputs)?;
        for item in items {
            let p = item.param;
            if self.next_step(item.name).is_none() {
                return Ok(None);
            }
            let fits = |t: &Tensor| t.shape() == p.shape() && t.dtype() == p.dtype() && t.device() == p.device();
            let buf = self.buffers.get(item.name);
            let usable = matches!(p.dtype(), DType::F32 | DType::F64)
                && p.is_contiguous()
                && fits(item.grad)
                && buf.is_none_or(fits)
                && item.weight_decay.is_finite()
                && item.weight_decay >= 0.0;
            if !usable {
                return Ok(None);
            }
            args.extend([item.param, item.grad]);
            args.extend(buf);
            args.push(item.step);
        }
        let f = SgdUpdateFn {
            cfg: self.cfg,
            weight_decays: items.iter().map(|i| i.weight_decay).collect(),
            max_norm: inputs.max_norm,
        };
        Tensor::apply_function(Arc::new(f), &args).map(Some)
    }

    /// SGD counts no steps: 1 when an update node can be made (always without momentum; with
    /// it, once the parameter's buffer exists).
    fn next_step(&self, name: &str) -> Option<u64> {
        let ready = self.loaded.is_none() && (self.cfg.momentum == 0.0 || self.buffers.contains_key(name));
        ready.then_some(1)
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        self.buffers
            .iter()
            .map(|(name, b)| {
                (
                    format!("{name}.momentum_buffer"),
                    b.contiguous_copy().expect("a copy of a CPU tensor"),
                )
            })
            .collect()
    }

    fn state_bytes(&self) -> usize {
        self.buffers
            .values()
            .map(|b| b.numel() * b.dtype().size_in_bytes())
            .sum()
    }

    fn load_state(&mut self, state: &BTreeMap<String, Tensor>) -> Result<()> {
        const OP: &str = "Sgd::load_state";
        let fields: &[&str] = if self.cfg.momentum != 0.0 { FIELDS } else { &[] };
        let by_param = split_state(OP, state, fields)?;
        let mut buffers = BTreeMap::new();
        for (param, t) in by_param {
            let key = format!("{param}.momentum_buffer");
            let b = t["momentum_buffer"];
            buffers.insert(param.to_string(), copy_moment(OP, &key, b, b.shape(), &key)?);
        }
        self.loaded = Some(buffers.keys().cloned().collect());
        self.buffers = buffers;
        Ok(())
    }
}
