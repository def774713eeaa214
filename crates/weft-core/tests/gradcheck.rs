//! Finite-difference gradient checks (f64) for every differentiable op, including broadcasting and
//! non-contiguous (transposed, narrowed, expanded) inputs.

#![allow(clippy::cloned_ref_to_slice_refs)] // inputs are passed as owned arrays for brevity

mod common;

use common::{gradcheck, gradcheck_tol, normal, uniform};
use weft_core::{Conv2dParams, DType, Generator, Op, Pool2dParams, Tensor, UnaryOp};

#[test]
fn unary_ops() {
    let x = normal(&[3, 4], 1);
    let pos = uniform(&[3, 4], 0.5, 2.0, 2);
    for op in [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
        UnaryOp::Relu,
        UnaryOp::Abs,
    ] {
        gradcheck(&format!("{op:?}"), &[x.clone()], |t| t[0].unary(op));
        // non-contiguous input
        gradcheck(&format!("{op:?} transposed"), &[x.clone()], |t| t[0].t()?.unary(op));
    }
    for op in [UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt] {
        gradcheck(&format!("{op:?}"), &[pos.clone()], |t| t[0].unary(op));
    }
}

#[test]
fn binary_ops_broadcast() {
    let shapes: [(&[usize], &[usize]); 4] = [
        (&[2, 3], &[2, 3]),
        (&[2, 3], &[3]),
        (&[4, 1, 3], &[2, 1]),
        (&[], &[2, 2]),
    ];
    for (i, (sa, sb)) in shapes.iter().enumerate() {
        let a = uniform(sa, 0.5, 2.0, 10 + i as u64);
        let b = uniform(sb, 0.5, 2.0, 20 + i as u64);
        gradcheck("add", &[a.clone(), b.clone()], |t| t[0].add(&t[1]));
        gradcheck("sub", &[a.clone(), b.clone()], |t| t[0].sub(&t[1]));
        gradcheck("mul", &[a.clone(), b.clone()], |t| t[0].mul(&t[1]));
        gradcheck("div", &[a.clone(), b.clone()], |t| t[0].div(&t[1]));
        gradcheck("pow", &[a.clone(), b.clone()], |t| t[0].pow(&t[1]));
        gradcheck("maximum", &[a.clone(), b.clone()], |t| t[0].maximum(&t[1]));
        gradcheck("minimum", &[a.clone(), b.clone()], |t| t[0].minimum(&t[1]));
    }
    // a transposed operand
    let a = normal(&[3, 2], 5);
    let b = normal(&[2, 3], 6);
    gradcheck("mul transposed", &[a, b], |t| t[0].t()?.mul(&t[1]));
}

#[test]
fn scalar_ops_clamp_where() {
    let x = normal(&[3, 5], 3);
    gradcheck("affine", &[x.clone()], |t| t[0].affine(-1.5, 0.25));
    gradcheck("pow_scalar", &[uniform(&[4], 0.5, 2.0, 4)], |t| t[0].pow_scalar(2.5));
    gradcheck("clamp", &[x.clone()], |t| t[0].clamp(Some(-0.5), Some(0.7)));
    let a = normal(&[3, 5], 8);
    let b = normal(&[5], 9);
    gradcheck("where", &[x.clone(), a, b], |t| {
        let cond = t[0].gt(&Tensor::zeros(&[], DType::F64)?)?;
        Tensor::where_cond(&cond, &t[1], &t[2])
    });
    gradcheck("masked_fill", &[x.clone()], |t| {
        let mask = t[0].detach().lt(&Tensor::zeros(&[], DType::F64)?)?;
        t[0].masked_fill(&mask, 3.0)
    });
    // f32 rounding needs a wide step: the check is that the gradient passes through unchanged
    gradcheck_tol("cast round trip", &[x], 1e-2, 1e-4, |t| {
        t[0].cast(DType::F32)?.cast(DType::F64)
    });
}

#[test]
fn reductions() {
    let x = normal(&[3, 4, 5], 11);
    for dims in [vec![], vec![0], vec![1], vec![-1], vec![0, 2]] {
        for keep in [false, true] {
            gradcheck("sum", &[x.clone()], |t| t[0].sum(&dims, keep));
            gradcheck("mean", &[x.clone()], |t| t[0].mean(&dims, keep));
            gradcheck("max", &[x.clone()], |t| t[0].max(&dims, keep));
            gradcheck("min", &[x.clone()], |t| t[0].min(&dims, keep));
            gradcheck("var", &[x.clone()], |t| t[0].var(&dims, 1, keep));
            gradcheck("var biased", &[x.clone()], |t| t[0].var(&dims, 0, keep));
        }
    }
    gradcheck("sum of permuted", &[x], |t| t[0].permute(&[2, 0, 1])?.sum(&[1], false));
}

