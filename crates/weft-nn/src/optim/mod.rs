//! Optimizers with PyTorch's update rules: [`Sgd`] (`torch.optim.SGD`) and [`Adam`]
//! (`torch.optim.Adam`, and `torch.optim.AdamW` with `decoupled: true`).
//!
//! An optimizer owns its state (moments, momentum buffers, step counts) keyed by parameter name;
//! the parameters themselves are passed to every [`Optimizer::step`] as [`ParamGroup`]s, together
//! with the learning rate of that step (from a [`crate::schedule::Schedule`]).
//!
//! Each step updates every parameter in place in one fused pass over its elements: the gradient is
//! read and the parameter and its state are written in a single loop (split into chunks over the
//! compute pool for large parameters; every element is computed independently, so the result does
//! not depend on the split). The elementwise arithmetic runs in the parameter's dtype (f32 or f64)
//! in the order of PyTorch's single-tensor (`foreach=False`) code, one ATen op after another with
//! ATen's CPU roundings: each scalar coefficient is computed in f64 and rounded to the parameter's
//! dtype as PyTorch rounds a Python float, and `add` with `alpha`, `lerp` and `addcmul` are fused
//! multiply-adds, as they are in PyTorch's AVX2/AVX-512 kernels (weft compiles each loop twice and
//! picks the AVX2+FMA copy at run time; without FMA hardware, `mul_add` gives the same numbers more
//! slowly). SGD trajectories match PyTorch's bit for bit; Adam's differ in the last bit for a few
//! elements only because PyTorch's x86 `sqrt` is not correctly rounded (weft's is IEEE `sqrt`).
//! See `tests/optim.rs`.
//!
//! A step first checks every parameter, gradient and state tensor, and only then changes anything:
//! an error leaves parameters and state as they were.

use std::collections::{BTreeMap, BTreeSet};

use weft_core::storage::StorageElement;
use weft_core::{DType, Error, Float, Result, Tensor};

pub mod adam;
pub mod sgd;

pub use adam::{Adam, AdamConfig};
pub use sgd::{Sgd, SgdConfig};

/// Parameters that share hyper-parameters (PyTorch's `param_groups`). The learning rate is not
/// stored here: it is an argument of [`Optimizer::step`].
#[derive(Clone, Debug)]
pub struct ParamGroup {
    /// `(name, parameter)` pairs, as [`crate::Module::parameters`] returns them. The name keys the
    /// optimizer state (`"{name}.exp_avg"`, ...), so it must be unique across all groups of a step.
    pub params: Vec<(String, Tensor)>,
    /// L2 penalty coefficient (dimensionless, >= 0): added to the gradient as `weight_decay * p`
    /// (SGD, Adam), or applied to the parameter as `p *= 1 - lr * weight_decay` (AdamW).
    pub weight_decay: f64,
}

impl ParamGroup {
    /// A group of `params` with the given `weight_decay`.
    pub fn new(params: Vec<(String, Tensor)>, weight_decay: f64) -> Self {
        ParamGroup { params, weight_decay }
    }
}

/// An optimizer: updates parameters in place from their gradients.
pub trait Optimizer: Send {
    /// One update of every parameter that has a gradient (parameters without `.grad()` are skipped,
    /// as PyTorch does), with learning rate `lr` (in parameter units per gradient unit for SGD, in
    /// parameter units for Adam's normalized step).
    ///
    /// Errors (before anything is changed): `lr` or a `weight_decay` negative or not finite; a
    /// parameter name repeated; a parameter that is not f32/f64 or not contiguous; a gradient whose
    /// shape or dtype differs from its parameter's; state (restored by
    /// [`Optimizer::load_state`]) whose shape differs from its parameter's, or that names a
    /// parameter none of `groups` has.
    fn step(&mut self, groups: &[ParamGroup], lr: f64) -> Result<()>;

    /// The optimizer state as named tensors for checkpoints, sorted by name: per parameter
    /// `"{param}.exp_avg"`, `"{param}.exp_avg_sq"` and `"{param}.step"` (Adam) or
    /// `"{param}.momentum_buffer"` (SGD with momentum). Moments have the parameter's shape and
    /// dtype; a step count is a 0-d f64 tensor holding an integer (PyTorch keeps it per parameter
    /// too, as a 0-d float32). Parameters that never had a gradient have no state. The tensors are
    /// copies: later steps do not change them.
    fn state(&self) -> Vec<(String, Tensor)>;

