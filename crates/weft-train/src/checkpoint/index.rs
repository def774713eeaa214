//! The checkpoint's index: every whole tensor with the pieces that hold it, and how the pieces
//! go back together.
//!
//! A piece is a run of elements of one tensor, written by one rank. A tensor is cut in two
//! ways, either or both:
//! - by tensor parallelism ([`TpPart`]): rank `r` of `ranks` holds part `r` of the tensor as
//!   [`weft_nn::parallel::Split`] cuts it (padding included);
//! - by ZeRO: a rank holds elements `[offset, offset + numel)` of that part (or of the whole
//!   tensor), in row-major order.
//!
//! A tensor nobody cuts is one piece with offset 0 holding every element.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use weft_core::io::safetensors;
use weft_core::Tensor;
use weft_nn::parallel::Split;

use super::{io, CheckpointState};
use crate::error::{Error, Result};

mod files;
pub use files::Files;

/// The format an index declares; readers refuse others.
pub const FORMAT: &str = "weft-checkpoint/2";

/// Which tensor-parallel part of a tensor a piece belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TpPart {
    /// The dimension cut, and how many blocks (3 for a fused q,k,v projection) are cut apart.
    pub dim: usize,
    pub blocks: usize,
    /// This part's rank, of `ranks`.
    pub rank: usize,
    pub ranks: usize,
}

/// One piece as the index records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PieceRecord {
    /// The file (inside the checkpoint folder) that holds it under the tensor's name.
    pub file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<TpPart>,
    /// First element, in the row-major numbering of the tensor-parallel part (or the tensor).
    pub offset: usize,
    pub numel: usize,
    /// Of the piece's values (see [`checksum`]).
    pub checksum: String,
}

/// One whole tensor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorRecord {
    pub shape: Vec<usize>,
    /// The dtype's name (`float32`, ...).
    pub dtype: String,
    pub pieces: Vec<PieceRecord>,
}

/// `index.json`: the checkpoint's state and where every tensor is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Index {
    pub format: String,
    pub state: CheckpointState,
    /// Ranks of the job that wrote it.
    pub ranks: usize,
    /// `(alternative, canonical)` names of tied tensors: a consolidated file holds both.
    #[serde(deserialize_with = "alias_pairs")]
    pub aliases: Vec<(String, String)>,
    /// Model parameters by PyTorch name.
    pub model: BTreeMap<String, TensorRecord>,
    /// Optimizer state by `"{param}.{field}"`.
    pub optimizer: BTreeMap<String, TensorRecord>,
}

/// `aliases` read as pairs: an entry of another length, or one that is not names, is an error
/// naming `aliases` and the entry (serde's own for a pair of three said only "trailing
/// characters").
fn alias_pairs<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<(String, String)>, D::Error> {
    use serde::de::Error as _;
    let entries: Vec<serde_json::Value> = Vec::deserialize(d)?;
    let pair = |(i, entry): (usize, serde_json::Value)| {
        let why = match &entry {
            serde_json::Value::Array(names) => match &names[..] {
                [serde_json::Value::String(alt), serde_json::Value::String(canonical)] => {
                    return Ok((alt.clone(), canonical.clone()))
                }
                [_, _] => "holds something besides names".to_string(),
                _ => format!("holds {} values", names.len()),
            },
            _ => "is not a list".to_string(),
        };
        Err(D::Error::custom(format!(
            "aliases[{i}] {why}; each entry is a pair of tensor names [alternative, canonical]"
        )))
    };
    entries.into_iter().enumerate().map(pair).collect()
}

/// A piece a rank holds, to write.
#[derive(Clone, Debug)]
pub struct Piece {
    /// The whole tensor's name and shape.
    pub name: String,
    pub shape: Vec<usize>,
    pub tp: Option<TpPart>,
    pub offset: usize,
    /// The piece's values (any shape; read in row-major order). Nothing else may change them.
    pub tensor: Tensor,
}

/// Everything one rank writes.
#[derive(Clone, Debug, Default)]
pub struct Shard {
    pub model: Vec<Piece>,
    pub optimizer: Vec<Piece>,
}

