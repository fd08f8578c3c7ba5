//! The edge's clients of the store's per-domain gRPC services (`proto/store_*.proto`), all over
//! one channel to `coffer-store`.
use coffer_proto::store::audit_client::AuditClient;
use coffer_proto::store::changes_client::ChangesClient;
use coffer_proto::store::channels_client::ChannelsClient;
use coffer_proto::store::credentials_client::CredentialsClient;
use coffer_proto::store::invocations_client::InvocationsClient;
use coffer_proto::store::llm_connections_client::LlmConnectionsClient;
use coffer_proto::store::maintenance_client::MaintenanceClient;
use coffer_proto::store::profiles_client::ProfilesClient;
use coffer_proto::store::registry_client::RegistryClient;
use coffer_proto::store::settings_client::SettingsClient;
use coffer_runtime::grpc::AuthChannel;

/// Largest store reply the edge decodes (bytes): a registry listing can be large.
pub const MAX_REPLY: usize = 64 * 1024 * 1024;

/// One client per store service; cheap to clone (they share the channel). Call a method on a
/// clone (`st.store.registry.clone().list_servers(..)`): tonic clients take `&mut self`.
#[derive(Clone)]
pub struct StoreClients {
    pub registry: RegistryClient<AuthChannel>,
    pub credentials: CredentialsClient<AuthChannel>,
    pub settings: SettingsClient<AuthChannel>,
    pub audit: AuditClient<AuthChannel>,
    pub invocations: InvocationsClient<AuthChannel>,
    pub changes: ChangesClient<AuthChannel>,
    pub maintenance: MaintenanceClient<AuthChannel>,
    /// LLM connections (`proto/store_llm.proto`).
    pub llm: LlmConnectionsClient<AuthChannel>,
    /// Channels (`proto/store_channels.proto`).
    pub channels: ChannelsClient<AuthChannel>,
    /// Profiles (`proto/store_profiles.proto`).
    pub profiles: ProfilesClient<AuthChannel>,
}

impl StoreClients {
    /// Every store client over `channel` (see `coffer_runtime::grpc::channel`), each decoding
    /// replies up to [`MAX_REPLY`].
    pub fn new(channel: AuthChannel) -> Self {
        Self {
            registry: RegistryClient::new(channel.clone()).max_decoding_message_size(MAX_REPLY),
            credentials: CredentialsClient::new(channel.clone()).max_decoding_message_size(MAX_REPLY),
            settings: SettingsClient::new(channel.clone()).max_decoding_message_size(MAX_REPLY),
            audit: AuditClient::new(channel.clone()).max_decoding_message_size(MAX_REPLY),
            invocations: InvocationsClient::new(channel.clone()).max_decoding_message_size(MAX_REPLY),
            changes: ChangesClient::new(channel.clone()).max_decoding_message_size(MAX_REPLY),
            maintenance: MaintenanceClient::new(channel.clone()).max_decoding_message_size(MAX_REPLY),
            llm: LlmConnectionsClient::new(channel.clone()).max_decoding_message_size(MAX_REPLY),
            channels: ChannelsClient::new(channel.clone()).max_decoding_message_size(MAX_REPLY),
            profiles: ProfilesClient::new(channel).max_decoding_message_size(MAX_REPLY),
        }
    }
}
