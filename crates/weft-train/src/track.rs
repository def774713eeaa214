//! Recording a run in the run store (`[track]`, docs/tracking.md): the run's params, tags,
//! layout and host when it starts, every logged step's and evaluation's metrics, checkpoint
//! folders and the trace as artifacts, and how it ended. Rank 0 records; a store that cannot be
//! opened turns tracking off with a warning, and the run trains. With `track.tensorboard` the
//! same metrics also go to a TensorBoard event file in the run's folder of the store.
//!
//! Checkpoints name the run they were recorded under (key [`CHECKPOINT_KEY`] of their extra
//! state), and a run resumed from one continues that run in the store when it can
//! ([`weft_track::RunWriter::resume`]; docs/tracking.md, "Resumed runs").

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weft_track::tensorboard::EventWriter;
use weft_track::{NewRun, NotContinued, Resumed, RunRef, RunWriter, Status, WriterOptions};

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
    /// The run's own folder in the store (`weft_track::run_folder`): the event file and the
    /// sample go there.
    folder: PathBuf,
}

impl Tracking {
    /// Starts recording the run on the rank that `logs` (rank 0), when `track.enabled`, with
    /// its `inputs` (called only then: [`crate::lineage::run_inputs`] hashes files); `None`
    /// otherwise, or when the store cannot be opened (after a warning naming it).
    ///
    /// `continues`: the extra state of the checkpoint this run continues (its own folder's) and
    /// the steps it holds. When the checkpoint names a run of this store that can go on, that run
    /// is continued after those steps; otherwise (after one warning saying why, unless the
    /// checkpoint names no run: one written before runs were named, or untracked) a new run is
    /// recorded.
    pub fn start(
        config: &RunConfig,
        logs: bool,
        continues: Option<(&serde_json::Value, usize)>,
        inputs: impl FnOnce() -> Vec<weft_track::RunInput>,
    ) -> Option<Tracking> {
        let tc = &config.track;
        if !(tc.enabled && logs) {
            return None;
        }
        let p = &config.parallel;
        let run = NewRun {
            layout: format!("dp={} tp={} pp={} zero={}", p.dp.max(1), p.tp, p.pp, p.zero),
            params: tc.params.clone(),
            // the config's tags, then the machine's (`sys.*`: os, cpus, cpu, memory, weft)
            tags: tc
                .tags
                .iter()
                .map(|(k, v)| (k.clone(), crate::config::track_value_text(v)))
                .chain(weft_track::system::system_tags())
                .collect(),
            inputs: inputs(),
            ..NewRun::here(&tc.experiment, tc.name.clone())
        };
        let dir = store_dir(config);
        let options = WriterOptions {
            flush_every: std::time::Duration::from_millis(tc.flush_ms),
            ..WriterOptions::default()
        };
        let prior = continues.and_then(|(extra, steps)| match run_ref_of(extra) {
            Ok(Some(r)) => Some((r, steps)),
            Ok(None) => None,
            Err(why) => {
                weft_core::errln!(
                    "weft: warning: track: the checkpoint's {CHECKPOINT_KEY:?} entry {why}; recording a new run"
                );
                None
            }
        });
        let started = match prior {
            Some((r, steps)) => match RunWriter::resume(&dir, &r, steps as u64, run.clone(), options.clone()) {
                Ok(Resumed::Continued(w)) => Ok(w),
                Ok(Resumed::NotContinued(why)) => {
                    warn_new_run(&r, &why);
                    RunWriter::start(&dir, run, options)
                }
                Err(e) => Err(e),
            },
            None => RunWriter::start(&dir, run, options),
        };
        match started {
            Ok(writer) => Some(Tracking {
                tensorboard: Tensorboard::start(tc.tensorboard, &dir, &tc.experiment, &writer),
                folder: weft_track::run_folder(&dir, &tc.experiment, writer.name()),
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

    /// Names the run in `extra` (a checkpoint's extra state, an object) under [`CHECKPOINT_KEY`],
    /// so that a run resumed from the checkpoint continues this one.
    pub fn name_in(&self, extra: &mut serde_json::Value) {
        let r = self.writer.run_ref();
        if let Some(map) = extra.as_object_mut() {
            map.insert(
                CHECKPOINT_KEY.to_string(),
                serde_json::json!({
                    "store": r.store,
                    "run": r.run,
                    "experiment": r.experiment,
                    "name": r.name,
                    "start_time": r.start_time,
                }),
            );
        }
    }

    /// The callback that records the trainer's metrics.
    pub fn callback(&self) -> TrackCallback {
        TrackCallback {
            writer: self.writer.clone(),
            tensorboard: self.tensorboard.clone(),
        }
    }

    /// Writes the run's generated sample to `sample.txt` in its folder of the store and records
    /// it as an artifact (kind `sample`); a write that fails is a warning.
    pub fn sample(&self, text: &str) {
        let path = self.folder.join("sample.txt");
        let written = std::fs::create_dir_all(&self.folder).and_then(|()| std::fs::write(&path, text));
        match written {
            Ok(()) => self.writer.artifact("sample", &path),
            Err(e) => weft_core::errln!(
                "weft: warning: track: {}: {e}; the sample is not recorded",
                path.display()
            ),
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
        // an error only when records or the status were lost (not for a store that was busy
        // for a while)
        if let Err(e) = self.writer.end(status, error) {
            weft_core::errln!("weft: warning: track: {e}; the run's record is incomplete");
        }
    }
}

/// The key of a checkpoint's extra state that names the run it was recorded under: `{"store":
/// the store's id, "run": the run's id, "experiment", "name", "start_time": seconds since the
/// Unix epoch}`.
pub const CHECKPOINT_KEY: &str = "track";

/// The run named in a checkpoint's extra state: `None` when it names none; why not, when its
/// entry cannot be read (the checkpoint is outside input: a bad entry is never a panic).
fn run_ref_of(extra: &serde_json::Value) -> std::result::Result<Option<RunRef>, String> {
    let entry = match extra.get(CHECKPOINT_KEY) {
        None | Some(serde_json::Value::Null) => return Ok(None),
        Some(e) => e,
    };
    let text = |key: &str| {
        entry
            .get(key)
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .ok_or_else(|| format!("has no text {key:?}"))
    };
    let run = entry
        .get("run")
        .and_then(|v| v.as_i64())
        .ok_or_else(|| "has no integer \"run\"".to_string())?;
    let start_time = entry
        .get("start_time")
        .and_then(|v| v.as_f64())
        .ok_or_else(|| "has no number \"start_time\"".to_string())?;
    Ok(Some(RunRef {
        store: text("store")?,
        run,
        experiment: text("experiment")?,
        name: text("name")?,
        start_time,
    }))
}

/// The one warning of a resumed run that is recorded as a new run.
fn warn_new_run(r: &RunRef, why: &NotContinued) {
    weft_core::errln!(
        "weft: warning: track: not continuing run {}/{} (id {}) of the checkpoint: {why}; recording a new run",
        r.experiment,
        r.name,
        r.run
    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_checkpoint_names_its_run_or_says_why_not() {
        let entry = json!({"store": "ab", "run": 3, "experiment": "e", "name": "r", "start_time": 1.5});
        let got = run_ref_of(&json!({ "model": {}, "track": entry })).unwrap().unwrap();
        assert_eq!(
            got,
            RunRef {
                store: "ab".into(),
                run: 3,
                experiment: "e".into(),
                name: "r".into(),
                start_time: 1.5
            }
        );
        // an older checkpoint, or an untracked run's: no run
        assert_eq!(run_ref_of(&json!({"model": {}})), Ok(None));
        assert_eq!(run_ref_of(&json!({"track": null})), Ok(None));
        assert_eq!(run_ref_of(&serde_json::Value::Null), Ok(None));
        // outside input of the wrong types: a reason, never a panic
        let mut bad = entry.clone();
        bad["run"] = json!("3");
        assert_eq!(
            run_ref_of(&json!({ "track": bad })),
            Err("has no integer \"run\"".into())
        );
        bad["run"] = json!(3.5);
        assert!(run_ref_of(&json!({ "track": bad })).is_err());
        let mut bad = entry.clone();
        bad["store"] = json!(7);
        assert_eq!(
            run_ref_of(&json!({ "track": bad })),
            Err("has no text \"store\"".into())
        );
        assert!(run_ref_of(&json!({"track": [1, 2]})).is_err());
        assert!(run_ref_of(&json!({"track": "x"})).is_err());
    }
}
