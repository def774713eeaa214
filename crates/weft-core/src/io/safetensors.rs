//! The safetensors format (as written by `safetensors.torch.save_file`): an 8-byte little-endian
//! header length, a JSON header mapping each tensor name to `{dtype, shape, data_offsets}` (plus an
//! optional `__metadata__` map of strings), then the raw little-endian data.
//!
//! Everything read is validated before use: a truncated file, a header that is not JSON, an unknown
//! dtype, or offsets that do not match the shape are errors naming the file and the tensor.

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::storage::{CpuStorage, StorageElement};
use crate::{DType, Tensor};

/// Tensors by name, plus the file's string metadata.
#[derive(Debug, Default)]
pub struct SafeTensors {
    pub tensors: BTreeMap<String, Tensor>,
    pub metadata: BTreeMap<String, String>,
}

fn bad(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Io(format!("{}: {what}", path.display()))
}

fn dtype_from_name(name: &str) -> Option<DType> {
    Some(match name {
        "F32" => DType::F32,
        "F64" => DType::F64,
        "BF16" => DType::BF16,
        "F16" => DType::F16,
        "I64" => DType::I64,
        "I32" => DType::I32,
        "U8" => DType::U8,
        "BOOL" => DType::Bool,
        _ => return None,
    })
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F64 => "F64",
        DType::BF16 => "BF16",
        DType::F16 => "F16",
        DType::I64 => "I64",
        DType::I32 => "I32",
        DType::U8 => "U8",
        DType::Bool => "BOOL",
    }
}

/// Decodes little-endian bytes into a typed buffer (allocated through [`crate::alloc`]).
fn decode(dtype: DType, bytes: &[u8]) -> Result<CpuStorage> {
    fn chunks<T: StorageElement, const N: usize>(b: &[u8], f: impl Fn([u8; N]) -> T) -> Result<CpuStorage> {
        let items = b.chunks_exact(N).map(|c| f(c.try_into().expect("exact chunk")));
        Ok(T::wrap(crate::alloc::collect("load", b.len() / N, items)?))
    }
    match dtype {
        DType::F32 => chunks(bytes, f32::from_le_bytes),
        DType::F64 => chunks(bytes, f64::from_le_bytes),
        DType::BF16 => chunks(bytes, |b: [u8; 2]| bf16::from_bits(u16::from_le_bytes(b))),
        DType::F16 => chunks(bytes, |b: [u8; 2]| f16::from_bits(u16::from_le_bytes(b))),
        DType::I64 => chunks(bytes, i64::from_le_bytes),
        DType::I32 => chunks(bytes, i32::from_le_bytes),
        DType::U8 => chunks(bytes, |b: [u8; 1]| b[0]),
        DType::Bool => {
            if let Some(v) = bytes.iter().find(|&&b| b > 1) {
                return Err(Error::Io(format!("bool byte {v} is neither 0 nor 1")));
            }
            chunks(bytes, |b: [u8; 1]| b[0] == 1)
        }
    }
}

/// Appends `t`'s elements as little-endian bytes (read in place when `t` is contiguous).
fn encode_into(t: &Tensor, out: &mut Vec<u8>) -> Result<()> {
    let op = "save";
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
    Ok(())
}

