//! Sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large
//! Transformer Models", 2022, section 4.2.2): outside the tensor-parallel regions (norms,
//! residual adds, the stream between blocks), each rank of a tensor-parallel group holds only
//! `1 / n` of the tokens of the activations `[B, T, C]`, so their memory is cut by `n` too.
//!
//! The two conjugate operators of [`crate::parallel`] change accordingly:
//! - in front of a column-parallel layer, `f` becomes an all-gather of the tokens
//!   ([`gather_sequence`]; its backward reduce-scatters the gradient);
//! - after a row-parallel layer, `g` becomes a reduce-scatter ([`reduce_scatter_sequence`]; its
//!   backward all-gathers).
//!
//! Together they move the bytes of one all-reduce, as `f` and `g` did. Where the stream enters
//! the region (after the embedding) [`split_sequence`] keeps this rank's tokens of a whole
//! tensor (its backward all-gathers). A parameter whole on every rank but applied to a rank's
//! tokens only (norm weights, a row-parallel bias) gets part of its gradient on each rank:
//! [`whole_gradient`] sums it over the group, in the backward of every pass, or, where the
//! group defers it ([`DeferredSums`]), once a step over the step's summed gradient, as
//! Megatron-LM does (`finalize_model_grads`): one all-reduce a step instead of one per
//! parameter and micro-batch.
//!
//! What a rank holds: part `r` of `n` of the micro-batch's `B x T` tokens in memory order, seen
//! as `[B, T / n, C]` (for `B = 1`, positions `[r T / n, (r + 1) T / n)`). Between the regions
//! every op works token by token (norms, residual additions), so which tokens a rank holds does
//! not matter, only that every op of the stream agrees; parts in memory order make each gather
//! and reduce-scatter one collective on contiguous memory, with no reordering copy (weft's
//! activations are `[B, T, C]`, Megatron-LM's `[T, B, C]`, whose sequence parts are contiguous
//! already). `T` must divide by `n`. [`column_input`] and [`row_output`] pick the operator a
//! group's mode asks for.

use std::sync::{Arc, Mutex};

use weft_core::{BackwardReads, Function, Result, Tensor};

use crate::parallel::{copy_to_group, invalid, reduce_from_group, TpGroup};

/// `f` of a column-parallel layer on `x`: [`gather_sequence`] when `group` runs
/// sequence-parallel, [`copy_to_group`] otherwise.
/// # Shapes
/// `[B, T / n, ...]` -> `[B, T, ...]` (sequence-parallel); unchanged otherwise.
pub fn column_input(x: &Tensor, group: &TpGroup) -> Result<Tensor> {
    if group.sequence_parallel() {
        gather_sequence(x, group)
    } else {
        copy_to_group(x, group)
    }
}

/// `g` of a row-parallel layer's partial sums `x`: [`reduce_scatter_sequence`] when `group`
/// runs sequence-parallel, [`reduce_from_group`] otherwise.
/// # Shapes
/// `[B, T, ...]` -> `[B, T / n, ...]` (sequence-parallel); unchanged otherwise.
pub fn row_output(x: &Tensor, group: &TpGroup) -> Result<Tensor> {
    if group.sequence_parallel() {
        reduce_scatter_sequence(x, group)
    } else {
        reduce_from_group(x, group)
    }
}

/// Every rank's part of `x`, in rank order: the forward all-gathers, the backward
/// reduce-scatters (each rank's part of the gradient, summed over the group).
/// # Shapes
/// `[B, T / n, ...]` -> `[B, T, ...]`.
pub fn gather_sequence(x: &Tensor, group: &TpGroup) -> Result<Tensor> {
    Tensor::apply_function(Arc::new(GatherSequence(group.clone())), &[x])
}

/// This rank's part of the sum over the group of `x`: the forward reduce-scatters, the
/// backward all-gathers.
/// # Shapes
/// `[B, T, ...]` -> `[B, T / n, ...]`.
pub fn reduce_scatter_sequence(x: &Tensor, group: &TpGroup) -> Result<Tensor> {
    Tensor::apply_function(Arc::new(ReduceScatterSequence(group.clone())), &[x])
}

/// This rank's part of `x`, whole (and equal) on every rank: the forward keeps it, the backward
/// all-gathers the gradient (whole again on every rank).
/// # Shapes
/// `[B, T, ...]` -> `[B, T / n, ...]`.
pub fn split_sequence(x: &Tensor, group: &TpGroup) -> Result<Tensor> {
    Tensor::apply_function(Arc::new(SplitSequence(group.clone())), &[x])
}

/// `p` unchanged forward; its gradient summed over the group backward (Megatron's `f`). For a
/// parameter whole on every rank that a rank applies to its part of the work only (its tokens
/// under sequence parallelism, its heads for a per-head norm). Where the group defers these
/// sums ([`crate::parallel::TensorParallelGroup::deferred_sums`]), `p` itself, recorded there:
/// whoever runs the step sums its gradient once ([`DeferredSums::sum`]).
pub fn whole_gradient(p: &Tensor, group: &TpGroup) -> Result<Tensor> {
    match group.deferred_sums() {
        Some(d) => {
            d.record(p);
            Ok(p.clone())
        }
        None => copy_to_group(p, group),
    }
}

