//! Unary math and its backward, broadcasting binary ops, comparisons, the scalar ops, `where`
//! and casts: every op against the CPU, forward and backward, in f32 and bf16 (and the other
//! dtypes each op takes), with strided and broadcast inputs and edge sizes.

use super::{assert_close, compare, gpu, randn, tolerance};
use weft_core::{BinaryOp, CompareOp, DType, Device, Tensor, UnaryOp};

const UNARY: [UnaryOp; 12] = [
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

const BINARY: [BinaryOp; 7] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Pow,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
];

const COMPARE: [CompareOp; 6] = [
    CompareOp::Eq,
    CompareOp::Ne,
    CompareOp::Lt,
    CompareOp::Le,
    CompareOp::Gt,
    CompareOp::Ge,
];

const ALL_DTYPES: [DType; 8] = [
    DType::F32,
    DType::F64,
    DType::BF16,
    DType::F16,
    DType::I64,
    DType::I32,
    DType::U8,
    DType::Bool,
];

/// Positive values (for log, sqrt, rsqrt, pow's base): |randn| + 0.25.
fn positive(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    randn(shape, DType::F32, seed)
        .abs()
        .and_then(|t| t.add_scalar(0.25))
        .and_then(|t| t.cast(dtype))
        .expect("positive")
}

/// `values` as a tensor of `shape` in `dtype` (through f64; Bool: nonzero).
fn values(v: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape)
        .and_then(|t| t.cast(dtype))
        .expect("values")
}

#[test]
fn unary_ops_and_their_gradients_match_the_cpu() {
    let Some(dev) = gpu("unary_ops_and_their_gradients_match_the_cpu") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        for op in UNARY {
            let needs_positive = matches!(op, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt);
            let x = if needs_positive {
                positive(&[37, 70], dtype, 1)
            } else {
                randn(&[37, 70], dtype, 1)
            };
            let tol = tolerance(dtype);
            compare(
                &format!("{op:?} {dtype:?}"),
                dev,
                std::slice::from_ref(&x),
                true,
                tol,
                |t| t[0].unary(op).unwrap(),
            );
            // A strided input: transposed, then narrowed.
            compare(
                &format!("{op:?} {dtype:?} strided"),
                dev,
                std::slice::from_ref(&x),
                true,
                tol,
                |t| {
                    t[0].permute(&[1, 0])
                        .unwrap()
                        .narrow(0, 3, 60)
                        .unwrap()
                        .unary(op)
                        .unwrap()
                },
            );
        }
    }
}

#[test]
fn unary_edge_sizes() {
    let Some(dev) = gpu("unary_edge_sizes") else {
        return;
    };
    // Many blocks (and more than one grid-stride step per thread is not needed to be right).
    let big = randn(&[70_001], DType::F32, 2);
    compare("gelu 70001", dev, &[big], true, 1e-5, |t| t[0].gelu().unwrap());
    let empty = randn(&[0, 3], DType::F32, 3);
    compare("exp of an empty tensor", dev, &[empty], true, 1e-5, |t| {
        t[0].exp().unwrap()
    });
    let scalar = randn(&[], DType::F32, 4);
    compare("tanh of a 0-d tensor", dev, &[scalar], true, 1e-5, |t| {
        t[0].tanh().unwrap()
    });
    // NaN and infinities go through as the CPU's functions send them.
    let special = values(
        &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 1.0],
        &[6],
        DType::F32,
    );
    for op in [
        UnaryOp::Relu,
        UnaryOp::Abs,
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Sigmoid,
    ] {
        compare(
            &format!("{op:?} of specials"),
            dev,
            std::slice::from_ref(&special),
            false,
            1e-5,
            |t| t[0].unary(op).unwrap(),
        );
    }
}

