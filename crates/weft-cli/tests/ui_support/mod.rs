//! What the `weft ui` tests share: a server started on a free port, runs recorded in a store,
//! the JSON API and the CLI's answers read, event streams followed, the screenshots' folder.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use weft_track::{NewRun, RunWriter, Status, WriterOptions};

use crate::common::{free_port, weft_bin};

/// Kills the server when the test ends, passing or not.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `weft ui` on `dir` at a free port: the server and its base URL.
pub fn start_ui(dir: &Path) -> (Server, String) {
    start_ui_with(dir, &[])
}

/// [`start_ui`] with more flags.
pub fn start_ui_with(dir: &Path, flags: &[&str]) -> (Server, String) {
    let port = free_port();
    let mut child = Command::new(weft_bin())
        .args(["ui", "--port", &port.to_string()])
        .args(flags)
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    assert!(first.contains(&format!("{base}/")), "{first}");
    (Server(child), base)
}

pub fn record(dir: &Path, experiment: &str, name: &str, lr: &str, steps: u64) -> i64 {
    let run = NewRun {
        experiment: experiment.into(),
        name: Some(name.into()),
        params: vec![("optim.lr".into(), lr.into()), ("model.kind".into(), "gpt".into())],
        tags: vec![("team".into(), "nlp".into())],
        ..Default::default()
    };
    let w = RunWriter::start(dir, run, WriterOptions::default()).unwrap();
    for s in 0..steps {
        w.log(
            s,
            "loss",
            4.0 / (1.0 + s as f64 * 0.01) + if s == steps / 3 { 7.0 } else { 0.0 },
        );
        if s % 10 == 0 {
            w.log(s, "lr", 0.001);
        }
    }
    w.end(Status::Finished, None).unwrap();
    w.id()
}

pub fn get(url: &str) -> (u16, Value) {
    let r = reqwest::blocking::get(url).unwrap();
    let code = r.status().as_u16();
    (code, serde_json::from_str(&r.text().unwrap()).unwrap())
}

pub fn cli_json(dir: &Path, args: &[&str]) -> Value {
    let out = Command::new(weft_bin())
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Where the browser checks keep their screenshots: `WEFT_UI_SCREENSHOTS`, else
/// `CARGO_TARGET_TMPDIR/ui-screenshots` (`target/tmp/ui-screenshots`).
pub fn screenshots_dir() -> std::path::PathBuf {
    let shots = std::env::var_os("WEFT_UI_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots"));
    std::fs::create_dir_all(&shots).unwrap();
    shots
}

/// A live run writing to `dir` (its values reach the store within 50 ms).
pub fn live_run(dir: &Path, name: &str) -> RunWriter {
    let run = NewRun {
        experiment: "live".into(),
        name: Some(name.into()),
        ..Default::default()
    };
    let options = WriterOptions {
        flush_every: Duration::from_millis(50),
        ..Default::default()
    };
    RunWriter::start(dir, run, options).unwrap()
}

/// One server-sent event: its name, id and data.
#[derive(Debug, Default, Clone)]
pub struct SseEvent {
    pub event: String,
    pub id: Option<i64>,
    pub data: Value,
}

/// Reads `url`'s event stream on a thread: its events, then `None` when it closes.
pub fn sse(url: &str, last_event_id: Option<i64>) -> std::sync::mpsc::Receiver<Option<SseEvent>> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut request = client.get(url);
    if let Some(id) = last_event_id {
        request = request.header("Last-Event-ID", id.to_string());
    }
    let response = request.send().unwrap();
    assert_eq!(response.status(), 200, "{url}");
    let kind = response.headers()["content-type"].to_str().unwrap().to_string();
    assert!(kind.starts_with("text/event-stream"), "{kind}");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut event = SseEvent::default();
        for line in BufReader::new(response).lines() {
            let Ok(line) = line else { break };
            if line.is_empty() {
                if !event.event.is_empty() && tx.send(Some(std::mem::take(&mut event))).is_err() {
                    return;
                }
            } else if let Some(v) = line.strip_prefix("event: ") {
                event.event = v.into();
            } else if let Some(v) = line.strip_prefix("id: ") {
                event.id = Some(v.parse().unwrap());
            } else if let Some(v) = line.strip_prefix("data: ") {
                event.data = serde_json::from_str(v).unwrap();
            }
        }
        let _ = tx.send(None);
    });
    rx
}

/// The next event (or the stream's end, `None`) within 20 s.
pub fn next(rx: &std::sync::mpsc::Receiver<Option<SseEvent>>) -> Option<SseEvent> {
    rx.recv_timeout(Duration::from_secs(20)).expect("an event within 20 s")
}

/// The steps of a `metrics` event's loss values.
pub fn loss_steps(e: &SseEvent) -> Vec<u64> {
    assert_eq!(e.event, "metrics", "{e:?}");
    e.data["points"]["loss"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_u64().unwrap())
        .collect()
}
