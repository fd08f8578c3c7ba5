//! `subscriptions/listen` for modern clients (MCP 2026-07-28, basic/patterns/subscriptions),
//! independent of the transport: the client's notification filter, the acknowledgment, and the
//! session's list-changed events filtered and tagged with the subscription id. Both transports
//! take what a session sends its client ([`crate::mcp::session::outbound::Outbound`], where list changes from
//! upstreams, policy and the catalog already arrive) and pass each message through [`Filter::tag`];
//! Streamable HTTP writes them on the listen request's SSE stream (with keep-alive comments), the
//! shim's stream on the connection. Request-scoped messages (progress, log messages) and
//! server→client requests never go out on a listen stream.
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::mcp::answer::RpcError;
use crate::mcp::downstream::era::META_SUBSCRIPTION_ID;
use crate::mcp::jsonrpc::INVALID_PARAMS;

/// The notification types one subscription opted in to, of those Coffer offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filter {
    pub tools: bool,
    pub prompts: bool,
    pub resources: bool,
}

impl Filter {
    /// Reads `params.notifications` of a `subscriptions/listen` request.
    ///
    /// # Errors
    /// -32602 when `notifications` is missing or opts in to none of the types Coffer offers
    /// (`toolsListChanged`, `promptsListChanged`, `resourcesListChanged`; per-resource
    /// `resourceSubscriptions` are not offered).
    pub fn parse(params: Option<&RawValue>) -> Result<Self, RpcError> {
        let p: Value = params.and_then(|p| serde_json::from_str(p.get()).ok()).unwrap_or_default();
        let n = p.get("notifications").filter(|n| n.is_object());
        let on = |key: &str| n.and_then(|n| n.get(key)).and_then(Value::as_bool).unwrap_or(false);
        let f = Self {
            tools: on("toolsListChanged"),
            prompts: on("promptsListChanged"),
            resources: on("resourcesListChanged"),
        };
        if !(f.tools || f.prompts || f.resources) {
            return Err(RpcError::new(
                INVALID_PARAMS,
                "Invalid params: subscriptions/listen needs params.notifications opting in to at least one of toolsListChanged, promptsListChanged, resourcesListChanged (Coffer offers no resourceSubscriptions)",
            ));
        }
        Ok(f)
    }

    /// `notifications/subscriptions/acknowledged` for subscription `id` (raw JSON): the subset
    /// honored.
    pub fn acknowledgment(&self, id: &RawValue) -> String {
        let mut honored = serde_json::Map::new();
        for (on, key) in [
            (self.tools, "toolsListChanged"),
            (self.prompts, "promptsListChanged"),
            (self.resources, "resourcesListChanged"),
        ] {
            if on {
                honored.insert(key.into(), json!(true));
            }
        }
        json!({
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {"_meta": {META_SUBSCRIPTION_ID: subscription_id(id)}, "notifications": honored}
        })
        .to_string()
    }

    /// The message to send on subscription `id` for `msg` (a JSON-RPC text the session queued
    /// for its client), or `None` when the subscription did not opt in to it (or it is not a
    /// list change at all).
    pub fn tag(&self, msg: &str, id: &RawValue) -> Option<String> {
        let wanted = [
            (self.tools, "notifications/tools/list_changed"),
            (self.prompts, "notifications/prompts/list_changed"),
            (self.resources, "notifications/resources/list_changed"),
        ];
        // Cheap test first: most queued messages are for other types.
        let method = wanted.iter().find(|(on, m)| *on && msg.contains(m)).map(|(_, m)| *m)?;
        let v: Value = serde_json::from_str(msg).ok()?;
        if v.get("method").and_then(Value::as_str) != Some(method) || v.get("id").is_some() {
            return None;
        }
        let mut params = v.get("params").cloned().filter(Value::is_object).unwrap_or_else(|| json!({}));
        params["_meta"] = json!({META_SUBSCRIPTION_ID: subscription_id(id)});
        Some(json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string())
    }
}

/// The graceful end of subscription `id` (subscriptions §Graceful Closure): its response.
pub fn closing(id: &RawValue) -> String {
    let tagged = json!({"resultType": "complete", "_meta": {META_SUBSCRIPTION_ID: subscription_id(id)}});
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{tagged}}}", id.get())
}

fn subscription_id(id: &RawValue) -> Value {
    serde_json::from_str(id.get()).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn only_opted_in_list_changes_pass_tagged() {
        assert!(Filter::parse(None).is_err());
        assert!(Filter::parse(Some(&raw(r#"{"notifications":{}}"#))).is_err());
        assert!(Filter::parse(Some(&raw(r#"{"notifications":{"resourceSubscriptions":["x"]}}"#))).is_err());
        let f = Filter::parse(Some(&raw(r#"{"notifications":{"toolsListChanged":true,"promptsListChanged":false}}"#)))
            .unwrap();
        let id = raw("7");
        let ack: Value = serde_json::from_str(&f.acknowledgment(&id)).unwrap();
        assert_eq!(
            ack["params"],
            json!({"_meta": {META_SUBSCRIPTION_ID: 7}, "notifications": {"toolsListChanged": true}})
        );
        let tagged = f.tag(r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#, &id).unwrap();
        let v: Value = serde_json::from_str(&tagged).unwrap();
        assert_eq!(v["params"]["_meta"][META_SUBSCRIPTION_ID], 7);
        assert!(f.tag(r#"{"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}"#, &id).is_none());
        assert!(f.tag(r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"notifications/tools/list_changed"}}"#, &id).is_none());
        assert!(
            f.tag(r#"{"jsonrpc":"2.0","id":"coffer-relay-1","method":"notifications/tools/list_changed"}"#, &id)
                .is_none()
        );
        let end: Value = serde_json::from_str(&closing(&raw("\"s\""))).unwrap();
        assert_eq!(end["result"]["_meta"][META_SUBSCRIPTION_ID], "s");
    }
}
