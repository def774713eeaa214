//! Stop sequences through the server: OpenAI's `stop` and Triton's `parameters.stop` end the
//! generation at the first one the text holds, the text excludes it, `finish_reason` says
//! `"stop"`, and a stream sends exactly that text (no part of the stop sequence).

use serde_json::{json, Value};

use crate::support::Server;

/// `(text, finish_reason, completion_tokens)` of a completion request.
fn complete(s: &Server, body: &Value) -> (String, String, u64) {
    let (status, answer) = s.post("/v1/completions", body.to_string());
    assert_eq!(status, 200, "{body}: {answer}");
    let choice = &answer["choices"][0];
    (
        choice["text"].as_str().unwrap().to_string(),
        choice["finish_reason"].as_str().unwrap().to_string(),
        answer["usage"]["completion_tokens"].as_u64().unwrap(),
    )
}

/// `(text, finish_reason)` of a streamed completion request: its chunks' text joined, its last
/// chunk's reason.
fn complete_streamed(s: &Server, body: &Value) -> (String, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let events = s.events("/v1/completions", &body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    let finish = chunks.last().unwrap()["choices"][0]["finish_reason"]
        .as_str()
        .unwrap()
        .to_string();
    (text, finish)
}

/// Triton's generate and its stream's joined text for `params`.
fn generate_both(s: &Server, params: Value) -> (String, String) {
    let body = json!({"text_input": "\nFirst", "parameters": params});
    let (status, answer) = s.post("/v2/models/gpt/generate", body.to_string());
    assert_eq!(status, 200, "{answer}");
    let streamed = s.stream_texts("/v2/models/gpt/generate_stream", &body).concat();
    (answer["text_output"].as_str().unwrap().to_string(), streamed)
}

/// The text before the earliest of `stops` in `text`, and how many characters that takes to
/// reach the stop's end (the tiny gpt's tokenizer is one character a token).
fn cut(text: &str, stops: &[&str]) -> (String, usize) {
    let (at, stop) = stops
        .iter()
        .filter_map(|s| text.find(s).map(|at| (at, *s)))
        .min()
        .expect("a stop in the text");
    (
        text[..at].to_string(),
        text[..at].chars().count() + stop.chars().count(),
    )
}

pub fn stop_sequences_end_the_text(s: &Server) {
    let base = json!({"model": "gpt", "prompt": "\nFirst", "max_tokens": 40, "seed": 5, "temperature": 0.8});
    let (full, finish, tokens) = complete(s, &base);
    assert_eq!((finish.as_str(), tokens), ("length", 40));
    // two characters from the middle of the text, and the text before their first occurrence
    let chars: Vec<char> = full.chars().collect();
    let stop: String = chars[20..22].iter().collect();
    let (want, stop_tokens) = cut(&full, &[&stop]);
    assert!(stop_tokens <= 22);

    for stops in [json!(stop), json!(["never there", stop]), json!([stop, stop])] {
        let mut body = base.clone();
        body["stop"] = stops.clone();
        let (text, finish, tokens) = complete(s, &body);
        assert_eq!(text, want, "stop {stops}");
        assert_eq!(finish, "stop");
        // generation ended with the stop sequence's last token, not at max_tokens
        assert_eq!(tokens, stop_tokens as u64);
        // a stream sends the same text: nothing of the stop sequence, nothing after it
        assert_eq!(
            complete_streamed(s, &body),
            (want.clone(), "stop".to_string()),
            "stop {stops}"
        );
    }

    // the earliest of several stops wins, whichever is listed first
    let first: String = chars[3..4].iter().collect();
    let (early, _) = cut(&full, &[&stop, &first]);
    let mut body = base.clone();
    body["stop"] = json!([stop, first]);
    assert_eq!(complete(s, &body).0, early);

    // a stop that never comes: the whole text, "length"
    body["stop"] = json!(["@@never@@"]);
    assert_eq!(complete(s, &body), (full.clone(), "length".into(), 40));
    assert_eq!(complete_streamed(s, &body), (full, "length".into()));

    // Triton's parameters.stop, answered and streamed
    let params = json!({"max_tokens": 40, "seed": 9});
    let (full, streamed) = generate_both(s, params.clone());
    assert_eq!(streamed, full);
    let chars: Vec<char> = full.chars().collect();
    let stop: String = chars[15..18].iter().collect();
    let (want, _) = cut(&full, &[&stop]);
    let mut params = params;
    params["stop"] = json!(stop);
    assert_eq!(generate_both(s, params), (want.clone(), want));
}
