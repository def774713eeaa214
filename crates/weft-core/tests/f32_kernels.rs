//! The f32 kernels (vectorized, polynomial exp/erf/tanh, multi-accumulator reductions, parallel
//! blocks) against the f64 path on the same inputs, at sizes with ragged tails and sizes large
//! enough to take the parallel paths. Gradients included, through the fused backward kernels.

mod common;

use common::{assert_close, leaf, normal, values_and_grads};
use weft_core::{Conv2dParams, DType, Pool2dParams, Result, Tensor, UnaryOp};

/// Runs `f` on `inputs` in f64 and in f32 (inputs cast), comparing outputs and the gradients of
/// `sum(out * w)` for each input.
fn compare(name: &str, inputs: &[Tensor], rtol: f64, f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let mut results = Vec::new();
    for dtype in [DType::F64, DType::F32] {
        let leaves: Vec<Tensor> = inputs.iter().map(|t| leaf(&t.cast(dtype).unwrap())).collect();
        let out = f(&leaves).unwrap_or_else(|e| panic!("{name} {dtype:?}: {e}"));
        assert_eq!(out.dtype(), dtype, "{name}: output dtype");
        results.push(values_and_grads(&out, &leaves, 999));
    }
    let scale = |v: &[f64]| v.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1.0);
    let (ref64, ref32) = (&results[0], &results[1]);
    assert_close(
        &format!("{name} value"),
        &ref32.0,
        &ref64.0,
        rtol * scale(&ref64.0),
        rtol,
    );
    for (i, (g32, g64)) in ref32.1.iter().zip(&ref64.1).enumerate() {
        assert_close(&format!("{name} grad {i}"), g32, g64, rtol * scale(g64), rtol);
    }
}

const SIZES: [&[usize]; 3] = [&[3, 37], &[5, 1000], &[96, 1024]];

#[test]
fn unary_f32_matches_f64() {
    for shape in SIZES {
        let x = normal(shape, 1).mul_scalar(3.0).unwrap();
        let pos = x.abs().unwrap().add_scalar(0.1).unwrap();
        for op in [
            UnaryOp::Neg,
            UnaryOp::Exp,
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::Relu,
            UnaryOp::Gelu,
            UnaryOp::GeluTanh,
            UnaryOp::Silu,
            UnaryOp::Abs,
        ] {
            compare(&format!("{op:?} {shape:?}"), std::slice::from_ref(&x), 2e-6, |t| {
                t[0].unary(op)
            });
        }
        for op in [UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt] {
            compare(&format!("{op:?} {shape:?}"), std::slice::from_ref(&pos), 2e-6, |t| {
                t[0].unary(op)
            });
        }
    }
}

#[test]
fn exp_f32_range() {
    // the polynomial exp across its whole range, including where it saturates
    let mut xs: Vec<f64> = (-1000..=1000).map(|i| i as f64 * 0.0885).collect();
    xs.push(f64::NEG_INFINITY);
    let x = Tensor::from_vec(xs.clone(), &[xs.len()]).unwrap();
    let got = x.cast(DType::F32).unwrap().exp().unwrap().to_vec_f64();
    for (g, &x) in got.iter().zip(&xs) {
        let want = (x as f32).exp() as f64;
        // subnormal results flush to 0
        let tol = if want < f32::MIN_POSITIVE as f64 {
            f32::MIN_POSITIVE as f64
        } else {
            3e-7 * want
        };
        assert!((g - want).abs() <= tol, "exp({x}) = {g}, want {want}");
    }
}

#[test]
fn reductions_f32_match_f64() {
    for shape in SIZES {
        let x = normal(shape, 2);
        for dims in [vec![-1], vec![0], vec![]] {
            compare(
                &format!("sum {dims:?} {shape:?}"),
                std::slice::from_ref(&x),
                1e-5,
                |t| t[0].sum(&dims, false),
            );
            compare(
                &format!("mean {dims:?} {shape:?}"),
                std::slice::from_ref(&x),
                1e-5,
                |t| t[0].mean(&dims, true),
            );
            compare(
                &format!("max {dims:?} {shape:?}"),
                std::slice::from_ref(&x),
                1e-6,
                |t| t[0].max(&dims, false),
            );
            compare(
                &format!("min {dims:?} {shape:?}"),
                std::slice::from_ref(&x),
                1e-6,
                |t| t[0].min(&dims, false),
            );
        }
    }
}

