//! matmul (cuBLAS) and linear (cuBLAS and the epilogue kernel) against the CPU.

use super::{assert_close, compare, gpu, randn, tolerance};
use weft_core::{DType, Device, Tensor, UnaryOp};

/// `randn` scaled by `s` (products of many terms stay near 1).
fn randn_scaled(shape: &[usize], dtype: DType, seed: u64, s: f64) -> Tensor {
    randn(shape, DType::F32, seed)
        .mul_scalar(s)
        .and_then(|t| t.cast(dtype))
        .expect("scaled randn")
}

const FLOATS: [DType; 4] = [DType::F32, DType::BF16, DType::F16, DType::F64];

#[test]
fn matmul_matches_the_cpu_in_every_float_dtype() {
    let Some(dev) = gpu("matmul_matches_the_cpu_in_every_float_dtype") else {
        return;
    };
    for dtype in FLOATS {
        let tol = tolerance(dtype);
        // sizes not multiples of 32
        let (a, b) = (randn(&[37, 70], dtype, 1), randn(&[70, 45], dtype, 2));
        compare(&format!("matmul {dtype:?}"), dev, &[a, b], true, tol, |t| {
            t[0].matmul(&t[1]).unwrap()
        });
        // a long inner dim, a row longer than a block
        let (a, b) = (randn(&[9, 1031], dtype, 3), randn(&[1031, 300], dtype, 4));
        compare(&format!("matmul long K {dtype:?}"), dev, &[a, b], true, tol, |t| {
            t[0].matmul(&t[1]).unwrap()
        });
    }
}

#[test]
fn matmul_reads_transposed_and_narrowed_views() {
    let Some(dev) = gpu("matmul_reads_transposed_and_narrowed_views") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let tol = tolerance(dtype);
        let (a, b) = (randn(&[33, 20], dtype, 5), randn(&[17, 33], dtype, 6));
        // a^T (column-major) @ b^T (column-major)
        compare(
            &format!("a^T @ b^T {dtype:?}"),
            dev,
            &[a.clone(), b.clone()],
            true,
            tol,
            |t| t[0].t().unwrap().matmul(&t[1].t().unwrap()).unwrap(),
        );
        // narrowed columns (row stride larger than the row) @ a narrowed transpose
        compare(
            &format!("narrowed {dtype:?}"),
            dev,
            &[a.clone(), b.clone()],
            true,
            tol,
            |t| {
                let x = t[0].narrow(1, 3, 15).unwrap(); // [33, 15], row stride 20
                let y = t[1].t().unwrap().narrow(0, 2, 15).unwrap(); // [15, 17], column-major
                x.matmul(&y).unwrap()
            },
        );
        // a strided inner dim (every other column): copied dense first
        compare(
            &format!("every other column {dtype:?}"),
            dev,
            &[randn(&[6, 40], dtype, 7), randn(&[20, 5], dtype, 8)],
            false,
            tol,
            |t| {
                let x = t[0]
                    .reshape(&[6, 20, 2])
                    .unwrap()
                    .narrow(2, 0, 1)
                    .unwrap()
                    .reshape(&[6, 20])
                    .unwrap();
                x.matmul(&t[1]).unwrap()
            },
        );
    }
}

#[test]
fn batched_matmul_broadcasts_batch_dims() {
    let Some(dev) = gpu("batched_matmul_broadcasts_batch_dims") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let tol = tolerance(dtype);
        let cases: &[(&[usize], &[usize])] = &[
            (&[4, 5, 7], &[4, 7, 6]),           // one stride per operand
            (&[3, 5, 7], &[1, 7, 6]),           // b broadcast with stride 0
            (&[2, 3, 5, 7], &[3, 7, 4]),        // b broadcast over a leading dim: copied
            (&[4, 1, 5, 7], &[1, 3, 7, 6]),     // both broadcast
            (&[2, 3, 33, 65], &[2, 3, 65, 40]), // two batch dims, one stride
        ];
        for (i, (sa, sb)) in cases.iter().enumerate() {
            let (a, b) = (randn(sa, dtype, 10 + i as u64), randn(sb, dtype, 20 + i as u64));
            compare(
                &format!("batched {sa:?} @ {sb:?} {dtype:?}"),
                dev,
                &[a, b],
                true,
                tol,
                |t| t[0].matmul(&t[1]).unwrap(),
            );
        }
        // permuted batch dims and a rank-2 right operand on a non-contiguous left one
        let (a, b) = (randn(&[5, 3, 7], dtype, 30), randn(&[7, 4], dtype, 31));
        compare(&format!("permuted batch {dtype:?}"), dev, &[a, b], true, tol, |t| {
            t[0].permute(&[1, 0, 2]).unwrap().matmul(&t[1]).unwrap()
        });
        // transposed inner matrices inside a batch
        let (a, b) = (randn(&[3, 7, 5], dtype, 32), randn(&[3, 6, 7], dtype, 33));
        compare(&format!("batched transposes {dtype:?}"), dev, &[a, b], true, tol, |t| {
            t[0].t().unwrap().matmul(&t[1].t().unwrap()).unwrap()
        });
    }
}

