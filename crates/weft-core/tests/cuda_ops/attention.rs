//! The attention family on a GPU against the CPU: `scaled_dot_product_attention` and
//! `qkv_attention`, forward and backward (through `compare(.., grad: true, ..)`), causal and not,
//! in f32, bf16, f16 and f64; sizes that are not multiples of 32, one query, keys longer or
//! shorter than the queries, heads wider than one pass of the kernels (128 columns), strided and
//! broadcast inputs, and empty ones.

use super::{assert_close, compare, gpu, randn, tolerance};
use weft_core::ops::execute;
use weft_core::{DType, Device, Op, Tensor};

/// `scaled_dot_product_attention(t[0], t[1], t[2])`.
fn sdpa(causal: bool, scale: Option<f64>) -> impl Fn(&[Tensor]) -> Tensor {
    move |t| Tensor::scaled_dot_product_attention(&t[0], &t[1], &t[2], causal, scale).expect("attention")
}

/// `t[0].qkv_attention(heads)`.
fn qkv(heads: usize, causal: bool) -> impl Fn(&[Tensor]) -> Tensor {
    move |t| t[0].qkv_attention(heads, causal, None).expect("qkv_attention")
}

/// q `[.., t, d]`, k `[.., s, d]`, v `[.., s, dv]` with leading dims `lead`, random.
fn qkv_inputs(lead: &[usize], t: usize, s: usize, d: usize, dv: usize, dtype: DType, seed: u64) -> Vec<Tensor> {
    let shape = |rows: usize, cols: usize| [lead, &[rows, cols]].concat();
    vec![
        randn(&shape(t, d), dtype, seed),
        randn(&shape(s, d), dtype, seed + 1),
        randn(&shape(s, dv), dtype, seed + 2),
    ]
}

/// Attention over `[b, h, t, d]` inputs (keys `s` long, values `dv` wide), causal and not,
/// forward and backward.
#[allow(clippy::too_many_arguments)]
fn sdpa_case(dev: Device, what: &str, dtype: DType, b: usize, h: usize, t: usize, s: usize, d: usize, dv: usize) {
    let inputs = qkv_inputs(&[b, h], t, s, d, dv, dtype, 10);
    for causal in [false, true] {
        compare(
            &format!("attention {what} {dtype:?} causal={causal}"),
            dev,
            &inputs,
            true,
            tolerance(dtype),
            sdpa(causal, None),
        );
    }
}

#[test]
fn attention_matches_the_cpu_in_f32() {
    let Some(dev) = gpu("attention_matches_the_cpu_in_f32") else {
        return;
    };
    // T not a multiple of 32, B * H > 1, D = 16
    sdpa_case(dev, "[2,3,37,16]", DType::F32, 2, 3, 37, 37, 16, 16);
    // GPT-2's head dim, three tiles of keys
    sdpa_case(dev, "[2,2,70,64]", DType::F32, 2, 2, 70, 70, 64, 64);
    // one query and one key
    sdpa_case(dev, "[1,2,1,16]", DType::F32, 1, 2, 1, 1, 16, 16);
    // exactly one tile, and one past it
    sdpa_case(dev, "[1,1,32,8]", DType::F32, 1, 1, 32, 32, 8, 8);
    sdpa_case(dev, "[1,1,33,8]", DType::F32, 1, 1, 33, 33, 8, 8);
}

#[test]
fn attention_with_other_key_lengths_and_value_widths() {
    let Some(dev) = gpu("attention_with_other_key_lengths_and_value_widths") else {
        return;
    };
    // more keys than queries (the causal mask stays aligned at the first key), other value width
    sdpa_case(dev, "t=20 s=45 dv=24", DType::F32, 2, 2, 20, 45, 16, 24);
    // fewer keys than queries: queries past the last key see every key
    sdpa_case(dev, "t=40 s=9", DType::F32, 1, 3, 40, 9, 16, 16);
    // heads wider than one pass of the kernels (128 columns): several passes
    sdpa_case(dev, "d=160 dv=136", DType::F32, 1, 2, 35, 35, 160, 136);
    // narrow heads
    sdpa_case(dev, "d=3 dv=5", DType::F32, 2, 1, 11, 11, 3, 5);
}

#[test]
fn attention_of_other_ranks_and_scales() {
    let Some(dev) = gpu("attention_of_other_ranks_and_scales") else {
        return;
    };
    let tol = tolerance(DType::F32);
    for causal in [false, true] {
        let rank3 = qkv_inputs(&[5], 29, 29, 16, 16, DType::F32, 20);
        compare(
            &format!("attention rank 3 causal={causal}"),
            dev,
            &rank3,
            true,
            tol,
            sdpa(causal, None),
        );
        let rank2 = qkv_inputs(&[], 19, 23, 8, 12, DType::F32, 30);
        compare(
            &format!("attention rank 2 causal={causal}"),
            dev,
            &rank2,
            true,
            tol,
            sdpa(causal, None),
        );
        let rank5 = qkv_inputs(&[2, 2, 2], 9, 9, 4, 4, DType::F32, 40);
        compare(
            &format!("attention rank 5 causal={causal}"),
            dev,
            &rank5,
            true,
            tol,
            sdpa(causal, Some(0.3)),
        );
    }
}

