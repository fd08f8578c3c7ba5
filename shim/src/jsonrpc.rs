//! JSON-RPC 2.0 as the shim needs it: telling requests, notifications and responses apart, and
//! the error objects the shim answers with itself (codes from `coffer_types::jsonrpc`).
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::frame::Frame;

/// The codes the shim answers with itself: -32700 (the line is not valid JSON), -32600 (valid
/// JSON, but not a valid request; also a line over the frame limit), -32603 (the daemon
/// answered something that is not JSON-RPC) and Coffer's -32001 (the daemon cannot be reached,
/// or the connection or session was lost while the request was in flight; it may be retried).
pub use coffer_types::jsonrpc::{DAEMON_UNAVAILABLE, INTERNAL_ERROR, INVALID_REQUEST, PARSE_ERROR};

/// What one JSON-RPC object is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    /// Has `method` and `id`: expects a response.
    Request { id: Value, method: String },
    /// Has `method`, no `id`.
    Notification { method: String },
    /// Has `id` and `result` or `error`, no `method`.
    Response { id: Value },
    /// Anything else; `id` is the object's id when it has a usable one, else null.
    Invalid { id: Value },
}

/// A parsed line or body.
#[derive(Debug)]
pub(crate) enum Parsed<'a> {
    Single(Kind),
    /// A JSON-RPC batch (the elements are not yet classified).
    Batch(Vec<&'a RawValue>),
}

/// Why a text is not a JSON-RPC message.
#[derive(Debug, PartialEq)]
pub(crate) enum ParseError {
    /// Not valid JSON (→ [`PARSE_ERROR`]).
    Syntax,
    /// A JSON object of the wrong shape, e.g. a member given twice (→ [`INVALID_REQUEST`] with
    /// its `id` when one can be found, and the reason).
    Shape { id: Value, reason: String },
    /// Valid JSON, but neither an object nor an array (→ [`INVALID_REQUEST`]).
    NotAMessage,
}

/// Parses and classifies a JSON-RPC message or batch. The whole text is validated; a member
/// given twice makes it an invalid request (as the daemon sees it too).
pub(crate) fn parse(text: &[u8]) -> Result<Parsed<'_>, ParseError> {
    match text.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {
            let envelope: Envelope<'_> = serde_json::from_slice(text).map_err(|e| match e.classify() {
                serde_json::error::Category::Data => {
                    ParseError::Shape { id: coffer_runtime::ndjson::sniff_id(text), reason: e.to_string() }
                }
                _ => ParseError::Syntax,
            })?;
            Ok(Parsed::Single(classify(&envelope)))
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_slice(text).map_err(|_| ParseError::Syntax)?;
            Ok(Parsed::Batch(items))
        }
        _ => {
            serde_json::from_slice::<serde::de::IgnoredAny>(text).map_err(|_| ParseError::Syntax)?;
            Err(ParseError::NotAMessage)
        }
    }
}

/// The members that tell JSON-RPC messages apart, borrowed from the text (nothing is copied);
/// each is `Some` when present, even as `null`. Other members are validated and skipped.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&'de RawValue as serde::Deserialize<'de>>::deserialize(d).map(Some)
}

fn classify(m: &Envelope<'_>) -> Kind {
    let id = m.id.and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok());
    let id_ok = id.as_ref().is_some_and(|v| v.is_string() || v.is_number() || v.is_null());
    let method = m.method.map(|raw| serde_json::from_str::<String>(raw.get()).ok());
    match (method, id) {
        (Some(Some(method)), Some(id)) if id_ok => Kind::Request { id, method },
        (Some(Some(method)), None) => Kind::Notification { method },
        (None, Some(id)) if id_ok && (m.result.is_some() || m.error.is_some()) => Kind::Response { id },
        (_, id) => Kind::Invalid { id: id.filter(|_| id_ok).unwrap_or(Value::Null) },
    }
}

/// A JSON-RPC error response for request `id`, with optional `data`.
pub(crate) fn error_frame(id: &Value, code: i64, message: &str, data: Option<Value>) -> Frame {
    let mut error = json!({"code": code, "message": message});
    if let Some(data) = data {
        error["data"] = data;
    }
    Frame::from_value(&json!({"jsonrpc": "2.0", "id": id, "error": error}))
}

