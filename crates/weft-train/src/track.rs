//! Recording a run in the run store (`[track]`, docs/tracking.md): the run's params, tags,
//! layout and host when it starts, every logged step's and evaluation's metrics, checkpoint
//! folders and the trace as artifacts, and how it ended. Rank 0 records; a store that cannot be
//! opened turns tracking off with a warning, and the run trains. With `track.tensorboard` the
//! same metrics also go to a TensorBoard event file in the run's folder of the store.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weft_track::tensorboard::EventWriter;
use weft_track::{NewRun, RunWriter, Status, WriterOptions};

use crate::config::RunConfig;
use crate::error::Result;
use crate::trainer::{Callback, EvalRecord, FitSummary, StepRecord};

/// The store's folder for `config`: `track.dir`, else `WEFT_TRACK_DIR`, else `weft-runs` in the
/// working directory.
pub fn store_dir(config: &RunConfig) -> PathBuf {
    match (&config.track.dir, std::env::var_os("WEFT_TRACK_DIR")) {
        (Some(dir), _) => config.resolve(dir),
        (None, Some(env)) if !env.is_empty() => PathBuf::from(env),
        _ => PathBuf::from("weft-runs"),
    }
}

/// A run being recorded.
pub struct Tracking {
    writer: RunWriter,
    tensorboard: Tensorboard,
    checkpoint_dir: Option<PathBuf>,
    trace: Option<PathBuf>,
}

impl Tracking {
    /// Starts recording the run on the rank that `logs` (rank 0), when `track.enabled`; `None`
    /// otherwise, or when the store cannot be opened (after a warning naming it).
    pub fn start(config: &RunConfig, logs: bool) -> Option<Tracking> {
        let tc = &config.track;
        if !(tc.enabled && logs) {
            return None;
        }
        let p = &config.parallel;
        let run = NewRun {
            layout: format!("dp={} tp={} pp={} zero={}", p.dp.max(1), p.tp, p.pp, p.zero),
            params: tc.params.clone(),
            tags: tc
                .tags
                .iter()
                .map(|(k, v)| (k.clone(), crate::config::track_value_text(v)))
                .collect(),
            ..NewRun::here(&tc.experiment, tc.name.clone())
        };
        let dir = store_dir(config);
        let options = WriterOptions {
            flush_every: std::time::Duration::from_millis(tc.flush_ms),
            ..WriterOptions::default()
        };
        match RunWriter::start(&dir, run, options) {
            Ok(writer) => Some(Tracking {
                tensorboard: Tensorboard::start(tc.tensorboard, &dir, &tc.experiment, &writer),
                writer,
                checkpoint_dir: config.train.checkpoint_dir.as_ref().map(|d| config.resolve(d)),
                trace: config.train.trace.as_ref().map(|t| config.resolve(t)),
            }),
            Err(e) => {
                weft_core::errln!("weft: warning: track: {e}; this run is not recorded (training goes on)");
                None
            }
        }
    }

    /// The callback that records the trainer's metrics.
    pub fn callback(&self) -> TrackCallback {
        TrackCallback {
            writer: self.writer.clone(),
            tensorboard: self.tensorboard.clone(),
        }
    }

    /// Records the checkpoint folders and trace the run left, and how `fit` ended: finished,
    /// killed (stopped by a signal) or failed (with its error).
    pub fn end(&self, fitted: &Result<FitSummary>) {
        if let Some(path) = self.tensorboard.close() {
            self.writer.artifact("tensorboard", &path);
        }
        if let Some(dir) = &self.checkpoint_dir {
            for folder in checkpoint_folders(dir) {
                self.writer.artifact("checkpoint", &folder);
            }
        }
        if let Some(trace) = self.trace.as_ref().filter(|t| t.is_file()) {
            self.writer.artifact("trace", trace);
        }
        let (status, error) = match fitted {
            Ok(s) => match s.stopped_by {
                Some(sig) => (
                    Status::Killed,
                    Some(format!("stopped by {}", weft_dist::signal::signal_name(sig))),
                ),
                None => (Status::Finished, None),
            },
            Err(e) => (Status::Failed, Some(e.to_string())),
        };
        if let Err(e) = self.writer.end(status, error) {
            weft_core::errln!("weft: warning: track: {e}; the run's record may be incomplete");
        }
    }
}

