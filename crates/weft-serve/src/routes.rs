//! The inference API's routes: KServe v2 (health, metadata, readiness, infer), TorchServe's
//! `/ping` and `/predictions`, Triton's generate extension and OpenAI's `/v1/completions`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Router};
use futures_util::stream::{self, Stream, StreamExt};
use serde::Deserialize;
use serde_json::json;

use crate::detok::MAX_STOPS;
use crate::error::{json_response, openai_response, parse_body, parse_json, ApiError, JsonError};
use crate::generation::{self, Constraints, GenerateParams, Piece, RequestedParams};
use crate::json::{Shallow, StringOrList, TensorData};
use crate::metrics::Answered;
use crate::protocol::{self, InferRequest, RequestInput};
use crate::registry::{Admitted, Served};
use crate::{answer, auth, error, metrics, openai, worker, AppState};

/// Every route; with `state.protect_inference`, all but the health checks need the token.
/// Errors on `/v1/*` take OpenAI's shape; every route is counted in the metrics.
pub fn router(state: AppState) -> Router {
    let mut v1 = Router::new()
        .route("/v1/completions", post(openai::completions))
        .route("/v1/models", get(openai::models));
    let mut inference = Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/models/{name}", get(model_metadata))
        .route("/v2/models/{name}/versions/{version}", get(model_metadata))
        .route("/v2/models/{name}/ready", get(model_ready))
        .route("/v2/models/{name}/versions/{version}/ready", get(model_ready))
        .route("/v2/models/{name}/infer", post(infer))
        .route("/v2/models/{name}/versions/{version}/infer", post(infer))
        .route("/v2/models/{name}/generate", post(generate))
        .route("/v2/models/{name}/versions/{version}/generate", post(generate))
        .route("/v2/models/{name}/generate_stream", post(generate_stream))
        .route(
            "/v2/models/{name}/versions/{version}/generate_stream",
            post(generate_stream),
        )
        .route("/predictions/{name}", post(predictions))
        .route("/predictions/{name}/{version}", post(predictions));
    // bodies are read (under the limit and the read timeout) after the token check
    let read_body = middleware::from_fn_with_state(state.clone(), crate::listen::read_body);
    inference = inference.route_layer(read_body.clone());
    v1 = v1.route_layer(read_body);
    if state.protect_inference {
        let auth = middleware::from_fn_with_state(state.clone(), auth::require_token);
        inference = inference.route_layer(auth.clone());
        v1 = v1.route_layer(auth);
    }
    let v1 = v1.route_layer(middleware::from_fn(error::openai_errors));
    Router::new()
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/ping", get(ping))
        .merge(inference)
        .merge(v1)
        .route_layer(middleware::from_fn_with_state(state.clone(), metrics::track))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.limits.body_bytes))
        .with_state(state)
}

type Params = Path<HashMap<String, String>>;

/// `(name, version)` of a model route's path.
fn target(params: &HashMap<String, String>) -> (&str, Option<&str>) {
    let name = params.get("name").map_or("", String::as_str);
    (name, params.get("version").map(String::as_str))
}

async fn not_found(uri: Uri) -> Response {
    let message = "no such endpoint (see docs/serving.md)";
    if uri.path().starts_with("/v1/") {
        return openai_response(StatusCode::NOT_FOUND, message);
    }
    ApiError::not_found(message).into_response()
}

/// `response` marked with the version that answered (the metrics' labels and the
/// `Weft-Model-Version` header).
pub(crate) fn answered(mut response: Response, served: &Served) -> Response {
    response.extensions_mut().insert(Answered {
        model: served.name.clone(),
        version: served.version.clone(),
    });
    response
}

async fn live() -> Response {
    json_response(StatusCode::OK, &json!({ "live": true }))
}

