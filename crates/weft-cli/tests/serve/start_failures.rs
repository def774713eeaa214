//! A model asked for at start that fails to load: the server starts and serves the others, says
//! why on stderr, and answers readiness with 503 naming the model and the cause until that name
//! and version is registered through the management API.

use reqwest::Method;
use serde_json::json;

use crate::common::temp_dir;
use crate::support::{train_mlp, Server};

#[test]
fn a_model_that_fails_at_start_leaves_the_others_serving() {
    let store = temp_dir("serve-start-failure");
    train_mlp(&store);
    // a folder that holds no checkpoint
    std::fs::create_dir_all(store.join("broken")).unwrap();
    let s = Server::start(&store, &["--model", "good=mlp", "--model", "bad=broken"]);

    let (status, ready) = s.get("/v2/health/ready");
    assert_eq!(status, 503, "{ready}");
    assert_eq!(ready["ready"], false);
    assert_eq!(ready["models"], 1);
    let failed = ready["failed"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{ready}");
    assert_eq!(
        (failed[0]["model"].as_str(), failed[0]["version"].as_str()),
        (Some("bad"), Some("1"))
    );
    assert!(
        failed[0]["error"].as_str().unwrap().contains("model bad version 1"),
        "{ready}"
    );
    assert_eq!(s.get("/v2/health/live").0, 200);

    // the model that loaded answers; the one that failed is unknown
    let body = json!({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 0.5]}]});
    let (status, answer) = s.post("/v2/models/good/infer", body.to_string());
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = s.post("/v2/models/bad/infer", body.to_string());
    assert_eq!(status, 404, "{answer}");

    // registered from a good checkpoint, the name and version are served and the server is ready
    let (status, answer) = s.manage(Method::POST, "/models?url=mlp&model_name=bad&version=1", "");
    assert_eq!(status, 200, "{answer}");
    let (status, ready) = s.get("/v2/health/ready");
    assert_eq!(status, 200, "{ready}");
    assert_eq!(
        (ready["ready"].as_bool(), ready["models"].as_u64()),
        (Some(true), Some(2))
    );
    assert_eq!(s.post("/v2/models/bad/infer", body.to_string()).0, 200);
    drop(s);
    let _ = std::fs::remove_dir_all(&store);
}
