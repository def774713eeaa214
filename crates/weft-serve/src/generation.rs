//! Text generation with a language model (gpt, llama): the sampling parameters, checked, and
//! the requests' entry points. The decode loop is [`crate::decode`]'s continuous batching, on
//! the key/value cache: each request draws the tokens `weft generate` draws for the same
//! checkpoint, prompt, sampling and seed (its own random stream, one draw per sampled token;
//! bit for bit on the CPU), and its text streams as it is made.

use std::time::Instant;

use tokio::sync::mpsc;
use weft_models::{LanguageModel, Sampling};

use crate::detok::{MAX_STOPS, MAX_STOP_BYTES};
use crate::error::{echo, ApiError};
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
    /// Its text reached a stop sequence, or it drew its end token.
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
    /// The new text (without the prompt; at a stop sequence, the text before it; without the
    /// end token).
    pub text: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub finish: Finish,
    /// With `logprobs`, one entry per new token (the stop sequence's tokens included); else
    /// empty.
    pub logprobs: Vec<TokenLogprob>,
}

/// What ends or restricts a generation besides its sampling: stop sequences (on its text),
/// bad words (token ids never drawn in a row) and an end token.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Constraints {
    /// Stop sequences (not empty strings): the text ends just before the first that it holds.
    pub stop: Vec<String>,
    /// Bad words as token ids (none empty), TensorRT-LLM's: a word's last token is never drawn
    /// right after the tokens before it in the word (a word of one token: never drawn).
    pub bad_words: Vec<Vec<i64>>,
    /// Token ids that end the generation when drawn (not part of the text): the model's
    /// end-of-sequence ids ([`crate::model::Served::eos`]) unless the request names its own
    /// (TensorRT-LLM's `end_id`) or asks for none (`ignore_eos`).
    pub end_ids: Vec<i64>,
}

impl From<Vec<String>> for Constraints {
    /// Stop sequences only.
    fn from(stop: Vec<String>) -> Constraints {
        Constraints {
            stop,
            ..Constraints::default()
        }
    }
}

impl Constraints {
    /// The tokens that may not come after `tokens` (the prompt and the tokens made so far):
    /// the last token of each bad word whose other tokens end `tokens`. Sorted, no repeats.
    pub(crate) fn banned(&self, tokens: &[i64]) -> Vec<usize> {
        let mut banned: Vec<usize> = self
            .bad_words
            .iter()
            .filter_map(|word| {
                let (last, before) = word.split_last()?;
                tokens.ends_with(before).then_some(*last as usize)
            })
            .collect();
        banned.sort_unstable();
        banned.dedup();
        banned
    }
}

/// The most bad words a request may give (each of at most [`MAX_STOP_BYTES`]).
pub const MAX_BAD_WORDS: usize = KEPT_ITEMS;

/// TensorRT-LLM's `stop_words` or `bad_words` as a request's `field` gives them: absent or null
/// (none), one string, or an array of at most `max` strings (at most [`KEPT_ITEMS`]), each of
/// at most [`MAX_STOP_BYTES`]. Empty strings are none (TensorRT-LLM skips a word of no tokens:
/// its clients send `""` for no words). 400 naming `field` otherwise.
pub fn word_list(field: &str, value: Option<&StringOrList>, max: usize) -> Result<Vec<String>, ApiError> {
    let max = max.min(KEPT_ITEMS);
    let items: Vec<&Shallow> = match value {
        None | Some(StringOrList::Other(Shallow::Null)) => return Ok(Vec::new()),
        Some(StringOrList::One(s)) => return checked_word(field, s).map(|w| w.into_iter().collect()),
        Some(StringOrList::List { items, len }) if *len <= max => items.iter().collect(),
        Some(StringOrList::List { len, .. }) => {
            return Err(ApiError::bad_request(format!(
                "{field}: {len} strings, at most {max} are allowed"
            )))
        }
        Some(StringOrList::Other(other)) => {
            return Err(ApiError::bad_request(format!(
                "{field}: expected a string or an array of at most {max} strings, got {other}"
            )))
        }
    };
    let mut words = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        match item {
            Shallow::String(s) => words.extend(checked_word(&format!("{field}[{i}]"), s)?),
            other => {
                return Err(ApiError::bad_request(format!(
                    "{field}[{i}]: expected a string, got {other}"
                )))
            }
        }
    }
    Ok(words)
}

/// One word of [`word_list`]: `None` when empty, else at most [`MAX_STOP_BYTES`] long.
fn checked_word(field: &str, s: &str) -> Result<Option<String>, ApiError> {
    if s.len() > MAX_STOP_BYTES {
        return Err(ApiError::bad_request(format!(
            "{field}: a string of {} bytes, at most {MAX_STOP_BYTES} are allowed",
            s.len()
        )));
    }
    Ok((!s.is_empty()).then(|| s.to_string()))
}

