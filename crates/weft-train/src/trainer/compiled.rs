//! `[train] compile = true`: a micro-batch's forward, loss and backward captured once as a graph
//! (`weft_core::graph`) and replayed at later steps. Clipping and the optimizer's update run as
//! in eager mode after it (each is already one fused pass per parameter). Under data
//! parallelism the replay hands each gradient to the wrapper as soon as it is made, so that its
//! reduction overlaps the rest of backward as the eager hooks' do.

use std::cell::RefCell;

use weft_core::graph::passes::PassReport;
use weft_core::graph::remat::RematReport;
use weft_core::graph::{Autotune, GraphCache, Outcome, TuneReport};
use weft_core::Tensor;

use super::Trainer;
use crate::error::{Error, Result};
use crate::replicas::Replicas;

/// The trainer's compiled step: its graphs, the parameters, and which get a gradient in them.
type Signature = Vec<(Vec<usize>, weft_core::DType)>;

pub(crate) struct CompiledStep {
    cache: GraphCache,
    /// The trainer's parameters in registration order (filled at the first micro-batch).
    params: Vec<Tensor>,
    /// Per input signature (the shapes and dtypes of inputs and targets) captured: whether the
    /// captured backward gives each parameter a gradient (result `k > 0` of that graph is the
    /// gradient of the `k`-th parameter that gets one).
    has_grad: Vec<(Signature, Vec<bool>)>,
    /// The whole step (with clipping and the update) as one graph, where it can be.
    pub(super) whole: super::captured_update::WholeStep,
}

impl CompiledStep {
    pub(crate) fn new(autotune: Autotune, recompute: bool) -> Self {
        CompiledStep {
            cache: step_cache(autotune, recompute),
            params: Vec::new(),
            has_grad: Vec::new(),
            whole: super::captured_update::WholeStep::new(step_cache(autotune, recompute)),
        }
    }
}

/// An empty cache for a step's graphs, choosing kernels by `autotune`, recomputing activations
/// when `recompute`.
pub(super) fn step_cache(autotune: Autotune, recompute: bool) -> GraphCache {
    GraphCache::default().with_autotune(autotune).with_recompute(recompute)
}

/// The function compiled mode captures: `xs = [inputs, targets]` -> `[loss, gradients...]`, the
/// loss detached and the gradient of each of `params` that gets one (which do: the mask). The
/// backward is seeded with `scale` when given (a micro-batch of an accumulated step).
pub(crate) fn loss_and_grads(
    model: &dyn weft_models::Model,
    params: &[Tensor],
    autocast: Option<weft_core::DType>,
    scale: Option<f64>,
    xs: &[Tensor],
) -> weft_core::Result<(Vec<Tensor>, Vec<bool>)> {
    params.iter().for_each(|p| p.set_grad(None));
    let loss = weft_core::autocast(autocast, || model.loss(&xs[0], &xs[1]))?;
    match scale {
        Some(s) => loss.backward_with(&Tensor::ones_like(&loss)?.mul_scalar(s)?)?,
        None => loss.backward()?,
    }
    let grads: Vec<Option<Tensor>> = params.iter().map(|p| p.grad()).collect();
    let mask = grads.iter().map(Option::is_some).collect();
    let mut out = vec![loss.detach()];
    out.extend(grads.into_iter().flatten());
    Ok((out, mask))
}

/// What a capture did, for the log: `captured {what}: N nodes (...)`.
pub(super) fn capture_line(what: &str, r: &PassReport, m: &RematReport) -> String {
    let recomputed = if m.recomputed > 0 {
        format!(
            "; {} activations recomputed in the backward, peak {} -> {}",
            m.recomputed,
            weft_core::alloc::human_bytes(m.peak_before as u128),
            weft_core::alloc::human_bytes(m.peak_after as u128)
        )
    } else {
        String::new()
    };
    format!(
        "captured {what}: {} nodes ({} folded, {} merged, {} removed{recomputed})",
        r.captured - r.folded - r.merged - r.removed,
        r.folded,
        r.merged,
        r.removed
    )
}

