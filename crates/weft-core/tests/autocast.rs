//! Autocast (`weft_core::autocast`): which ops run in bf16, which in f32, what crosses between
//! them, and that gradients come back to f32 parameters in f32.

use weft_core::{autocast, autocast_dtype, DType, Error, Generator, Tensor};

fn randn(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape, DType::F32, &mut Generator::new(seed)).unwrap()
}

fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_vec_f64(), b.to_vec_f64());
    let scale = b.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / scale
}

#[test]
fn products_run_in_bf16_and_gradients_reach_f32_parameters_in_f32() {
    let x = randn(&[4, 8], 1);
    let w = randn(&[16, 8], 2).requires_grad_().unwrap();
    let b = randn(&[16], 3).requires_grad_().unwrap();
    let y = autocast(Some(DType::BF16), || x.linear(&w, Some(&b))).unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    // exactly the product of the bf16-rounded inputs
    let want = x
        .cast(DType::BF16)
        .unwrap()
        .linear(
            &w.detach().cast(DType::BF16).unwrap(),
            Some(&b.detach().cast(DType::BF16).unwrap()),
        )
        .unwrap();
    assert_eq!(y.to_vec_f64(), want.to_vec_f64());
    y.cast(DType::F32).unwrap().sum_all().unwrap().backward().unwrap();
    let gw = w.grad().unwrap();
    assert_eq!(gw.dtype(), DType::F32);
    // d/dw sum(x w^T + b) = column sums of x, here of x rounded to bf16
    let want_gw = Tensor::ones(&[4, 16], DType::F32)
        .unwrap()
        .t()
        .unwrap()
        .matmul(&x)
        .unwrap();
    assert!(max_rel(&gw, &want_gw) < 1e-2, "{}", max_rel(&gw, &want_gw));
    // ...made in f32 from the bf16 operands, not rounded to bf16 on its way to the f32
    // parameter: the sums of four bf16 values, exact in f32, are the f32 product's bits
    let x_low = x.cast(DType::BF16).unwrap().cast(DType::F32).unwrap();
    let exact = Tensor::ones(&[4, 16], DType::F32)
        .unwrap()
        .t()
        .unwrap()
        .matmul(&x_low)
        .unwrap();
    assert_eq!(
        gw.to_vec_f64(),
        exact.to_vec_f64(),
        "the weight's gradient was rounded to bf16"
    );
    assert_eq!(b.grad().unwrap().to_vec_f64(), vec![4.0; 16]);
    // matmul and attention too
    let m = autocast(Some(DType::BF16), || x.matmul(&x.t().unwrap())).unwrap();
    assert_eq!(m.dtype(), DType::BF16);
    let qkv = randn(&[2, 5, 12], 4);
    let a = autocast(Some(DType::BF16), || qkv.qkv_attention(2, true, None)).unwrap();
    assert_eq!(a.dtype(), DType::BF16);
}

#[test]
fn the_residual_stream_norms_and_losses_stay_f32() {
    let h = randn(&[4, 8], 5);
    let w = randn(&[8, 8], 6);
    let b = randn(&[8], 7);
    let r = randn(&[4, 8], 8);
    autocast(Some(DType::BF16), || {
        let y = h.linear_add(&w, Some(&b), &r).unwrap();
        assert_eq!(y.dtype(), DType::F32, "x + linear(h) is f32");
        let unfused = r
            .add(
                &h.cast(DType::BF16)
                    .unwrap()
                    .linear(&w.cast(DType::BF16).unwrap(), Some(&b.cast(DType::BF16).unwrap()))
                    .unwrap()
                    .cast(DType::F32)
                    .unwrap(),
            )
            .unwrap();
        assert_eq!(y.to_vec_f64(), unfused.to_vec_f64());
        let low = h.cast(DType::BF16).unwrap();
        assert_eq!(low.softmax(-1).unwrap().dtype(), DType::F32);
        assert_eq!(low.log_softmax(0).unwrap().dtype(), DType::F32);
        assert_eq!(low.layer_norm(None, None, 1e-5).unwrap().dtype(), DType::F32);
        let targets = Tensor::from_vec(vec![0i64, 3, 7, 1], &[4]).unwrap();
        let loss = low.cross_entropy(&targets, -100, 0.0).unwrap();
        assert_eq!(loss.dtype(), DType::F32);
        // an f32 op on f32 inputs is left alone
        assert_eq!(h.add(&r).unwrap().dtype(), DType::F32);
    });
}

#[test]
fn outside_the_scope_nothing_changes() {
    let x = randn(&[3, 4], 9);
    let w = randn(&[2, 4], 10);
    assert_eq!(autocast_dtype(), None);
    autocast(Some(DType::BF16), || {
        assert_eq!(autocast_dtype(), Some(DType::BF16));
        autocast(None, || assert_eq!(autocast_dtype(), None));
        assert_eq!(autocast_dtype(), Some(DType::BF16));
    });
    assert_eq!(autocast_dtype(), None);
    assert_eq!(x.linear(&w, None).unwrap().dtype(), DType::F32);
    assert!(matches!(
        x.add(&x.cast(DType::BF16).unwrap()),
        Err(Error::DTypeMismatch { .. })
    ));
    // restored when the closure panics, too
    let caught = std::panic::catch_unwind(|| autocast(Some(DType::BF16), || panic!("inside")));
    assert!(caught.is_err());
    assert_eq!(autocast_dtype(), None);
}

