//! Autograd bookkeeping: accumulation, reuse, no_grad, detach, errors, and the gradient-ready hook.

use std::sync::{Arc, Mutex};

use weft_core::{no_grad, DType, Error, Tensor};

fn t(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn param(v: &[f64], shape: &[usize]) -> Tensor {
    t(v, shape).requires_grad_().unwrap()
}

#[test]
fn gradients_accumulate_across_backward_calls() {
    let x = param(&[1.0, 2.0], &[2]);
    for _ in 0..2 {
        x.mul_scalar(3.0).unwrap().sum_all().unwrap().backward().unwrap();
    }
    assert_eq!(x.grad().unwrap().to_vec_f64(), vec![6.0, 6.0]);
    x.set_grad(None);
    assert!(x.grad().is_none());
}

#[test]
fn reused_tensor_sums_its_gradients() {
    let x = param(&[1.5, -2.0], &[2]);
    let y = x.mul(&x).unwrap().add(&x).unwrap(); // x^2 + x
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec_f64(), vec![4.0, -3.0]);
}

#[test]
fn summing_gradients_in_place_leaves_shared_ones_alone() {
    // h feeds three ops: its gradients from `exp` and `mul` are fresh buffers that the sum may
    // take in place; the one from `add` is the seed itself, shared with the caller, which the
    // sum must not write into
    let x = param(&[0.5, -1.0, 2.0, 0.25], &[4]);
    let h = x.mul_scalar(2.0).unwrap();
    let y = h.exp().unwrap().add(&h.mul(&h).unwrap()).unwrap().add(&h).unwrap();
    let seed = t(&[1.0, 2.0, -1.0, 0.5], &[4]);
    y.backward_with(&seed).unwrap();
    assert_eq!(
        seed.to_vec_f64(),
        vec![1.0, 2.0, -1.0, 0.5],
        "the seed was written into"
    );
    let want: Vec<f64> = [0.5f64, -1.0, 2.0, 0.25]
        .iter()
        .zip([1.0, 2.0, -1.0, 0.5])
        .map(|(&x, s)| {
            let h = 2.0 * x;
            // dy/dh = exp(h) + 2h + 1, dh/dx = 2, in the order autograd adds them
            2.0 * (s * h.exp() + s * h + s * h + s)
        })
        .collect();
    for (got, want) in x.grad().unwrap().to_vec_f64().iter().zip(&want) {
        assert!(
            (got - want).abs() <= 1e-12 * want.abs().max(1.0),
            "{got} against {want}"
        );
    }
    // the same in f32, large enough for the pool, against the unfused sum computed by hand
    let n = 100_000;
    let v: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
    let x = Tensor::from_vec(v.clone(), &[n]).unwrap().requires_grad_().unwrap();
    let h = x.mul_scalar(1.5).unwrap();
    let y = h.tanh().unwrap().add(&h.mul(&h).unwrap()).unwrap().add(&h).unwrap();
    let seed = Tensor::from_vec(vec![1.0f32; n], &[n]).unwrap();
    y.backward_with(&seed).unwrap();
    assert!(
        seed.to_vec::<f32>().unwrap().iter().all(|&s| s == 1.0),
        "the seed was written into"
    );
    let g = x.grad().unwrap().to_vec::<f32>().unwrap();
    for (i, &x) in v.iter().enumerate().step_by(997) {
        let h = 1.5 * x;
        let want = 1.5 * ((1.0 - h.tanh() * h.tanh()) + 2.0 * h + 1.0);
        assert!(
            (g[i] - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{} against {want}",
            g[i]
        );
    }
}

#[test]
fn no_grad_and_detach_stop_recording() {
    let x = param(&[1.0], &[1]);
    let y = no_grad(|| x.mul_scalar(2.0).unwrap());
    assert!(!y.requires_grad());
    assert!(y.backward().is_err());
    let z = x.detach().mul_scalar(2.0).unwrap().add(&x).unwrap();
    z.sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec_f64(), vec![1.0]);
    assert!(weft_core::is_grad_enabled());
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    let x = param(&[1.0, 2.0], &[2]);
    let y = x.mul_scalar(2.0).unwrap();
    assert!(matches!(y.backward(), Err(Error::Autograd(_))), "non-scalar backward");
    assert!(y.set_requires_grad(false).is_err(), "requires_grad on a non-leaf");
    let ids = Tensor::from_vec(vec![1i64], &[1]).unwrap();
    assert!(
        ids.set_requires_grad(true).is_err(),
        "integer tensors cannot require grad"
    );
    let wrong = Tensor::ones(&[3], DType::F64).unwrap();
    assert!(matches!(y.backward_with(&wrong), Err(Error::ShapeMismatch { .. })));
}

