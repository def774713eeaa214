//! The cost model's tests: each term against its formula, on the built-in specs.

use super::*;
use crate::layout::{CommDtype, Schedule};
use crate::model::tests::gpt2_small;
use crate::model::{ModelShape, Precision};

/// gpt2-small's 12 blocks cut evenly over `pp` stages, ZeRO 0, 1F1B, no recompute, f32.
fn plain(dp: usize, tp: usize, pp: usize, micro_batches: usize) -> Layout {
    Layout {
        dp,
        tp,
        pp,
        zero: 0,
        micro_batches,
        schedule: Schedule::OneFOneB,
        recompute: false,
        comm_dtype: CommDtype::F32,
        pipeline_dtype: CommDtype::F32,
        sequence_parallel: false,
        stage_blocks: vec![12 / pp; pp],
    }
}

fn work() -> Workload {
    Workload {
        model: gpt2_small(),
        global_batch: 64,
        precision: Precision::Bf16,
        grad_accum: 1,
        optimizer_moments: 2,
        kv_repeated: false,
        fused_accumulation: false,
    }
}

#[test]
fn ranks_that_share_compute_take_turns() {
    let w = work();
    let d = DeviceSpec {
        devices_per_node: 4,
        ..DeviceSpec::builtin("h100-sxm-80gb").unwrap()
    };
    let shared = DeviceSpec {
        shared_compute: Some(2.0),
        ..d.clone()
    };
    let layout = |dp, pp, m| plain(dp, 1, pp, m);
    // four data-parallel ranks on two devices' worth of compute: twice the compute
    let (own, two) = (
        step_time(&w, &d, &layout(4, 1, 1)),
        step_time(&w, &shared, &layout(4, 1, 1)),
    );
    let compute = |t: &StepTime| t.pipeline + t.optimizer;
    assert!((compute(&two) / compute(&own) - 2.0).abs() < 1e-9, "{two:?} {own:?}");
    // one micro-batch through four stages: one rank computes at a time, at the full rate;
    // on shared cores the receiver's copy of each of the 6 messages is CPU work too
    let (own, two) = (
        step_time(&w, &d, &layout(1, 4, 1)),
        step_time(&w, &shared, &layout(1, 4, 1)),
    );
    let u = unit_times(&w, &shared, 1, 1, 4, 64.0);
    let transfer = u.p2p - shared.link(1, 2).1;
    assert!(
        (two.pipeline - own.pipeline - 6.0 * transfer).abs() < 1e-12,
        "{two:?} {own:?}"
    );
    // many micro-batches through four stages on two cores: more than the work over the
    // cores, less than the pipeline with a core each plus that
    let (own, two) = (
        step_time(&w, &d, &layout(1, 4, 16)),
        step_time(&w, &shared, &layout(1, 4, 16)),
    );
    let work: f64 = own.stages.iter().sum::<f64>() * 16.0 / 2.0;
    assert!(
        two.pipeline > work && two.pipeline < own.pipeline + work,
        "{} vs {work}, {}",
        two.pipeline,
        own.pipeline
    );
}

#[test]
fn ring_collectives() {
    // 8 devices, 1 GB at 100 GB/s, no latency: 2 x 7/8 x 10 ms
    assert!((all_reduce(1e9, 8, (100e9, 0.0)) - 0.0175).abs() < 1e-12);
    assert!((gather(1e9, 8, (100e9, 0.0)) - 0.00875).abs() < 1e-12);
    assert_eq!(all_reduce(1e9, 1, (100e9, 1.0)), 0.0);
    assert!((all_reduce(0.0, 4, (1.0, 1e-6)) - 6e-6).abs() < 1e-15);
}

