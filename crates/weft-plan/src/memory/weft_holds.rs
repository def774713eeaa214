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
        pipeline_dtype: CommDtype::F32,
        sequence_parallel: false,
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
        activations::micro_batch_bytes(&w.model, Precision::Bf16, 1, false, 3, (first, false), tokens) - chunk_copies
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
        head_dim: 32,
        intermediate: 512,
        tied: true,
        bias: true,
        qk_norm: false,
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
    // the shard between steps; while a step runs, the unit's whole gradients, the running unit
    // in f32 and the next one's bf16 gather buffer
    let m = stage_memory(&w, &l, 0);
    assert!((m.params - 4.0 * psi / 4.0).abs() < 1.0, "{m:?}");
    assert!((m.comm_buffers - (4.0 + 4.0 + 2.0) * unit).abs() < 1.0, "{m:?}");
    l.comm_dtype = CommDtype::F32;
    let f = stage_memory(&w, &l, 0);
    assert!((f.comm_buffers - (4.0 + 8.0) * unit).abs() < 1.0, "{f:?}");
}
