//! Sum, mean, max, min over sets of dims, argmax and var against the CPU, forward and backward,
//! in f32 and bf16 (and the integer dtypes where the CPU takes them), with rows longer than a
//! block, sizes that are not multiples of 32, strided inputs, NaN and empty dims.

use super::{compare, gpu, randn, tolerance};
use weft_core::{DType, ReduceOp, Tensor};

const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min];

/// Dim sets to reduce a rank-3 tensor over: none given (all), single dims, leading, trailing,
/// and a non-adjacent pair.
const DIMS: [&[isize]; 7] = [&[], &[0], &[1], &[2], &[0, 1], &[1, 2], &[0, 2]];

/// `values` as a tensor of `shape` in `dtype`.
fn values(v: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape)
        .and_then(|t| t.cast(dtype))
        .expect("values")
}

#[test]
fn reductions_over_any_dims_match_the_cpu() {
    let Some(dev) = gpu("reductions_over_any_dims_match_the_cpu") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        let tol = tolerance(dtype);
        // Dim 2 (300) is longer than a block of 256 threads; 37 is not a multiple of 32.
        let x = randn(&[5, 37, 300], dtype, 1);
        for op in OPS {
            for dims in DIMS {
                for keepdim in [false, true] {
                    compare(
                        &format!("{op:?} {dims:?} keepdim={keepdim} {dtype:?}"),
                        dev,
                        std::slice::from_ref(&x),
                        true,
                        tol,
                        |t| t[0].reduce(op, dims, keepdim).unwrap(),
                    );
                }
            }
            // A strided input: permuted and narrowed.
            compare(
                &format!("{op:?} strided {dtype:?}"),
                dev,
                std::slice::from_ref(&x),
                true,
                tol,
                |t| {
                    t[0].permute(&[2, 0, 1])
                        .unwrap()
                        .narrow(0, 7, 250)
                        .unwrap()
                        .reduce(op, &[0, 2], false)
                        .unwrap()
                },
            );
        }
    }
}

#[test]
fn reduction_edge_sizes() {
    let Some(dev) = gpu("reduction_edge_sizes") else {
        return;
    };
    // One long row (many elements per thread), a 0-d tensor, a broadcast (expanded) input.
    let long = randn(&[100_003], DType::F32, 2);
    for op in OPS {
        compare(
            &format!("{op:?} of a long row"),
            dev,
            std::slice::from_ref(&long),
            true,
            1e-5,
            |t| t[0].reduce(op, &[], false).unwrap(),
        );
    }
    let scalar = randn(&[], DType::F32, 3);
    compare("sum of a 0-d tensor", dev, &[scalar], true, 1e-5, |t| {
        t[0].sum_all().unwrap()
    });
    let col = randn(&[6, 1], DType::F32, 4);
    compare("mean of an expanded input", dev, &[col], true, 1e-5, |t| {
        t[0].expand(&[6, 45]).unwrap().mean(&[1], false).unwrap()
    });
    // Many short rows: one block per row of 3.
    let short = randn(&[2000, 3], DType::F32, 5);
    compare("max of short rows", dev, &[short], true, 1e-5, |t| {
        t[0].max(&[1], true).unwrap()
    });
    // Empty: a sum over an empty dim is 0, a mean NaN; no rows at all is an empty result.
    let empty = randn(&[4, 0, 3], DType::F32, 6);
    compare(
        "sum over an empty dim",
        dev,
        std::slice::from_ref(&empty),
        true,
        1e-5,
        |t| t[0].sum(&[1], false).unwrap(),
    );
    compare(
        "mean over an empty dim",
        dev,
        std::slice::from_ref(&empty),
        false,
        1e-5,
        |t| t[0].mean(&[1], false).unwrap(),
    );
    compare("sum with no rows", dev, std::slice::from_ref(&empty), true, 1e-5, |t| {
        t[0].sum(&[2], false).unwrap()
    });
    compare(
        "max with no rows",
        dev,
        std::slice::from_ref(&empty),
        false,
        1e-5,
        |t| t[0].max(&[0], false).unwrap(),
    );
    // Broadcast adjoint: sum_to_shape after a broadcast binary op.
    let (a, b) = (randn(&[3, 1, 5], DType::F32, 7), randn(&[4, 1], DType::F32, 8));
    compare("gradient of a broadcast mul", dev, &[a, b], true, 1e-5, |t| {
        t[0].mul(&t[1]).unwrap()
    });
}

#[test]
fn max_min_propagate_nan_like_the_cpu() {
    let Some(dev) = gpu("max_min_propagate_nan_like_the_cpu") else {
        return;
    };
    let mut v: Vec<f64> = (0..4 * 70).map(|i| ((i * 37) % 101) as f64 - 50.0).collect();
    v[3] = f64::NAN; // row 0, early
    v[70 + 69] = f64::NAN; // row 1, last
    v[140] = f64::NEG_INFINITY; // row 2 has -inf but no NaN
    for dtype in [DType::F32, DType::BF16, DType::F64] {
        let x = values(&v, &[4, 70], dtype);
        for op in [ReduceOp::Max, ReduceOp::Min] {
            compare(
                &format!("{op:?} NaN {dtype:?}"),
                dev,
                std::slice::from_ref(&x),
                false,
                0.0,
                |t| t[0].reduce(op, &[1], false).unwrap(),
            );
            compare(
                &format!("{op:?} NaN columns {dtype:?}"),
                dev,
                std::slice::from_ref(&x),
                false,
                0.0,
                |t| t[0].reduce(op, &[0], false).unwrap(),
            );
        }
    }
}