#[test]
fn fused_nn_f32_match_f64() {
    for shape in SIZES {
        let x = normal(shape, 3).mul_scalar(4.0).unwrap();
        let c = shape[1];
        let (w, b) = (normal(&[c], 4), normal(&[c], 5));
        compare(&format!("softmax {shape:?}"), std::slice::from_ref(&x), 1e-5, |t| {
            t[0].softmax(-1)
        });
        compare(&format!("log_softmax {shape:?}"), std::slice::from_ref(&x), 1e-5, |t| {
            t[0].log_softmax(-1)
        });
        compare(
            &format!("layer_norm {shape:?}"),
            &[x.clone(), w.clone(), b.clone()],
            1e-4,
            |t| t[0].layer_norm(Some(&t[1]), Some(&t[2]), 1e-5),
        );
        compare(
            &format!("layer_norm plain {shape:?}"),
            std::slice::from_ref(&x),
            1e-4,
            |t| t[0].layer_norm(None, None, 1e-5),
        );
        compare(&format!("rms_norm {shape:?}"), &[x.clone(), w.clone()], 1e-4, |t| {
            t[0].rms_norm(Some(&t[1]), 1e-6)
        });
        let n = shape[0];
        let targets: Vec<i64> = (0..n as i64)
            .map(|i| if i % 5 == 3 { -100 } else { (i * 31) % c as i64 })
            .collect();
        let targets = Tensor::from_vec(targets, &[n]).unwrap();
        for smoothing in [0.0, 0.2] {
            compare(
                &format!("cross_entropy {shape:?} {smoothing}"),
                std::slice::from_ref(&x),
                1e-5,
                |t| t[0].cross_entropy(&targets, -100, smoothing),
            );
        }
    }
}

#[test]
fn matmul_attention_conv_f32_match_f64() {
    compare("matmul", &[normal(&[3, 70, 33], 6), normal(&[33, 17], 7)], 1e-5, |t| {
        t[0].matmul(&t[1])
    });
    // small heads, and heads as wide as Qwen3's and Llama 3's (128) and Gemma's (256)
    for (t, d, dv) in [(130, 16, 8), (70, 128, 128), (37, 256, 256)] {
        let (q, k, v) = (
            normal(&[2, 2, t, d], 8),
            normal(&[2, 2, t, d], 9),
            normal(&[2, 2, t, dv], 10),
        );
        for causal in [true, false] {
            compare(
                &format!("attention causal={causal} d={d}"),
                &[q.clone(), k.clone(), v.clone()],
                1e-4,
                |t| Tensor::scaled_dot_product_attention(&t[0], &t[1], &t[2], causal, None),
            );
        }
    }
    let x = normal(&[3, 4, 9, 11], 11);
    let w = normal(&[6, 2, 3, 3], 12);
    let p = Conv2dParams {
        stride: (2, 1),
        padding: (1, 1),
        dilation: (1, 2),
        groups: 2,
    };
    compare("conv2d", &[x.clone(), w], 1e-4, |t| t[0].conv2d(&t[1], None, p));
    compare("max_pool2d", std::slice::from_ref(&x), 1e-6, |t| {
        t[0].max_pool2d(Pool2dParams::square(2))
    });
    compare("avg_pool2d", &[x], 1e-6, |t| t[0].avg_pool2d(Pool2dParams::square(3)));
}

#[test]
fn broadcast_binary_f32_match_f64() {
    let a = normal(&[64, 1000], 13);
    let b = normal(&[1000], 14).abs().unwrap().add_scalar(0.5).unwrap();
    compare("add row", &[a.clone(), b.clone()], 1e-6, |t| t[0].add(&t[1]));
    compare("div row", &[a.clone(), b.clone()], 1e-6, |t| t[0].div(&t[1]));
    compare("mul col", &[a.clone(), normal(&[64, 1], 15)], 1e-6, |t| t[0].mul(&t[1]));
    compare("sub transposed", &[a.clone(), normal(&[1000, 64], 16)], 1e-6, |t| {
        t[0].sub(&t[1].t()?)
    });
}

