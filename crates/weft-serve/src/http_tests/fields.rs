//! Fields a request may give: Triton's generate and KServe's infer refuse fields and parameters
//! they do not define, naming them, take those the protocols define (`id`, `parameters`) and
//! refuse binary tensor data, which weft does not do; `/v1/completions` takes `null` for
//! `stream` and `echo`; INT64 data outside INT64's range says so.

use std::time::Duration;

use serde_json::{json, Value};

use super::{exchange, message, parse, request, start};
use crate::Limits;

#[test]
fn generate_refuses_fields_it_does_not_define_and_takes_those_it_does() {
    let s = start(Limits::default());
    let generate = |path: &str, body: Value| request(s.inference, "POST", path, &body.to_string(), false);
    for (path, body, want) in [
        (
            "/v2/models/g/generate",
            json!({"text_input": "a", "parameters": {"max_new_tokens": 3}}),
            "unknown field `max_new_tokens`, expected one of `max_tokens`",
        ),
        (
            "/v2/models/g/generate",
            json!({"text_input": "a", "max_new_tokens": 3}),
            "unknown field `max_new_tokens`, expected one of `id`, `text_input`, `parameters`",
        ),
        (
            "/v2/models/g/generate",
            json!({"text_input": "a", "max_tokens": 3, "parameters": {"max_tokens": 3}}),
            "max_tokens is given both at the top level and in parameters",
        ),
        (
            "/v2/models/g/generate",
            json!({"text_input": "a", "stream": true}),
            "stream: true asks for a stream",
        ),
        (
            "/v2/models/g/generate_stream",
            json!({"text_input": "a", "parameters": {"repetition_penalty": 1.1}}),
            "unknown field `repetition_penalty`",
        ),
        (
            "/v2/models/g/generate",
            json!({"text_input": "a", "parameters": {"stream": true}}),
            "parameters.stream: true asks for a stream",
        ),
        (
            "/v2/models/g/generate_stream",
            json!({"text_input": "a", "parameters": {"stream": false}}),
            "parameters.stream: false asks for one answer",
        ),
    ] {
        let (status, answer) = generate(path, body.clone());
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(message(&answer).contains(want), "{body}: {answer}");
    }
    // taken: the request's id (given back), `stream` agreeing with the endpoint, null parameters
    let params = json!({"max_tokens": 3, "temperature": 0});
    let (status, plain) = generate(
        "/v2/models/g/generate",
        json!({"text_input": "a", "parameters": params}),
    );
    assert_eq!(status, 200, "{plain}");
    assert!(plain.get("id").is_none(), "{plain}");
    let mut with_stream = params.clone();
    with_stream["stream"] = json!(false);
    let (status, answer) = generate(
        "/v2/models/g/generate",
        json!({"id": "r7", "text_input": "a", "parameters": with_stream}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], "r7");
    assert_eq!(answer["text_output"], plain["text_output"]);
    let (status, answer) = generate("/v2/models/g/generate", json!({"text_input": "a", "parameters": null}));
    assert_eq!(status, 200, "{answer}");
    // the same parameters at the top level, as TensorRT-LLM's clients send them (Triton hands
    // top-level fields to the model as inputs)
    let (status, answer) = generate(
        "/v2/models/g/generate",
        json!({"text_input": "a", "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["text_output"], plain["text_output"]);
    // streamed: each event gives the id back
    let body = json!({"id": "s1", "text_input": "a", "parameters": {"max_tokens": 2, "stream": true}}).to_string();
    let raw = format!(
        "POST /v2/models/g/generate_stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let got = exchange(s.inference, raw.as_bytes(), Duration::from_secs(30)).expect("no answer in 30 s");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(!events.is_empty() && events.iter().all(|e| e["id"] == "s1"), "{text}");
}

#[test]
fn infer_refuses_fields_it_does_not_define_and_binary_data() {
    let s = start(Limits::default());
    let input = json!({"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [0.5, -1]});
    let infer = |extra: Value| {
        let mut body = json!({"inputs": [input]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        request(s.inference, "POST", "/v2/models/m/infer", &body.to_string(), false)
    };
    let mut odd_input = input.clone();
    odd_input["contents"] = json!({"fp32_contents": [0.5, -1]});
    let mut binary_input = input.clone();
    binary_input["parameters"] = json!({"binary_data_size": 8});
    for (extra, want) in [
        (json!({"request_id": "r"}), "unknown field `request_id`"),
        (
            json!({"parameters": {"priority": 1}}),
            "unknown field `priority`, expected one of `binary_data_output`",
        ),
        (
            json!({"outputs": [{"name": "logits", "parameters": {"classification": 2}}]}),
            "outputs[0].parameters.classification: unknown field `classification`",
        ),
        (
            json!({"inputs": [odd_input]}),
            "inputs[0].contents: unknown field `contents`",
        ),
        (
            json!({"inputs": [binary_input]}),
            "inputs[0].parameters.binary_data_size: 8 bytes of binary data",
        ),
    ] {
        let (status, answer) = infer(extra.clone());
        assert_eq!(status, 400, "{extra}: {answer}");
        assert!(message(&answer).contains(want), "{extra}: {answer}");
    }
    // what the protocol defines, asking for JSON, is taken (tritonclient's binary_data=False)
    let (status, plain) = infer(json!({}));
    assert_eq!(status, 200, "{plain}");
    let mut json_input = input.clone();
    json_input["parameters"] = json!({});
    let (status, answer) = infer(json!({"id": "r1", "parameters": {"binary_data_output": false},
        "inputs": [json_input], "outputs": [{"name": "logits", "parameters": {"binary_data": false}}]}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!((&answer["id"], &answer["outputs"]), (&json!("r1"), &plain["outputs"]));
    // MLServer's codecs' content types and headers are hints: taken, the answer the same
    let mut np_input = input.clone();
    np_input["parameters"] = json!({"content_type": "np"});
    let (status, answer) = infer(json!({"parameters": {"content_type": "np", "headers": {"x": "y"}},
        "inputs": [np_input], "outputs": [{"name": "logits", "parameters": {"content_type": "np"}}]}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["outputs"], plain["outputs"]);
    // outputs asked for as binary (tritonclient's default without `outputs`) come back in JSON,
    // which Triton's clients read as from a server without the extension
    for extra in [
        json!({"parameters": {"binary_data_output": true}}),
        json!({"outputs": [{"name": "logits", "parameters": {"binary_data": true}}]}),
    ] {
        let (status, answer) = infer(extra.clone());
        assert_eq!(status, 200, "{extra}: {answer}");
        assert_eq!(answer["outputs"], plain["outputs"], "{extra}");
    }
    // a body of JSON then binary data (Triton's binary data extension) is named as such
    let body = json!({"inputs": [binary_input]}).to_string();
    let mut raw = format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nInference-Header-Content-Length: {}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len(),
        body.len() + 8
    )
    .into_bytes();
    raw.extend(0.5f32.to_le_bytes().into_iter().chain((-1f32).to_le_bytes()));
    let got = exchange(s.inference, &raw, Duration::from_secs(30)).expect("no answer in 30 s");
    let (status, answer) = parse(&got).expect("an HTTP answer");
    assert_eq!(status, 400, "{answer}");
    assert!(
        message(&answer).contains("Inference-Header-Content-Length: binary tensor data is not supported"),
        "{answer}"
    );
}

#[test]
fn completions_take_null_for_stream_and_echo() {
    let s = start(Limits::default());
    let complete = |body: Value| request(s.inference, "POST", "/v1/completions", &body.to_string(), false);
    let (status, plain) = complete(json!({"model": "g", "prompt": "to be", "max_tokens": 4, "seed": 2}));
    assert_eq!(status, 200, "{plain}");
    let (status, answer) =
        complete(json!({"model": "g", "prompt": "to be", "max_tokens": 4, "seed": 2, "stream": null, "echo": null}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"], plain["choices"]);
    // stream_options still needs stream: true
    let (status, answer) = complete(json!({"model": "g", "prompt": "to be", "stream": null,
        "stream_options": {"include_usage": true}}));
    assert_eq!(status, 400, "{answer}");
    assert!(message(&answer).contains("stream_options"), "{answer}");
}

#[test]
fn int64_data_past_its_range_says_so() {
    let s = start(Limits::default());
    for (path, body, want) in [
        (
            "/predictions/g",
            "[[1e300]]",
            "data[0] = 1e300 is a whole number outside INT64's range",
        ),
        (
            "/v2/models/g/infer",
            r#"{"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2.0]}]}"#,
            "data[1] = 2.0 is written as a decimal",
        ),
        (
            "/predictions/g",
            "[[1.5]]",
            "data[0] = 1.5 is not a whole number (INT64)",
        ),
    ] {
        let (status, answer) = request(s.inference, "POST", path, body, false);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(message(&answer).contains(want), "{body}: {answer}");
    }
}
