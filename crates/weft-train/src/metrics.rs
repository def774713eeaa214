//! Built-in callbacks: a JSON-lines metrics file and a progress display.

use std::io::{IsTerminal, Write};
use std::path::Path;

use crate::error::{Error, Result};
use crate::trainer::{Callback, StepRecord};

/// Appends one JSON object per logged step (`step`, `loss`, `lr`, `grad_norm`, `step_ms`,
/// `tokens_per_s` or `samples_per_s`) and per evaluation (`step`, `val_loss`).
pub struct MetricsFile {
    file: std::io::BufWriter<std::fs::File>,
    path: std::path::PathBuf,
}

impl MetricsFile {
    /// Creates (or, when `append`, extends) the file.
    pub fn create(path: &Path, append: bool) -> Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| Error::Io(format!("{}: {e}", parent.display())))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)
            .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        Ok(MetricsFile {
            file: std::io::BufWriter::new(file),
            path: path.to_path_buf(),
        })
    }

    fn write(&mut self, v: serde_json::Value) -> Result<()> {
        writeln!(self.file, "{v}")
            .and_then(|_| self.file.flush())
            .map_err(|e| Error::Io(format!("{}: {e}", self.path.display())))
    }
}

impl Callback for MetricsFile {
    fn on_step(&mut self, r: &StepRecord) -> Result<()> {
        let mut v = serde_json::json!({"step": r.step, "loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm, "step_ms": r.step_ms});
        v[r.items_key] = serde_json::json!(r.items_per_s);
        let b = &r.state_bytes;
        v["state_bytes"] = serde_json::json!({"params": b.params, "grads": b.grads, "optimizer": b.optimizer});
        if let Some(a) = &r.activation_bytes {
            v["activation_bytes"] = serde_json::json!(a);
        }
        self.write(v)
    }

    fn on_eval(&mut self, step: usize, val_loss: f64) -> Result<()> {
        self.write(serde_json::json!({"step": step, "val_loss": val_loss}))
    }
}

/// A one-line progress bar on a terminal; plain lines otherwise (logs, pipes).
pub struct Progress {
    total: usize,
    tty: bool,
}

impl Progress {
    pub fn new(total: usize) -> Self {
        Progress {
            total,
            tty: std::io::stderr().is_terminal(),
        }
    }
}

impl Callback for Progress {
    fn on_step(&mut self, r: &StepRecord) -> Result<()> {
        let done = r.step + 1;
        let line = format!(
            "step {done:>6}/{} | loss {:.4} | lr {:.2e} | grad norm {:.3} | {:.1} ms/step",
            self.total, r.loss, r.lr, r.grad_norm, r.step_ms
        );
        if self.tty {
            let width = 24;
            let filled = width * done / self.total.max(1);
            weft_core::err!("\r[{}{}] {line}   ", "#".repeat(filled), "-".repeat(width - filled));
            if done == self.total {
                weft_core::errln!();
            }
        } else {
            weft_core::errln!("{line}");
        }
        Ok(())
    }

    fn on_eval(&mut self, step: usize, val_loss: f64) -> Result<()> {
        if self.tty {
            weft_core::errln!();
        }
        weft_core::errln!("step {:>6}/{} | val loss {val_loss:.4}", step + 1, self.total);
        Ok(())
    }
}
