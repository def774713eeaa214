//! The metrics, the management API and dynamic batching through the binary: the metrics count
//! the requests made, the management API registers, splits traffic and unregisters with
//! draining, and batched requests give the unbatched logits.

use serde_json::json;
use weft_core::Tensor;

use crate::common::{temp_dir, wait_for, weft_command};
use crate::support::{assert_output, body_json, infer_body, reference_logits, train_mlp, Server};

#[test]
fn metrics_count_the_requests_made() {
    let store = temp_dir("serve-metrics");
    train_mlp(&store);
    let s = Server::start(&store, &["--model", "cls=mlp", "--model", "cls=mlp:2"]);
    for i in 0..7 {
        let (status, _) = s.post("/v2/models/cls/infer", infer_body(&[[i as f32, 0.5]]));
        assert_eq!(status, 200);
    }
    for _ in 0..3 {
        assert_eq!(s.post("/v2/models/cls/versions/2/infer", "{}").0, 400);
    }
    for _ in 0..2 {
        assert_eq!(s.post("/predictions/cls/2", "[[1.0, 2.0]]").0, 200);
    }
    assert_eq!(s.post("/v2/models/nope/infer", "{}").0, 404);
    let m = s.scrape();
    let v1 = "model=\"cls\",version=\"1\"";
    let v2 = "model=\"cls\",version=\"2\"";
    #[rustfmt::skip]
    let counts = [
        (format!("weft_requests_total{{{v1},endpoint=\"infer\",code=\"200\"}}"), 7.0),
        (format!("weft_requests_total{{{v2},endpoint=\"infer\",code=\"400\"}}"), 3.0),
        (format!("weft_requests_total{{{v2},endpoint=\"predictions\",code=\"200\"}}"), 2.0),
        // an unknown model's name is no label value
        ("weft_requests_total{model=\"\",version=\"\",endpoint=\"infer\",code=\"404\"}".to_string(), 1.0),
        (format!("weft_request_duration_seconds_count{{{v1},endpoint=\"infer\"}}"), 7.0),
        (format!("weft_request_duration_seconds_bucket{{{v1},endpoint=\"infer\",le=\"+Inf\"}}"), 7.0),
        (format!("weft_batch_size_count{{{v1}}}"), 7.0),
        (format!("weft_batch_size_sum{{{v1}}}"), 7.0),
        (format!("weft_inference_duration_seconds_count{{{v2}}}"), 2.0),
        (format!("weft_queue_duration_seconds_count{{{v1}}}"), 7.0),
        (format!("weft_queue_depth{{{v1}}}"), 0.0),
        (format!("weft_queue_capacity{{{v1}}}"), 64.0),
        (format!("weft_generated_tokens_total{{{v1}}}"), 0.0),
    ];
    for (key, want) in counts {
        assert_eq!(m.get(&key), Some(&want), "{key} in {m:#?}");
    }
    // the buckets are cumulative and end with the count
    let buckets: Vec<f64> = m
        .iter()
        .filter(|(k, _)| {
            k.starts_with(&format!(
                "weft_request_duration_seconds_bucket{{{v1},endpoint=\"infer\""
            ))
        })
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(buckets.len(), 17);
    assert!(buckets.iter().all(|&b| b <= 7.0));
    assert!(m.contains_key(&format!("weft_model_load_seconds{{{v2}}}")));
    drop(s);
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn management_registers_splits_traffic_and_drains() {
    use reqwest::Method;
    let store = temp_dir("serve-manage");
    let mlp = train_mlp(&store);
    std::fs::create_dir_all(store.join("../serve-manage-outside")).unwrap();
    std::os::unix::fs::symlink(store.join("../serve-manage-outside"), store.join("link")).unwrap();
    // a folder inside the store that holds no checkpoint: its load fails, the others serve on
    std::fs::create_dir_all(store.join("empty")).unwrap();
    let s = Server::start(
        &store,
        &[
            "--model",
            "cls=mlp",
            "--max-batch-size",
            "4",
            "--max-batch-delay-ms",
            "2",
        ],
    );
    // the token is always needed
    let r = s.client.get(format!("{}/models", s.management)).send().unwrap();
    assert_eq!(r.status(), 401);
    let (status, list) = s.manage(Method::GET, "/models", "");
    assert_eq!(status, 200);
    assert_eq!(list["models"], json!([{"modelName": "cls", "modelUrl": "mlp"}]));
    // only folders inside the store
    #[rustfmt::skip]
    let refused = [
        ("url=http://example.com/m.mar&model_name=x", 400), ("url=file:///etc&model_name=x", 400),
        ("url=../serve-manage-outside&model_name=x", 403), ("url=/etc&model_name=x", 403),
        ("url=link&model_name=x", 403), ("url=missing&model_name=x", 404), ("url=mlp&model_name=cls", 409),
        ("url=empty&model_name=x", 400), ("url=mlp&model_name=a%20b", 400), ("url=mlp", 400),
        ("url=mlp&model_name=x&batch_size=-1", 400), ("url=mlp&model_name=x&prefill_chunk=-1", 400),
        ("url=mlp&model_name=x&prefill_chunk=many", 400),
    ];
    for (q, status) in refused {
        let (got, answer) = s.manage(Method::POST, &format!("/models?{q}"), "");
        assert_eq!(got, status, "{q}: {answer}");
        assert!(answer["error"].is_string(), "{q}: {answer}");
        if q.contains("prefill_chunk") {
            assert!(answer["error"].as_str().unwrap().contains("prefill_chunk"), "{answer}");
        }
        if q.starts_with("url=empty") {
            assert!(
                answer["error"].as_str().unwrap().contains("model x version 1"),
                "{answer}"
            );
        }
    }
    s.alive();
    let (status, answer) = s.manage(
        Method::POST,
        "/models?url=mlp&model_name=cls&version=2&prefill_chunk=32",
        "",
    );
    assert_eq!(status, 200, "{answer}");
    let (_, all) = s.manage(Method::GET, "/models/cls/all", "");
    assert_eq!(all.as_array().unwrap().len(), 2, "{all}");
    assert_eq!(
        (&all[0]["isDefault"], &all[1]["isDefault"]),
        (&json!(true), &json!(false))
    );
    assert_eq!(all[1]["batchSize"], 4);
    assert_eq!(
        (&all[0]["prefillChunk"], &all[1]["prefillChunk"]),
        (&json!(256), &json!(32))
    );
    assert_eq!(s.manage(Method::GET, "/models/cls/3", "").0, 404);

    // set-default moves unversioned requests
    let x = infer_body(&[[0.25, -0.5]]);
    let answer_version = |body: &str| {
        let r = s
            .client
            .post(format!("{}/v2/models/cls/infer", s.base))
            .body(body.to_string())
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
        let header = r.headers()["weft-model-version"].to_str().unwrap().to_string();
        let v = body_json(r)["model_version"].as_str().unwrap().to_string();
        assert_eq!(header, v);
        v
    };
    assert_eq!(answer_version(&x), "1");
    assert_eq!(s.manage(Method::PUT, "/models/cls/2/set-default", "").0, 200);
    assert_eq!(answer_version(&x), "2");
    assert_eq!(s.manage(Method::PUT, "/models/cls/1/set-default", "").0, 200);

    // a 70/30 split over 200 requests, then 50/50 set by a JSON body
    let (status, answer) = s.manage(Method::PUT, "/models/cls?split=1:0.7,2:0.3", "");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["traffic"], json!({"1": 0.7, "2": 0.3}));
    let ones = (0..200).filter(|_| answer_version(&x) == "1").count();
    assert!((130..=150).contains(&ones), "version 1 answered {ones} of 200");
    assert_eq!(s.manage(Method::PUT, "/models/cls?split=1:0.7,9:0.3", "").0, 404);
    assert_eq!(s.manage(Method::PUT, "/models/cls?split=1:-1", "").0, 400);
    let (status, answer) = s.manage(Method::PUT, "/models/cls/traffic", "{\"1\": 50, \"2\": 50}");
    assert_eq!(status, 200, "{answer}");
    let ones = (0..100).filter(|_| answer_version(&x) == "1").count();
    assert!((40..=60).contains(&ones), "version 1 answered {ones} of 100");
    // the default cannot go while another version is there
    assert_eq!(s.manage(Method::DELETE, "/models/cls/1", "").0, 409);

    // unregistering version 2 under load: every request succeeds, none reaches 2 afterwards
    let want = reference_logits(&mlp, &Tensor::from_vec(vec![0.25f32, -0.5], &[1, 2]).unwrap());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let deleted = std::sync::atomic::AtomicBool::new(false);
    let (answers, after) = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let (mut answers, mut after_delete) = (Vec::new(), Vec::new());
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let was_deleted = deleted.load(std::sync::atomic::Ordering::SeqCst);
                        let (status, answer) = s.post("/v2/models/cls/infer", x.clone());
                        assert_eq!(status, 200, "{answer}");
                        assert_output(&answer["outputs"][0], &want);
                        let v = answer["model_version"].as_str().unwrap().to_string();
                        if was_deleted {
                            after_delete.push(v.clone());
                        }
                        answers.push(v);
                    }
                    (answers, after_delete)
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(400));
        let (status, answer) = s.manage(Method::DELETE, "/models/cls/2", "");
        assert_eq!(status, 200, "{answer}");
        deleted.store(true, std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(300));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut answers = Vec::new();
        let mut after = Vec::new();
        for c in clients {
            let (a, b) = c.join().unwrap();
            answers.extend(a);
            after.extend(b);
        }
        (answers, after)
    });
    assert!(answers.iter().any(|v| v == "2"), "version 2 never answered");
    assert!(!after.is_empty() && after.iter().all(|v| v == "1"), "{after:?}");
    assert_eq!(s.get("/v2/models/cls/versions/2").0, 404);
    let (_, all) = s.manage(Method::GET, "/models/cls/all", "");
    assert_eq!(all.as_array().unwrap().len(), 1, "{all}");
    // the last version goes with its name
    assert_eq!(s.manage(Method::DELETE, "/models/cls/1", "").0, 200);
    assert_eq!(s.manage(Method::GET, "/models", "").1["models"], json!([]));
    assert_eq!(s.post("/v2/models/cls/infer", x).0, 404);
    s.alive();
    drop(s);
    let _ = std::fs::remove_dir_all(&store);
    let _ = std::fs::remove_dir_all(store.join("../serve-manage-outside"));
}

