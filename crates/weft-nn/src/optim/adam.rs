//! Adam with L2 weight decay (`torch.optim.Adam`) and with decoupled weight decay
//! (`torch.optim.AdamW`).

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use weft_core::cpu::pool::{self, Chunks};
use weft_core::{DType, Function, Result, Tensor};

use crate::step_ops::{node_inputs, read_scalars, read_step_count, UpdateInputs, UpdateItem};

use super::{
    check_loaded_names, check_state_shape, collect_work, copy_moment, fma_dispatch, grad_for_update, invalid,
    like_param, missing_state, read_step, split_state, warn_missing_state, FusedFloat, Optimizer, ParamGroup, Work,
    CHUNK, PARALLEL_MIN,
};

/// Hyper-parameters of [`Adam`] other than the learning rate and weight decay (which come with each
/// step and each [`ParamGroup`]). The defaults are PyTorch's `torch.optim.Adam` defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// `(β1, β2)`: decay rates of the first and second moment averages, each in `[0, 1)`
    /// (default `(0.9, 0.999)`).
    pub betas: (f64, f64),
    /// `ε`, added to the bias-corrected root of the second moment, in gradient units (>= 0;
    /// default 1e-8).
    pub eps: f64,
    /// false (default): Adam, the weight decay `λ` is added to the gradient (`g = ∇ + λ p`).
    /// true: AdamW, the parameter decays directly (`p *= 1 - η λ`) and the gradient is left alone.
    pub decoupled: bool,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            betas: (0.9, 0.999),
            eps: 1e-8,
            decoupled: false,
        }
    }
}

impl AdamConfig {
    /// Checks the hyper-parameters: both betas in `[0, 1)`, `eps` finite and >= 0 (PyTorch's rules,
    /// plus finiteness).
    pub fn validate(&self) -> Result<()> {
        let (b1, b2) = self.betas;
        for (i, b) in [(1, b1), (2, b2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(invalid("Adam::new", format!("beta{i} = {b} must be in [0, 1)")));
            }
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(invalid(
                "Adam::new",
                format!("eps {} must be finite and >= 0", self.eps),
            ));
        }
        Ok(())
    }
}

/// Adam as `torch.optim.Adam` / `torch.optim.AdamW` (`amsgrad=False`, `maximize=False`). Per
/// parameter `p` with gradient `∇` and group weight decay `λ`, at learning rate `η`:
///
/// ```text
/// t = t + 1
/// g = ∇ + λ p              (Adam)      or      p = p (1 - η λ)   (AdamW; g = ∇)
/// m = m + (1 - β1) (g - m)            (PyTorch's lerp: β1 m + (1 - β1) g)
/// v = β2 v + (1 - β2) g g
/// p = p - η / (1 - β1^t) · m / (sqrt(v) / sqrt(1 - β2^t) + ε)
/// ```
///
/// The scalars (`1 - η λ`, the bias corrections, the step size) are computed in f64; the
/// elementwise arithmetic runs in the parameter's dtype in the order of PyTorch's single-tensor
/// code. `m` is in gradient units, `v` in squared gradient units.
///
/// State per parameter that has had a gradient: `"{param}.exp_avg"` (`m`), `"{param}.exp_avg_sq"`
/// (`v`), both of the parameter's shape and dtype, and `"{param}.step"` (`t`, the number of updates
/// this parameter has had: it lags behind for a parameter that missed gradients, as in PyTorch).
#[derive(Debug)]
pub struct Adam {
    cfg: AdamConfig,
    state: BTreeMap<String, AdamState>,
    /// Parameter names restored by `load_state`, checked against the next step's groups.
    loaded: Option<BTreeSet<String>>,
}

/// One parameter's moments and step count.
#[derive(Debug)]
struct AdamState {
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: u64,
}

impl Adam {
    /// An Adam (or, with `cfg.decoupled`, AdamW) optimizer with no state yet; errors when `cfg` is
    /// invalid (see [`AdamConfig::validate`]).
    pub fn new(cfg: AdamConfig) -> Result<Adam> {
        cfg.validate()?;
        Ok(Adam {
            cfg,
            state: BTreeMap::new(),
            loaded: None,
        })
    }

