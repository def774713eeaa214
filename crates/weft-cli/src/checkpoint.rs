//! `weft checkpoint inspect` and `weft checkpoint consolidate`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    /// The safetensors file to write (PyTorch's names; `safetensors.torch.load_file` reads it).
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The checkpoint folder `path` names: itself, or the newest complete one inside it.
fn resolve(path: &Path) -> Result<PathBuf, String> {
    if path.join("state.json").exists() {
        return Ok(path.to_path_buf());
    }
    if !path.exists() {
        return Err(format!("{}: no such checkpoint folder", path.display()));
    }
    checkpoint::latest(path).map_err(err)?.ok_or_else(|| {
        format!(
            "{}: holds no complete checkpoint (no step-*/state.json)",
            path.display()
        )
    })
}

/// Lists a checkpoint: its step, the layout that wrote it, every tensor with dtype and shape,
/// after checking every checksum.
pub fn inspect(args: &InspectArgs) -> Result<(), String> {
    use std::fmt::Write as _;
    let dir = resolve(&args.dir)?;
    let mut out = String::new();
    let loaded = checkpoint::read(&dir).map_err(err)?;
    let state = &loaded.state;
    let _ = writeln!(out, "checkpoint {}", dir.display());
    let _ = writeln!(out, "step {} (the next step to run)", state.step);
    if let Some(p) = state.extra.get("parallel").filter(|p| !p.is_null()) {
        let _ = writeln!(
            out,
            "written by a run with dp = {}, tp = {}, pp = {}, zero = {} (the files hold whole tensors; \
             any layout loads them)",
            p["dp"], p["tp"], p["pp"], p["zero"]
        );
    }
    if let Some(kind) = state.extra["model"].get("kind").and_then(|k| k.as_str()) {
        let _ = writeln!(out, "model {kind}");
    }
    for (file, tensors) in [
        ("model.safetensors", &loaded.params),
        ("optimizer.safetensors", &loaded.optimizer),
    ] {
        let numel: usize = tensors.values().map(|t| t.numel()).sum();
        let _ = writeln!(
            out,
            "{file}: {} tensors, {numel} values, checksums verified",
            tensors.len()
        );
        let width = tensors.keys().map(|k| k.len()).max().unwrap_or(0);
        for (name, t) in tensors {
            let _ = writeln!(out, "  {name:width$}  {:<7} {:?}", t.dtype().name(), t.shape());
        }
    }
    print_out(&out)
}

/// Writes `text` to stdout; a reader that went away (`| head`) is not an error.
fn print_out(text: &str) -> Result<(), String> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("stdout: {e}")),
        _ => Ok(()),
    }
}

/// Writes the checkpoint's model as one safetensors file, after checking its checksums.
pub fn consolidate(args: &ConsolidateArgs) -> Result<(), String> {
    let dir = resolve(&args.dir)?;
    let state = checkpoint::read_state(&dir).map_err(err)?;
    let params = checkpoint::read_params(&dir, &state).map_err(err)?;
    safetensors::save(
        &args.output,
        params.iter().map(|(n, t)| (n.as_str(), t)),
        &BTreeMap::new(),
    )
    .map_err(err)?;
    let numel: usize = params.values().map(|t| t.numel()).sum();
    print_out(&format!(
        "wrote {} ({} tensors, {numel} values, from step {})\n",
        args.output.display(),
        params.len(),
        state.step
    ))
}
