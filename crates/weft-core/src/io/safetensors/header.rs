//! The header of a safetensors file, read and checked before any tensor byte is touched.
//!
//! The `safetensors` crate parses the header and checks what the format requires: a header of
//! at most 100 MB that is UTF-8 JSON, tensors whose `data_offsets` follow one another from 0
//! with no gap or overlap, an end offset that matches `shape` x dtype size (with no overflow),
//! and data that ends exactly where the file does. On top of that this module refuses dtypes
//! weft has no storage for, and words every refusal as one line naming the file and, where
//! one is to blame, the tensor.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensorError};
use safetensors::SafeTensors as Parsed;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::DType;

/// One tensor as the header describes it. `begin..end` are byte offsets into the data (which
/// starts at [`Header::data_start`] of the file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub begin: usize,
    pub end: usize,
}

impl TensorEntry {
    /// Elements (the product of `shape`; it fits, the header was checked).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A checked header.
#[derive(Clone, Debug, Default)]
pub struct Header {
    /// Byte offset of the data in the file (8 + the header's length).
    pub data_start: usize,
    pub tensors: BTreeMap<String, TensorEntry>,
    pub metadata: BTreeMap<String, String>,
}

/// The largest header the format allows (the crate's limit), in bytes.
const MAX_HEADER: u64 = 100_000_000;

/// The most tensors weft reads from one file. Parsing costs about 900 bytes of memory and
/// 6 µs a tensor (a 90 MB header of 1.5 million empty tensors took 1.3 GB and 9 s), so a
/// header's length alone does not bound it; real files hold thousands at most (models of
/// more tensors are sharded over several files).
pub const MAX_TENSORS: usize = 1 << 18;

pub(super) fn bad(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Io(format!("{}: {what}", path.display()))
}

pub(super) fn dtype_from_st(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::BF16 => DType::BF16,
        Dtype::F16 => DType::F16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

pub(super) fn dtype_to_st(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

const SUPPORTED: &str = "F32 F64 BF16 F16 I64 I32 U8 BOOL";

impl Header {
    /// Reads and checks the header of `bytes`, the whole file (a memory map: only the first
    /// 8 + header-length bytes are read). `path` names the file in errors.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Header> {
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
        if n > MAX_HEADER {
            return Err(bad(
                path,
                format!("header of {n} bytes is longer than the {MAX_HEADER} bytes a safetensors header may have"),
            ));
        }
        if too_many_tensors(&bytes[8..8 + n as usize], MAX_TENSORS) {
            return Err(bad(
                path,
                format!("header lists more than {MAX_TENSORS} tensors, the most weft reads from one file"),
            ));
        }
        let (n, meta) = Parsed::read_metadata(bytes).map_err(|e| explain(bytes, n as usize, e, path))?;
        let data_start = 8 + n;
        let mut tensors = BTreeMap::new();
        for (name, info) in meta.tensors() {
            let dtype = dtype_from_st(info.dtype).ok_or_else(|| {
                bad(
                    path,
                    format!(
                        "tensor {name:?}: dtype {:?} is not one weft reads ({SUPPORTED})",
                        info.dtype
                    ),
                )
            })?;
            let (begin, end) = info.data_offsets;
            tensors.insert(
                name,
                TensorEntry {
                    dtype,
                    shape: info.shape.clone(),
                    begin,
                    end,
                },
            );
        }
        let metadata = meta
            .metadata()
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(Header {
            data_start,
            tensors,
            metadata,
        })
    }
}

/// Whether a header's top-level object has more than `limit` tensors (entries besides
/// `__metadata__`), found by a pass that keeps nothing of what it reads and stops at the first
/// entry past the limit. A header that is not a JSON object passes, for the crate to refuse
/// in its words.
fn too_many_tensors(header: &[u8], limit: usize) -> bool {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    use std::cell::Cell;
    struct Count<'a>(&'a Cell<bool>, usize);
    impl<'de> Visitor<'de> for Count<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
            let mut n = 0;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                map.next_value::<IgnoredAny>()?;
                if key != "__metadata__" {
                    n += 1;
                }
                if n > self.1 {
                    self.0.set(true);
                    return Err(serde::de::Error::custom("too many entries"));
                }
            }
            Ok(())
        }
    }
    let over = Cell::new(false);
    let _ = serde_json::Deserializer::from_slice(header).deserialize_map(Count(&over, limit));
    over.get()
}

/// One tensor's fields as written, for naming the culprit of a refusal.
struct Raw {
    name: String,
    dtype: String,
    shape: Option<Vec<u64>>,
    offsets: Option<(u64, u64)>,
}

fn raw_entries(header: &[u8]) -> Vec<Raw> {
    let Ok(Value::Object(entries)) = serde_json::from_slice::<Value>(header) else {
        return Vec::new();
    };
    let mut out: Vec<Raw> = entries
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .map(|(name, e)| Raw {
            name,
            dtype: e.get("dtype").and_then(Value::as_str).unwrap_or_default().to_string(),
            shape: e
                .get("shape")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(Value::as_u64).collect()),
            offsets: e
                .get("data_offsets")
                .and_then(Value::as_array)
                .and_then(|a| match a.as_slice() {
                    [b, e] => Some((b.as_u64()?, e.as_u64()?)),
                    _ => None,
                }),
        })
        .collect();
    out.sort_by(|a, b| (a.offsets, &a.name).cmp(&(b.offsets, &b.name)));
    out
}

