//! Helpers shared by the trainer's tests.
#![allow(dead_code)]

use std::sync::Arc;

use weft_core::{DType, Generator, Tensor};
use weft_models::mlp::{MlpConfig, MlpModel};
use weft_nn::layers::Activation;
use weft_nn::optim::{Adam, AdamConfig, Sgd};
use weft_nn::schedule::Schedule;
use weft_train::trainer::BatchFn;
use weft_train::Trainer;

pub fn temp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("weft-trainer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

pub fn trainer() -> Trainer {
    plain_trainer().with_progress(false)
}

/// [`trainer`] with the progress display at its default.
pub fn plain_trainer() -> Trainer {
    let sgd = Sgd::new(Default::default()).unwrap();
    Trainer::new(mlp(), Box::new(sgd), Schedule::Constant { lr: 0.1 }, 0.0)
}

/// The tests' classifier: 4 features, a hidden layer of 8, 3 classes.
pub fn mlp() -> Arc<MlpModel> {
    let config = MlpConfig {
        in_features: 4,
        hidden: vec![8],
        out_features: 3,
        activation: Activation::Relu,
    };
    Arc::new(MlpModel::new(config, 0).unwrap())
}

/// A trainer of `model` with Adam at a constant learning rate of 0.01, no progress display.
pub fn adam_trainer(model: Arc<MlpModel>) -> Trainer {
    let adam = Adam::new(AdamConfig::default()).unwrap();
    Trainer::new(model, Box::new(adam), Schedule::Constant { lr: 0.01 }, 0.0).with_progress(false)
}

/// Batch `i`: 8 seeded rows labelled by the largest of their first 3 features, scaled by `scale`.
pub fn batches(scale: f32) -> BatchFn {
    Arc::new(move |i| {
        let mut g = Generator::new(3);
        g.set_offset(i as u64 * 64);
        let x = Tensor::randn(&[8, 4], DType::F32, &mut g)?;
        let y = x.narrow(1, 0, 3)?.argmax(-1, false)?;
        Ok((x.mul_scalar(scale as f64)?, y))
    })
}
