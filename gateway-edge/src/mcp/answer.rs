//! What the gateway core answers a request with ([`Answer`]), its own JSON-RPC errors
//! ([`RpcError`]), and how the invocation log names each outcome. The one conversion from a
//! gateway error to a JSON-RPC error response is [`Answer::into_response`].
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::mcp::Outcome;
use crate::mcp::jsonrpc::{self, TOOL_DISABLED, UPSTREAM_TIMEOUT, UPSTREAM_UNAVAILABLE};
use crate::mcp::upstream::UpstreamError;

/// A JSON-RPC error produced by the gateway itself (codes in [`jsonrpc`]).
#[derive(Debug)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    /// The error's `data` member, e.g. `{"server": …}` for -32001.
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), data: None }
    }

    pub(super) fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// How the invocation log records this error.
    pub(super) fn outcome(&self) -> Outcome {
        match self.code {
            TOOL_DISABLED => Outcome::Disabled,
            UPSTREAM_TIMEOUT => Outcome::Timeout,
            UPSTREAM_UNAVAILABLE => Outcome::Unreachable,
            _ => Outcome::Invalid,
        }
    }
}

impl From<UpstreamError> for RpcError {
    fn from(e: UpstreamError) -> Self {
        match &e {
            UpstreamError::Timeout { server, ms } => {
                RpcError::new(UPSTREAM_TIMEOUT, e.to_string()).with_data(json!({"server": server, "timeout_ms": ms}))
            }
            UpstreamError::Start { server, .. }
            | UpstreamError::Closed { server, .. }
            | UpstreamError::Stopped { server, .. } => {
                RpcError::new(UPSTREAM_UNAVAILABLE, e.to_string()).with_data(json!({"server": server}))
            }
        }
    }
}

/// What a handled request produced: a raw result or an error (upstream errors stay raw).
pub enum Answer {
    Result(Box<RawValue>),
    UpstreamError(Box<RawValue>),
    Error(RpcError),
    /// The client cancelled the request (`notifications/cancelled`) while it was in flight.
    /// MCP (basic/utilities/cancellation): the receiver SHOULD NOT answer it, so the `/mcp`
    /// stream sends nothing; an HTTP POST, which must get a response, gets -32800.
    Cancelled,
}

impl Answer {
    /// A result from a JSON value the gateway built itself.
    pub fn ok(v: Value) -> Self {
        Answer::Result(RawValue::from_string(v.to_string()).expect("json"))
    }

    /// The JSON-RPC response text for downstream request `id` (raw).
    pub fn into_response(self, id: &RawValue) -> String {
        match self {
            Answer::Result(r) => format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{}}}", id.get(), r.get()),
            Answer::UpstreamError(e) => format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"error\":{}}}", id.get(), e.get()),
            Answer::Error(e) => {
                let id: Value = serde_json::from_str(id.get()).unwrap_or(Value::Null);
                jsonrpc::error_object(id, e.code, &e.message, e.data).to_string()
            }
            Answer::Cancelled => {
                let id: Value = serde_json::from_str(id.get()).unwrap_or(Value::Null);
                jsonrpc::error_object(id, jsonrpc::REQUEST_CANCELLED, "Request cancelled by the client", None)
                    .to_string()
            }
        }
    }

    /// How the invocation log records this answer.
    pub(super) fn outcome(&self) -> Outcome {
        match self {
            Answer::Result(r) if is_tool_error(r) => Outcome::UpstreamError,
            Answer::Result(_) => Outcome::Ok,
            Answer::UpstreamError(e) if is_cancellation(e) => Outcome::Cancelled,
            Answer::UpstreamError(_) => Outcome::UpstreamError,
            Answer::Error(e) => e.outcome(),
            Answer::Cancelled => Outcome::Cancelled,
        }
    }
}

/// Whether an upstream error is the "request cancelled" error (-32800, as LSP and MCP SDKs use
/// it; also what the gateway answers a request its client cancelled).
fn is_cancellation(error: &RawValue) -> bool {
    error.get().contains("-32800")
        && serde_json::from_str::<Value>(error.get())
            .is_ok_and(|v| v.get("code").and_then(Value::as_i64) == Some(crate::mcp::jsonrpc::REQUEST_CANCELLED))
}

/// Whether a tool result reports a tool-level error (`isError: true`); cheap on the common path.
fn is_tool_error(result: &RawValue) -> bool {
    let t = result.get();
    t.contains("\"isError\"")
        && serde_json::from_str::<Value>(t).is_ok_and(|v| v.get("isError").and_then(Value::as_bool) == Some(true))
}

/// A raw JSON-RPC error object `{code, message}` (what the gateway answers an upstream with).
pub(super) fn error_raw(code: i64, message: &str) -> Box<RawValue> {
    RawValue::from_string(json!({"code": code, "message": message}).to_string()).expect("json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn answers_become_responses_with_the_request_s_id() {
        let id = raw("\"a-1\"");
        assert_eq!(Answer::ok(json!({"x": 1})).into_response(&id), r#"{"jsonrpc":"2.0","id":"a-1","result":{"x":1}}"#);
        let up = Answer::UpstreamError(raw(r#"{"code": -5, "message":"raw"}"#)).into_response(&id);
        assert_eq!(up, r#"{"jsonrpc":"2.0","id":"a-1","error":{"code": -5, "message":"raw"}}"#, "verbatim");
        let e: Value = serde_json::from_str(&Answer::Cancelled.into_response(&raw("7"))).unwrap();
        assert_eq!((e["id"].clone(), e["error"]["code"].clone()), (json!(7), json!(-32800)));
    }

    #[test]
    fn outcomes_name_what_happened() {
        assert_eq!(Answer::ok(json!({"content": []})).outcome().as_str(), "ok");
        assert_eq!(Answer::ok(json!({"content": [], "isError": true})).outcome().as_str(), "upstream_error");
        assert_eq!(Answer::UpstreamError(raw(r#"{"code":-32800,"message":"c"}"#)).outcome().as_str(), "cancelled");
        assert_eq!(
            Answer::UpstreamError(raw(r#"{"code":-1,"message":"-32800"}"#)).outcome().as_str(),
            "upstream_error"
        );
        let timeout: RpcError = UpstreamError::Timeout { server: "s".into(), ms: 5 }.into();
        assert_eq!(
            (timeout.code, timeout.data.clone()),
            (UPSTREAM_TIMEOUT, Some(json!({"server": "s", "timeout_ms": 5})))
        );
        assert_eq!(Answer::Error(timeout).outcome().as_str(), "timeout");
        assert_eq!(Answer::Error(RpcError::new(TOOL_DISABLED, "off")).outcome().as_str(), "disabled");
        assert_eq!(Answer::Error(RpcError::new(jsonrpc::INVALID_PARAMS, "?")).outcome().as_str(), "invalid");
    }
}
