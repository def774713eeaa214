//! Predicted time of a layout's optimizer step, seconds.
//!
//! - Compute: FLOPs over `peak x efficiency.gemm`, plus the memory-bound kernels' bytes over
//!   `HBM bandwidth x efficiency.memory_bound`. Backward is twice the forward; recompute adds
//!   one forward per micro-batch.
//! - Tensor parallelism (Megatron-LM's layout, as weft cuts gpt and llama): two all-reduces of
//!   the hidden states per block in the forward (in the products' dtype) and two in the
//!   backward (f32), on the critical path and apart from compute; recompute repeats the
//!   forward's two. The embedding adds one in the forward, the loss two of one or two numbers
//!   per token in the forward and one of the hidden states in the backward. Sequence-parallel
//!   layouts replace each all-reduce of the hidden states by an all-gather and a reduce-scatter
//!   and sum the whole vector parameters' gradients over the group ([`unit_times_sequence`]).
//!   A llama with `qk_norm` sums its q and k norms' gradients (`hd` each, f32, whole on every
//!   rank) too, sequence-parallel or not. Without ZeRO weft sums all of a stage's such gradients
//!   in one all-reduce a step, after its passes (exposed); with ZeRO every backward pass sums
//!   them, one small all-reduce each ([`whole_gradient_sums`]).
//! - Collectives as a ring: all-reduce `2 (n - 1) a + 2 (n - 1) / n x bytes / B`,
//!   reduce-scatter and all-gather half of that, with `a` and `B` the latency and bus bandwidth
//!   of the link the group spans ([`DeviceSpec::link`]).
//! - Pipeline: with per-micro-batch stage times `t_s`, a step of `m` micro-batches takes
//!   `(m - 1) max t_s + sum t_s` (GPipe and 1F1B: with equal stages, the bubble is
//!   `(p - 1) / (m + p - 1)` of the step, `weft_dist::pipeline::ideal_bubble`); interleaved over
//!   `v` chunks, whose passes take `1/v` of a stage's, `(m - 1/v) max t_s + sum t_s / v` (with
//!   equal stages a bubble of `(p - 1) / (v m + p - 1)`), every chunk pass sending its
//!   activations on and its input's gradient back (`2 v` sends a micro-batch, `2 v - 1` on the
//!   first and last stage).
//! - Gradient accumulation: `grad_accum` passes of the pipeline per step, each over
//!   `global_batch / grad_accum` rows.
//! - Data parallelism: weft reduces gradients once per step, in bucket order during the last
//!   micro-batch's backward; what does not fit under that backward is exposed, and at least the
//!   last bucket always is. ZeRO 1 and 2 all-gather the updated shards after the step (exposed);
//!   ZeRO 3 gathers each unit before its forward and again before its backward, prefetching
//!   the next one under the current one's compute.
//! - What a pass costs beyond its FLOPs and bytes ([`DeviceSpec::pass_cost`], measured on
//!   the model's own passes by `weft plan calibrate`): the compute above is scaled by
//!   `time_scale`, and every block's forward and backward of a micro-batch adds `block`
//!   seconds, the embeddings' and the output layer's together `ends`. So more, smaller
//!   micro-batches cost more than their FLOPs alone say.
//! - Gradient accumulation inside a step: every micro-batch but the step's first adds its f32
//!   gradients to the step's, 12 bytes a parameter of its stage (read both, write the sum; of
//!   the rank's shard under ZeRO 2 and 3, which reduce-scatter each micro-batch's first),
//!   memory-bound, in its backward (weft adds them as autograd makes them; Megatron-LM's
//!   gradient-accumulation fusion, which has the weight-gradient product add into them, is not
//!   weft's).
//! - The step's own all-reduces over every rank, of one number each: the loss, and where the
//!   gradients are sharded (ZeRO, tensor or pipeline parallelism) their norm for clipping.
//! - The optimizer step: Adam reads parameters, gradients and two moments and writes three:
//!   28 bytes per local parameter, memory-bound.
//! - Devices that share compute ([`DeviceSpec::shared_compute`]: CPU ranks on fewer cores):
//!   the pipeline is simulated pass by pass ([`crate::shared`]), the ranks computing at any
//!   moment sharing the cores equally; a pass's compute and the transfers of its collectives
//!   and messages are CPU work (weft's ranks copy and reduce on the CPU, the receiver's copy
//!   as well as the sender's), the latencies waiting. Data-parallel and ZeRO communication
//!   hides under nothing there: its transfers are CPU work of every rank of the node at once.
//!   Pipelines too long to simulate ([`MAX_SIMULATED`]) take the node's compute over its cores
//!   as a bound.

