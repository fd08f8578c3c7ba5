//! Multi Round-Trip Requests for modern downstream clients (MCP 2026-07-28,
//! basic/patterns/mrtr): a modern client must never receive a server→client request, so a
//! request an upstream relays while one of the client's calls runs (`sampling/createMessage`,
//! `elicitation/create`, `roots/list`, reaching the session through [`crate::mcp::session::relay`] as for any
//! client) ends that call's answer early as an `InputRequiredResult`:
//!
//! - `inputRequests` holds each relayed request under its relay id (`coffer-relay-N`), the key
//!   Coffer mints; `requestState` (`coffer-mrtr-<128 random bits>`) names the parked call;
//! - the call itself stays parked: its task keeps running, the upstream keeps waiting for the
//!   relayed requests' answers;
//! - the client's retry (same method and name, `inputResponses` + `requestState`) answers the
//!   parked relays (each `inputResponses` value goes back to the upstream as the result of its
//!   request) and waits again: for the upstream's real answer, or for more input requests (a new
//!   `InputRequiredResult`, with a new `requestState`: each is good for one retry);
//! - a retry without `inputResponses` (or missing some) is asked again for what is missing, and
//!   keys that answer no pending input request are ignored (MRTR §Error Handling: re-ask, not an
//!   error); `inputResponses` without `requestState` answer nothing and the request runs afresh;
//! - a `requestState` that is unknown, expired, already used or for another method or name, and
//!   `inputResponses` that are not an object (or answer a pending request with a non-object),
//!   get -32602 naming the problem, and a parked call stays parked;
//! - a parked call nobody retries is dropped after the call timeout; dropping a call that has not
//!   finished (expiry, or the client closing the request's stream) cancels it upstream, as
//!   `notifications/cancelled` from the client would.
//!
//! A modern upstream's own `InputRequiredResult` reaches this session as ordinary relays (the
//! upstream side translates it), so the same translation serves upstreams of both eras.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use tokio::task::JoinHandle;

use crate::mcp::answer::{Answer, RpcError};
use crate::mcp::downstream::era;
use crate::mcp::jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS};
use crate::mcp::policy::truncate;
use crate::mcp::session::{LANE_MESSAGES, Lane, RequestCtx, Session};

/// A session's parked calls, by `requestState`.
#[derive(Default)]
pub struct Parked {
    calls: Mutex<HashMap<String, Call>>,
}

impl Parked {
    /// Number of parked calls (for tests and status).
    pub fn len(&self) -> usize {
        self.calls.lock().expect("parked").len()
    }

    /// True when no call is parked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn take(&self, state: &str) -> Option<Call> {
        self.calls.lock().expect("parked").remove(state)
    }

    fn put(&self, state: String, call: Call) {
        self.calls.lock().expect("parked").insert(state, call);
    }
}

/// A modern client's call in progress: its task, where its upstream's relayed requests arrive,
/// and the input requests the client has not answered yet.
pub struct Call {
    method: String,
    target: String,
    task: JoinHandle<Answer>,
    side: crate::mcp::flow::LaneRx,
    /// Input request key → `{method, params}`, not yet answered.
    pending: Map<String, Value>,
    guard: CancelOnDrop,
}

/// Cancels a call that ends unfinished (dropped while parked, or its client went away).
struct CancelOnDrop {
    session: Weak<Session>,
    /// The call's request id as the relays know it (raw JSON); `None` once it finished.
    call_id: Option<String>,
    /// Stops the call's task when it has not reached its upstream yet (nothing to cancel there).
    task: Option<tokio::task::AbortHandle>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let (Some(id), Some(session)) = (self.call_id.take(), self.session.upgrade()) else { return };
        let task = self.task.take();
        tokio::spawn(async move {
            let params = RawValue::from_string(format!("{{\"requestId\":{id},\"reason\":\"the client went away\"}}"))
                .expect("json");
            if !session.relays.cancel(&session.pool, &session.id, Some(&params)).await
                && let Some(task) = task
            {
                task.abort();
            }
        });
    }
}

fn invalid(message: impl Into<String>) -> Answer {
    Answer::Error(RpcError::new(INVALID_PARAMS, message))
}