#[test]
fn matmul_of_vectors_and_empty_operands() {
    let Some(dev) = gpu("matmul_of_vectors_and_empty_operands") else {
        return;
    };
    let tol = tolerance(DType::F32);
    compare(
        "vector @ matrix",
        dev,
        &[randn(&[7], DType::F32, 40), randn(&[7, 4], DType::F32, 41)],
        true,
        tol,
        |t| t[0].matmul(&t[1]).unwrap(),
    );
    compare(
        "matrix @ vector",
        dev,
        &[randn(&[5, 7], DType::F32, 42), randn(&[7], DType::F32, 43)],
        true,
        tol,
        |t| t[0].matmul(&t[1]).unwrap(),
    );
    // no rows; an empty inner dim gives zeros
    compare(
        "[0, 5] @ [5, 3]",
        dev,
        &[randn(&[0, 5], DType::F32, 46), randn(&[5, 3], DType::F32, 47)],
        false,
        tol,
        |t| t[0].matmul(&t[1]).unwrap(),
    );
    compare(
        "[4, 0] @ [0, 3]",
        dev,
        &[randn(&[4, 0], DType::F32, 48), randn(&[0, 3], DType::F32, 49)],
        false,
        tol,
        |t| t[0].matmul(&t[1]).unwrap(),
    );
    compare(
        "[0, 4, 2] @ [2, 3]",
        dev,
        &[randn(&[0, 4, 2], DType::F32, 50), randn(&[2, 3], DType::F32, 51)],
        false,
        tol,
        |t| t[0].matmul(&t[1]).unwrap(),
    );
}

#[test]
fn matmul_refuses_what_the_cpu_refuses() {
    let Some(dev) = gpu("matmul_refuses_what_the_cpu_refuses") else {
        return;
    };
    let a = Tensor::arange(0.0, 6.0, 1.0, DType::I64)
        .unwrap()
        .reshape(&[2, 3])
        .unwrap();
    let b = Tensor::arange(0.0, 6.0, 1.0, DType::I64)
        .unwrap()
        .reshape(&[3, 2])
        .unwrap();
    let cpu = a.matmul(&b).unwrap_err().to_string();
    let on = |t: &Tensor| t.to(dev).unwrap();
    let gpu_err = on(&a).matmul(&on(&b)).unwrap_err().to_string();
    assert_eq!(gpu_err, cpu);
    let x = randn(&[2, 3], DType::F32, 52);
    let cpu = x.matmul(&x).unwrap_err().to_string();
    assert_eq!(on(&x).matmul(&on(&x)).unwrap_err().to_string(), cpu);
    assert_eq!(on(&x).device(), dev);
}

#[test]
fn linear_matches_the_cpu() {
    let Some(dev) = gpu("linear_matches_the_cpu") else {
        return;
    };
    for dtype in FLOATS {
        let tol = tolerance(dtype);
        let (x, w, b) = (
            randn(&[37, 70], dtype, 60),
            randn_scaled(&[45, 70], dtype, 61, 0.2),
            randn(&[45], dtype, 62),
        );
        compare(&format!("linear {dtype:?}"), dev, &[x, w, b], true, tol, |t| {
            t[0].linear(&t[1], Some(&t[2])).unwrap()
        });
        // 3-D input, an output row longer than a block
        let (x, w, b) = (
            randn(&[2, 5, 33], dtype, 63),
            randn_scaled(&[300, 33], dtype, 64, 0.2),
            randn(&[300], dtype, 65),
        );
        compare(&format!("linear 3-D {dtype:?}"), dev, &[x, w, b], true, tol, |t| {
            t[0].linear(&t[1], Some(&t[2])).unwrap()
        });
    }
}

