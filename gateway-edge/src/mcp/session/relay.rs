//! Requests between an upstream and the downstream client that are not the client's own calls:
//! requests an upstream sends (`sampling/createMessage`, `elicitation/create`, `roots/list`,
//! `ping`) relayed to the client with a rewritten id (`coffer-relay-N`), and the client's
//! `notifications/cancelled` for a call in flight, forwarded with the upstream's own request id.
//! A 2026-07-28 upstream's input requests (an `InputRequiredResult`, see [`crate::mcp::upstream::mrtr`]) take
//! the same way to the client through [`Relays::ask`]; their answers come back to the caller
//! instead of to the upstream.
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use crate::mcp::answer::error_raw;
use crate::mcp::flow::{Lane, Undelivered};
use crate::mcp::jsonrpc::{self, METHOD_NOT_FOUND, UPSTREAM_TIMEOUT, UPSTREAM_UNAVAILABLE};
use crate::mcp::policy::truncate;
use crate::mcp::session::outbound::Outbound;
use crate::mcp::session::pool::Pool;
use crate::mcp::upstream::Reply;

/// Relayed requests that may wait for the client's answer at once, per session; more are
/// refused to their upstream at once (an upstream that floods requests holds no more).
pub const MAX_WAITING: usize = 64;

/// A request an upstream sent that waits for the downstream client's answer.
struct Relay {
    server: String,
    to: Target,
}

/// Where the client's answer to a relayed request goes.
enum Target {
    /// To the upstream, as the response to its request with this (raw) id.
    Upstream(Box<RawValue>),
    /// To the gateway itself (an input request of an `InputRequiredResult`).
    Local(tokio::sync::oneshot::Sender<Reply>),
}

/// A POST response stream that upstream requests may be relayed on while its call runs.
struct RelayStream {
    token: u64,
    server: String,
    side: Lane,
}

/// One session's relayed requests and its client's calls in flight.
#[derive(Default)]
pub struct Relays {
    /// Downstream request id (raw JSON text) → (server, upstream request id), while in flight.
    inflight: Mutex<HashMap<String, (String, u64)>>,
    /// Downstream request ids (raw JSON text) the client cancelled while they were in flight;
    /// each is taken out again when its request ends (as `Answer::Cancelled`).
    cancelled: Mutex<HashSet<String>>,
    streams: Mutex<Vec<RelayStream>>,
    /// Relayed requests waiting for the client, by the relay id (raw JSON text).
    waiting: Arc<Mutex<HashMap<String, Relay>>>,
    counter: AtomicU64,
}

/// Removes a stream registration ([`Relays::open_stream`]) when the call that made it ends.
pub struct StreamGuard<'a> {
    relays: &'a Relays,
    token: u64,
}

impl Drop for StreamGuard<'_> {
    fn drop(&mut self) {
        self.relays.streams.lock().expect("streams").retain(|r| r.token != self.token);
    }
}

