//! Requests while their model runs: a streamed completion that fails halfway (a gpt whose
//! position 8 gives NaN logits) ends with its error and no usage chunk, and a request held in
//! its forward (a model that waits on the test) counts its input against the budget, so that
//! a request that would pass the budget meanwhile is a 503 with `Retry-After`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::{json, Value};
use weft_core::{Result, Tensor};
use weft_models::Model;
use weft_nn::{Context, Module};

use super::answers::{infer_raw, split_answer, status};
use super::{exchange, message, request, start_with, wait};
use crate::model::{test_gpt, test_version};
use crate::registry::Served;
use crate::Limits;

/// The test gpt `g` as version `broken`, whose position `at` gives NaN logits: a completion
/// fails at the token drawn there.
fn broken_gpt(at: usize) -> Served {
    let mut served = test_gpt();
    served.version = "broken".into();
    let lm = served.lm.clone().expect("a language model");
    let (_, wpe) = lm
        .parameters()
        .into_iter()
        .find(|(name, _)| name == "transformer.wpe.weight")
        .expect("position embeddings");
    let width = wpe.shape()[1];
    let mut rows = wpe.to_vec::<f32>().unwrap();
    rows[at * width..(at + 1) * width].fill(f32::NAN);
    wpe.copy_from(&Tensor::from_vec(rows, wpe.shape()).unwrap()).unwrap();
    served
}

/// The `data:` events of a streamed completion of `body` (`[DONE]` as `null`).
fn events(addr: std::net::SocketAddr, body: &Value) -> Vec<Value> {
    let body = body.to_string();
    let raw = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let got = exchange(addr, raw.as_bytes(), Duration::from_secs(30)).expect("no answer in 30 s");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or(Value::Null))
        .collect()
}

#[test]
fn a_stream_that_fails_halfway_ends_with_its_error_and_no_usage() {
    let s = start_with(Limits::default(), vec![broken_gpt(8)]);
    // a prompt of 5 tokens: the tokens drawn at positions 4 to 7 come, the fifth fails
    for n in [1, 2] {
        let body = json!({"model": "g:broken", "prompt": "to be", "max_tokens": 10, "n": n, "stream": true,
            "seed": 1, "stream_options": {"include_usage": true}});
        let events = events(s.inference, &body);
        let [chunks @ .., error, done] = events.as_slice() else {
            panic!("{events:?}")
        };
        assert_eq!(*done, Value::Null, "{events:?}");
        assert!(message(error).contains("new token 4"), "n = {n}: {events:?}");
        assert_eq!(error["error"]["type"], "server_error", "{error}");
        // the text made before the failure came (each completion's 4 tokens, but what one
        // still had to send when another's error ended the stream), with no usage and no
        // other error
        let text: String = chunks
            .iter()
            .map(|c| c["choices"][0]["text"].as_str().expect("a text chunk"))
            .collect();
        let count = text.chars().count();
        assert!((4..=4 * n).contains(&count), "n = {n}: {events:?}");
        for c in chunks {
            assert!(c["usage"].is_null() && c.get("error").is_none(), "n = {n}: {c}");
            assert!(c["choices"][0]["finish_reason"].is_null(), "n = {n}: {c}");
        }
    }
    // without a stream: a 500 naming the cause
    let body = json!({"model": "g:broken", "prompt": "to be", "max_tokens": 10, "seed": 1});
    let (status, answer) = request(s.inference, "POST", "/v1/completions", &body.to_string(), false);
    assert_eq!(status, 500, "{answer}");
    assert!(message(&answer).contains("new token 4"), "{answer}");
    // the model's other positions, and the other versions, still answer
    let body = json!({"model": "g:broken", "prompt": "to be", "max_tokens": 3, "stream": true,
        "stream_options": {"include_usage": true}});
    let events = events(s.inference, &body);
    let usage = &events[events.len() - 2]["usage"];
    assert_eq!(usage["completion_tokens"], 3, "{events:?}");
}

/// A model whose forward waits while the test holds `gate`, counting the forwards that began.
struct Gated {
    inner: Arc<dyn Model>,
    gate: Arc<RwLock<()>>,
    began: Arc<AtomicUsize>,
}

impl Module for Gated {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        self.inner.parameters()
    }
}

impl Model for Gated {
    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self.inner.loss(inputs, targets)
    }

    fn logits(&self, inputs: &Tensor) -> Result<Tensor> {
        self.began.fetch_add(1, Ordering::SeqCst);
        // held (poisoned or not) until the forward is done
        let _open = self.gate.read();
        self.inner.logits(inputs)
    }

    fn context(&self) -> &Context {
        self.inner.context()
    }
}

#[test]
fn a_request_past_the_budget_while_another_is_in_its_forward_is_a_503() {
    let gate = Arc::new(RwLock::new(()));
    let began = Arc::new(AtomicUsize::new(0));
    let mut held = test_version("held", 8, 1);
    held.model = Arc::new(Gated {
        inner: held.model.clone(),
        gate: gate.clone(),
        began: began.clone(),
    });
    let s = start_with(
        Limits {
            body_bytes: 2 << 20,
            body_bytes_in_flight: 2 << 20,
            ..Limits::default()
        },
        vec![held],
    );
    let closed = gate.write().unwrap();
    // 1,000 rows padded to 1.5 MB: its input is larger than its answer (3,000 values, 72 kB)
    let rows = infer_raw(1000, "1,-1");
    let (head, body) = rows.split_once("\r\n\r\n").unwrap();
    let padded = format!("{body}{}", " ".repeat(1_500_000 - body.len()));
    let head = head
        .replace("/v2/models/m/infer", "/v2/models/m/versions/held/infer")
        .replace(&format!("Content-Length: {}", body.len()), "Content-Length: 1500000");
    let first = format!("{head}\r\n\r\n{padded}");
    let addr = s.inference;
    let answering = std::thread::spawn(move || exchange(addr, first.as_bytes(), Duration::from_secs(60)));
    assert!(wait(|| began.load(Ordering::SeqCst) == 1), "the forward did not begin");
    // in its forward, the request holds its input's bytes
    let used = s.bodies.used();
    assert!(used >= 1_500_000, "{used} bytes held in the forward");
    // 60,000 values (1.3 MB held while sent) from a model that is free: past the budget now
    let got = exchange(addr, infer_raw(20_000, "1,-1").as_bytes(), Duration::from_secs(30)).expect("an answer");
    let (head, body) = split_answer(&got);
    assert_eq!(status(&got), 503, "{head}");
    assert!(head.contains("retry-after: 1"), "{head}");
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert!(message(&body).contains("this answer's 60000 output values"), "{body}");
    // the forward ends: the first is answered, what it held given back, and the second fits
    drop(closed);
    let got = answering.join().unwrap().expect("the first request got no answer");
    assert_eq!(status(&got), 200, "{}", split_answer(&got).0);
    assert!(wait(|| s.bodies.used() == 0), "{} bytes held", s.bodies.used());
    let got = exchange(addr, infer_raw(20_000, "1,-1").as_bytes(), Duration::from_secs(30)).expect("an answer");
    assert_eq!(status(&got), 200);
}