#[test]
fn binary_ops_broadcast_and_match_the_cpu() {
    let Some(dev) = gpu("binary_ops_broadcast_and_match_the_cpu") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        let tol = tolerance(dtype);
        for op in BINARY {
            let a = if op == BinaryOp::Pow {
                positive(&[5, 1, 33], dtype, 10)
            } else {
                randn(&[5, 1, 33], dtype, 10)
            };
            // Divisors away from zero; the exponent small.
            let b = match op {
                BinaryOp::Div => positive(&[4, 33], dtype, 11),
                BinaryOp::Pow => randn(&[4, 33], dtype, 11).mul_scalar(0.5).unwrap(),
                _ => randn(&[4, 33], dtype, 11),
            };
            compare(
                &format!("{op:?} {dtype:?} broadcast"),
                dev,
                &[a.clone(), b.clone()],
                true,
                tol,
                |t| t[0].binary(op, &t[1]).unwrap(),
            );
            // Strided: b transposed from a [33, 4] tensor; a expanded explicitly.
            let bt = b.permute(&[1, 0]).unwrap().contiguous().unwrap();
            compare(&format!("{op:?} {dtype:?} strided"), dev, &[a, bt], true, tol, |t| {
                let a = t[0].expand(&[5, 4, 33]).unwrap();
                a.binary(op, &t[1].permute(&[1, 0]).unwrap()).unwrap()
            });
        }
    }
    // Both sides broadcast, 0-d against a matrix, and an empty result.
    let (col, row) = (randn(&[7, 1], DType::F32, 12), randn(&[1, 45], DType::F32, 13));
    compare("add outer", dev, &[col, row], true, 1e-5, |t| t[0].add(&t[1]).unwrap());
    let (s, m) = (randn(&[], DType::F32, 14), randn(&[3, 40], DType::F32, 15));
    compare("mul by a 0-d", dev, &[s, m], true, 1e-5, |t| t[0].mul(&t[1]).unwrap());
    let (e, r) = (randn(&[0, 5], DType::F32, 16), randn(&[5], DType::F32, 17));
    compare("sub, empty", dev, &[e, r], true, 1e-5, |t| t[0].sub(&t[1]).unwrap());
}

#[test]
fn maximum_minimum_nan_and_ties_match_the_cpu() {
    let Some(dev) = gpu("maximum_minimum_nan_and_ties_match_the_cpu") else {
        return;
    };
    let a = values(&[f64::NAN, 1.0, f64::NAN, 2.0, 3.0, -0.0], &[6], DType::F32);
    let b = values(&[1.0, f64::NAN, f64::NAN, 2.0, -1.0, 0.0], &[6], DType::F32);
    for op in [BinaryOp::Maximum, BinaryOp::Minimum] {
        compare(
            &format!("{op:?} with NaN"),
            dev,
            &[a.clone(), b.clone()],
            false,
            0.0,
            |t| t[0].binary(op, &t[1]).unwrap(),
        );
    }
    // Ties split the gradient (the backward compares on the GPU).
    let x = values(&[1.0, 2.0, 3.0, 4.0], &[4], DType::F32);
    let y = values(&[1.0, 5.0, 3.0, 0.0], &[4], DType::F32);
    compare("maximum ties", dev, &[x.clone(), y.clone()], true, 1e-5, |t| {
        t[0].maximum(&t[1]).unwrap()
    });
    compare("minimum ties", dev, &[x, y], true, 1e-5, |t| {
        t[0].minimum(&t[1]).unwrap()
    });
}

#[test]
fn integer_binary_ops_match_the_cpu() {
    let Some(dev) = gpu("integer_binary_ops_match_the_cpu") else {
        return;
    };
    for dtype in [DType::I64, DType::I32, DType::U8] {
        // Values that do not overflow even in u8 (the CPU's debug build checks overflow).
        let av: Vec<f64> = (0..60).map(|i| (i % 28) as f64).collect();
        let a = values(&av, &[4, 15], dtype);
        let b = values(
            &[
                3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0, 5.0, 0.0, 2.0, 1.0, 3.0,
            ],
            &[15],
            dtype,
        );
        for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Maximum, BinaryOp::Minimum] {
            compare(
                &format!("{op:?} {dtype:?}"),
                dev,
                &[a.clone(), b.clone()],
                false,
                0.0,
                |t| t[0].binary(op, &t[1]).unwrap(),
            );
        }
        let big = a.add_scalar_int(10);
        compare(&format!("Sub {dtype:?}"), dev, &[big, b.clone()], false, 0.0, |t| {
            t[0].permute(&[1, 0]).unwrap().sub(&t[1].unsqueeze(1).unwrap()).unwrap()
        });
        // The CPU's refusals, word for word.
        let (ga, gb) = (a.to(dev).unwrap(), b.to(dev).unwrap());
        for op in [BinaryOp::Div, BinaryOp::Pow] {
            let want = a.binary(op, &b).unwrap_err().to_string();
            let got = ga.binary(op, &gb).unwrap_err().to_string();
            assert_eq!(got, want, "{op:?} {dtype:?}");
        }
    }
    let t = values(&[1.0, 0.0, 1.0], &[3], DType::Bool);
    let want = t.add(&t).unwrap_err().to_string();
    let got = t.to(dev).unwrap().add(&t.to(dev).unwrap()).unwrap_err().to_string();
    assert_eq!(got, want, "bool add");
}

/// `t + v` for an integer tensor (no scalar op takes integers).
trait AddScalarInt {
    fn add_scalar_int(&self, v: i64) -> Tensor;
}

