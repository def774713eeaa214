//! A user-defined model trained through the `Trainer`: the nanoGPT parameter groups, a cosine
//! schedule, clipping, evaluation with accuracy, a custom callback, a metrics file and
//! checkpoints, and the summary `fit` returns.
//!
//! Run: `cargo run --release -p weft-train --example trainer_callbacks`

use std::sync::Arc;

use weft_core::{DType, Generator, Tensor};
use weft_models::{evaluate_classifier, EvalOutput, Model};
use weft_nn::layers::Linear;
use weft_nn::module::{prefixed, Module};
use weft_nn::optim::Adam;
use weft_nn::schedule::Schedule;
use weft_nn::Context;
use weft_train::metrics::{MetricsFile, MetricsMode};
use weft_train::trainer::{BatchFn, CheckpointPolicy};
use weft_train::{Callback, EvalRecord, StepRecord, Trainer};

/// A classifier of the user's own: two Linears with a GELU between them.
struct TwoLayer {
    hidden: Linear,
    out: Linear,
    ctx: Context,
}

impl TwoLayer {
    fn new(features: usize, width: usize, classes: usize, seed: u64) -> weft_core::Result<Self> {
        let mut rng = Generator::new(seed);
        Ok(TwoLayer {
            hidden: Linear::new(features, width, true, &mut rng)?,
            out: Linear::new(width, classes, true, &mut rng)?,
            ctx: Context::new(seed),
        })
    }
}

impl Module for TwoLayer {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("hidden", self.hidden.parameters());
        p.extend(prefixed("out", self.out.parameters()));
        p
    }
}

impl Model for TwoLayer {
    fn logits(&self, x: &Tensor) -> weft_core::Result<Tensor> {
        self.out.forward(&self.hidden.forward(x)?.gelu()?)
    }

    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> weft_core::Result<Tensor> {
        self.logits(inputs)?.cross_entropy(targets, -100, 0.0)
    }

    fn context(&self) -> &Context {
        &self.ctx
    }

    /// Evaluations report the accuracy too.
    fn evaluate(&self, inputs: &Tensor, targets: &Tensor) -> weft_core::Result<EvalOutput> {
        evaluate_classifier(&self.logits(inputs)?, targets)
    }
}

/// Prints every logged step and evaluation.
struct Print;

impl Callback for Print {
    fn on_step(&mut self, r: &StepRecord) -> weft_train::Result<()> {
        println!(
            "step {:>3}  loss {:.4}  lr {:.2e}  grad norm {:.3}",
            r.step, r.loss, r.lr, r.grad_norm
        );
        Ok(())
    }

    fn on_eval(&mut self, e: &EvalRecord) -> weft_train::Result<()> {
        let acc = e.accuracy.unwrap_or(0.0) * 100.0;
        println!("step {:>3}  val loss {:.4}  val accuracy {acc:.1}%", e.step, e.loss);
        Ok(())
    }
}

/// Batch `i` of a seeded stream of 32 points, labelled by the largest of their first 4
/// features: a pure function of `(seed, i)`, so a resumed run sees the same data.
fn batches(seed: u64) -> BatchFn {
    Arc::new(move |i| {
        let mut g = Generator::new(seed);
        g.set_offset(i as u64 * 1024);
        let x = Tensor::randn(&[32, 8], DType::F32, &mut g)?;
        let y = x.narrow(1, 0, 4)?.argmax(-1, false)?;
        Ok((x, y))
    })
}

fn main() -> weft_train::Result<()> {
    let model = Arc::new(TwoLayer::new(8, 32, 4, 0)?);
    let out = std::env::temp_dir().join("weft-example-trainer");
    let schedule = Schedule::Cosine {
        lr: 3e-3,
        warmup_steps: 10,
        decay_steps: 200,
        min_lr: 3e-4,
    };
    let metrics = MetricsFile::open(&out.join("metrics.jsonl"), MetricsMode::Fresh { overwrite: true })?;
    let mut trainer = Trainer::new(model, Box::new(Adam::adamw((0.9, 0.95), 1e-8)?), schedule, 0.01)
        .with_grad_clip(Some(1.0))
        .with_log_every(25)
        .with_eval(100, 4, batches(99))
        .with_callback(Print)
        .with_callback(metrics)
        .with_checkpoints(CheckpointPolicy {
            dir: out.join("ckpt"),
            every: 100,
            keep: 2,
            // the example starts afresh each time it runs
            overwrite: true,
        });
    let summary = trainer.fit(batches(7), 0, 200)?;
    println!(
        "{} steps in {:.2} s; last loss {:.4}; best val loss {:.4}; checkpoint {}",
        summary.steps_run,
        summary.elapsed.as_secs_f64(),
        summary.last.as_ref().map_or(f64::NAN, |r| r.loss),
        summary.best_eval.as_ref().map_or(f64::NAN, |e| e.loss),
        summary
            .checkpoint
            .as_ref()
            .map_or("none".into(), |p| p.display().to_string())
    );
    Ok(())
}
