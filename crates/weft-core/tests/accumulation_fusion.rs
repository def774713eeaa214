//! Gradient accumulation fusion: a weight's gradient product added in place into the gradient
//! its parameter holds from earlier micro-batches. Each case runs the same micro-batches with
//! fusion on and off and compares the accumulated gradients (bit for bit: the product is made
//! as the unfused formula makes it, and added as the unfused sum adds it), and checks whether
//! the gradient buffer was reused (fused) or replaced (not).

use std::sync::{Arc, Mutex, MutexGuard};

use weft_core::{autocast, set_accumulation_fusion, DType, Generator, Tensor, UnaryOp};

/// Fusion is a process-wide switch: the cases here take turns.
static SWITCH: Mutex<()> = Mutex::new(());

fn turns() -> MutexGuard<'static, ()> {
    SWITCH.lock().unwrap_or_else(|e| e.into_inner())
}

fn randn(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    Tensor::randn(shape, dtype, &mut Generator::new(seed)).unwrap()
}

fn param(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    randn(shape, dtype, seed).requires_grad_().unwrap()
}

/// A two-layer model touching both fused forms: `Linear` with a bias and an activation (its
/// weight is the op's input), and a plain product with a transposed weight (a `Matmul` whose
/// input is the weight's transpose).
struct Model {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
}

impl Model {
    fn new(dtype: DType) -> Model {
        Model {
            w1: param(&[24, 16], dtype, 1),
            b1: param(&[24], dtype, 2),
            w2: param(&[40, 24], dtype, 3),
        }
    }

    fn params(&self) -> [&Tensor; 3] {
        [&self.w1, &self.b1, &self.w2]
    }

    /// The loss of micro-batch `j` (rows `[8, 160, 16]`: the products flatten batch dims, and the
    /// weight gradients sum over 1280 rows, more than one block of the kernels' inner dimension).
    fn loss(&self, j: u64) -> Tensor {
        let x = randn(&[8, 160, 16], self.w1.dtype(), 100 + j);
        let h = x.linear_act(&self.w1, Some(&self.b1), UnaryOp::Gelu).unwrap();
        let y = h.matmul(&self.w2.t().unwrap()).unwrap();
        y.mul(&y).unwrap().mean_all().unwrap()
    }
}

/// Runs `f` with fusion `on`, and turns it back on after.
fn with_fusion<R>(on: bool, f: impl FnOnce() -> R) -> R {
    set_accumulation_fusion(on);
    let out = f();
    set_accumulation_fusion(true);
    out
}

/// Two micro-batches of `loss(j)` into `w`'s gradient with fusion `on`: the gradient, and
/// whether its buffer stayed the one the first micro-batch made.
fn two_micro_batches(w: &Tensor, on: bool, loss: &dyn Fn(u64) -> Tensor) -> (Vec<f64>, bool) {
    with_fusion(on, || {
        w.set_grad(None);
        loss(0).backward().unwrap();
        let first = storage_of(w);
        loss(1).backward().unwrap();
        (w.grad().unwrap().to_vec_f64(), storage_of(w) == first)
    })
}

fn storage_of(t: &Tensor) -> usize {
    Arc::as_ptr(t.grad().expect("a gradient").storage()) as usize
}

/// Runs `micro` micro-batches of the model's loss with fusion `on`, all in one autocast region
/// of `low` (as the trainer runs a step's: each weight cast once); returns each parameter's
/// gradient and whether each gradient buffer stayed the one the first micro-batch made.
fn accumulate(model: &Model, micro: u64, on: bool, low: Option<DType>) -> Vec<(Vec<f64>, bool)> {
    with_fusion(on, || {
        model.params().iter().for_each(|p| p.set_grad(None));
        let first = autocast(low, || {
            model.loss(0).backward().unwrap();
            let first: Vec<usize> = model.params().iter().map(|p| storage_of(p)).collect();
            for j in 1..micro {
                model.loss(j).backward().unwrap();
            }
            first
        });
        model
            .params()
            .iter()
            .zip(first)
            .map(|(p, s)| (p.grad().unwrap().to_vec_f64(), storage_of(p) == s))
            .collect()
    })
}

fn f32_run(m: &Model, j: u64) {
    m.loss(j).backward().unwrap();
}

