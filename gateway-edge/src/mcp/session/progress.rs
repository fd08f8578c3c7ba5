//! Progress notifications routed back to the caller (MCP 2025-11-25 basic/utilities/progress).
//!
//! A request whose `params._meta.progressToken` is set, and whose transport can carry
//! notifications back ([`crate::mcp::session::RequestCtx::progress`]), goes upstream with the token
//! rewritten to one unique in the session (`"coffer-progress-N"`): on a modern (2026-07-28)
//! session several client connections share one Coffer session and may each pick token `1`.
//! The upstream's `notifications/progress` for that token gets the client's own token back and
//! goes to the caller's stream only: the shim's `/mcp` stream, the POST's SSE answer, or the
//! modern request's SSE answer. The mapping ends with the call ([`Route`] drops it), so progress
//! after the answer, or after the client cancelled, is dropped; progress naming a token of
//! another upstream, or none Coffer issued, is dropped too.
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::mcp::flow::Lane;

/// Where one upstream progress token leads.
struct Target {
    server: String,
    /// The client's own token (raw JSON: a string or an integer).
    token: Box<RawValue>,
    lane: Lane,
}

/// A session's progress tokens in flight, by the token its upstreams were given.
#[derive(Default)]
pub struct Progress {
    next: AtomicU64,
    routes: Mutex<HashMap<String, Target>>,
}

/// A registered token: removed when the call ends (dropped).
pub struct Route<'a> {
    progress: &'a Progress,
    key: String,
}

impl Drop for Route<'_> {
    fn drop(&mut self) {
        self.progress.routes.lock().expect("progress").remove(&self.key);
    }
}

impl Progress {
    /// When `params` (a request's params object) carries `_meta.progressToken`: registers it for
    /// `server`, answered on `lane`, and returns the params to send upstream (the token replaced
    /// by a session-unique one) with the registration. `None` when there is no token (or no
    /// object to find it in): the params go as they are.
    pub fn register(&self, server: &str, params: &RawValue, lane: &Lane) -> Option<(Box<RawValue>, Route<'_>)> {
        // Most requests carry no token: a substring test keeps them from being parsed.
        if !params.get().contains("progressToken") {
            return None;
        }
        let mut fields: Map<String, Value> = serde_json::from_str(params.get()).ok()?;
        let meta = fields.get_mut("_meta")?.as_object_mut()?;
        let token = meta.get("progressToken").filter(|t| t.is_string() || t.is_number())?;
        let token = RawValue::from_string(token.to_string()).ok()?;
        let ours = format!("coffer-progress-{}", self.next.fetch_add(1, Ordering::Relaxed));
        meta.insert("progressToken".into(), Value::String(ours.clone()));
        let key = serde_json::to_string(&ours).expect("json");
        let params = RawValue::from_string(Value::Object(fields).to_string()).ok()?;
        self.routes
            .lock()
            .expect("progress")
            .insert(key.clone(), Target { server: server.to_owned(), token, lane: lane.clone() });
        Some((params, Route { progress: self, key }))
    }

    /// `notifications/progress` from `server` with `params`: sent to the caller's stream with
    /// the client's token. False when it was dropped (no call of `server` has that token, or
    /// the caller's stream is full or gone).
    pub fn deliver(&self, server: &str, params: Option<&RawValue>) -> bool {
        let Some(mut p) = params.and_then(|p| serde_json::from_str::<Map<String, Value>>(p.get()).ok()) else {
            return false;
        };
        let Some(key) = p.get("progressToken").map(Value::to_string) else { return false };
        let (token, lane) = {
            let routes = self.routes.lock().expect("progress");
            match routes.get(&key) {
                Some(t) if t.server == server => (t.token.clone(), t.lane.clone()),
                _ => return false,
            }
        };
        let token: Value = serde_json::from_str(token.get()).expect("a token is JSON");
        p.insert("progressToken".into(), token);
        let msg = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": p});
        let before = lane.dropped();
        lane.notify(msg.to_string()) && lane.dropped() == before
    }

    /// Tokens in flight (for tests).
    pub fn len(&self) -> usize {
        self.routes.lock().expect("progress").len()
    }

    /// True when no token is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.into()).unwrap()
    }

    #[test]
    fn tokens_are_rewritten_per_session_and_mapped_back_while_the_call_runs() {
        let p = Progress::default();
        let (lane, mut rx) = Lane::new(8, "test");
        assert!(p.register("s", &raw(r#"{"name":"x","arguments":{}}"#), &lane).is_none(), "no token");
        assert!(p.register("s", &raw(r#"{"name":"x","_meta":{"progressToken":{"a":1}}}"#), &lane).is_none());
        let (sent, route) =
            p.register("s", &raw(r#"{"name":"x","_meta":{"progressToken":7,"k":"v"}}"#), &lane).unwrap();
        let sent: Value = serde_json::from_str(sent.get()).unwrap();
        assert_eq!(sent["_meta"]["progressToken"], "coffer-progress-0");
        assert_eq!(sent["_meta"]["k"], "v", "the rest of _meta stays");
        let (_, other) = p.register("s", &raw(r#"{"_meta":{"progressToken":7}}"#), &lane).unwrap();
        assert_eq!(p.len(), 2, "two callers with the same token get two upstream tokens");

        let n = raw(r#"{"progressToken":"coffer-progress-0","progress":1,"total":4}"#);
        assert!(!p.deliver("elsewhere", Some(&n)), "another upstream's notification never matches");
        assert!(p.deliver("s", Some(&n)));
        let got: Value = serde_json::from_str(&rx.try_recv().unwrap()).unwrap();
        assert_eq!(got["method"], "notifications/progress");
        assert_eq!(got["params"]["progressToken"], 7);
        assert_eq!(got["params"]["total"], 4);
        assert!(!p.deliver("s", Some(&raw(r#"{"progressToken":"coffer-progress-9","progress":1}"#))));
        drop(route);
        assert!(!p.deliver("s", Some(&n)), "progress after the call ended is dropped");
        drop(other);
        assert!(p.is_empty());
    }
}
