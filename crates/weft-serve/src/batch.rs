//! Dynamic batching of infer and predictions requests: each model version that batches
//! (`max_batch_size > 1`) has a batcher task. It takes the first queued request, waits up to
//! `max_batch_delay` for more (up to `max_batch_size` requests whose inputs agree on every
//! dimension but the first), joins their inputs along the batch dimension, runs one forward on
//! one of the model's workers and hands each request its rows of the logits. Requests that
//! queue while every worker is busy form the next batch, so under load batches fill even with
//! no delay; with several workers, each free worker takes the next batch.

use std::sync::{Arc, Weak};

use tokio::sync::mpsc::{self, UnboundedReceiver};
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use weft_core::{DType, Tensor};

use crate::error::ApiError;
use crate::model::LoadOptions;
use crate::protocol::ResponseOutput;
use crate::registry::{Admitted, Served};
use crate::worker;

/// A request waiting in a batcher's queue with its queue place and where its answer goes.
pub(crate) struct Pending {
    input: Tensor,
    reply: oneshot::Sender<Result<ResponseOutput, ApiError>>,
    /// When the request was admitted.
    at: std::time::Instant,
    /// Given back just before the answer is sent (a client that has its answer sees the place
    /// free): the version is not drained before.
    permit: OwnedSemaphorePermit,
}

impl Pending {
    /// Gives the queue place back, then sends `answer`.
    fn answer(self, answer: Result<ResponseOutput, ApiError>) {
        let Pending { reply, permit, .. } = self;
        drop(permit);
        let _ = reply.send(answer);
    }
}

/// Queues `input` for the admitted model's batcher (started by the first request) and waits
/// for its logits.
pub async fn submit(admitted: Admitted, input: Tensor) -> Result<ResponseOutput, ApiError> {
    let Admitted { served, permit, at } = admitted;
    let queue = served.batcher.get_or_init(|| {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run_batches(Arc::downgrade(&served), rx, served.options));
        tx
    });
    let who = format!("model {} version {}", served.name, served.version);
    let (reply, answer) = oneshot::channel();
    let pending = Pending {
        input,
        reply,
        at,
        permit,
    };
    queue
        .send(pending)
        .map_err(|_| ApiError::internal(format!("{who}: its batcher stopped")))?;
    answer
        .await
        .map_err(|_| ApiError::internal(format!("{who} failed while running a batch")))?
}

/// Whether two inputs can share a forward: the same datatype and every dimension but the
/// first equal.
fn joinable(a: &Tensor, b: &Tensor) -> bool {
    a.dtype() == b.dtype() && a.shape()[1..] == b.shape()[1..]
}

