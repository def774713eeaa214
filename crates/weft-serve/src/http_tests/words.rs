//! TensorRT-LLM's request fields on Triton's generate: the backend's documented request (`""`
//! for `bad_words` and `stop_words`, `pad_id` and `end_id`) is answered; `stop_words` end the
//! text before them, joined with `stop`; `bad_words` are never generated (a word of one token
//! never, a longer one's last token never after the rest); `end_id` ends the generation before
//! the token's text; `pad_id` is checked and changes nothing; wrong values are 400s naming the
//! field as the request gave it (top level or in `parameters`).

use std::net::SocketAddr;

use serde_json::{json, Value};

use super::{message, request, start};
use crate::model::test_gpt;
use crate::Limits;

/// The test gpt's prompt in these tests (its characters are in its vocabulary).
const PROMPT: &str = "to be";

/// `(status, answer)` of `POST /v2/models/g/generate` with `body`.
fn generate(addr: SocketAddr, body: &Value) -> (u16, Value) {
    request(addr, "POST", "/v2/models/g/generate", &body.to_string(), false)
}

/// The text of `generate`'s 200 answer to `body`.
fn text(addr: SocketAddr, body: &Value) -> String {
    let (status, answer) = generate(addr, body);
    assert_eq!(status, 200, "{body}: {answer}");
    answer["text_output"].as_str().expect("text_output").to_string()
}

/// The joined `text_output` of the events of `POST /v2/models/g/generate_stream` with `body`.
fn streamed(addr: SocketAddr, body: &Value) -> String {
    super::sse_events(addr, "/v2/models/g/generate_stream", body)
        .iter()
        .map(|event| {
            assert!(event.get("error").is_none(), "{event}");
            event["text_output"].as_str().unwrap().to_string()
        })
        .collect()
}

/// `base` with the fields of `extra` added at the top level.
fn with(base: &Value, extra: Value) -> Value {
    let mut body = base.clone();
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The test gpt's token id of the one-character `c`.
fn id_of(c: char) -> u32 {
    let tok = test_gpt().tokenizer.expect("a tokenizer");
    let ids = tok.encode(&c.to_string()).unwrap();
    assert_eq!(ids.len(), 1, "{c:?}");
    ids[0]
}

/// `text` before the first `c` (the whole text when it has none).
fn before(text: &str, c: char) -> &str {
    &text[..text.find(c).unwrap_or(text.len())]
}

/// A character of `text` first drawn after a few others.
fn drawn_later(text: &str) -> char {
    text.chars()
        .skip(3)
        .find(|c| text.find(*c).unwrap() >= 3)
        .unwrap_or_else(|| panic!("{text:?}"))
}

/// A sampled request of 30 tokens (the context slides past the test gpt's 16 positions).
fn sampled() -> Value {
    json!({"text_input": PROMPT, "max_tokens": 30, "temperature": 1.0, "seed": 3})
}

#[test]
fn tensorrt_llms_documented_request_is_answered() {
    let s = start(Limits::default());
    let plain = text(s.inference, &json!({"text_input": PROMPT, "max_tokens": 20}));
    // the TensorRT-LLM backend's request, with the test gpt's prompt
    let documented = json!({"text_input": PROMPT, "max_tokens": 20, "bad_words": "", "stop_words": ""});
    assert_eq!(text(s.inference, &documented), plain);
    // empty lists and empty words are none, in parameters too; pad_id changes nothing
    for extra in [
        json!({"bad_words": [], "stop_words": [""], "pad_id": 2}),
        json!({"parameters": {"bad_words": [""], "stop_words": [], "pad_id": 0}}),
        json!({"bad_words": null, "stop_words": null, "end_id": null, "pad_id": null}),
    ] {
        assert_eq!(
            text(
                s.inference,
                &with(&json!({"text_input": PROMPT, "max_tokens": 20}), extra.clone())
            ),
            plain,
            "{extra}"
        );
    }
    // the variant with "pad_id": 2, "end_id": 2: the text up to token 2, which ends it (at a
    // seed whose text draws token 2 after a few others)
    let tok = test_gpt().tokenizer.expect("a tokenizer");
    let end = tok.decode(&[2]).unwrap().chars().next().unwrap();
    let (seed, plain) = (1..100)
        .map(|seed| {
            (
                seed,
                text(
                    s.inference,
                    &json!({"text_input": PROMPT, "max_tokens": 20, "seed": seed}),
                ),
            )
        })
        .find(|(_, plain)| plain.find(end).is_some_and(|at| at >= 2))
        .unwrap_or_else(|| panic!("no seed draws {end:?}"));
    let with_ids = with(&documented, json!({"pad_id": 2, "end_id": 2, "seed": seed}));
    assert_eq!(text(s.inference, &with_ids), before(&plain, end));
}

#[test]
fn stop_words_end_the_text_before_them_with_stop() {
    let s = start(Limits::default());
    let full = text(s.inference, &sampled());
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 20, "{full:?}");
    // a stop word from the middle of the text: the text ends just before its first occurrence
    let word: String = chars[10..12].iter().collect();
    let at = full.find(&word).unwrap();
    let want = &full[..at];
    assert!(want.len() < full.len());
    for extra in [
        json!({"stop_words": word}),
        json!({"stop_words": ["", word]}),
        json!({"parameters": {"stop_words": [word]}}),
    ] {
        let body = with(&sampled(), extra.clone());
        assert_eq!(text(s.inference, &body), want, "{extra}");
        assert_eq!(streamed(s.inference, &body), want, "{extra}");
    }
    // joined with stop (either place): the earlier of the two ends the text
    let early: String = chars[3..5].iter().collect();
    let early_at = full.find(&early).unwrap();
    assert!(early_at < at, "{full:?}");
    for extra in [
        json!({"stop_words": [word], "parameters": {"stop": early}}),
        json!({"stop_words": early, "stop": [word]}),
        json!({"stop_words": [word, early], "stop": [word]}),
    ] {
        assert_eq!(
            text(s.inference, &with(&sampled(), extra.clone())),
            &full[..early_at],
            "{extra}"
        );
    }
    let never = "zzz";
    assert_eq!(
        text(
            s.inference,
            &with(&sampled(), json!({"stop_words": [never], "stop": word}))
        ),
        want
    );
}

