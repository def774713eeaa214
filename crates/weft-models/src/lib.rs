//! Built-in models with PyTorch-compatible parameter names: [`Mlp`](mlp::MlpModel),
//! [`ConvNet`](convnet::ConvNet), [`Gpt`](gpt::Gpt) (nanoGPT's layout) and [`Llama`](llama::Llama)
//! (transformers' `LlamaForCausalLM` layout). Each ends in mean
//! cross-entropy over its targets.

#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

mod config_check;
pub mod convnet;
pub mod gpt;
pub mod hf;
mod kv_cache;
pub mod llama;
mod lm;
pub mod mlp;
pub mod sampling;
mod stage_cut;

pub use kv_cache::{CachedTokens, KvCache};
pub use lm::LanguageModel;
pub use sampling::Sampling;
pub use stage_cut::{StageCut, StageWeights};

use weft_core::{Result, Tensor};
use weft_nn::{Context, Module};

/// What evaluating one batch gives: its mean loss and, for a classifier, how many of its
/// predictions (the largest logit) were right.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalOutput {
    /// Mean loss over the batch.
    pub loss: f64,
    /// Rows whose predicted class is the target (classifiers only).
    pub correct: Option<usize>,
    /// Rows in the batch.
    pub rows: usize,
}

/// A model the trainer can run: parameters, a loss, and its mode/RNG context.
pub trait Model: Module + Send + Sync {
    /// Mean cross-entropy of one batch.
    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<Tensor>;

    /// The inference forward: class logits `[B, classes]` of a classifier's inputs, or next-token
    /// logits `[B, T, vocab]` of a language model's ids `[B, T]` (what `weft export onnx`
    /// exports).
    fn logits(&self, inputs: &Tensor) -> Result<Tensor>;

    /// The loss of one evaluation batch (called without gradients, in eval mode), and the
    /// correct predictions of a classifier. By default the loss alone.
    fn evaluate(&self, inputs: &Tensor, targets: &Tensor) -> Result<EvalOutput> {
        Ok(EvalOutput {
            loss: self.loss(inputs, targets)?.item()?,
            correct: None,
            rows: inputs.shape().first().copied().unwrap_or(0),
        })
    }

    /// The train/eval mode and dropout stream shared by the model's layers.
    fn context(&self) -> &Context;

    /// Makes now the tables a model grows on demand (llama's rotary embeddings) for sequences
    /// of up to `n` positions, so that later forwards only read them (a traced forward then sees
    /// the same tensors at every length). Fails, without aborting, when they cannot be
    /// allocated. Nothing by default.
    fn reserve_positions(&self, n: usize) -> Result<()> {
        let _ = n;
        Ok(())
    }

    /// `(alternative, canonical)` parameter names accepted when loading, and written as extra
    /// copies when saving (tied weights).
    fn aliases(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }

    /// Names of the model's units in forward order: groups of parameters (those named
    /// `"{unit}.*"`) whose forward runs inside [`Context::unit`], so that sharded data
    /// parallelism can hold only the running unit's parameters whole. Parameters outside every
    /// unit form the root unit. None by default.
    fn units(&self) -> Vec<String> {
        Vec::new()
    }

    /// How each tensor-parallel parameter is cut (by name); empty when the model is whole.
    fn splits(&self) -> Vec<(String, weft_nn::parallel::Split)> {
        Vec::new()
    }
}

/// A model that can be cut into pipeline stages: consecutive runs of its layers, each stage
/// passing its activations to the next.
pub trait StagedModel: Send + Sync {
    /// Stage `stage` of `stages`: from the batch's inputs (first stage) or the previous stage's
    /// activations, this stage's activations, or (last stage) the mean loss against `targets`.
    /// With one stage, the model's loss.
    fn stage_forward(&self, stage: usize, stages: usize, input: &Tensor, targets: &Tensor) -> Result<Tensor>;

    /// The parameters stage `stage` of `stages` uses, by name.
    fn stage_parameters(&self, stage: usize, stages: usize) -> Result<Vec<(String, Tensor)>>;

    /// The shape of the activations between stages for inputs of `input_shape`.
    fn activation_shape(&self, input_shape: &[usize]) -> Vec<usize>;

    /// Parameters used by more than one stage (weights tied across the first and last stage):
    /// their gradients are summed across those stages.
    fn shared_parameters(&self) -> Vec<String>;

    /// The mode and dropout stream the stages' layers share (recomputing a forward replays
    /// the stream from where the first pass began).
    fn stage_context(&self) -> &Context;
}

/// An error for a bad model configuration value.
pub(crate) fn config_error(key: &str, msg: impl std::fmt::Display) -> weft_core::Error {
    weft_core::Error::Invalid {
        op: "model config",
        msg: format!("model.{key}: {msg}"),
    }
}

/// [`Model::evaluate`] of a classifier whose `logits` (`[B, classes]`) were computed for
/// `targets` (`[B]`, class ids): mean cross-entropy and the rows whose largest logit is the
/// target.
pub fn evaluate_classifier(logits: &Tensor, targets: &Tensor) -> Result<EvalOutput> {
    let loss = logits.cross_entropy(targets, -100, 0.0)?.item()?;
    let predicted = logits.argmax(-1, false)?.to_vec::<i64>()?;
    let wanted = targets.to_vec::<i64>()?;
    let correct = predicted.iter().zip(&wanted).filter(|(p, t)| p == t).count();
    Ok(EvalOutput {
        loss,
        correct: Some(correct),
        rows: wanted.len(),
    })
}
