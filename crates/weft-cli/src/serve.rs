//! `weft serve`: serves checkpoints from a model store over HTTP (docs/serving.md).

use std::path::PathBuf;
use std::sync::Arc;

use weft_serve::{AppState, Limits, ModelSpec, Registry, Token};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The folder models are served from: every `--model` path lies inside it.
    #[arg(long, value_name = "DIR")]
    model_store: PathBuf,
    /// A model to serve: NAME=PATH[:VERSION], PATH a checkpoint folder (or a checkpoint
    /// directory: its newest checkpoint) relative to the model store; VERSION defaults to 1.
    /// Repeat for more models or versions (a name's first version is its default).
    #[arg(long = "model", value_name = "NAME=PATH[:VERSION]")]
    models: Vec<String>,
    /// The address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// A file holding the bearer token (at least 16 printable characters) that requests send as
    /// `Authorization: Bearer TOKEN`.
    #[arg(long, value_name = "F")]
    token_file: Option<PathBuf>,
    /// Require the token on the inference API too (the health checks stay open).
    #[arg(long, requires = "token_file")]
    inference_token: bool,
    /// The largest request body, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().body_bytes)]
    max_body_bytes: usize,
    /// The most new tokens one generation request may ask for.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_tokens)]
    max_tokens: usize,
}

pub fn run(args: ServeArgs) -> Result<(), String> {
    if !args.model_store.is_dir() {
        return Err(format!("--model-store {}: not a folder", args.model_store.display()));
    }
    let token = args.token_file.as_deref().map(Token::from_file).transpose()?;
    let limits = Limits {
        body_bytes: args.max_body_bytes,
        max_tokens: args.max_tokens,
        ..Limits::default()
    };
    let mut registry = Registry::default();
    for raw in &args.models {
        let spec: ModelSpec = raw.parse()?;
        let served = weft_serve::registry::load(&args.model_store, &spec, limits.queue)?;
        weft_core::errln!(
            "weft serve: loaded model {} version {} ({}) from {}",
            spec.name,
            spec.version,
            served.kind,
            spec.path.display()
        );
        registry.add(served)?;
    }
    if registry.is_empty() {
        weft_core::errln!("weft serve: no --model given; serving the health checks only");
    }
    let loopback = matches!(args.host.as_str(), "127.0.0.1" | "::1" | "localhost");
    if !loopback && !args.inference_token {
        weft_core::errln!(
            "weft serve: warning: listening on {} without --inference-token: anyone who reaches it can run the models",
            args.host
        );
    }
    let state = AppState {
        registry: Arc::new(registry),
        limits,
        token: token.map(Arc::new),
        protect_inference: args.inference_token,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .map_err(|e| format!("cannot listen on {}:{}: {e}", args.host, args.port))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        crate::print_out(&format!("weft serve: listening on http://{addr}\n"))?;
        weft_serve::serve(listener, state, weft_serve::shutdown_signal())
            .await
            .map_err(|e| format!("serving on {addr}: {e}"))
    })
}
