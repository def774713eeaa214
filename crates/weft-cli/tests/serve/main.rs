//! `weft serve` through the binary and a real HTTP client: every endpoint against checkpoints
//! trained here (a tiny gpt and a tiny mlp): infer outputs equal the model's forward, generation
//! equals `weft generate`'s text for the same seed, streams deliver several chunks, the token
//! guards the inference API, and each bad input is a 4xx naming its cause (in OpenAI's shape on
//! `/v1/*`) with the server answering after it; OpenAI's `n`, `logprobs` and `echo` agree with
//! single requests and the model's forward (completions.rs). The metrics count the requests
//! made, the management API registers, splits traffic and unregisters with draining, batched
//! requests give the unbatched logits, workers run requests at once and scale down without a
//! failure (workers.rs), and the Kubernetes manifest's args and probes work (k8s.rs).

mod bounds_and_bodies;
#[path = "../common.rs"]
mod common;
mod completions;
mod k8s;
mod limits;
mod manage;
mod start_failures;
mod stop;
mod support;
mod workers;

use std::path::{Path, PathBuf};

use common::{path_set, temp_dir, wait_for, weft_command, weft_ok};
use serde_json::{json, Value};
use support::{assert_output, body_json, reference_logits, train_mlp, Server};
use weft_core::Tensor;

/// Trains a tiny gpt (2 blocks, width 32, block_size 16) for 3 steps on the built-in corpus
/// into `store/gpt`.
fn train_gpt(store: &Path) -> PathBuf {
    let ckpt = store.join("gpt");
    let set = path_set("train.checkpoint_dir", &ckpt);
    #[rustfmt::skip]
    weft_ok(&["train", "--quiet", "--set", "train.steps=3", "--set", "model.n_layer=2",
        "--set", "model.n_embd=32", "--set", "model.n_head=2", "--set", "model.block_size=16",
        "--set", "train.eval_every=0", "--set", "train.sample_tokens=0", "--set", &set]);
    ckpt
}

/// Trains a tiny llama (2 blocks, width 32, grouped-query attention, vocab_size 128: more than
/// the corpus's characters) for 3 steps on the built-in corpus into `store/llama`.
fn train_llama(store: &Path) -> PathBuf {
    let cfg = store.join("llama.toml");
    let config = "[model]\nkind = \"llama\"\nvocab_size = 128\nblock_size = 16\nn_layer = 2\nn_head = 4\n\
        n_kv_head = 2\nn_embd = 32\nintermediate_size = 64\n\n\
        [data]\nkind = \"text\"\npath = \"builtin\"\nbatch_size = 4\nval_fraction = 0.1\n\n\
        [optim]\nkind = \"adamw\"\nlr = 0.003\n\n[train]\nsteps = 3\neval_every = 0\nsample_tokens = 0\n";
    std::fs::write(&cfg, config).unwrap();
    let ckpt = store.join("llama");
    let set = path_set("train.checkpoint_dir", &ckpt);
    weft_ok(&["train", "--config", cfg.to_str().unwrap(), "--quiet", "--set", &set]);
    ckpt
}

/// `weft generate`'s text (prompt included, final newline dropped) for `flags`.
fn weft_generate(ckpt: &Path, flags: &[&str]) -> String {
    let mut args = vec!["generate", "--checkpoint", ckpt.to_str().unwrap()];
    args.extend(flags);
    let out = weft_ok(&args);
    String::from_utf8(out.stdout)
        .unwrap()
        .strip_suffix('\n')
        .unwrap()
        .to_string()
}

