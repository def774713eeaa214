//! What `weft serve` and `weft bench ops` took without effect, through the binary: a token file
//! that is a device or past 4 KiB stops the start at once (it was read until out of memory), the
//! management API's `initial_workers` registers that many workers (it registered 1), SIGTERM
//! stops the server within seconds while a client drips a request body and another has sent half
//! a head (it waited for them), and `weft bench ops --filter` matching no op fails.

mod common;
#[allow(dead_code)]
#[path = "serve/support.rs"]
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{temp_dir, weft, weft_command};
use reqwest::Method;
use support::{train_mlp, Server};

/// Waits up to `secs` for `child` to exit; kills it and panics naming `what` otherwise.
fn exits_within(child: &mut std::process::Child, secs: u64, what: &str) -> std::process::ExitStatus {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_token_file_that_is_a_device_or_too_long_stops_the_start() {
    let store = temp_dir("serve-token-files");
    let long = store.join("long.token");
    std::fs::write(&long, "t".repeat(1 << 20)).unwrap();
    for (file, want) in [
        ("/dev/zero", "not a regular file"),
        (long.to_str().unwrap(), "more than 4096 bytes"),
    ] {
        #[rustfmt::skip]
        let mut child = weft_command(&["serve", "--model-store", store.to_str().unwrap(), "--token-file", file,
            "--port", "0", "--management-port", "0", "--metrics-port", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = exits_within(&mut child, 30, file);
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(!status.success(), "{file}: {err}");
        assert!(err.contains("--token-file") && err.contains(want), "{file}: {err}");
    }
}

#[test]
fn initial_workers_are_registered_and_sigterm_waits_for_no_body_still_arriving() {
    let store = temp_dir("serve-refusals");
    train_mlp(&store);
    let mut s = Server::start(&store, &["--model", "cls=mlp"]);
    let (status, answer) = s.manage(Method::POST, "/models?url=mlp&model_name=x&initial_workers=3", "");
    assert_eq!(status, 200, "{answer}");
    let (status, described) = s.manage(Method::GET, "/models/x", "");
    assert_eq!(status, 200, "{described}");
    assert_eq!(described[0]["workers"], 3, "{described}");
    // a client that sent half a head, and one that drips a body a byte every 200 ms (the
    // default --read-timeout-ms, 30 s, ends neither)
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut half = TcpStream::connect(&addr).unwrap();
    half.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    let mut drip = TcpStream::connect(&addr).unwrap();
    drip.write_all(b"POST /v2/models/cls/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    let dripping = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(40);
        while Instant::now() < until && drip.write_all(b" ").is_ok() {
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) }, 0);
    let started = Instant::now();
    let status = exits_within(&mut s.child, 20, "weft serve after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    dripping.join().unwrap();
    drop(half);
}

#[test]
fn bench_ops_with_a_filter_that_matches_nothing_fails() {
    let out = weft(&["bench", "ops", "--filter", "zzz", "--min-ms", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("--filter \"zzz\"") && err.contains("matmul"), "{err}");
    // a filter that matches runs those ops only
    let out = weft(&["bench", "ops", "--filter", "gelu", "--min-ms", "1", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("\"op\":\"gelu\""), "{text}");
}
