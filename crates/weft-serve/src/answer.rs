//! Infer and predictions answers, written as they are sent rather than held whole: an answer
//! keeps its output's FP32 values (4 bytes each) and writes their JSON text a piece at a time as
//! the client reads it, so that an answer of 2^24 logits (the most an infer request may ask for)
//! holds 64 MiB, not its 200 MiB of text or a tree of `serde_json::Value`s (32 bytes and more a
//! value: the 393 kB request that asked for 2^24 logits made a 329 MB answer and held about 700
//! MB until it was read). What an answer holds counts against the budget of bytes in flight that
//! request bodies share (`--max-body-bytes-in-flight`, [`crate::body::BodyBudget`]) from before
//! its forward until it has been sent: past it the request is a 503 with `Retry-After` (an
//! answer larger than the whole budget: a 400, as retrying cannot help). Answers of up to
//! [`WHOLE_TEXT`] bytes of text are written at once and sent with a `Content-Length`, larger ones
//! in chunks (chunked transfer encoding). Each value is written as the shortest decimal that reads
//! back as the same FP32 value, as serde_json writes it (with `zmij`, as serde_json does).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};

use crate::body::{BodyBudget, Held};
use crate::error::ApiError;
use crate::protocol::ResponseOutput;
use crate::registry::{Served, Signature};

/// The most bytes of text one value takes with its separator and brackets (`-1.1754944e-38`,
/// and `],[` in an answer nested as `[B, 1]`).
const VALUE_TEXT: usize = 20;

/// Answers of at most this many bytes of text (about 50,000 values) are written whole; the
/// larger ones are written a chunk of this size at a time as the client reads.
pub const WHOLE_TEXT: usize = 1 << 20;

/// Values written per chunk of a streamed answer.
const CHUNK_VALUES: usize = WHOLE_TEXT / VALUE_TEXT;

/// How many values the logits of a model with `signature` hold for an input of `shape`
/// (`[B, classes]` of a classifier, `[B, T, vocab]` of a language model); checked by
/// [`crate::protocol::input_tensor`] to be at most the output limit.
pub fn output_values(signature: Signature, shape: &[usize]) -> usize {
    let rows = shape.first().copied().unwrap_or(1);
    match signature {
        Signature::Tokens { vocab, .. } => rows
            .saturating_mul(shape.get(1).copied().unwrap_or(1))
            .saturating_mul(vocab),
        Signature::Features { classes, .. } | Signature::Images { classes, .. } => rows.saturating_mul(classes),
    }
}

/// What an answer of `values` values holds while it is sent: the values, and the text of the
/// whole answer (when written whole) or of one chunk.
fn held_bytes(values: usize) -> usize {
    values
        .saturating_mul(4)
        .saturating_add(values.saturating_mul(VALUE_TEXT).min(WHOLE_TEXT))
}

/// Reserves, from `budget`, what an answer of `values` values holds until it is sent, taking
/// over what the request's body held ([`crate::body::take_body_hold`]; the larger of the two is
/// held until the answer is made, as the parsed input lives through the forward); a 503
/// (with `Retry-After`) when it does not fit now, a 400 when it cannot fit at all.
pub fn reserve(budget: &Arc<BodyBudget>, values: usize) -> Result<Held, ApiError> {
    let bytes = held_bytes(values);
    if bytes > budget.limit() {
        return Err(ApiError::bad_request(format!(
            "the answer's {values} output values take {bytes} bytes to hold while it is sent, more than the \
             server's limit of {} bytes in flight (--max-body-bytes-in-flight): send fewer rows per request",
            budget.limit()
        )));
    }
    let mut held = match crate::body::take_body_hold() {
        Some(held) => held,
        None => budget.reserve(0).expect("0 bytes always fit"),
    };
    let had = held.bytes();
    // the larger of the two until the forward has run (the parsed input is held through it);
    // the answer gives back the rest when it is made (`Answer::new`)
    if had >= bytes {
        return Ok(held);
    }
    if held.grow(bytes - had) {
        return Ok(held);
    }
    // the body's bytes go back before saying what the server holds
    drop(held);
    let what = format!("this answer's {values} output values ({bytes} bytes) would pass it");
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        crate::body::over_budget_message(budget, &what),
    ))
}

