//! `weft graph dump`: the graph compiled mode captures for a run config's training step.

use weft_core::graph::{passes, trace, Graph};

use super::build::build_model;
use super::data::{build_data, check_data};
use crate::config::RunConfig;
use crate::error::{Error, Result};

/// The captured step of a run: one micro-batch's forward, loss and backward.
pub struct StepGraph {
    /// After the passes.
    pub graph: Graph,
    /// Nodes the capture recorded, before the passes.
    pub captured_nodes: usize,
    pub report: passes::PassReport,
}

/// Builds the config's model (its initialisation; `[init] from` is not read: shapes are what
/// matter) and the first batch of its data, and captures the step the trainer would compile,
/// on one process. Fails naming the reason when the step cannot be captured.
pub fn step_graph(config: &RunConfig) -> Result<StepGraph> {
    let data = build_data(config)?;
    check_data(config, &data)?;
    let (x, y) = (data.train)(0)?;
    let model = build_model(&config.model, config.train.seed)?;
    let params: Vec<_> = model.parameters().into_iter().map(|(_, p)| p).collect();
    let autocast = config
        .train
        .autocast()
        .map_err(|e| Error::Config(format!("train.precision: {e}")))?;
    let scale = (config.train.grad_accum > 1).then(|| 1.0 / config.train.grad_accum as f64);
    let step = |xs: &[weft_core::Tensor]| {
        crate::trainer::compiled::loss_and_grads(model.as_ref(), &params, autocast, scale, xs).map(|(out, _)| out)
    };
    let inputs = [x, y];
    let (_, mut captured) = trace(&inputs, step)?;
    if let Err(e) = &captured {
        if e.may_retry {
            // a cache the model fills at its first call (rotary tables) exists now
            captured = trace(&inputs, step)?.1;
        }
    }
    let mut graph = captured.map_err(|e| Error::Run(format!("the training step cannot be captured: {e}")))?;
    let captured_nodes = graph.nodes.len();
    let report = passes::optimize(&mut graph)?;
    Ok(StepGraph {
        graph,
        captured_nodes,
        report,
    })
}
