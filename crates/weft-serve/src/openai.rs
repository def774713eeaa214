//! OpenAI-compatible `POST /v1/completions` (and `GET /v1/models`), in the shapes the `openai`
//! Python client reads; `"stream": true` sends `data: {chunk}` server-sent events ending with
//! `data: [DONE]` (after a chunk of the usage with `stream_options.include_usage`; a completion
//! that fails ends the stream with its error instead, and no usage). `n`
//! completions of one prompt run as `n` sequences of the decode loop (seeds
//! [`choice_seed`]) that share the prompt's forward; `logprobs` and `echo` follow the legacy
//! completions API ([`crate::logprobs`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::Event;
use axum::response::Response;
use futures_util::stream::{self, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};
use weft_data::Tokenizer;

use crate::error::{json_response, openai_error, parse_body, ApiError};
use crate::generation::{self, GenerateParams, Piece, RequestedParams};
use crate::json::{Shallow, StringOrList};
use crate::logprobs::{Legacy, TokenLogprob, MAX_LOGPROBS};
use crate::registry::Admitted;
use crate::routes::{answered, pieces, sse};
use crate::{worker, AppState};

/// OpenAI's defaults: 16 tokens, temperature 1, top-p 1, no top-k (`top_k`, which OpenAI does
/// not take, is 0: off); the seed, when absent, is drawn from the clock.
const OPENAI_DEFAULTS: GenerateParams = GenerateParams {
    max_tokens: 16,
    sampling: weft_models::Sampling {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
    },
    seed: 0,
    logprobs: None,
};

/// The fields of a completion request. A field weft does not know is refused (400 naming it),
/// and so are OpenAI's parameters it does not implement unless given their neutral value
/// ([`not_implemented`]), rather than answered as if absent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompletionRequest {
    model: String,
    prompt: StringOrList,
    max_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    /// Sampling from the `k` most likely tokens only (0: off), as Triton's `parameters.top_k`
    /// (and vLLM's `top_k`); not one of OpenAI's.
    top_k: Option<u64>,
    seed: Option<u64>,
    /// Server-sent events (`null`: false, as OpenAI takes it).
    stream: Option<bool>,
    n: Option<u64>,
    /// The prompt before each completion's text (`null`: false).
    echo: Option<bool>,
    stop: Option<StringOrList>,
    /// Generate past the model's end-of-sequence tokens (vLLM's extension; `null`: false, a
    /// completion ends at one with `finish_reason` "stop").
    ignore_eos: Option<bool>,
    /// The most likely tokens to list at each position (0 to [`MAX_LOGPROBS`]).
    logprobs: Option<u64>,
    /// An end user's id, for the caller's own records: it changes no answer, and is not kept.
    #[allow(dead_code)]
    user: Option<String>,
    // OpenAI's parameters that weft does not implement: taken only at their neutral values
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    best_of: Option<u64>,
    logit_bias: Option<Entries>,
    suffix: Option<String>,
    /// With `include_usage`, a stream ends with a chunk of the request's usage (and every
    /// chunk has a `usage` field, `null` before it), as OpenAI's.
    stream_options: Option<StreamOptions>,
}

/// `stream_options` of a completion request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// A JSON object whose entries are counted, not kept (`logit_bias`).
#[derive(Debug)]
struct Entries(usize);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Count;
        impl<'de> serde::de::Visitor<'de> for Count {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut n = 0;
                while map
                    .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                    .is_some()
                {
                    n += 1;
                }
                Ok(Entries(n))
            }
        }
        d.deserialize_map(Count)
    }
}

