//! Queue places of completions: a request takes every place it needs when it is admitted (one
//! per completion; the prompt's forward of `echo` with `logprobs` runs on them), so a completion
//! admitted before `DELETE /models/NAME/VERSION` finishes while the version drains, and `echo`
//! with `logprobs` is answered by a version of one place.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use serde_json::{json, Value};

use super::forwards::Gated;
use super::{message, request, start_with, wait};
use crate::model::test_gpt_with;
use crate::registry::Served;
use crate::{Limits, LoadOptions};

/// The test gpt `g` as version `version`, admitting `queue` requests.
fn gpt_with_queue(version: &str, queue: usize) -> Served {
    let mut served = test_gpt_with(LoadOptions {
        queue,
        ..LoadOptions::default()
    });
    served.version = version.into();
    served
}

/// The choices' texts and legacy logprobs objects of a completion's answer.
fn choices(answer: &Value) -> Vec<(String, Value)> {
    let all = answer["choices"].as_array().cloned().unwrap_or_default();
    all.iter()
        .map(|c| {
            (
                c["text"].as_str().unwrap_or_default().to_string(),
                c["logprobs"].clone(),
            )
        })
        .collect()
}

#[test]
fn echo_with_logprobs_runs_its_prompt_on_the_requests_own_place() {
    let s = start_with(Limits::default(), vec![gpt_with_queue("one", 1)]);
    let complete = |model: &str, extra: Value| {
        let mut body = json!({"model": model, "prompt": "to be", "echo": true, "logprobs": 2, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        request(s.inference, "POST", "/v1/completions", &body.to_string(), false)
    };
    // scoring the prompt alone (max_tokens 0) and with a completion: each needs one place
    for extra in [json!({"max_tokens": 0}), json!({"max_tokens": 3})] {
        let (status, answer) = complete("g:one", extra.clone());
        assert_eq!(status, 200, "{extra}: {answer}");
        // what a version with places to spare answers
        let (status, roomy) = complete("g", extra.clone());
        assert_eq!(status, 200, "{extra}: {roomy}");
        assert_eq!(choices(&answer), choices(&roomy), "{extra}");
        let tokens = answer["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .map_or(0, Vec::len);
        assert_eq!(tokens, 5 + extra["max_tokens"].as_u64().unwrap() as usize, "{answer}");
    }
    // two completions do need two places: refused, naming n and the queue, with advice that holds
    let (status, answer) = complete("g:one", json!({"max_tokens": 1, "n": 2}));
    assert_eq!(status, 400, "{answer}");
    let m = message(&answer);
    assert!(
        m.contains("n: 2 completions need 2 queue places (one each), more than model g version one has (1); lower n"),
        "{m}"
    );
    // every place is back
    let (status, described) = request(s.management, "GET", "/models/g/one", "", true);
    assert_eq!((status, &described[0]["queueDepth"]), (200, &json!(0)), "{described}");
}

#[test]
fn a_completion_admitted_before_its_version_is_unregistered_finishes() {
    // version 2 of two places, whose prompt forward (echo with logprobs) waits on the test
    let gate = Arc::new(RwLock::new(()));
    let began = Arc::new(AtomicUsize::new(0));
    let mut served = gpt_with_queue("2", 2);
    served.model = Arc::new(Gated {
        inner: served.model.clone(),
        gate: gate.clone(),
        began: began.clone(),
    });
    let s = start_with(Limits::default(), vec![served]);
    let closed = gate.write().unwrap();
    let body = json!({"model": "g:2", "prompt": "to be", "max_tokens": 2, "n": 2, "echo": true, "logprobs": 1,
        "temperature": 0})
    .to_string();
    let (inference, management) = (s.inference, s.management);
    let completing = std::thread::spawn(move || request(inference, "POST", "/v1/completions", &body, false));
    assert!(
        wait(|| began.load(Ordering::SeqCst) == 1),
        "the prompt's forward did not begin"
    );
    // in its prompt's forward, the request holds both of its places, and no third
    let (status, described) = request(management, "GET", "/models/g/2", "", true);
    assert_eq!((status, &described[0]["queueDepth"]), (200, &json!(2)), "{described}");
    // unregistered meanwhile: the version is gone at once and drains
    let deleting = std::thread::spawn(move || request(management, "DELETE", "/models/g/2", "", true));
    assert!(
        wait(|| request(management, "GET", "/models/g/2", "", true).0 == 404),
        "the version was not removed"
    );
    assert!(
        !deleting.is_finished(),
        "unregistered before its admitted request finished"
    );
    drop(closed);
    // the request admitted before the call finishes: both completions, after the echoed prompt
    let (status, answer) = completing.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    let got = choices(&answer);
    assert_eq!(got.len(), 2, "{answer}");
    for (text, logprobs) in &got {
        assert!(text.starts_with("to be"), "{answer}");
        assert_eq!(logprobs["tokens"].as_array().map(Vec::len), Some(7), "{answer}");
    }
    let (status, answer) = deleting.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    // the other version answers the same
    let (status, _) = request(
        inference,
        "POST",
        "/v1/completions",
        &json!({"model": "g", "prompt": "to be", "max_tokens": 2}).to_string(),
        false,
    );
    assert_eq!(status, 200);
}
