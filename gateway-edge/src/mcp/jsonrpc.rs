//! JSON-RPC 2.0 error objects as `/mcp` returns them, with Coffer's error codes (from `coffer-types`).
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

// The codes are defined once, in coffer-types, for the daemon, the CLI and the shim.
pub use coffer_types::jsonrpc::{
    INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR, REQUEST_CANCELLED, TOOL_DISABLED,
    UPSTREAM_TIMEOUT, UPSTREAM_UNAVAILABLE,
};

/// The error for a message text that could not be decoded as one JSON-RPC message: -32700 with
/// a null id when it is not JSON; -32600 with its id (when one can be found) when it is JSON of
/// the wrong shape, e.g. a member given twice. Returns (id, code, message).
pub fn undecodable(text: &[u8], e: &serde_json::Error) -> (Value, i64, String) {
    match e.classify() {
        serde_json::error::Category::Data => {
            (coffer_runtime::ndjson::sniff_id(text), INVALID_REQUEST, format!("Invalid Request: {e}"))
        }
        _ => (Value::Null, PARSE_ERROR, format!("Parse error: {e}")),
    }
}

/// A JSON-RPC error response object for request `id` (`null` when unknown).
pub fn error_object(id: Value, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut err = json!({"code": code, "message": message});
    if let Some(d) = data {
        err["data"] = d;
    }
    json!({"jsonrpc": "2.0", "id": id, "error": err})
}

/// An HTTP response with `status` whose body is a JSON-RPC error with `id: null`.
pub fn http_error(status: StatusCode, code: i64, message: &str) -> Response {
    http_error_for(status, Value::Null, code, message)
}

/// An HTTP response with `status` whose body is a JSON-RPC error for request `id`.
pub fn http_error_for(status: StatusCode, id: Value, code: i64, message: &str) -> Response {
    let body = error_object(id, code, message, None);
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
