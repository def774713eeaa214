//! The safetensors format (as written by `safetensors.torch.save_file`): an 8-byte little-endian
//! header length, a JSON header mapping each tensor name to `{dtype, shape, data_offsets}` (plus an
//! optional `__metadata__` map of strings), then the raw little-endian data.
//!
//! Reading and writing go through the `safetensors` crate. A file is read lazily through
//! [`SafeTensorsFile`]: memory-mapped read-only, only its header read on open, a tensor's bytes
//! (or only some of its rows or elements) copied out of the map when asked for. The eager API
//! ([`load`], [`from_bytes`] into a [`SafeTensors`]) reads every tensor through it.
//!
//! Everything read is validated before use (see [`header`]): a truncated file, a header that
//! is not JSON, a dtype weft has no storage for, offsets that overlap, leave gaps or do not match
//! the shape, a shape whose element count overflows, are errors naming the file and the tensor.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::Result;
use crate::Tensor;

mod file;
pub mod header;
mod write;

pub use file::SafeTensorsFile;
pub use header::{Header, TensorEntry};
pub(crate) use write::encode as le_bytes;
pub use write::{save, to_bytes};

/// Tensors by name, plus the file's string metadata.
#[derive(Debug, Default)]
pub struct SafeTensors {
    pub tensors: BTreeMap<String, Tensor>,
    pub metadata: BTreeMap<String, String>,
}

/// Parses safetensors bytes (a whole file); `path` only names the source in errors.
pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<SafeTensors> {
    let header = Header::parse(bytes, path)?;
    let mut tensors = BTreeMap::new();
    for (name, e) in &header.tensors {
        let data = &bytes[header.data_start + e.begin..header.data_start + e.end];
        let storage =
            file::decode(e.dtype, data).map_err(|err| header::bad(path, format!("tensor {name:?}: {err}")))?;
        tensors.insert(name.clone(), Tensor::from_storage(storage, &e.shape));
    }
    Ok(SafeTensors {
        tensors,
        metadata: header.metadata,
    })
}

/// Reads every tensor of a safetensors file (through [`SafeTensorsFile`]: the file is mapped,
/// not read into a buffer of its size). A tensor larger than memory can hold (a header claiming
/// a huge tensor, with the bytes to match) is an error naming the file, the tensor and the bytes.
pub fn load(path: &Path) -> Result<SafeTensors> {
    let file = SafeTensorsFile::open(path)?;
    let mut tensors = BTreeMap::new();
    for name in file.names() {
        tensors.insert(name.to_string(), file.tensor(name)?);
    }
    Ok(SafeTensors {
        tensors,
        metadata: file.metadata().clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn round_trip_every_dtype() {
        let a = Tensor::from_vec(vec![1.5f32, -2.0, 3.25, 0.0], &[2, 2]).unwrap();
        let mut named = vec![("a".to_string(), a.clone())];
        for d in [
            DType::F64,
            DType::BF16,
            DType::F16,
            DType::I64,
            DType::I32,
            DType::U8,
            DType::Bool,
        ] {
            named.push((format!("{d:?}"), a.abs().unwrap().cast(d).unwrap().t().unwrap()));
        }
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let bytes = to_bytes(named.iter().map(|(n, t)| (n.as_str(), t)), &meta).unwrap();
        let back = from_bytes(&bytes, Path::new("x")).unwrap();
        assert_eq!(back.metadata, meta);
        for (n, t) in &named {
            let r = &back.tensors[n];
            assert_eq!((r.dtype(), r.shape()), (t.dtype(), t.shape()), "{n}");
            assert_eq!(r.to_vec_f64(), t.to_vec_f64(), "{n}");
        }
    }

    #[test]
    fn damaged_files_are_errors_naming_the_file_and_tensor() {
        let a = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]).unwrap();
        let bytes = to_bytes([("weight", &a)], &BTreeMap::new()).unwrap();
        let p = Path::new("model.safetensors");
        let truncated = from_bytes(&bytes[..bytes.len() - 4], p).unwrap_err().to_string();
        assert!(
            truncated.contains("model.safetensors") && truncated.contains("weight") && truncated.contains("truncated"),
            "{truncated}"
        );
        assert!(from_bytes(&bytes[..5], p)
            .unwrap_err()
            .to_string()
            .contains("model.safetensors"));
        let mut garbled = bytes.clone();
        garbled[9] = b'#';
        assert!(from_bytes(&garbled, p).unwrap_err().to_string().contains("JSON"));
        let mut huge = bytes.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(from_bytes(&huge, p).unwrap_err().to_string().contains("truncated"));
    }
}
