//! From a [`RunConfig`] to a finished run: builds the model, data, optimizer, schedule and
//! callbacks, checks what the run will need before its first step, resumes if asked, trains,
//! and (for gpt on text) prints a sample.

mod auto;
mod build;
mod data;
mod evaluate;
mod graph;
mod layout;

use std::collections::BTreeMap;
use std::sync::Arc;

use weft_models::{LanguageModel, Model, StageCut};
use weft_nn::state_dict;

pub(crate) use build::build_language_model;
pub use build::{build_model, build_optimizer, build_schedule};
use data::{build_data, check_data};
pub use evaluate::{evaluate, Evaluation};
pub use graph::{step_graph, tune_step, whole_step_graph, StepGraph};
use layout::{job_shape, join_job, with_job_dp};

use crate::checkpoint::{self, ClaimMode};
use crate::config::RunConfig;
use crate::error::{Error, Result};
use crate::metrics::{self, MetricsFile, MetricsMode};
use crate::trainer::{CheckpointPolicy, Trainer};

/// Options of `weft train` besides the config file.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// Continue from the newest checkpoint in `train.checkpoint_dir` that verifies.
    pub resume: bool,
    /// Start from this checkpoint (a folder, or the newest one in a directory), whatever
    /// layout wrote it; with `resume`, only when `train.checkpoint_dir` holds none yet.
    pub resume_from: Option<std::path::PathBuf>,
    /// Show the progress display.
    pub progress: bool,
    /// Stop cleanly on SIGINT and SIGTERM ([`crate::stop`]): finish the step, write a
    /// checkpoint, and return [`RunOutcome::stopped_by`].
    pub handle_signals: bool,
}

/// How a run ended (errors aside).
#[derive(Debug, Clone, Default)]
pub struct RunOutcome {
    /// What training did; `None` when there was nothing left to train.
    pub summary: Option<crate::trainer::FitSummary>,
    /// The signal that stopped the run early, if one did: `weft train` exits with 128 + it.
    pub stopped_by: Option<i32>,
}

/// Checks, before anything is built, that a new run's metrics file holds no other run's records
/// (unless `train.overwrite`) and that the metrics file can be written (a resumed run's too), on
/// the rank that writes it; every rank of
/// `group` fails if it fails. (The trace's path is checked by `Trainer::fit`, before its first
/// step.)
fn check_metrics(config: &RunConfig, options: &TrainOptions, group: Option<&weft_dist::ProcessGroup>) -> Result<()> {
    let writes = group.is_none_or(|g| g.rank() == 0);
    let checked = match (&config.train.metrics, writes) {
        (Some(path), true) if options.resume => metrics::check_writable(&config.resolve(path)),
        (Some(path), true) => metrics::check_new(&config.resolve(path), config.train.overwrite),
        _ => Ok(()),
    };
    crate::job::agree(group, checked, "checking train.metrics")
}

/// The device this rank trains on (`train.device`; a bare `"cuda"` in a launched job is
/// `cuda:(LOCAL_RANK mod the GPUs there are)`, so ranks share GPUs when there are more ranks
/// than GPUs), checked before anything is built or written: one line naming the device and why
/// it cannot be used. GPU ranks run data parallelism only (collectives through host memory).
fn rank_device(config: &RunConfig, job: &layout::JobShape) -> Result<weft_core::Device> {
    use weft_core::Device;
    let named: Device = config
        .train
        .device
        .parse()
        .map_err(|e: String| Error::Config(format!("train.device: {e}")))?;
    let bad = |e: weft_core::Error| Error::Config(format!("train.device: {e}"));
    let device = match (named, config.train.device.trim() == "cuda", job.ranks > 1) {
        (Device::Cuda(_), true, true) => {
            let count = weft_core::cuda::device_count()
                .map_err(|e| bad(weft_core::Error::Device(format!("{named} is not available: {e}"))))?;
            let local: usize = std::env::var("LOCAL_RANK")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            Device::Cuda(local % count.max(1))
        }
        (d, _, _) => d,
    };
    weft_core::cuda::check(device).map_err(bad)?;
    let p = &config.parallel;
    if device.is_cuda() && job.ranks > 1 && (p.tp > 1 || p.pp > 1 || p.zero > 0) {
        return Err(Error::Config(format!(
            "train.device: {device} with parallel.tp = {}, pp = {}, zero = {}: GPU ranks run data parallelism only for now (tp = pp = 1, zero = 0)",
            p.tp, p.pp, p.zero
        )));
    }
    Ok(device)
}