#[test]
fn attention_of_strided_and_broadcast_inputs() {
    let Some(dev) = gpu("attention_of_strided_and_broadcast_inputs") else {
        return;
    };
    let tol = tolerance(DType::F32);
    let (b, h, t, d) = (2, 3, 37, 16);
    // As nanoGPT calls it: q, k, v viewed [B, T, H, D] -> [B, H, T, D] (permuted, not contiguous),
    // and k a narrowed view of a longer tensor.
    let inputs = vec![
        randn(&[b, t, h, d], DType::F32, 50),
        randn(&[b, t + 4, h, d], DType::F32, 51),
        randn(&[b, t, h, d], DType::F32, 52),
    ];
    for causal in [false, true] {
        compare(
            &format!("attention permuted causal={causal}"),
            dev,
            &inputs,
            true,
            tol,
            move |x| {
                let q = x[0].permute(&[0, 2, 1, 3]).unwrap();
                let k = x[1].narrow(1, 2, t).unwrap().permute(&[0, 2, 1, 3]).unwrap();
                let v = x[2].permute(&[0, 2, 1, 3]).unwrap();
                sdpa(causal, None)(&[q, k, v])
            },
        );
    }
    // k and v shared by every head (broadcast, stride 0), and a transposed last dim on q.
    let inputs = vec![
        randn(&[b, h, d, t], DType::F32, 53),
        randn(&[b, 1, t, d], DType::F32, 54),
        randn(&[b, 1, t, d], DType::F32, 55),
    ];
    for causal in [false, true] {
        compare(
            &format!("attention broadcast causal={causal}"),
            dev,
            &inputs,
            true,
            tol,
            move |x| {
                let q = x[0].permute(&[0, 1, 3, 2]).unwrap();
                let k = x[1].expand(&[b, h, t, d]).unwrap();
                let v = x[2].expand(&[b, h, t, d]).unwrap();
                sdpa(causal, None)(&[q, k, v])
            },
        );
    }
    // The output itself is a strided view: attention of attention's output.
    let inputs = qkv_inputs(&[b, h], t, t, d, d, DType::F32, 56);
    compare("attention of an attention output", dev, &inputs, true, tol, |x| {
        let o = sdpa(true, None)(x);
        sdpa(false, None)(&[o.clone(), x[1].clone(), o])
    });
}

#[test]
fn attention_in_low_and_double_precision() {
    let Some(dev) = gpu("attention_in_low_and_double_precision") else {
        return;
    };
    for dtype in [DType::BF16, DType::F16, DType::F64] {
        sdpa_case(dev, "[2,3,37,16]", dtype, 2, 3, 37, 37, 16, 16);
        sdpa_case(dev, "[1,2,70,64]", dtype, 1, 2, 70, 70, 64, 64);
        sdpa_case(dev, "[1,1,1,16]", dtype, 1, 1, 1, 1, 16, 16);
    }
}

#[test]
fn attention_of_empty_inputs() {
    let Some(dev) = gpu("attention_of_empty_inputs") else {
        return;
    };
    let tol = tolerance(DType::F32);
    for causal in [false, true] {
        // no problems, no queries
        compare(
            "attention b=0",
            dev,
            &qkv_inputs(&[0, 2], 5, 5, 4, 4, DType::F32, 60),
            true,
            tol,
            sdpa(causal, None),
        );
        compare(
            "attention t=0",
            dev,
            &qkv_inputs(&[2, 2], 0, 5, 4, 4, DType::F32, 61),
            true,
            tol,
            sdpa(causal, None),
        );
        // no keys: zeros
        compare(
            "attention s=0",
            dev,
            &qkv_inputs(&[2, 2], 5, 0, 4, 4, DType::F32, 62),
            true,
            tol,
            sdpa(causal, None),
        );
    }
}

/// Runs `forward` on `inputs` through `ops::execute` on the CPU and on `dev` and compares every
/// output (the result and the saved log-sum-exp); then runs `backward` on the same inputs, the
/// CPU's outputs and a random output gradient on both devices and compares the gradients. Needs
/// no other op family on the GPU.
fn raw_case(dev: Device, what: &str, forward: Op, backward: Op, inputs: &[Tensor], tol: f64) {
    let on = |ts: &[Tensor]| -> Vec<Tensor> { ts.iter().map(|t| t.to(dev).expect("to gpu")).collect() };
    let run = |op: &Op, ts: &[Tensor]| -> Vec<Tensor> {
        let r: Vec<&Tensor> = ts.iter().collect();
        execute(op, &r).unwrap_or_else(|e| panic!("{what}: {}: {e}", op.name()))
    };
    let want = run(&forward, inputs);
    let got = run(&forward, &on(inputs));
    assert_eq!(got.len(), want.len(), "{what}: outputs");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.device(), dev, "{what}: output {i} left the GPU");
        assert_close(&format!("{what}: forward output {i}"), g, w, tol);
    }
    let grad = randn(want[0].shape(), want[0].dtype(), 77);
    let mut args = inputs.to_vec();
    args.extend([want[0].clone(), want[1].clone(), grad]);
    // (q, k, v, out, lse, grad) or (qkv, out, lse, grad)
    let want = run(&backward, &args);
    let got = run(&backward, &on(&args));
    assert_eq!(got.len(), want.len(), "{what}: gradients");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.device(), dev, "{what}: gradient {i} left the GPU");
        assert_close(&format!("{what}: gradient {i}"), g, w, tol);
    }
}

