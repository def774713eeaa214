//! OpenAI-compatible `POST /v1/completions` (and `GET /v1/models`), in the shapes the `openai`
//! Python client reads; `"stream": true` sends `data: {chunk}` server-sent events ending with
//! `data: [DONE]`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::Event;
use axum::response::Response;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{json_response, openai_error, parse_body, ApiError};
use crate::generation::{self, GenerateParams, Piece, RequestedParams};
use crate::routes::{answered, pieces, sse};
use crate::AppState;

/// OpenAI's defaults: 16 tokens, temperature 1, top-p 1, no top-k; the seed, when absent, is
/// drawn from the clock.
const OPENAI_DEFAULTS: GenerateParams = GenerateParams {
    max_tokens: 16,
    sampling: weft_models::Sampling {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
    },
    seed: 0,
};

/// The fields of a completion request weft reads; others the client may send are ignored.
#[derive(Debug, Deserialize)]
struct CompletionRequest {
    model: String,
    prompt: Value,
    max_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    seed: Option<u64>,
    #[serde(default)]
    stream: bool,
    n: Option<u64>,
    #[serde(default)]
    echo: bool,
    stop: Option<Value>,
}

/// Seconds since the Unix epoch.
fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A fresh completion id.
fn completion_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("cmpl-{}-{}", now(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The one prompt of a request: a string, or an array holding one string.
fn prompt_text(prompt: &Value) -> Result<&str, ApiError> {
    match prompt {
        Value::String(s) => Ok(s),
        Value::Array(items) if items.len() == 1 && items[0].is_string() => Ok(items[0].as_str().unwrap_or("")),
        _ => Err(ApiError::bad_request(
            "prompt: give one string (batches of prompts and token-id prompts are not supported)",
        )),
    }
}

pub async fn completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let request: CompletionRequest = parse_body(body, state.limits.body_bytes)?;
    let (name, version) = match request.model.split_once(':') {
        Some((n, v)) => (n, Some(v)),
        None => (request.model.as_str(), None),
    };
    let admitted = state.registry.admit(name, version)?;
    let served = admitted.served.clone();
    if request.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("n: only 1 completion per request is supported"));
    }
    if request.echo {
        return Err(ApiError::bad_request("echo: not supported"));
    }
    let stop = generation::stop_sequences("stop", request.stop.as_ref())?;
    let requested = RequestedParams {
        max_tokens: request.max_tokens,
        temperature: request.temperature,
        top_k: None,
        top_p: request.top_p,
        seed: Some(request.seed.unwrap_or_else(clock_seed)),
    };
    let params = requested.checked(OPENAI_DEFAULTS, state.limits.max_tokens)?;
    let ids = generation::prompt_ids(&served, prompt_text(&request.prompt)?)?;
    let (id, created, model) = (completion_id(), now(), request.model.clone());
    let chunk = move |text: &str, finish: Value| {
        json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{ "text": text, "index": 0, "logprobs": null, "finish_reason": finish }],
        })
    };
    if !request.stream {
        let made = generation::run(admitted, ids, params, stop, arrived).await?;
        let mut answer = chunk(&made.text, json!(made.finish.reason()));
        answer["usage"] = json!({
            "prompt_tokens": made.prompt_tokens,
            "completion_tokens": made.completion_tokens,
            "total_tokens": made.prompt_tokens + made.completion_tokens,
        });
        return Ok(answered(json_response(StatusCode::OK, &answer), &served));
    }
    let rx = generation::start_stream(admitted, ids, params, stop, arrived);
    let events = pieces(rx).map(move |piece| match piece {
        Piece::Text(t) => vec![Event::default().data(chunk(&t, Value::Null).to_string())],
        Piece::Done(made) => vec![
            Event::default().data(chunk("", json!(made.finish.reason())).to_string()),
            Event::default().data("[DONE]"),
        ],
        Piece::Failed(e) => vec![
            Event::default().data(openai_error(e.status, &e.message).to_string()),
            Event::default().data("[DONE]"),
        ],
    });
    Ok(answered(sse(events), &served))
}

/// A seed from the clock, for requests that give none.
fn clock_seed() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// `GET /v1/models`: every model's name, as OpenAI lists them.
pub async fn models(State(state): State<AppState>) -> Response {
    let data: Vec<Value> = state
        .registry
        .names()
        .into_iter()
        .map(|(name, _)| json!({ "id": name, "object": "model", "created": 0, "owned_by": "weft" }))
        .collect();
    json_response(StatusCode::OK, &json!({ "object": "list", "data": data }))
}