/// The error every in-flight request gets when the daemon connection or session is lost.
pub(crate) fn lost_frame(id: &Value, reason: &str) -> Frame {
    error_frame(
        id,
        DAEMON_UNAVAILABLE,
        "The connection to the Coffer daemon was lost; the request may be retried.",
        Some(json!({"reason": reason})),
    )
}

/// The JSON-RPC error object in the body of an HTTP error response, with its `id` set to
/// `request_id` when the body has none or `null` (servers send `id: null` when they answer
/// before reading the request). `None` when the body is not a JSON-RPC error object.
pub(crate) fn error_body(body: &[u8], request_id: Option<&Value>) -> Option<Frame> {
    let mut value: Value = serde_json::from_slice(body).ok()?;
    let obj = value.as_object_mut()?;
    if !obj.get("error").is_some_and(Value::is_object) {
        return None;
    }
    if let Some(id) = request_id
        && obj.get("id").is_none_or(Value::is_null)
    {
        obj.insert("id".into(), id.clone());
    }
    obj.entry("jsonrpc").or_insert_with(|| json!("2.0"));
    Some(Frame::from_value(&value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(text: &str) -> Kind {
        match parse(text.as_bytes()) {
            Ok(Parsed::Single(k)) => k,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn classifies_messages() {
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#),
            Kind::Request { id: json!(1), method: "ping".into() }
        );
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Kind::Notification { method: "notifications/initialized".into() }
        );
        assert_eq!(kind(r#"{"jsonrpc":"2.0","id":"a","result":{}}"#), Kind::Response { id: json!("a") });
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","id":"a","error":{"code":1,"message":"x"}}"#),
            Kind::Response { id: json!("a") }
        );
        assert_eq!(kind(r#"{"jsonrpc":"2.0","id":7}"#), Kind::Invalid { id: json!(7) });
        assert_eq!(kind(r#"{"id":[1],"method":"x"}"#), Kind::Invalid { id: Value::Null });
        assert_eq!(kind(r#"{"id":1,"method":5}"#), Kind::Invalid { id: json!(1) });
        // Present as null still counts as present; escaped member names are the same members.
        assert_eq!(kind(r#"{"id":1,"method":null}"#), Kind::Invalid { id: json!(1) });
        assert_eq!(kind(r#"{"id":"r","result":null}"#), Kind::Response { id: json!("r") });
        assert_eq!(
            kind(r#"{"jsonrpc":"2.0","\u0069d":2,"meth\u006fd":"ping","params":{"x":[1,{"y":null}]}}"#),
            Kind::Request { id: json!(2), method: "ping".into() }
        );
    }

    #[test]
    fn a_repeated_member_is_an_invalid_request_with_its_id() {
        match parse(br#"{"jsonrpc":"2.0","id":7,"method":"ping","method":"x"}"#).unwrap_err() {
            ParseError::Shape { id, reason } => {
                assert_eq!(id, json!(7));
                assert!(reason.contains("duplicate field `method`"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(parse(br#"{"id":1,"method":"a","x":{"bad":}}"#).unwrap_err(), ParseError::Syntax);
    }

    #[test]
    fn rejects_non_messages() {
        assert_eq!(parse(b"{\"a\":").unwrap_err(), ParseError::Syntax);
        assert_eq!(parse(b"nope").unwrap_err(), ParseError::Syntax);
        assert_eq!(parse(b"42").unwrap_err(), ParseError::NotAMessage);
        assert!(matches!(parse(b"[{\"id\":1},2]"), Ok(Parsed::Batch(v)) if v.len() == 2));
    }

    #[test]
    fn fills_in_a_null_id_of_an_error_body() {
        let body = br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32602,"message":"bad"}}"#;
        let f = error_body(body, Some(&json!(9))).unwrap();
        let v: Value = serde_json::from_slice(f.bytes()).unwrap();
        assert_eq!(v, json!({"jsonrpc":"2.0","id":9,"error":{"code":-32602,"message":"bad"}}));
        let body = br#"{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"m"}}"#;
        let v: Value = serde_json::from_slice(error_body(body, Some(&json!(9))).unwrap().bytes()).unwrap();
        assert_eq!(v["id"], json!(3));
        assert!(error_body(b"<html>", Some(&json!(1))).is_none());
        assert!(error_body(br#"{"error":"x"}"#, None).is_none());
    }
}