/// Runs the training described by `config`.
pub fn train(config: &RunConfig, options: &TrainOptions) -> Result<RunOutcome> {
    if options.handle_signals {
        crate::stop::install().map_err(|e| Error::Run(format!("cannot install the signal handlers: {e}")))?;
        // joining the job looks at it too: a rank told to stop while it waits for the others
        // ends at once, not at the job's timeout
        weft_dist::interrupt::set_stop_check(crate::stop::requested);
    }
    let job = job_shape()?;
    let planned = match config.parallel.auto {
        true => Some(auto::plan(config, job.ranks)?),
        false => None,
    };
    let config = planned.as_ref().map_or(config, |p| &p.config);
    let dp_from_job = config.parallel.dp == 0;
    let resolved = with_job_dp(config, &job)?;
    let config = &resolved;
    let t = &config.train;
    let p = &config.parallel;
    let device = rank_device(config, &job)?;
    let group = match join_job(config, &job) {
        Ok(group) => group,
        Err(e) => match crate::stop::requested() {
            Some(sig) => {
                weft_core::errln!("weft: {e}; nothing was trained");
                return Ok(RunOutcome {
                    summary: None,
                    stopped_by: Some(sig),
                });
            }
            None => return Err(e),
        },
    };
    if let (Some(g), Some(p)) = (&group, &planned) {
        auto::agree_on_plan(g, p.fingerprint)?;
    }
    // refuse what cannot fit before allocating any of it (the ranks read the free memory at
    // different moments: they agree, so that none goes on alone)
    let fits = crate::memory::check(config, job.local_ranks);
    crate::job::agree(group.as_ref(), fits, "the memory check")?;
    let rank = group.as_ref().map_or(0, |g| g.rank());
    // rank 0 logs, shows progress and samples for the whole job
    let logs = rank == 0;
    if let (true, Some(p)) = (logs, &planned) {
        weft_core::errln!("{}", p.line);
    }
    if logs && job.ranks > 1 {
        let from = if dp_from_job {
            " (dp: the job's ranks / (tp x pp))"
        } else {
            ""
        };
        weft_core::errln!(
            "weft: {} ranks: dp = {} x tp = {} x pp = {}, zero = {}{from}",
            job.ranks,
            p.dp,
            p.tp,
            p.pp,
            if p.dp > 1 { p.zero } else { 0 }
        );
    }
    let mesh = match &group {
        Some(g) => Some(weft_dist::DeviceMesh::new(g, p.dp, p.tp, p.pp)?),
        None => None,
    };
    // every rank of a data-parallel replica (its tensor-parallel ranks) sees the same rows
    let (dp_rank, dp_size) = mesh.as_ref().map_or((0, 1), |m| (m.dp_group.rank(), m.dp));
    let data = build_data(config)?;
    check_data(config, &data)?;
    let data = data.shard(dp_rank, dp_size)?;
    if (data.batch_rows / dp_size) % p.micro_batches != 0 {
        return Err(Error::Config(format!(
            "parallel.micro_batches: {} does not divide the {} rows each data-parallel rank gets per step",
            p.micro_batches,
            data.batch_rows / dp_size
        )));
    }
    check_metrics(config, options, group.as_ref())?;
    // a checkpoint of another model is refused from its index, before this one is built (with
    // --resume, FROM may never be read: the run's own checkpoint comes first, and loading
    // FROM compares the models then)
    if let (Some(from), false) = (&options.resume_from, options.resume) {
        let ours = serde_json::json!({
            "model": config.model,
            "tokenizer": data.tokenizer.as_ref().map(|t| t.to_json()),
        });
        crate::trainer::check_checkpoint_model(
            &ours,
            from,
            "start from a checkpoint of this run's model, or give the run the checkpoint's model",
        )?;
    }
    // the initial weights are read (mapped) and their shapes checked against the model config
    // before the model is built: a config.json that disagreed with its weights built a model
    // of its size first (979 MB and 12 s for n_embd 2048 over 128-wide weights) to fail after
    let init = config.init.from.as_ref().map(|f| config.resolve(f));
    // (a file is read a tensor at a time as it is loaded, its names and shapes checked first)
    let init_tensors: Option<(Box<dyn state_dict::TensorSource>, String)> = match &init {
        Some(dir) if weft_models::hf::is_checkpoint_folder(dir) => Some((
            Box::new(weft_models::hf::open_folder(dir)?.weights),
            dir.display().to_string(),
        )),
        Some(path) => Some((
            Box::new(weft_core::io::safetensors::SafeTensorsFile::open(path)?),
            path.display().to_string(),
        )),
        None => None,
    };
    if let Some((tensors, source)) = &init_tensors {
        let shapes: BTreeMap<String, Vec<usize>> = tensors
            .names()
            .into_iter()
            .filter_map(|n| Some((n.to_string(), tensors.shape(n)?)))
            .collect();
        config
            .model
            .check_shapes(&shapes)
            .map_err(|e| Error::Io(format!("{source}: {e}")))?;
    }
    // the optimizer and schedule before the folder is claimed (cheap, and what fails here
    // must not follow a claim); the earlier checkpoints a claim with train.overwrite finds go
    // only when the run starts (its first step or save), so that a run refused after it (a
    // model that does not build, a --resume-from that does not load) leaves them
    let optimizer = build_optimizer(&config.optim)?;
    let schedule = build_schedule(&config.schedule, config.optim.lr, config.train.steps)?;
    // the run's outputs, before the model is built: a folder of its own, files it can write
    // (after the checks of what it starts from, which write nothing: a bad init.from or
    // --resume-from left the folder's lock behind)
    let claim = match &t.checkpoint_dir {
        Some(dir) => {
            let mode = if options.resume {
                ClaimMode::Resume
            } else {
                ClaimMode::Fresh { overwrite: t.overwrite }
            };
            Some(checkpoint::claim(&config.resolve(dir), group.as_ref(), mode)?)
        }
        None => None,
    };
    let load_init = |m: &dyn Model| -> Result<()> {
        if let Some((tensors, source)) = &init_tensors {
            state_dict::load_state_dict(m, tensors.as_ref(), m.aliases(), source)?;
        }
        Ok(())
    };
    // parameters whole on every tensor-parallel rank (norms under sequence parallelism, a
    // llama's head norms) have their gradients summed once a step where gradients stay whole
    // until the update; ZeRO shards them at the data-parallel reduction, so each pass sums them
    let deferred =
        (p.tp > 1 && (p.dp == 1 || p.zero == 0)).then(|| Arc::new(weft_nn::sequence_parallel::DeferredSums::default()));
    // a language model is kept as one too: for its pipeline stages and to sample from it
    let lm: Option<Arc<dyn LanguageModel>> = match config.model.language_model_sizes() {
        Some(_) => {
            let mut g = weft_nn::init::with_device(device, || build_language_model(&config.model, t.seed))?;
            load_init(g.as_ref())?;
            g.set_stage_cut(match (&p.stage_blocks, p.balance.as_str()) {
                (Some(counts), _) => StageCut::Given(counts.clone()),
                (None, "parameters") => StageCut::Parameters,
                _ => StageCut::Blocks,
            });
            // the whole model is built (and loaded) on every rank, then cut
            if let Some(m) = mesh.as_ref().filter(|m| m.tp > 1) {
                g.make_tensor_parallel(&weft_dist::tensor_parallel::TpProcessGroup::with_deferred_sums(
                    &m.tp_group,
                    p.sequence_parallel,
                    deferred.clone(),
                ))?;
            }
            Some(Arc::from(g))
        }
        None => None,
    };
    let model: Arc<dyn Model> = match &lm {
        Some(g) => g.clone(),
        None => {
            let m = weft_nn::init::with_device(device, || build_model(&config.model, t.seed))?;
            load_init(m.as_ref())?;
            m
        }
    };
    // the parameters hold the initial weights now: the read copies go (a large model's would
    // stay for the whole run otherwise)
    drop(init_tensors);
    // one run a process: its autograd adds weight gradients in place or not
    weft_core::set_accumulation_fusion(t.fuse_accumulation);
    let mut trainer = Trainer::new(model.clone(), optimizer, schedule, config.optim.weight_decay)
        .with_grad_clip(config.optim.grad_clip)
        .with_grad_accum(t.grad_accum)
        .with_log_every(t.log_every)
        .with_skip_nonfinite(t.skip_nonfinite)
        .with_autotune(
            t.autotune_mode()
                .map_err(|(key, e)| Error::Config(format!("{key}: {e}")))?,
        )
        .with_compile_recompute(t.compile_recompute)
        .with_compile(t.compile)
        .with_progress(options.progress && logs)
        .with_device(device)
        .with_autocast(
            t.autocast()
                .map_err(|e| Error::Config(format!("train.precision: {e}")))?,
        );
    if let Some(m) = &mesh {
        trainer = trainer.with_job(m.world.clone());
        if m.tp > 1 {
            trainer = trainer.with_tensor_parallel(m.tp_group.clone());
            if let Some(d) = &deferred {
                trainer = trainer.with_deferred_sums(d.clone());
            }
        }
        if let (true, Some(g)) = (m.pp > 1, &lm) {
            let schedule = p.pipeline_schedule().ok_or_else(|| {
                Error::Config(format!(
                    "parallel.schedule: {:?} is not one of 1f1b, gpipe, interleaved",
                    p.schedule
                ))
            })?;
            let pipeline = crate::pipeline::Pipeline::new(
                g.clone(),
                m.pp_group.clone(),
                schedule,
                p.micro_batches,
                m.ends_group.clone(),
                p.recompute,
            )?;
            let wire = match p.pipeline_dtype.as_str() {
                "bf16" => weft_core::DType::BF16,
                _ => weft_core::DType::F32,
            };
            trainer = trainer.with_pipeline(pipeline.with_wire_dtype(wire));
        }
    }
    if let Some(g) = mesh.as_ref().filter(|m| m.dp > 1).map(|m| m.dp_group.clone()) {
        let mib = |v: f64| (v * (1 << 20) as f64) as usize;
        let options = weft_dist::DdpOptions {
            first_bucket_bytes: mib(config.parallel.first_bucket_mb),
            bucket_bytes: mib(config.parallel.bucket_cap_mb),
            ..Default::default()
        };
        trainer = match config.parallel.zero {
            0 => trainer.with_data_parallel(g, options)?,
            stage => trainer.with_zero(
                g,
                weft_dist::ZeroOptions {
                    stage,
                    ddp: options,
                    bf16: config.parallel.comm_dtype == "bf16",
                },
            )?,
        };
    }
    if let Some(path) = &t.trace {
        trainer = trainer.with_trace(config.resolve(path));
    }
    if let Some(eval) = data.eval.clone() {
        trainer = trainer.with_eval(t.eval_every, t.eval_batches, eval);
    }
    if let Some(dir) = &t.checkpoint_dir {
        trainer = trainer.with_checkpoints(CheckpointPolicy {
            dir: config.resolve(dir),
            every: t.checkpoint_every,
            keep: t.keep_checkpoints,
            overwrite: t.overwrite,
        });
    }
    if let Some(claim) = claim {
        trainer = trainer.with_claim(claim);
    }
    let mut parallel = serde_json::json!({"dp": p.dp, "tp": p.tp, "pp": p.pp, "zero": p.zero});
    if p.pp > 1 {
        // what decides which layers each stage's dropout stream serves, and in what order: a
        // resume with the same settings puts each stage's stream back where it was
        parallel["pipeline"] = serde_json::json!({
            "schedule": p.schedule,
            "virtual_stages": p.virtual_stages,
            "micro_batches": p.micro_batches,
            "balance": p.balance,
            "stage_blocks": p.stage_blocks,
        });
    }
    trainer.checkpoint_extra = serde_json::json!({
        "model": config.model,
        "tokenizer": data.tokenizer.as_ref().map(|t| t.to_json()),
        "parallel": parallel,
    });
    let mut start = if options.resume { trainer.resume()? } else { 0 };
    if logs {
        match trainer.resumed_from() {
            Some(path) => weft_core::errln!("weft: resuming after step {start} from {}", path.display()),
            None if options.resume && options.resume_from.is_none() => {
                let dir = t.checkpoint_dir.as_ref().map(|d| config.resolve(d)).unwrap_or_default();
                weft_core::errln!(
                    "weft: --resume: {} holds no checkpoint to resume; starting at step 0",
                    dir.display()
                );
            }
            None => {}
        }
    }
    // started from another folder's checkpoint (when not resumed from its own)
    let mut loaded_elsewhere = false;
    if let (Some(from), 0) = (&options.resume_from, start) {
        start = trainer.load_checkpoint(from)?;
        loaded_elsewhere = true;
        if logs {
            weft_core::errln!("weft: starting after step {start} from {}", from.display());
        }
    }
    if let (Some(path), true) = (&t.metrics, logs) {
        let path = config.resolve(path);
        let mode = match (options.resume, trainer.resumed_from()) {
            (true, Some(_)) => MetricsMode::Resume { steps: start },
            (true, None) => {
                // nothing of this folder was resumed: whatever the file holds (an attempt killed
                // before its first checkpoint, or another run's records) is kept beside it
                if let Some(aside) = metrics::set_aside(&path)? {
                    weft_core::errln!(
                        "weft: --resume: nothing was resumed; kept the records already in {} as {}",
                        path.display(),
                        aside.display()
                    );
                }
                MetricsMode::Fresh { overwrite: false }
            }
            (false, _) => MetricsMode::Fresh { overwrite: t.overwrite },
        };
        trainer = trainer.with_callback(MetricsFile::open(&path, mode)?);
    }
    let mut outcome = RunOutcome::default();
    // the sample printed at the end: `(heading, text)` on the rank that logs
    let mut sample_text = None;
    if start < t.steps {
        // recorded in the run store (rank 0, `[track]`): metrics as they come, the status at the end
        // a run resumed from its own checkpoint continues the run that checkpoint names
        let continues = trainer.continued_extra().map(|e| (e, start));
        // started from another run's checkpoint folder (lineage), not resumed from its own
        let resumed_from = options
            .resume_from
            .as_deref()
            .filter(|_| loaded_elsewhere && trainer.continued_extra().is_none())
            .and_then(|from| checkpoint::resolve(from).ok());
        let tracking = crate::track::Tracking::start(config, logs, continues, || {
            crate::lineage::run_inputs(config, data.tokens_digest.as_deref(), resumed_from.as_deref())
        });
        if let Some(tr) = &tracking {
            tr.name_in(&mut trainer.checkpoint_extra);
            trainer = trainer.with_callback(tr.callback());
        }
        let fitted = trainer.fit(data.train.clone(), start, t.steps);
        // the sample of a run that trained to its end is one of its artifacts, so it is made
        // before the run's record ends
        let sampled = match &fitted {
            Ok(s) if s.stopped_by.is_none() => sample(config, &data, lm.as_deref(), &trainer, logs),
            _ => Ok(None),
        };
        if let Some(tr) = &tracking {
            if let Ok(Some((_, text))) = &sampled {
                tr.sample(text);
            }
            tr.end(&fitted);
        }
        let summary = fitted?;
        sample_text = sampled?;
        outcome.stopped_by = summary.stopped_by;
        if let (Some(sig), true) = (summary.stopped_by, logs) {
            let saved = match &summary.checkpoint {
                Some(path) => format!("checkpoint at {}; continue with --resume", path.display()),
                None => "no train.checkpoint_dir is set, so nothing was saved".to_string(),
            };
            weft_core::errln!(
                "weft: stopped by {} after step {}; {saved}",
                weft_dist::signal::signal_name(sig),
                summary.steps
            );
        }
        outcome.summary = Some(summary);
    } else if loaded_elsewhere {
        // nothing left to train: the state goes into this run's own folder, in its layout
        trainer.save_checkpoint(start)?;
    } else if logs {
        weft_core::errln!(
            "weft: the newest checkpoint is at step {start}; nothing left to train (train.steps = {})",
            t.steps
        );
    }
    if outcome.stopped_by.is_some() {
        return Ok(outcome);
    }
    if start >= t.steps {
        // nothing trained here: a sample of the model as loaded
        sample_text = sample(config, &data, lm.as_deref(), &trainer, logs)?;
    }
    if let Some((heading, text)) = sample_text {
        weft_core::outln!("--- {heading} ---\n{text}");
    }
    Ok(outcome)
}

