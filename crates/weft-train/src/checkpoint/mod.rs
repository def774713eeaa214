//! Sharded checkpoints. `DIR/step-NNNNNNNN/` holds:
//! - `model-rank-RRRRR.safetensors` and `optimizer-rank-RRRRR.safetensors`: the pieces of
//!   tensors rank `R` owns, under the whole tensor's name: its ZeRO shard (a flat run of a
//!   parameter's elements), its tensor-parallel slice, its pipeline stage's parameters
//!   (continued in `...-rank-RRRRR-N.safetensors` past the tensors one file may hold).
//!   Data-parallel replicas are written once (by data-parallel rank 0), so a rank that owns
//!   nothing writes no file;
//! - `index.json` ([`Index`]): every whole tensor (the model's by PyTorch name, the
//!   optimizer's by `"{param}.{field}"`) with its shape, dtype and pieces (file, tensor-parallel
//!   part, element range, checksum), the next step, the dropout stream positions (rank 0's, and
//!   every rank's) and free-form extra JSON (run config, tokenizer, layout);
//! - `COMPLETE`: the marker, written last. Only folders with it count.
//!
//! Writing ([`writer`]) never communicates through collectives: each rank copies its pieces and
//! a background thread writes them into a temporary folder and reports to rank 0 through the
//! job's store; rank 0 writes the index, renames the folder into place and writes the marker.
//! Reading ([`read`]) puts whole tensors back together from whatever layout wrote them; the
//! trainer cuts them again for its own. Batches are pure functions of (seed, step), so the step
//! is the data position.

mod apart;
mod claim;
mod index;
mod verify;
mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use weft_core::Tensor;

use crate::error::{Error, Result};
pub use apart::check_output_apart;
pub use claim::{claim, Claim, ClaimMode, LOCK};
pub use index::{checksum, merge, write_pieces, Files, Index, Piece, PieceRecord, Shard, TensorRecord, TpPart};
pub use verify::{check_recorded, verify_model};
pub use writer::{new_nonce, BackgroundWriter, Coordination, Pending};

/// The file that marks a checkpoint folder complete.
pub const MARKER: &str = "COMPLETE";
/// The index's file name.
pub const INDEX: &str = "index.json";

/// What besides tensors a checkpoint records.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CheckpointState {
    /// The step to run next.
    pub step: usize,
    /// Position of the model's dropout random stream: rank 0's (every rank's but a pipeline's
    /// later stages, which advance their streams by their own layers only).
    pub rng_offset: u64,
    /// Each rank's position, by rank of the job that wrote it (empty for one process, and in
    /// checkpoints written before the ranks recorded their own). A run resumed at the same
    /// layout takes its rank's; any other takes [`CheckpointState::rng_offset`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rng_offsets: Vec<u64>,
    /// Anything else worth keeping with the weights (run config, tokenizer, layout).
    #[serde(default)]
    pub extra: serde_json::Value,
    /// The run that wrote it: a resumed run keeps its id, a fresh run gets a new one. Pruning
    /// removes only the checkpoints of the run being pruned. Absent in checkpoints written
    /// before runs had ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

fn io(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io(format!("{}: {e}", path.display()))
}

/// The folder name of the checkpoint taken before step `step`.
fn folder_name(step: usize) -> String {
    format!("step-{step:08}")
}

/// The folder of checkpoint directory `dir` that holds the checkpoint taken after `steps`
/// steps.
pub fn folder(dir: &Path, steps: usize) -> PathBuf {
    dir.join(folder_name(steps))
}

/// Whether `path` is a complete checkpoint folder.
pub fn is_complete(path: &Path) -> bool {
    path.join(MARKER).is_file() && path.join(INDEX).is_file()
}

/// What a `step-NNNNNNNN` folder of a checkpoint directory holds, as far as its names tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FolderState {
    /// The marker and the index are there: a checkpoint, unless its files are damaged.
    Complete,
    /// No `COMPLETE` marker: the save did not finish (or the marker was lost).
    NoMarker,
    /// A marker but no `index.json`.
    NoIndex,
}

impl FolderState {
    fn of(path: &Path) -> FolderState {
        match (path.join(MARKER).is_file(), path.join(INDEX).is_file()) {
            (true, true) => FolderState::Complete,
            (false, _) => FolderState::NoMarker,
            (true, false) => FolderState::NoIndex,
        }
    }
}

