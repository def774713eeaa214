//! The trainer's collectives over the layout of a parallel run: the gradient norm across
//! shards, stages and tensor-parallel parts, the whole parameters (for sampling after a run),
//! and the reading of a checkpoint for this rank: only its stage's tensors, and of a tensor
//! cut across the tensor-parallel group only the rows of its part where the cut allows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use weft_core::Tensor;
use weft_dist::{ProcessGroup, ReduceOp};
use weft_nn::clip::grad_norm;
use weft_nn::parallel::Split;

use super::Trainer;
use crate::checkpoint::{self, Files, Loaded, TensorRecord};

/// The tensor-parallel group a model is cut across, and how each cut parameter is cut.
pub(super) struct TensorParallel {
    pub group: ProcessGroup,
    pub splits: BTreeMap<String, Split>,
    /// Gradients of parameters whole on every rank, summed over `group` once a step
    /// ([`weft_nn::sequence_parallel::DeferredSums`]); `None` where each pass sums them.
    pub deferred: Option<std::sync::Arc<weft_nn::sequence_parallel::DeferredSums>>,
}

/// The parameter an optimizer state key (`"{param}.{field}"`) belongs to.
pub(super) fn param_of(key: &str) -> &str {
    key.rsplit_once('.').map_or("", |(p, _)| p)
}
use crate::error::Result;

impl Trainer {
    /// The global gradient norm when gradients are cut: ZeRO pieces (each element on exactly
    /// one data-parallel rank) summed over the data-parallel group, tensor-parallel parts
    /// summed over the tensor-parallel group (parameters whole on every tensor-parallel rank
    /// counted on its rank 0 only), stages summed over the pipeline (a tied weight counted on
    /// the first stage only).
    pub(super) fn sharded_grad_norm(&self) -> Result<f64> {
        let tp = self.tensor_parallel.as_ref();
        let mut local = 0.0;
        for (name, p) in self.groups.iter().flat_map(|g| g.params.iter()) {
            let in_tp = tp.is_none_or(|tp| tp.group.rank() == 0 || tp.splits.contains_key(name));
            let in_pp = self.pipeline.as_ref().is_none_or(|pp| pp.counts_in_norm(name));
            if in_tp && in_pp {
                let n = grad_norm(std::slice::from_ref(p))?;
                local += n * n;
            }
        }
        if self.zero().is_some() {
            local = self.sum_over_ranks(vec![local])?[0];
        }
        let groups = [tp.map(|tp| &tp.group), self.pipeline.as_ref().map(|p| p.group())];
        for g in groups.into_iter().flatten() {
            let t = Tensor::from_vec(vec![local], &[1])?;
            g.all_reduce(&t, ReduceOp::Sum)?.wait()?;
            local = t.to_vec::<f64>()?[0];
        }
        Ok(local.sqrt())
    }

    /// Collective (every rank of the job): the model's whole parameters by name (ZeRO stage 3
    /// gathered, each taken from the pipeline stage that trains it, tensor-parallel parts put
    /// together).
    pub fn whole_parameters(&self) -> Result<Vec<(String, Tensor)>> {
        self.gather_parameters()?;
        self.model
            .parameters()
            .into_iter()
            .map(|(name, p)| {
                // the stage that trains it has its value
                let p = match &self.pipeline {
                    Some(pp) => {
                        let t = p.detach().contiguous_copy()?;
                        pp.group().broadcast(&t, pp.owner(&name)?)?.wait()?;
                        t
                    }
                    None => p,
                };
                let whole = self.whole_of(&name, p)?;
                Ok((name, whole))
            })
            .collect()
    }

    /// Collective over the tensor-parallel group: the whole of `t`, this rank's part of
    /// parameter `param` (or of a tensor of its shape, such as a moment); `t` itself when the
    /// parameter is not cut, or `t` is a scalar (a step count).
    fn whole_of(&self, param: &str, t: Tensor) -> Result<Tensor> {
        match &self.tensor_parallel {
            Some(tp) if t.rank() > 0 => match tp.splits.get(param) {
                Some(split) => Ok(weft_dist::tensor_parallel::gather_whole(&tp.group, split, &t)?),
                None => Ok(t),
            },
            _ => Ok(t),
        }
    }

