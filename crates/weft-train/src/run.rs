//! From a [`RunConfig`] to a finished run: builds the model, data, optimizer, schedule and
//! callbacks, resumes if asked, trains, and (for gpt on text) prints a sample.

use std::collections::BTreeMap;
use std::sync::Arc;

use weft_data::{BatchesDataset, CsvDataset, LabelColumn, Split, TextDataset};
use weft_models::convnet::{ConvNet, ConvNetConfig};
use weft_models::gpt::Gpt;
use weft_models::mlp::{MlpConfig, MlpModel};
use weft_models::Model;
use weft_nn::layers::Activation;
use weft_nn::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use weft_nn::schedule::Schedule;
use weft_nn::state_dict;

use crate::checkpoint::{self, ClaimMode};
use crate::config::{DataConfig, LabelColumnConfig, ModelConfig, OptimConfig, RunConfig, ScheduleConfig};
use crate::error::{Error, Result};
use crate::metrics::{MetricsFile, MetricsMode};
use crate::trainer::{shard_rows, BatchFn, CheckpointPolicy, Trainer};

/// The model of a `[model]` section, initialised from `seed`.
pub fn build_model(cfg: &ModelConfig, seed: u64) -> Result<Arc<dyn Model>> {
    Ok(match cfg {
        ModelConfig::Mlp(m) => {
            let activation = Activation::parse(&m.activation).ok_or_else(|| {
                Error::Config(format!(
                    "model.activation: {:?} is not one of relu, gelu, tanh",
                    m.activation
                ))
            })?;
            let c = MlpConfig {
                in_features: m.in_features,
                hidden: m.hidden.clone(),
                out_features: m.out_features,
                activation,
            };
            Arc::new(MlpModel::new(c, seed)?)
        }
        ModelConfig::Convnet(m) => {
            let c = ConvNetConfig {
                in_channels: m.in_channels,
                image_size: m.image_size,
                channels: m.channels.clone(),
                num_classes: m.num_classes,
            };
            Arc::new(ConvNet::new(c, seed)?)
        }
        ModelConfig::Gpt(_) => Arc::new(build_gpt(cfg, seed)?),
    })
}

