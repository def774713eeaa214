//! Ops against hand-computed values, dtype behaviour, RNG properties, and the error messages of
//! misuse (naming the op and the shapes).

use weft_core::{Conv2dParams, DType, Error, Generator, Pool2dParams, Tensor};

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn ids(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-9, "{a:?} vs {b:?}");
    }
}

#[test]
fn arithmetic_and_broadcasting() {
    let a = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = t(&[10.0, 20.0], &[2]);
    assert_eq!(a.add(&b).unwrap().to_vec_f64(), vec![11.0, 22.0, 13.0, 24.0]);
    assert_eq!(
        a.sub(&b.view(&[2, 1]).unwrap()).unwrap().to_vec_f64(),
        vec![-9.0, -8.0, -17.0, -16.0]
    );
    assert_eq!(a.mul(&a.t().unwrap()).unwrap().to_vec_f64(), vec![1.0, 6.0, 6.0, 16.0]);
    assert_eq!(a.pow_scalar(2.0).unwrap().to_vec_f64(), vec![1.0, 4.0, 9.0, 16.0]);
    assert_eq!(
        a.clamp(Some(1.5), Some(3.0)).unwrap().to_vec_f64(),
        vec![1.5, 2.0, 3.0, 3.0]
    );
    assert_eq!(
        a.gt(&t(&[2.0], &[1])).unwrap().to_vec::<bool>().unwrap(),
        vec![false, false, true, true]
    );
    let mask = a.le(&t(&[2.0], &[])).unwrap();
    assert_eq!(
        a.masked_fill(&mask, -1.0).unwrap().to_vec_f64(),
        vec![-1.0, -1.0, 3.0, 4.0]
    );
    let ia = ids(&[5, -3], &[2]);
    assert_eq!(ia.mul(&ids(&[2], &[1])).unwrap().to_vec::<i64>().unwrap(), vec![10, -6]);
    assert!(ia.div(&ia).is_err(), "integer division asks for a cast");
}

#[test]
fn unary_values() {
    let x = t(&[-1.0, 0.0, 2.0], &[3]);
    close(&x.relu().unwrap().to_vec_f64(), &[0.0, 0.0, 2.0]);
    close(
        &x.sigmoid().unwrap().to_vec_f64(),
        &[1.0 / (1.0 + 1f64.exp()), 0.5, 1.0 / (1.0 + (-2f64).exp())],
    );
    close(
        &x.silu().unwrap().to_vec_f64(),
        &[-1.0 / (1.0 + 1f64.exp()), 0.0, 2.0 / (1.0 + (-2f64).exp())],
    );
    // gelu(x) = x * Phi(x); Phi(-1) = 0.15865525393145707, Phi(2) = 0.9772498680518208
    close(
        &x.gelu().unwrap().to_vec_f64(),
        &[-0.15865525393145707, 0.0, 2.0 * 0.9772498680518208],
    );
}

#[test]
fn reductions_values() {
    let x = t(&[1.0, 5.0, 3.0, 2.0, 2.0, 8.0], &[2, 3]);
    assert_eq!(x.sum(&[1], false).unwrap().to_vec_f64(), vec![9.0, 12.0]);
    assert_eq!(x.sum(&[0], true).unwrap().shape(), &[1, 3]);
    assert_eq!(x.mean_all().unwrap().item().unwrap(), 3.5);
    assert_eq!(x.max(&[0], false).unwrap().to_vec_f64(), vec![2.0, 5.0, 8.0]);
    assert_eq!(x.min(&[-1], false).unwrap().to_vec_f64(), vec![1.0, 2.0]);
    assert_eq!(x.argmax(1, false).unwrap().to_vec::<i64>().unwrap(), vec![1, 2]);
    // var([1, 5, 3]) unbiased = 4, biased = 8/3
    close(&x.var(&[1], 1, false).unwrap().to_vec_f64(), &[4.0, 12.0]);
    close(&x.var(&[1], 0, false).unwrap().to_vec_f64(), &[8.0 / 3.0, 8.0]);
    let i = ids(&[3, 7, 1], &[3]);
    assert_eq!(i.sum_all().unwrap().to_vec::<i64>().unwrap(), vec![11]);
    assert_eq!(i.max(&[], false).unwrap().to_vec::<i64>().unwrap(), vec![7]);
}

