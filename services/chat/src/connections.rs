//! LLM connections as coffer-chat uses them: a connection record (the store's `LlmConnections`,
//! `proto/store_llm.proto`) turned into a [`coffer_llm::Endpoint`] with its credential's value
//! (the store's `ResolveCredentials`), for the `Llm` service (probes, the internal agent) and for
//! binding a managed agent to a provider. This is the one place a connection's secret is read;
//! it lives in memory only ([`secrecy::SecretString`]) and reaches a provider request or an agent
//! CLI's environment, never a file or a log.
use std::time::Duration;

use coffer_proto::store as st;
use coffer_proto::store::credentials_client::CredentialsClient;
use coffer_proto::store::llm_connections_client::LlmConnectionsClient;
use coffer_runtime::grpc::AuthChannel;
use secrecy::SecretString;

/// A connection ready to use.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The record as stored (or the draft as given).
    pub record: st::LlmConnection,
    /// Where and how to reach it, with the credential's value.
    pub endpoint: coffer_llm::Endpoint,
}

/// Why a connection cannot be used. Messages name the connection and what to do; never a value.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// No connection of that name.
    #[error("no LLM connection named {0:?} (see `coffer llm list`)")]
    NotFound(String),
    /// No internal-default connection is configured.
    #[error(
        "no internal LLM connection is configured: add one with `coffer llm add NAME --wire anthropic|openai|openai-chat|ollama --model ID --default` (or `coffer llm default NAME`)"
    )]
    NoDefault,
    /// The connection names a credential that has no value on this machine.
    #[error(
        "LLM connection {connection:?} needs the credential {credential:?}, which is not set: `coffer credentials set {credential}`"
    )]
    CredentialMissing {
        /// The connection.
        connection: String,
        /// The credential it names.
        credential: String,
    },
    /// The record itself is unusable (unknown wire, base URL not a URL).
    #[error("LLM connection {connection:?}: {problem}")]
    Invalid {
        /// The connection.
        connection: String,
        /// What is wrong.
        problem: String,
    },
    /// The store did not answer.
    #[error("the store: {0}")]
    Store(#[from] tonic::Status),
}

/// The timeouts every request of a resolved endpoint gets (`llm.request_timeout_s`,
/// `llm.stall_timeout_s`).
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Until a response's headers.
    pub request: Duration,
    /// Between two stream events.
    pub stall: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        use coffer_types::settings::{LLM_REQUEST_TIMEOUT_S, LLM_STALL_TIMEOUT_S};
        Self {
            request: Duration::from_secs(LLM_REQUEST_TIMEOUT_S.default),
            stall: Duration::from_secs(LLM_STALL_TIMEOUT_S.default),
        }
    }
}

/// The store's clients for connections and their credentials. Cheap to clone.
#[derive(Clone)]
pub struct Connections {
    connections: LlmConnectionsClient<AuthChannel>,
    credentials: CredentialsClient<AuthChannel>,
}

impl Connections {
    /// Over a channel to the store.
    pub fn new(channel: AuthChannel) -> Self {
        Self { connections: LlmConnectionsClient::new(channel.clone()), credentials: CredentialsClient::new(channel) }
    }

    /// Every connection record (no secrets).
    ///
    /// # Errors
    /// [`ResolveError::Store`].
    pub async fn list(&self) -> Result<Vec<st::LlmConnection>, ResolveError> {
        Ok(self.connections.clone().list_connections(st::ListConnectionsRequest {}).await?.into_inner().connections)
    }

    /// The connection `name`, resolved.
    ///
    /// # Errors
    /// [`ResolveError::NotFound`], and as [`Connections::resolve`].
    pub async fn get(&self, name: &str, timeouts: Timeouts) -> Result<Resolved, ResolveError> {
        let record =
            match self.connections.clone().get_connection(st::GetConnectionRequest { name: name.to_owned() }).await {
                Ok(r) => r.into_inner(),
                Err(s) if s.code() == tonic::Code::NotFound => return Err(ResolveError::NotFound(name.to_owned())),
                Err(s) => return Err(s.into()),
            };
        self.resolve(record, timeouts).await
    }

    /// The internal-default connection, resolved.
    ///
    /// # Errors
    /// [`ResolveError::NoDefault`], and as [`Connections::resolve`].
    pub async fn internal_default(&self, timeouts: Timeouts) -> Result<Resolved, ResolveError> {
        let record = self.list().await?.into_iter().find(|c| c.internal_default).ok_or(ResolveError::NoDefault)?;
        self.resolve(record, timeouts).await
    }

    /// `record` (stored or a draft) with its credential's value.
    ///
    /// # Errors
    /// [`ResolveError::Invalid`] for an unknown wire or a base URL that is not one;
    /// [`ResolveError::CredentialMissing`] when the named credential has no value.
    pub async fn resolve(&self, record: st::LlmConnection, timeouts: Timeouts) -> Result<Resolved, ResolveError> {
        let invalid = |problem: String| ResolveError::Invalid { connection: record.name.clone(), problem };
        let wire = match st::LlmWire::try_from(record.wire).unwrap_or(st::LlmWire::Unspecified) {
            st::LlmWire::Anthropic => coffer_llm::Wire::Anthropic,
            st::LlmWire::OpenaiResponses => coffer_llm::Wire::OpenAiResponses,
            st::LlmWire::OpenaiChat => coffer_llm::Wire::OpenAiChat,
            st::LlmWire::Ollama => coffer_llm::Wire::Ollama,
            st::LlmWire::Unspecified => return Err(invalid("the wire is not set".into())),
        };
        let base = if record.base_url.trim().is_empty() {
            wire.default_base_url()
                .ok_or_else(|| invalid(format!("a {} connection needs a base URL", wire.as_str())))?
        } else {
            record.base_url.trim()
        };
        let base_url = url::Url::parse(base).map_err(|e| invalid(format!("base URL {base:?} is not a URL: {e}")))?;
        let secret = if record.credential_ref.is_empty() {
            None
        } else {
            let name = record.credential_ref.clone();
            let values = match self
                .credentials
                .clone()
                .resolve_credentials(st::ResolveCredentialsRequest { names: vec![name.clone()] })
                .await
            {
                Ok(r) => r.into_inner().values,
                Err(s) if s.code() == tonic::Code::NotFound => Default::default(),
                Err(s) => return Err(s.into()),
            };
            match values.get(&name) {
                Some(v) => Some(SecretString::from(v.clone())),
                None => {
                    return Err(ResolveError::CredentialMissing { connection: record.name.clone(), credential: name });
                }
            }
        };
        let endpoint = coffer_llm::Endpoint {
            wire,
            base_url,
            secret,
            request_timeout: timeouts.request,
            stall_timeout: timeouts.stall,
        };
        Ok(Resolved { record, endpoint })
    }
}
