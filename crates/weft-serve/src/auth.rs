//! Bearer tokens: reading the token file, comparing in constant time, and the middleware that
//! answers 401 to a request without the token.

use std::path::Path;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::AppState;

/// The fewest bytes a token may have: shorter ones are guessable.
pub const MIN_TOKEN_BYTES: usize = 16;

/// The largest token file read, in bytes: a token is one short line.
pub const MAX_TOKEN_FILE_BYTES: usize = 4 << 10;

/// A secret that requests present as `Authorization: Bearer <token>`.
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A token from its text: surrounding whitespace is dropped; at least [`MIN_TOKEN_BYTES`]
    /// bytes, printable ASCII only (it travels in an HTTP header).
    pub fn new(text: &str) -> Result<Token, String> {
        let t = text.trim();
        if t.len() < MIN_TOKEN_BYTES {
            return Err(format!(
                "the token has {} bytes; give at least {MIN_TOKEN_BYTES}",
                t.len()
            ));
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the token must be printable ASCII without spaces".into());
        }
        Ok(Token(t.as_bytes().to_vec()))
    }

    /// The token in the file at `path` (its whole content, trimmed): a regular file (not a
    /// device such as `/dev/zero`, a pipe or a folder) of at most [`MAX_TOKEN_FILE_BYTES`],
    /// read through that cap.
    pub fn from_file(path: &Path) -> Result<Token, String> {
        use std::io::Read;
        let fail = |e: String| format!("--token-file {}: {e}", path.display());
        // looked at before it is opened: opening a pipe would wait for a writer
        let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
        if !meta.is_file() {
            return Err(fail("not a regular file (a token file holds one short line)".into()));
        }
        let file = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
        // what was opened, in case the path changed since
        let opened = file.metadata().map_err(|e| fail(e.to_string()))?;
        if !opened.is_file() {
            return Err(fail("not a regular file (a token file holds one short line)".into()));
        }
        let mut bytes = Vec::new();
        file.take(MAX_TOKEN_FILE_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| fail(e.to_string()))?;
        if bytes.len() > MAX_TOKEN_FILE_BYTES {
            return Err(fail(format!(
                "more than {MAX_TOKEN_FILE_BYTES} bytes; a token file holds one token"
            )));
        }
        let text = String::from_utf8(bytes).map_err(|_| fail("not UTF-8 text".into()))?;
        Token::new(&text).map_err(fail)
    }

    /// Whether `given` is the token, in time that depends only on the lengths.
    pub fn matches(&self, given: &[u8]) -> bool {
        let mut diff = u8::from(given.len() != self.0.len());
        for (i, &want) in self.0.iter().enumerate() {
            diff |= want ^ given.get(i).copied().unwrap_or(!want);
        }
        std::hint::black_box(diff) == 0
    }
}

/// Passes the request on when it carries `Authorization: Bearer <token>`; 401 otherwise.
pub async fn require_token(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(token) = state.token.as_ref() else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes().strip_prefix(b"Bearer ").unwrap_or(b""));
    let refused = match given {
        None => "missing Authorization header: send `Authorization: Bearer <token>`",
        Some(t) if token.matches(t) => return next.run(request).await,
        Some(_) => "wrong token in the Authorization header (expected `Bearer <token>`)",
    };
    let mut response = ApiError::new(StatusCode::UNAUTHORIZED, refused).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_matches() {
        let t = Token::new("  0123456789abcdef\n").unwrap();
        assert!(t.matches(b"0123456789abcdef"));
        assert!(!t.matches(b"0123456789abcdeF"));
        assert!(!t.matches(b"0123456789abcde"));
        assert!(!t.matches(b"0123456789abcdef0"));
        assert!(!t.matches(b""));
        assert!(Token::new("short").is_err());
        assert!(Token::new("0123456789 abcdef").is_err());
    }

    #[test]
    fn token_files_are_short_regular_files() {
        let dir = std::env::temp_dir().join(format!("weft-serve-token-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("ok");
        std::fs::write(&ok, "0123456789abcdef\n").unwrap();
        assert!(Token::from_file(&ok).unwrap().matches(b"0123456789abcdef"));
        // a device that never ends, a folder, and a file past the cap: refused without reading
        // them whole
        for (path, want) in [
            (Path::new("/dev/zero"), "not a regular file"),
            (dir.as_path(), "not a regular file"),
        ] {
            let e = Token::from_file(path).unwrap_err();
            assert!(e.contains(want), "{}: {e}", path.display());
        }
        // a pipe: opening it would wait for a writer
        let fifo = dir.join("fifo");
        if std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success())
        {
            let e = Token::from_file(&fifo).unwrap_err();
            assert!(e.contains("not a regular file"), "{e}");
        }
        let big = dir.join("big");
        std::fs::write(&big, "a".repeat(MAX_TOKEN_FILE_BYTES + 1)).unwrap();
        let e = Token::from_file(&big).unwrap_err();
        assert!(e.contains("more than 4096 bytes"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
