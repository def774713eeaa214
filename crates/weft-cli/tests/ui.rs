//! `weft ui`: the JSON API through a real HTTP client against the real binary (and what it
//! returns against what `weft runs` prints), and the page in a real headless browser (Debian's
//! Chromium) when one is installed.

mod cdp;
mod common;
mod ui_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use weft_track::{NewRun, RunWriter, Status, WriterOptions};

use common::{temp_dir, weft_bin};
use ui_support::*;

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
    assert!(body["error"].as_str().unwrap().contains("from 0 to 100000"), "{body}");
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
