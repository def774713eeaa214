//! Bytes per device of a layout, by term, as weft allocates them once the model is cut:
//! parameters, gradients and optimizer state in f32 (weft's autocast keeps them so), divided by
//! ZeRO stage as `weft_dist::ShardedDataParallel` shards them (`16 P` bytes per parameter under
//! plain data parallelism with Adam, `8 P + 8 P / N` at stage 1, `4 P + 12 P / N` at 2,
//! `16 P / N` at 3); activations per micro-batch as weft's autograd graph keeps them
//! ([`crate::activations`], which `weft_train::memory` shares), times the micro-batches the
//! schedule holds at once; communication buffers.
//!
//! Not counted: weft today builds the whole model on every rank before cutting it (a transient
//! peak `weft_train::memory::estimate` does count); the planner plans the steady state.

use crate::activations;
use crate::layout::Layout;
use crate::model::{ModelShape, Workload};

mod interleaved;

use interleaved::interleaved_activations;

/// Bytes one device holds, by term.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemoryBreakdown {
    /// Parameters (f32; at ZeRO 3 this rank's shard): what the rank holds between steps, as
    /// the metrics' `state_bytes` count it.
    pub params: f64,
    /// Gradients (f32; at ZeRO 2 and 3 this rank's shard), between steps.
    pub grads: f64,
    /// Optimizer state (f32 moments; f32 master shards when gathering in bf16).
    pub optimizer: f64,
    /// Activations of the micro-batches in flight.
    pub activations: f64,
    /// Buffers that live only while a step runs: gradient buckets, tensor-parallel and pipeline
    /// send/receive buffers, gather buffers, and at ZeRO 2 and 3 the largest unit's whole
    /// gradients before they are reduce-scattered, at ZeRO 3 also the unit running (its f32
    /// parameters) and the next one's gather buffer in `comm_dtype`.
    pub comm_buffers: f64,
}

impl MemoryBreakdown {
    pub fn total(&self) -> f64 {
        self.params + self.grads + self.optimizer + self.activations + self.comm_buffers
    }

    /// The largest term: `(name, bytes)`.
    pub fn dominant(&self) -> (&'static str, f64) {
        [
            ("parameters", self.params),
            ("gradients", self.grads),
            ("optimizer state", self.optimizer),
            ("activations", self.activations),
            ("communication buffers", self.comm_buffers),
        ]
        .into_iter()
        .fold(("parameters", f64::MIN), |a, b| if b.1 > a.1 { b } else { a })
    }
}

/// PyTorch's `bucket_cap_mb` and weft's default (`parallel.bucket_cap_mb`), bytes.
pub const BUCKET_BYTES: f64 = 25.0 * 1024.0 * 1024.0;

/// Parameters one tensor-parallel rank of a stage holds: `blocks` blocks, the embeddings on the
/// first stage, the final norm and output layer on the last (a tied output layer again when
/// it is a different stage from the first, as weft's pipeline keeps it).
pub fn stage_params(model: &ModelShape, tp: usize, pp: usize, blocks: usize, first: bool, last: bool) -> f64 {
    let tp = tp as f64;
    let (cut, whole) = model.block_params_split();
    let mut p = blocks as f64 * (cut / tp + whole);
    if first {
        let (cut, whole) = model.embedding_params_split();
        p += cut / tp + whole;
    }
    if last {
        let (cut, whole) = model.head_params_split(pp > 1);
        p += cut / tp + whole;
    }
    p
}

/// Bytes a device of stage `stage` holds under `layout` (`layout.stage_blocks` cut).
pub fn stage_memory(work: &Workload, layout: &Layout, stage: usize) -> MemoryBreakdown {
    stage_memory_with(work, layout, stage, layout.stage_blocks[stage])
}

/// Bytes a device of stage `stage` holds under `layout` were that stage given `blocks` blocks
/// (every term is linear in `blocks`).
pub fn stage_memory_with(work: &Workload, layout: &Layout, stage: usize, blocks: usize) -> MemoryBreakdown {
    let activations = stage_activations(work, layout, stage, blocks);
    stage_memory_given(work, layout, stage, blocks, activations)
}

