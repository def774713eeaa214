//! Text generation with a language model (gpt, llama): the sampling parameters, checked, and
//! the requests' entry points. The decode loop is [`crate::decode`]'s continuous batching, on
//! the key/value cache: each request draws the tokens `weft generate` draws for the same
//! checkpoint, prompt, sampling and seed (its own random stream, one draw per sampled token;
//! bit for bit on the CPU), and its text streams as it is made.

use std::time::Instant;

use tokio::sync::mpsc;
use weft_models::{LanguageModel, Sampling};

use crate::detok::{MAX_STOPS, MAX_STOP_BYTES};
use crate::error::ApiError;
use crate::json::{Shallow, StringOrList, KEPT_ITEMS};
use crate::logprobs::TokenLogprob;
use crate::registry::{Admitted, Served};

/// How to generate: at most `max_tokens` new tokens, each drawn by `sampling` from `seed`;
/// with `logprobs: Some(k)`, each new token's log-probability and the `k` most likely tokens at
/// its position are kept ([`crate::logprobs`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub seed: u64,
    pub logprobs: Option<usize>,
}

/// The parameters as a request gives them (any may be absent).
#[derive(Debug, Default, Clone, Copy)]
pub struct RequestedParams {
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_k: Option<u64>,
    pub top_p: Option<f64>,
    pub seed: Option<u64>,
}

impl RequestedParams {
    /// The parameters with `defaults` for those absent, checked: `max_tokens` in `1..=limit`,
    /// `temperature` finite and `>= 0`, `top_p` in `(0, 1]`. Errors name the parameter.
    pub fn checked(&self, defaults: GenerateParams, limit: usize) -> Result<GenerateParams, ApiError> {
        let max_tokens = match self.max_tokens {
            None => defaults.max_tokens.min(limit),
            Some(0) => {
                return Err(ApiError::bad_request(
                    "max_tokens: 0 generates nothing; give at least 1",
                ))
            }
            Some(n) if n > limit as u64 => {
                return Err(ApiError::bad_request(format!(
                    "max_tokens: {n} is over the limit of {limit} new tokens per request"
                )))
            }
            Some(n) => n as usize,
        };
        let temperature = self.temperature.unwrap_or(defaults.sampling.temperature);
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(ApiError::bad_request(format!(
                "temperature: {temperature} is not a finite number >= 0 (0: greedy)"
            )));
        }
        let top_p = self.top_p.unwrap_or(defaults.sampling.top_p);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::bad_request(format!(
                "top_p: {top_p} is outside (0, 1] (1: off)"
            )));
        }
        let top_k = match self.top_k {
            None => defaults.sampling.top_k,
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        };
        Ok(GenerateParams {
            max_tokens,
            sampling: Sampling {
                temperature,
                top_k,
                top_p,
            },
            seed: self.seed.unwrap_or(defaults.seed),
            logprobs: defaults.logprobs,
        })
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// It made the tokens asked for.
    Length,
    /// Its text reached a stop sequence.
    Stop,
}

impl Finish {
    /// OpenAI's `finish_reason`: `"length"` or `"stop"`.
    pub fn reason(self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::Stop => "stop",
        }
    }
}

/// What a generation made.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// The new text (without the prompt; at a stop sequence, the text before it).
    pub text: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub finish: Finish,
    /// With `logprobs`, one entry per new token (the stop sequence's tokens included); else
    /// empty.
    pub logprobs: Vec<TokenLogprob>,
}

/// The stop sequences of a request's `field` (OpenAI's `stop`, Triton's `parameters.stop`):
/// absent or null (none), one string, or an array of at most [`MAX_STOPS`] strings; no string
/// may be empty or longer than [`MAX_STOP_BYTES`]. 400 naming `field` otherwise.
pub fn stop_sequences(field: &str, value: Option<&StringOrList>) -> Result<Vec<String>, ApiError> {
    let stops: Vec<&Shallow> = match value {
        None | Some(StringOrList::Other(Shallow::Null)) => return Ok(Vec::new()),
        Some(StringOrList::One(s)) => return checked_stop(field, s).map(|s| vec![s]),
        Some(StringOrList::List { items, len }) if *len <= MAX_STOPS => items.iter().collect(),
        Some(StringOrList::List { len, .. }) => {
            return Err(ApiError::bad_request(format!(
                "{field}: {len} stop sequences, at most {MAX_STOPS} are allowed"
            )))
        }
        Some(StringOrList::Other(other)) => {
            return Err(ApiError::bad_request(format!(
                "{field}: expected a string or an array of at most {MAX_STOPS} strings, got {other}"
            )))
        }
    };
    stops
        .into_iter()
        .enumerate()
        .map(|(i, v)| match v {
            Shallow::String(s) => checked_stop(field, s),
            other => Err(ApiError::bad_request(format!(
                "{field}[{i}]: expected a string, got {other}"
            ))),
        })
        .collect()
}