#[test]
fn integer_reductions_match_the_cpu() {
    let Some(dev) = gpu("integer_reductions_match_the_cpu") else {
        return;
    };
    let v: Vec<f64> = (0..6 * 50).map(|i| ((i * 13) % 29) as f64).collect();
    for dtype in [DType::I64, DType::I32, DType::U8] {
        let x = values(&v, &[6, 50], dtype);
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
            let dim_sets: [&[isize]; 3] = [&[], &[0], &[1]];
            for dims in dim_sets {
                // u8 sums saturate at 255 (the CPU converts the f64 sum with `as`).
                compare(
                    &format!("{op:?} {dims:?} {dtype:?}"),
                    dev,
                    std::slice::from_ref(&x),
                    false,
                    0.0,
                    |t| t[0].reduce(op, dims, false).unwrap(),
                );
            }
        }
    }
    // i64 values past f32's precision and negatives.
    let big = Tensor::from_vec(vec![(1i64 << 40) + 3, -5, 1 << 41, -(1 << 35)], &[2, 2]).unwrap();
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min] {
        compare(
            &format!("{op:?} of big i64"),
            dev,
            std::slice::from_ref(&big),
            false,
            0.0,
            |t| t[0].reduce(op, &[1], true).unwrap(),
        );
    }
    // The CPU's refusals hold on the GPU too.
    let b = values(&[1.0, 0.0], &[2], DType::Bool).to(dev).unwrap();
    assert!(b.sum_all().is_err());
    assert!(values(&v, &[6, 50], DType::I64).to(dev).unwrap().mean_all().is_err());
}

#[test]
fn argmax_matches_the_cpu_ties_and_nan_included() {
    let Some(dev) = gpu("argmax_matches_the_cpu_ties_and_nan_included") else {
        return;
    };
    // Values from a small set: many ties, the first must win.
    let v: Vec<f64> = (0..6 * 7 * 300).map(|i| ((i * 31) % 17) as f64).collect();
    for dtype in [
        DType::F32,
        DType::BF16,
        DType::F16,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ] {
        let x = values(&v, &[6, 7, 300], dtype);
        for dim in [0isize, 1, 2, -1] {
            for keepdim in [false, true] {
                compare(
                    &format!("argmax {dim} keepdim={keepdim} {dtype:?}"),
                    dev,
                    std::slice::from_ref(&x),
                    false,
                    0.0,
                    |t| t[0].argmax(dim, keepdim).unwrap(),
                );
            }
        }
        compare(
            &format!("argmax strided {dtype:?}"),
            dev,
            std::slice::from_ref(&x),
            false,
            0.0,
            |t| {
                t[0].permute(&[2, 0, 1])
                    .unwrap()
                    .narrow(0, 1, 299)
                    .unwrap()
                    .argmax(0, false)
                    .unwrap()
            },
        );
    }
    // NaN beats everything (the first NaN); -inf rows still give an index.
    let mut w = vec![1.0; 3 * 40];
    w[5] = f64::NAN;
    w[9] = f64::NAN;
    w[12] = 7.0;
    w[40 + 33] = f64::NAN;
    w[80..120].iter_mut().for_each(|x| *x = f64::NEG_INFINITY);
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let x = values(&w, &[3, 40], dtype);
        compare(
            &format!("argmax NaN {dtype:?}"),
            dev,
            std::slice::from_ref(&x),
            false,
            0.0,
            |t| t[0].argmax(1, false).unwrap(),
        );
    }
    let long = randn(&[2, 100_001], DType::F32, 9);
    compare("argmax of long rows", dev, &[long], false, 0.0, |t| {
        t[0].argmax(-1, false).unwrap()
    });
}

#[test]
fn var_matches_the_cpu() {
    let Some(dev) = gpu("var_matches_the_cpu") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        let tol = tolerance(dtype);
        let x = randn(&[5, 37, 300], dtype, 10)
            .mul_scalar(3.0)
            .unwrap()
            .add_scalar(2.0)
            .unwrap();
        for dims in DIMS {
            for (correction, keepdim) in [(1, false), (0, true)] {
                compare(
                    &format!("var {dims:?} correction={correction} keepdim={keepdim} {dtype:?}"),
                    dev,
                    std::slice::from_ref(&x),
                    true,
                    tol,
                    |t| t[0].var(dims, correction, keepdim).unwrap(),
                );
            }
        }
        compare(
            &format!("var strided {dtype:?}"),
            dev,
            std::slice::from_ref(&x),
            true,
            tol,
            |t| {
                t[0].permute(&[1, 2, 0])
                    .unwrap()
                    .narrow(1, 10, 270)
                    .unwrap()
                    .var(&[1], 1, false)
                    .unwrap()
            },
        );
    }
    // A single element with correction 1 divides by zero, as the CPU does.
    let one = randn(&[4, 1], DType::F32, 11);
    compare("var of one element", dev, &[one], false, 1e-5, |t| {
        t[0].var(&[1], 1, false).unwrap()
    });
}
