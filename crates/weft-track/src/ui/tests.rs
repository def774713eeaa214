use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use super::*;
use crate::{NewRun, RunWriter, Status, WriterOptions};

#[test]
fn query_strings_decode() {
    let q = super::query_pairs("filter=optim.lr+%3C+1e-3+and+status+%3D+%27finished%27&sort=-id&x=%zz&y=%4");
    assert_eq!(
        q[0],
        ("filter".into(), "optim.lr < 1e-3 and status = 'finished'".into())
    );
    assert_eq!(q[1], ("sort".into(), "-id".into()));
    assert_eq!(q[2], ("x".into(), "%zz".into()));
    assert_eq!(q[3], ("y".into(), "%4".into()));
}

#[test]
fn max_points_below_4_counts_as_4_as_documented() {
    let q = |v: &str| vec![("max_points".to_string(), v.to_string())];
    assert_eq!(max_points(&[]).ok(), Some(DEFAULT_MAX_POINTS));
    // 0 was a 400 where the docs say values below 4 count as 4
    for (v, want) in [
        ("0", 4),
        ("1", 4),
        ("3", 4),
        ("4", 4),
        ("1000", 1000),
        ("100000", MAX_MAX_POINTS),
    ] {
        assert_eq!(max_points(&q(v)).ok(), Some(want), "{v}");
    }
    for bad in ["100001", "-1", "x", "", "1.5"] {
        let Err(Failure(code, msg)) = max_points(&q(bad)) else {
            panic!("{bad} accepted")
        };
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert!(msg.starts_with("max_points:"), "{msg}");
    }
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weft-ui-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn record(dir: &Path, name: &str) -> i64 {
    let run = NewRun {
        experiment: "exp".into(),
        name: Some(name.into()),
        ..Default::default()
    };
    let w = RunWriter::start(dir, run, WriterOptions::default()).unwrap();
    w.log(1, "loss", 1.0);
    let id = w.id();
    w.end(Status::Finished, None).unwrap();
    id
}

/// `GET path` from the server at `addr`: its status, content type and body.
fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

/// The dashboard of the store in `dir`, served on a free loopback port while `f` runs.
fn serve(dir: &Path, f: impl FnOnce(std::net::SocketAddr)) {
    let store = Store::open_existing(dir).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (_closing_tx, closing) = tokio::sync::watch::channel(false);
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app(store, closing, |r| r);
    runtime.spawn(async move { axum::serve(listener, app).await });
    f(addr);
    runtime.shutdown_background();
}

#[test]
fn every_error_is_json_and_a_replaced_store_is_served_anew() {
    let dir = temp("http");
    let id = record(&dir, "old");
    serve(&dir, |addr| {
        // a path segment that is not UTF-8 once decoded: axum's plain-text 400 before
        for path in [
            "/api/runs/%ff".to_string(),
            "/api/runs/%ff/metrics".to_string(),
            format!("/api/runs/{id}/metrics/%ff"),
            "/api/runs/%ff/events".to_string(),
            format!("/api/runs/{id}/artifacts/%ff"),
        ] {
            let (status, content_type, body) = get(addr, &path);
            assert_eq!(status, 400, "{path}: {body}");
            assert_eq!(content_type, "application/json", "{path}: {body}");
            let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
            assert!(
                v["error"].as_str().is_some_and(|e| e.contains("UTF-8")),
                "{path}: {body}"
            );
        }
        let (status, _, body) = get(addr, &format!("/api/runs/{id}/metrics?max_points=0"));
        assert_eq!(status, 200, "{body}");
        // the store deleted and made again by a new run: its runs, not the old file's
        let (_, _, body) = get(addr, "/api/runs");
        assert!(body.contains("\"old\""), "{body}");
        std::fs::remove_dir_all(&dir).unwrap();
        let (status, _, body) = get(addr, "/api/runs");
        assert_eq!(status, 500, "{body}");
        assert!(body.contains("deleted or moved"), "{body}");
        record(&dir, "new");
        let (status, _, body) = get(addr, "/api/runs");
        assert_eq!(status, 200, "{body}");
        let names: Vec<String> = serde_json::from_str::<Vec<Value>>(&body)
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(names, ["new"]);
    });
    let _ = std::fs::remove_dir_all(&dir);
}