/// What one micro-batch's graph keeps on a device of `layout` holding `blocks` blocks and the
/// ends: [`activations::micro_batch_bytes`], less what sequence parallelism holds at `1 / tp`
/// ([`activations::sequence_parallel_saving_per_token`]).
pub(crate) fn graph_bytes(
    work: &Workload,
    layout: &Layout,
    blocks: usize,
    (first, last): (bool, bool),
    tokens: f64,
) -> f64 {
    let model = &work.model;
    let whole = activations::micro_batch_bytes(
        model,
        work.precision,
        layout.tp,
        work.kv_repeated,
        blocks,
        (first, last),
        tokens,
    );
    let saved = if layout.sequence_parallel {
        tokens * activations::sequence_parallel_saving_per_token(model, layout.tp, blocks, first, last)
    } else {
        0.0
    };
    whole - saved
}

/// Bytes per token of the f32 residual stream a pipeline stage receives, sends and (under
/// recompute) keeps per micro-batch: `4C`, this rank's part of the tokens (`4C / tp`) when
/// sequence-parallel.
pub(crate) fn stream_bytes_per_token(work: &Workload, layout: &Layout) -> f64 {
    let whole = 4.0 * work.model.n_embd as f64;
    if layout.sequence_parallel {
        whole / layout.tp as f64
    } else {
        whole
    }
}

/// Tokens of one micro-batch under `layout`.
fn micro_batch_tokens(work: &Workload, layout: &Layout) -> f64 {
    let rows = (work.pass_rows() as f64 / layout.dp as f64) / layout.micro_batches as f64;
    rows * work.model.seq_len as f64
}

/// Activation bytes a device of stage `stage` holds under `layout` were that stage given
/// `blocks` blocks (the term of [`MemoryBreakdown`] that depends on the schedule and recompute,
/// not on ZeRO or the gather dtype).
pub fn stage_activations(work: &Workload, layout: &Layout, stage: usize, blocks: usize) -> f64 {
    let model = &work.model;
    let (tp, pp) = (layout.tp, layout.pp);
    let (first, last) = (stage == 0, stage + 1 == pp);
    let tokens = micro_batch_tokens(work, layout);
    if layout.schedule.chunks() > 1 {
        interleaved_activations(work, layout, stage, tokens)
    } else {
        let in_flight = layout.schedule.in_flight(stage, pp, layout.micro_batches) as f64;
        let whole_mb = graph_bytes(work, layout, blocks, (first, last), tokens);
        if layout.recompute {
            // each micro-batch in flight keeps its input (the token ids on the first stage, the
            // f32 residual stream on the others); one at a time is rebuilt whole
            let input = if first {
                8.0
            } else {
                stream_bytes_per_token(work, layout)
            };
            in_flight * tokens * input + whole_mb
        } else {
            // the bf16 weight copies once: the step's micro-batches run in one autocast region,
            // which casts each parameter once
            let copies = activations::weight_copy_bytes(model, work.precision, tp, blocks, last);
            in_flight * (whole_mb - copies) + copies
        }
    }
}

/// The least bytes a device of stage `stage` with `blocks` blocks can hold under `layout` at
/// any number of micro-batches up to `layout.micro_batches` (1F1B or GPipe; the same pass
/// rows): fewer micro-batches are larger, and hold at least as many tokens in flight and as
/// large send buffers, but a micro-batch's bytes besides its tokens' (llama's rotary tables)
/// are held once per micro-batch in flight, which may be one.
pub fn stage_memory_floor(work: &Workload, layout: &Layout, stage: usize, blocks: usize) -> f64 {
    let total = stage_memory_with(work, layout, stage, blocks).total();
    if layout.recompute || layout.schedule.chunks() > 1 {
        // recompute rebuilds one micro-batch at a time (interleaved plans are not bounded so)
        return total;
    }
    let (first, last) = (stage == 0, stage + 1 == layout.pp);
    let model = &work.model;
    let fixed = graph_bytes(work, layout, blocks, (first, last), 0.0)
        - activations::weight_copy_bytes(model, work.precision, layout.tp, blocks, last);
    let in_flight = layout.schedule.in_flight(stage, layout.pp, layout.micro_batches) as f64;
    total - (in_flight - 1.0) * fixed.max(0.0)
}