use crate::device::DeviceSpec;
use crate::layout::{CommDtype, Layout, Schedule};
use crate::memory::{stage_params, BUCKET_BYTES};
use crate::model::Workload;
use crate::shared::{PassTime, SharedPipeline};

mod whole_sums;

pub use whole_sums::{whole_gradient_sums, without_whole_gradient_sums, WholeGradientSums};

/// The most passes times stages a pipeline on shared cores is simulated at
/// ([`crate::shared::SharedPipeline::step`] steps every stage at each of its events); past it the
/// step is bounded below by the node's compute over its cores, as for pipelines too long to
/// simulate. A pipeline of 64 stages is simulated up to 32 micro-batches, one of 4 stages (as many
/// ranks as a CPU machine runs) up to 8192: far past what calibrated plans use, each in about a
/// millisecond (one of 1000 stages took a tenth of a second, and a search evaluates thousands).
pub const MAX_SIMULATED: usize = 1 << 18;

/// Time of a ring all-reduce of `bytes` over `n` devices on a link of `(bandwidth, latency)`.
pub fn all_reduce(bytes: f64, n: usize, link: (f64, f64)) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let n = n as f64;
    2.0 * (n - 1.0) * link.1 + 2.0 * (n - 1.0) / n * bytes / link.0
}

/// Time of a ring reduce-scatter or all-gather of `bytes` (the whole tensor) over `n` devices.
pub fn gather(bytes: f64, n: usize, link: (f64, f64)) -> f64 {
    all_reduce(bytes, n, link) / 2.0
}

/// Tensor-parallel communication of one piece per micro-batch, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TpComm {
    /// In its forward (run again by recompute).
    pub forward: f64,
    /// In its backward.
    pub backward: f64,
}

/// Per-micro-batch times of a stage's pieces on one device, seconds: compute, and apart from
/// it the tensor-parallel all-reduces (weft runs them on the critical path).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UnitTimes {
    /// One block's forward compute.
    pub block_forward: f64,
    /// The embeddings' forward compute (first stage).
    pub embed_forward: f64,
    /// The final norm, output layer and loss forward compute (last stage).
    pub head_forward: f64,
    /// One block's all-reduces: two in the forward (after the row-parallel `c_proj`s), two in
    /// the backward (the gradients of the column-parallel layers' inputs); sequence-parallel,
    /// an all-gather and a reduce-scatter in place of each, and the vector parameters'
    /// gradient all-reduces in the backward; with `qk_norm`, the head norms' two gradient
    /// all-reduces in the backward.
    pub block_comm: TpComm,
    /// The vocabulary-parallel embedding's all-reduce (forward; sequence-parallel, the
    /// all-gather of its gradient in the backward).
    pub embed_comm: TpComm,
    /// The vocabulary-parallel loss's two all-reduces of one or two numbers per token
    /// (forward), and the gradient of the output layer's input (backward); sequence-parallel,
    /// the gather of the final norm's output (forward), a reduce-scatter of its gradient and
    /// the final norm's gradient all-reduces (backward).
    pub head_comm: TpComm,
    /// Sending one micro-batch's activations (or their gradients) to the next stage.
    pub p2p: f64,
    /// Adding one micro-batch's gradients of a block's parameters to the step's (f32: both
    /// read, the sum written, 12 bytes a parameter), averaged over the step's micro-batches,
    /// of which the first has nothing to add to.
    pub block_accumulate: f64,
    /// The same for the embeddings (first stage).
    pub embed_accumulate: f64,
    /// The same for the final norm and output layer (last stage).
    pub head_accumulate: f64,
}

/// Seconds to add a micro-batch's f32 gradients of `params` parameters to the accumulated ones
/// (read both, write the sum) on `device`, memory-bound.
pub fn accumulate_time(params: f64, device: &DeviceSpec) -> f64 {
    12.0 * params / (device.memory_bandwidth * device.efficiency.memory_bound)
}

