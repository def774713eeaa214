//! The deploy step: promotes a registered version (as `weft models promote` does) and, with a
//! `server`, makes a running `weft serve` answer with it through its management API
//! (docs/serving.md), waiting until the server reports it as the model's default version.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use reqwest::StatusCode;
use weft_tune::pipeline::refs::{output, parse_output};
use weft_tune::pipeline::Deploy;
use weft_tune::registry::{ModelRegistry, ModelVersion, Stage};

use super::Context;

/// Promotes the version (`d.step`'s registration, or `d.version`) to `d.stage`; with a server,
/// tells it. The output: `model=N version=V stage=S` (and `server=URL`).
pub(super) fn deploy(ctx: &Context, d: &Deploy, outputs: &BTreeMap<String, String>) -> Result<String, String> {
    let version: i64 = match (&d.step, &d.version) {
        (Some(from), _) => {
            let out = outputs.get(from).map_or("", String::as_str);
            let pairs = parse_output(out);
            let model = pairs.get("model").map_or("", String::as_str);
            if model != d.model {
                return Err(format!(
                    "step {from:?} registered model {model:?} ({out:?}), not {:?}",
                    d.model
                ));
            }
            pairs
                .get("version")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("the output of step {from:?} ({out:?}) names no version"))?
        }
        (None, Some(v)) => v
            .trim()
            .parse()
            .ok()
            .filter(|v| *v >= 1)
            .ok_or_else(|| format!("`version` {v:?} is not a version (1, 2, ...)"))?,
        (None, None) => return Err("give `step` or `version`".into()),
    };
    let stage: Stage = d.stage.parse().map_err(|e: weft_tune::Error| e.to_string())?;
    let mut reg = ModelRegistry::open(&ctx.dir).map_err(|e| e.to_string())?;
    reg.promote(&d.model, version, stage).map_err(|e| e.to_string())?;
    let v = reg.version(&d.model, version).map_err(|e| e.to_string())?;
    let mut pairs = vec![
        ("model", d.model.clone()),
        ("version", version.to_string()),
        ("stage", d.stage.clone()),
    ];
    if let Some(server) = &d.server {
        tell(ctx, d, server.trim_end_matches('/'), &v)?;
        pairs.push(("server", server.clone()));
    }
    Ok(output(&pairs))
}

/// A management API call's failure, in one line.
fn failed(base: &str, what: &str, status: StatusCode, body: &str) -> String {
    let why = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.trim().replace('\n', " "));
    let hint = if status == StatusCode::UNAUTHORIZED {
        " (the token in token_file was refused)"
    } else {
        ""
    };
    format!("server {base}: {what}: {status}{hint}: {why}")
}

/// The version server `base` answers model `name` with (its default), `None` when it serves no
/// such model.
/// A failed look at a server: its message, and whether the server refused the token (which a
/// later try will not change).
struct Unserved {
    message: String,
    refused: bool,
}

fn served(client: &Client, base: &str, token: &str, name: &str) -> Result<Option<String>, Unserved> {
    let gone = |message: String| Unserved {
        message,
        refused: false,
    };
    let what = format!("GET /models/{name}");
    let r = client
        .get(format!("{base}/models/{name}"))
        .bearer_auth(token)
        .send()
        .map_err(|e| gone(format!("server {base}: {what}: {e}")))?;
    let status = r.status();
    let body = r.text().unwrap_or_default();
    match status {
        StatusCode::NOT_FOUND => Ok(None),
        StatusCode::OK => {
            let list: serde_json::Value =
                serde_json::from_str(&body).map_err(|e| gone(format!("server {base}: {what}: {e}")))?;
            Ok(list
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["isDefault"] == true)
                .and_then(|v| v["modelVersion"].as_str().map(str::to_string)))
        }
        s => Err(Unserved {
            message: failed(base, &what, s, &body),
            refused: s == StatusCode::UNAUTHORIZED,
        }),
    }
}

