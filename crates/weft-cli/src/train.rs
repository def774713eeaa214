//! `weft train`: the flags, mapped onto `weft_train::run` (see docs/training.md).

use std::path::PathBuf;

use weft_train::config::{Overrides, RunConfig};

/// The run config a command reads: a file or the built-in one, with keys removed and set.
#[derive(clap::Args)]
pub struct ConfigArgs {
    /// The run config (relative paths inside it resolve against its folder; without one: the
    /// built-in run).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Overrides a config value: `section.key=value` (repeatable; a relative path given here
    /// resolves against the working directory).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    overrides: Vec<String>,
    /// Removes a key from the config: `section.key` (repeatable; applied before --set).
    #[arg(long = "unset", value_name = "SECTION.KEY")]
    unset: Vec<String>,
}

impl ConfigArgs {
    /// The same choice as command-line arguments, for a process started in the same working
    /// directory (the config file's path made absolute).
    pub(crate) fn to_args(&self) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        if let Some(path) = &self.config {
            let path = std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))?;
            out.push("--config".to_string());
            out.push(path.display().to_string());
        }
        for key in &self.unset {
            out.extend(["--unset".to_string(), key.clone()]);
        }
        for set in &self.overrides {
            out.extend(["--set".to_string(), set.clone()]);
        }
        Ok(out)
    }

    /// The run config, with `--unset` keys removed and `--set` values applied.
    pub(crate) fn load(&self) -> Result<RunConfig, String> {
        let cwd = std::env::current_dir().map_err(|e| format!("the working directory: {e}"))?;
        let overrides = Overrides {
            unset: self.unset.clone(),
            set: self.overrides.clone(),
            cwd: cwd.clone(),
        };
        match &self.config {
            Some(path) => RunConfig::load(path, &overrides),
            None => RunConfig::parse(weft_train::builtin::CONFIG, "built-in config", cwd, &overrides),
        }
        .map_err(|e| e.to_string())
    }
}

#[derive(clap::Args)]
pub struct TrainArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Continue from the newest checkpoint in `train.checkpoint_dir` that verifies (from step 0,
    /// saying so, when there is none).
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

/// Runs the training; a run stopped by SIGINT or SIGTERM (after writing its checkpoint) exits
/// the process with 128 + the signal's number, as a shell reports it.
pub fn run(args: TrainArgs) -> Result<(), String> {
    let cfg = args.config.load()?;
    let options = weft_train::run::TrainOptions {
        resume: args.resume,
        resume_from: args.resume_from,
        progress: !args.quiet,
        handle_signals: true,
    };
    let outcome = weft_train::run::train(&cfg, &options).map_err(|e| e.to_string())?;
    if let Some(sig) = outcome.stopped_by {
        std::process::exit(128 + sig);
    }
    Ok(())
}
