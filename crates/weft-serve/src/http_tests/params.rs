//! Parameters that were taken without effect: `/v1/completions` honours `top_k` and refuses
//! OpenAI's parameters it does not implement (taking their neutral values) and fields it does
//! not know, naming them; the management API refuses a query parameter given twice, one a call
//! does not take, and checks TorchServe's `initial_workers` as `workers`.

use serde_json::{json, Value};

use super::{message, request, start};
use crate::Limits;

#[test]
fn completions_honour_top_k_and_refuse_what_they_do_not_implement() {
    let s = start(Limits::default());
    let complete = |extra: Value| {
        let mut body = json!({"model": "g", "prompt": "to be", "max_tokens": 12, "temperature": 1.0, "seed": 3});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        request(s.inference, "POST", "/v1/completions", &body.to_string(), false)
    };
    let text = |answer: &Value| answer["choices"][0]["text"].as_str().unwrap_or_default().to_string();
    let (status, greedy) = complete(json!({"temperature": 0}));
    assert_eq!(status, 200, "{greedy}");
    // top_k 1 keeps the most likely token only: greedy, whatever the temperature and seed
    for seed in [3, 4, 5] {
        let (status, answer) = complete(json!({"top_k": 1, "seed": seed}));
        assert_eq!(status, 200, "{answer}");
        assert_eq!(text(&answer), text(&greedy), "seed {seed}");
    }
    // the same sampling as Triton's generate with the same parameters and seed
    let triton = json!({"text_input": "to be", "parameters": {"max_tokens": 12, "temperature": 1.0, "top_k": 3, "top_p": 1.0, "seed": 3}});
    let (status, generated) = request(s.inference, "POST", "/v2/models/g/generate", &triton.to_string(), false);
    assert_eq!(status, 200, "{generated}");
    let (status, answer) = complete(json!({"top_k": 3}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(text(&answer), generated["text_output"].as_str().unwrap());
    // refused, naming the field, in OpenAI's shape
    for (extra, field) in [
        (json!({"top_k": "x"}), "top_k"),
        (json!({"top_k": -1}), "top_k"),
        (json!({"logit_bias": {"5": 100}}), "logit_bias"),
        (json!({"logit_bias": "x"}), "logit_bias"),
        (json!({"best_of": 5}), "best_of"),
        (json!({"presence_penalty": 2}), "presence_penalty"),
        (json!({"frequency_penalty": -0.5}), "frequency_penalty"),
        (json!({"suffix": "zz"}), "suffix"),
        (json!({"repetition_penalty": 1.2}), "repetition_penalty"),
        (json!({"stream_options": {"include_usage": true}}), "stream_options"),
    ] {
        let (status, answer) = complete(extra.clone());
        assert_eq!(status, 400, "{extra}: {answer}");
        assert!(message(&answer).contains(field), "{extra}: {answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error", "{answer}");
    }
    // their neutral values, as clients send by default, are taken
    let neutral = json!({"presence_penalty": 0, "frequency_penalty": 0.0, "best_of": 1, "logit_bias": {},
        "suffix": null, "user": "someone"});
    let (status, answer) = complete(neutral);
    assert_eq!(status, 200, "{answer}");
    let (_, plain) = complete(json!({}));
    assert_eq!(text(&answer), text(&plain));
}

/// The JSON events of a streamed completion of `body` (`data: [DONE]` last, as `null`).
fn streamed(addr: std::net::SocketAddr, body: &Value) -> Vec<Value> {
    super::sse_events(addr, "/v1/completions", body)
}

#[test]
fn a_stream_with_include_usage_ends_with_the_usage() {
    let s = start(Limits::default());
    let body = json!({"model": "g", "prompt": "to be", "max_tokens": 5, "n": 2, "stream": true, "seed": 1,
        "stream_options": {"include_usage": true}});
    let events = streamed(s.inference, &body);
    let [chunks @ .., last, done] = events.as_slice() else {
        panic!("{events:?}")
    };
    assert_eq!(*done, Value::Null, "{events:?}");
    // OpenAI's shape: no choices, the usage of the whole request
    assert_eq!(last["choices"], json!([]), "{last}");
    let completion_tokens = last["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((2..=10).contains(&completion_tokens), "{last}");
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": completion_tokens, "total_tokens": 5 + completion_tokens})
    );
    // the same count as the answer without a stream
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    whole.as_object_mut().unwrap().remove("stream_options");
    let (status, answer) = request(s.inference, "POST", "/v1/completions", &whole.to_string(), false);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"], last["usage"]);
    // every other chunk has a null usage
    assert!(!chunks.is_empty());
    for c in chunks {
        assert!(
            c["usage"].is_null() && c.as_object().unwrap().contains_key("usage"),
            "{c}"
        );
        assert_eq!(c["choices"].as_array().map(Vec::len), Some(1), "{c}");
    }
    // without it: no usage chunk, no usage field
    let mut plain = body.clone();
    plain["stream_options"] = json!({"include_usage": false});
    let events = streamed(s.inference, &plain);
    assert!(
        events[..events.len() - 1]
            .iter()
            .all(|c| c.get("usage").is_none() && c["choices"].as_array().map(Vec::len) == Some(1)),
        "{events:?}"
    );
}

#[test]
fn management_queries_name_each_parameter_once_and_only_those_taken() {
    let s = start(Limits::default());
    let manage = |method: &str, path: &str| request(s.management, method, path, "", true);
    for (method, path, want) in [
        ("POST", "/models?url=h&url=elsewhere&model_name=h", "url: given twice"),
        (
            "POST",
            "/models?url=h&model_name=h&model_name=i",
            "model_name: given twice",
        ),
        ("PUT", "/models/m?split=1:1&split=2:1", "split: given twice"),
        ("PUT", "/models/m/1?workers=2&workers=3", "workers: given twice"),
        (
            "POST",
            "/models?url=h&model_name=h&initial_workers=0",
            "initial_workers: \"0\" is not a whole number from 1 to 64",
        ),
        (
            "POST",
            "/models?url=h&model_name=h&initial_workers=65",
            "initial_workers",
        ),
        (
            "POST",
            "/models?url=h&model_name=h&initial_workers=2&workers=2",
            "give one of them",
        ),
        (
            "POST",
            "/models?url=h&model_name=h&handler=custom.py",
            "unknown query parameter \"handler\"",
        ),
        ("POST", "/models?url=h&model_name=h&synchronous=false", "synchronous"),
        (
            "PUT",
            "/models/m?min_worker=2",
            "unknown query parameter \"min_worker\"",
        ),
    ] {
        let (status, answer) = manage(method, path);
        assert_eq!(status, 400, "{path}: {answer}");
        assert!(message(&answer).contains(want), "{path}: {answer}");
    }
    // nothing was changed: one worker each, no split
    let (status, described) = manage("GET", "/models/m/all");
    assert_eq!(status, 200);
    for v in described.as_array().unwrap() {
        assert!(v["trafficShare"].is_null(), "{described}");
        assert_eq!(v["workers"], 1, "{described}");
    }
    // taken: the checks go on to the folder, which is not there
    let (status, answer) = manage("POST", "/models?url=h&model_name=h&initial_workers=3&synchronous=true");
    assert_eq!(status, 404, "{answer}");
}