#[test]
fn leaf_gradients_own_their_buffers() {
    let a = param(&[1.0, 2.0], &[2]);
    let b = param(&[3.0, 4.0], &[2]);
    a.add(&b).unwrap().sum_all().unwrap().backward().unwrap();
    let (ga, gb) = (a.grad().unwrap(), b.grad().unwrap());
    assert!(!ga.same_storage(&gb));
    ga.copy_from(&t(&[9.0, 9.0], &[2])).unwrap();
    assert_eq!(b.grad().unwrap().to_vec_f64(), vec![1.0, 1.0]);
}

#[test]
fn a_leaf_is_ready_as_soon_as_its_gradient_is_final_whatever_its_age() {
    // w_late is created first but used last: its gradient is final right after the last
    // matmul's backward, long before backward reaches w_early
    let w_late = param(&[1.0, -2.0], &[2, 1]);
    let w_early = param(&[0.5, -1.0, 2.0, 1.0, 0.0, 3.0], &[3, 2]);
    let x = t(&[1.0, 2.0, 3.0], &[1, 3]);
    let seen: Arc<Mutex<Option<bool>>> = Arc::default();
    let (s, e) = (seen.clone(), w_early.clone());
    w_late.register_grad_ready_hook(move |_| *s.lock().unwrap() = Some(e.grad().is_some()));
    let h = x.matmul(&w_early).unwrap().tanh().unwrap();
    h.matmul(&w_late).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        Some(false),
        "w_late's hook ran before w_early's gradient"
    );
    assert!(w_early.grad().is_some());
}

#[test]
fn a_non_leaf_hook_runs_once_its_gradient_is_complete_and_before_its_op_backward() {
    // h feeds two consumers; its hook must wait for both, and run before w gets a gradient
    let w = param(&[0.5, -1.0, 2.0, 1.0, 0.0, 3.0], &[3, 2]);
    let x = t(&[1.0, 2.0, 3.0], &[1, 3]);
    let h = x.matmul(&w).unwrap();
    let calls: Arc<Mutex<Vec<bool>>> = Arc::default();
    let (c, w2) = (calls.clone(), w.clone());
    h.register_grad_ready_hook(move |_| c.lock().unwrap().push(w2.grad().is_some()));
    let a = h.tanh().unwrap().sum_all().unwrap();
    let b = h.mul_scalar(2.0).unwrap().sum_all().unwrap();
    a.add(&b).unwrap().backward().unwrap();
    assert_eq!(*calls.lock().unwrap(), vec![false], "one call, before w's gradient");
    assert!(w.grad().is_some());
}

/// (which leaf, its gradient when the hook ran, whether the other leaf had a gradient then)
type HookRecord = (String, Vec<f64>, bool);

