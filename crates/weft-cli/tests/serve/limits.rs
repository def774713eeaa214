//! Settings past their bounds (found by a fuzzing pass): flags are refused at start naming the
//! flag and its bounds, the management API's registration settings are 400s naming the
//! parameter, and connections that stop halfway through a request are closed after
//! `--read-timeout-ms`. (The requests themselves: `crates/weft-serve/src/http_tests/`.)

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use reqwest::Method;

use crate::common::{temp_dir, wait_for, weft_command};
use crate::support::{infer_body, train_mlp, Server};

#[test]
fn flags_past_their_bounds_stop_the_start_naming_the_flag() {
    let store = temp_dir("serve-flag-bounds");
    let u = "18446744073709551615";
    for (flag, value, want) in [
        (
            "--max-tokens",
            u,
            "--max-tokens: 18446744073709551615 is outside 1 to 1048576",
        ),
        (
            "--max-batch-delay-ms",
            u,
            "--max-batch-delay-ms: 18446744073709551615 is outside 0 to 10000",
        ),
        (
            "--max-batch-size",
            u,
            "--max-batch-size: 18446744073709551615 is outside 1 to 1024",
        ),
        ("--max-batch-size", "0", "--max-batch-size: 0 is outside 1 to 1024"),
        ("--max-sequences", "0", "--max-sequences: 0 is outside 1 to 1024"),
        (
            "--max-sequences",
            u,
            "--max-sequences: 18446744073709551615 is outside 1 to 1024",
        ),
        (
            "--prefill-chunk",
            u,
            "--prefill-chunk: 18446744073709551615 is outside 0 to 1048576",
        ),
        ("--queue", u, "--queue: 18446744073709551615 is outside 1 to 1048576"),
        ("--queue", "0", "--queue: 0 is outside 1 to 1048576"),
        ("--read-timeout-ms", "0", "--read-timeout-ms: 0 is outside 1 to 600000"),
        (
            "--min-send-rate",
            "0",
            "--min-send-rate: 0 is outside 1 to 1073741824 (bytes a second)",
        ),
        (
            "--min-send-rate",
            u,
            "--min-send-rate: 18446744073709551615 is outside 1 to 1073741824",
        ),
    ] {
        #[rustfmt::skip]
        let mut child = weft_command(&["serve", "--model-store", store.to_str().unwrap(), "--port", "0",
            "--management-port", "0", "--metrics-port", "0", flag, value])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let exited = wait_for(30, || child.try_wait().unwrap().is_some());
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{flag} {value}: the server started");
        }
        let status = child.wait().unwrap();
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(!status.success(), "{flag} {value}");
        assert!(err.contains(want), "{flag} {value}: {err}");
        assert!(!err.contains("panicked"), "{flag} {value}: {err}");
    }
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn a_batch_delay_past_the_bound_is_refused_and_half_sent_requests_are_closed() {
    let store = temp_dir("serve-delay-bound");
    train_mlp(&store);
    let s = Server::start(&store, &["--model", "m=mlp", "--read-timeout-ms", "2000"]);
    let u = u64::MAX;
    // registered, this delay held the batch's first request (and the version's removal) forever
    for query in [
        format!("max_batch_delay={u}"),
        format!("batch_size={u}"),
        "max_sequences=0".into(),
        format!("prefill_chunk={u}"),
    ] {
        // batch_size is given once (a repeated key is refused before any bound is checked)
        let batch = if query.starts_with("batch_size=") {
            ""
        } else {
            "batch_size=2&"
        };
        let path = format!("/models?url=mlp&model_name=h1&{batch}{query}");
        let (status, answer) = s.manage(Method::POST, &path, "");
        assert_eq!(status, 400, "{query}: {answer}");
        let key = query.split('=').next().unwrap();
        assert!(
            answer["error"].as_str().unwrap().starts_with(&format!("{key}: ")),
            "{answer}"
        );
    }
    // a delay within the bound: the lone request is answered after it, and the version goes
    let (status, answer) = s.manage(
        Method::POST,
        "/models?url=mlp&model_name=h1&batch_size=2&max_batch_delay=200",
        "",
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = s.post("/v2/models/h1/infer", infer_body(&[[0.5, -0.5]]));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(s.manage(Method::DELETE, "/models/h1/1", "").0, 200);

    // half a request line and headers, then nothing: closed after --read-timeout-ms
    let started = Instant::now();
    let mut c = TcpStream::connect(s.base.trim_start_matches("http://")).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.write_all(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-")
        .unwrap();
    let mut rest = Vec::new();
    let closed = c.read_to_end(&mut rest);
    assert!(closed.is_ok(), "the half-sent request held its connection: {closed:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    s.alive();
    drop(s);
    let _ = std::fs::remove_dir_all(&store);
}

/// The server's `VmHWM` or `VmRSS` (bytes) from /proc.
fn memory(s: &Server, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.child.id())).unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

#[test]
fn bodies_at_the_size_limit_are_read_in_a_few_times_their_size() {
    if !std::path::Path::new("/proc/self/status").exists() {
        eprintln!("skipped: no /proc to read the server's memory from");
        return;
    }
    let store = temp_dir("serve-body-memory");
    train_mlp(&store);
    let limit = 16usize << 20; // the default --max-body-bytes
    let items = |item: &str, room: usize| vec![item; (limit - room) / (item.len() + 1)].join(",");
    // each the largest body of its kind under the limit; as serde_json::Values these took
    // 450 to 900 MB of the server's memory each
    #[rustfmt::skip]
    let cases = [
        ("/v2/models/m/infer", format!(r#"{{"inputs": [{{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [{}]}}]}}"#, items("1", 200)), "data holds"),
        ("/v2/models/m/infer", format!(r#"{{"inputs": [{{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [{}]}}]}}"#, items("[1]", 200)), "nests as"),
        ("/predictions/m", format!("[{}]", items("[1,1,1]", 10)), "does not match"),
        ("/v1/completions", format!(r#"{{"model": "m", "prompt": [{}]}}"#, items("1", 100)), "prompt"),
        ("/v1/completions", format!(r#"{{"model": "m", "prompt": "a", "stop": [{}]}}"#, items("\"a\"", 100)), "stop sequences"),
    ];
    for (path, body, want) in cases {
        assert!(body.len() <= limit && body.len() > limit - 300, "{}", body.len());
        // a server of its own for each body: `VmHWM` is the peak of the process's life, and
        // what the allocator keeps of one request (in another thread's arena) would count
        // again under the next one's peak
        let s = Server::start(&store, &["--model", "m=mlp"]);
        let idle = memory(&s, "VmRSS");
        let (status, answer) = s.post(path, body);
        let answer: String = answer.to_string().chars().take(300).collect();
        assert_eq!(status, 400, "{path}: {answer}");
        assert!(answer.contains(want), "{path}: {answer}");
        // 8 bytes a number kept (2 to 4 body bytes each) and the body itself: measured at
        // 18 to 119 MB over the idle server, the same in five runs
        let grew = memory(&s, "VmHWM").saturating_sub(idle);
        assert!(grew < 10 * limit as u64, "{path}: the server grew by {grew} bytes");
        s.alive();
    }
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn bodies_held_at_once_past_the_budget_are_answered_503_and_the_budget_comes_back() {
    let store = temp_dir("serve-body-budget");
    train_mlp(&store);
    #[rustfmt::skip]
    let s = Server::start(&store, &["--model", "m=mlp", "--max-body-bytes", "400000",
        "--max-body-bytes-in-flight", "1000000"]);
    let addr = s.base.trim_start_matches("http://").to_string();
    // clients that send most of a 390 kB body and pause: the server holds what arrived
    let stalled = || -> TcpStream {
        let mut c = TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let head = "POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                    Content-Length: 390000\r\n\r\n";
        c.write_all(head.as_bytes()).unwrap();
        let _ = c.write_all(&[b' '; 389_990]);
        c
    };
    let first = stalled();
    let second = stalled();
    std::thread::sleep(Duration::from_millis(500));
    let mut third = stalled();
    let mut answer = String::new();
    let _ = third.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 503"),
        "{}",
        &answer[..answer.len().min(300)]
    );
    assert!(answer.to_ascii_lowercase().contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("--max-body-bytes-in-flight"), "{answer}");
    // the stalled clients leave: what they held is given back, and a request fits again
    drop((first, second));
    let answered = wait_for(10, || s.post("/v2/models/m/infer", infer_body(&[[0.5, -0.5]])).0 == 200);
    assert!(answered, "the budget did not come back");
    s.alive();
    drop(s);
    // a budget below one body is refused at start
    let mut child = weft_command(&[
        "serve",
        "--model-store",
        store.to_str().unwrap(),
        "--port",
        "0",
        "--management-port",
        "0",
        "--metrics-port",
        "0",
        "--max-body-bytes",
        "1000",
        "--max-body-bytes-in-flight",
        "999",
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(
        !status.success() && err.contains("--max-body-bytes-in-flight: 999 is below --max-body-bytes (1000)"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&store);
}
