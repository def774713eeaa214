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
