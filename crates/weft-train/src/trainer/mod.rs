//! The training loop, usable from Rust without any config file.

use std::sync::Arc;
use std::time::Instant;

use weft_core::{no_grad, Tensor};
use weft_dist::trace::span;
use weft_dist::{DataParallel, DdpOptions, ProcessGroup, ReduceOp, ShardedDataParallel, ZeroOptions};
use weft_models::Model;
use weft_nn::clip::{clip_grad_norm, clip_to_norm, grad_norm};
use weft_nn::optim::{Optimizer, ParamGroup};
use weft_nn::schedule::Schedule;

use crate::checkpoint::{self, CheckpointState};
use crate::error::{Error, Result};
use crate::pipeline::Pipeline;
use crate::replicas::{unsharded_bytes, Replicas, StateBytes, ZeroUnits};

mod shards;
mod whole;

/// What one optimizer step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    /// 0-based step index.
    pub step: usize,
    /// Mean loss of the step's batch, computed before the update.
    pub loss: f64,
    /// Learning rate used at this step.
    pub lr: f64,
    /// Global L2 norm of the gradients before clipping.
    pub grad_norm: f64,
    /// Wall time of the whole step (batch, forward, backward, clip, update), milliseconds.
    pub step_ms: f64,
    /// Items processed per second: tokens for sequence models, samples otherwise.
    pub items_per_s: f64,
    /// `"tokens_per_s"` or `"samples_per_s"`.
    pub items_key: &'static str,
    /// Model state this rank held when the gradients were ready, before the update.
    pub state_bytes: StateBytes,
    /// With a pipeline: the most activation bytes each stage (in stage order) held at once in
    /// this step.
    pub activation_bytes: Option<Vec<usize>>,
}

/// Hooks the trainer calls; metrics files and progress bars are callbacks.
pub trait Callback: Send {
    /// After every step whose index is a multiple of the log interval, and after the last.
    fn on_step(&mut self, record: &StepRecord) -> Result<()>;
    /// After an evaluation: mean validation loss at `step`.
    fn on_eval(&mut self, _step: usize, _val_loss: f64) -> Result<()> {
        Ok(())
    }
    /// When the run finishes.
    fn on_end(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A function from a step (or evaluation batch index) to `(inputs, targets)`.
pub type BatchFn = Arc<dyn Fn(usize) -> Result<(Tensor, Tensor)> + Send + Sync>;

/// Where and how often to save checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointPolicy {
    pub dir: std::path::PathBuf,
    /// Every this many steps (0: only at the end).
    pub every: usize,
    /// Complete checkpoints kept.
    pub keep: usize,
}

/// Trains a [`Model`] with an [`Optimizer`] and a [`Schedule`].
pub struct Trainer {
    pub model: Arc<dyn Model>,
    pub optimizer: Box<dyn Optimizer>,
    pub groups: Vec<ParamGroup>,
    pub schedule: Schedule,
    pub grad_clip: Option<f64>,
    pub log_every: usize,
    callbacks: Vec<Box<dyn Callback>>,
    checkpoints: Option<CheckpointPolicy>,
    eval: Option<(usize, usize, BatchFn)>,
    /// Free-form JSON saved with every checkpoint (the run config, a tokenizer).
    pub checkpoint_extra: serde_json::Value,
    /// The data-parallel group and the wrapper that averages gradients over it.
    data_parallel: Option<(ProcessGroup, Replicas)>,
    /// Where rank 0 writes the timeline of the run (Chrome trace format).
    trace: Option<std::path::PathBuf>,
    /// The tensor-parallel group, when the model is cut across one.
    tensor_parallel: Option<whole::TensorParallel>,
    /// All ranks of the job, when there are several: rank 0 writes checkpoints and the trace.
    job: Option<ProcessGroup>,
    /// This rank's pipeline stage, when the model is cut into stages.
    pipeline: Option<Pipeline>,
    /// Writes checkpoints while training goes on.
    checkpoint_writer: checkpoint::BackgroundWriter,
    /// The same on every rank, new for every run: names checkpoints' temporary folders (set at
    /// the first save).
    checkpoint_nonce: Option<u64>,
    /// The parameters this rank trains (all the model's, or its stage's), in registration
    /// order.
    params: Vec<(String, Tensor)>,
}

impl Trainer {
    /// A trainer with nanoGPT's parameter groups: `weight_decay` for parameters of two or more dims
    /// (matrices, embeddings), none for biases and norm weights.
    pub fn new(model: Arc<dyn Model>, optimizer: Box<dyn Optimizer>, schedule: Schedule, weight_decay: f64) -> Self {
        let params = model.parameters();
        let groups = decay_groups(whole_dims(&params), weight_decay);
        Trainer {
            params,
            pipeline: None,
            checkpoint_writer: Default::default(),
            checkpoint_nonce: None,
            model,
            optimizer,
            groups,
            schedule,
            grad_clip: None,
            log_every: 1,
            callbacks: Vec::new(),
            checkpoints: None,
            eval: None,
            checkpoint_extra: serde_json::Value::Null,
            data_parallel: None,
            trace: None,
            tensor_parallel: None,
            job: None,
        }
    }