#[test]
fn one_device_is_compute_over_the_effective_peak() {
    let w = work();
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let l = plain(1, 1, 1, 1);
    let t = step_time(&w, &d, &l);
    let gemm = 3.0 * w.model.forward_flops_per_token() * 1024.0 * 64.0 / (989.5e12 * d.efficiency.gemm);
    // the rest is memory-bound work: norms and the residual stream (f32), activations, the
    // f32 logits of the loss
    assert!(t.step > 1.2 * gemm && t.step < 2.5 * gemm, "{} vs {gemm}", t.step);
    assert_eq!(t.exposed_comm, 0.0);
    let mfu_hbm = mfu(&w, &d, 1, t.step);
    // with unbounded memory bandwidth, only the products remain
    let fast = DeviceSpec {
        memory_bandwidth: 1e30,
        ..d.clone()
    };
    let t = step_time(&w, &fast, &l);
    assert!((t.step / gemm - 1.0).abs() < 1e-9, "{} vs {gemm}", t.step);
    assert!((mfu(&w, &fast, 1, t.step) - d.efficiency.gemm).abs() < 1e-9);
    assert!(mfu_hbm < 0.5);
}

#[test]
fn a_pass_cost_makes_small_micro_batches_dearer() {
    let w = work();
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let costed = DeviceSpec {
        pass_cost: crate::device::PassCost {
            time_scale: 1.0,
            block: 3e-3,
            ends: 6e-3,
        },
        ..d.clone()
    };
    let rows = 8.0;
    let (u, c) = (
        unit_times(&w, &d, 1, 1, 2, rows),
        unit_times(&w, &costed, 1, 1, 2, rows),
    );
    // a third of each pass's cost in the forward; the backward's two thirds follow
    assert!((c.block_forward - u.block_forward - 1e-3).abs() < 1e-12);
    assert!((c.embed_forward - u.embed_forward - 1e-3).abs() < 1e-12);
    assert!((c.head_forward - u.head_forward - 1e-3).abs() < 1e-12);
    assert!(
        (stage_time(&c, 6, true, false, false) - stage_time(&u, 6, true, false, false) - (6.0 * 3e-3 + 3e-3)).abs()
            < 1e-12
    );
    // the scale multiplies the compute alone, not the communication
    let doubled = DeviceSpec {
        pass_cost: crate::device::PassCost {
            time_scale: 2.0,
            ..Default::default()
        },
        ..d.clone()
    };
    let s = unit_times(&w, &doubled, 2, 1, 2, rows);
    let u2 = unit_times(&w, &d, 2, 1, 2, rows);
    assert!((s.block_forward - 2.0 * u2.block_forward).abs() < 1e-15);
    assert_eq!((s.block_comm, s.p2p), (u2.block_comm, u2.p2p));
    // through the pipeline: (m - 1) x the slowest stage's cost + every stage's, so more
    // micro-batches of the same batch cost more
    let layout = |m| plain(1, 1, 2, m);
    for m in [1usize, 8] {
        let extra = step_time(&w, &costed, &layout(m)).pipeline - step_time(&w, &d, &layout(m)).pipeline;
        let stage = 6.0 * 3e-3 + 3e-3;
        let want = (m as f64 - 1.0) * stage + 2.0 * stage;
        assert!((extra - want).abs() < 1e-9, "m={m}: {extra} vs {want}");
    }
}

#[test]
fn the_bubble_is_p_minus_1_over_m_plus_p_minus_1() {
    let w = work();
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let u = UnitTimes {
        block_forward: 1.0,
        ..UnitTimes::default()
    };
    assert_eq!(stage_time(&u, 3, false, false, false), 9.0);
    assert_eq!(stage_time(&u, 3, false, false, true), 12.0);
    let l = plain(1, 1, 4, 8);
    let t = step_time(&w, &d, &l);
    let slowest = t.stages.iter().cloned().fold(0.0, f64::max);
    assert_eq!(t.pipeline, 7.0 * slowest + t.stages.iter().sum::<f64>());
    // the last stage also runs the output layer: it is the slowest
    assert_eq!(slowest, t.stages[3]);
    // equal stages: the step is (m + p - 1) stage times, a bubble of (p - 1) / (m + p - 1)
    let busy = 8.0 * 9.0;
    assert!((pipeline_time(&[9.0; 4], 8) * (1.0 - 3.0 / 11.0) - busy).abs() < 1e-12);
    assert_eq!(pipeline_time(&[2.0, 5.0], 1), 7.0);
    // interleaved over v chunks: a bubble of (p - 1) / (v m + p - 1)
    for v in [2, 4] {
        let t = pipeline_time_chunked(&[9.0; 4], 8, v);
        let bubble = 3.0 / (8.0 * v as f64 + 3.0);
        assert!((t * (1.0 - bubble) - busy).abs() < 1e-9, "v={v}: {t}");
    }
    // through step_time: shorter than 1F1B for the same stages, with 2 v sends a micro-batch
    let interleaved = Layout {
        schedule: Schedule::Interleaved(2),
        ..l.clone()
    };
    let ti = step_time(&w, &d, &interleaved);
    assert!(ti.pipeline < t.pipeline, "{} vs {}", ti.pipeline, t.pipeline);
    let u = unit_times(&w, &d, 1, 1, 4, (w.pass_rows() / 8) as f64);
    // a middle stage sends 4 times a micro-batch (1F1B: 2), the first 3 (1F1B: 1)
    assert!((ti.stages[1] - (t.stages[1] + 2.0 * u.p2p)).abs() < 1e-15);
    assert!((ti.stages[0] - (t.stages[0] + 2.0 * u.p2p)).abs() < 1e-15);
    assert!((ti.stages[3] - (t.stages[3] + 2.0 * u.p2p)).abs() < 1e-15);
}