#[test]
fn a_parameter_is_cast_once_per_region_and_its_gradient_sums_every_use() {
    let w = randn(&[16, 8], 2).requires_grad_().unwrap();
    let (x1, x2) = (randn(&[4, 8], 1), randn(&[4, 8], 3));
    // two micro-batches in one region (as a pipeline runs them): one bf16 copy of w
    let loss = |x: &Tensor| x.linear(&w, None).unwrap().cast(DType::F32).unwrap().sum_all().unwrap();
    let (l1, l2) = autocast(Some(DType::BF16), || (loss(&x1), loss(&x2)));
    let skip_w = |t: &Tensor| t.same_storage(&w);
    let copy_bytes = 16 * 8 * 2;
    let (b1, b2) = (l1.graph_bytes(&skip_w), l2.graph_bytes(&skip_w));
    let both = l1.add(&l2).unwrap().graph_bytes(&skip_w);
    // the copy counted once; the two losses (4 bytes each, which the sum's backward does not
    // read) give way to the sum (4 bytes)
    assert_eq!(both + copy_bytes + 4, b1 + b2, "one copy of w for both");
    // each backward brings its own use's gradient, added in w
    l1.backward().unwrap();
    l2.backward().unwrap();
    let got = w.grad().unwrap();
    // the same as two regions, each with its own copy
    let w2 = w.detach().requires_grad_().unwrap();
    for x in [&x1, &x2] {
        let l = autocast(Some(DType::BF16), || {
            x.linear(&w2, None).unwrap().cast(DType::F32).unwrap().sum_all()
        })
        .unwrap();
        l.backward().unwrap();
    }
    assert_eq!(got.to_vec_f64(), w2.grad().unwrap().to_vec_f64());
    // regions do not share: a new region (after an update in place, say) casts again
    let c1 = autocast(Some(DType::BF16), || x1.linear(&w, None).unwrap());
    let c2 = autocast(Some(DType::BF16), || x1.linear(&w, None).unwrap());
    assert_eq!(c1.to_vec_f64(), c2.to_vec_f64());
    w.with_data_mut::<f32, _>(|d| d[0] += 1.0).unwrap();
    let c3 = autocast(Some(DType::BF16), || x1.linear(&w, None).unwrap());
    assert_ne!(c1.to_vec_f64(), c3.to_vec_f64());
}

#[test]
fn a_cast_made_without_gradients_is_not_reused_with_them() {
    let w = randn(&[16, 8], 2).requires_grad_().unwrap();
    let x = randn(&[4, 8], 1);
    let l = autocast(Some(DType::BF16), || {
        // a recomputation's first forward runs without gradients
        let _ = weft_core::no_grad(|| x.linear(&w, None).unwrap());
        x.linear(&w, None).unwrap().cast(DType::F32).unwrap().sum_all().unwrap()
    });
    l.backward().unwrap();
    assert!(
        w.grad().is_some(),
        "the gradient reaches w through a cast recorded by autograd"
    );
}

#[test]
fn with_the_cache_off_every_use_casts_again() {
    let w = randn(&[16, 8], 2).requires_grad_().unwrap();
    let x = randn(&[4, 8], 1);
    let skip_w = |t: &Tensor| t.same_storage(&w);
    let l = || x.linear(&w, None).unwrap().cast(DType::F32).unwrap().sum_all().unwrap();
    let (l1, l2, l3) = weft_core::autocast_with_cache(Some(DType::BF16), false, || {
        // a nested region does not turn the cache on again
        let (l2, l3) = autocast(Some(DType::BF16), || (l(), l()));
        (l(), l2, l3)
    });
    assert!(weft_core::autocast_cached_casts().is_empty());
    // three copies of w (16 x 8 bf16 each): what the three graphs hold apart
    let all = l1.add(&l2).unwrap().add(&l3).unwrap().graph_bytes(&skip_w);
    let apart: usize = [&l1, &l2, &l3].iter().map(|l| l.graph_bytes(&skip_w)).sum();
    // the three losses (4 bytes each, read by no backward) give way to the sum (4 bytes)
    assert_eq!(all + 8, apart);
}

#[test]
fn only_tensors_made_before_the_region_are_kept() {
    let w = randn(&[16, 8], 2).requires_grad_().unwrap();
    let x = randn(&[4, 8], 1);
    autocast(Some(DType::BF16), || {
        // a pipeline stage's received activations: a leaf that requires grad, made in the region
        let received = randn(&[4, 8], 3).requires_grad_().unwrap();
        let _ = x.linear(&w, None).unwrap();
        let _ = received.linear(&w, None).unwrap();
        let kept = weft_core::autocast_cached_casts();
        assert_eq!(kept.len(), 1, "w's cast only");
        assert_eq!(kept[0].shape(), &[16, 8]);
    });
    assert!(weft_core::autocast_cached_casts().is_empty(), "gone with the region");
}