/// The batcher loop of one model version; it ends when the version is dropped (its queue's
/// sender goes with it). After a batch's first request it waits for a free worker, then up to
/// `max_batch_delay` (from the first's arrival) for more; the batch runs on that worker while
/// the next one forms, so with N workers up to N batches run at once.
async fn run_batches(served: Weak<Served>, mut queue: UnboundedReceiver<Pending>, options: LoadOptions) {
    let mut carried: Option<Pending> = None;
    loop {
        let first = match carried.take() {
            Some(p) => p,
            None => match queue.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let deadline = tokio::time::Instant::now() + options.max_batch_delay;
        let Some(workers) = served.upgrade().map(|s| s.workers.clone()) else {
            return;
        };
        // requests that arrive while every worker is busy join this batch
        let worker = workers.acquire_async().await;
        let mut batch = vec![first];
        while batch.len() < options.max_batch_size {
            // a request already queued is taken even once the deadline has passed
            match tokio::time::timeout_at(deadline, queue.recv()).await {
                Ok(Some(p)) if joinable(&batch[0].input, &p.input) => batch.push(p),
                Ok(Some(p)) => {
                    carried = Some(p);
                    break;
                }
                Ok(None) | Err(_) => break,
            }
        }
        let Some(served) = served.upgrade() else { return };
        // a forward that panics drops its replies (each request is answered with a 500) and
        // gives its worker back while unwinding
        tokio::task::spawn_blocking(move || {
            let _worker = worker;
            run_batch(&served, batch);
        });
    }
}

/// Row-major values of every input in `batch`, joined along the first dimension.
fn join(batch: &[Pending]) -> Result<Tensor, weft_core::Error> {
    let mut shape = batch[0].input.shape().to_vec();
    shape[0] = batch.iter().map(|p| p.input.shape()[0]).sum();
    if batch[0].input.dtype() == DType::I64 {
        let mut all = Vec::new();
        for p in batch {
            all.extend(p.input.to_vec::<i64>()?);
        }
        Tensor::from_vec(all, &shape)
    } else {
        let mut all = Vec::new();
        for p in batch {
            all.extend(p.input.to_vec::<f32>()?);
        }
        Tensor::from_vec(all, &shape)
    }
}

/// Runs `batch` as one forward on the calling thread (which holds the worker) and answers each
/// request with its rows.
fn run_batch(served: &Served, batch: Vec<Pending>) {
    for p in &batch {
        served.stats.queue.observe(p.at.elapsed().as_secs_f64());
    }
    let out = match batch.as_slice() {
        [one] => worker::logits(served, &one.input, 1),
        _ => join(&batch)
            .map_err(|e| ApiError::internal(format!("model {} version {}: {e}", served.name, served.version)))
            .and_then(|joined| worker::logits(served, &joined, batch.len())),
    };
    let out = match out {
        Ok(out) => out,
        Err(e) => {
            for p in batch {
                p.answer(Err(e.clone()));
            }
            return;
        }
    };
    let rows: usize = out.shape[0].max(1);
    let per_row = out.data.len() / rows;
    let mut at = 0;
    for p in batch {
        let n = p.input.shape()[0];
        let mut shape = out.shape.clone();
        shape[0] = n;
        let data = out.data[at * per_row..(at + n) * per_row].to_vec();
        at += n;
        let mine = ResponseOutput {
            name: out.name,
            datatype: out.datatype,
            shape,
            data,
        };
        // a request whose rows overflow fails alone
        let answer = worker::finite(served, &mine).map(|()| mine);
        p.answer(answer);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::model::test_mlp;

    #[test]
    fn batched_requests_give_the_unbatched_logits() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let alone = test_mlp(16, 1);
            let batched = test_mlp(16, 8);
            let inputs: Vec<Tensor> = (0..8)
                .map(|i| {
                    let rows = 1 + i % 3;
                    let xs: Vec<f32> = (0..rows * 2).map(|j| (i * 7 + j) as f32 * 0.1 - 1.0).collect();
                    Tensor::from_vec(xs, &[rows, 2]).unwrap()
                })
                .collect();
            let mut want = Vec::new();
            for x in &inputs {
                want.push(
                    worker::forward(Admitted::new(&alone).unwrap(), x.clone())
                        .await
                        .unwrap(),
                );
            }
            let tasks: Vec<_> = inputs
                .iter()
                .map(|x| {
                    let admitted = Admitted::new(&batched).unwrap();
                    tokio::spawn(submit(admitted, x.clone()))
                })
                .collect();
            for (task, want) in tasks.into_iter().zip(&want) {
                let got = task.await.unwrap().unwrap();
                assert_eq!(got.shape, want.shape);
                for (g, w) in got.data.iter().zip(&want.data) {
                    assert!((g - w).abs() <= 1e-6, "{g} vs {w}");
                }
            }
            // all 8 queued within the 20 ms delay: fewer forwards than requests
            let d = batched.stats.batch_size.snapshot();
            assert_eq!(d.1, 8.0, "requests counted: {d:?}");
            assert!(d.0 < 8, "forwards: {d:?}");
            assert_eq!(batched.queue_depth(), 0);
            assert_eq!(alone.stats.generated_tokens.load(Ordering::Relaxed), 0);
        });
    }

    #[test]
    fn a_batch_runs_on_a_free_worker_while_another_is_busy() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let s = test_mlp(16, 4);
            s.workers.scale(2);
            // one worker held for the whole test: the batch must run on the other
            let held = s.workers.acquire_async().await;
            let x = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.25], &[2, 2]).unwrap();
            // bounded, so that a batcher waiting for the held worker fails here instead of hanging
            let answer = tokio::time::timeout(
                std::time::Duration::from_secs(60),
                submit(Admitted::new(&s).unwrap(), x),
            );
            let out = answer.await.expect("the batch waited for the held worker").unwrap();
            assert_eq!(out.shape, vec![2, 3]);
            // (the batch's worker is given back just after its answer: `busy` may still say 2)
            assert_eq!(s.workers.peak(), 2);
            drop(held);
        });
    }
}
