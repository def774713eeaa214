//! `weft evaluate`: a checkpoint's validation loss (and a classifier's accuracy) on a run
//! config's data, by the trainer's own evaluation (`weft_train::run::evaluate`; see
//! docs/training.md, "Evaluating a checkpoint").

use std::path::PathBuf;

use crate::train::ConfigArgs;

#[derive(clap::Args)]
pub struct EvaluateArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// A checkpoint folder, or a checkpoint directory (its newest checkpoint is used).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Evaluation batches, from the first (default: the config's train.eval_batches).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    batches: Option<String>,
    /// Print one JSON object: {"val_loss", "batches", "step", "checkpoint"[, "val_accuracy"]}.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &EvaluateArgs) -> Result<(), String> {
    let batches = match &args.batches {
        None => None,
        Some(raw) => match raw.trim().parse::<usize>() {
            Ok(n) if (1..=weft_train::MAX_EVAL_BATCHES).contains(&n) => Some(n),
            _ => {
                return Err(format!(
                    "--batches: {raw:?} is not a whole number >= 1 (and at most {})",
                    weft_train::MAX_EVAL_BATCHES
                ))
            }
        },
    };
    let cfg = args.config.load()?;
    let e = weft_train::run::evaluate(&cfg, &args.checkpoint, batches).map_err(|e| e.to_string())?;
    if args.json {
        let mut v = serde_json::json!({
            "val_loss": e.loss,
            "batches": e.batches,
            "step": e.step,
            "checkpoint": e.checkpoint.display().to_string(),
        });
        if let Some(a) = e.accuracy {
            v["val_accuracy"] = serde_json::json!(a);
        }
        weft_core::outln!("{v}");
    } else {
        let accuracy = e.accuracy.map_or(String::new(), |a| format!(", val_accuracy {a}"));
        weft_core::outln!(
            "{}: step {}: val_loss {}{accuracy} ({} batches)",
            e.checkpoint.display(),
            e.step,
            e.loss,
            e.batches
        );
    }
    Ok(())
}