/// [`stage_memory_with`] with its activation bytes given ([`stage_activations`]).
pub fn stage_memory_given(
    work: &Workload,
    layout: &Layout,
    stage: usize,
    blocks: usize,
    activations: f64,
) -> MemoryBreakdown {
    let model = &work.model;
    let (tp, pp) = (layout.tp, layout.pp);
    let dp = layout.dp as f64;
    let zero = if layout.dp > 1 { layout.zero } else { 0 };
    let (first, last) = (stage == 0, stage + 1 == pp);
    let p = stage_params(model, tp, pp, blocks, first, last);
    let comm = layout.comm_dtype.bytes();
    // the largest ZeRO unit on this rank: a block, or the root unit of the rest
    let block = stage_params(model, tp, pp, 1, false, false);
    let unit = block.max(p - blocks as f64 * block);

    let params = if zero >= 3 { 4.0 * p / dp } else { 4.0 * p };
    let grads = if zero >= 2 { 4.0 * p / dp } else { 4.0 * p };
    let moments = work.optimizer_moments as f64;
    let master = if layout.comm_dtype.bytes() < 4.0 && (1..=2).contains(&zero) {
        4.0 * p / dp
    } else {
        0.0
    };
    let optimizer = if zero >= 1 {
        moments * 4.0 * p / dp + master
    } else {
        moments * 4.0 * p
    };

    let tokens = micro_batch_tokens(work, layout);

    // tensor-parallel all-reduces carry the products' dtype, pipeline sends the f32 stream
    let hidden = tokens * model.n_embd as f64;
    let mut comm_buffers = 0.0;
    if layout.dp > 1 && zero < 2 {
        comm_buffers += 2.0 * BUCKET_BYTES;
    }
    if (1..=2).contains(&zero) {
        comm_buffers += unit * comm;
    }
    // ZeRO 2 and 3: a unit's whole gradients before the reduce-scatter; ZeRO 3 also the unit
    // running, its parameters filled in f32 from the gathered flat buffer (cast when gathered in
    // bf16), and the next unit's flat buffer being gathered
    if zero >= 2 {
        comm_buffers += 4.0 * unit;
    }
    if zero >= 3 {
        comm_buffers += (4.0 + comm) * unit;
    }
    if tp > 1 {
        comm_buffers += 2.0 * hidden * work.precision.activation_bytes();
    }
    if pp > 1 {
        comm_buffers += 2.0 * tokens * stream_bytes_per_token(work, layout);
    }
    MemoryBreakdown {
        params,
        grads,
        optimizer,
        activations,
        comm_buffers,
    }
}

/// The most blocks each stage of `layout` can hold within `usable` bytes per device (0 where
/// not even one fits).
pub fn block_caps(work: &Workload, layout: &Layout, usable: f64) -> Vec<usize> {
    let n_layer = work.model.n_layer as usize;
    (0..layout.pp)
        .map(|s| {
            let none = stage_memory_with(work, layout, s, 0).total();
            let one = stage_memory_with(work, layout, s, 1).total();
            if one > usable {
                return 0;
            }
            let per_block = one - none;
            if per_block <= 0.0 {
                return n_layer;
            }
            (((usable - none) / per_block).floor() as usize).clamp(1, n_layer)
        })
        .collect()
}

/// The stage that needs the most memory under `layout`: `(stage, its bytes)`.
pub fn peak_memory(work: &Workload, layout: &Layout) -> (usize, MemoryBreakdown) {
    (0..layout.pp)
        .map(|s| (s, stage_memory(work, layout, s)))
        .fold((0, MemoryBreakdown::default()), |a, b| {
            if b.1.total() > a.1.total() {
                b
            } else {
                a
            }
        })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod weft_holds;