#[test]
fn grad_ready_hooks_fire_in_reverse_order_with_final_gradients() {
    // y = ((x * w1) reused twice) @ ... : w1 is used first in the forward, w2 last.
    let x = t(&[1.0, 2.0, 3.0], &[1, 3]);
    let w1 = param(&[0.5, -1.0, 2.0, 1.0, 0.0, 3.0], &[3, 2]);
    let w2 = param(&[1.0, -2.0], &[2, 1]);
    let log: Arc<Mutex<Vec<HookRecord>>> = Arc::default();
    for (name, w, other) in [("w1", &w1, &w2), ("w2", &w2, &w1)] {
        let log = log.clone();
        let other = other.clone();
        w.register_grad_ready_hook(move |leaf| {
            let g = leaf.grad().expect("gradient is set when the hook fires").to_vec_f64();
            log.lock().unwrap().push((name.to_string(), g, other.grad().is_some()));
        });
    }
    let h = x.matmul(&w1).unwrap();
    let h = h.add(&h.relu().unwrap()).unwrap(); // w1's gradient arrives through two paths
    let y = h.matmul(&w2).unwrap().sum_all().unwrap();
    y.backward().unwrap();
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 2, "each hook fires once per backward");
    assert_eq!(log[0].0, "w2", "the last-used parameter is ready first");
    assert!(!log[0].2, "w2's hook ran while w1's gradient was still pending");
    assert_eq!(log[1].0, "w1");
    // final values: h = x @ w1 = [4.5, 10.0], both positive, so h + relu(h) = [9, 20]
    assert_eq!(log[0].1, vec![9.0, 20.0]);
    assert_eq!(log[1].1, w1.grad().unwrap().to_vec_f64());
    assert_eq!(log[1].1, vec![2.0, -4.0, 4.0, -8.0, 6.0, -12.0]);
}

/// `x * y` with a deliberately different backward (`2 g y` for x), so the test sees that
/// backward is the function's own and not derived from its forward's ops.
struct ScaledProduct;

impl weft_core::Function for ScaledProduct {
    fn name(&self) -> &'static str {
        "scaled_product"
    }
    fn forward(&self, inputs: &[&Tensor]) -> weft_core::Result<Tensor> {
        assert!(!weft_core::is_grad_enabled(), "forward runs without recording");
        inputs[0].mul(inputs[1])
    }
    fn backward(&self, inputs: &[Tensor], _output: &Tensor, grad: &Tensor) -> weft_core::Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(grad.mul(&inputs[1])?.mul_scalar(2.0)?), None])
    }
}

#[test]
fn a_function_is_one_node_whose_backward_is_its_own() {
    let x = param(&[1.0, 2.0, 3.0], &[3]);
    let y = param(&[4.0, 5.0, 6.0], &[3]);
    let f: Arc<dyn weft_core::Function> = Arc::new(ScaledProduct);
    let out = Tensor::apply_function(f.clone(), &[&x, &y]).unwrap();
    assert_eq!(out.to_vec_f64(), vec![4.0, 10.0, 18.0]);
    assert_eq!(out.op().map(|o| o.name()), Some("scaled_product"));
    out.sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec_f64(), vec![8.0, 10.0, 12.0]);
    assert!(y.grad().is_none(), "the function gave y no gradient");
    // without an input that requires grad, nothing is recorded
    let plain = Tensor::apply_function(f, &[&x.detach(), &y.detach()]).unwrap();
    assert!(plain.op().is_none());
}

#[test]
fn graph_bytes_counts_each_activation_buffer_once_and_skips_what_it_is_told() {
    let w = param(&[1.0; 12], &[3, 4]);
    let x = t(&[1.0; 6], &[2, 3]);
    let h = x.matmul(&w).unwrap(); // [2, 4] f64
    let y = h.tanh().unwrap().add(&h).unwrap(); // the sum: 1 more [2, 4]
    let is_w = |t: &Tensor| t.same_storage(&w);
    // x (6), h (8), y (8) f64 values; w skipped; the tanh's output is not held: the sum's
    // backward reads neither input, and tanh's reads its input (h)
    assert_eq!(y.graph_bytes(&is_w), (6 + 8 + 8) * 8);
    assert_eq!(y.graph_bytes(&|_| false), (6 + 8 + 8 + 12) * 8);
}

