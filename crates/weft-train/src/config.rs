//! The run configuration (`run.toml`): parsing, `--set` overrides, validation. Every error names
//! the file and the key (`optim.lr`), or the path of a missing file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A whole run: what `weft train --config run.toml` reads.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    pub model: ModelConfig,
    #[serde(default)]
    pub init: InitConfig,
    pub data: DataConfig,
    pub optim: OptimConfig,
    #[serde(default)]
    pub schedule: ScheduleConfig,
    pub train: TrainConfig,
    #[serde(default)]
    pub parallel: ParallelConfig,
    /// The folder relative paths are resolved against (the config file's folder).
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// `[model]`: which model and its sizes.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ModelConfig {
    Mlp { in_features: usize, hidden: Vec<usize>, out_features: usize, activation: String },
    Convnet { in_channels: usize, image_size: usize, channels: Vec<usize>, num_classes: usize },
    Gpt { vocab_size: usize, block_size: usize, n_layer: usize, n_head: usize, n_embd: usize, bias: bool, dropout: f64 },
}

/// `[init]`: start from a safetensors state dict instead of the seeded initialisation.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitConfig {
    pub from: Option<PathBuf>,
}

/// `[data]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum DataConfig {
    /// A safetensors file with `inputs` `[S, B, ...]` and `targets` `[S, B, ...]`; step `i` uses
    /// row `i mod S`.
    Batches { path: PathBuf },
    /// Character-level text; windows of the model's `block_size`.
    Text {
        path: PathBuf,
        batch_size: usize,
        #[serde(default = "default_val_fraction")]
        val_fraction: f64,
    },
    /// Numeric features plus a label column (`.csv` or `.csv.gz`).
    Csv {
        path: PathBuf,
        label_column: LabelColumnConfig,
        batch_size: usize,
        #[serde(default = "default_val_fraction")]
        val_fraction: f64,
        #[serde(default = "default_feature_scale")]
        feature_scale: f64,
    },
}

/// A label column by index (0-based, negative from the end) or by header name.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum LabelColumnConfig {
    Index(i64),
    Name(String),
}

fn default_val_fraction() -> f64 {
    0.1
}

fn default_feature_scale() -> f64 {
    1.0
}

/// `[optim]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimConfig {
    /// `sgd` | `adam` | `adamw`.
    pub kind: String,
    pub lr: f64,
    pub betas: Option<[f64; 2]>,
    pub eps: Option<f64>,
    #[serde(default)]
    pub weight_decay: f64,
    #[serde(default)]
    pub momentum: f64,
    #[serde(default)]
    pub dampening: f64,
    #[serde(default)]
    pub nesterov: bool,
    /// Global gradient-norm clipping threshold.
    pub grad_clip: Option<f64>,
}

/// `[schedule]`: learning rate per step.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ScheduleConfig {
    /// `optim.lr` at every step.
    #[default]
    Constant,
    /// nanoGPT's `get_lr`: linear warmup, cosine decay to `min_lr` at `decay_steps`, then `min_lr`.
    Cosine { warmup_steps: usize, decay_steps: usize, min_lr: f64 },
}

/// `[train]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    pub steps: usize,
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default = "default_log_every")]
    pub log_every: usize,
    /// JSON-lines metrics file.
    pub metrics: Option<PathBuf>,
    /// Evaluate on the validation split every this many steps (0: never).
    #[serde(default)]
    pub eval_every: usize,
    /// Batches per evaluation.
    #[serde(default = "default_eval_batches")]
    pub eval_batches: usize,
    pub checkpoint_dir: Option<PathBuf>,
    /// Save every this many steps (0: only at the end, when `checkpoint_dir` is set).
    #[serde(default)]
    pub checkpoint_every: usize,
    /// Complete checkpoints to keep (older ones are deleted).
    #[serde(default = "default_keep")]
    pub keep_checkpoints: usize,
    /// For gpt on text data: characters to generate and print after training (0: none).
    #[serde(default)]
    pub sample_tokens: usize,
}

fn default_seed() -> u64 {
    1337
}
fn default_log_every() -> usize {
    10
}
fn default_eval_batches() -> usize {
    10
}
fn default_keep() -> usize {
    3
}

/// `[parallel]`: parsed and validated; only the single-process layout runs today.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelConfig {
    #[serde(default = "one")]
    pub dp: usize,
    #[serde(default = "one")]
    pub tp: usize,
    #[serde(default = "one")]
    pub pp: usize,
    #[serde(default)]
    pub zero: usize,
    #[serde(default = "one")]
    pub micro_batches: usize,
    #[serde(default = "default_pp_schedule")]
    pub schedule: String,
}

fn one() -> usize {
    1
}
fn default_pp_schedule() -> String {
    "1f1b".into()
}

impl Default for ParallelConfig {
    fn default() -> Self {
        ParallelConfig { dp: 1, tp: 1, pp: 1, zero: 0, micro_batches: 1, schedule: default_pp_schedule() }
    }
}

