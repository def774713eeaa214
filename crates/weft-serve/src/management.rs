//! The management API, in TorchServe's shape, on its own port and always behind the token:
//! list and describe models, register a checkpoint folder inside the model store, set the
//! default version, split traffic between versions (A/B tests), scale a version's workers, and
//! unregister a version once the requests admitted to it have finished.
//!
//! Only folders inside `--model-store` are registered: a `url` with a scheme (`http://`,
//! `file:`, ...), an absolute path or a `..` component is refused, and so is a path that
//! resolves through a link outside the store (TorchServe's open management API and URL
//! loading were CVE-2023-43654).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::Router;
use serde_json::{json, Value};

use crate::error::{echo, json_response, ApiError};
use crate::registry::{self, ModelSpec, Served};
use crate::workers::MAX_WORKERS;
use crate::{auth, AppState};

/// The management routes over `state`; every one needs the token (with no token set, every
/// one is refused).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/models", get(list).post(register))
        .route("/models/{name}", get(describe).put(split_query))
        .route(
            "/models/{name}/{version}",
            get(describe).put(put_version).delete(unregister),
        )
        .route("/models/{name}/{version}/set-default", put(set_default))
        .route_layer(middleware::from_fn_with_state(state.clone(), crate::listen::read_body))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .fallback(|| async { ApiError::not_found("no such management endpoint (see docs/serving.md)") })
        .with_state(state)
}

/// The token check of [`auth::require_token`], refusing everything when no token is set.
async fn require_token(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if state.token.is_none() {
        return ApiError::new(StatusCode::UNAUTHORIZED, "the management API has no token set").into_response();
    }
    auth::require_token(State(state), request, next).await
}

type Query2 = Result<Query<Vec<(String, String)>>, QueryRejection>;

/// The query's parameters, of a call that takes those in `known`; 400 when it cannot be read,
/// names a parameter twice (which one counts would be a guess) or names one the call does not
/// take (it would be ignored).
fn query(q: Query2, call: &str, known: &[&str]) -> Result<HashMap<String, String>, ApiError> {
    let Query(pairs) = q.map_err(|e| ApiError::bad_request(format!("the query string: {e}")))?;
    let mut params: HashMap<String, String> = HashMap::new();
    for (key, value) in pairs {
        if !known.contains(&key.as_str()) {
            let takes = match known {
                [] => "no query parameters".to_string(),
                _ => known.join(", "),
            };
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {}: {call} takes {takes}",
                echo(&key),
            )));
        }
        if let Some(first) = params.get(&key) {
            return Err(ApiError::bad_request(format!(
                "{key}: given twice in the query ({} and {}); give each parameter once",
                echo(first),
                echo(&value)
            )));
        }
        params.insert(key, value);
    }
    Ok(params)
}

/// What `POST /models` takes; `initial_workers` and `synchronous` are TorchServe's names.
const REGISTER_PARAMS: [&str; 10] = [
    "url",
    "model_name",
    "version",
    "batch_size",
    "max_batch_delay",
    "max_sequences",
    "prefill_chunk",
    "workers",
    "initial_workers",
    "synchronous",
];

/// One version as the management API describes it.
fn describe_version(s: &Served, default: &str, split: &[(String, f64)]) -> Value {
    let share = split.iter().find(|(v, _)| *v == s.version).map(|(_, w)| *w);
    json!({
        "modelName": s.name,
        "modelVersion": s.version,
        "modelUrl": s.source.display().to_string(),
        "kind": s.kind,
        "isDefault": s.version == default,
        "trafficShare": share,
        "batchSize": s.options.max_batch_size,
        "maxBatchDelay": s.options.max_batch_delay.as_millis() as u64,
        "maxSequences": s.options.max_sequences,
        "prefillChunk": s.options.prefill_chunk,
        "queueCapacity": s.options.queue,
        "queueDepth": s.queue_depth(),
        "loadSeconds": s.load_seconds,
        "workers": s.workers.count(),
        "workersBusy": s.workers.busy(),
    })
}

/// The most models one page of `GET /models?limit=N` lists.
pub const MAX_LIST_LIMIT: u64 = 1 << 20;

