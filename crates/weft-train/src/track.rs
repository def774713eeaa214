//! Recording a run in the run store (`[track]`, docs/tracking.md): the run's params, tags,
//! layout and host when it starts, every logged step's and evaluation's metrics, checkpoint
//! folders and the trace as artifacts, and how it ended. Rank 0 records; a store that cannot be
//! opened turns tracking off with a warning, and the run trains.

use std::path::{Path, PathBuf};

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
        match RunWriter::start(&dir, run, WriterOptions::default()) {
            Ok(writer) => Some(Tracking {
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
        }
    }

    /// Records the checkpoint folders and trace the run left, and how `fit` ended: finished,
    /// killed (stopped by a signal) or failed (with its error).
    pub fn end(&self, fitted: &Result<FitSummary>) {
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
}

impl Callback for TrackCallback {
    fn on_step(&mut self, r: &StepRecord) -> Result<()> {
        let w = &self.writer;
        let step = r.step as u64;
        w.log(step, "loss", r.loss);
        w.log(step, "lr", r.lr);
        w.log(step, "grad_norm", r.grad_norm);
        w.log(step, "step_ms", r.step_ms);
        w.log(step, r.items_key, r.items_per_s);
        w.log(step, "data_wait_ms", r.data_wait_ms);
        if r.skipped_steps > 0 {
            w.log(step, "skipped_steps", r.skipped_steps as f64);
        }
        if let Some(b) = r.gpu_mem_bytes {
            w.log(step, "gpu_mem_bytes", b as f64);
        }
        if let Some(b) = r.host_mem_bytes {
            w.log(step, "host_mem_bytes", b as f64);
        }
        Ok(())
    }

    fn on_eval(&mut self, r: &EvalRecord) -> Result<()> {
        self.writer.log(r.step as u64, "val_loss", r.loss);
        if let Some(a) = r.accuracy {
            self.writer.log(r.step as u64, "val_accuracy", a);
        }
        Ok(())
    }
}
