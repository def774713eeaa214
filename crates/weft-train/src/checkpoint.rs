//! Checkpoints: `DIR/step-NNNNNNNN/` holding `model.safetensors` (PyTorch names),
//! `optimizer.safetensors` and `state.json` (the next step, the dropout stream position, and
//! free-form extra JSON such as the run config and tokenizer). A checkpoint is written into a
//! temporary folder, each file fsynced, then renamed into place, so a folder named `step-*` is
//! always complete. Batches are pure functions of (seed, step), so the step is the data position.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use weft_core::io::safetensors;
use weft_core::Tensor;

use crate::error::{Error, Result};

/// What besides tensors a checkpoint records.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CheckpointState {
    /// The step to run next.
    pub step: usize,
    /// Position of the model's dropout random stream.
    pub rng_offset: u64,
    /// Anything else worth keeping with the weights (run config, tokenizer).
    #[serde(default)]
    pub extra: serde_json::Value,
    /// Per file, per tensor: a checksum of its values, checked when the checkpoint is read
    /// (filled in by [`save`]).
    #[serde(default)]
    pub checksums: BTreeMap<String, BTreeMap<String, String>>,
}

/// FNV-1a (64 bits) over the tensor's values as f64 bit patterns, in hex: any changed value
/// changes it.
fn checksum(t: &Tensor) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in t.to_vec_f64() {
        for b in v.to_bits().to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    format!("fnv1a64:{h:016x}")
}

fn checksums<'a>(tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>) -> BTreeMap<String, String> {
    tensors.into_iter().map(|(n, t)| (n.to_string(), checksum(t))).collect()
}

/// Checks the tensors read from `file` of checkpoint `ckpt` against the checksums its state
/// recorded (checkpoints written before checksums existed have none).
fn verify(ckpt: &Path, state: &CheckpointState, file: &str, tensors: &BTreeMap<String, Tensor>) -> Result<()> {
    let Some(want) = state.checksums.get(file) else {
        return Ok(());
    };
    let path = ckpt.join(file);
    for (name, sum) in want {
        let t = tensors.get(name).ok_or_else(|| {
            io(
                &path,
                format!("tensor {name:?} is missing (the file is damaged or was replaced)"),
            )
        })?;
        if &checksum(t) != sum {
            return Err(io(
                &path,
                format!("tensor {name:?} does not match its checksum (the file is damaged)"),
            ));
        }
    }
    if let Some(extra) = tensors.keys().find(|n| !want.contains_key(*n)) {
        return Err(io(
            &path,
            format!("tensor {extra:?} has no checksum (the file was replaced)"),
        ));
    }
    Ok(())
}

fn io(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io(format!("{}: {e}", path.display()))
}

/// Saves into `dir/step-{state.step}` atomically and keeps the newest `keep` checkpoints.
/// `params` are the model's whole parameters by PyTorch name; each `(alternative, canonical)`
/// alias adds another name for a tensor (tied weights).
pub fn save(
    dir: &Path,
    params: &[(String, Tensor)],
    aliases: &[(&str, &str)],
    optimizer_state: &[(String, Tensor)],
    state: &CheckpointState,
    keep: usize,
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let name = format!("step-{:08}", state.step);
    let tmp = dir.join(format!(".tmp-{name}"));
    let fin = dir.join(&name);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
    let mut named: Vec<(&str, &Tensor)> = params.iter().map(|(n, t)| (n.as_str(), t)).collect();
    for (alt, canonical) in aliases {
        if let Some((_, t)) = params.iter().find(|(n, _)| n == canonical) {
            named.push((alt, t));
        }
    }
    let mut state = state.clone();
    state
        .checksums
        .insert("model.safetensors".into(), checksums(named.iter().copied()));
    state.checksums.insert(
        "optimizer.safetensors".into(),
        checksums(optimizer_state.iter().map(|(n, t)| (n.as_str(), t))),
    );
    safetensors::save(&tmp.join("model.safetensors"), named, &BTreeMap::new())?;
    safetensors::save(
        &tmp.join("optimizer.safetensors"),
        optimizer_state.iter().map(|(n, t)| (n.as_str(), t)),
        &BTreeMap::new(),
    )?;
    let json = serde_json::to_vec_pretty(&state).map_err(|e| io(&tmp, e))?;
    let state_path = tmp.join("state.json");
    write_synced(&state_path, &json)?;
    if fin.exists() {
        std::fs::remove_dir_all(&fin).map_err(|e| io(&fin, e))?;
    }
    std::fs::rename(&tmp, &fin).map_err(|e| io(&fin, e))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    let mut all = list(dir)?;
    while all.len() > keep.max(1) {
        let (_, old) = all.remove(0);
        std::fs::remove_dir_all(&old).map_err(|e| io(&old, e))?;
    }
    Ok(fin)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| io(path, e))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| io(path, e))
}