/// The bytes of one element of a dtype named as in a header; `None` for a name the format
/// does not know or a dtype of less than a byte.
fn element_bytes(name: &str) -> Option<u64> {
    let d: Dtype = serde_json::from_value(Value::String(name.to_string())).ok()?;
    let bits = d.bitsize();
    bits.is_multiple_of(8).then_some(bits as u64 / 8)
}

/// One line for a refusal by the crate, naming the tensor to blame where there is one.
fn explain(bytes: &[u8], n: usize, e: SafeTensorError, path: &Path) -> Error {
    use SafeTensorError as E;
    let header = &bytes[8..8 + n];
    let data_len = (bytes.len() - 8 - n) as u64;
    let entries = raw_entries(header);
    let tensor = |r: &Raw, what: String| bad(path, format!("tensor {:?}: {what}", r.name));
    match e {
        E::InvalidHeader(e) => bad(path, format!("header is not UTF-8: {e}")),
        E::InvalidHeaderDeserialization(e) if !matches!(e.classify(), serde_json::error::Category::Data) => {
            bad(path, format!("header is not valid JSON: {e}"))
        }
        E::InvalidHeaderDeserialization(e) => {
            for r in &entries {
                if element_bytes(&r.dtype).is_none() {
                    return tensor(r, format!("dtype {:?} is not one weft reads ({SUPPORTED})", r.dtype));
                }
                if r.shape.is_none() {
                    return tensor(r, "shape is not a list of sizes".into());
                }
                if r.offsets.is_none() {
                    return tensor(r, "data_offsets is not [begin, end]".into());
                }
            }
            bad(path, format!("header is not a safetensors header: {e}"))
        }
        E::MetadataIncompleteBuffer => match entries
            .iter()
            .filter_map(|r| Some((r, r.offsets?.1)))
            .max_by_key(|x| x.1)
        {
            Some((r, end)) if end > data_len => bad(
                path,
                format!(
                    "truncated: tensor {:?} needs bytes up to {end}, the data has {data_len}",
                    r.name
                ),
            ),
            Some((_, end)) => bad(
                path,
                format!(
                    "{} bytes follow the last tensor's data (the file is damaged)",
                    data_len - end
                ),
            ),
            None if data_len > 0 => bad(path, format!("{data_len} bytes follow a header that names no tensor")),
            None => bad(path, "header does not cover the file"),
        },
        E::InvalidOffset(name) => {
            // the crate's order among equal offsets is arbitrary: name the first in name order
            let mut next = 0;
            let culprit = entries.iter().find_map(|r| {
                let (b, e) = r.offsets?;
                let off = b != next || e < b;
                next = e;
                off.then_some(r.name.as_str())
            });
            let name = culprit.unwrap_or(&name);
            bad(
                path,
                format!("tensor {name:?}: its data_offsets overlap another tensor's or leave a gap before it"),
            )
        }
        e @ (E::TensorInvalidInfo | E::ValidationOverflow | E::MisalignedSlice) => {
            for r in &entries {
                let (Some(shape), Some((begin, end)), Some(size)) = (&r.shape, r.offsets, element_bytes(&r.dtype))
                else {
                    continue;
                };
                let want = shape.iter().try_fold(size, |acc, &d| acc.checked_mul(d));
                match want {
                    None => {
                        return tensor(r, format!("shape {shape:?} has more elements than fit in memory"));
                    }
                    Some(w) if begin > end || end - begin != w => {
                        return tensor(r, format!("offsets {begin}..{end} do not hold {} {shape:?}", r.dtype));
                    }
                    _ => {}
                }
            }
            bad(path, format!("header: {e}"))
        }
        e => bad(path, format!("header: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::too_many_tensors;

    #[test]
    fn entries_are_counted_past_escapes_and_nesting() {
        let entry = |k: &str| format!(r#""{k}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#);
        let header = |keys: &[&str]| format!("{{{}}}", keys.iter().map(|k| entry(k)).collect::<Vec<_>>().join(","));
        // three tensors and the metadata fit a limit of three; a fourth tensor does not
        let meta = r#""__metadata__":{"a":"{\"x\":1}"}"#;
        let three = format!("{{{meta},{},{},{}}}", entry("a"), entry("b"), entry("c"));
        assert!(!too_many_tensors(three.as_bytes(), 3));
        assert!(too_many_tensors(header(&["a", "b", "c", "d", "e"]).as_bytes(), 3));
        // keys written with escapes, and values with nested objects and strings holding braces
        let odd = header(&[r"\u0061", r#"b\"}"#, "c{", "d", "e"]);
        assert!(too_many_tensors(odd.as_bytes(), 4));
        assert!(!too_many_tensors(odd.as_bytes(), 5));
        // the metadata is no tensor, and its slot is no spare one: four tensors pass three
        assert!(too_many_tensors(header(&["a", "b", "c", "d"]).as_bytes(), 3));
        // not an object, or not JSON: left to the crate's refusal
        assert!(!too_many_tensors(b"[1,2,3,4,5,6]", 3));
        assert!(!too_many_tensors(b"{\"a\":", 0));
    }
}
