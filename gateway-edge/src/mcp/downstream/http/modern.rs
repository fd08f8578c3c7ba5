//! `POST /mcp` from a modern client (MCP 2026-07-28, basic/transports/streamable-http): one
//! request per POST, no protocol session. See the parent module for the rules; this file holds
//! the request path: validation, the client's gateway session ([`scope`]), and the three answer
//! shapes (JSON, a request's SSE stream, the `subscriptions/listen` stream).
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::Digest;

use super::{accepts, json_response, refuse, rpc_error};
use crate::mcp::downstream::era::{self, Refusal};
use crate::mcp::downstream::listen::{self, Filter};
use crate::mcp::downstream::message::{self, Parsed};
use crate::mcp::jsonrpc::{INVALID_REQUEST, METHOD_NOT_FOUND};
use crate::mcp::session::{LANE_MESSAGES, Lane};
use crate::mcp::{Gateway, Session};

/// Keep-alive comment interval on a modern request's SSE stream: a client gone away is noticed
/// (and its request cancelled) at the next one at the latest.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// Handles a modern client's POST (already decoded).
pub(super) async fn post(gw: Arc<Gateway>, headers: HeaderMap, parsed: Parsed, profile: &super::Requested) -> Response {
    let (id, method, params) = match parsed {
        Parsed::Request { id, method, params } => (id, method, params),
        // Cancellation is closing the request's stream; other notifications carry nothing Coffer
        // acts on for a modern client.
        Parsed::Notification { .. } => return StatusCode::ACCEPTED.into_response(),
        Parsed::Response { id, .. } => {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                serde_json::from_str(id.get()).unwrap_or(Value::Null),
                INVALID_REQUEST,
                "Invalid Request: a 2026-07-28 client sends no JSON-RPC responses (input goes in inputResponses)",
            );
        }
    };
    let id_value = || serde_json::from_str::<Value>(id.get()).unwrap_or(Value::Null);
    let meta = era::meta(params.as_deref());
    if let Err(r) = era::check_headers(&headers, &method, params.as_deref(), meta.as_ref()) {
        return refuse(StatusCode::BAD_REQUEST, id_value(), &r);
    }
    let meta = match era::check_version(meta.as_ref()) {
        Ok(m) => m.clone(),
        Err(r) => return refuse(StatusCode::BAD_REQUEST, id_value(), &r),
    };
    if !era::is_modern_method(&method) {
        let msg = format!("Method not found: {}", method.chars().take(100).collect::<String>());
        return rpc_error(StatusCode::NOT_FOUND, id_value(), METHOD_NOT_FOUND, &msg);
    }
    if let Some(body) = message::sessionless(&method, &id) {
        return json_response(StatusCode::OK, body);
    }
    let profile = match super::choose_profile(&gw, profile) {
        Ok(p) => p,
        Err(e) => return super::profile_refused(&id, e),
    };
    let session = match scope(&headers, &meta) {
        // One gateway session per profile too: a profile is fixed for a session's life.
        Ok(key) => gw.modern_session(&format!("{key}/{profile}"), &meta),
        Err(r) => return refuse(StatusCode::BAD_REQUEST, id_value(), &r),
    };
    session.select_profile(profile);
    if method == "subscriptions/listen" {
        return subscribe(session, id, params.as_deref());
    }
    let call_id = format!("\"coffer-call-{}\"", uuid::Uuid::new_v4().simple());
    let streamed = era::is_call_like(&method) && accepts_stream(&headers);
    // On a stream, the request's progress notifications come first, then its response.
    let (progress, progress_rx) = if streamed {
        let (lane, rx) = Lane::new(LANE_MESSAGES, "progress on a 2026-07-28 request's SSE answer");
        (Some(lane), Some(rx))
    } else {
        (None, None)
    };
    let work = async move {
        let answer = session.modern_request(&method, params.as_deref(), call_id, progress).await;
        message::modern_response(answer, &method, &id)
    };
    let Some(progress_rx) = progress_rx else {
        return json_response(StatusCode::OK, work.await);
    };
    // The work lives in the stream: when the client closes it, the stream is dropped with the
    // work, and the call is cancelled upstream (see `mrtr.rs`).
    let stream = futures_util::stream::unfold(Some((Box::pin(work), progress_rx)), |state| async move {
        let (mut work, mut progress) = state?;
        tokio::select! {
            biased;
            Some(note) = progress.recv() => Some((note, Some((work, progress)))),
            answer = &mut work => Some((answer, None)),
        }
    })
    .map(|m| Ok::<_, Infallible>(Event::default().data(m)));
    sse(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)).into_response())
}

fn accepts_stream(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/event-stream"))
        && accepts(headers, "text/event-stream")
}

