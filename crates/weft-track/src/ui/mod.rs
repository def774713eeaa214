//! `weft ui`: the dashboard, served over HTTP from one process (feature `ui`).
//!
//! `GET /` is one HTML page with its script inline (embedded in the binary at build time; no
//! build step, nothing fetched from elsewhere). It reads the JSON API:
//!
//! - `GET /api/experiments`: `[{name, runs, running}]`;
//! - `GET /api/runs?experiment=E&filter=EXPR&sort=KEY`: the run table as `weft runs list --json`
//!   prints it (a bad filter: 400 with the position and what was expected);
//! - `GET /api/runs/{id}`: one run as `weft runs show --json` prints it (unknown: 404);
//! - `GET /api/runs/{id}/metrics?key=K&max_points=N` (or `/api/runs/{id}/metrics/{key}`): a
//!   metric's `[step, value, time]` points, down-sampled on the server to at most `N` (default
//!   1000) by min and max per bucket; without `key`, every metric's; with `cursor`, the newest
//!   metric row's id when it was read;
//! - `GET /api/runs/{id}/events?after=CURSOR`: the run's new values as server-sent events while
//!   it runs ([`live`]);
//! - `GET /api/sweeps`: the sweeps, from their trials' tags ([`sweeps`]);
//! - `GET /api/runs/{id}/artifacts/{kind}`: the file of a run's trace, sample or event file
//!   ([`artifact`]).
//!
//! The caller's `wrap` may add routes (`weft ui` adds `GET /api/models`, the model registry);
//! the page shows their views when they answer.
//!
//! Requests share one store connection, behind a lock, taking it in turn on tokio's blocking
//! pool; each run table request first marks runs whose heartbeat stopped as killed (as
//! `weft runs` does when it opens the store).

mod artifact;
mod downsample;
pub mod json;
pub mod live;
pub mod sweeps;

use std::sync::{Arc, Mutex};

use axum::extract::rejection::PathRejection;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

pub use downsample::min_max;

use crate::filter::{sort_runs, Filter};
use crate::{Error, Store};

/// The page, embedded at build time.
const INDEX_HTML: &str = include_str!("index.html");

/// The most points a metric's series is sent with when the request does not say.
pub const DEFAULT_MAX_POINTS: usize = 1000;

/// The most points a request may ask for (`max_points` above it: 400): each point is about 40
/// bytes of JSON, and an unbounded value sent a 2-million-point series whole (a 71 MB answer,
/// 600 MB of the server's memory while it was built).
pub const MAX_MAX_POINTS: usize = 100_000;

type Shared = Arc<Mutex<Store>>;

/// The dashboard of `store` as a router, with the caller's layers added by `wrap` (`weft ui`
/// adds the loopback `Host` guard and its `/api/models`, and serves it through
/// `weft_serve::listen`, which closes connections that do not send their request head in time).
/// Once `closing` turns true (the server is shutting down), every live event stream ends within
/// [`live::POLL`]: a stream lasts as long as its run otherwise, and a graceful shutdown waits
/// for the requests in flight.
pub fn app(store: Store, closing: tokio::sync::watch::Receiver<bool>, wrap: impl FnOnce(Router) -> Router) -> Router {
    wrap(router(Arc::new(Mutex::new(store))).layer(axum::Extension(live::Closing(closing))))
}

fn router(store: Shared) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/api/experiments", get(experiments))
        .route("/api/runs", get(runs))
        .route("/api/runs/{id}", get(run))
        .route("/api/runs/{id}/metrics", get(metrics))
        .route("/api/runs/{id}/metrics/{key}", get(metric_by_path))
        .route("/api/runs/{id}/events", get(live::events))
        .route("/api/sweeps", get(sweep_list))
        .route("/api/runs/{id}/artifacts/{kind}", get(artifact::artifact))
        .method_not_allowed_fallback(|| async {
            reply(Err(Failure(
                StatusCode::METHOD_NOT_ALLOWED,
                "the dashboard's API answers GET (and HEAD) only".into(),
            )))
        })
        .fallback(|uri: axum::http::Uri| async move {
            reply(Err(Failure(
                StatusCode::NOT_FOUND,
                format!("no such page or API route: {}", crate::ui::json::short(uri.path())),
            )))
        })
        .with_state(store)
}

async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX_HTML,
    )
        .into_response()
}

/// A failed request: its status and `{"error": message}`.
struct Failure(StatusCode, String);

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match e {
            Error::UnknownRun(_) => StatusCode::NOT_FOUND,
            Error::Filter(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure(code, e.to_string())
    }
}

fn reply(result: Result<Value, Failure>) -> Response {
    json_reply(result.map_err(|Failure(code, message)| (code, message)))
}

/// The API's answer: `200` and the JSON value, or the status and `{"error": message}` (for
/// routes the caller's `wrap` adds, as `weft ui`'s `/api/models`).
pub fn json_reply(result: Result<Value, (StatusCode, String)>) -> Response {
    let (code, body) = match result {
        Ok(v) => (StatusCode::OK, v),
        Err((code, message)) => (code, json!({ "error": message })),
    };
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// Runs `f` on the store (taking its lock) on tokio's blocking pool.
async fn on_store<T: Send + 'static>(
    store: &Shared,
    f: impl FnOnce(&Store) -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || {
        let mut store = store.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        // a store read as it is (a read-only folder) is opened again when its file changed
        store.refresh()?;
        f(&store)
    })
    .await
    .unwrap_or_else(|e| Err(Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())))
}

