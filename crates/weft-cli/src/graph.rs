//! `weft graph dump`: the graph compiled mode (`[train] compile = true`) captures for a run's
//! training step, with its fusion groups and memory plan.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct DumpArgs {
    #[command(flatten)]
    config: crate::train::ConfigArgs,
    /// `text` (ops, shapes, fusion groups, memory plan) or `dot` (Graphviz).
    #[arg(long, default_value = "text")]
    format: String,
}

/// Prints the steps compiled mode captures for the config's model on its first batches, as a
/// run of its `[parallel]` layout captures them ([`capture_of`]). On one process: the whole
/// step it replays at every step once captured (from the second; the first for SGD without
/// momentum) (the last micro-batch's forward and backward, the gradients' norm, clipping and
/// the update), and with `train.grad_accum` above 1 the graph of each earlier micro-batch; when
/// the whole step cannot be captured, the micro-batch graph, saying why. Under data parallelism
/// and ZeRO stages 1 and 2: the micro-batch graph one rank captures, at its rows. `dot` prints
/// one graph: the whole step, or the micro-batch graph. A layout whose run is eager (tensor or
/// pipeline parallelism, ZeRO stage 3) prints one line saying why (exit 0); with `dot`, that
/// line is the error (exit 1): there is no graph to draw.
pub fn dump(args: &DumpArgs) -> Result<(), String> {
    if !matches!(args.format.as_str(), "text" | "dot") {
        return Err(format!("--format: {:?} is not one of text, dot", args.format));
    }
    let cfg = args.config.load()?;
    if cfg.parallel.auto {
        weft_core::errln!(
            "weft: note: parallel.auto plans the layout for the job's ranks; this is the step of one process"
        );
    } else if cfg.parallel.dp == 0 && cfg.parallel.tp * cfg.parallel.pp == 1 && cfg.parallel.zero > 0 {
        // dp unset takes the job's ranks: under weft launch the layout is another
        weft_core::errln!(
            "weft: note: parallel.dp is unset, so it is the job's ranks; this is the step of one process (give \
             parallel.dp to see a rank's: with zero = {} and more than one rank{})",
            cfg.parallel.zero,
            if cfg.parallel.zero == 3 {
                ", the run does not capture its step"
            } else {
                ", a rank captures its micro-batch's step"
            }
        );
    }
    match capture_of(&cfg.parallel) {
        Capture::Eager(why) => {
            let line = format!("train.compile: running eagerly: {why}; nothing is captured");
            if args.format == "dot" {
                return Err(format!("{line}, so there is no graph to draw"));
            }
            crate::print_out(&format!("{line}\n"))
        }
        Capture::Ranks { dp, zero } => {
            let rank = RankStep::new(&cfg, dp)?;
            let step = weft_train::run::step_graph(&rank.config).map_err(|e| e.to_string());
            drop(rank.scratch);
            let step = step?;
            if args.format == "dot" {
                return crate::print_out(&step.graph.to_dot());
            }
            let zero = match zero {
                0 => String::new(),
                z => format!(", ZeRO stage {z}"),
            };
            let micro = match cfg.train.grad_accum {
                0 | 1 => "its micro-batch graph".to_string(),
                k => format!("the graph of each of its train.grad_accum = {k} micro-batches"),
            };
            let text = format!(
                "one rank's step of dp = {dp} ranks{zero}: {micro} (forward and backward), replayed at every step \
                 once captured, on its {} of the batch's {} rows; the gradients' reduction, clipping and the \
                 optimizer's update run eagerly after it (data parallelism keeps the micro-batch graph: its \
                 reductions sit between backward and the update):\n{}",
                rank.rows / dp,
                rank.rows,
                describe(&step)
            );
            crate::print_out(&text)
        }
        Capture::Whole => single_process(args, &cfg),
    }
}