impl AddScalarInt for Tensor {
    fn add_scalar_int(&self, v: i64) -> Tensor {
        let s = values(&[v as f64], &[], self.dtype());
        self.add(&s).unwrap()
    }
}

#[test]
fn comparisons_match_the_cpu_in_every_dtype() {
    let Some(dev) = gpu("comparisons_match_the_cpu_in_every_dtype") else {
        return;
    };
    // Repeated values (ties), negatives, and a NaN for the floats.
    let av: Vec<f64> = (0..40).map(|i| ((i * 7) % 11) as f64 - 3.0).collect();
    let bv: Vec<f64> = (0..8).map(|i| ((i * 3) % 5) as f64 - 1.0).collect();
    for dtype in ALL_DTYPES {
        let (mut av, mut bv) = (av.clone(), bv.clone());
        if dtype == DType::U8 {
            av.iter_mut().chain(bv.iter_mut()).for_each(|v| *v = v.abs());
        }
        if dtype.is_float() {
            av[5] = f64::NAN;
            bv[2] = f64::NAN;
        }
        let a = values(&av, &[5, 8], dtype);
        let b = values(&bv, &[8], dtype);
        for op in COMPARE {
            compare(
                &format!("{op:?} {dtype:?}"),
                dev,
                &[a.clone(), b.clone()],
                false,
                0.0,
                |t| t[0].compare(op, &t[1]).unwrap(),
            );
            compare(
                &format!("{op:?} {dtype:?} strided"),
                dev,
                &[a.clone(), b.clone()],
                false,
                0.0,
                |t| {
                    let bt = t[1].unsqueeze(1).unwrap();
                    t[0].permute(&[1, 0]).unwrap().compare(op, &bt).unwrap()
                },
            );
        }
    }
}

#[test]
fn scalar_ops_match_the_cpu() {
    let Some(dev) = gpu("scalar_ops_match_the_cpu") else {
        return;
    };
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::F64] {
        let tol = tolerance(dtype);
        let x = randn(&[33, 65], dtype, 20);
        let p = positive(&[33, 65], dtype, 21);
        compare(
            &format!("affine {dtype:?}"),
            dev,
            std::slice::from_ref(&x),
            true,
            tol,
            |t| t[0].affine(1.7, -0.3).unwrap(),
        );
        compare(
            &format!("div_scalar {dtype:?} strided"),
            dev,
            std::slice::from_ref(&x),
            true,
            tol,
            |t| t[0].permute(&[1, 0]).unwrap().div_scalar(3.0).unwrap(),
        );
        for e in [2.0, -1.0, 0.5, 3.0, -1.5] {
            compare(
                &format!("pow_scalar {e} {dtype:?}"),
                dev,
                std::slice::from_ref(&p),
                true,
                tol,
                |t| t[0].pow_scalar(e).unwrap(),
            );
        }
        for (lo, hi) in [(Some(-0.5), Some(0.7)), (None, Some(0.2)), (Some(-0.1), None)] {
            compare(
                &format!("clamp {lo:?} {hi:?} {dtype:?}"),
                dev,
                std::slice::from_ref(&x),
                true,
                tol,
                |t| t[0].narrow(1, 5, 40).unwrap().clamp(lo, hi).unwrap(),
            );
        }
    }
    // NaN through clamp (Rust's max/min send it to the lower bound) and pow.
    let special = values(
        &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -2.0, 0.0, 2.0],
        &[6],
        DType::F32,
    );
    for (lo, hi) in [(Some(-1.0), Some(1.0)), (None, Some(1.0)), (Some(-1.0), None)] {
        compare(
            &format!("clamp {lo:?} {hi:?} specials"),
            dev,
            std::slice::from_ref(&special),
            false,
            0.0,
            |t| t[0].clamp(lo, hi).unwrap(),
        );
    }
    compare(
        "square of specials",
        dev,
        std::slice::from_ref(&special),
        false,
        0.0,
        |t| t[0].square().unwrap(),
    );
    compare(
        "recip of specials",
        dev,
        std::slice::from_ref(&special),
        false,
        0.0,
        |t| t[0].recip().unwrap(),
    );
}

