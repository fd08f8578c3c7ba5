//! The internal agent's tools: the gateway's `ToolBroker` (`proto/broker.proto`), one broker
//! session per run (key `ask:<run id>`, actor [`ACTOR`]), so the person's policy and the
//! invocation log apply to every call the agent makes. The session is closed when the run ends
//! ([`BrokerTools::close`]); one the gateway outlives is reaped on idle.
use coffer_proto::gateway::tool_broker_client::ToolBrokerClient;
use coffer_proto::gateway::{CallToolRequest, CloseSessionRequest, ListRequest, call_reply};
use coffer_runtime::grpc::AuthChannel;
use futures_util::future::BoxFuture;
use serde_json::Value;

use super::agent::{ListedTool, Tools};

/// The actor the invocation log records for the internal agent's calls.
pub const ACTOR: &str = "agent";

/// Longest a broker request may take (a search that starts its engines, an upstream tool).
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Largest broker reply decoded (bytes): the broker's own request limit.
pub const MAX_REPLY: usize = 16 * 1024 * 1024;

/// One run's broker session.
pub struct BrokerTools {
    client: ToolBrokerClient<AuthChannel>,
    key: String,
}

impl BrokerTools {
    /// The session `ask:<run_id>` over `client`.
    pub fn new(client: ToolBrokerClient<AuthChannel>, run_id: &str) -> Self {
        Self { client: client.max_decoding_message_size(MAX_REPLY), key: format!("ask:{run_id}") }
    }

    /// The session's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Ends the session (its upstream children with it); a failure is logged, never raised.
    pub async fn close(&self) {
        let req = CloseSessionRequest { session_key: self.key.clone() };
        match coffer_runtime::grpc::call_within(
            "gateway (broker)",
            CALL_TIMEOUT,
            self.client.clone().close_session(req),
        )
        .await
        {
            Ok(_) => {}
            Err(e) => tracing::warn!(key = %self.key, error = %e.message(), "Cannot close the agent's broker session."),
        }
    }
}

impl Tools for BrokerTools {
    fn list(&self) -> BoxFuture<'_, Result<Vec<ListedTool>, String>> {
        Box::pin(async move {
            let req = ListRequest { actor: ACTOR.into(), session_key: self.key.clone() };
            let reply = coffer_runtime::grpc::call_within(
                "gateway (broker)",
                CALL_TIMEOUT,
                self.client.clone().list_tools(req),
            )
            .await
            .map_err(|s| s.message().to_owned())?;
            Ok(reply
                .items
                .into_iter()
                .map(|c| ListedTool {
                    definition: serde_json::from_str(&c.definition_json).unwrap_or(Value::Null),
                    name: c.name,
                    server: c.server,
                    original: c.original_name,
                })
                .collect())
        })
    }

    fn call<'a>(&'a self, name: &'a str, arguments: &'a Value) -> BoxFuture<'a, Result<Value, String>> {
        Box::pin(async move {
            let req = CallToolRequest {
                actor: ACTOR.into(),
                session_key: self.key.clone(),
                name: name.to_owned(),
                arguments_json: arguments.to_string(),
            };
            match coffer_runtime::grpc::call_within(
                "gateway (broker)",
                CALL_TIMEOUT,
                self.client.clone().call_tool(req),
            )
            .await
            {
                Ok(reply) => match reply.answer {
                    Some(call_reply::Answer::ResultJson(r)) => {
                        serde_json::from_str(&r).map_err(|e| format!("{name} returned a result that is not JSON: {e}"))
                    }
                    Some(call_reply::Answer::UpstreamErrorJson(e)) => {
                        let v: Value = serde_json::from_str(&e).unwrap_or(Value::Null);
                        let msg = v.get("message").and_then(Value::as_str).unwrap_or(&e);
                        Err(format!("{name} failed: {msg}"))
                    }
                    None => Err(format!("{name} returned nothing")),
                },
                Err(s) => Err(refusal(name, &s)),
            }
        })
    }
}

/// A broker status said for the model.
fn refusal(name: &str, s: &tonic::Status) -> String {
    match s.code() {
        tonic::Code::FailedPrecondition => {
            format!("{name} is disabled by the person's Coffer policy; do without it ({})", s.message())
        }
        tonic::Code::NotFound => format!("There is no tool named {name:?} ({})", s.message()),
        tonic::Code::InvalidArgument => format!("{name} refused the arguments: {}", s.message()),
        _ => format!("{name} could not be called: {}", s.message()),
    }
}