/// 400 naming the first of OpenAI's parameters that `request` gives a value weft does not
/// implement: `presence_penalty` and `frequency_penalty` other than 0, `best_of` other than `n`,
/// a `logit_bias` with entries, a `suffix` with text. Their neutral values (what clients such as
/// LangChain send by default) are taken.
fn not_implemented(request: &CompletionRequest, n: u64) -> Result<(), ApiError> {
    let refuse = |field: &str, value: String, neutral: String| {
        Err(ApiError::bad_request(format!(
            "{field}: {value} is not supported by weft serve (it would be ignored); leave it out or give {neutral}"
        )))
    };
    for (field, value) in [
        ("presence_penalty", request.presence_penalty),
        ("frequency_penalty", request.frequency_penalty),
    ] {
        if let Some(v) = value.filter(|&v| v != 0.0) {
            return refuse(field, v.to_string(), "0".into());
        }
    }
    if let Some(b) = request.best_of.filter(|&b| b != n) {
        return refuse(
            "best_of",
            format!("{b} completions drawn for n = {n} answered"),
            format!("n ({n})"),
        );
    }
    if let Some(Entries(k)) = request.logit_bias.as_ref().filter(|e| e.0 > 0) {
        let entries = if *k == 1 { "entry" } else { "entries" };
        return refuse("logit_bias", format!("an object of {k} {entries}"), "{}".into());
    }
    if let Some(s) = request.suffix.as_ref().filter(|s| !s.is_empty()) {
        return refuse("suffix", crate::error::echo(s), "\"\" or null".into());
    }
    // as OpenAI answers it
    if request.stream_options.is_some() && request.stream != Some(true) {
        return Err(ApiError::bad_request("stream_options: only allowed with stream: true"));
    }
    Ok(())
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
fn prompt_text(prompt: &StringOrList) -> Result<&str, ApiError> {
    match prompt {
        StringOrList::One(s) => Ok(s),
        StringOrList::List { items, len: 1 } if matches!(&items[..], [Shallow::String(_)]) => match &items[0] {
            Shallow::String(s) => Ok(s),
            _ => Ok(""),
        },
        _ => Err(ApiError::bad_request(
            "prompt: give one string (batches of prompts and token-id prompts are not supported)",
        )),
    }
}

/// The most completions one request may ask for (`n` above it: 400).
pub const MAX_N: u64 = 16;

/// The seed of completion `i` of a request with seed `seed`: `seed + i` (wrapping), so choice
/// `i` of `n` is what a request for one completion with that seed answers.
pub fn choice_seed(seed: u64, i: usize) -> u64 {
    seed.wrapping_add(i as u64)
}

/// The prompt part of an `echo` choice: its text, and with `logprobs`, its tokens (the first
/// with a `null` log-probability).
struct Echo {
    text: String,
    ids: Vec<i64>,
    logprobs: Option<Vec<TokenLogprob>>,
}

impl Echo {
    /// The prompt's legacy logprobs object (empty without `logprobs`); the completion's tokens
    /// are pushed after it.
    fn legacy(&self, tok: &Tokenizer) -> Legacy {
        let mut legacy = Legacy::default();
        if let Some(lps) = &self.logprobs {
            for (j, &id) in self.ids.iter().enumerate() {
                legacy.push(tok, id, j.checked_sub(1).and_then(|j| lps.get(j)));
            }
        }
        legacy
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
    let (stream, echo) = (request.stream.unwrap_or(false), request.echo.unwrap_or(false));
    let n = request.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::bad_request(format!("n: {n} completions; give 1 to {MAX_N}")));
    }
    not_implemented(&request, n)?;
    let n = n as usize;
    if let Some(k) = request.logprobs {
        if k > MAX_LOGPROBS as u64 {
            return Err(ApiError::bad_request(format!(
                "logprobs: {k} is over {MAX_LOGPROBS} (the most likely tokens to list, 0 to {MAX_LOGPROBS})"
            )));
        }
    }
    let stop = generation::stop_sequences("stop", request.stop.as_ref())?;
    // `echo` with `max_tokens: 0` scores the prompt alone (lm-eval-harness's loglikelihood)
    let score_only = echo && request.max_tokens == Some(0);
    let requested = RequestedParams {
        max_tokens: if score_only { None } else { request.max_tokens },
        temperature: request.temperature,
        top_k: request.top_k,
        top_p: request.top_p,
        seed: Some(request.seed.unwrap_or_else(clock_seed)),
    };
    let mut params = requested.checked(OPENAI_DEFAULTS, state.limits.max_tokens)?;
    params.logprobs = request.logprobs.map(|k| k as usize);
    if score_only {
        params.max_tokens = 0;
    }
    // checked: with a large --max-tokens the product can pass usize
    let total = n.checked_mul(params.max_tokens);
    if total.is_none_or(|t| t > state.limits.max_tokens) {
        let product = total.map_or_else(|| "more than fits in a number".to_string(), |t| t.to_string());
        return Err(ApiError::bad_request(format!(
            "n x max_tokens = {n} x {} = {product} is over the limit of {} new tokens per request",
            params.max_tokens, state.limits.max_tokens
        )));
    }
    let prompt = prompt_text(&request.prompt)?.to_string();
    // every queue place the request needs (one per completion; the prompt's forward of `echo`
    // with `logprobs` runs on them too), taken at once before anything else: a version being
    // unregistered meanwhile takes every place given back, so a place taken later would never
    // come (503 for a request admitted before the call, which was to finish)
    let admitted = state.registry.admit_many(name, version, n, |s, queue| {
        ApiError::bad_request(format!(
            "n: {n} completions need {n} queue places (one each), more than model {} version {} has ({queue}); lower n",
            s.name, s.version
        ))
    })?;
    let served = admitted.served.clone();
    let ids = generation::prompt_ids(&served, &prompt)?;
    let (echo, admitted) = if echo {
        let (logprobs, admitted) = match params.logprobs {
            None => (None, admitted),
            Some(k) => {
                let (lps, admitted) = echo_logprobs(admitted, &ids, k).await?;
                (Some(lps), admitted)
            }
        };
        let echo = Echo {
            text: prompt.clone(),
            ids: ids.clone(),
            logprobs,
        };
        (Some(echo), admitted)
    } else {
        (None, admitted)
    };
    // one place each: a completion gives its place back when it ends
    let places = admitted.into_places();
    // checked by prompt_ids; read through the version, not cloned (a tokenizer.json's is large)
    let tok = served
        .tokenizer
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("the model records no tokenizer"))?;
    let (id, created, model) = (completion_id(), now(), request.model.clone());
    // a stream's chunks each have `usage` (null) when the last one is to say it
    let include_usage = stream && request.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let chunk = move |choices: Vec<Value>| {
        let mut chunk = json!({
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
        });
        if include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    };
    let usage = |prompt_tokens: usize, completion_tokens: usize| {
        json!({
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        })
    };
    let choice = |index: usize, text: &str, logprobs: Value, finish: Value| json!({ "text": text, "index": index, "logprobs": logprobs, "finish_reason": finish });
    let asks: Vec<_> = places
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let mut p = params;
            p.seed = choice_seed(params.seed, i);
            (a, p)
        })
        .collect();
    // the prompt runs once; each completion goes on from its cache with its own seed
    let constraints = generation::Constraints {
        stop: stop.clone(),
        end_ids: match request.ignore_eos {
            Some(true) => Vec::new(),
            _ => served.eos.clone(),
        },
        ..Default::default()
    };
    let receivers = generation::start_streams(asks, ids.clone(), constraints, arrived);
    if !stream {
        let who = format!("model {} version {}", served.name, served.version);
        let runs = receivers.into_iter().map(|rx| generation::finish(rx, &who));
        let made = futures_util::future::join_all(runs).await;
        let (mut choices, mut completion_tokens) = (Vec::new(), 0);
        for (i, made) in made.into_iter().enumerate() {
            let made = made?;
            completion_tokens += made.completion_tokens;
            let (mut text, mut legacy) = match &echo {
                Some(e) => (e.text.clone(), e.legacy(tok)),
                None => (String::new(), Legacy::default()),
            };
            text.push_str(&made.text);
            let logprobs = match params.logprobs {
                None => Value::Null,
                Some(_) => {
                    for lp in &made.logprobs {
                        legacy.push(tok, lp.id, Some(lp));
                    }
                    legacy.to_json()
                }
            };
            choices.push(choice(i, &text, logprobs, json!(made.finish.reason())));
        }
        let mut answer = chunk(choices);
        answer["usage"] = usage(ids.len(), completion_tokens);
        return Ok(answered(json_response(StatusCode::OK, &answer), &served));
    }
    let with_logprobs = params.logprobs.is_some();
    // the completions' tokens, added up as each ends, for the usage chunk
    let made_tokens = Arc::new(AtomicU64::new(0));
    let mut first = Vec::new();
    let mut streams = Vec::new();
    for (i, rx) in receivers.into_iter().enumerate() {
        let mut legacy = Legacy::default();
        if let Some(e) = &echo {
            legacy = e.legacy(tok);
            let lp = if with_logprobs { legacy.to_json() } else { Value::Null };
            first.push(Event::default().data(chunk(vec![choice(i, &e.text, lp, Value::Null)]).to_string()));
        }
        // each chunk's logprobs: the tokens made since the last chunk, offsets running on
        let mut offset = legacy.offset();
        let mut sent = 0;
        let (version, chunk, choice) = (served.clone(), chunk.clone(), choice);
        let made_tokens = made_tokens.clone();
        let events = pieces(rx).map(move |piece| {
            let mut logprobs = |lps: &[TokenLogprob], sent: &mut usize| {
                *sent += lps.len();
                if !with_logprobs {
                    return Value::Null;
                }
                let Some(tok) = version.tokenizer.as_ref() else {
                    return Value::Null;
                };
                let mut l = Legacy::at(offset);
                lps.iter().for_each(|lp| l.push(tok, lp.id, Some(lp)));
                offset = l.offset();
                l.to_json()
            };
            let c = match piece {
                Piece::Text(t, lps) => choice(i, &t, logprobs(&lps, &mut sent), Value::Null),
                Piece::Done(made) => {
                    made_tokens.fetch_add(made.completion_tokens as u64, Ordering::SeqCst);
                    let rest = made.logprobs.get(sent..).unwrap_or(&[]);
                    choice(i, "", logprobs(rest, &mut sent), json!(made.finish.reason()))
                }
                Piece::Failed(e) => {
                    let error = openai_error(e.status, &e.message).to_string();
                    return (Event::default().data(error), true);
                }
            };
            (Event::default().data(chunk(vec![c]).to_string()), false)
        });
        streams.push(events.boxed());
    }
    // a completion that fails ends the stream with its error: the request failed, as OpenAI
    // ends a stream that fails, and the others are dropped (their sequences end at their next
    // step); no usage follows, which would count a failed request as if it had been answered
    let failed = Arc::new(AtomicBool::new(false));
    let ended = failed.clone();
    // the flag is read before the next completion is awaited: the stream ends right after the
    // error, and the other completions' channels go with it (a `scan` would first wait for
    // another completion's next piece, which a slow or waiting completion may take long to make)
    let answers = stream::unfold((stream::select_all(streams), false), move |(mut all, over)| {
        let ended = ended.clone();
        async move {
            if over {
                return None;
            }
            let (event, failure) = all.next().await?;
            ended.fetch_or(failure, Ordering::SeqCst);
            Some((event, (all, failure)))
        }
    });
    // after every completion has ended: their tokens are all counted
    let prompt_tokens = ids.len();
    let usage_chunk = stream::once(async move {
        if !include_usage || failed.load(Ordering::SeqCst) {
            return None;
        }
        let mut last = chunk(Vec::new());
        last["usage"] = usage(prompt_tokens, made_tokens.load(Ordering::SeqCst) as usize);
        Some(Event::default().data(last.to_string()))
    })
    .filter_map(std::future::ready);
    let events = stream::iter(first)
        .chain(answers)
        .chain(usage_chunk)
        .chain(stream::once(async { Event::default().data("[DONE]") }))
        .map(|e| vec![e]);
    Ok(answered(sse(events), &served))
}

/// The prompt's log-probabilities for `echo` with `logprobs: k`: one forward of the prompt on
/// one of the model's workers, run on the request's own queue places (given back with the
/// result, for its completions). The prompt must fit in `block_size` (400 otherwise).
async fn echo_logprobs(admitted: Admitted, ids: &[i64], k: usize) -> Result<(Vec<TokenLogprob>, Admitted), ApiError> {
    if let Some(lm) = &admitted.served.lm {
        if ids.len() > lm.block_size() {
            return Err(ApiError::bad_request(format!(
                "echo with logprobs: the prompt's {} tokens are more than block_size = {}",
                ids.len(),
                lm.block_size()
            )));
        }
    }
    let ids = ids.to_vec();
    worker::run_holding(admitted, move |s| crate::logprobs::prompt_logprobs(s, &ids, k)).await
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