    /// Reads checkpoint folder `dir` (whatever layout wrote it) for this rank only; see
    /// [`read_own_tensors`]. With `check_every_piece`, every piece it reads from is checked whole
    /// against its checksum, even where it needs only some of its rows. Without `optimizer`, the
    /// optimizer's state is left unread (empty).
    pub(super) fn read_own(&self, dir: &Path, check_every_piece: bool, optimizer: bool) -> Result<Loaded> {
        let index = checkpoint::read_index(dir)?;
        let mine: BTreeSet<&str> = self.params.iter().map(|(n, _)| n.as_str()).collect();
        let tp = self
            .tensor_parallel
            .as_ref()
            .map(|t| (&t.splits, t.group.rank(), t.group.size()));
        let mut files = Files::new(dir);
        if check_every_piece {
            files = files.checking_every_piece();
        }
        let params = read_own_tensors(&mut files, &index.model, false, &mine, tp)?;
        let optimizer = match optimizer {
            true => read_own_tensors(&mut files, &index.optimizer, true, &mine, tp)?,
            false => Default::default(),
        };
        Ok(Loaded {
            state: index.state,
            params,
            optimizer,
        })
    }
}

/// How a rank's tensor-parallel group cuts parameters: the splits by parameter name, this
/// rank and the group's size.
pub(super) type TpCut<'a> = (&'a BTreeMap<String, Split>, usize, usize);

/// The tensors of `records` a rank needs, read from `files` (the checkpoint's pieces):
/// - only those of parameters in `mine` (a pipeline stage's; with `by_param`, `records` are
///   optimizer state keyed `"{param}.{field}"`);
/// - of a parameter cut across the tensor-parallel group (`tp`), this rank's part, padding
///   included: on dim 0 read from only the bytes of the pieces holding its rows, on another dim
///   (a rank needs some of every row) cut from the whole tensor;
/// - every other tensor whole (under ZeRO the parameters are whole on every rank, and the
///   optimizer state is cut by [`crate::zero`] after reading).
///
/// A tensor whose recorded length along its cut is not the parameter's is returned whole, for
/// loading to name the mismatch.
pub(super) fn read_own_tensors(
    files: &mut Files,
    records: &BTreeMap<String, TensorRecord>,
    by_param: bool,
    mine: &BTreeSet<&str>,
    tp: Option<TpCut>,
) -> Result<BTreeMap<String, Tensor>> {
    let mut out = BTreeMap::new();
    for (name, rec) in records {
        let param = if by_param { param_of(name) } else { name.as_str() };
        if !mine.contains(param) {
            continue;
        }
        let cut = tp.and_then(|(splits, rank, size)| splits.get(param).map(|s| (s, rank, size)));
        let t = match cut.filter(|(s, _, _)| rec.shape.get(s.dim) == Some(&s.len)) {
            Some((split, rank, size)) if split.dim == 0 => part_rows(files, name, rec, split, rank, size)?,
            Some((split, rank, size)) => split.shard(&files.assemble_one(name, rec)?, rank, size)?,
            None => files.assemble_one(name, rec)?,
        };
        out.insert(name.clone(), t);
    }
    Ok(out)
}

