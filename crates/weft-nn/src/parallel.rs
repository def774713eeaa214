//! Tensor parallelism (Megatron-LM: Shoeybi et al., "Megatron-LM: Training Multi-Billion
//! Parameter Language Models Using Model Parallelism", 2019): layers whose weights are cut
//! across the ranks of a group, and the two conjugate operators that join them.
//!
//! - `f` ([`copy_to_group`]): the identity forward; backward sums the gradient over the group.
//!   It goes in front of a column-parallel layer (each rank computes some output features from
//!   the whole input).
//! - `g` ([`reduce_from_group`]): sums over the group forward; the identity backward. It follows
//!   a row-parallel layer (each rank holds some input features and computes a partial sum).
//!
//! The layers (`Linear` in its column and row modes, `Embedding` over a slice of the vocabulary,
//! [`vocab_parallel_cross_entropy`]) talk to the group through the [`TensorParallelGroup`]
//! trait, which `weft-dist` implements over a process group. A [`Split`] says how a parameter
//! was cut, so that checkpoints can cut whole tensors and put the pieces back together.

use std::sync::{Arc, Mutex};

use weft_core::{BackwardReads, DType, Error, Function, Result, Tensor};

/// A reduction over the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupReduce {
    Sum,
    Max,
}

/// The ranks a tensor-parallel layer is cut across.
pub trait TensorParallelGroup: Send + Sync {
    /// This rank's index in the group.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// Reduces the contiguous `t` in place over the group; returns when done.
    fn all_reduce(&self, t: &Tensor, op: GroupReduce) -> Result<()>;
    /// `output` (contiguous, `size` times `input`'s elements) receives every rank's `input`, in
    /// rank order.
    fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<()>;
    /// `output` (contiguous) receives the sum over the group of part `rank` of every rank's
    /// `input` (contiguous, `size` times `output`'s elements, parts in rank order). Groups that
    /// cannot (test stand-ins) say so.
    fn reduce_scatter(&self, output: &Tensor, input: &Tensor) -> Result<()> {
        let _ = (output, input);
        Err(invalid("this group cannot reduce-scatter".into()))
    }
    /// Whether the layers cut across this group run sequence-parallel (Korthikanti et al.,
    /// "Reducing Activation Recomputation in Large Transformer Models", 2022): between the
    /// tensor-parallel regions each rank holds `1 / size` of the activations' tokens, `f`
    /// gathers them and `g` reduce-scatters ([`crate::sequence_parallel`]).
    fn sequence_parallel(&self) -> bool {
        false
    }
    /// Where the gradients of parameters whole on every rank are left to be summed once a step
    /// ([`crate::sequence_parallel::whole_gradient`]); `None` (the default): each backward
    /// pass sums them.
    fn deferred_sums(&self) -> Option<&crate::sequence_parallel::DeferredSums> {
        None
    }
}

/// A shared handle to a group.
pub type TpGroup = Arc<dyn TensorParallelGroup>;

/// How a parameter is cut: along `dim`, the whole tensor (of `len` entries there) is seen as
/// `blocks` equal blocks (3 for a fused q,k,v projection), each padded with zeros to a multiple
/// of the group size and cut into equal parts; rank `r` holds part `r` of every block, blocks
/// in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub dim: usize,
    pub blocks: usize,
    /// Entries of the whole tensor along `dim`.
    pub len: usize,
}

impl Split {
    /// Entries along `dim` each rank holds per block.
    pub fn part(&self, size: usize) -> usize {
        (self.len / self.blocks).div_ceil(size)
    }

    /// The entries along `dim` of block `b` of the whole tensor that rank `rank` of `size` holds
    /// (its part of the block before padding; empty for a rank entirely in the padding).
    pub fn held(&self, b: usize, rank: usize, size: usize) -> std::ops::Range<usize> {
        let (block, part) = (self.len / self.blocks, self.part(size));
        let end = (b * block + (rank + 1) * part).min((b + 1) * block);
        (b * block + rank * part).min(end)..end
    }