impl Session {
    /// Runs a modern client's request. `call_id` is the request's id as the relays know it (raw
    /// JSON: the client's own on a stream, one Coffer mints on HTTP, where ids of different
    /// POSTs may repeat). Calls, prompts and reads go through the MRTR translation above; the
    /// answer is an `InputRequiredResult` or the final one, as the legacy path would give it.
    /// `progress`: the request's own stream, where its progress notifications go (`None`: they
    /// are dropped); a call parked for input keeps the stream of the request that started it.
    pub async fn modern_request(
        self: &Arc<Self>,
        method: &str,
        params: Option<&RawValue>,
        call_id: String,
        progress: Option<Lane>,
    ) -> Answer {
        if !era::is_call_like(method) {
            let ctx = RequestCtx { id: Some(call_id), side: None, progress };
            return self.handle_request_ctx(method, params, &ctx).await;
        }
        let fields: Value = params.and_then(|p| serde_json::from_str(p.get()).ok()).unwrap_or_else(|| json!({}));
        let responses = fields.get("inputResponses");
        // Without `requestState` nothing was asked of this client: its `inputResponses` answer
        // nothing and are ignored (MRTR §Error Handling), and the request runs afresh.
        let Some(state) = fields.get("requestState") else {
            return self.fresh(method, params, call_id, &fields, progress).await;
        };
        let Some(state) = state.as_str() else {
            return invalid("Invalid params: requestState must be the string Coffer sent");
        };
        let Some(mut call) = self.parked.take(state) else {
            return invalid(format!(
                "Invalid params: requestState {:?} is unknown, expired or already used; send the request again without inputResponses and requestState",
                truncate(state, 80)
            ));
        };
        let target = target_of(method, &fields);
        if call.method != method || call.target != target {
            let msg = format!(
                "Invalid params: requestState {:?} belongs to {} {:?}, not {} {:?}",
                truncate(state, 80),
                call.method,
                truncate(&call.target, 100),
                truncate(method, 40),
                truncate(&target, 100)
            );
            self.parked.put(state.to_owned(), call);
            return invalid(msg);
        }
        if let Some(responses) = responses {
            if let Err(msg) = check_responses(&call.pending, responses) {
                self.parked.put(state.to_owned(), call);
                return invalid(msg);
            }
            for (key, value) in responses.as_object().into_iter().flatten() {
                if call.pending.remove(key).is_none() {
                    continue;
                }
                let id = RawValue::from_string(serde_json::to_string(key).expect("json")).expect("json");
                let result = RawValue::from_string(value.to_string()).expect("json");
                self.relays.answer(&self.pool, &self.id, &id, Some(result), None).await;
            }
        }
        self.step(call).await
    }

    /// Starts a call whose relayed requests come back here instead of reaching the client.
    async fn fresh(
        self: &Arc<Self>,
        method: &str,
        params: Option<&RawValue>,
        call_id: String,
        fields: &Value,
        progress: Option<Lane>,
    ) -> Answer {
        let (side, rx) = Lane::new(LANE_MESSAGES, "input requests of a 2026-07-28 call");
        let ctx = RequestCtx { id: Some(call_id.clone()), side: Some(side), progress };
        let (session, m, p) = (self.clone(), method.to_owned(), params.map(ToOwned::to_owned));
        let trace = coffer_runtime::grpc::current_trace().unwrap_or_default();
        let task = tokio::spawn(coffer_runtime::grpc::with_trace(trace, async move {
            session.handle_request_ctx(&m, p.as_deref(), &ctx).await
        }));
        let abort = task.abort_handle();
        let call = Call {
            method: method.to_owned(),
            target: target_of(method, fields),
            task,
            side: rx,
            pending: Map::new(),
            guard: CancelOnDrop { session: Arc::downgrade(self), call_id: Some(call_id), task: Some(abort) },
        };
        self.step(call).await
    }