/// `GET /models[?limit=N][&next_page_token=T]`: every model's name and its default version's
/// path, in name order; TorchServe's pagination: with `limit`, at most N models, and when more
/// follow, `nextPageToken` to give as `next_page_token` for the next page (the last name
/// listed: the next page starts after it, so a model registered or removed in between moves
/// no other model across pages).
async fn list(State(state): State<AppState>, q: Query2) -> Result<Response, ApiError> {
    let q = query(q, "GET /models", &["limit", "next_page_token"])?;
    let limit = bounded_number(&q, "limit", 1, MAX_LIST_LIMIT)?.map_or(usize::MAX, |n| n as usize);
    let after = q.get("next_page_token");
    let names: Vec<(String, String)> = state
        .registry
        .names()
        .into_iter()
        .filter(|(name, _)| after.is_none_or(|a| name > a))
        .collect();
    let more = names.len() > limit;
    let page: Vec<(String, String)> = names.into_iter().take(limit).collect();
    // the token is the last name taken, listed or not: a model unregistered since `names()` is
    // left out of the page without ending the listing early
    let last_taken = page.last().map(|(name, _)| name.clone());
    let models: Vec<Value> = page
        .into_iter()
        .filter_map(|(name, default)| {
            let s = state.registry.get(&name, Some(&default)).ok()?;
            Some(json!({ "modelName": name, "modelUrl": s.source.display().to_string() }))
        })
        .collect();
    let mut answer = json!({ "models": models });
    if let (true, Some(last)) = (more, last_taken) {
        answer["nextPageToken"] = json!(last);
    }
    Ok(json_response(StatusCode::OK, &answer))
}

/// `GET /models/{name}` (the default version), `/models/{name}/{version}` or
/// `/models/{name}/all`: a list of version descriptions.
async fn describe(
    State(state): State<AppState>,
    Path(params): Path<HashMap<String, String>>,
    q: Query2,
) -> Result<Response, ApiError> {
    let call = match params.contains_key("version") {
        true => "GET /models/{name}/{version}",
        false => "GET /models/{name}",
    };
    // TorchServe's `customized` asks for the handler's own metadata as well; weft's models have
    // none, so the description is the same either way
    let asked = query(q, call, &["customized"])?;
    if let Some(v) = asked.get("customized") {
        if !["true", "false"].contains(&v.as_str()) {
            return Err(ApiError::bad_request(format!(
                "customized: {} is not true or false",
                echo(v)
            )));
        }
    }
    let name = params.get("name").map_or("", String::as_str);
    let view = state.registry.view(name)?;
    let wanted = params.get("version").map(String::as_str);
    let chosen: Vec<Value> = view
        .versions
        .iter()
        .filter(|s| match wanted {
            Some("all") => true,
            Some(v) => s.version == v,
            None => s.version == view.default,
        })
        .map(|s| describe_version(s, &view.default, &view.split))
        .collect();
    if chosen.is_empty() {
        state.registry.get(name, wanted)?;
    }
    Ok(json_response(StatusCode::OK, &Value::Array(chosen)))
}

/// Whether `url` starts with a URL scheme (`http:`, `file:`, `s3:`, ...).
fn has_scheme(url: &str) -> bool {
    match url.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        }
        None => false,
    }
}

/// A whole number parameter of the query in `min..=max`; 400 naming it and the bounds otherwise.
fn bounded_number(q: &HashMap<String, String>, key: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
    let Some(text) = q.get(key) else {
        return Ok(None);
    };
    let value = match text.parse::<u64>() {
        Ok(v) => Ok(v),
        // digits past u64: out of bounds as well
        Err(_) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => Ok(u64::MAX),
        Err(_) => Err(ApiError::bad_request(format!(
            "{key}: {text:?} is not a whole number from {min} to {max}"
        ))),
    }?;
    Some(value)
        .map(|v| {
            registry::bounded(key, v, min, max).map_err(|e| {
                let why = if key == "max_batch_delay" {
                    " (milliseconds; a batch's first request waits that long)"
                } else {
                    ""
                };
                ApiError::bad_request(format!("{e}{why}"))
            })
        })
        .transpose()
}