#[test]
fn micro_batches_after_the_first_add_their_gradients() {
    // the global batch of 64 rows in one micro-batch: nothing to add; over 2 replicas in
    // micro-batches of 4 rows, 8 a step: 7 of 8 add 12 bytes a parameter
    let w = work();
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let one = unit_times(&w, &d, 1, 1, 1, 64.0);
    assert_eq!(
        (one.block_accumulate, one.embed_accumulate, one.head_accumulate),
        (0.0, 0.0, 0.0)
    );
    let u = unit_times(&w, &d, 1, 2, 1, 4.0);
    let block = stage_params(&w.model, 1, 1, 1, false, false);
    let want = 7.0 / 8.0 * 12.0 * block / (3.35e12 * 0.70);
    assert!(
        (u.block_accumulate - want).abs() < 1e-15,
        "{} vs {want}",
        u.block_accumulate
    );
    assert!(u.embed_accumulate > 0.0 && u.head_accumulate > 0.0);
    // in the stage's time once a micro-batch, and in its backward
    let with = stage_time(&u, 12, true, true, false);
    let without = stage_time(
        &UnitTimes {
            block_accumulate: 0.0,
            embed_accumulate: 0.0,
            head_accumulate: 0.0,
            ..u
        },
        12,
        true,
        true,
        false,
    );
    let all = 12.0 * u.block_accumulate + u.embed_accumulate + u.head_accumulate;
    assert!((with - without - all).abs() < 1e-15);
    assert!(
        (stage_backward_time(&u, 12, true, true)
            - 2.0 * (12.0 * u.block_forward + u.embed_forward + u.head_forward)
            - all)
            .abs()
            < 1e-15
    );
}

#[test]
fn tensor_parallel_all_reduces_run_twice_a_micro_batch() {
    // weft's blocks: two all-reduces in the forward (bf16 partial sums), two in the
    // backward (f32 gradients of the norms' outputs); recompute repeats the forward's
    let w = work();
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let rows = 4.0;
    let u = unit_times(&w, &d, 8, 1, 2, rows);
    let hidden = rows * 1024.0 * 768.0;
    let link = d.link(1, 8);
    let (f, b) = (all_reduce(hidden * 2.0, 8, link), all_reduce(hidden * 4.0, 8, link));
    let block = stage_time(&u, 1, false, false, false) - 3.0 * u.block_forward - 2.0 * u.p2p - u.block_accumulate;
    assert!(
        (block - (2.0 * f + 2.0 * b)).abs() < 1e-12,
        "{block} vs {}",
        2.0 * f + 2.0 * b
    );
    let rc = stage_time(&u, 1, false, false, true) - 4.0 * u.block_forward - 2.0 * u.p2p - u.block_accumulate;
    assert!((rc - (4.0 * f + 2.0 * b)).abs() < 1e-12, "{rc}");
    // the embedding's one (forward) and the loss's (forward) and output layer's (backward)
    // are counted once each
    let first = stage_time(&u, 0, true, false, false) - 3.0 * u.embed_forward - u.p2p - u.embed_accumulate;
    assert!((first - b).abs() < 1e-12, "{first} vs {b}");
    let loss = all_reduce(rows * 1024.0 * 8.0, 8, link) + all_reduce(rows * 1024.0 * 16.0, 8, link);
    let last = stage_time(&u, 0, false, true, false) - 3.0 * u.head_forward - u.p2p - u.head_accumulate;
    assert!((last - (loss + b)).abs() < 1e-12, "{last}");
    // no tensor parallelism: no all-reduces
    let one = unit_times(&w, &d, 1, 1, 1, rows);
    assert_eq!(
        stage_time(&one, 2, false, false, true),
        8.0 * one.block_forward + 2.0 * one.block_accumulate
    );
}