/// A 500 for an output holding a value that is not finite (JSON has no text for it); the
/// forward refuses such outputs first (400), so this is not reached.
fn not_finite(values: &[f32]) -> Option<Response> {
    values.iter().any(|v| !v.is_finite()).then(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the model's output holds a value outside FP32's range (infinite or NaN)",
        )
        .into_response()
    })
}

/// KServe v2's infer answer: `model_name`, `model_version`, `id` (when the request gave one)
/// and the one output, its `data` flat.
pub fn infer(served: &Served, id: Option<&str>, output: ResponseOutput, held: Held) -> Response {
    if let Some(refused) = not_finite(&output.data) {
        return refused;
    }
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    let id = id.map_or(String::new(), |id| format!("\"id\":{},", quote(id)));
    let shape = serde_json::to_string(&output.shape).unwrap_or_default();
    let head = format!(
        "{{{id}\"model_name\":{},\"model_version\":{},\"outputs\":[{{\"name\":{},\"datatype\":{},\"shape\":{shape},\"data\":",
        quote(&served.name),
        quote(&served.version),
        quote(output.name),
        quote(output.datatype),
    );
    Answer::new(head, output.data, None, "}]}", held).into_response()
}

/// TorchServe's predictions answer: the logits nested as their shape.
pub fn nested(output: ResponseOutput, held: Held) -> Response {
    if let Some(refused) = not_finite(&output.data) {
        return refused;
    }
    Answer::new(String::new(), output.data, Some(output.shape), "", held).into_response()
}

/// An answer's body: the text before the values, the values (flat, or nested as a shape), the
/// text after them, and its hold on the budget, given back when the body is dropped (sent, or
/// the client gone).
struct Answer {
    head: Option<String>,
    values: Vec<f32>,
    /// The nesting's block sizes, outermost first (`[T x V, V]` for `[B, T, V]`); empty: flat.
    blocks: Vec<usize>,
    /// The next value to write.
    next: usize,
    tail: &'static str,
    /// The whole text, when written at once.
    whole: Option<Bytes>,
    ended: bool,
    held: Held,
}

impl Answer {
    /// The answer, written whole at once when its text is at most [`WHOLE_TEXT`].
    fn new(head: String, values: Vec<f32>, shape: Option<Vec<usize>>, tail: &'static str, mut held: Held) -> Answer {
        // the request's input, held through the forward, is gone by now
        held.shrink(held.bytes().saturating_sub(held_bytes(values.len())));
        let mut answer = Answer::streamed(head, values, shape, tail, held);
        if answer.values.len().saturating_mul(VALUE_TEXT) <= WHOLE_TEXT {
            let mut text = Vec::new();
            while let Some(piece) = answer.piece(usize::MAX) {
                text.extend_from_slice(&piece);
            }
            answer.held.shrink(answer.values.len() * 4);
            answer.values = Vec::new();
            answer.whole = Some(Bytes::from(text));
        }
        answer
    }

    /// The answer, to be written a piece at a time.
    fn streamed(head: String, values: Vec<f32>, shape: Option<Vec<usize>>, tail: &'static str, held: Held) -> Answer {
        let blocks = match &shape {
            Some(shape) => (1..shape.len()).map(|j| shape[j..].iter().product()).collect(),
            None => Vec::new(),
        };
        Answer {
            head: Some(head),
            values,
            blocks,
            next: 0,
            tail,
            whole: None,
            ended: false,
            held,
        }
    }

