//! `weft serve`: serves checkpoints from a model store over HTTP (docs/serving.md).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use weft_serve::{AppState, Limits, Listeners, LoadOptions, ModelSpec, Registry, Token};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The folder models are served from: every `--model` path lies inside it (and every
    /// folder the management API registers). Required unless `--registry` is given.
    #[arg(long, value_name = "DIR", required_unless_present = "registry")]
    model_store: Option<PathBuf>,
    /// A run store whose model registry is served (`weft models`): each model's production
    /// version under its name, its registry version as the version label, the default of its
    /// name. Promotions are followed while serving: the new version loads, becomes the default,
    /// and the old one is unregistered once its requests have finished. A version that does not
    /// load is reported and tried again; versions given otherwise (--model, POST /models) are
    /// left alone, a registry version whose label they hold not loaded (docs/registry.md).
    #[arg(long, value_name = "DIR")]
    registry: Option<PathBuf>,
    /// How often the registry is read for promotions, in milliseconds (10 to 600000).
    #[arg(long, value_name = "MS", default_value_t = 1000, requires = "registry")]
    registry_poll_ms: u64,
    /// A model to serve: NAME=PATH[:VERSION], PATH a checkpoint folder (or a checkpoint
    /// directory: its newest checkpoint) relative to the model store; VERSION defaults to 1.
    /// Repeat for more models or versions (a name's first version is its default, unless
    /// --registry serves a production version of that name).
    #[arg(long = "model", value_name = "NAME=PATH[:VERSION]")]
    models: Vec<String>,
    /// The address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port of the inference API (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The port of the management API, always behind the token (0: any free port).
    #[arg(long, default_value_t = 8081)]
    management_port: u16,
    /// The address the management API listens on (loopback by default).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    management_host: String,
    /// The port of the Prometheus metrics (`GET /metrics`, no token) (0: any free port).
    #[arg(long, default_value_t = 8082)]
    metrics_port: u16,
    /// The address the metrics listen on (loopback by default; `0.0.0.0` in a pod lets
    /// Prometheus scrape it).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    metrics_host: String,
    /// A file holding the bearer token (at least 16 printable characters) that requests send as
    /// `Authorization: Bearer TOKEN`. Without it, a token for the management API is generated
    /// at start and written to a new 0600 file whose path is printed.
    #[arg(long, value_name = "F")]
    token_file: Option<PathBuf>,
    /// Require the token on the inference API too (the health checks stay open).
    #[arg(long, requires = "token_file")]
    inference_token: bool,
    /// The largest request body, in bytes (256 to 1073741824: 1 GiB).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().body_bytes)]
    max_body_bytes: usize,
    /// The most bytes of request bodies (being read or handled) and infer answers (their output
    /// values, until sent) the server holds at once, across all connections; a request past it
    /// is answered 503 with Retry-After. From --max-body-bytes to 1099511627776 (1 TiB)
    /// [default: 1 GiB, or --max-body-bytes when that is larger]
    #[arg(long, value_name = "BYTES")]
    max_body_bytes_in_flight: Option<usize>,
    /// The most new tokens one generation request may ask for.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_tokens as u64)]
    max_tokens: u64,
    /// Requests each model admits at once, running or waiting (over it: 503).
    #[arg(long, value_name = "N", default_value_t = LoadOptions::default().queue as u64)]
    queue: u64,
    /// The most infer/predictions requests of one model run as one forward (1: no batching),
    /// for the `--model`s given here (the management API takes `batch_size` per model).
    #[arg(long, value_name = "N", default_value_t = 1)]
    max_batch_size: u64,
    /// How long, in milliseconds, a batch waits for more requests after its first arrives.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    max_batch_delay_ms: u64,
    /// The most generation requests of one language model decoded together, a token each per
    /// step (continuous batching; 1: one at a time; the management API takes `max_sequences`).
    #[arg(long, value_name = "N", default_value_t = LoadOptions::default().max_sequences as u64)]
    max_sequences: u64,
    /// The most prompt tokens one sequence runs per decode step: a longer prompt runs in chunks
    /// of N while the other sequences go on decoding (0: whole, in one step; the management API
    /// takes `prefill_chunk`).
    #[arg(long, value_name = "N", default_value_t = LoadOptions::default().prefill_chunk as u64)]
    prefill_chunk: u64,
    /// How long a connection may take to send a request's headers (an idle keep-alive
    /// connection: its next request's), the longest pause inside a request's body, the grace
    /// before --min-body-rate and --min-send-rate count, and how long an answer may wait on a
    /// client that does not read it, in milliseconds (1 to 600000); past it the connection is
    /// closed (a body: 408).
    #[arg(long, value_name = "MS", default_value_t = Limits::default().read_timeout.as_millis() as u64)]
    read_timeout_ms: u64,
    /// The slowest a request body may arrive, in bytes a second on average, counted once
    /// --read-timeout-ms has passed since its head arrived (slower: 408 and the connection
    /// closed), so that a client dripping a body cannot hold a connection for good (1 to
    /// 1073741824).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().min_body_rate)]
    min_body_rate: u64,
    /// The slowest a client may take an answer, in bytes a second on average, counted while the
    /// answer waits on it once it has waited --read-timeout-ms (slower: the connection is
    /// closed and the answer dropped, giving back what it held), so that a client reading a
    /// large answer a little at a time cannot hold it for hours (1 to 1073741824).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().min_send_rate)]
    min_send_rate: u64,
    /// The most connections each port (inference, management, metrics) holds open at once;
    /// more wait, unaccepted, until one closes. Lowered, with a warning, to what the limit on
    /// open files (raised to its hard limit) leaves.
    #[arg(long, value_name = "N", default_value_t = Limits::default().connections)]
    max_connections: usize,
    /// Workers of each `--model` given here: how many of its jobs (forwards, batches, decode
    /// steps) run at once, 1 to 64 (the management API takes `workers` per model and scales it).
    #[arg(long, value_name = "N", default_value_t = LoadOptions::default().workers)]
    workers: usize,
}