async fn ready(State(state): State<AppState>) -> Response {
    // models load before the server listens: once it answers, every model that loaded is
    // ready; one asked for at start that failed keeps the server unready until it is registered
    let models = state.registry.names().len();
    let failed = state.registry.failures();
    if failed.is_empty() {
        return json_response(StatusCode::OK, &json!({ "ready": true, "models": models }));
    }
    // the cause (paths, checksums) goes to the server's log only: the health checks need no token
    let failed: Vec<serde_json::Value> = failed
        .iter()
        .map(
            |f| json!({ "model": f.name, "version": f.version, "error": "failed to load (the server's log says why)" }),
        )
        .collect();
    json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &json!({ "ready": false, "models": models, "failed": failed }),
    )
}

async fn ping() -> Response {
    json_response(StatusCode::OK, &json!({ "status": "Healthy" }))
}

async fn server_metadata() -> Response {
    json_response(
        StatusCode::OK,
        &json!({ "name": "weft", "version": env!("CARGO_PKG_VERSION"), "extensions": ["generate"] }),
    )
}

async fn model_metadata(State(state): State<AppState>, Path(params): Params) -> Result<Response, ApiError> {
    let (name, version) = target(&params);
    let served = state.registry.get(name, version)?;
    let (inputs, outputs) = protocol::metadata(served.signature);
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "name": served.name,
            "versions": state.registry.versions(name),
            "platform": format!("weft_{}", served.kind),
            "inputs": inputs,
            "outputs": outputs,
        }),
    ))
}

async fn model_ready(State(state): State<AppState>, Path(params): Params) -> Result<Response, ApiError> {
    let (name, version) = target(&params);
    let served = state.registry.get(name, version)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({ "name": served.name, "version": served.version, "ready": true }),
    ))
}

/// The header of Triton's binary data extension: the body is this many bytes of JSON, then
/// the inputs' binary data.
const BINARY_HEADER: &str = "inference-header-content-length";

async fn infer(
    State(state): State<AppState>,
    Path(params): Params,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    if headers.contains_key(BINARY_HEADER) {
        // the JSON would be refused for the binary data after it, naming neither
        return Err(ApiError::bad_request(
            "Inference-Header-Content-Length: binary tensor data is not supported; weft serve reads tensor data as \
             JSON only (give the values in each input's `data`)",
        ));
    }
    let (name, version) = target(&params);
    let admitted = state.registry.admit(name, version)?;
    let served = admitted.served.clone();
    let request: InferRequest = parse_body(body, state.limits.body_bytes)?;
    request.refuse_binary_data()?;
    let [input] = request.inputs.as_slice() else {
        return Err(ApiError::bad_request(format!(
            "inputs: {} tensors given; model {name} takes one",
            request.inputs.len()
        )));
    };
    for wanted in request.outputs.iter().flatten() {
        if wanted.name != protocol::LOGITS {
            return Err(ApiError::bad_request(format!(
                "unknown output {:?}: model {name} gives one output named {:?}",
                wanted.name,
                protocol::LOGITS
            )));
        }
    }
    let tensor = protocol::input_tensor(&served, input, state.limits.max_output_values)?;
    // held from before the forward until the answer is sent
    let held = answer::reserve(&state.bodies, answer::output_values(served.signature, tensor.shape()))?;
    let output = worker::forward(admitted, tensor).await?;
    Ok(answered(
        answer::infer(&served, request.id.as_deref(), output, held),
        &served,
    ))
}

