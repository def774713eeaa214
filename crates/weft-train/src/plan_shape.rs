//! A run config as the parallel planner (`weft_plan`) sees it: the model's shapes, the global
//! batch, the precision and the optimizer's state per parameter. Nothing is allocated.

use weft_plan::{DeviceSpec, ModelKind, ModelShape, Precision, Workload};

use crate::config::{DataConfig, ModelConfig, RunConfig};

/// The planner's shapes of the `[model]` section; only gpt and llama are planned.
pub fn model_shape(model: &ModelConfig) -> Result<ModelShape, String> {
    match model {
        ModelConfig::Gpt(g) => Ok(ModelShape {
            kind: ModelKind::Gpt,
            vocab: g.vocab_size as u64,
            seq_len: g.block_size as u64,
            n_layer: g.n_layer as u64,
            n_head: g.n_head as u64,
            n_kv_head: g.n_head as u64,
            n_embd: g.n_embd as u64,
            head_dim: (g.n_embd / g.n_head.max(1)) as u64,
            intermediate: 4 * g.n_embd as u64,
            tied: true,
            bias: g.bias,
            qk_norm: false,
        }),
        ModelConfig::Llama(l) => Ok(ModelShape {
            kind: ModelKind::Llama,
            vocab: l.vocab_size as u64,
            seq_len: l.block_size as u64,
            n_layer: l.n_layer as u64,
            n_head: l.n_head as u64,
            n_kv_head: l.n_kv_head as u64,
            n_embd: l.n_embd as u64,
            // `[model] head_dim`, else n_embd / n_head, as the model resolves it
            head_dim: l.to_config().head_dim() as u64,
            intermediate: l.intermediate_size as u64,
            tied: l.tie_embeddings,
            bias: l.qkv_bias,
            qk_norm: l.qk_norm,
        }),
        other => Err(format!(
            "model.kind = {:?}: the planner plans gpt and llama models",
            other.kind()
        )),
    }
}

/// The workload of `config`: its model, the rows of one optimizer step (`global_batch` in one
/// pass, or `train.grad_accum` passes of `data.batch_size`), `train.precision` and the
/// optimizer's moments.
pub fn workload(config: &RunConfig, global_batch: Option<u64>) -> Result<Workload, String> {
    let model = model_shape(&config.model)?;
    // `--global-batch B`: B rows in one forward and backward; else `grad_accum` passes of
    // `data.batch_size` rows each
    let accum = match global_batch {
        Some(_) => 1,
        None => config.train.grad_accum.max(1) as u64,
    };
    let global_batch = match (global_batch, &config.data) {
        (Some(b), _) => b,
        (None, DataConfig::Text(t)) => (t.batch_size as u64).saturating_mul(accum),
        (None, DataConfig::Tokens(t)) => (t.batch_size as u64).saturating_mul(accum),
        (None, DataConfig::Csv(c)) => (c.batch_size as u64).saturating_mul(accum),
        (None, DataConfig::Batches(_)) => {
            return Err("data.kind = \"batches\" has no batch_size key: give --global-batch".into())
        }
    };
    let precision = match config.train.precision.as_str() {
        "bf16" => Precision::Bf16,
        _ => Precision::F32,
    };
    let optimizer_moments = match config.optim.kind.as_str() {
        "sgd" if config.optim.momentum == 0.0 => 0,
        "sgd" => 1,
        _ => 2,
    };
    Ok(Workload {
        model,
        global_batch,
        precision,
        grad_accum: accum,
        optimizer_moments,
        // the run's own devices; `weft plan` sets it from the spec it plans for
        kv_repeated: config.train.device.trim().starts_with("cuda"),
        // weft's autograd adds the products' weight gradients into the accumulated ones
        fused_accumulation: config.train.fuse_accumulation,
    })
}

/// The command that measures this machine for the `local` spec.
pub const CALIBRATE_COMMAND: &str = "weft plan calibrate --nproc N";

/// Where `weft plan calibrate` keeps this machine's latest calibration: `plan-local.toml` in
/// weft's cache folder (`WEFT_CACHE_DIR`, else `$XDG_CACHE_HOME/weft`, else `~/.cache/weft`:
/// [`weft_core::tune::cache_dir`]).
pub fn calibration_path() -> std::path::PathBuf {
    weft_core::tune::cache_dir().join("plan-local.toml")
}

