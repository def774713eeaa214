//! The end of a training step as graph-capturable ops, for compiled mode (`[train] compile =
//! true`): the gradients' global norm, then clipping and the optimizer's update of every
//! parameter as one node (see [`crate::optim::Optimizer::update_node`]). Each is a custom
//! function (one node of a captured graph, replayed by calling it again) running the same code
//! as the eager step ([`crate::clip::grad_norm`], [`crate::clip::clip_to_norm`],
//! `Optimizer::step`, one parallel job over the parameters), so a replayed step computes the
//! same numbers bit for bit.
//!
//! Values a step reads on the host (the learning rate, step counts, whether the norm and the
//! loss are finite) are inputs of these nodes, read inside them when they run: a captured graph
//! takes the learning rate and step counts as its inputs at every replay, and an update whose
//! loss or gradient norm is not finite changes nothing, as the eager step skips it.

use std::sync::Arc;

use weft_core::{Error, Function, Result, Tensor};

/// The global L2 norm of its inputs (the gradients, in the order given), as a 0-d f64 tensor.
struct GradNormFn;

impl Function for GradNormFn {
    fn name(&self) -> &'static str {
        "grad_norm"
    }

    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let grads: Vec<Tensor> = inputs.iter().map(|&t| t.clone()).collect();
        Ok(Tensor::scalar(crate::clip::norm_of(&grads)?))
    }

    fn backward(&self, _: &[Tensor], _: &Tensor, _: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Err(not_differentiable("grad_norm"))
    }
}

fn not_differentiable(op: &'static str) -> Error {
    Error::Invalid {
        op,
        msg: "a step's end has no gradient".into(),
    }
}

/// `grads`' global L2 norm (0-d f64) as one node; see [`crate::clip::grad_norm`]. Run it under
/// `no_grad`.
pub fn grad_norm_node(grads: &[Tensor]) -> Result<Tensor> {
    let refs: Vec<&Tensor> = grads.iter().collect();
    Tensor::apply_function(Arc::new(GradNormFn), &refs)
}

/// One parameter of an update node: its name (the optimizer's state key), the parameter, its
/// gradient, its group's weight decay and its step count (a 0-d f64 tensor holding a whole
/// number: its updates so far plus one; [`crate::optim::Optimizer::next_step`]).
pub struct UpdateItem<'a> {
    pub name: &'a str,
    pub param: &'a Tensor,
    pub grad: &'a Tensor,
    pub weight_decay: f64,
    pub step: &'a Tensor,
}

/// What an update node reads besides its parameters: 0-d tensors, and the clipping.
pub struct UpdateInputs<'a> {
    /// The learning rate (f64).
    pub lr: &'a Tensor,
    /// The step's loss and the gradients' global norm (from [`grad_norm_node`]): when either is
    /// not finite the update changes nothing.
    pub loss: &'a Tensor,
    pub norm: &'a Tensor,
    /// Clip the gradients to this global norm first (in place, as
    /// [`crate::clip::clip_to_norm`]), or not.
    pub max_norm: Option<f64>,
}

/// An update node's scalars when it runs: the learning rate and the clipping coefficient to
/// scale the gradients by (`None`: leave them); `None` when the loss or the norm is not finite.
pub(crate) fn read_scalars(inputs: &[&Tensor], max_norm: Option<f64>) -> Result<Option<(f64, Option<f64>)>> {
    let (lr, loss, norm) = (inputs[0].item()?, inputs[1].item()?, inputs[2].item()?);
    if !(loss.is_finite() && norm.is_finite()) {
        return Ok(None);
    }
    if !(lr.is_finite() && lr >= 0.0) {
        return Err(Error::Invalid {
            op: "optimizer update",
            msg: format!("learning rate {lr} must be finite and >= 0"),
        });
    }
    // as `clip_to_norm`: scaled when the coefficient is below 1
    let coef = max_norm
        .map(|max| max / (norm + 1e-6))
        .filter(|c| c.is_nan() || *c < 1.0);
    Ok(Some((lr, coef)))
}

/// The gradients an update node clips and reads, each in a buffer of its own: eagerly every
/// parameter's gradient has one (autograd copies a gradient it hands to a second leaf), but a
/// captured graph records that copy as the same value, so two parameters' gradients may share a
/// buffer at a replay; clipping it in place once per parameter would scale it twice. `grads[i]`
/// is copied when its storage is an earlier one's.
pub(crate) fn own_gradients<'a>(grads: impl Iterator<Item = &'a Tensor>) -> Result<Vec<Tensor>> {
    let mut seen = std::collections::HashSet::new();
    grads
        .map(|g| match seen.insert(Arc::as_ptr(g.storage())) {
            true => Ok(g.clone()),
            false => g.contiguous_copy(),
        })
        .collect()
}

/// A step count input: a whole number >= 1.
pub(crate) fn read_step_count(t: &Tensor) -> Result<u64> {
    let t = t.item()?;
    if !(t >= 1.0 && t.fract() == 0.0 && t < 9.0e15) {
        return Err(Error::Invalid {
            op: "optimizer update",
            msg: format!("step count {t} must be a whole number >= 1"),
        });
    }
    Ok(t as u64)
}

/// An update node's first inputs, `[lr, loss, norm]` (each parameter's follow), after checking
/// that the clipping bound is usable.
pub(crate) fn node_inputs<'a>(inputs: &UpdateInputs<'a>) -> Result<Vec<&'a Tensor>> {
    if let Some(max) = inputs.max_norm {
        if max.is_nan() || max < 0.0 {
            return Err(Error::Invalid {
                op: "clip_grad_norm",
                msg: format!("max_norm {max} must be >= 0"),
            });
        }
    }
    Ok(vec![inputs.lr, inputs.loss, inputs.norm])
}
