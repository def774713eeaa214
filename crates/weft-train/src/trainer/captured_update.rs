//! Compiled mode's whole step: with one micro-batch on a single process, forward, loss,
//! backward, the gradients' global norm, clipping and the optimizer's update are captured as one
//! graph (`weft_nn::step_ops`: the norm, the clipping and each parameter's update are nodes that
//! run the eager step's own code) and replayed at every later step. The learning rate and each
//! parameter's step count are the graph's inputs; an update whose loss or gradient norm is not
//! finite changes nothing (the eager step skips it), and the step counts advance only for
//! updates that ran.
//!
//! The whole step needs the optimizer's state to exist before it is captured (the graph holds
//! its tensors), so the first step runs through the micro-batch graph and the eager update,
//! which makes it; the whole step is captured at the second and replayed from the third.

use weft_core::graph::{GraphCache, Outcome};
use weft_core::Tensor;
use weft_nn::optim::Optimizer;
use weft_nn::step_ops::{grad_norm_node, UpdateInputs, UpdateItem};

use super::Trainer;
use crate::error::{Error, Result};

type Signature = Vec<(Vec<usize>, weft_core::DType)>;

/// The whole-step graphs, and per input signature which parameters (in the groups' order) their
/// capture gave a gradient.
pub(crate) struct WholeStep {
    pub(super) cache: GraphCache,
    updated: Vec<(Signature, Vec<bool>)>,
    /// Given up (a capture refused): the micro-batch graph and the eager update from then on.
    off: bool,
}

impl WholeStep {
    pub(crate) fn new(cache: GraphCache) -> Self {
        WholeStep {
            cache,
            updated: Vec::new(),
            off: false,
        }
    }
}

/// What one whole step gave: the loss, the gradients' global norm, and the bytes of the
/// gradients it made (inside its graph).
pub(crate) struct WholeOutcome {
    pub loss: f64,
    pub grad_norm: f64,
    pub grad_bytes: usize,
}

/// The function the whole step captures: `xs = [inputs, targets, lr, step counts...]` (a step
/// count per parameter of `flat`, the groups' parameters in order) -> `[loss, gradient norm]`,
/// and which parameters got a gradient.
fn whole_step_fn(
    model: &dyn weft_models::Model,
    flat: &[(String, Tensor, f64)],
    optimizer: &dyn Optimizer,
    autocast: Option<weft_core::DType>,
    clip: Option<f64>,
    xs: &[Tensor],
) -> weft_core::Result<(Vec<Tensor>, Vec<bool>)> {
    flat.iter().for_each(|(_, p, _)| p.set_grad(None));
    let loss = weft_core::autocast(autocast, || model.loss(&xs[0], &xs[1]))?;
    loss.backward()?;
    let loss = loss.detach();
    weft_core::no_grad(|| {
        let grads: Vec<Option<Tensor>> = flat.iter().map(|(_, p, _)| p.grad()).collect();
        let mask = grads.iter().map(Option::is_some).collect();
        // summed in the groups' order, as the eager step's norm
        let present: Vec<Tensor> = grads.iter().flatten().cloned().collect();
        let norm = grad_norm_node(&present)?;
        let items: Vec<UpdateItem> = flat
            .iter()
            .zip(&grads)
            .enumerate()
            .filter_map(|(i, ((name, param, wd), g))| {
                Some(UpdateItem {
                    name,
                    param,
                    grad: g.as_ref()?,
                    weight_decay: *wd,
                    step: &xs[3 + i],
                })
            })
            .collect();
        let inputs = UpdateInputs {
            lr: &xs[2],
            loss: &loss,
            norm: &norm,
            max_norm: clip,
        };
        if optimizer.update_node(&items, &inputs)?.is_none() {
            return Err(weft_core::Error::Invalid {
                op: "compiled step",
                msg: "the optimizer's update has no graph form for these parameters".into(),
            });
        }
        flat.iter().for_each(|(_, p, _)| p.set_grad(None));
        Ok((vec![loss, norm], mask))
    })
}

impl Trainer {
    /// The groups' parameters in order, each with its group's weight decay.
    fn flat_params(&self) -> Vec<(String, Tensor, f64)> {
        self.groups
            .iter()
            .flat_map(|g| g.params.iter().map(|(n, p)| (n.clone(), p.clone(), g.weight_decay)))
            .collect()
    }

