//! The same kind of run through the trainer: a built-in model, the nanoGPT parameter groups,
//! a cosine schedule, clipping, a custom callback, a metrics file and checkpoints.
//!
//! Run: `cargo run --release -p weft-train --example trainer_callbacks`

use std::sync::Arc;

use weft_core::{DType, Generator, Tensor};
use weft_models::mlp::{MlpConfig, MlpModel};
use weft_nn::layers::Activation;
use weft_nn::optim::Adam;
use weft_nn::schedule::Schedule;
use weft_train::metrics::MetricsFile;
use weft_train::trainer::{BatchFn, CheckpointPolicy};
use weft_train::{Callback, StepRecord, Trainer};

/// Prints every logged step.
struct Print;

impl Callback for Print {
    fn on_step(&mut self, r: &StepRecord) -> weft_train::Result<()> {
        println!(
            "step {:>3}  loss {:.4}  lr {:.2e}  grad norm {:.3}",
            r.step, r.loss, r.lr, r.grad_norm
        );
        Ok(())
    }
}

fn main() -> weft_train::Result<()> {
    let config = MlpConfig {
        in_features: 8,
        hidden: vec![32],
        out_features: 4,
        activation: Activation::Gelu,
    };
    let model = Arc::new(MlpModel::new(config, 0)?);
    // batches are a pure function of the step, so a resumed run sees the same data
    let batches: BatchFn = Arc::new(|step| {
        let mut g = Generator::new(7);
        g.set_offset(step as u64 * 1024);
        let x = Tensor::randn(&[32, 8], DType::F32, &mut g)?;
        let y = x.narrow(1, 0, 4)?.argmax(-1, false)?; // the label is the argmax of the first 4 features
        Ok((x, y))
    });
    let out = std::env::temp_dir().join("weft-example-trainer");
    let schedule = Schedule::Cosine {
        lr: 3e-3,
        warmup_steps: 10,
        decay_steps: 200,
        min_lr: 3e-4,
    };
    let mut trainer = Trainer::new(model, Box::new(Adam::adamw((0.9, 0.95), 1e-8)?), schedule, 0.01)
        .with_grad_clip(Some(1.0))
        .with_log_every(25)
        .with_callback(Print)
        .with_callback(MetricsFile::create(&out.join("metrics.jsonl"), false)?)
        .with_checkpoints(CheckpointPolicy {
            dir: out.join("ckpt"),
            every: 100,
            keep: 2,
        });
    trainer.fit(batches, 0, 200)?;
    println!("metrics and checkpoints in {}", out.display());
    Ok(())
}
