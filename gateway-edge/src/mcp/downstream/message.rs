//! Downstream JSON-RPC messages, independent of the transport that carried them (Streamable
//! HTTP in [`crate::mcp::downstream::http`], the `/mcp` stream in [`crate::mcp::downstream::stream`]): decoding and classifying
//! one message (JSON-RPC 2.0 §4–5 as MCP 2025-11-25 basic §messages restricts it), running a
//! batch on a session, and opening a session for `initialize`.
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::mcp::jsonrpc::{self, INVALID_REQUEST};
use crate::mcp::session::RequestCtx;
use crate::mcp::{Gateway, SUPPORTED_VERSIONS, Session};

/// The answer to a `server/discover` that carries neither a modern `MCP-Protocol-Version` nor
/// `_meta` (so it is no 2026-07-28 request): a legacy client gets what a legacy server gives.
pub const DISCOVER_NOT_FOUND: &str = "Method not found: server/discover is a 2026-07-28 method; send it with params._meta[\"io.modelcontextprotocol/protocolVersion\"] (and MCP-Protocol-Version over HTTP), or send initialize";

/// What Coffer tells a client's model about itself (`initialize` and `server/discover`).
pub const INSTRUCTIONS: &str = "Coffer aggregates the user's MCP servers. Tools are named <server>__<tool>; coffer__search_tools finds tools by keyword. coffer__search_knowledge searches the user's notes; coffer__remember, coffer__recall and coffer__forget keep durable facts; coffer__list_skills and coffer__load_skill give task instructions.";

/// The response to modern request `id` when its method needs no session (`server/discover`),
/// or `None`.
pub fn sessionless(method: &str, id: &RawValue) -> Option<String> {
    (method == "server/discover").then(|| {
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{}}}",
            id.get(),
            crate::mcp::downstream::era::discover_result(INSTRUCTIONS)
        )
    })
}

/// The response text of a modern request: results get `resultType` and, for lists and reads,
/// cache hints ([`crate::mcp::downstream::era::complete`]).
pub fn modern_response(answer: crate::mcp::session::Answer, method: &str, id: &RawValue) -> String {
    match answer {
        crate::mcp::session::Answer::Result(r) => {
            crate::mcp::session::Answer::Result(crate::mcp::downstream::era::complete(&r, method)).into_response(id)
        }
        other => other.into_response(id),
    }
}

