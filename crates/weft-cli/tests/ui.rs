//! `weft ui`: the JSON API through a real HTTP client against the real binary (and what it
//! returns against what `weft runs` prints), and the page in a real headless browser (Debian's
//! Chromium) when one is installed.

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

    let port = free_port();
    let mut child = Command::new(weft_bin())
        .args(["ui", "--port", &port.to_string(), "--dir"])
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let _server = Server(child);
    let base = format!("http://127.0.0.1:{port}");
    assert!(first.contains(&format!("{base}/")), "{first}");

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

/// Loads the page in headless Chromium and checks the dumped DOM: the run table and a chart
/// with the newest two runs' curves.
fn browser_check(base: &str) {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).is_file());
    let Some(chromium) = chromium else {
        eprintln!("skipped: the browser check (no chromium; tools/browser/install.sh installs it)");
        return;
    };
    let profile = temp_dir("ui-chromium");
    let out = Command::new("timeout")
        .arg("120")
        .arg(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--virtual-time-budget=5000", "--dump-dom"])
        .arg(format!("{base}/"))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !dom.is_empty(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["alpha", "beta", "gamma"] {
        assert!(
            dom.contains(&format!("class=\"run-name\">{name}</a>")),
            "run {name} in the table:\n{dom}"
        );
    }
    assert!(dom.contains("id=\"chart-svg\""), "a chart:\n{dom}");
    let curves = dom.matches("class=\"curve\"").count();
    assert_eq!(curves, 2, "the newest two runs drawn:\n{dom}");
    assert!(dom.contains("1 running (refreshing)"), "{dom}");
    eprintln!("chromium drew the run table and {curves} curves");
    let _ = std::fs::remove_dir_all(&profile);
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
}