/// The parameters whose gradients [`whole_gradient`] left to sum over a tensor-parallel group,
/// in the order the forward first used them (the same on every rank of the group, which runs
/// the same layers). For a trainer whose gradients stay whole on each rank until the update
/// (no ZeRO sharding): it calls [`DeferredSums::sum`] once the step's backward passes and the
/// data-parallel reduction are done; summing over the group and averaging over the replicas
/// commute.
#[derive(Default)]
pub struct DeferredSums {
    params: Mutex<Vec<Tensor>>,
}

impl DeferredSums {
    /// Adds `p` unless it is there already.
    pub fn record(&self, p: &Tensor) {
        let mut params = self.params.lock().unwrap_or_else(|e| e.into_inner());
        if !params.iter().any(|q| q.same_storage(p)) {
            params.push(p.clone());
        }
    }

    /// How many parameters are recorded.
    pub fn len(&self) -> usize {
        self.params.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces each recorded parameter's gradient with its sum over the group, all of them
    /// (those that have one) in one flat buffer per dtype: `all_reduce` sums a contiguous
    /// tensor over the group in place. Returns the number of collectives run.
    pub fn sum(&self, all_reduce: &dyn Fn(&Tensor) -> Result<()>) -> Result<usize> {
        let grads: Vec<Tensor> = {
            let params = self.params.lock().unwrap_or_else(|e| e.into_inner());
            params.iter().filter_map(|p| p.grad()).collect()
        };
        // in the order first met, the same on every rank
        let mut dtypes = Vec::new();
        for g in &grads {
            if !dtypes.contains(&g.dtype()) {
                dtypes.push(g.dtype());
            }
        }
        for &dtype in &dtypes {
            let mine: Vec<&Tensor> = grads.iter().filter(|g| g.dtype() == dtype).collect();
            let flat: Vec<Tensor> = mine.iter().map(|g| g.reshape(&[-1])).collect::<Result<_>>()?;
            // a buffer of its own: `cat` of one tensor is that tensor, and the copies back below
            // must not read and write one storage
            let flat = Tensor::cat(&flat.iter().collect::<Vec<_>>(), 0)?.contiguous_copy()?;
            all_reduce(&flat)?;
            let mut at = 0;
            for g in mine {
                let n = g.numel();
                g.copy_from(&flat.narrow(0, at, n)?.view(g.shape())?)?;
                at += n;
            }
        }
        Ok(dtypes.len())
    }
}

/// Checks that `x` has a sequence dim (1) whose length divides by `n` (what a cut into `n`
/// parts needs; `n = 1` for a gather), naming `what` otherwise.
fn check_tokens(x: &Tensor, n: usize, what: &str) -> Result<()> {
    match x.shape().get(1) {
        Some(t) if t.is_multiple_of(n) => Ok(()),
        _ => Err(invalid(format!(
            "sequence parallelism: {what} of shape {:?} has no sequence length (dim 1) that divides by \
             parallel.tp = {n}",
            x.shape()
        ))),
    }
}

/// `shape` with its sequence dim (1) multiplied by `num` and divided by `den`.
fn scaled(shape: &[usize], num: usize, den: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    s[1] = s[1] * num / den;
    s
}

/// All-gather of each rank's part `x` `[B, P, ...]` into `[B, n P, ...]`: the parts side by
/// side in memory order, in rank order.
fn all_gather_tokens(x: &Tensor, group: &TpGroup, what: &str) -> Result<Tensor> {
    let n = group.size();
    check_tokens(x, 1, what)?;
    let local = x.contiguous()?;
    let whole = Tensor::zeros_on(&scaled(local.shape(), n, 1), local.dtype(), local.device())?;
    group.all_gather(&whole, &local)?;
    Ok(whole)
}

/// Reduce-scatter of partial sums `x` `[B, n P, ...]`: this rank's part `[B, P, ...]` of the
/// sum (part `r` of `n` of its elements in memory order).
fn reduce_scatter_tokens(x: &Tensor, group: &TpGroup, what: &str) -> Result<Tensor> {
    let n = group.size();
    check_tokens(x, n, what)?;
    let out = Tensor::zeros_on(&scaled(x.shape(), 1, n), x.dtype(), x.device())?;
    group.reduce_scatter(&out, &x.contiguous()?)?;
    Ok(out)
}

struct GatherSequence(TpGroup);

impl Function for GatherSequence {
    fn name(&self) -> &'static str {
        "gather_sequence"
    }
    fn backward_reads(&self) -> BackwardReads {
        BackwardReads::NOTHING
    }
    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        all_gather_tokens(inputs[0], &self.0, "the activations")
    }
    fn backward(&self, _inputs: &[Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(reduce_scatter_tokens(grad, &self.0, "the gradient")?)])
    }
}

struct ReduceScatterSequence(TpGroup);