    /// Trains one stage of a pipeline: only the stage's parameters (the optimizer's groups are
    /// rebuilt from them), each step's batch cut into micro-batches run in the pipeline's
    /// schedule, tied weights' gradients summed over the stages that hold them, the gradient
    /// norm summed over the stages. Call before [`Trainer::with_data_parallel`] or
    /// [`Trainer::with_zero`] (ZeRO stage 1 at most).
    pub fn with_pipeline(mut self, pipeline: Pipeline) -> Self {
        self.params = pipeline.parameters().to_vec();
        let weight_decay = self.groups.first().map_or(0.0, |g| g.weight_decay);
        self.groups = decay_groups(whole_dims(&self.params), weight_decay);
        self.pipeline = Some(pipeline);
        self
    }

    /// The model was cut across `tp` (see `Gpt::make_tensor_parallel`): the gradient norm is
    /// summed over the group (parameters that are whole on every rank counted once), and
    /// each rank writes its own slice of the cut parameters and their optimizer state into
    /// checkpoints (needs [`Trainer::with_job`]).
    pub fn with_tensor_parallel(mut self, tp: ProcessGroup) -> Self {
        self.tensor_parallel = Some(whole::TensorParallel {
            group: tp,
            splits: self.model.splits().into_iter().collect(),
        });
        self
    }

    /// The job's ranks (all of them, whatever the layout): its rank 0 completes checkpoints
    /// (every rank writes what it owns) and writes the trace, which gathers every rank's spans.
    /// Without it, the data-parallel group plays that role; tensor and pipeline parallelism
    /// need it for checkpoints.
    pub fn with_job(mut self, job: ProcessGroup) -> Self {
        self.job = Some(job);
        self
    }

    /// The ranks that write a checkpoint together: the job, else the data-parallel group;
    /// `None` for a single process.
    fn checkpoint_group(&self) -> Result<Option<&ProcessGroup>> {
        match (&self.job, &self.data_parallel) {
            (Some(job), _) => Ok(Some(job)),
            _ if self.tensor_parallel.is_some() || self.pipeline.is_some() => Err(Error::Config(
                "checkpoints of a tensor-parallel or pipeline run need the job's group (Trainer::with_job)".into(),
            )),
            (None, Some((pg, _))) => Ok(Some(pg)),
            (None, None) => Ok(None),
        }
    }

    /// Records compute and communication spans of every step, and writes them (every rank's,
    /// on rank 0) to `path` in the Chrome trace format when [`Trainer::fit`] ends.
    pub fn with_trace(mut self, path: std::path::PathBuf) -> Self {
        weft_dist::trace::enable();
        self.trace = Some(path);
        self
    }

    /// Trains data-parallel over `pg`: the model's parameters are broadcast from rank 0 now,
    /// gradients are averaged over the group in every step (buckets all-reduced while backward
    /// runs), the logged loss is the mean over the group, and only rank 0 writes checkpoints.
    /// Each rank is given its own share of every batch; see [`shard_rows`].
    pub fn with_data_parallel(mut self, pg: ProcessGroup, options: DdpOptions) -> Result<Self> {
        let ddp = DataParallel::new(self.params.clone(), &pg, options)?;
        self.data_parallel = Some((pg, Replicas::Plain(ddp)));
        Ok(self)
    }