/// Parameters of a stage (`blocks` blocks, the embeddings when `first`, the final norm and the
/// output layer when `last`, at `tp`) whose gradients a micro-batch adds to the step's in a pass
/// of its own: all of them, or with `work.fused_accumulation` those no matrix product makes: a
/// block's biases and norm weights, the embeddings (an index-add's gradient; a tied output
/// layer on the embedding's stage is a second use of that parameter, which fusion leaves alone
/// too), the final norm.
pub fn unfused_params(work: &Workload, tp: usize, pp: usize, blocks: usize, first: bool, last: bool) -> f64 {
    let m = &work.model;
    if !work.fused_accumulation {
        return stage_params(m, tp, pp, blocks, first, last);
    }
    let (cut, whole) = m.block_vector_params_split();
    let mut p = blocks as f64 * (cut / tp as f64 + whole);
    if first {
        p += stage_params(m, tp, pp, 0, true, false);
    }
    if last {
        p += m.head_params_split(pp > 1).1;
    }
    p
}

/// The forward times of a layout's pieces for micro-batches of `rows` rows, without sequence
/// parallelism ([`unit_times_sequence`]).
pub fn unit_times(work: &Workload, device: &DeviceSpec, tp: usize, dp: usize, pp: usize, rows: f64) -> UnitTimes {
    unit_times_sequence(work, device, tp, dp, pp, rows, false)
}

