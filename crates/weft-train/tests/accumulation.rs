//! Gradient accumulation through the `Trainer` API: which batches `fit` reads, the update of `K`
//! micro-batches against one made by hand from the same gradients, and `data_wait_ms`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{adam_trainer, batches, mlp, trainer};
use weft_nn::module::Module;
use weft_nn::optim::{Adam, AdamConfig};
use weft_nn::schedule::Schedule;
use weft_train::trainer::BatchFn;
use weft_train::{Callback, StepRecord, Trainer};

mod common;

/// Keeps every step record.
struct Keep(Arc<Mutex<Vec<StepRecord>>>);

impl Callback for Keep {
    fn on_step(&mut self, r: &StepRecord) -> weft_train::Result<()> {
        self.0.lock().unwrap().push(r.clone());
        Ok(())
    }
}

#[test]
fn fit_reads_batches_i_k_to_i_k_plus_k_for_step_i() {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = asked.clone();
    let inner = batches(1.0);
    let recording: BatchFn = Arc::new(move |i| {
        seen.lock().unwrap().push(i);
        inner(i)
    });
    let mut t = trainer().with_grad_accum(3);
    let s = t.fit(recording, 2, 5).unwrap();
    assert_eq!((s.steps, s.steps_run), (5, 3));
    let mut got = asked.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, (6..15).collect::<Vec<_>>(), "steps 2..5 read batches 6..15");
    assert_eq!(s.last.unwrap().micro_batches, 3);
}

#[test]
fn an_accumulated_step_is_the_mean_of_its_micro_batches() {
    let k = 4;
    let data = batches(1.0);
    let micro: Vec<_> = (0..k).map(|i| data(i).unwrap()).collect();
    // the step through the trainer
    let mut t = trainer();
    let before: Vec<Vec<f32>> = t
        .model
        .parameters()
        .iter()
        .map(|(_, p)| p.to_vec::<f32>().unwrap())
        .collect();
    let rec = t.train_accumulated(0, &micro).unwrap();
    // by hand: mean loss, summed gradients of loss / K, one SGD update at lr 0.1
    let reference = trainer();
    let mut losses = 0.0;
    for (x, y) in &micro {
        let loss = reference.model.loss(x, y).unwrap();
        losses += loss.item().unwrap();
        loss.mul_scalar(1.0 / k as f64).unwrap().backward().unwrap();
    }
    assert!(
        (rec.loss - losses / k as f64).abs() <= 1e-6 * rec.loss.abs(),
        "{} vs {}",
        rec.loss,
        losses / k as f64
    );
    let mut norm2 = 0.0f64;
    for ((name, p), start) in reference.model.parameters().iter().zip(&before) {
        let g = p.grad().unwrap().to_vec::<f32>().unwrap();
        norm2 += g.iter().map(|v| (*v as f64).powi(2)).sum::<f64>();
        let updated = t
            .model
            .parameters()
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
            .to_vec::<f32>()
            .unwrap();
        for ((u, s), g) in updated.iter().zip(start).zip(&g) {
            let want = s - 0.1 * g;
            assert!((u - want).abs() <= 1e-6, "{name}: {u} vs {want}");
        }
    }
    assert!((rec.grad_norm - norm2.sqrt()).abs() <= 1e-5 * norm2.sqrt());
    // samples per second count every micro-batch's 8 rows
    let items = rec.items_per_s * rec.step_ms / 1e3;
    assert!((items - 32.0).abs() < 1e-6, "{items} samples in the step");
}

#[test]
fn data_wait_ms_sums_the_wait_for_every_micro_batch() {
    let inner = batches(1.0);
    let slow: BatchFn = Arc::new(move |i| {
        std::thread::sleep(Duration::from_millis(30));
        inner(i)
    });
    let records = Arc::new(Mutex::new(Vec::new()));
    let mut t = trainer().with_grad_accum(2).with_callback(Keep(records.clone()));
    t.fit(slow, 0, 4).unwrap();
    let records = records.lock().unwrap();
    assert_eq!(records.len(), 4);
    for r in records.iter() {
        // the step itself takes well under a millisecond: it waits for two 30 ms batches
        assert!(
            r.data_wait_ms >= 40.0,
            "step {}: waited {} ms for two batches that take 30 ms each",
            r.step,
            r.data_wait_ms
        );
        assert!(r.step_ms < r.data_wait_ms, "step_ms {} counts no wait", r.step_ms);
    }
}

