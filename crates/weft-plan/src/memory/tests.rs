//! Tests of the per-stage memory terms: ZeRO's sharding, activations under each schedule, and
//! the interleaved walk against the whole list of passes.

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
        pipeline_dtype: CommDtype::F32,
        sequence_parallel: false,
        stage_blocks: vec![12],
    }
}

/// The walk of an interleaved stage's passes that passes over whole periods holds what the
/// whole list of passes (`Schedule::chunk_order`) holds.
#[test]
fn interleaved_activations_are_the_runtime_orders_walked_pass_by_pass() {
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
                // whole groups of pp micro-batches, and counts that share out leftovers
                for m in (pp..=13 * pp).filter(|m| m % pp == 0 || m % 3 == 1 || *m < 2 * pp) {
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
    let m2 = stage_memory(&w, &layout(4, 2), 0);
    assert!((m2.params + m2.grads + m2.optimizer - (4.0 * psi + 12.0 * psi / n)).abs() < 1.0);
    let m3 = stage_memory(&w, &layout(4, 3), 0);
    assert!((m3.params + m3.grads + m3.optimizer - 16.0 * psi / n).abs() < 1.0);
    // while a step runs, stages 2 and 3 also hold one unit's whole gradients, and stage 3 the
    // unit running and the next one's gather buffer (f32 here), beside stage 1 and 2's
    // gathered unit: buffers, not the state kept between steps
    let unit = stage_params(&w.model, 1, 1, 0, true, true);
    let m1 = stage_memory(&w, &layout(4, 1), 0);
    let buckets = 2.0 * crate::memory::BUCKET_BYTES;
    assert!((m1.comm_buffers - (buckets + 4.0 * unit)).abs() < 1.0, "{m1:?}");
    assert!((m2.comm_buffers - (4.0 + 4.0) * unit).abs() < 1.0, "{m2:?}");
    assert!((m3.comm_buffers - (4.0 + 8.0) * unit).abs() < 1.0, "{m3:?}");
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
