//! One optimizer step: the forward and backward passes of its micro-batches (through the
//! pipeline's schedule when there is one), the gradient synchronisation, the global norm,
//! clipping and the update, and the step's record.

use std::time::Instant;

use weft_core::Tensor;
use weft_dist::trace::span;
use weft_nn::clip::{clip_to_norm, grad_norm};

use super::{StepRecord, Trainer};
use crate::error::{Error, Result};
use crate::replicas::{unsharded_bytes, Replicas, StateBytes};

impl Trainer {
    /// One step on `(x, y)` at index `step` (0-based: the steps done before it; its record is
    /// numbered `step + 1`).
    pub fn train_step(&mut self, step: usize, x: &Tensor, y: &Tensor) -> Result<StepRecord> {
        self.train_accumulated(step, &[(x.clone(), y.clone())])
    }

    /// One optimizer step at index `step` over the `K = batches.len()` micro-batches of
    /// `batches` (gradient accumulation): each micro-batch's loss is scaled by `1/K` before its
    /// backward, so that the gradients summed over them are those of the mean loss; the record's
    /// loss is the mean of the `K` losses (and over the data-parallel group). Data-parallel
    /// gradients are averaged once, after the last micro-batch (ZeRO stages 2 and 3
    /// reduce-scatter every micro-batch's gradients and add the shards).
    pub fn train_accumulated(&mut self, step: usize, batches: &[(Tensor, Tensor)]) -> Result<StepRecord> {
        self.accumulated_step(step, batches.len(), &mut |j| Ok(batches[j].clone()))
    }