    /// Waits for the call's answer or its next input requests; parks it for the latter.
    async fn step(self: &Arc<Self>, mut call: Call) -> Answer {
        if call.pending.is_empty() {
            let relayed = tokio::select! {
                done = &mut call.task => {
                    call.guard.call_id = None;
                    return done.unwrap_or_else(|e| {
                        tracing::error!(error = %e, "A modern call's task failed.");
                        Answer::Error(RpcError::new(INTERNAL_ERROR, "internal error"))
                    });
                }
                msg = call.side.recv() => msg,
            };
            match relayed {
                Some(msg) => add_request(&mut call.pending, &msg),
                None => {
                    // Every sender is gone: the call is ending; its answer follows.
                    call.guard.call_id = None;
                    return (&mut call.task)
                        .await
                        .unwrap_or_else(|_| Answer::Error(RpcError::new(INTERNAL_ERROR, "internal error")));
                }
            }
            while let Ok(msg) = call.side.try_recv() {
                add_request(&mut call.pending, &msg);
            }
        }
        self.park(call)
    }

    /// Parks `call` under a fresh `requestState` and returns the `InputRequiredResult`.
    fn park(self: &Arc<Self>, call: Call) -> Answer {
        let state = format!("coffer-mrtr-{}", uuid::Uuid::new_v4().simple());
        let result = json!({
            "resultType": "input_required",
            "inputRequests": Value::Object(call.pending.clone()),
            "requestState": state,
        });
        tracing::debug!(session = %self.id, method = %call.method, inputs = call.pending.len(), "Call parked for client input.");
        self.parked.put(state.clone(), call);
        let weak = Arc::downgrade(self);
        let expiry = self.shared.call_timeout();
        let closed = self.closed.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(expiry) => {}
                () = closed.cancelled() => {}
            }
            if let Some(s) = weak.upgrade()
                && s.parked.take(&state).is_some()
            {
                tracing::debug!(session = %s.id, "A parked call expired without a retry.");
            }
        });
        Answer::ok(result)
    }
}

/// `params.name` (calls, prompts) or `params.uri` (reads).
fn target_of(method: &str, fields: &Value) -> String {
    let key = if method == "resources/read" { "uri" } else { "name" };
    fields.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// Records one relayed request (`{"jsonrpc","id","method","params"}` text) as an input request.
fn add_request(pending: &mut Map<String, Value>, msg: &str) {
    let Ok(v) = serde_json::from_str::<Value>(msg) else { return };
    let Some(key) = v.get("id").and_then(Value::as_str) else { return };
    let mut request = json!({"method": v.get("method").cloned().unwrap_or(Value::Null)});
    if let Some(p) = v.get("params") {
        request["params"] = p.clone();
    }
    pending.insert(key.to_owned(), request);
}

/// Checks a retry's `inputResponses` against the pending input requests.
fn check_responses(pending: &Map<String, Value>, responses: &Value) -> Result<(), String> {
    let Some(map) = responses.as_object() else {
        return Err("Invalid params: inputResponses must be an object keyed by the inputRequests keys".into());
    };
    for (key, value) in map {
        // A key that answers no pending request is ignored (MRTR §Error Handling).
        if pending.contains_key(key) && !value.is_object() {
            return Err(format!("Invalid params: inputResponses[{:?}] must be a result object", truncate(key, 80)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relayed_requests_become_input_requests_keyed_by_relay_id() {
        let mut pending = Map::new();
        add_request(
            &mut pending,
            r#"{"jsonrpc":"2.0","id":"coffer-relay-3","method":"sampling/createMessage","params":{"maxTokens":5}}"#,
        );
        add_request(&mut pending, "not json");
        add_request(&mut pending, r#"{"jsonrpc":"2.0","id":7,"method":"roots/list"}"#);
        assert_eq!(
            Value::Object(pending.clone()),
            json!({"coffer-relay-3": {"method": "sampling/createMessage", "params": {"maxTokens": 5}}})
        );
        assert_eq!(check_responses(&pending, &json!({"coffer-relay-3": {"role": "assistant"}})), Ok(()));
        assert!(check_responses(&pending, &json!([])).unwrap_err().contains("must be an object"));
        assert_eq!(check_responses(&pending, &json!({"nope": 1})), Ok(()), "unknown keys are ignored");
        assert!(check_responses(&pending, &json!({"coffer-relay-3": 1})).unwrap_err().contains("result object"));
        assert_eq!(target_of("resources/read", &json!({"uri": "u", "name": "n"})), "u");
        assert_eq!(target_of("tools/call", &json!({"uri": "u", "name": "n"})), "n");
    }
}
