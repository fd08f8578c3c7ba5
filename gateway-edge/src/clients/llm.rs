//! The edge's client of coffer-chat's `Llm` service (`proto/llm.proto`, `coffer.llm.v1`):
//! probing LLM connections (REST `/v1/llm/connections/{name}/test|models`) and the internal
//! agent behind the `coffer__ask` built-in. Same channel shape as [`crate::clients::chat`] (lazily
//! connected, HTTP/2 keep-alive pings notice a stopped `coffer-chat`).
use std::time::Duration;

use coffer_api::llm as api;
use coffer_proto::llm::llm_client::LlmClient;
use coffer_runtime::grpc::AuthChannel;
use secrecy::SecretString;

/// The Llm client type; cheap to clone (call a method on a clone: tonic clients take `&mut
/// self`).
pub type Client = LlmClient<AuthChannel>;

/// Longest reply or request the edge decodes or encodes (bytes): an answer with its citations.
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// Deadline of `TestConnection` and `ListModels`: above the longest `llm.request_timeout_s` a
/// person would set for a probe; the service answers a provider's timeout itself, as a failure.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

/// Deadline of one `Ask` run: several model requests and tool calls.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(600);

const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// A lazily connecting client of the Llm service at `addr` (coffer-chat's listener,
/// `127.0.0.1:port`) presenting `token`.
///
/// # Errors
/// When `addr` is not a valid authority.
pub fn client(addr: &str, token: &SecretString) -> Result<Client, tonic::transport::Error> {
    Ok(over(channel(addr, token)?))
}

/// A lazily connecting channel to the service at `addr` presenting `token`, with the
/// keep-alive described in the module docs; every client of this service shares it
/// ([`crate::clients::Clients`]).
///
/// # Errors
/// When `addr` is not a valid authority.
pub fn channel(addr: &str, token: &SecretString) -> Result<AuthChannel, tonic::transport::Error> {
    coffer_runtime::grpc::watched_channel(addr, token, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT)
}

/// The client over `ch` (from [`channel`]), with its message size limits.
pub fn over(ch: AuthChannel) -> Client {
    LlmClient::new(ch).max_decoding_message_size(MAX_MESSAGE).max_encoding_message_size(MAX_MESSAGE)
}

/// Runs one Llm call within `deadline` ([`PROBE_TIMEOUT`] or [`ASK_TIMEOUT`]); a call that takes
/// longer is `DEADLINE_EXCEEDED`.
///
/// # Errors
/// The call's status.
pub async fn call<T>(
    deadline: Duration,
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    coffer_runtime::grpc::call_within("chat service (llm)", deadline, fut).await
}

/// A failure kind as REST names it (`unknown` for an unset one).
pub fn failure_kind(kind: coffer_proto::llm::FailureKind) -> api::FailureKind {
    use coffer_proto::llm::FailureKind as K;
    match kind {
        K::Auth => api::FailureKind::Auth,
        K::NotFound => api::FailureKind::NotFound,
        K::RateLimited => api::FailureKind::RateLimited,
        K::Server => api::FailureKind::Server,
        K::Unreachable => api::FailureKind::Unreachable,
        K::Timeout => api::FailureKind::Timeout,
        K::Tls => api::FailureKind::Tls,
        K::BadResponse => api::FailureKind::BadResponse,
        K::Config => api::FailureKind::Config,
        K::Unspecified => api::FailureKind::Unknown,
    }
}

/// A provider's failure as REST answers it (`http_status`/`retry_after_ms` null when there was
/// no HTTP answer / no `retry-after`).
pub fn failure(f: Option<&coffer_proto::llm::Failure>) -> Option<api::LlmFailure> {
    let f = f?;
    Some(api::LlmFailure {
        kind: failure_kind(f.kind()),
        message: f.message.clone(),
        http_status: (f.http_status != 0).then_some(f.http_status),
        retry_after_ms: (f.retry_after_ms != 0).then_some(f.retry_after_ms),
    })
}

/// `TestConnection`'s reply as REST answers it (`failure` null when `ok`).
pub fn test_report(r: &coffer_proto::llm::TestConnectionReply) -> api::LlmTestReport {
    api::LlmTestReport {
        ok: r.ok,
        latency_ms: r.latency_ms,
        model: r.model.clone(),
        failure: if r.ok { None } else { failure(r.failure.as_ref()) },
    }
}

/// `ListModels`' reply as REST answers it (one page; `hint` null when empty).
pub fn models(r: &coffer_proto::llm::ListModelsReply) -> api::LlmModels {
    api::LlmModels {
        items: r.models.iter().map(|m| api::LlmModel { id: m.clone() }).collect(),
        next_cursor: None,
        hint: (!r.hint.is_empty()).then(|| r.hint.clone()),
        failure: failure(r.failure.as_ref()),
    }
}

#[cfg(test)]
mod tests {
    use coffer_proto::llm::{Failure, FailureKind, ListModelsReply, TestConnectionReply};
    use serde_json::{json, to_value};

    use super::*;

    #[test]
    fn replies_as_json() {
        let ok = TestConnectionReply { ok: true, latency_ms: 42, model: "m".into(), failure: None };
        assert_eq!(
            to_value(test_report(&ok)).unwrap(),
            json!({"ok": true, "latency_ms": 42, "model": "m", "failure": null})
        );
        let rate = Failure {
            kind: FailureKind::RateLimited.into(),
            message: "anthropic at http://x answered 429".into(),
            http_status: 429,
            retry_after_ms: 2000,
        };
        let bad = TestConnectionReply { ok: false, latency_ms: 5, model: "m".into(), failure: Some(rate) };
        assert_eq!(
            to_value(test_report(&bad)).unwrap()["failure"],
            json!({"kind": "rate_limited", "message": "anthropic at http://x answered 429", "http_status": 429, "retry_after_ms": 2000})
        );
        let unreachable = Failure { kind: FailureKind::Unreachable.into(), ..Default::default() };
        let f = to_value(failure(Some(&unreachable))).unwrap();
        assert_eq!(
            (f["kind"].as_str(), &f["http_status"], &f["retry_after_ms"]),
            (Some("unreachable"), &json!(null), &json!(null))
        );
        let listed = ListModelsReply { models: vec!["a".into(), "b".into()], hint: String::new(), failure: None };
        assert_eq!(
            to_value(models(&listed)).unwrap(),
            json!({"items": [{"id": "a"}, {"id": "b"}], "next_cursor": null, "hint": null, "failure": null})
        );
        let empty = ListModelsReply { models: vec![], hint: "type an id".into(), failure: None };
        assert_eq!(models(&empty).hint.as_deref(), Some("type an id"));
    }
}