    /// The next piece of text (at most `count` values), `None` at the end.
    fn piece(&mut self, count: usize) -> Option<Bytes> {
        if self.next > self.values.len() {
            return None;
        }
        let depth = self.blocks.len() + 1;
        let mut out = Vec::with_capacity(count.min(self.values.len()).saturating_mul(12) + 64);
        let mut number = zmij::Buffer::new();
        if let Some(head) = self.head.take() {
            out.extend_from_slice(head.as_bytes());
            out.extend(std::iter::repeat_n(b'[', depth));
        }
        let end = self.next.saturating_add(count).min(self.values.len());
        for i in self.next..end {
            if i > 0 {
                let closed = self.blocks.iter().filter(|&&b| i % b == 0).count();
                out.extend(std::iter::repeat_n(b']', closed));
                out.push(b',');
                out.extend(std::iter::repeat_n(b'[', closed));
            }
            // as serde_json writes an f32: the shortest text that reads back as the value
            let v = self.values[i];
            debug_assert!(v.is_finite(), "checked by not_finite");
            out.extend_from_slice(number.format_finite(v).as_bytes());
        }
        self.next = end;
        if end == self.values.len() {
            out.extend(std::iter::repeat_n(b']', depth));
            out.extend_from_slice(self.tail.as_bytes());
            // past the end: the next call says so
            self.next = end + 1;
        }
        Some(Bytes::from(out))
    }
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        let piece = match this.whole.take() {
            Some(whole) => {
                this.ended = true;
                Some(whole)
            }
            None if this.ended => None,
            None => {
                let piece = this.piece(CHUNK_VALUES);
                this.ended = this.next > this.values.len();
                piece
            }
        };
        Poll::Ready(piece.map(|p| Ok(Frame::data(p))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.whole.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match &self.whole {
            Some(whole) => SizeHint::with_exact(whole.len() as u64),
            None if self.ended => SizeHint::with_exact(0),
            None => SizeHint::default(),
        }
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::new(self));
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole text of an answer of `values` nested as `shape` (flat when `None`), chunk by
    /// chunk with `chunk` values each.
    fn text(values: Vec<f32>, shape: Option<Vec<usize>>, chunk: usize) -> String {
        let budget = BodyBudget::new(1 << 30);
        let mut a = Answer::streamed("H".into(), values, shape, "T", budget.reserve(0).unwrap());
        let mut out = Vec::new();
        while let Some(p) = a.piece(chunk) {
            out.extend_from_slice(&p);
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn values_are_written_flat_or_nested_in_any_chunks() {
        let v: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 1.0).collect();
        for chunk in [1, 5, 100] {
            assert_eq!(
                text(v.clone(), None, chunk),
                "H[-1.0,-0.5,0.0,0.5,1.0,1.5,2.0,2.5,3.0,3.5,4.0,4.5]T"
            );
            let nested = text(v.clone(), Some(vec![2, 3, 2]), chunk);
            let got: serde_json::Value = serde_json::from_str(&nested[1..nested.len() - 1]).unwrap();
            assert_eq!(
                got,
                serde_json::json!([
                    [[-1.0, -0.5], [0.0, 0.5], [1.0, 1.5]],
                    [[2.0, 2.5], [3.0, 3.5], [4.0, 4.5]]
                ])
            );
        }
        // FP32's extremes read back exactly
        let extremes = vec![f32::MAX, f32::MIN_POSITIVE, -1.0e-45, 0.1, -0.0];
        let t = text(extremes.clone(), Some(vec![5, 1]), 2);
        let back: Vec<Vec<f32>> = serde_json::from_str(&t[1..t.len() - 1]).unwrap();
        assert_eq!(back.concat(), extremes);
    }

    #[test]
    fn values_are_written_as_serde_json_writes_them() {
        // `{:?}` wrote 1e15 as 1000000000000000.0 and rounded some ties the other way
        let mut v = vec![
            1.0e15f32,
            1.0e16,
            1.0e-7,
            123_456_790.0,
            0.3,
            16_777_216.0,
            -0.0,
            1.0e-45,
        ];
        let mut bits = 0x1234_5678u32;
        while v.len() < 20_000 {
            bits = bits.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let f = f32::from_bits(bits);
            if f.is_finite() {
                v.push(f);
            }
        }
        let t = text(v.clone(), None, 333);
        assert_eq!(&t[1..t.len() - 1], serde_json::to_string(&v).unwrap());
    }

    #[test]
    fn a_value_that_is_not_finite_is_not_written() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let refused = not_finite(&[1.0, bad]).expect("refused");
            assert_eq!(refused.status(), StatusCode::INTERNAL_SERVER_ERROR);
        }
        assert!(not_finite(&[1.0, f32::MAX]).is_none());
    }

    #[test]
    fn what_an_answer_holds_counts_against_the_budget() {
        let budget = BodyBudget::new(1 << 20);
        let held = reserve(&budget, 1000).unwrap();
        assert_eq!(budget.used(), 1000 * 4 + 1000 * VALUE_TEXT);
        // written whole: the values are let go of
        let a = Answer::new(String::new(), vec![1.0; 1000], None, "", held);
        assert_eq!(budget.used(), 1000 * VALUE_TEXT);
        drop(a);
        assert_eq!(budget.used(), 0);
        let e = reserve(&budget, 1 << 20).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let _held = reserve(&budget, 30_000).unwrap();
        let e = reserve(&budget, 30_000).unwrap_err();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
    }
}