/// Where the calibration measured with `ranks` ranks is kept as well: `plan-local-{ranks}.toml`
/// beside [`calibration_path`].
pub fn calibration_path_for(ranks: usize) -> std::path::PathBuf {
    weft_core::tune::cache_dir().join(format!("plan-local-{ranks}.toml"))
}

/// The longest calibration file read, in bytes (one is a few kilobytes at most).
pub const MAX_CALIBRATION_FILE: u64 = 1 << 20;

/// The calibration at `path`: `Ok(None)` when there is none, an error when the file cannot be
/// used (unreadable, not a regular file, longer than [`MAX_CALIBRATION_FILE`], broken, another
/// format version). A FIFO or a device there is refused without being read
/// ([`weft_core::tune::read_cache_file`]).
pub fn read_calibration(path: &std::path::Path) -> Result<Option<weft_plan::calibration::Calibration>, String> {
    let Some(text) = weft_core::tune::read_cache_file(path, MAX_CALIBRATION_FILE)? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&text);
    weft_plan::calibration::Calibration::parse(&text, &path.display().to_string())
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The `local` spec for planning `ranks` ranks: the calibration measured with that many ranks
/// when there is one, else the latest one, with a note saying for how many ranks it was
/// measured (its per-rank rates, its link and how many ranks computed at once are those of
/// that job size). Without any calibration (or with one that cannot be used), an error naming
/// the command that measures it.
pub fn local_spec_for(ranks: usize) -> Result<(DeviceSpec, Option<String>), String> {
    let measure = measure_command(ranks);
    let own = calibration_path_for(ranks);
    match read_calibration(&own) {
        Ok(Some(c)) => return Ok((c.spec, None)),
        Ok(None) => {}
        Err(e) => {
            return Err(format!(
                "the local device spec's calibration for {ranks} ranks cannot be used ({e}): run {measure} to measure again"
            ))
        }
    }
    let latest = read_calibration(&calibration_path()).ok().flatten();
    let spec = local_spec()?;
    let note = latest.filter(|c| c.ranks != ranks).map(|c| {
        if ranks > weft_plan::calibration::MAX_RANKS {
            format!(
                "planning {ranks} ranks with the calibration of {} ranks, per rank, its machine as a node (`weft plan \
                 calibrate` measures at most {} ranks, those of one machine: run {measure})",
                c.ranks,
                weft_plan::calibration::MAX_RANKS
            )
        } else {
            format!(
                "planning {ranks} ranks with the calibration of {} ranks (none was measured for {ranks}: {measure} \
                 measures one)",
                c.ranks
            )
        }
    });
    Ok((spec, note))
}

/// The command that measures this machine for a job of `ranks` ranks: `weft plan calibrate
/// --nproc ranks`, or, past the ranks one calibration measures
/// ([`weft_plan::calibration::MAX_RANKS`], those of one machine), with the ranks each machine of
/// the job runs.
fn measure_command(ranks: usize) -> String {
    let most = weft_plan::calibration::MAX_RANKS;
    if ranks <= most {
        format!("`weft plan calibrate --nproc {ranks}`")
    } else {
        format!("`weft plan calibrate --nproc N` with N the ranks each machine of the job runs (at most {most})")
    }
}

/// The `local` spec from this machine's latest calibration; without one (or with one that
/// cannot be used), an error naming the command that measures it.
pub fn local_spec() -> Result<DeviceSpec, String> {
    let path = calibration_path();
    match read_calibration(&path) {
        Ok(Some(c)) => Ok(c.spec),
        Ok(None) => Err(format!(
            "the local device spec needs a calibration of this machine, and there is none yet ({} does not \
             exist): run `{CALIBRATE_COMMAND}` with N the ranks you will train on",
            path.display()
        )),
        Err(e) => Err(format!(
            "the local device spec's calibration cannot be used ({e}): run `{CALIBRATE_COMMAND}` to measure again"
        )),
    }
}

