//! OpenAI's completions with `n`, `logprobs` and `echo`: `n` choices equal single requests
//! with the derived seeds (as a whole and streamed), greedy logprobs equal the log-softmax of
//! the model's forward computed here, `echo` gives the prompt and its tokens' logprobs, and bad
//! values are 400s naming the field.

use std::path::Path;

use serde_json::{json, Value};
use weft_core::Tensor;

use crate::support::{reference_logits, Server};

const PROMPT: &str = "\nFirst";

/// The checkpoint's tokenizer.
fn tokenizer(ckpt: &Path) -> weft_data::Tokenizer {
    let trained = weft_train::generate::read_trained(ckpt).unwrap();
    weft_data::Tokenizer::from_json(trained.tokenizer.as_ref().unwrap()).unwrap()
}

/// The log-softmax of `row` over its first `n` entries.
fn log_softmax(row: &[f32], n: usize) -> Vec<f64> {
    let row: Vec<f64> = row[..n].iter().map(|&x| x as f64).collect();
    let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
    row.iter().map(|x| x - lse).collect()
}

/// The answer of a completion request, checked to be a 200.
fn complete(s: &Server, request: Value) -> Value {
    let (status, answer) = s.post("/v1/completions", request.to_string());
    assert_eq!(status, 200, "{request}: {answer}");
    answer
}

fn text(choice: &Value) -> String {
    choice["text"].as_str().unwrap().to_string()
}

/// The prompt tokens the gpt's decode steps have run (`weft_prefill_tokens_total`).
fn prefilled(s: &Server) -> f64 {
    s.scrape()["weft_prefill_tokens_total{model=\"gpt\",version=\"1\"}"]
}

fn n_choices_equal_single_requests_with_the_derived_seeds(s: &Server) {
    let ask = |n: u64, seed: u64| json!({"model": "gpt", "prompt": PROMPT, "max_tokens": 10, "temperature": 0.9, "seed": seed, "n": n});
    let before = prefilled(s);
    let three = complete(s, ask(3, 5));
    // the three completions ran their prompt once (6 + 10 tokens: no slide past block_size 16)
    let prompt_tokens = PROMPT.chars().count() as f64;
    assert_eq!(prefilled(s) - before, prompt_tokens);
    let choices = three["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let before = prefilled(s);
    let alone: Vec<String> = (0..3)
        .map(|i| text(&complete(s, ask(1, 5 + i))["choices"][0]))
        .collect();
    assert_eq!(prefilled(s) - before, 3.0 * prompt_tokens);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(text(c), alone[i], "choice {i}");
        assert_eq!(c["logprobs"], Value::Null);
    }
    assert!(
        alone[0] != alone[1] || alone[1] != alone[2],
        "three seeds drew the same text: {alone:?}"
    );
    assert_eq!(three["usage"]["completion_tokens"], 30);
    assert_eq!(three["usage"]["prompt_tokens"], PROMPT.chars().count());

    // streamed: each chunk names its choice; each choice's pieces join to its text and end once
    let mut stream = ask(3, 5);
    stream["stream"] = json!(true);
    let events = s.events("/v1/completions", &stream);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let mut texts = vec![String::new(); 3];
    let mut finished = [0; 3];
    for e in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(e).unwrap();
        let c = &chunk["choices"][0];
        let i = c["index"].as_u64().unwrap() as usize;
        texts[i].push_str(c["text"].as_str().unwrap());
        if !c["finish_reason"].is_null() {
            finished[i] += 1;
        }
    }
    assert_eq!(texts, alone);
    assert_eq!(finished, [1, 1, 1]);
}