pub(crate) fn build_gpt(cfg: &ModelConfig, seed: u64) -> Result<Gpt> {
    let ModelConfig::Gpt(g) = cfg else {
        return Err(Error::Config("model.kind: expected gpt".into()));
    };
    Ok(Gpt::new(g.to_config(), seed)?)
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

/// The schedule of a `[schedule]` section.
pub fn build_schedule(s: &ScheduleConfig, lr: f64) -> Result<Schedule> {
    let schedule = match s {
        ScheduleConfig::Constant => Schedule::Constant { lr },
        ScheduleConfig::Cosine(c) => Schedule::Cosine {
            lr,
            warmup_steps: c.warmup_steps,
            decay_steps: c.decay_steps,
            min_lr: c.min_lr,
        },
    };
    schedule
        .validate()
        .map_err(|e| Error::Config(format!("schedule: {e}")))?;
    Ok(schedule)
}

/// Training and evaluation batches of a `[data]` section.
struct Data {
    train: BatchFn,
    eval: Option<BatchFn>,
    text: Option<Arc<TextDataset>>,
    /// Rows of every training batch (the global batch).
    batch_rows: usize,
}

impl Data {
    /// This data-parallel rank's share of every training batch: the same global batches are
    /// built on every rank (from the same seed and step) and each keeps its rows, so `ranks`
    /// ranks see exactly what one process would, in the same order whatever their number.
    /// Evaluation batches stay whole (ranks share them out by index instead).
    fn shard(mut self, rank: usize, ranks: usize) -> Result<Data> {
        if ranks == 1 {
            return Ok(self);
        }
        if !self.batch_rows.is_multiple_of(ranks) {
            return Err(Error::Config(format!(
                "parallel.dp: a global batch of {} rows does not split evenly across dp = {ranks} ranks",
                self.batch_rows
            )));
        }
        let inner = self.train.clone();
        self.train = Arc::new(move |step| {
            let (x, y) = inner(step)?;
            Ok((shard_rows(&x, rank, ranks)?, shard_rows(&y, rank, ranks)?))
        });
        Ok(self)
    }
}

fn build_data(config: &RunConfig) -> Result<Data> {
    let seed = config.train.seed;
    let block_size = match &config.model {
        ModelConfig::Gpt(g) => g.block_size,
        _ => 0,
    };
    Ok(match &config.data {
        DataConfig::Batches(b) => {
            let ds = Arc::new(BatchesDataset::from_file(config.resolve(&b.path))?);
            let batch_rows = ds.batch_size();
            Data {
                train: Arc::new(move |step| Ok(ds.batch(step)?)),
                eval: None,
                text: None,
                batch_rows,
            }
        }
        DataConfig::Text(t) => {
            let (path, val_fraction) = (&t.path, t.val_fraction);
            let ds = Arc::new(if path.as_os_str() == "builtin" {
                TextDataset::from_text(crate::builtin::CORPUS, val_fraction)?
            } else {
                TextDataset::from_file(config.resolve(path), val_fraction)?
            });
            if let ModelConfig::Gpt(g) = &config.model {
                if ds.vocab_size() > g.vocab_size {
                    return Err(Error::Config(format!(
                        "model.vocab_size: {} is smaller than the {} distinct characters of {}",
                        g.vocab_size,
                        ds.vocab_size(),
                        config.resolve(path).display()
                    )));
                }
            }
            let bs = t.batch_size;
            let (t, v) = (ds.clone(), ds.clone());
            let train: BatchFn = Arc::new(move |step| Ok(t.batch(Split::Train, bs, block_size, seed, step)?));
            let has_val = val_fraction > 0.0;
            let eval: Option<BatchFn> = has_val
                .then(|| Arc::new(move |i| Ok(v.batch(Split::Val, bs, block_size, seed ^ 0x5eed, i)?)) as BatchFn);
            Data {
                train,
                eval,
                text: Some(ds),
                batch_rows: bs,
            }
        }
        DataConfig::Csv(c) => {
            let label = match &c.label_column {
                LabelColumnConfig::Index(i) if *i < 0 => LabelColumn::Last,
                LabelColumnConfig::Index(i) => LabelColumn::Index(*i as usize),
                LabelColumnConfig::Name(n) => LabelColumn::Name(n.clone()),
            };
            let ds = Arc::new(CsvDataset::from_file(
                config.resolve(&c.path),
                label,
                c.feature_scale as f32,
                c.val_fraction,
            )?);
            // a label past the model's classes would fail mid-run, naming neither file nor row
            let classes = match &config.model {
                ModelConfig::Mlp(m) => Some(m.out_features),
                ModelConfig::Convnet(m) => Some(m.num_classes),
                ModelConfig::Gpt(_) => None,
            };
            if let Some(classes) = classes {
                ds.check_labels(classes)?;
            }
            let bs = c.batch_size;
            let (t, v) = (ds.clone(), ds.clone());
            let train: BatchFn = Arc::new(move |step| Ok(t.batch(Split::Train, bs, seed, step)?));
            let eval: Option<BatchFn> = (c.val_fraction > 0.0)
                .then(|| Arc::new(move |i| Ok(v.batch(Split::Val, bs, seed ^ 0x5eed, i)?)) as BatchFn);
            Data {
                train,
                eval,
                text: None,
                batch_rows: bs,
            }
        }
    })
}

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

/// The job this process belongs to, from the launcher's (or Slurm's, OpenMPI's) variables.
struct JobShape {
    ranks: usize,
    rank: usize,
    /// Ranks of the job on this machine.
    local_ranks: usize,
}

impl JobShape {
    /// `this job has 4 ranks (this is rank 1)`, or that this is a single process.
    fn describe(&self) -> String {
        if self.ranks > 1 {
            format!("this job has {} ranks (this is rank {})", self.ranks, self.rank)
        } else {
            "this is a single process (no launcher variables are set)".to_string()
        }
    }
}

fn job_shape() -> Result<JobShape> {
    let env = weft_dist::env::from_env()?;
    Ok(JobShape {
        ranks: env.as_ref().map_or(1, |e| e.world_size),
        rank: env.as_ref().map_or(0, |e| e.rank),
        local_ranks: env.as_ref().map_or(1, |e| e.local_world_size),
    })
}

/// Joins the job when this process is one of several ranks (started by `weft launch`, Slurm or
/// OpenMPI), after checking that `[parallel]` describes as many ranks as the job has: every rank
/// reads the same config, so each stops with the same message before any connection is made.
fn join_job(config: &RunConfig, job: &JobShape) -> Result<Option<weft_dist::ProcessGroup>> {
    let p = &config.parallel;
    let want = p.dp * p.tp * p.pp;
    let ranks = job.ranks;
    if want != ranks {
        let who = job.describe();
        return Err(Error::Config(format!(
            "parallel: dp x tp x pp = {} x {} x {} = {want}, but {who}; start {want} ranks, e.g. `weft launch \
             --nproc-per-node {want} -- weft train ...`, or leave parallel.dp unset to use every rank",
            p.dp, p.tp, p.pp
        )));
    }
    if ranks == 1 {
        return Ok(None);
    }
    Ok(Some(weft_dist::init()?))
}

/// `config` with `parallel.dp = 0` (the default) replaced by the data-parallel ranks the job
/// has: its ranks divided by `tp x pp`.
fn with_job_dp(config: &RunConfig, job: &JobShape) -> Result<RunConfig> {
    let mut resolved = config.clone();
    let p = &config.parallel;
    if p.dp == 0 {
        let cut = p.tp * p.pp;
        if cut == 0 || !job.ranks.is_multiple_of(cut) {
            return Err(Error::Config(format!(
                "parallel: dp unset takes the job's ranks divided by tp x pp = {} x {} = {cut}, but {}; start a \
                 multiple of {cut} ranks, e.g. `weft launch --nproc-per-node {cut} -- weft train ...`",
                p.tp,
                p.pp,
                job.describe()
            )));
        }
        resolved.parallel.dp = job.ranks / cut;
    }
    Ok(resolved)
}

/// Checks before anything is built that the data can serve the run: CSV labels within the
/// model's classes, and a validation split that gives a batch when the run evaluates.
fn check_data(config: &RunConfig, data: &Data) -> Result<()> {
    let t = &config.train;
    if t.eval_every == 0 {
        return Ok(());
    }
    let Some(eval) = &data.eval else {
        return Err(Error::Config(format!(
            "train.eval_every = {}, but the data has no validation split (data.val_fraction = 0, or data of kind \
             \"batches\"); set train.eval_every = 0, or give the data a validation split",
            t.eval_every
        )));
    };
    eval(0).map(drop).map_err(|e| {
        Error::Config(format!(
            "train.eval_every = {}, but the validation split cannot give a batch: {e}; raise data.val_fraction or \
             set train.eval_every = 0",
            t.eval_every
        ))
    })
}

/// Checks, on the rank that writes it (`writes`), that the metrics file of a new run holds no
/// other run's records (unless `train.overwrite`) and that the trace can be written, so that
/// neither fails after training; every rank of `group` fails if it fails.
fn check_outputs(config: &RunConfig, options: &TrainOptions, group: Option<&weft_dist::ProcessGroup>) -> Result<()> {
    let t = &config.train;
    let writes = group.is_none_or(|g| g.rank() == 0);
    let check = || -> Result<()> {
        if !writes {
            return Ok(());
        }
        if let Some(path) = &t.metrics {
            let path = config.resolve(path);
            let taken = std::fs::metadata(&path).is_ok_and(|m| m.len() > 0);
            if taken && !options.resume && !t.overwrite {
                return Err(Error::Config(format!(
                    "train.metrics: {} holds another run's records; continue that run with --resume, write this \
                     one elsewhere, or set train.overwrite = true to replace it",
                    path.display()
                )));
            }
            crate::trainer::probe_writable(&path)
                .map_err(|e| Error::Config(format!("train.metrics: cannot write {}: {e}", path.display())))?;
        }
        if let Some(path) = &t.trace {
            let path = config.resolve(path);
            crate::trainer::probe_writable(&path)
                .map_err(|e| Error::Config(format!("train.trace: cannot write {}: {e}", path.display())))?;
        }
        Ok(())
    };
    crate::job::agree(group, check(), "checking train.metrics and train.trace")
}

/// Runs the training described by `config`.
pub fn train(config: &RunConfig, options: &TrainOptions) -> Result<RunOutcome> {
    if options.handle_signals {
        crate::stop::install().map_err(|e| Error::Run(format!("cannot install the signal handlers: {e}")))?;
    }
    let job = job_shape()?;
    let dp_from_job = config.parallel.dp == 0;
    let resolved = with_job_dp(config, &job)?;
    let config = &resolved;
    let t = &config.train;
    let p = &config.parallel;
    // refuse what cannot fit before allocating any of it (every rank computes the same)
    crate::memory::check(config, job.local_ranks)?;
    let group = join_job(config, &job)?;
    let rank = group.as_ref().map_or(0, |g| g.rank());
    // rank 0 logs, shows progress and samples for the whole job
    let logs = rank == 0;
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
    // the run's outputs, before the model is built: a folder of its own, files it can write
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
    check_outputs(config, options, group.as_ref())?;
    let init = config.init.from.as_ref().map(|f| config.resolve(f));
    let load_init = |m: &dyn Model| -> Result<()> {
        if let Some(path) = &init {
            state_dict::load_file(m, path, m.aliases())?;
        }
        Ok(())
    };
    // a gpt is kept by its own type too, to sample from it after training
    let gpt = match &config.model {
        ModelConfig::Gpt(_) => {
            let mut g = build_gpt(&config.model, t.seed)?;
            load_init(&g)?;
            g.stage_cut = match (&p.stage_blocks, p.balance.as_str()) {
                (Some(counts), _) => weft_models::gpt::StageCut::Given(counts.clone()),
                (None, "parameters") => weft_models::gpt::StageCut::Parameters,
                _ => weft_models::gpt::StageCut::Blocks,
            };
            // the whole model is built (and loaded) on every rank, then cut
            if let Some(m) = mesh.as_ref().filter(|m| m.tp > 1) {
                g.make_tensor_parallel(&weft_dist::tensor_parallel::TpProcessGroup::handle(&m.tp_group))?;
            }
            Some(Arc::new(g))
        }
        _ => None,
    };
    let model: Arc<dyn Model> = match &gpt {
        Some(g) => g.clone(),
        None => {
            let m = build_model(&config.model, t.seed)?;
            load_init(m.as_ref())?;
            m
        }
    };
    let optimizer = build_optimizer(&config.optim)?;
    let schedule = build_schedule(&config.schedule, config.optim.lr)?;
    let mut trainer = Trainer::new(model.clone(), optimizer, schedule, config.optim.weight_decay)
        .with_grad_clip(config.optim.grad_clip)
        .with_log_every(t.log_every)
        .with_skip_nonfinite(t.skip_nonfinite)
        .with_progress(options.progress && logs);
    if let Some(m) = &mesh {
        trainer = trainer.with_job(m.world.clone());
        if m.tp > 1 {
            trainer = trainer.with_tensor_parallel(m.tp_group.clone());
        }
        if let (true, Some(g)) = (m.pp > 1, &gpt) {
            let schedule = weft_dist::pipeline::PipelineSchedule::parse(&p.schedule).ok_or_else(|| {
                Error::Config(format!("parallel.schedule: {:?} is not one of 1f1b, gpipe", p.schedule))
            })?;
            let pipeline = crate::pipeline::Pipeline::new(
                g.clone(),
                m.pp_group.clone(),
                schedule,
                p.micro_batches,
                m.ends_group.clone(),
                p.recompute,
            )?;
            trainer = trainer.with_pipeline(pipeline);
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
    trainer.checkpoint_extra = serde_json::json!({
        "model": config.model,
        "tokenizer": data.text.as_ref().map(|d| d.tokenizer().to_json()),
        "parallel": {"dp": p.dp, "tp": p.tp, "pp": p.pp, "zero": p.zero},
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
        let mode = if options.resume {
            MetricsMode::Resume { steps: start }
        } else {
            MetricsMode::Fresh { overwrite: t.overwrite }
        };
        trainer = trainer.with_callback(MetricsFile::open(&config.resolve(path), mode)?);
    }
    let mut outcome = RunOutcome::default();
    if start < t.steps {
        let summary = trainer.fit(data.train.clone(), start, t.steps)?;
        outcome.stopped_by = summary.stopped_by;
        if let (Some(sig), true) = (summary.stopped_by, logs) {
            let saved = match &summary.checkpoint {
                Some(path) => format!("checkpoint at {}; continue with --resume", path.display()),
                None => "no train.checkpoint_dir is set, so nothing was saved".to_string(),
            };
            weft_core::errln!(
                "weft: stopped by {} after step {}; {saved}",
                crate::stop::name(sig),
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
    if let (Some(text), Some(gpt), true) = (&data.text, &gpt, t.sample_tokens > 0) {
        // a model cut across ranks is put together first (every rank takes part): a
        // tensor-parallel model's parts, a pipeline's stages (each trained by its own rank)
        let whole = if p.tp > 1 || p.pp > 1 {
            let params: BTreeMap<String, weft_core::Tensor> = trainer.whole_parameters()?.into_iter().collect();
            let g = build_gpt(&config.model, t.seed)?;
            state_dict::load_state_dict(&g, &params, g.aliases(), "the tensor-parallel model")?;
            Some(g)
        } else {
            None
        };
        if logs {
            // a new line, or the first character of a text that has none
            let tok = text.tokenizer();
            let prompt = match tok.encode("\n") {
                Ok(_) => "\n".to_string(),
                Err(_) => tok.decode(&[0])?,
            };
            let sample =
                crate::generate::sample_text(whole.as_ref().unwrap_or(gpt), tok, &prompt, t.sample_tokens, t.seed)?;
            weft_core::outln!("--- sample ({} characters) ---\n{sample}", t.sample_tokens);
        }
    }
    Ok(outcome)
}
