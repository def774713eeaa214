//! `GET /api/runs/{id}/artifacts/{kind}`: the file of a run's artifact (its latest of that
//! kind), for the kinds that are one file: `trace` (a Chrome trace, for Perfetto or
//! `chrome://tracing`), `sample` (the generated text) and `tensorboard` (the event file). Only
//! paths the run recorded are served; a checkpoint (a folder) is not, nor a path that is a
//! symbolic link (swapped in after the run recorded a file there). The file is sent as it is
//! read, 64 KiB at a time, so a client that reads slowly holds a chunk of it, not the whole file.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{on_store, reply, run_id, segments, Failure, Segments, Shared};

/// The kinds served, with their content types.
const KINDS: [(&str, &str); 3] = [
    ("trace", "application/json"),
    ("sample", "text/plain; charset=utf-8"),
    ("tensorboard", "application/octet-stream"),
];

/// The largest file served, in bytes.
pub const MAX_BYTES: u64 = 256 << 20;

/// The bytes read from the file for each piece of the response.
const CHUNK: usize = 64 << 10;

pub(super) async fn artifact(State(store): State<Shared>, path: Segments<(String, String)>) -> Response {
    let (id, kind) = match segments(path) {
        Ok(both) => both,
        Err(f) => return reply(Err(f)),
    };
    match open(store, id, kind).await {
        Ok((file, content_type, name)) => (
            [
                (header::CONTENT_TYPE, content_type.to_string()),
                (header::CONTENT_DISPOSITION, format!("attachment; filename=\"{name}\"")),
            ],
            Body::from_stream(chunks(file)),
        )
            .into_response(),
        Err(f) => reply(Err(f)),
    }
}

/// The rest of `file`, [`CHUNK`] bytes at a time, each read on the blocking pool when the
/// response asks for it.
fn chunks(file: std::fs::File) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send {
    futures_util::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let read = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; CHUNK];
            let n = file.read(&mut buf)?;
            buf.truncate(n);
            Ok::<_, std::io::Error>((buf, file))
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        match read {
            Ok((buf, _)) if buf.is_empty() => None,
            Ok((buf, file)) => Some((Ok(Bytes::from(buf)), Some(file))),
            Err(e) => Some((Err(e), None)),
        }
    })
}

/// `name` as the quoted `filename` of a `Content-Disposition` header: printable ASCII but `"`
/// and `\` kept, everything else (control characters, which no header may hold, and non-ASCII)
/// as `_`.
fn header_file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

async fn open(store: Shared, id: String, kind: String) -> Result<(std::fs::File, &'static str, String), Failure> {
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
    let (file, path) = tokio::task::spawn_blocking(move || {
        let kind = kind_;
        let gone = |e: std::io::Error| {
            Failure(
                StatusCode::NOT_FOUND,
                format!("run {id}'s {kind}: {}: {e}", path.display()),
            )
        };
        let not_a_file = || {
            Failure(
                StatusCode::NOT_FOUND,
                format!("run {id}'s {kind}: {} is not a file", path.display()),
            )
        };
        let found = std::fs::symlink_metadata(&path).map_err(gone)?.file_type();
        if found.is_symlink() {
            return Err(Failure(
                StatusCode::NOT_FOUND,
                format!(
                    "run {id}'s {kind}: {} is a symbolic link, not the file the run wrote",
                    path.display()
                ),
            ));
        }
        // a FIFO or a device is refused before it is opened (opening a FIFO waits for a
        // writer, forever); one swapped in after this look opens without waiting, and is
        // refused below
        if !found.is_file() {
            return Err(not_a_file());
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            // opens a FIFO without waiting for a writer; changes nothing for a regular file
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(gone)?;
        let meta = file.metadata().map_err(gone)?;
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
        Ok((file, path))
    })
    .await
    .unwrap_or_else(|e| Err(Failure(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())))?;
    let name = path
        .file_name()
        .map(|n| header_file_name(&n.to_string_lossy()))
        .unwrap_or_else(|| kind.clone());
    Ok((file, content_type, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_in_the_header_are_printable_ascii() {
        assert_eq!(header_file_name("trace.json"), "trace.json");
        assert_eq!(header_file_name("a b.json"), "a b.json");
        assert_eq!(header_file_name("evil\nname\r.json"), "evil_name_.json");
        assert_eq!(header_file_name("q\"u\\o\u{7f}é.txt"), "q_u_o__.txt");
        for name in ["x\ny", "\u{0}", "é"] {
            let value = format!("attachment; filename=\"{}\"", header_file_name(name));
            assert!(axum::http::HeaderValue::from_str(&value).is_ok(), "{name:?}");
        }
    }
}
