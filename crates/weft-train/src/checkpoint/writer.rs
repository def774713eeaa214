//! Writing a checkpoint from every rank at once, in the background.
//!
//! Each rank writes its own files into `DIR/.tmp-step-NNNNNNNN-<nonce>/` (fsynced) and reports
//! their index records and its dropout stream position to rank 0 through the job's store
//! (`weft/checkpoint/<nonce>/<step>/rank-R`; a failed rank reports its error). Rank 0 waits for
//! every report, checks that the pieces cover every tensor exactly once, writes `index.json`,
//! fsyncs the folder, renames it to `DIR/step-NNNNNNNN/`, writes the `COMPLETE` marker and
//! keeps the run's newest K checkpoints. A rank killed at any point leaves at most a temporary folder (which the next
//! completed checkpoint removes) or an unmarked one (which readers skip and nothing removes). A
//! save that fails removes its temporary files. The nonce, the same on every rank and new for
//! every run of the job, keeps attempts from mixing their files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use weft_dist::ProcessGroup;

use super::index::{self, Index, Shard, TensorRecord};
use super::{folder_name, io, list, CheckpointState, INDEX, MARKER};
use crate::error::{Error, Result};

/// How long rank 0 waits for the other ranks' files of one checkpoint.
const REPORT_TIMEOUT: Duration = Duration::from_secs(1800);

/// How the ranks of a job agree on a checkpoint.
#[derive(Clone, Debug)]
pub struct Coordination {
    /// Every rank of the job; its store carries the reports.
    pub group: ProcessGroup,
    /// The same on every rank, new for every run of the job.
    pub nonce: u64,
}

/// A checkpoint to write: this rank's share, owned, so that a background thread can write it
/// while training goes on.
pub struct Pending {
    pub dir: PathBuf,
    pub shard: Shard,
    /// With this rank's dropout stream position (`rng_offset`; rank 0 collects every rank's
    /// into `rng_offsets`).
    pub state: CheckpointState,
    /// `(alternative, canonical)` names of tied parameters.
    pub aliases: Vec<(String, String)>,
    /// Complete checkpoints kept (rank 0 removes older ones).
    pub keep: usize,
    /// `None` for a single process.
    pub coordination: Option<Coordination>,
}

/// What a rank tells rank 0 about its files.
#[derive(Serialize, Deserialize)]
struct Report {
    model: BTreeMap<String, TensorRecord>,
    optimizer: BTreeMap<String, TensorRecord>,
    error: Option<String>,
    /// The rank's dropout stream position.
    #[serde(default)]
    rng_offset: Option<u64>,
}

/// A nonce for one run of a job: the clock and the process id, 52 bits (it travels as an f64).
pub fn new_nonce() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ ((std::process::id() as u64) << 32)) & ((1 << 52) - 1)
}