/// The fast path for a run of consecutive middle dims (the sum an `expand`'s gradient takes)
/// against the generic path, which a non-contiguous layout of the same values takes.
#[test]
fn middle_dim_reductions_match_the_generic_path() {
    for (shape, dims) in [
        (vec![3, 4, 5, 6], vec![1]),
        (vec![3, 4, 5, 6], vec![1, 2]),
        (vec![2, 300, 3], vec![1]),
        (vec![2, 16, 2, 2, 8], vec![3]),
    ] {
        let x = normal(&shape, 9);
        let rank = shape.len();
        let reversed: Vec<usize> = (0..rank).rev().collect();
        // the same values, laid out backwards: not contiguous, so the generic path reduces them
        let strided = x
            .permute(&reversed)
            .unwrap()
            .contiguous_copy()
            .unwrap()
            .permute(&reversed)
            .unwrap();
        assert!(!strided.is_contiguous());
        let dims: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
        for keep in [false, true] {
            let pairs = [
                (x.sum(&dims, keep).unwrap(), strided.sum(&dims, keep).unwrap(), 1e-5),
                (x.mean(&dims, keep).unwrap(), strided.mean(&dims, keep).unwrap(), 1e-5),
                (x.max(&dims, keep).unwrap(), strided.max(&dims, keep).unwrap(), 0.0),
                (x.min(&dims, keep).unwrap(), strided.min(&dims, keep).unwrap(), 0.0),
            ];
            for (fast, generic, tol) in pairs {
                assert_eq!(fast.shape(), generic.shape());
                assert_close(
                    &format!("{shape:?} over {dims:?}"),
                    &fast.to_vec_f64(),
                    &generic.to_vec_f64(),
                    tol,
                    tol,
                );
            }
        }
    }
}

/// The fused attention at wide heads (128, Qwen3's and Llama 3's; 256, Gemma's) against its
/// definition composed of plain ops, `softmax(q k^T / sqrt(d) + mask) v`, in f64: values and the
/// gradients of q, k and v; plain (two heads of each) and grouped-query (two query heads on one
/// key/value head, which the definition repeats).
#[test]
fn attention_at_wide_heads_is_its_definition() {
    for (t, d, kv_heads) in [(33, 128, 2), (19, 256, 2), (33, 128, 1)] {
        let inputs = [
            normal(&[1, 2, t, d], 21),
            normal(&[1, kv_heads, t, d], 22),
            normal(&[1, kv_heads, t, d], 23),
        ];
        for causal in [false, true] {
            let mask: Vec<f64> = (0..t * t)
                .map(|ij| {
                    if causal && ij % t > ij / t {
                        f64::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            let mask = Tensor::from_vec(mask, &[t, t]).unwrap();
            let run = |fused: bool| {
                let leaves: Vec<Tensor> = inputs.iter().map(|x| leaf(&x.cast(DType::F64).unwrap())).collect();
                let (q, k, v) = (&leaves[0], &leaves[1], &leaves[2]);
                let out = if fused && kv_heads == 1 {
                    Tensor::grouped_query_attention(q, k, v, causal, None).unwrap()
                } else if fused {
                    Tensor::scaled_dot_product_attention(q, k, v, causal, None).unwrap()
                } else {
                    let repeat = |z: &Tensor| match kv_heads {
                        1 => Tensor::cat(&[z, z], 1).unwrap(),
                        _ => z.clone(),
                    };
                    let (k, v) = (&repeat(k), &repeat(v));
                    let scores = q
                        .matmul(&k.transpose(2, 3).unwrap())
                        .unwrap()
                        .mul_scalar(1.0 / (d as f64).sqrt())
                        .unwrap()
                        .add(&mask)
                        .unwrap();
                    scores.softmax(-1).unwrap().matmul(v).unwrap()
                };
                values_and_grads(&out, &leaves, 5)
            };
            let (fused, plain) = (run(true), run(false));
            let what = format!("t={t} d={d} kv_heads={kv_heads} causal={causal}");
            assert_close(&format!("{what} value"), &fused.0, &plain.0, 1e-10, 1e-10);
            for (i, (g, want)) in fused.1.iter().zip(&plain.1).enumerate() {
                assert_close(&format!("{what} grad {i}"), g, want, 1e-10, 1e-10);
            }
        }
    }
}
