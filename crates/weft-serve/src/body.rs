//! Request bodies, read before the handlers under limits of size, time and memory: the body limit
//! (413; from `Content-Length` at once when the client waits for `100 Continue`), a limit on each
//! pause inside the body and a deadline for the whole body (408: the body must keep arriving at
//! `--min-body-rate` bytes a second after a grace of `--read-timeout-ms`, so that a client
//! dripping a byte now and then cannot hold its connection for good), an answer at once when the
//! server is stopping (503: a body still arriving does not hold the shutdown up), and one budget of
//! bytes held at once across connections ([`BodyBudget`]; past it 503) that request bodies and the
//! infer answers being sent ([`crate::answer`]) share, so that many clients sending bodies at the
//! limit, or asking for large answers and not reading them, cannot hold more memory than it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt;

use crate::error::refusal;
use crate::listen::Stopping;
use crate::AppState;

/// The bytes the server holds at once (request bodies being read or in a request being handled,
/// and the output values of infer answers until they are sent), across all connections, and
/// their limit (`--max-body-bytes-in-flight`).
#[derive(Debug)]
pub struct BodyBudget {
    limit: usize,
    used: AtomicUsize,
}

impl BodyBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// The bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    /// The most bytes held at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Takes `n` more bytes when they fit.
    fn take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                u.checked_add(n).filter(|&t| t <= self.limit)
            })
            .is_ok()
    }

    /// `n` bytes of the budget, held until the [`Held`] is dropped; `None` when they do not fit
    /// now.
    pub(crate) fn reserve(self: &Arc<Self>, n: usize) -> Option<Held> {
        let mut held = Held {
            budget: self.clone(),
            bytes: 0,
        };
        held.grow(n).then_some(held)
    }
}

/// The bytes one request (or answer) holds of a [`BodyBudget`], given back when it is dropped.
#[derive(Debug)]
pub(crate) struct Held {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Held {
    /// Takes `n` more bytes when they fit (else holds what it held).
    pub(crate) fn grow(&mut self, n: usize) -> bool {
        let fits = self.budget.take(n);
        if fits {
            self.bytes += n;
        }
        fits
    }