#[test]
fn matmul_values() {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = t(&[7.0, 8.0, 9.0, 10.0, 11.0, 12.0], &[3, 2]);
    assert_eq!(a.matmul(&b).unwrap().to_vec_f64(), vec![58.0, 64.0, 139.0, 154.0]);
    assert_eq!(
        a.matmul(&t(&[1.0, 0.0, -1.0], &[3])).unwrap().to_vec_f64(),
        vec![-2.0, -2.0]
    );
    let batched = Tensor::stack(&[&a, &a.mul_scalar(2.0).unwrap()], 0)
        .unwrap()
        .matmul(&b)
        .unwrap();
    assert_eq!(batched.shape(), &[2, 2, 2]);
    assert_eq!(batched.to_vec_f64()[4..], [116.0, 128.0, 278.0, 308.0]);
    let f32 = a
        .cast(DType::F32)
        .unwrap()
        .matmul(&b.cast(DType::F32).unwrap())
        .unwrap();
    assert_eq!(f32.dtype(), DType::F32);
    let bf = a
        .cast(DType::BF16)
        .unwrap()
        .matmul(&b.cast(DType::BF16).unwrap())
        .unwrap();
    assert_eq!(
        (bf.dtype(), bf.to_vec_f64()),
        (DType::BF16, vec![58.0, 64.0, 139.0, 154.0])
    );
}

#[test]
fn shape_and_index_values() {
    let a = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = t(&[5.0, 6.0], &[2, 1]);
    assert_eq!(
        Tensor::cat(&[&a, &b], 1).unwrap().to_vec_f64(),
        vec![1.0, 2.0, 5.0, 3.0, 4.0, 6.0]
    );
    let parts = a.split(&[1, 1], 0).unwrap();
    assert_eq!(parts[1].to_vec_f64(), vec![3.0, 4.0]);
    assert_eq!(
        a.index_select(1, &ids(&[1, 1, 0], &[3])).unwrap().to_vec_f64(),
        vec![2.0, 2.0, 1.0, 4.0, 4.0, 3.0]
    );
    assert_eq!(
        a.gather(1, &ids(&[1, 0, 0, 0], &[2, 2])).unwrap().to_vec_f64(),
        vec![2.0, 1.0, 3.0, 3.0]
    );
    let z = Tensor::zeros(&[2, 3], DType::F64).unwrap();
    let s = z.scatter_add(1, &ids(&[2, 2, 0, 1], &[2, 2]), &a).unwrap();
    assert_eq!(s.to_vec_f64(), vec![0.0, 0.0, 3.0, 3.0, 4.0, 0.0]);
    assert_eq!(
        ids(&[2, 0], &[2]).one_hot(3).unwrap().to_vec::<i64>().unwrap(),
        vec![0, 0, 1, 1, 0, 0]
    );
    let emb = a.embedding(&ids(&[1, 1, 0], &[3])).unwrap();
    assert_eq!(
        (emb.shape(), emb.to_vec_f64()),
        (&[3usize, 2][..], vec![3.0, 4.0, 3.0, 4.0, 1.0, 2.0])
    );
    assert_eq!(
        Tensor::arange(0.0, 5.0, 2.0, DType::I64)
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![0, 2, 4]
    );
}

#[test]
fn fused_values() {
    let x = t(&[0.0, 2f64.ln()], &[1, 2]);
    close(&x.softmax(-1).unwrap().to_vec_f64(), &[1.0 / 3.0, 2.0 / 3.0]);
    close(
        &x.log_softmax(-1).unwrap().to_vec_f64(),
        &[(1.0f64 / 3.0).ln(), (2.0f64 / 3.0).ln()],
    );
    let y = t(&[1.0, 2.0, 3.0], &[1, 3]).layer_norm(None, None, 0.0).unwrap();
    close(&y.to_vec_f64(), &[-(1.5f64).sqrt(), 0.0, (1.5f64).sqrt()]);
    let r = t(&[3.0, 4.0], &[1, 2]).rms_norm(None, 0.0).unwrap();
    let rms = 12.5f64.sqrt();
    close(&r.to_vec_f64(), &[3.0 / rms, 4.0 / rms]);
    let logits = t(&[0.0, 0.0, 5.0, 1.0], &[2, 2]);
    let l = logits.cross_entropy(&ids(&[0, -100], &[2]), -100, 0.0).unwrap();
    close(&[l.item().unwrap()], &[2f64.ln()]);
    let all_ignored = logits.cross_entropy(&ids(&[-100, -100], &[2]), -100, 0.0).unwrap();
    assert!(
        all_ignored.item().unwrap().is_nan(),
        "PyTorch gives NaN when every target is ignored"
    );
    // one query sees one key: output is that value
    let (q, k, v) = (
        t(&[1.0, 0.0], &[1, 1, 2]),
        t(&[3.0, 1.0], &[1, 1, 2]),
        t(&[7.0, -1.0], &[1, 1, 2]),
    );
    close(
        &Tensor::scaled_dot_product_attention(&q, &k, &v, true, None)
            .unwrap()
            .to_vec_f64(),
        &[7.0, -1.0],
    );
}