/// Complete checkpoints in `dir`, oldest first.
pub fn list(dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let entry = entry.map_err(|e| io(dir, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(step) = name.strip_prefix("step-").and_then(|s| s.parse::<usize>().ok()) {
            if entry.path().join("state.json").exists() {
                out.push((step, entry.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The newest complete checkpoint in `dir`.
pub fn latest(dir: &Path) -> Result<Option<PathBuf>> {
    Ok(list(dir)?.pop().map(|(_, p)| p))
}

/// Reads a checkpoint's `state.json`.
pub fn read_state(ckpt: &Path) -> Result<CheckpointState> {
    let path = ckpt.join("state.json");
    let bytes = std::fs::read(&path).map_err(|e| io(&path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| io(&path, e))
}

/// What a checkpoint folder holds: its state, the model's whole parameters and the optimizer
/// state, by name.
pub struct Loaded {
    pub state: CheckpointState,
    pub params: BTreeMap<String, Tensor>,
    pub optimizer: BTreeMap<String, Tensor>,
}

/// Reads checkpoint folder `ckpt`, checking every tensor against its checksum.
pub fn read(ckpt: &Path) -> Result<Loaded> {
    let state = read_state(ckpt)?;
    let params = read_params(ckpt, &state)?;
    let optimizer = safetensors::load(&ckpt.join("optimizer.safetensors"))?.tensors;
    verify(ckpt, &state, "optimizer.safetensors", &optimizer)?;
    Ok(Loaded {
        state,
        params,
        optimizer,
    })
}

/// The model's tensors of checkpoint `ckpt` (whose state is `state`), checked against their
/// checksums.
pub fn read_params(ckpt: &Path, state: &CheckpointState) -> Result<BTreeMap<String, Tensor>> {
    let params = safetensors::load(&ckpt.join("model.safetensors"))?.tensors;
    verify(ckpt, state, "model.safetensors", &params)?;
    Ok(params)
}

/// A checkpoint to write: everything [`save`] takes, owned, so that a background thread can
/// write it while training goes on.
pub struct Pending {
    pub dir: PathBuf,
    /// Copies of the whole parameters (nothing else may change them).
    pub params: Vec<(String, Tensor)>,
    pub aliases: &'static [(&'static str, &'static str)],
    pub optimizer_state: Vec<(String, Tensor)>,
    pub state: CheckpointState,
    pub keep: usize,
}

/// Writes checkpoints on a background thread, one at a time: [`BackgroundWriter::submit`]
/// returns at once (after the previous checkpoint is complete), and the files appear, complete,
/// when the thread is done. A write's error comes out of the next `submit` or of
/// [`BackgroundWriter::finish`].
#[derive(Default)]
pub struct BackgroundWriter {
    running: Option<std::thread::JoinHandle<Result<PathBuf>>>,
}

impl BackgroundWriter {
    /// Waits for the checkpoint being written, if any, then starts writing `pending`.
    pub fn submit(&mut self, pending: Pending) -> Result<()> {
        self.finish()?;
        let handle = std::thread::Builder::new()
            .name("weft-checkpoint".into())
            .spawn(move || {
                let _s = weft_dist::trace::span("checkpoint", format!("write step {}", pending.state.step));
                save(
                    &pending.dir,
                    &pending.params,
                    pending.aliases,
                    &pending.optimizer_state,
                    &pending.state,
                    pending.keep,
                )
            })
            .map_err(|e| Error::Io(format!("cannot start the checkpoint writer: {e}")))?;
        self.running = Some(handle);
        Ok(())
    }

    /// Waits for the checkpoint being written, if any; its error, if it failed.
    pub fn finish(&mut self) -> Result<()> {
        match self.running.take() {
            None => Ok(()),
            Some(h) => h
                .join()
                .map_err(|_| Error::Io("the checkpoint writer panicked".into()))?
                .map(|_| ()),
        }
    }
}

impl Drop for BackgroundWriter {
    /// A run that stops on an error still completes the checkpoint being written.
    fn drop(&mut self) {
        let _ = self.finish();
    }
}