/// TorchServe-style prediction: the body is the model's one input as nested JSON arrays (rows
/// of features, images `[C][H][W]`, or rows of token ids); the answer is the logits, nested
/// likewise.
async fn predictions(
    State(state): State<AppState>,
    Path(params): Params,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (name, version) = target(&params);
    let admitted = state.registry.admit(name, version)?;
    let served = admitted.served.clone();
    let bytes = body.map_err(|r| ApiError::new(r.status(), format!("the request body: {r}")))?;
    let data: TensorData = parse_json(&bytes).map_err(|e| match e {
        JsonError::Syntax(e) => ApiError::bad_request(format!("the request body is not valid JSON: {e}")),
        JsonError::Data { path, message } => ApiError::bad_request(format!("the request body at {path}: {message}")),
    })?;
    // parsed: its text is not held through the forward
    drop(bytes);
    let shape = (data.nesting.clone())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ApiError::bad_request("the body must be a non-empty rectangular nested JSON array"))?;
    let (inputs, _) = protocol::metadata(served.signature);
    let input = RequestInput {
        name: inputs[0].name.to_string(),
        shape: shape.iter().map(|&d| d as i64).collect(),
        datatype: inputs[0].datatype.to_string(),
        parameters: None,
        data,
    };
    let tensor = protocol::input_tensor(&served, &input, state.limits.max_output_values)?;
    let held = answer::reserve(&state.bodies, answer::output_values(served.signature, tensor.shape()))?;
    let output = worker::forward(admitted, tensor).await?;
    Ok(answered(answer::nested(output, held), &served))
}

/// Triton's generate extension request: `id` (echoed in the answer), `text_input` and
/// `parameters`. Triton hands other top-level fields to the model as its inputs, which is where
/// TensorRT-LLM's models take `max_tokens`, `temperature`, `stop_words`, `end_id` and the like:
/// those that [`GenerateParameters`] names are taken at the top level too (each in one place
/// only). Any other field is refused (400 naming it) rather than ignored.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GenerateRequest {
    /// The client's id of the request, given back in the answer (and each event of a stream).
    id: Option<String>,
    text_input: String,
    parameters: Option<GenerateParameters>,
    max_tokens: Option<u64>,
    temperature: Option<f64>,
    top_k: Option<u64>,
    top_p: Option<f64>,
    seed: Option<u64>,
    stop: Option<StringOrList>,
    stream: Option<bool>,
    stop_words: Option<StringOrList>,
    bad_words: Option<StringOrList>,
    end_id: Option<Shallow>,
    pad_id: Option<Shallow>,
    ignore_eos: Option<bool>,
}

/// Which parameters a generate request gave at the top level rather than in `parameters`, to
/// name each as the client wrote it.
#[derive(Debug, Default)]
struct Given {
    top: Vec<&'static str>,
}

impl Given {
    /// `key` as the request gave it: `stop` at the top level, else `parameters.stop`.
    fn name(&self, key: &'static str) -> String {
        match self.top.contains(&key) {
            true => key.to_string(),
            false => format!("parameters.{key}"),
        }
    }
}

impl GenerateRequest {
    /// The parameters, those given at the top level moved in, and which those were; a key given
    /// in both places is a 400 naming it.
    fn merged_parameters(&mut self) -> Result<(GenerateParameters, Given), ApiError> {
        fn one<T>(
            given: &mut Given,
            key: &'static str,
            top: Option<T>,
            inner: Option<T>,
        ) -> Result<Option<T>, ApiError> {
            match (top, inner) {
                (Some(_), Some(_)) => Err(ApiError::bad_request(format!(
                    "{key} is given both at the top level and in parameters: give it once"
                ))),
                (Some(top), None) => {
                    given.top.push(key);
                    Ok(Some(top))
                }
                (None, inner) => Ok(inner),
            }
        }
        let p = self.parameters.take().unwrap_or_default();
        let g = &mut Given::default();
        let merged = GenerateParameters {
            max_tokens: one(g, "max_tokens", self.max_tokens.take(), p.max_tokens)?,
            temperature: one(g, "temperature", self.temperature.take(), p.temperature)?,
            top_k: one(g, "top_k", self.top_k.take(), p.top_k)?,
            top_p: one(g, "top_p", self.top_p.take(), p.top_p)?,
            seed: one(g, "seed", self.seed.take(), p.seed)?,
            stop: one(g, "stop", self.stop.take(), p.stop)?,
            stream: one(g, "stream", self.stream.take(), p.stream)?,
            stop_words: one(g, "stop_words", self.stop_words.take(), p.stop_words)?,
            bad_words: one(g, "bad_words", self.bad_words.take(), p.bad_words)?,
            end_id: one(g, "end_id", self.end_id.take(), p.end_id)?,
            pad_id: one(g, "pad_id", self.pad_id.take(), p.pad_id)?,
            ignore_eos: one(g, "ignore_eos", self.ignore_eos.take(), p.ignore_eos)?,
        };
        Ok((merged, std::mem::take(g)))
    }
}

