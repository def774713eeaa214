//! Writing safetensors files through the `safetensors` crate. Tensors are laid out as the crate
//! (and PyTorch's writer) does: by dtype, widest first, then by name; the header is padded so
//! the data starts 8-byte aligned. Each tensor's little-endian bytes are made when the crate
//! writes it, one tensor at a time.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::rc::Rc;

use half::{bf16, f16};
use safetensors::tensor::{Dtype, View};

use super::header::{bad, dtype_to_st};
use crate::error::{invalid, Error, Result};
use crate::{DType, Tensor};

/// A tensor as the crate's writer sees it.
struct Encoded<'a> {
    name: &'a str,
    tensor: &'a Tensor,
    len: usize,
    /// The first tensor that could not be encoded: the writer's `data` cannot fail, so the
    /// failure is kept here and the output thrown away.
    failed: Rc<RefCell<Option<Error>>>,
}

impl View for Encoded<'_> {
    fn dtype(&self) -> Dtype {
        dtype_to_st(self.tensor.dtype())
    }

    fn shape(&self) -> &[usize] {
        self.tensor.shape()
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match encode(self.tensor) {
            Ok(bytes) => Cow::Owned(bytes),
            Err(e) => {
                let mut failed = self.failed.borrow_mut();
                if failed.is_none() {
                    *failed = Some(invalid("save", format!("tensor {:?}: {e}", self.name)));
                }
                Cow::Owned(Vec::new())
            }
        }
    }

    fn data_len(&self) -> usize {
        self.len
    }
}

/// `t`'s elements as little-endian bytes (read in place when `t` is contiguous).
pub(crate) fn encode(t: &Tensor) -> Result<Vec<u8>> {
    let op = "save";
    let mut out = crate::alloc::with_capacity(op, t.numel() * t.dtype().size_in_bytes())?;
    match t.dtype() {
        DType::F32 => out.extend(t.contig::<f32>(op)?.iter().flat_map(|x| x.to_le_bytes())),
        DType::F64 => out.extend(t.contig::<f64>(op)?.iter().flat_map(|x| x.to_le_bytes())),
        DType::BF16 => out.extend(t.contig::<bf16>(op)?.iter().flat_map(|x| x.to_bits().to_le_bytes())),
        DType::F16 => out.extend(t.contig::<f16>(op)?.iter().flat_map(|x| x.to_bits().to_le_bytes())),
        DType::I64 => out.extend(t.contig::<i64>(op)?.iter().flat_map(|x| x.to_le_bytes())),
        DType::I32 => out.extend(t.contig::<i32>(op)?.iter().flat_map(|x| x.to_le_bytes())),
        DType::U8 => out.extend_from_slice(&t.contig::<u8>(op)?),
        DType::Bool => out.extend(t.contig::<bool>(op)?.iter().map(|&b| b as u8)),
    }
    Ok(out)
}

/// The tensors as the crate's writer takes them, with the data's total bytes (checked to fit).
#[allow(clippy::type_complexity)]
fn prepared<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
    metadata: &BTreeMap<String, String>,
    failed: &Rc<RefCell<Option<Error>>>,
) -> Result<(Vec<(&'a str, Encoded<'a>)>, Option<HashMap<String, String>>, usize)> {
    let mut total = 0usize;
    let mut views = Vec::new();
    for (name, tensor) in tensors {
        let len = tensor
            .numel()
            .checked_mul(tensor.dtype().size_in_bytes())
            .filter(|&n| total.checked_add(n).is_some())
            .ok_or_else(|| invalid("save", format!("tensor {name:?}: more bytes than a file can hold")))?;
        total += len;
        views.push((
            name,
            Encoded {
                name,
                tensor,
                len,
                failed: failed.clone(),
            },
        ));
    }
    let meta = (!metadata.is_empty()).then(|| metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    Ok((views, meta, total))
}

/// Serializes tensors with string metadata into one buffer of the file's size.
pub fn to_bytes<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let failed = Rc::new(RefCell::new(None));
    let (views, meta, total) = prepared(tensors, metadata, &failed)?;
    crate::alloc::check_bytes("save", total as u128)?;
    let bytes = safetensors::serialize(views, meta).map_err(|e| invalid("save", e.to_string()))?;
    let failed = failed.borrow_mut().take();
    match failed {
        Some(e) => Err(e),
        None => Ok(bytes),
    }
}

/// Writes a safetensors file atomically and streaming: the crate writes the tensors one at a
/// time into a temporary file beside the target, which is fsynced and renamed over the target
/// (see [`crate::io::atomic::write_with`]); nothing is left behind on failure.
pub fn save<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let failed = Rc::new(RefCell::new(None));
    let (views, meta, _) = prepared(tensors, metadata, &failed).map_err(|e| bad(path, e))?;
    crate::io::atomic::write_with(path, |tmp| {
        safetensors::serialize_to_file(views, meta, tmp).map_err(|e| match e {
            safetensors::SafeTensorError::IoError(e) => e,
            e => std::io::Error::other(e.to_string()),
        })?;
        match failed.borrow_mut().take() {
            Some(e) => Err(std::io::Error::other(e.to_string())),
            None => Ok(()),
        }
    })
}
