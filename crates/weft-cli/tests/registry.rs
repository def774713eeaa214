//! `weft models` and `weft serve --registry`: versions registered from tiny mlp runs (by run
//! name and by checkpoint path), promoted, listed and shown as JSON; bad input refused in one
//! line; a server on the registry answering with the production version and following a
//! promotion made while a client sends requests non-stop, with no request failing; a promoted
//! version that does not load leaves the previous one serving; a version's lineage (its run,
//! that run's data and initial weights, the run those came from).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::{free_port, path_set, sha256_of, temp_dir, wait_for, weft_command};
use serde_json::{json, Value};

/// `weft ARGS` with the run store in `runs`.
fn weft_with(runs: &Path, args: &[&str]) -> Output {
    common::weft_with_store(runs, args)
}

fn ok(runs: &Path, args: &[&str]) -> String {
    common::weft_ok_with_store(runs, args)
}

/// Exit 1 with one line on stderr.
fn refused(runs: &Path, args: &[&str]) -> String {
    let out = weft_with(runs, args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "weft {args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "weft {args:?}: {err}");
    err
}

/// Trains an mlp (2 features, 8 hidden, 3 classes) for `steps` steps into `dir/NAME`, recorded
/// as run `NAME` in `runs`.
fn train_mlp(dir: &Path, runs: &Path, name: &str, steps: usize) -> PathBuf {
    let cfg = common::write_tiny_mlp(dir, "steps = 6\n");
    let ckpt = dir.join(name);
    let (set, steps, track) = (
        path_set("train.checkpoint_dir", &ckpt),
        format!("train.steps={steps}"),
        format!("track.name={name:?}"),
    );
    #[rustfmt::skip]
    ok(runs, &["train", "--config", cfg.to_str().unwrap(), "--quiet", "--set", &set, "--set", &steps,
        "--set", &track]);
    ckpt
}

/// `weft serve --registry runs` on free ports, reading the registry every `poll_ms`, its
/// stderr to `stderr`; the child and its inference port.
fn serve_registry(dir: &Path, runs: &Path, poll_ms: &str, stderr: Stdio) -> (std::process::Child, String) {
    let (port, mport, xport) = (
        free_port().to_string(),
        free_port().to_string(),
        free_port().to_string(),
    );
    let token = dir.join("token");
    std::fs::write(&token, "management-token-0123456789").unwrap();
    #[rustfmt::skip]
    let child = weft_command(&["serve", "--registry", runs.to_str().unwrap(), "--registry-poll-ms", poll_ms,
        "--port", &port, "--management-port", &mport, "--metrics-port", &xport,
        "--token-file", token.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    (child, port)
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
fn a_versions_lineage_names_its_run_the_data_it_read_and_the_run_its_weights_came_from() {
    let dir = temp_dir("lineage");
    let runs = dir.join("runs");
    let a = train_mlp(&dir, &runs, "mlp-a", 4);
    // run b starts from a's weights: a file inside a's checkpoint folder, named through a link
    let a_weights = a.join("step-00000004").join("model-rank-00000.safetensors");
    assert!(a_weights.is_file(), "{}", a_weights.display());
    std::os::unix::fs::symlink(&a, dir.join("link-to-a")).unwrap();
    let linked = dir
        .join("link-to-a")
        .join("step-00000004")
        .join("model-rank-00000.safetensors");
    let a_weights = a_weights.canonicalize().unwrap();
    let cfg = dir.join("mlp.toml");
    let (init, ckpt) = (
        path_set("init.from", &linked),
        path_set("train.checkpoint_dir", &dir.join("mlp-b")),
    );
    #[rustfmt::skip]
    ok(&runs, &["train", "--config", cfg.to_str().unwrap(), "--quiet", "--set", &init, "--set", &ckpt,
        "--set", "train.steps=2", "--set", "track.name=\"mlp-b\""]);
    ok(&runs, &["models", "register", "mlp-b", "--name", "m"]);
    // a version registered by folder: the run that recorded the folder
    ok(&runs, &["models", "register", a.to_str().unwrap(), "--name", "m"]);
    let id_of = |name: &str| -> i64 {
        let all = json_of(&ok(&runs, &["runs", "list", "--json"]));
        let run = all
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap()
            .clone();
        run["id"].as_i64().unwrap()
    };
    let (a_id, b_id) = (id_of("mlp-a"), id_of("mlp-b"));
    let data_uri = dir.join("d.csv").canonicalize().unwrap().display().to_string();
    let data_digest = sha256_of(&dir.join("d.csv"));

    let l = json_of(&ok(&runs, &["models", "lineage", "m", "1", "--json"]));
    assert_eq!(l["model"]["version"], 1, "{l}");
    let chain: Vec<i64> = l["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(chain, [b_id, a_id], "{l}");
    let inputs = &l["runs"][0]["inputs"];
    assert_eq!(
        inputs[0],
        json!({"kind": "data", "uri": data_uri, "digest": data_digest, "source_run": null, "made_by": []}),
        "{l}"
    );
    assert_eq!(inputs[1]["kind"], "init", "{l}");
    assert_eq!(inputs[1]["uri"], a_weights.display().to_string(), "{l}");
    assert_eq!(inputs[1]["digest"], sha256_of(&a_weights), "{l}");
    assert_eq!(inputs[1]["source_run"], a_id, "{l}");
    // a's own inputs: the same data, no initial weights
    assert_eq!(l["runs"][1]["inputs"].as_array().unwrap().len(), 1, "{l}");
    assert_eq!(l["runs"][1]["inputs"][0]["digest"], data_digest, "{l}");
    assert_eq!(l["runs"][1]["params"]["optim.lr"], "0.01", "{l}");

    let by_folder = json_of(&ok(&runs, &["models", "lineage", "m", "2", "--json"]));
    assert_eq!(by_folder["model"]["source_run"], Value::Null, "{by_folder}");
    assert_eq!(by_folder["runs"][0]["id"], a_id, "{by_folder}");

    let text = ok(&runs, &["models", "lineage", "m", "1"]);
    assert!(text.contains(&format!("(from run {a_id})")), "{text}");
    assert!(text.contains(&format!("data: {data_uri} {data_digest}")), "{text}");
    let shown = ok(&runs, &["runs", "show", "mlp-b"]);
    assert!(
        shown.contains(&format!("input data: {data_uri} {data_digest}")),
        "{shown}"
    );

    // changed data: the next run's digest says so
    let mut csv = std::fs::read_to_string(dir.join("d.csv")).unwrap();
    csv.push_str("0.5,0.5,1\n");
    std::fs::write(dir.join("d.csv"), csv).unwrap();
    // (train_mlp would write the data again)
    #[rustfmt::skip]
    ok(&runs, &["train", "--config", cfg.to_str().unwrap(), "--quiet", "--set", "train.steps=2",
        "--set", "track.name=\"mlp-c\""]);
    let c = json_of(&ok(&runs, &["runs", "show", "mlp-c", "--json"]));
    assert_eq!(c["inputs"][0]["uri"], data_uri, "{c}");
    assert_ne!(c["inputs"][0]["digest"], data_digest, "{c}");
    assert_eq!(c["inputs"][0]["digest"], sha256_of(&dir.join("d.csv")), "{c}");

    // run d resumed from a's checkpoint directory (--resume-from): the folder it loaded, from a
    let (resume, ckpt) = (
        format!("--resume-from={}", a.display()),
        path_set("train.checkpoint_dir", &dir.join("mlp-d")),
    );
    #[rustfmt::skip]
    ok(&runs, &["train", "--config", cfg.to_str().unwrap(), "--quiet", &resume, "--set", &ckpt,
        "--set", "train.steps=6", "--set", "track.name=\"mlp-d\""]);
    ok(&runs, &["models", "register", "mlp-d", "--name", "m"]);
    let d = json_of(&ok(&runs, &["models", "lineage", "m", "3", "--json"]));
    let chain: Vec<i64> = d["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(chain, [id_of("mlp-d"), a_id], "{d}");
    let from = &d["runs"][0]["inputs"][1];
    assert_eq!(from["kind"], "resume_from", "{d}");
    let a_step = a.join("step-00000004").canonicalize().unwrap();
    assert_eq!(from["uri"], a_step.display().to_string(), "{d}");
    assert_eq!(
        (&from["digest"], &from["source_run"]),
        (&Value::Null, &json!(a_id)),
        "{d}"
    );

    let err = refused(&runs, &["models", "lineage", "m", "7"]);
    assert!(err.contains("no version 7"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_row_that_is_no_version_is_left_out_with_a_warning_and_the_rest_listed_and_served() {
    let dir = temp_dir("registry-bad-row");
    let runs = dir.join("runs");
    train_mlp(&dir, &runs, "mlp-a", 4);
    ok(&runs, &["models", "register", "mlp-a", "--name", "cls"]);
    ok(&runs, &["models", "promote", "cls", "1", "--stage", "production"]);
    // another program wrote a path as a blob; before, every read of the registry failed on it
    let db = rusqlite::Connection::open(runs.join("runs.db")).unwrap();
    db.execute(
        "INSERT INTO model_versions VALUES ('blobby', 1, 'production', NULL, NULL, x'2f', 0, 0)",
        [],
    )
    .unwrap();
    drop(db);
    let warning = "warning: the registry's row for model \"blobby\" version 1 cannot be read (column path holds a blob); it is left out";
    let out = weft_with(&runs, &["models", "list", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(warning), "{err}");
    let listed = json_of(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["name"], "cls");

    let (mut child, port) = serve_registry(&dir, &runs, "100", Stdio::piped());
    let client = reqwest::blocking::Client::new();
    let body =
        json!({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [0.3, 0.6]}]}).to_string();
    let answered = wait_for(60, || {
        client
            .post(format!("http://127.0.0.1:{port}/v2/models/cls/infer"))
            .body(body.clone())
            .send()
            .is_ok_and(|r| r.status() == 200)
    });
    // the served model's own row turns unreadable: it is not taken for a model without a
    // production version, and goes on answering
    let db = rusqlite::Connection::open(runs.join("runs.db")).unwrap();
    db.execute("UPDATE model_versions SET path = x'2f' WHERE name = 'cls'", [])
        .unwrap();
    drop(db);
    std::thread::sleep(std::time::Duration::from_millis(500)); // a few more reads of the registry
    let still = client
        .post(format!("http://127.0.0.1:{port}/v2/models/cls/infer"))
        .body(body.clone())
        .send()
        .map(|r| r.status().as_u16());
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(answered, "the registry's good version was not served: {err}");
    assert_eq!(still.ok(), Some(200), "{err}");
    // said once, not at every read
    assert_eq!(err.matches(warning).count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn models_register_promote_list_show_and_serve_follows_promotions() {
    let dir = temp_dir("registry");
    let runs = dir.join("runs");
    let a = train_mlp(&dir, &runs, "mlp-a", 4);
    let b = train_mlp(&dir, &runs, "mlp-b", 12);
    let r = |args: &[&str]| ok(&runs, args);

    // by run name, then by checkpoint directory: versions 1, 2
    assert!(r(&["models", "register", "mlp-a", "--name", "cls"]).contains("version 1"));
    assert!(r(&["models", "register", b.to_str().unwrap(), "--name", "cls"]).contains("version 2"));
    assert!(r(&["models", "register", "default/mlp-b", "--name", "other"]).contains("version 1"));

    // bad input: one line, exit 1
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let err = refused(&runs, &["models", "register", "no-such-run", "--name", "cls"]);
    assert!(err.contains("no-such-run"), "{err}");
    let err = refused(&runs, &["models", "register", empty.to_str().unwrap(), "--name", "cls"]);
    assert!(err.contains("no complete checkpoint"), "{err}");
    refused(&runs, &["models", "register", "mlp-a", "--name", "bad/name"]);
    let err = refused(&runs, &["models", "promote", "cls", "9", "--stage", "production"]);
    assert!(err.contains("no version 9"), "{err}");
    let err = refused(&runs, &["models", "promote", "cls", "1", "--stage", "live"]);
    assert!(err.contains("unknown stage"), "{err}");
    let err = refused(&runs, &["models", "show", "nope"]);
    assert!(err.contains("nope"), "{err}");
    let err = refused(&dir.join("no-store"), &["models", "list"]);
    assert!(err.contains("no run store"), "{err}");

    r(&["models", "promote", "cls", "1", "--stage", "production"]);
    r(&["models", "promote", "other", "1", "--stage", "staging"]);
    let list = json_of(&r(&["models", "list", "--json"]));
    let rows: Vec<(String, i64, String)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_string(),
                v["version"].as_i64().unwrap(),
                v["stage"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want = |n: &str, v: i64, s: &str| (n.to_string(), v, s.to_string());
    assert_eq!(
        rows,
        [
            want("cls", 1, "production"),
            want("cls", 2, "none"),
            want("other", 1, "staging")
        ]
    );
    assert_eq!(list[0]["run_name"], "default/mlp-a");
    assert!(list[0]["source_run"].as_i64().is_some());
    assert!(list[1]["source_run"].is_null());
    let a_ckpt = Path::new(list[0]["path"].as_str().unwrap());
    assert!(a_ckpt.starts_with(a.canonicalize().unwrap()), "{a_ckpt:?}");
    let show = json_of(&r(&["models", "show", "cls", "--json"]));
    assert_eq!(show["production"], 1);
    assert_eq!(show["versions"].as_array().unwrap().len(), 2);

    // the server answers with version 1, then follows the promotion of version 2
    let (mut child, port) = serve_registry(&dir, &runs, "200", Stdio::inherit());
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking::Client::builder()
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .unwrap();
    let infer_url = format!("{base}/v2/models/cls/infer");
    let body =
        json!({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [0.3, 0.6]}]}).to_string();
    let up = wait_for(60, || {
        client
            .get(format!("{base}/v2/health/live"))
            .send()
            .is_ok_and(|r| r.status() == 200)
    });
    assert!(up, "weft serve answered no health check: {:?}", child.try_wait());
    let (url, payload) = (infer_url.clone(), body.clone());
    let ask = move |client: &reqwest::blocking::Client| -> (u16, String) {
        match client.post(&url).body(payload.clone()).send() {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let v: Value = serde_json::from_str(&resp.text().unwrap_or_default()).unwrap_or(Value::Null);
                (status, v["model_version"].as_str().unwrap_or("").to_string())
            }
            Err(e) => (0, e.to_string()),
        }
    };
    assert_eq!(ask(&client), (200, "1".to_string()));
    // `other` has no production version: not served
    let other = client
        .post(format!("{base}/v2/models/other/infer"))
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(other.status(), 404);

    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let sender = {
        let (stop, answers, client, ask) = (stop.clone(), answers.clone(), client.clone(), ask.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let got = ask(&client);
                answers.lock().unwrap().push(got);
            }
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    r(&["models", "promote", "cls", "2", "--stage", "production"]);
    let moved = wait_for(30, || {
        let a = answers.lock().unwrap();
        a.len() > 20 && a[a.len() - 20..].iter().all(|(_, v)| v == "2")
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    sender.join().unwrap();
    let answers = answers.lock().unwrap().clone();
    assert!(
        moved,
        "the answers never moved to version 2: {:?}",
        &answers[answers.len().saturating_sub(5)..]
    );
    let failed: Vec<&(u16, String)> = answers.iter().filter(|(s, _)| *s != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        answers.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(
        answers.iter().any(|(_, v)| v == "1"),
        "no answer came from version 1 before the promotion"
    );
    assert_eq!(answers.last().unwrap().1, "2");
    // version 1 is archived and no longer served
    let v1 = client
        .post(format!("{base}/v2/models/cls/versions/1/infer"))
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(v1.status(), 404);
    let show = json_of(&r(&["models", "show", "cls", "--json"]));
    assert_eq!(show["production"], 2);
    assert_eq!(show["versions"][0]["stage"], "archived");

    // a promoted version that does not load leaves the previous one serving (registering
    // checks that it loads: it breaks after)
    let broken = dir.join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    let good = a.join("step-00000004");
    for f in std::fs::read_dir(&good).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, broken.join(f.file_name().unwrap())).unwrap();
    }
    assert!(r(&["models", "register", broken.to_str().unwrap(), "--name", "cls"]).contains("version 3"));
    std::fs::write(broken.join("index.json"), "{}").unwrap();
    r(&["models", "promote", "cls", "3", "--stage", "production"]);
    std::thread::sleep(std::time::Duration::from_millis(1000));
    assert_eq!(ask(&client), (200, "2".to_string()));
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
