//! Running a model off the async runtime: each job runs on tokio's blocking pool while it holds
//! its model's worker (one job per model at a time) and the queue place it was admitted with
//! ([`Admitted`]; none left: 503 with `Retry-After`). Forwards of models that batch go through
//! their batcher ([`crate::batch`]).

use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinHandle;
use weft_core::Tensor;

use crate::error::ApiError;
use crate::protocol::{ResponseOutput, LOGITS};
use crate::registry::{Admitted, Served};

/// Starts `job` on the blocking pool with the admitted model's worker held; the queue place is
/// freed when the job ends.
pub fn spawn<T: Send + 'static>(
    admitted: Admitted,
    job: impl FnOnce(&Arc<Served>) -> T + Send + 'static,
) -> JoinHandle<T> {
    let Admitted { served, permit, at } = admitted;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        // given back when the job ends, or unwinds
        let _worker = served.workers.acquire();
        served.stats.queue.observe(at.elapsed().as_secs_f64());
        job(&served)
    })
}

/// Runs `job` as [`spawn`] does and waits for it; a job that panicked is a 500.
pub async fn run<T: Send + 'static>(
    admitted: Admitted,
    job: impl FnOnce(&Arc<Served>) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let name = format!("model {} version {}", admitted.served.name, admitted.served.version);
    spawn(admitted, job)
        .await
        .map_err(|e| ApiError::internal(format!("{name} failed: {e}")))?
}

/// Runs `job` as [`run`] does, and gives the request's queue places back with its result: a
/// request that goes on after the job (the prompt's forward of `echo` with `logprobs`, before
/// its completions run on those places) needs no place of its own for it. The places are held
/// through the job, also when the caller stops waiting for it; a job that panicked is a 500 and
/// gives them back to the queue.
pub async fn run_holding<T: Send + 'static>(
    admitted: Admitted,
    job: impl FnOnce(&Arc<Served>) -> Result<T, ApiError> + Send + 'static,
) -> Result<(T, Admitted), ApiError> {
    let name = format!("model {} version {}", admitted.served.name, admitted.served.version);
    tokio::task::spawn_blocking(move || {
        let served = admitted.served.clone();
        let _worker = served.workers.acquire();
        served.stats.queue.observe(admitted.at.elapsed().as_secs_f64());
        job(&served).map(|out| (out, admitted))
    })
    .await
    .map_err(|e| ApiError::internal(format!("{name} failed: {e}")))?
}

/// The admitted model's logits for `input`: batched with other requests when the model batches
/// (`max_batch_size > 1`), else run alone.
pub async fn forward(admitted: Admitted, input: Tensor) -> Result<ResponseOutput, ApiError> {
    if admitted.served.options.max_batch_size > 1 {
        crate::batch::submit(admitted, input).await
    } else {
        run(admitted, move |s| {
            let out = logits(s, &input, 1)?;
            finite(s, &out)?;
            Ok(out)
        })
        .await
    }
}

/// 400 when `out` holds a value that is not finite: the input passed its checks (every value
/// inside FP32's range) but drives the model past it (an overflow to infinity, or NaN after
/// one), so the request must change, not be retried; JSON cannot carry the value anyway.
pub fn finite(served: &Served, out: &ResponseOutput) -> Result<(), ApiError> {
    match out.data.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(ApiError::bad_request(format!(
            "model {} version {} gives {} at {}[{i}] for this input: its values drive the model \
             outside FP32's range (give smaller values)",
            served.name, served.version, out.data[i], out.name
        ))),
    }
}

/// The model's logits for `input` (classifier: `[B, classes]`; language model: `[B, T,
/// vocab]`), as an FP32 output tensor; `requests` is how many requests `input` holds (for the
/// batch-size and forward-time metrics).
pub fn logits(served: &Served, input: &Tensor, requests: usize) -> Result<ResponseOutput, ApiError> {
    let fail =
        |e: weft_core::Error| ApiError::internal(format!("model {} version {}: {e}", served.name, served.version));
    let started = Instant::now();
    let out = weft_core::no_grad(|| served.model.logits(input)).map_err(fail)?;
    let data = out.to_vec::<f32>().map_err(fail)?;
    served.stats.inference.observe(started.elapsed().as_secs_f64());
    served.stats.batch_size.observe(requests as f64);
    Ok(ResponseOutput {
        name: LOGITS,
        datatype: "FP32",
        shape: out.shape().to_vec(),
        data,
    })
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;

    use super::*;
    use crate::model::test_mlp;

    #[test]
    fn a_full_queue_is_503_and_frees_its_places() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        runtime.block_on(async {
            let s = test_mlp(2, 1);
            let (release, wait) = std::sync::mpsc::channel::<()>();
            let first = spawn(Admitted::new(&s).unwrap(), move |_| wait.recv().is_ok());
            let second = spawn(Admitted::new(&s).unwrap(), |_| true);
            assert_eq!(s.queue_depth(), 2);
            let refused = Admitted::new(&s).err().unwrap();
            assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(refused.message.contains("queue is full"), "{}", refused.message);
            release.send(()).unwrap();
            assert!(first.await.unwrap() && second.await.unwrap());
            // the places are free again; a forward runs
            assert_eq!(s.queue_depth(), 0);
            let x = Tensor::from_vec(vec![0.5f32, -1.0], &[1, 2]).unwrap();
            let out = forward(Admitted::new(&s).unwrap(), x).await.unwrap();
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
            let s = test_mlp(1, 1);
            let err = run(Admitted::new(&s).unwrap(), |_| -> Result<(), ApiError> {
                panic!("boom")
            })
            .await
            .unwrap_err();
            assert_eq!(err.status, StatusCode::INTERNAL_SERVER_ERROR);
            assert!(err.message.contains("model m version 1 failed"), "{}", err.message);
            assert!(run(Admitted::new(&s).unwrap(), |_| Ok(7)).await.is_ok_and(|v| v == 7));
        });
    }
}