/// A JSON-RPC message as received; everything but the routing fields stays raw.
#[derive(Deserialize)]
pub struct Incoming {
    jsonrpc: Option<Value>,
    /// `None` only when absent: a present `null` is kept (as raw `null`) so that it is refused
    /// (MCP: a request id "MUST NOT be null") rather than taken for a notification.
    #[serde(default, deserialize_with = "present")]
    id: Option<Box<RawValue>>,
    method: Option<Value>,
    params: Option<Box<RawValue>>,
    result: Option<Box<RawValue>>,
    error: Option<Box<RawValue>>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// One valid downstream message, by kind. Ids, params, results and errors stay raw JSON.
#[derive(Debug)]
pub enum Parsed {
    Request { id: Box<RawValue>, method: String, params: Option<Box<RawValue>> },
    Notification { method: String, params: Option<Box<RawValue>> },
    Response { id: Box<RawValue>, result: Option<Box<RawValue>>, error: Option<Box<RawValue>> },
}

/// Why a message text is not one valid JSON-RPC message: the error response's `id` (`null`
/// when unknown), code (-32700 or -32600) and message.
#[derive(Debug, PartialEq)]
pub struct Invalid {
    pub id: Value,
    pub code: i64,
    pub message: String,
}

/// Decodes and classifies one message text (not a batch).
///
/// # Errors
/// [`Invalid`]: -32700 when the text is not JSON, -32600 when it is JSON of the wrong shape
/// (see [`jsonrpc::undecodable`]) or fails [`classify`].
pub fn decode(text: &[u8]) -> Result<Parsed, Invalid> {
    let msg: Incoming = serde_json::from_slice(text).map_err(|e| {
        let (id, code, message) = jsonrpc::undecodable(text, &e);
        Invalid { id, code, message }
    })?;
    classify(msg).map_err(|(id, message)| Invalid { id, code: INVALID_REQUEST, message })
}

/// Validates the JSON-RPC envelope (`jsonrpc: "2.0"`, string `method`, string/number `id`).
///
/// # Errors
/// The error response's id and message (code -32600).
pub fn classify(m: Incoming) -> Result<Parsed, (Value, String)> {
    let id_value = || m.id.as_ref().and_then(|i| serde_json::from_str::<Value>(i.get()).ok()).unwrap_or(Value::Null);
    if m.jsonrpc.as_ref().and_then(Value::as_str) != Some("2.0") {
        return Err((id_value(), "Invalid Request: \"jsonrpc\" must be \"2.0\"".into()));
    }
    if let Some(id) = &m.id {
        let first = id.get().as_bytes().first().copied().unwrap_or(b'n');
        if !(first == b'"' || first == b'-' || first.is_ascii_digit()) {
            return Err((Value::Null, "Invalid Request: \"id\" must be a string or a number".into()));
        }
    }
    match (m.method, m.id) {
        (Some(Value::String(method)), Some(id)) => Ok(Parsed::Request { id, method, params: m.params }),
        (Some(Value::String(method)), None) => Ok(Parsed::Notification { method, params: m.params }),
        (Some(_), id) => Err((
            id.and_then(|i| serde_json::from_str(i.get()).ok()).unwrap_or(Value::Null),
            "Invalid Request: \"method\" must be a string".into(),
        )),
        (None, Some(id)) if m.result.is_some() || m.error.is_some() => {
            Ok(Parsed::Response { id, result: m.result, error: m.error })
        }
        (None, _) => Err((Value::Null, "Invalid Request: no \"method\"".into())),
    }
}

/// Why a session may not take a JSON-RPC batch (batching exists only in MCP 2025-03-26; it was
/// removed in 2025-06-18), or `None` when it may. `session` is the sender's, if it has one.
pub fn batch_refused(session: Option<&Session>) -> Option<String> {
    match session {
        Some(s) if s.protocol_version == "2025-03-26" => None,
        Some(s) => Some(format!(
            "JSON-RPC batches are not supported in protocol {}; only sessions that negotiated 2025-03-26 may send them",
            s.protocol_version
        )),
        None => Some("JSON-RPC batches need a 2025-03-26 session; send initialize alone first".into()),
    }
}

/// Runs the items of a JSON-RPC batch concurrently; returns the answers to its requests (and
/// the errors for its invalid items), in item order.
pub async fn batch_answers(session: &Arc<Session>, items: Vec<Box<RawValue>>) -> Vec<String> {
    let futs = items.into_iter().map(|raw| {
        let session = session.clone();
        async move {
            let msg: Incoming = match serde_json::from_str(raw.get()) {
                Ok(m) => m,
                Err(e) => {
                    return Some(
                        jsonrpc::error_object(Value::Null, INVALID_REQUEST, &format!("Invalid Request: {e}"), None)
                            .to_string(),
                    );
                }
            };
            match classify(msg) {
                Err((id, m)) => Some(jsonrpc::error_object(id, INVALID_REQUEST, &m, None).to_string()),
                Ok(Parsed::Request { id, method, params }) => {
                    let ctx = RequestCtx { id: Some(id.get().to_owned()), ..RequestCtx::default() };
                    Some(session.handle_request_ctx(&method, params.as_deref(), &ctx).await.into_response(&id))
                }
                Ok(Parsed::Notification { method, params }) => {
                    session.handle_notification(&method, params.as_deref()).await;
                    None
                }
                Ok(Parsed::Response { id, result, error }) => {
                    session.handle_response(&id, result, error).await;
                    None
                }
            }
        }
    });
    futures_util::future::join_all(futs).await.into_iter().flatten().collect()
}

/// Negotiates the protocol version of an `initialize` request (MCP 2025-11-25 lifecycle:
/// the client's version when supported, else our latest), creates its session, and returns it
/// with the JSON-RPC response text (Coffer answering as one server).
pub fn open_session(gateway: &Gateway, id: &RawValue, params: Option<&RawValue>) -> (Arc<Session>, String) {
    let params: Value = params.and_then(|p| serde_json::from_str(p.get()).ok()).unwrap_or_else(|| json!({}));
    let requested = params.get("protocolVersion").and_then(Value::as_str).unwrap_or("");
    let version = if SUPPORTED_VERSIONS.contains(&requested) { requested } else { SUPPORTED_VERSIONS[0] };
    let session = gateway.create_session(version, &params);
    let result = json!({
        "protocolVersion": version,
        "capabilities": {
            "tools": {"listChanged": true},
            "prompts": {"listChanged": true},
            "resources": {"listChanged": true, "subscribe": true},
            "completions": {},
            "logging": {}
        },
        "serverInfo": {"name": "coffer", "title": "Coffer", "version": coffer_runtime::VERSION},
        "instructions": INSTRUCTIONS
    });
    let body = format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{}}}", id.get(), result);
    (session, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(text: &str) -> Result<&'static str, Invalid> {
        decode(text.as_bytes()).map(|p| match p {
            Parsed::Request { .. } => "request",
            Parsed::Notification { .. } => "notification",
            Parsed::Response { .. } => "response",
        })
    }

    #[test]
    fn requests_notifications_and_responses_are_told_apart() {
        assert_eq!(kind(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#), Ok("request"));
        assert_eq!(kind(r#"{"jsonrpc":"2.0","id":"a","method":"ping","params":{}}"#), Ok("request"));
        assert_eq!(kind(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#), Ok("notification"));
        assert_eq!(kind(r#"{"jsonrpc":"2.0","id":"coffer-relay-1","result":{}}"#), Ok("response"));
        assert_eq!(kind(r#"{"jsonrpc":"2.0","id":7,"error":{"code":-1,"message":"x"}}"#), Ok("response"));
    }

    #[test]
    fn params_and_ids_stay_raw() {
        let Ok(Parsed::Request { id, method, params }) =
            decode(br#"{"jsonrpc":"2.0","id":  12 ,"method":"tools/call","params":{"b": 1,"a":[ 2 ]}}"#)
        else {
            panic!("a request");
        };
        assert_eq!((id.get(), method.as_str()), ("12", "tools/call"));
        assert_eq!(params.unwrap().get(), r#"{"b": 1,"a":[ 2 ]}"#);
    }

    #[test]
    fn invalid_envelopes_get_the_json_rpc_error_for_them() {
        let e = kind("not json").unwrap_err();
        assert_eq!((e.id, e.code), (Value::Null, jsonrpc::PARSE_ERROR));
        let e = kind(r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#).unwrap_err();
        assert_eq!(
            (e.id, e.code, e.message.as_str()),
            (json!(3), INVALID_REQUEST, "Invalid Request: \"jsonrpc\" must be \"2.0\"")
        );
        let e = kind(r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#).unwrap_err();
        assert_eq!(
            (e.id, e.code),
            (Value::Null, INVALID_REQUEST),
            "a null id is refused, not taken for a notification"
        );
        let e = kind(r#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#).unwrap_err();
        assert!(e.message.contains("string or a number"), "{}", e.message);
        let e = kind(r#"{"jsonrpc":"2.0","id":4,"method":5}"#).unwrap_err();
        assert_eq!((e.id, e.message.as_str()), (json!(4), "Invalid Request: \"method\" must be a string"));
        let e = kind(r#"{"jsonrpc":"2.0","id":4}"#).unwrap_err();
        assert_eq!(e.message, "Invalid Request: no \"method\"", "an id alone is neither request nor response");
        // JSON of the wrong shape (a member twice) is -32600 with the id it carries.
        let e = kind(r#"{"jsonrpc":"2.0","id":9,"method":"a","method":"b"}"#).unwrap_err();
        assert_eq!((e.id, e.code), (json!(9), INVALID_REQUEST));
    }
}
