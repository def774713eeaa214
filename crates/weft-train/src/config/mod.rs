//! The run configuration (`run.toml`): parsing, `--set` overrides, validation. Every error names
//! the file and the key (`optim.lr`), or the path of a missing file.

use std::path::{Path, PathBuf};

use read::{key_of, model_from_hf_folder, syntax_error};
use serde::Deserialize;

use crate::error::{Error, Result};

mod bounds;
mod classifier_shapes;
mod data;
mod model;
mod overrides;
mod parallel;
mod read;
mod schedule;
mod track;
mod train;

pub use bounds::MAX_EVAL_BATCHES;
pub use data::{BatchesKeys, CsvKeys, DataConfig, LabelColumnConfig, TextKeys, TokensKeys};
pub use model::{ConvnetKeys, GptKeys, LlamaKeys, MlpKeys, ModelConfig, RopeScalingKeys};
pub use overrides::Overrides;
pub(crate) use parallel::uncapturable_layout;
pub use parallel::ParallelConfig;
pub use schedule::{CosineKeys, ScheduleConfig, WsdKeys};
pub use track::{value_text as track_value_text, TrackConfig};
pub use train::TrainConfig;

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
    #[serde(default)]
    pub track: TrackConfig,
    /// The folder relative paths are resolved against (the config file's folder).
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// Deserializes section `section` (`model`), whose `kind` key picks the struct for the other
/// keys. Unlike serde's internally tagged enums, errors keep the key's whole name
/// (`model.n_layer: invalid value ...`, `model.bias: missing field ...`).
pub(super) fn by_kind<'de, D: serde::Deserializer<'de>, T>(
    d: D,
    section: &str,
    kinds: &[&str],
    pick: impl Fn(&str, toml::Value) -> std::result::Result<T, serde_path_to_error::Error<toml::de::Error>>,
) -> std::result::Result<T, D::Error> {
    use serde::de::Error as _;
    let mut table = toml::Table::deserialize(d)?;
    let kind = match table.remove("kind") {
        Some(toml::Value::String(k)) => k,
        Some(other) => {
            return Err(D::Error::custom(format!(
                "{section}.kind: expected a string, got {other}"
            )))
        }
        None => {
            return Err(D::Error::custom(format!(
                "{section}: missing key `kind` (one of {})",
                kinds.join(", ")
            )))
        }
    };
    if !kinds.contains(&kind.as_str()) {
        return Err(D::Error::custom(format!(
            "{section}.kind: {kind:?} is not one of {}",
            kinds.join(", ")
        )));
    }
    pick(&kind, toml::Value::Table(table)).map_err(|e| {
        let path = e.path().to_string();
        let msg = e.into_inner().to_string();
        let first = msg.lines().next().unwrap_or_default().trim();
        let key = match key_of(&path, first).as_str() {
            "." => section.to_string(),
            key => format!("{section}.{key}"),
        };
        D::Error::custom(format!("{key}: {first}"))
    })
}

/// `[init]`: start from a safetensors state dict instead of the seeded initialisation.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitConfig {
    pub from: Option<PathBuf>,
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

/// The longest run config read, in bytes (one is a few kilobytes).
const MAX_CONFIG_BYTES: u64 = 16 << 20;