/// The `step-N` folders in `dir`, by step.
fn checkpoint_folders(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            e.path().is_dir().then(|| (step, e.path()))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// Sends every logged step's and evaluation's metrics to the run's writer (a channel send each:
/// the step never waits for the store).
pub struct TrackCallback {
    writer: RunWriter,
    tensorboard: Tensorboard,
}

impl TrackCallback {
    /// Records `key` at `step` in the store, and in the event file when there is one.
    fn log(&self, step: u64, key: &str, value: f64) {
        self.writer.log(step, key, value);
        self.tensorboard.scalar(step, key, value);
    }
}

impl Callback for TrackCallback {
    fn on_step(&mut self, r: &StepRecord) -> Result<()> {
        let step = r.step as u64;
        self.log(step, "loss", r.loss);
        self.log(step, "lr", r.lr);
        self.log(step, "grad_norm", r.grad_norm);
        self.log(step, "step_ms", r.step_ms);
        self.log(step, r.items_key, r.items_per_s);
        self.log(step, "data_wait_ms", r.data_wait_ms);
        if r.skipped_steps > 0 {
            self.log(step, "skipped_steps", r.skipped_steps as f64);
        }
        if let Some(b) = r.gpu_mem_bytes {
            self.log(step, "gpu_mem_bytes", b as f64);
        }
        if let Some(b) = r.host_mem_bytes {
            self.log(step, "host_mem_bytes", b as f64);
        }
        self.tensorboard.flush_now_and_then();
        Ok(())
    }

    fn on_eval(&mut self, r: &EvalRecord) -> Result<()> {
        self.log(r.step as u64, "val_loss", r.loss);
        if let Some(a) = r.accuracy {
            self.log(r.step as u64, "val_accuracy", a);
        }
        Ok(())
    }
}

/// The run's TensorBoard event file (`track.tensorboard`), shared by the callback and
/// [`Tracking::end`]; `None` inside when off, or after a write failed (warned once).
#[derive(Clone, Default)]
struct Tensorboard(Arc<Mutex<Option<(EventWriter, Instant)>>>);

impl Tensorboard {
    /// How often buffered events reach the file while the run lives.
    const FLUSH_EVERY: Duration = Duration::from_secs(1);

    /// Creates the event file in the run's folder of the store in `dir` when `on`.
    fn start(on: bool, dir: &Path, experiment: &str, writer: &RunWriter) -> Tensorboard {
        if !on {
            return Tensorboard::default();
        }
        let folder = weft_track::run_folder(dir, experiment, writer.name());
        match EventWriter::create_in(&folder) {
            Ok(w) => Tensorboard(Arc::new(Mutex::new(Some((w, Instant::now()))))),
            Err(e) => {
                weft_core::errln!("weft: warning: track.tensorboard: {e}; no event file is written");
                Tensorboard::default()
            }
        }
    }

    /// Runs `f` on the writer; a failure is warned and turns the file off.
    fn with(&self, f: impl FnOnce(&mut EventWriter, &mut Instant) -> weft_track::Result<()>) {
        let Ok(mut slot) = self.0.lock() else { return };
        if let Some((w, flushed)) = slot.as_mut() {
            if let Err(e) = f(w, flushed) {
                weft_core::errln!("weft: warning: track.tensorboard: {e}; the event file stops here");
                *slot = None;
            }
        }
    }

    fn scalar(&self, step: u64, key: &str, value: f64) {
        self.with(|w, _| w.scalar(key, step as i64, value, weft_track::now()));
    }

    /// Pushes buffered events to the file once [`Self::FLUSH_EVERY`] has passed since the last.
    fn flush_now_and_then(&self) {
        self.with(|w, flushed| {
            if flushed.elapsed() < Self::FLUSH_EVERY {
                return Ok(());
            }
            *flushed = Instant::now();
            w.flush()
        });
    }

    /// Flushes and closes the file; its path.
    fn close(&self) -> Option<PathBuf> {
        let (mut w, _) = self.0.lock().ok()?.take()?;
        match w.flush() {
            Ok(()) => Some(w.path().to_path_buf()),
            Err(e) => {
                weft_core::errln!("weft: warning: track.tensorboard: {e}");
                None
            }
        }
    }
}
