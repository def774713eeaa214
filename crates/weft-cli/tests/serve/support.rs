//! What the serving tests share: a tiny mlp trained here, a running `weft serve` on free
//! loopback ports with a client for its three ports, and the reference forward.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use reqwest::blocking::Client;
use serde_json::{json, Value};
use weft_core::Tensor;

use crate::common::{free_port, path_set, wait_for, weft_command, weft_ok};

/// Trains an mlp (2 features, 8 hidden, 3 classes) for 6 steps on a small CSV into `store/mlp`.
pub fn train_mlp(store: &Path) -> PathBuf {
    let cfg = crate::common::write_tiny_mlp(store, "steps = 6\n");
    let ckpt = store.join("mlp");
    let set = path_set("train.checkpoint_dir", &ckpt);
    weft_ok(&["train", "--config", cfg.to_str().unwrap(), "--quiet", "--set", &set]);
    ckpt
}

/// A running `weft serve`, killed when dropped.
pub struct Server {
    pub child: Child,
    pub base: String,
    /// The management API's base URL.
    pub management: String,
    /// The metrics' base URL.
    pub metrics: String,
    /// The token, in the file `--token-file` names.
    pub token: String,
    pub client: Client,
}

/// The token the servers here are started with (unless a test gives its own `--token-file`).
pub const TOKEN: &str = "management-token-0123456789";

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `weft serve --model-store store` with `args` on a free loopback port and waits
    /// until it answers.
    pub fn start(store: &Path, args: &[&str]) -> Server {
        let (port, mport, xport) = (
            free_port().to_string(),
            free_port().to_string(),
            free_port().to_string(),
        );
        let token_file = store.join("management.token");
        std::fs::write(&token_file, TOKEN).unwrap();
        #[rustfmt::skip]
        let mut all = vec!["serve", "--model-store", store.to_str().unwrap(), "--port", &port,
            "--management-port", &mport, "--metrics-port", &xport];
        if !args.contains(&"--token-file") {
            all.extend(["--token-file", token_file.to_str().unwrap()]);
        }
        all.extend(args);
        let child = weft_command(&all).stdout(Stdio::null()).spawn().unwrap();
        let client = Client::builder()
            .timeout(std::time::Duration::from_secs(120))
            .build()
            .unwrap();
        let mut server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            management: format!("http://127.0.0.1:{mport}"),
            metrics: format!("http://127.0.0.1:{xport}"),
            token: TOKEN.to_string(),
            client,
        };
        let url = format!("{}/v2/health/live", server.base);
        let up = wait_for(60, || server.client.get(&url).send().is_ok_and(|r| r.status() == 200));
        assert!(up, "weft serve answered no health check: {:?}", server.child.try_wait());
        server
    }

    /// `(status, body as JSON)` of a GET.
    pub fn get(&self, path: &str) -> (u16, Value) {
        let r = self.client.get(format!("{}{path}", self.base)).send().unwrap();
        (r.status().as_u16(), body_json(r))
    }

    /// `(status, body as JSON)` of a POST of `body`.
    pub fn post(&self, path: &str, body: impl Into<reqwest::blocking::Body>) -> (u16, Value) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .body(body)
            .send()
            .unwrap();
        (r.status().as_u16(), body_json(r))
    }

    /// The `data:` payloads of a server-sent-event POST, in order.
    pub fn events(&self, path: &str, body: &Value) -> Vec<String> {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .body(body.to_string())
            .send()
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let kind = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(kind.starts_with("text/event-stream"), "{kind}");
        BufReader::new(r)
            .lines()
            .map(Result::unwrap)
            .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
            .collect()
    }

    /// The `text_output` of each event of Triton's `generate_stream` at `path`, in order.
    pub fn stream_texts(&self, path: &str, body: &Value) -> Vec<String> {
        self.events(path, body)
            .iter()
            .map(|e| {
                let v: Value = serde_json::from_str(e).unwrap();
                v["text_output"].as_str().unwrap().to_string()
            })
            .collect()
    }

    /// `(status, body as JSON)` of a management call (with the token).
    pub fn manage(&self, method: reqwest::Method, path: &str, body: &str) -> (u16, Value) {
        let r = self
            .client
            .request(method, format!("{}{path}", self.management))
            .bearer_auth(&self.token)
            .body(body.to_string())
            .send()
            .unwrap();
        (r.status().as_u16(), body_json(r))
    }

    /// The metrics scraped now: each sample's `name{labels}` and value. Checks the exposition
    /// format's content type and that every line is a comment or a sample.
    pub fn scrape(&self) -> BTreeMap<String, f64> {
        let r = self.client.get(format!("{}/metrics", self.metrics)).send().unwrap();
        assert_eq!(r.status(), 200);
        let kind = r.headers()["content-type"].to_str().unwrap().to_string();
        assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
        let text = r.text().unwrap();
        let mut samples = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (key, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
            assert!(samples.insert(key.to_string(), value).is_none(), "{key} twice");
        }
        samples
    }

    /// Checks that the server still answers.
    pub fn alive(&self) {
        // on a connection of its own: a pooled one may be the idle connection the server is
        // closing that moment (its --read-timeout-ms also ends idle keep-alive connections), and
        // the request sent on it fails with an incomplete message
        let fresh = Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .unwrap();
        let r = fresh.get(format!("{}/v2/health/live", self.base)).send().unwrap();
        assert_eq!(r.status().as_u16(), 200, "the server stopped answering");
    }
}

/// A response's body as JSON (`null` when it is not JSON).
pub fn body_json(r: reqwest::blocking::Response) -> Value {
    serde_json::from_str(&r.text().unwrap()).unwrap_or(Value::Null)
}

/// The logits of the checkpoint at `ckpt` for `input`, computed here, without the server.
pub fn reference_logits(ckpt: &Path, input: &Tensor) -> (Vec<usize>, Vec<f32>) {
    let trained = weft_train::generate::read_trained(ckpt).unwrap();
    let cfg = weft_train::generate::recorded_model(&trained).unwrap();
    let model = weft_train::run::build_model(&cfg, 0).unwrap();
    weft_nn::state_dict::load_state_dict(model.as_ref(), trained.params.as_ref(), model.aliases(), "reference")
        .unwrap();
    model.context().set_training(false);
    let out = weft_core::no_grad(|| model.logits(input)).unwrap();
    (out.shape().to_vec(), out.to_vec::<f32>().unwrap())
}

/// Asserts that `output` (a v2 output tensor) holds `want` within 1e-6.
pub fn assert_output(output: &Value, want: &(Vec<usize>, Vec<f32>)) {
    assert_eq!(output["name"], "logits");
    assert_eq!(output["datatype"], "FP32");
    let shape: Vec<usize> = serde_json::from_value(output["shape"].clone()).unwrap();
    let data: Vec<f32> = serde_json::from_value(output["data"].clone()).unwrap();
    assert_eq!(shape, want.0);
    assert_eq!(data.len(), want.1.len());
    for (i, (g, w)) in data.iter().zip(&want.1).enumerate() {
        assert!((g - w).abs() <= 1e-6, "logit {i}: served {g}, forward {w}");
    }
}

/// A v2 infer body of FP32 rows of 2 features.
pub fn infer_body(rows: &[[f32; 2]]) -> String {
    let data: Vec<f32> = rows.iter().flatten().copied().collect();
    json!({"inputs": [{"name": "input", "shape": [rows.len(), 2], "datatype": "FP32", "data": data}]}).to_string()
}