/// Writes this rank's files; rank 0 also completes the checkpoint (waiting for every other
/// rank's report). Returns the complete folder on rank 0. A failed save leaves no temporary
/// files: a rank removes its own when it cannot finish them, and rank 0 removes the temporary
/// folder once every rank has reported (or the wait has timed out).
pub fn write(p: Pending) -> Result<Option<PathBuf>> {
    let (rank, ranks, nonce) = match &p.coordination {
        Some(c) => (c.group.rank(), c.group.size(), c.nonce),
        None => (0, 1, new_nonce()),
    };
    let step = p.state.step;
    let tmp = p.dir.join(format!(".tmp-{}-{nonce:013x}", folder_name(step)));
    let key = |r: usize| format!("weft/checkpoint/{nonce:013x}/{step}/rank-{r}");
    let store = match &p.coordination {
        Some(c) if ranks > 1 => Some(c.group.store().ok_or_else(|| {
            Error::Io("checkpoints of several ranks need the job's store (start the job with weft launch)".into())
        })?),
        _ => None,
    };
    let written = write_shard(&tmp, rank, &p.shard);
    if rank != 0 {
        let (report, result) = match written {
            Ok((model, optimizer)) => (
                Report {
                    model,
                    optimizer,
                    error: None,
                    rng_offset: Some(p.state.rng_offset),
                },
                Ok(None),
            ),
            Err(e) => (
                Report {
                    model: BTreeMap::new(),
                    optimizer: BTreeMap::new(),
                    error: Some(e.to_string()),
                    rng_offset: None,
                },
                Err(e),
            ),
        };
        let bytes = serde_json::to_vec(&report).map_err(|e| Error::Io(format!("checkpoint report: {e}")))?;
        if let Some(store) = store {
            store.set(&key(rank), &bytes)?;
        }
        return result;
    }
    let gathered = written.and_then(|(model, optimizer)| {
        let mut index = Index {
            format: index::FORMAT.to_string(),
            state: p.state.clone(),
            ranks,
            aliases: p.aliases.clone(),
            model,
            optimizer,
        };
        if let Some(store) = store {
            gather_reports(store, &mut index, ranks, step, &key)?;
        }
        Ok(index)
    });
    let result = gathered.and_then(|index| complete(&p.dir, &tmp, &index, p.keep, nonce));
    if result.is_err() && tmp.exists() {
        // every rank has reported (or timed out): nothing more is written into it
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result.map(Some)
}

/// Rank 0: waits for every other rank's report of checkpoint `step` and adds its records and
/// its dropout stream position (`index.state.rng_offsets`, rank 0's first) to `index`. Waits
/// for all of them even after a failure, so that no rank is still writing into the temporary
/// folder when rank 0 removes it; returns the first failure.
fn gather_reports(
    store: &weft_dist::store::StoreClient,
    index: &mut Index,
    ranks: usize,
    step: usize,
    key: &dyn Fn(usize) -> String,
) -> Result<()> {
    let deadline = Instant::now() + REPORT_TIMEOUT;
    let mut first_error = None;
    let mut offsets = vec![index.state.rng_offset];
    for r in 1..ranks {
        let report = match wait_report(store, &key(r), r, step, deadline) {
            Ok(report) => report,
            Err(e) => {
                first_error.get_or_insert(e);
                continue;
            }
        };
        // the store keeps every key for the whole job: drop the report's bulk
        store.set(&key(r), b"")?;
        offsets.extend(report.rng_offset);
        let merged = match report.error {
            Some(e) => Err(Error::Io(format!(
                "checkpoint of step {step}: rank {r} could not write its files: {e}"
            ))),
            None => index::merge(&mut index.model, report.model)
                .and_then(|_| index::merge(&mut index.optimizer, report.optimizer)),
        };
        if let Err(e) = merged {
            first_error.get_or_insert(e);
        }
    }
    if offsets.len() == ranks {
        index.state.rng_offsets = offsets;
    }
    first_error.map_or(Ok(()), Err)
}

/// This rank's files in `tmp`: their records (model, optimizer).
type Records = (BTreeMap<String, TensorRecord>, BTreeMap<String, TensorRecord>);

/// This rank's files of `kind` (`model`, `optimizer`): `KIND-rank-RRRRR.safetensors`, and when
/// the rank has more tensors of that kind than one file may hold (the readers' limit,
/// [`weft_core::io::safetensors::header::MAX_TENSORS`]: Adam's three tensors a parameter pass it at about
/// 87,000 parameters) more files `KIND-rank-RRRRR-N.safetensors`, N from 1.
fn shard_file(kind: &str, rank: usize, part: usize) -> String {
    match part {
        0 => format!("{kind}-rank-{rank:05}.safetensors"),
        n => format!("{kind}-rank-{rank:05}-{n}.safetensors"),
    }
}

fn write_shard(tmp: &Path, rank: usize, shard: &Shard) -> Result<Records> {
    std::fs::create_dir_all(tmp).map_err(|e| io(tmp, e))?;
    let mut out: Records = Default::default();
    let mut written = Vec::new();
    for (kind, pieces, records) in [
        ("model", &shard.model, &mut out.0),
        ("optimizer", &shard.optimizer, &mut out.1),
    ] {
        for (part, chunk) in pieces
            .chunks(weft_core::io::safetensors::header::MAX_TENSORS)
            .enumerate()
        {
            let file = tmp.join(shard_file(kind, rank, part));
            written.push(file.clone());
            match index::write_pieces(&file, chunk) {
                Ok(r) => records.extend(r),
                Err(e) => {
                    // this rank's files only: the others may still be writing theirs
                    for f in &written {
                        let _ = std::fs::remove_file(f);
                    }
                    return Err(e);
                }
            }
        }
    }
    Ok(out)
}

/// Rank `r`'s report under `key`, polling the store (briefly, so that other users of the
/// connection are not held up) until `deadline`.
fn wait_report(
    store: &weft_dist::store::StoreClient,
    key: &str,
    r: usize,
    step: usize,
    deadline: Instant,
) -> Result<Report> {
    loop {
        match store.get(key, Duration::from_millis(50)) {
            Ok(bytes) => {
                return serde_json::from_slice(&bytes).map_err(|e| {
                    Error::Io(format!(
                        "checkpoint of step {step}: rank {r} sent a malformed report: {e}"
                    ))
                })
            }
            Err(weft_dist::Error::Timeout(_)) if Instant::now() < deadline => {}
            Err(weft_dist::Error::Timeout(_)) => {
                return Err(Error::Io(format!(
                    "checkpoint of step {step}: rank {r} did not report its files within {} s",
                    REPORT_TIMEOUT.as_secs()
                )))
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| io(path, e))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| io(path, e))
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Rank 0: checks the pieces, writes the index, moves `tmp` into place, marks it complete and
/// removes what is no longer needed.
fn complete(dir: &Path, tmp: &Path, index: &Index, keep: usize, nonce: u64) -> Result<PathBuf> {
    let step = index.state.step;
    index::check(index).map_err(|e| Error::Io(format!("checkpoint of step {step} is incomplete: {e}")))?;
    let json = serde_json::to_vec_pretty(index).map_err(|e| io(tmp, e))?;
    write_synced(&tmp.join(INDEX), &json)?;
    sync_dir(tmp);
    let fin = dir.join(folder_name(step));
    if fin.exists() {
        make_way(&fin, index.state.run.as_deref(), nonce)?;
    }
    std::fs::rename(tmp, &fin).map_err(|e| io(&fin, e))?;
    sync_dir(dir);
    write_synced(&fin.join(MARKER), b"complete\n")?;
    sync_dir(&fin);
    prune(dir, step, keep, index.state.run.as_deref())?;
    Ok(fin)
}

/// Clears the way for a new checkpoint at `fin`, where a folder of the same step already is: this
/// run's own complete checkpoint of that step is replaced; anything else (a damaged folder,
/// another run's checkpoint) is kept under a new name and named on stderr.
fn make_way(fin: &Path, run: Option<&str>, nonce: u64) -> Result<()> {
    let why = match super::read_index(fin) {
        Ok(old) if super::is_complete(fin) && old.state.run.as_deref() == run && run.is_some() => {
            return std::fs::remove_dir_all(fin).map_err(|e| io(fin, e));
        }
        Ok(_) if super::is_complete(fin) => "it belongs to another run".to_string(),
        Ok(_) => format!("it has no {MARKER} marker"),
        Err(e) => e.to_string(),
    };
    let name = fin.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let aside = fin.with_file_name(format!("{name}.kept-{nonce:013x}"));
    std::fs::rename(fin, &aside).map_err(|e| io(fin, e))?;
    weft_core::errln!(
        "weft: warning: {} was in the way of this run's checkpoint ({why}); kept it as {}",
        fin.display(),
        aside.display()
    );
    Ok(())
}

/// Keeps this run's newest `keep` checkpoints (those that are complete, whose index reads, and
/// that `run` wrote; other runs' checkpoints and folders that do not verify are never removed),
/// and removes temporary folders of steps up to `step`, which no reader uses (left by killed
/// ranks; every rank has finished those steps).
fn prune(dir: &Path, step: usize, keep: usize, run: Option<&str>) -> Result<()> {
    let mut mine: Vec<PathBuf> = list(dir)?
        .into_iter()
        .filter(|(_, p)| run.is_some() && super::read_index(p).is_ok_and(|i| i.state.run.as_deref() == run))
        .map(|(_, p)| p)
        .collect();
    while mine.len() > keep.max(1) {
        let old = mine.remove(0);
        std::fs::remove_dir_all(&old).map_err(|e| io(&old, e))?;
    }
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let path = entry.map_err(|e| io(dir, e))?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let Some(rest) = name.strip_prefix(".tmp-step-") else {
            continue;
        };
        if rest
            .split('-')
            .next()
            .unwrap_or("")
            .parse::<usize>()
            .is_ok_and(|s| s <= step)
        {
            std::fs::remove_dir_all(&path).map_err(|e| io(&path, e))?;
        }
    }
    Ok(())
}

/// Writes checkpoints on a background thread, one at a time: [`BackgroundWriter::submit`]
/// returns at once (after this rank's previous checkpoint is written), and the files appear,
/// complete, when every rank is done. A write's error comes out of the next `submit` or of
/// [`BackgroundWriter::finish`].
#[derive(Default)]
pub struct BackgroundWriter {
    running: Option<std::thread::JoinHandle<Result<Option<PathBuf>>>>,
}

impl BackgroundWriter {
    /// Waits for the checkpoint being written, if any, then starts writing `pending`.
    pub fn submit(&mut self, pending: Pending) -> Result<()> {
        self.finish()?;
        let handle = std::thread::Builder::new()
            .name("weft-checkpoint".into())
            .spawn(move || {
                let _s = weft_dist::trace::span("checkpoint", format!("write step {}", pending.state.step));
                write(pending)
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

#[cfg(test)]
mod tests {
    use super::*;
    use weft_core::io::safetensors::{header::MAX_TENSORS, SafeTensorsFile};
    use weft_core::Tensor;

    /// A rank with more tensors than one file may hold writes them over several files, each
    /// readable, the records naming where each tensor went (the optimizer file of a model of
    /// about 87,000 parameter tensors was written whole and could not be read back).
    #[test]
    fn more_tensors_than_a_file_holds_go_to_several_files() {
        let dir = std::env::temp_dir().join(format!("weft-shard-files-{}", std::process::id()));
        let one = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
        let pieces: Vec<index::Piece> = (0..MAX_TENSORS + 2)
            .map(|i| index::Piece {
                name: format!("p{i:07}"),
                shape: vec![1],
                tp: None,
                offset: 0,
                tensor: one.clone(),
            })
            .collect();
        let shard = Shard {
            model: pieces[..3].to_vec(),
            optimizer: pieces,
        };
        let (model, optimizer) = write_shard(&dir, 7, &shard).unwrap();
        assert_eq!(model.len(), 3);
        assert_eq!(optimizer.len(), MAX_TENSORS + 2);
        let files: std::collections::BTreeSet<&str> = optimizer.values().map(|r| r.pieces[0].file.as_str()).collect();
        assert_eq!(
            files.into_iter().collect::<Vec<_>>(),
            ["optimizer-rank-00007-1.safetensors", "optimizer-rank-00007.safetensors"]
        );
        for f in ["optimizer-rank-00007.safetensors", "optimizer-rank-00007-1.safetensors"] {
            SafeTensorsFile::open(&dir.join(f)).unwrap();
        }
        let last = &optimizer[&format!("p{:07}", MAX_TENSORS + 1)];
        assert_eq!(last.pieces[0].file, "optimizer-rank-00007-1.safetensors");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