#[test]
fn fused_accumulation_leaves_the_gradients_no_product_makes() {
    // gpt2-small (tied, biases) at tp 2 over 2 stages, 8 micro-batches a step
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let fused_work = Workload {
        fused_accumulation: true,
        ..work()
    };
    let (plain, fused) = (
        unit_times(&work(), &d, 2, 2, 2, 4.0),
        unit_times(&fused_work, &d, 2, 2, 2, 4.0),
    );
    let m = &fused_work.model;
    let per_param = 7.0 / 8.0 * 12.0 / (3.35e12 * 0.70);
    // a block: its biases (the column-parallel ones cut) and its two LayerNorms
    let (cut, whole) = m.block_vector_params_split();
    assert_eq!(cut, 3.0 * 768.0 + 3072.0);
    assert_eq!(whole, 2.0 * 768.0 + 4.0 * 768.0);
    let want = per_param * (cut / 2.0 + whole);
    assert!((fused.block_accumulate - want).abs() < 1e-15 * want.max(1.0));
    assert!(fused.block_accumulate < plain.block_accumulate / 400.0);
    // the embeddings' gradients are an index-add's: a pass either way
    assert_eq!(fused.embed_accumulate, plain.embed_accumulate);
    // the last stage's own copy of the tied output layer is a product's weight; its final
    // LayerNorm is not
    let want = per_param * 2.0 * 768.0;
    assert!((fused.head_accumulate - want).abs() < 1e-15 * want.max(1.0));
    assert!(plain.head_accumulate > 100.0 * fused.head_accumulate);
}

#[test]
fn zero_2_and_3_gain_nothing_from_fused_accumulation() {
    // stages 2 and 3 keep no whole gradient between micro-batches: every parameter's shard is
    // added in a pass of its own, fused or not
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let fused = Workload {
        global_batch: 256,
        fused_accumulation: true,
        ..work()
    };
    let unfused = Workload {
        fused_accumulation: false,
        ..fused.clone()
    };
    for zero in [1, 2, 3] {
        let layout = Layout {
            zero,
            ..plain(4, 1, 1, 8)
        };
        let (a, b) = (step_time(&fused, &d, &layout), step_time(&unfused, &d, &layout));
        if zero >= 2 {
            assert_eq!(a.step, b.step, "zero {zero}");
        } else {
            assert!(a.step < b.step, "zero {zero}: {} vs {}", a.step, b.step);
        }
    }
}

#[test]
fn gradient_accumulation_runs_the_pipeline_once_a_pass() {
    // 64 rows a step as 4 passes of 16: four pipelines of 16 rows, one reduction
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let l = plain(2, 1, 2, 2);
    let accum = Workload {
        grad_accum: 4,
        ..work()
    };
    let t = step_time(&accum, &d, &l);
    let u = unit_times(&accum, &d, 1, 2, 2, 4.0);
    assert_eq!(t.stages[0], stage_time(&u, 6, true, false, false));
    assert!((t.pipeline - 4.0 * pipeline_time(&t.stages, 2)).abs() < 1e-12);
    let once = step_time(&work(), &d, &l);
    assert_eq!(t.exposed_comm, once.exposed_comm);
}

#[test]
fn the_steps_loss_and_norm_are_reduced_over_every_rank() {
    // tensor parallelism alone: no data-parallel reduction, two all-reduces of one number (the
    // loss, and the norm of the sharded gradients) over the 2 ranks
    let w = work();
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let layout = plain(1, 2, 1, 1);
    let t = step_time(&w, &d, &layout);
    let one = all_reduce(8.0, 2, d.link(1, 2));
    assert!(
        one > 0.0 && (t.exposed_comm - 2.0 * one).abs() < 1e-15,
        "{} vs {one}",
        t.exposed_comm
    );
    // one rank: nothing to reduce
    let alone = step_time(&w, &d, &Layout { tp: 1, ..layout });
    assert_eq!(alone.exposed_comm, 0.0);
}

