//! The model, optimizer and schedule of a run config's sections.

use std::sync::Arc;

use weft_models::convnet::ConvNet;
use weft_models::gpt::Gpt;
use weft_models::llama::Llama;
use weft_models::mlp::MlpModel;
use weft_models::{LanguageModel, Model};
use weft_nn::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use weft_nn::schedule::{DecayShape, Schedule};

use crate::config::{ModelConfig, OptimConfig, ScheduleConfig};
use crate::error::{Error, Result};

/// The model of a `[model]` section, initialised from `seed`.
pub fn build_model(cfg: &ModelConfig, seed: u64) -> Result<Arc<dyn Model>> {
    Ok(match cfg {
        ModelConfig::Mlp(m) => Arc::new(MlpModel::new(m.to_config()?, seed)?),
        ModelConfig::Convnet(m) => Arc::new(ConvNet::new(m.to_config(), seed)?),
        ModelConfig::Gpt(_) | ModelConfig::Llama(_) => {
            let lm: Arc<dyn LanguageModel> = Arc::from(build_language_model(cfg, seed)?);
            lm
        }
    })
}

/// The language model (gpt, llama) of a `[model]` section, initialised from `seed`.
pub(crate) fn build_language_model(cfg: &ModelConfig, seed: u64) -> Result<Box<dyn LanguageModel>> {
    Ok(match cfg {
        ModelConfig::Gpt(g) => Box::new(Gpt::new(g.to_config(), seed)?),
        ModelConfig::Llama(l) => Box::new(Llama::new(l.to_config(), seed)?),
        ModelConfig::Mlp(_) | ModelConfig::Convnet(_) => {
            return Err(Error::Config(
                "model.kind: expected a language model (gpt or llama)".into(),
            ))
        }
    })
}

/// The optimizer of an `[optim]` section.
pub fn build_optimizer(o: &OptimConfig) -> Result<Box<dyn Optimizer>> {
    let betas = o.betas.map(|b| (b[0], b[1]));
    Ok(match o.kind.as_str() {
        "sgd" => Box::new(Sgd::new(SgdConfig {
            momentum: o.momentum,
            dampening: o.dampening,
            nesterov: o.nesterov,
        })?),
        "adam" | "adamw" => {
            let d = AdamConfig::default();
            let cfg = AdamConfig {
                betas: betas.unwrap_or(d.betas),
                eps: o.eps.unwrap_or(d.eps),
                decoupled: o.kind == "adamw",
            };
            Box::new(Adam::new(cfg)?)
        }
        k => {
            return Err(Error::Config(format!(
                "optim.kind: {k:?} is not one of sgd, adam, adamw"
            )))
        }
    })
}

/// The schedule of a `[schedule]` section, peaking at `lr`, for a run of `steps` optimizer
/// steps (the end of `wsd`'s decay unless it names `total_steps`).
pub fn build_schedule(s: &ScheduleConfig, lr: f64, steps: usize) -> Result<Schedule> {
    let schedule = match s {
        ScheduleConfig::Constant => Schedule::Constant { lr },
        ScheduleConfig::Cosine(c) => Schedule::Cosine {
            lr,
            warmup_steps: c.warmup_steps,
            decay_steps: c.decay_steps,
            min_lr: c.min_lr,
        },
        ScheduleConfig::Linear(c) => Schedule::Linear {
            lr,
            warmup_steps: c.warmup_steps,
            decay_steps: c.decay_steps,
            min_lr: c.min_lr,
        },
        ScheduleConfig::Wsd(w) => Schedule::Wsd {
            lr,
            warmup_steps: w.warmup_steps,
            decay_steps: w.decay_steps,
            total_steps: w.total_steps.unwrap_or(steps),
            min_lr: w.min_lr,
            shape: DecayShape::parse(&w.decay_shape).ok_or_else(|| {
                Error::Config(format!(
                    "schedule.decay_shape: {:?} is not one of linear, cosine, sqrt",
                    w.decay_shape
                ))
            })?,
        },
    };
    schedule.validate().map_err(|e| match e {
        // the message names the key; the function that checked it means nothing to a user
        weft_core::Error::Invalid { msg, .. } => Error::Config(format!("schedule: {msg}")),
        other => Error::Config(format!("schedule: {other}")),
    })?;
    Ok(schedule)
}
