//! The server on real loopback sockets ([`crate::serve`], its three ports) with a plain HTTP/1.1
//! client over `std::net::TcpStream`: hostile requests a fuzzing pass found are answered with a
//! 4xx naming the cause (no panic, no hang), and half-sent requests and idle connections are
//! closed after the read timeout.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::model::{test_gpt, test_version, test_version_hidden};
use crate::{AppState, Limits, Listeners, LoadOptions, Registry, Token};

mod admission;
mod answers;
mod fields;
mod forwards;
mod hostile;
mod manage;
mod pace;
mod params;
mod words;
mod writes;

const TOKEN: &str = "edge-test-token-0123456789";

/// A server on free loopback ports, stopped when dropped.
struct Running {
    inference: SocketAddr,
    management: SocketAddr,
    metrics: SocketAddr,
    /// The bytes of request bodies and answers it holds.
    bodies: Arc<crate::body::BodyBudget>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Says when the server has stopped.
    stopped: std::sync::mpsc::Receiver<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Stops the server and waits for it (at most `wait`): whether it stopped in time.
    fn stop_within(&mut self, wait: Duration) -> bool {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.stopped.recv_timeout(wait).is_ok()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves versions 1 and 2 of the test mlp `m` with `limits`.
fn start(limits: Limits) -> Running {
    start_with(limits, Vec::new())
}

/// [`start`], serving the versions `more` too.
fn start_with(limits: Limits, more: Vec<crate::registry::Served>) -> Running {
    let registry = Registry::default();
    registry.add(test_version("1", 8, 1)).unwrap();
    registry.add(test_version("2", 8, 1)).unwrap();
    // wide enough that the largest FP32 inputs overflow it
    registry.add(test_version_hidden("wide", 8, 2, vec![64, 64])).unwrap();
    registry.add(test_gpt()).unwrap();
    for served in more {
        registry.add(served).unwrap();
    }
    let bodies = crate::body::BodyBudget::new(limits.body_bytes_in_flight);
    let state = AppState {
        registry: Arc::new(registry),
        limits,
        token: Some(Arc::new(Token::new(TOKEN).unwrap())),
        protect_inference: false,
        store: Arc::new(std::env::temp_dir()),
        load: LoadOptions::default(),
        metrics: Arc::default(),
        bodies: bodies.clone(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (addrs_tx, addrs_rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let bind = || async { tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap() };
            let (i, m, x) = (bind().await, bind().await, bind().await);
            let addrs = (
                i.local_addr().unwrap(),
                m.local_addr().unwrap(),
                x.local_addr().unwrap(),
            );
            addrs_tx.send(addrs).unwrap();
            let listeners = Listeners {
                inference: i,
                management: Some(m),
                metrics: Some(x),
            };
            crate::serve(listeners, state, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
            let _ = done_tx.send(());
        });
    });
    let (inference, management, metrics) = addrs_rx.recv().unwrap();
    Running {
        inference,
        management,
        metrics,
        bodies,
        stop: Some(stop),
        stopped: done_rx,
        thread: Some(thread),
    }
}

/// The `data:` events of a streamed `POST path` of `body` (a 200 within 30 s), each as JSON
/// (`data: [DONE]` as `null`).
fn sse_events(addr: SocketAddr, path: &str, body: &serde_json::Value) -> Vec<serde_json::Value> {
    let body = body.to_string();
    let raw = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let got = exchange(addr, raw.as_bytes(), Duration::from_secs(30)).expect("no answer in 30 s");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or(serde_json::Value::Null))
        .collect()
}

/// Sends `raw` on a new connection to `addr` and reads until the server closes it (at most
/// `wait`): `None` when nothing came back in time.
fn exchange(addr: SocketAddr, raw: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s.write_all(raw).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // a reset after the answer: what came is the answer
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(got),
            Err(_) => return None,
        }
    }
}

/// `(status, body as JSON)` of one request (`Connection: close`); panics when no answer comes
/// within 30 s (a hang).
fn request(addr: SocketAddr, method: &str, path: &str, body: &str, token: bool) -> (u16, Value) {
    let auth = if token {
        format!("Authorization: Bearer {TOKEN}\r\n")
    } else {
        String::new()
    };
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let got = exchange(addr, raw.as_bytes(), Duration::from_secs(30))
        .unwrap_or_else(|| panic!("{method} {path}: no answer within 30 s"));
    parse(&got).unwrap_or_else(|| panic!("{method} {path}: no HTTP answer (the connection closed): {got:?}"))
}

