//! `[schedule]`: the learning rate per step.

use serde::Deserialize;

use super::by_kind;

/// `[schedule]`: learning rate per step.
#[derive(Debug, Clone, Default)]
pub enum ScheduleConfig {
    /// `optim.lr` at every step.
    #[default]
    Constant,
    /// nanoGPT's `get_lr`: linear warmup, cosine decay to `min_lr` at `decay_steps`, then `min_lr`.
    Cosine(CosineKeys),
    /// Linear warmup from 0, linear decay to `min_lr` at `decay_steps`, then `min_lr`.
    Linear(CosineKeys),
    /// Warmup, constant `optim.lr`, then a decay to `min_lr` over the last `decay_steps` steps
    /// before `total_steps` (by default `train.steps`).
    Wsd(WsdKeys),
}

/// `[schedule]` keys of `kind = "wsd"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WsdKeys {
    pub warmup_steps: usize,
    pub decay_steps: usize,
    pub min_lr: f64,
    /// The step at which the decay ends; `train.steps` when left out.
    pub total_steps: Option<usize>,
    /// `"linear"` (the default), `"cosine"` or `"sqrt"`.
    #[serde(default = "default_decay_shape")]
    pub decay_shape: String,
}

fn default_decay_shape() -> String {
    "linear".to_string()
}

/// `[schedule]` keys of `kind = "cosine"` and `kind = "linear"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CosineKeys {
    pub warmup_steps: usize,
    pub decay_steps: usize,
    pub min_lr: f64,
}

/// `[schedule]` of `kind = "constant"`: no other keys.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct NoKeys {}

impl<'de> Deserialize<'de> for ScheduleConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        by_kind(d, "schedule", &["constant", "cosine", "linear", "wsd"], |kind, v| {
            Ok(match kind {
                "constant" => {
                    let _: NoKeys = serde_path_to_error::deserialize(v)?;
                    ScheduleConfig::Constant
                }
                "linear" => ScheduleConfig::Linear(serde_path_to_error::deserialize(v)?),
                "wsd" => ScheduleConfig::Wsd(serde_path_to_error::deserialize(v)?),
                _ => ScheduleConfig::Cosine(serde_path_to_error::deserialize(v)?),
            })
        })
    }
}
