//! `weft data`: tokenizes text (`encode`, `decode`) and writes token datasets (`prepare`); see
//! docs/data.md.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Instant;

use weft_data::tokens::{PrepareOptions, DEFAULT_BLOCK_BYTES, INDEX_NAME};
use weft_data::{Tokenizer, TokenizerSpec};

/// The tokenizer flag shared by the three commands.
#[derive(clap::Args)]
pub struct TokenizerArg {
    /// `gpt2`, `char` (prepare only: the vocabulary of the inputs), or the path of a Hugging Face
    /// tokenizer.json, of a token dataset's index.json (its tokenizer), or of a weft tokenizer JSON
    /// form (as a checkpoint records it).
    #[arg(long, value_name = "T")]
    tokenizer: String,
}

/// `weft data encode`.
#[derive(clap::Args)]
pub struct EncodeArgs {
    #[command(flatten)]
    tok: TokenizerArg,
}

/// `weft data decode`.
#[derive(clap::Args)]
pub struct DecodeArgs {
    #[command(flatten)]
    tok: TokenizerArg,
}

/// `weft data prepare`. Numbers are read as text and parsed here, so a malformed value is one
/// error line naming the flag.
#[derive(clap::Args)]
pub struct PrepareArgs {
    #[command(flatten)]
    tok: TokenizerArg,
    /// Text files (UTF-8), one document each.
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    input: Vec<PathBuf>,
    /// The folder to write shards and index.json into (must not hold an index.json yet).
    #[arg(long, value_name = "DIR")]
    output: String,
    /// The fraction of each document's tokens that goes to the val split, in [0, 1).
    #[arg(long, value_name = "F", default_value = "0.1", allow_hyphen_values = true)]
    val_fraction: String,
    /// Tokens per shard file.
    #[arg(long, value_name = "N", default_value = "100000000", allow_hyphen_values = true)]
    shard_tokens: String,
    /// Bytes per checksummed block (a positive multiple of 4).
    #[arg(long, value_name = "B", default_value_t = DEFAULT_BLOCK_BYTES.to_string(), allow_hyphen_values = true)]
    block_bytes: String,
}

fn parse<T: FromStr>(flag: &str, raw: &str, must_be: &str) -> Result<T, String> {
    raw.trim()
        .parse()
        .map_err(|_| format!("--{flag}: {raw:?} is not {must_be}"))
}

fn spec(arg: &TokenizerArg) -> Result<TokenizerSpec, String> {
    TokenizerSpec::from_str(&arg.tokenizer).map_err(|e| format!("--tokenizer: {e}"))
}

fn load(arg: &TokenizerArg) -> Result<Tokenizer, String> {
    spec(arg)?.load().map_err(|e| format!("--tokenizer: {e}"))
}

/// An error of encode or decode: about the input read on stdin (an id past the vocabulary, a
/// character outside it), or about the tokenizer (a tokenizer.json the `tokenizers` library fails
/// on: the message names the file).
fn tokenizing_error(e: weft_data::Error) -> String {
    match e {
        weft_data::Error::TokenOutOfRange { .. } | weft_data::Error::UnknownChar { .. } => format!("stdin: {e}"),
        other => format!("--tokenizer: {other}"),
    }
}

/// Standard input, read whole: the user's own stream, not bounded here.
fn stdin_bytes() -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    std::io::stdin()
        .read_to_end(&mut buf)
        .map_err(|e| format!("stdin: {e}"))?;
    Ok(buf)
}

/// Reads text on stdin and prints its ids as one JSON array.
pub fn encode(args: &EncodeArgs) -> Result<(), String> {
    let tok = load(&args.tok)?;
    let bytes = stdin_bytes()?;
    let text = std::str::from_utf8(&bytes).map_err(|e| format!("stdin: not UTF-8 text ({e})"))?;
    let ids = tok.encode(text).map_err(tokenizing_error)?;
    let json = serde_json::to_string(&ids).map_err(|e| e.to_string())?;
    weft_core::outln!("{json}");
    Ok(())
}

/// Reads a JSON array of ids on stdin and prints their text (nothing added).
pub fn decode(args: &DecodeArgs) -> Result<(), String> {
    let tok = load(&args.tok)?;
    let bytes = stdin_bytes()?;
    let ids: Vec<u32> = serde_json::from_slice(&bytes)
        .map_err(|e| format!("stdin: expected a JSON array of token ids (whole numbers from 0 to 2^32 - 1): {e}"))?;
    let text = tok.decode_exact(&ids).map_err(tokenizing_error)?;
    weft_core::out!("{text}");
    Ok(())
}