#[test]
fn conv_pool_values() {
    let x = Tensor::arange(1.0, 10.0, 1.0, DType::F64)
        .unwrap()
        .view(&[1, 1, 3, 3])
        .unwrap();
    let w = Tensor::ones(&[1, 1, 2, 2], DType::F64).unwrap();
    let y = x.conv2d(&w, Some(&t(&[0.5], &[1])), Conv2dParams::new()).unwrap();
    assert_eq!(y.to_vec_f64(), vec![12.5, 16.5, 24.5, 28.5]);
    let p = Conv2dParams {
        padding: (1, 1),
        stride: (2, 2),
        ..Conv2dParams::new()
    };
    assert_eq!(x.conv2d(&w, None, p).unwrap().to_vec_f64(), vec![1.0, 5.0, 11.0, 28.0]);
    assert_eq!(x.max_pool2d(Pool2dParams::square(2)).unwrap().to_vec_f64(), vec![5.0]);
    let pad = Pool2dParams {
        kernel: (2, 2),
        stride: (2, 2),
        padding: (1, 1),
    };
    assert_eq!(x.max_pool2d(pad).unwrap().to_vec_f64(), vec![1.0, 3.0, 7.0, 9.0]);
    assert_eq!(x.avg_pool2d(pad).unwrap().to_vec_f64(), vec![0.25, 1.25, 2.75, 7.0]);
}