fn health_metadata_and_infer(s: &Server, gpt: &Path, mlp: &Path) {
    assert_eq!(s.get("/v2/health/live"), (200, json!({"live": true})));
    assert_eq!(s.get("/v2/health/ready").1["ready"], true);
    assert_eq!(s.get("/ping"), (200, json!({"status": "Healthy"})));
    assert_eq!(s.get("/v2").1["name"], "weft");
    let (status, meta) = s.get("/v2/models/cls");
    assert_eq!(status, 200);
    assert_eq!(meta["versions"], json!(["1", "2"]));
    assert_eq!(
        meta["inputs"],
        json!([{"name": "input", "datatype": "FP32", "shape": [-1, 2]}])
    );
    assert_eq!(
        meta["outputs"],
        json!([{"name": "logits", "datatype": "FP32", "shape": [-1, 3]}])
    );
    let meta = s.get("/v2/models/gpt/versions/1").1;
    assert_eq!(
        meta["inputs"][0],
        json!({"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]})
    );
    let vocab = meta["outputs"][0]["shape"][2].as_u64().unwrap() as i64;
    assert!(vocab > 10, "{meta}");
    assert_eq!(s.get("/v2/models/cls/versions/2/ready").1["ready"], true);
    assert_eq!(s.get("/v2/models/gpt/ready").0, 200);
    let meta = s.get("/v2/models/llama").1;
    assert_eq!(meta["platform"], "weft_llama");
    assert_eq!(meta["outputs"][0]["shape"], json!([-1, -1, 128]));

    // a classifier: FP32 [3, 2] -> logits [3, 3]
    let x = [0.1f32, -0.5, 0.7, 0.25, 1.5, -2.0];
    let want = reference_logits(mlp, &Tensor::from_vec(x.to_vec(), &[3, 2]).unwrap());
    for path in ["/v2/models/cls/infer", "/v2/models/cls/versions/2/infer"] {
        let body = json!({"id": "r1", "inputs": [{"name": "input", "shape": [3, 2], "datatype": "FP32", "data": x}]});
        let (status, answer) = s.post(path, body.to_string());
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["id"], "r1");
        assert_output(&answer["outputs"][0], &want);
    }
    // nested data is read row-major too; /predictions answers nested rows
    let nested = json!([[0.1, -0.5], [0.7, 0.25], [1.5, -2.0]]);
    let (status, rows) = s.post("/predictions/cls/2", nested.to_string());
    assert_eq!(status, 200, "{rows}");
    let flat: Vec<f32> = rows
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| serde_json::from_value::<Vec<f32>>(r.clone()).unwrap())
        .collect();
    assert_output(
        &json!({"name": "logits", "datatype": "FP32", "shape": [3, 3], "data": flat}),
        &want,
    );

    // a language model: INT64 ids [2, 5] -> logits [2, 5, vocab]
    let ids: Vec<i64> = (0..10).map(|i| (i * 7) % vocab).collect();
    let want = reference_logits(gpt, &Tensor::from_vec(ids.clone(), &[2, 5]).unwrap());
    let body = json!({"inputs": [{"name": "input_ids", "shape": [2, 5], "datatype": "INT64", "data": ids}]});
    let (status, answer) = s.post("/v2/models/gpt/infer", body.to_string());
    assert_eq!(status, 200, "{answer}");
    assert_output(&answer["outputs"][0], &want);
}

fn generation_matches_weft_generate(s: &Server, gpt: &Path, llama: &Path) {
    let prompt = "\nFirst";
    let reference = weft_generate(
        gpt,
        &[
            "--prompt",
            prompt,
            "--tokens",
            "24",
            "--seed",
            "7",
            "--temperature",
            "0.9",
            "--top-k",
            "5",
            "--top-p",
            "0.95",
        ],
    );
    let params = json!({"max_tokens": 24, "seed": 7, "temperature": 0.9, "top_k": 5, "top_p": 0.95});
    let body = json!({"text_input": prompt, "parameters": params});
    let (status, answer) = s.post("/v2/models/gpt/generate", body.to_string());
    assert_eq!(status, 200, "{answer}");
    let text = answer["text_output"].as_str().unwrap().to_string();
    assert_eq!(format!("{prompt}{text}"), reference);
    assert_eq!(text.chars().count(), 24);

    let pieces = s.stream_texts("/v2/models/gpt/generate_stream", &body);
    assert!(pieces.len() >= 2, "{pieces:?}");
    assert_eq!(pieces.concat(), text);

    // OpenAI's completions: no top-k (weft generate's --top-k 0)
    let reference = weft_generate(
        gpt,
        &[
            "--prompt",
            prompt,
            "--tokens",
            "12",
            "--seed",
            "3",
            "--temperature",
            "1",
            "--top-k",
            "0",
            "--top-p",
            "0.9",
        ],
    );
    let request = json!({"model": "gpt", "prompt": prompt, "max_tokens": 12, "seed": 3, "top_p": 0.9});
    let (status, answer) = s.post("/v1/completions", request.to_string());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["object"], "text_completion");
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
    assert_eq!(answer["usage"]["completion_tokens"], 12);
    let text = answer["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(format!("{prompt}{text}"), reference);

    let mut stream = request.clone();
    stream["stream"] = json!(true);
    let events = s.events("/v1/completions", &stream);
    assert!(events.len() >= 4, "{events:?}");
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
    let streamed: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, text);

    // a llama (whose tokenizer knows fewer tokens than its vocabulary)
    let reference = weft_generate(
        llama,
        &[
            "--prompt",
            prompt,
            "--tokens",
            "16",
            "--seed",
            "11",
            "--temperature",
            "0.7",
            "--top-k",
            "0",
        ],
    );
    let body =
        json!({"text_input": prompt, "parameters": {"max_tokens": 16, "seed": 11, "temperature": 0.7, "top_k": 0}});
    let (status, answer) = s.post("/v2/models/llama/generate", body.to_string());
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        format!("{prompt}{}", answer["text_output"].as_str().unwrap()),
        reference
    );
}

