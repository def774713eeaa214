//! `weft evaluate`: a checkpoint's validation loss (and a classifier's accuracy) on a run
//! config's evaluation batches, computed by the trainer's own evaluation
//! ([`Trainer::evaluate`], as `train.eval_every` runs it) after loading the checkpoint's model
//! weights ([`Trainer::load_weights`], from any layout: its model config and tokenizer must be
//! the config's; the optimizer state is not read, so `[optim]` need not be the training run's).

use std::path::{Path, PathBuf};

use super::build::{build_model, build_optimizer, build_schedule};
use super::data::build_data;
use crate::checkpoint;
use crate::config::RunConfig;
use crate::error::{Error, Result};
use crate::trainer::Trainer;

/// What [`evaluate`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// The checkpoint folder read.
    pub checkpoint: PathBuf,
    /// The steps the checkpoint had trained.
    pub step: usize,
    /// The mean loss over the evaluation batches.
    pub loss: f64,
    /// A classifier's share of correct predictions.
    pub accuracy: Option<f64>,
    pub batches: usize,
}

/// Evaluates `ckpt` (a checkpoint folder, or the newest one of a checkpoint directory) on the
/// first `batches` evaluation batches of `config`'s data (default: `train.eval_batches`), in
/// one process, on `train.device` with `train.precision`: the batches and the loss of the
/// run's own evaluation at that step when they are the same data and count.
pub fn evaluate(config: &RunConfig, ckpt: &Path, batches: Option<usize>) -> Result<Evaluation> {
    let t = &config.train;
    let batches = batches.unwrap_or(t.eval_batches);
    if batches == 0 {
        return Err(Error::Config(
            "the number of evaluation batches must be at least 1 (train.eval_batches = 0)".into(),
        ));
    }
    let device: weft_core::Device = t
        .device
        .parse()
        .map_err(|e: String| Error::Config(format!("train.device: {e}")))?;
    weft_core::cuda::check(device).map_err(|e| Error::Config(format!("train.device: {e}")))?;
    let dir = checkpoint::resolve(ckpt)?;
    let data = build_data(config)?;
    let eval = data.eval.clone().ok_or_else(|| {
        Error::Config(
            "the data has no validation split to evaluate on (data.val_fraction = 0, or data of kind \"batches\")"
                .into(),
        )
    })?;
    eval(0).map(drop).map_err(|e| match data.eval_short {
        true => Error::Config(super::data::no_eval_batch(&e)),
        false => e,
    })?;
    let extra = serde_json::json!({
        "model": config.model,
        "tokenizer": data.tokenizer.as_ref().map(|t| t.to_json()),
    });
    // before a model of the config's size is built
    crate::trainer::check_checkpoint_model(
        &extra,
        &dir,
        "evaluate it with the run config that trained it (weft checkpoint inspect shows its model)",
    )?;
    let model = weft_nn::init::with_device(device, || build_model(&config.model, t.seed))?;
    // the trainer needs one; it never steps, and the checkpoint's optimizer state is not loaded
    let optimizer = build_optimizer(&config.optim)?;
    let schedule = build_schedule(&config.schedule, config.optim.lr, t.steps)?;
    let mut trainer = Trainer::new(model, optimizer, schedule, config.optim.weight_decay)
        .with_device(device)
        .with_autocast(
            t.autocast()
                .map_err(|e| Error::Config(format!("train.precision: {e}")))?,
        )
        .with_eval(1, batches, eval);
    // what `load_weights` compares with the checkpoint's own record
    trainer.checkpoint_extra = extra;
    let step = trainer.load_weights(&dir)?;
    let record = trainer
        .evaluate(step)?
        .ok_or_else(|| Error::Run("the trainer has no evaluation batches".into()))?;
    Ok(Evaluation {
        checkpoint: dir,
        step,
        loss: record.loss,
        accuracy: record.accuracy,
        batches,
    })
}
