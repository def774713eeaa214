//! `[train]`: the run's length, logging, outputs, device and precision.

use std::path::PathBuf;

use serde::Deserialize;

/// `[train]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Optimizer steps.
    pub steps: usize,
    /// Micro-batches per optimizer step (gradient accumulation): each loss scaled by `1/K`
    /// before its backward, the gradients summed over the `K`, one update. Micro-batch `j` of
    /// step `i` is the data's batch `i K + j`.
    #[serde(default = "default_grad_accum")]
    pub grad_accum: usize,
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
    /// Where rank 0 writes the run's timeline (Chrome trace format), if anywhere.
    #[serde(default)]
    pub trace: Option<PathBuf>,
    /// Save every this many steps (0: only at the end, when `checkpoint_dir` is set).
    #[serde(default)]
    pub checkpoint_every: usize,
    /// Complete checkpoints to keep (older ones are deleted).
    #[serde(default = "default_keep")]
    pub keep_checkpoints: usize,
    /// For gpt on text data: characters to generate and print after training (0: none).
    #[serde(default)]
    pub sample_tokens: usize,
    /// A fresh run (not `--resume`) may start in a `checkpoint_dir` holding another run's
    /// checkpoints, which it removes, and replace another run's `metrics` file. Without it such
    /// a run is refused before it starts.
    #[serde(default)]
    pub overwrite: bool,
    /// A step whose loss or gradients are not finite is skipped (no update; counted in the
    /// metrics as `skipped_steps`), as AMP's gradient scaler does, instead of stopping the run.
    #[serde(default)]
    pub skip_nonfinite: bool,
    /// Where the model trains: `"cpu"` (the default), `"cuda"` or `"cuda:N"`. In a launched job
    /// `"cuda"` gives each rank `cuda:(LOCAL_RANK mod the GPUs there are)`.
    #[serde(default = "default_device")]
    pub device: String,
    /// `"f32"` (the default) or `"bf16"`: autocast, as `torch.autocast(dtype=torch.bfloat16)`:
    /// products and attention in bf16, norms, softmax and the loss in f32, parameters, gradients
    /// and optimizer state in f32 (see `weft_core::autocast`).
    #[serde(default = "default_precision")]
    pub precision: String,
    /// Compiled mode: a step's forward, loss and backward are captured as a graph at the first
    /// step and replayed after (docs/compiled.md). Layouts and models that cannot be captured
    /// run eagerly, with one line saying why.
    #[serde(default)]
    pub compile: bool,
    /// `"heuristic"` (the default: kernels choose their variants by their own rules) or
    /// `"search"`: with `compile`, the first replay times each kernel variant at its shapes and
    /// keeps the fastest, cached per machine under `WEFT_CACHE_DIR` (docs/compiled.md,
    /// "Autotuning").
    #[serde(default = "default_autotune")]
    pub autotune: String,
    /// With `compile`: the captured step makes cheap activations (elementwise results, norms,
    /// the activation of a fused linear) a second time next to the backward that reads them when
    /// that lowers its peak memory (docs/compiled.md, "Recomputation"). Default true.
    #[serde(default = "default_true")]
    pub compile_recompute: bool,
    /// Gradient accumulation fusion (default true): from a step's second micro-batch on, each
    /// weight gradient of a matrix product is added in place into the parameter's accumulated
    /// gradient as it is made, instead of made as a new tensor and then added (docs/training.md,
    /// "Gradient accumulation"). On the CPU the sums are the same bits either way (on a GPU the
    /// same to rounding); false costs the pass. Sets `weft_core::set_accumulation_fusion` for
    /// the process.
    #[serde(default = "default_true")]
    pub fuse_accumulation: bool,
}

impl TrainConfig {
    /// Checks the keys whose values serde does not bound: the culprit key and what is wrong.
    pub fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        if self.grad_accum == 0 {
            return Err(("train.grad_accum", "must be at least 1".into()));
        }
        if self.steps.checked_mul(self.grad_accum).is_none() {
            return Err((
                "train.grad_accum",
                format!(
                    "{} micro-batches per step times {} steps overflows",
                    self.grad_accum, self.steps
                ),
            ));
        }
        for (key, path) in [
            ("train.checkpoint_dir", &self.checkpoint_dir),
            ("train.metrics", &self.metrics),
        ] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err((key, "is empty: name a path, or leave the key out".into()));
            }
        }
        self.autotune_mode()?;
        Ok(())
    }

    /// The autotuning mode `autotune` names, or the culprit key and why not.
    pub fn autotune_mode(&self) -> std::result::Result<weft_core::graph::Autotune, (&'static str, String)> {
        match (self.autotune.as_str(), self.compile) {
            ("heuristic", _) => Ok(weft_core::graph::Autotune::Heuristic),
            ("search", true) => Ok(weft_core::graph::Autotune::Search),
            ("search", false) => Err((
                "train.autotune",
                "\"search\" tunes the kernels of the compiled step: set train.compile = true too".into(),
            )),
            (other, _) => Err(("train.autotune", format!("{other:?} is not one of heuristic, search"))),
        }
    }

    /// The autocast dtype of `precision` (`None` for f32), or why it is not one.
    pub fn autocast(&self) -> std::result::Result<Option<weft_core::DType>, String> {
        match self.precision.as_str() {
            "f32" => Ok(None),
            "bf16" => Ok(Some(weft_core::DType::BF16)),
            p => Err(format!("{p:?} is not one of f32, bf16")),
        }
    }
}

fn default_true() -> bool {
    true
}
fn default_grad_accum() -> usize {
    1
}
fn default_device() -> String {
    "cpu".to_string()
}
fn default_autotune() -> String {
    "heuristic".to_string()
}
fn default_precision() -> String {
    "f32".to_string()
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