    /// This rank's part of `whole` (whose `dim` has `len` entries).
    pub fn shard(&self, whole: &Tensor, rank: usize, size: usize) -> Result<Tensor> {
        let shape = whole.shape();
        if shape.get(self.dim) != Some(&self.len) || !self.len.is_multiple_of(self.blocks) {
            return Err(invalid(format!(
                "cannot cut a tensor of shape {shape:?} into {} blocks along dim {} of {} entries",
                self.blocks, self.dim, self.len
            )));
        }
        let part = self.part(size);
        let dim = self.dim as isize;
        let mut pieces = Vec::with_capacity(self.blocks);
        for b in 0..self.blocks {
            let std::ops::Range { start, end } = self.held(b, rank, size);
            let mut pad_shape = shape.to_vec();
            pad_shape[self.dim] = part - (end - start);
            let mut piece = if end > start {
                whole.narrow(dim, start, end - start)?.contiguous_copy()?
            } else {
                Tensor::zeros(&pad_shape, whole.dtype())?
            };
            if end > start && pad_shape[self.dim] > 0 {
                piece = Tensor::cat(&[&piece, &Tensor::zeros(&pad_shape, whole.dtype())?], dim)?;
            }
            pieces.push(piece);
        }
        let refs: Vec<&Tensor> = pieces.iter().collect();
        Tensor::cat(&refs, dim)?.contiguous_copy()
    }

    /// The whole tensor from every rank's part (`parts[r]` is rank `r`'s), padding dropped.
    pub fn unshard(&self, parts: &[Tensor]) -> Result<Tensor> {
        let size = parts.len();
        let part = self.part(size);
        let block = self.len / self.blocks;
        let dim = self.dim as isize;
        let mut pieces = Vec::with_capacity(self.blocks * size);
        for b in 0..self.blocks {
            for p in parts {
                pieces.push(p.narrow(dim, b * part, part)?);
            }
        }
        let refs: Vec<&Tensor> = pieces.iter().collect();
        let padded_blocks = Tensor::cat(&refs, dim)?;
        let mut kept = Vec::with_capacity(self.blocks);
        for b in 0..self.blocks {
            kept.push(padded_blocks.narrow(dim, b * part * size, block)?);
        }
        let refs: Vec<&Tensor> = kept.iter().collect();
        Tensor::cat(&refs, dim)?.contiguous_copy()
    }
}

/// This rank's part of parameter `p`, as a new leaf that requires grad.
pub(crate) fn shard_param(p: &Tensor, split: &Split, group: &TpGroup) -> Result<Tensor> {
    split.shard(&p.detach(), group.rank(), group.size())?.requires_grad_()
}

pub(crate) fn invalid(msg: String) -> Error {
    Error::Invalid {
        op: "tensor parallel",
        msg,
    }
}

/// Megatron's `f`: `x` forward; the gradient summed over the group backward.
pub fn copy_to_group(x: &Tensor, group: &TpGroup) -> Result<Tensor> {
    Tensor::apply_function(Arc::new(CopyToGroup(group.clone())), &[x])
}

/// Megatron's `g`: `x` summed over the group forward; the gradient unchanged backward.
pub fn reduce_from_group(x: &Tensor, group: &TpGroup) -> Result<Tensor> {
    Tensor::apply_function(Arc::new(ReduceFromGroup(group.clone())), &[x])
}

struct CopyToGroup(TpGroup);

impl Function for CopyToGroup {
    fn name(&self) -> &'static str {
        "copy_to_tensor_parallel_group"
    }
    fn backward_reads(&self) -> BackwardReads {
        BackwardReads::NOTHING
    }
    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        Ok(inputs[0].clone())
    }
    fn backward(&self, _inputs: &[Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let g = grad.contiguous_copy()?;
        self.0.all_reduce(&g, GroupReduce::Sum)?;
        Ok(vec![Some(g)])
    }
}