/// How often a `--model` that failed to load at start is tried again (and a production version
/// of `--registry` that failed to load: serve_registry.rs).
pub(crate) const RETRY_EVERY: Duration = Duration::from_secs(5);

/// Tries the `--model`s that failed to load at start again every [`RETRY_EVERY`] (a volume still
/// mounting, a checkpoint still being copied), until each loads or its name and version is
/// served otherwise (registered through the management API). A new cause is reported once.
fn retry_failed(registry: &Registry, store: &std::path::Path, mut failed: Vec<(ModelSpec, String)>, load: LoadOptions) {
    while !failed.is_empty() {
        std::thread::sleep(RETRY_EVERY);
        failed.retain_mut(|(spec, last)| {
            if registry.get(&spec.name, Some(&spec.version)).is_ok() {
                return false;
            }
            match weft_serve::registry::load(store, spec, load) {
                Ok(served) => {
                    let kind = served.kind;
                    // (an error: registered meanwhile through the management API)
                    if registry.add(served).is_ok() {
                        weft_core::errln!(
                            "weft serve: loaded model {} version {} ({kind}) from {} on a later try",
                            spec.name,
                            spec.version,
                            spec.path.display()
                        );
                    }
                    false
                }
                Err(e) => {
                    if e != *last {
                        weft_core::errln!("weft serve: error: {e}; tried again in {} s", RETRY_EVERY.as_secs());
                        *last = e;
                    }
                    true
                }
            }
        });
    }
}

/// `--registry-poll-ms`'s bounds: a read of the registry (one SQLite query) every 10 ms at most,
/// and a promotion followed within 10 minutes at least.
const MIN_REGISTRY_POLL_MS: u64 = 10;
const MAX_REGISTRY_POLL_MS: u64 = 600_000;
/// `--max-body-bytes`' bounds: room for a short request (a generate or completions call with
/// its parameters), and 1 GiB (a body is read whole, and JSON's tensors take 2 to 20 bytes a
/// value: far past any forward a CPU answers in time).
const MIN_BODY_BYTES: u64 = 256;
const MAX_BODY_BYTES: u64 = 1 << 30;
/// `--max-body-bytes-in-flight`'s upper bound (1 TiB); its lower bound is `--max-body-bytes`.
const MAX_BODY_BYTES_IN_FLIGHT: u64 = 1 << 40;

