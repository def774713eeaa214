//! Prometheus metrics in the text exposition format (version 0.0.4), written here rather than
//! with a crate: a handful of counters, gauges and fixed-bucket histograms need no more.
//!
//! Requests are counted by model, version, endpoint and status code as they are answered (a
//! middleware on the inference routes); each loaded version keeps its own counters (tokens,
//! batch sizes, forward and first-token times), and the queue depths are read at scrape time.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::registry::Registry;
use crate::AppState;

/// The upper bounds, in seconds, of the latency histograms' buckets (request, forward, time to
/// first token); a last `+Inf` bucket holds everything.
pub const SECONDS_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The upper bounds of the batch-size histogram's buckets (requests per forward).
pub const BATCH_BUCKETS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// A histogram with fixed bucket bounds: per-bucket counts (not cumulative), their sum and count.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    inner: Mutex<HistogramData>,
}

#[derive(Debug, Clone, Default)]
struct HistogramData {
    /// `bounds.len() + 1` counts, the last for values over every bound.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            inner: Mutex::new(HistogramData {
                counts: vec![0; bounds.len() + 1],
                sum: 0.0,
            }),
        }
    }

    /// Counts one value (seconds, or a batch size: in the bounds' unit).
    pub fn observe(&self, value: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| value <= b)
            .unwrap_or(self.bounds.len());
        let mut d = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        d.counts[i] += 1;
        d.sum += value;
    }

    /// `(count, sum)` of the values observed so far.
    pub fn snapshot(&self) -> (u64, f64) {
        let d = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (d.counts.iter().sum(), d.sum)
    }

    /// Appends `name_bucket`, `name_sum` and `name_count` lines with `labels` (already
    /// rendered, `k="v",...`) to `out`.
    fn render(&self, name: &str, labels: &str, out: &mut String) {
        let d = self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, count) in d.counts.iter().enumerate() {
            cumulative += count;
            let le = self.bounds.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", d.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

/// The counters one loaded version keeps.
#[derive(Debug)]
pub struct ModelStats {
    /// New tokens generated (all generation endpoints, streams cut short included).
    pub generated_tokens: AtomicU64,
    /// Context tokens run through the decode steps: prompts (once for the `n` completions of
    /// one) and a context run again once it slides past `block_size`.
    pub prefill_tokens: AtomicU64,
    /// Seconds from a generation request's arrival to its first new token.
    pub time_to_first_token: Histogram,
    /// Requests run by each forward (1 without batching).
    pub batch_size: Histogram,
    /// Seconds each forward (of one request or a batch) took on the worker.
    pub inference: Histogram,
    /// Seconds each request waited from its admission until its forward or generation started
    /// on the worker (in the batcher's queue too).
    pub queue: Histogram,
    /// Sequences run together by each decode step of generation (continuous batching).
    pub decode_batch: Histogram,
    /// Seconds each decode step (one cached forward of every running sequence) took.
    pub decode_step: Histogram,
}

impl Default for ModelStats {
    fn default() -> Self {
        ModelStats {
            generated_tokens: AtomicU64::new(0),
            prefill_tokens: AtomicU64::new(0),
            time_to_first_token: Histogram::new(&SECONDS_BUCKETS),
            batch_size: Histogram::new(&BATCH_BUCKETS),
            inference: Histogram::new(&SECONDS_BUCKETS),
            queue: Histogram::new(&SECONDS_BUCKETS),
            decode_batch: Histogram::new(&BATCH_BUCKETS),
            decode_step: Histogram::new(&SECONDS_BUCKETS),
        }
    }
}

/// Which model version answered a request: handlers put it in the response's extensions, and
/// [`track`] uses it for the labels and the `Weft-Model-Version` header.
#[derive(Debug, Clone)]
pub struct Answered {
    pub model: String,
    pub version: String,
}

/// The labels one request is counted under.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct RequestKey {
    model: String,
    version: String,
    endpoint: &'static str,
}

#[derive(Debug)]
struct RequestStats {
    codes: BTreeMap<u16, u64>,
    /// Dropped once its version is no longer served (the counts stay).
    seconds: Option<Histogram>,
}

/// The server's request counters.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<RequestKey, RequestStats>>,
}

impl Metrics {
    /// Counts one answered request that took `seconds` (until its response head).
    fn record(&self, key: RequestKey, code: u16, seconds: f64) {
        let mut requests = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        let stats = requests.entry(key).or_insert_with(|| RequestStats {
            codes: BTreeMap::new(),
            seconds: None,
        });
        *stats.codes.entry(code).or_insert(0) += 1;
        (stats.seconds.get_or_insert_with(|| Histogram::new(&SECONDS_BUCKETS))).observe(seconds);
    }
}

/// `s` escaped for a label value.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn help(out: &mut String, name: &str, kind: &str, text: &str) {
    let _ = writeln!(out, "# HELP {name} {text}\n# TYPE {name} {kind}");
}

