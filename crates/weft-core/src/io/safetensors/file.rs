//! A safetensors file opened lazily: the file is memory-mapped read-only, only its header is
//! read on open, and a tensor's bytes (or a range of its rows or elements) are copied out of
//! the map when asked for.
//!
//! A mapped file that shrinks under the map would raise `SIGBUS` on the next read past its new
//! end. weft never truncates a file in place: every file it writes goes to a temporary file
//! that is renamed over the target ([`crate::io::atomic`]), so a reader keeps the old file's
//! pages until it drops the map. Another program truncating a checkpoint in place while weft
//! reads it is not guarded against.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use half::{bf16, f16};

use super::header::{bad, Header, TensorEntry};
use crate::error::{Error, Result};
use crate::storage::{CpuStorage, StorageElement};
use crate::{DType, Tensor};

/// An open safetensors file (see the module docs).
pub struct SafeTensorsFile {
    path: PathBuf,
    map: memmap2::Mmap,
    header: Header,
    /// Tensor bytes copied out of the map so far.
    copied: AtomicU64,
}

impl std::fmt::Debug for SafeTensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafeTensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

impl SafeTensorsFile {
    /// Opens and maps `path`, and reads and checks its header (see [`Header::parse`]); no
    /// tensor byte is read. Errors name the file (and the tensor to blame).
    pub fn open(path: &Path) -> Result<SafeTensorsFile> {
        // checked before opening, and opened without waiting: opening a FIFO for reading waits
        // for a writer, forever (a checkpoint whose shard was replaced by one hung every command
        // that read it)
        use crate::io::regular::{open_regular, Regular};
        let (file, meta) = match open_regular(path, true).map_err(|e| bad(path, e))? {
            Regular::File(file, meta) => (file, meta),
            Regular::Missing => return Err(bad(path, "no such file")),
            Regular::Other(kind) => {
                let kind = crate::io::atomic::describe(&kind);
                return Err(bad(path, format!("not a file ({kind})")));
            }
        };
        let len = meta.len();
        if len < 8 {
            return Err(bad(
                path,
                format!("not a safetensors file: {len} bytes, shorter than the 8-byte header length"),
            ));
        }
        // SAFETY: the map is read-only and owned by this value; the bytes may change only if
        // another program writes the file in place, which weft never does (see the module docs).
        let map =
            unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(|e| bad(path, format!("cannot map: {e}")))?;
        let header = Header::parse(&map, path)?;
        Ok(SafeTensorsFile {
            path: path.to_path_buf(),
            map,
            header,
            copied: AtomicU64::new(0),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's length in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.map.len() as u64
    }

    /// Tensor names, in name order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.header.tensors.keys().map(String::as_str)
    }

    /// Tensor `name`'s dtype, shape and place in the file; `None` when the file has no such
    /// tensor.
    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.header.tensors.get(name)
    }

    /// The header's `__metadata__` strings.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.header.metadata
    }

    /// Tensor bytes copied out of the map by this value so far (to check what a reader read).
    pub fn bytes_copied(&self) -> u64 {
        self.copied.load(Ordering::Relaxed)
    }

    fn lookup(&self, name: &str) -> Result<&TensorEntry> {
        self.entry(name)
            .ok_or_else(|| bad(&self.path, format!("no tensor {name:?} in the file")))
    }

    /// Tensor `name`, whole.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let e = self.lookup(name)?;
        let storage = self.copy(name, e, 0..e.numel())?;
        Ok(Tensor::from_storage(storage, &e.shape))
    }

    /// Rows `rows` (a range of the first dimension) of tensor `name`, shape
    /// `[rows.len(), shape[1..]..]`; only those rows' bytes are read.
    pub fn rows(&self, name: &str, rows: Range<usize>) -> Result<Tensor> {
        let e = self.lookup(name)?;
        let Some((&first, rest)) = e.shape.split_first() else {
            return Err(bad(&self.path, format!("tensor {name:?} is a scalar; it has no rows")));
        };
        if rows.start > rows.end || rows.end > first {
            return Err(bad(
                &self.path,
                format!("tensor {name:?} has {first} rows; rows {rows:?} are not among them"),
            ));
        }
        let row: usize = rest.iter().product();
        let storage = self.copy(name, e, rows.start * row..rows.end * row)?;
        let mut shape = e.shape.clone();
        shape[0] = rows.len();
        Ok(Tensor::from_storage(storage, &shape))
    }

    /// Elements `range` of tensor `name` in row-major order, as a 1-D tensor; only those
    /// elements' bytes are read.
    pub fn elements(&self, name: &str, range: Range<usize>) -> Result<Tensor> {
        let e = self.lookup(name)?;
        if range.start > range.end || range.end > e.numel() {
            return Err(bad(
                &self.path,
                format!(
                    "tensor {name:?} has {} elements; {range:?} are not among them",
                    e.numel()
                ),
            ));
        }
        let n = range.len();
        let storage = self.copy(name, e, range)?;
        Ok(Tensor::from_storage(storage, &[n]))
    }

    /// Decodes elements `range` (checked to lie inside the tensor) of entry `e`.
    fn copy(&self, name: &str, e: &TensorEntry, range: Range<usize>) -> Result<CpuStorage> {
        let size = e.dtype.size_in_bytes();
        let start = self.header.data_start + e.begin;
        let (from, to) = (start + range.start * size, start + range.end * size);
        self.copied.fetch_add((to - from) as u64, Ordering::Relaxed);
        let out =
            decode(e.dtype, &self.map[from..to]).map_err(|err| bad(&self.path, format!("tensor {name:?}: {err}")));
        self.release(from, to - from);
        out
    }

    /// Drops the map's pages of bytes `offset..offset + len` from this process (they stay in
    /// the page cache): the bytes were copied out, and keeping them mapped would double the
    /// resident memory of a whole load. A later read maps them again from the file.
    fn release(&self, offset: usize, len: usize) {
        #[cfg(unix)]
        if len > 0 {
            // SAFETY: the map is a read-only map of a file: MADV_DONTNEED only drops its
            // pages, which read back the file's bytes when touched again; no slice of the map
            // outlives `copy`, so nothing observes the range while it is dropped.
            let _ = unsafe {
                self.map
                    .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len)
            };
        }
    }
}

/// Decodes little-endian bytes into a typed buffer (allocated through [`crate::alloc`]).
pub(super) fn decode(dtype: DType, bytes: &[u8]) -> Result<CpuStorage> {
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