    /// Trains data-parallel over `pg` with ZeRO stage `options.stage` (1-3): the optimizer
    /// updates only this rank's pieces of the parameters (see [`weft_dist::zero`]), the global
    /// gradient norm is computed across the shards, checkpoints hold the whole (consolidated)
    /// state, and at stage 3 the model's units are gathered and freed around their forward and
    /// backward through the model's context. The parameter groups are rebuilt from the pieces
    /// (weight decay for pieces of parameters of two or more dims, as [`Trainer::new`]).
    pub fn with_zero(mut self, pg: ProcessGroup, options: ZeroOptions) -> Result<Self> {
        // a pipeline stage shards the units it holds
        let mut units = self.model.units();
        units.retain(|u| self.params.iter().any(|(n, _)| n.starts_with(&format!("{u}."))));
        let zero = Arc::new(ShardedDataParallel::new(self.params.clone(), &units, &pg, options)?);
        let weight_decay = self.groups.first().map_or(0.0, |g| g.weight_decay);
        let pieces = zero
            .pieces()
            .iter()
            .map(|p| (p.name.clone(), p.tensor.clone(), p.param_shape.len()));
        self.groups = decay_groups(pieces.collect(), weight_decay);
        if zero.stage() == 3 {
            self.model
                .context()
                .set_unit_hooks(Some(Arc::new(ZeroUnits(zero.clone()))));
        }
        self.data_parallel = Some((pg, Replicas::Sharded(zero)));
        Ok(self)
    }

    /// The ZeRO wrapper, when training with one.
    fn zero(&self) -> Option<&Arc<ShardedDataParallel>> {
        match &self.data_parallel {
            Some((_, Replicas::Sharded(z))) => Some(z),
            _ => None,
        }
    }

    /// ZeRO stage 3: the model's parameters whole again (after training, or to save them).
    fn gather_parameters(&self) -> Result<()> {
        if let Some(z) = self.zero() {
            z.gather_parameters()?;
        }
        Ok(())
    }

    /// The data-parallel group's (rank, size); (0, 1) without one.
    pub fn rank_and_size(&self) -> (usize, usize) {
        self.data_parallel
            .as_ref()
            .map_or((0, 1), |(pg, _)| (pg.rank(), pg.size()))
    }

    /// `values` summed over the data-parallel group (unchanged without one).
    fn sum_over_ranks(&self, values: Vec<f64>) -> Result<Vec<f64>> {
        let Some((pg, _)) = &self.data_parallel else {
            return Ok(values);
        };
        let n = values.len();
        let t = Tensor::from_vec(values, &[n])?;
        pg.all_reduce(&t, ReduceOp::Sum)?.wait()?;
        Ok(t.to_vec::<f64>()?)
    }

    /// Clips the global gradient norm to `max_norm` before each update.
    pub fn with_grad_clip(mut self, max_norm: Option<f64>) -> Self {
        self.grad_clip = max_norm;
        self
    }

    /// Calls callbacks every `n` steps (and at the last step).
    pub fn with_log_every(mut self, n: usize) -> Self {
        self.log_every = n.max(1);
        self
    }

    pub fn with_callback(mut self, c: impl Callback + 'static) -> Self {
        self.callbacks.push(Box::new(c));
        self
    }

    pub fn with_checkpoints(mut self, policy: CheckpointPolicy) -> Self {
        self.checkpoints = Some(policy);
        self
    }

    /// Every `every` steps, the mean loss over `batches` evaluation batches from `batch`.
    pub fn with_eval(mut self, every: usize, batches: usize, batch: BatchFn) -> Self {
        if every > 0 && batches > 0 {
            self.eval = Some((every, batches, batch));
        }
        self
    }