#[test]
fn bad_words_are_never_generated() {
    let s = start(Limits::default());
    for base in [sampled(), with(&sampled(), json!({"temperature": 0}))] {
        let full = text(s.inference, &base);
        // a word of one token: that token is never drawn (one first drawn late in the text)
        let c = full
            .chars()
            .filter(|c| !PROMPT.contains(*c))
            .max_by_key(|c| full.find(*c).unwrap())
            .unwrap_or_else(|| panic!("{full:?}"));
        for extra in [
            json!({"bad_words": c.to_string()}),
            json!({"parameters": {"bad_words": ["", c.to_string()]}}),
        ] {
            let body = with(&base, extra.clone());
            let got = text(s.inference, &body);
            assert!(!got.contains(c), "{extra}: {got:?} (without: {full:?})");
            // greedy, the same tokens until the first place it was drawn (sampled, every draw
            // is made from the other tokens alone, and differs before)
            if base["temperature"] == 0 {
                assert!(got.starts_with(before(&full, c)), "{extra}: {got:?} vs {full:?}");
            }
            assert_eq!(got.chars().count(), full.chars().count(), "{got:?}");
            assert_eq!(streamed(s.inference, &body), got, "{extra}");
        }
        // a word of two tokens: its second is never drawn right after its first. Of the pairs
        // of the text, one whose second character came earlier alone (so banning either
        // character outright would change the text before the pair)
        let whole = format!("{PROMPT}{full}");
        let from = PROMPT.len() - 1;
        let pairs: Vec<(String, usize)> = (from + 1..whole.len())
            .map(|i| whole[i - 1..=i].to_string())
            .filter(|w| w.as_bytes()[0] != w.as_bytes()[1])
            // where its second character comes in the text without the ban
            .map(|w| (w.clone(), whole[from..].find(&w).unwrap()))
            .filter(|&(_, at)| at >= 1)
            .collect();
        let (word, at) = pairs
            .iter()
            .find(|(w, at)| full[..*at].contains(&w[1..]))
            .or(pairs.first())
            .cloned()
            .unwrap_or_else(|| panic!("{full:?}"));
        let got = text(s.inference, &with(&base, json!({"bad_words": [&word]})));
        let made = format!("{PROMPT}{got}");
        assert!(!made[from..].contains(&word), "{word:?} in {got:?} (without: {full:?})");
        // the same draws until the pair; its first character is drawn, then not its second
        assert_eq!(got[..at], full[..at], "{word:?}: {got:?} vs {full:?}");
        assert_eq!(&got[at - 1..at], &word[..1], "{word:?}: {got:?}");
        assert_ne!(&got[at..at + 1], &word[1..], "{word:?}: {got:?}");
        assert_eq!(streamed(s.inference, &with(&base, json!({"bad_words": [&word]}))), got);
    }
}