    /// The bytes it holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Gives `n` of its bytes back (at most what it holds).
    pub(crate) fn shrink(&mut self, n: usize) {
        let n = n.min(self.bytes);
        self.budget.used.fetch_sub(n, Ordering::SeqCst);
        self.bytes -= n;
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

/// Why a request past the budget is refused: what the server holds, its limit, and `what`
/// would pass it.
pub(crate) fn over_budget_message(budget: &BodyBudget, what: &str) -> String {
    format!(
        "the server holds {} bytes of request bodies and answers already, of its limit of {} \
         (--max-body-bytes-in-flight); {what}: retry later",
        budget.used(),
        budget.limit
    )
}

/// The 503 of a request past the budget, with `Retry-After`.
pub(crate) fn over_budget(path: &str, budget: &BodyBudget, what: &str) -> Response {
    refusal(path, StatusCode::SERVICE_UNAVAILABLE, over_budget_message(budget, what))
}

tokio::task_local! {
    /// The hold of the request being handled on the budget for its body, while its handler
    /// runs: an answer that counts against the budget takes it over ([`take_body_hold`]).
    static BODY_HOLD: RefCell<Option<Held>>;
}

/// The budget held for the body of the request whose handler calls it (once; `None` after, or
/// outside [`read_body`]). An answer takes the hold over, so that a request is counted for the
/// larger of its body and its answer, not both (a body and an answer each under the budget but
/// over it together were a 503 however long the client waited); the larger until the answer is
/// made, since the parsed input lives through the forward.
pub(crate) fn take_body_hold() -> Option<Held> {
    BODY_HOLD.try_with(|h| h.borrow_mut().take()).ok().flatten()
}

/// `response` with `Connection: close` (the rest of its request's body is not read).
fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// When the body read so far (`received` bytes, started at `started`) must have arrived at the
/// latest: `grace` after its start, and one second more for each `rate` bytes received.
fn body_deadline(started: Instant, grace: Duration, rate: u64, received: usize) -> Instant {
    let earned = Duration::try_from_secs_f64(received as f64 / rate.max(1) as f64).unwrap_or(Duration::MAX);
    started
        .checked_add(grace.saturating_add(earned))
        .unwrap_or_else(|| started + Duration::from_secs(1 << 32))
}

/// The middleware that reads a request's body before its handler: 413 when what arrives is over
/// `state.limits.body_bytes` (at once, from the `Content-Length`, for a client that sent
/// `Expect: 100-continue` and waits before sending the body), 408 when the client pauses longer
/// than `state.limits.read_timeout` inside it or the body arrives slower than
/// `state.limits.min_body_rate` (after a grace of the read timeout), 503 when it would pass the
/// budget of bytes in flight or the server is stopping. The handler gets the whole body. On
/// `/v1/*` the refusals take OpenAI's shape.
pub async fn read_body(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let limits = state.limits;
    let limit = limits.body_bytes;
    let path = request.uri().path().to_string();
    let refuse = |status: StatusCode, message: String| refusal(&path, status, message);
    let too_large = || format!("the request body is over the limit of {limit} bytes");
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().parse::<u64>());
    // a client that waits for `100 Continue` before sending its body is answered from the
    // header; any other is read up to the limit first, as it may be writing the body already and
    // would see the connection close under it (a broken pipe) rather than the 413
    let waits_to_send = request
        .headers()
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let capacity = match declared {
        Some(Ok(n)) if n > limit as u64 && waits_to_send => return refuse(StatusCode::PAYLOAD_TOO_LARGE, too_large()),
        Some(Ok(n)) if n > limit as u64 => limit,
        Some(Ok(n)) => n as usize,
        Some(Err(_)) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "the Content-Length header is not a whole number".into(),
            )
        }
        None => 0,
    };
    let stopping = request.extensions().get::<Stopping>().cloned();
    let (parts, body) = request.into_parts();
    let mut chunks = body.into_data_stream();
    let Some(mut held) = state.bodies.reserve(0) else {
        unreachable!("0 bytes always fit");
    };
    let stop = async move {
        match stopping {
            Some(s) => s.wait().await,
            None => std::future::pending().await,
        }
    };
    let mut stop = std::pin::pin!(stop);
    // reserved as it arrives past 1 MiB: a client sending only headers reserves little
    let mut bytes = Vec::with_capacity(capacity.min(1 << 20));
    loop {
        let whole_by = body_deadline(started, limits.read_timeout, limits.min_body_rate, bytes.len());
        let pause_by = Instant::now() + limits.read_timeout;
        let next_chunk = tokio::time::timeout_at(whole_by.min(pause_by).into(), chunks.next());
        let arrived = tokio::select! {
            biased;
            _ = stop.as_mut() => {
                return closing(refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the server is stopping and the request body had not arrived; send it again (to another instance)"
                        .into(),
                ))
            }
            arrived = next_chunk => arrived,
        };
        match arrived {
            Err(_) if whole_by <= pause_by => {
                let of = declared
                    .and_then(Result::ok)
                    .map_or(String::new(), |n| format!(" of {n}"));
                return closing(refuse(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body arrived too slowly: {}{of} bytes in {:.1} s, under {} bytes a second after \
                         the first {} ms (--min-body-rate)",
                        bytes.len(),
                        started.elapsed().as_secs_f64(),
                        limits.min_body_rate,
                        limits.read_timeout.as_millis()
                    ),
                ));
            }
            Err(_) => {
                return closing(refuse(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body stopped arriving for {} ms",
                        limits.read_timeout.as_millis()
                    ),
                ))
            }
            Ok(None) => break,
            Ok(Some(Ok(chunk))) => {
                if bytes.len() + chunk.len() > limit {
                    return refuse(StatusCode::PAYLOAD_TOO_LARGE, too_large());
                }
                if !held.grow(chunk.len()) {
                    return over_budget(&path, &state.bodies, "this request's body would pass it");
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(Some(Err(e))) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    format!("the request body could not be read: {e}"),
                )
            }
        }
    }
    // held until the handler has let go of the body (a streamed response keeps what it made
    // of it), or taken over by its answer
    let request = Request::from_parts(parts, Body::from(Bytes::from(bytes)));
    BODY_HOLD.scope(RefCell::new(Some(held)), next.run(request)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_body_deadline_grows_with_what_arrived() {
        let t = Instant::now();
        let grace = Duration::from_secs(2);
        assert_eq!(body_deadline(t, grace, 1000, 0), t + grace);
        assert_eq!(body_deadline(t, grace, 1000, 3000), t + Duration::from_secs(5));
        // no overflow at the extremes
        assert!(body_deadline(t, Duration::MAX, 1, usize::MAX) > t);
    }

    #[test]
    fn held_bytes_are_given_back() {
        let b = BodyBudget::new(10);
        let mut h = b.reserve(4).unwrap();
        assert!(b.reserve(7).is_none());
        assert!(h.grow(6));
        assert!(!h.grow(1));
        h.shrink(3);
        assert_eq!(b.used(), 7);
        drop(h);
        assert_eq!(b.used(), 0);
    }
}
