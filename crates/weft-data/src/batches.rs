//! Pre-made batches from a safetensors file (for reproducing another framework's run batch for
//! batch), served in a cycle.

use std::path::{Path, PathBuf};

use weft_core::Tensor;

use crate::error::{invalid, Result};

/// Batches stored as two tensors of a safetensors file: `inputs` `[S, B, ...]` and `targets`
/// `[S, B, ...]` (any dtypes, same `S` steps and `B` rows per batch). Step `k` is row `k mod S` of
/// each.
#[derive(Debug, Clone)]
pub struct BatchesDataset {
    path: PathBuf,
    inputs: Tensor,
    targets: Tensor,
}

impl BatchesDataset {
    /// Reads `path`. Errors name the path and the missing tensor (`inputs` or `targets`, listing
    /// the tensors the file has), or the tensor and both shapes when they have rank below 2,
    /// `S = 0`, disagree in `S` or `B`, or have a dimension of size 0 (`B = 0` rows: every batch
    /// would be empty, and its loss NaN). A path that is not a regular file (a directory,
    /// `/dev/zero`) is refused before reading.
    pub fn from_file(path: impl AsRef<Path>) -> Result<BatchesDataset> {
        let path = path.as_ref();
        crate::files::check_regular(path)?;
        let mut file = weft_core::io::safetensors::load(path)?;
        // the names as the file has them, before either is taken out
        let names: Vec<String> = file.tensors.keys().cloned().collect();
        let mut take = |name: &str| {
            file.tensors.remove(name).ok_or_else(|| {
                invalid(format!(
                    "{}: no tensor named {name:?} (the file has {names:?})",
                    path.display()
                ))
            })
        };
        let inputs = take("inputs")?;
        let targets = take("targets")?;
        let (si, st) = (inputs.shape(), targets.shape());
        let mismatch = |why: &str| {
            invalid(format!(
                "{}: {why}: \"inputs\" has shape {si:?}, \"targets\" has shape {st:?}",
                path.display()
            ))
        };
        if si.len() < 2 || st.len() < 2 {
            return Err(mismatch("both tensors must be [steps, batch, ...]"));
        }
        if si[0] != st[0] || si[1] != st[1] {
            return Err(mismatch("the first two dims (steps, batch) must agree"));
        }
        if si[0] == 0 {
            return Err(mismatch("the file holds no steps"));
        }
        for (name, shape) in [("inputs", si), ("targets", st)] {
            if let Some(d) = shape.iter().position(|&n| n == 0) {
                let what = match d {
                    1 => "(batch) is 0: every batch would have no rows".to_string(),
                    _ => "is 0: every batch would be empty".to_string(),
                };
                return Err(invalid(format!(
                    "{}: tensor {name:?} has shape {shape:?}: dimension {d} {what}",
                    path.display()
                )));
            }
        }
        Ok(BatchesDataset {
            path: path.into(),
            inputs,
            targets,
        })
    }

    /// The path the batches came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `S`: the number of distinct batches before the cycle repeats.
    pub fn steps_per_cycle(&self) -> usize {
        self.inputs.shape()[0]
    }

    /// `B`: rows per batch.
    pub fn batch_size(&self) -> usize {
        self.inputs.shape()[1]
    }

    /// The batch at `step`: `(inputs[step mod S], targets[step mod S])`, of shapes `[B, ...]` and the
    /// stored dtypes, each in its own contiguous storage.
    pub fn batch(&self, step: usize) -> Result<(Tensor, Tensor)> {
        let row = step % self.steps_per_cycle();
        let pick =
            |t: &Tensor| -> Result<Tensor> { Ok(t.narrow(0, row, 1)?.contiguous_copy()?.view(&t.shape()[1..])?) };
        Ok((pick(&self.inputs)?, pick(&self.targets)?))
    }
}
