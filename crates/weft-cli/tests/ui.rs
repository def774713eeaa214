//! `weft ui`: the JSON API through a real HTTP client against the real binary (and what it
//! returns against what `weft runs` prints), and the page in a real headless browser (Debian's
//! Chromium) when one is installed.

mod cdp;
mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_track::{NewRun, RunWriter, Status, WriterOptions};

use common::{free_port, temp_dir, weft_bin};

/// Kills the server when the test ends, passing or not.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `weft ui` on `dir` at a free port: the server and its base URL.
fn start_ui(dir: &Path) -> (Server, String) {
    start_ui_with(dir, &[])
}

/// [`start_ui`] with more flags.
fn start_ui_with(dir: &Path, flags: &[&str]) -> (Server, String) {
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

fn record(dir: &Path, experiment: &str, name: &str, lr: &str, steps: u64) -> i64 {
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

fn get(url: &str) -> (u16, Value) {
    let r = reqwest::blocking::get(url).unwrap();
    let code = r.status().as_u16();
    (code, serde_json::from_str(&r.text().unwrap()).unwrap())
}

fn cli_json(dir: &Path, args: &[&str]) -> Value {
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

#[test]
fn the_api_answers_what_the_cli_shows_and_a_browser_draws_the_runs() {
    let dir = temp_dir("ui").join("weft-runs");
    let alpha = record(&dir, "exp", "alpha", "0.001", 50);
    let beta = record(&dir, "exp", "beta", "0.002", 120_000);
    // a live run: it logs while the test reads it
    let live = RunWriter::start(
        &dir,
        NewRun {
            experiment: "other".into(),
            name: Some("gamma".into()),
            ..Default::default()
        },
        WriterOptions {
            flush_every: Duration::from_millis(50),
            ..Default::default()
        },
    )
    .unwrap();
    let gamma = live.id();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let logger = {
        let (live, stop) = (live.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut s = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                live.log(s, "loss", 3.0 - s as f64 * 1e-3);
                s += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    let (_server, base) = start_ui(&dir);

    let (code, experiments) = get(&format!("{base}/api/experiments"));
    assert_eq!(code, 200);
    assert_eq!(experiments[0]["name"], "exp");
    assert_eq!(experiments[0]["runs"], 2);
    assert_eq!(experiments[1]["name"], "other");
    assert_eq!(experiments[1]["running"], 1);

    // the run table and a run: what `weft runs list --json` and `show --json` print
    let (code, runs) = get(&format!("{base}/api/runs?experiment=exp"));
    assert_eq!(code, 200);
    assert_eq!(runs, cli_json(&dir, &["runs", "list", "--json", "--experiment", "exp"]));
    assert_eq!(runs.as_array().unwrap().len(), 2);
    let (code, one) = get(&format!("{base}/api/runs/{beta}"));
    assert_eq!(code, 200);
    assert_eq!(one, cli_json(&dir, &["runs", "show", "exp/beta", "--json"]));
    assert_eq!(one["params"]["optim.lr"], "0.002");
    assert_eq!(one["metric_summaries"]["loss"]["count"], 120_000);

    let filter = "optim.lr+%3E+0.0015+and+status+%3D+%27finished%27";
    let (_, filtered) = get(&format!("{base}/api/runs?filter={filter}&sort=-id"));
    let names: Vec<&str> = filtered
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["beta"]);
    let (_, all) = get(&format!("{base}/api/runs?sort=-id"));
    assert_eq!(all.as_array().unwrap().len(), 3);
    assert_eq!(all[0]["name"], "gamma");
    assert_eq!(all[0]["status"], "running");
    let (code, bad) = get(&format!("{base}/api/runs?filter=optim.lr+%3C+abc"));
    assert_eq!(code, 400);
    assert!(bad["error"].as_str().unwrap().contains("expected a number"), "{bad}");

    // curves arrive down-sampled, keeping the ends and the spike
    let t = Instant::now();
    let (code, m) = get(&format!("{base}/api/runs/{beta}/metrics?key=loss"));
    eprintln!("120,000-point series in {} ms (debug build)", t.elapsed().as_millis());
    assert_eq!(code, 200);
    let loss = &m["metrics"]["loss"];
    assert_eq!(loss["count"], 120_000);
    let points = loss["points"].as_array().unwrap();
    assert!(points.len() <= 1000 && points.len() > 900, "{}", points.len());
    assert_eq!(points[0][0], 0);
    assert_eq!(points.last().unwrap()[0], 119_999);
    assert!(points.iter().any(|p| p[0] == 40_000), "the spike at step 40000 is kept");
    let (_, m) = get(&format!("{base}/api/runs/{beta}/metrics/loss?max_points=100"));
    assert!(m["metrics"]["loss"]["points"].as_array().unwrap().len() <= 100);
    let (_, m) = get(&format!("{base}/api/runs/{alpha}/metrics"));
    assert_eq!(m["metrics"]["loss"]["points"].as_array().unwrap().len(), 50);
    assert_eq!(m["metrics"]["lr"]["count"], 5);
    assert_eq!(get(&format!("{base}/api/runs/999/metrics")).0, 404);
    assert_eq!(get(&format!("{base}/api/runs/999")).0, 404);
    assert_eq!(get(&format!("{base}/api/runs/{alpha}/metrics?max_points=x")).0, 400);

    // the live run grows between two reads
    let count = || {
        get(&format!("{base}/api/runs/{gamma}/metrics?key=loss")).1["metrics"]["loss"]["count"]
            .as_u64()
            .unwrap()
    };
    let before = count();
    std::thread::sleep(Duration::from_millis(400));
    assert!(count() > before, "the live run's curve grows");

    let page = reqwest::blocking::get(format!("{base}/")).unwrap().text().unwrap();
    assert!(page.contains("<title>weft runs</title>"));
    // the SVG namespace is a name, not an address fetched
    let page = page.replace("http://www.w3.org/2000/svg", "");
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "the page fetches nothing from elsewhere"
    );

    // a page elsewhere whose name was rebound to 127.0.0.1 reads nothing
    let rebound = reqwest::blocking::Client::new()
        .get(format!("{base}/api/runs"))
        .header("Host", "evil.example")
        .send()
        .unwrap();
    assert_eq!(rebound.status(), 403);
    assert!(rebound.text().unwrap().contains("loopback"));

    browser_check(&base);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    logger.join().unwrap();
    live.end(Status::Finished, None).unwrap();
}

/// Loads the page in headless Chromium (driven over the DevTools protocol) and checks what it
/// drew: the run table and a chart with the newest two runs' curves.
fn browser_check(base: &str) {
    let Some(chromium) = cdp::chromium() else {
        eprintln!("skipped: the browser check (no chromium; tools/browser/install.sh installs it)");
        return;
    };
    let mut page = cdp::Page::open(chromium, &format!("{base}/"), temp_dir("ui-chromium"), 1400, 900);
    let names = "[...document.querySelectorAll('#runs a.run-name')].map(a => a.textContent).sort().join(',')";
    page.wait_for("the three runs in the table", names, Duration::from_secs(60), |v| {
        v == "alpha,beta,gamma"
    });
    let curves = "document.querySelectorAll('#chart-svg polyline.curve').length";
    page.wait_for("the newest two runs drawn", curves, Duration::from_secs(60), |v| v == 2);
    assert_eq!(
        page.eval("document.getElementById('live').textContent"),
        "1 running (live)"
    );
    page.screenshot(&screenshots_dir().join("runs-table.png"));
    eprintln!("chromium drew the run table and 2 curves");
}

/// Where the browser checks keep their screenshots: `WEFT_UI_SCREENSHOTS`, else
/// `CARGO_TARGET_TMPDIR/ui-screenshots` (`target/tmp/ui-screenshots`).
fn screenshots_dir() -> std::path::PathBuf {
    let shots = std::env::var_os("WEFT_UI_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots"));
    std::fs::create_dir_all(&shots).unwrap();
    shots
}

/// A live run writing to `dir` (its values reach the store within 50 ms).
fn live_run(dir: &Path, name: &str) -> RunWriter {
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
struct SseEvent {
    event: String,
    id: Option<i64>,
    data: Value,
}

/// Reads `url`'s event stream on a thread: its events, then `None` when it closes.
fn sse(url: &str, last_event_id: Option<i64>) -> std::sync::mpsc::Receiver<Option<SseEvent>> {
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
fn next(rx: &std::sync::mpsc::Receiver<Option<SseEvent>>) -> Option<SseEvent> {
    rx.recv_timeout(Duration::from_secs(20)).expect("an event within 20 s")
}

/// The steps of a `metrics` event's loss values.
fn loss_steps(e: &SseEvent) -> Vec<u64> {
    assert_eq!(e.event, "metrics", "{e:?}");
    e.data["points"]["loss"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_u64().unwrap())
        .collect()
}

/// A connection that sends half a request head, or nothing, is closed after `--read-timeout-ms`
/// (it held its file descriptor forever before), and the dashboard answers afterwards.
#[test]
fn half_sent_and_silent_connections_are_closed() {
    use std::io::{Read, Write};
    let dir = temp_dir("ui-timeout").join("weft-runs");
    record(&dir, "exp", "one", "0.1", 3);
    let (_server, base) = start_ui_with(&dir, &["--read-timeout-ms", "300"]);
    let addr = base.trim_start_matches("http://").to_string();
    for raw in [
        &b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAcc"[..],
        b"GET /api",
        b"",
    ] {
        let started = Instant::now();
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(raw).unwrap();
        let mut rest = Vec::new();
        let closed = c.read_to_end(&mut rest);
        assert!(closed.is_ok(), "{raw:?}: still open after 10 s: {closed:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{raw:?}: {:?}",
            started.elapsed()
        );
    }
    let (code, runs) = get(&format!("{base}/api/runs"));
    assert_eq!(code, 200, "{runs}");
    // the flag's bounds
    let out = Command::new(weft_bin())
        .args(["ui", "--port", "0", "--read-timeout-ms", "0", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--read-timeout-ms"), "{err}");
}

/// Past `--max-connections` open connections, a new one waits unaccepted (its request gets no
/// answer) until one of the open ones closes; then it is answered.
#[test]
fn connections_past_the_limit_wait_until_one_closes() {
    use std::io::{Read, Write};
    let dir = temp_dir("ui-connections").join("weft-runs");
    record(&dir, "exp", "one", "0.1", 3);
    let (_server, base) = start_ui_with(&dir, &["--max-connections", "2", "--read-timeout-ms", "60000"]);
    let addr = base.trim_start_matches("http://").to_string();
    let first = std::net::TcpStream::connect(&addr).unwrap();
    let _second = std::net::TcpStream::connect(&addr).unwrap();
    let mut third = std::net::TcpStream::connect(&addr).unwrap();
    third
        .write_all(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    third.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    let mut byte = [0u8; 1];
    let waited = third.read(&mut byte);
    assert!(
        waited
            .as_ref()
            .is_err_and(|e| matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
        "the third connection was served while two were open: {waited:?}"
    );
    drop(first);
    third.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = Vec::new();
    third.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // the flag's bounds
    let out = Command::new(weft_bin())
        .args(["ui", "--port", "0", "--max-connections", "0", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--max-connections"), "{err}");
}

#[test]
fn a_runs_event_stream_sends_its_new_values_then_ends_with_the_run() {
    let dir = temp_dir("ui-events").join("weft-runs");
    let live = live_run(&dir, "streamed");
    for s in 0..5 {
        live.log(s, "loss", 1.0 / (s + 1) as f64);
    }
    let id = live.id();
    let (_server, base) = start_ui(&dir);
    let read = |after: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (code, m) = get(&format!("{base}/api/runs/{id}/metrics{after}"));
            assert_eq!(code, 200);
            if m["metrics"]["loss"]["count"] == 5 || Instant::now() > deadline {
                return m;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let m = read("");
    assert_eq!(m["metrics"]["loss"]["count"], 5);
    let cursor = m["cursor"].as_i64().unwrap();

    // from the series' cursor: only what the run writes next, in order, then the end
    let events = sse(&format!("{base}/api/runs/{id}/events?after={cursor}"), None);
    for s in 5..15 {
        live.log(s, "loss", 1.0 / (s + 1) as f64);
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut per_event, mut ids) = (Vec::new(), Vec::new());
    while per_event.iter().map(Vec::len).sum::<usize>() < 10 {
        let e = next(&events).expect("the stream goes on while the run runs");
        per_event.push(loss_steps(&e));
        ids.push(e.id.expect("a metrics event has an id"));
    }
    assert_eq!(per_event.concat(), (5..15).collect::<Vec<u64>>());
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    live.end(Status::Finished, None).unwrap();
    let end = next(&events).expect("an end event");
    assert_eq!(end.event, "end");
    assert_eq!(end.data["status"], "finished");
    assert!(next(&events).is_none(), "the stream closes after its end");

    // a reconnect from an event's id (as a browser does) sends the rest; with no cursor, a
    // finished run's stream is its end alone
    // (the browser reconnects to the URL it opened, `?after=` and all: the header wins)
    let resumed = sse(&format!("{base}/api/runs/{id}/events?after={cursor}"), Some(ids[0]));
    let mut rest = Vec::new();
    let last = loop {
        let e = next(&resumed).expect("events");
        if e.event != "metrics" {
            break e;
        }
        rest.extend(loss_steps(&e));
    };
    assert_eq!(rest, per_event[1..].concat());
    assert_eq!(last.event, "end");
    let fresh = sse(&format!("{base}/api/runs/{id}/events"), None);
    assert_eq!(next(&fresh).map(|e| e.event).as_deref(), Some("end"));
    let whole = sse(&format!("{base}/api/runs/{id}/events?after=0"), None);
    let all = loss_steps(&next(&whole).unwrap());
    assert_eq!(all, (0..15).collect::<Vec<u64>>());

    assert_eq!(get(&format!("{base}/api/runs/999/events")).0, 404);
    let (code, bad) = get(&format!("{base}/api/runs/{id}/events?after=x"));
    assert_eq!(code, 400);
    assert!(bad["error"].as_str().unwrap().starts_with("after:"), "{bad}");
}

/// SIGINT or SIGTERM to `weft ui` ends the live event streams it serves, so it stops while a
/// browser follows a running run (the graceful shutdown waited for the stream, which lasts as
/// long as the run: hours).
#[test]
fn a_shutdown_ends_the_live_event_streams() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let dir = temp_dir(&format!("ui-shutdown-{signal}")).join("weft-runs");
        let live = live_run(&dir, "running");
        live.log(0, "loss", 1.0);
        let (mut server, base) = start_ui(&dir);
        let events = sse(&format!("{base}/api/runs/{}/events?after=0", live.id()), None);
        assert_eq!(next(&events).map(|e| e.event).as_deref(), Some("metrics"));
        let sent = Instant::now();
        // SAFETY: kill has no memory effects; the pid is this test's child
        unsafe { libc::kill(server.0.id() as i32, signal) };
        let status = loop {
            if let Some(status) = server.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                sent.elapsed() < Duration::from_secs(15),
                "weft ui still runs 15 s after signal {signal}, a stream open"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "{status:?}");
        assert!(next(&events).is_none(), "the stream closes");
        live.end(Status::Finished, None).unwrap();
    }
}

/// The page in a real headless browser while a run trains: its curve grows through the run's
/// event stream (one fetch of its series, then events), and the run's row turns finished when
/// it ends. Screenshots before, while and after are kept in `CARGO_TARGET_TMPDIR/ui-screenshots`
/// (or `WEFT_UI_SCREENSHOTS`).
#[test]
fn a_live_runs_curve_grows_in_the_browser() {
    let Some(chromium) = cdp::chromium() else {
        eprintln!("skipped: the live browser check (no chromium; tools/browser/install.sh installs it)");
        return;
    };
    let dir = temp_dir("ui-live").join("weft-runs");
    record(&dir, "exp", "done", "0.001", 120);
    let live = live_run(&dir, "growing");
    let id = live.id();
    for s in 0..30 {
        live.log(s, "loss", 3.0 * (-(s as f64) / 40.0).exp() + 0.5);
    }
    std::thread::sleep(Duration::from_millis(200));
    let (_server, base) = start_ui(&dir);
    let shots = screenshots_dir();
    let mut page = cdp::Page::open(chromium, &format!("{base}/"), temp_dir("ui-live-chromium"), 1400, 900);

    let points = format!("Number(document.querySelector('polyline[data-run=\"{id}\"]')?.dataset.points ?? -1)");
    let streaming = format!("state.streams[{id}] instanceof EventSource && state.streams[{id}].readyState === 1");
    page.wait_for("30 points drawn", &points, Duration::from_secs(30), |v| v == 30);
    page.wait_for("the run's stream open", &streaming, Duration::from_secs(30), |v| {
        v == true
    });
    page.screenshot(&shots.join("live-1-start.png"));

    for s in 30..90 {
        live.log(s, "loss", 3.0 * (-(s as f64) / 40.0).exp() + 0.5);
        std::thread::sleep(Duration::from_millis(20));
        if s == 60 {
            page.wait_for("the curve growing", &points, Duration::from_secs(30), |v| {
                v.as_u64() > Some(30)
            });
            page.screenshot(&shots.join("live-2-growing.png"));
        }
    }
    page.wait_for("90 points drawn", &points, Duration::from_secs(30), |v| v == 90);
    let fetches = format!(
        "performance.getEntriesByType('resource').filter(e => e.name.includes('/api/runs/{id}/metrics')).length"
    );
    assert_eq!(
        page.eval(&fetches),
        1,
        "the series is fetched once; the rest came as events"
    );
    assert_eq!(page.eval(&format!("state.series[{id}].loss.count")), 90);
    assert_eq!(
        page.eval("document.getElementById('live').textContent"),
        "1 running (live)"
    );

    live.end(Status::Finished, None).unwrap();
    let finished = format!("document.querySelector('tr[data-run=\"{id}\"] td.status-finished') !== null");
    page.wait_for("the run's row finished", &finished, Duration::from_secs(30), |v| {
        v == true
    });
    page.wait_for(
        "its stream closed",
        &format!("{id} in state.streams"),
        Duration::from_secs(30),
        |v| v == false,
    );
    assert_eq!(page.eval("document.getElementById('live').textContent"), "");
    assert_eq!(page.eval(&points), 90);
    page.screenshot(&shots.join("live-3-finished.png"));
    let read = |n: &str| std::fs::read(shots.join(n)).unwrap();
    assert_ne!(read("live-1-start.png"), read("live-3-finished.png"));
    eprintln!(
        "chromium drew the live curve growing 30 -> 90 points; screenshots in {}",
        shots.display()
    );
}

/// A finished or pruned trial of sweep `sweep` (tagged as `weft sweep` tags them) whose
/// `val_loss` ends at `last`, with a checkpoint folder recorded as its artifact.
fn trial(dir: &Path, sweep: &str, n: u64, last: f64, status: Status) -> i64 {
    let run = NewRun {
        experiment: "tune".into(),
        name: Some(format!("{sweep}-trial-{n}")),
        params: vec![("optim.lr".into(), format!("{}", 0.001 * (n + 1) as f64))],
        tags: [("sweep", sweep.to_string()), ("sweep_trial", n.to_string())]
            .into_iter()
            .chain([("sweep_metric", "val_loss".into()), ("sweep_goal", "minimize".into())])
            .chain([("sys.cpus", "2".to_string())])
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        inputs: vec![weft_track::RunInput {
            kind: "data".into(),
            uri: "s3://corpus/shards".into(),
            digest: Some(format!("sha256:{n:064}")),
            source_run: None,
        }],
        ..Default::default()
    };
    let w = RunWriter::start(dir, run, WriterOptions::default()).unwrap();
    for s in 0..20 {
        w.log(s * 10, "val_loss", last + 2.0 / (1.0 + s as f64) - 2.0 / 20.0);
    }
    let ckpt = dir.join(format!("ckpt-{sweep}-{n}"));
    std::fs::create_dir_all(&ckpt).unwrap();
    std::fs::write(ckpt.join("COMPLETE"), "").unwrap();
    std::fs::write(ckpt.join("index.json"), "{}").unwrap();
    w.artifact("checkpoint", &ckpt);
    w.end(status, None).unwrap();
    w.id()
}

#[test]
fn the_sweep_and_model_views_show_the_store() {
    let dir = temp_dir("ui-views").join("weft-runs");
    record(&dir, "exp", "plain", "0.001", 30);
    let finals = [2.0, 1.5, 1.8, 2.4];
    let ids: Vec<i64> = finals
        .iter()
        .enumerate()
        .map(|(n, &v)| {
            let status = if n == 3 { Status::Pruned } else { Status::Finished };
            trial(&dir, "lr-search", n as u64, v, status)
        })
        .collect();
    let mut registry = weft_tune::registry::ModelRegistry::open(&dir).unwrap();
    registry.register(&dir, "tune/lr-search-trial-0", "char_gpt").unwrap();
    registry.register(&dir, &ids[1].to_string(), "char_gpt").unwrap();
    registry
        .promote("char_gpt", 2, weft_tune::registry::Stage::Production)
        .unwrap();
    drop(registry);
    let (_server, base) = start_ui(&dir);

    let (code, sweeps) = get(&format!("{base}/api/sweeps"));
    assert_eq!(code, 200);
    assert_eq!(sweeps.as_array().unwrap().len(), 1, "{sweeps}");
    let sweep = &sweeps[0];
    assert_eq!(sweep["name"], "lr-search");
    assert_eq!(sweep["experiment"], "tune");
    assert_eq!(sweep["trials"], 4);
    assert_eq!(sweep["by_status"]["finished"], 3);
    assert_eq!(sweep["by_status"]["pruned"], 1);
    assert_eq!(sweep["metric"], "val_loss");
    assert_eq!(sweep["best"]["run"], ids[1]);
    assert_eq!(sweep["best"]["name"], "lr-search-trial-1");
    assert!(
        (sweep["best"]["value"].as_f64().unwrap() - 1.5).abs() < 1e-12,
        "{sweep}"
    );
    let (code, models) = get(&format!("{base}/api/models"));
    assert_eq!(code, 200);
    assert_eq!(models, cli_json(&dir, &["models", "list", "--json"]));
    assert_eq!(models[1]["stage"], "production");
    assert_eq!(models[1]["source_run"], ids[1]);

    let Some(chromium) = cdp::chromium() else {
        eprintln!(
            "skipped: the sweep and model views in the browser (no chromium; tools/browser/install.sh installs it)"
        );
        return;
    };
    let shots = screenshots_dir();
    let mut page = cdp::Page::open(chromium, &format!("{base}/"), temp_dir("ui-views-chromium"), 1400, 900);
    let rows = "document.querySelectorAll('#runs tbody tr').length";
    page.wait_for("the run table", rows, Duration::from_secs(30), |v| v == 5);
    page.wait_for(
        "the models tab shown",
        "!document.querySelector('#views a[data-view=\"models\"]').hidden",
        Duration::from_secs(30),
        |v| v == true,
    );

    page.eval("document.querySelector('#views a[data-view=\"sweeps\"]').click()");
    let sweep_row = "document.querySelector('#sweeps tr[data-sweep=\"lr-search\"]')?.innerText ?? ''";
    let text = page.wait_for("the sweep's row", sweep_row, Duration::from_secs(30), |v| {
        v.as_str().is_some_and(|t| !t.is_empty())
    });
    let cells: Vec<&str> = text.as_str().unwrap().split('\t').map(str::trim).collect();
    assert_eq!(
        cells[..5],
        ["lr-search", "tune", "4", "3", "1"],
        "sweep, experiment, trials, finished, pruned: {cells:?}"
    );
    assert!(
        cells.contains(&"1.5") && cells.contains(&"lr-search-trial-1"),
        "{cells:?}"
    );
    assert_eq!(page.eval("document.getElementById('runs-view').hidden"), true);
    page.screenshot(&shots.join("views-1-sweeps.png"));

    // a sweep's name: its trials in the table, best first, the best five (here four) drawn
    page.eval("document.querySelector('#sweeps a.sweep-name').click()");
    let names = "[...document.querySelectorAll('#runs tbody a.run-name')].map(a => a.textContent).join(',')";
    page.wait_for("the sweep's trials by val_loss", names, Duration::from_secs(30), |v| {
        v == "lr-search-trial-1,lr-search-trial-2,lr-search-trial-0,lr-search-trial-3"
    });
    page.wait_for(
        "four curves of val_loss",
        "document.querySelectorAll('#chart-svg polyline').length + ':' + document.getElementById('key').value",
        Duration::from_secs(30),
        |v| v == "4:val_loss",
    );
    assert_eq!(
        page.eval("document.getElementById('filter').value"),
        "tags.sweep = 'lr-search'"
    );
    page.screenshot(&shots.join("views-2-sweep-trials.png"));

    page.eval("document.querySelector('#views a[data-view=\"models\"]').click()");
    let model_rows = "[...document.querySelectorAll('#models tbody tr')].map(r => r.dataset.model + ' ' + r.children[2].textContent).join(',')";
    page.wait_for("the model versions", model_rows, Duration::from_secs(30), |v| {
        v == "char_gpt/1 none,char_gpt/2 production"
    });
    page.screenshot(&shots.join("views-3-models.png"));
    // a version's run opens its details
    page.eval("document.querySelectorAll('#models tbody tr')[1].children[3].querySelector('a').click()");
    page.wait_for(
        "the source run's details",
        "document.querySelector('#details h3')?.textContent ?? ''",
        Duration::from_secs(30),
        |v| v.as_str() == Some(&format!("run {}: tune/lr-search-trial-1", ids[1])),
    );
    // the machine's tags apart, as "system"
    let system = page.eval("document.getElementById('run-system')?.innerText ?? ''");
    assert!(system.as_str().unwrap().contains("cpus\t2"), "{system}");
    // what it read
    let inputs = page.eval("document.getElementById('run-inputs')?.innerText ?? ''");
    assert!(
        inputs
            .as_str()
            .unwrap()
            .contains(&format!("data\ts3://corpus/shards\tsha256:{:064}", 1)),
        "{inputs}"
    );
    eprintln!(
        "chromium showed the sweep, its trials and the model versions; screenshots in {}",
        shots.display()
    );
}

#[test]
fn a_runs_trace_and_sample_files_are_served_and_nothing_else() {
    let dir = temp_dir("ui-artifacts").join("weft-runs");
    let files = dir.parent().unwrap().join("files");
    std::fs::create_dir_all(files.join("step-3")).unwrap();
    std::fs::write(files.join("trace.json"), br#"{"traceEvents": []}"#).unwrap();
    std::fs::write(files.join("sample.txt"), "\nTo be").unwrap();
    let w = live_run(&dir, "with-files");
    w.artifact("trace", &files.join("trace.json"));
    w.artifact("sample", &files.join("sample.txt"));
    w.artifact("checkpoint", &files.join("step-3"));
    w.artifact("tensorboard", &files.join("gone.tfevents"));
    w.end(Status::Finished, None).unwrap();
    let id = w.id();
    let (_server, base) = start_ui(&dir);
    let fetch = |kind: &str| {
        let r = reqwest::blocking::get(format!("{base}/api/runs/{id}/artifacts/{kind}")).unwrap();
        let (code, kind) = (r.status().as_u16(), r.headers().get("content-type").cloned());
        (code, kind, r.text().unwrap())
    };
    let (code, kind, body) = fetch("trace");
    assert_eq!((code, body.as_str()), (200, r#"{"traceEvents": []}"#));
    assert_eq!(kind.unwrap(), "application/json");
    assert_eq!(fetch("sample").2, "\nTo be");
    // a folder, a kind not served, a file gone, a run unknown
    let (code, _, body) = fetch("checkpoint");
    assert_eq!(code, 404);
    assert!(body.contains("served are trace, sample, tensorboard"), "{body}");
    let (code, _, body) = fetch("tensorboard");
    assert_eq!(code, 404);
    assert!(body.contains("gone.tfevents"), "{body}");
    assert_eq!(get(&format!("{base}/api/runs/999/artifacts/trace")).0, 404);
    assert_eq!(get(&format!("{base}/api/runs/{id}/artifacts/..%2F..%2Fetc")).0, 404);

    // a file of several 64 KiB pieces arrives whole, under a name no header may hold, cleaned
    // (a 500 in plain text before); a recorded path swapped for a link is not followed
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let odd = files.join("odd\nname.tfevents");
    std::fs::write(&odd, &big).unwrap();
    std::fs::write(files.join("real.txt"), "not the run's").unwrap();
    std::fs::write(files.join("swapped.txt"), "the run's").unwrap();
    let w2 = live_run(&dir, "odd-files");
    w2.artifact("tensorboard", &odd);
    w2.artifact("sample", &files.join("swapped.txt"));
    w2.end(Status::Finished, None).unwrap();
    std::fs::remove_file(files.join("swapped.txt")).unwrap();
    std::os::unix::fs::symlink(files.join("real.txt"), files.join("swapped.txt")).unwrap();
    let id2 = w2.id();
    let r = reqwest::blocking::get(format!("{base}/api/runs/{id2}/artifacts/tensorboard")).unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.headers()["content-disposition"],
        "attachment; filename=\"odd_name.tfevents\""
    );
    assert_eq!(r.bytes().unwrap().as_ref(), &big[..]);
    let (code, body) = get(&format!("{base}/api/runs/{id2}/artifacts/sample"));
    assert_eq!(code, 404);
    assert!(body["error"].as_str().unwrap().contains("is a symbolic link"), "{body}");
    // nor is a FIFO put in a recorded file's place opened (that waited for a writer forever,
    // and kept the server from stopping)
    let fifo = files.join("fifo.json");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: c_path is a valid NUL-terminated path
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let w3 = live_run(&dir, "fifo");
    w3.artifact("trace", &fifo);
    w3.end(Status::Finished, None).unwrap();
    let r = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .get(format!("{base}/api/runs/{}/artifacts/trace", w3.id()))
        .send()
        .expect("an answer within 10 s");
    assert_eq!(r.status().as_u16(), 404);
    let body: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("fifo.json is not a file"),
        "{body}"
    );

    // a series asked for with more points than any page draws; routes and methods not served:
    // each a JSON error
    let (code, body) = get(&format!("{base}/api/runs/{id}/metrics?max_points=18446744073709551615"));
    assert_eq!(code, 400);
    assert!(body["error"].as_str().unwrap().contains("from 1 to 100000"), "{body}");
    let (code, body) = get(&format!("{base}/api/nope"));
    assert_eq!(code, 404);
    assert!(body["error"].as_str().unwrap().contains("/api/nope"), "{body}");
    let r = reqwest::blocking::Client::new()
        .post(format!("{base}/api/runs"))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    let body: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    assert!(body["error"].as_str().unwrap().contains("GET"), "{body}");
}

#[test]
fn a_folder_without_a_store_is_named() {
    let dir = temp_dir("ui-empty");
    let out = Command::new(weft_bin())
        .args(["ui", "--port", "0", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("runs.db") && err.contains("no run store here"), "{err}");
    // a runs.db that is a folder is named as such (it read as no store at all)
    std::fs::create_dir(dir.join("runs.db")).unwrap();
    let out = Command::new(weft_bin())
        .args(["runs", "list", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("runs.db") && err.contains("a directory"), "{err}");
}
