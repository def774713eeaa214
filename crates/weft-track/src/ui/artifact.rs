//! `GET /api/runs/{id}/artifacts/{kind}`: the file of a run's artifact (its latest of that
//! kind), for the kinds that are one file: `trace` (a Chrome trace, for Perfetto or
//! `chrome://tracing`), `sample` (the generated text) and `tensorboard` (the event file). Only
//! paths the run recorded are served; a checkpoint (a folder) is not.

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{on_store, reply, run_id, Failure, Shared};

/// The kinds served, with their content types.
const KINDS: [(&str, &str); 3] = [
    ("trace", "application/json"),
    ("sample", "text/plain; charset=utf-8"),
    ("tensorboard", "application/octet-stream"),
];

/// The largest file served, in bytes.
pub const MAX_BYTES: u64 = 256 << 20;

pub(super) async fn artifact(State(store): State<Shared>, UrlPath((id, kind)): UrlPath<(String, String)>) -> Response {
    match read(store, id, kind).await {
        Ok((bytes, content_type, name)) => (
            [
                (header::CONTENT_TYPE, content_type.to_string()),
                (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}\"")),
            ],
            bytes,
        )
            .into_response(),
        Err(f) => reply(Err(f)),
    }
}

async fn read(store: Shared, id: String, kind: String) -> Result<(Vec<u8>, &'static str, String), Failure> {
    let Some(&(_, content_type)) = KINDS.iter().find(|(k, _)| *k == kind) else {
        let served: Vec<&str> = KINDS.iter().map(|(k, _)| *k).collect();
        return Err(Failure(
            StatusCode::NOT_FOUND,
            format!("artifact kind {kind:?}: served are {}", served.join(", ")),
        ));
    };
    let id = run_id(&id)?;
    let detail = on_store(&store, move |s| Ok(s.run_detail(id)?)).await?;
    let path = detail
        .artifacts
        .iter()
        .rev()
        .find(|(k, _)| *k == kind)
        .map(|(_, p)| std::path::PathBuf::from(p))
        .ok_or_else(|| Failure(StatusCode::NOT_FOUND, format!("run {id} has no {kind} artifact")))?;
    // the file is read off the store's lock, on the blocking pool
    let kind_ = kind.clone();
    let (bytes, path) = tokio::task::spawn_blocking(move || {
        let kind = kind_;
        let gone = |e: std::io::Error| {
            Failure(
                StatusCode::NOT_FOUND,
                format!("run {id}'s {kind}: {}: {e}", path.display()),
            )
        };
        let meta = std::fs::metadata(&path).map_err(gone)?;
        if !meta.is_file() {
            return Err(Failure(
                StatusCode::NOT_FOUND,
                format!("run {id}'s {kind}: {} is not a file", path.display()),
            ));
        }
        if meta.len() > MAX_BYTES {
            return Err(Failure(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "run {id}'s {kind}: {} is {} bytes, more than the {MAX_BYTES} served",
                    path.display(),
                    meta.len()
                ),
            ));
        }
        let bytes = std::fs::read(&path).map_err(gone)?;
        Ok((bytes, path))
    })
    .await
    .unwrap_or_else(|e| Err(Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().replace(['"', '\\'], "_"))
        .unwrap_or_else(|| kind.clone());
    Ok((bytes, content_type, name))
}
