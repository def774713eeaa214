//! Errors the endpoints answer with: a status and `{"error": "..."}` naming the cause (the
//! shape KServe's and TorchServe's clients read), or on `/v1/*` OpenAI's `{"error": {"message",
//! "type", "param", "code"}}` (the shape the `openai` client reads).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::json::Checked;

/// A failed request: its HTTP status and a message naming the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

/// The longest message an error keeps, in bytes: past it the message is cut (its JSON, even
/// with every character escaped, stays within the [`MAX_ERROR_BODY`] that OpenAI's rewrite
/// reads).
pub const MAX_MESSAGE_BYTES: usize = 8 << 10;

/// The most characters of a client's value (a model name, a field) an error message echoes.
pub const MAX_ECHO_CHARS: usize = 80;

/// `value` quoted as `{:?}` does, its first [`MAX_ECHO_CHARS`] characters only (then `...` and
/// its length): a name sent with 100,000 characters is not sent back whole.
pub fn echo(value: &str) -> String {
    match value.char_indices().nth(MAX_ECHO_CHARS) {
        None => format!("{value:?}"),
        Some((end, _)) => format!("{:?}... ({} bytes)", &value[..end], value.len()),
    }
}

/// `message` cut to at most [`MAX_MESSAGE_BYTES`] (on a character boundary).
fn cut(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES - 16;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("... (cut)");
    }
    message
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: cut(message.into()),
        }
    }

    /// 400: the request is well-formed HTTP but its content is wrong.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404: no such model, version or path.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 500: the model failed on an input that passed the checks.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = json_response(self.status, &json!({ "error": self.message }));
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// OpenAI's error object for a refused request: `type` and `code` from the status (and, for a
/// 404, from whether a model or an endpoint is unknown), `message` weft's cause.
pub fn openai_error(status: StatusCode, message: &str) -> Value {
    let unknown_model = message.starts_with("unknown model") || message.starts_with("unknown version");
    let (kind, code) = match status.as_u16() {
        401 => ("authentication_error", "invalid_api_key"),
        404 if unknown_model => ("invalid_request_error", "model_not_found"),
        404 => ("invalid_request_error", "not_found"),
        413 => ("invalid_request_error", "request_too_large"),
        503 => ("server_error", "overloaded"),
        400..=499 => ("invalid_request_error", "invalid_request"),
        _ => ("server_error", "internal_error"),
    };
    json!({ "error": { "message": message, "type": kind, "param": null, "code": code } })
}

/// The longest error body [`openai_errors`] rewrites, in bytes (weft's are far shorter).
const MAX_ERROR_BODY: usize = 1 << 16;

/// Rewrites the `{"error": "..."}` of a refused request into OpenAI's error object, keeping the
/// status and headers (`WWW-Authenticate`, `Retry-After`); other responses pass unchanged.
pub async fn openai_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_ERROR_BODY).await else {
        return openai_response(status, "the error could not be read");
    };
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string));
    let Some(message) = message else {
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    let rewritten = openai_response(status, &message);
    let (new_parts, body) = rewritten.into_parts();
    parts.headers.extend(new_parts.headers);
    Response::from_parts(parts, body)
}

/// OpenAI's error object for `status` and `message` as a response.
pub fn openai_response(status: StatusCode, message: &str) -> Response {
    let mut response = json_response(status, &openai_error(status, message));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// A refused request to `path` as a response: `{"error": message}`, or OpenAI's error object on
/// `/v1/*` (503s with `Retry-After`).
pub fn refusal(path: &str, status: StatusCode, message: impl Into<String>) -> Response {
    let e = ApiError::new(status, message);
    if path.starts_with("/v1/") {
        openai_response(e.status, &e.message)
    } else {
        e.into_response()
    }
}

/// The longest body of a refusal that [`json_errors`] reads as its message, in bytes.
const MAX_PLAIN_ERROR: usize = 4 << 10;

/// The middleware that gives every refusal a JSON body: a 4xx or 5xx answered without one (a
/// method the route does not take, 405 with an empty body; a path axum's extractor cannot read,
/// 400 in plain text; an unknown path on a port without a fallback, 404) gets `{"error": ...}`
/// (OpenAI's shape on `/v1/*`) holding the text it had or a message for its status; its headers
/// stay (and a 405's `Allow`, which axum adds outside this layer). JSON answers pass unchanged.
pub async fn json_errors(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_PLAIN_ERROR)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if status == StatusCode::METHOD_NOT_ALLOWED {
        // the methods it takes are in the `Allow` header, which axum adds after this layer
        format!(
            "method {method} is not allowed on {} (the Allow header names those it takes)",
            echo(&path)
        )
    } else if text.is_empty() {
        let reason = status.canonical_reason().unwrap_or("refused");
        format!("{reason}: {method} {}", echo(&path))
    } else {
        text
    };
    let rewritten = refusal(&path, status, message);
    let (new_parts, body) = rewritten.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.extend(new_parts.headers);
    Response::from_parts(parts, body)
}

