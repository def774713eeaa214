//! `weft generate`: continues a prompt with a trained gpt checkpoint.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// A checkpoint folder, or a checkpoint directory (its newest checkpoint is used).
    #[arg(long)]
    checkpoint: PathBuf,
    #[arg(long, default_value = "\n")]
    prompt: String,
    /// Characters to generate.
    #[arg(long, default_value_t = 200)]
    tokens: usize,
    #[arg(long, default_value_t = 1337)]
    seed: u64,
}

pub fn run(args: GenerateArgs) -> Result<(), String> {
    let text = weft_train::generate::generate(&args.checkpoint, &args.prompt, args.tokens, args.seed)
        .map_err(|e| e.to_string())?;
    weft_core::outln!("{text}");
    Ok(())
}