#[test]
fn zero_2_and_3_accumulate_their_shard() {
    let w = work();
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let u = unit_times(&w, &d, 1, 4, 1, 4.0);
    assert!(u.block_accumulate > 0.0);
    for zero in [0, 1] {
        assert_eq!(sharded_accumulation(u, zero, 4), u);
    }
    for zero in [2, 3] {
        let s = sharded_accumulation(u, zero, 4);
        assert_eq!(s.block_accumulate, u.block_accumulate / 4.0);
        assert_eq!(
            (s.embed_accumulate, s.head_accumulate),
            (u.embed_accumulate / 4.0, u.head_accumulate / 4.0)
        );
        assert_eq!(s.block_forward, u.block_forward);
    }
}

#[test]
fn zero_2_and_3_communicate_for_every_accumulated_pass() {
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    // the same rows a pass, one pass or four a step
    let one = Workload {
        global_batch: 16,
        ..work()
    };
    let four = Workload {
        global_batch: 64,
        grad_accum: 4,
        ..work()
    };
    for zero in 0..=3 {
        let layout = Layout {
            zero,
            ..plain(8, 1, 1, 1)
        };
        let (a, b) = (step_time(&one, &d, &layout), step_time(&four, &d, &layout));
        // plain data parallelism and ZeRO 1 reduce once a step; ZeRO 2 and 3 reduce-scatter
        // (what backward does not hide of it) every pass, and ZeRO 3 gathers every pass (the
        // step's own all-reduces and ZeRO 1-2's gather of the updated parameters are once a
        // step either way)
        let ratio = b.exposed_comm / a.exposed_comm;
        if zero >= 2 {
            assert!(ratio > 1.1, "zero {zero}: {a:?} {b:?}");
        } else {
            assert!((ratio - 1.0).abs() < 1e-9, "zero {zero}: {a:?} {b:?}");
        }
    }
}

#[test]
fn interleaved_chunks_reduce_their_gradients_under_the_passes_after_their_last_backward() {
    let one = Schedule::OneFOneB;
    // one chunk: under the last micro-batch's backward, the last bucket always exposed
    assert_eq!(exposed_reduction(10.0, 1.0, 4.0, &one, 4, 8), 6.0);
    assert_eq!(exposed_reduction(3.0, 1.0, 4.0, &one, 4, 8), 1.0);
    assert_eq!(exposed_reduction(0.5, 1.0, 4.0, &one, 4, 8), 0.5);
    // 2 chunks, 4 stages, 8 micro-batches (last group of 4), a chunk's backward pass 2 s:
    // chunk 1's half (5 s) starts at its last pass, 4 x 2 + 2 = 10 s before the end, and ends
    // 5 s before it; chunk 0's starts at its last pass, 2 s before the end: 3 s exposed
    let il = Schedule::Interleaved(2);
    assert_eq!(exposed_reduction(10.0, 1.0, 4.0, &il, 4, 8), 3.0);
    // a link too slow for chunk 1's to end in time: chunk 0's waits for it
    assert_eq!(exposed_reduction(30.0, 1.0, 4.0, &il, 4, 8), 15.0 - 10.0 + 15.0);
    // 10 s a chunk: with 8 micro-batches chunk 1's ends at the end, and chunk 0's follows it;
    // with 10 on 4 stages (groups of 5) chunk 1's starts 5 x 2 + 2 s before the end, ends 2 s
    // before it, and chunk 0's starts at its last pass
    assert_eq!(exposed_reduction(20.0, 1.0, 4.0, &il, 4, 8), 10.0);
    assert_eq!(exposed_reduction(20.0, 1.0, 4.0, &il, 4, 10), 8.0);
    // never more than the whole reduction, never less than the last bucket
    assert_eq!(exposed_reduction(0.5, 1.0, 4.0, &il, 4, 8), 0.5);
    assert_eq!(exposed_reduction(1.5, 1.0, 4.0, &il, 4, 8), 1.0);
}

