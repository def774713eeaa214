//! Built-in callbacks: a JSON-lines metrics file and a progress display.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::trainer::{Callback, EvalRecord, FitSummary, StepRecord};

/// Appends one JSON object per logged step (`step`, `loss`, `lr`, `grad_norm`, `step_ms`,
/// `data_wait_ms`, `tokens_per_s` or `samples_per_s`, `state_bytes`, ...) and per evaluation
/// (`step`, `val_loss`, and `val_accuracy` for classifiers).
///
/// Every record is one `write` of a whole line; when a write fails (a full disk) the file is cut
/// back to its last whole line, a warning is printed once, and the run goes on: later records
/// say how many were lost (`lost_records`).
pub struct MetricsFile {
    file: std::fs::File,
    path: PathBuf,
    /// The file's length after its last whole line.
    len: u64,
    lost: usize,
}

/// How [`MetricsFile::open`] treats a file that is already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsMode {
    /// A new run: an existing non-empty file is an error (another run's records), unless
    /// `overwrite`, which starts it afresh.
    Fresh { overwrite: bool },
    /// A run resumed after `steps` steps: records of later steps (written after the checkpoint
    /// it resumes from, and about to be written again) are removed, so each step is in the file
    /// once.
    Resume { steps: usize },
}

impl MetricsFile {
    /// Creates the file (and its folder), as `mode` says.
    pub fn open(path: &Path, mode: MetricsMode) -> Result<Self> {
        let bad = |e: &dyn std::fmt::Display| Error::Io(format!("train.metrics: {}: {e}", path.display()));
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| bad(&e))?;
        }
        if path.is_dir() {
            return Err(bad(&"it is a folder"));
        }
        let existing = std::fs::metadata(path).map_or(0, |m| m.len());
        match mode {
            MetricsMode::Fresh { overwrite: false } => check_new(path, false)?,
            MetricsMode::Fresh { overwrite: true } if existing > 0 => {
                weft_core::errln!("weft: train.overwrite: replacing {}", path.display());
                std::fs::write(path, b"").map_err(|e| bad(&e))?;
            }
            MetricsMode::Resume { steps } if existing > 0 => keep_steps_up_to(path, steps).map_err(|e| bad(&e))?,
            _ => {}
        }
        let file = crate::writable::open_for_append(path).map_err(|e| bad(&e))?;
        let len = file.metadata().map_err(|e| bad(&e))?.len();
        Ok(MetricsFile {
            file,
            path: path.to_path_buf(),
            len,
            lost: 0,
        })
    }

    fn write(&mut self, mut v: serde_json::Value) {
        if self.lost > 0 {
            v["lost_records"] = serde_json::json!(self.lost);
        }
        // stdout or stderr gone (a closed pipe, a full disk): the run goes on, and says so here
        let lost_output = weft_core::console::lost_writes();
        if lost_output > 0 {
            v["lost_output_writes"] = serde_json::json!(lost_output);
        }
        let line = format!("{v}\n");
        match self.file.write_all(line.as_bytes()) {
            Ok(()) => self.len += line.len() as u64,
            Err(e) => {
                // no half line stays behind
                let _ = self.file.set_len(self.len);
                if self.lost == 0 {
                    weft_core::errln!(
                        "weft: warning: cannot write to {} ({e}); training goes on, and later records count the \
                         lost ones",
                        self.path.display()
                    );
                }
                self.lost += 1;
            }
        }
    }
}

/// Checks that a new run may write its records to `path`: that it holds no other run's (unless
/// `overwrite`, which will replace them) and can be written. `train.metrics` names it in errors.
pub fn check_new(path: &Path, overwrite: bool) -> Result<()> {
    if path.is_dir() {
        return Err(Error::Config(format!(
            "train.metrics: {} is a folder; name a file (for example {})",
            path.display(),
            path.join("metrics.jsonl").display()
        )));
    }
    if !overwrite && std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
        return Err(Error::Config(format!(
            "train.metrics: {} holds another run's records; continue that run with --resume, write this one \
             elsewhere, or set train.overwrite = true to replace it",
            path.display()
        )));
    }
    check_writable(path)
}

/// Checks that the metrics file at `path` can be written, leaving it as it was (a FIFO is
/// taken unopened: the run's open says whether a process reads it); what a resumed run checks
/// before its first step.
pub fn check_writable(path: &Path) -> Result<()> {
    crate::writable::probe_writable(path, crate::writable::Fifo::Stream)
        .map_err(|e| Error::Config(format!("train.metrics: cannot write {}: {e}", path.display())))
}