/// `POST /models?url=PATH&model_name=N[&version=V][&batch_size=B][&max_batch_delay=MS]...`
/// ([`REGISTER_PARAMS`]): loads the checkpoint folder PATH (relative to the model store) off the
/// async threads and serves it as model N version V (default 1). Requests to other models go on
/// meanwhile.
async fn register(State(state): State<AppState>, q: Query2) -> Result<Response, ApiError> {
    let q = query(q, "POST /models", &REGISTER_PARAMS)?;
    // weft loads the model before it answers, always: TorchServe's synchronous=true
    if let Some(sync) = q.get("synchronous").filter(|v| !v.eq_ignore_ascii_case("true")) {
        return Err(ApiError::bad_request(format!(
            "synchronous={}: registration answers once the model is loaded (synchronous=true), always",
            echo(sync)
        )));
    }
    let url = q
        .get("url")
        .ok_or_else(|| ApiError::bad_request("url: give the checkpoint folder's path inside the model store"))?;
    if has_scheme(url) {
        return Err(ApiError::bad_request(format!(
            "url {url:?}: only folders inside the model store are registered, not URLs"
        )));
    }
    if url.is_empty() {
        return Err(ApiError::bad_request(
            "url: empty; give the checkpoint folder's path inside the model store",
        ));
    }
    let name = q
        .get("model_name")
        .ok_or_else(|| ApiError::bad_request("model_name: give the model's name"))?;
    let version = q.get("version").map_or(registry::DEFAULT_VERSION, String::as_str);
    // each parameter checked on its own, so that a refusal names the one at fault
    registry::check_name(name).map_err(|why| ApiError::bad_request(format!("model_name {} {why}", echo(name))))?;
    registry::check_version(version)
        .map_err(|why| ApiError::bad_request(format!("version {} {why}", echo(version))))?;
    let spec = ModelSpec {
        name: name.clone(),
        path: url.into(),
        version: version.to_string(),
    };
    let mut options = state.load;
    if let Some(b) = bounded_number(&q, "batch_size", 1, registry::MAX_BATCH_SIZE as u64)? {
        options.max_batch_size = b as usize;
    }
    if let Some(ms) = bounded_number(&q, "max_batch_delay", 0, registry::MAX_BATCH_DELAY_MS)? {
        options.max_batch_delay = Duration::from_millis(ms);
    }
    if let Some(n) = bounded_number(&q, "max_sequences", 1, registry::MAX_SEQUENCES as u64)? {
        options.max_sequences = n as usize;
    }
    if let Some(n) = bounded_number(&q, "prefill_chunk", 0, registry::MAX_PREFILL_CHUNK as u64)? {
        options.prefill_chunk = n as usize;
    }
    match (q.contains_key("workers"), q.contains_key("initial_workers")) {
        (true, true) => {
            return Err(ApiError::bad_request(
                "workers and initial_workers: give one of them (initial_workers is TorchServe's name for workers)",
            ))
        }
        (true, false) => options.workers = workers_param(&q, "workers")?,
        (false, true) => options.workers = workers_param(&q, "initial_workers")?,
        (false, false) => {}
    }
    registry::resolve_in_store(&state.store, &spec.path).map_err(|e| {
        let status = if e.contains("relative to the model store") || e.contains("outside the model store") {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::NOT_FOUND
        };
        ApiError::new(status, e)
    })?;
    if state.registry.get(&spec.name, Some(&spec.version)).is_ok() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("model {} version {} is already served", spec.name, spec.version),
        ));
    }
    let store = state.store.clone();
    let spec2 = spec.clone();
    let loaded = tokio::task::spawn_blocking(move || registry::load(&store, &spec2, options))
        .await
        .map_err(|e| ApiError::internal(format!("loading failed: {e}")))?
        .map_err(ApiError::bad_request)?;
    state.registry.add(loaded)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({ "status": format!("Model \"{}\" Version: {} registered with {} initial workers", spec.name, spec.version, options.workers) }),
    ))
}

/// `PUT /models/{name}/{version}/set-default`.
async fn set_default(
    State(state): State<AppState>,
    Path((name, version)): Path<(String, String)>,
    q: Query2,
) -> Result<Response, ApiError> {
    query(q, "PUT /models/{name}/{version}/set-default", &[])?;
    state.registry.set_default(&name, &version)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({ "status": format!("Default version successfully updated for model \"{name}\" to \"{version}\"") }),
    ))
}

/// `DELETE /models/{name}/{version}`: no request is admitted to the version after this; the
/// answer comes once those admitted before have finished.
async fn unregister(
    State(state): State<AppState>,
    Path((name, version)): Path<(String, String)>,
    q: Query2,
) -> Result<Response, ApiError> {
    query(q, "DELETE /models/{name}/{version}", &[])?;
    let served = state.registry.remove(&name, &version)?;
    registry::drain(&served).await;
    Ok(json_response(
        StatusCode::OK,
        &json!({ "status": format!("Model \"{name}\" version {version} unregistered") }),
    ))
}

/// A split `1:0.9,2:0.1` as `(version, weight)` pairs.
fn parse_split(text: &str) -> Result<Vec<(String, f64)>, ApiError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|part| {
            let (v, w) = part.rsplit_once(':').ok_or_else(|| {
                ApiError::bad_request(format!(
                    "split: {part:?} is not VERSION:WEIGHT (e.g. split=1:0.9,2:0.1)"
                ))
            })?;
            let w: f64 = w.parse().map_err(|_| {
                ApiError::bad_request(format!("split: the weight {w:?} of version {v:?} is not a number"))
            })?;
            Ok((v.to_string(), w))
        })
        .collect()
}

/// Sets `name`'s split and answers with the shares now in force.
fn apply_split(state: &AppState, name: &str, weights: &[(String, f64)]) -> Result<Response, ApiError> {
    state.registry.set_split(name, weights)?;
    let view = state.registry.view(name)?;
    let shares: BTreeMap<String, f64> = view.split.into_iter().collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({ "modelName": name, "defaultVersion": view.default, "traffic": shares }),
    ))
}