fn sse(mut r: Response) -> Response {
    r.headers_mut().insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// The gateway-session scope of a modern HTTP client: a digest of the credential it presented
/// (token or web-session cookie), of its `X-Coffer-Connection` header when sent, else of its
/// `clientInfo` name and version, and of its declared capabilities (sorted). Deterministic, so a stateful upstream keeps its state between
/// one client's calls; two clients with different credentials, connection ids or identities
/// never share upstream processes.
///
/// # Errors
/// -32020 for an `X-Coffer-Connection` longer than 128 bytes or not visible ASCII.
#[allow(clippy::result_large_err)]
fn scope(headers: &HeaderMap, meta: &era::Meta) -> Result<String, Refusal> {
    let mut h = sha2::Sha256::new();
    for name in [coffer_types::header::TOKEN, header::AUTHORIZATION.as_str(), header::COOKIE.as_str()] {
        if let Some(v) = headers.get(name) {
            h.update(name.as_bytes());
            h.update(b"\0");
            h.update(v.as_bytes());
            h.update(b"\0");
        }
    }
    match headers.get(coffer_types::header::CONNECTION_ID) {
        Some(c) if c.len() > 128 || c.to_str().is_err() || c.is_empty() => {
            return Err(Refusal {
                code: era::HEADER_MISMATCH,
                message: "Header mismatch: X-Coffer-Connection must be 1 to 128 visible ASCII characters".into(),
                data: None,
            });
        }
        Some(c) => {
            h.update(b"connection\0");
            h.update(c.as_bytes());
        }
        None => {
            h.update(b"client\0");
            let info = &meta.client_info;
            h.update(info.get("name").and_then(Value::as_str).unwrap_or_default().as_bytes());
            h.update(b"\0");
            h.update(info.get("version").and_then(Value::as_str).unwrap_or_default().as_bytes());
        }
    }
    // The capabilities are mirrored to the session's upstreams when they start, so two clients
    // that declare different ones (one answers elicitation, one does not) are two sessions.
    h.update(b"\0capabilities\0");
    h.update(sorted_json(&meta.capabilities).as_bytes());
    Ok(hex::encode(h.finalize()))
}

/// `v` as JSON text with every object's keys in sorted order, so equal capabilities written in
/// another key order give the same scope.
fn sorted_json(v: &Value) -> String {
    fn sort(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                Value::Object(keys.into_iter().map(|k| (k.clone(), sort(&m[k]))).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(v).to_string()
}

/// `subscriptions/listen`: the acknowledgment, then the opted-in list changes of the client's
/// session tagged with the subscription id, keep-alive comments meanwhile; when the session
/// ends, the request's response (a graceful close). Closing the stream ends the subscription.
fn subscribe(session: Arc<Session>, id: Box<RawValue>, params: Option<&RawValue>) -> Response {
    let filter = match Filter::parse(params) {
        Ok(f) => f,
        Err(e) => {
            let id = serde_json::from_str(id.get()).unwrap_or(Value::Null);
            return rpc_error(StatusCode::OK, id, e.code, &e.message);
        }
    };
    let (_, rx) = session.outbound.subscribe(None);
    let ack = filter.acknowledgment(&id);
    let end = listen::closing(&id);
    let closed = session.closed.clone();
    let id: Arc<RawValue> = Arc::from(id);
    let live = tokio_stream::wrappers::BroadcastStream::new(rx)
        .filter_map(move |m| {
            let id = id.clone();
            async move { m.ok().and_then(|(_, msg)| filter.tag(&msg, &id)) }
        })
        .take_until(closed.cancelled_owned());
    let stream = futures_util::stream::once(async move { ack })
        .chain(live)
        .chain(futures_util::stream::once(async move { end }))
        .map(|m| Ok::<_, Infallible>(Event::default().data(m)));
    sse(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)).into_response())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn meta(capabilities: Value) -> era::Meta {
        era::Meta {
            version: "2026-07-28".into(),
            client_info: json!({"name": "mcp", "version": "0.1.0"}),
            capabilities,
            has_capabilities: true,
        }
    }

    #[test]
    fn clients_that_declare_other_capabilities_get_other_sessions() {
        let mut headers = HeaderMap::new();
        headers.insert(coffer_types::header::TOKEN, HeaderValue::from_static("t"));
        let plain = scope(&headers, &meta(json!({}))).unwrap();
        let asks = scope(&headers, &meta(json!({"elicitation": {"form": {}}, "sampling": {}}))).unwrap();
        let reordered = scope(&headers, &meta(json!({"sampling": {}, "elicitation": {"form": {}}}))).unwrap();
        assert_ne!(plain, asks, "a client that answers elicitation never shares a session with one that does not");
        assert_eq!(asks, reordered, "the same capabilities in another key order are the same scope");
        headers.insert(coffer_types::header::CONNECTION_ID, HeaderValue::from_static("one"));
        assert_ne!(scope(&headers, &meta(json!({}))).unwrap(), plain);
    }
}