/// One of a version's histograms.
type StatsHistogram = fn(&crate::registry::Served) -> &Histogram;

/// One of a version's gauges (worker counts).
type StatsGauge = fn(&crate::registry::Served) -> usize;

/// A model version's counter, read from its stats.
type StatsCounter = fn(&crate::registry::Served) -> u64;

/// Every metric as Prometheus text (exposition format 0.0.4).
pub fn render(metrics: &Metrics, registry: &Registry) -> String {
    let mut out = String::new();
    let versions = registry.all();
    let names: BTreeSet<&str> = versions.iter().map(|s| s.name.as_str()).collect();
    let served: BTreeSet<(&str, &str)> = versions.iter().map(|s| (s.name.as_str(), s.version.as_str())).collect();
    let mut requests = metrics.requests.lock().unwrap_or_else(|p| p.into_inner());
    // the latencies of a version no longer served (unregistered, or replaced by a promotion) go
    // with it, as its own series do; its request counts stay
    for (k, s) in requests.iter_mut() {
        let gone = match (k.model.as_str(), k.version.as_str()) {
            ("", _) => false,
            (model, "") => !names.contains(model),
            (model, version) => !served.contains(&(model, version)),
        };
        if gone {
            s.seconds = None;
        }
    }
    let label = |k: &RequestKey| {
        format!(
            "model=\"{}\",version=\"{}\",endpoint=\"{}\"",
            escape(&k.model),
            escape(&k.version),
            k.endpoint
        )
    };
    help(
        &mut out,
        "weft_requests_total",
        "counter",
        "Requests answered, by model, version, endpoint and HTTP status code.",
    );
    for (k, s) in requests.iter() {
        for (code, n) in &s.codes {
            let _ = writeln!(out, "weft_requests_total{{{},code=\"{code}\"}} {n}", label(k));
        }
    }
    help(
        &mut out,
        "weft_request_duration_seconds",
        "histogram",
        "Seconds from a request's arrival to its response head (for streams: to the stream's start).",
    );
    for (k, s) in requests.iter() {
        if let Some(seconds) = &s.seconds {
            seconds.render("weft_request_duration_seconds", &label(k), &mut out);
        }
    }
    drop(requests);
    let model_label =
        |s: &crate::registry::Served| format!("model=\"{}\",version=\"{}\"", escape(&s.name), escape(&s.version));
    help(
        &mut out,
        "weft_queue_depth",
        "gauge",
        "Requests admitted to a model version now, running or waiting.",
    );
    for s in &versions {
        let _ = writeln!(out, "weft_queue_depth{{{}}} {}", model_label(s), s.queue_depth());
    }
    help(
        &mut out,
        "weft_queue_capacity",
        "gauge",
        "Requests a model version admits at once (over it: 503).",
    );
    for s in &versions {
        let _ = writeln!(out, "weft_queue_capacity{{{}}} {}", model_label(s), s.options.queue);
    }
    let gauges: [(&str, &str, StatsGauge); 3] = [
        ("weft_workers", "Workers of a model version (jobs it runs at once).", |s| s.workers.count()),
        ("weft_workers_busy", "Workers of a model version running a job now.", |s| s.workers.busy()),
        (
            "weft_workers_busy_peak",
            "The most workers of a model version busy at once since it loaded or a scaling of its workers was answered.",
            |s| s.workers.peak(),
        ),
    ];
    for (name, text, get) in gauges {
        help(&mut out, name, "gauge", text);
        for s in &versions {
            let _ = writeln!(out, "{name}{{{}}} {}", model_label(s), get(s));
        }
    }
    help(
        &mut out,
        "weft_model_load_seconds",
        "gauge",
        "Seconds reading, checking and building a model version took.",
    );
    for s in &versions {
        let _ = writeln!(out, "weft_model_load_seconds{{{}}} {}", model_label(s), s.load_seconds);
    }
    let counters: [(&str, &str, StatsCounter); 2] = [
        (
            "weft_generated_tokens_total",
            "New tokens generated by a model version.",
            |s| s.stats.generated_tokens.load(Ordering::Relaxed),
        ),
        (
            "weft_prefill_tokens_total",
            "Prompt tokens run by a model version's decode steps (a prompt shared by n completions once; a context sliding past block_size again).",
            |s| s.stats.prefill_tokens.load(Ordering::Relaxed),
        ),
    ];
    for (name, text, get) in counters {
        help(&mut out, name, "counter", text);
        for s in &versions {
            let _ = writeln!(out, "{name}{{{}}} {}", model_label(s), get(s));
        }
    }
    let histograms: [(&str, &str, StatsHistogram); 6] = [
        (
            "weft_queue_duration_seconds",
            "Seconds a request waited from its admission until it started on a model version's worker.",
            |s| &s.stats.queue,
        ),
        (
            "weft_time_to_first_token_seconds",
            "Seconds from a generation request's arrival to its first new token.",
            |s| &s.stats.time_to_first_token,
        ),
        (
            "weft_batch_size",
            "Requests run together by one forward of a model version.",
            |s| &s.stats.batch_size,
        ),
        (
            "weft_inference_duration_seconds",
            "Seconds one forward (one request or a batch) took on a model version's worker.",
            |s| &s.stats.inference,
        ),
        (
            "weft_decode_batch_size",
            "Sequences generated together by one decode step of a model version.",
            |s| &s.stats.decode_batch,
        ),
        (
            "weft_decode_step_duration_seconds",
            "Seconds one decode step (a cached forward of every running sequence) took.",
            |s| &s.stats.decode_step,
        ),
    ];
    for (name, text, get) in histograms {
        help(&mut out, name, "histogram", text);
        for s in &versions {
            get(s).render(name, &model_label(s), &mut out);
        }
    }
    out
}