    /// Replaces the state with `state()` output (for example read back from a checkpoint). The
    /// tensors are copied. Every key must be `"{param}.{field}"` with a field this optimizer keeps,
    /// and each parameter's fields must be complete and of one shape; errors name the missing or
    /// mismatched tensor (and both shapes). Shapes against the parameters themselves, and that
    /// every restored name is a parameter, are checked by the next [`Optimizer::step`]. Moments
    /// are cast to the parameter's dtype there, as PyTorch's `load_state_dict` does.
    fn load_state(&mut self, state: &BTreeMap<String, Tensor>) -> Result<()>;

    /// Compiled mode: this step's update of `items` (the parameters that have a gradient) as
    /// one node a graph can capture (a custom function that, when it runs, clips the gradients
    /// in place when `inputs.max_norm` says so and writes the parameters and their state in
    /// place; see [`crate::step_ops`]): the arithmetic of [`crate::clip::clip_to_norm`] and
    /// [`Optimizer::step`], one parallel job over the parameters, the learning rate and step
    /// counts read from the inputs, nothing changed when the step's loss or gradient norm is not
    /// finite. The node holds the state's tensors, so a graph that captured it updates them at
    /// every replay; the caller counts the updates with [`Optimizer::count_updates`]. Run it
    /// under `no_grad`. `Ok(None)` when this optimizer has no such node, when an item has no
    /// state yet (its first update, by `step`, makes it), when the state was just restored by
    /// `load_state` (`step` checks it first), or when a parameter, its gradient and its state do
    /// not fit together (`step` names the problem).
    fn update_node(
        &self,
        _items: &[crate::step_ops::UpdateItem],
        _inputs: &crate::step_ops::UpdateInputs,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }

    /// The step count parameter `name`'s next update uses (its updates so far plus one), when it
    /// has state an update node can use.
    fn next_step(&self, _name: &str) -> Option<u64> {
        None
    }

    /// Counts one update of each parameter in `names`, made by update nodes, as `step` counts
    /// its own.
    fn count_updates(&mut self, _names: &[&str]) {}

    /// Bytes the state holds now (moments and step counts), without copying it.
    fn state_bytes(&self) -> usize {
        self.state()
            .iter()
            .map(|(_, t)| t.numel() * t.dtype().size_in_bytes())
            .sum()
    }
}

/// Parameters with at least this many elements are updated in chunks in parallel on the compute pool.
pub(crate) const PARALLEL_MIN: usize = 1 << 16;
/// Elements per parallel chunk.
pub(crate) const CHUNK: usize = 1 << 14;

/// A float type the update kernels run in (f32, f64), with a fused multiply-add.
pub(crate) trait FusedFloat: Float + StorageElement {
    /// `self * a + b` with one rounding (IEEE fused multiply-add).
    fn fma(self, a: Self, b: Self) -> Self;
}

impl FusedFloat for f32 {
    #[inline(always)]
    fn fma(self, a: Self, b: Self) -> Self {
        self.mul_add(a, b)
    }
}

impl FusedFloat for f64 {
    #[inline(always)]
    fn fma(self, a: Self, b: Self) -> Self {
        self.mul_add(a, b)
    }
}

/// True when the CPU has the FMA instructions (checked once by std, then cached).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// Defines `fn $name<T: FusedFloat>(args)` whose body is compiled twice on x86_64: with AVX2+FMA
/// (chosen at run time when the CPU has them, so `fma` is one instruction and the loop vectorizes)
/// and without (where `fma` is a call to libm's correctly rounded `fma`: the same results, slower).
/// Other architectures (aarch64) have FMA in their baseline.
macro_rules! fma_dispatch {
    ($(#[$meta:meta])* fn $name:ident<$T:ident>($($arg:ident : $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        fn $name<$T: $crate::optim::FusedFloat>($($arg: $ty),*) {
            #[inline(always)]
            fn body<$T: $crate::optim::FusedFloat>($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn v3<$T: $crate::optim::FusedFloat>($($arg: $ty),*) {
                    body::<$T>($($arg),*)
                }
                if $crate::optim::has_fma() {
                    // SAFETY: the CPU supports the features v3 was compiled for.
                    return unsafe { v3::<$T>($($arg),*) };
                }
            }
            body::<$T>($($arg),*)
        }
    };
}
pub(crate) use fma_dispatch;