impl Function for ReduceScatterSequence {
    fn name(&self) -> &'static str {
        "reduce_scatter_sequence"
    }
    fn backward_reads(&self) -> BackwardReads {
        BackwardReads::NOTHING
    }
    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        reduce_scatter_tokens(inputs[0], &self.0, "the activations")
    }
    fn backward(&self, _inputs: &[Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(all_gather_tokens(grad, &self.0, "the gradient")?)])
    }
}

struct SplitSequence(TpGroup);

impl Function for SplitSequence {
    fn name(&self) -> &'static str {
        "split_sequence"
    }
    fn backward_reads(&self) -> BackwardReads {
        BackwardReads::NOTHING
    }
    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let (x, n) = (inputs[0], self.0.size());
        check_tokens(x, n, "the activations")?;
        let len = x.numel() / n;
        x.contiguous()?
            .reshape(&[-1])?
            .narrow(0, self.0.rank() * len, len)?
            .contiguous_copy()?
            .view(&scaled(x.shape(), 1, n))
    }
    fn backward(&self, _inputs: &[Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(all_gather_tokens(grad, &self.0, "the gradient")?)])
    }
}

/// The sequence-parallel group a layer whole on every rank runs in: its parameters' gradients
/// are summed over it ([`whole_gradient`]), each rank having seen only its part of the tokens.
#[derive(Clone)]
pub struct SequenceGroup(pub TpGroup);

impl std::fmt::Debug for SequenceGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SequenceGroup({} ranks)", self.0.size())
    }
}

impl SequenceGroup {
    /// `group` when it runs sequence-parallel; `None` otherwise (nothing to sum).
    pub fn of(group: &TpGroup) -> Option<SequenceGroup> {
        group.sequence_parallel().then(|| SequenceGroup(group.clone()))
    }

    /// `p`, its gradient summed over the group ([`whole_gradient`]); `p` itself without a group.
    pub fn param(group: Option<&SequenceGroup>, p: &Tensor) -> Result<Tensor> {
        match group {
            Some(g) => whole_gradient(p, &g.0),
            None => Ok(p.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::parallel::{GroupReduce, TensorParallelGroup};

    /// Rank 0 of 2 whose peer holds the same gradients: an all-reduce doubles, and is counted.
    struct Doubling {
        calls: AtomicUsize,
        deferred: Option<DeferredSums>,
    }

    impl TensorParallelGroup for Doubling {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            2
        }
        fn all_reduce(&self, t: &Tensor, op: GroupReduce) -> Result<()> {
            assert_eq!(op, GroupReduce::Sum);
            self.calls.fetch_add(1, Ordering::SeqCst);
            t.copy_from(&t.mul_scalar(2.0)?)
        }
        fn all_gather(&self, _output: &Tensor, _input: &Tensor) -> Result<()> {
            unreachable!("not used here")
        }
        fn deferred_sums(&self) -> Option<&DeferredSums> {
            self.deferred.as_ref()
        }
    }

    /// Two micro-batches' backward passes through a norm weight and a bias whole on every
    /// rank: their gradients, and the collectives that made them.
    fn two_passes(deferred: bool) -> (Vec<f32>, Vec<f32>, usize, usize) {
        let group: Arc<Doubling> = Arc::new(Doubling {
            calls: AtomicUsize::new(0),
            deferred: deferred.then(DeferredSums::default),
        });
        let tp: TpGroup = group.clone();
        let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])
            .unwrap()
            .requires_grad_()
            .unwrap();
        let b = Tensor::from_vec(vec![0.5f32, -1.0, 0.25], &[3])
            .unwrap()
            .requires_grad_()
            .unwrap();
        for seed in [1.0f32, -3.0] {
            let x = Tensor::from_vec(vec![seed, 2.0 * seed, 0.5, -1.0, 4.0, seed * seed], &[2, 3]).unwrap();
            let y = x.layer_norm(
                Some(&whole_gradient(&w, &tp).unwrap()),
                Some(&whole_gradient(&b, &tp).unwrap()),
                1e-5,
            );
            y.unwrap().mul(&x).unwrap().sum_all().unwrap().backward().unwrap();
        }
        let during = group.calls.load(Ordering::SeqCst);
        if let Some(d) = &group.deferred {
            assert_eq!(d.len(), 2, "each parameter recorded once");
            let all_reduce = |t: &Tensor| group.all_reduce(t, GroupReduce::Sum);
            assert_eq!(d.sum(&all_reduce).unwrap(), 1, "one flat buffer");
        }
        let after = group.calls.load(Ordering::SeqCst) - during;
        let grad = |p: &Tensor| p.grad().unwrap().to_vec::<f32>().unwrap();
        (grad(&w), grad(&b), during, after)
    }

    #[test]
    fn deferred_whole_gradients_are_summed_once_a_step_to_what_every_pass_summing_gives() {
        let (w_each, b_each, during_each, after_each) = two_passes(false);
        // a sum in each backward pass: one per parameter and pass
        assert_eq!((during_each, after_each), (4, 0));
        let (w_once, b_once, during_once, after_once) = two_passes(true);
        // deferred: none in the passes, one for the step
        assert_eq!((during_once, after_once), (0, 1));
        assert_eq!((w_once, b_once), (w_each, b_each));
    }
}
