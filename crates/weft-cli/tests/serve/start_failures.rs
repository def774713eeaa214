//! A model asked for at start that fails to load: the server starts and serves the others, says
//! why on stderr, and answers readiness with 503 naming the model (not the cause: the health
//! checks need no token) until that name and version is served, registered through the
//! management API or loaded by the server's own retries once its folder holds a checkpoint.

use reqwest::Method;
use serde_json::json;

use crate::common::{temp_dir, wait_for, weft_command};
use crate::support::{train_mlp, Server};

#[test]
fn a_model_that_fails_at_start_leaves_the_others_serving() {
    let store = temp_dir("serve-start-failure");
    train_mlp(&store);
    // folders that hold no checkpoint (yet)
    std::fs::create_dir_all(store.join("broken")).unwrap();
    std::fs::create_dir_all(store.join("late")).unwrap();
    let s = Server::start(
        &store,
        &["--model", "good=mlp", "--model", "bad=broken", "--model", "late=late"],
    );

    let (status, ready) = s.get("/v2/health/ready");
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["ready"], false);
    assert_eq!(ready["models"], 1);
    let failed: Vec<(String, String)> = ready["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["model"].as_str().unwrap().into(),
                f["version"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        failed,
        [("bad".into(), "1".into()), ("late".into(), "1".into())],
        "{ready}"
    );
    // no path of the store in an answer anyone may read
    assert!(!ready.to_string().contains(store.to_str().unwrap()), "{ready}");
    assert_eq!(s.get("/v2/health/live").0, 200);

    // the model that loaded answers; the ones that failed are unknown
    let body = json!({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 0.5]}]});
    let (status, answer) = s.post("/v2/models/good/infer", body.to_string());
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = s.post("/v2/models/bad/infer", body.to_string());
    assert_eq!(status, 404, "{answer}");

    // registered from a good checkpoint, `bad` is served; `late` still keeps the server unready
    let (status, answer) = s.manage(Method::POST, "/models?url=mlp&model_name=bad&version=1", "");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(s.post("/v2/models/bad/infer", body.to_string()).0, 200);
    let (status, ready) = s.get("/v2/health/ready");
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["failed"].as_array().unwrap().len(), 1, "{ready}");

    // once its folder holds a checkpoint, the server's retries load `late` and it is ready
    std::fs::remove_dir(store.join("late")).unwrap();
    std::fs::rename(store.join("mlp"), store.join("late")).unwrap();
    let ready_now = wait_for(60, || s.get("/v2/health/ready").0 == 200);
    assert!(ready_now, "{}", s.get("/v2/health/ready").1);
    assert_eq!(s.get("/v2/health/ready").1["models"], 3);
    assert_eq!(s.post("/v2/models/late/infer", body.to_string()).0, 200);
    drop(s);
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn a_model_given_twice_stops_the_start() {
    let store = temp_dir("serve-start-twice");
    train_mlp(&store);
    let s = store.to_str().unwrap();
    let out = weft_command(&["serve", "--model-store", s, "--model", "m=mlp", "--model", "m=mlp:1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("model m version 1 is given twice"), "{err}");
    let _ = std::fs::remove_dir_all(&store);
}
