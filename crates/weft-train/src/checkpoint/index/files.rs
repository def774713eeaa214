//! Reading a checkpoint folder's pieces back: whole tensors, or only the rows of a tensor a rank
//! needs, from only the bytes of the pieces that hold them.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::Path;

use weft_core::io::safetensors::SafeTensorsFile;
use weft_core::{DType, Tensor};
use weft_nn::parallel::Split;

use super::{checksum, numel, part_shape, parts, PieceRecord, TensorRecord};
use crate::checkpoint::io;
use crate::error::{Error, Result};

/// The files of a checkpoint folder, each opened (and its header read) once; a tensor's bytes
/// are read from the file's map when a piece, or the part of one a rank needs, is asked for.
pub struct Files<'a> {
    dir: &'a Path,
    open: BTreeMap<String, SafeTensorsFile>,
    /// Whether a piece read in part is first checked whole against its checksum.
    check_parts: bool,
    /// `(file, tensor)` pieces checked so far.
    checked: BTreeSet<(String, String)>,
}

impl<'a> Files<'a> {
    pub fn new(dir: &'a Path) -> Self {
        Files {
            dir,
            open: BTreeMap::new(),
            check_parts: false,
            checked: BTreeSet::new(),
        }
    }

    /// Checks every piece a read takes anything from against its checksum, once, even when only
    /// part of it is needed (which then reads the whole piece): what `--resume` does, so that a
    /// damaged piece is found whatever part of it a rank reads.
    pub fn checking_every_piece(mut self) -> Self {
        self.check_parts = true;
        self
    }

    /// Tensor bytes read out of the folder's files so far.
    pub fn bytes_read(&self) -> u64 {
        self.open.values().map(SafeTensorsFile::bytes_copied).sum()
    }

    /// File `file` of the folder, opened once; tensor `name` of it checked against its
    /// record's size and dtype (from the header: no tensor byte is read).
    fn file(&mut self, file: &str, name: &str, rec: &PieceRecord, dtype: &str) -> Result<&SafeTensorsFile> {
        if file.is_empty() || file.contains(['/', '\\']) || file.starts_with('.') {
            return Err(io(
                self.dir,
                format!("index.json names the file {file:?}, which is not a file of this folder"),
            ));
        }
        if !self.open.contains_key(file) {
            let opened = SafeTensorsFile::open(&self.dir.join(file))?;
            self.open.insert(file.to_string(), opened);
        }
        let f = &self.open[file];
        let e = f.entry(name).ok_or_else(|| {
            io(
                f.path(),
                format!("tensor {name:?} is missing (the file is damaged or was replaced)"),
            )
        })?;
        if e.numel() != rec.numel || e.dtype.name() != dtype {
            return Err(io(
                f.path(),
                format!(
                    "tensor {name:?} holds {} {} values, the index says {} {dtype} (the file was replaced)",
                    e.numel(),
                    e.dtype.name(),
                    rec.numel
                ),
            ));
        }
        Ok(f)
    }

    /// Tensor `name` of `file`, whole, checked against its record and checksum.
    fn piece(&mut self, file: &str, name: &str, rec: &PieceRecord, dtype: &str) -> Result<Tensor> {
        let f = self.file(file, name, rec, dtype)?;
        let t = f.tensor(name)?;
        if checksum(&t) != rec.checksum {
            return Err(io(
                f.path(),
                format!("tensor {name:?} does not match its checksum (the file is damaged)"),
            ));
        }
        self.checked.insert((file.to_string(), name.to_string()));
        Ok(t)
    }

    /// Checks piece `rec` of tensor `name` (of dtype `dtype`) without keeping it: its file holds
    /// it at the record's size and dtype (the file's header only), and, with `checksum`, its
    /// values match the record's checksum (the piece is read, then dropped).
    pub fn check_piece(&mut self, name: &str, rec: &PieceRecord, dtype: &str, checksum: bool) -> Result<()> {
        match checksum {
            true => self.piece(&rec.file, name, rec, dtype).map(drop),
            false => self.file(&rec.file, name, rec, dtype).map(drop),
        }
    }

    /// Every tensor of `records` (checked by [`check`] when read from an index), whole, put
    /// together from its pieces; errors about a piece name its file.
    pub fn assemble(&mut self, records: &BTreeMap<String, TensorRecord>) -> Result<BTreeMap<String, Tensor>> {
        let mut out = BTreeMap::new();
        for (name, rec) in records {
            out.insert(name.clone(), self.assemble_one(name, rec)?);
        }
        Ok(out)
    }

    pub fn assemble_one(&mut self, name: &str, rec: &TensorRecord) -> Result<Tensor> {
        let mut dtype = None;
        let mut tp_parts = Vec::new();
        let parts = parts(name, rec)?;
        let split = parts[0].0.as_ref().map(|t| Split {
            dim: t.dim,
            blocks: t.blocks,
            len: rec.shape[t.dim],
        });
        for (tp, pieces) in parts {
            let shape = part_shape(name, &rec.shape, &tp)?;
            // every piece read and checked before anything the size of the whole is allocated
            let tensors = pieces
                .iter()
                .map(|p| self.piece(&p.file, name, p, &rec.dtype))
                .collect::<Result<Vec<_>>>()?;
            let n = numel(name, &shape)?;
            let mut values = Vec::new();
            values.try_reserve_exact(n).map_err(|_| {
                Error::Io(format!(
                    "tensor {name:?}: {n} values of shape {shape:?} do not fit in memory"
                ))
            })?;
            values.resize(n, 0.0f64);
            for (p, t) in pieces.iter().zip(&tensors) {
                dtype = Some(t.dtype());
                values[p.offset..p.offset + p.numel].copy_from_slice(&t.to_vec_f64());
            }
            let dtype = dtype.ok_or_else(|| Error::Io(format!("tensor {name:?}: no piece holds it")))?;
            tp_parts.push(Tensor::from_vec(values, &shape)?.cast(dtype)?);
        }
        match split {
            Some(split) => Ok(split.unshard(&tp_parts)?),
            None => Ok(tp_parts.remove(0)),
        }
    }