#[test]
fn matmul_shapes() {
    let cases: [(&[usize], &[usize]); 5] = [
        (&[3, 4], &[4, 2]),
        (&[2, 3, 4], &[4, 5]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[1, 3, 4], &[2, 4, 2]),
        (&[4], &[4, 3]),
    ];
    for (i, (sa, sb)) in cases.iter().enumerate() {
        gradcheck("matmul", &[normal(sa, 30 + i as u64), normal(sb, 40 + i as u64)], |t| {
            t[0].matmul(&t[1])
        });
    }
    gradcheck(
        "matmul transposed operands",
        &[normal(&[4, 3], 50), normal(&[2, 4], 51)],
        |t| t[0].t()?.matmul(&t[1].t()?),
    );
    gradcheck(
        "linear",
        &[normal(&[2, 3, 4], 52), normal(&[5, 4], 53), normal(&[5], 54)],
        |t| t[0].linear(&t[1], Some(&t[2])),
    );
    gradcheck("linear no bias", &[normal(&[2, 3, 4], 55), normal(&[5, 4], 56)], |t| {
        t[0].linear(&t[1], None)
    });
    // no input features: the bias alone (zeros without one), with or without a residual
    for dtype in [DType::F32, DType::F64] {
        let x = Tensor::zeros(&[2, 3, 0], dtype).unwrap();
        let w = Tensor::zeros(&[5, 0], dtype).unwrap();
        let b = Tensor::full(&[5], 0.5, dtype).unwrap();
        assert_eq!(x.linear(&w, None).unwrap().to_vec_f64(), vec![0.0; 30]);
        assert_eq!(x.linear(&w, Some(&b)).unwrap().to_vec_f64(), vec![0.5; 30]);
        let r = Tensor::full(&[2, 3, 5], 1.0, dtype).unwrap();
        assert_eq!(x.linear_add(&w, None, &r).unwrap().to_vec_f64(), vec![1.0; 30]);
    }
}