/// The generated management token's file, removed when dropped.
struct TokenFile(PathBuf);

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub fn run(args: ServeArgs) -> Result<(), String> {
    if !(1..=weft_serve::workers::MAX_WORKERS).contains(&args.workers) {
        return Err(format!(
            "--workers {}: give a whole number from 1 to {}",
            args.workers,
            weft_serve::workers::MAX_WORKERS
        ));
    }
    if args.max_tokens == 0 {
        return Err("--max-tokens: 0 lets a request generate nothing; give at least 1".into());
    }
    use weft_serve::registry::{
        bounded, MAX_BATCH_DELAY_MS, MAX_BATCH_SIZE, MAX_PREFILL_CHUNK, MAX_QUEUE, MAX_SEQUENCES,
    };
    let flag = |what: &str, value: u64, min: u64, max: u64| bounded(what, value, min, max).map(|v| v as usize);
    let max_tokens = flag("--max-tokens", args.max_tokens, 1, weft_serve::MAX_TOKENS_LIMIT as u64)?;
    let queue = flag("--queue", args.queue, 1, MAX_QUEUE as u64)?;
    let max_batch_size = flag("--max-batch-size", args.max_batch_size, 1, MAX_BATCH_SIZE as u64)?;
    let max_batch_delay = bounded("--max-batch-delay-ms", args.max_batch_delay_ms, 0, MAX_BATCH_DELAY_MS)
        .map_err(|e| format!("{e} (milliseconds a batch's first request waits for more; docs/serving.md)"))?;
    let max_sequences = flag("--max-sequences", args.max_sequences, 1, MAX_SEQUENCES as u64)?;
    let prefill_chunk = flag("--prefill-chunk", args.prefill_chunk, 0, MAX_PREFILL_CHUNK as u64)?;
    let read_timeout_ms = bounded(
        "--read-timeout-ms",
        args.read_timeout_ms,
        1,
        weft_serve::MAX_READ_TIMEOUT_MS,
    )?;
    let min_body_rate = bounded("--min-body-rate", args.min_body_rate, 1, weft_serve::MAX_MIN_BODY_RATE)
        .map_err(|e| format!("{e} (bytes a second)"))?;
    let min_send_rate = bounded("--min-send-rate", args.min_send_rate, 1, weft_serve::MAX_MIN_SEND_RATE)
        .map_err(|e| format!("{e} (bytes a second)"))?;
    let registry_poll_ms = bounded(
        "--registry-poll-ms",
        args.registry_poll_ms,
        MIN_REGISTRY_POLL_MS,
        MAX_REGISTRY_POLL_MS,
    )
    .map_err(|e| format!("{e} (milliseconds between reads of the registry)"))?;
    let max_body_bytes = bounded(
        "--max-body-bytes",
        args.max_body_bytes as u64,
        MIN_BODY_BYTES,
        MAX_BODY_BYTES,
    )? as usize;
    let model_store = match (&args.model_store, &args.registry) {
        (Some(store), _) => store.clone(),
        (None, Some(registry)) => registry.clone(),
        (None, None) => return Err("give --model-store DIR or --registry DIR".into()),
    };
    if !model_store.is_dir() {
        return Err(format!("--model-store {}: not a folder", model_store.display()));
    }
    let mut generated = None;
    let token = match args.token_file.as_deref() {
        Some(path) => Token::from_file(path)?,
        None => {
            let text = weft_serve::management::generate_token().map_err(|e| format!("cannot make a token: {e}"))?;
            let path = std::env::temp_dir().join(format!("weft-serve-{}.token", std::process::id()));
            weft_serve::management::write_token_file(&path, &text)
                .map_err(|e| format!("cannot write the token file {}: {e}", path.display()))?;
            crate::print_out(&format!(
                "weft serve: the management API's token is in {} (0600)\n",
                path.display()
            ))?;
            generated = Some(TokenFile(path));
            Token::new(&text)?
        }
    };
    let in_flight = args
        .max_body_bytes_in_flight
        .unwrap_or_else(|| Limits::default().body_bytes_in_flight.max(max_body_bytes));
    if in_flight < max_body_bytes {
        return Err(format!(
            "--max-body-bytes-in-flight: {in_flight} is below --max-body-bytes ({max_body_bytes}): one request at the limit would not fit"
        ));
    }
    let in_flight = bounded(
        "--max-body-bytes-in-flight",
        in_flight as u64,
        max_body_bytes as u64,
        MAX_BODY_BYTES_IN_FLIGHT,
    )? as usize;
    let connections = crate::open_files::connections_per_port("weft serve", args.max_connections, 3)?;
    let limits = Limits {
        body_bytes: max_body_bytes,
        connections,
        body_bytes_in_flight: in_flight,
        max_tokens,
        read_timeout: Duration::from_millis(read_timeout_ms),
        min_body_rate,
        min_send_rate,
        ..Limits::default()
    };
    let load = LoadOptions {
        queue,
        max_batch_size,
        max_batch_delay: Duration::from_millis(max_batch_delay),
        max_sequences,
        prefill_chunk,
        workers: args.workers,
    };
    let registry = Registry::default();
    let specs = args
        .models
        .iter()
        .map(|raw| raw.parse::<ModelSpec>())
        .collect::<Result<Vec<_>, _>>()?;
    for (i, spec) in specs.iter().enumerate() {
        if specs[..i]
            .iter()
            .any(|s| s.name == spec.name && s.version == spec.version)
        {
            return Err(format!(
                "--model {}: model {} version {} is given twice",
                args.models[i], spec.name, spec.version
            ));
        }
        // a path outside the store is a refused flag, not a model that failed to load
        if let Err(e) = weft_serve::registry::resolve_in_store(&model_store, &spec.path) {
            if e.contains("relative to the model store") || e.contains("outside the model store") {
                return Err(e);
            }
        }
    }
    let mut failed = Vec::new();
    for spec in &specs {
        match weft_serve::registry::load(&model_store, spec, load) {
            Ok(served) => {
                weft_core::errln!(
                    "weft serve: loaded model {} version {} ({}) from {}",
                    spec.name,
                    spec.version,
                    served.kind,
                    spec.path.display()
                );
                registry.add(served).map_err(|e| e.message)?;
            }
            Err(e) => {
                // the others are served; readiness says 503 until this one loads
                weft_core::errln!(
                    "weft serve: error: {e}; serving the other models, not ready until it loads (tried again every {} s) or is registered",
                    RETRY_EVERY.as_secs()
                );
                registry.record_failure(weft_serve::registry::LoadFailure {
                    name: spec.name.clone(),
                    version: spec.version.clone(),
                    error: e.clone(),
                });
                failed.push((spec.clone(), e));
            }
        }
    }
    let follower = match &args.registry {
        Some(dir) => Some(crate::serve_registry::Follower::start(dir, &registry, load)?),
        None => None,
    };
    if registry.is_empty() && registry.failures().is_empty() {
        weft_core::errln!("weft serve: no --model given; serving the health checks only");
    }
    let loopback = matches!(args.host.as_str(), "127.0.0.1" | "::1" | "localhost");
    if !loopback && !args.inference_token {
        weft_core::errln!(
            "weft serve: warning: listening on {} without --inference-token: anyone who reaches it can run the models",
            args.host
        );
    }
    let registry = Arc::new(registry);
    if !failed.is_empty() {
        let (registry, store) = (registry.clone(), model_store.clone());
        let retrying = std::thread::Builder::new()
            .name("weft-serve-retry".into())
            .spawn(move || retry_failed(&registry, &store, failed, load));
        if let Err(e) = retrying {
            weft_core::errln!("weft serve: warning: cannot start the thread that retries failed models: {e}");
        }
    }
    let state = AppState {
        registry: registry.clone(),
        limits,
        token: Some(Arc::new(token)),
        protect_inference: args.inference_token,
        store: Arc::new(model_store.clone()),
        load,
        metrics: Arc::default(),
        bodies: weft_serve::body::BodyBudget::new(limits.body_bytes_in_flight),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    if let Some(follower) = follower {
        let every = Duration::from_millis(registry_poll_ms);
        follower.follow(registry, runtime.handle().clone(), every);
    }
    let served = runtime.block_on(async move {
        let bind = |host: &str, port: u16, what: &'static str| {
            let host = host.to_string();
            async move {
                let listener = tokio::net::TcpListener::bind((host.as_str(), port))
                    .await
                    .map_err(|e| format!("cannot listen on {host}:{port} ({what}): {e}"))?;
                let addr = listener.local_addr().map_err(|e| e.to_string())?;
                crate::print_out(&format!("weft serve: {what} on http://{addr}\n"))?;
                Ok::<_, String>(listener)
            }
        };
        let listeners = Listeners {
            inference: bind(&args.host, args.port, "listening").await?,
            management: Some(bind(&args.management_host, args.management_port, "management API").await?),
            metrics: Some(bind(&args.metrics_host, args.metrics_port, "metrics").await?),
        };
        weft_serve::serve(listeners, state, weft_serve::shutdown_signal())
            .await
            .map_err(|e| format!("serving: {e}"))
    });
    drop(generated);
    served
}
