//! Shared state of the edge process: the router state of `/v1` and `/ui`. The MCP transports
//! do not take it: `/mcp` is mounted with the gateway alone as its state
//! (`mcp::downstream::http::routes`), and nothing under `mcp/` names this module (held by
//! `mcp/tests/boundaries.rs`). The service clients are built once, one channel per service, by
//! [`crate::clients::Clients::connect`].
use std::sync::Arc;

use coffer_proto::control::control_client::ControlClient;
use coffer_runtime::grpc::AuthChannel;
use coffer_runtime::home::CofferHome;
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use crate::clients::store::StoreClients;
use crate::snapshot::SnapshotHandle;

/// How long a web session cookie lives (`Max-Age`): its idle expiry.
pub const WEB_SESSION_MAX_AGE: std::time::Duration = crate::web_sessions::IDLE_EXPIRY;

pub use crate::web_sessions::WebSessions;

/// Everything a request handler may need.
pub struct AppState {
    /// The owner's token (`daemon.json`): every route.
    pub public_token: SecretString,
    /// The managed agents' token (`agent-access/agent.json`): `/mcp` only (see
    /// [`crate::middleware::auth`]).
    pub agent_token: SecretString,
    /// Public port, for the Host/Origin checks.
    pub port: u16,
    pub pid: u32,
    pub started_at: String,
    pub store: StoreClients,
    /// `coffer-retrieval` (knowledge bases, memory, skills), lazily connected; call through
    /// [`crate::clients::retrieval::call`].
    pub retrieval: crate::clients::retrieval::Client,
    /// coffer-retrieval's `Sync` service (`coffer sync`), lazily connected.
    pub sync: crate::rest::sync::Client,
    /// `coffer-chat` (agents, conversations, turns, events), lazily connected; unary calls go
    /// through [`crate::clients::chat::call`].
    pub chat: crate::clients::chat::Client,
    /// coffer-chat's `Llm` service (connection probes, the internal agent); calls go through
    /// [`crate::clients::llm::call`].
    pub llm: crate::clients::llm::Client,
    /// coffer-chat's `ChannelAdapters` service (`proto/channel.proto`): the adapters' live state
    /// for `/v1/channels`.
    pub adapters: coffer_proto::channel::channel_adapters_client::ChannelAdaptersClient<AuthChannel>,
    pub control: ControlClient<AuthChannel>,
    pub snapshot: SnapshotHandle,
    /// Web-console sessions, persisted in `COFFER_HOME/web-sessions.json`.
    pub web_sessions: WebSessions,
    /// One-time codes `coffer ui` prints, redeemed by `GET /ui/login`.
    pub login_codes: crate::ui::LoginCodes,
    pub gateway: Arc<crate::mcp::Gateway>,
    /// `COFFER_HOME` (log files for `/v1/logs`).
    pub home: CofferHome,
    /// The multiplexed chat event streams (`GET /v1/events`) and the count of every chat
    /// event stream open.
    pub streams: crate::rest::events::Streams,
    /// Recent `Idempotency-Key`s of `POST /v1/conversations/{id}/messages` (a retried send
    /// is not queued twice).
    pub sends: crate::rest::idempotency::Recent,
    /// Cancelled at shutdown; long-lived responses (SSE) end on it so draining finishes.
    pub shutdown: CancellationToken,
}