#[test]
fn linear_reads_strided_and_broadcast_inputs() {
    let Some(dev) = gpu("linear_reads_strided_and_broadcast_inputs") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16] {
        let tol = tolerance(dtype);
        let (x, w, b) = (
            randn(&[12, 20], dtype, 70),
            randn_scaled(&[12, 15], dtype, 71, 0.3),
            randn(&[11, 2], dtype, 72),
        );
        compare(&format!("strided linear {dtype:?}"), dev, &[x, w, b], true, tol, |t| {
            let x = t[0].t().unwrap(); // [20, 12], column-major
            let w = t[1].t().unwrap().narrow(0, 2, 11).unwrap(); // [11, 12], column-major
            let b = t[2].narrow(1, 1, 1).unwrap().reshape(&[11]).unwrap(); // stride 2
            x.linear(&w, Some(&b)).unwrap()
        });
        let (x, w, b) = (
            randn(&[6, 8], dtype, 73),
            randn_scaled(&[5, 8], dtype, 74, 0.3),
            randn(&[1], dtype, 75),
        );
        compare(&format!("broadcast bias {dtype:?}"), dev, &[x, w, b], true, tol, |t| {
            t[0].linear(&t[1], Some(&t[2].expand(&[5]).unwrap())).unwrap()
        });
    }
}

#[test]
fn linear_with_a_residual() {
    let Some(dev) = gpu("linear_with_a_residual") else {
        return;
    };
    for dtype in [DType::F32, DType::F64] {
        let tol = tolerance(dtype);
        let (x, w, b, r) = (
            randn(&[2, 17, 40], dtype, 80),
            randn_scaled(&[33, 40], dtype, 81, 0.2),
            randn(&[33], dtype, 82),
            randn(&[2, 17, 33], dtype, 83),
        );
        compare(
            &format!("linear_add {dtype:?}"),
            dev,
            &[x, w, b, r.clone()],
            true,
            tol,
            |t| t[0].linear_add(&t[1], Some(&t[2]), &t[3]).unwrap(),
        );
        // a permuted residual is made contiguous first
        let r = randn(&[33, 2, 17], dtype, 84);
        let (x, w, b) = (
            randn(&[2, 17, 40], dtype, 85),
            randn_scaled(&[33, 40], dtype, 86, 0.2),
            randn(&[33], dtype, 87),
        );
        compare(
            &format!("linear_add permuted residual {dtype:?}"),
            dev,
            &[x, w, b, r],
            true,
            tol,
            |t| {
                t[0].linear_add(&t[1], Some(&t[2]), &t[3].permute(&[1, 2, 0]).unwrap())
                    .unwrap()
            },
        );
    }
}

const ACTS: [UnaryOp; 12] = [
    UnaryOp::Neg,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Abs,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
    UnaryOp::Silu,
];

#[test]
fn linear_act_matches_the_cpu_for_every_activation() {
    let Some(dev) = gpu("linear_act_matches_the_cpu_for_every_activation") else {
        return;
    };
    for dtype in [DType::F32, DType::F64] {
        let tol = tolerance(dtype);
        for act in ACTS {
            // Log, Sqrt and Rsqrt of the negative pre-activations are NaN on both devices.
            let (x, w, b) = (
                randn(&[19, 40], dtype, 90),
                randn_scaled(&[35, 40], dtype, 91, 0.15),
                randn(&[35], dtype, 92),
            );
            compare(
                &format!("linear_act {act:?} {dtype:?}"),
                dev,
                &[x, w, b],
                false,
                tol,
                |t| t[0].linear_act(&t[1], Some(&t[2]), act).unwrap(),
            );
        }
    }
}

/// The backward of `linear_act` through the saved pre-activation (the GPU's UnaryBackward).
#[test]
fn linear_act_backward_matches_the_cpu() {
    let Some(dev) = gpu("linear_act_backward_matches_the_cpu") else {
        return;
    };
    for act in [
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Relu,
        UnaryOp::Silu,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
    ] {
        let (x, w, b) = (
            randn(&[19, 40], DType::F32, 93),
            randn_scaled(&[35, 40], DType::F32, 94, 0.15),
            randn(&[35], DType::F32, 95),
        );
        compare(
            &format!("linear_act backward {act:?}"),
            dev,
            &[x, w, b],
            true,
            1e-5,
            |t| t[0].linear_act(&t[1], Some(&t[2]), act).unwrap(),
        );
    }
}