/// `value` as a JSON response with `status`.
pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        value.to_string(),
    )
        .into_response()
}

/// The request body parsed as a `T`: 413 when it is over `limit` bytes, 400 naming the cause
/// when it is not JSON or not a `T` (a missing field, a value of the wrong type).
pub fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(status, format!("the request body is over the limit of {limit} bytes"))
        } else {
            ApiError::new(status, format!("the request body could not be read: {rejection}"))
        }
    })?;
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        // not an object: say whether it is JSON at all (read without keeping anything)
        return Err(match serde_json::from_slice::<Checked>(&bytes) {
            Ok(_) => ApiError::bad_request("the request body must be a JSON object"),
            Err(e) => ApiError::bad_request(format!("the request body is not valid JSON: {e}")),
        });
    }
    parse_json(&bytes).map_err(|e| match e {
        JsonError::Syntax(e) => ApiError::bad_request(format!("the request body is not valid JSON: {e}")),
        JsonError::Data { path, message } => {
            ApiError::bad_request(format!("invalid request at {path}: {}", plain(&message)))
        }
    })
}

/// Why [`parse_json`] failed.
#[derive(Debug)]
pub enum JsonError {
    /// Not JSON (or cut short).
    Syntax(serde_json::Error),
    /// JSON, but not a `T`: where (`inputs[0].data[3]`, `.` for the whole) and serde's message
    /// without its line and column.
    Data { path: String, message: String },
}

/// `bytes` read as a `T` straight from the bytes (no `serde_json::Value` of the whole body is
/// built: crate::json keeps the large fields small), nothing after it but whitespace.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, JsonError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let classify = |path: String, e: serde_json::Error| match e.classify() {
        serde_json::error::Category::Data => {
            let mut message = e.to_string();
            let at = format!(" at line {} column {}", e.line(), e.column());
            if message.ends_with(&at) {
                message.truncate(message.len() - at.len());
            }
            JsonError::Data { path, message }
        }
        // serde_json reads a struct from an array's first items, then finds more of them and
        // calls that a syntax error (trailing characters); the body is JSON, just not a `T`.
        // Checked, not IgnoredAny: IgnoredAny passes what is not JSON (a number past f64's
        // range, a lone surrogate escape, a string that is not UTF-8), whose own error is meant
        _ if e.to_string().starts_with("trailing characters") && serde_json::from_slice::<Checked>(bytes).is_ok() => {
            JsonError::Data {
                path,
                message: "invalid length: expected fewer elements in array".to_string(),
            }
        }
        _ => JsonError::Syntax(e),
    };
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        classify(path, e.into_inner())
    })?;
    de.end().map_err(|e| classify(".".to_string(), e))?;
    Ok(value)
}