/// The gpt registered again with `prefill_chunk=3`: its prompts run 3 tokens a step (and again
/// when the context slides past block_size 16), and greedy generation still draws the tokens of
/// `weft generate` (a chunked prompt's logits agree with the whole prompt's within rounding,
/// docs/serving.md, "Chunked prefill"); the request runs beside another that streams.
fn chunked_prompts_draw_weft_generates_greedy_tokens(s: &Server, gpt: &Path) {
    let (status, answer) = s.manage(
        reqwest::Method::POST,
        "/models?url=gpt&model_name=chunked&prefill_chunk=3",
        "",
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        s.manage(reqwest::Method::GET, "/models/chunked", "").1[0]["prefillChunk"],
        3
    );
    let prompt = "\nFirst Citizen";
    #[rustfmt::skip]
    let reference = weft_generate(gpt, &["--prompt", prompt, "--tokens", "20", "--temperature", "0"]);
    let request = json!({"model": "chunked", "prompt": prompt, "max_tokens": 20, "temperature": 0});
    let (answer, beside) = std::thread::scope(|scope| {
        let beside = scope.spawn(|| {
            let body = json!({"model": "chunked", "prompt": "a", "max_tokens": 30, "temperature": 0, "stream": true});
            s.events("/v1/completions", &body).len()
        });
        (s.post("/v1/completions", request.to_string()), beside.join().unwrap())
    });
    assert_eq!(answer.0, 200, "{}", answer.1);
    let text = answer.1["choices"][0]["text"].as_str().unwrap();
    assert_eq!(format!("{prompt}{text}"), reference);
    assert!(beside > 2);
    // the prompts (14 + 1 tokens), then, once a context fills block_size, all 16 again per token
    let m = s.scrape();
    assert!(
        m["weft_prefill_tokens_total{model=\"chunked\",version=\"1\"}"] > 15.0 + 16.0,
        "{m:?}"
    );
}

