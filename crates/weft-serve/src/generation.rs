//! Text generation with a language model (gpt, llama): the sampling parameters, checked; the
//! decode loop, which draws exactly the tokens `weft generate` draws for the same checkpoint,
//! prompt, sampling and seed (it calls [`LanguageModel::generate`] one token at a time with one
//! random stream); and streaming the text as it is made.
//!
//! There is no KV cache yet: each new token runs the model over the whole (cropped) context.

use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::mpsc;
use weft_core::{Generator, Tensor};
use weft_models::{LanguageModel, Sampling};

use crate::error::ApiError;
use crate::registry::{Admitted, Served};
use crate::worker;

/// How to generate: at most `max_tokens` new tokens, each drawn by `sampling` from `seed`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub seed: u64,
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
        })
    }
}

/// What a generation made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// The new text (without the prompt).
    pub text: String,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
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

/// Generates after `ids` on the calling thread (a worker's), giving `emit` each new piece of
/// text as soon as it decodes whole; `emit` returns false to stop early (the client left).
/// `arrived` is when the request arrived: the time to the first new token is measured from it.
pub fn generate(
    served: &Served,
    ids: Vec<i64>,
    params: &GenerateParams,
    arrived: Instant,
    mut emit: impl FnMut(&str) -> bool,
) -> Result<Generated, ApiError> {
    let (lm, tok) = parts(served)?;
    let fail = |e: &dyn std::fmt::Display| {
        ApiError::internal(format!("model {} version {}: {e}", served.name, served.version))
    };
    let mut rng = Generator::new(params.seed);
    let prompt_tokens = ids.len();
    let mut all = ids;
    let mut sent = String::new();
    for step in 0..params.max_tokens {
        let context = Tensor::from_vec(all.clone(), &[1, all.len()]).map_err(|e| fail(&e))?;
        let out = lm
            .generate(&context, 1, &params.sampling, Some(tok.vocab_size()), &mut rng)
            .map_err(|e| fail(&e))?;
        let next = out.to_vec::<i64>().map_err(|e| fail(&e))?.last().copied();
        all.push(next.ok_or_else(|| fail(&"the model returned no token"))?);
        served.stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
        if step == 0 {
            served
                .stats
                .time_to_first_token
                .observe(arrived.elapsed().as_secs_f64());
        }
        let text = decode(tok, &all[prompt_tokens..]).map_err(|e| fail(&e))?;
        // a token that ends inside a character decodes to U+FFFD until the rest arrives
        if text.ends_with('\u{FFFD}') && step + 1 < params.max_tokens {
            continue;
        }
        if let Some(piece) = text.strip_prefix(sent.as_str()) {
            if !piece.is_empty() && !emit(piece) {
                break;
            }
            sent = text;
        }
    }
    let completion_tokens = all.len() - prompt_tokens;
    Ok(Generated {
        text: decode(tok, &all[prompt_tokens..]).map_err(|e| fail(&e))?,
        prompt_tokens,
        completion_tokens,
    })
}

/// `ids` (below the tokenizer's vocabulary: the sampler draws no others) decoded.
fn decode(tok: &weft_data::Tokenizer, ids: &[i64]) -> weft_data::Result<String> {
    let ids: Vec<u32> = ids.iter().map(|&t| t as u32).collect();
    tok.decode(&ids)
}

/// One message of a streamed generation.
#[derive(Debug)]
pub enum Piece {
    /// New text.
    Text(String),
    /// The end, with all that was made.
    Done(Generated),
    /// The generation failed; nothing follows.
    Failed(ApiError),
}

/// Starts generating on the admitted model's worker; the pieces arrive on the returned
/// channel, the last one `Done` or `Failed` (a channel that closes without either: the job
/// died). Dropping the receiver stops the generation at its next token.
pub fn start_stream(
    admitted: Admitted,
    ids: Vec<i64>,
    params: GenerateParams,
    arrived: Instant,
) -> mpsc::Receiver<Piece> {
    let (tx, rx) = mpsc::channel(64);
    worker::spawn(admitted, move |s| {
        let result = generate(s, ids, &params, arrived, |p| {
            tx.blocking_send(Piece::Text(p.to_string())).is_ok()
        });
        let _ = tx.blocking_send(match result {
            Ok(g) => Piece::Done(g),
            Err(e) => Piece::Failed(e),
        });
    });
    rx
}

/// Runs a whole generation on the admitted model's worker.
pub async fn run(
    admitted: Admitted,
    ids: Vec<i64>,
    params: GenerateParams,
    arrived: Instant,
) -> Result<Generated, ApiError> {
    worker::run(admitted, move |s| generate(s, ids, &params, arrived, |_| true)).await
}
