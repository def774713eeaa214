//! A stop requested while `fit` runs (as a signal handler does) ends it after the step, with a
//! checkpoint. Alone in its test binary: the request is process-wide.

use std::sync::Arc;

use weft_core::{DType, Generator, Tensor};
use weft_models::mlp::{MlpConfig, MlpModel};
use weft_nn::layers::Activation;
use weft_nn::optim::Sgd;
use weft_nn::schedule::Schedule;
use weft_train::trainer::{BatchFn, CheckpointPolicy};
use weft_train::Trainer;

fn temp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("weft-trainer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn trainer() -> Trainer {
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
    Trainer::new(Arc::new(model), Box::new(sgd), Schedule::Constant { lr: 0.1 }, 0.0).with_progress(false)
}

/// Batch `i`: 8 seeded rows labelled by the largest of their first 3 features, scaled by `scale`.
fn batches(scale: f32) -> BatchFn {
    Arc::new(move |i| {
        let mut g = Generator::new(3);
        g.set_offset(i as u64 * 64);
        let x = Tensor::randn(&[8, 4], DType::F32, &mut g)?;
        let y = x.narrow(1, 0, 3)?.argmax(-1, false)?;
        Ok((x.mul_scalar(scale as f64)?, y))
    })
}

#[test]
fn a_requested_stop_ends_fit_after_the_step_with_a_checkpoint() {
    let dir = temp("stop");
    let mut t = trainer().with_checkpoints(CheckpointPolicy {
        dir: dir.clone(),
        every: 0,
        keep: 3,
        overwrite: false,
    });
    // the batch of step 3 (index 2) asks for the stop, as a signal arriving mid-step would
    let inner = batches(1.0);
    let asking: BatchFn = Arc::new(move |i| {
        if i == 2 {
            weft_train::stop::request(15);
        }
        inner(i)
    });
    let s = t.fit(asking, 0, 100).unwrap();
    assert_eq!(s.stopped_by, Some(15));
    // the prefetcher builds batches ahead, so the request lands during step 1, 2 or 3
    assert!((1..=3).contains(&s.steps), "{}", s.steps);
    let ckpt = s.checkpoint.unwrap();
    assert_eq!(ckpt, dir.join(format!("step-{:08}", s.steps)));
    assert!(weft_train::checkpoint::is_complete(&ckpt));
    let _ = std::fs::remove_dir_all(&dir);
}