impl RunConfig {
    /// Reads `path`, applies `overrides` (`--unset` and `--set`), and validates. Relative paths
    /// in the file resolve against its folder, those given in `overrides` against the working
    /// directory.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<RunConfig> {
        use std::io::Read;
        // at most MAX_CONFIG_BYTES: `/dev/zero` was read until memory ran out (a pipe, as from
        // the shell's `<(...)`, is still read)
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text))
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(Error::Config(format!(
                "{}: longer than {MAX_CONFIG_BYTES} bytes: not a run config",
                path.display()
            )));
        }
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, &path.display().to_string(), base, overrides)
    }

    /// Parses config text; `source` names it in errors, `base_dir` anchors the text's relative
    /// paths.
    pub fn parse(text: &str, source: &str, base_dir: PathBuf, overrides: &Overrides) -> Result<RunConfig> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| Error::Config(syntax_error(source, text, &e)))?;
        overrides.apply(&mut table)?;
        model_from_hf_folder(&mut table, source, &base_dir)?;
        crate::plan_shape::check_auto(&table, source)?;
        let params = track::flatten(&table);
        let mut config: RunConfig = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let path = e.path().to_string();
            // the deserializer appends "in `section`" on a second line; the path already says it
            let msg = e.into_inner().to_string();
            let first = msg.lines().next().unwrap_or_default().trim().to_string();
            // a section read by `by_kind` names its keys itself (`model.bias: ...`)
            if first.starts_with(&format!("{path}.")) || first.starts_with(&format!("{path}:")) {
                return Error::Config(format!("{source}: {first}"));
            }
            Error::Config(format!("{source}: {}: {first}", key_of(&path, &first)))
        })?;
        config.base_dir = base_dir;
        config.track.params = params;
        if let ModelConfig::Llama(l) = &mut config.model {
            l.drop_derived_head_dim();
        }
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

    pub(crate) fn validate(&self, source: &str) -> Result<()> {
        let bad = |key: &str, msg: String| Err(Error::Config(format!("{source}: {key}: {msg}")));
        if let Some((key, msg)) = bounds::check(self) {
            return bad(&key, msg);
        }
        if let Some((key, msg)) = track::check_names(&self.track) {
            return bad(&key, msg);
        }
        if !(1..=60_000).contains(&self.track.flush_ms) {
            return bad(
                "track.flush_ms",
                format!("{} is outside 1 to 60000 milliseconds", self.track.flush_ms),
            );
        }
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
            return bad(
                "optim.momentum/nesterov/dampening",
                format!("apply to sgd, not {}", o.kind),
            );
        }
        if let Some(betas) = o.betas {
            for (i, b) in betas.iter().enumerate() {
                if !(0.0..1.0).contains(b) {
                    return bad("optim.betas", format!("beta{} = {b} must be in [0, 1)", i + 1));
                }
            }
        }
        if let Some(eps) = o.eps {
            if !(eps.is_finite() && eps >= 0.0) {
                return bad("optim.eps", format!("{eps} must be a finite number >= 0"));
            }
        }
        for (key, v) in [("optim.weight_decay", o.weight_decay), ("optim.momentum", o.momentum)] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(key, format!("{v} must be a finite number >= 0"));
            }
        }
        if !o.dampening.is_finite() {
            return bad("optim.dampening", format!("{} must be finite", o.dampening));
        }
        if o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0) {
            return bad(
                "optim.nesterov",
                format!(
                    "Nesterov momentum needs optim.momentum > 0 and optim.dampening = 0, got {} and {}",
                    o.momentum, o.dampening
                ),
            );
        }
        if let Some(c) = o.grad_clip {
            if !(c.is_finite() && c > 0.0) {
                return bad("optim.grad_clip", format!("{c} must be positive"));
            }
        }
        if self.train.steps == 0 {
            return bad("train.steps", "must be at least 1".into());
        }
        // the schedule's own checks, here rather than when the run has begun writing
        if let Err(Error::Config(msg)) = crate::run::build_schedule(&self.schedule, o.lr, self.train.steps) {
            return Err(Error::Config(format!("{source}: {msg}")));
        }
        if let Err(e) = self.train.device.parse::<weft_core::Device>() {
            return bad("train.device", e);
        }
        if let Err(e) = self.train.autocast() {
            return bad("train.precision", e);
        }
        if let Err(e) = self.train.check() {
            return bad(e.0, e.1);
        }
        if self.train.log_every == 0 {
            return bad("train.log_every", "must be at least 1".into());
        }
        let data_path = match &self.data {
            DataConfig::Batches(d) => d.path.as_os_str().is_empty(),
            DataConfig::Text(d) => d.path.as_os_str().is_empty(),
            DataConfig::Csv(d) => d.path.as_os_str().is_empty(),
            DataConfig::Tokens(d) => d.path.is_empty(),
        };
        if data_path {
            return bad("data.path", "is empty: name the data's file or folder".into());
        }
        if self.train.eval_every > 0 && self.train.eval_batches == 0 {
            return bad(
                "train.eval_batches",
                "0 with train.eval_every > 0 would evaluate nothing: give at least 1, or set train.eval_every = 0"
                    .into(),
            );
        }
        if self.train.sample_tokens > crate::generate::MAX_TOKENS {
            return bad(
                "train.sample_tokens",
                format!(
                    "{} is more than the {} characters one sample may have",
                    self.train.sample_tokens,
                    crate::generate::MAX_TOKENS
                ),
            );
        }
        if let ModelConfig::Gpt(g) = &self.model {
            if !["gelu", "gelu_tanh"].contains(&g.activation.as_str()) {
                return bad(
                    "model.activation",
                    format!("{:?} is not one of gelu, gelu_tanh", g.activation),
                );
            }
        }
        // the model's own checks (a head count that does not divide the width, a dropout of 1),
        // here rather than when the run has begun claiming and clearing its checkpoint folder
        if let Err(e) = self.model.validate() {
            let msg = match e {
                weft_core::Error::Invalid { msg, .. } => msg,
                other => other.to_string(),
            };
            return Err(Error::Config(format!("{source}: {msg}")));
        }
        let p = &self.parallel;
        if p.tp == 0 {
            return bad("parallel.tp", "must be at least 1".into());
        }
        let lm = self.model.language_model_sizes().is_some();
        if p.tp > 1 && !lm {
            return bad(
                "parallel.tp",
                format!("{}: tensor parallelism cuts language models (gpt, llama) only", p.tp),
            );
        }
        if let (true, ModelConfig::Llama(l)) = (p.tp > 1, &self.model) {
            if !l.n_kv_head.is_multiple_of(p.tp) {
                return bad(
                    "model.n_kv_head",
                    format!("{} does not divide by parallel.tp = {}", l.n_kv_head, p.tp),
                );
            }
        }
        if p.sequence_parallel && p.tp > 1 {
            if let Some((_, block)) = self.model.language_model_sizes() {
                if !block.is_multiple_of(p.tp) {
                    return bad(
                        "model.block_size",
                        format!(
                            "{block} does not divide by parallel.tp = {} (parallel.sequence_parallel cuts each \
                             micro-batch's tokens into tp parts)",
                            p.tp
                        ),
                    );
                }
            }
            if let ModelConfig::Gpt(g) = &self.model {
                if g.dropout > 0.0 {
                    return bad(
                        "model.dropout",
                        format!(
                            "{} with parallel.sequence_parallel: dropout on a rank's part of the tokens is not \
                             supported yet; set model.dropout = 0",
                            g.dropout
                        ),
                    );
                }
            }
        }
        for (key, v) in [("parallel.pp", p.pp), ("parallel.micro_batches", p.micro_batches)] {
            if v == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        if p.pp > 1 && !lm {
            return bad(
                "parallel.pp",
                format!("{}: pipeline parallelism cuts language models (gpt, llama) only", p.pp),
            );
        }
        if p.pp > 1 && p.zero > 1 {
            return bad(
                "parallel.zero",
                format!(
                    "{} with pp = {}: pipeline stages accumulate gradients over micro-batches, which ZeRO \
                     stages 2 and 3 do not; use zero = 0 or 1",
                    p.zero, p.pp
                ),
            );
        }
        if !["blocks", "parameters"].contains(&p.balance.as_str()) {
            return bad(
                "parallel.balance",
                format!("{:?} is not one of blocks, parameters", p.balance),
            );
        }
        if p.pp == 1 && p.recompute {
            return bad(
                "parallel.recompute",
                "recomputes pipeline stages; it needs pp > 1".into(),
            );
        }
        if p.tp == 1 && p.sequence_parallel {
            return bad(
                "parallel.sequence_parallel",
                "cuts the activations' tokens between tensor-parallel regions over the tp ranks; it needs tp > 1"
                    .into(),
            );
        }
        if p.pp == 1 && p.stage_blocks.is_some() {
            return bad(
                "parallel.stage_blocks",
                "cuts the model into pipeline stages; it needs pp > 1".into(),
            );
        }
        if p.pp == 1 && p.micro_batches > 1 {
            return bad(
                "parallel.micro_batches",
                format!(
                    "{}: micro-batches feed pipeline stages; they need pp > 1",
                    p.micro_batches
                ),
            );
        }
        for (key, v) in [
            ("parallel.first_bucket_mb", p.first_bucket_mb),
            ("parallel.bucket_cap_mb", p.bucket_cap_mb),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(key, format!("{v} must be a size in MiB, >= 0"));
            }
        }
        if p.zero > 3 {
            return bad("parallel.zero", format!("{} is not a ZeRO stage (0-3)", p.zero));
        }
        // f32, or bf16 where the layout has what the key rounds (why not, otherwise)
        for (key, value, bf16_allowed, why) in [
            (
                "parallel.comm_dtype",
                &p.comm_dtype,
                p.zero > 0,
                "needs ZeRO sharding (zero = 1, 2 or 3), which keeps the f32 master weights",
            ),
            (
                "parallel.pipeline_dtype",
                &p.pipeline_dtype,
                p.pp > 1,
                "is what pipeline stages send each other; it needs pp > 1",
            ),
        ] {
            match value.as_str() {
                "f32" => {}
                "bf16" if bf16_allowed => {}
                "bf16" => return bad(key, format!("\"bf16\" {why}")),
                other => return bad(key, format!("{other:?} is not one of f32, bf16")),
            }
        }
        if !["1f1b", "gpipe", "interleaved"].contains(&p.schedule.as_str()) {
            return bad(
                "parallel.schedule",
                format!("{:?} is not one of 1f1b, gpipe, interleaved", p.schedule),
            );
        }
        if let Some(schedule) = p.pipeline_schedule() {
            let v = schedule.chunks();
            if p.virtual_stages.is_some() && p.schedule != "interleaved" {
                return bad(
                    "parallel.virtual_stages",
                    format!(
                        "chunks of the interleaved schedule; parallel.schedule is {:?}",
                        p.schedule
                    ),
                );
            }
            if let Some(why) = schedule.check(p.pp, p.micro_batches) {
                let key = match (v < 2, p.pp < 2) {
                    (true, _) => "parallel.virtual_stages",
                    (false, true) => "parallel.pp",
                    (false, false) => "parallel.micro_batches",
                };
                return bad(key, why);
            }
            let n_layer = match &self.model {
                ModelConfig::Gpt(g) => Some(g.n_layer),
                ModelConfig::Llama(l) => Some(l.n_layer),
                ModelConfig::Mlp(_) | ModelConfig::Convnet(_) => None,
            };
            if let (true, Some(b)) = (v > 1, &p.stage_blocks) {
                if b.len() != p.pp * v {
                    return bad(
                        "parallel.stage_blocks",
                        format!(
                            "{} counts, but the interleaved schedule's pp x virtual_stages = {} virtual stages need one each",
                            b.len(),
                            p.pp * v
                        ),
                    );
                }
            }
            if let (true, Some(n_layer)) = (v > 1, n_layer) {
                if n_layer < p.pp * v {
                    return bad(
                        "parallel.virtual_stages",
                        format!(
                            "{v} chunks on each of pp = {} ranks make {} virtual stages, more than the model's {n_layer} blocks",
                            p.pp,
                            p.pp * v
                        ),
                    );
                }
            }
        }
        match &self.data {
            DataConfig::Text(TextKeys {
                batch_size,
                val_fraction,
                ..
            })
            | DataConfig::Csv(CsvKeys {
                batch_size,
                val_fraction,
                ..
            }) => {
                if *batch_size == 0 {
                    return bad("data.batch_size", "must be at least 1".into());
                }
                if !(0.0..1.0).contains(val_fraction) {
                    return bad("data.val_fraction", format!("{val_fraction} is outside [0, 1)"));
                }
            }
            DataConfig::Tokens(k) => {
                if k.batch_size == 0 {
                    return bad("data.batch_size", "must be at least 1".into());
                }
                if !(k.cache_gb.is_finite() && k.cache_gb > 0.0) {
                    return bad(
                        "data.cache_gb",
                        format!("{} must be a positive size in GiB", k.cache_gb),
                    );
                }
                if !(k.cache_block_mb.is_finite()
                    && k.cache_block_mb * 1048576.0 >= 4096.0
                    && k.cache_block_mb <= 1024.0)
                {
                    return bad(
                        "data.cache_block_mb",
                        format!("{} must be between 1/256 (4 KiB) and 1024 MiB", k.cache_block_mb),
                    );
                }
                if !(k.retry_seconds.is_finite() && k.retry_seconds >= 0.0) {
                    return bad(
                        "data.retry_seconds",
                        format!("{} must be seconds, >= 0", k.retry_seconds),
                    );
                }
                if !lm {
                    return bad(
                        "data.kind",
                        "token data needs a language model (model.kind = \"gpt\" or \"llama\")".into(),
                    );
                }
            }
            DataConfig::Batches(_) => {}
        }
        if let DataConfig::Csv(c) = &self.data {
            // features are f32: a scale they can hold, neither 0 (every feature 0) nor negative
            let (v, range) = (c.feature_scale, f32::MIN_POSITIVE as f64..=f32::MAX as f64);
            if !range.contains(&v) {
                return bad(
                    "data.feature_scale",
                    format!(
                        "{v} must be a positive number that f32 features can hold ({:e} to {:e})",
                        f32::MIN_POSITIVE,
                        f32::MAX
                    ),
                );
            }
        }
        if matches!(self.data, DataConfig::Text(_)) && !lm {
            return bad(
                "data.kind",
                "text data needs a language model: model.kind = \"gpt\" or \"llama\"".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