#[test]
fn a_pipeline_sending_bf16_pays_half_the_bytes_and_the_same_latency() {
    let w = work();
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let l = plain(1, 1, 4, 8);
    let u = unit_times(&w, &d, 1, 1, 4, (w.pass_rows() / 8) as f64);
    let latency = d.link(1, 2).1;
    let half = on_the_wire(u, &d, 1, 1, 4, CommDtype::Bf16);
    assert!((half.p2p - (latency + (u.p2p - latency) / 2.0)).abs() < 1e-15);
    assert_eq!(on_the_wire(u, &d, 1, 1, 4, CommDtype::F32), u);
    // no pipeline, nothing sent
    assert_eq!(on_the_wire(u, &d, 1, 1, 1, CommDtype::Bf16), u);
    // through step_time: each stage's two sends a micro-batch (one on the ends) cost less
    let f32 = step_time(&w, &d, &l);
    let bf16 = step_time(
        &w,
        &d,
        &Layout {
            pipeline_dtype: CommDtype::Bf16,
            ..l.clone()
        },
    );
    let saved = u.p2p - half.p2p;
    assert!((f32.stages[1] - bf16.stages[1] - 2.0 * saved).abs() < 1e-15);
    assert!((f32.stages[0] - bf16.stages[0] - saved).abs() < 1e-15);
    assert!(bf16.step < f32.step);
}

#[test]
fn the_head_norms_gradients_are_summed_over_the_tensor_parallel_group() {
    // Qwen3-0.6B's q_norm and k_norm (128 each, whole on every rank): one all-reduce of each's
    // f32 gradient per block and micro-batch in the backward, sequence-parallel or not
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let normed = Workload {
        model: crate::model::tests::qwen3_0_6b(),
        ..work()
    };
    let plain = Workload {
        model: ModelShape {
            qk_norm: false,
            ..normed.model.clone()
        },
        ..normed.clone()
    };
    let rows = 4.0;
    for tp in [1, 2, 8] {
        let reduce = 2.0 * all_reduce(128.0 * 4.0, tp, d.link(1, tp));
        for sequence in [false, true] {
            let (n, p) = (
                unit_times_sequence(&normed, &d, tp, 1, 2, rows, sequence),
                unit_times_sequence(&plain, &d, tp, 1, 2, rows, sequence),
            );
            let what = format!("tp {tp} sequence {sequence}");
            assert_eq!(n.block_comm.forward, p.block_comm.forward, "{what}");
            assert!(
                (n.block_comm.backward - p.block_comm.backward - reduce).abs() < 1e-15,
                "{what}: {} vs {} + {reduce}",
                n.block_comm.backward,
                p.block_comm.backward
            );
            if tp > 1 {
                assert!(reduce > 0.0);
            }
            // the output layer's and the embedding's are the same
            assert_eq!((n.head_comm, n.embed_comm), (p.head_comm, p.embed_comm), "{what}");
        }
    }
    // sequence-parallel, the block's two RMSNorms (C each) are still two all-reduces of C, the
    // head norms two of hd, however wide the heads are beside C (here 2 hd = C)
    let (tp, c) = (8, 256.0);
    let link = d.link(1, tp);
    let narrow = Workload {
        model: ModelShape {
            n_embd: 256,
            ..normed.model.clone()
        },
        ..normed.clone()
    };
    let u = unit_times_sequence(&narrow, &d, tp, 1, 2, rows, true);
    let hidden = rows * 4096.0 * c;
    let both = gather(hidden * 4.0, tp, link) + gather(hidden * 2.0, tp, link);
    let want = 2.0 * both + 2.0 * all_reduce(c * 4.0, tp, link) + 2.0 * all_reduce(128.0 * 4.0, tp, link);
    assert!(
        (u.block_comm.backward - want).abs() < 1e-15,
        "{} vs {want}",
        u.block_comm.backward
    );
}