/// What a run of a `[parallel]` layout captures with `train.compile = true`.
#[derive(Debug, PartialEq)]
enum Capture {
    /// One process: the whole step (where it can be captured).
    Whole,
    /// `dp` ranks, ZeRO stage `zero` (0, 1 or 2): each rank's micro-batch graph.
    Ranks { dp: usize, zero: usize },
    /// Nothing: the run is eager, for this reason.
    Eager(&'static str),
}

/// What the trainer captures for `p`, read as one process reads it (`dp` unset, 0, is the
/// job's ranks over `tp x pp`: 1 here; `auto` plans one process): the trainer's reason when it
/// runs eagerly ([`ParallelConfig::uncapturable`](weft_train::config::ParallelConfig::uncapturable));
/// the whole step on a single process only (`Trainer::whole_step_ready`).
/// `crates/weft-cli/tests/graph_dump_layouts.rs` checks that a run of each eager layout logs
/// this reason and that a data-parallel rank captures what the dump prints.
fn capture_of(p: &weft_train::config::ParallelConfig) -> Capture {
    let dp = p.dp.max(1);
    match p.uncapturable(dp) {
        Some(why) => Capture::Eager(why),
        None if dp > 1 => Capture::Ranks { dp, zero: p.zero },
        None => Capture::Whole,
    }
}

/// The config of one data-parallel rank's step: the rows of a batch that rank 0 of `dp` gets
/// (`data.batch_size / dp`; for `data.kind = "batches"`, the first rows of the file's first
/// batch, in a scratch file removed when this is dropped).
struct RankStep {
    config: weft_train::config::RunConfig,
    /// Rows of the whole batch.
    rows: usize,
    scratch: Option<Scratch>,
}

/// A folder removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    /// A new folder `weft-graph-dump-<pid>-<n>` in the system's temporary folder (made here, so
    /// nothing that stood there before is written into).
    fn new() -> Result<Scratch, String> {
        let base = std::env::temp_dir();
        for n in 0..64 {
            let dir = base.join(format!("weft-graph-dump-{}-{n}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(Scratch(dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("{}: {e}", dir.display())),
            }
        }
        Err(format!(
            "{}: no new weft-graph-dump-{}-N folder could be made",
            base.display(),
            std::process::id()
        ))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl RankStep {
    fn new(cfg: &weft_train::config::RunConfig, dp: usize) -> Result<RankStep, String> {
        use weft_train::config::DataConfig;
        let mut config = cfg.clone();
        let split = |rows: usize| -> Result<usize, String> {
            if rows.is_multiple_of(dp) {
                Ok(rows / dp)
            } else {
                Err(format!(
                    "parallel.dp: a global batch of {rows} rows does not split evenly across dp = {dp} ranks"
                ))
            }
        };
        let (rows, scratch) = match &mut config.data {
            DataConfig::Text(t) => (std::mem::replace(&mut t.batch_size, 0), None),
            DataConfig::Tokens(t) => (std::mem::replace(&mut t.batch_size, 0), None),
            DataConfig::Csv(c) => (std::mem::replace(&mut c.batch_size, 0), None),
            DataConfig::Batches(b) => {
                let source = cfg.resolve(&b.path);
                let ds = weft_data::BatchesDataset::from_file(&source).map_err(|e| e.to_string())?;
                let rows = ds.batch_size();
                let per = split(rows)?;
                let (x, y) = ds.batch(0).map_err(|e| e.to_string())?;
                let first = |t: &weft_core::Tensor| -> weft_core::Result<weft_core::Tensor> {
                    let mut shape = t.shape().to_vec();
                    shape[0] = per;
                    shape.insert(0, 1);
                    t.narrow(0, 0, per)?.contiguous_copy()?.view(&shape)
                };
                let (x, y) = (
                    first(&x).map_err(|e| e.to_string())?,
                    first(&y).map_err(|e| e.to_string())?,
                );
                let scratch = Scratch::new()?;
                let file = scratch.0.join("batches.safetensors");
                weft_core::io::safetensors::save(&file, [("inputs", &x), ("targets", &y)], &Default::default())
                    .map_err(|e| e.to_string())?;
                b.path = file;
                (rows, Some(scratch))
            }
        };
        let per = split(rows)?;
        match &mut config.data {
            DataConfig::Text(t) => t.batch_size = per,
            DataConfig::Tokens(t) => t.batch_size = per,
            DataConfig::Csv(c) => c.batch_size = per,
            DataConfig::Batches(_) => {}
        }
        Ok(RankStep { config, rows, scratch })
    }
}

/// One process's dump: the whole step, or the micro-batch graph saying why not.
fn single_process(args: &DumpArgs, cfg: &weft_train::config::RunConfig) -> Result<(), String> {
    let micro = || weft_train::run::step_graph(cfg).map_err(|e| e.to_string());
    let whole = weft_train::run::whole_step_graph(cfg).map_err(|e| e.to_string());
    if args.format == "dot" {
        let step = match whole {
            Ok(w) => w,
            Err(why) => {
                weft_core::errln!("weft: {why}; printing the micro-batch graph");
                micro()?
            }
        };
        return crate::print_out(&step.graph.to_dot());
    }
    let mut text = String::new();
    match whole {
        Ok(w) => {
            text += "the whole step, replayed at every step once captured (the last micro-batch's forward and \
                     backward, the gradients' norm, clipping and the optimizer's update):\n";
            text += &describe(&w);
            if cfg.train.grad_accum > 1 {
                text += "\neach earlier micro-batch of a step (forward and backward; its gradients are added to \
                         the parameters'):\n";
                text += &describe(&micro()?);
            }
        }
        Err(why) => {
            text += &format!("{why}; the micro-batch graph (forward and backward), the update running eagerly:\n");
            text += &describe(&micro()?);
        }
    }
    crate::print_out(&text)
}

/// A captured graph in text: what the passes did, then its nodes, fusion groups and memory plan.
fn describe(step: &weft_train::run::StepGraph) -> String {
    let (r, m) = (step.report, step.remat);
    let recomputed = if m.recomputed > 0 {
        format!(
            "; {} activations recomputed in the backward (train.compile_recompute), peak {:.2} -> {:.2} MiB",
            m.recomputed,
            m.peak_before as f64 / (1 << 20) as f64,
            m.peak_after as f64 / (1 << 20) as f64
        )
    } else {
        String::new()
    };
    format!(
        "captured {} nodes; folded {}, merged {}, removed {}{recomputed}\n{}",
        r.captured,
        r.folded,
        r.merged,
        r.removed,
        step.graph.to_text()
    )
}

#[derive(clap::Args)]
pub struct TuneArgs {
    #[command(flatten)]
    config: crate::train::ConfigArgs,
    /// Time every kernel call again instead of starting from this machine's cache file.
    #[arg(long)]
    fresh: bool,
}

/// Times each kernel variant of the config's captured step and prints the choices.
pub fn tune(args: &TuneArgs) -> Result<(), String> {
    let cfg = args.config.load()?;
    let r = weft_train::run::tune_step(&cfg, args.fresh).map_err(|e| e.to_string())?;
    for w in &r.warnings {
        weft_core::errln!("weft: warning: {w}");
    }
    let written = if r.searched.is_empty() {
        "nothing new to write".to_string()
    } else if !r.warnings.iter().any(|w| w.contains("could not be written")) {
        format!("choices written to {}", weft_core::tune::cache_file().display())
    } else {
        "see the warning above".to_string()
    };
    crate::print_out(&format!(
        "searched {} kernel calls in {:.2} s ({} of the step's calls already chosen, {} choices read from the cache \
         file); {written}\n{}",
        r.searched.len(),
        r.seconds,
        r.known,
        r.from_file,
        r.to_table()
    ))
}