/// The forward times of a layout's pieces for micro-batches of `rows` rows; `sequence`:
/// sequence-parallel across the `tp` ranks (`parallel.sequence_parallel`), as weft runs it
/// (`weft_nn::sequence_parallel`): each all-reduce of a block becomes an all-gather and a
/// reduce-scatter (the all-gathers of the norms' outputs in f32, the reduce-scatters of the
/// products' outputs in their dtype, and the backward's the other way round), the embeddings'
/// gradient is all-gathered and the output layer's input gathered; the norms and residual
/// additions run on `1 / tp` of the tokens; the gradients of the parameters whole on every
/// rank (norms, row-parallel biases) are all-reduced, one small all-reduce each per
/// micro-batch ([`whole_gradient_sums`]; [`step_time`] takes them out again where weft sums
/// them once a step); the pipeline sends `1 / tp` of the stream.
#[allow(clippy::too_many_arguments)]
pub fn unit_times_sequence(
    work: &Workload,
    device: &DeviceSpec,
    tp: usize,
    dp: usize,
    pp: usize,
    rows: f64,
    sequence: bool,
) -> UnitTimes {
    let sequence = sequence && tp > 1;
    let m = &work.model;
    let eff = &device.efficiency;
    let gemm = device.peak_flops(work.precision) * eff.gemm;
    let hbm = device.memory_bandwidth * eff.memory_bound;
    let act = work.precision.activation_bytes();
    let tokens = rows * m.seq_len as f64;
    let tpf = tp as f64;
    // hidden states of the micro-batch: the products' partial sums are in the compute dtype;
    // the norms' outputs, whose gradients the backward sums, and the residual stream the
    // pipeline sends are f32
    let hidden = tokens * m.n_embd as f64;
    let tp_link = device.link(1, tp);
    let ar_low = all_reduce(hidden * act, tp, tp_link);
    let ar_f32 = all_reduce(hidden * 4.0, tp, tp_link);

    let (whole, cut) = m.block_memory_elements_per_token();
    // with qk_norm the head norms and the rotation after them, cut and in f32
    let cut_f32 = m.block_f32_cut_elements_per_token();
    // sequence-parallel: the whole-on-every-rank kernels on this rank's tokens
    let whole = if sequence { whole / tpf } else { whole };
    // the attention's products at their own rate (eff.attention of the matrix products')
    let attention = m.attention_flops_per_token();
    // what a pass costs beyond its compute, a third of it in the forward (the backward's
    // two thirds follow from it, as its compute does), the same on every tensor-parallel rank
    let pc = &device.pass_cost;
    let scale = pc.time_scale;
    let block_forward = scale
        * (tokens * (m.block_flops_per_token() - attention) / tpf / gemm
            + tokens * attention / tpf / (gemm * eff.attention)
            + tokens * (4.0 * whole + cut / tpf * act + cut_f32 / tpf * 4.0) / hbm)
        + pc.block / 3.0;
    // the lookup of f32 rows
    let embed_forward = scale * 2.0 * hidden * 4.0 / hbm + pc.ends / 6.0;
    // the final norm and the output layer; the cross-entropy reads and writes the logits
    // (f32) three times
    let logits = tokens * m.vocab as f64 / tpf * 4.0;
    let head_forward = scale
        * (tokens * m.head_flops_per_token() / tpf / gemm + (2.0 * hidden * 4.0 + 3.0 * logits) / hbm)
        + pc.ends / 6.0;
    // weft's vocabulary-parallel loss reduces its maxima and then its sums and target logits,
    // in f64
    let loss_ar = all_reduce(tokens * 8.0, tp, tp_link) + all_reduce(tokens * 16.0, tp, tp_link);
    // every micro-batch of the step but the first adds its gradients to the others'
    let micro_batches = (work.global_batch as f64 / (dp as f64 * rows)).max(1.0);
    let accumulate = |params: f64| scale * (micro_batches - 1.0) / micro_batches * accumulate_time(params, device);
    let stream = if sequence { hidden / tpf } else { hidden };
    let p2p = if pp > 1 {
        let link = device.link(tp * dp, 2);
        link.1 + stream * 4.0 / link.0
    } else {
        0.0
    };
    let sums = whole_gradient_sums(work, device, tp, sequence);
    let (block_comm, embed_comm, head_comm) = if sequence {
        let both = gather(hidden * 4.0, tp, tp_link) + gather(hidden * act, tp, tp_link);
        (
            TpComm {
                forward: 2.0 * both,
                backward: 2.0 * both + sums.block,
            },
            TpComm {
                forward: ar_f32,
                backward: gather(hidden * 4.0, tp, tp_link),
            },
            TpComm {
                forward: loss_ar + gather(hidden * 4.0, tp, tp_link),
                backward: gather(hidden * 4.0, tp, tp_link) + sums.head,
            },
        )
    } else {
        (
            TpComm {
                forward: 2.0 * ar_low,
                backward: 2.0 * ar_f32 + sums.block,
            },
            TpComm {
                forward: ar_f32,
                backward: 0.0,
            },
            TpComm {
                forward: loss_ar,
                backward: ar_f32,
            },
        )
    };
    UnitTimes {
        block_forward,
        embed_forward,
        head_forward,
        block_comm,
        embed_comm,
        head_comm,
        p2p,
        block_accumulate: accumulate(unfused_params(work, tp, pp, 1, false, false)),
        embed_accumulate: accumulate(unfused_params(work, tp, pp, 0, true, false)),
        head_accumulate: accumulate(unfused_params(work, tp, pp, 0, false, true)),
    }
}

/// Per-micro-batch time of a stage of `blocks` blocks: forward, backward (twice the forward's
/// compute), recompute (the forward again), their tensor-parallel all-reduces, the sends to
/// neighbours and the gradients' accumulation.
pub fn stage_time(u: &UnitTimes, blocks: usize, first: bool, last: bool, recompute: bool) -> f64 {
    let k = blocks as f64;
    let mut forward = k * u.block_forward;
    let mut comm_forward = k * u.block_comm.forward;
    let mut comm_backward = k * u.block_comm.backward;
    if first {
        forward += u.embed_forward;
        comm_forward += u.embed_comm.forward;
        comm_backward += u.embed_comm.backward;
    }
    if last {
        forward += u.head_forward;
        comm_forward += u.head_comm.forward;
        comm_backward += u.head_comm.backward;
    }
    let passes = if recompute { 2.0 } else { 1.0 };
    let sends = (!last as u8 + !first as u8) as f64 * u.p2p;
    (passes + 2.0) * forward + passes * comm_forward + comm_backward + sends + accumulate(u, blocks, first, last)
}

/// Per-micro-batch time of a stage's gradient accumulation.
fn accumulate(u: &UnitTimes, blocks: usize, first: bool, last: bool) -> f64 {
    blocks as f64 * u.block_accumulate
        + if first { u.embed_accumulate } else { 0.0 }
        + if last { u.head_accumulate } else { 0.0 }
}