/// `GET /metrics`.
pub async fn scrape(State(state): State<AppState>) -> Response {
    let text = render(&state.metrics, &state.registry);
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

/// The short name of a route (the `endpoint` label), from its path template.
fn endpoint(template: &str) -> &'static str {
    let t = template.replace("/versions/{version}", "");
    match t.as_str() {
        "/v2" => "server_metadata",
        "/v2/health/live" => "live",
        "/v2/health/ready" => "ready",
        "/ping" => "ping",
        "/v2/models/{name}" => "model_metadata",
        "/v2/models/{name}/ready" => "model_ready",
        "/v2/models/{name}/infer" => "infer",
        "/v2/models/{name}/generate" => "generate",
        "/v2/models/{name}/generate_stream" => "generate_stream",
        "/predictions/{name}" | "/predictions/{name}/{version}" => "predictions",
        "/v1/completions" => "completions",
        "/v1/models" => "models",
        _ => "other",
    }
}

/// `(model, version)` named by a request's path (`/v2/models/NAME[/versions/V]/...`,
/// `/predictions/NAME[/V]`), each kept only when the registry serves it, so that unknown
/// names never become label values.
fn path_labels(path: &str, registry: &Registry) -> (String, String) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (name, version) = match parts.as_slice() {
        ["v2", "models", name, "versions", v, ..] => (*name, Some(*v)),
        ["v2", "models", name, ..] => (*name, None),
        ["predictions", name, v] => (*name, Some(*v)),
        ["predictions", name] => (*name, None),
        _ => return (String::new(), String::new()),
    };
    match registry.knows(name, version) {
        (true, true) => (name.to_string(), version.unwrap_or("").to_string()),
        (true, false) => (name.to_string(), String::new()),
        _ => (String::new(), String::new()),
    }
}

/// Counts each request under its model, version, endpoint and status, and times it; the
/// version that answered (when a handler says) is also sent as `Weft-Model-Version`. A refused
/// request is counted under what its path names (see [`path_labels`]).
pub async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("other", |m| endpoint(m.as_str()));
    let (mut model, mut version) = path_labels(request.uri().path(), &state.registry);
    let mut response = next.run(request).await;
    if let Some(a) = response.extensions().get::<Answered>().cloned() {
        if let Ok(v) = HeaderValue::from_str(&a.version) {
            response.headers_mut().insert("weft-model-version", v);
        }
        (model, version) = (a.model, a.version);
    }
    let key = RequestKey {
        model,
        version,
        endpoint,
    };
    state
        .metrics
        .record(key, response.status().as_u16(), started.elapsed().as_secs_f64());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_render_cumulative_buckets() {
        let h = Histogram::new(&BATCH_BUCKETS);
        for v in [1.0, 3.0, 3.0, 500.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render("b", "m=\"x\"", &mut out);
        assert!(out.contains("b_bucket{m=\"x\",le=\"1\"} 1\n"), "{out}");
        assert!(out.contains("b_bucket{m=\"x\",le=\"2\"} 1\n"), "{out}");
        assert!(out.contains("b_bucket{m=\"x\",le=\"4\"} 3\n"), "{out}");
        assert!(out.contains("b_bucket{m=\"x\",le=\"256\"} 3\n"), "{out}");
        assert!(out.contains("b_bucket{m=\"x\",le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("b_sum{m=\"x\"} 507\n"), "{out}");
        assert!(out.contains("b_count{m=\"x\"} 4\n"), "{out}");
    }

    #[test]
    fn endpoints_have_short_names() {
        assert_eq!(endpoint("/v2/models/{name}/versions/{version}/infer"), "infer");
        assert_eq!(endpoint("/v2/models/{name}/infer"), "infer");
        assert_eq!(endpoint("/predictions/{name}/{version}"), "predictions");
        assert_eq!(endpoint("/v1/completions"), "completions");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