/// Every `step-NNNNNNNN` folder in `dir` with its step and state, oldest first (none when
/// `dir` does not exist).
pub fn scan(dir: &Path) -> Result<Vec<(usize, PathBuf, FolderState)>> {
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let entry = entry.map_err(|e| io(dir, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(step) = name.strip_prefix("step-").and_then(|s| s.parse::<usize>().ok()) {
            if entry.path().is_dir() {
                out.push((step, entry.path(), FolderState::of(&entry.path())));
            }
        }
    }
    out.sort_by_key(|(step, _, _)| *step);
    Ok(out)
}

/// Complete checkpoints in `dir`, oldest first.
pub fn list(dir: &Path) -> Result<Vec<(usize, PathBuf)>> {
    Ok(scan(dir)?
        .into_iter()
        .filter(|(_, _, s)| *s == FolderState::Complete)
        .map(|(step, path, _)| (step, path))
        .collect())
}

/// The newest complete checkpoint in `dir`.
pub fn latest(dir: &Path) -> Result<Option<PathBuf>> {
    Ok(list(dir)?.pop().map(|(_, p)| p))
}

/// The checkpoint folder `path` names: itself when it is one, else the newest complete one
/// inside it. Errors name the path.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    if is_complete(path) {
        return Ok(path.to_path_buf());
    }
    if !path.exists() {
        return Err(io(path, "no such checkpoint folder or directory"));
    }
    latest(path)?.ok_or_else(|| io(path, format!("holds no complete checkpoint (no step-*/{MARKER})")))
}

/// The longest `index.json` read, in bytes: about 300 bytes a piece, so a billion-parameter
/// model's index at any layout is a few megabytes, and the largest layouts planned (a trillion
/// parameters on 4096 devices under ZeRO-3) stay under a gigabyte; a larger file is refused
/// before it is read.
pub const MAX_INDEX_BYTES: u64 = 1 << 30;

/// Reads and checks a checkpoint's `index.json`.
pub fn read_index(ckpt: &Path) -> Result<Index> {
    let path = ckpt.join(INDEX);
    let bytes = match weft_core::io::regular::read_capped(&path, MAX_INDEX_BYTES) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Err(io(&path, "no such file")),
        Err(e) => return Err(Error::Io(e)),
    };
    let index: Index = serde_json::from_slice(&bytes).map_err(|e| io(&path, e))?;
    if index.format != index::FORMAT {
        return Err(io(
            &path,
            format!(
                "format {:?} is not {:?}, the one this build reads",
                index.format,
                index::FORMAT
            ),
        ));
    }
    index::check(&index).map_err(|e| io(&path, e))?;
    if index.state.step as u64 > MAX_STEP {
        return Err(io(
            &path,
            format!(
                "state.step = {} is past {MAX_STEP}, the most steps a run config can give (train.steps); \
                 the file is damaged or was not written by a run",
                index.state.step
            ),
        ));
    }
    Ok(index)
}

/// The largest step a checkpoint may record: `train.steps` is a TOML integer (at most
/// `i64::MAX`), so no run reaches a later step, and the run store records steps as `i64`.
pub const MAX_STEP: u64 = i64::MAX as u64;

/// Whole tensors by name.
pub type Tensors = BTreeMap<String, Tensor>;

/// What a checkpoint folder holds, whole: its state, the model's parameters and the optimizer
/// state, by name.
pub struct Loaded {
    pub state: CheckpointState,
    pub params: Tensors,
    pub optimizer: Tensors,
}

/// Reads checkpoint folder `ckpt`, putting every tensor together and checking every piece
/// against its checksum.
pub fn read(ckpt: &Path) -> Result<Loaded> {
    let index = read_index(ckpt)?;
    let (params, optimizer) = read_tensors(ckpt, &index)?;
    Ok(Loaded {
        state: index.state,
        params,
        optimizer,
    })
}

/// The whole model parameters and optimizer state of checkpoint `ckpt`, whose index is
/// `index`, each piece checked against its checksum.
#[allow(clippy::type_complexity)]
pub fn read_tensors(ckpt: &Path, index: &Index) -> Result<(Tensors, Tensors)> {
    let mut files = index::Files::new(ckpt);
    Ok((files.assemble(&index.model)?, files.assemble(&index.optimizer)?))
}

/// The model's whole parameters of checkpoint `ckpt` (no optimizer state), with its index.
pub fn read_params(ckpt: &Path) -> Result<(Index, Tensors)> {
    let index = read_index(ckpt)?;
    let params = index::Files::new(ckpt).assemble(&index.model)?;
    Ok((index, params))
}