    /// [`Trainer::train_accumulated`] over `k` micro-batches that `next(j)` gives when micro-batch
    /// `j`'s forward is due (so one is held at a time); the time spent in `next` is the record's
    /// `data_wait_ms`, and is not part of its `step_ms`.
    pub(crate) fn accumulated_step(
        &mut self,
        step: usize,
        k: usize,
        next: &mut dyn FnMut(usize) -> Result<(Tensor, Tensor)>,
    ) -> Result<StepRecord> {
        let t0 = Instant::now();
        let mut waited = std::time::Duration::ZERO;
        if k == 0 {
            return Err(Error::Run(format!("step {}: no batch to train on", step + 1)));
        }
        weft_core::cuda::reset_peak(self.device)?;
        weft_core::memory::reset_max_allocated();
        self.hook_replicas_unless_compiled();
        let lr = self.schedule.lr_at(step);
        let _step_span = span("compute", "step");
        // the weight of each micro-batch's loss; exactly 1 without accumulation
        let scale = 1.0 / k as f64;
        let (mut local_sum, mut activation_bytes) = (0.0, None::<Vec<usize>>);
        let mut items = 0;
        let mut tokens = false;
        let mut whole_out = None;
        for j in 0..k {
            let last = j + 1 == k;
            let asked = Instant::now();
            let (x, y) = next(j)?;
            waited += asked.elapsed();
            let (x, y) = (&x.to(self.device)?, &y.to(self.device)?);
            tokens = x.dtype() == weft_core::DType::I64;
            items += if tokens { x.numel() } else { x.shape()[0] };
            if let Some(z) = self.zero() {
                z.begin_forward()?;
            }
            let compiled = self.use_compiled();
            // compiled mode on one process: the last micro-batch's graph holds the update too
            // (asked at the last micro-batch: an earlier one's refused capture turns it off)
            let whole =
                last && self.pipeline.is_none() && self.whole_step_ready() && (k == 1 || self.holds_every_gradient());
            // a pipeline runs forward and backward passes together, micro-batch by micro-batch
            match &self.pipeline {
                Some(p) => {
                    // one region for the step's micro-batches: each weight cast once, unless
                    // they are recomputed (a cache would then keep every chunk's copies)
                    let (value, peaks) = weft_core::autocast_with_cache(self.autocast, !p.recomputes(), || {
                        p.run_step(x, y, scale, &mut |out, seed, end| {
                            micro_backward(self.replicas(), &|| out.backward_with(seed), end && last)
                        })
                    })?;
                    local_sum += value;
                    activation_bytes = Some(match activation_bytes {
                        Some(before) => before.iter().zip(&peaks).map(|(a, b)| *a.max(b)).collect(),
                        None => peaks,
                    });
                }
                None if whole => {
                    let _s = span("compute", "compiled step");
                    let out = self.whole_compiled_step(x, y, lr, (k > 1).then_some((scale, local_sum)))?;
                    local_sum += out.loss;
                    whole_out = Some(out);
                }
                None if compiled => {
                    let _s = span("compute", "compiled forward and backward");
                    local_sum += self.compiled_micro_step(x, y, (k > 1).then_some(scale), last)?;
                    // as `micro_backward` after an eager backward: plain data parallelism and
                    // ZeRO stage 1 keep the sum locally (their wrappers have no hooks here);
                    // stage 2 reduce-scatters each micro-batch's gradients and adds the shards
                    if let Some(z) = self.zero().filter(|z| !last && z.stage() >= 2) {
                        z.accumulate()?;
                    }
                }
                None => {
                    let loss = {
                        let _s = span("compute", "forward");
                        weft_core::autocast(self.autocast, || self.model.loss(x, y))?
                    };
                    local_sum += loss.item()?;
                    let _s = span("compute", "backward");
                    if k == 1 {
                        loss.backward()?;
                    } else {
                        // on the loss's device, in its dtype
                        let seed = Tensor::ones_like(&loss)?.mul_scalar(scale)?;
                        micro_backward(self.replicas(), &|| loss.backward_with(&seed), last)?;
                    }
                }
            }
        }
        let local_loss = local_sum / k as f64;
        let (_, ranks) = self.rank_and_size();
        // the mean over the global batch: every rank's share has the same size
        let loss_value = self.sum_over_ranks(vec![local_loss])?[0] / ranks as f64;
        // the same value on every rank, so every rank takes the same branch
        if !loss_value.is_finite() && !self.skip_nonfinite {
            return Err(Error::Run(format!(
                "step {}: the loss is {loss_value}; set train.skip_nonfinite = true to skip such steps",
                step + 1
            )));
        }
        if let Some((_, replicas)) = &self.data_parallel {
            let _s = span("compute", "gradient sync");
            match replicas {
                Replicas::Plain(ddp) => ddp.finish()?,
                Replicas::Sharded(zero) => zero.finish()?,
            }
        }
        if let Some(p) = &self.pipeline {
            p.sum_shared_gradients(&self.params)?;
        }
        if let Some((tp, d)) = self
            .tensor_parallel
            .as_ref()
            .and_then(|tp| Some((tp, tp.deferred.as_ref()?)))
        {
            let _s = span("compute", "whole gradients summed");
            d.sum(&|t| Ok(tp.group.all_reduce(t, weft_dist::ReduceOp::Sum)?.wait()?))?;
        }
        // the groups hold every parameter (or this rank's pieces of them)
        let params: Vec<Tensor> = self
            .groups
            .iter()
            .flat_map(|g| g.params.iter().map(|(_, p)| p.clone()))
            .collect();
        let state_bytes = match &whole_out {
            // the whole step's gradients lived inside its graph
            Some(o) => StateBytes {
                grads: o.grad_bytes,
                ..unsharded_bytes(&params, self.optimizer.as_ref())
            },
            None => self.state_bytes(&params),
        };
        let _s = span("compute", "clip and optimizer step");
        // the global norm (the same on every rank), checked before clipping scales by it
        let grad_norm = if let Some(o) = &whole_out {
            o.grad_norm
        } else if self.zero().is_some() || self.tensor_parallel.is_some() || self.pipeline.is_some() {
            self.sharded_grad_norm()?
        } else {
            grad_norm(&params)?
        };
        let skipped = !(grad_norm.is_finite() && loss_value.is_finite());
        if skipped && !self.skip_nonfinite {
            let which = match whole_out {
                // its update changed nothing; the gradients were not kept
                Some(_) => "the compiled step keeps no gradient to name (train.compile = false names the first \
                            parameter whose gradient is not finite)"
                    .to_string(),
                None => self.first_nonfinite_gradient(),
            };
            return Err(Error::Run(format!(
                "step {}: the gradient norm is {grad_norm}: {which}; set train.skip_nonfinite = true to skip such steps",
                step + 1,
            )));
        }
        if skipped {
            self.skipped_steps += 1;
        } else if whole_out.is_some() {
            // clipped and updated inside the graph
        } else {
            if let Some(max) = self.grad_clip {
                clip_to_norm(&params, max, grad_norm)?;
            }
            self.optimizer.step(&self.groups, lr)?;
        }
        match self.zero() {
            Some(z) => z.after_step()?,
            None => params.iter().for_each(|p| p.set_grad(None)),
        }
        // the step's time includes its GPU work
        weft_core::cuda::synchronize(self.device)?;
        let step_ms = t0.elapsed().saturating_sub(waited).as_secs_f64() * 1e3;
        let (gpu_mem_bytes, host_mem_bytes) = match self.device {
            weft_core::Device::Cpu => (None, Some(weft_core::memory::max_allocated_bytes() as u64)),
            d => (Some(weft_core::cuda::memory_stats(d)?.peak_allocated), None),
        };
        // every micro-batch of every data-parallel rank
        let items = items * ranks;
        let key = if tokens { "tokens_per_s" } else { "samples_per_s" };
        Ok(StepRecord {
            step: step + 1,
            loss: loss_value,
            lr,
            grad_norm,
            step_ms,
            items_per_s: items as f64 / (step_ms / 1e3),
            items_key: key,
            state_bytes,
            activation_bytes,
            skipped,
            skipped_steps: self.skipped_steps,
            gpu_mem_bytes,
            host_mem_bytes,
            micro_batches: k,
            data_wait_ms: waited.as_secs_f64() * 1e3,
        })
    }