/// Parses safetensors bytes; `path` only names the source in errors.
pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<SafeTensors> {
    if bytes.len() < 8 {
        return Err(bad(
            path,
            format!(
                "not a safetensors file: {} bytes, shorter than the 8-byte header length",
                bytes.len()
            ),
        ));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let rest = (bytes.len() - 8) as u64;
    if n > rest {
        return Err(bad(
            path,
            format!("truncated: header claims {n} bytes but only {rest} follow"),
        ));
    }
    let data = &bytes[8 + n as usize..];
    let header: Value = serde_json::from_slice(&bytes[8..8 + n as usize])
        .map_err(|e| bad(path, format!("header is not valid JSON: {e}")))?;
    let Value::Object(entries) = header else {
        return Err(bad(path, "header is not a JSON object"));
    };
    let mut out = SafeTensors::default();
    for (name, entry) in entries {
        if name == "__metadata__" {
            if let Value::Object(m) = entry {
                for (k, v) in m {
                    out.metadata.insert(k, v.as_str().unwrap_or_default().to_string());
                }
            }
            continue;
        }
        let field = |k: &str| {
            entry
                .get(k)
                .ok_or_else(|| bad(path, format!("tensor {name:?}: header entry lacks {k:?}")))
        };
        let dtype_str = field("dtype")?.as_str().unwrap_or_default();
        let dtype = dtype_from_name(dtype_str)
            .ok_or_else(|| bad(path, format!("tensor {name:?}: unsupported dtype {dtype_str:?}")))?;
        let shape: Vec<usize> = field("shape")?
            .as_array()
            .and_then(|a| {
                a.iter()
                    .map(|d| d.as_u64().map(|d| d as usize))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| bad(path, format!("tensor {name:?}: shape is not a list of sizes")))?;
        let offsets: Vec<u64> = field("data_offsets")?
            .as_array()
            .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
            .filter(|o| o.len() == 2)
            .ok_or_else(|| bad(path, format!("tensor {name:?}: data_offsets is not [begin, end]")))?;
        let (begin, end) = (offsets[0], offsets[1]);
        let want = shape
            .iter()
            .try_fold(dtype.size_in_bytes() as u64, |acc, &d| acc.checked_mul(d as u64));
        if begin > end || Some(end - begin) != want {
            return Err(bad(
                path,
                format!("tensor {name:?}: offsets {begin}..{end} do not hold {dtype_str} {shape:?}"),
            ));
        }
        if end > data.len() as u64 {
            return Err(bad(
                path,
                format!(
                    "truncated: tensor {name:?} needs bytes up to {end}, the data has {}",
                    data.len()
                ),
            ));
        }
        let storage = decode(dtype, &data[begin as usize..end as usize])
            .map_err(|e| bad(path, format!("tensor {name:?}: {e}")))?;
        out.tensors.insert(name, Tensor::from_storage(storage, &shape));
    }
    Ok(out)
}

/// Reads a safetensors file. A file larger than memory can hold (a header claiming a huge
/// tensor, with the bytes to match) is an error naming the file and the bytes.
pub fn load(path: &Path) -> Result<SafeTensors> {
    let bytes = read_file(path)?;
    from_bytes(&bytes, path)
}

/// The whole file, in a buffer allocated through [`crate::alloc`] for the size the file has.
fn read_file(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| bad(path, e))?;
    let len = f.metadata().map_err(|e| bad(path, e))?.len();
    let len = usize::try_from(len).map_err(|_| bad(path, format!("{len} bytes do not fit in memory")))?;
    let mut bytes = crate::alloc::with_capacity::<u8>("load", len).map_err(|e| bad(path, e))?;
    f.read_to_end(&mut bytes).map_err(|e| bad(path, e))?;
    Ok(bytes)
}

/// Serializes tensors (in name order) with string metadata, into one buffer of the file's size
/// (allocated through [`crate::alloc`]; each tensor is encoded straight into it).
pub fn to_bytes<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let mut sorted: Vec<(&str, &Tensor)> = tensors.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut header = Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), json!(metadata));
    }
    let mut end = 0usize;
    for &(name, t) in &sorted {
        let begin = end;
        end = t
            .numel()
            .checked_mul(t.dtype().size_in_bytes())
            .and_then(|n| n.checked_add(begin))
            .ok_or_else(|| {
                crate::error::invalid("save", format!("tensor {name:?}: more bytes than a file can hold"))
            })?;
        header.insert(
            name.into(),
            json!({"dtype": dtype_name(t.dtype()), "shape": t.shape(), "data_offsets": [begin, end]}),
        );
    }
    let mut head = serde_json::to_vec(&Value::Object(header)).expect("JSON of strings and numbers");
    // pad the header with spaces so the data starts 8-byte aligned, as the reference writer does
    while !(8 + head.len()).is_multiple_of(8) {
        head.push(b' ');
    }
    let mut out = crate::alloc::with_capacity("save", (8 + head.len()).saturating_add(end))?;
    out.extend_from_slice(&(head.len() as u64).to_le_bytes());
    out.extend_from_slice(&head);
    for (_, t) in sorted {
        encode_into(t, &mut out)?;
    }
    Ok(out)
}

/// Writes a safetensors file atomically (`super::atomic::write`): to a temporary file beside
/// the target, fsync, then rename over the target. A symlink at `path` is written through; an
/// existing `path` that is not a regular file is refused; the temporary file never outlives a
/// failure.
pub fn save<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (&'a str, &'a Tensor)>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let bytes = to_bytes(tensors, metadata).map_err(|e| bad(path, e))?;
    super::atomic::write(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

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
