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

/// Bytes one device holds, by term.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemoryBreakdown {
    /// Parameters (f32; at ZeRO-3 the shard plus the unit running, in f32, and the next one's
    /// gather buffer in `comm_dtype`).
    pub params: f64,
    /// Gradients (f32; at ZeRO 2 and 3 the shard plus one unit's whole gradients).
    pub grads: f64,
    /// Optimizer state (f32 moments; f32 master shards when gathering in bf16).
    pub optimizer: f64,
    /// Activations of the micro-batches in flight.
    pub activations: f64,
    /// Gradient buckets, tensor-parallel and pipeline send/receive buffers, gather buffers.
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

/// The most activation bytes stage `stage` of an interleaved layout holds at once: its passes
/// in the runtime's order ([`crate::layout::Schedule::chunk_order`]), each (chunk, micro-batch)
/// holding what its virtual stage keeps (its blocks of the even cut, with the embeddings on
/// the first virtual stage and the output layer on the last), or under recompute its input
/// until its backward rebuilds it whole; without recompute, a chunk's bf16 weight copies once,
/// from its first forward to the end of the step (autocast casts a parameter once per step's
/// region; with recompute the region does not keep casts, and each rebuilt pass makes its own).
fn interleaved_activations(work: &Workload, layout: &Layout, stage: usize, tokens: f64) -> f64 {
    let model = &work.model;
    let (pp, v) = (layout.pp, layout.schedule.chunks());
    // blocks of virtual stage `vs` (`Layout::config_stage_blocks`, without listing them all)
    let blocks: usize = layout.stage_blocks.iter().sum();
    let count = |vs: usize| blocks / (pp * v) + usize::from(vs < blocks % (pp * v));
    // per chunk: a micro-batch's graph without the weight copies, its input, the copies
    let per_pass: Vec<(f64, f64, f64)> = (0..v)
        .map(|c| {
            let vs = c * pp + stage;
            let (first, last) = (vs == 0, vs + 1 == pp * v);
            let whole = activations::micro_batch_bytes(
                model,
                work.precision,
                layout.tp,
                work.kv_repeated,
                count(vs),
                (first, last),
                tokens,
            );
            let copies = activations::weight_copy_bytes(model, work.precision, layout.tp, count(vs), last);
            let input = tokens * if first { 8.0 } else { 4.0 * model.n_embd as f64 };
            (whole - copies, input, copies)
        })
        .collect();
    let (mut held, mut peak) = (0.0f64, 0.0f64);
    let mut cast = vec![false; v];
    // one pass: a forward or a backward of chunk `c`
    let mut pass = |c: usize, forward: bool, held: &mut f64| {
        let (graph, input, copies) = per_pass[c];
        match (layout.recompute, forward) {
            (false, true) => {
                if !cast[c] {
                    cast[c] = true;
                    *held += copies;
                }
                *held += graph;
            }
            (false, false) => *held -= graph,
            (true, true) => *held += input,
            (true, false) => {
                // rebuilt whole, weight copies included, for its backward, then gone
                peak = peak.max(*held + graph + copies);
                *held -= input;
            }
        }
        peak = peak.max(*held);
    };
    // the runtime's order (`Schedule::chunk_order`, which this walks without listing it): the
    // warm-up's forwards, a forward and a backward in turn, the backwards left; a chunk's passes
    // come in runs of up to `pp` in a row. Within a run of `n` steps (a pass, or a forward and a
    // backward in turn, of the same chunks) what is held changes by the same amount each step
    // after the first (which may cast the chunk's weights), so its most is at the first or the
    // last step: those two are walked, the ones between passed over. The turns also repeat
    // every `pp v` steps (a period holds each chunk's passes as often forward as backward, and
    // every chunk's weights are cast by the end of the first): whole periods past the second
    // are passed over too. A stage's walk is `O(v)` runs, however many micro-batches.
    let run = |held: &mut f64, n: usize, step: &mut dyn FnMut(&mut f64)| {
        if n == 0 {
            return;
        }
        step(held);
        if n > 1 {
            let before = *held;
            step(held);
            let each = *held - before;
            *held += (n - 2) as f64 * each;
            if n > 2 {
                // the last step, walked again from the one before it
                *held -= each;
                step(held);
            }
        }
    };
    let m = layout.micro_batches;
    let (total, period) = (m * v, pp * v);
    let chunk = |k: usize, forward: bool| {
        let c = (k % period) / pp;
        if forward {
            c
        } else {
            v - 1 - c
        }
    };
    let warmup = if m == pp {
        total
    } else {
        ((pp - 1 - stage) * 2 + (v - 1) * pp).min(total)
    };
    // passes k = from..to of one kind, in runs of one chunk
    let mut k = 0;
    while k < warmup {
        let end = (k + pp - k % pp).min(warmup);
        let c = chunk(k, true);
        run(&mut held, end - k, &mut |h| pass(c, true, h));
        k = end;
    }
    let steady = total - warmup;
    let mut k = 0;
    while k < steady {
        if k == 2 * period {
            k += (steady - k) / period * period;
            if k == steady {
                break;
            }
        }
        // forward warmup + k and backward k, until either changes chunk (or a second period ends)
        let mut end = (k + pp - k % pp).min(k + pp - (warmup + k) % pp).min(steady);
        if k < 2 * period {
            end = end.min(2 * period);
        }
        let (f, b) = (chunk(warmup + k, true), chunk(k, false));
        run(&mut held, end - k, &mut |h| {
            pass(f, true, h);
            pass(b, false, h);
        });
        k = end;
    }
    let mut k = steady;
    while k < total {
        let end = (k + pp - k % pp).min(total);
        let c = chunk(k, false);
        run(&mut held, end - k, &mut |h| pass(c, false, h));
        k = end;
    }
    peak
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
        let whole_mb = activations::micro_batch_bytes(
            model,
            work.precision,
            tp,
            work.kv_repeated,
            blocks,
            (first, last),
            tokens,
        );
        if layout.recompute {
            // each micro-batch in flight keeps its input (the token ids on the first stage, the
            // f32 residual stream on the others); one at a time is rebuilt whole
            let input = if first { 8.0 } else { 4.0 * model.n_embd as f64 };
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
    let fixed = activations::micro_batch_bytes(
        model,
        work.precision,
        layout.tp,
        work.kv_repeated,
        blocks,
        (first, last),
        0.0,
    ) - activations::weight_copy_bytes(model, work.precision, layout.tp, blocks, last);
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

    // ZeRO 3: the unit running, its parameters filled in f32 from the gathered flat buffer
    // (cast when gathered in bf16), and the next unit's flat buffer being gathered
    let params = if zero >= 3 {
        4.0 * p / dp + (4.0 + comm) * unit
    } else {
        4.0 * p
    };
    let grads = if zero >= 2 { 4.0 * p / dp + 4.0 * unit } else { 4.0 * p };
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
    if tp > 1 {
        comm_buffers += 2.0 * hidden * work.precision.activation_bytes();
    }
    if pp > 1 {
        comm_buffers += 2.0 * hidden * 4.0;
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
mod tests {
    use super::*;
    use crate::layout::{CommDtype, Schedule};
    use crate::model::tests::gpt2_small;
    use crate::model::Precision;

    fn work() -> Workload {
        Workload {
            model: gpt2_small(),
            global_batch: 32,
            precision: Precision::Bf16,
            grad_accum: 1,
            optimizer_moments: 2,
            kv_repeated: false,
            fused_accumulation: false,
        }
    }

    fn layout(dp: usize, zero: usize) -> Layout {
        Layout {
            dp,
            tp: 1,
            pp: 1,
            zero,
            micro_batches: 1,
            schedule: Schedule::OneFOneB,
            recompute: false,
            comm_dtype: CommDtype::F32,
            stage_blocks: vec![12],
        }
    }

    /// The walk of an interleaved stage's passes that passes over whole periods holds what the
    /// whole list of passes (`Schedule::chunk_order`) holds.
    #[test]
    fn interleaved_activations_pass_over_whole_periods_exactly() {
        let full = |work: &Workload, layout: &Layout, stage: usize, tokens: f64| -> f64 {
            let model = &work.model;
            let (pp, v) = (layout.pp, layout.schedule.chunks());
            let counts = layout.config_stage_blocks();
            let per_pass: Vec<(f64, f64, f64)> = (0..v)
                .map(|c| {
                    let vs = c * pp + stage;
                    let (first, last) = (vs == 0, vs + 1 == pp * v);
                    let whole = activations::micro_batch_bytes(
                        model,
                        work.precision,
                        layout.tp,
                        false,
                        counts[vs],
                        (first, last),
                        tokens,
                    );
                    let copies = activations::weight_copy_bytes(model, work.precision, layout.tp, counts[vs], last);
                    let input = tokens * if first { 8.0 } else { 4.0 * model.n_embd as f64 };
                    (whole - copies, input, copies)
                })
                .collect();
            let (mut held, mut peak) = (0.0f64, 0.0f64);
            let mut cast = vec![false; v];
            for (c, forward) in layout.schedule.chunk_order(stage, pp, layout.micro_batches) {
                let (graph, input, copies) = per_pass[c];
                match (layout.recompute, forward) {
                    (false, true) => {
                        if !cast[c] {
                            cast[c] = true;
                            held += copies;
                        }
                        held += graph;
                    }
                    (false, false) => held -= graph,
                    (true, true) => held += input,
                    (true, false) => {
                        peak = peak.max(held + graph + copies);
                        held -= input;
                    }
                }
                peak = peak.max(held);
            }
            peak
        };
        let mut cases = 0;
        for precision in [Precision::F32, Precision::Bf16] {
            let mut w = work();
            w.precision = precision;
            w.model.n_layer = 37;
            w.global_batch = 1 << 12;
            for pp in 2..=5 {
                for v in 2..=4 {
                    if w.model.n_layer < (v * pp) as u64 {
                        continue;
                    }
                    for m in (1..=13).map(|k| k * pp) {
                        for recompute in [false, true] {
                            let l = Layout {
                                pp,
                                micro_batches: m,
                                schedule: Schedule::Interleaved(v),
                                recompute,
                                stage_blocks: crate::search::interleaved_cut(37, pp, v),
                                ..layout(1, 0)
                            };
                            let tokens = (w.global_batch / m as u64) as f64 * w.model.seq_len as f64;
                            for stage in 0..pp {
                                let got = interleaved_activations(&w, &l, stage, tokens);
                                let want = full(&w, &l, stage, tokens);
                                assert!(
                                    (got - want).abs() <= 1e-9 * want,
                                    "pp {pp} v {v} m {m} rc {recompute} stage {stage}: {got} vs {want}"
                                );
                                cases += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(cases > 1000, "{cases}");
    }

    #[test]
    fn zero_stages_shard_as_zeros_accounting() {
        let w = work();
        let psi = w.model.parameter_count();
        let n = 4.0;
        let m0 = stage_memory(&w, &layout(4, 0), 0);
        assert_eq!(m0.params + m0.grads + m0.optimizer, 16.0 * psi);
        let m1 = stage_memory(&w, &layout(4, 1), 0);
        assert!((m1.params + m1.grads + m1.optimizer - (8.0 * psi + 8.0 * psi / n)).abs() < 1.0);
        // stages 2 and 3 also hold one unit's whole gradients (and gathered parameters)
        let m2 = stage_memory(&w, &layout(4, 2), 0);
        let unit = stage_params(&w.model, 1, 1, 0, true, true);
        assert!((m2.params + m2.grads + m2.optimizer - (4.0 * psi + 12.0 * psi / n + 4.0 * unit)).abs() < 1.0);
        let m3 = stage_memory(&w, &layout(4, 3), 0);
        let expect = 16.0 * psi / n + 4.0 * unit + 2.0 * 4.0 * unit;
        assert!((m3.params + m3.grads + m3.optimizer - expect).abs() < 1.0);
        assert!(m0.total() > m1.total() && m1.total() > m2.total() && m2.total() > m3.total());
        // one replica: nothing to shard
        assert_eq!(stage_memory(&w, &layout(1, 3), 0).params, 4.0 * psi);
    }

    #[test]
    fn activations_follow_weft_and_the_schedule() {
        let w = work();
        // 32 rows of 1024 tokens on one rank, f32: a block keeps 4C f32 (norms, residual sums),
        // 4C + 2I products (I = 4C), 4 norm statistics and 12 heads' log-sum-exp (c_proj adds
        // bias and residual in its own op); the ends the ids (8 bytes), the embeddings' sum (C;
        // the lookups only a sum reads are freed), the final norm (C + 2), the logits and their
        // gradient (2V), the loss's 3 numbers
        let f32w = Workload {
            precision: Precision::F32,
            ..w.clone()
        };
        let (c, v) = (768.0, 50257.0);
        let block = 4.0 * (16.0 * c + 4.0 + 12.0);
        let ends = 8.0 + 4.0 * c + 4.0 * (c + 2.0) + 8.0 * v + 12.0;
        let expect = 32.0 * 1024.0 * (12.0 * block + ends);
        assert_eq!(stage_memory(&f32w, &layout(1, 0), 0).activations, expect);
        // a pipeline of 4 with 8 micro-batches: 1F1B holds 4 on the first stage, GPipe 8
        let mut l = layout(1, 0);
        l.pp = 4;
        l.micro_batches = 8;
        l.stage_blocks = vec![3; 4];
        let one_f = stage_memory(&f32w, &l, 0).activations;
        let one_f_bf16 = stage_memory(&w, &l, 0).activations;
        l.schedule = Schedule::GPipe;
        let gpipe = stage_memory(&f32w, &l, 0).activations;
        assert_eq!(gpipe, 2.0 * one_f);
        // under bf16 the micro-batches in flight share the stage's weight copies
        let copies = activations::weight_copy_bytes(&w.model, Precision::Bf16, 1, 3, false);
        let gpipe_bf16 = stage_memory(&w, &l, 0).activations;
        assert!((gpipe_bf16 - copies - 2.0 * (one_f_bf16 - copies)).abs() < 1.0);
        l.recompute = true;
        assert!(stage_memory(&f32w, &l, 0).activations < one_f / 3.0);
    }
}

#[cfg(test)]
mod weft_holds {
    //! Activations and gathered units as weft holds them: f32 where autocast keeps f32, the
    //! whole tensors a tensor-parallel rank keeps, ZeRO-3's f32 units.
    use super::*;
    use crate::layout::{CommDtype, Schedule};
    use crate::model::tests::gpt2_small;
    use crate::model::{ModelKind, Precision};

    fn layout(dp: usize, tp: usize, pp: usize, zero: usize, m: usize, stage_blocks: Vec<usize>) -> Layout {
        Layout {
            dp,
            tp,
            pp,
            zero,
            micro_batches: m,
            schedule: Schedule::OneFOneB,
            recompute: false,
            comm_dtype: CommDtype::F32,
            stage_blocks,
        }
    }

    #[test]
    fn bf16_keeps_norms_the_residual_stream_and_the_loss_in_f32() {
        let w = Workload {
            model: gpt2_small(),
            global_batch: 32,
            precision: Precision::Bf16,
            grad_accum: 1,
            optimizer_moments: 2,
            kv_repeated: false,
            fused_accumulation: false,
        };
        let (c, v) = (768.0, 50257.0);
        // per block: residual sums (2C), norm statistics and log-sum-exp in f32; q, k, v, the
        // attention's output (4C), the MLP's sum with the bias and its GELU (2I = 8C) in bf16;
        // each product's bf16 copy of its norm output (2C); nothing of the c_proj outputs (only
        // a bias, a cast and the residual sum read them)
        let block = 4.0 * (2.0 * c + 4.0 + 12.0) + 2.0 * 12.0 * c + 2.0 * 2.0 * c;
        // the ends: ids, the embeddings' sum (C) in f32; the final norm's statistics in f32 and
        // its bf16 output, the logits' f32 copy and gradient, the loss's 3 numbers
        let ends = 8.0 + 4.0 * c + 8.0 + 2.0 * c + 8.0 * v + 12.0;
        // and the bf16 copy of every product's weights (not the biases': only sums read
        // them), the output layer's too
        let copies = 2.0 * (12.0 * 12.0 * c * c + v * c);
        let got = stage_memory(&w, &layout(1, 1, 1, 0, 1, vec![12]), 0).activations;
        assert_eq!(got, 32.0 * 1024.0 * (12.0 * block + ends) + copies);
        // less than the f32 run's: the halved products outweigh the copies
        let f32w = Workload {
            precision: Precision::F32,
            ..w.clone()
        };
        let all_f32 = stage_memory(&f32w, &layout(1, 1, 1, 0, 1, vec![12]), 0).activations;
        assert!(got < all_f32, "{got} {all_f32}");
    }

    #[test]
    fn bf16_weight_copies_are_held_once_a_step() {
        let w = Workload {
            model: gpt2_small(),
            global_batch: 32,
            precision: Precision::Bf16,
            grad_accum: 1,
            optimizer_moments: 2,
            kv_repeated: false,
            fused_accumulation: false,
        };
        // pp 4, 8 micro-batches of 4 rows: stage 0 of 1F1B holds 4 graphs, which share one
        // bf16 copy of the stage's 3 blocks' product weights (one autocast region a step)
        let mut l = layout(1, 1, 4, 0, 8, vec![3; 4]);
        let tokens = 4.0 * 1024.0;
        let copies = activations::weight_copy_bytes(&w.model, Precision::Bf16, 1, 3, false);
        assert_eq!(copies, 2.0 * 3.0 * 12.0 * 768.0 * 768.0);
        let one = activations::micro_batch_bytes(&w.model, Precision::Bf16, 1, false, 3, (true, false), tokens);
        assert_eq!(stage_memory(&w, &l, 0).activations, 4.0 * (one - copies) + copies);
        // interleaved, pp 2 with 2 chunks of 3 blocks a stage: stage 0 runs virtual stages 0
        // (with the embeddings) and 2; the peak is whole graphs of each chunk plus each chunk's
        // copies once
        let mut il = layout(1, 1, 2, 0, 8, vec![6; 2]);
        il.schedule = Schedule::Interleaved(2);
        let tokens = 4.0 * 1024.0;
        let chunk_copies = activations::weight_copy_bytes(&w.model, Precision::Bf16, 1, 3, false);
        let graph = |first| {
            activations::micro_batch_bytes(&w.model, Precision::Bf16, 1, false, 3, (first, false), tokens)
                - chunk_copies
        };
        let peak = stage_memory(&w, &il, 0).activations;
        let fits = (0..=8).any(|a| {
            (0..=8).any(|b| (a as f64 * graph(true) + b as f64 * graph(false) + 2.0 * chunk_copies - peak).abs() < 1.0)
        });
        assert!(fits, "{peak}");
        // recomputed: each keeps its ids, and only the micro-batch rebuilt holds a graph and
        // its copies (the forward under no_grad keeps none)
        l.recompute = true;
        assert_eq!(stage_memory(&w, &l, 0).activations, 4.0 * tokens * 8.0 + one);
        // f32 makes no copies
        assert_eq!(
            activations::weight_copy_bytes(&w.model, Precision::F32, 1, 3, false),
            0.0
        );
    }

    #[test]
    fn tensor_parallel_ranks_keep_what_weft_measured() {
        // weft's built-in GPT (vocab 128, block 64, 4 layers, width 128, biases, f32, batch 16)
        // as dp1 tp2 pp2 m4 1f1b on [2, 2]: rank 0's pipeline logged 5.80 MB of activations
        // (`weft launch --nproc-per-node 4 -- weft train` with that layout, 4 steps; 9.53 MB
        // before autograd kept only what backward formulas read)
        let model = ModelShape {
            kind: ModelKind::Gpt,
            vocab: 128,
            seq_len: 64,
            n_layer: 4,
            n_head: 4,
            n_kv_head: 4,
            n_embd: 128,
            intermediate: 512,
            tied: true,
            bias: true,
        };
        let w = Workload {
            model,
            global_batch: 16,
            precision: Precision::F32,
            grad_accum: 1,
            optimizer_moments: 2,
            kv_repeated: false,
            fused_accumulation: false,
        };
        let got = stage_memory(&w, &layout(1, 2, 2, 0, 4, vec![2, 2]), 0).activations;
        assert!((got / 5.80e6 - 1.0).abs() < 0.03, "{got}");
        // the same with recompute: 2.90 MB logged (4.77 before)
        let mut rc = layout(1, 2, 2, 0, 4, vec![2, 2]);
        rc.recompute = true;
        let got = stage_memory(&w, &rc, 0).activations;
        assert!((got / 2.90e6 - 1.0).abs() < 0.06, "{got}");
        // without tensor parallelism (dp1 tp1 pp4 m4, one block a stage): 8.96 MB logged (9.61
        // before)
        let got = stage_memory(&w, &layout(1, 1, 4, 0, 4, vec![1; 4]), 0).activations;
        assert!((got / 8.96e6 - 1.0).abs() < 0.03, "{got}");
        // bf16, dp1 tp2 pp2 m4: 4.09 MB logged on the first stage, whose two micro-batches in
        // flight share one bf16 copy of the stage's weights (4.49 MB when each had its own)
        let bf16 = Workload {
            precision: Precision::Bf16,
            ..w.clone()
        };
        let got = stage_memory(&bf16, &layout(1, 2, 2, 0, 4, vec![2, 2]), 0).activations;
        assert!((got / 4.09e6 - 1.0).abs() < 0.03, "{got}");
        // and with recompute, whose region keeps no casts: 2.25 MB logged
        let got = stage_memory(&bf16, &rc, 0).activations;
        assert!((got / 2.25e6 - 1.0).abs() < 0.06, "{got}");
    }

    #[test]
    fn zero3_fills_gathered_units_in_f32() {
        let w = Workload {
            model: gpt2_small(),
            global_batch: 32,
            precision: Precision::Bf16,
            grad_accum: 1,
            optimizer_moments: 2,
            kv_repeated: false,
            fused_accumulation: false,
        };
        let psi = w.model.parameter_count();
        // the largest unit: the root (embeddings, final norm)
        let unit = stage_params(&w.model, 1, 1, 0, true, true);
        let mut l = layout(4, 1, 1, 3, 1, vec![12]);
        l.comm_dtype = CommDtype::Bf16;
        // the running unit in f32 and the next one's bf16 gather buffer
        let m = stage_memory(&w, &l, 0);
        assert!((m.params - (4.0 * psi / 4.0 + (4.0 + 2.0) * unit)).abs() < 1.0, "{m:?}");
        l.comm_dtype = CommDtype::F32;
        let f = stage_memory(&w, &l, 0);
        assert!((f.params - (4.0 * psi / 4.0 + 8.0 * unit)).abs() < 1.0, "{f:?}");
    }
}