#[test]
fn a_node_keeps_only_what_its_backward_reads() {
    // a 4 MiB intermediate that only sums read: the graph behind the loss must not hold it, and
    // the gradient must stay right
    let w = param(&[0.5; 4], &[2, 2]);
    let x = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let big = x
        .matmul(&w)
        .unwrap()
        .expand(&[64, 1024, 2, 2])
        .unwrap()
        .contiguous()
        .unwrap();
    let s = big.add(&big).unwrap().sum_all().unwrap();
    drop(big);
    // x (4 f64, read by the product's backward), the loss itself (1), w (4)
    assert_eq!(s.graph_bytes(&|_| false), (4 + 1 + 4) * 8);
    s.backward().unwrap();
    // d/dw of sum(2 * expand(x @ w)) = 2 * 65536 * x^T 1
    let n = 2.0 * 65536.0;
    assert_eq!(w.grad().unwrap().to_vec_f64(), vec![n * 4.0, n * 4.0, n * 6.0, n * 6.0]);
    // an op whose backward reads its output (softmax) keeps it, though its reader (a sum) would not
    let z = x.matmul(&w).unwrap().softmax(-1).unwrap();
    let z_bytes = 4 * 8;
    let loss = z.sum_all().unwrap();
    drop(z);
    // x, the softmax's output, the loss, w (the product's output: softmax reads only its output)
    assert_eq!(loss.graph_bytes(&|_| false), 4 * 8 + z_bytes + 8 + 4 * 8);
}

/// Declares that its backward reads nothing, then reads its input: a wrong declaration.
struct ReadsWhatItDenies;

impl weft_core::Function for ReadsWhatItDenies {
    fn name(&self) -> &'static str {
        "reads_what_it_denies"
    }
    fn forward(&self, inputs: &[&Tensor]) -> weft_core::Result<Tensor> {
        inputs[0].mul_scalar(2.0)
    }
    fn backward(&self, inputs: &[Tensor], _output: &Tensor, grad: &Tensor) -> weft_core::Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(grad.mul(&inputs[0])?)])
    }
    fn backward_reads(&self) -> weft_core::BackwardReads {
        weft_core::BackwardReads::NOTHING
    }
}

#[test]
fn a_formula_reading_what_autograd_did_not_keep_is_an_error_not_a_panic() {
    let w = param(&[1.0, 2.0], &[2]);
    let h = w.mul_scalar(3.0).unwrap(); // a non-leaf: the function's node keeps only its handle
    let out = Tensor::apply_function(Arc::new(ReadsWhatItDenies), &[&h]).unwrap();
    drop(h);
    let err = out.sum_all().unwrap().backward().unwrap_err().to_string();
    assert!(err.contains("autograd did not keep"), "{err}");
}

#[test]
fn a_hook_gets_the_tensor_itself_when_any_node_kept_it() {
    // h is read by a product's backward (kept) and by a sum's (not kept): whichever the walk
    // meets first, the hook is handed h with its elements
    for product_first in [true, false] {
        let w = param(&[1.0, 2.0], &[2]);
        let h = w.mul_scalar(3.0).unwrap();
        let seen: Arc<Mutex<Vec<Vec<f64>>>> = Arc::default();
        let s = seen.clone();
        h.register_grad_ready_hook(move |t| s.lock().unwrap().push(t.to_vec_f64()));
        let product = h.mul(&w).unwrap();
        let sum = h.add(&w).unwrap();
        let (a, b) = if product_first { (product, sum) } else { (sum, product) };
        a.add(&b).unwrap().sum_all().unwrap().backward().unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            vec![vec![3.0, 6.0]],
            "product first: {product_first}"
        );
    }
}

/// A graph of 300,000 ops is freed without running out of stack (dropping it recursed once per
/// op, and a 12,000-layer model's step overflowed the main thread's stack).
#[test]
fn a_very_deep_graph_is_dropped_without_recursion() {
    let x = param(&[1.0], &[1]);
    // on a thread of a small stack of its own, so the test does not depend on the harness's
    std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            let mut y = x.clone();
            for _ in 0..300_000 {
                y = y.mul_scalar(1.0).unwrap();
            }
            drop(y);
        })
        .unwrap()
        .join()
        .expect("the graph was dropped on a 256 KiB stack");
}