    /// One step on `(x, y)` at index `step`.
    pub fn train_step(&mut self, step: usize, x: &Tensor, y: &Tensor) -> Result<StepRecord> {
        let t0 = Instant::now();
        let lr = self.schedule.lr_at(step);
        let _step_span = span("compute", "step");
        if let Some(z) = self.zero() {
            z.begin_forward()?;
        }
        // a pipeline runs forward and backward passes together, micro-batch by micro-batch
        let (local_loss, loss, activation_bytes) = match &self.pipeline {
            Some(p) => {
                let replicas = self.data_parallel.as_ref().map(|(_, r)| r);
                let (value, peaks) =
                    p.run_step(x, y, &mut |out, seed, last| micro_backward(replicas, out, seed, last))?;
                (value, None, Some(peaks))
            }
            None => {
                let _s = span("compute", "forward");
                let loss = self.model.loss(x, y)?;
                (loss.item()?, Some(loss), None)
            }
        };
        let (_, ranks) = self.rank_and_size();
        // the mean over the global batch: every rank's share has the same size
        let loss_value = self.sum_over_ranks(vec![local_loss])?[0] / ranks as f64;
        if !loss_value.is_finite() {
            return Err(Error::Run(format!("step {step}: the loss is {loss_value}")));
        }
        if let Some(loss) = loss {
            let _s = span("compute", "backward");
            loss.backward()?;
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
        // the groups hold every parameter (or this rank's pieces of them)
        let params: Vec<Tensor> = self
            .groups
            .iter()
            .flat_map(|g| g.params.iter().map(|(_, p)| p.clone()))
            .collect();
        let state_bytes = self.state_bytes(&params);
        let _s = span("compute", "clip and optimizer step");
        let grad_norm = if self.zero().is_some() || self.tensor_parallel.is_some() || self.pipeline.is_some() {
            let total = self.sharded_grad_norm()?;
            if let Some(max) = self.grad_clip {
                clip_to_norm(&params, max, total)?;
            }
            total
        } else {
            match self.grad_clip {
                Some(max) => clip_grad_norm(&params, max)?,
                None => grad_norm(&params)?,
            }
        };
        self.optimizer.step(&self.groups, lr)?;
        match self.zero() {
            Some(z) => z.after_step()?,
            None => params.iter().for_each(|p| p.set_grad(None)),
        }
        let step_ms = t0.elapsed().as_secs_f64() * 1e3;
        let (items, key) = if x.dtype() == weft_core::DType::I64 {
            (x.numel() * ranks, "tokens_per_s")
        } else {
            (x.shape()[0] * ranks, "samples_per_s")
        };
        Ok(StepRecord {
            step,
            loss: loss_value,
            lr,
            grad_norm,
            step_ms,
            items_per_s: items as f64 / (step_ms / 1e3),
            items_key: key,
            state_bytes,
            activation_bytes,
        })
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

    /// Mean loss over the evaluation batches, in eval mode without gradients. Data-parallel
    /// ranks share the batches out (batch `i` on rank `i mod size`) and sum their results.
    pub fn evaluate(&self) -> Result<Option<f64>> {
        let Some((_, n, batch)) = &self.eval else {
            return Ok(None);
        };
        let (rank, ranks) = self.rank_and_size();
        let ctx = self.model.context();
        ctx.set_training(false);
        let zero = self.zero();
        let local = no_grad(|| -> Result<f64> {
            let mut total = 0.0;
            // ZeRO stage 3 gathers parameters in every forward: every rank runs as many (the
            // ones past the end repeat a batch and are not counted)
            let rounds = if zero.is_some_and(|z| z.stage() == 3) {
                n.div_ceil(ranks)
            } else {
                (*n + ranks - 1 - rank) / ranks
            };
            for k in 0..rounds {
                let i = rank + k * ranks;
                let (x, y) = batch(i % n)?;
                if let Some(z) = zero {
                    z.begin_forward()?;
                }
                let loss = match &self.pipeline {
                    Some(p) => p.forward_loss(&x, &y)?,
                    None => self.model.loss(&x, &y)?.item()?,
                };
                if let Some(z) = zero {
                    z.end_forward()?;
                }
                if i < *n {
                    total += loss;
                }
            }
            Ok(total)
        });
        ctx.set_training(true);
        let total = self.sum_over_ranks(vec![local?])?[0];
        Ok(Some(total / *n as f64))
    }

    /// Restores the newest complete checkpoint of the policy's folder, if any; returns the step
    /// to continue from.
    pub fn resume(&mut self) -> Result<usize> {
        let Some(policy) = &self.checkpoints else {
            return Err(Error::Config("resume needs train.checkpoint_dir".into()));
        };
        match checkpoint::latest(&policy.dir)? {
            None => Ok(0),
            Some(dir) => self.load_checkpoint(&dir),
        }
    }

    /// Restores checkpoint folder `ckpt` (or the newest one inside a checkpoint directory),
    /// whatever layout wrote it; returns the step to continue from. Every rank reads the whole
    /// tensors and keeps its own part of them.
    pub fn load_checkpoint(&mut self, ckpt: &std::path::Path) -> Result<usize> {
        let dir = checkpoint::resolve(ckpt)?;
        self.gather_parameters()?;
        let mut loaded = checkpoint::read(&dir)?;
        self.tensor_parallel_parts(&mut loaded.params, false)?;
        weft_nn::state_dict::load_state_dict(
            self.model.as_ref(),
            &loaded.params,
            self.model.aliases(),
            &dir.display().to_string(),
        )?;
        // a pipeline stage keeps the state of its own parameters only
        let mine: std::collections::BTreeSet<&str> = self.params.iter().map(|(n, _)| n.as_str()).collect();
        loaded.optimizer.retain(|key, _| mine.contains(whole::param_of(key)));
        self.tensor_parallel_parts(&mut loaded.optimizer, true)?;
        match self.zero() {
            Some(z) => self.optimizer.load_state(&z.shard_state(&loaded.optimizer)?)?,
            None => self.optimizer.load_state(&loaded.optimizer)?,
        }
        self.model.context().set_rng_offset(loaded.state.rng_offset);
        Ok(loaded.state.step)
    }

    /// Hands this rank's share of the state before step `next_step` (copies of the pieces it
    /// owns; no communication but, once, agreeing on a nonce) to the background writer, which
    /// writes it while training goes on; rank 0's writer completes the checkpoint when every
    /// rank's files are written.
    fn save(&mut self, next_step: usize) -> Result<()> {
        let Some(policy) = &self.checkpoints else {
            return Ok(());
        };
        let _s = span("checkpoint", format!("copy step {next_step}"));
        let group = self.checkpoint_group()?.cloned();
        let nonce = match (self.checkpoint_nonce, &group) {
            (Some(n), _) => n,
            (None, None) => checkpoint::new_nonce(),
            (None, Some(g)) => {
                let t = Tensor::from_vec(vec![checkpoint::new_nonce() as f64], &[1])?;
                g.broadcast(&t, 0)?.wait()?;
                t.to_vec::<f64>()?[0] as u64
            }
        };
        self.checkpoint_nonce = Some(nonce);
        let shard = self.local_shard()?;
        let state = CheckpointState {
            step: next_step,
            rng_offset: self.model.context().rng_offset(),
            extra: self.checkpoint_extra.clone(),
        };
        let pending = checkpoint::Pending {
            dir: policy.dir.clone(),
            shard,
            state,
            aliases: self
                .model
                .aliases()
                .iter()
                .map(|(a, c)| (a.to_string(), c.to_string()))
                .collect(),
            keep: policy.keep,
            coordination: group.map(|group| checkpoint::Coordination { group, nonce }),
        };
        self.checkpoint_writer.submit(pending)
    }

    /// Saves the state before step `next_step` into the policy's folder (no-op without one)
    /// and waits until the checkpoint is complete. Every rank of the job must call it.
    pub fn save_checkpoint(&mut self, next_step: usize) -> Result<()> {
        self.save(next_step)?;
        self.checkpoint_writer.finish()
    }

    /// Runs steps `start..end`, fetching batches from `batches` (a background thread prepares the
    /// next ones), calling callbacks, evaluating and checkpointing as configured.
    pub fn fit(&mut self, batches: BatchFn, start: usize, end: usize) -> Result<()> {
        let producer = batches.clone();
        let mut prefetch =
            weft_data::Prefetcher::<(Tensor, Tensor), Error>::new(start..end, 2, move |step| producer(step))?;
        for step in start..end {
            let (x, y) = prefetch
                .next()
                .ok_or_else(|| Error::Run(format!("step {step}: the batch producer stopped")))??;
            let record = self.train_step(step, &x, &y)?;
            if step % self.log_every == 0 || step + 1 == end {
                for c in &mut self.callbacks {
                    c.on_step(&record)?;
                }
            }
            if let Some((every, _, _)) = &self.eval {
                if (step + 1) % every == 0 || step + 1 == end {
                    if let Some(v) = self.evaluate()? {
                        for c in &mut self.callbacks {
                            c.on_eval(step, v)?;
                        }
                    }
                }
            }
            if let Some(policy) = &self.checkpoints {
                if (policy.every > 0 && (step + 1) % policy.every == 0) || step + 1 == end {
                    self.save(step + 1)?;
                }
            }
        }
        // the last checkpoint is complete before the run is
        self.checkpoint_writer.finish()?;
        for c in &mut self.callbacks {
            c.on_end()?;
        }
        // leave the model whole for whatever comes next (sampling, saving, another fit)
        self.gather_parameters()?;
        if let Some(path) = &self.trace {
            let pg = self.job.as_ref().or(self.data_parallel.as_ref().map(|(pg, _)| pg));
            weft_dist::trace::gather_and_write(pg, path)?;
        }
        Ok(())
    }
}

/// Rows `[rank * b, (rank + 1) * b)` of `t`, `b = rows / ranks`: a data-parallel rank's share of
/// a global batch (dim 0), so that `ranks` ranks together see exactly the batch one process
/// would. Errors when the rows do not split evenly.
pub fn shard_rows(t: &Tensor, rank: usize, ranks: usize) -> Result<Tensor> {
    let rows = t.shape().first().copied().unwrap_or(0);
    if ranks == 0 || rows % ranks != 0 || rank >= ranks {
        return Err(Error::Config(format!(
            "data: a global batch of {rows} rows does not split evenly across {ranks} data-parallel ranks"
        )));
    }
    let b = rows / ranks;
    Ok(t.narrow(0, rank * b, b)?.contiguous_copy()?)
}

/// nanoGPT's parameter groups: `weight_decay` for parameters of two or more dims (matrices,
/// embeddings), none for biases and norm weights. Each entry is `(name, tensor the optimizer
/// updates, dims of the whole parameter)`: the tensor may be a 1-D ZeRO piece of it.
fn decay_groups(params: Vec<(String, Tensor, usize)>, weight_decay: f64) -> Vec<ParamGroup> {
    let (decay, no_decay): (Vec<_>, Vec<_>) = params.into_iter().partition(|(_, _, dims)| *dims >= 2);
    let named = |v: Vec<(String, Tensor, usize)>| v.into_iter().map(|(n, t, _)| (n, t)).collect();
    vec![
        ParamGroup::new(named(decay), weight_decay),
        ParamGroup::new(named(no_decay), 0.0),
    ]
}

/// Whole parameters with their own dims, for [`decay_groups`].
fn whole_dims(params: &[(String, Tensor)]) -> Vec<(String, Tensor, usize)> {
    params.iter().map(|(n, p)| (n.clone(), p.clone(), p.rank())).collect()
}

/// One micro-batch's backward from `out` with gradient `seed`: gradients accumulate locally
/// (data-parallel averaging deferred, as `no_sync`) except on the step's `last` micro-batch.
fn micro_backward(replicas: Option<&Replicas>, out: &Tensor, seed: &Tensor, last: bool) -> Result<()> {
    let run = || out.backward_with(seed);
    match (replicas, last) {
        (Some(Replicas::Plain(ddp)), false) => ddp.no_sync(run)?,
        (Some(Replicas::Sharded(zero)), false) => zero.no_sync(run)?,
        _ => run()?,
    }
    Ok(())
}
