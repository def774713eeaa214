//! Running a model off the async runtime: each job runs on tokio's blocking pool while it holds
//! its model's worker (one job per model at a time), after taking one of the model's queue
//! places (none left: 503 with `Retry-After`).

use std::sync::Arc;

use axum::http::StatusCode;
use tokio::task::JoinHandle;
use weft_core::Tensor;

use crate::error::ApiError;
use crate::protocol::{ResponseOutput, LOGITS};
use crate::registry::Served;

/// Starts `job` on the blocking pool with `served`'s worker held; 503 when its queue is full.
pub fn spawn<T: Send + 'static>(
    served: &Arc<Served>,
    job: impl FnOnce(&Served) -> T + Send + 'static,
) -> Result<JoinHandle<T>, ApiError> {
    let permit = served.admitted.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "model {} version {}: its queue is full, retry later",
                served.name, served.version
            ),
        )
    })?;
    let served = served.clone();
    Ok(tokio::task::spawn_blocking(move || {
        let _permit = permit;
        // a job that panicked left nothing half-written in the guard's unit value
        let _running = served.running.lock().unwrap_or_else(|p| p.into_inner());
        job(&served)
    }))
}

/// Runs `job` as [`spawn`] does and waits for it; a job that panicked is a 500.
pub async fn run<T: Send + 'static>(
    served: &Arc<Served>,
    job: impl FnOnce(&Served) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let name = format!("model {} version {}", served.name, served.version);
    spawn(served, job)?
        .await
        .map_err(|e| ApiError::internal(format!("{name} failed: {e}")))?
}

/// The model's logits for `input` (classifier: `[B, classes]`; language model: `[B, T,
/// vocab]`), as an FP32 output tensor.
pub fn logits(served: &Served, input: &Tensor) -> Result<ResponseOutput, ApiError> {
    let fail =
        |e: weft_core::Error| ApiError::internal(format!("model {} version {}: {e}", served.name, served.version));
    let out = weft_core::no_grad(|| served.model.logits(input)).map_err(fail)?;
    Ok(ResponseOutput {
        name: LOGITS,
        datatype: "FP32",
        shape: out.shape().to_vec(),
        data: out.to_vec::<f32>().map_err(fail)?,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::sync::Semaphore;
    use weft_models::mlp::{MlpConfig, MlpModel};
    use weft_nn::layers::Activation;

    use super::*;
    use crate::registry::Signature;

    /// An mlp of 2 features and 3 classes admitting `queue` requests.
    fn served(queue: usize) -> Arc<Served> {
        let config = MlpConfig {
            in_features: 2,
            hidden: vec![4],
            out_features: 3,
            activation: Activation::Relu,
        };
        Arc::new(Served {
            name: "m".into(),
            version: "1".into(),
            kind: "mlp",
            signature: Signature::Features {
                features: 2,
                classes: 3,
            },
            model: Arc::new(MlpModel::new(config, 0).unwrap()),
            lm: None,
            tokenizer: None,
            running: Mutex::new(()),
            admitted: Arc::new(Semaphore::new(queue)),
        })
    }

    #[test]
    fn a_full_queue_is_503_and_frees_its_places() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        runtime.block_on(async {
            let s = served(2);
            let (release, wait) = std::sync::mpsc::channel::<()>();
            let first = spawn(&s, move |_| wait.recv().is_ok()).unwrap();
            let second = spawn(&s, |_| true).unwrap();
            let refused = spawn(&s, |_| true).unwrap_err();
            assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(refused.message.contains("queue is full"), "{}", refused.message);
            release.send(()).unwrap();
            assert!(first.await.unwrap() && second.await.unwrap());
            // the places are free again; a forward runs
            let x = Tensor::from_vec(vec![0.5f32, -1.0], &[1, 2]).unwrap();
            let out = run(&s, move |m| logits(m, &x)).await.unwrap();
            assert_eq!((out.shape, out.data.len()), (vec![1, 3], 3));
        });
    }

    #[test]
    fn a_job_that_panics_is_a_500_and_the_model_keeps_working() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        runtime.block_on(async {
            let s = served(1);
            let err = run(&s, |_| -> Result<(), ApiError> { panic!("boom") })
                .await
                .unwrap_err();
            assert_eq!(err.status, StatusCode::INTERNAL_SERVER_ERROR);
            assert!(err.message.contains("model m version 1 failed"), "{}", err.message);
            assert!(run(&s, |_| Ok(7)).await.is_ok_and(|v| v == 7));
        });
    }
}