struct ReduceFromGroup(TpGroup);

impl Function for ReduceFromGroup {
    fn name(&self) -> &'static str {
        "reduce_from_tensor_parallel_group"
    }
    fn backward_reads(&self) -> BackwardReads {
        BackwardReads::NOTHING
    }
    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let out = inputs[0].contiguous_copy()?;
        self.0.all_reduce(&out, GroupReduce::Sum)?;
        Ok(out)
    }
    fn backward(&self, _inputs: &[Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(grad.clone())])
    }
}

/// Rows `[start, start + rows)` of a vocabulary of `vocab` entries: what one rank of a
/// vocab-parallel embedding and output layer holds (the last rank's part may run past `vocab`:
/// padding, which never takes part in a loss).
#[derive(Clone)]
pub struct VocabShard {
    pub group: TpGroup,
    pub start: usize,
    /// Rows this rank holds (the padded part size).
    pub rows: usize,
    /// The real vocabulary size.
    pub vocab: usize,
}

impl std::fmt::Debug for VocabShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "VocabShard(rows {}..{} of {})",
            self.start,
            self.start + self.rows,
            self.vocab
        )
    }
}

impl VocabShard {
    /// The part of a `vocab`-row table rank `group.rank()` holds.
    pub fn new(group: TpGroup, vocab: usize) -> VocabShard {
        let rows = vocab.div_ceil(group.size());
        VocabShard {
            start: group.rank() * rows,
            rows,
            vocab,
            group,
        }
    }

    /// The split of the table (dim 0).
    pub fn split(&self) -> Split {
        Split {
            dim: 0,
            blocks: 1,
            len: self.vocab,
        }
    }

    /// Embedding lookup of I64 `ids` `[...]` in this rank's rows `weight` `[rows, dim]`: rows
    /// of other ranks give zeros here, and the sum over the group is the whole lookup.
    /// Returns `[..., dim]`. Ids outside the vocabulary are an error naming the id.
    pub fn embedding(&self, weight: &Tensor, ids: &Tensor) -> Result<Tensor> {
        let all = ids.to_vec::<i64>()?;
        let mut local = Vec::with_capacity(all.len());
        let mut mask = Vec::with_capacity(all.len());
        for (pos, &id) in all.iter().enumerate() {
            if id < 0 || id as usize >= self.vocab {
                return Err(invalid(format!(
                    "token id {id} at flat position {pos} is outside the vocabulary (vocab_size = {})",
                    self.vocab
                )));
            }
            let mine = (self.start..self.start + self.rows).contains(&(id as usize));
            local.push(if mine { id - self.start as i64 } else { 0 });
            mask.push(if mine { 1.0f32 } else { 0.0 });
        }
        let local = Tensor::from_vec(local, ids.shape())?;
        let mut mask_shape = ids.shape().to_vec();
        mask_shape.push(1);
        let mask = Tensor::from_vec(mask, &mask_shape)?.cast(weight.dtype())?;
        let partial = weight.embedding(&local)?.mul(&mask)?;
        reduce_from_group(&partial, &self.group)
    }