/// Per-micro-batch time of a stage's backward alone: twice its forward compute, the
/// backward's all-reduces and the gradients' accumulation.
pub fn stage_backward_time(u: &UnitTimes, blocks: usize, first: bool, last: bool) -> f64 {
    let k = blocks as f64;
    let mut t = k * (2.0 * u.block_forward + u.block_comm.backward);
    if first {
        t += 2.0 * u.embed_forward + u.embed_comm.backward;
    }
    if last {
        t += 2.0 * u.head_forward + u.head_comm.backward;
    }
    t + accumulate(u, blocks, first, last)
}

/// Time of `m` micro-batches through stages of per-micro-batch times `stages`:
/// `(m - 1) max t_s + sum t_s`.
pub fn pipeline_time(stages: &[f64], m: usize) -> f64 {
    pipeline_time_chunked(stages, m, 1)
}

/// [`pipeline_time`] with each stage run as `chunks` interleaved chunks:
/// `(m - 1/v) max t_s + sum t_s / v`.
pub fn pipeline_time_chunked(stages: &[f64], m: usize, chunks: usize) -> f64 {
    let slowest = stages.iter().cloned().fold(0.0, f64::max);
    let v = chunks.max(1) as f64;
    (m as f64 - 1.0 / v) * slowest + stages.iter().sum::<f64>() / v
}

/// The predicted step of a layout.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTime {
    /// The whole optimizer step, seconds.
    pub step: f64,
    /// The pipeline part (every micro-batch through every stage), seconds.
    pub pipeline: f64,
    /// Data-parallel and ZeRO communication not hidden under compute, and the step's
    /// all-reduces of its loss and gradient norm, seconds.
    pub exposed_comm: f64,
    /// The optimizer's update, seconds.
    pub optimizer: f64,
    /// Per-micro-batch time of each stage, seconds.
    pub stages: Vec<f64>,
}

/// `u` with ZeRO 2 and 3's accumulation: they reduce-scatter each micro-batch's gradients and
/// add the rank's shard, a `1/dp` of the stage's parameters.
fn sharded_accumulation(mut u: UnitTimes, zero: usize, dp: usize) -> UnitTimes {
    if zero >= 2 {
        let shard = 1.0 / dp as f64;
        u.block_accumulate *= shard;
        u.embed_accumulate *= shard;
        u.head_accumulate *= shard;
    }
    u
}

/// `work` as its gradients are accumulated at ZeRO stage `zero`: stages 2 and 3 hand every
/// micro-batch's gradients to the reduce-scatter and keep only the shard, so no parameter holds
/// a gradient for a product to add into and fusion saves nothing there.
fn accumulated_as_run(work: &Workload, zero: usize) -> std::borrow::Cow<'_, Workload> {
    if zero >= 2 && work.fused_accumulation {
        std::borrow::Cow::Owned(Workload {
            fused_accumulation: false,
            ..work.clone()
        })
    } else {
        std::borrow::Cow::Borrowed(work)
    }
}

/// What a stage's data-parallel gradient reduction (`reduce` seconds in all, its last bucket
/// `last_bucket`) leaves exposed after its passes end, `backward` the stage's backward of one
/// micro-batch. The reduction goes out in buckets during the backward of the step's last
/// micro-batch and runs under it. Interleaved over `v` chunks, weft reduces each chunk's
/// gradients (`1 / v` of them) after that chunk's last backward, so chunk `c`'s run under the
/// `c g` chunk passes of backward that follow it (`g` micro-batches in the last group), one
/// chunk's after another on the link; chunk 0's last pass ends the step's. Waiting on the next
/// stage between those passes is not counted (it would hide more). The last bucket is always
/// exposed.
fn exposed_reduction(reduce: f64, last_bucket: f64, backward: f64, schedule: &Schedule, pp: usize, m: usize) -> f64 {
    let v = schedule.chunks();
    let g = match schedule {
        // the last group is one of the smaller
        Schedule::Interleaved(_) => crate::layout::GroupSizes::of(pp, m).smaller,
        _ => 1,
    } as f64;
    let pass = backward / v as f64;
    // when the link is next free, in seconds from the end of the stage's last pass
    let mut free = f64::NEG_INFINITY;
    for c in (0..v).rev() {
        // chunk c's last backward, during which its buckets go out
        let start = -(c as f64) * g * pass - pass;
        free = free.max(start) + reduce / v as f64;
    }
    free.max(last_bucket).min(reduce)
}