/// The stop sequences `stop` (of the field `stop_field`) and then the stop words `words` (of
/// `words_field`) not already among them: at most [`MAX_STOPS`] together, else 400 naming both.
pub fn joined_stops(
    stop: Vec<String>,
    stop_field: &str,
    words: Vec<String>,
    words_field: &str,
) -> Result<Vec<String>, ApiError> {
    let mut all = stop;
    for w in words {
        if !all.contains(&w) {
            all.push(w);
        }
    }
    if all.len() > MAX_STOPS {
        return Err(ApiError::bad_request(format!(
            "{words_field} and {stop_field}: {} different stop sequences together, at most {MAX_STOPS} are allowed",
            all.len()
        )));
    }
    Ok(all)
}

/// The bad words `words` (of the field `field`, from [`word_list`]) as the token ids of
/// `served`'s tokenizer, each word encoded alone as TensorRT-LLM encodes it; 400 naming `field`
/// for a word the tokenizer cannot encode, and when the words of one token ban every token.
pub fn bad_word_ids(served: &Served, field: &str, words: &[String]) -> Result<Vec<Vec<i64>>, ApiError> {
    let (_, tok) = parts(served)?;
    let mut ids = Vec::with_capacity(words.len());
    for word in words {
        let encoded = tok
            .encode(word)
            .map_err(|e| ApiError::bad_request(format!("{field}: the word {} cannot be encoded: {e}", echo(word))))?;
        if encoded.is_empty() {
            continue;
        }
        ids.push(encoded.into_iter().map(i64::from).collect::<Vec<i64>>());
    }
    let constraints = Constraints {
        bad_words: ids,
        ..Constraints::default()
    };
    if constraints.banned(&[]).len() >= tok.vocab_size() {
        return Err(ApiError::bad_request(format!(
            "{field}: every token of the vocabulary is a bad word: nothing could be generated"
        )));
    }
    Ok(constraints.bad_words)
}

/// A token id a request's `field` gives (TensorRT-LLM's `end_id` and `pad_id`): absent or null
/// (none), else a whole number below `served`'s vocabulary. 400 naming `field` otherwise.
pub fn token_id(served: &Served, field: &str, value: Option<&Shallow>) -> Result<Option<i64>, ApiError> {
    let Some(given) = value.filter(|v| **v != Shallow::Null) else {
        return Ok(None);
    };
    let vocab = parts(served)?.1.vocab_size();
    let id = match given {
        Shallow::Number(n) => n.parse::<u64>().ok().filter(|&id| id < vocab as u64),
        _ => None,
    };
    match id {
        Some(id) => Ok(Some(id as i64)),
        None => Err(ApiError::bad_request(format!(
            "{field}: {given} is not a token id of model {} version {}: give a whole number from 0 to {} \
             (its vocabulary has {vocab} tokens)",
            served.name,
            served.version,
            vocab.saturating_sub(1)
        ))),
    }
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
/// `params.max_tokens`, the first of the stop sequences or the end token of `constraints` (stop
/// sequences alone: a `Vec<String>`); the pieces arrive on the returned channel, the last one
/// `Done` or `Failed` (a channel that closes without either: the decode thread died). Dropping
/// the receiver ends the sequence at its next step.
pub fn start_stream(
    admitted: Admitted,
    ids: Vec<i64>,
    params: GenerateParams,
    constraints: impl Into<Constraints>,
    arrived: Instant,
) -> mpsc::UnboundedReceiver<Piece> {
    crate::decode::submit(admitted, ids, params, constraints, arrived)
}

/// Starts several completions of one prompt ([`start_stream`]), each with its queue place (of
/// one model version) and parameters: the prompt runs once for all of them, and each draws
/// what a request for it alone would. One channel per completion, in order.
pub fn start_streams(
    asks: Vec<(Admitted, GenerateParams)>,
    ids: Vec<i64>,
    constraints: impl Into<Constraints>,
    arrived: Instant,
) -> Vec<mpsc::UnboundedReceiver<Piece>> {
    crate::decode::submit_group(asks, ids, constraints, arrived)
}

/// Runs a whole generation ([`start_stream`]) and waits for it.
pub async fn run(
    admitted: Admitted,
    ids: Vec<i64>,
    params: GenerateParams,
    constraints: impl Into<Constraints>,
    arrived: Instant,
) -> Result<Generated, ApiError> {
    let who = format!("model {} version {}", admitted.served.name, admitted.served.version);
    finish(start_stream(admitted, ids, params, constraints, arrived), &who).await
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