#[test]
fn where_broadcasts_all_three_in_every_dtype() {
    let Some(dev) = gpu("where_broadcasts_all_three_in_every_dtype") else {
        return;
    };
    let cond = randn(&[4, 1, 3], DType::F32, 30).gt(&Tensor::scalar(0.0f32)).unwrap();
    for dtype in ALL_DTYPES {
        let grad = dtype.is_float();
        let (a, b) = (randn(&[1, 5, 3], dtype, 31), randn(&[5, 1], dtype, 32));
        let tol = if grad { tolerance(dtype) } else { 0.0 };
        compare(
            &format!("where {dtype:?}"),
            dev,
            &[cond.clone(), a.clone(), b.clone()],
            grad,
            tol,
            |t| Tensor::where_cond(&t[0], &t[1], &t[2]).unwrap(),
        );
        compare(
            &format!("where {dtype:?} strided"),
            dev,
            &[cond.clone(), a.clone(), b],
            grad,
            tol,
            |t| {
                let c = t[0].permute(&[2, 1, 0]).unwrap();
                let a = t[1].permute(&[2, 1, 0]).unwrap();
                Tensor::where_cond(
                    &c,
                    &a,
                    &Tensor::zeros(&[], t[1].dtype()).unwrap().to(t[1].device()).unwrap(),
                )
                .unwrap()
            },
        );
    }
    let x = randn(&[6, 7], DType::F32, 33);
    let mask = randn(&[7], DType::F32, 34).lt(&Tensor::scalar(0.0f32)).unwrap();
    compare("masked_fill", dev, &[x, mask], true, 1e-5, |t| {
        t[0].masked_fill(&t[1], -1e9).unwrap()
    });
}

#[test]
fn casts_match_the_cpu_bit_for_bit() {
    let Some(dev) = gpu("casts_match_the_cpu_bit_for_bit") else {
        return;
    };
    // Fractions, negatives, rounding ties of the narrow floats, values past every integer type's
    // range, and the specials.
    let v = [
        0.0,
        -0.0,
        0.5,
        -0.5,
        1.5,
        -1.7,
        2.5,
        255.0,
        255.9,
        256.0,
        300.0,
        -300.0,
        65504.0,
        65520.0,
        1.0 + 1.0 / 256.0,
        1.0 + 1.0 / 256.0 + 1e-12,
        1.0 + 3.0 / 512.0,
        3.0e9,
        -3.0e9,
        1.0e20,
        -1.0e20,
        1.0e-40,
        1.0e300,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        123_456_789.123,
        16_777_217.0,
        9.3e18,
    ];
    let base = Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap();
    for from in ALL_DTYPES {
        let x = base.cast(from).unwrap();
        for to in ALL_DTYPES {
            compare(
                &format!("cast {from:?} -> {to:?}"),
                dev,
                std::slice::from_ref(&x),
                false,
                0.0,
                |t| t[0].cast(to).unwrap(),
            );
        }
    }
    // Integer sources with values only they hold (i64 -> i32 wraps, i64 -> f32 rounds twice).
    let ints = Tensor::from_vec(
        vec![
            i64::MAX,
            i64::MIN,
            (1 << 40) + 7,
            -(1 << 33) - 1,
            (1 << 53) + 1,
            200,
            -1,
        ],
        &[7],
    )
    .unwrap();
    for to in ALL_DTYPES {
        compare(
            &format!("cast i64 -> {to:?}"),
            dev,
            std::slice::from_ref(&ints),
            false,
            0.0,
            |t| t[0].cast(to).unwrap(),
        );
    }
    // Strided, empty, and the backward (a cast of the gradient back).
    let x = randn(&[17, 40], DType::F32, 40);
    compare("cast strided", dev, std::slice::from_ref(&x), false, 0.0, |t| {
        t[0].permute(&[1, 0]).unwrap().cast(DType::BF16).unwrap()
    });
    compare("cast empty", dev, &[randn(&[0, 4], DType::F32, 41)], false, 0.0, |t| {
        t[0].cast(DType::I32).unwrap()
    });
    compare("cast backward", dev, std::slice::from_ref(&x), true, 1e-2, |t| {
        t[0].cast(DType::BF16).unwrap().exp().unwrap()
    });
    compare("cast to f64 backward", dev, std::slice::from_ref(&x), true, 1e-5, |t| {
        t[0].cast(DType::F64).unwrap().tanh().unwrap().cast(DType::F32).unwrap()
    });
}

#[test]
fn results_stay_on_the_gpu() {
    let Some(dev) = gpu("results_stay_on_the_gpu") else {
        return;
    };
    let x = randn(&[3, 4], DType::F32, 50).to(dev).unwrap();
    let y = x.exp().unwrap().add(&x).unwrap().gt(&x).unwrap();
    assert_eq!(y.device(), dev);
    assert_eq!(y.dtype(), DType::Bool);
    assert!(y.to_vec_f64().iter().all(|&v| v == 1.0));
    let back = y.to(Device::Cpu).unwrap();
    assert_close(
        "exp(x) + x > x",
        &back,
        &Tensor::ones(&[3, 4], DType::Bool).unwrap(),
        0.0,
    );
}
