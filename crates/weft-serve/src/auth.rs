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

    /// The token in the file at `path` (its whole content, trimmed).
    pub fn from_file(path: &Path) -> Result<Token, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("--token-file {}: {e}", path.display()))?;
        Token::new(&text).map_err(|e| format!("--token-file {}: {e}", path.display()))
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
}
