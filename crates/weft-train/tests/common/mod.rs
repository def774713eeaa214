//! Helpers shared by the trainer's tests.
#![allow(dead_code)]

use std::sync::Arc;

use weft_core::{DType, Generator, Tensor};
use weft_models::mlp::{MlpConfig, MlpModel};
use weft_nn::layers::Activation;
use weft_nn::optim::Sgd;
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
    let model = MlpModel::new(
        MlpConfig {
            in_features: 4,
            hidden: vec![8],
            out_features: 3,
            activation: Activation::Relu,
        },
        0,
    )
    .unwrap();
    let sgd = Sgd::new(Default::default()).unwrap();
    Trainer::new(Arc::new(model), Box::new(sgd), Schedule::Constant { lr: 0.1 }, 0.0)
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
