//! The edge's clients of the internal services, one channel per service: `coffer-store`
//! ([`store::StoreClients`], one client per store domain), `coffer-retrieval` ([`retrieval`] and
//! its `Sync` service), `coffer-chat` ([`chat`], its `Llm` service [`llm`] and its
//! `ChannelAdapters`) and the supervisor's `Control`. Each module holds its client type, its
//! deadline-bounded `call` and the one JSON form of its messages.
//!
//! Every channel is lazily connected and presents the edge's internal token. Retrieval's and
//! Chat's are watched (HTTP/2 keep-alive pings while a call or stream is open, so a stopped
//! service is noticed within seconds: the supervisor keeps its listener); the store's and the
//! supervisor's are plain. Clients are cheap to clone (they share their service's channel);
//! tonic clients take `&mut self`, so call a method on a clone.
pub mod chat;
pub mod llm;
pub mod retrieval;
pub mod store;

use coffer_proto::channel::channel_adapters_client::ChannelAdaptersClient;
use coffer_proto::control::control_client::ControlClient;
use coffer_proto::sync::sync_client::SyncClient;
use coffer_runtime::grpc::AuthChannel;
use coffer_runtime::identity::Identity;
use coffer_runtime::service::Internal;

/// Every client the edge holds, built by [`Clients::connect`].
#[derive(Clone)]
pub struct Clients {
    /// `coffer-store`, one client per store service.
    pub store: store::StoreClients,
    /// `coffer-retrieval` (knowledge bases, memory, skills); call through [`retrieval::call`].
    pub retrieval: retrieval::Client,
    /// coffer-retrieval's `Sync` service (`coffer sync`), on the same channel.
    pub sync: SyncClient<AuthChannel>,
    /// `coffer-chat` (agents, conversations, turns, events); unary calls through [`chat::call`].
    pub chat: chat::Client,
    /// coffer-chat's `Llm` service (connection probes, the internal agent), on the same channel;
    /// calls through [`llm::call`].
    pub llm: llm::Client,
    /// coffer-chat's `ChannelAdapters` service (`proto/channel.proto`), on the same channel.
    pub adapters: ChannelAdaptersClient<AuthChannel>,
    /// The supervisor's `Control` service.
    pub control: ControlClient<AuthChannel>,
}

impl Clients {
    /// One lazily connecting channel per internal service named in `internal`, and every
    /// client over its service's channel. Nothing is contacted here.
    ///
    /// # Errors
    /// When a service has no address in `internal`, or the address is not a valid authority.
    pub fn connect(internal: &Internal) -> anyhow::Result<Self> {
        let token = internal.token();
        let retrieval = retrieval::channel(internal.addr(Identity::Retrieval)?, token)?;
        let chat = chat::channel(internal.addr(Identity::Chat)?, token)?;
        Ok(Self {
            store: store::StoreClients::new(internal.channel(Identity::Store)?),
            sync: SyncClient::new(retrieval.clone()).max_decoding_message_size(retrieval::MAX_REPLY),
            retrieval: retrieval::over(retrieval),
            llm: llm::over(chat.clone()),
            adapters: ChannelAdaptersClient::new(chat.clone()),
            chat: chat::over(chat),
            control: ControlClient::new(internal.channel(Identity::Supervisor)?),
        })
    }
}