/// `key=N` (`workers`, `initial_workers`) of the query: a whole number in `1..=MAX_WORKERS`;
/// 400 naming the limit.
fn workers_param(q: &HashMap<String, String>, key: &str) -> Result<usize, ApiError> {
    let text = q.get(key).map_or("", String::as_str);
    match text.parse::<usize>() {
        Ok(n) if (1..=MAX_WORKERS).contains(&n) => Ok(n),
        _ => Err(ApiError::bad_request(format!(
            "{key}: {} is not a whole number from 1 to {MAX_WORKERS}",
            echo(text)
        ))),
    }
}

/// `PUT /models/{name}[/{version}]?workers=N`: sets the version's workers (the default
/// version's when none is named) and answers once at most N are busy: a stopped worker ends
/// after its current job, and no request fails.
async fn scale(state: &AppState, name: &str, version: Option<&str>, n: usize) -> Result<Response, ApiError> {
    let served = state.registry.get(name, version)?;
    let before = served.workers.scale(n);
    served.workers.drained().await;
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "status": format!(
                "Model \"{name}\" version {}: workers scaled from {before} to {n}",
                served.version
            ),
            "modelName": name,
            "modelVersion": served.version,
            "workers": n,
        }),
    ))
}

/// `PUT /models/{name}?split=1:0.9,2:0.1` (an empty split clears it) or
/// `PUT /models/{name}?workers=N` (the default version's workers).
async fn split_query(State(state): State<AppState>, Path(name): Path<String>, q: Query2) -> Result<Response, ApiError> {
    let q = query(q, "PUT /models/{name}", &["split", "workers"])?;
    if q.contains_key("workers") && q.contains_key("split") {
        return Err(ApiError::bad_request(
            "workers and split: give one of them per call (the split is not applied with workers)",
        ));
    }
    if q.contains_key("workers") {
        return scale(&state, &name, None, workers_param(&q, "workers")?).await;
    }
    let text = q
        .get("split")
        .ok_or_else(|| ApiError::bad_request("give split=VERSION:WEIGHT,... or workers=N"))?;
    apply_split(&state, &name, &parse_split(text)?)
}

/// `PUT /models/{name}/traffic` with a JSON body `{"1": 90, "2": 10}` (weights of versions), or
/// `PUT /models/{name}/{version}?workers=N`.
async fn put_version(
    State(state): State<AppState>,
    Path((name, version)): Path<(String, String)>,
    q: Query2,
    body: Bytes,
) -> Result<Response, ApiError> {
    let q = query(q, "PUT /models/{name}/{version}", &["workers"])?;
    if q.contains_key("workers") {
        return scale(&state, &name, Some(&version), workers_param(&q, "workers")?).await;
    }
    if version != "traffic" {
        return Err(ApiError::bad_request(
            "PUT /models/{name}/{version} takes workers=N; use /set-default or PUT /models/{name}/traffic",
        ));
    }
    let Weights(weights) = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body must be a JSON object of version: weight, e.g. {{\"1\": 90, \"2\": 10}}: {e}"
        ))
    })?;
    apply_split(&state, &name, &weights)
}

/// A JSON object of version: weight, in its order, a repeated version kept (and refused by
/// [`registry::Registry::set_split`]) rather than overwritten as a map would.
struct Weights(Vec<(String, f64)>);

impl<'de> serde::Deserialize<'de> for Weights {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Weights;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of version: weight")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Weights, A::Error> {
                let mut all = Vec::new();
                while let Some(pair) = map.next_entry::<String, f64>()? {
                    all.push(pair);
                }
                Ok(Weights(all))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// A fresh random token (64 hex digits from the system's random source).
pub fn generate_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes `token` to a new file at `path` readable and writable by its owner only (0600),
/// replacing whatever was there (a link is replaced, not followed).
pub fn write_token_file(path: &std::path::Path, token: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(f, "{token}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_and_splits_parse() {
        for url in ["http://x/m.mar", "file:///etc", "s3://b/k", "C:m"] {
            assert!(has_scheme(url), "{url}");
        }
        for path in ["mlp", "runs/a/ckpt", "./m", "a:b/c"] {
            assert_eq!(has_scheme(path), path == "a:b/c", "{path}");
        }
        assert_eq!(
            parse_split("1:0.9,2:0.1").unwrap(),
            vec![("1".to_string(), 0.9), ("2".to_string(), 0.1)]
        );
        assert!(parse_split("1=0.9").is_err());
        assert!(parse_split("1:x").is_err());
        assert!(parse_split("").unwrap().is_empty());
    }

    #[test]
    fn a_token_file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("weft-serve-token-test-{}", std::process::id()));
        let t = generate_token().unwrap();
        assert_eq!(t.len(), 64);
        write_token_file(&path, &t).unwrap();
        write_token_file(&path, &t).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), t);
        let _ = std::fs::remove_file(&path);
    }
}
