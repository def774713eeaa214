//! `weft checkpoint inspect` and `weft checkpoint consolidate`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use weft_core::io::safetensors;
use weft_train::checkpoint;

#[derive(Args)]
pub struct InspectArgs {
    /// A checkpoint folder, or a checkpoint directory (its newest checkpoint is used).
    pub dir: PathBuf,
}

#[derive(Args)]
pub struct ConsolidateArgs {
    /// A checkpoint folder, or a checkpoint directory (its newest checkpoint is used).
    pub dir: PathBuf,
    /// What to write: with `--format safetensors`, one safetensors file (PyTorch's names;
    /// `safetensors.torch.load_file` reads it, and `weft generate` too: its metadata holds the
    /// model config and tokenizer); with `--format hf`, a Hugging Face checkpoint folder
    /// (`config.json`, `model.safetensors`) that `transformers`' `from_pretrained` loads.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// `safetensors` (one file) or `hf` (a Hugging Face folder; gpt and llama models).
    #[arg(long, default_value = "safetensors", value_parser = ["safetensors", "hf"])]
    pub format: String,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// How a tensor's pieces are cut: `"whole"`, `"tp 2"`, `"4 runs"`, `"tp 2 x 2 runs"`.
fn cut(rec: &checkpoint::TensorRecord) -> String {
    let ranks = rec.pieces.first().and_then(|p| p.tp.as_ref()).map_or(1, |t| t.ranks);
    let runs = rec.pieces.len() / ranks.max(1);
    match (ranks, runs) {
        (1, 1) => "whole".into(),
        (1, n) => format!("{n} runs"),
        (t, 1) => format!("tp {t}"),
        (t, n) => format!("tp {t} x {n} runs"),
    }
}

/// Lists a checkpoint: its step, the layout that wrote it, its files, every tensor with dtype,
/// shape and how it is cut, after putting every tensor together and checking every checksum.
pub fn inspect(args: &InspectArgs) -> Result<(), String> {
    use std::fmt::Write as _;
    let dir = checkpoint::resolve(&args.dir).map_err(err)?;
    let index = checkpoint::read_index(&dir).map_err(err)?;
    // reading puts every tensor together and checks every piece
    checkpoint::read_tensors(&dir, &index).map_err(err)?;
    let state = &index.state;
    let mut out = String::new();
    let _ = writeln!(out, "checkpoint {}", dir.display());
    let _ = writeln!(out, "step {} (the next step to run)", state.step);
    if let Some(p) = state.extra.get("parallel").filter(|p| !p.is_null()) {
        let _ = writeln!(
            out,
            "written by {} ranks of a run with dp = {}, tp = {}, pp = {}, zero = {} (any layout loads it)",
            index.ranks, p["dp"], p["tp"], p["pp"], p["zero"]
        );
    }
    if let Some(kind) = state.extra["model"].get("kind").and_then(|k| k.as_str()) {
        let _ = writeln!(out, "model {kind}");
    }
    let mut files: BTreeMap<&str, usize> = BTreeMap::new();
    for rec in index.model.values().chain(index.optimizer.values()) {
        for p in &rec.pieces {
            *files.entry(&p.file).or_default() += 1;
        }
    }
    let _ = writeln!(out, "files: {}", files.len());
    for (file, pieces) in &files {
        let _ = writeln!(out, "  {file}: {pieces} pieces");
    }
    for (what, tensors) in [("model", &index.model), ("optimizer", &index.optimizer)] {
        let numel: usize = tensors.values().map(|t| t.shape.iter().product::<usize>()).sum();
        let _ = writeln!(
            out,
            "{what}: {} tensors, {numel} values, checksums verified",
            tensors.len()
        );
        let width = tensors.keys().map(|k| k.len()).max().unwrap_or(0);
        for (name, rec) in tensors {
            let shape = format!("{:?}", rec.shape);
            let _ = writeln!(out, "  {name:width$}  {:<7} {shape:<14} {}", rec.dtype, cut(rec));
        }
    }
    for (alt, canonical) in &index.aliases {
        let _ = writeln!(out, "{alt} is {canonical} (tied)");
    }
    crate::print_out(&out)
}

/// Writes the checkpoint's whole model as one safetensors file (tied tensors under both
/// names, as PyTorch's `state_dict` has them), after checking its checksums. The header's
/// metadata carries what `weft generate` needs to read the file alone: the model config and the
/// tokenizer (`weft_train::generate::consolidated_metadata`).
pub fn consolidate(args: &ConsolidateArgs) -> Result<(), String> {
    let dir = checkpoint::resolve(&args.dir).map_err(err)?;
    // never over the checkpoint it reads (its index.json, a shard, a file inside the folder)
    checkpoint::check_output_apart(&dir, &args.output, "--output").map_err(err)?;
    let (index, mut params) = checkpoint::read_params(&dir).map_err(err)?;
    if params.is_empty() {
        return Err(format!(
            "{}: the checkpoint holds no model tensors (its index.json lists none); nothing to consolidate",
            dir.display()
        ));
    }
    // the model config (against the tensors' shapes) and tokenizer the file's metadata copies
    checkpoint::check_recorded(&dir, &index, true).map_err(err)?;
    if args.format == "hf" {
        return consolidate_hf(args, &index, &params);
    }
    for (alt, canonical) in &index.aliases {
        if let Some(t) = params.get(canonical).cloned() {
            params.entry(alt.clone()).or_insert(t);
        }
    }
    safetensors::save(
        &args.output,
        params.iter().map(|(n, t)| (n.as_str(), t)),
        &weft_train::generate::consolidated_metadata(&index.state),
    )
    .map_err(err)?;
    let numel: usize = params.values().map(|t| t.numel()).sum();
    crate::print_out(&format!(
        "wrote {} ({} tensors, {numel} values, from step {})\n",
        args.output.display(),
        params.len(),
        index.state.step
    ))
}

/// `consolidate --format hf`: the checkpoint's model as a Hugging Face folder.
fn consolidate_hf(
    args: &ConsolidateArgs,
    index: &checkpoint::Index,
    params: &BTreeMap<String, weft_core::Tensor>,
) -> Result<(), String> {
    let source = args.dir.display();
    let model = index.state.extra["model"]
        .as_object()
        .ok_or_else(|| format!("{source}: the checkpoint records no model config"))?;
    let aliases: Vec<(&str, &str)> = index.aliases.iter().map(|(a, c)| (a.as_str(), c.as_str())).collect();
    // the tokenizer the checkpoint records (checked above), as a tokenizer.json; written before
    // the weights and config.json, and only into a folder the weights may go to
    let tokenizer = match index.state.extra["tokenizer"].as_str() {
        Some(text) => Some(weft_data::Tokenizer::from_json(text).map_err(|e| format!("{source}: {e}"))?),
        None => None,
    };
    // a model the folder cannot express is refused before anything is written
    weft_models::hf::from_weft_keys(model).map_err(err)?;
    let mut note = None;
    if let Some(t) = &tokenizer {
        weft_models::hf::check_output_folder(&args.output).map_err(err)?;
        note = weft_models::hf::write_tokenizer(&args.output, &t.to_hf_tokenizer_json()).map_err(err)?;
    }
    weft_models::hf::write_folder(&args.output, model, params, &aliases).map_err(err)?;
    if let Some(note) = note {
        weft_core::errln!("weft: {note}");
    }
    crate::print_out(&format!(
        "wrote {} (config.json, model.safetensors: {} tensors, from step {}{})\n",
        args.output.display(),
        params.len() - aliases.iter().filter(|(a, _)| params.contains_key(*a)).count(),
        index.state.step,
        match &tokenizer {
            Some(t) => format!("; tokenizer.json: {}", t.kind()),
            None => String::new(),
        }
    ))
}
