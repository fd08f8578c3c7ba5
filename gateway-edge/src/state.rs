//! Shared state of the edge process.
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use coffer_proto::control::control_client::ControlClient;
use coffer_runtime::grpc::AuthChannel;
use coffer_runtime::home::CofferHome;
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use crate::snapshot::SnapshotHandle;
use crate::store::StoreClients;

/// How long a web session cookie lives (`Max-Age`).
pub const WEB_SESSION_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// Web-session ids issued by the web console's one-time login (`crate::ui`).
#[derive(Default)]
pub struct WebSessions(Mutex<HashSet<String>>);

impl WebSessions {
    /// True when `id` is a live session. Ids are 64 random hex characters, so a set lookup
    /// leaks nothing useful about other ids' values.
    pub fn contains(&self, id: &str) -> bool {
        id.len() == 64 && self.0.lock().expect("web sessions").contains(id)
    }

    /// Starts a session; returns its id (the cookie value).
    pub fn create(&self) -> String {
        let id = secrecy::ExposeSecret::expose_secret(&coffer_runtime::token::random_token()).to_owned();
        self.0.lock().expect("web sessions").insert(id.clone());
        id
    }

    /// Ends every session; returns how many there were.
    pub fn revoke_all(&self) -> usize {
        let mut s = self.0.lock().expect("web sessions");
        let n = s.len();
        s.clear();
        n
    }
}

/// Everything a request handler may need.
pub struct AppState {
    pub public_token: SecretString,
    /// Public port, for the Host/Origin checks.
    pub port: u16,
    pub pid: u32,
    pub started_at: String,
    pub store: StoreClients,
    /// `coffer-retrieval` (knowledge bases, memory, skills), lazily connected; call through
    /// [`crate::retrieval::call`].
    pub retrieval: crate::retrieval::Client,
    /// `coffer-chat` (agents, conversations, turns, events), lazily connected; unary calls go
    /// through [`crate::chat::call`].
    pub chat: crate::chat::Client,
    pub control: ControlClient<AuthChannel>,
    pub snapshot: SnapshotHandle,
    pub web_sessions: WebSessions,
    /// One-time codes `coffer ui` prints, redeemed by `GET /ui/login`.
    pub login_codes: crate::ui::LoginCodes,
    pub gateway: Arc<crate::mcp::Gateway>,
    /// `COFFER_HOME` (log files for `/v1/logs`).
    pub home: CofferHome,
    /// Cancelled at shutdown; long-lived responses (SSE) end on it so draining finishes.
    pub shutdown: CancellationToken,
}