/// Tokenizes the inputs and writes a token dataset.
pub fn prepare(args: &PrepareArgs) -> Result<(), String> {
    let opts = PrepareOptions {
        val_fraction: parse("val-fraction", &args.val_fraction, "a number in [0, 1)")?,
        shard_tokens: parse("shard-tokens", &args.shard_tokens, "a whole number of tokens >= 1")?,
        block_bytes: parse("block-bytes", &args.block_bytes, "a positive multiple of 4")?,
        threads: weft_core::cpu::threads::num_threads(),
    };
    if !(0.0..1.0).contains(&opts.val_fraction) {
        return Err(format!("--val-fraction: {} is not in [0, 1)", opts.val_fraction));
    }
    if opts.shard_tokens == 0 {
        return Err("--shard-tokens: must be at least 1".into());
    }
    weft_data::tokens::check_block_bytes(opts.block_bytes).map_err(|e| format!("--block-bytes: {e}"))?;
    // a folder, or an object store (`s3://bucket/prefix`, ...): written through the same sink
    // the store's errors name the URL already: said once, after the flag
    let output_error = |e: weft_data::Error| {
        let e = e.to_string();
        let e = e.strip_prefix(&format!("{}: ", args.output)).unwrap_or(&e).to_string();
        format!("--output {}: {e}", args.output)
    };
    let store = weft_data::store::open(&args.output).map_err(output_error)?;
    // only "not found" means there is no dataset here: a HEAD refused (a write-only role) or a
    // store that stayed unavailable must stop prepare before anything is written, not let it
    // replace the dataset that may be there
    match store.exists(INDEX_NAME) {
        Ok(false) => {}
        Ok(true) => {
            return Err(format!(
                "--output {}: already holds an {INDEX_NAME}; choose an empty folder or remove it",
                args.output
            ))
        }
        Err(e) => {
            return Err(format!(
                "--output {}: cannot tell whether it already holds an {INDEX_NAME}, so nothing was written: {e}",
                args.output
            ))
        }
    }
    let mut total = 0u64;
    for p in &args.input {
        let meta = std::fs::metadata(p).map_err(|e| format!("--input {}: {e}", p.display()))?;
        if !meta.is_file() {
            return Err(format!("--input {}: not a file", p.display()));
        }
        total += meta.len();
    }
    let spec = spec(&args.tok)?;
    let tok = if spec == TokenizerSpec::Char {
        // the vocabulary is the characters of every input
        let mut texts = Vec::with_capacity(args.input.len());
        for p in &args.input {
            let bytes = std::fs::read(p).map_err(|e| format!("--input {}: {e}", p.display()))?;
            texts.push(String::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8 text ({e})", p.display()))?);
        }
        spec.load_with_corpus(texts.iter().map(String::as_str))
    } else {
        spec.load()
    }
    .map_err(|e| format!("--tokenizer: {e}"))?;

    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let start = Instant::now();
    let sink: &dyn weft_data::ObjectSink = &*store;
    let result = weft_data::tokens::prepare(&tok, &args.input, sink, &opts, &mut |bytes| {
        if let Some(bar) = &bar {
            bar.inc(bytes);
        }
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let index = result.map_err(|e| e.to_string())?;
    let secs = start.elapsed().as_secs_f64();
    let split = |name: &str| {
        let s = &index.splits[name];
        format!("{name} {} tokens in {} shards", s.tokens, s.shards.len())
    };
    weft_core::outln!(
        "wrote {} ({}, {}; tokenizer {}, vocab {}, {}) from {} files, {:.1} MB in {:.2} s ({:.1} MB/s, {} thread{})",
        sink.describe(INDEX_NAME),
        split("train"),
        split("val"),
        tok.kind(),
        index.vocab_size,
        if index.dtype.width() == 2 { "u16" } else { "u32" },
        args.input.len(),
        total as f64 / 1e6,
        secs,
        total as f64 / 1e6 / secs.max(1e-9),
        opts.threads,
        if opts.threads == 1 { "" } else { "s" }
    );
    Ok(())
}