#[test]
fn raw_ops_match_the_cpu_with_their_saved_tensors() {
    let Some(dev) = gpu("raw_ops_match_the_cpu_with_their_saved_tensors") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16, DType::F64] {
        for causal in [false, true] {
            let scale = 0.25;
            let inputs = qkv_inputs(&[2, 3], 37, 45, 16, 24, dtype, 70);
            raw_case(
                dev,
                &format!("raw attention {dtype:?} causal={causal}"),
                Op::Attention { causal, scale },
                Op::AttentionBackward { causal, scale },
                &inputs,
                tolerance(dtype),
            );
            let inputs = vec![randn(&[2, 37, 3 * 48], dtype, 71)];
            raw_case(
                dev,
                &format!("raw qkv_attention {dtype:?} causal={causal}"),
                Op::QkvAttention {
                    heads: 3,
                    causal,
                    scale,
                },
                Op::QkvAttentionBackward {
                    heads: 3,
                    causal,
                    scale,
                },
                &inputs,
                tolerance(dtype),
            );
        }
    }
}

#[test]
fn qkv_attention_matches_the_cpu() {
    let Some(dev) = gpu("qkv_attention_matches_the_cpu") else {
        return;
    };
    // heads = 3 of 16 columns, T not a multiple of 32
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        let x = randn(&[2, 37, 3 * 48], dtype, 80);
        for causal in [false, true] {
            compare(
                &format!("qkv_attention heads=3 {dtype:?} causal={causal}"),
                dev,
                std::slice::from_ref(&x),
                true,
                tolerance(dtype),
                qkv(3, causal),
            );
        }
    }
    let tol = tolerance(DType::F32);
    for causal in [false, true] {
        // GPT-2's head dim, three tiles
        let x = randn(&[2, 70, 3 * 128], DType::F32, 81);
        compare(
            "qkv_attention heads=2 hd=64",
            dev,
            std::slice::from_ref(&x),
            true,
            tol,
            qkv(2, causal),
        );
        // one token
        let x = randn(&[3, 1, 3 * 32], DType::F32, 82);
        compare(
            "qkv_attention T=1",
            dev,
            std::slice::from_ref(&x),
            true,
            tol,
            qkv(4, causal),
        );
        // heads wider than one pass
        let x = randn(&[1, 20, 3 * 2 * 144], DType::F32, 83);
        compare(
            "qkv_attention hd=144",
            dev,
            std::slice::from_ref(&x),
            true,
            tol,
            qkv(2, causal),
        );
    }
}

#[test]
fn qkv_attention_of_strided_and_empty_inputs() {
    let Some(dev) = gpu("qkv_attention_of_strided_and_empty_inputs") else {
        return;
    };
    let tol = tolerance(DType::F32);
    for causal in [false, true] {
        // rows of the projection further apart than 3C (a narrowed view)
        let x = randn(&[2, 21, 3 * 48 + 7], DType::F32, 90);
        compare(
            "qkv_attention narrowed",
            dev,
            std::slice::from_ref(&x),
            true,
            tol,
            move |t| qkv(3, causal)(&[t[0].narrow(2, 5, 3 * 48).unwrap()]),
        );
        // batch and time swapped in memory (permuted)
        let x = randn(&[21, 2, 3 * 48], DType::F32, 91);
        compare(
            "qkv_attention permuted",
            dev,
            std::slice::from_ref(&x),
            true,
            tol,
            move |t| qkv(3, causal)(&[t[0].permute(&[1, 0, 2]).unwrap()]),
        );
        // a broadcast batch (stride 0)
        let x = randn(&[1, 13, 3 * 24], DType::F32, 92);
        compare(
            "qkv_attention broadcast",
            dev,
            std::slice::from_ref(&x),
            true,
            tol,
            move |t| qkv(2, causal)(&[t[0].expand(&[3, 13, 3 * 24]).unwrap()]),
        );
        // empty (forward only for T = 0: the CPU's backward panics there, indexing past an
        // empty projection in `cpu::attention::Mats::at`)
        let x = randn(&[2, 0, 3 * 24], DType::F32, 93);
        compare(
            "qkv_attention T=0",
            dev,
            std::slice::from_ref(&x),
            false,
            tol,
            qkv(2, causal),
        );
        let x = randn(&[0, 5, 3 * 24], DType::F32, 94);
        compare(
            "qkv_attention B=0",
            dev,
            std::slice::from_ref(&x),
            true,
            tol,
            qkv(2, causal),
        );
    }
}