/// `u` with the pipeline's sends (`u.p2p`, computed for f32) in `wire`: the same latency, the
/// bytes in `wire`'s width.
pub fn on_the_wire(
    mut u: UnitTimes,
    device: &DeviceSpec,
    tp: usize,
    dp: usize,
    pp: usize,
    wire: CommDtype,
) -> UnitTimes {
    if pp > 1 {
        let latency = device.link(tp * dp, 2).1;
        // (an unbounded latency leaves the transfer undefined: the send takes forever anyway)
        u.p2p = latency + (u.p2p - latency).max(0.0) * wire.bytes() / 4.0;
    }
    u
}

/// The step time of `layout` (its `stage_blocks` cut) on devices `device`.
pub fn step_time(work: &Workload, device: &DeviceSpec, layout: &Layout) -> StepTime {
    let (dp, tp, pp) = (layout.dp, layout.tp, layout.pp);
    let zero = if dp > 1 { layout.zero } else { 0 };
    let work = &*accumulated_as_run(work, zero);
    let rows = work.pass_rows() as f64 / dp as f64 / layout.micro_batches as f64;
    let sp = layout.sequence_parallel;
    // without ZeRO sharding weft sums the gradients of parameters whole on every
    // tensor-parallel rank once a step, after the passes; ZeRO shards them, so each pass does
    let sums = whole_gradient_sums(work, device, tp, sp);
    let once_a_step = |u: UnitTimes| {
        if zero == 0 {
            without_whole_gradient_sums(u, &sums)
        } else {
            u
        }
    };
    let u = sharded_accumulation(unit_times_sequence(work, device, tp, dp, pp, rows, sp), zero, dp);
    let u = on_the_wire(once_a_step(u), device, tp, dp, pp, layout.pipeline_dtype);
    let chunks = layout.schedule.chunks();
    // interleaved: every chunk pass sends its activations on and its input's gradient back,
    // but the first virtual stage's gradient and the last one's activations (2 v sends a
    // micro-batch, one fewer on the first and the last stage); stage_time counts 1F1B's
    let extra_sends = |s: usize| {
        let own = usize::from(s > 0) + usize::from(s + 1 < pp);
        let all = 2 * chunks - usize::from(s == 0) - usize::from(s + 1 == pp);
        if chunks > 1 {
            (all - own) as f64 * u.p2p
        } else {
            0.0
        }
    };
    let stages: Vec<f64> = (0..pp)
        .map(|s| stage_time(&u, layout.stage_blocks[s], s == 0, s + 1 == pp, layout.recompute) + extra_sends(s))
        .collect();
    let passes = work.grad_accum.max(1) as f64;
    let pipeline = passes * pipeline_time_chunked(&stages, layout.micro_batches, chunks);

    let dp_link = device.link(tp, dp);
    let comm = layout.comm_dtype.bytes();
    let hbm = device.memory_bandwidth * device.efficiency.memory_bound;
    let mut exposed: f64 = 0.0;
    let mut optimizer: f64 = 0.0;
    for s in 0..pp {
        let blocks = layout.stage_blocks[s];
        let (first, last) = (s == 0, s + 1 == pp);
        let p = stage_params(&work.model, tp, pp, blocks, first, last);
        // the last micro-batch's backward, under which the gradients are reduced
        let backward = stage_backward_time(&u, blocks, first, last);
        let mut e = 0.0;
        // ZeRO 2 and 3 reduce-scatter every pass's gradients (and stage 3 gathers its units
        // for every pass); plain data parallelism and ZeRO 1 reduce under the step's last pass
        let reductions = if zero >= 2 { passes } else { 1.0 };
        let gathers = if zero == 3 { passes } else { 0.0 };
        if dp > 1 {
            let reduce = if zero >= 2 {
                gather(p * comm, dp, dp_link)
            } else {
                all_reduce(p * 4.0, dp, dp_link)
            };
            let last_bucket = if zero >= 2 {
                gather(BUCKET_BYTES.min(p * comm), dp, dp_link)
            } else {
                all_reduce(BUCKET_BYTES.min(p * 4.0), dp, dp_link)
            };
            e += reductions
                * exposed_reduction(
                    reduce,
                    last_bucket,
                    backward,
                    &layout.schedule,
                    pp,
                    layout.micro_batches,
                );
            if (1..=2).contains(&zero) {
                e += gather(p * comm, dp, dp_link);
            }
            if zero == 3 {
                // units gathered for the forward and again for the backward, each under the
                // previous unit's compute; the first of each pass is exposed
                let block = stage_params(&work.model, tp, pp, 1, false, false);
                let g_block = gather(block * comm, dp, dp_link);
                let g_root = gather((p - blocks as f64 * block) * comm, dp, dp_link);
                let fwd_hidden = (g_block - u.block_forward).max(0.0) * blocks as f64;
                let bwd_hidden = (g_block - 2.0 * u.block_forward).max(0.0) * blocks as f64;
                e += gathers * (2.0 * g_root + fwd_hidden + bwd_hidden);
            }
            if let Some(k) = device.shared_compute {
                // on shared cores nothing hides it: every transfer is CPU work of each of the
                // node's ranks (they copy and reduce on the CPU), at `k` of them at a time
                let full = |link: (f64, f64)| {
                    let mut t = reductions
                        * if zero >= 2 {
                            gather(p * comm, dp, link)
                        } else {
                            all_reduce(p * 4.0, dp, link)
                        };
                    if (1..=2).contains(&zero) {
                        t += gather(p * comm, dp, link);
                    }
                    // every unit gathered for the forward and again for the backward
                    t += gathers * 2.0 * gather(p * comm, dp, link);
                    t
                };
                let per_node = ((dp * tp * pp) as f64).min(device.devices_per_node as f64);
                let transfer = full((dp_link.0, 0.0));
                e = transfer * (per_node / k).max(1.0) + (full(dp_link) - transfer);
            }
        }
        if zero == 0 && tp > 1 {
            // the stage's whole-parameter gradients in one all-reduce, after its passes
            let params = blocks as f64 * sums.block_params + if last { sums.head_params } else { 0.0 };
            if params > 0.0 {
                e += all_reduce(params * 4.0, tp, device.link(1, tp));
            }
        }
        exposed = exposed.max(e);
        let local = if zero >= 1 { p / dp as f64 } else { p };
        optimizer = optimizer.max(28.0 * local / hbm);
    }
    // devices that share compute: the node's ranks' work at most `shared_compute` at a time
    let mut pipeline = pipeline;
    if let Some(k) = device.shared_compute {
        let devices = (dp * tp * pp) as f64;
        let per_node = devices.min(device.devices_per_node as f64);
        // compute only: waiting on a collective or a send takes no core
        let no_comm = device.without_links();
        let uc = sharded_accumulation(unit_times_sequence(work, &no_comm, tp, dp, pp, rows, sp), zero, dp);
        // the links' transfers alone (their latencies left out)
        let no_latency = DeviceSpec {
            intra_latency: 0.0,
            inter_latency: 0.0,
            ..device.clone()
        };
        let ut = once_a_step(unit_times_sequence(work, &no_latency, tp, dp, pp, rows, sp));
        let cores = (devices / per_node).max(1.0) * k;
        // the simulation's work is its passes times the stages it steps at each event
        let simulate = (2 * pp * chunks)
            .saturating_mul(layout.micro_batches)
            .saturating_mul(pp)
            <= MAX_SIMULATED;
        let simulated = if simulate {
            shared_pipeline([&u, &uc, &ut], device, layout, cores).step()
        } else {
            None
        };
        pipeline = match simulated {
            Some(t) => passes * t,
            None => {
                // too long to simulate: at least the node's compute over its cores
                let (mut compute, mut comm) = (0.0, 0.0f64);
                for (s, &with_comm) in stages.iter().enumerate() {
                    let c = stage_time(&uc, layout.stage_blocks[s], s == 0, s + 1 == pp, layout.recompute);
                    compute += c;
                    comm = comm.max(with_comm - c);
                }
                let m = passes * layout.micro_batches as f64;
                let busy = compute * m * (dp * tp) as f64;
                // on shared cores a rank's collectives and sends do not hide under the others'
                // compute
                pipeline.max(busy * per_node / devices / k + m * comm)
            }
        };
        optimizer *= (per_node / k).max(1.0);
    }
    // the step's own all-reduces of one number over every rank: the loss, and where the
    // gradients are sharded (ZeRO, tensor or pipeline parallelism) their norm
    let devices = dp * tp * pp;
    if devices > 1 {
        let sharded = zero > 0 || tp > 1 || pp > 1;
        exposed += (1.0 + f64::from(u8::from(sharded))) * all_reduce(8.0, devices, device.link(1, devices));
    }
    StepTime {
        step: pipeline + exposed + optimizer,
        pipeline,
        exposed_comm: exposed,
        optimizer,
        stages,
    }
}