#[test]
fn end_id_ends_the_generation_before_its_token() {
    let s = start(Limits::default());
    let full = text(s.inference, &sampled());
    let c = drawn_later(&full);
    let want = before(&full, c);
    assert!(!want.is_empty() && want.len() < full.len(), "{full:?}");
    let id = id_of(c);
    for extra in [
        json!({"end_id": id}),
        json!({"parameters": {"end_id": id, "pad_id": id}}),
    ] {
        let body = with(&sampled(), extra.clone());
        assert_eq!(text(s.inference, &body), want, "{extra}");
        assert_eq!(streamed(s.inference, &body), want, "{extra}");
    }
    // an end token never drawn changes nothing
    let tok = test_gpt().tokenizer.expect("a tokenizer");
    let unused = (0..tok.vocab_size() as u32).find(|&t| !full.contains(tok.decode(&[t]).unwrap().as_str()));
    if let Some(unused) = unused {
        assert_eq!(text(s.inference, &with(&sampled(), json!({"end_id": unused}))), full);
    }
}

#[test]
fn wrong_values_are_400s_naming_the_field_as_given() {
    let s = start(Limits::default());
    let vocab = test_gpt().tokenizer.unwrap().vocab_size();
    let base = json!({"text_input": PROMPT, "max_tokens": 3});
    for (extra, want) in [
        (json!({"stop_words": 5}), "stop_words: expected a string or an array"),
        (json!({"stop_words": [1]}), "stop_words[0]: expected a string, got 1"),
        (
            json!({"stop_words": {"a": 1}}),
            "stop_words: expected a string or an array",
        ),
        (
            json!({"stop_words": ["a", "b", "c", "d", "e"]}),
            "stop_words: 5 strings, at most 4",
        ),
        (
            json!({"stop_words": ["a", "b", "c"], "stop": ["d", "e"]}),
            "stop_words and stop: 5 different stop sequences together, at most 4",
        ),
        (
            json!({"parameters": {"stop_words": 5}}),
            "parameters.stop_words: expected a string or an array",
        ),
        (
            json!({"stop_words": "x".repeat(257)}),
            "stop_words: a string of 257 bytes",
        ),
        (json!({"bad_words": 5}), "bad_words: expected a string or an array"),
        (
            json!({"bad_words": ["a", true]}),
            "bad_words[1]: expected a string, got true",
        ),
        (json!({"bad_words": "Z"}), "bad_words: the word \"Z\" cannot be encoded"),
        (
            json!({"parameters": {"bad_words": ["", "a", "Z"]}}),
            "parameters.bad_words: the word \"Z\" cannot be encoded",
        ),
        (json!({"bad_words": vec!["a"; 9]}), "bad_words: 9 strings, at most 8"),
        (json!({"end_id": -1}), "end_id: -1 is not a token id"),
        (json!({"end_id": vocab}), &*format!("end_id: {vocab} is not a token id")),
        (json!({"end_id": "2"}), "end_id: \"2\" is not a token id"),
        (json!({"end_id": 1.5}), "end_id: 1.5 is not a token id"),
        (json!({"end_id": [2]}), "end_id: an array is not a token id"),
        (
            json!({"parameters": {"end_id": -1}}),
            "parameters.end_id: -1 is not a token id",
        ),
        (json!({"pad_id": vocab}), &*format!("pad_id: {vocab} is not a token id")),
        (json!({"pad_id": -2}), "pad_id: -2 is not a token id"),
        (
            json!({"end_id": 2, "parameters": {"end_id": 2}}),
            "end_id is given both at the top level and in parameters",
        ),
        // as given: at the top level, not in parameters
        (json!({"stream": true}), "stream: true asks for a stream"),
        (json!({"stop": ""}), "stop: a stop sequence is empty"),
        (
            json!({"parameters": {"stop": ""}}),
            "parameters.stop: a stop sequence is empty",
        ),
    ] {
        let body = with(&base, extra.clone());
        let (status, answer) = generate(s.inference, &body);
        assert_eq!(status, 400, "{body}: {answer}");
        let m = message(&answer);
        assert!(m.starts_with(want), "{body}: {m}");
        if extra.to_string().contains('Z') {
            // the tokenizer's cause: the character it does not know
            assert!(m.contains('Z'), "{m}");
        }
    }
    // a stream that disagrees with its endpoint, named where it was given
    for (path, body, want) in [
        (
            "/v2/models/g/generate_stream",
            json!({"text_input": PROMPT, "stream": false}),
            "stream: false asks for one answer",
        ),
        (
            "/v2/models/g/generate_stream",
            json!({"text_input": PROMPT, "parameters": {"stream": false}}),
            "parameters.stream: false asks for one answer",
        ),
    ] {
        let (status, answer) = request(s.inference, "POST", path, &body.to_string(), false);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(message(&answer).starts_with(want), "{body}: {answer}");
    }
}