    /// Rows `rows` of whole tensor `name` (a range of its first dimension; shape
    /// `[rows.len(), shape[1..]..]`), put together from only the bytes of its pieces that hold
    /// them, whatever tensor-parallel or ZeRO layout wrote them. A piece read whole is checked
    /// against its checksum; one read in part only against its record's size and dtype (its
    /// checksum covers all of it), unless [`Files::checking_every_piece`].
    pub fn assemble_rows(&mut self, name: &str, rec: &TensorRecord, rows: Range<usize>) -> Result<Tensor> {
        let parts = parts(name, rec)?;
        let bad = |msg: String| Error::Io(format!("tensor {name:?}: {msg}"));
        let Some((&len, rest)) = rec.shape.split_first() else {
            return Err(bad("a scalar has no rows".into()));
        };
        if rows.start > rows.end || rows.end > len {
            return Err(bad(format!("rows {rows:?} are not among its {len}")));
        }
        let width: usize = rest.iter().product();
        let mut out_shape = rec.shape.clone();
        out_shape[0] = rows.len();
        let mut dtype = None;
        match parts[0].0.clone() {
            // each part holds some whole rows of the tensor (and padding rows)
            Some(tp) if tp.dim == 0 => {
                let split = Split {
                    dim: 0,
                    blocks: tp.blocks,
                    len,
                };
                let part = split.part(tp.ranks);
                let mut values = vec![0.0f64; rows.len() * width];
                for (r, (_, pieces)) in parts.iter().enumerate() {
                    for b in 0..tp.blocks {
                        // whole rows lo..hi are this part's rows b * part + (lo - first)..
                        let held = split.held(b, r, tp.ranks);
                        let first = held.start;
                        let (lo, hi) = (first.max(rows.start), held.end.min(rows.end));
                        if lo >= hi {
                            continue;
                        }
                        let at = (b * part + lo - first) * width;
                        let (got, d) = self.elements(name, rec, pieces, at..at + (hi - lo) * width)?;
                        dtype = Some(d);
                        values[(lo - rows.start) * width..(hi - rows.start) * width].copy_from_slice(&got);
                    }
                }
                let dtype = match dtype {
                    Some(d) => d,
                    None => dtype_of(name, rec)?,
                };
                Ok(Tensor::from_vec(values, &out_shape)?.cast(dtype)?)
            }
            // every part holds some of every row: its rows `rows`, put together as a whole
            tp => {
                let mut tp_parts = Vec::with_capacity(parts.len());
                for (tp, pieces) in &parts {
                    let mut shape = part_shape(name, &rec.shape, tp)?;
                    shape[0] = rows.len();
                    let w: usize = shape[1..].iter().product();
                    let (got, d) = self.elements(name, rec, pieces, rows.start * w..rows.end * w)?;
                    tp_parts.push(Tensor::from_vec(got, &shape)?.cast(d)?);
                }
                match tp {
                    Some(tp) => Ok(Split {
                        dim: tp.dim,
                        blocks: tp.blocks,
                        len: rec.shape[tp.dim],
                    }
                    .unshard(&tp_parts)?),
                    None => Ok(tp_parts.remove(0)),
                }
            }
        }
    }

    /// Elements `range` (row-major) of one tensor-parallel part held by `pieces` (sorted by
    /// offset, covering the part once), as f64 values, with the tensor's dtype.
    fn elements(
        &mut self,
        name: &str,
        rec: &TensorRecord,
        pieces: &[&PieceRecord],
        range: Range<usize>,
    ) -> Result<(Vec<f64>, DType)> {
        let mut out = Vec::with_capacity(range.len());
        let mut dtype = None;
        for p in pieces {
            let (lo, hi) = (range.start.max(p.offset), range.end.min(p.offset + p.numel));
            if lo >= hi {
                continue;
            }
            let whole = lo == p.offset && hi == p.offset + p.numel;
            if !whole && self.check_parts && !self.checked.contains(&(p.file.clone(), name.to_string())) {
                self.piece(&p.file, name, p, &rec.dtype)?;
            }
            let t = if whole {
                self.piece(&p.file, name, p, &rec.dtype)?
            } else {
                let f = self.file(&p.file, name, p, &rec.dtype)?;
                f.elements(name, lo - p.offset..hi - p.offset)?
            };
            dtype = Some(t.dtype());
            out.extend(t.to_vec_f64());
        }
        let dtype = match dtype {
            Some(d) => d,
            None => dtype_of(name, rec)?,
        };
        Ok((out, dtype))
    }
}

/// The dtype a record names (by [`DType::name`]).
fn dtype_of(name: &str, rec: &TensorRecord) -> Result<DType> {
    [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F16,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ]
    .into_iter()
    .find(|d| d.name() == rec.dtype)
    .ok_or_else(|| Error::Io(format!("tensor {name:?}: unknown dtype {:?}", rec.dtype)))
}
