//! Clients that hold connections or dodge the checks: a body dripped a byte at a time is 408
//! within its deadline and frees its connection, stopping the server waits for neither such a body
//! nor a half-sent head (and finishes a stream being answered), `Host` headers and absolute-form
//! targets must name loopback, and every refusal (405, an unreadable path, 403) is JSON.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{exchange, message, parse, request, start, TOKEN};
use crate::Limits;

/// Opens a connection to `addr` and sends `head`, then one byte of body every `every` until
/// `until` or until the server stops taking them; returns what the server answered.
fn drip(addr: std::net::SocketAddr, head: &str, every: Duration, until: Instant) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(every)).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
        if s.write_all(b" ").is_err() {
            // closed: read what came before
            let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
            let _ = s.read_to_end(&mut got);
            break;
        }
    }
    got
}

#[test]
fn a_dripped_body_is_408_within_its_deadline_and_frees_its_connection() {
    let s = start(Limits {
        read_timeout: Duration::from_millis(500),
        min_body_rate: 1000,
        connections: 2,
        ..Limits::default()
    });
    let head = "POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 16000\r\n\r\n";
    // both connections the port allows, each sending a byte every 200 ms: every pause is under
    // the read timeout, the rate far under 1000 bytes a second
    let until = Instant::now() + Duration::from_secs(8);
    let addr = s.inference;
    let drips: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(move || drip(addr, head, Duration::from_millis(200), until)))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let asked = Instant::now();
    let got = exchange(
        s.inference,
        b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        Duration::from_secs(6),
    );
    let waited = asked.elapsed();
    let answered = got.as_deref().and_then(parse).map(|(status, _)| status);
    assert_eq!(
        answered,
        Some(200),
        "the health check got no answer while two bodies dripped ({waited:?})"
    );
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    for d in drips {
        let got = d.join().unwrap();
        let (status, body) = parse(&got).expect("the dripping client got no answer");
        assert_eq!(status, 408, "{body}");
        assert!(message(&body).contains("too slowly"), "{body}");
    }
    // a body sent faster than the rate is read, however long it takes past the read timeout:
    // 6,000 bytes in 30 pieces 50 ms apart (1.5 s, 4,000 bytes a second)
    let json = r#"{"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]"#;
    let body = format!("{json}{}}}", " ".repeat(6000 - json.len() - 1));
    let mut c = TcpStream::connect(s.inference).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head =
        "POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 6000\r\nConnection: close\r\n\r\n";
    c.write_all(head.as_bytes()).unwrap();
    for piece in body.as_bytes().chunks(200) {
        c.write_all(piece).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    let (status, answer) = parse(&got).expect("an answer");
    assert_eq!(status, 200, "{answer}");
}

#[test]
fn stopping_waits_for_neither_a_body_nor_a_head_still_arriving() {
    let mut s = start(Limits {
        // neither the pauses nor the rate end them: only the stop does
        read_timeout: Duration::from_secs(60),
        min_body_rate: 1,
        ..Limits::default()
    });
    let mut half_head = TcpStream::connect(s.inference).unwrap();
    half_head.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    half_head
        .write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    let addr = s.inference;
    let until = Instant::now() + Duration::from_secs(30);
    let head = "POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n";
    let dripping = std::thread::spawn(move || drip(addr, head, Duration::from_millis(100), until));
    // a stream being answered: it is finished
    let mut stream = TcpStream::connect(s.inference).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = r#"{"model": "g", "prompt": "to be", "max_tokens": 1000, "stream": true, "seed": 1}"#;
    let raw = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(raw.as_bytes()).unwrap();
    let mut first = [0u8; 64];
    assert!(stream.read(&mut first).unwrap() > 0);
    let reading = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
        String::from_utf8_lossy(&rest).into_owned()
    });
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    assert!(
        s.stop_within(Duration::from_secs(10)),
        "the server did not stop within 10 s"
    );
    assert!(asked.elapsed() < Duration::from_secs(5), "{:?}", asked.elapsed());
    let got = dripping.join().unwrap();
    let (status, body) = parse(&got).expect("the dripping client got no answer");
    assert_eq!(status, 503, "{body}");
    assert!(message(&body).contains("stopping"), "{body}");
    let text = reading.join().unwrap();
    assert!(
        text.contains("data: [DONE]"),
        "the stream was cut short: {:?}",
        &text[text.len().saturating_sub(200)..]
    );
    let mut after = Vec::new();
    assert_eq!(half_head.read_to_end(&mut after).ok(), Some(0), "{after:?}");
}

/// The status line and JSON body of `raw` sent to `addr`, and its headers' text.
fn raw_answer(addr: std::net::SocketAddr, raw: &str) -> (u16, Value, String) {
    let got = exchange(addr, raw.as_bytes(), Duration::from_secs(10)).expect("no answer");
    let (status, body) = parse(&got).expect("an HTTP answer");
    let text = String::from_utf8_lossy(&got);
    let head = text.split("\r\n\r\n").next().unwrap_or("").to_ascii_lowercase();
    (status, body, head)
}

#[test]
fn hosts_and_absolute_targets_must_name_loopback() {
    let s = start(Limits::default());
    let (status, body, _) = raw_answer(
        s.inference,
        "GET /v2/models/m HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 400, "{body}");
    assert!(message(&body).contains("more than one Host"), "{body}");
    let (status, body, _) = raw_answer(
        s.inference,
        "GET http://evil.example/v2/models/m HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 403, "{body}");
    assert!(message(&body).contains("evil.example"), "{body}");
    let (status, body, _) = raw_answer(
        s.inference,
        "GET http://127.0.0.1:9/v2/health/live HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200, "{body}");
    // refusals are JSON, OpenAI's shape on /v1
    let (status, body, head) = raw_answer(
        s.inference,
        "GET /v1/models HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 403, "{body}");
    assert!(head.contains("content-type: application/json"), "{head}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    for addr in [s.inference, s.management, s.metrics] {
        let (status, body, _) = raw_answer(
            addr,
            "GET /v2/models/m HTTP/1.1\r\nHost: evil.example:80\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(status, 403, "{body}");
        assert!(message(&body).contains("loopback"), "{body}");
    }
}

#[test]
fn every_refusal_is_json() {
    let s = start(Limits::default());
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    for (addr, method, path, status, openai) in [
        (s.inference, "GET", "/v1/completions", 405, true),
        (s.inference, "PUT", "/v2/models/m/infer", 405, false),
        (s.inference, "GET", "/v2/models/%ff/ready", 400, false),
        (s.management, "DELETE", "/models/m", 405, false),
        (s.management, "GET", "/models/%ff", 400, false),
        (s.metrics, "POST", "/metrics", 405, false),
        (s.metrics, "GET", "/nothing", 404, false),
    ] {
        let raw = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let (got, body, head) = raw_answer(addr, &raw);
        assert_eq!(got, status, "{method} {path}: {body}");
        assert!(
            head.contains("content-type: application/json"),
            "{method} {path}: {head}"
        );
        let m = message(&body);
        assert!(!m.is_empty(), "{method} {path}: {body}");
        assert_eq!(body["error"]["type"].is_string(), openai, "{method} {path}: {body}");
        if status == 405 {
            assert!(m.contains("not allowed"), "{m}");
            assert!(head.contains("\r\nallow: "), "{method} {path}: {head}");
        }
    }
    // the server answers after all that
    assert_eq!(request(s.inference, "GET", "/v2/health/live", "", false).0, 200);
}
