//! Helpers shared by the integration tests: seeded inputs and the finite-difference gradient check.
#![allow(dead_code)]

use weft_core::{DType, Generator, Result, Tensor};

/// A seeded f64 tensor with values in `[lo, hi)`.
pub fn uniform(shape: &[usize], lo: f64, hi: f64, seed: u64) -> Tensor {
    let mut g = Generator::new(seed);
    Tensor::rand(shape, DType::F64, &mut g)
        .unwrap()
        .affine(hi - lo, lo)
        .unwrap()
}

/// A seeded standard-normal f64 tensor.
pub fn normal(shape: &[usize], seed: u64) -> Tensor {
    let mut g = Generator::new(seed);
    Tensor::randn(shape, DType::F64, &mut g).unwrap()
}

/// A fresh leaf holding `t`'s values (contiguous, requires grad).
pub fn leaf(t: &Tensor) -> Tensor {
    t.contiguous_copy().unwrap().requires_grad_().unwrap()
}

/// `out`'s values and the gradient of `sum(out * w)` for each of `leaves` (empty where none
/// reaches it), `w` drawn from `seed` in `out`'s dtype; all as f64.
pub fn values_and_grads(out: &Tensor, leaves: &[Tensor], seed: u64) -> (Vec<f64>, Vec<Vec<f64>>) {
    let w = normal(out.shape(), seed).cast(out.dtype()).unwrap();
    out.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    let grads = leaves
        .iter()
        .map(|l| l.grad().map(|g| g.to_vec_f64()).unwrap_or_default())
        .collect();
    (out.to_vec_f64(), grads)
}

/// Checks the gradient of `f` with respect to every input against central finite differences in
/// f64. The scalar differentiated is `sum(f(inputs) * w)` with a fixed random `w`, so that errors
/// in individual output positions cannot cancel.
pub fn gradcheck(name: &str, inputs: &[Tensor], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    gradcheck_tol(name, inputs, 1e-6, 1e-5, f)
}

pub fn gradcheck_tol(name: &str, inputs: &[Tensor], eps: f64, tol: f64, f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let leaves: Vec<Tensor> = inputs.iter().map(leaf).collect();
    let out = f(&leaves).unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
    let w = normal(out.shape(), 12345);
    let loss = out.mul(&w).unwrap().sum_all().unwrap();
    loss.backward()
        .unwrap_or_else(|e| panic!("{name}: backward failed: {e}"));
    let scalar = |xs: &[Tensor]| -> f64 { f(xs).unwrap().mul(&w).unwrap().sum_all().unwrap().item().unwrap() };
    for (i, x) in inputs.iter().enumerate() {
        let analytic = leaves[i]
            .grad()
            .map(|g| g.to_vec_f64())
            .unwrap_or_else(|| vec![0.0; x.numel()]);
        let base = x.to_vec_f64();
        for j in 0..base.len() {
            let mut plus = base.clone();
            plus[j] += eps;
            let mut minus = base.clone();
            minus[j] -= eps;
            let mut xp: Vec<Tensor> = inputs.to_vec();
            xp[i] = Tensor::from_vec(plus, x.shape()).unwrap();
            let mut xm: Vec<Tensor> = inputs.to_vec();
            xm[i] = Tensor::from_vec(minus, x.shape()).unwrap();
            let numeric = (scalar(&xp) - scalar(&xm)) / (2.0 * eps);
            let a = analytic[j];
            assert!(
                (a - numeric).abs() <= tol * (1.0 + numeric.abs()),
                "{name}: input {i} element {j}: analytic {a} vs numeric {numeric}"
            );
        }
    }
}

/// Asserts two float slices agree within `atol + rtol * |b|`.
pub fn assert_close(name: &str, a: &[f64], b: &[f64], atol: f64, rtol: f64) {
    assert_eq!(a.len(), b.len(), "{name}: lengths differ");
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= atol + rtol * y.abs() || (x.is_nan() && y.is_nan()),
            "{name}: element {i}: {x} vs {y}"
        );
    }
}
