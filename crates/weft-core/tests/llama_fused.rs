//! The fused pieces of a llama layer against the compositions they replace: the rotation of
//! halves (`Tensor::rotate_halves`) against narrow, cat, mul and add, and grouped-query
//! attention (`Tensor::grouped_query_attention`) against repeating k and v and plain attention,
//! and SwiGLU's `Tensor::silu_mul` against `silu` then `mul`.
//! Outputs and gradients, in f32 and f64, contiguous and strided inputs (the rotation's bf16
//! case runs the composition on both sides: the kernel takes f32 and f64 only).

mod common;

use common::{leaf, normal, values_and_grads};
use weft_core::{DType, Result, Tensor};

/// Values of `t` as f64 (exact for every float dtype).
fn values(t: &Tensor) -> Vec<f64> {
    t.cast(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// The output of `f` on leaves made from `inputs` (cast to `dtype`; those in `strided` as a
/// transposed view of dims 1 and 2, or of a copy stored that way), and the gradients of
/// `sum(out * w)` for each input.
fn run(
    inputs: &[Tensor],
    dtype: DType,
    strided: &[bool],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> (Vec<f64>, Vec<Vec<f64>>) {
    let leaves: Vec<Tensor> = inputs.iter().map(|t| leaf(&t.cast(dtype).unwrap())).collect();
    let args: Vec<Tensor> = leaves
        .iter()
        .zip(strided)
        .map(|(t, &s)| {
            if s {
                // the same values, read through a transposed layout
                let stored = t.transpose(1, 2).unwrap().contiguous().unwrap();
                stored.transpose(1, 2).unwrap()
            } else {
                t.clone()
            }
        })
        .collect();
    values_and_grads(&f(&args).unwrap(), &leaves, 99)
}

/// `x` with the halves of its last dim exchanged (the composition the fused rotation replaces).
fn swap_halves(x: &Tensor) -> Result<Tensor> {
    let half = x.dim(-1)? / 2;
    Tensor::cat(&[&x.narrow(-1, half, half)?, &x.narrow(-1, 0, half)?], -1)
}

/// Tables shaped like the rotary embeddings' (cos and sin `[T, D]`), but whose two halves
/// differ (the embeddings' cos halves are equal and sin's differ only in sign), so that a kernel
/// reading the wrong half of either gives other values.
fn tables(t: usize, d: usize) -> (Tensor, Tensor) {
    let mut cos = Vec::new();
    let mut sin = Vec::new();
    for p in 0..t {
        for (sign, stretch) in [(-1.0, 1.0), (1.0, 1.37)] {
            for i in 0..d / 2 {
                let f = p as f64 * 0.7f64.powi(i as i32);
                cos.push((f * stretch).cos());
                sin.push(sign * (f / stretch).sin());
            }
        }
    }
    (
        Tensor::from_vec(cos, &[t, d]).unwrap(),
        Tensor::from_vec(sin, &[t, d]).unwrap(),
    )
}

#[test]
fn rotate_halves_equals_the_composition_bit_for_bit() {
    let (b, t, h) = (2, 7, 3);
    for d in [2, 8, 64] {
        // longer tables cut to t positions, as the rotary cache is
        let (cos, sin) = tables(t + 3, d);
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            let (c, s) = (
                cos.cast(dtype).unwrap().narrow(0, 1, t).unwrap(),
                sin.cast(dtype).unwrap().narrow(0, 1, t).unwrap(),
            );
            let (c4, s4) = (c.view(&[1, t, 1, d]).unwrap(), s.view(&[1, t, 1, d]).unwrap());
            // broadcast from fewer dims
            let (c, s) = (c.view(&[t, 1, d]).unwrap(), s.view(&[t, 1, d]).unwrap());
            let x = normal(&[b, t, h, d], d as u64);
            for strided in [false, true] {
                for (ct, st) in [(&c4, &s4), (&c, &s)] {
                    let (ct, st) = (ct.clone(), st.clone());
                    let (ct2, st2) = (ct.clone(), st.clone());
                    let fused = run(std::slice::from_ref(&x), dtype, &[strided], &move |a| {
                        a[0].rotate_halves(&ct, &st)
                    });
                    let composed = run(std::slice::from_ref(&x), dtype, &[strided], &move |a| {
                        a[0].mul(&ct2)?.add(&swap_halves(&a[0])?.mul(&st2)?)
                    });
                    let what = format!("d={d} {dtype:?} strided={strided} table rank {}", c4.rank());
                    assert_eq!(fused.0, composed.0, "{what}: output");
                    assert_eq!(fused.1, composed.1, "{what}: gradient");
                }
            }
        }
    }
}

#[test]
fn rotate_halves_written_out() {
    let (t, d) = (4, 6);
    let (cos, sin) = tables(t, d);
    let x = normal(&[1, t, 1, d], 3);
    let y = values(
        &x.rotate_halves(&cos.view(&[1, t, 1, d]).unwrap(), &sin.view(&[1, t, 1, d]).unwrap())
            .unwrap(),
    );
    let (xv, cv, sv) = (values(&x), values(&cos), values(&sin));
    for p in 0..t {
        for j in 0..d {
            let partner = if j < d / 2 { j + d / 2 } else { j - d / 2 };
            let want = xv[p * d + j] * cv[p * d + j] + xv[p * d + partner] * sv[p * d + j];
            assert_eq!(y[p * d + j], want, "position {p} dim {j}");
        }
    }
    assert!(
        x.narrow(-1, 0, 5).unwrap().rotate_halves(&cos, &sin).is_err(),
        "odd last dim"
    );
    // tables that do not broadcast to the input (more positions) are refused
    let (more_cos, more_sin) = tables(t + 1, d);
    assert!(
        x.rotate_halves(
            &more_cos.view(&[1, t + 1, 1, d]).unwrap(),
            &more_sin.view(&[1, t + 1, 1, d]).unwrap()
        )
        .is_err(),
        "tables of {} positions for {t}",
        t + 1
    );
}

/// k or v `[B, Hkv, S, D]` with each head repeated `rep` times in a row: `[B, Hkv * rep, S, D]`.
fn repeat_heads(z: &Tensor, rep: usize) -> Result<Tensor> {
    let s = z.shape().to_vec();
    let r = s.len();
    let mut wide = s.clone();
    wide.insert(r - 2, rep);
    let mut merged: Vec<isize> = s.iter().map(|&d| d as isize).collect();
    merged[r - 3] *= rep as isize;
    z.unsqueeze((r - 2) as isize)?.expand(&wide)?.reshape(&merged)
}

#[test]
fn grouped_query_attention_equals_repeated_heads() {
    let (h, t, d) = (4, 19, 8);
    // one batch element: tasks of one group each; two: of all heads of an element
    // (8 batch elements: tasks of all heads of an element, several groups each, on machines of
    // up to 8 threads)
    for (b, kv_heads) in [(2, 4), (2, 2), (2, 1), (1, 2), (1, 1), (8, 2)] {
        let rep = h / kv_heads;
        for causal in [true, false] {
            for dtype in [DType::F32, DType::F64] {
                for strided in [false, true] {
                    let q = normal(&[b, h, t, d], 1);
                    let k = normal(&[b, kv_heads, t, d], 2);
                    let v = normal(&[b, kv_heads, t, d + 2], 3);
                    let inputs = [q, k, v];
                    let fl = [strided; 3];
                    let grouped = run(&inputs, dtype, &fl, &|a| {
                        Tensor::grouped_query_attention(&a[0], &a[1], &a[2], causal, None)
                    });
                    let repeated = run(&inputs, dtype, &fl, &|a| {
                        Tensor::scaled_dot_product_attention(
                            &a[0],
                            &repeat_heads(&a[1], rep)?,
                            &repeat_heads(&a[2], rep)?,
                            causal,
                            None,
                        )
                    });
                    let what = format!("b={b} kv_heads={kv_heads} causal={causal} {dtype:?} strided={strided}");
                    assert_eq!(grouped.0, repeated.0, "{what}: output");
                    assert_eq!(grouped.1[0], repeated.1[0], "{what}: dq");
                    for (i, name) in [(1, "dk"), (2, "dv")] {
                        let (g, r) = (&grouped.1[i], &repeated.1[i]);
                        assert_eq!(g.len(), r.len(), "{what}: {name} size");
                        if rep <= 2 {
                            // a sum of two is the same in any order
                            assert_eq!(g, r, "{what}: {name}");
                        } else {
                            for (j, (x, y)) in g.iter().zip(r).enumerate() {
                                assert!(
                                    (x - y).abs() <= 1e-6 * y.abs().max(1e-3),
                                    "{what}: {name}[{j}] {x} vs {y}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn grouped_query_attention_rank_3_and_errors() {
    // [heads, T, D] without a batch dim, as a decode step's
    let q = normal(&[6, 5, 4], 1);
    let k = normal(&[2, 9, 4], 2);
    let v = normal(&[2, 9, 4], 3);
    let fl = [false; 3];
    let grouped = run(&[q.clone(), k.clone(), v.clone()], DType::F32, &fl, &|a| {
        Tensor::grouped_query_attention(&a[0], &a[1], &a[2], false, None)
    });
    let repeated = run(&[q.clone(), k.clone(), v.clone()], DType::F32, &fl, &|a| {
        Tensor::scaled_dot_product_attention(&a[0], &repeat_heads(&a[1], 3)?, &repeat_heads(&a[2], 3)?, false, None)
    });
    assert_eq!(grouped.0, repeated.0);
    for i in 0..3 {
        for (x, y) in grouped.1[i].iter().zip(&repeated.1[i]) {
            assert!((x - y).abs() <= 1e-6 * y.abs().max(1e-3), "input {i}: {x} vs {y}");
        }
    }
    // causal with fewer queries than keys
    for causal in [true, false] {
        let q = normal(&[6, 5, 4], 4);
        let grouped = run(&[q.clone(), k.clone(), v.clone()], DType::F64, &fl, &|a| {
            Tensor::grouped_query_attention(&a[0], &a[1], &a[2], causal, None)
        });
        let repeated = run(&[q, k.clone(), v.clone()], DType::F64, &fl, &|a| {
            Tensor::scaled_dot_product_attention(
                &a[0],
                &repeat_heads(&a[1], 3)?,
                &repeat_heads(&a[2], 3)?,
                causal,
                None,
            )
        });
        assert_eq!(grouped.0, repeated.0, "causal {causal}");
        for i in 0..3 {
            for (x, y) in grouped.1[i].iter().zip(&repeated.1[i]) {
                assert!(
                    (x - y).abs() <= 1e-12 * y.abs().max(1e-3),
                    "causal {causal} input {i}: {x} vs {y}"
                );
            }
        }
    }
    let k4 = normal(&[4, 9, 4], 2);
    assert!(
        Tensor::grouped_query_attention(&q, &k4, &k4, false, None).is_err(),
        "6 heads over 4"
    );
    // k and v with different numbers of keys, and no query heads
    let v_short = normal(&[2, 8, 4], 3);
    assert!(
        Tensor::grouped_query_attention(&q, &k, &v_short, false, None).is_err(),
        "S 9 and 8"
    );
    let v_long = normal(&[2, 10, 4], 3);
    assert!(
        Tensor::grouped_query_attention(&q, &k, &v_long, false, None).is_err(),
        "S 9 and 10"
    );
    let q0 = normal(&[0, 5, 4], 1);
    assert!(
        Tensor::grouped_query_attention(&q0, &k, &v, false, None).is_err(),
        "no query heads"
    );
    // plain attention still wants equal heads
    assert!(Tensor::scaled_dot_product_attention(&q, &k, &v, false, None).is_err());
}

#[test]
fn silu_mul_equals_silu_then_mul() {
    // sizes below and above the parallel threshold, ragged
    for shape in [vec![3, 5, 7], vec![4, 77, 131]] {
        let x = normal(&shape, 5).mul_scalar(3.0).unwrap();
        let u = normal(&shape, 6);
        for dtype in [DType::F32, DType::F64] {
            for strided in [false, true] {
                let inputs = [x.clone(), u.clone()];
                let fl = [strided; 2];
                let fused = run(&inputs, dtype, &fl, &|a| a[0].silu_mul(&a[1]));
                let composed = run(&inputs, dtype, &fl, &|a| a[0].silu()?.mul(&a[1]));
                let what = format!("{shape:?} {dtype:?} strided={strided}");
                if dtype == DType::F32 {
                    assert_eq!(fused.0, composed.0, "{what}: output");
                    assert_eq!(fused.1, composed.1, "{what}: gradients");
                } else {
                    // the composition's own derivative formula against the silu op's
                    assert_eq!(fused.0, composed.0, "{what}: output");
                    for (g, c) in fused.1.iter().zip(&composed.1) {
                        for (a, b) in g.iter().zip(c) {
                            assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{what}: {a} vs {b}");
                        }
                    }
                }
            }
        }
    }
    let (a, b) = (normal(&[2, 3], 1), normal(&[3, 2], 2));
    assert!(a.silu_mul(&b).is_err(), "shapes differ");
}
