//! `weft serve`: an HTTP server for weft checkpoints. KServe v2 / Open Inference Protocol
//! (health, metadata, infer), TorchServe-style `/ping` and `/predictions`, Triton's generate
//! extension and an OpenAI-compatible `/v1/completions` with server-sent-event streaming
//! (docs/serving.md). Models run on tokio's blocking pool, one job per model at a time; the
//! async threads only move bytes.

#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod auth;
pub mod error;
pub mod generation;
mod openai;
pub mod protocol;
pub mod registry;
mod routes;
mod worker;

use std::future::Future;
use std::sync::Arc;

pub use auth::Token;
pub use registry::{ModelSpec, Registry};

/// Request limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest request body, in bytes (over it: 413).
    pub body_bytes: usize,
    /// The most new tokens one generation request may ask for.
    pub max_tokens: usize,
    /// The most values one infer request's output may hold (`B x classes`, `B x T x vocab`).
    pub max_output_values: usize,
    /// Requests each model admits at once, running or waiting (over it: 503).
    pub queue: usize,
}

impl Default for Limits {
    /// 16 MiB bodies, 4096 new tokens, 2^24 output values (64 MiB of FP32), 64 queued requests.
    fn default() -> Self {
        Limits {
            body_bytes: 16 << 20,
            max_tokens: 4096,
            max_output_values: 1 << 24,
            queue: 64,
        }
    }
}

/// What every request handler sees.
#[derive(Clone)]
pub struct AppState {
    pub registry: Arc<Registry>,
    pub limits: Limits,
    /// The bearer token, when one is set.
    pub token: Option<Arc<Token>>,
    /// Whether the inference API needs the token too (the health checks never do).
    pub protect_inference: bool,
}

/// The server's routes over `state`.
pub fn router(state: AppState) -> axum::Router {
    routes::router(state)
}

/// Serves `state` on `listener` until `shutdown` completes, then finishes the requests in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
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