impl Relays {
    /// Registers `side` (the response stream of a call to `server`) as where requests from
    /// `server` are relayed while the call runs; the registration ends with the guard.
    pub fn open_stream(&self, server: &str, side: &Lane) -> StreamGuard<'_> {
        let token = self.counter.fetch_add(1, Ordering::Relaxed);
        self.streams.lock().expect("streams").push(RelayStream {
            token,
            server: server.to_owned(),
            side: side.clone(),
        });
        StreamGuard { relays: self, token }
    }

    /// Notes that downstream request `id` (raw JSON text) is upstream request `uid` of `server`.
    pub fn begin(&self, id: &str, server: &str, uid: u64) {
        self.inflight.lock().expect("inflight").insert(id.to_owned(), (server.to_owned(), uid));
    }

    /// Ends downstream request `id`; true when the client cancelled it meanwhile.
    pub fn end(&self, id: &str) -> bool {
        // Under the `inflight` lock, as `cancel` marks it: a cancel either finds the request
        // in flight and marks it, or finds it gone and does nothing.
        let mut inflight = self.inflight.lock().expect("inflight");
        inflight.remove(id);
        self.cancelled.lock().expect("cancelled").remove(id)
    }

    /// `notifications/cancelled` from the client (raw `params`): the upstream handling that
    /// request gets `notifications/cancelled` with its own request id, and the call ends at
    /// once. Unknown or finished requests are ignored. Returns whether the request was in flight
    /// upstream.
    pub async fn cancel(&self, pool: &Pool, session_id: &str, params: Option<&RawValue>) -> bool {
        let p: Value = params.and_then(|p| serde_json::from_str(p.get()).ok()).unwrap_or_default();
        let Some(rid) = p.get("requestId") else { return false };
        let key = rid.to_string();
        let found = {
            let inflight = self.inflight.lock().expect("inflight");
            let found = inflight.get(&key).cloned();
            if found.is_some() {
                self.cancelled.lock().expect("cancelled").insert(key);
            }
            found
        };
        match found {
            Some((server, uid)) => {
                if let Some(up) = pool.running(&server).await {
                    let reason = p.get("reason").and_then(Value::as_str).unwrap_or("cancelled by the client");
                    up.cancel(uid, reason).await;
                    up.fail_local(uid, jsonrpc::REQUEST_CANCELLED, "Request cancelled by the client");
                }
                true
            }
            None => {
                tracing::debug!(session = %session_id, "Cancel for an unknown or finished request ignored.");
                false
            }
        }
    }

    /// A response from the client to a relayed request: passed back to its upstream with the
    /// upstream's original id. Unknown ids are ignored (already answered or timed out).
    pub async fn answer(
        &self,
        pool: &Pool,
        session_id: &str,
        id: &RawValue,
        result: Option<Box<RawValue>>,
        error: Option<Box<RawValue>>,
    ) {
        let relay = self.waiting.lock().expect("relays").remove(id.get());
        let Some(relay) = relay else {
            tracing::debug!(session = %session_id, "Response for an unknown relayed request ignored.");
            return;
        };
        let reply = match (result, error) {
            (Some(r), _) => Reply::Result(r),
            (None, Some(e)) => Reply::Error(e),
            (None, None) => Reply::Result(RawValue::from_string("{}".into()).expect("json")),
        };
        match relay.to {
            Target::Upstream(upstream_id) => {
                if let Some(up) = pool.running(&relay.server).await {
                    let _ = up.respond(&upstream_id, reply).await;
                }
            }
            Target::Local(tx) => {
                let _ = tx.send(reply);
            }
        }
    }

    /// Asks the client `method` with `params` on behalf of `server` (an input request of a
    /// 2026-07-28 upstream's `InputRequiredResult`), exactly as [`Relays::relay`] relays a
    /// handshake-era upstream's own request, and returns the client's answer. An error reply
    /// when the client lacks the capability, has no stream to take it, or does not answer
    /// within `timeout` (or before `closed` fires).
    #[allow(clippy::too_many_arguments)]
    pub async fn ask(
        &self,
        pool: &Pool,
        outbound: &Outbound,
        closed: &CancellationToken,
        timeout: Duration,
        server: &str,
        method: &str,
        params: Option<&RawValue>,
    ) -> Reply {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let relay_id = match self.send(pool, outbound, server, method, params, Target::Local(tx)) {
            Ok(id) => id,
            Err(reply) => return reply,
        };
        let answer = tokio::select! {
            r = tokio::time::timeout(timeout, rx) => r.ok().and_then(Result::ok),
            _ = closed.cancelled() => None,
        };
        self.waiting.lock().expect("relays").remove(&relay_id);
        answer.unwrap_or_else(|| {
            Reply::Error(error_raw(
                UPSTREAM_TIMEOUT,
                &format!("The client did not answer {method} within {} ms", timeout.as_millis()),
            ))
        })
    }

    /// Sends request `method` to the client for `server` with a fresh relay id, registered as
    /// waiting with `to`: on the originating POST's stream when a call to that server is
    /// running, else on the GET stream (`outbound`). Returns the relay id (raw JSON text), or
    /// the error to answer with (unknown method, a capability the client did not declare, no
    /// stream to relay on; `ping` without a stream is answered `{}`).
    fn send(
        &self,
        pool: &Pool,
        outbound: &Outbound,
        server: &str,
        method: &str,
        params: Option<&RawValue>,
        to: Target,
    ) -> Result<String, Reply> {
        let needed = match method {
            "sampling/createMessage" => Some("sampling"),
            "elicitation/create" => Some("elicitation"),
            "roots/list" => Some("roots"),
            "ping" => None,
            _ => {
                return Err(Reply::Error(error_raw(
                    METHOD_NOT_FOUND,
                    &format!(
                        "Method not found: {} (Coffer relays sampling, elicitation, roots and ping)",
                        truncate(method, 100)
                    ),
                )));
            }
        };
        if let Some(cap) = needed
            && pool.init_params()["capabilities"].get(cap).is_none()
        {
            let err = error_raw(METHOD_NOT_FOUND, &format!("The client did not declare the {cap} capability"));
            return Err(Reply::Error(err));
        }
        // A modern client (MCP 2026-07-28) takes no server→client requests: `ping` is answered
        // here, the rest only on the stream of a call, where `mrtr.rs` turns them into input
        // requests; there is no GET stream to send them on.
        let modern = pool.init_params()["protocolVersion"].as_str().is_some_and(crate::mcp::downstream::era::is_modern);
        if modern && method == "ping" {
            return Err(Reply::Result(RawValue::from_string("{}".into()).expect("json")));
        }
        let side = self
            .streams
            .lock()
            .expect("streams")
            .iter()
            .rev()
            .find(|r| r.server == server && !r.side.is_closed())
            .map(|r| r.side.clone());
        if side.is_none() && (modern || !outbound.has_listener()) {
            if method == "ping" {
                return Err(Reply::Result(RawValue::from_string("{}".into()).expect("json")));
            }
            let err = error_raw(UPSTREAM_UNAVAILABLE, "The client has no open stream to relay this request on");
            return Err(Reply::Error(err));
        }
        let relay_id = format!("\"coffer-relay-{}\"", self.counter.fetch_add(1, Ordering::Relaxed));
        {
            let mut waiting = self.waiting.lock().expect("relays");
            if waiting.len() >= MAX_WAITING {
                let err = error_raw(
                    UPSTREAM_UNAVAILABLE,
                    &format!("The client already has {MAX_WAITING} requests to answer; try again later"),
                );
                return Err(Reply::Error(err));
            }
            waiting.insert(relay_id.clone(), Relay { server: server.to_owned(), to });
        }
        let method_json = serde_json::to_string(method).expect("json");
        let msg = match params {
            Some(p) => {
                format!("{{\"jsonrpc\":\"2.0\",\"id\":{relay_id},\"method\":{method_json},\"params\":{}}}", p.get())
            }
            None => format!("{{\"jsonrpc\":\"2.0\",\"id\":{relay_id},\"method\":{method_json}}}"),
        };
        let undelivered = match side {
            Some(lane) => lane.deliver(msg.clone()).err(),
            None => Some(Undelivered::Closed),
        };
        match undelivered {
            None => {}
            // A client that leaves this many messages unread is not reading this stream: the
            // request is refused rather than queued without limit.
            Some(Undelivered::Full) => {
                self.waiting.lock().expect("relays").remove(&relay_id);
                let err = error_raw(
                    UPSTREAM_UNAVAILABLE,
                    "The client is not reading its stream; this request could not be queued for it",
                );
                return Err(Reply::Error(err));
            }
            Some(Undelivered::Closed) if modern => {
                self.waiting.lock().expect("relays").remove(&relay_id);
                let err = error_raw(UPSTREAM_UNAVAILABLE, "The client's call ended before this request could reach it");
                return Err(Reply::Error(err));
            }
            Some(Undelivered::Closed) => outbound.push(msg),
        }
        Ok(relay_id)
    }

    /// Relays a request `server`'s upstream sent to the client: on the originating POST's
    /// stream when a call to that upstream is running, else on the GET stream (`outbound`); the
    /// id is rewritten both ways. When the client lacks the capability or cannot be reached, the
    /// upstream gets an error at once; an unanswered relay gets one after `timeout` (or when
    /// `closed` fires).
    #[allow(clippy::too_many_arguments)]
    pub async fn relay(
        &self,
        pool: &Pool,
        outbound: &Outbound,
        closed: &CancellationToken,
        timeout: Duration,
        server: String,
        id: Box<RawValue>,
        method: String,
        params: Option<Box<RawValue>>,
    ) {
        let Some(up) = pool.running(&server).await else { return };
        let relay_id =
            match self.send(pool, outbound, &server, &method, params.as_deref(), Target::Upstream(id.clone())) {
                Ok(relay_id) => relay_id,
                Err(reply) => {
                    let _ = up.respond(&id, reply).await;
                    return;
                }
            };
        // Bound the wait by the call timeout: an unanswered relay gets an error upstream.
        let waiting = self.waiting.clone();
        let closed = closed.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(timeout) => {}
                _ = closed.cancelled() => {}
            }
            let expired = waiting.lock().expect("relays").remove(&relay_id);
            if let Some(Relay { to: Target::Upstream(upstream_id), .. }) = expired {
                let err = error_raw(
                    UPSTREAM_TIMEOUT,
                    &format!("The client did not answer {method} within {} ms", timeout.as_millis()),
                );
                let _ = up.respond(&upstream_id, Reply::Error(err)).await;
            }
        });
    }
}
