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

/// A failed request: its HTTP status and a message naming the cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
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
    json_response(status, &openai_error(status, message))
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
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        ApiError::bad_request(format!("invalid request at {path}: {}", e.inner()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