#[test]
fn casts_round_trip() {
    let x = t(&[1.5, -2.25, 3.0e5], &[3]);
    for d in [DType::F32, DType::BF16, DType::F16] {
        assert_eq!(
            x.cast(d).unwrap().cast(DType::F64).unwrap().to_vec_f64()[..2],
            [1.5, -2.25],
            "{d:?}"
        );
    }
    assert_eq!(
        x.cast(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![1, -2, 300000]
    );
    let h = x.cast(DType::BF16).unwrap();
    assert_eq!(
        h.exp().unwrap().dtype(),
        DType::BF16,
        "bf16 ops return bf16 (computed in f32)"
    );
}

#[test]
fn rng_is_counter_based() {
    let whole = Tensor::rand(&[100], DType::F64, &mut Generator::new(3))
        .unwrap()
        .to_vec_f64();
    let mut g = Generator::new(3);
    let mut parts = Tensor::rand(&[30], DType::F64, &mut g).unwrap().to_vec_f64();
    parts.extend(Tensor::rand(&[70], DType::F64, &mut g).unwrap().to_vec_f64());
    assert_eq!(whole, parts, "draws continue the same stream whatever the split");
    assert_eq!(g.offset(), 100);
    let other = Tensor::rand(&[100], DType::F64, &mut Generator::new(4))
        .unwrap()
        .to_vec_f64();
    assert_ne!(whole, other);
    let x = Tensor::ones(&[20000], DType::F32).unwrap();
    let d = x.dropout(0.25, true, &mut Generator::new(1)).unwrap().to_vec_f64();
    let zeros = d.iter().filter(|&&v| v == 0.0).count() as f64 / d.len() as f64;
    assert!((zeros - 0.25).abs() < 0.02, "dropped fraction {zeros}");
    assert!(d.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
    assert_eq!(
        x.dropout(0.25, false, &mut Generator::new(1)).unwrap().to_vec_f64(),
        vec![1.0; 20000]
    );
}

#[test]
fn errors_name_the_op_and_shapes() {
    let a = t(&[1.0; 6], &[2, 3]);
    let b = t(&[1.0; 4], &[2, 2]);
    let msg = a.add(&b).unwrap_err().to_string();
    assert!(
        msg.contains("binary") && msg.contains("[2, 3]") && msg.contains("[2, 2]"),
        "{msg}"
    );
    let msg = a.matmul(&b).unwrap_err().to_string();
    assert!(
        msg.contains("matmul") && msg.contains("[2, 3]") && msg.contains("[2, 2]"),
        "{msg}"
    );
    assert!(matches!(
        a.sum(&[2], false),
        Err(Error::DimOutOfRange {
            op: "reduce",
            dim: 2,
            rank: 2
        })
    ));
    let msg = a.embedding(&ids(&[0, 5], &[2])).unwrap_err().to_string();
    assert!(msg.contains("index_select") && msg.contains('5'), "{msg}");
    let msg = a.cross_entropy(&ids(&[3, 0], &[2]), -100, 0.0).unwrap_err().to_string();
    assert!(msg.contains("cross_entropy") && msg.contains("index 3"), "{msg}");
    assert!(matches!(
        a.add(&a.cast(DType::F32).unwrap()),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(a.reshape(&[4, -1]).is_err());
    assert!(a.narrow(1, 2, 2).is_err());
    assert!(a.permute(&[0, 0]).is_err());
    assert!(Tensor::from_vec(vec![1.0f32; 5], &[2, 3]).is_err());
    let x = t(&[0.0; 16], &[1, 1, 4, 4]);
    assert!(x
        .conv2d(
            &t(&[0.0; 18], &[2, 1, 3, 3]),
            None,
            Conv2dParams {
                groups: 2,
                ..Conv2dParams::new()
            }
        )
        .is_err());
    assert!(x.max_pool2d(Pool2dParams::square(5)).is_err());
}

#[test]
fn large_matmuls_match_a_naive_product() {
    // shapes large enough for the multi-threaded split (by rows when m >= n, by columns otherwise),
    // with plain and transposed operands
    for (m, k, n) in [(300, 64, 40), (40, 64, 300), (129, 33, 257)] {
        let a = Tensor::randn(&[m, k], DType::F64, &mut Generator::new(1)).unwrap();
        let b = Tensor::randn(&[k, n], DType::F64, &mut Generator::new(2)).unwrap();
        let naive = a
            .unsqueeze(-1)
            .unwrap()
            .mul(&b.unsqueeze(0).unwrap())
            .unwrap()
            .sum(&[1], false)
            .unwrap()
            .to_vec_f64();
        let bt = b.t().unwrap().contiguous_copy().unwrap().t().unwrap();
        let at = a.t().unwrap().contiguous_copy().unwrap().t().unwrap();
        for (name, x, y) in [("plain", &a, &b), ("b transposed", &a, &bt), ("a transposed", &at, &b)] {
            let got = x.matmul(y).unwrap().to_vec_f64();
            for (i, (g, w)) in got.iter().zip(&naive).enumerate() {
                assert!(
                    (g - w).abs() < 1e-9 * (1.0 + w.abs()),
                    "{m}x{k}x{n} {name}: element {i}: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn layer_norm_with_a_bias_and_no_weight_adds_the_bias() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 4.0, -1.0, 0.5, 3.0], &[2, 3]).unwrap();
    let b = Tensor::from_vec(vec![10.0f32, 20.0, 30.0], &[3]).unwrap();
    let got = x.layer_norm(None, Some(&b), 1e-5).unwrap();
    let want = x.layer_norm(None, None, 1e-5).unwrap().add(&b).unwrap();
    assert_eq!(got.to_vec_f64(), want.to_vec_f64());
}

#[test]
fn attention_over_no_positions_has_empty_gradients() {
    // [B, T, 3C] with T = 0: forward and backward are empty, not a panic
    let qkv = Tensor::zeros(&[2, 0, 12], DType::F32)
        .unwrap()
        .requires_grad_()
        .unwrap();
    let y = qkv.qkv_attention(2, true, None).unwrap();
    assert_eq!(y.shape(), [2, 0, 4]);
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(qkv.grad().unwrap().shape(), [2, 0, 12]);
}

#[test]
fn integer_sources_added_into_f64_stay_exact() {
    // 2^40 + 1 has no f32 form: converting the source through f32 first lost the 1
    let x = Tensor::zeros(&[2], DType::F64).unwrap();
    let src = Tensor::from_vec(vec![(1i64 << 40) + 1, (1 << 30) + 1], &[2]).unwrap();
    let index = Tensor::from_vec(vec![0i64, 1], &[2]).unwrap();
    let want = vec![((1i64 << 40) + 1) as f64, ((1i64 << 30) + 1) as f64];
    assert_eq!(x.index_add(0, &index, &src).unwrap().to_vec_f64(), want);
    assert_eq!(x.scatter_add(0, &index, &src).unwrap().to_vec_f64(), want);
    let src32 = src.cast(DType::I32).unwrap().narrow(0, 1, 1).unwrap();
    let one = Tensor::from_vec(vec![0i64], &[1]).unwrap();
    let got = Tensor::zeros(&[1], DType::F64)
        .unwrap()
        .index_add(0, &one, &src32)
        .unwrap();
    assert_eq!(got.to_vec_f64(), vec![((1i64 << 30) + 1) as f64]);
}

#[test]
fn uniform_draws_stay_below_one_in_every_float_dtype() {
    // about one draw in 512 lies above bf16's largest value below 1 (1 - 2^-8) and rounded up to
    // 1.0 when only f32's cap (1 - 2^-24) applied
    for dtype in [DType::BF16, DType::F16, DType::F32, DType::F64] {
        let x = Tensor::rand(&[20_000], dtype, &mut weft_core::Generator::new(3)).unwrap();
        let max = x.to_vec_f64().into_iter().fold(0.0f64, f64::max);
        assert!(max < 1.0, "{dtype:?}: a draw of {max}");
    }
}
