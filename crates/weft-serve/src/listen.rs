//! Connections and request bodies under time limits: every port is served by hyper's HTTP/1
//! server with a header-read timeout (`axum::serve` sets none: a client that sends half a
//! request line, or opens a connection and sends nothing, would hold it, and its file
//! descriptor, forever), and request bodies are read before the handlers with the body limit
//! (413; from `Content-Length` at once when the client waits for `100 Continue`) and a limit
//! on each pause inside the body (408), and all bodies held at once (being read or handled) under
//! one budget across connections ([`BodyBudget`]; past it 503), so that many clients sending
//! bodies at the limit cannot hold more memory than the budget. Each port holds at most
//! `max_connections` connections open at once; past that, new ones wait in the kernel's backlog,
//! unaccepted, until one closes, so clients that open connections without end cannot take
//! the file descriptors the server needs for its own files.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::StreamExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::error::{openai_response, ApiError};
use crate::AppState;

/// The bytes of request bodies the server holds at once (being read, or in a request being
/// handled), across all connections, and their limit.
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

    /// Takes `n` more bytes when they fit.
    fn take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                u.checked_add(n).filter(|&t| t <= self.limit)
            })
            .is_ok()
    }
}

/// The bytes one request holds of a [`BodyBudget`], given back when it is dropped.
struct Held {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

/// How often at most the accept loop says that a port is at its connection limit.
const FULL_NOTICE_EVERY: Duration = Duration::from_secs(60);

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting and waits for
/// the connections' requests in flight (idle connections close at once). A connection that has
/// not sent a whole request head within `header_timeout` of its start (or, kept alive, of its
/// last response) is closed. At most `max_connections` (at least 1) are open at once; the next
/// is accepted when one closes, and reaching the limit is logged (at most once a minute).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    max_connections: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections.max(1)));
    let mut noticed: Option<std::time::Instant> = None;
    let (signal_tx, signal_rx) = watch::channel(());
    tokio::spawn(async move {
        shutdown.await;
        drop(signal_rx);
    });
    // each connection's task holds a receiver; all dropped: every connection has ended
    let (close_tx, close_rx) = watch::channel(());
    loop {
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if noticed.is_none_or(|t| t.elapsed() >= FULL_NOTICE_EVERY) {
                    noticed = Some(std::time::Instant::now());
                    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
                    weft_core::errln!(
                        "weft: {addr}: {max_connections} connections open, the most allowed (--max-connections); \
                         new ones wait until one closes"
                    );
                }
                tokio::select! {
                    slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
                    _ = signal_tx.closed() => break,
                }
            }
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // out of file descriptors and the like: wait a little rather than spin
                    if !is_connection_error(&e) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            _ = signal_tx.closed() => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let (signal_tx, close_rx) = (signal_tx.clone(), close_rx.clone());
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = signal_tx.closed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(close_rx);
            drop(slot);
        });
    }
    drop(close_rx);
    drop(listener);
    close_tx.closed().await;
    Ok(())
}

/// Errors of one connection that the accept loop passes over at once.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// The middleware that reads a request's body before its handler: 413 when what arrives is over
/// `state.limits.body_bytes` (at once, from the `Content-Length`, for a client that sent
/// `Expect: 100-continue` and waits before sending the body), 408 when the client
/// pauses longer than `state.limits.read_timeout` inside it. The handler gets the whole body.
/// On `/v1/*` the refusals take OpenAI's shape.
pub async fn read_body(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let limit = state.limits.body_bytes;
    let openai = request.uri().path().starts_with("/v1/");
    let refuse = |status: StatusCode, message: String| {
        if openai {
            openai_response(status, &message)
        } else {
            ApiError::new(status, message).into_response()
        }
    };
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
    let (parts, body) = request.into_parts();
    let mut chunks = body.into_data_stream();
    let mut held = Held {
        budget: state.bodies.clone(),
        bytes: 0,
    };
    // reserved as it arrives past 1 MiB: a client sending only headers reserves little
    let mut bytes = Vec::with_capacity(capacity.min(1 << 20));
    loop {
        match tokio::time::timeout(state.limits.read_timeout, chunks.next()).await {
            Err(_) => {
                return refuse(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body stopped arriving for {} ms",
                        state.limits.read_timeout.as_millis()
                    ),
                )
            }
            Ok(None) => break,
            Ok(Some(Ok(chunk))) => {
                if bytes.len() + chunk.len() > limit {
                    return refuse(StatusCode::PAYLOAD_TOO_LARGE, too_large());
                }
                if !held.budget.take(chunk.len()) {
                    let mut busy = refuse(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "the server holds {} bytes of request bodies already (--max-body-bytes-in-flight); retry later",
                            held.budget.limit
                        ),
                    );
                    busy.headers_mut()
                        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
                    return busy;
                }
                held.bytes += chunk.len();
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
    let response = next
        .run(Request::from_parts(parts, Body::from(Bytes::from(bytes))))
        .await;
    // the handler has let go of the body (a streamed response keeps what it made of it)
    drop(held);
    response
}
