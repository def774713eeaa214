//! The gradient sums of parameters whole on every tensor-parallel rank (norms under sequence
//! parallelism, a llama's head norms): per pass, or once a step where weft holds gradients
//! whole until the update.

use super::{all_reduce, UnitTimes};
use crate::device::DeviceSpec;
use crate::model::Workload;

/// The gradient sums of the parameters whole on every tensor-parallel rank, as a backward pass
/// makes them where each pass sums them (`weft_nn::sequence_parallel::whole_gradient`), seconds
/// per micro-batch, and the parameters they sum.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WholeGradientSums {
    /// A block's: sequence-parallel, its vector parameters' (norms, row-parallel biases), one
    /// small all-reduce of `C` each; with `qk_norm`, the head norms' two of `hd`.
    pub block: f64,
    /// The final norm's (sequence-parallel).
    pub head: f64,
    /// The parameters summed: a block's, and the last stage's beyond its blocks.
    pub block_params: f64,
    pub head_params: f64,
}

/// [`WholeGradientSums`] of `work`'s model cut over `tp` ranks (`sequence`: sequence-parallel).
pub fn whole_gradient_sums(work: &Workload, device: &DeviceSpec, tp: usize, sequence: bool) -> WholeGradientSums {
    let m = &work.model;
    if tp <= 1 {
        return WholeGradientSums::default();
    }
    let link = device.link(1, tp);
    // one tensor of `C` at a time
    let vectors = |params: f64| (params / m.n_embd as f64).round() * all_reduce(m.n_embd as f64 * 4.0, tp, link);
    // a llama's per-head q and k norms (`qk_norm`), whole on every rank that normalizes its own
    // heads, with or without sequence parallelism
    let heads = m.head_norm_params();
    let head_norms = if heads > 0.0 {
        2.0 * all_reduce(m.head_dim as f64 * 4.0, tp, link)
    } else {
        0.0
    };
    if sequence {
        let block_vectors = m.block_vector_params_split().1 - heads;
        let head_params = m.head_params_split(false).1;
        WholeGradientSums {
            block: vectors(block_vectors) + head_norms,
            head: vectors(head_params),
            block_params: block_vectors + heads,
            head_params,
        }
    } else {
        WholeGradientSums {
            block: head_norms,
            head: 0.0,
            block_params: heads,
            head_params: 0.0,
        }
    }
}

/// `u` without the per-pass [`WholeGradientSums`] `sums`: where weft sums those gradients once
/// a step instead (gradients whole until the update: no ZeRO sharding), as
/// [`super::step_time`] then counts.
pub fn without_whole_gradient_sums(mut u: UnitTimes, sums: &WholeGradientSums) -> UnitTimes {
    u.block_comm.backward = (u.block_comm.backward - sums.block).max(0.0);
    u.head_comm.backward = (u.head_comm.backward - sums.head).max(0.0);
    u
}