/// The sample a language model on text or token data writes at the end of a run: `(heading,
/// text)` on the rank that `logs` (`train.sample_tokens` tokens, or characters, after a new
/// line), `None` elsewhere or when there is nothing to sample. A model cut across ranks is put
/// together first, and every rank takes part in that.
fn sample(
    config: &RunConfig,
    data: &data::Data,
    lm: Option<&dyn LanguageModel>,
    trainer: &Trainer,
    logs: bool,
) -> Result<Option<(String, String)>> {
    let t = &config.train;
    let p = &config.parallel;
    let (Some(tok), Some(lm), true) = (&data.tokenizer, lm, t.sample_tokens > 0) else {
        return Ok(None);
    };
    // a tensor-parallel model's parts, a pipeline's stages (each trained by its own rank)
    let whole = if p.tp > 1 || p.pp > 1 {
        let params: BTreeMap<String, weft_core::Tensor> = trainer.whole_parameters()?.into_iter().collect();
        let g = build_language_model(&config.model, t.seed)?;
        state_dict::load_state_dict(g.as_ref(), &params, g.aliases(), "the tensor-parallel model")?;
        Some(g)
    } else {
        None
    };
    if !logs {
        return Ok(None);
    }
    // a new line, or the first character of a text that has none
    let prompt = match tok.encode("\n") {
        Ok(_) => "\n".to_string(),
        Err(_) => tok.decode(&[0])?,
    };
    let text = crate::generate::sample_text(whole.as_deref().unwrap_or(lm), tok, &prompt, t.sample_tokens, t.seed)?;
    let unit = if tok.kind() == "char" { "characters" } else { "tokens" };
    Ok(Some((format!("sample ({} {unit})", t.sample_tokens), text)))
}