    /// Mean cross-entropy of `logits` `[N, rows]` (this rank's columns of the vocabulary)
    /// against I64 `targets` `[N]` (`ignore_index` rows left out), as `cross_entropy` of the
    /// whole logits would give: maxima, sums of exponentials and target logits are reduced over
    /// the group; padding columns take no part. Differentiable with respect to `logits`.
    ///
    /// Under autocast, as the core `cross_entropy` (an f32 op), bf16 or f16 logits give an f32
    /// loss: the logits are read as they are (no f32 copy is kept for the backward), the sums
    /// are taken in f64, and the gradient returns to the logits in their dtype.
    pub fn cross_entropy(&self, logits: &Tensor, targets: &Tensor, ignore_index: i64) -> Result<Tensor> {
        if logits.rank() != 2 || logits.dim(1)? != self.rows || targets.shape() != [logits.dim(0)?] {
            return Err(invalid(format!(
                "vocab-parallel cross-entropy needs logits [N, {}] and targets [N], got {:?} and {:?}",
                self.rows,
                logits.shape(),
                targets.shape()
            )));
        }
        let loss_dtype = match logits.dtype() {
            DType::BF16 | DType::F16 if weft_core::autocast_dtype().is_some() => DType::F32,
            d => d,
        };
        let f = VocabParallelCrossEntropy {
            shard: self.clone(),
            loss_dtype,
            targets: targets.to_vec::<i64>()?,
            ignore_index,
            saved: Mutex::new(None),
        };
        Tensor::apply_function(Arc::new(f), &[logits])
    }
}

/// The function behind [`VocabShard::cross_entropy`].
struct VocabParallelCrossEntropy {
    shard: VocabShard,
    /// The loss's dtype: f32 for bf16 or f16 logits under autocast (decided when the call is
    /// made, as the core op does), the logits' otherwise.
    loss_dtype: DType,
    targets: Vec<i64>,
    ignore_index: i64,
    /// Per row: the global maximum and the sum of `exp(logit - max)` over the vocabulary.
    saved: Mutex<Option<(Vec<f64>, Vec<f64>)>>,
}

impl VocabParallelCrossEntropy {
    /// Columns of this rank that are real vocabulary entries.
    fn real_columns(&self) -> usize {
        self.shard.vocab.saturating_sub(self.shard.start).min(self.shard.rows)
    }

    /// The target's column on this rank, if it is here (and the row counts).
    fn local_target(&self, row: usize) -> Option<usize> {
        let t = self.targets[row];
        if t == self.ignore_index || t < 0 {
            return None;
        }
        let t = t as usize;
        (self.shard.start..self.shard.start + self.real_columns())
            .contains(&t)
            .then(|| t - self.shard.start)
    }

    fn counted(&self) -> usize {
        self.targets.iter().filter(|&&t| t != self.ignore_index).count()
    }
}