impl Trainer {
    /// Why this trainer's layout cannot be captured yet, if it cannot. Data parallelism and ZeRO
    /// stages 1 and 2 can: their wrappers run without gradient hooks and are handed each
    /// gradient as a replay makes it (`finish` and `accumulate` take the rest).
    fn uncapturable_layout(&self) -> Option<&'static str> {
        let layout = crate::config::uncapturable_layout(
            self.pipeline.is_some(),
            self.tensor_parallel.is_some(),
            self.zero().is_some_and(|z| z.stage() == 3),
        );
        if layout.is_some() {
            layout
        } else if self.replicas().is_some_and(Replicas::hooked) {
            Some("the data-parallel gradient hooks were registered by an eager step before compile was turned on")
        } else {
            None
        }
    }

    /// Before a step: unless it goes through the compiled step, the data-parallel wrapper's
    /// gradient hooks are registered (once), so that its reductions overlap backward.
    pub(crate) fn hook_replicas_unless_compiled(&mut self) {
        if self.use_compiled() {
            return;
        }
        match self.replicas() {
            Some(Replicas::Plain(ddp)) => ddp.attach_hooks(),
            Some(Replicas::Sharded(zero)) => zero.attach_hooks(),
            None => {}
        }
    }

    /// Whether the next micro-batch goes through the compiled step; says once (on the job's
    /// first rank) why not when compile was asked for and the layout cannot be captured.
    pub(crate) fn use_compiled(&mut self) -> bool {
        if self.compiled.is_none() {
            return false;
        }
        let Some(why) = self.uncapturable_layout() else {
            return true;
        };
        self.tell_eager(why);
        self.compiled = None;
        false
    }

    fn tell_eager(&self, why: &str) {
        self.tell(&format!("running eagerly: {why}"));
    }

    /// Says what an autotuning search did (and its warnings), on the job's first rank.
    pub(super) fn tell_tuned(&self, r: &TuneReport) {
        if self.job.as_ref().is_some_and(|j| j.rank() != 0) {
            return;
        }
        for w in &r.warnings {
            weft_core::errln!("weft: warning: train.autotune: {w}");
        }
        let changed = r.searched.iter().filter(|e| e.chosen != "heuristic").count();
        weft_core::errln!(
            "weft: train.autotune: searched {} kernel calls in {:.2} s, {changed} of them to run another variant than \
             the rule ({} of the step's calls already chosen, {} choices read from {})",
            r.searched.len(),
            r.seconds,
            r.known,
            r.from_file,
            weft_core::tune::cache_file().display()
        );
    }

    /// A `train.compile` line, on the job's first rank.
    pub(super) fn tell(&self, what: &str) {
        if self.job.as_ref().is_none_or(|j| j.rank() == 0) {
            weft_core::errln!("weft: train.compile: {what}");
        }
    }

    /// One micro-batch through the compiled step: the loss (its value) and each parameter's
    /// gradient, the backward seeded with `scale` when given (a micro-batch of an accumulated
    /// step) and added to what earlier micro-batches left, as eager `backward` would. With a
    /// data-parallel wrapper, each gradient a replay makes is installed and handed to it at
    /// once, as its hook would be: on the step's `last` micro-batch, or on every one at ZeRO
    /// stage 2 (the gradients it cannot hand over early are taken by `finish` or `accumulate`).
    pub(crate) fn compiled_micro_step(
        &mut self,
        x: &Tensor,
        y: &Tensor,
        scale: Option<f64>,
        last: bool,
    ) -> Result<f64> {
        let Some(compiled) = self.compiled.as_mut() else {
            return Err(Error::Run("the compiled step is off".into()));
        };
        if compiled.params.is_empty() {
            compiled.params = self.params.iter().map(|(_, p)| p.clone()).collect();
        }
        let params = &compiled.params;
        let before: Vec<Option<Tensor>> = params.iter().map(|p| p.grad()).collect();
        let (model, autocast) = (self.model.as_ref(), self.autocast);
        let has_grad = RefCell::new(None);
        let sig: Signature = [x, y].iter().map(|t| (t.shape().to_vec(), t.dtype())).collect();
        let mask = |c: &CompiledStep| c.has_grad.iter().find(|(s, _)| *s == sig).map(|(_, m)| m.clone());
        // result k > 0 of a replay is the gradient of parameter result_param[k - 1] (as the
        // capture of this signature saw)
        let result_param: Vec<usize> = mask(compiled)
            .map(|m| (0..m.len()).filter(|&i| m[i]).collect())
            .unwrap_or_default();
        let replicas = self
            .data_parallel
            .as_ref()
            .map(|(_, r)| r)
            .filter(|r| last || r.reduces_every_backward());
        // the loss when the replay hands it over early
        let mut early_loss = None;
        // a gradient made: on its parameter (added to what earlier micro-batches left), then to
        // the wrapper
        let mut ready = |k: usize, grad: &Tensor| -> weft_core::Result<()> {
            let Some(j) = k.checked_sub(1) else {
                early_loss = Some(grad.clone());
                return Ok(());
            };
            let &i = result_param.get(j).ok_or_else(|| weft_core::Error::Invalid {
                op: "compiled step",
                msg: format!(
                    "result {k} is no parameter's gradient ({} were captured)",
                    result_param.len()
                ),
            })?;
            let p = &params[i];
            p.set_grad(Some(match &before[i] {
                Some(prev) => prev.add(grad)?,
                None => grad.clone(),
            }));
            if let Some(r) = replicas {
                r.hand_gradient(i);
            }
            Ok(())
        };
        // dropout draws from the model's stream: replays move their masks along it
        let outputs =
            compiled
                .cache
                .call_handing(&[x.clone(), y.clone()], Some(model.context()), &mut ready, |xs| {
                    let (out, mask) = loss_and_grads(model, params, autocast, scale, xs)?;
                    *has_grad.borrow_mut() = Some(mask);
                    Ok(out)
                })?;
        if let Some(m) = has_grad.into_inner() {
            compiled.has_grad.retain(|(s, _)| *s != sig);
            compiled.has_grad.push((sig.clone(), m));
        }
        let had_grad = mask(compiled).unwrap_or_else(|| vec![true; compiled.params.len()]);
        let tuned = compiled.cache.take_tune_report();
        let captured = (compiled.cache.last_outcome() == Some(&Outcome::Captured))
            .then(|| (compiled.cache.pass_report(), compiled.cache.remat_report()));
        // given up for good (a capture that may succeed at the next call is tried again)
        let refused = compiled.cache.eager_reason().map(str::to_string);
        let mut results = outputs.into_iter();
        let loss = results
            .next()
            .and_then(|l| l.or(early_loss))
            .ok_or_else(|| Error::Run("the compiled step returned no loss".into()))?;
        for ((p, had), prev) in compiled.params.iter().zip(&had_grad).zip(before) {
            let grad = if *had {
                match results.next() {
                    Some(Some(grad)) => grad,
                    // installed and handed over when the replay made it
                    Some(None) => continue,
                    None => return Err(Error::Run("the compiled step returned too few gradients".into())),
                }
            } else {
                p.set_grad(prev);
                continue;
            };
            p.set_grad(Some(match prev {
                Some(prev) => prev.add(&grad)?,
                None => grad,
            }));
        }
        if let Some((r, m)) = captured {
            self.tell(&capture_line("the step", &r, &m));
        }
        if let Some(r) = tuned {
            self.tell_tuned(&r);
        }
        if let Some(why) = refused {
            // this micro-batch ran eagerly while being captured; the rest run eagerly too
            self.tell_eager(&why);
            self.compiled = None;
        }
        Ok(loss.item()?)
    }
}
