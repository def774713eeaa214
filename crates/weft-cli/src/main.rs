//! The `weft` command-line tool.

#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

mod bench;
mod calibrate;
mod checkpoint;
mod data;
mod dist;
mod evaluate;
mod export;
mod generate;
mod graph;
mod launch;
mod lineage;
mod models;
mod open_files;
mod pipeline;
mod plan;
mod runs;
mod serve;
mod serve_registry;
mod sweep;
mod train;
mod ui;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "weft", version, about = "weft: deep-learning training in Rust")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Trains a model described by a TOML run config (without one: a character-level GPT on the
    /// built-in corpus).
    Train(train::TrainArgs),
    /// Continues a prompt with a trained gpt or llama checkpoint.
    Generate(generate::GenerateArgs),
    /// Evaluates a checkpoint on a run config's validation data: the loss (and a classifier's
    /// accuracy) the trainer's evaluation computes.
    Evaluate(evaluate::EvaluateArgs),
    /// Serves checkpoints over HTTP: KServe v2, TorchServe-style and OpenAI-compatible
    /// endpoints (docs/serving.md).
    Serve(serve::ServeArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
    /// Starts a distributed job: one worker process per rank.
    Launch(launch::LaunchArgs),
    /// Looks into checkpoints, and writes their model as one file.
    Checkpoint {
        #[command(subcommand)]
        what: CheckpointCommand,
    },
    /// Tokenizes text and writes token datasets.
    Data {
        #[command(subcommand)]
        what: DataCommand,
    },
    /// Writes a trained model in another format.
    Export {
        #[command(subcommand)]
        what: ExportCommand,
    },
    /// Shows the graph compiled mode captures for a run config's training step.
    Graph {
        #[command(subcommand)]
        what: GraphCommand,
    },
    /// Ranks the parallel layouts (dp, tp, pp, ZeRO, micro-batches, recompute) of a run
    /// config's model on N devices by predicted step time and memory (docs/plan.md); `weft
    /// plan calibrate` measures this machine for `--device-spec local`.
    Plan(plan::PlanArgs),
    /// The runs recorded in a run store (`weft-runs/`): list, show, compare, delete, export
    /// (docs/tracking.md).
    Runs {
        #[command(subcommand)]
        what: runs::RunsCommand,
    },
    /// Hyperparameter sweeps: trials of a run config with swept keys (TPE, random or grid),
    /// stopped early by a pruner (ASHA, Hyperband, median), each recorded in the run store
    /// (docs/sweep.md); `weft sweep status` shows a sweep's trials and its best.
    Sweep(sweep::SweepArgs),
    /// The model registry in a run store: register a run's checkpoint as a model's next
    /// version, list, show, promote to staging/production (docs/registry.md); `weft serve
    /// --registry` serves each model's production version.
    Models {
        #[command(subcommand)]
        what: models::ModelsCommand,
    },
    /// Pipelines: a DAG of steps (prepare, train, sweep, evaluate, command, condition,
    /// register, deploy) run in dependency order, independent ones at once, a step matching a
    /// finished execution in the run store skipped (docs/registry.md).
    Pipeline {
        #[command(subcommand)]
        what: pipeline::PipelineCommand,
    },
    /// Serves the dashboard of a run store in the browser: the run table, run details and
    /// metric curves, and its JSON API (docs/tracking.md).
    Ui(ui::UiArgs),
    /// Checks that parts of the system work on this machine or cluster.
    Check {
        #[command(subcommand)]
        what: CheckCommand,
    },
}

#[derive(Subcommand)]
enum ExportCommand {
    /// Writes a checkpoint's inference forward (its logits) as an ONNX model (opset 17), with
    /// a dynamic batch axis (and sequence axis, for gpt and llama).
    Onnx(export::OnnxArgs),
}

#[derive(Subcommand)]
enum GraphCommand {
    /// Prints the ops, shapes, fusion groups and memory plan of the captured step.
    Dump(graph::DumpArgs),
    /// Times every variant of the captured step's kernel calls (autotuning search), keeps the
    /// fastest in this machine's cache file, and prints a table per kernel.
    Tune(graph::TuneArgs),
}

#[derive(Subcommand)]
enum DataCommand {
    /// Reads text on stdin and prints its token ids as one JSON array.
    Encode(data::EncodeArgs),
    /// Reads a JSON array of token ids on stdin and prints their text.
    Decode(data::DecodeArgs),
    /// Tokenizes text files (in parallel: WEFT_NUM_THREADS, default all cores) into token shards
    /// and an index.json.
    Prepare(data::PrepareArgs),
}

#[derive(Subcommand)]
enum CheckCommand {
    /// Runs every collective on every dtype across the job (start it under `weft launch`) and
    /// checks each result element by element.
    Collectives(dist::CheckArgs),
}

#[derive(Subcommand)]
enum CheckpointCommand {
    /// Lists a checkpoint's step, the layout that wrote it, and its tensors (checking every
    /// checksum).
    Inspect(checkpoint::InspectArgs),
    /// Writes a checkpoint's model as one safetensors file under PyTorch's names.
    Consolidate(checkpoint::ConsolidateArgs),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Times the core ops at fixed shapes (threads: WEFT_NUM_THREADS, default all cores).
    Ops(bench::OpsArgs),
    /// Times the collectives across the job (start it under `weft launch`): median latency and
    /// bus bandwidth per op and size.
    Collectives(dist::BenchArgs),
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Train(args) => train::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Evaluate(args) => evaluate::run(&args),
        Command::Serve(args) => serve::run(args),
        Command::Bench {
            what: BenchCommand::Ops(args),
        } => bench::run_ops(&args).map_err(|e| e.to_string()),
        Command::Bench {
            what: BenchCommand::Collectives(args),
        } => dist::run_bench(&args),
        Command::Check {
            what: CheckCommand::Collectives(args),
        } => dist::run_check(&args),
        Command::Data {
            what: DataCommand::Encode(args),
        } => data::encode(&args),
        Command::Data {
            what: DataCommand::Decode(args),
        } => data::decode(&args),
        Command::Data {
            what: DataCommand::Prepare(args),
        } => data::prepare(&args),
        Command::Graph {
            what: GraphCommand::Dump(args),
        } => graph::dump(&args),
        Command::Graph {
            what: GraphCommand::Tune(args),
        } => graph::tune(&args),
        Command::Export {
            what: ExportCommand::Onnx(args),
        } => export::onnx(&args),
        Command::Launch(args) => launch::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Runs { what } => runs::run(what),
        Command::Sweep(args) => sweep::run(args),
        Command::Models { what } => models::run(what),
        Command::Pipeline { what } => pipeline::run(what),
        Command::Ui(args) => ui::run(&args),
        Command::Checkpoint {
            what: CheckpointCommand::Inspect(args),
        } => checkpoint::inspect(&args),
        Command::Checkpoint {
            what: CheckpointCommand::Consolidate(args),
        } => checkpoint::consolidate(&args),
    }
}

/// Writes `text` to stdout; a reader that went away (`| head`) is not an error.
pub(crate) fn print_out(text: &str) -> Result<(), String> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("stdout: {e}")),
        _ => Ok(()),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // the commands that compute read their thread count (refusing a malformed or too large
    // WEFT_NUM_THREADS) and set up the allocator before their first tensor (the launcher
    // computes nothing)
    if !matches!(
        cli.command,
        Command::Launch(_)
            | Command::Runs { .. }
            | Command::Sweep(_)
            | Command::Ui(_)
            | Command::Models { .. }
            | Command::Pipeline { .. }
    ) {
        if let Err(e) = weft_core::cpu::threads::try_init() {
            weft_core::errln!("weft: error: {e}");
            return ExitCode::FAILURE;
        }
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            weft_core::errln!("weft: error: {e}");
            // under `weft launch`: tells the launcher what failed, and whether a peer caused it
            weft_dist::failure::record(&e);
            ExitCode::FAILURE
        }
    }
}