/// Makes server `base` answer model `v.name` with version `v.version`: with `model_store`,
/// registers the version's checkpoint folder (which must lie inside it) and makes it the
/// default; without, waits for a server that follows the registry to load it. Either way it
/// then waits (up to `d.timeout` seconds) until the server reports that version as the
/// model's default.
fn tell(ctx: &Context, d: &Deploy, base: &str, v: &ModelVersion) -> Result<(), String> {
    let token_file = ctx.root.join(d.token_file.as_deref().unwrap_or_default());
    // a token is short: a device or a FIFO named by mistake is refused, not read for ever
    let bytes = match weft_core::io::regular::read_capped(&token_file, 64 << 10) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Err(format!("`token_file` {}: no such file", token_file.display())),
        Err(e) => return Err(format!("`token_file` {e}")),
    };
    let token =
        String::from_utf8(bytes).map_err(|_| format!("`token_file` {}: not UTF-8 text", token_file.display()))?;
    let token = token.trim();
    let client = Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| format!("the HTTP client: {e}"))?;
    let (name, version) = (v.name.as_str(), v.version.to_string());
    if let Some(store) = &d.model_store {
        let store_dir = ctx.root.join(store);
        let store_dir = store_dir
            .canonicalize()
            .map_err(|e| format!("`model_store` {}: {e}", store_dir.display()))?;
        let rel = v.path.strip_prefix(&store_dir).map_err(|_| {
            format!(
                "model {name} version {version}'s checkpoint {} is not inside `model_store` {} (the server registers folders of its --model-store only)",
                v.path.display(),
                store_dir.display()
            )
        })?;
        let rel = rel.to_str().ok_or_else(|| format!("{}: not UTF-8", rel.display()))?;
        let mut url = reqwest::Url::parse(&format!("{base}/models")).map_err(|e| format!("`server` {base}: {e}"))?;
        url.query_pairs_mut()
            .append_pair("url", rel)
            .append_pair("model_name", name)
            .append_pair("version", &version);
        let what = "POST /models";
        let r = client
            .post(url)
            .bearer_auth(token)
            .send()
            .map_err(|e| format!("server {base}: {what}: {e}"))?;
        // 409: that version is served already (an earlier deploy)
        if !(r.status().is_success() || r.status() == StatusCode::CONFLICT) {
            let status = r.status();
            return Err(failed(base, what, status, &r.text().unwrap_or_default()));
        }
        let what = format!("PUT /models/{name}/{version}/set-default");
        let r = client
            .put(format!("{base}/models/{name}/{version}/set-default"))
            .bearer_auth(token)
            .send()
            .map_err(|e| format!("server {base}: {what}: {e}"))?;
        if !r.status().is_success() {
            let status = r.status();
            return Err(failed(base, &what, status, &r.text().unwrap_or_default()));
        }
    }
    let deadline = Instant::now() + Duration::from_secs_f64(d.timeout);
    let mut last;
    loop {
        last = match served(&client, base, token, name) {
            Ok(Some(now)) if now == version => return Ok(()),
            Ok(Some(now)) => format!("it answers with version {now}"),
            Ok(None) => format!("it serves no model {name}"),
            // a refused token will not be accepted later
            Err(e) if e.refused => return Err(e.message),
            Err(e) => e.message,
        };
        if Instant::now() >= deadline {
            break;
        }
        if let Some((sig, _)) = super::children::caught() {
            return Err(format!(
                "stopped by signal {sig} while waiting for the server to serve {name} version {version} ({last})"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let how = if d.model_store.is_some() {
        ""
    } else {
        " (a server started with `weft serve --registry` on this store follows promotions to production; for one started with --model-store, give `model_store`)"
    };
    Err(format!(
        "server {base} does not answer model {name} with version {version} after {} s: {last}{how}",
        d.timeout
    ))
}
