//! Compiled mode's whole step: on a single process, the last micro-batch's forward, loss and
//! backward, the gradients' global norm, clipping and the optimizer's update are captured as one
//! graph (`weft_nn::step_ops`: the norm, the clipping and each parameter's update are nodes that
//! run the eager step's own code) and replayed at every later step. The learning rate and each
//! parameter's step count are the graph's inputs; an update whose loss or gradient norm is not
//! finite changes nothing (the eager step skips it), and the step counts advance only for
//! updates that ran.
//!
//! With gradient accumulation (`K > 1` micro-batches), the first `K - 1` run through the
//! micro-batch graph, which leaves their summed gradients on the parameters; the whole step then
//! takes those sums as inputs, adds the last micro-batch's gradients to them as eager backward
//! would, and checks the sum of the earlier losses (an input) with the last for finiteness.
//!
//! The whole step needs the optimizer's state to exist before it is captured (the graph holds
//! its tensors), so the first step runs through the micro-batch graph and the eager update,
//! which makes it; the whole step is captured at the second and replayed from the third (SGD
//! without momentum keeps no state: captured at the first).

use weft_core::graph::passes::PassReport;
use weft_core::graph::remat::RematReport;
use weft_core::graph::{Graph, GraphCache, Outcome};
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
    /// Given up (a capture refused, the reason): the micro-batch graph and the eager update from
    /// then on.
    off: Option<String>,
}