#[test]
fn batched_requests_give_the_unbatched_logits() {
    let store = temp_dir("serve-batch");
    let mlp = train_mlp(&store);
    #[rustfmt::skip]
    let s = Server::start(&store, &["--model", "cls=mlp", "--max-batch-size", "8", "--max-batch-delay-ms", "100"]);
    let inputs: Vec<Vec<[f32; 2]>> = (0..16)
        .map(|i| {
            (0..1 + i % 3)
                .map(|j| [i as f32 * 0.1 - 0.7, j as f32 * 0.3 - 0.2])
                .collect()
        })
        .collect();
    let barrier = std::sync::Barrier::new(inputs.len());
    std::thread::scope(|scope| {
        for (i, rows) in inputs.iter().enumerate() {
            let (barrier, s, mlp) = (&barrier, &s, &mlp);
            scope.spawn(move || {
                let flat: Vec<f32> = rows.iter().flatten().copied().collect();
                let want = reference_logits(mlp, &Tensor::from_vec(flat, &[rows.len(), 2]).unwrap());
                barrier.wait();
                if i % 2 == 0 {
                    let (status, answer) = s.post("/v2/models/cls/infer", infer_body(rows));
                    assert_eq!(status, 200, "{answer}");
                    assert_output(&answer["outputs"][0], &want);
                } else {
                    let (status, answer) = s.post("/predictions/cls", json!(rows).to_string());
                    assert_eq!(status, 200, "{answer}");
                    let data: Vec<f32> = answer
                        .as_array()
                        .unwrap()
                        .iter()
                        .flat_map(|r| serde_json::from_value::<Vec<f32>>(r.clone()).unwrap())
                        .collect();
                    let shape = [rows.len(), want.0[1]];
                    assert_output(
                        &json!({"name": "logits", "datatype": "FP32", "shape": shape, "data": data}),
                        &want,
                    );
                }
            });
        }
    });
    let m = s.scrape();
    let v1 = "model=\"cls\",version=\"1\"";
    let forwards = m[&format!("weft_batch_size_count{{{v1}}}")];
    assert_eq!(m[&format!("weft_batch_size_sum{{{v1}}}")], 16.0);
    assert!(forwards < 16.0, "16 requests ran as {forwards} forwards");
    assert!(m[&format!("weft_batch_size_bucket{{{v1},le=\"1\"}}")] < forwards);
    drop(s);
    let _ = std::fs::remove_dir_all(&store);
}