/// Parses a `section.key=value` override; the value is TOML (`3`, `0.1`, `true`, `[1, 2]`, `"x"`)
/// or, failing that, a bare string.
fn apply_override(table: &mut toml::Table, spec: &str) -> Result<()> {
    let (key, raw) = spec
        .split_once('=')
        .ok_or_else(|| Error::Config(format!("--set {spec:?}: expected section.key=value")))?;
    let parts: Vec<&str> = key.trim().split('.').collect();
    if parts.len() != 2 || parts.iter().any(|p| p.is_empty()) {
        return Err(Error::Config(format!("--set {spec:?}: the key must be section.key")));
    }
    let value: toml::Value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let section = table
        .entry(parts[0].to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .ok_or_else(|| Error::Config(format!("--set {spec:?}: {} is not a section", parts[0])))?;
    section.insert(parts[1].to_string(), value);
    Ok(())
}

impl RunConfig {
    /// Reads `path`, applies `overrides` (`section.key=value`), and validates.
    pub fn load(path: &Path, overrides: &[String]) -> Result<RunConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, &path.display().to_string(), base, overrides)
    }

    /// Parses config text; `source` names it in errors, `base_dir` anchors relative paths.
    pub fn parse(text: &str, source: &str, base_dir: PathBuf, overrides: &[String]) -> Result<RunConfig> {
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e.span().map(|s| text[..s.start].lines().count().max(1));
            let at = line.map(|l| format!(" (line {l})")).unwrap_or_default();
            Error::Config(format!("{source}{at}: {}", e.message().trim()))
        })?;
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        let mut config: RunConfig = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let path = e.path().to_string();
            let msg = e.into_inner().to_string();
            Error::Config(format!("{source}: {path}: {}", msg.trim()))
        })?;
        config.base_dir = base_dir;
        config.validate(source)?;
        Ok(config)
    }

    /// Resolves a path from the config against the config file's folder.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }

    fn validate(&self, source: &str) -> Result<()> {
        let bad = |key: &str, msg: String| Err(Error::Config(format!("{source}: {key}: {msg}")));
        let o = &self.optim;
        if !["sgd", "adam", "adamw"].contains(&o.kind.as_str()) {
            return bad("optim.kind", format!("{:?} is not one of sgd, adam, adamw", o.kind));
        }
        if !(o.lr.is_finite() && o.lr >= 0.0) {
            return bad("optim.lr", format!("{} must be a finite non-negative number", o.lr));
        }
        if o.kind == "sgd" && (o.betas.is_some() || o.eps.is_some()) {
            return bad("optim.betas/eps", "apply to adam and adamw, not sgd".into());
        }
        if o.kind != "sgd" && (o.momentum != 0.0 || o.nesterov || o.dampening != 0.0) {
            return bad("optim.momentum/nesterov/dampening", format!("apply to sgd, not {}", o.kind));
        }
        if let Some(c) = o.grad_clip {
            if !(c.is_finite() && c > 0.0) {
                return bad("optim.grad_clip", format!("{c} must be positive"));
            }
        }
        if self.train.steps == 0 {
            return bad("train.steps", "must be at least 1".into());
        }
        if self.train.log_every == 0 {
            return bad("train.log_every", "must be at least 1".into());
        }
        let p = &self.parallel;
        for (key, v) in [("parallel.dp", p.dp), ("parallel.tp", p.tp), ("parallel.pp", p.pp), ("parallel.micro_batches", p.micro_batches)] {
            if v == 0 {
                return bad(key, "must be at least 1".into());
            }
            if v != 1 {
                return bad(key, format!("{v}: parallel training is not available yet; only 1 runs"));
            }
        }
        if p.zero > 3 {
            return bad("parallel.zero", format!("{} is not a ZeRO stage (0-3)", p.zero));
        }
        if p.zero != 0 {
            return bad("parallel.zero", format!("{}: ZeRO sharding is not available yet; only 0 runs", p.zero));
        }
        if !["1f1b", "gpipe"].contains(&p.schedule.as_str()) {
            return bad("parallel.schedule", format!("{:?} is not one of 1f1b, gpipe", p.schedule));
        }
        match &self.data {
            DataConfig::Text { batch_size, val_fraction, .. } | DataConfig::Csv { batch_size, val_fraction, .. } => {
                if *batch_size == 0 {
                    return bad("data.batch_size", "must be at least 1".into());
                }
                if !(0.0..1.0).contains(val_fraction) {
                    return bad("data.val_fraction", format!("{val_fraction} is outside [0, 1)"));
                }
            }
            DataConfig::Batches { .. } => {}
        }
        if matches!(self.data, DataConfig::Text { .. }) && !matches!(self.model, ModelConfig::Gpt { .. }) {
            return bad("data.kind", "text data needs model.kind = \"gpt\"".into());
        }
        Ok(())
    }
}
