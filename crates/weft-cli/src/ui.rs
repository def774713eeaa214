//! `weft ui`: the dashboard of a run store, served over HTTP (docs/tracking.md).

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct UiArgs {
    /// The run store's folder (default: `WEFT_TRACK_DIR`, else `weft-runs`).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The address to listen on (loopback by default: the dashboard has no login).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 5000)]
    port: u16,
    /// Milliseconds a connection has to send its request head (from its start, or from its
    /// last answer when kept alive) before it is closed.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    read_timeout_ms: u64,
    /// The most connections open at once; more wait, unaccepted, until one closes. Lowered,
    /// with a warning, to what the limit on open files (raised to its hard limit) leaves.
    #[arg(long, value_name = "N", default_value_t = weft_serve::Limits::default().connections)]
    max_connections: usize,
}

pub fn run(args: &UiArgs) -> Result<(), String> {
    let read_timeout = weft_serve::registry::bounded(
        "--read-timeout-ms",
        args.read_timeout_ms,
        1,
        weft_serve::MAX_READ_TIMEOUT_MS,
    )?;
    let connections = crate::open_files::connections_per_port("weft ui", args.max_connections, 1)?;
    let dir = match (&args.dir, std::env::var_os("WEFT_TRACK_DIR")) {
        (Some(d), _) => d.clone(),
        (None, Some(env)) if !env.is_empty() => PathBuf::from(env),
        _ => PathBuf::from("weft-runs"),
    };
    let loopback = matches!(args.host.as_str(), "127.0.0.1" | "::1" | "localhost");
    if !loopback {
        weft_core::errln!(
            "weft ui: warning: listening on {}: anyone who reaches it can read (and see the commands of) every run",
            args.host
        );
    }
    let store = weft_track::Store::open_existing(&dir).map_err(|e| e.to_string())?;
    // the model registry's table lives in the same file (read only: none yet lists nothing)
    let registry = weft_tune::registry::ModelRegistry::open_existing(&dir).map_err(|e| e.to_string())?;
    let registry = std::sync::Arc::new(std::sync::Mutex::new(registry));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .map_err(|e| format!("cannot listen on {}:{}: {e}", args.host, args.port))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        crate::print_out(&format!(
            "weft ui: serving {} on http://{addr}/\n",
            store.path().display()
        ))?;
        // on loopback, only requests naming loopback in their Host: a web page the user visits
        // cannot read the runs by rebinding its name to 127.0.0.1
        let guard = addr.ip().is_loopback();
        // live event streams last as long as their runs: the shutdown ends them
        let (closing_tx, closing) = tokio::sync::watch::channel(false);
        let app = weft_track::ui::app(store, closing, move |app| {
            let app = app.route("/api/models", axum::routing::get(move || models(registry.clone())));
            if guard {
                app.layer(axum::middleware::from_fn(weft_serve::host::loopback_only))
            } else {
                app
            }
        });
        // half-sent and idle connections are closed, as on weft serve's ports
        weft_serve::listen::serve(
            listener,
            app,
            std::time::Duration::from_millis(read_timeout),
            connections,
            async move {
                weft_serve::shutdown_signal().await;
                let _ = closing_tx.send(true);
            },
        )
        .await
        .map_err(|e| e.to_string())
    })
}

/// `GET /api/models`: every registered version, as `weft models list --json` prints them.
async fn models(
    registry: std::sync::Arc<std::sync::Mutex<weft_tune::registry::ModelRegistry>>,
) -> axum::response::Response {
    let listed = tokio::task::spawn_blocking(move || {
        let mut registry = registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        registry.refresh().map_err(|e| e.to_string())?;
        let listing = registry.list().map_err(|e| e.to_string())?;
        // the dashboard asks every few seconds: each row's warning once
        static WARNED: std::sync::Mutex<std::collections::BTreeSet<String>> =
            std::sync::Mutex::new(std::collections::BTreeSet::new());
        let mut warned = WARNED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for bad in &listing.unreadable {
            if warned.insert(bad.to_string()) {
                weft_core::errln!("weft ui: warning: {bad}");
            }
        }
        Ok(listing.versions)
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    weft_track::ui::json_reply(
        listed
            .map(|versions| serde_json::Value::Array(versions.iter().map(crate::models::version_json).collect()))
            .map_err(|e| (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e)),
    )
}