#[test]
fn without_a_token_file_a_private_one_is_made_and_removed() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::PermissionsExt;
    let store = temp_dir("serve-gen-token");
    train_mlp(&store);
    #[rustfmt::skip]
    let mut child = weft_command(&["serve", "--model-store", store.to_str().unwrap(), "--model", "cls=mlp",
        "--port", "0", "--management-port", "0", "--metrics-port", "0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // the token file's path, then the three addresses
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || lines.next().unwrap().unwrap();
    let first = next();
    let path = first
        .strip_prefix("weft serve: the management API's token is in ")
        .and_then(|rest| rest.strip_suffix(" (0600)"))
        .unwrap_or_else(|| panic!("{first}"))
        .to_string();
    let mut addresses = Vec::new();
    for _ in 0..3 {
        let line = next();
        addresses.push(line.rsplit_once("http://").unwrap().1.to_string());
    }
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{path}");
    let token = std::fs::read_to_string(&path).unwrap().trim().to_string();
    assert_eq!(token.len(), 64);
    let client = reqwest::blocking::Client::new();
    let models = format!("http://{}/models", addresses[1]);
    assert_eq!(client.get(&models).send().unwrap().status(), 401);
    assert_eq!(client.get(&models).bearer_auth(&token).send().unwrap().status(), 200);
    // the inference API stays open without --inference-token
    let ready = format!("http://{}/v2/models/cls/ready", addresses[0]);
    assert_eq!(client.get(&ready).send().unwrap().status(), 200);
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert!(wait_for(30, || child.try_wait().unwrap().is_some()));
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(!std::path::Path::new(&path).exists(), "{path} is still there");
    let _ = std::fs::remove_dir_all(&store);
}
