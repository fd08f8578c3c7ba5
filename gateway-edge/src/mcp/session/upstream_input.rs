//! A session's side of an upstream's multi round-trip request (MCP 2026-07-28
//! basic/patterns/mrtr): each input request of an `InputRequiredResult` (its wire format is
//! [`crate::mcp::upstream::mrtr`]) is relayed to the client, and the original request retried
//! upstream with the answers.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use serde_json::value::RawValue;

use crate::mcp::answer::{Answer, RpcError};
use crate::mcp::jsonrpc::INTERNAL_ERROR;
use crate::mcp::session::{RequestCtx, Session};
use crate::mcp::upstream::mrtr::{MAX_ROUNDS, input_required, parse, retry_params};
use crate::mcp::upstream::{Reply, Upstream, UpstreamError};

fn failed(server: &str, message: String) -> Answer {
    Answer::Error(RpcError::new(INTERNAL_ERROR, message).with_data(serde_json::json!({"server": server})))
}

impl Session {
    /// Completes a request whose first answer (`first`) was an `InputRequiredResult`: relays
    /// its input requests to the client, retries with the answers, for at most [`MAX_ROUNDS`]
    /// rounds. Returns the final reply (a result, or the upstream's error), or the answer to
    /// give at once: a malformed `InputRequiredResult`, an input request the client refused
    /// or did not answer, too many rounds (-32603 naming the server), or a cancel.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::mcp) async fn input_rounds(
        &self,
        up: &Arc<Upstream>,
        server: &str,
        method: &str,
        params: &RawValue,
        first: Result<Reply, UpstreamError>,
        timeout: Duration,
        ctx: &RequestCtx,
    ) -> Result<Result<Reply, UpstreamError>, Answer> {
        let mut res = first;
        for round in 1..=MAX_ROUNDS {
            let result = match &res {
                Ok(Reply::Result(r)) if input_required(method, r) => r,
                _ => return Ok(res),
            };
            let wanted = parse(result).map_err(|why| {
                tracing::warn!(server = %server, method, error = %why, "Upstream sent an unusable InputRequiredResult.");
                failed(server, format!("upstream {server} answered {method} with an unusable InputRequiredResult: {why}"))
            })?;
            tracing::debug!(server = %server, method, round, requests = wanted.requests.len(), "Upstream needs input; relaying it to the client.");
            let mut responses = BTreeMap::new();
            for (key, input_method, input_params) in &wanted.requests {
                let reply = self
                    .relays
                    .ask(
                        &self.pool,
                        &self.outbound,
                        &self.closed,
                        timeout,
                        server,
                        input_method,
                        input_params.as_deref(),
                    )
                    .await;
                match reply {
                    Reply::Result(r) => {
                        responses.insert(key.clone(), r);
                    }
                    Reply::Error(e) => {
                        let v: Value = serde_json::from_str(e.get()).unwrap_or_default();
                        let why = v["message"].as_str().unwrap_or("an error").chars().take(300).collect::<String>();
                        return Err(failed(
                            server,
                            format!(
                                "upstream {server} needs input for {method} ({input_method}) that the client did not give: {why}"
                            ),
                        ));
                    }
                }
            }
            let retry = retry_params(params, &responses, wanted.request_state.as_deref());
            res = self.exchange(up, server, method, &retry, timeout, ctx).await?;
        }
        if matches!(&res, Ok(Reply::Result(r)) if input_required(method, r)) {
            tracing::warn!(server = %server, method, rounds = MAX_ROUNDS, "Upstream kept asking for input; call failed.");
            return Err(failed(
                server,
                format!(
                    "upstream {server} still asked for input after {MAX_ROUNDS} rounds of {method}; Coffer gave up"
                ),
            ));
        }
        Ok(res)
    }
}