#[test]
fn the_head_norms_and_the_rotation_after_them_move_f32_bytes() {
    // with qk_norm, q and k go through the norms in f32 (read and write q + kv) and are rotated
    // in f32 (read and write again), where without it the rotation moves them in the products'
    // dtype: the same FLOPs, 16 (q + kv) bytes a token in place of 2 x act (q + kv)
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let normed = crate::model::tests::qwen3_0_6b();
    let plain = ModelShape {
        qk_norm: false,
        ..normed.clone()
    };
    let (rows, tp, q, kv) = (4.0, 2, 2048.0, 1024.0);
    let tokens = rows * 4096.0;
    let hbm = d.memory_bandwidth * d.efficiency.memory_bound;
    for (precision, act) in [(Precision::Bf16, 2.0), (Precision::F32, 4.0)] {
        let w = |model: &ModelShape| Workload {
            model: model.clone(),
            precision,
            ..work()
        };
        let (n, p) = (
            unit_times(&w(&normed), &d, tp, 1, 1, rows),
            unit_times(&w(&plain), &d, tp, 1, 1, rows),
        );
        let want = d.pass_cost.time_scale * tokens * (16.0 - 2.0 * act) * (q + kv) / tp as f64 / hbm;
        let got = n.block_forward - p.block_forward;
        assert!((got / want - 1.0).abs() < 1e-9, "{precision:?}: {got} vs {want}");
    }
}

#[test]
fn without_zero_the_whole_gradients_are_summed_once_a_step() {
    // gpt2-small cut over 2 ranks, sequence-parallel: a block's two layer norms (weight and
    // bias) and two row-parallel biases, 6 C numbers whole on every rank, and the final norm's
    // 2 C, summed over the group
    let d = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
    let c = 768.0;
    let link = d.link(1, 2);
    let w = Workload {
        grad_accum: 4,
        ..work()
    };
    let sums = whole_gradient_sums(&w, &d, 2, true);
    assert_eq!((sums.block_params, sums.head_params), (6.0 * c, 2.0 * c));
    let small = all_reduce(c * 4.0, 2, link);
    assert!(
        (sums.block - 6.0 * small).abs() < 1e-15 && (sums.head - 2.0 * small).abs() < 1e-15,
        "{sums:?}"
    );
    // nothing to sum on one rank, nor for a gpt without sequence parallelism
    assert_eq!(whole_gradient_sums(&w, &d, 1, true), WholeGradientSums::default());
    assert_eq!(whole_gradient_sums(&w, &d, 2, false), WholeGradientSums::default());

    // dp 1 (so no ZeRO), 4 passes a step: each pass's backward without the sums, and one
    // all-reduce of all 12 x 6 C + 2 C gradients after them, beside the loss's and the norm's
    let layout = Layout {
        sequence_parallel: true,
        ..plain(1, 2, 1, 1)
    };
    let t = step_time(&w, &d, &layout);
    let rows = w.pass_rows() as f64;
    let u = unit_times_sequence(&w, &d, 2, 1, 1, rows, true);
    let once = without_whole_gradient_sums(u, &sums);
    assert!(once.block_comm.backward < u.block_comm.backward);
    let pipeline = 4.0 * stage_time(&once, 12, true, true, false);
    assert!(
        (t.pipeline - pipeline).abs() < 1e-12 * pipeline,
        "{} vs {pipeline}",
        t.pipeline
    );
    let scalars = 2.0 * all_reduce(8.0, 2, d.link(1, 2));
    let exposed = all_reduce((12.0 * 6.0 * c + 2.0 * c) * 4.0, 2, link) + scalars;
    assert!(
        (t.exposed_comm - exposed).abs() < 1e-12,
        "{} vs {exposed}",
        t.exposed_comm
    );

    // with ZeRO (dp 2, stage 1) every pass sums them: the backward keeps its all-reduces
    let zero = Layout {
        zero: 1,
        ..plain(2, 2, 1, 1)
    };
    let zero = Layout {
        sequence_parallel: true,
        ..zero
    };
    let t = step_time(&w, &d, &zero);
    let u = unit_times_sequence(&w, &d, 2, 2, 1, rows / 2.0, true);
    let pipeline = 4.0 * stage_time(&u, 12, true, true, false);
    assert!(
        (t.pipeline - pipeline).abs() < 1e-12 * pipeline,
        "{} vs {pipeline}",
        t.pipeline
    );
}