/// Moves a non-empty metrics file at `path` aside, to `PATH.<n>` with the first `n` from 1 that is
/// free; where it went (`None` when there was nothing to keep).
pub fn set_aside(path: &Path) -> Result<Option<PathBuf>> {
    if std::fs::metadata(path).map_or(true, |m| m.len() == 0) {
        return Ok(None);
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let aside = (1..)
        .map(|n| path.with_file_name(format!("{name}.{n}")))
        .find(|p| !p.exists())
        .unwrap_or_default();
    std::fs::rename(path, &aside).map_err(|e| Error::Io(format!("train.metrics: {}: {e}", path.display())))?;
    Ok(Some(aside))
}

/// Removes from the metrics file at `path` every record of a step after `steps`, and any line
/// that is not a whole JSON object (cut short by a killed run), through a temporary file renamed
/// over it.
fn keep_steps_up_to(path: &Path, steps: usize) -> std::io::Result<()> {
    let text = std::fs::read_to_string(path)?;
    let mut kept = String::with_capacity(text.len());
    let mut dropped = 0;
    for line in text.lines() {
        let step = serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v.get("step").and_then(|s| s.as_u64()));
        match step {
            Some(s) if s as usize <= steps => {
                kept.push_str(line);
                kept.push('\n');
            }
            _ => dropped += 1,
        }
    }
    if dropped == 0 {
        return Ok(());
    }
    let tmp = path.with_extension("jsonl.tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(kept.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

impl Callback for MetricsFile {
    fn on_step(&mut self, r: &StepRecord) -> Result<()> {
        let mut v = serde_json::json!({"step": r.step, "loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm, "step_ms": r.step_ms, "data_wait_ms": r.data_wait_ms});
        v[r.items_key] = serde_json::json!(r.items_per_s);
        let b = &r.state_bytes;
        v["state_bytes"] = serde_json::json!({"params": b.params, "grads": b.grads, "optimizer": b.optimizer});
        if let Some(a) = &r.activation_bytes {
            v["activation_bytes"] = serde_json::json!(a);
        }
        if r.skipped {
            v["skipped"] = serde_json::json!(true);
        }
        if r.skipped_steps > 0 {
            v["skipped_steps"] = serde_json::json!(r.skipped_steps);
        }
        if let Some(b) = r.gpu_mem_bytes {
            v["gpu_mem_bytes"] = serde_json::json!(b);
        }
        if let Some(b) = r.host_mem_bytes {
            v["host_mem_bytes"] = serde_json::json!(b);
        }
        self.write(v);
        Ok(())
    }

    fn on_eval(&mut self, e: &EvalRecord) -> Result<()> {
        let mut v = serde_json::json!({"step": e.step, "val_loss": e.loss});
        if let Some(a) = e.accuracy {
            v["val_accuracy"] = serde_json::json!(a);
        }
        self.write(v);
        Ok(())
    }
}

/// A progress bar (`indicatif`) with the time left on a terminal; plain lines otherwise (logs,
/// pipes). Steps are numbered from 1 (the numbering of the metrics file and checkpoints).
pub struct Progress {
    total: usize,
    /// The bar, on a terminal only.
    bar: Option<indicatif::ProgressBar>,
    /// The first step shown and when: the time left is extrapolated from there.
    first: Option<(usize, Instant)>,
}

impl Progress {
    pub fn new(total: usize) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar =
                indicatif::ProgressBar::with_draw_target(Some(total as u64), indicatif::ProgressDrawTarget::stderr());
            // the template is fixed and valid; a bar without it would still count steps
            if let Ok(style) = indicatif::ProgressStyle::with_template("[{bar:24}] {msg}") {
                bar.set_style(style.progress_chars("#>-"));
            }
            bar
        });
        Progress {
            total,
            bar,
            first: None,
        }
    }

    /// The time left after `step`, from the pace since the first step shown: `1m05s`.
    fn eta(&mut self, step: usize) -> Option<String> {
        let (s0, t0) = *self.first.get_or_insert((step, Instant::now()));
        if step <= s0 {
            return None;
        }
        let per_step = t0.elapsed().as_secs_f64() / (step - s0) as f64;
        let left = (per_step * self.total.saturating_sub(step) as f64).round() as u64;
        Some(match left {
            s if s >= 3600 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
            s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
            s => format!("{s}s"),
        })
    }
}

impl Callback for Progress {
    fn on_step(&mut self, r: &StepRecord) -> Result<()> {
        let done = r.step;
        let eta = self.eta(done).map_or(String::new(), |e| format!(" | eta {e}"));
        let what = if r.skipped {
            "skipped (not finite)".to_string()
        } else {
            format!("loss {:.4}", r.loss)
        };
        let line = format!(
            "step {done:>6}/{} | {what} | lr {:.2e} | grad norm {:.3} | {:.1} ms/step{eta}",
            self.total, r.lr, r.grad_norm, r.step_ms
        );
        match &self.bar {
            Some(bar) => {
                bar.set_position(done as u64);
                bar.set_message(line);
                if done >= self.total {
                    bar.finish();
                }
            }
            None => weft_core::errln!("{line}"),
        }
        Ok(())
    }

    fn on_eval(&mut self, e: &EvalRecord) -> Result<()> {
        let acc = e
            .accuracy
            .map_or(String::new(), |a| format!(" | val accuracy {:.2}%", a * 100.0));
        let line = format!("step {:>6}/{} | val loss {:.4}{acc}", e.step, self.total, e.loss);
        match &self.bar {
            // above the bar, which is drawn again below it
            Some(bar) => bar.println(line),
            None => weft_core::errln!("{line}"),
        }
        Ok(())
    }

    fn on_end(&mut self, _: &FitSummary) -> Result<()> {
        if let Some(bar) = &self.bar {
            // a run stopped early leaves the bar where it got to
            bar.abandon();
        }
        Ok(())
    }
}