fn greedy_logprobs_equal_the_forwards_log_softmax(s: &Server, gpt: &Path) {
    let tok = tokenizer(gpt);
    let vocab = tok.vocab_size();
    let answer = complete(
        s,
        json!({"model": "gpt", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 1}),
    );
    let choice = &answer["choices"][0];
    let completion = text(choice);
    let lp = &choice["logprobs"];
    let ids: Vec<i64> = tok
        .encode(&format!("{PROMPT}{completion}"))
        .unwrap()
        .into_iter()
        .map(i64::from)
        .collect();
    let p = tok.encode(PROMPT).unwrap().len();
    assert_eq!(ids.len(), p + 6);
    let (shape, logits) = reference_logits(gpt, &Tensor::from_vec(ids.clone(), &[1, ids.len()]).unwrap());
    let v = shape[2];
    let row = |pos: usize| &logits[pos * v..(pos + 1) * v];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 6, "{lp}");
    for i in 0..6 {
        let want = log_softmax(row(p - 1 + i), vocab);
        let id = ids[p + i] as usize;
        let got = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(
            (got - want[id]).abs() <= 1e-5,
            "token {i}: served {got}, forward {}",
            want[id]
        );
        // greedy: the token drawn is the most likely, the one listed
        let best = (0..vocab)
            .max_by(|&a, &b| want[a].total_cmp(&want[b]).then(b.cmp(&a)))
            .unwrap();
        assert_eq!(best, id, "token {i} is not the forward's argmax");
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert_eq!(top.len(), 1, "{top:?}");
        let token = lp["tokens"][i].as_str().unwrap();
        assert_eq!(token, tok.decode(&[id as u32]).unwrap());
        assert!((top[token].as_f64().unwrap() - got).abs() < 1e-12);
        assert_eq!(lp["text_offset"][i], i, "one character a token");
    }

    // echo: the prompt comes first, its first token without a logprob, the others the
    // forward's; the completion is the same
    let echoed = complete(
        s,
        json!({"model": "gpt", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 2, "echo": true}),
    );
    let c = &echoed["choices"][0];
    assert_eq!(text(c), format!("{PROMPT}{completion}"));
    let lp = &c["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), p + 6);
    assert_eq!(lp["token_logprobs"][0], Value::Null);
    assert_eq!(lp["top_logprobs"][0], Value::Null);
    for j in 1..p + 6 {
        let want = log_softmax(row(j - 1), vocab)[ids[j] as usize];
        let got = lp["token_logprobs"][j].as_f64().unwrap();
        assert!((got - want).abs() <= 1e-5, "position {j}: served {got}, forward {want}");
        let top = lp["top_logprobs"][j].as_object().unwrap();
        assert!((2..=3).contains(&top.len()), "{top:?}");
        assert_eq!(lp["text_offset"][j], j);
    }
    // echo with max_tokens 0 scores the prompt alone: the same prompt logprobs, no new token
    let scored = complete(
        s,
        json!({"model": "gpt", "prompt": PROMPT, "max_tokens": 0, "logprobs": 2, "echo": true}),
    );
    let c = &scored["choices"][0];
    assert_eq!(text(c), PROMPT);
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(scored["usage"]["completion_tokens"], 0);
    let prompt_lp = &lp["token_logprobs"].as_array().unwrap()[..p];
    assert_eq!(c["logprobs"]["token_logprobs"].as_array().unwrap()[..], prompt_lp[..]);
    let plain = complete(
        s,
        json!({"model": "gpt", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "echo": true}),
    );
    assert_eq!(text(&plain["choices"][0]), format!("{PROMPT}{completion}"));
    assert_eq!(plain["choices"][0]["logprobs"], Value::Null);

    // streamed with logprobs and echo: the prompt's chunk first, then the tokens, every token's
    // logprob once
    let events = s.events(
        "/v1/completions",
        &json!({"model": "gpt", "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 1, "echo": true, "stream": true}),
    );
    let mut streamed = String::new();
    let mut logprobs = Vec::new();
    let mut offsets = Vec::new();
    for e in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(e).unwrap();
        let c = &chunk["choices"][0];
        streamed.push_str(c["text"].as_str().unwrap());
        logprobs.extend(c["logprobs"]["token_logprobs"].as_array().unwrap().iter().cloned());
        offsets.extend(
            c["logprobs"]["text_offset"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o.as_u64().unwrap()),
        );
    }
    assert_eq!(streamed, format!("{PROMPT}{completion}"));
    assert_eq!(logprobs, lp["token_logprobs"].as_array().unwrap().clone());
    assert_eq!(offsets, (0..(p + 6) as u64).collect::<Vec<_>>());
}

fn bad_n_and_logprobs_are_400(s: &Server) {
    let long = "First Citizen: ".repeat(2);
    #[rustfmt::skip]
    let cases: [(Value, &str); 7] = [
        (json!({"n": 0}), "n: 0 completions; give 1 to 16"),
        (json!({"n": 17}), "n: 17 completions; give 1 to 16"),
        (json!({"n": "two"}), "n"),
        (json!({"logprobs": 6}), "logprobs: 6 is over 5"),
        (json!({"logprobs": -1}), "logprobs"),
        (json!({"n": 16, "max_tokens": 8}), "n x max_tokens = 16 x 8 = 128 is over the limit of 64"),
        (json!({"prompt": long, "echo": true, "logprobs": 1}), "more than block_size = 16"),
    ];
    for (fields, cause) in cases {
        let mut request = json!({"model": "gpt", "prompt": PROMPT, "max_tokens": 2});
        for (k, v) in fields.as_object().unwrap() {
            request[k] = v.clone();
        }
        let (status, answer) = s.post("/v1/completions", request.to_string());
        assert_eq!(status, 400, "{request}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(cause), "{request}: {message:?} should name {cause:?}");
    }
    s.alive();
}

/// Every check of this file, on a server serving the tiny gpt `gpt` (block_size 16) with
/// `--max-tokens 64`.
pub fn n_logprobs_and_echo(s: &Server, gpt: &Path) {
    n_choices_equal_single_requests_with_the_derived_seeds(s);
    greedy_logprobs_equal_the_forwards_log_softmax(s, gpt);
    bad_n_and_logprobs_are_400(s);
}