/// `parameters` of a generate request. Any other parameter is refused (400 naming it and
/// listing these): one weft does not know (`max_new_tokens`) would be ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GenerateParameters {
    max_tokens: Option<u64>,
    temperature: Option<f64>,
    top_k: Option<u64>,
    top_p: Option<f64>,
    seed: Option<u64>,
    /// Stop sequences: a string or an array of at most 4 (checked by
    /// [`generation::stop_sequences`]).
    stop: Option<StringOrList>,
    /// Whether to stream (vLLM's Triton backend takes it): the endpoint decides, so it is taken
    /// when it agrees with it (`false` on `generate`, `true` on `generate_stream`), else 400.
    stream: Option<bool>,
    /// TensorRT-LLM's stop words: a string or an array of at most 4 (`""` is none), joined
    /// with `stop` ([`generation::joined_stops`]).
    stop_words: Option<StringOrList>,
    /// TensorRT-LLM's bad words: a string or an array of at most
    /// [`generation::MAX_BAD_WORDS`] (`""` is none), never generated.
    bad_words: Option<StringOrList>,
    /// TensorRT-LLM's end token: ends the generation when drawn, not part of the text.
    end_id: Option<Shallow>,
    /// TensorRT-LLM's padding token: checked (a token id), no effect on one sequence's answer.
    pad_id: Option<Shallow>,
    /// Generate past the model's end-of-sequence tokens (vLLM's name; false: generation ends
    /// at one, as `weft generate` does). With `end_id`, a 400: the two contradict.
    ignore_eos: Option<bool>,
}

/// Defaults of the generate extension: `weft generate`'s (200 tokens, temperature 0.8, top-k
/// 40, top-p off, seed 1337), so that the same request gives the same text.
const TRITON_DEFAULTS: GenerateParams = GenerateParams {
    max_tokens: 200,
    sampling: weft_models::Sampling {
        temperature: 0.8,
        top_k: 40,
        top_p: 1.0,
    },
    seed: 1337,
    logprobs: None,
};

/// What a generate request asks for.
struct GenerateAsk {
    admitted: Admitted,
    /// The prompt's token ids.
    ids: Vec<i64>,
    params: GenerateParams,
    /// Its stop sequences, bad words and end token.
    constraints: Constraints,
    /// The client's id of the request, to give back.
    id: Option<String>,
}

/// A generate answer's JSON (or a stream event's) with `text` as `text_output`, and the
/// request's `id` when it gave one.
fn generated(served: &Served, id: Option<&str>, text: &str) -> serde_json::Value {
    let mut answer = json!({ "model_name": served.name, "model_version": served.version, "text_output": text });
    if let Some(id) = id {
        answer["id"] = json!(id);
    }
    answer
}