/// serde's message with weft's type names said as what the client must send: `expected
/// struct GenerateParameters` (or `... with 6 elements`, for an array) becomes `expected a JSON
/// object`.
fn plain(message: &str) -> String {
    // an array where an object goes: serde reads it as the fields in order and counts them
    if message.starts_with("invalid length")
        && (message.contains("expected struct ") || message.contains("expected fewer elements in array"))
    {
        return "expected a JSON object, not an array".to_string();
    }
    let Some(at) = message.find("expected struct ") else {
        return message.to_string();
    };
    let head = &message[..at];
    let rest = &message[at + "expected struct ".len()..];
    let name_end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    format!("{head}expected a JSON object{}", &rest[name_end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_no_internal_type_and_echo_little() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Inner {
            a: Option<u64>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Outer {
            p: Inner,
        }
        for (body, want) in [
            (
                r#"{"p": [1, 2]}"#,
                "invalid request at p: expected a JSON object, not an array",
            ),
            (
                r#"{"p": 3}"#,
                "invalid request at p: invalid type: integer `3`, expected a JSON object",
            ),
        ] {
            let e = parse_body::<Outer>(Ok(Bytes::from(body)), 100).unwrap_err();
            assert_eq!(e.message, want);
        }
        // read straight from the bytes: what follows the object, and bodies that are not one
        for (body, want) in [
            (
                r#"{"p": {}} x"#,
                "the request body is not valid JSON: trailing characters",
            ),
            (
                r#"{"p": {"a": 1"#,
                "the request body is not valid JSON: EOF while parsing",
            ),
            (" [1, 2]", "the request body must be a JSON object"),
            ("\"p\"", "the request body must be a JSON object"),
            ("[1, 2", "the request body is not valid JSON"),
            (
                r#"{"p": {"a": -1}}"#,
                "invalid request at p.a: invalid value: integer `-1`",
            ),
        ] {
            let e = parse_body::<Outer>(Ok(Bytes::from(body)), 100).unwrap_err();
            assert!(e.message.starts_with(want), "{body}: {}", e.message);
            assert!(!e.message.contains("struct"), "{}", e.message);
        }
        let long = "m".repeat(100_000);
        let shown = echo(&long);
        assert!(shown.len() < 120 && shown.ends_with("(100000 bytes)"), "{shown}");
        assert_eq!(echo("gpt"), "\"gpt\"");
        let e = ApiError::bad_request("é".repeat(100_000));
        assert!(e.message.len() <= MAX_MESSAGE_BYTES && e.message.ends_with("(cut)"));
    }

    #[test]
    fn a_body_that_is_not_json_is_named_for_its_own_cause_not_an_array() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Params {
            temperature: Option<f64>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Body {
            prompt: Option<crate::json::StringOrList>,
            parameters: Option<Params>,
            data: Option<crate::json::TensorData>,
        }
        let bodies: [(&[u8], &str); 7] = [
            (
                br#"{"parameters": {"temperature": 1e400}}"#,
                "number out of range at line 1 column",
            ),
            (br#"{"data": [20, 43, 1e400]}"#, "number out of range at line 1 column"),
            (br#"{"prompt": "\ud800"}"#, "hex escape at line 1 column"),
            (
                b"{\"prompt\": \"\xff\xfe\"}",
                "invalid unicode code point at line 1 column",
            ),
            (
                b"{\"prompt\": \"a\tb\"}",
                "control character (\\u0000-\\u001F) found while parsing a string",
            ),
            (br#"{"prompt": "ab",}"#, "trailing comma at line 1 column"),
            // past the items a list keeps (8), what is skipped is checked too
            (
                br#"{"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 1e400]}"#,
                "number out of range",
            ),
        ];
        for (body, cause) in bodies {
            let e = parse_body::<Body>(Ok(Bytes::copy_from_slice(body)), 1000).unwrap_err();
            let shown = String::from_utf8_lossy(body);
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(
                e.message.starts_with("the request body is not valid JSON: ") && e.message.contains(cause),
                "{shown}: {}",
                e.message
            );
            assert!(!e.message.contains("array"), "{shown}: {}", e.message);
        }
        // an array where an object goes is still said so, whatever follows
        let e = parse_body::<Body>(Ok(Bytes::from(r#"{"parameters": [1, 2], "prompt": "a"}"#)), 1000).unwrap_err();
        assert_eq!(
            e.message,
            "invalid request at parameters: expected a JSON object, not an array"
        );
        // and a body that is not an object is named for what is wrong with it
        let e = parse_body::<Body>(Ok(Bytes::from("[1e400]")), 1000).unwrap_err();
        assert!(e.message.contains("number out of range"), "{}", e.message);
    }

    #[test]
    fn openai_errors_have_type_and_code() {
        let e = openai_error(StatusCode::NOT_FOUND, "unknown model \"x\"");
        assert_eq!(e["error"]["code"], "model_not_found");
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert_eq!(e["error"]["message"], "unknown model \"x\"");
        assert!(e["error"]["param"].is_null());
        assert_eq!(
            openai_error(StatusCode::NOT_FOUND, "no such endpoint")["error"]["code"],
            "not_found"
        );
        assert_eq!(
            openai_error(StatusCode::UNAUTHORIZED, "m")["error"]["type"],
            "authentication_error"
        );
        assert_eq!(
            openai_error(StatusCode::SERVICE_UNAVAILABLE, "m")["error"]["code"],
            "overloaded"
        );
        assert_eq!(
            openai_error(StatusCode::INTERNAL_SERVER_ERROR, "m")["error"]["type"],
            "server_error"
        );
    }
}