/// The status and JSON body of a whole HTTP/1.1 answer.
fn parse(got: &[u8]) -> Option<(u16, Value)> {
    let text = String::from_utf8_lossy(got);
    let status = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

/// Whether `ok` holds within 15 s (asked every 20 ms).
fn wait(mut ok: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ok()
}

/// The message of an error body, either shape.
fn message(body: &Value) -> String {
    let e = &body["error"];
    e["message"].as_str().or(e.as_str()).unwrap_or_default().to_string()
}

#[test]
fn n_times_max_tokens_past_usize_is_a_400() {
    let s = start(Limits {
        max_tokens: usize::MAX,
        ..Limits::default()
    });
    let body = json!({"model": "m", "prompt": "a", "max_tokens": 9_223_372_036_854_775_808u64, "n": 2});
    let (status, answer) = request(s.inference, "POST", "/v1/completions", &body.to_string(), false);
    assert_eq!(status, 400, "{answer}");
    assert!(message(&answer).contains("n x max_tokens"), "{answer}");
    assert_eq!(request(s.inference, "GET", "/v2/health/live", "", false).0, 200);
}

#[test]
fn half_sent_and_idle_connections_are_closed_on_every_port() {
    let s = start(Limits {
        read_timeout: Duration::from_millis(300),
        ..Limits::default()
    });
    for addr in [s.inference, s.management, s.metrics] {
        for raw in [
            &b"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"[..],
            b"GET /metr",
            b"",
        ] {
            let started = Instant::now();
            let got = exchange(addr, raw, Duration::from_secs(10));
            assert!(got.is_some(), "{addr}: {raw:?} held the connection for 10 s");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{addr}: {:?}",
                started.elapsed()
            );
        }
    }
    // a kept-alive connection is closed once idle, after its answer
    let mut c = TcpStream::connect(s.inference).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut all = Vec::new();
    let closed = c.read_to_end(&mut all);
    assert!(closed.is_ok(), "the idle connection stayed open: {closed:?}");
    assert!(String::from_utf8_lossy(&all).starts_with("HTTP/1.1 200"), "{all:?}");
    // the server answers after all that
    assert_eq!(request(s.inference, "GET", "/v2/health/live", "", false).0, 200);
}

#[test]
fn a_body_over_the_limit_is_413_and_a_stalled_body_is_408() {
    let s = start(Limits {
        body_bytes: 1 << 10,
        read_timeout: Duration::from_secs(2),
        ..Limits::default()
    });
    for (addr, path, openai) in [
        (s.inference, "/v2/models/m/infer", false),
        (s.inference, "/v1/completions", true),
    ] {
        // the header says 1025 bytes and the client waits for 100 Continue before sending
        // them: the answer comes at once, not after the timeout
        let raw =
            format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1025\r\nExpect: 100-continue\r\n\r\n");
        let started = Instant::now();
        let got = exchange(addr, raw.as_bytes(), Duration::from_secs(10)).expect("no answer");
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
        let (status, body) = parse(&got).expect("an HTTP answer");
        assert_eq!(status, 413, "{body}");
        assert!(message(&body).contains("over the limit of 1024 bytes"), "{body}");
        assert_eq!(
            body["error"]["code"].as_str() == Some("request_too_large"),
            openai,
            "{body}"
        );
        // a client sending all of its 1025 bytes at once reads the 413 (the body is read up to
        // the limit first, so the connection does not close under its writes)
        let raw = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1025\r\n\r\n{}",
            "x".repeat(1025)
        );
        let got = exchange(addr, raw.as_bytes(), Duration::from_secs(10)).expect("no answer");
        assert_eq!(parse(&got).expect("an HTTP answer").0, 413);
        // 10 bytes announced, 2 sent, then nothing: 408
        let raw = format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n{{}}");
        let got = exchange(addr, raw.as_bytes(), Duration::from_secs(10)).expect("no answer");
        let (status, body) = parse(&got).expect("an HTTP answer");
        assert_eq!(status, 408, "{body}");
    }
    let (status, body) = request(s.management, "PUT", "/models/m/traffic", &"x".repeat(2000), true);
    assert_eq!(status, 413, "{body}");
}

#[test]
fn traffic_splits_that_do_not_sum_or_repeat_a_version_are_400s() {
    let s = start(Limits::default());
    let manage = |method: &str, path: &str, body: &str| request(s.management, method, path, body, true);
    for (method, path, body, want) in [
        ("PUT", "/models/m?split=1:1e308,2:1e308", "", "past the largest number"),
        (
            "PUT",
            "/models/m/traffic",
            r#"{"1": 1e308, "2": 1e308}"#,
            "past the largest number",
        ),
        ("PUT", "/models/m?split=1:1,1:2", "", "version \"1\" is given twice"),
        (
            "PUT",
            "/models/m/traffic",
            r#"{"1": 1, "1": 2}"#,
            "version \"1\" is given twice",
        ),
        ("PUT", "/models/m?workers=2&split=1:1", "", "workers and split"),
    ] {
        let (status, answer) = manage(method, path, body);
        assert_eq!(status, 400, "{path} {body}: {answer}");
        assert!(message(&answer).contains(want), "{path} {body}: {answer}");
    }
    // nothing was applied: no split, one worker
    let (status, described) = manage("GET", "/models/m/all", "");
    assert_eq!(status, 200);
    for v in described.as_array().unwrap() {
        assert!(v["trafficShare"].is_null(), "{described}");
        assert_eq!(v["workers"], 1, "{described}");
    }
    let (status, answer) = manage("PUT", "/models/m?split=1:1,2:3", "");
    assert_eq!((status, &answer["traffic"]), (200, &json!({"1": 0.25, "2": 0.75})));
}