#[test]
fn linear_act() {
    for act in [UnaryOp::Gelu, UnaryOp::Relu, UnaryOp::Tanh] {
        gradcheck(
            &format!("linear_act {act:?}"),
            &[normal(&[2, 3, 4], 55), normal(&[5, 4], 56), normal(&[5], 57)],
            |t| t[0].linear_act(&t[1], Some(&t[2]), act),
        );
    }
    // transposed input and weight, and no bias (the unfused path)
    gradcheck(
        "linear_act strided",
        &[normal(&[4, 3], 58), normal(&[4, 5], 59), normal(&[5], 60)],
        |t| t[0].t()?.linear_act(&t[1].t()?, Some(&t[2]), UnaryOp::Gelu),
    );
    gradcheck("linear_act no bias", &[normal(&[3, 4], 61), normal(&[5, 4], 62)], |t| {
        t[0].linear_act(&t[1], None, UnaryOp::Gelu)
    });
    // f32, large enough to split across threads: the same bits as linear then gelu, values and
    // gradients
    let f32s = |t: Tensor| t.cast(DType::F32).unwrap();
    let (x, w, b) = (
        f32s(normal(&[300, 64], 63)),
        f32s(normal(&[96, 64], 64)),
        f32s(normal(&[96], 65)),
    );
    let run = |fused: bool| {
        let (x, w, b) = (leaf_of(&x), leaf_of(&w), leaf_of(&b));
        let y = if fused {
            x.linear_act(&w, Some(&b), UnaryOp::Gelu).unwrap()
        } else {
            x.linear(&w, Some(&b)).unwrap().gelu().unwrap()
        };
        let g = f32s(normal(y.shape(), 66));
        y.mul(&g).unwrap().sum(&[], false).unwrap().backward().unwrap();
        [y, x.grad().unwrap(), w.grad().unwrap(), b.grad().unwrap()].map(|t| t.to_vec::<f32>().unwrap())
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn linear_add() {
    gradcheck(
        "linear_add",
        &[
            normal(&[2, 3, 4], 67),
            normal(&[5, 4], 68),
            normal(&[5], 69),
            normal(&[2, 3, 5], 70),
        ],
        |t| t[0].linear_add(&t[1], Some(&t[2]), &t[3]),
    );
    // a residual that broadcasts goes through the unfused ops
    gradcheck(
        "linear_add broadcast",
        &[
            normal(&[3, 4], 71),
            normal(&[5, 4], 72),
            normal(&[5], 73),
            normal(&[5], 74),
        ],
        |t| t[0].linear_add(&t[1], Some(&t[2]), &t[3]),
    );
    // f32, split across threads: the same bits as residual + linear, values and gradients
    let f32s = |t: Tensor| t.cast(DType::F32).unwrap();
    let (x, w, b, r) = (
        f32s(normal(&[4, 75, 64], 75)),
        f32s(normal(&[96, 64], 76)),
        f32s(normal(&[96], 77)),
        f32s(normal(&[4, 75, 96], 78)),
    );
    let run = |fused: bool| {
        let (x, w, b, r) = (leaf_of(&x), leaf_of(&w), leaf_of(&b), leaf_of(&r));
        let y = if fused {
            x.linear_add(&w, Some(&b), &r).unwrap()
        } else {
            r.add(&x.linear(&w, Some(&b)).unwrap()).unwrap()
        };
        let g = f32s(normal(y.shape(), 79));
        y.mul(&g).unwrap().sum(&[], false).unwrap().backward().unwrap();
        [
            y,
            x.grad().unwrap(),
            w.grad().unwrap(),
            b.grad().unwrap(),
            r.grad().unwrap(),
        ]
        .map(|t| t.to_vec::<f32>().unwrap())
    };
    assert_eq!(run(true), run(false));
    gradcheck(
        "linear_add no bias",
        &[normal(&[2, 3, 4], 84), normal(&[5, 4], 85), normal(&[2, 3, 5], 86)],
        |t| t[0].linear_add(&t[1], None, &t[2]),
    );
    // without a bias, against the residual plus the plain product (the weight's gradient made
    // in the weight's layout, `g^T x`, rather than transposed from `x^T g`: the same sums, the
    // same bits)
    let run = |fused: bool| {
        let (x, w, r) = (leaf_of(&x), leaf_of(&w), leaf_of(&r));
        let y = if fused {
            // one op (on 2-D operands, no reshape around it): the product, its residual added
            // in its blocks
            let (x2, r2) = (x.reshape(&[-1, 64]).unwrap(), r.reshape(&[-1, 96]).unwrap());
            let op = x2.linear_add(&w, None, &r2).unwrap().op().cloned();
            assert!(
                matches!(
                    op,
                    Some(Op::Linear {
                        act: None,
                        bias: false,
                        residual: true
                    })
                ),
                "{op:?}"
            );
            x.linear_add(&w, None, &r).unwrap()
        } else {
            r.add(&x.matmul(&w.t().unwrap()).unwrap()).unwrap()
        };
        let g = f32s(normal(y.shape(), 87));
        y.mul(&g).unwrap().sum(&[], false).unwrap().backward().unwrap();
        let w_grad = w.grad().unwrap();
        assert!(w_grad.is_contiguous() && w_grad.shape() == [96, 64]);
        [y, x.grad().unwrap(), w_grad, r.grad().unwrap()].map(|t| t.to_vec::<f32>().unwrap())
    };
    assert_eq!(run(true), run(false));
    // a residual of the wrong shape is refused, naming both shapes
    let e = normal(&[3, 4], 80)
        .linear_add(&normal(&[5, 4], 81), Some(&normal(&[5], 82)), &normal(&[3, 6], 83))
        .unwrap_err()
        .to_string();
    assert!(e.contains("[3, 6]") && e.contains("[3, 5]"), "{e}");
}

#[test]
fn shape_ops() {
    let x = normal(&[2, 3, 4], 60);
    gradcheck("reshape", &[x.clone()], |t| t[0].reshape(&[4, -1]));
    gradcheck("permute+reshape", &[x.clone()], |t| {
        t[0].permute(&[1, 2, 0])?.reshape(&[-1])
    });
    gradcheck("narrow", &[x.clone()], |t| t[0].narrow(1, 1, 2));
    gradcheck("expand", &[normal(&[3, 1], 61)], |t| t[0].expand(&[2, 3, 4]));
    gradcheck("squeeze/unsqueeze", &[normal(&[3, 1], 62)], |t| {
        t[0].squeeze(1)?.unsqueeze(0)
    });
    gradcheck("cat", &[normal(&[2, 3], 63), normal(&[2, 2], 64)], |t| {
        Tensor::cat(&[&t[0], &t[1]], 1)
    });
    gradcheck("stack", &[normal(&[2, 3], 65), normal(&[2, 3], 66)], |t| {
        Tensor::stack(&[&t[0], &t[1]], 1)
    });
    gradcheck("split", &[x.clone()], |t| {
        let parts = t[0].split(&[1, 3], -1)?;
        parts[1].mul(&parts[1])
    });
    gradcheck("contiguous", &[x], |t| t[0].transpose(0, 2)?.contiguous());
}

#[test]
fn index_ops() {
    let w = normal(&[5, 3], 70);
    let idx = Tensor::from_vec(vec![4i64, 0, 4, 2], &[4]).unwrap();
    gradcheck("index_select", &[w.clone()], |t| t[0].index_select(0, &idx));
    gradcheck("index_select dim1", &[w.clone()], |t| {
        t[0].index_select(1, &Tensor::from_vec(vec![2i64, 2, 0], &[3])?)
    });
    let ids = Tensor::from_vec(vec![1i64, 3, 3, 0, 2, 4], &[2, 3]).unwrap();
    gradcheck("embedding", &[w.clone()], |t| t[0].embedding(&ids));
    let gidx = Tensor::from_vec(vec![0i64, 2, 1, 1, 0, 0], &[2, 3]).unwrap();
    gradcheck("gather", &[normal(&[2, 3], 71)], |t| t[0].gather(1, &gidx));
    gradcheck("scatter_add", &[normal(&[2, 3], 72), normal(&[2, 3], 73)], |t| {
        t[0].scatter_add(1, &gidx, &t[1])
    });
    gradcheck("index_add", &[normal(&[5, 3], 74), normal(&[4, 3], 75)], |t| {
        t[0].index_add(0, &idx, &t[1])
    });
}

#[test]
fn fused_nn_ops() {
    let x = normal(&[4, 7], 80);
    gradcheck("softmax", &[x.clone()], |t| t[0].softmax(-1));
    gradcheck("softmax dim0", &[x.clone()], |t| t[0].softmax(0));
    gradcheck("log_softmax", &[x.clone()], |t| t[0].log_softmax(-1));
    let (w, b) = (normal(&[7], 81), normal(&[7], 82));
    gradcheck("layer_norm", &[x.clone(), w.clone(), b.clone()], |t| {
        t[0].layer_norm(Some(&t[1]), Some(&t[2]), 1e-5)
    });
    gradcheck("layer_norm no affine", &[x.clone()], |t| {
        t[0].layer_norm(None, None, 1e-5)
    });
    gradcheck("layer_norm weight only", &[x.clone(), w.clone()], |t| {
        t[0].layer_norm(Some(&t[1]), None, 1e-5)
    });
    gradcheck("rms_norm", &[x.clone(), w.clone()], |t| {
        t[0].rms_norm(Some(&t[1]), 1e-6)
    });
    gradcheck(
        "layer_norm transposed",
        &[normal(&[7, 4], 83), w.clone(), b.clone()],
        |t| t[0].t()?.layer_norm(Some(&t[1]), Some(&t[2]), 1e-5),
    );
    let targets = Tensor::from_vec(vec![1i64, -100, 6, 0], &[4]).unwrap();
    gradcheck("cross_entropy", &[x.clone()], |t| {
        t[0].cross_entropy(&targets, -100, 0.0)
    });
    gradcheck("cross_entropy smoothing", &[x.clone()], |t| {
        t[0].cross_entropy(&targets, -100, 0.1)
    });
    gradcheck("dropout", &[x], |t| t[0].dropout(0.3, true, &mut Generator::new(5)));
}

#[test]
fn attention() {
    // 70 queries cross the 64-query tile boundary of the kernel
    for (causal, t, s) in [(true, 5, 5), (false, 3, 6), (true, 70, 70), (false, 70, 9)] {
        let q = normal(&[1, 2, t, 4], 90);
        let k = normal(&[1, 2, s, 4], 91);
        let v = normal(&[1, 2, s, 3], 92);
        gradcheck("attention", &[q, k, v], |x| {
            Tensor::scaled_dot_product_attention(&x[0], &x[1], &x[2], causal, None)
        });
    }
}

#[test]
fn attention_on_strided_views() {
    // q, k, v as the transposes of [B, T, H, D] tensors, as a model's head split produces them
    let (q, k, v) = (
        normal(&[1, 6, 2, 4], 93),
        normal(&[1, 6, 2, 4], 94),
        normal(&[1, 6, 2, 3], 95),
    );
    for causal in [true, false] {
        gradcheck("attention strided", &[q.clone(), k.clone(), v.clone()], |x| {
            let heads = |t: &Tensor| t.transpose(1, 2);
            let o = Tensor::scaled_dot_product_attention(&heads(&x[0])?, &heads(&x[1])?, &heads(&x[2])?, causal, None)?;
            // back to [B, T, H * Dv], through the (strided) output
            o.transpose(1, 2)?.reshape(&[1, 6, 6])
        });
    }
}

/// The fused projection's attention, as the unfused ops compute it: split q, k, v, view each as
/// `[B, H, T, hd]`, attend, merge the heads back.
fn unfused_qkv_attention(qkv: &Tensor, heads: usize, causal: bool) -> weft_core::Result<Tensor> {
    let (b, t, w) = (qkv.dim(0)?, qkv.dim(1)?, qkv.dim(2)?);
    let (c, hd) = (w / 3, w / 3 / heads);
    let x = qkv.reshape(&[b as isize, t as isize, 3, heads as isize, hd as isize])?;
    let part = |i: usize| {
        x.narrow(2, i, 1)?
            .reshape(&[b as isize, t as isize, heads as isize, hd as isize])?
            .transpose(1, 2)
    };
    let o = Tensor::scaled_dot_product_attention(&part(0)?, &part(1)?, &part(2)?, causal, None)?;
    o.transpose(1, 2)?.reshape(&[b as isize, t as isize, c as isize])
}

#[test]
fn qkv_attention() {
    // 70 positions cross the kernel's query tiles; 3 heads of 4
    for (causal, t) in [(true, 5), (false, 4), (true, 70)] {
        let qkv = normal(&[2, t, 36], 96);
        gradcheck("qkv attention", &[qkv.clone()], |x| x[0].qkv_attention(3, causal, None));
        // same values and gradient as the unfused ops
        let fused = leaf_of(&qkv);
        let unfused = leaf_of(&qkv);
        let (yf, yu) = (
            fused.qkv_attention(3, causal, None).unwrap(),
            unfused_qkv_attention(&unfused, 3, causal).unwrap(),
        );
        let w = normal(yf.shape(), 97);
        yf.mul(&w).unwrap().sum(&[], false).unwrap().backward().unwrap();
        yu.mul(&w).unwrap().sum(&[], false).unwrap().backward().unwrap();
        let max_diff = |a: &Tensor, b: &Tensor| {
            let (a, b) = (a.to_vec::<f64>().unwrap(), b.to_vec::<f64>().unwrap());
            a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
        };
        assert!(max_diff(&yf, &yu) < 1e-12, "values differ (t = {t})");
        let (gf, gu) = (fused.grad().unwrap(), unfused.grad().unwrap());
        assert!(max_diff(&gf, &gu) < 1e-12, "gradients differ (t = {t})");
    }
    // a strided input (a transposed view) is read correctly
    let x = normal(&[2, 12, 5], 98);
    gradcheck("qkv attention strided", &[x], |x| {
        x[0].transpose(1, 2)?.qkv_attention(2, true, None)
    });
    // a width that is not 3 x heads x head size is refused, naming the shape
    let e = normal(&[2, 3, 10], 99)
        .qkv_attention(3, true, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("qkv_attention") && e.contains("[2, 3, 10]"), "{e}");
}

fn leaf_of(t: &Tensor) -> Tensor {
    t.detach().requires_grad_().unwrap()
}

#[test]
fn conv_and_pool() {
    let x = normal(&[2, 4, 5, 6], 100);
    for (stride, padding, dilation, groups) in [
        ((1, 1), (0, 0), (1, 1), 1),
        ((2, 1), (1, 2), (1, 1), 2),
        ((1, 2), (1, 1), (2, 1), 4),
    ] {
        let w = normal(&[4, 4 / groups, 3, 2], 101);
        let b = normal(&[4], 102);
        let p = Conv2dParams {
            stride,
            padding,
            dilation,
            groups,
        };
        gradcheck("conv2d", &[x.clone(), w, b], |t| t[0].conv2d(&t[1], Some(&t[2]), p));
    }
    gradcheck("max_pool2d", &[x.clone()], |t| t[0].max_pool2d(Pool2dParams::square(2)));
    let p = Pool2dParams {
        kernel: (3, 2),
        stride: (2, 1),
        padding: (1, 1),
    };
    gradcheck("max_pool2d padded", &[x.clone()], |t| t[0].max_pool2d(p));
    gradcheck("avg_pool2d", &[x.clone()], |t| t[0].avg_pool2d(p));
}