    /// The data-parallel wrapper, if there is one.
    pub(crate) fn replicas(&self) -> Option<&Replicas> {
        self.data_parallel.as_ref().map(|(_, r)| r)
    }

    /// Which parameter's gradient (the first in registration order, among those this rank
    /// holds) has a value that is not finite, for the error that stops the run.
    fn first_nonfinite_gradient(&self) -> String {
        let order: std::collections::HashMap<&str, usize> = self
            .params
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (n.as_str(), i))
            .collect();
        let mut held: Vec<(&str, &Tensor)> = self
            .groups
            .iter()
            .flat_map(|g| g.params.iter().map(|(n, p)| (n.as_str(), p)))
            .collect();
        held.sort_by_key(|(n, _)| order.get(n).copied().unwrap_or(usize::MAX));
        for (name, p) in held {
            let Some(g) = p.grad() else { continue };
            if let Some(v) = g.to_vec_f64().into_iter().find(|v| !v.is_finite()) {
                return format!("the gradient of {name} holds {v}");
            }
        }
        "every gradient this rank holds is finite (another rank's are not)".to_string()
    }

    /// The model state this rank holds now; `params` are the optimizer's parameters.
    fn state_bytes(&self, params: &[Tensor]) -> StateBytes {
        match self.zero() {
            Some(z) => {
                let held = z.held_bytes();
                StateBytes {
                    params: held.params,
                    grads: held.grads,
                    optimizer: self.optimizer.state_bytes(),
                }
            }
            None => unsharded_bytes(params, self.optimizer.as_ref()),
        }
    }
}

/// One micro-batch's backward (`run`): gradients accumulate locally (data-parallel averaging
/// deferred, as `no_sync`; ZeRO stages 2 and 3 reduce-scatter them and add the shards) except on
/// the step's `last` micro-batch, whose gradients the caller synchronises with `finish`.
fn micro_backward(replicas: Option<&Replicas>, run: &dyn Fn() -> weft_core::Result<()>, last: bool) -> Result<()> {
    match (replicas, last) {
        (Some(Replicas::Plain(ddp)), false) => ddp.no_sync(run)?,
        (Some(Replicas::Sharded(zero)), false) if zero.stage() == 1 => zero.no_sync(run)?,
        (Some(Replicas::Sharded(zero)), false) => {
            run()?;
            zero.accumulate()?;
        }
        _ => run()?,
    }
    Ok(())
}