    /// Whether a step of `k` micro-batches runs as the whole-step graph: compiled mode on and
    /// not given up, one micro-batch, a single process (the data-parallel reductions and the
    /// other layouts sit between backward and the update), and an optimizer with update nodes
    /// and state for every parameter.
    pub(crate) fn whole_step_ready(&mut self, k: usize) -> bool {
        if k != 1 || self.data_parallel.is_some() || !self.use_compiled() {
            return false;
        }
        let Some(whole) = self.compiled.as_ref().map(|c| &c.whole) else {
            return false;
        };
        !whole.off
            && self
                .groups
                .iter()
                .flat_map(|g| &g.params)
                .all(|(name, _)| self.optimizer.next_step(name).is_some())
    }

    /// One step through the whole-step graph at learning rate `lr`: forward, backward, the
    /// norm, clipping and (when the loss and norm are finite) the update.
    pub(crate) fn whole_compiled_step(&mut self, x: &Tensor, y: &Tensor, lr: f64) -> Result<WholeOutcome> {
        let flat = self.flat_params();
        let mut inputs = vec![x.clone(), y.clone(), Tensor::scalar(lr)];
        for (name, _, _) in &flat {
            let t = self
                .optimizer
                .next_step(name)
                .ok_or_else(|| Error::Run(format!("the optimizer has no state for {name}")))?;
            inputs.push(Tensor::scalar(t as f64));
        }
        let sig: Signature = inputs.iter().map(|t| (t.shape().to_vec(), t.dtype())).collect();
        let (model, autocast, clip) = (self.model.as_ref(), self.autocast, self.grad_clip);
        let optimizer = self.optimizer.as_ref();
        let Some(compiled) = self.compiled.as_mut() else {
            return Err(Error::Run("the compiled step is off".into()));
        };
        let whole = &mut compiled.whole;
        let mut mask = None;
        let outputs = whole.cache.call_with_stream(&inputs, model.context(), |xs| {
            let (out, m) = whole_step_fn(model, &flat, optimizer, autocast, clip, xs)?;
            mask = Some(m);
            Ok(out)
        })?;
        if let Some(m) = mask {
            whole.updated.retain(|(s, _)| *s != sig);
            whole.updated.push((sig.clone(), m));
        }
        let captured = (whole.cache.last_outcome() == Some(&Outcome::Captured))
            .then(|| (whole.cache.pass_report(), whole.cache.remat_report()));
        let tuned = whole.cache.take_tune_report();
        let refused = whole.cache.eager_reason().map(str::to_string);
        if refused.is_some() {
            whole.off = true;
        }
        let updated = whole
            .updated
            .iter()
            .find(|(s, _)| *s == sig)
            .map(|(_, m)| m.clone())
            .ok_or_else(|| Error::Run("the whole-step graph has no record of its gradients".into()))?;
        let [loss, grad_norm] = [&outputs[0], &outputs[1]].map(|t| t.item());
        let (loss, grad_norm) = (loss?, grad_norm?);
        let names: Vec<&str> = flat
            .iter()
            .zip(&updated)
            .filter(|(_, u)| **u)
            .map(|((n, _, _), _)| n.as_str())
            .collect();
        if loss.is_finite() && grad_norm.is_finite() {
            self.optimizer.count_updates(&names);
        }
        let grad_bytes = flat
            .iter()
            .zip(&updated)
            .filter(|(_, u)| **u)
            .map(|((_, p, _), _)| p.numel() * p.dtype().size_in_bytes())
            .sum();
        if let Some((r, m)) = captured {
            self.tell(&super::compiled::capture_line(
                "the whole step (forward, backward, clipping and the optimizer's update)",
                &r,
                &m,
            ));
        }
        if let Some(r) = tuned {
            self.tell_tuned(&r);
        }
        if let Some(why) = refused {
            self.tell(&format!(
                "the whole step is not captured ({why}); the forward and backward still are"
            ));
        }
        Ok(WholeOutcome {
            loss,
            grad_norm,
            grad_bytes,
        })
    }
}