/// Runs `f` on the store and answers with its JSON.
async fn with_store(store: Shared, f: impl FnOnce(&Store) -> Result<Value, Failure> + Send + 'static) -> Response {
    reply(on_store(&store, f).await)
}

async fn experiments(State(store): State<Shared>) -> Response {
    with_store(store, |s| {
        let all = s.experiments()?;
        Ok(all
            .into_iter()
            .map(|(name, runs, running)| json!({"name": name, "runs": runs, "running": running}))
            .collect())
    })
    .await
}

async fn runs(State(store): State<Shared>, RawQuery(q): RawQuery) -> Response {
    let q = query_pairs(q.as_deref().unwrap_or(""));
    let get = |k: &str| {
        q.iter()
            .find(|(key, v)| key == k && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    let (experiment, filter, sort) = (get("experiment"), get("filter"), get("sort"));
    with_store(store, move |s| {
        let filter = filter.as_deref().map(Filter::parse).transpose()?;
        s.mark_stale_unless_busy()?;
        let mut runs = s.list_runs(experiment.as_deref())?;
        if let Some(f) = &filter {
            runs.retain(|r| f.matches(r));
        }
        if let Some(key) = &sort {
            sort_runs(&mut runs, key);
        }
        Ok(runs.iter().map(json::summary).collect())
    })
    .await
}

async fn sweep_list(State(store): State<Shared>) -> Response {
    with_store(store, |s| Ok(s.sweeps()?.iter().map(sweeps::json).collect())).await
}

/// A request path's segments, or the error `{"error": ...}` (400) for one that does not decode
/// (a percent-escape that is not UTF-8, as `/api/runs/%ff`): axum answered such a request with a
/// plain-text body, unlike the rest of the API.
type Segments<T> = Result<UrlPath<T>, PathRejection>;

fn segments<T>(path: Segments<T>) -> Result<T, Failure> {
    path.map(|UrlPath(t)| t)
        .map_err(|e| Failure(e.status(), format!("the request's path: {}", e.body_text())))
}

fn run_id(raw: &str) -> Result<i64, Failure> {
    raw.parse()
        .map_err(|_| Failure(StatusCode::NOT_FOUND, format!("no run with id {raw:?}")))
}

async fn run(State(store): State<Shared>, path: Segments<String>) -> Response {
    let id = match segments(path) {
        Ok(id) => id,
        Err(f) => return reply(Err(f)),
    };
    with_store(store, move |s| Ok(json::detail(&s.run_detail(run_id(&id)?)?))).await
}

async fn metrics(State(store): State<Shared>, path: Segments<String>, RawQuery(q): RawQuery) -> Response {
    let id = match segments(path) {
        Ok(id) => id,
        Err(f) => return reply(Err(f)),
    };
    let q = query_pairs(q.as_deref().unwrap_or(""));
    let key = q.iter().find(|(k, _)| k == "key").map(|(_, v)| v.clone());
    series(store, id, key, &q).await
}

async fn metric_by_path(
    State(store): State<Shared>,
    path: Segments<(String, String)>,
    RawQuery(q): RawQuery,
) -> Response {
    let (id, key) = match segments(path) {
        Ok(both) => both,
        Err(f) => return reply(Err(f)),
    };
    let q = query_pairs(q.as_deref().unwrap_or(""));
    series(store, id, Some(key), &q).await
}

/// The `max_points` of a query: [`DEFAULT_MAX_POINTS`] when not given, a whole number up to
/// [`MAX_MAX_POINTS`] (below 4 counts as 4, as [`min_max`] takes it), else 400.
fn max_points(q: &[(String, String)]) -> Result<usize, Failure> {
    match q.iter().find(|(k, _)| k == "max_points") {
        None => Ok(DEFAULT_MAX_POINTS),
        Some((_, v)) => match v.parse::<usize>() {
            Ok(n) if n <= MAX_MAX_POINTS => Ok(n.max(4)),
            _ => Err(Failure(
                StatusCode::BAD_REQUEST,
                format!(
                    "max_points: expected a whole number from 0 to {MAX_MAX_POINTS} (below 4 counts as 4), found {}",
                    crate::ui::json::short(v)
                ),
            )),
        },
    }
}

/// `{"run": id, "cursor": c, "metrics": {key: {"count": n, "points": [[step, value, time], ...]}}}`,
/// one key or all, each down-sampled to `max_points`; `cursor` (read before the series) is where
/// the run's event stream takes over.
async fn series(store: Shared, id: String, key: Option<String>, q: &[(String, String)]) -> Response {
    let max_points = max_points(q);
    with_store(store, move |s| {
        let max_points = max_points?;
        let id = run_id(&id)?;
        if !s.has_run(id)? {
            return Err(Failure(StatusCode::NOT_FOUND, format!("no run with id {id}")));
        }
        let cursor = s.metric_cursor()?;
        let keys = match key {
            Some(k) => vec![k],
            None => s.metric_keys(id)?,
        };
        let mut out = serde_json::Map::new();
        for key in keys {
            let all = s.metric_series(id, &key)?;
            let points: Vec<Value> = min_max(&all, max_points, |p| p.1)
                .iter()
                .map(|(step, value, time)| json!([step, json::num(*value), time]))
                .collect();
            out.insert(key, json!({"count": all.len(), "points": points}));
        }
        Ok(json!({"run": id, "cursor": cursor, "metrics": out}))
    })
    .await
}

/// `a=1&b=x%20y` as pairs, percent-escapes and `+` decoded.
fn query_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests;
