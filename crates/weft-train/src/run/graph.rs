//! `weft graph dump`: the graph compiled mode captures for a run config's training step.

use weft_core::graph::{passes::PassReport, remat::RematReport, Graph, GraphCache};
use weft_core::Tensor;

use super::build::{build_model, build_optimizer, build_schedule};
use super::data::{build_data, check_data};
use crate::config::RunConfig;
use crate::error::{Error, Result};
use crate::trainer::Trainer;

/// The captured step of a run: one micro-batch's forward, loss and backward.
pub struct StepGraph {
    /// After the passes.
    pub graph: Graph,
    pub report: PassReport,
    /// What recomputation did (`train.compile_recompute`; all zero when it is off).
    pub remat: RematReport,
}

/// Builds the config's model (its initialisation; `[init] from` is not read: shapes are what
/// matter) and the first batch of its data, and compiles the step the trainer would compile,
/// on one process (recomputing activations as `train.compile_recompute` says). Fails naming the reason when the step cannot be captured.
pub fn step_graph(config: &RunConfig) -> Result<StepGraph> {
    let cache = GraphCache::new(1).with_recompute(config.train.compile_recompute);
    with_step(config, cache, 2, |cache, inputs| {
        cache.graph_for(inputs).map(|graph| StepGraph {
            graph: graph.clone(),
            report: cache.pass_report(),
            remat: cache.remat_report(),
        })
    })
}

/// The whole step compiled mode replays on one process from the second step on: the last
/// micro-batch's forward, loss and backward (added to the earlier micro-batches' gradients with
/// `train.grad_accum` above 1), the gradients' norm, clipping and the optimizer's update. Trains
/// the config's model (initialised as [`step_graph`]'s) for the steps it takes to capture it,
/// at most three, on the first batches of its data, on the CPU; nothing is written. Fails naming
/// the reason when the whole step is not captured. It holds the optimizer's state as a run does
/// (Adam: two more tensors the size of the parameters).
pub fn whole_step_graph(config: &RunConfig) -> Result<StepGraph> {
    let data = build_data(config)?;
    check_data(config, &data)?;
    let model = build_model(&config.model, config.train.seed)?;
    let optimizer = build_optimizer(&config.optim)?;
    let schedule = build_schedule(&config.schedule, config.optim.lr, config.train.steps)?;
    let t = &config.train;
    let mut trainer = Trainer::new(model, optimizer, schedule, config.optim.weight_decay)
        .with_grad_clip(config.optim.grad_clip)
        .with_grad_accum(t.grad_accum)
        .with_skip_nonfinite(t.skip_nonfinite)
        .with_compile_recompute(t.compile_recompute)
        .with_compile(true)
        .with_autocast(
            t.autocast()
                .map_err(|e| Error::Config(format!("train.precision: {e}")))?,
        );
    let k = t.grad_accum.max(1);
    let mut why = String::new();
    for step in 0..3 {
        let batches = (0..k).map(|j| (data.train)(step * k + j)).collect::<Result<Vec<_>>>()?;
        trainer
            .train_accumulated(step, &batches)
            .map_err(|e| Error::Run(format!("step {} of the capture failed: {e}", step + 1)))?;
        match trainer.whole_step_graph() {
            Ok((graph, report, remat)) => return Ok(StepGraph { graph, report, remat }),
            Err(w) => why = w,
        }
    }
    Err(Error::Run(format!("the whole step cannot be captured: {why}")))
}

/// Captures the config's step as [`step_graph`] does, then replays it once with an autotuning
/// search (`weft graph tune`): every kernel call timed in each of its variants, the choices
/// written to the machine's cache file. With `fresh`, the cache file's choices are not used
/// (every call is timed again, and its choice replaced).
pub fn tune_step(config: &RunConfig, fresh: bool) -> Result<weft_core::graph::TuneReport> {
    if fresh {
        weft_core::tune::ignore_cache_file();
    }
    let cache = GraphCache::new(1).with_autotune(weft_core::graph::Autotune::Search);
    // capture, then the tuned replay
    with_step(config, cache, 3, |cache, _| cache.take_tune_report())
}

/// Calls the config's step through `cache` (up to `calls` times) until `done` gives a result:
/// a model that fills a cache at its first call (llama's rotary tables) is captured at its
/// second, as in the trainer.
fn with_step<T>(
    config: &RunConfig,
    mut cache: GraphCache,
    calls: usize,
    mut done: impl FnMut(&mut GraphCache, &[Tensor]) -> Option<T>,
) -> Result<T> {
    let data = build_data(config)?;
    check_data(config, &data)?;
    let (x, y) = (data.train)(0)?;
    let model = build_model(&config.model, config.train.seed)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, p)| p).collect();
    let autocast = config
        .train
        .autocast()
        .map_err(|e| Error::Config(format!("train.precision: {e}")))?;
    let scale = (config.train.grad_accum > 1).then(|| 1.0 / config.train.grad_accum as f64);
    let inputs = [x, y];
    for _ in 0..calls {
        cache.call_with_stream(&inputs, model.context(), |xs| {
            crate::trainer::compiled::loss_and_grads(model.as_ref(), &params, autocast, scale, xs).map(|(out, _)| out)
        })?;
        if let Some(why) = cache.eager_reason() {
            return Err(Error::Run(format!("the training step cannot be captured: {why}")));
        }
        if let Some(out) = done(&mut cache, &inputs) {
            return Ok(out);
        }
    }
    Err(Error::Run(
        "the training step cannot be captured: it makes tensors outside the op set at every call".into(),
    ))
}
