//! `weft ui`'s connections and live event streams: half-sent and silent connections closed,
//! connections past the limit kept waiting, a run's event stream following it to its end, a
//! shutdown ending the streams, and a live run's curve growing in a real browser.

mod cdp;
mod common;
mod ui_support;

use std::process::Command;
use std::time::{Duration, Instant};

use weft_track::Status;

use common::{temp_dir, weft_bin};
use ui_support::*;

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