/// Part `rank` of `size` of tensor `name` cut on dim 0 by `split` ([`Split::shard`]'s cut),
/// read row by row from the checkpoint's pieces.
fn part_rows(
    files: &mut Files,
    name: &str,
    rec: &TensorRecord,
    split: &Split,
    rank: usize,
    size: usize,
) -> Result<Tensor> {
    let part = split.part(size);
    let mut pieces = Vec::with_capacity(split.blocks);
    for b in 0..split.blocks {
        let held = split.held(b, rank, size);
        let pad = part - held.len();
        let rows = files.assemble_rows(name, rec, held)?;
        let piece = if pad > 0 {
            let mut shape = rec.shape.clone();
            shape[0] = pad;
            let zeros = Tensor::zeros(&shape, rows.dtype())?;
            Tensor::cat(&[&rows, &zeros], 0)?
        } else {
            rows
        };
        pieces.push(piece);
    }
    let refs: Vec<&Tensor> = pieces.iter().collect();
    Ok(Tensor::cat(&refs, 0)?.contiguous_copy()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{merge, write_pieces, Piece, TpPart};

    fn seq(n: usize, shape: &[usize]) -> Tensor {
        Tensor::from_vec((0..n).map(|v| v as f32).collect::<Vec<_>>(), shape).unwrap()
    }

    fn whole(name: &str, t: &Tensor) -> Piece {
        Piece {
            name: name.into(),
            shape: t.shape().to_vec(),
            tp: None,
            offset: 0,
            tensor: t.clone(),
        }
    }

    fn folder(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("weft-own-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn file_bytes(dir: &Path) -> u64 {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    }

    #[test]
    fn a_pipeline_stage_reads_its_own_tensors_only() {
        let dir = folder("stage");
        // a 2-stage checkpoint: each stage wrote its parameters and their moments
        let (a, b, c, d) = (seq(64, &[16, 4]), seq(8, &[8]), seq(64, &[16, 4]), seq(8, &[8]));
        let mut model = BTreeMap::new();
        let mut optim = BTreeMap::new();
        for (stage, names) in [(0, [("a", &a), ("b", &b)]), (1, [("c", &c), ("d", &d)])] {
            let mut pieces: Vec<Piece> = names.iter().map(|(n, t)| whole(n, t)).collect();
            let moments: Vec<Piece> = names.iter().map(|(n, t)| whole(&format!("{n}.exp_avg"), t)).collect();
            pieces.extend(moments.clone());
            let recs = write_pieces(&dir.join(format!("stage{stage}.safetensors")), &pieces).unwrap();
            for (k, r) in recs {
                let into = if k.contains('.') { &mut optim } else { &mut model };
                merge(into, BTreeMap::from([(k, r)])).unwrap();
            }
        }
        let mine = BTreeSet::from(["c", "d"]);
        let mut files = Files::new(&dir);
        let params = read_own_tensors(&mut files, &model, false, &mine, None).unwrap();
        let state = read_own_tensors(&mut files, &optim, true, &mine, None).unwrap();
        assert_eq!(params.keys().collect::<Vec<_>>(), ["c", "d"]);
        assert_eq!(state.keys().collect::<Vec<_>>(), ["c.exp_avg", "d.exp_avg"]);
        assert_eq!(params["c"].to_vec::<f32>().unwrap(), c.to_vec::<f32>().unwrap());
        // stage 1's tensor bytes only: under half of the checkpoint's files
        let own = 2 * (64 + 8) * 4;
        assert_eq!(files.bytes_read(), own);
        assert!(2 * files.bytes_read() < file_bytes(&dir), "{}", file_bytes(&dir));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Writes `w` cut on dim 0 for `ranks` tensor-parallel ranks, each part in `runs` ZeRO
    /// runs of elements, one file per piece; returns the model records.
    fn write_cut(dir: &Path, w: &Tensor, split: &Split, ranks: usize, runs: usize) -> BTreeMap<String, TensorRecord> {
        let mut all = BTreeMap::new();
        for r in 0..ranks {
            let part = split.shard(w, r, ranks).unwrap().reshape(&[-1]).unwrap();
            let n = part.numel();
            let step = n.div_ceil(runs);
            for (i, lo) in (0..n).step_by(step).enumerate() {
                let len = step.min(n - lo);
                let piece = Piece {
                    name: "w".into(),
                    shape: w.shape().to_vec(),
                    tp: Some(TpPart {
                        dim: split.dim,
                        blocks: split.blocks,
                        rank: r,
                        ranks,
                    }),
                    offset: lo,
                    tensor: part.narrow(0, lo, len).unwrap().contiguous_copy().unwrap(),
                };
                let recs = write_pieces(&dir.join(format!("r{r}-{i}.safetensors")), &[piece]).unwrap();
                merge(&mut all, recs).unwrap();
            }
        }
        all
    }

    #[test]
    fn a_tensor_parallel_rank_reads_only_the_rows_of_its_part() {
        let mine = BTreeSet::from(["w"]);
        // 10 rows of 4, fused as 2 blocks of 5 (as q,k,v are 3): written by 2 tensor-parallel
        // ranks of 2 ZeRO runs each, read by 3 ranks (parts of 2 rows per block, the last one
        // padding)
        let w = seq(40, &[10, 4]);
        let dir = folder("tp");
        let written = Split {
            dim: 0,
            blocks: 2,
            len: 10,
        };
        let records = write_cut(&dir, &w, &written, 2, 2);
        for rank in 0..3 {
            let splits = BTreeMap::from([("w".to_string(), written.clone())]);
            let mut files = Files::new(&dir);
            let got = read_own_tensors(&mut files, &records, false, &mine, Some((&splits, rank, 3))).unwrap();
            let want = written.shard(&w, rank, 3).unwrap();
            assert_eq!(got["w"].shape(), want.shape(), "rank {rank}");
            assert_eq!(
                got["w"].to_vec::<f32>().unwrap(),
                want.to_vec::<f32>().unwrap(),
                "rank {rank}"
            );
            // the rows of its part that hold data: 2 + 2 for ranks 0 and 1, 1 + 1 for rank 2
            let rows = if rank < 2 { 4 } else { 2 };
            assert_eq!(files.bytes_read(), rows * 4 * 4, "rank {rank}");
        }
        let _ = std::fs::remove_dir_all(&dir);

        // written cut on dim 1 (every part holds some of every row), read cut on dim 0
        let dir = folder("tp-cols");
        let cols = Split {
            dim: 1,
            blocks: 1,
            len: 4,
        };
        let records = write_cut(&dir, &w, &cols, 2, 3);
        let rows = Split {
            dim: 0,
            blocks: 1,
            len: 10,
        };
        let splits = BTreeMap::from([("w".to_string(), rows.clone())]);
        let mut files = Files::new(&dir);
        let got = read_own_tensors(&mut files, &records, false, &mine, Some((&splits, 1, 2))).unwrap();
        assert_eq!(
            got["w"].to_vec::<f32>().unwrap(),
            rows.shard(&w, 1, 2).unwrap().to_vec::<f32>().unwrap()
        );
        assert_eq!(files.bytes_read(), 5 * 4 * 4);
        // a rank whose cut is on dim 1 reads the whole tensor and returns its part
        let splits = BTreeMap::from([("w".to_string(), cols.clone())]);
        let mut files = Files::new(&dir);
        let got = read_own_tensors(&mut files, &records, false, &mine, Some((&splits, 1, 2))).unwrap();
        assert_eq!(
            got["w"].to_vec::<f32>().unwrap(),
            cols.shard(&w, 1, 2).unwrap().to_vec::<f32>().unwrap()
        );
        assert_eq!(files.bytes_read(), 10 * 4 * 4);
        // a part as long as the whole (blocks of one entry, padded for 2 ranks) is still cut
        // once: the decision reads the checkpoint's recorded shape, not the tensor's
        let single = Split {
            dim: 0,
            blocks: 10,
            len: 10,
        };
        let splits = BTreeMap::from([("w".to_string(), single.clone())]);
        let mut files = Files::new(&dir);
        let got = read_own_tensors(&mut files, &records, false, &mine, Some((&splits, 1, 2))).unwrap();
        assert_eq!(
            got["w"].to_vec::<f32>().unwrap(),
            single.shard(&w, 1, 2).unwrap().to_vec::<f32>().unwrap()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
