//! `weft generate`: continues a prompt with a trained gpt (see docs/training.md, "Generation").

use std::path::PathBuf;
use std::str::FromStr;

use weft_train::generate::{GenerateOptions, Sampling, MAX_TOKENS};

/// The numeric flags are read as text and parsed here, so that a negative, malformed or
/// out-of-range value is one error line naming the flag.
#[derive(clap::Args)]
pub struct GenerateArgs {
    /// A checkpoint folder, a checkpoint directory (its newest checkpoint is used), a
    /// safetensors file written by `weft checkpoint consolidate`, or a Hugging Face checkpoint
    /// folder (config.json, its weights and a tokenizer.json).
    #[arg(long)]
    checkpoint: PathBuf,
    /// The text to continue (each character must be in the checkpoint's vocabulary).
    #[arg(long, default_value = "\n")]
    prompt: String,
    /// Tokens to generate (at most; fewer when an end-of-sequence token comes), 1 to 1000000.
    #[arg(long, value_name = "N", default_value = "200", allow_hyphen_values = true)]
    tokens: String,
    /// Seed of the draws.
    #[arg(long, value_name = "S", default_value = "1337", allow_hyphen_values = true)]
    seed: String,
    /// Divides the logits before the softmax; 0: greedy (the most likely character each time).
    #[arg(long, value_name = "T", default_value = "0.8", allow_hyphen_values = true)]
    temperature: String,
    /// Draws from the K most likely characters only; 0: off.
    #[arg(long, value_name = "K", default_value = "40", allow_hyphen_values = true)]
    top_k: String,
    /// Nucleus sampling: draws from the smallest set of most likely characters whose
    /// probabilities add up to P (after temperature and top-k); in (0, 1], 1: off.
    #[arg(long, value_name = "P", default_value = "1", allow_hyphen_values = true)]
    top_p: String,
    /// Where the model runs: cpu, cuda or cuda:N.
    #[arg(long, value_name = "DEVICE", default_value = "cpu")]
    device: String,
    /// Generate all --tokens, also past an end-of-sequence token (by default generation ends
    /// there: a Hugging Face folder's eos_token_id, or the tokenizer's end-of-text token).
    #[arg(long)]
    ignore_eos: bool,
}

/// `raw` parsed as a `T`, or an error naming `flag` and saying what it must be.
fn parse<T: FromStr>(flag: &str, raw: &str, must_be: &str) -> Result<T, String> {
    raw.trim()
        .parse()
        .map_err(|_| format!("--{flag}: {raw:?} is not {must_be}"))
}

/// The flags, checked.
fn options(args: &GenerateArgs) -> Result<GenerateOptions, String> {
    let tokens_range = format!("a whole number from 1 to {MAX_TOKENS}");
    let tokens: usize = parse("tokens", &args.tokens, &tokens_range)?;
    if tokens == 0 {
        return Err(format!("--tokens: 0 generates nothing; give {tokens_range}"));
    }
    if tokens > MAX_TOKENS {
        return Err(format!(
            "--tokens: {tokens} is more than {MAX_TOKENS}, the most one call generates"
        ));
    }
    let seed = parse("seed", &args.seed, "a whole number from 0 to 2^64 - 1")?;
    let temperature_range = "a finite number >= 0 (0: greedy)";
    let temperature: f64 = parse("temperature", &args.temperature, temperature_range)?;
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(format!("--temperature: {temperature} is not {temperature_range}"));
    }
    let top_k = parse("top-k", &args.top_k, "a whole number >= 0 (0: off)")?;
    let top_p_range = "a number in (0, 1] (1: off)";
    let top_p: f64 = parse("top-p", &args.top_p, top_p_range)?;
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(format!("--top-p: {top_p} is not {top_p_range}"));
    }
    let device = args.device.parse().map_err(|e| format!("--device: {e}"))?;
    Ok(GenerateOptions {
        device,
        prompt: args.prompt.clone(),
        tokens,
        seed,
        sampling: Sampling {
            temperature,
            top_k,
            top_p,
        },
        ignore_eos: args.ignore_eos,
    })
}

pub fn run(args: GenerateArgs) -> Result<(), String> {
    let options = options(&args)?;
    let text = weft_train::generate::generate(&args.checkpoint, &options).map_err(|e| e.to_string())?;
    weft_core::outln!("{text}");
    Ok(())
}
