//! Scaling workers through the binary: with 2 workers two requests run at once (the version's
//! `weft_workers_busy_peak` reaches 2), scaling 2 -> 1 under constant load fails no request and
//! leaves at most one running, and a bad count is a 400 naming the limit.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use reqwest::Method;
use serde_json::json;
use weft_core::Tensor;

use crate::common::{path_set, temp_dir, wait_for, weft_command, weft_ok};
use crate::support::{assert_output, reference_logits, Server};

/// Trains a wide mlp (2 -> 256 -> 256 -> 3) for 2 steps into `store/wide`: a forward of a few
/// hundred rows takes far longer than reading its request, so requests sent together overlap
/// on the workers.
fn train_wide_mlp(store: &Path) -> PathBuf {
    let cfg = crate::common::write_tiny_mlp(store, "steps = 2\n");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("hidden = [8]", "hidden = [256, 256]");
    std::fs::write(&cfg, text).unwrap();
    let ckpt = store.join("wide");
    let set = path_set("train.checkpoint_dir", &ckpt);
    weft_ok(&["train", "--config", cfg.to_str().unwrap(), "--quiet", "--set", &set]);
    ckpt
}

/// `rows` rows of 2 features, and the v2 infer body holding them.
fn rows(rows: usize) -> (Vec<f32>, String) {
    let x: Vec<f32> = (0..rows * 2).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
    let body = json!({"inputs": [{"name": "input", "shape": [rows, 2], "datatype": "FP32", "data": x}]});
    (x, body.to_string())
}

const V1: &str = "model=\"wide\",version=\"1\"";

fn gauge(s: &Server, name: &str) -> f64 {
    s.scrape()[&format!("{name}{{{V1}}}")]
}

/// Sends the same infer request from `clients` threads until `stop` is set; each answer must
/// be a 200 equal to `want`; `sent` counts them as they come.
fn load(s: &Server, clients: usize, body: &str, want: &(Vec<usize>, Vec<f32>), stop: &AtomicBool, sent: &AtomicUsize) {
    std::thread::scope(|scope| {
        for _ in 0..clients {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let (status, answer) = s.post("/v2/models/wide/infer", body.to_string());
                    assert_eq!(status, 200, "{answer}");
                    assert_output(&answer["outputs"][0], want);
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
}

#[test]
fn workers_run_requests_at_once_and_scale_down_without_failing_any() {
    let store = temp_dir("serve-workers");
    let ckpt = train_wide_mlp(&store);
    let s = Server::start(&store, &["--model", "wide=wide", "--workers", "2"]);
    let (status, described) = s.manage(Method::GET, "/models/wide", "");
    assert_eq!((status, &described[0]["workers"]), (200, &json!(2)), "{described}");
    assert_eq!(gauge(&s, "weft_workers"), 2.0);

    let (x, body) = rows(400);
    let want = reference_logits(&ckpt, &Tensor::from_vec(x, &[400, 2]).unwrap());
    // two clients at once until two forwards have run together (each forward is long next to
    // reading its request, so this takes a request or two, not a timing guess)
    let (stop, sent) = (AtomicBool::new(false), AtomicUsize::new(0));
    std::thread::scope(|scope| {
        scope.spawn(|| load(&s, 2, &body, &want, &stop, &sent));
        let overlapped = wait_for(120, || {
            gauge(&s, "weft_workers_busy_peak") >= 2.0 || sent.load(Ordering::Relaxed) > 400
        });
        stop.store(true, Ordering::Relaxed);
        assert!(overlapped);
    });
    assert_eq!(
        gauge(&s, "weft_workers_busy_peak"),
        2.0,
        "two requests never ran at once"
    );
    let first_round = sent.load(Ordering::Relaxed);

    // 2 -> 1 under constant load from 4 clients: no request fails, and afterwards at most one
    // runs at a time
    let (stop, sent) = (AtomicBool::new(false), AtomicUsize::new(0));
    std::thread::scope(|scope| {
        scope.spawn(|| load(&s, 4, &body, &want, &stop, &sent));
        assert!(wait_for(120, || sent.load(Ordering::Relaxed) >= 8));
        let (status, answer) = s.manage(Method::PUT, "/models/wide?workers=1", "");
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["workers"], 1);
        // the call answered once the stopped worker's request was done
        assert!(gauge(&s, "weft_workers_busy") <= 1.0);
        let after = sent.load(Ordering::Relaxed);
        assert!(wait_for(120, || sent.load(Ordering::Relaxed) >= after + 12));
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(
        gauge(&s, "weft_workers_busy_peak"),
        1.0,
        "two ran at once after scaling to 1"
    );
    assert_eq!(gauge(&s, "weft_workers"), 1.0);
    // every request sent in both rounds was answered 200, none otherwise
    let m = s.scrape();
    let total = first_round + sent.load(Ordering::Relaxed);
    let ok = format!("weft_requests_total{{{V1},endpoint=\"infer\",code=\"200\"}}");
    assert_eq!(m.get(&ok), Some(&(total as f64)));
    let failed: Vec<&String> = m
        .keys()
        .filter(|k| k.starts_with("weft_requests_total") && k.contains("\"wide\"") && **k != ok)
        .collect();
    assert!(failed.is_empty(), "{failed:?}");

    // back up, by version, and through registering
    assert_eq!(s.manage(Method::PUT, "/models/wide/1?workers=3", "").0, 200);
    assert_eq!(s.manage(Method::GET, "/models/wide/1", "").1[0]["workers"], 3);
    let (status, answer) = s.manage(Method::POST, "/models?url=wide&model_name=wide&version=2&workers=4", "");
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["status"].as_str().unwrap().contains("4 initial workers"),
        "{answer}"
    );
    assert_eq!(s.manage(Method::GET, "/models/wide/2", "").1[0]["workers"], 4);

    // a bad count is a 400 naming the limit; unknown models and versions are 404
    for bad in ["0", "65", "x", "-1", "", "2.5"] {
        for path in [
            format!("/models/wide?workers={bad}"),
            format!("/models/wide/1?workers={bad}"),
        ] {
            let (status, answer) = s.manage(Method::PUT, &path, "");
            assert_eq!(status, 400, "{path}: {answer}");
            let e = answer["error"].as_str().unwrap();
            assert!(e.contains("workers") && e.contains("1 to 64"), "{path}: {e}");
        }
    }
    let (status, answer) = s.manage(
        Method::POST,
        "/models?url=wide&model_name=wide&version=3&workers=65",
        "",
    );
    assert_eq!(status, 400, "{answer}");
    assert_eq!(s.manage(Method::PUT, "/models/wide/9?workers=2", "").0, 404);
    assert_eq!(s.manage(Method::PUT, "/models/nope?workers=2", "").0, 404);
    s.alive();
    drop(s);

    for bad in ["0", "65"] {
        let st = store.to_str().unwrap();
        let out = weft_command(&["serve", "--model-store", st, "--model", "wide=wide", "--workers", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("--workers") && err.contains("1 to 64"),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&store);
}