impl WholeStep {
    pub(crate) fn new(cache: GraphCache) -> Self {
        WholeStep {
            cache,
            updated: Vec::new(),
            off: None,
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
/// count per parameter of `flat`, the groups' parameters in order), followed when
/// `accumulated` by `[earlier gradients..., earlier losses' sum, loss scale]` (a gradient per
/// parameter of `flat`, the sum and scale 0-d f64) -> `[loss, gradient norm]`, and which
/// parameters got a gradient.
fn whole_step_fn(
    model: &dyn weft_models::Model,
    flat: &[(String, Tensor, f64)],
    optimizer: &dyn Optimizer,
    autocast: Option<weft_core::DType>,
    clip: Option<f64>,
    accumulated: bool,
    xs: &[Tensor],
) -> weft_core::Result<(Vec<Tensor>, Vec<bool>)> {
    let n = flat.len();
    flat.iter().for_each(|(_, p, _)| p.set_grad(None));
    let loss = weft_core::autocast(autocast, || model.loss(&xs[0], &xs[1]))?;
    if accumulated {
        // the seed eager mode gives a micro-batch's backward: `ones_like(loss) * scale`, whose
        // arithmetic is f64 for an f64 loss and f32 otherwise (then rounded to the loss's dtype)
        let scale = &xs[3 + 2 * n + 1];
        let seed = match loss.dtype() {
            weft_core::DType::F64 => scale.clone(),
            dt => scale.cast(weft_core::DType::F32)?.cast(dt)?,
        };
        loss.backward_with(&seed)?;
    } else {
        loss.backward()?;
    }
    let loss = loss.detach();
    weft_core::no_grad(|| {
        let mut grads: Vec<Option<Tensor>> = flat.iter().map(|(_, p, _)| p.grad()).collect();
        // the step's loss as far as finiteness goes: the earlier micro-batches' sum and this one
        let mut checked = loss.clone();
        if accumulated {
            for (i, g) in grads.iter_mut().enumerate() {
                let held = &xs[3 + n + i];
                *g = Some(match g.take() {
                    Some(g) => held.add(&g)?,
                    None => held.clone(),
                });
            }
            checked = loss.cast(weft_core::DType::F64)?.add(&xs[3 + 2 * n])?;
        }
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
            loss: &checked,
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

    /// Whether a step's last micro-batch may run as the whole-step graph: compiled mode on and
    /// not given up, a single process (the data-parallel reductions and the other layouts sit
    /// between backward and the update), and an optimizer with update nodes and state for every
    /// parameter. With accumulation, [`Trainer::holds_every_gradient`] decides at the last
    /// micro-batch.
    pub(crate) fn whole_step_ready(&mut self) -> bool {
        if self.data_parallel.is_some() || !self.use_compiled() {
            return false;
        }
        let Some(whole) = self.compiled.as_ref().map(|c| &c.whole) else {
            return false;
        };
        whole.off.is_none()
            && self
                .groups
                .iter()
                .flat_map(|g| &g.params)
                .all(|(name, _)| self.optimizer.next_step(name).is_some())
    }

    /// Whether compiled mode holds a captured whole step (forward, backward, clipping and the
    /// update as one graph), which the next step will replay when its shapes match.
    pub fn whole_step_captured(&self) -> bool {
        self.whole_step_graph().is_ok()
    }

    /// The whole-step graph used last, with what the passes and recomputation did at its capture
    /// (`weft graph dump`); `Err` says why there is none.
    pub(crate) fn whole_step_graph(&self) -> std::result::Result<(Graph, PassReport, RematReport), String> {
        let whole = match &self.compiled {
            Some(c) => &c.whole,
            None => return Err("compiled mode is off".into()),
        };
        if let Some(why) = &whole.off {
            return Err(why.clone());
        }
        let stateless = self
            .groups
            .iter()
            .flat_map(|g| &g.params)
            .find(|(name, _)| self.optimizer.next_step(name).is_none());
        let graph = match (whole.cache.newest_graph(), stateless) {
            (Some(g), _) => g,
            (None, Some((name, _))) => {
                return Err(format!(
                    "the optimizer holds no state for {name} (made at its first update, or checked after a \
                     checkpoint's), so its update runs eagerly"
                ))
            }
            (None, None) => return Err("no step has reached it yet".into()),
        };
        Ok((graph.clone(), whole.cache.pass_report(), whole.cache.remat_report()))
    }

    /// Drops the whole-step graphs (they hold the optimizer's state tensors, which a checkpoint
    /// load replaces): the next steps capture them again.
    pub(crate) fn forget_whole_step(&mut self) {
        if let Some(c) = self.compiled.as_mut() {
            // a whole step given up stays given up
            let off = c.whole.off.take();
            c.whole = WholeStep::new(super::compiled::step_cache(self.autotune, self.recompute));
            c.whole.off = off;
        }
    }

    /// Whether every parameter holds a gradient (what the earlier micro-batches of an
    /// accumulated step left): the whole step then takes them as inputs. (A parameter the earlier
    /// micro-batches gave none leaves the update to eager mode: which ones have a gradient is not
    /// part of a graph's input signature.)
    pub(crate) fn holds_every_gradient(&self) -> bool {
        self.groups
            .iter()
            .flat_map(|g| &g.params)
            .all(|(_, p)| p.grad().is_some())
    }

    /// One step (or its last micro-batch, of `accumulated = Some((scale, earlier))`: each
    /// micro-batch's loss weighed by `scale`, `earlier` the sum of the earlier micro-batches'
    /// losses, whose gradients the parameters hold) through the whole-step graph at learning
    /// rate `lr`: forward, backward, the norm, clipping and (when the loss and norm are finite)
    /// the update. The outcome's loss is this micro-batch's.
    pub(crate) fn whole_compiled_step(
        &mut self,
        x: &Tensor,
        y: &Tensor,
        lr: f64,
        accumulated: Option<(f64, f64)>,
    ) -> Result<WholeOutcome> {
        let flat = self.flat_params();
        let mut inputs = vec![x.clone(), y.clone(), Tensor::scalar(lr)];
        for (name, _, _) in &flat {
            let t = self
                .optimizer
                .next_step(name)
                .ok_or_else(|| Error::Run(format!("the optimizer has no state for {name}")))?;
            inputs.push(Tensor::scalar(t as f64));
        }
        if self.compiled.as_ref().is_none_or(|c| c.whole.off.is_some()) {
            return Err(Error::Run("the whole compiled step is off".into()));
        }
        // the earlier micro-batches' gradients, given back should the step fail
        let mut held = Vec::new();
        if let Some((scale, earlier)) = accumulated {
            for (name, p, _) in &flat {
                let g = p
                    .grad()
                    .ok_or_else(|| Error::Run(format!("{name} holds no gradient of the earlier micro-batches")))?;
                held.push(g);
            }
            flat.iter().for_each(|(_, p, _)| p.set_grad(None));
            inputs.extend(held.iter().cloned());
            inputs.extend([Tensor::scalar(earlier), Tensor::scalar(scale)]);
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
            let (out, m) = whole_step_fn(model, &flat, optimizer, autocast, clip, accumulated.is_some(), xs)?;
            mask = Some(m);
            Ok(out)
        });
        let outputs = match outputs {
            Ok(o) => o,
            Err(e) => {
                for ((_, p, _), g) in flat.iter().zip(held) {
                    p.set_grad(Some(g));
                }
                return Err(e.into());
            }
        };
        if let Some(m) = mask {
            whole.updated.retain(|(s, _)| *s != sig);
            whole.updated.push((sig.clone(), m));
        }
        let captured = (whole.cache.last_outcome() == Some(&Outcome::Captured))
            .then(|| (whole.cache.pass_report(), whole.cache.remat_report()));
        let tuned = whole.cache.take_tune_report();
        let refused = whole.cache.eager_reason().map(str::to_string);
        if refused.is_some() {
            whole.off.clone_from(&refused);
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
        let checked = loss + accumulated.map_or(0.0, |(_, earlier)| earlier);
        if checked.is_finite() && grad_norm.is_finite() {
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
