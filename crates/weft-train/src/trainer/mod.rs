//! The training loop, usable from Rust without any config file.

use std::sync::Arc;

use weft_core::{no_grad, Tensor};
use weft_dist::{DataParallel, DdpOptions, ProcessGroup, ReduceOp, ShardedDataParallel, ZeroOptions};
use weft_models::Model;
use weft_nn::optim::{Optimizer, ParamGroup};
use weft_nn::schedule::Schedule;

use crate::checkpoint;
use crate::error::{Error, Result};
use crate::pipeline::Pipeline;
use crate::replicas::{Replicas, ZeroUnits};

pub(crate) mod captured_update;
mod checkpointing;
pub(crate) mod compiled;
mod fit;
mod records;
mod shards;
mod step;
mod whole;

pub(crate) use checkpointing::check_checkpoint_model;
pub use fit::FitSummary;
pub use records::{Callback, EvalRecord, StepRecord};

/// A function from a step (or evaluation batch index) to `(inputs, targets)`.
pub type BatchFn = Arc<dyn Fn(usize) -> Result<(Tensor, Tensor)> + Send + Sync>;

/// Where and how often to save checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointPolicy {
    pub dir: std::path::PathBuf,
    /// Every this many steps (0: only at the end).
    pub every: usize,
    /// This run's newest checkpoints kept (older ones of the run are deleted; other runs'
    /// checkpoints and folders that do not verify never are).
    pub keep: usize,
    /// A fresh run may start in a folder holding another run's checkpoints, removing them
    /// (otherwise it is refused: see [`checkpoint::Claim`]).
    pub overwrite: bool,
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
    /// Written into every checkpoint; a resumed run takes its checkpoint's.
    run_id: String,
    /// The checkpoint `resume` restored.
    resumed_from: Option<std::path::PathBuf>,
    /// The extra state of the checkpoint this run continues (its own folder's), once restored.
    continued_extra: Option<serde_json::Value>,
    /// The checkpoint folder, once claimed (locked on the job's rank 0) for this run.
    claim: Option<checkpoint::Claim>,
    /// Skip steps with a non-finite loss or gradient instead of failing.
    skip_nonfinite: bool,
    /// Steps skipped in the current `fit`.
    skipped_steps: usize,
    /// Show the progress display: `None` on a terminal only.
    progress: Option<bool>,
    /// Where the model lives: each batch is moved there.
    device: weft_core::Device,
    /// The autocast dtype of the forward passes (`None`: the parameters' dtype throughout).
    autocast: Option<weft_core::DType>,
    /// Micro-batches per optimizer step in [`Trainer::fit`] (gradient accumulation).
    grad_accum: usize,
    /// The captured step, when compiled mode is on (and not given up).
    compiled: Option<compiled::CompiledStep>,
    /// How the compiled step's kernels choose their variants.
    autotune: weft_core::graph::Autotune,
    /// Whether the compiled step recomputes cheap activations to lower its peak memory.
    recompute: bool,
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
            run_id: format!("{:013x}", checkpoint::new_nonce()),
            claim: None,
            resumed_from: None,
            continued_extra: None,
            skip_nonfinite: false,
            skipped_steps: 0,
            progress: None,
            device: weft_core::Device::Cpu,
            autocast: None,
            grad_accum: 1,
            compiled: None,
            autotune: weft_core::graph::Autotune::Heuristic,
            recompute: true,
        }
    }

    /// Compiled mode: each micro-batch's forward, loss and backward are captured as a graph at the
    /// first step and replayed after (see `weft_core::graph`); layouts and models that cannot be
    /// captured run eagerly, with one line saying why.
    pub fn with_compile(mut self, on: bool) -> Self {
        let (autotune, recompute) = (self.autotune, self.recompute);
        self.compiled = on.then(|| compiled::CompiledStep::new(autotune, recompute));
        self
    }

    /// Whether the compiled step recomputes cheap activations (elementwise results, norms, the
    /// activation of a fused linear) next to the backward that reads them, when that lowers the
    /// graph's peak memory (`weft_core::graph::remat`); on by default. Matters with
    /// [`Trainer::with_compile`].
    pub fn with_compile_recompute(mut self, on: bool) -> Self {
        self.recompute = on;
        if self.compiled.is_some() {
            self.compiled = Some(compiled::CompiledStep::new(self.autotune, on));
        }
        self
    }

    /// How the compiled step's kernels choose their variants (see
    /// `weft_core::graph::Autotune`); heuristic by default. Matters with [`Trainer::with_compile`].
    pub fn with_autotune(mut self, autotune: weft_core::graph::Autotune) -> Self {
        self.autotune = autotune;
        if self.compiled.is_some() {
            self.compiled = Some(compiled::CompiledStep::new(autotune, self.recompute));
        }
        self
    }

    /// Accumulates gradients over `k` micro-batches per optimizer step in [`Trainer::fit`]:
    /// step `i` trains on batches `i k .. i k + k` of the batch function (see
    /// [`Trainer::train_accumulated`]). 0 is taken as 1.
    pub fn with_grad_accum(mut self, k: usize) -> Self {
        self.grad_accum = k.max(1);
        self
    }

    /// Forward passes under autocast to `dtype` (`weft_core::autocast`; `None`: off), as
    /// `torch.autocast` around the forward and the loss. The backward runs outside it, on the
    /// dtypes the forward chose (except with a pipeline, whose schedule interleaves forward and
    /// backward passes: its whole step runs under autocast).
    pub fn with_autocast(mut self, dtype: Option<weft_core::DType>) -> Self {
        self.autocast = dtype;
        self
    }

    /// Runs on `device`, where the model's parameters must already be (built under
    /// `weft_nn::init::with_device`): every batch is moved there before its step.
    pub fn with_device(mut self, device: weft_core::Device) -> Self {
        self.device = device;
        self
    }

    pub fn device(&self) -> weft_core::Device {
        self.device
    }

    /// A step whose loss or gradients are not finite makes no update and is counted
    /// ([`StepRecord::skipped`]), as AMP's gradient scaler skips such steps; without it (the
    /// default) such a step stops the run with an error naming the step and the first
    /// parameter whose gradient is not finite.
    pub fn with_skip_nonfinite(mut self, skip: bool) -> Self {
        self.skip_nonfinite = skip;
        self
    }

    /// Shows (or hides) the progress display on the job's rank 0: a bar with the loss and the
    /// time left on a terminal, plain lines otherwise. By default it shows on a terminal only.
    pub fn with_progress(mut self, show: bool) -> Self {
        self.progress = Some(show);
        self
    }

    /// The id this run writes into its checkpoints.
    pub fn run_id(&self) -> &str {
        &self.run_id
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
            deferred: None,
        });
        self
    }

    /// The model's tensor-parallel group leaves the gradients of parameters whole on every
    /// rank in `deferred` (`weft_dist::tensor_parallel::TpProcessGroup::with_deferred_sums`):
    /// each step sums them over the group once, after its backward passes and the
    /// data-parallel reduction. Only where gradients stay whole until the update (no ZeRO
    /// sharding); after [`Trainer::with_tensor_parallel`].
    pub fn with_deferred_sums(mut self, deferred: std::sync::Arc<weft_nn::sequence_parallel::DeferredSums>) -> Self {
        if let Some(tp) = &mut self.tensor_parallel {
            tp.deferred = Some(deferred);
        }
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

    /// Records compute and communication spans of every step, and writes them (every rank's,
    /// on rank 0) to `path` in the Chrome trace format when [`Trainer::fit`] ends.
    pub fn with_trace(mut self, path: std::path::PathBuf) -> Self {
        weft_dist::trace::enable();
        self.trace = Some(path);
        self
    }

    /// Trains data-parallel over `pg`: the model's parameters are broadcast from rank 0 now,
    /// gradients are averaged over the group in every step (buckets all-reduced while backward
    /// runs, eager or replayed; after it at the step that captures a compiled graph), the logged
    /// loss is the mean over the
    /// group, and only rank 0 writes checkpoints. Each rank is given its own share of every
    /// batch; see [`shard_rows`].
    pub fn with_data_parallel(mut self, pg: ProcessGroup, mut options: DdpOptions) -> Result<Self> {
        // an interleaved stage's chunks each reduce after their own last backward
        if let Some(p) = &self.pipeline {
            options.bucket_breaks = p.chunk_starts().to_vec();
        }
        // the gradient hooks are registered at the first step that runs eagerly
        let ddp = DataParallel::new_unhooked(self.params.clone(), &pg, options)?;
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
        // stages 1 and 2: the gradient hooks are registered at the first step that runs eagerly
        let zero = Arc::new(match options.stage {
            1 | 2 => ShardedDataParallel::new_unhooked(self.params.clone(), &units, &pg, options)?,
            _ => ShardedDataParallel::new(self.params.clone(), &units, &pg, options)?,
        });
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

    /// Mean loss over the evaluation batches (and, for classifiers, the accuracy), in eval mode
    /// without gradients, as of `steps` steps done. Data-parallel ranks share the batches out
    /// (batch `i` on rank `i mod size`) and sum their results. `None` without evaluation data.
    pub fn evaluate(&self, steps: usize) -> Result<Option<EvalRecord>> {
        let Some((_, n, batch)) = &self.eval else {
            return Ok(None);
        };
        let (rank, ranks) = self.rank_and_size();
        let ctx = self.model.context();
        ctx.set_training(false);
        let zero = self.zero();
        // (loss sum, correct predictions, rows, whether the model counts correct predictions)
        let local = no_grad(|| -> Result<[f64; 4]> {
            let mut sums = [0.0; 4];
            // ZeRO stage 3 gathers parameters in every forward: every rank runs as many (the
            // ones past the end repeat a batch and are not counted)
            let rounds = if zero.is_some_and(|z| z.stage() == 3) {
                n.div_ceil(ranks)
            } else {
                n.saturating_sub(rank).div_ceil(ranks)
            };
            for k in 0..rounds {
                let i = rank + k * ranks;
                let (x, y) = batch(i % n)?;
                let (x, y) = (x.to(self.device)?, y.to(self.device)?);
                if let Some(z) = zero {
                    z.begin_forward()?;
                }
                let out = weft_core::autocast(self.autocast, || -> Result<weft_models::EvalOutput> {
                    Ok(match &self.pipeline {
                        Some(p) => weft_models::EvalOutput {
                            loss: p.forward_loss(&x, &y)?,
                            correct: None,
                            rows: 0,
                        },
                        None => self.model.evaluate(&x, &y)?,
                    })
                })?;
                if let Some(z) = zero {
                    z.end_forward()?;
                }
                if i < *n {
                    sums[0] += out.loss;
                    if let Some(c) = out.correct {
                        sums[1] += c as f64;
                        sums[2] += out.rows as f64;
                        sums[3] = 1.0;
                    }
                }
            }
            Ok(sums)
        });
        ctx.set_training(true);
        let sums = self.sum_over_ranks(local?.to_vec())?;
        let accuracy = (sums[3] > 0.0 && sums[2] > 0.0).then(|| sums[1] / sums[2]);
        Ok(Some(EvalRecord {
            step: steps,
            loss: sums[0] / *n as f64,
            accuracy,
        }))
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
