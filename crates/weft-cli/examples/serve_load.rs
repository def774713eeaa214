//! A small load generator for `weft serve`: `--clients` threads, each with its own keep-alive
//! connection, send KServe v2 infer requests of `--rows` rows of `--features` FP32 values (or
//! of shape `--shape`, e.g. `1,8,8` for an image) to `--url` back to back for `--seconds` seconds (after one second of warm-up), then it prints
//! one JSON line: requests, failures, requests per second and latency percentiles (ms).
//! `--body nested` sends the rows as nested JSON arrays instead (the body of TorchServe-style
//! `/predictions/NAME`, which `weft serve` and a TorchServe handler both take).
//!
//! ```sh
//! cargo run --example serve_load -- --url http://127.0.0.1:8080/v2/models/digits/infer \
//!     --features 64 --clients 16 --seconds 10
//! ```
//!
//! tools/bench/serve_batching.sh runs it against `weft serve` with batching off and on.

use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serde_json::json;

/// What to send, read from the command line.
struct Load {
    url: String,
    clients: usize,
    seconds: f64,
    rows: usize,
    /// The dimensions of one row.
    row_shape: Vec<usize>,
    /// Send the rows as nested arrays (`/predictions`) rather than a KServe v2 tensor.
    nested: bool,
}

fn parse_args() -> Result<Load, String> {
    let mut load = Load {
        url: String::new(),
        clients: 16,
        seconds: 10.0,
        rows: 1,
        row_shape: vec![64],
        nested: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag}: give a value"))?;
        let number = |v: &str| v.parse::<f64>().map_err(|_| format!("{flag}: {v:?} is not a number"));
        match flag.as_str() {
            "--url" => load.url = value,
            "--clients" => load.clients = number(&value)? as usize,
            "--seconds" => load.seconds = number(&value)?,
            "--rows" => load.rows = number(&value)? as usize,
            "--features" => load.row_shape = vec![number(&value)? as usize],
            "--shape" => {
                load.row_shape = value
                    .split(',')
                    .map(|d| number(d).map(|d| d as usize))
                    .collect::<Result<_, _>>()?
            }
            "--body" => {
                load.nested = match value.as_str() {
                    "v2" => false,
                    "nested" => true,
                    _ => return Err(format!("--body: {value:?} is neither v2 nor nested")),
                }
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if load.url.is_empty() {
        return Err("give --url http://HOST:PORT/v2/models/NAME/infer".into());
    }
    Ok(load)
}

/// The latencies (seconds) and failures of one client sending until `end`; only requests that
/// start after `measure_from` are kept.
fn client(load: &Load, index: usize, measure_from: Instant, end: Instant) -> (Vec<f64>, usize) {
    let http = Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("an HTTP client");
    let mut shape = vec![load.rows];
    shape.extend(&load.row_shape);
    let data: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|i| ((i * 31 + index * 7) % 17) as f32 / 17.0)
        .collect();
    let body = if load.nested {
        nest(&data, &shape).to_string()
    } else {
        json!({"inputs": [{"name": "input", "shape": shape, "datatype": "FP32", "data": data}]}).to_string()
    };
    let (mut latencies, mut failures) = (Vec::new(), 0);
    loop {
        let started = Instant::now();
        if started >= end {
            break;
        }
        let ok = http
            .post(&load.url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .and_then(|r| r.error_for_status())
            .and_then(|r| r.bytes())
            .is_ok();
        if started >= measure_from {
            if ok {
                latencies.push(started.elapsed().as_secs_f64());
            } else {
                failures += 1;
            }
        }
    }
    (latencies, failures)
}

/// `data` (row-major, `shape`) as nested JSON arrays.
fn nest(data: &[f32], shape: &[usize]) -> serde_json::Value {
    match shape {
        [] | [_] => json!(data),
        [n, rest @ ..] => {
            let step = data.len() / n.max(&1);
            serde_json::Value::Array((0..*n).map(|i| nest(&data[i * step..(i + 1) * step], rest)).collect())
        }
    }
}

/// The `p`-th percentile (0 to 100) of sorted `xs`.
fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (xs.len() - 1) as f64).round() as usize;
    xs[i.min(xs.len() - 1)]
}

fn main() {
    let load = match parse_args() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("serve_load: {e}");
            std::process::exit(2);
        }
    };
    let measure_from = Instant::now() + Duration::from_secs(1);
    let end = measure_from + Duration::from_secs_f64(load.seconds);
    let results: Vec<(Vec<f64>, usize)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..load.clients)
            .map(|i| {
                let load = &load;
                scope.spawn(move || client(load, i, measure_from, end))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a client")).collect()
    });
    let mut latencies: Vec<f64> = results.iter().flat_map(|(l, _)| l.iter().copied()).collect();
    let failures: usize = results.iter().map(|(_, f)| f).sum();
    latencies.sort_by(f64::total_cmp);
    let summary = json!({
        "clients": load.clients,
        "rows": load.rows,
        "requests": latencies.len(),
        "failures": failures,
        "requests_per_s": latencies.len() as f64 / load.seconds,
        "p50_ms": percentile(&latencies, 50.0) * 1e3,
        "p99_ms": percentile(&latencies, 99.0) * 1e3,
    });
    println!("{summary}");
}