#[test]
fn registration_settings_are_bounded() {
    let s = start(Limits::default());
    let u = u64::MAX;
    for (query, want) in [
        (
            format!("max_batch_delay={u}"),
            "max_batch_delay: 18446744073709551615 is outside 0 to 10000",
        ),
        ("max_batch_delay=99999999999999999999999".into(), "max_batch_delay"),
        (
            format!("batch_size={u}"),
            "batch_size: 18446744073709551615 is outside 1 to 1024",
        ),
        ("batch_size=0".into(), "batch_size: 0 is outside 1 to 1024"),
        (
            format!("max_sequences={u}"),
            "max_sequences: 18446744073709551615 is outside 1 to 1024",
        ),
        ("max_sequences=0".into(), "max_sequences: 0 is outside 1 to 1024"),
        (
            format!("prefill_chunk={u}"),
            "prefill_chunk: 18446744073709551615 is outside 0 to 1048576",
        ),
    ] {
        let path = format!("/models?url=h&model_name=h&{query}");
        let (status, answer) = request(s.management, "POST", &path, "", true);
        assert_eq!(status, 400, "{query}: {answer}");
        assert!(message(&answer).contains(want), "{query}: {answer}");
    }
}

#[test]
fn an_unknown_long_model_name_is_a_short_404() {
    let s = start(Limits::default());
    let name = "x".repeat(100_000);
    let body = json!({"model": &name, "prompt": "a"});
    let (status, answer) = request(s.inference, "POST", "/v1/completions", &body.to_string(), false);
    assert_eq!(status, 404, "{answer}");
    let m = message(&answer);
    assert!(
        m.starts_with("unknown model \"xxxx") && m.contains("(100000 bytes)"),
        "{m:.200}"
    );
    assert!(m.len() < 400, "{}", m.len());
    assert_eq!(answer["error"]["code"], "model_not_found");
    let (status, answer) = request(
        s.inference,
        "POST",
        &format!("/v2/models/{}/infer", &name[..5000]),
        "{}",
        false,
    );
    assert_eq!(status, 404, "{answer}");
    assert!(message(&answer).len() < 400);
}

#[test]
fn non_finite_outputs_and_nesting_against_the_shape_are_400s() {
    let s = start(Limits::default());
    let infer = |shape: Value, data: Value| {
        let body = json!({"inputs": [{"name": "input", "shape": shape, "datatype": "FP32", "data": data}]});
        request(
            s.inference,
            "POST",
            "/v2/models/m/versions/wide/infer",
            &body.to_string(),
            false,
        )
    };
    // the largest FP32 values overflow the wide mlp (batched: each request is checked alone)
    let big = 3.0e38f32;
    let rows = [[big, big], [big, -big], [-big, big], [-big, -big]];
    let model = test_version_hidden("wide", 1, 1, vec![64, 64]).model;
    let mut overflowing = 0;
    for row in rows {
        let x = weft_core::Tensor::from_vec(row.to_vec(), &[1, 2]).unwrap();
        let out = weft_core::no_grad(|| model.logits(&x))
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let (status, answer) = infer(json!([1, 2]), json!(row));
        if out.iter().all(|v| v.is_finite()) {
            assert_eq!(status, 200, "{answer}");
        } else {
            overflowing += 1;
            assert_eq!(status, 400, "{row:?}: {answer}");
            assert!(message(&answer).contains("outside FP32's range"), "{answer}");
        }
    }
    assert!(overflowing > 0, "no input overflowed the test mlp");
    for (shape, data) in [
        (json!([2, 2]), json!([[1, 2, 3, 4]])),
        (json!([1, 2]), json!([[[1, 2]]])),
        (json!([2, 2]), json!([[1, 2], 3, 4])),
    ] {
        let (status, answer) = infer(shape.clone(), data.clone());
        assert_eq!(status, 400, "{shape} {data}: {answer}");
        assert!(message(&answer).contains("not as shape"), "{answer}");
    }
    for data in [json!([1, 2, 3, 4]), json!([[1, 2], [3, 4]])] {
        assert_eq!(infer(json!([2, 2]), data.clone()).0, 200, "{data}");
    }
}

#[test]
fn a_field_of_the_wrong_type_names_what_it_must_be() {
    let s = start(Limits::default());
    for body in [
        r#"{"text_input": "a", "parameters": [1]}"#,
        r#"{"text_input": "a", "parameters": 7}"#,
    ] {
        let (status, answer) = request(s.inference, "POST", "/v2/models/m/generate", body, false);
        assert_eq!(status, 400, "{answer}");
        let m = message(&answer);
        assert!(
            m.contains("at parameters") && m.contains("expected a JSON object"),
            "{m}"
        );
        assert!(!m.contains("struct") && !m.contains("GenerateParameters"), "{m}");
    }
}