/// Requests sent at once share the running batch (continuous batching) and each draws what it
/// draws alone.
fn concurrent_generations_equal_their_answers_alone(s: &Server) {
    let body = |seed: u64| {
        json!({"text_input": "\nFirst", "parameters": {"max_tokens": 8 + seed as usize * 3, "seed": seed, "temperature": 0.8}})
            .to_string()
    };
    let text = |(status, answer): (u16, Value)| {
        assert_eq!(status, 200, "{answer}");
        answer["text_output"].as_str().unwrap().to_string()
    };
    let alone: Vec<String> = (0..6)
        .map(|seed| text(s.post("/v2/models/gpt/generate", body(seed))))
        .collect();
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6)
            .map(|seed| scope.spawn(move || text(s.post("/v2/models/gpt/generate", body(seed)))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
}

fn bad_inputs_are_4xx_naming_the_cause(s: &Server) {
    // a page elsewhere whose name was rebound to 127.0.0.1 runs nothing, on any of the ports
    for base in [&s.base, &s.management, &s.metrics] {
        let r = s
            .client
            .get(format!("{base}/v2/health/ready"))
            .header("Host", "evil.example:8080")
            .send()
            .unwrap();
        assert_eq!(r.status(), 403, "{base}");
    }
    let infer = |name: &str, shape: Value, datatype: &str, data: Value| {
        json!({"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]}).to_string()
    };
    let gen = |params: Value| json!({"text_input": "\nA", "parameters": params}).to_string();
    #[rustfmt::skip]
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/v2/models/cls/infer", "{\"inputs\": [".into(), 400, "not valid JSON"),
        ("/v2/models/cls/infer", "{}".into(), 400, "missing field `inputs`"),
        ("/v2/models/cls/infer", infer("x", json!([1, 2]), "FP32", json!([1, 2])), 400, "unknown input \"x\""),
        ("/v2/models/cls/infer", infer("input", json!([1, 3]), "FP32", json!([1, 2, 3])), 400, "shape [1, 3]"),
        ("/v2/models/cls/infer", infer("input", json!([1, 2]), "INT64", json!([1, 2])), 400, "datatype \"INT64\""),
        ("/v2/models/cls/infer", infer("input", json!([2, 2]), "FP32", json!([1, 2])), 400, "data holds 2 values"),
        ("/v2/models/cls/infer", infer("input", json!([1, 2]), "FP32", json!([1, "a"])), 400, "data[1]"),
        ("/v2/models/cls/infer", infer("input", json!([1, 2]), "FP32", json!([1, 1e39])), 400, "FP32's range"),
        ("/v2/models/gpt/infer", infer("input_ids", json!([1, 2]), "INT64", json!([1, 100000])), 400, "token id 100000 at data[1] is outside the vocabulary"),
        ("/v2/models/gpt/infer", infer("input_ids", json!([1, 17]), "INT64", json!(vec![1; 17])), 400, "block_size = 16"),
        ("/v2/models/nope/infer", infer("input", json!([1, 2]), "FP32", json!([1, 2])), 404, "unknown model \"nope\""),
        ("/v2/models/cls/versions/9/infer", infer("input", json!([1, 2]), "FP32", json!([1, 2])), 404, "unknown version \"9\""),
        ("/predictions/cls", "[[1, 2], [3]]".into(), 400, "rectangular"),
        ("/v2/models/gpt/generate", gen(json!({"max_tokens": 65})), 400, "max_tokens: 65 is over the limit of 64"),
        ("/v2/models/gpt/generate", gen(json!({"max_tokens": "many"})), 400, "parameters.max_tokens"),
        ("/v2/models/gpt/generate", gen(json!({"top_p": 1.5})), 400, "top_p"),
        ("/v2/models/gpt/generate", json!({"text_input": "\u{20ac}"}).to_string(), 400, "prompt"),
        ("/v2/models/cls/generate", gen(json!({})), 400, "not a language model"),
        ("/v1/completions", json!({"model": "nope", "prompt": "a"}).to_string(), 404, "unknown model"),
        ("/v1/completions", json!({"model": "gpt", "prompt": "\nA", "max_tokens": 1000}).to_string(), 400, "max_tokens"),
        ("/v1/completions", json!({"model": "gpt", "prompt": [1, 2]}).to_string(), 400, "prompt"),
        ("/v1/completions", json!({"model": "gpt", "prompt": "a", "stop": 5}).to_string(), 400, "stop: expected a string or an array"),
        ("/v1/completions", json!({"model": "gpt", "prompt": "a", "stop": ["a", "b", "c", "d", "e"]}).to_string(), 400, "stop: 5 stop sequences, at most 4"),
        ("/v1/completions", json!({"model": "gpt", "prompt": "a", "stop": ["a", "x".repeat(257)]}).to_string(), 400, "stop: a stop sequence of 257 bytes, at most 256"),
        ("/v1/completions", json!({"model": "gpt", "prompt": "a", "stop": ["a", ""]}).to_string(), 400, "stop: a stop sequence is empty"),
        ("/v2/models/gpt/generate", gen(json!({"stop": [1]})), 400, "parameters.stop[0]: expected a string"),
        ("/v2/models/gpt/generate", gen(json!({"stop": ""})), 400, "parameters.stop: a stop sequence is empty"),
    ];
    for (path, body, status, cause) in cases {
        let (got, answer) = s.post(path, body.clone());
        assert_eq!(got, status, "{path} {body}: {answer}");
        // OpenAI's shape on /v1, `{"error": "..."}` elsewhere
        let error = &answer["error"];
        let message = if path.starts_with("/v1/") {
            let want_code = if status == 404 {
                "model_not_found"
            } else {
                "invalid_request"
            };
            assert_eq!(error["type"], "invalid_request_error", "{answer}");
            assert_eq!(error["code"], want_code, "{answer}");
            error["message"].as_str()
        } else {
            error.as_str()
        };
        let message = message.unwrap_or_else(|| panic!("{path} {body}: no error in {answer}"));
        assert!(
            message.contains(cause),
            "{path} {body}: {message:?} should name {cause:?}"
        );
        s.alive();
    }
    // over the body limit (1 MiB here)
    let (got, answer) = s.post("/v2/models/cls/infer", vec![b' '; (1 << 20) + 1]);
    assert_eq!(got, 413, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("over the limit of 1048576 bytes"),
        "{answer}"
    );
    assert_eq!(s.get("/v2/models/nope").0, 404);
    let (got, answer) = s.post("/v1/completions", vec![b' '; (1 << 20) + 1]);
    assert_eq!(
        (got, &answer["error"]["code"]),
        (413, &json!("request_too_large")),
        "{answer}"
    );
    let (got, answer) = s.get("/v1/nothing");
    assert_eq!((got, &answer["error"]["code"]), (404, &json!("not_found")), "{answer}");
    assert_eq!(
        s.get("/no/such/path").1["error"]
            .as_str()
            .map(|e| e.contains("no such endpoint")),
        Some(true)
    );
    s.alive();
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// 10,000 bad requests (after 1,000 to warm up): each refused, and the server's memory grows by
/// less than 16 MiB (a leak of 2 KiB a request would show).
fn bad_requests_leak_nothing(s: &Server) {
    let bodies = [
        "{\"inputs\": [".to_string(),
        json!({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}).to_string(),
        json!({"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 100000]}]})
            .to_string(),
    ];
    let paths = ["/v2/models/cls/infer", "/v2/models/cls/infer", "/v2/models/gpt/infer"];
    let send = |n: usize| {
        for i in 0..n {
            let (status, _) = s.post(paths[i % 3], bodies[i % 3].clone());
            assert_eq!(status, 400);
        }
    };
    send(1000);
    let before = rss_kib(s.child.id());
    send(10_000);
    let after = rss_kib(s.child.id());
    assert!(
        after < before + 16 * 1024,
        "resident memory grew from {before} KiB to {after} KiB"
    );
    s.alive();
}

#[test]
fn every_endpoint_answers_and_bad_input_is_refused() {
    let store = temp_dir("serve");
    let gpt = train_gpt(&store);
    let mlp = train_mlp(&store);
    let llama = train_llama(&store);
    #[rustfmt::skip]
    let s = Server::start(&store, &["--model", "gpt=gpt", "--model", "llama=llama", "--model", "cls=mlp", "--model", "cls=./mlp:2",
        "--max-tokens", "64", "--max-body-bytes", "1048576"]);
    health_metadata_and_infer(&s, &gpt, &mlp);
    generation_matches_weft_generate(&s, &gpt, &llama);
    // tokens generated: gpt 24 + 24 (generate, its stream) + 12 + 12 (completions, its
    // stream) in 4 requests; llama 16 in 1
    let m = s.scrape();
    let gpt1 = "model=\"gpt\",version=\"1\"";
    assert_eq!(m[&format!("weft_generated_tokens_total{{{gpt1}}}")], 72.0);
    assert_eq!(m[&format!("weft_time_to_first_token_seconds_count{{{gpt1}}}")], 4.0);
    assert_eq!(m["weft_generated_tokens_total{model=\"llama\",version=\"1\"}"], 16.0);
    let key = format!("weft_requests_total{{{gpt1},endpoint=\"generate_stream\",code=\"200\"}}");
    assert_eq!(m[&key], 1.0);
    concurrent_generations_equal_their_answers_alone(&s);
    let m = s.scrape();
    assert!(m[&format!("weft_decode_batch_size_count{{{gpt1}}}")] > 0.0);
    stop::stop_sequences_end_the_text(&s);
    bad_inputs_are_4xx_naming_the_cause(&s);
    bad_requests_leak_nothing(&s);
    completions::n_logprobs_and_echo(&s, &gpt);
    chunked_prompts_draw_weft_generates_greedy_tokens(&s, &gpt);
    drop(s);
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn the_token_guards_inference_but_not_health_checks() {
    let store = temp_dir("serve-token");
    train_mlp(&store);
    let token = "s3cret-token-0123456789";
    let file = store.join("token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let mut s = Server::start(
        &store,
        &[
            "--model",
            "cls=mlp",
            "--token-file",
            file.to_str().unwrap(),
            "--inference-token",
        ],
    );
    assert_eq!(s.get("/v2/health/ready").0, 200);
    assert_eq!(s.get("/ping").0, 200);
    let url = format!("{}/v2/models/cls", s.base);
    let r = s.client.get(&url).send().unwrap();
    assert_eq!(r.status(), 401);
    assert!(body_json(r)["error"]
        .as_str()
        .unwrap()
        .contains("missing Authorization"));
    for wrong in [
        "Bearer s3cret-token-012345678",
        "Bearer s3cret-token-01234567890",
        "s3cret-token-0123456789",
        "Basic abc",
    ] {
        let r = s.client.get(&url).header("authorization", wrong).send().unwrap();
        assert_eq!(r.status(), 401, "{wrong}");
    }
    let r = s.client.get(&url).bearer_auth(token).send().unwrap();
    assert_eq!(r.status(), 200);
    let r = s.client.get(format!("{}/v1/models", s.base)).send().unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let error = body_json(r)["error"].clone();
    assert_eq!(
        (&error["type"], &error["code"]),
        (&json!("authentication_error"), &json!("invalid_api_key")),
        "{error}"
    );
    assert!(error["message"].as_str().unwrap().contains("missing Authorization"));
    // the management API takes the same token
    let r = s.client.get(format!("{}/models", s.management)).send().unwrap();
    assert_eq!(r.status(), 401);
    s.token = token.to_string();
    assert_eq!(s.manage(reqwest::Method::GET, "/models", "").0, 200);
    let body = json!({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 0.5]}]});
    let r = s
        .client
        .post(format!("{url}/infer"))
        .body(body.to_string())
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = s
        .client
        .post(format!("{url}/infer"))
        .bearer_auth(token)
        .body(body.to_string())
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    // SIGTERM: the server stops and exits 0
    assert_eq!(unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) }, 0);
    let exited = wait_for(30, || s.child.try_wait().unwrap().is_some());
    assert!(exited, "weft serve did not stop on SIGTERM");
    assert_eq!(s.child.try_wait().unwrap().and_then(|st| st.code()), Some(0));
    drop(s);
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn models_outside_the_store_and_bad_flags_are_refused_at_start() {
    let store = temp_dir("serve-refused");
    std::fs::create_dir_all(store.join("inside")).unwrap();
    let s = store.to_str().unwrap();
    #[rustfmt::skip]
    let cases: [(&[&str], &str); 8] = [
        (&["serve", "--model-store", s, "--model", "m=../outside"], "relative to the model store"),
        (&["serve", "--model-store", s, "--model", "m=/etc"], "relative to the model store"),
        // refused before any model loads, even after one that loads or fails
        (&["serve", "--model-store", s, "--model", "m=inside", "--model", "n=../x"], "relative to the model store"),
        (&["serve", "--model-store", s, "--model", "m"], "NAME=PATH"),
        (&["serve", "--model-store", s, "--inference-token"], "--token-file"),
        (&["serve", "--model-store", s, "--max-tokens", "0"], "--max-tokens: 0"),
        (&["serve", "--model-store", s, "--prefill-chunk=-1"], "--prefill-chunk"),
        (&["serve", "--model-store", s, "--prefill-chunk", "many"], "--prefill-chunk"),
    ];
    for (args, cause) in cases {
        let out = weft_command(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(err.contains(cause), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&store);
}
