//! Experiment tracking: every training run recorded in one SQLite file (`runs.db` in the
//! store's folder, `weft-runs/` by default), with its params, tags, metrics, artifacts and
//! status.
//!
//! - [`Store`] opens (or creates) the file in WAL mode with a busy timeout, so many processes
//!   (parallel runs, sweeps) write to it at once; a run still `running` whose heartbeat is older
//!   than [`OpenOptions::stale_after`] is marked `killed` when the store is opened.
//! - [`RunWriter`] records one run: metrics go through a channel to a background thread that
//!   writes them in batches, so the training loop never waits for SQLite; a run resumed from a
//!   checkpoint continues its run ([`RunWriter::resume`]).
//! - [`filter`] parses the expressions of `weft runs list --filter`.
//! - [`tensorboard`] writes TensorBoard event files of a run's scalars.
//! - `ui` (feature `ui`) serves the dashboard of `weft ui` and its JSON API.

mod error;
pub mod filter;
mod metrics;
mod read;
mod resume;
mod spill;
mod store;
pub mod sweep_tags;
pub mod system;
pub mod tensorboard;
#[cfg(feature = "ui")]
pub mod ui;
mod writer;

pub use error::{Error, Result};
pub use read::{MetricSummary, RunDetail, RunSummary};
pub use resume::{NotContinued, Resumed, RunRef, RESUMED_TAG};
pub use store::{OpenOptions, Store, STORE_FILE};
pub use writer::{nan_tag, NewRun, RunInput, RunWriter, WriterOptions};

/// How a run ended, or that it has not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Still training (its heartbeat is fresh).
    Running,
    /// Training returned normally.
    Finished,
    /// Training returned an error (recorded with the run).
    Failed,
    /// Stopped by a signal, or its heartbeat stopped (the process died).
    Killed,
    /// Stopped early by a sweep's pruner (a trial whose metric fell behind; `weft sweep`).
    Pruned,
}

impl Status {
    /// The word stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Finished => "finished",
            Status::Failed => "failed",
            Status::Killed => "killed",
            Status::Pruned => "pruned",
        }
    }
}

/// A run's own folder in the store's folder `dir`: `dir/<experiment>/<name>` (a `/` or `\` in
/// either becomes `_`). TensorBoard event files go here, so `tensorboard --logdir <dir>` names
/// each run `<experiment>/<name>`.
pub fn run_folder(dir: &std::path::Path, experiment: &str, name: &str) -> std::path::PathBuf {
    // one path component whatever the name: no separators, and never `.` or `..`
    let clean = |s: &str| {
        let s = s.replace(['/', '\\'], "_");
        if s.is_empty() || s == "." || s == ".." {
            format!("_{s}")
        } else {
            s
        }
    };
    dir.join(clean(experiment)).join(clean(name))
}

/// Seconds since the Unix epoch, as stored in the time columns.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