/// The passes of `layout`'s pipeline on ranks that share `cores`, from its unit times with
/// communication (`u`), without it (`uc`) and without the links' latencies (`ut`): on shared
/// cores, a pass's compute and the transfers of its tensor-parallel collectives and of the
/// activations (or gradients) it receives and sends are CPU work (weft's ranks copy and reduce
/// them on the CPU); the collectives' latencies are waiting, and a send's latency delays the
/// pass that waits for it.
fn shared_pipeline([u, uc, ut]: [&UnitTimes; 3], device: &DeviceSpec, layout: &Layout, cores: f64) -> SharedPipeline {
    let (pp, chunks) = (layout.pp, layout.schedule.chunks());
    let virtual_stages = pp * chunks;
    let latency = if pp > 1 {
        device.link(layout.tp * layout.dp, 2).1
    } else {
        0.0
    };
    let transfer = (u.p2p - latency).max(0.0);
    // blocks per virtual stage: the runtime's even cut under interleaving
    let per_virtual: Vec<usize> = if chunks > 1 {
        crate::search::virtual_stage_blocks(layout.stage_blocks.iter().sum(), pp, chunks)
    } else {
        layout.stage_blocks.clone()
    };
    let (mut forward, mut backward) = (Vec::new(), Vec::new());
    for (vs, &blocks) in per_virtual.iter().enumerate() {
        let blocks = blocks as f64;
        let (first, last) = (vs == 0, vs + 1 == virtual_stages);
        let part = |block: f64, embed: f64, head: f64| {
            blocks * block + if first { embed } else { 0.0 } + if last { head } else { 0.0 }
        };
        let compute = part(uc.block_forward, uc.embed_forward, uc.head_forward);
        let accumulate = part(uc.block_accumulate, uc.embed_accumulate, uc.head_accumulate);
        let fwd = |x: &UnitTimes| part(x.block_comm.forward, x.embed_comm.forward, x.head_comm.forward);
        let bwd = |x: &UnitTimes| part(x.block_comm.backward, x.embed_comm.backward, x.head_comm.backward);
        // (transfer, latency) of the collectives
        let comm_fwd = (fwd(ut), fwd(u) - fwd(ut));
        let comm_bwd = (bwd(ut), bwd(u) - bwd(ut));
        let messages = (!first as u8 + !last as u8) as f64 * transfer;
        let again = if layout.recompute { 1.0 } else { 0.0 };
        forward.push(PassTime {
            work: compute + comm_fwd.0 + messages,
            wait: comm_fwd.1,
        });
        backward.push(PassTime {
            work: (2.0 + again) * compute + accumulate + comm_bwd.0 + again * comm_fwd.0 + messages,
            wait: comm_bwd.1 + again * comm_fwd.1,
        });
    }
    SharedPipeline {
        stages: pp,
        schedule: layout.schedule,
        micro_batches: layout.micro_batches,
        forward,
        backward,
        ranks_per_stage: (layout.dp * layout.tp) as f64,
        cores,
        handoff: latency,
    }
}

/// Model FLOPs utilization: the model's FLOPs per step (forward and backward, without
/// recompute) over the step time and every device's peak.
pub fn mfu(work: &Workload, device: &DeviceSpec, devices: usize, step_seconds: f64) -> f64 {
    let flops = 3.0 * work.model.forward_flops_per_token() * work.model.seq_len as f64 * work.global_batch as f64;
    flops / (step_seconds * devices as f64 * device.peak_flops(work.precision))
}

#[cfg(test)]
mod tests;