    /// AdamW (`torch.optim.AdamW`): decoupled weight decay, with the given `betas` and `eps`. Note
    /// that PyTorch's AdamW default weight decay (0.01) is a [`ParamGroup`] field here.
    pub fn adamw(betas: (f64, f64), eps: f64) -> Result<Adam> {
        Adam::new(AdamConfig {
            betas,
            eps,
            decoupled: true,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamConfig {
        &self.cfg
    }
}

/// Per-step scalars, rounded to the parameter's dtype as PyTorch rounds Python floats.
struct Coefs<T> {
    /// Adam: `λ` (`grad.add(param, alpha=λ)`), `None` when 0.
    l2: Option<T>,
    /// AdamW: `1 - η λ` (`param.mul_(1 - lr * weight_decay)`), `None` when `λ` is 0.
    decay: Option<T>,
    /// `exp_avg.lerp_(grad, 1 - β1)`: the weight `w = 1 - β1`, whether `|w| < 0.5`, and `w - 1`
    /// (computed in `T`, as ATen does).
    lerp_w: T,
    lerp_small: bool,
    lerp_w_minus_one: T,
    beta2: T,
    one_minus_beta2: T,
    /// `sqrt(1 - β2^t)`.
    bias_correction2_sqrt: T,
    eps: T,
    /// `-η / (1 - β1^t)`.
    neg_step_size: T,
}

fma_dispatch! {
    /// The Adam update over one chunk (see [`Adam`]). Each line is one op of PyTorch's
    /// `_single_tensor_adam` with ATen's CPU rounding: `add` with `alpha`, `lerp` and `addcmul` are
    /// fused multiply-adds there (AVX2/AVX-512 builds), `mul`, `div`, `addcdiv` are not.
    fn kernel<T>(p: &mut [T], m: &mut [T], v: &mut [T], grad: &[T], c: &Coefs<T>) {
        for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(grad) {
            let mut pv = *p;
            // `grad.add(param, alpha=weight_decay)`.
            let g = match c.l2 {
                Some(wd) => pv.fma(wd, g),
                None => g,
            };
            // `param.mul_(1 - lr * weight_decay)`.
            if let Some(f) = c.decay {
                pv *= f;
            }
            // `exp_avg.lerp_(grad, w)`: `fma(w, g - m, m)` for |w| < 0.5, else `fma(w - 1, g - m, g)`.
            let mv = if c.lerp_small { c.lerp_w.fma(g - *m, *m) } else { c.lerp_w_minus_one.fma(g - *m, g) };
            // `exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)`.
            let vv = (c.one_minus_beta2 * g).fma(g, *v * c.beta2);
            // `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`.
            let denom = vv.sqrt() / c.bias_correction2_sqrt + c.eps;
            // `param.addcdiv_(exp_avg, denom, value=-step_size)`: self + value * t1 / t2.
            *p = pv + c.neg_step_size * mv / denom;
            *m = mv;
            *v = vv;
        }
    }
}

fn update<T: FusedFloat>(w: &Work, s: &AdamState, cfg: &AdamConfig, lr: f64) -> Result<()> {
    let (b1, b2) = cfg.betas;
    let wd = w.weight_decay;
    // As `_single_tensor_adam` with a float step (`_get_value(step_t)`): Python's `**` is C `pow`.
    let t = s.step as f64;
    let bias_correction1 = 1.0 - b1.powf(t);
    let bias_correction2 = 1.0 - b2.powf(t);
    let step_size = lr / bias_correction1;
    let lerp_w = T::from_f64(1.0 - b1);
    let c = Coefs {
        l2: (wd != 0.0 && !cfg.decoupled).then(|| T::from_f64(wd)),
        decay: (wd != 0.0 && cfg.decoupled).then(|| T::from_f64(1.0 - lr * wd)),
        lerp_w,
        lerp_small: lerp_w.abs() < T::from_f64(0.5),
        lerp_w_minus_one: lerp_w - T::from_f64(1.0),
        beta2: T::from_f64(b2),
        one_minus_beta2: T::from_f64(1.0 - b2),
        bias_correction2_sqrt: T::from_f64(bias_correction2.powf(0.5)),
        eps: T::from_f64(cfg.eps),
        neg_step_size: T::from_f64(-step_size),
    };
    if w.param.device().is_cuda() {
        let f = |x: T| x.to_f64();
        let scalars = weft_core::cuda::optim::AdamScalars {
            l2: c.l2.map(f),
            decay: c.decay.map(f),
            lerp_w: f(c.lerp_w),
            lerp_small: c.lerp_small,
            lerp_w_minus_one: f(c.lerp_w_minus_one),
            beta2: f(c.beta2),
            one_minus_beta2: f(c.one_minus_beta2),
            bias_correction2_sqrt: f(c.bias_correction2_sqrt),
            eps: f(c.eps),
            neg_step_size: f(c.neg_step_size),
        };
        return weft_core::cuda::optim::adam_step(w.param, &s.exp_avg, &s.exp_avg_sq, &w.grad, &scalars);
    }
    let parallel = w.param.numel() >= PARALLEL_MIN;
    w.param.with_data_mut::<T, _>(|ps| {
        s.exp_avg.with_data_mut::<T, _>(|ms| {
            s.exp_avg_sq.with_data_mut::<T, _>(|vs| {
                w.grad.with_data::<T, _>(|gs| {
                    if parallel {
                        let (pc, mc, vc) = (Chunks::new(ps, CHUNK), Chunks::new(ms, CHUNK), Chunks::new(vs, CHUNK));
                        pool::run(pc.count(), |i| {
                            // SAFETY: `run` calls each chunk once.
                            let (p, m, v) = unsafe { (pc.take(i), mc.take(i), vc.take(i)) };
                            kernel(p, m, v, &gs[i * CHUNK..][..p.len()], &c)
                        });
                    } else {
                        kernel(ps, ms, vs, gs, &c);
                    }
                })
            })?
        })?
    })??;
    Ok(())
}

const FIELDS: &[&str] = &["exp_avg", "exp_avg_sq", "step"];

/// Adam's update of several parameters as one graph node: inputs `[lr, loss, norm]` then
/// `[param, grad, exp_avg, exp_avg_sq, step]` per parameter; the gradients clipped in place
/// when `max_norm` says so, the parameters and moments written in place by [`update`], one
/// parallel job over the parameters as [`Adam::step`]. Its output (0-d f64) is 1 when it
/// updated, 0 when the loss or norm was not finite.
struct AdamUpdateFn {
    cfg: AdamConfig,
    weight_decays: Vec<f64>,
    max_norm: Option<f64>,
}

/// Inputs per parameter of [`AdamUpdateFn`].
const ADAM_PER_PARAM: usize = 5;

impl Function for AdamUpdateFn {
    fn name(&self) -> &'static str {
        "adam_update"
    }

    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let Some((lr, coef)) = read_scalars(inputs, self.max_norm)? else {
            return Ok(Tensor::scalar(0.0f64));
        };
        let of = |i: usize| &inputs[3 + ADAM_PER_PARAM * i..][..ADAM_PER_PARAM];
        let n = self.weight_decays.len();
        let states = (0..n)
            .map(|i| {
                let x = of(i);
                Ok(AdamState {
                    exp_avg: x[2].clone(),
                    exp_avg_sq: x[3].clone(),
                    step: read_step_count(x[4])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let grads = crate::step_ops::own_gradients((0..n).map(|i| of(i)[1]))?;
        let cfg = &self.cfg;
        let one = |i: usize| -> Result<()> {
            let (param, grad) = (of(i)[0], &grads[i]);
            // clipping first, in place, as the eager step's `clip_to_norm`
            if let Some(c) = coef {
                crate::clip::scale(grad, c)?;
            }
            let w = Work {
                name: "",
                param,
                grad: grad_for_update(param, grad)?,
                weight_decay: self.weight_decays[i],
            };
            match param.dtype() {
                DType::F32 => update::<f32>(&w, &states[i], cfg, lr),
                _ => update::<f64>(&w, &states[i], cfg, lr),
            }
        };
        if (0..n).any(|i| of(i)[0].device().is_cuda()) {
            (0..n).try_for_each(one)?;
        } else {
            pool::map(n, one).into_iter().collect::<Result<()>>()?;
        }
        Ok(Tensor::scalar(1.0f64))
    }

    fn backward(&self, _: &[Tensor], _: &Tensor, _: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Err(invalid("adam_update", "an optimizer update has no gradient"))
    }
}

impl Optimizer for Adam {
    fn step(&mut self, groups: &[ParamGroup], lr: f64) -> Result<()> {
        const OP: &str = "Adam::step";
        let (work, names) = collect_work(OP, groups, lr)?;
        if let Some(loaded) = &self.loaded {
            check_loaded_names(OP, loaded, &names)?;
            warn_missing_state(OP, &missing_state(loaded, &names));
        }
        for w in &work {
            if let Some(s) = self.state.get(w.name) {
                check_state_shape(OP, &format!("{}.exp_avg", w.name), &s.exp_avg, w.name, w.param)?;
                check_state_shape(OP, &format!("{}.exp_avg_sq", w.name), &s.exp_avg_sq, w.name, w.param)?;
            }
        }
        for w in &work {
            let dtype = w.param.dtype();
            if !matches!(dtype, DType::F32 | DType::F64) {
                return Err(invalid(
                    OP,
                    format!("parameter {:?}: unsupported dtype {}", w.name, dtype.name()),
                ));
            }
        }
        self.loaded = None;
        for w in &work {
            let s = match self.state.entry(w.name.to_string()) {
                Entry::Occupied(e) => {
                    let s = e.into_mut();
                    s.exp_avg = like_param(&s.exp_avg, w.param)?;
                    s.exp_avg_sq = like_param(&s.exp_avg_sq, w.param)?;
                    s
                }
                Entry::Vacant(e) => e.insert(AdamState {
                    exp_avg: Tensor::zeros_like(w.param)?,
                    exp_avg_sq: Tensor::zeros_like(w.param)?,
                    step: 0,
                }),
            };
            s.step += 1;
        }
        // One parallel job over the parameters (a parameter's update inside it runs on one
        // thread): most of a model's tensors are too small to split, and updated one after the
        // other they would leave the pool idle.
        let states: Vec<&AdamState> = work.iter().map(|w| &self.state[w.name]).collect();
        let cfg = &self.cfg;
        let one = |i: usize| match work[i].param.dtype() {
            DType::F32 => update::<f32>(&work[i], states[i], cfg, lr),
            _ => update::<f64>(&work[i], states[i], cfg, lr),
        };
        if work.iter().any(|w| w.param.device().is_cuda()) {
            // One kernel per parameter, queued in order on the GPU's stream.
            return (0..work.len()).try_for_each(one);
        }
        pool::map(work.len(), one).into_iter().collect()
    }

    fn update_node(&self, items: &[UpdateItem], inputs: &UpdateInputs) -> Result<Option<Tensor>> {
        if self.loaded.is_some() {
            return Ok(None);
        }
        let mut states = Vec::with_capacity(items.len());
        for item in items {
            let Some(s) = self.state.get(item.name) else {
                return Ok(None);
            };
            let p = item.param;
            let fits = |t: &Tensor| t.shape() == p.shape() && t.dtype() == p.dtype() && t.device() == p.device();
            let usable = matches!(p.dtype(), DType::F32 | DType::F64)
                && p.is_contiguous()
                && fits(item.grad)
                && fits(&s.exp_avg)
                && fits(&s.exp_avg_sq)
                && item.weight_decay.is_finite()
                && item.weight_decay >= 0.0;
            if !usable {
                return Ok(None);
            }
            states.push(s);
        }
        let mut args = node_inputs(inputs)?;
        for (item, s) in items.iter().zip(states) {
            args.extend([item.param, item.grad, &s.exp_avg, &s.exp_avg_sq, item.step]);
        }
        let f = AdamUpdateFn {
            cfg: self.cfg,
            weight_decays: items.iter().map(|i| i.weight_decay).collect(),
            max_norm: inputs.max_norm,
        };
        Tensor::apply_function(Arc::new(f), &args).map(Some)
    }

    fn next_step(&self, name: &str) -> Option<u64> {
        match &self.loaded {
            Some(_) => None,
            None => self.state.get(name).map(|s| s.step + 1),
        }
    }

    fn count_updates(&mut self, names: &[&str]) {
        for name in names {
            if let Some(s) = self.state.get_mut(*name) {
                s.step += 1;
            }
        }
    }

    fn state(&self) -> Vec<(String, Tensor)> {
        let copy = |t: &Tensor| t.contiguous_copy().expect("a copy of a CPU tensor");
        let mut out = Vec::with_capacity(3 * self.state.len());
        for (name, s) in &self.state {
            out.push((format!("{name}.exp_avg"), copy(&s.exp_avg)));
            out.push((format!("{name}.exp_avg_sq"), copy(&s.exp_avg_sq)));
            out.push((format!("{name}.step"), Tensor::scalar(s.step as f64)));
        }
        out
    }

    fn state_bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.numel() * t.dtype().size_in_bytes();
        // the step count is saved as one f64
        self.state
            .values()
            .map(|s| bytes(&s.exp_avg) + bytes(&s.exp_avg_sq) + 8)
            .sum()
    }

    fn load_state(&mut self, state: &BTreeMap<String, Tensor>) -> Result<()> {
        const OP: &str = "Adam::load_state";
        let by_param = split_state(OP, state, FIELDS)?;
        let mut restored = BTreeMap::new();
        for (param, t) in by_param {
            let avg_key = format!("{param}.exp_avg");
            let avg = t["exp_avg"];
            let exp_avg = copy_moment(OP, &avg_key, avg, avg.shape(), &avg_key)?;
            let exp_avg_sq = copy_moment(
                OP,
                &format!("{param}.exp_avg_sq"),
                t["exp_avg_sq"],
                avg.shape(),
                &avg_key,
            )?;
            let step = read_step(OP, &format!("{param}.step"), t["step"])?;
            restored.insert(
                param.to_string(),
                AdamState {
                    exp_avg,
                    exp_avg_sq,
                    step,
                },
            );
        }
        self.loaded = Some(restored.keys().cloned().collect());
        self.state = restored;
        Ok(())
    }
}
