//! Log-probabilities of tokens for OpenAI's legacy completions (`logprobs: k`, `echo`): the
//! log-softmax of the model's logits over the tokens the tokenizer knows (those the sampler can
//! draw), taken before temperature, top-k and top-p (vLLM's default, "raw" logprobs: what the
//! model gives, whatever the sampling), and the legacy response object `{tokens, token_logprobs,
//! top_logprobs, text_offset}`.

use std::sync::Arc;

use serde_json::{json, Map, Value};
use weft_core::Tensor;

use crate::error::ApiError;
use crate::registry::Served;

/// The most alternatives a request may ask for (`logprobs` above it: 400), as OpenAI's API.
pub const MAX_LOGPROBS: usize = 5;

/// One token's log-probability (natural log) and the most likely tokens at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's id.
    pub id: i64,
    /// Its log-probability under the model at its position.
    pub logprob: f64,
    /// The `k` most likely tokens there, most likely first (ties: lower id first), each
    /// `(id, log-probability)`.
    pub top: Vec<(i64, f64)>,
}

/// The log-softmax of `row` (logits over the vocabulary, `[vocab]`) at `chosen`, with the `k`
/// most likely tokens. Computed in f64: `x - (m + ln sum exp(x - m))`, `m` the row's maximum.
pub fn from_row(row: &[f64], chosen: usize, k: usize) -> TokenLogprob {
    let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + row.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
    let mut order: Vec<usize> = (0..row.len()).collect();
    let k = k.min(row.len());
    if k > 0 {
        let by_value = |a: &usize, b: &usize| row[*b].total_cmp(&row[*a]).then(a.cmp(b));
        order.select_nth_unstable_by(k - 1, by_value);
        order.truncate(k);
        order.sort_by(by_value);
    } else {
        order.clear();
    }
    TokenLogprob {
        id: chosen as i64,
        logprob: row.get(chosen).map_or(f64::NEG_INFINITY, |x| x - lse),
        top: order.into_iter().map(|i| (i as i64, row[i] - lse)).collect(),
    }
}

/// The log-probabilities of the prompt `ids` after the first (`ids.len() - 1` entries, the
/// first prompt token has none), with the `k` most likely tokens at each position: one forward
/// of the whole prompt (`[1, T]`, `T <= block_size`, checked by the caller), run on the
/// calling thread (which holds a worker).
pub fn prompt_logprobs(served: &Arc<Served>, ids: &[i64], k: usize) -> Result<Vec<TokenLogprob>, ApiError> {
    let fail =
        |e: weft_core::Error| ApiError::internal(format!("model {} version {}: {e}", served.name, served.version));
    let limit = served.tokenizer.as_ref().map_or(usize::MAX, |t| t.vocab_size());
    let input = Tensor::from_vec(ids.to_vec(), &[1, ids.len()]).map_err(fail)?;
    let logits = weft_core::no_grad(|| served.model.logits(&input)).map_err(fail)?;
    let vocab = *logits.shape().last().unwrap_or(&0);
    let width = limit.min(vocab);
    // f32 logits are read as they are (a row widened to f64 at a time), not copied whole to f64
    let rows: Box<dyn Fn(usize) -> Vec<f64>> = match logits.to_vec::<f32>() {
        Ok(all) => Box::new(move |j| {
            all[j * vocab..j * vocab + width]
                .iter()
                .map(|&x| f64::from(x))
                .collect()
        }),
        Err(_) => {
            let all = logits.try_to_vec_f64().map_err(fail)?;
            Box::new(move |j| all[j * vocab..j * vocab + width].to_vec())
        }
    };
    Ok((1..ids.len())
        .map(|j| from_row(&rows(j - 1), ids[j] as usize, k))
        .collect())
}

/// OpenAI's legacy `logprobs` object of one choice, built token by token: each token's text
/// (the token decoded alone), its log-probability (`null` for the first prompt token with
/// `echo`), its alternatives `{text: logprob}` (the `k` most likely, and the token itself when
/// it is not among them), and its offset in characters into the choice's text (the sum of
/// the earlier tokens' text lengths, as vLLM counts).
#[derive(Debug, Default)]
pub struct Legacy {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<Value>,
    /// Where the next token's text starts, in characters.
    offset: usize,
}

impl Legacy {
    /// Starts at `offset` characters into the choice's text (a stream's later chunks).
    pub fn at(offset: usize) -> Legacy {
        Legacy {
            offset,
            ..Legacy::default()
        }
    }

    /// Appends token `id` with its log-probability (`None`: the first prompt token).
    pub fn push(&mut self, tok: &weft_data::Tokenizer, id: i64, entry: Option<&TokenLogprob>) {
        let text = token_text(tok, id);
        self.text_offset.push(json!(self.offset));
        self.offset += text.chars().count();
        match entry {
            None => {
                self.token_logprobs.push(Value::Null);
                self.top_logprobs.push(Value::Null);
            }
            Some(e) => {
                self.token_logprobs.push(json!(e.logprob));
                let mut top = Map::new();
                for &(alt, lp) in &e.top {
                    top.entry(token_text(tok, alt)).or_insert(json!(lp));
                }
                top.entry(text.clone()).or_insert(json!(e.logprob));
                self.top_logprobs.push(Value::Object(top));
            }
        }
        self.tokens.push(json!(text));
    }

    /// Where the next token's text would start, in characters.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The object: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`.
    pub fn to_json(&self) -> Value {
        json!({
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs,
            "text_offset": self.text_offset,
        })
    }
}

/// Token `id` decoded alone (a piece of a multi-byte character decodes to U+FFFD).
fn token_text(tok: &weft_data::Tokenizer, id: i64) -> String {
    tok.decode(&[id as u32]).unwrap_or_else(|_| "\u{fffd}".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_and_the_top_tokens() {
        let row = [1.0, 3.0, 2.0, 3.0, -1.0];
        let lp = from_row(&row, 2, 3);
        let z: f64 = row.iter().map(|x: &f64| x.exp()).sum();
        assert!((lp.logprob - (2.0f64.exp() / z).ln()).abs() < 1e-12);
        let ids: Vec<i64> = lp.top.iter().map(|t| t.0).collect();
        // ties: the lower id first
        assert_eq!(ids, [1, 3, 2]);
        assert!((lp.top[0].1 - (3.0f64.exp() / z).ln()).abs() < 1e-12);
        let total: f64 = row.iter().map(|x| (x - (z.ln())).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert!(from_row(&row, 0, 0).top.is_empty());
        assert_eq!(from_row(&row, 0, 9).top.len(), 5);
    }
}
