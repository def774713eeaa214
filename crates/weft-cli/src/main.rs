//! The `weft` command-line tool.

mod bench;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "weft", version, about = "weft: deep-learning training in Rust")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Times the core ops at fixed shapes (threads: WEFT_NUM_THREADS, default all cores).
    Ops(bench::OpsArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench {
            what: BenchCommand::Ops(args),
        } => bench::run_ops(&args),
    };
    if let Err(e) = result {
        eprintln!("weft: error: {e}");
        std::process::exit(1);
    }
}