impl Function for VocabParallelCrossEntropy {
    fn name(&self) -> &'static str {
        "vocab_parallel_cross_entropy"
    }

    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        // the logits read as they are into one transient f64 buffer (the backward keeps only
        // the logits themselves, in their dtype)
        let (n, cols) = (inputs[0].dim(0)?, inputs[0].dim(1)?);
        let real = self.real_columns();
        let l = inputs[0].try_to_vec_f64()?;
        let row = |i: usize| &l[i * cols..i * cols + real];
        let group = &self.shard.group;
        let max = Tensor::from_vec(
            (0..n)
                .map(|i| row(i).iter().cloned().fold(f64::NEG_INFINITY, f64::max))
                .collect::<Vec<_>>(),
            &[n],
        )?;
        group.all_reduce(&max, GroupReduce::Max)?;
        let max = max.to_vec::<f64>()?;
        // sums of exponentials and the target logits, reduced together
        let mut both = vec![0.0f64; 2 * n];
        for i in 0..n {
            both[i] = row(i).iter().map(|&x| (x - max[i]).exp()).sum();
            if let Some(t) = self.local_target(i) {
                both[n + i] = row(i)[t];
            }
        }
        let both_t = Tensor::from_vec(both, &[2 * n])?;
        group.all_reduce(&both_t, GroupReduce::Sum)?;
        let both = both_t.to_vec::<f64>()?;
        let mut total = 0.0;
        for i in 0..n {
            if self.targets[i] != self.ignore_index {
                total += both[i].ln() + max[i] - both[n + i];
            }
        }
        let count = self.counted();
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some((max, both[..n].to_vec()));
        let loss = if count == 0 { f64::NAN } else { total / count as f64 };
        Tensor::from_vec(vec![loss], &[])?.cast(self.loss_dtype)
    }

    fn backward(&self, inputs: &[Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (n, cols) = (inputs[0].dim(0)?, inputs[0].dim(1)?);
        let l = inputs[0].try_to_vec_f64()?;
        let saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let (max, sums) = saved
            .as_ref()
            .ok_or_else(|| Error::Autograd("vocab-parallel cross-entropy: backward before forward".into()))?;
        let scale = grad.item()? / self.counted().max(1) as f64;
        let real = self.real_columns();
        let mut out = vec![0.0f64; n * cols];
        for i in 0..n {
            if self.targets[i] == self.ignore_index {
                continue;
            }
            for j in 0..real {
                out[i * cols + j] = (l[i * cols + j] - max[i]).exp() / sums[i] * scale;
            }
            if let Some(t) = self.local_target(i) {
                out[i * cols + t] -= scale;
            }
        }
        Ok(vec![Some(Tensor::from_vec(out, &[n, cols])?.cast(inputs[0].dtype())?)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arange(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), shape).unwrap()
    }

    #[test]
    fn a_split_cuts_each_block_and_puts_the_parts_back() {
        // a fused [3C, C'] projection with C = 4 over 2 ranks: rank r takes rows r*2..r*2+2 of
        // each of q, k and v
        let whole = arange(&[12, 2]);
        let split = Split {
            dim: 0,
            blocks: 3,
            len: 12,
        };
        let parts: Vec<Tensor> = (0..2).map(|r| split.shard(&whole, r, 2).unwrap()).collect();
        let rows = |t: &Tensor| {
            t.to_vec::<f32>()
                .unwrap()
                .chunks(2)
                .map(|c| c[0] as usize / 2)
                .collect::<Vec<_>>()
        };
        assert_eq!(rows(&parts[0]), [0, 1, 4, 5, 8, 9]);
        assert_eq!(rows(&parts[1]), [2, 3, 6, 7, 10, 11]);
        assert_eq!(
            split.unshard(&parts).unwrap().to_vec::<f32>().unwrap(),
            whole.to_vec::<f32>().unwrap()
        );
    }

    #[test]
    fn a_length_that_does_not_divide_is_padded_with_zeros_and_the_padding_dropped() {
        // 5 columns over 3 ranks: 2, 2 and 1 real columns plus one zero column
        let whole = arange(&[2, 5]).add_scalar(1.0).unwrap();
        let split = Split {
            dim: 1,
            blocks: 1,
            len: 5,
        };
        let parts: Vec<Tensor> = (0..3).map(|r| split.shard(&whole, r, 3).unwrap()).collect();
        for p in &parts {
            assert_eq!(p.shape(), [2, 2]);
        }
        assert_eq!(parts[2].to_vec::<f32>().unwrap(), [5.0, 0.0, 10.0, 0.0]);
        assert_eq!(
            split.unshard(&parts).unwrap().to_vec::<f32>().unwrap(),
            whole.to_vec::<f32>().unwrap()
        );
        // 2 entries over 4 ranks: the last two ranks hold only padding
        let small = Split {
            dim: 0,
            blocks: 1,
            len: 2,
        };
        let t = arange(&[2]).add_scalar(1.0).unwrap();
        let parts: Vec<Tensor> = (0..4).map(|r| small.shard(&t, r, 4).unwrap()).collect();
        assert_eq!(parts[3].to_vec::<f32>().unwrap(), [0.0]);
        assert_eq!(small.unshard(&parts).unwrap().to_vec::<f32>().unwrap(), [1.0, 2.0]);
    }

    #[test]
    fn a_tensor_of_the_wrong_size_is_refused() {
        let split = Split {
            dim: 0,
            blocks: 3,
            len: 12,
        };
        let e = split.shard(&arange(&[10, 2]), 0, 2).unwrap_err();
        assert!(e.to_string().contains("[10, 2]"), "{e}");
    }
}