/// A compiled step of two micro-batches whose first alone has a loss that is not finite (every
/// target ignored: the loss is 0/0, its gradients zero) is skipped as eagerly: the whole-step
/// graph of the last micro-batch, whose own loss is finite, reads the earlier losses' sum. The
/// same losses, norms and skips step by step, and the same parameters after.
#[test]
fn a_compiled_step_whose_earlier_micro_batch_is_not_finite_is_skipped_as_eagerly() {
    let data = batches(1.0);
    let run = |compile: bool| {
        let model = mlp();
        let mut t = adam_trainer(model.clone())
            .with_grad_clip(Some(0.5))
            .with_grad_accum(2)
            .with_skip_nonfinite(true)
            .with_compile(compile);
        let mut rows = Vec::new();
        for step in 0..6 {
            let mut micro: Vec<_> = (0..2).map(|j| data(2 * step + j).unwrap()).collect();
            if step == 3 {
                let y = &micro[0].1;
                micro[0].1 = weft_core::Tensor::full(y.shape(), -100.0, y.dtype()).unwrap();
            }
            let r = t.train_accumulated(step, &micro).unwrap();
            rows.push((r.loss.to_bits(), r.grad_norm.to_bits(), r.skipped, r.skipped_steps));
        }
        let params: Vec<Vec<f64>> = model.parameters().iter().map(|(_, p)| p.to_vec_f64()).collect();
        assert_eq!(t.whole_step_captured(), compile, "the whole step was captured");
        (rows, params)
    };
    let (eager, compiled) = (run(false), run(true));
    assert!(eager.0[3].2 && !eager.0[2].2 && !eager.0[4].2, "{:?}", eager.0);
    assert!(f64::from_bits(eager.0[3].1).is_finite(), "only the loss is not finite");
    assert_eq!(eager, compiled);
}

/// A linear classifier of f64 parameters: its loss is f64, so eager mode seeds each micro-batch's
/// backward with the scale in f64.
struct F64Linear {
    w: weft_core::Tensor,
    ctx: weft_nn::context::Context,
}

impl Module for F64Linear {
    fn parameters(&self) -> Vec<(String, weft_core::Tensor)> {
        vec![("w".into(), self.w.clone())]
    }
}

impl weft_models::Model for F64Linear {
    fn loss(&self, x: &weft_core::Tensor, y: &weft_core::Tensor) -> weft_core::Result<weft_core::Tensor> {
        self.logits(x)?.cross_entropy(y, -100, 0.0)
    }

    fn logits(&self, x: &weft_core::Tensor) -> weft_core::Result<weft_core::Tensor> {
        x.cast(weft_core::DType::F64)?.matmul(&self.w)
    }

    fn context(&self) -> &weft_nn::context::Context {
        &self.ctx
    }
}

/// With three micro-batches (a scale of 1/3, not exact in f32) an f64 model's compiled steps
/// log the eager losses and leave its parameters as eager steps do, bit for bit.
#[test]
fn a_compiled_f64_model_accumulates_as_eagerly() {
    let data = batches(1.0);
    let run = |compile: bool| {
        let mut g = weft_core::Generator::new(5);
        let w = weft_core::Tensor::randn(&[4, 3], weft_core::DType::F64, &mut g).unwrap();
        let model = Arc::new(F64Linear {
            w: w.requires_grad_().unwrap(),
            ctx: weft_nn::context::Context::new(0),
        });
        let adam = Box::new(Adam::new(AdamConfig::default()).unwrap());
        let mut t = Trainer::new(model.clone(), adam, Schedule::Constant { lr: 0.01 }, 0.0)
            .with_progress(false)
            .with_grad_accum(3)
            .with_compile(compile);
        let losses: Vec<u64> = (0..5)
            .map(|step| {
                let micro: Vec<_> = (0..3).map(|j| data(3 * step + j).unwrap()).collect();
                t.train_accumulated(step, &micro).unwrap().loss.to_bits()
            })
            .collect();
        assert_eq!(t.whole_step_captured(), compile, "the whole step was captured");
        (losses, model.w.to_vec::<f64>().unwrap())
    };
    assert_eq!(run(false), run(true));
}