#[test]
fn linear_with_empty_dims() {
    let Some(dev) = gpu("linear_with_empty_dims") else {
        return;
    };
    let tol = tolerance(DType::F32);
    // no rows
    compare(
        "linear [0, 8]",
        dev,
        &[
            randn(&[0, 8], DType::F32, 100),
            randn(&[5, 8], DType::F32, 101),
            randn(&[5], DType::F32, 102),
        ],
        false,
        tol,
        |t| t[0].linear(&t[1], Some(&t[2])).unwrap(),
    );
    // no output features (an empty inner dim, or a residual with N = 0, cannot reach the op:
    // `linear` reshapes to [-1, K] and [-1, N], which a 0 there refuses)
    let (x, w, b) = (
        randn(&[3, 8], DType::F32, 103),
        randn(&[0, 8], DType::F32, 104),
        randn(&[0], DType::F32, 105),
    );
    compare(
        "linear N = 0",
        dev,
        &[x.clone(), w.clone(), b.clone()],
        false,
        tol,
        |t| t[0].linear(&t[1], Some(&t[2])).unwrap(),
    );
    compare("linear_act N = 0", dev, &[x, w, b], false, tol, |t| {
        t[0].linear_act(&t[1], Some(&t[2]), UnaryOp::Gelu).unwrap()
    });
}

#[test]
fn linear_outputs_stay_on_the_gpu() {
    let Some(dev) = gpu("linear_outputs_stay_on_the_gpu") else {
        return;
    };
    let x = randn(&[4, 6], DType::F32, 110).to(dev).unwrap();
    let w = randn(&[3, 6], DType::F32, 111).to(dev).unwrap();
    let b = randn(&[3], DType::F32, 112).to(dev).unwrap();
    let y = x.linear_act(&w, Some(&b), UnaryOp::Relu).unwrap();
    assert_eq!(y.device(), dev);
    assert_eq!(y.shape(), &[4, 3]);
    assert!(y.to_vec_f64().iter().all(|v| *v >= 0.0));
    assert_eq!(y.to(Device::Cpu).unwrap().device(), Device::Cpu);
}

/// Gradient accumulation fusion on the GPU: three micro-batches of a transposed-weight product
/// (f32, and under bf16 autocast, whose weight gradients go to the f32 parameter through
/// `WideMatmul` and a beta-1 gemm) reuse the parameter's gradient buffer and sum as the CPU does.
#[test]
fn weight_gradients_accumulate_in_place_as_on_the_cpu() {
    let Some(dev) = gpu("weight_gradients_accumulate_in_place_as_on_the_cpu") else {
        return;
    };
    for low in [None, Some(DType::BF16)] {
        let run = |device: Device| -> (Tensor, bool) {
            let w = randn(&[24, 16], DType::F32, 1)
                .to(device)
                .unwrap()
                .requires_grad_()
                .unwrap();
            let mut first = 0;
            for j in 0..3 {
                let x = randn(&[300, 16], DType::F32, 10 + j).to(device).unwrap();
                let y = weft_core::autocast(low, || x.matmul(&w.t().unwrap()).unwrap());
                let y = y.cast(DType::F32).unwrap();
                y.mul(&y).unwrap().mean_all().unwrap().backward().unwrap();
                if j == 0 {
                    first = std::sync::Arc::as_ptr(w.grad().unwrap().storage()) as usize;
                }
            }
            let g = w.grad().unwrap();
            let kept = std::sync::Arc::as_ptr(g.storage()) as usize == first;
            (g.to(Device::Cpu).unwrap(), kept)
        };
        let (want, _) = run(Device::Cpu);
        let (got, kept) = run(dev);
        assert!(kept, "{low:?}: the GPU gradient was not added to in place");
        assert_eq!(got.dtype(), DType::F32);
        // the products differ in summation order only (bf16 operands: the same bf16 values)
        assert_close(
            &format!("accumulated gradient {low:?}"),
            &got,
            &want,
            tolerance(DType::F32),
        );
    }
}