#[test]
fn weight_gradients_add_in_place_and_equal_the_unfused_sums() {
    let _turn = turns();
    for dtype in [DType::F32, DType::F64] {
        let model = Model::new(dtype);
        let fused = accumulate(&model, 3, true, None);
        let plain = accumulate(&model, 3, false, None);
        for (name, (f, p)) in ["w1", "b1", "w2"].iter().zip(fused.iter().zip(&plain)) {
            assert_eq!(f.0, p.0, "{dtype:?} {name}: fused and unfused sums differ");
            assert!(
                !p.1,
                "{dtype:?} {name}: without fusion each micro-batch makes a new sum"
            );
        }
        // both weights are added to in place; the bias (a column sum, not a product) is not
        assert!(
            fused[0].1,
            "{dtype:?}: the linear weight's gradient was not added in place"
        );
        assert!(
            fused[2].1,
            "{dtype:?}: the transposed weight's gradient was not added in place"
        );
        assert!(!fused[1].1, "{dtype:?}: the bias has no product to fuse");
    }
}

#[test]
fn autocast_copies_of_the_weights_add_into_their_f32_gradients() {
    let _turn = turns();
    let model = Model::new(DType::F32);
    let run_all = |on: bool| accumulate(&model, 3, on, Some(DType::BF16));
    let fused = run_all(true);
    let plain = run_all(false);
    assert!(
        fused[0].1 && fused[2].1,
        "the weights' f32 gradients were not added to in place"
    );
    assert!(!plain[0].1 && !plain[2].1);
    // either way the weights' gradients are made in f32 from the bf16 operands (not rounded
    // to bf16) and added to the f32 sums: the same bits
    for (name, (f, p)) in ["w1", "b1", "w2"].iter().zip(fused.iter().zip(&plain)) {
        assert_eq!(f.0, p.0, "{name}: fused and unfused sums differ");
    }
}

#[test]
fn a_gradient_someone_holds_is_not_changed_under_them() {
    let _turn = turns();
    let model = Model::new(DType::F32);
    model.params().iter().for_each(|p| p.set_grad(None));
    f32_run(&model, 0);
    let held = model.w1.grad().unwrap();
    let before = held.to_vec_f64();
    f32_run(&model, 1);
    assert_eq!(held.to_vec_f64(), before, "a held gradient was written to");
    // the sum is still right: it is the same as with fusion off
    let now = model.w1.grad().unwrap().to_vec_f64();
    drop(held);
    let plain = accumulate(&model, 2, false, None);
    assert_eq!(now, plain[0].0);
    // a view of the storage counts as holding it too
    model.params().iter().for_each(|p| p.set_grad(None));
    f32_run(&model, 0);
    let view = model.w2.grad().unwrap().reshape(&[-1]).unwrap();
    let grad = model.w2.grad().unwrap();
    drop(grad);
    let before = view.to_vec_f64();
    f32_run(&model, 1);
    assert_eq!(view.to_vec_f64(), before, "a view of a gradient was written to");
}

#[test]
fn a_weight_used_twice_in_a_pass_is_summed_as_before() {
    let _turn = turns();
    // tied weights: the same parameter reaches the loss through two products, so neither is
    // its only gradient and neither is added in place
    let w = param(&[6, 6], DType::F32, 7);
    let loss = |j: u64| {
        let x = randn(&[3, 6], DType::F32, 50 + j);
        let y = x.matmul(&w).unwrap().matmul(&w.t().unwrap()).unwrap();
        y.mul(&y).unwrap().sum_all().unwrap()
    };
    let run = |on: bool| two_micro_batches(&w, on, &loss);
    let (plain0, _) = run(false);
    let (fused, kept) = run(true);
    let (plain, _) = run(false);
    assert_eq!(plain0, plain, "unfused twice");
    assert!(
        !kept,
        "a parameter with two gradients in the pass was added to in place"
    );
    assert_eq!(fused, plain);
}

#[test]
fn the_first_micro_batch_and_a_lone_step_are_unchanged() {
    let _turn = turns();
    // without an earlier gradient there is nothing to add to: one backward gives the same bits
    let model = Model::new(DType::F32);
    let fused = accumulate(&model, 1, true, None);
    let plain = accumulate(&model, 1, false, None);
    for (f, p) in fused.iter().zip(&plain) {
        assert_eq!(f.0, p.0);
    }
}

#[test]
fn a_cast_that_rounds_the_gradient_is_not_skipped() {
    let _turn = turns();
    // a bf16 round trip between the weight and the product: its backward rounds the gradient
    // to bf16, which a sink must not skip (only autocast's one cast from f32 is routed)
    let w = param(&[8, 16], DType::F32, 11);
    let loss = |j: u64| {
        let x = randn(&[64, 16], DType::F32, 200 + j);
        let wq = w.cast(DType::BF16).unwrap().cast(DType::F32).unwrap();
        let y = x.matmul(&wq.t().unwrap()).unwrap();
        y.mul(&y).unwrap().mean_all().unwrap()
    };
    let run = |on: bool| two_micro_batches(&w, on, &loss).0;
    let plain = run(false);
    let fused = run(true);
    assert_eq!(plain, fused, "fused and unfused sums differ");
}
