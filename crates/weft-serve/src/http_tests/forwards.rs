//! Requests while their model runs: a streamed completion that fails halfway (a gpt whose
//! position 8 gives NaN logits) ends with its error and no usage chunk, also while another
//! completion of it waits in its forward, and a request held in its forward (a model that waits
//! on the test) counts its input against the budget, so that a request that would pass the
//! budget meanwhile is a 503 with `Retry-After`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::{json, Value};
use weft_core::Device;
use weft_core::{Result, Tensor};
use weft_models::{CachedTokens, KvCache, LanguageModel, Model, StageCut, StagedModel};
use weft_nn::parallel::TpGroup;
use weft_nn::{Context, Module};

use super::answers::{infer_raw, split_answer, status};
use super::{exchange, message, request, start_with, wait};
use crate::model::{test_gpt, test_gpt_with, test_version};
use crate::registry::Served;
use crate::{Limits, LoadOptions};

/// The test gpt `g` as version `broken`, whose position `at` gives NaN logits: a completion
/// fails at the token drawn there.
fn broken_gpt(at: usize) -> Served {
    broken(test_gpt(), at)
}

/// `served` (the test gpt) as version `broken`, whose position `at` gives NaN logits.
fn broken(mut served: Served, at: usize) -> Served {
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
    super::sse_events(addr, "/v1/completions", body)
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

/// A language model whose cached forwards after the first `free` wait while the test holds
/// `gate`.
struct GatedLm {
    inner: Arc<dyn LanguageModel>,
    free: usize,
    calls: AtomicUsize,
    gate: Arc<RwLock<()>>,
}

impl Module for GatedLm {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        self.inner.parameters()
    }
}

impl Model for GatedLm {
    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self.inner.loss(inputs, targets)
    }

    fn logits(&self, inputs: &Tensor) -> Result<Tensor> {
        self.inner.logits(inputs)
    }

    fn context(&self) -> &Context {
        self.inner.context()
    }
}

impl StagedModel for GatedLm {
    fn stage_forward(&self, stage: usize, stages: usize, input: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self.inner.stage_forward(stage, stages, input, targets)
    }

    fn stage_parameters(&self, stage: usize, stages: usize) -> Result<Vec<(String, Tensor)>> {
        self.inner.stage_parameters(stage, stages)
    }

    fn activation_shape(&self, input_shape: &[usize]) -> Vec<usize> {
        self.inner.activation_shape(input_shape)
    }

    fn shared_parameters(&self) -> Vec<String> {
        self.inner.shared_parameters()
    }

    fn stage_context(&self) -> &Context {
        self.inner.stage_context()
    }
}

impl LanguageModel for GatedLm {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    fn device(&self) -> Device {
        self.inner.device()
    }

    fn forward_ids(&self, idx: &Tensor) -> Result<Tensor> {
        self.inner.forward_ids(idx)
    }

    fn new_cache(&self) -> KvCache {
        self.inner.new_cache()
    }

    fn forward_cached(&self, seqs: &mut [CachedTokens]) -> Result<Tensor> {
        if self.calls.fetch_add(1, Ordering::SeqCst) >= self.free {
            let _open = self.gate.read();
            return self.inner.forward_cached(seqs);
        }
        self.inner.forward_cached(seqs)
    }

    fn make_tensor_parallel(&mut self, _group: &TpGroup) -> Result<()> {
        unreachable!("served whole")
    }

    fn set_stage_cut(&mut self, _cut: StageCut) {}
}

#[test]
fn a_failed_completion_ends_its_stream_without_waiting_for_the_others() {
    // one sequence at a time: the second completion waits for the first, which fails at its 5th
    // step (its 5 forwards: the prompt, then 4 tokens); the second's next forward waits on the
    // test, so it makes no piece while the stream ends
    let mut served = broken(
        test_gpt_with(LoadOptions {
            max_sequences: 1,
            ..LoadOptions::default()
        }),
        8,
    );
    let gate = Arc::new(RwLock::new(()));
    served.lm = Some(Arc::new(GatedLm {
        inner: served.lm.clone().expect("a language model"),
        free: 5,
        calls: AtomicUsize::new(0),
        gate: gate.clone(),
    }));
    let s = start_with(Limits::default(), vec![served]);
    let closed = gate.write().unwrap();
    let body = json!({"model": "g:broken", "prompt": "to be", "max_tokens": 10, "n": 2, "stream": true,
        "seed": 1, "stream_options": {"include_usage": true}})
    .to_string();
    let raw = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let got = exchange(s.inference, raw.as_bytes(), Duration::from_secs(10));
    drop(closed);
    let got = got.expect("the stream did not end after the error");
    let text = String::from_utf8_lossy(&got);
    let events: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    let [.., error, done] = events.as_slice() else {
        panic!("{text}")
    };
    assert_eq!(*done, "[DONE]", "{text}");
    assert!(error.contains("new token 4"), "{text}");
}

/// A model whose forward waits while the test holds `gate`, counting the forwards that began.
pub(super) struct Gated {
    pub(super) inner: Arc<dyn Model>,
    pub(super) gate: Arc<RwLock<()>>,
    pub(super) began: Arc<AtomicUsize>,
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
