//! `weft serve`: an HTTP server for weft checkpoints. KServe v2 / Open Inference Protocol
//! (health, metadata, infer), TorchServe-style `/ping` and `/predictions`, Triton's generate
//! extension and an OpenAI-compatible `/v1/completions` with server-sent-event streaming
//! (docs/serving.md); a TorchServe-style management API (register, set-default, traffic split,
//! unregister with draining, scaling workers) and Prometheus metrics, each on its own port.
//! Models run on tokio's blocking pool and their decode threads, each job (a forward of one
//! request or of a batch, or a decode step) on one of the version's workers ([`workers`]); the
//! async threads only move bytes.

#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

mod answer;
pub mod auth;
mod batch;
pub mod body;
mod decode;
mod detok;
pub mod error;
pub mod generation;
pub mod host;
#[cfg(test)]
mod http_tests;
pub mod json;
pub mod listen;
pub mod logprobs;
pub mod management;
pub mod metrics;
mod model;
mod openai;
pub mod protocol;
pub mod registry;
mod routes;
mod worker;
pub mod workers;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

pub use auth::Token;
pub use metrics::Metrics;
pub use registry::{LoadOptions, ModelSpec, Registry};

/// Request limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest request body, in bytes (over it: 413).
    pub body_bytes: usize,
    /// The most bytes of request bodies held at once across connections (over it: 503 with
    /// `Retry-After`); at least `body_bytes`.
    pub body_bytes_in_flight: usize,
    /// The most new tokens one generation request may ask for.
    pub max_tokens: usize,
    /// The most values one infer request's output may hold (`B x classes`, `B x T x vocab`).
    pub max_output_values: usize,
    /// How long a connection may take to send a request's headers (an idle keep-alive
    /// connection: its next request's), the longest pause inside a body, the grace before a
    /// body's rate is counted, the longest time an answer may wait on a client that does not
    /// read it, and the grace before an answer's rate is counted; past it the connection is
    /// closed (a body: 408) ([`listen`], [`body`]).
    pub read_timeout: std::time::Duration,
    /// The slowest a request body may arrive, in bytes a second on average, once
    /// `read_timeout` has passed since its head arrived (slower: 408) ([`body`]).
    pub min_body_rate: u64,
    /// The slowest a client may take an answer, in bytes a second on average while the answer
    /// waits on it, once it has waited `read_timeout` (slower: the connection is closed and the
    /// answer dropped) ([`listen::Pacing`]).
    pub min_send_rate: u64,
    /// The most connections each port holds open at once; past it new ones wait, unaccepted,
    /// until one closes ([`listen::serve`]).
    pub connections: usize,
}

/// The largest `--max-tokens`: 2^20 new tokens for one request, far past any model's use.
pub const MAX_TOKENS_LIMIT: usize = 1 << 20;

/// The longest `--read-timeout-ms`: 10 minutes.
pub const MAX_READ_TIMEOUT_MS: u64 = 600_000;

/// The largest `--min-body-rate`: 1 GiB a second.
pub const MAX_MIN_BODY_RATE: u64 = 1 << 30;

/// The largest `--min-send-rate`: 1 GiB a second.
pub const MAX_MIN_SEND_RATE: u64 = 1 << 30;

impl Default for Limits {
    /// 16 MiB bodies, 4096 new tokens, 2^24 output values (64 MiB of FP32), 30 s to send the
    /// headers, bodies and answers at 64 KiB a second at least, 1024 connections a port.
    fn default() -> Self {
        Limits {
            body_bytes: 16 << 20,
            body_bytes_in_flight: 1 << 30,
            max_tokens: 4096,
            max_output_values: 1 << 24,
            read_timeout: std::time::Duration::from_secs(30),
            min_body_rate: 64 << 10,
            min_send_rate: 64 << 10,
            connections: 1024,
        }
    }
}

/// What every request handler sees.
#[derive(Clone)]
pub struct AppState {
    pub registry: Arc<Registry>,
    pub limits: Limits,
    /// The bearer token, when one is set. The management API needs it always (and refuses
    /// everything without one).
    pub token: Option<Arc<Token>>,
    /// Whether the inference API needs the token too (the health checks never do).
    pub protect_inference: bool,
    /// The model store: the management API registers folders inside it only.
    pub store: Arc<PathBuf>,
    /// Queueing and batching of models registered through the management API without their own.
    pub load: LoadOptions,
    /// Request counters and latencies.
    pub metrics: Arc<Metrics>,
    /// The request bodies and infer answers held at once, across connections
    /// ([`Limits::body_bytes_in_flight`]).
    pub bodies: Arc<body::BodyBudget>,
}

/// The inference API's routes over `state`.
pub fn router(state: AppState) -> axum::Router {
    routes::router(state).layer(axum::middleware::from_fn(error::json_errors))
}

/// The management API's routes over `state` (all behind the token).
pub fn management_router(state: AppState) -> axum::Router {
    management::router(state).layer(axum::middleware::from_fn(error::json_errors))
}

/// `GET /metrics` over `state`.
pub fn metrics_router(state: AppState) -> axum::Router {
    axum::Router::new()
        .route("/metrics", axum::routing::get(metrics::scrape))
        .with_state(state)
        .layer(axum::middleware::from_fn(error::json_errors))
}

/// Where the server listens: the inference API, and (when given) the management API and the
/// metrics.
pub struct Listeners {
    pub inference: tokio::net::TcpListener,
    pub management: Option<tokio::net::TcpListener>,
    pub metrics: Option<tokio::net::TcpListener>,
}

/// Serves `state` on `listeners` until `shutdown` completes, then finishes the requests in
/// flight on every port.
pub async fn serve(
    listeners: Listeners,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let pacing = listen::Pacing {
        timeout: state.limits.read_timeout,
        min_rate: state.limits.min_send_rate,
    };
    let connections = state.limits.connections;
    let side = |listener: Option<tokio::net::TcpListener>, app: axum::Router, rx| async move {
        match listener {
            Some(l) => {
                let app = guard_loopback(&l, app);
                listen::serve_paced(l, app, pacing, connections, wait(rx)).await
            }
            None => Ok(()),
        }
    };
    let management = side(listeners.management, management_router(state.clone()), stopped.clone());
    let metrics = side(listeners.metrics, metrics_router(state.clone()), stopped.clone());
    let inference_app = guard_loopback(&listeners.inference, router(state));
    let inference = listen::serve_paced(listeners.inference, inference_app, pacing, connections, async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    let (a, b, c) = tokio::join!(inference, management, metrics);
    a.and(b).and(c)
}

/// `app`, answering only requests that name loopback in their `Host` when `listener` is on a
/// loopback address ([`host`]: the guard against DNS rebinding).
fn guard_loopback(listener: &tokio::net::TcpListener, app: axum::Router) -> axum::Router {
    match listener.local_addr() {
        Ok(a) if a.ip().is_loopback() => app.layer(axum::middleware::from_fn(host::loopback_only)),
        _ => app,
    }
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
}
