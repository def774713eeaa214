//! `[parallel]`: the layout of a job.

use std::path::PathBuf;

use serde::Deserialize;

/// Why `[train] compile` cannot capture a step that runs pipeline parallelism, tensor
/// parallelism or ZeRO stage 3 (the first that applies); `None` for none of them. The trainer
/// says it once when it runs such a step eagerly; [`ParallelConfig::uncapturable`] reads it
/// from a config.
pub(crate) fn uncapturable_layout(pipeline: bool, tensor_parallel: bool, zero3: bool) -> Option<&'static str> {
    if pipeline {
        Some("pipeline parallelism is not captured yet (its schedule interleaves forward and backward passes across stages)")
    } else if tensor_parallel {
        Some("tensor parallelism is not captured yet (its collectives run inside forward and backward)")
    } else if zero3 {
        Some(
            "ZeRO stage 3 is not captured yet (it gathers and frees parameters from hooks inside forward and backward)",
        )
    } else {
        None
    }
}

/// `[parallel]`: the layout of the job: `pp x dp x tp` ranks, ZeRO stage `zero` across the `dp`
/// ranks (0-3; with `dp = 1` there is nothing to shard and every stage runs as 0), and the
/// settings of each kind of parallelism. `dp = 0` takes every rank the job has, divided by
/// `tp x pp` (so an elastic job that lost a node goes on with fewer data-parallel ranks).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelConfig {
    /// Data-parallel ranks; 0 (the default): the job's ranks divided by `tp x pp` (1 for a
    /// single process).
    #[serde(default)]
    pub dp: usize,
    #[serde(default = "one")]
    pub tp: usize,
    #[serde(default = "one")]
    pub pp: usize,
    #[serde(default)]
    pub zero: usize,
    #[serde(default = "one")]
    pub micro_batches: usize,
    /// Pipeline schedule: `"1f1b"` (default), `"gpipe"` or `"interleaved"`.
    #[serde(default = "default_pp_schedule")]
    pub schedule: String,
    /// With `schedule = "interleaved"`: model chunks per pipeline rank (default 2; Megatron-LM's
    /// virtual pipeline size).
    #[serde(default)]
    pub virtual_stages: Option<usize>,
    /// Data parallelism: size cap of the first gradient bucket (the last parameters), MiB.
    #[serde(default = "default_first_bucket_mb")]
    pub first_bucket_mb: f64,
    /// Data parallelism: size cap of the other gradient buckets, MiB (PyTorch's `bucket_cap_mb`).
    #[serde(default = "default_bucket_cap_mb")]
    pub bucket_cap_mb: f64,
    /// ZeRO: `"f32"` (default), or `"bf16"` to gather parameters and reduce gradients in bf16
    /// with f32 shards as master weights (DeepSpeed's `communication_data_type`).
    #[serde(default = "default_comm_dtype")]
    pub comm_dtype: String,
    /// Pipeline: what activations and their gradients travel between stages as, `"f32"`
    /// (default) or `"bf16"` (half the bytes, each value rounded to bf16 on the way, as
    /// Megatron-LM sends its bf16 stream; `pipeline_dtype` there). Needs `pp > 1`.
    #[serde(default = "default_comm_dtype")]
    pub pipeline_dtype: String,
    /// Pipeline stages recompute each micro-batch's forward before its backward instead of
    /// keeping its activations.
    #[serde(default)]
    pub recompute: bool,
    /// Tensor parallelism: between the tensor-parallel regions each rank keeps only `1 / tp` of
    /// the activations' tokens (norms, residual adds, the stream between blocks),
    /// with an all-gather and a reduce-scatter in place of each all-reduce (Megatron-LM's
    /// `--sequence-parallel`). Needs `tp > 1`; `model.block_size` must divide by `tp`.
    #[serde(default)]
    pub sequence_parallel: bool,
    /// Pipeline: how blocks are shared out among stages, `"blocks"` (as evenly as they allow)
    /// or `"parameters"` (the cut whose largest stage holds the fewest parameters).
    #[serde(default = "default_balance")]
    pub balance: String,
    /// Pipeline: blocks per stage, in stage order (overrides `balance`).
    #[serde(default)]
    pub stage_blocks: Option<Vec<usize>>,
    /// Plans the layout at the start of the run (`weft_plan`, docs/plan.md) for the ranks the
    /// job has, and runs the fastest predicted plan: its `dp`, `tp`, `pp`, `zero`,
    /// `micro_batches`, `schedule`, `recompute`, `sequence_parallel`, `comm_dtype`,
    /// `pipeline_dtype` and `stage_blocks` replace these
    /// keys, which must then be left unset.
    #[serde(default)]
    pub auto: bool,
    /// With `auto`: a cluster.toml of the devices to plan for (default: the `local` spec that
    /// `weft plan calibrate` measured on this machine).
    #[serde(default)]
    pub cluster: Option<PathBuf>,
}

fn default_balance() -> String {
    "blocks".into()
}

fn default_comm_dtype() -> String {
    "f32".into()
}

fn default_first_bucket_mb() -> f64 {
    1.0
}
fn default_bucket_cap_mb() -> f64 {
    25.0
}

fn one() -> usize {
    1
}
fn default_pp_schedule() -> String {
    "1f1b".into()
}

impl ParallelConfig {
    /// Why `[train] compile` cannot capture a step of this layout (it then runs eagerly), for
    /// a job of `dp` data-parallel ranks; `None` when it can (one process, or data parallelism
    /// with ZeRO 0 to 2). `weft graph dump` says it instead of a graph.
    pub fn uncapturable(&self, dp: usize) -> Option<&'static str> {
        uncapturable_layout(self.pp > 1, self.tp > 1, dp > 1 && self.zero == 3)
    }

    /// The pipeline schedule `schedule` (and `virtual_stages`) names; `None` for an unknown
    /// name.
    pub fn pipeline_schedule(&self) -> Option<weft_dist::pipeline::PipelineSchedule> {
        match self.schedule.as_str() {
            "interleaved" => Some(weft_dist::pipeline::PipelineSchedule::Interleaved(
                self.virtual_stages.unwrap_or(2),
            )),
            name => weft_dist::pipeline::PipelineSchedule::parse(name),
        }
    }
}

impl Default for ParallelConfig {
    fn default() -> Self {
        ParallelConfig {
            dp: 0,
            tp: 1,
            pp: 1,
            zero: 0,
            micro_batches: 1,
            schedule: default_pp_schedule(),
            virtual_stages: None,
            first_bucket_mb: default_first_bucket_mb(),
            bucket_cap_mb: default_bucket_cap_mb(),
            comm_dtype: default_comm_dtype(),
            pipeline_dtype: default_comm_dtype(),
            recompute: false,
            sequence_parallel: false,
            balance: default_balance(),
            stage_blocks: None,
            auto: false,
            cluster: None,
        }
    }
}