/// The model, prompt ids, parameters, stop sequences, bad words and end token of a generate
/// request, to `generate` or (`streaming`) `generate_stream`.
fn generate_request(
    state: &AppState,
    params: &HashMap<String, String>,
    body: Result<Bytes, BytesRejection>,
    streaming: bool,
) -> Result<GenerateAsk, ApiError> {
    let (name, version) = target(params);
    let admitted = state.registry.admit(name, version)?;
    let mut request: GenerateRequest = parse_body(body, state.limits.body_bytes)?;
    let (p, given) = request.merged_parameters()?;
    match p.stream {
        Some(true) if !streaming => {
            return Err(ApiError::bad_request(format!(
                "{}: true asks for a stream; POST .../generate_stream streams, .../generate answers once",
                given.name("stream")
            )))
        }
        Some(false) if streaming => {
            return Err(ApiError::bad_request(format!(
                "{}: false asks for one answer; POST .../generate answers once, .../generate_stream streams",
                given.name("stream")
            )))
        }
        _ => {}
    }
    let requested = RequestedParams {
        max_tokens: p.max_tokens,
        temperature: p.temperature,
        top_k: p.top_k,
        top_p: p.top_p,
        seed: p.seed,
    };
    let gen = requested.checked(TRITON_DEFAULTS, state.limits.max_tokens)?;
    let (stop_field, words_field) = (given.name("stop"), given.name("stop_words"));
    let stop = generation::stop_sequences(&stop_field, p.stop.as_ref())?;
    let stop_words = generation::word_list(&words_field, p.stop_words.as_ref(), MAX_STOPS)?;
    let stop = generation::joined_stops(stop, &stop_field, stop_words, &words_field)?;
    let bad_field = given.name("bad_words");
    let bad_words = generation::word_list(&bad_field, p.bad_words.as_ref(), generation::MAX_BAD_WORDS)?;
    let served = &admitted.served;
    let ids = generation::prompt_ids(served, &request.text_input)?;
    let bad_words = generation::bad_word_ids(served, &bad_field, &bad_words)?;
    let end_id = generation::token_id(served, &given.name("end_id"), p.end_id.as_ref())?;
    let end_ids = match (end_id, p.ignore_eos) {
        (Some(_), Some(true)) => {
            return Err(ApiError::bad_request(format!(
                "{} and {}: true contradict each other; give one",
                given.name("end_id"),
                given.name("ignore_eos")
            )))
        }
        (Some(id), _) => vec![id],
        (None, Some(true)) => Vec::new(),
        (None, _) => served.eos.clone(),
    };
    // one sequence per answer: nothing is padded
    generation::token_id(served, &given.name("pad_id"), p.pad_id.as_ref())?;
    Ok(GenerateAsk {
        admitted,
        ids,
        params: gen,
        constraints: Constraints {
            stop,
            bad_words,
            end_ids,
        },
        id: request.id,
    })
}

async fn generate(
    State(state): State<AppState>,
    Path(params): Params,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let ask = generate_request(&state, &params, body, false)?;
    let served = ask.admitted.served.clone();
    let made = generation::run(ask.admitted, ask.ids, ask.params, ask.constraints, arrived).await?;
    let answer = generated(&served, ask.id.as_deref(), &made.text);
    Ok(answered(json_response(StatusCode::OK, &answer), &served))
}

async fn generate_stream(
    State(state): State<AppState>,
    Path(params): Params,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let ask = generate_request(&state, &params, body, true)?;
    let served = ask.admitted.served.clone();
    let rx = generation::start_stream(ask.admitted, ask.ids, ask.params, ask.constraints, arrived);
    let (version, id) = (served.clone(), ask.id);
    let events = pieces(rx).map(move |piece| {
        let value = match piece {
            Piece::Text(t, _) => generated(&version, id.as_deref(), &t),
            Piece::Failed(e) => json!({ "error": e.message }),
            Piece::Done(_) => return Vec::new(),
        };
        vec![Event::default().data(value.to_string())]
    });
    Ok(answered(sse(events), &served))
}

/// The pieces of a streamed generation; a channel that closed without an end gives `Failed`.
pub(crate) fn pieces(rx: tokio::sync::mpsc::UnboundedReceiver<Piece>) -> impl Stream<Item = Piece> {
    stream::unfold(Some(rx), |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(p @ (Piece::Done(_) | Piece::Failed(_))) => Some((p, None)),
            Some(p) => Some((p, Some(rx))),
            None => Some((
                Piece::Failed(ApiError::internal("the generation stopped unexpectedly")),
                None,
            )),
        }
    })
}

/// Server-sent events, several per item.
pub(crate) fn sse(events: impl Stream<Item = Vec<Event>> + Send + 'static) -> Response {
    let flat = events.flat_map(|batch| stream::iter(batch.into_iter().map(Ok::<Event, Infallible>)));
    Sse::new(flat).into_response()
}
