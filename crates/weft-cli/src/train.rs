//! `weft train`: the flags, mapped onto `weft_train::run` (see docs/training.md).

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct TrainArgs {
    /// The run config (paths inside it are relative to its folder).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Overrides a config value: `section.key=value` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    overrides: Vec<String>,
    /// Continue from the newest complete checkpoint in `train.checkpoint_dir`.
    #[arg(long)]
    resume: bool,
    /// Start from this checkpoint (a folder, or the newest in a directory), saved under any
    /// layout; with --resume, only while train.checkpoint_dir holds no checkpoint yet.
    #[arg(long, value_name = "PATH")]
    resume_from: Option<PathBuf>,
    /// Hide the progress display.
    #[arg(long)]
    quiet: bool,
}

pub fn run(args: TrainArgs) -> Result<(), String> {
    let cfg = match &args.config {
        Some(path) => weft_train::config::RunConfig::load(path, &args.overrides),
        None => {
            let cwd = std::env::current_dir().unwrap_or_default();
            weft_train::config::RunConfig::parse(weft_train::builtin::CONFIG, "built-in config", cwd, &args.overrides)
        }
    }
    .map_err(|e| e.to_string())?;
    let options = weft_train::run::TrainOptions {
        resume: args.resume,
        resume_from: args.resume_from,
        progress: !args.quiet,
    };
    weft_train::run::train(&cfg, &options).map_err(|e| e.to_string())
}
