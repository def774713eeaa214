//! Large answers: an infer answer past a megabyte of text is sent in chunks and equals the
//! model's forward; what answers hold counts against the budget of bytes in flight (a second
//! large request while a client does not read the first is a 503, one larger than the budget a
//! 400), and an answer the client stops reading is dropped after the read timeout, its bytes
//! given back. An unregistered version's latency series go with it (its request counts stay).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{message, request, start, wait};
use crate::model::test_version;
use crate::Limits;

/// An infer request for `rows` rows of the test mlp, each `row` (`1,-1`), its body written by
/// hand (`serde_json` would take long for millions of values).
pub(super) fn infer_raw(rows: usize, row: &str) -> String {
    let mut data = String::with_capacity(rows * (row.len() + 1));
    for i in 0..rows {
        if i > 0 {
            data.push(',');
        }
        data.push_str(row);
    }
    let body =
        format!(r#"{{"inputs": [{{"name": "input", "shape": [{rows}, 2], "datatype": "FP32", "data": [{data}]}}]}}"#);
    format!(
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The head (lowercase) and the de-chunked body of a whole HTTP/1.1 answer.
pub(super) fn split_answer(got: &[u8]) -> (String, Vec<u8>) {
    let at = got.windows(4).position(|w| w == b"\r\n\r\n").expect("a head");
    let head = String::from_utf8_lossy(&got[..at]).to_ascii_lowercase();
    let mut rest = &got[at + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return (head, rest.to_vec());
    }
    let mut body = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").expect("a chunk size");
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap().trim(), 16).unwrap();
        rest = &rest[line_end + 2..];
        if size == 0 {
            return (head, body);
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// Sends `raw` and reads the whole answer.
pub(super) fn send(addr: SocketAddr, raw: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    got
}

/// The status of an answer.
pub(super) fn status(got: &[u8]) -> u16 {
    String::from_utf8_lossy(&got[..12.min(got.len())])
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A client that sends `raw` and reads nothing for now.
fn not_reading(addr: SocketAddr, raw: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    s
}

#[test]
fn a_large_answer_is_sent_in_chunks_and_equals_the_forward() {
    let s = start(Limits::default());
    let rows = 60_000;
    let got = send(s.inference, &infer_raw(rows, "1,-1"));
    assert_eq!(status(&got), 200);
    let (head, body) = split_answer(&got);
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["model_name"], "m");
    let output = &answer["outputs"][0];
    assert_eq!(output["shape"], serde_json::json!([rows, 3]));
    let data: Vec<f32> = serde_json::from_value(output["data"].clone()).unwrap();
    let model = test_version("1", 1, 1).model;
    let x = weft_core::Tensor::from_vec(vec![1.0f32, -1.0], &[1, 2]).unwrap();
    let want = weft_core::no_grad(|| model.logits(&x))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(data.len(), rows * 3);
    for (i, v) in data.iter().enumerate() {
        assert_eq!(*v, want[i % 3], "value {i}");
    }
    // nothing is held once it is sent
    assert!(wait(|| s.bodies.used() == 0), "{} bytes held", s.bodies.used());
}

#[test]
fn answers_count_against_the_budget_and_one_not_read_is_dropped_after_the_read_timeout() {
    let s = start(Limits {
        body_bytes: 12 << 20,
        body_bytes_in_flight: 24 << 20,
        read_timeout: Duration::from_secs(3),
        ..Limits::default()
    });
    // 3 million values: 12 MB held, about 36 MB of text, far more than the sockets take
    let big = infer_raw(1_000_000, "1,-1");
    let first = not_reading(s.inference, &big);
    let held = wait(|| s.bodies.used() >= 12_000_000);
    assert!(held, "the first answer holds {} bytes", s.bodies.used());
    let started = Instant::now();
    let got = send(s.inference, &big);
    let (head, body) = split_answer(&got);
    assert_eq!(status(&got), 503, "{head}");
    assert!(head.contains("retry-after: 1"), "{head}");
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert!(message(&body).contains("--max-body-bytes-in-flight"), "{body}");
    // larger than the whole budget: a 400, however long the client waits
    let got = send(s.inference, &infer_raw(2_200_000, "0,0"));
    let (head, body) = split_answer(&got);
    assert_eq!(status(&got), 400, "{head}");
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert!(message(&body).contains("more than the server's limit"), "{body}");
    // the first client has not read for the read timeout: its answer is dropped, its bytes
    // given back, while it still holds its connection open
    let freed = wait(|| s.bodies.used() == 0);
    assert!(
        freed,
        "{} bytes still held after {:?}",
        s.bodies.used(),
        started.elapsed()
    );
    assert_eq!(status(&send(s.inference, &big)), 200);
    let mut first = first;
    first.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    let _ = first.read_to_end(&mut got);
    assert!(!got.ends_with(b"0\r\n\r\n"), "the unread answer was sent whole");
}

#[test]
fn an_unregistered_version_takes_its_latencies_along() {
    let s = start(Limits::default());
    for _ in 0..3 {
        assert_eq!(
            request(s.inference, "GET", "/v2/models/m/versions/2/ready", "", false).0,
            200
        );
    }
    let scrape = || request_text(s.metrics, "/metrics");
    let series = |text: &str, name: &str| {
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains("model=\"m\",version=\"2\""))
            .count()
    };
    let before = scrape();
    assert!(series(&before, "weft_request_duration_seconds") > 0, "{before}");
    let (status, answer) = request(s.management, "DELETE", "/models/m/2", "", true);
    assert_eq!(status, 200, "{answer}");
    let after = scrape();
    assert_eq!(series(&after, "weft_request_duration_seconds"), 0, "{after}");
    assert_eq!(series(&after, "weft_queue_depth"), 0, "{after}");
    // the request counts stay
    assert!(
        after.contains("weft_requests_total{model=\"m\",version=\"2\",endpoint=\"model_ready\",code=\"200\"} 3"),
        "{after}"
    );
}

/// The body of `GET path` as text.
fn request_text(addr: SocketAddr, path: &str) -> String {
    let raw = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    let got = send(addr, &raw);
    let (_, body) = split_answer(&got);
    String::from_utf8(body).unwrap()
}
