//! The store's gRPC services, one module per domain of `coffer.db`; each holds its domain's SQL
//! and the tonic glue of its service (`proto/store_<domain>.proto`):
//!
//! | module | service | tables |
//! |---|---|---|
//! | [`registry`] | `Registry` | `mcp_servers`, `capability_prefs` |
//! | [`credentials`] | `Credentials` | `credentials` (through [`crate::credential_crypto`]) |
//! | [`settings`] | `Settings` | `settings` |
//! | [`audit`] | `Audit` | `audit_log` (and [`audit::record`] for the other domains' writes) |
//! | [`invocations`] | `Invocations` | `mcp_invocations` |
//! | [`changes`] | `Changes` | `changes` (rows written by [`crate::db::Db::write`]) |
//! | [`maintenance`] | `Maintenance` | retention ([`crate::retention`]) and backups ([`crate::backup`]) |
//! | [`index`] | `Index` | `kb_*` (retrieval's derived indexes: documents, chunks, FTS5 `kb_fts`, vec0 `kb_vectors`) |
//! | [`conversations`] | `Conversations` | `conversations`, `conversation_titles` (trigram FTS5), `messages`, `pending_items`, `conversation_allowed_tools` (the chat service's) |
//! | [`llm`] | `LlmConnections` | `llm_connections` (no secret: a credential reference) |
//! | [`channels`] | `Channels` | `channels`, `channel_events` (no secret: credential references, a pairing code's digest) |
//! | [`profiles`] | `Profiles` | `profiles` (each spec a `coffer_api::profiles::ProfileSpec` as JSON text) |
//! | [`sync_export`] | `VaultState` | every table `coffer sync` carries, exported as canonical JSON and applied |
//!
//! [`StoreError`] becomes a `tonic::Status` here, once; a domain's own error (the credential crypto's, the
//! backup's) once in its module. Adding a domain is a proto file, a module here and a line in
//! [`routes`].
pub mod audit;
pub mod changes;
pub mod channels;
pub mod conversations;
pub mod credentials;
pub mod index;
pub mod invocations;
pub mod llm;
pub mod maintenance;
pub mod profiles;
pub mod registry;
pub mod settings;
pub mod sync_export;

use tonic::Status;

use crate::credential_crypto::CredentialCrypto;
use crate::db::{Db, StoreError};

/// Largest gRPC request a store service decodes (bytes): an invocation batch stays under half
/// of it, and so does a message of the largest size `Conversations` stores
/// ([`conversations::MAX_MESSAGE_BYTES`], 8 MiB; a 1 MiB chat message is far below).
pub const MAX_DECODING_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// Longest page a list RPC returns.
const MAX_PAGE: u32 = 500;

/// Every store service over `db`, encrypting credentials with `vault`, for one listener.
pub fn routes(db: &Db, vault: CredentialCrypto) -> tonic::service::Routes {
    use coffer_proto::store::{
        audit_server::AuditServer, changes_server::ChangesServer, channels_server::ChannelsServer,
        conversations_server::ConversationsServer, credentials_server::CredentialsServer, index_server::IndexServer,
        invocations_server::InvocationsServer, llm_connections_server::LlmConnectionsServer,
        maintenance_server::MaintenanceServer, profiles_server::ProfilesServer, registry_server::RegistryServer,
        settings_server::SettingsServer, vault_state_server::VaultStateServer,
    };
    const MAX: usize = MAX_DECODING_MESSAGE_SIZE;
    tonic::service::Routes::new(
        RegistryServer::new(registry::RegistryService::new(db.clone())).max_decoding_message_size(MAX),
    )
    .add_service(
        CredentialsServer::new(credentials::CredentialsService::new(db.clone(), vault)).max_decoding_message_size(MAX),
    )
    .add_service(SettingsServer::new(settings::SettingsService::new(db.clone())).max_decoding_message_size(MAX))
    .add_service(AuditServer::new(audit::AuditService::new(db.clone())).max_decoding_message_size(MAX))
    .add_service(
        InvocationsServer::new(invocations::InvocationsService::new(db.clone())).max_decoding_message_size(MAX),
    )
    .add_service(ChangesServer::new(changes::ChangesService::new(db.clone())).max_decoding_message_size(MAX))
    .add_service(
        MaintenanceServer::new(maintenance::MaintenanceService::new(db.clone())).max_decoding_message_size(MAX),
    )
    .add_service(
        IndexServer::new(index::IndexService::new(db.clone()))
            .max_decoding_message_size(index::MAX_DECODING_MESSAGE_SIZE),
    )
    .add_service(
        ConversationsServer::new(conversations::ConversationsService::new(db.clone())).max_decoding_message_size(MAX),
    )
    .add_service(LlmConnectionsServer::new(llm::LlmConnectionsService::new(db.clone())).max_decoding_message_size(MAX))
    .add_service(ChannelsServer::new(channels::ChannelsService::new(db.clone())).max_decoding_message_size(MAX))
    .add_service(ProfilesServer::new(profiles::ProfilesService::new(db.clone())).max_decoding_message_size(MAX))
    .add_service(VaultStateServer::new(sync_export::VaultStateService::new(db.clone())).max_decoding_message_size(MAX))
}

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Invalid(m) => Status::invalid_argument(m),
            StoreError::NotFound(m) => Status::not_found(format!("{m} not found")),
            StoreError::Exists(m) => Status::already_exists(format!("{m} already exists")),
            e @ StoreError::Conflict { .. } => Status::aborted(e.to_string()),
            StoreError::Precondition(m) => Status::failed_precondition(m),
            StoreError::Aborted(m) => Status::aborted(m),
            other => {
                tracing::error!(error = %other, "Store failure.");
                Status::internal("store failure; see logs/store.log")
            }
        }
    }
}

/// The trace id of the request being served (read in the async handler: the writer thread has
/// no request context), or empty.
fn trace() -> String {
    coffer_runtime::grpc::current_trace().unwrap_or_default()
}

/// `s` cut to `n` characters (with `…`), for error messages that quote caller input.
fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_owned() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

/// The enum a wire `i32` names, or [`StoreError::Invalid`] naming `field` when it is unknown or
/// `Unspecified` (the zero every enum starts with).
fn required<E>(value: i32, field: &str) -> Result<E, StoreError>
where
    E: TryFrom<i32> + Copy + Into<i32>,
{
    match E::try_from(value) {
        Ok(e) if e.into() != 0 => Ok(e),
        _ => Err(StoreError::Invalid(format!("{field} is required"))),
    }
}

/// Trims a `limit + 1` result to `limit` and returns the cursor for the next page (0 = none).
fn page<T>(mut items: Vec<T>, limit: u32, id: impl Fn(&T) -> i64) -> (Vec<T>, i64) {
    if items.len() > limit as usize {
        items.truncate(limit as usize);
        let next = items.last().map(&id).unwrap_or(0);
        (items, next)
    } else {
        (items, 0)
    }
}
