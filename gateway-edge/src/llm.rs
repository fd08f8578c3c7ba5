//! The edge's client of coffer-chat's `Llm` service (`proto/llm.proto`, `coffer.llm.v1`):
//! probing LLM connections (REST `/v1/llm/connections/{name}/test|models`) and the internal
//! agent behind the `coffer__ask` built-in. Same channel shape as [`crate::chat`] (lazily
//! connected, HTTP/2 keep-alive pings notice a stopped `coffer-chat`).
use std::time::Duration;

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
    let ch = coffer_runtime::grpc::watched_channel(addr, token, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT)?;
    Ok(LlmClient::new(ch).max_decoding_message_size(MAX_MESSAGE).max_encoding_message_size(MAX_MESSAGE))
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