/// A parameter that takes part in a step: validated, with its gradient.
pub(crate) struct Work<'a> {
    pub name: &'a str,
    pub param: &'a Tensor,
    pub grad: Tensor,
    pub weight_decay: f64,
}

/// The gradient an update reads: a copy when it views the parameter's storage (the update holds
/// the parameter's storage for writing while it reads the gradient) or when a GPU update needs
/// it contiguous, else itself.
pub(crate) fn grad_for_update(param: &Tensor, grad: &Tensor) -> Result<Tensor> {
    if grad.same_storage(param) || (param.device().is_cuda() && !grad.is_contiguous()) {
        grad.contiguous_copy()
    } else {
        Ok(grad.clone())
    }
}

/// Checks `lr`, every group's weight decay, names, dtypes, contiguity and gradient shapes, and
/// returns the parameters that have a gradient in order, plus the set of all parameter names.
pub(crate) fn collect_work<'a>(
    op: &'static str,
    groups: &'a [ParamGroup],
    lr: f64,
) -> Result<(Vec<Work<'a>>, BTreeSet<&'a str>)> {
    if !(lr.is_finite() && lr >= 0.0) {
        return Err(invalid(op, format!("learning rate {lr} must be finite and >= 0")));
    }
    let mut work = Vec::new();
    let mut names = BTreeSet::new();
    for (gi, group) in groups.iter().enumerate() {
        let wd = group.weight_decay;
        if !(wd.is_finite() && wd >= 0.0) {
            return Err(invalid(
                op,
                format!("param group {gi}: weight_decay {wd} must be finite and >= 0"),
            ));
        }
        for (name, param) in &group.params {
            if !names.insert(name.as_str()) {
                return Err(invalid(
                    op,
                    format!("parameter {name:?} appears more than once in the param groups"),
                ));
            }
            let Some(grad) = param.grad() else { continue };
            if !matches!(param.dtype(), DType::F32 | DType::F64) {
                return Err(invalid(
                    op,
                    format!(
                        "parameter {name:?} has dtype {}; only float32 and float64 are supported",
                        param.dtype().name()
                    ),
                ));
            }
            if !param.is_contiguous() {
                return Err(invalid(
                    op,
                    format!("parameter {name:?} (shape {:?}) is not contiguous", param.shape()),
                ));
            }
            if grad.shape() != param.shape() {
                return Err(invalid(
                    op,
                    format!(
                        "gradient of {name:?} has shape {:?}, the parameter {:?}",
                        grad.shape(),
                        param.shape()
                    ),
                ));
            }
            if grad.dtype() != param.dtype() {
                return Err(invalid(
                    op,
                    format!(
                        "gradient of {name:?} has dtype {}, the parameter {}",
                        grad.dtype().name(),
                        param.dtype().name()
                    ),
                ));
            }
            if grad.device() != param.device() {
                return Err(invalid(
                    op,
                    format!(
                        "gradient of {name:?} lives on {}, the parameter on {}",
                        grad.device(),
                        param.device()
                    ),
                ));
            }
            let grad = grad_for_update(param, &grad)?;
            work.push(Work {
                name,
                param,
                grad,
                weight_decay: wd,
            });
        }
    }
    Ok((work, names))
}

/// After [`Optimizer::load_state`]: every restored parameter name must be among the step's.
pub(crate) fn check_loaded_names(op: &'static str, loaded: &BTreeSet<String>, names: &BTreeSet<&str>) -> Result<()> {
    match loaded.iter().find(|n| !names.contains(n.as_str())) {
        Some(n) => Err(invalid(
            op,
            format!("restored optimizer state names parameter {n:?}, which is in none of the param groups"),
        )),
        None => Ok(()),
    }
}

/// After [`Optimizer::load_state`]: the step's parameters the restored state holds nothing for,
/// in name order (they start from zero, as in a fresh run, so the run no longer continues the
/// saved one exactly: an optimizer state with entries dropped from its checkpoint resumed
/// without a word).
pub(crate) fn missing_state<'a>(loaded: &BTreeSet<String>, names: &BTreeSet<&'a str>) -> Vec<&'a str> {
    names.iter().copied().filter(|n| !loaded.contains(*n)).collect()
}