// an array of stop sequences keeps all it may hold
const _: () = assert!(MAX_STOPS <= KEPT_ITEMS);

/// One stop sequence, not empty and at most [`MAX_STOP_BYTES`] long.
fn checked_stop(field: &str, s: &str) -> Result<String, ApiError> {
    if s.is_empty() {
        Err(ApiError::bad_request(format!(
            "{field}: a stop sequence is empty (give at least one character)"
        )))
    } else if s.len() > MAX_STOP_BYTES {
        Err(ApiError::bad_request(format!(
            "{field}: a stop sequence of {} bytes, at most {MAX_STOP_BYTES} are allowed",
            s.len()
        )))
    } else {
        Ok(s.to_string())
    }
}

/// The language model and tokenizer of `served`, or 400 saying why it cannot generate.
fn parts(served: &Served) -> Result<(&std::sync::Arc<dyn LanguageModel>, &weft_data::Tokenizer), ApiError> {
    let who = format!("model {} version {}", served.name, served.version);
    let lm = served.lm.as_ref().ok_or_else(|| {
        ApiError::bad_request(format!(
            "{who} is a {}, not a language model: it cannot generate text (use /infer)",
            served.kind
        ))
    })?;
    let tok = served.tokenizer.as_ref().ok_or_else(|| {
        ApiError::bad_request(format!(
            "{who} records no tokenizer (it was not trained on text): it cannot generate text"
        ))
    })?;
    Ok((lm, tok))
}

/// `prompt`'s token ids, checked as `weft generate` checks them (not empty, every character
/// known to the tokenizer); 400 naming the cause.
pub fn prompt_ids(served: &Served, prompt: &str) -> Result<Vec<i64>, ApiError> {
    let (_, tok) = parts(served)?;
    weft_train::generate::encode_prompt(tok, prompt).map_err(|e| ApiError::bad_request(format!("prompt: {e}")))
}

/// `ids` (below the tokenizer's vocabulary: the sampler draws no others) decoded.
pub(crate) fn decode_text(tok: &weft_data::Tokenizer, ids: &[i64]) -> weft_data::Result<String> {
    let ids: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
    tok.decode(&ids)
}

/// One message of a streamed generation.
#[derive(Debug)]
pub enum Piece {
    /// New text, with the log-probabilities (when asked for) of the tokens made since the last
    /// piece; those of tokens whose text never came are only in `Done`'s.
    Text(String, Vec<TokenLogprob>),
    /// The end, with all that was made.
    Done(Generated),
    /// The generation failed; nothing follows.
    Failed(ApiError),
}

/// Starts generating in the admitted model's running batch ([`crate::decode`]), until
/// `params.max_tokens` or the first of the stop sequences `stop` (not empty strings); the pieces
/// arrive on the returned channel, the last one `Done` or `Failed` (a channel that closes without
/// either: the decode thread died). Dropping the receiver ends the sequence at its next step.
pub fn start_stream(
    admitted: Admitted,
    ids: Vec<i64>,
    params: GenerateParams,
    stop: Vec<String>,
    arrived: Instant,
) -> mpsc::UnboundedReceiver<Piece> {
    crate::decode::submit(admitted, ids, params, stop, arrived)
}

/// Starts several completions of one prompt ([`start_stream`]), each with its queue place (of
/// one model version) and parameters: the prompt runs once for all of them, and each draws
/// what a request for it alone would. One channel per completion, in order.
pub fn start_streams(
    asks: Vec<(Admitted, GenerateParams)>,
    ids: Vec<i64>,
    stop: Vec<String>,
    arrived: Instant,
) -> Vec<mpsc::UnboundedReceiver<Piece>> {
    crate::decode::submit_group(asks, ids, stop, arrived)
}

/// Runs a whole generation ([`start_stream`]) and waits for it.
pub async fn run(
    admitted: Admitted,
    ids: Vec<i64>,
    params: GenerateParams,
    stop: Vec<String>,
    arrived: Instant,
) -> Result<Generated, ApiError> {
    let who = format!("model {} version {}", admitted.served.name, admitted.served.version);
    finish(start_stream(admitted, ids, params, stop, arrived), &who).await
}

/// Waits for the end of a started generation of model `who` (its pieces' channel).
pub async fn finish(mut pieces: mpsc::UnboundedReceiver<Piece>, who: &str) -> Result<Generated, ApiError> {
    while let Some(piece) = pieces.recv().await {
        match piece {
            Piece::Text(..) => {}
            Piece::Done(made) => return Ok(made),
            Piece::Failed(e) => return Err(e),
        }
    }
    Err(ApiError::internal(format!("{who} failed while generating")))
}