/// A model's end-of-sequence ids (a Hugging Face folder's `eos_token_id`, a tokenizer's
/// end-of-text token) end generation by default, as `weft generate` does, on Triton's generate
/// and OpenAI's completions alike: the text stops before the token and finishes with "stop".
/// `ignore_eos: true` (vLLM's name) generates past it; an `end_id` replaces the model's; both
/// together are a 400.
#[test]
fn the_models_end_of_sequence_ends_generation_unless_ignored() {
    let s = start(Limits::default());
    let full = text(s.inference, &sampled());
    let c = drawn_later(&full);
    let want = before(&full, c);
    // the same gpt as `g`, named `e`, whose end-of-sequence id is `c`'s
    let mut eos = test_gpt();
    eos.name = "e".into();
    eos.eos = vec![i64::from(id_of(c))];
    let s = super::start_with(Limits::default(), vec![eos]);
    let on_e = |body: &Value| {
        let (status, answer) = request(s.inference, "POST", "/v2/models/e/generate", &body.to_string(), false);
        assert_eq!(status, 200, "{body}: {answer}");
        answer["text_output"].as_str().unwrap().to_string()
    };
    assert_eq!(on_e(&sampled()), want);
    assert_eq!(on_e(&with(&sampled(), json!({"ignore_eos": true}))), full);
    assert_eq!(
        on_e(&with(&sampled(), json!({"parameters": {"ignore_eos": false}}))),
        want
    );
    // an end_id of the request's own, never drawn: the model's is not used
    let tok = test_gpt().tokenizer.expect("a tokenizer");
    if let Some(unused) = (0..tok.vocab_size() as u32).find(|&t| !full.contains(tok.decode(&[t]).unwrap().as_str())) {
        assert_eq!(on_e(&with(&sampled(), json!({"end_id": unused}))), full);
    }
    let (status, answer) = request(
        s.inference,
        "POST",
        "/v2/models/e/generate",
        &with(&sampled(), json!({"end_id": 1, "ignore_eos": true})).to_string(),
        false,
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        message(&answer).starts_with("end_id and ignore_eos: true contradict"),
        "{answer}"
    );
    // OpenAI's completions: the same text, finish_reason "stop"
    let completion = |extra: Value| {
        let mut body = json!({"model": "e", "prompt": PROMPT, "max_tokens": 30, "temperature": 1.0, "seed": 3});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, answer) = request(s.inference, "POST", "/v1/completions", &body.to_string(), false);
        assert_eq!(status, 200, "{body}: {answer}");
        answer["choices"][0].clone()
    };
    let ended = completion(json!({}));
    assert_eq!(ended["finish_reason"], "stop", "{ended}");
    assert!(!ended["text"].as_str().unwrap().contains(c), "{ended}");
    let ignored = completion(json!({"ignore_eos": true}));
    assert_eq!(ignored["finish_reason"], "length", "{ignored}");
}