/// FNV-1a (64 bits) over the tensor's values as f64 bit patterns, in hex: any changed value
/// changes it.
pub fn checksum(t: &Tensor) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in t.to_vec_f64() {
        for b in v.to_bits().to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    format!("fnv1a64:{h:016x}")
}

/// Elements of a tensor of shape `shape`; an error when the product overflows (a damaged or
/// forged index).
fn numel(name: &str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| Error::Io(format!("tensor {name:?}: shape {shape:?} has too many elements")))
}

/// The shape of tensor-parallel part `tp` of a tensor of shape `shape` (padding included).
fn part_shape(name: &str, shape: &[usize], tp: &Option<TpPart>) -> Result<Vec<usize>> {
    let Some(tp) = tp else {
        return Ok(shape.to_vec());
    };
    let len = shape.get(tp.dim).copied();
    match len {
        Some(len) if tp.blocks > 0 && tp.ranks > 0 && len % tp.blocks == 0 => {
            let split = Split {
                dim: tp.dim,
                blocks: tp.blocks,
                len,
            };
            let mut s = shape.to_vec();
            s[tp.dim] = split.part(tp.ranks) * tp.blocks;
            Ok(s)
        }
        _ => Err(Error::Io(format!(
            "tensor {name:?} of shape {shape:?} cannot be cut into {} blocks along dim {} for {} ranks",
            tp.blocks, tp.dim, tp.ranks
        ))),
    }
}

/// The pieces of `rec`, grouped by tensor-parallel part in rank order, after checking that
/// they hold every element of every part exactly once.
fn parts<'a>(name: &str, rec: &'a TensorRecord) -> Result<Vec<(Option<TpPart>, Vec<&'a PieceRecord>)>> {
    let bad = |msg: String| Error::Io(format!("tensor {name:?}: {msg}"));
    let first = rec.pieces.first().ok_or_else(|| bad("no piece holds it".into()))?;
    let ranks = first.tp.as_ref().map_or(1, |t| t.ranks);
    if ranks > rec.pieces.len() {
        return Err(bad(format!(
            "it is cut for {ranks} tensor-parallel ranks, but only {} pieces hold it",
            rec.pieces.len()
        )));
    }
    // a file holds a tensor under its name once: two pieces naming one file are one piece read
    // twice (an index edited so; one piece claimed again K times made K copies of a tensor's
    // size in memory, and the process aborted on the allocation)
    let mut files: Vec<&str> = rec.pieces.iter().map(|p| p.file.as_str()).collect();
    files.sort_unstable();
    if let Some(w) = files.windows(2).find(|w| w[0] == w[1]) {
        return Err(bad(format!(
            "two of its pieces are in file {:?}, which holds it once",
            w[0]
        )));
    }
    let mut out: Vec<(Option<TpPart>, Vec<&PieceRecord>)> = Vec::with_capacity(ranks);
    for r in 0..ranks {
        let tp = first.tp.as_ref().map(|t| TpPart { rank: r, ..t.clone() });
        let mut mine: Vec<&PieceRecord> = rec.pieces.iter().filter(|p| p.tp == tp).collect();
        mine.sort_by_key(|p| p.offset);
        out.push((tp, mine));
    }
    let grouped: usize = out.iter().map(|(_, p)| p.len()).sum();
    if grouped != rec.pieces.len() {
        return Err(bad("its pieces are cut in different ways".into()));
    }
    for (tp, pieces) in &out {
        let numel = numel(name, &part_shape(name, &rec.shape, tp)?)?;
        let which = tp
            .as_ref()
            .map_or(String::new(), |t| format!(" of tensor-parallel part {}", t.rank));
        let mut next = 0;
        for p in pieces {
            if p.offset != next {
                let what = if p.offset > next {
                    "are in no piece"
                } else {
                    "are in two pieces"
                };
                return Err(bad(format!(
                    "elements {}..{}{which} {what} (a rank's file is missing from the index)",
                    next.min(p.offset),
                    next.max(p.offset)
                )));
            }
            next = next
                .checked_add(p.numel)
                .ok_or_else(|| bad(format!("a piece at element {} is too long", p.offset)))?;
        }
        if next != numel {
            return Err(bad(format!(
                "its pieces{which} hold {next} elements, the shape {:?} needs {numel}",
                rec.shape
            )));
        }
    }
    Ok(out)
}