/// A device spec by name for planning `devices` devices: `local` (this machine's calibration
/// for that many ranks, see [`local_spec_for`], with its note) or a built-in one.
pub fn device_spec(name: &str, devices: usize) -> Result<(DeviceSpec, Option<String>), String> {
    match name {
        "local" => local_spec_for(devices),
        _ => DeviceSpec::builtin(name)
            .map(|d| (d, None))
            .map_err(|e| format!("{e}, or local")),
    }
}

/// Whether weft can run `config`'s model sequence-parallel: a gpt with dropout cannot (each
/// rank would draw the same mask for its own tokens), so the planner leaves those layouts
/// out for it.
pub fn sequence_parallel_runs(config: &RunConfig) -> bool {
    match &config.model {
        crate::config::ModelConfig::Gpt(g) => g.dropout == 0.0,
        _ => true,
    }
}

/// The `[parallel]` keys a plan chooses, refused next to `auto = true`.
pub const PLANNED_KEYS: [&str; 13] = [
    "dp",
    "tp",
    "pp",
    "zero",
    "micro_batches",
    "schedule",
    "virtual_stages",
    "recompute",
    "sequence_parallel",
    "comm_dtype",
    "pipeline_dtype",
    "stage_blocks",
    "balance",
];

/// Refuses `[parallel] auto = true` next to keys the plan chooses (naming them), and
/// `cluster` without `auto`.
pub(crate) fn check_auto(table: &toml::Table, source: &str) -> crate::error::Result<()> {
    let Some(toml::Value::Table(p)) = table.get("parallel") else {
        return Ok(());
    };
    let auto = matches!(p.get("auto"), Some(toml::Value::Boolean(true)));
    if auto {
        let given: Vec<String> = PLANNED_KEYS
            .iter()
            .filter(|k| p.contains_key(**k))
            .map(|k| format!("parallel.{k}"))
            .collect();
        if !given.is_empty() {
            return Err(crate::error::Error::Config(format!(
                "{source}: parallel.auto = true chooses the layout, but {} {} given too; remove {} or set \
                 parallel.auto = false",
                given.join(", "),
                if given.len() == 1 { "is" } else { "are" },
                if given.len() == 1 { "it" } else { "them" },
            )));
        }
    } else if p.contains_key("cluster") {
        return Err(crate::error::Error::Config(format!(
            "{source}: parallel.cluster: applies with parallel.auto = true only"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use weft_dist::pipeline::{peak_in_flight, PipelineSchedule};
    use weft_plan::Schedule;

    #[test]
    fn the_planners_passes_in_flight_are_the_runtime_schedules() {
        for (plan, run) in [
            (Schedule::GPipe, PipelineSchedule::GPipe),
            (Schedule::OneFOneB, PipelineSchedule::OneFOneB),
            (Schedule::Interleaved(2), PipelineSchedule::Interleaved(2)),
            (Schedule::Interleaved(3), PipelineSchedule::Interleaved(3)),
            (Schedule::Interleaved(4), PipelineSchedule::Interleaved(4)),
        ] {
            assert_eq!(plan.chunks(), run.chunks());
            for p in 2..6 {
                for m in p..=3 * p + 1 {
                    for s in 0..p {
                        if plan.chunks() > 1 {
                            // the planner's order of an interleaved stage's passes is the runtime's
                            let runtime: Vec<(usize, bool)> = run
                                .chunk_actions(s, p, m)
                                .into_iter()
                                .map(|(c, a)| (c, matches!(a, weft_dist::pipeline::Action::Forward(_))))
                                .collect();
                            assert_eq!(plan.chunk_order(s, p, m), runtime, "{plan:?} p={p} m={m} s={s}");
                        }
                    }
                }
            }
            for p in 2..6 {
                for m in [p, p + 1, 2 * p, 2 * p + 1, 3 * p, 5 * p, 5 * p + 3] {
                    for s in 0..p {
                        assert_eq!(
                            plan.in_flight(s, p, m),
                            peak_in_flight(&run.actions(s, p, m)),
                            "{plan:?} p={p} m={m} s={s}"
                        );
                    }
                }
            }
        }
    }
}
