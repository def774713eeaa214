//! `deploy/k8s-serve.yaml` against the real server: its container args start `weft serve`
//! (the host swapped to loopback, the store and token file to this test's), its readiness and
//! liveness probes' paths answer 200 on the port the args listen on, and the token it requires
//! guards inference. Read as text, line by line, in the layout the manifest keeps (its header
//! says so): a change to the args or the probes that the server does not take fails here.

use serde_json::json;

use crate::common::repo;
use crate::support::{body_json, train_mlp, Server};

/// The lines after the first line equal to `key` (trimmed) that are indented deeper than it.
fn block<'a>(lines: &[&'a str], key: &str) -> Vec<&'a str> {
    let at = lines
        .iter()
        .position(|l| l.trim() == key)
        .unwrap_or_else(|| panic!("no {key:?} in the manifest"));
    let indent = |l: &str| l.len() - l.trim_start().len();
    let depth = indent(lines[at]);
    lines[at + 1..]
        .iter()
        .take_while(|l| l.trim().is_empty() || indent(l) > depth)
        .copied()
        .collect()
}

/// The value of `key: value` in `lines` (quotes removed).
fn value(lines: &[&str], key: &str) -> String {
    let line = lines
        .iter()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in {lines:?}"));
    line.trim().trim_matches('"').to_string()
}

/// `--flag`'s value in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    let i = args
        .iter()
        .position(|a| a == name)
        .unwrap_or_else(|| panic!("no {name} in {args:?}"));
    &args[i + 1]
}

#[test]
fn the_kubernetes_manifest_starts_a_server_whose_probes_answer() {
    let text = std::fs::read_to_string(repo().join("deploy/k8s-serve.yaml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let args: Vec<String> = block(&lines, "args:")
        .iter()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|a| a.trim().trim_matches('"').to_string())
        .collect();
    assert_eq!(args[0], "serve", "{args:?}");
    assert_eq!(value(&lines, "command"), "[\"weft\"]");
    // inside the pod: every interface, the token on inference
    assert_eq!(flag(&args, "--host"), "0.0.0.0");
    assert!(args.iter().any(|a| a == "--inference-token"), "{args:?}");
    let port = flag(&args, "--port").to_string();
    assert_eq!(value(&block(&lines, "ports:"), "containerPort"), port);
    // the metrics on the pod's address, on the port its annotations and containerPort name
    assert_eq!(flag(&args, "--metrics-host"), "0.0.0.0");
    let metrics_port = flag(&args, "--metrics-port").to_string();
    assert_eq!(value(&block(&lines, "- name: metrics"), "containerPort"), metrics_port);
    let annotations = block(&lines, "annotations:");
    assert_eq!(value(&annotations, "prometheus.io/port"), metrics_port);
    assert_eq!(value(&annotations, "prometheus.io/path"), "/metrics");
    let mut probes = Vec::new();
    for probe in ["readinessProbe:", "livenessProbe:", "startupProbe:"] {
        let get = block(&block(&lines, probe), "httpGet:");
        assert_eq!(value(&get, "port"), port, "{probe} port");
        probes.push(value(&get, "path"));
    }
    assert_eq!(probes[..2], ["/v2/health/ready", "/v2/health/live"]);
    // the grace period covers the preStop pause
    let grace: u64 = value(&lines, "terminationGracePeriodSeconds").parse().unwrap();
    let pause: u64 = value(&block(&lines, "preStop:"), "seconds").parse().unwrap();
    assert!(grace > pause + 30, "grace {grace} s, preStop {pause} s");

    // the args, with this test's store, token file and port, on loopback
    let store = crate::common::temp_dir("serve-k8s");
    let spec = flag(&args, "--model").to_string();
    let (name, path) = spec.split_once('=').unwrap();
    std::fs::rename(train_mlp(&store), store.join(path)).unwrap();
    let token_file = store.join("management.token");
    let mut local: Vec<String> = Vec::new();
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            // Server::start gives the store and the ports
            "--model-store" | "--port" | "--metrics-port" | "--management-port" => {
                it.next();
            }
            "--host" | "--metrics-host" | "--management-host" => {
                it.next();
                local.extend([a.clone(), "127.0.0.1".into()]);
            }
            "--token-file" => {
                it.next();
                local.extend(["--token-file".into(), token_file.to_str().unwrap().into()]);
            }
            _ => local.push(a.clone()),
        }
    }
    let local: Vec<&str> = local.iter().map(String::as_str).collect();
    let s = Server::start(&store, &local);
    for path in &probes {
        let (status, answer) = s.get(path);
        assert_eq!(status, 200, "{path}: {answer}");
    }
    assert_eq!(s.get("/v2/health/ready").1["models"], 1);
    let metrics = s.client.get(format!("{}/metrics", s.metrics)).send().unwrap();
    assert_eq!(metrics.status(), 200);
    assert!(metrics.text().unwrap().contains("weft_"), "the metrics page");
    // inference needs the token
    let body = json!({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 0.5]}]});
    let url = format!("{}/v2/models/{name}/infer", s.base);
    let r = s.client.post(&url).body(body.to_string()).send().unwrap();
    assert_eq!(r.status(), 401);
    let r = s
        .client
        .post(&url)
        .bearer_auth(&s.token)
        .body(body.to_string())
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(body_json(r)["model_name"], name);
    drop(s);
    let _ = std::fs::remove_dir_all(&store);
}