/// Checks that every tensor of `index` is covered exactly once by its pieces.
pub fn check(index: &Index) -> Result<()> {
    for (name, rec) in index.model.iter().chain(&index.optimizer) {
        parts(name, rec)?;
    }
    Ok(())
}

/// Writes `pieces` (keyed by their tensor's name) to `path` and returns each tensor's record
/// with this one piece.
pub fn write_pieces(path: &Path, pieces: &[Piece]) -> Result<BTreeMap<String, TensorRecord>> {
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut records = BTreeMap::new();
    for p in pieces {
        let rec = TensorRecord {
            shape: p.shape.clone(),
            dtype: p.tensor.dtype().name().to_string(),
            pieces: vec![PieceRecord {
                file: file.clone(),
                tp: p.tp.clone(),
                offset: p.offset,
                numel: p.tensor.numel(),
                checksum: checksum(&p.tensor),
            }],
        };
        if records.insert(p.name.clone(), rec).is_some() {
            return Err(io(path, format!("tensor {:?} has two pieces on one rank", p.name)));
        }
    }
    safetensors::save(
        path,
        pieces.iter().map(|p| (p.name.as_str(), &p.tensor)),
        &BTreeMap::new(),
    )?;
    Ok(records)
}

/// Adds `from`'s pieces to `into` (records of one tensor from several ranks), refusing
/// disagreeing shapes or dtypes.
pub fn merge(into: &mut BTreeMap<String, TensorRecord>, from: BTreeMap<String, TensorRecord>) -> Result<()> {
    for (name, rec) in from {
        match into.get_mut(&name) {
            None => {
                into.insert(name, rec);
            }
            Some(have) if have.shape == rec.shape && have.dtype == rec.dtype => have.pieces.extend(rec.pieces),
            Some(have) => {
                return Err(Error::Io(format!(
                    "tensor {name:?}: ranks disagree on its shape or dtype ({:?} {} and {:?} {})",
                    have.shape, have.dtype, rec.shape, rec.dtype
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(shape: &[usize], pieces: &[(Option<TpPart>, usize, usize)]) -> TensorRecord {
        TensorRecord {
            shape: shape.to_vec(),
            dtype: "float32".into(),
            pieces: pieces
                .iter()
                .enumerate()
                .map(|(i, (tp, offset, numel))| PieceRecord {
                    file: format!("rank-{i}.safetensors"),
                    tp: tp.clone(),
                    offset: *offset,
                    numel: *numel,
                    checksum: String::new(),
                })
                .collect(),
        }
    }

    fn tp(rank: usize) -> Option<TpPart> {
        Some(TpPart {
            dim: 0,
            blocks: 1,
            rank,
            ranks: 2,
        })
    }

    #[test]
    fn pieces_must_cover_every_element_once() {
        assert!(parts("w", &record(&[2, 3], &[(None, 0, 6)])).is_ok());
        assert!(parts("w", &record(&[2, 3], &[(None, 4, 2), (None, 0, 4)])).is_ok());
        let gap = parts("w", &record(&[2, 3], &[(None, 0, 2), (None, 3, 3)])).unwrap_err();
        assert!(gap.to_string().contains("elements 2..3 are in no piece"), "{gap}");
        let overlap = parts("w", &record(&[2, 3], &[(None, 0, 4), (None, 3, 3)])).unwrap_err();
        assert!(overlap.to_string().contains("are in two pieces"), "{overlap}");
        let short = parts("w", &record(&[2, 3], &[(None, 0, 5)])).unwrap_err();
        assert!(short.to_string().contains("hold 5 elements"), "{short}");
        // 5 rows cut in 2: parts of 3 rows (one of padding on rank 1)
        assert!(parts("w", &record(&[5, 2], &[(tp(0), 0, 6), (tp(1), 0, 6)])).is_ok());
        let missing = parts("w", &record(&[5, 2], &[(tp(0), 0, 6)])).unwrap_err();
        assert!(missing.to_string().contains("only 1 pieces"), "{missing}");
        let missing = parts("w", &record(&[5, 2], &[(tp(0), 0, 6), (tp(0), 6, 0)])).unwrap_err();
        assert!(missing.to_string().contains("tensor-parallel part 1"), "{missing}");
        let huge = parts("w", &record(&[usize::MAX, 3], &[(None, 0, 6)])).unwrap_err();
        assert!(huge.to_string().contains("too many elements"), "{huge}");
        let mixed = parts("w", &record(&[5, 2], &[(tp(0), 0, 6), (tp(1), 0, 6), (None, 0, 10)])).unwrap_err();
        assert!(mixed.to_string().contains("different ways"), "{mixed}");
        // one file's piece claimed again for more of a grown shape: the file holds it once
        let mut twice = record(&[4, 3], &[(None, 0, 6), (None, 6, 6)]);
        twice.pieces[1].file = twice.pieces[0].file.clone();
        let e = parts("w", &twice).unwrap_err();
        assert!(
            e.to_string()
                .contains("two of its pieces are in file \"rank-0.safetensors\""),
            "{e}"
        );
    }

    #[test]
    fn an_alias_that_is_not_a_pair_is_named() {
        let index = |aliases: &str| {
            format!(
                "{{\"format\": \"{FORMAT}\", \"state\": {{\"step\": 1, \"rng_offset\": 0}}, \"ranks\": 1, \
                 \"aliases\": {aliases}, \"model\": {{}}, \"optimizer\": {{}}}}"
            )
        };
        let read: Index = serde_json::from_str(&index("[[\"lm_head.weight\", \"wte.weight\"]]")).unwrap();
        assert_eq!(read.aliases, [("lm_head.weight".to_string(), "wte.weight".to_string())]);
        for (aliases, want) in [
            (
                "[[\"a\", \"b\"], [\"a\", \"b\", \"c\"]]",
                "aliases[1] holds 3 values; each entry is a pair",
            ),
            ("[[\"a\"]]", "aliases[0] holds 1 values"),
            ("[[\"a\", 3]]", "aliases[0] holds something besides names"),
            ("[\"a\"]", "aliases[0] is not a list"),
        ] {
            let e = serde_json::from_str::<Index>(&index(aliases)).unwrap_err().to_string();
            assert!(e.contains(want), "{aliases}: {e}");
        }
    }

    #[test]
    fn pieces_go_back_together() {
        let dir = std::env::temp_dir().join(format!("weft-index-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // a [5, 2] tensor cut in two tensor-parallel parts (rank 1's last row is padding),
        // each cut again in two flat runs
        let whole = Tensor::from_vec((0..10).map(|v| v as f32).collect::<Vec<_>>(), &[5, 2]).unwrap();
        let split = Split {
            dim: 0,
            blocks: 1,
            len: 5,
        };
        let mut all = BTreeMap::new();
        for r in 0..2 {
            let part = split.shard(&whole, r, 2).unwrap().reshape(&[-1]).unwrap();
            for (i, (lo, n)) in [(0, 4), (4, 2)].into_iter().enumerate() {
                let piece = Piece {
                    name: "w".into(),
                    shape: vec![5, 2],
                    tp: tp(r),
                    offset: lo,
                    tensor: part.narrow(0, lo, n).unwrap().contiguous_copy().unwrap(),
                };
                let recs = write_pieces(&dir.join(format!("r{r}-{i}.safetensors")), &[piece]).unwrap();
                merge(&mut all, recs).unwrap();
            }
        }
        let back = Files::new(&dir).assemble(&all).unwrap();
        assert_eq!(back["w"].to_vec::<f32>().unwrap(), whole.to_vec::<f32>().unwrap());
        assert_eq!(back["w"].shape(), &[5, 2]);
        // a changed value is caught by its checksum, naming the file and the tensor
        let mut bad = all.clone();
        bad.get_mut("w").unwrap().pieces[0].checksum = "fnv1a64:0".into();
        let e = Files::new(&dir).assemble(&bad).unwrap_err().to_string();
        assert!(
            e.contains("r0-0.safetensors") && e.contains("\"w\"") && e.contains("checksum"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