/// Says on stderr (once per restore) which parameters the restored state of `op` misses.
pub(crate) fn warn_missing_state(op: &str, missing: &[&str]) {
    if let Some(first) = missing.first() {
        let more = match missing.len() {
            1 => String::new(),
            n => format!(" and {} more", n - 1),
        };
        weft_core::errln!(
            "weft: warning: {op}: the restored optimizer state holds nothing for parameter {first:?}{more}; \
             that state starts from zero, so this run no longer continues the saved one exactly"
        );
    }
}

/// Checks that state tensor `key` has the shape of parameter `name`.
pub(crate) fn check_state_shape(op: &'static str, key: &str, state: &Tensor, name: &str, param: &Tensor) -> Result<()> {
    if state.shape() != param.shape() {
        return Err(invalid(
            op,
            format!(
                "state tensor {key:?} has shape {:?}, but parameter {name:?} has shape {:?}",
                state.shape(),
                param.shape()
            ),
        ));
    }
    Ok(())
}

/// A state tensor in `param`'s dtype and on its device: itself when it already is, a converted
/// copy otherwise.
pub(crate) fn like_param(t: &Tensor, param: &Tensor) -> Result<Tensor> {
    if t.dtype() == param.dtype() && t.device() == param.device() {
        return Ok(t.clone());
    }
    let out = Tensor::zeros_on(t.shape(), param.dtype(), param.device())?;
    out.copy_from(t)?;
    Ok(out)
}

/// Groups `state`'s keys `"{param}.{field}"` by parameter, checking each field is one of `fields`
/// and that every parameter has all of them.
pub(crate) fn split_state<'a>(
    op: &'static str,
    state: &'a BTreeMap<String, Tensor>,
    fields: &[&str],
) -> Result<BTreeMap<&'a str, BTreeMap<&'a str, &'a Tensor>>> {
    let mut by_param: BTreeMap<&str, BTreeMap<&str, &Tensor>> = BTreeMap::new();
    for (key, t) in state {
        let (param, field) = match key.rsplit_once('.') {
            Some((p, f)) if !p.is_empty() && fields.contains(&f) => (p, f),
            _ => {
                return Err(invalid(
                    op,
                    format!(
                    "unexpected state tensor {key:?}: keys are \"{{param}}.{{field}}\" with field one of {fields:?}"
                ),
                ))
            }
        };
        by_param.entry(param).or_default().insert(field, t);
    }
    for (param, got) in &by_param {
        if let Some(missing) = fields.iter().find(|f| !got.contains_key(*f)) {
            let present: Vec<String> = got.keys().map(|f| format!("{param}.{f}")).collect();
            return Err(invalid(
                op,
                format!("state tensor \"{param}.{missing}\" is missing (present: {present:?})"),
            ));
        }
    }
    Ok(by_param)
}

/// A copy of a moment tensor for `load_state`/`state`, checked to be a float tensor of `shape`.
pub(crate) fn copy_moment(op: &'static str, key: &str, t: &Tensor, shape: &[usize], shape_key: &str) -> Result<Tensor> {
    if !t.dtype().is_float() {
        return Err(invalid(
            op,
            format!("state tensor {key:?} has dtype {}, not a float type", t.dtype().name()),
        ));
    }
    if t.shape() != shape {
        return Err(invalid(
            op,
            format!(
                "state tensor {key:?} has shape {:?}, but {shape_key:?} has shape {shape:?}",
                t.shape()
            ),
        ));
    }
    t.contiguous_copy()
}

/// Reads a step count: a one-element tensor holding a non-negative integer.
pub(crate) fn read_step(op: &'static str, key: &str, t: &Tensor) -> Result<u64> {
    if t.numel() != 1 {
        return Err(invalid(
            op,
            format!(
                "state tensor {key:?} has shape {:?}, expected a one-element step count (shape [])",
                t.shape()
            ),
        ));
    }
    let v = t.to_vec_f64()[0];
    if !(v >= 0.0 && v.fract() == 0.0 && v <= 2f64.powi(53)) {
        return Err(invalid(
            op,
            format!("state tensor {key:?} holds {v}, not a step count (an integer >= 0)"),
        ));
    }
    Ok(v as u64)
}

/// Shorthand for [`Error::Invalid`].
pub(crate) fn invalid(op: &'static str, msg: impl Into<String>) -> Error {
    Error::Invalid { op, msg: msg.into() }
}
