//! Where the daemon is: the [`Connector`] seam between the bridge and detect-or-spawn, so tests
//! can point the shim at a stand-in `/mcp` server.
use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use coffer_runtime::home::CofferHome;
use secrecy::SecretString;

use crate::memory::Memory;

/// Any error a [`Connector`] reports; the shim only shows its message.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How to reach the daemon's public HTTP edge.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `http://127.0.0.1:<port>`, without a trailing slash.
    pub base_url: String,
    /// The public token, sent as `X-Coffer-Token` on every request.
    pub token: SecretString,
    /// The client to send with (loopback: no proxy, no TLS).
    pub http: reqwest::Client,
    /// Try switching `/mcp` to a stream (`Upgrade: coffer-mcp-stream`) before using Streamable
    /// HTTP. The Coffer daemon offers it; a server that answers the upgrade with anything but
    /// `101` is then spoken to with Streamable HTTP. [`Endpoint::new`] leaves it off.
    pub stream: bool,
    /// The daemon's Unix-domain socket (`daemon.json` `socket`): the same HTTP edge as
    /// `base_url`, used for the `/mcp` stream when set (the TCP address when connecting to it
    /// fails). Streamable HTTP always uses `base_url`.
    pub socket: Option<std::path::PathBuf>,
}

impl Endpoint {
    /// An endpoint at `base_url` using a new [`mcp_client`].
    pub fn new(base_url: impl Into<String>, token: SecretString) -> Self {
        Self { base_url: base_url.into(), token, http: mcp_client(), stream: false, socket: None }
    }

    /// The endpoint with [`Endpoint::stream`] set to `stream`.
    #[must_use]
    pub fn with_stream(self, stream: bool) -> Self {
        Self { stream, ..self }
    }

    /// The endpoint with [`Endpoint::socket`] set to `socket`.
    #[must_use]
    pub fn with_socket(self, socket: Option<std::path::PathBuf>) -> Self {
        Self { socket, ..self }
    }

    /// The MCP endpoint, `{base_url}/mcp`.
    pub(crate) fn mcp_url(&self) -> String {
        format!("{}/mcp", self.base_url.trim_end_matches('/'))
    }
}

/// Finds (or starts) the daemon. The shim calls it before it forwards the first message and
/// again whenever the daemon connection or the MCP session was lost.
pub trait Connector: Send + Sync + 'static {
    /// Returns how to reach a running daemon.
    ///
    /// # Errors
    /// Any error that means the daemon cannot be reached; the shim answers the message that
    /// needed it with a JSON-RPC error (-32001) carrying this error's text.
    fn connect(&self) -> impl Future<Output = Result<Endpoint, BoxError>> + Send;

    /// Where the shim keeps the daemon's discovery answers for a cold start (see
    /// [`Memory`]); `None` (the default) keeps none, so every request waits for the daemon.
    fn memory(&self) -> Option<Memory> {
        None
    }

    /// Whether a daemon is up and ready now (a cheap local check, no request). Only while it
    /// is not does the shim answer from [`Connector::memory`]: a running daemon answers within
    /// milliseconds, and its answer is current (a server added since the memory was written is
    /// in it). The default says yes.
    fn daemon_ready(&self) -> bool {
        true
    }
}

/// Whose credentials the shim connects with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The owner's: `daemon.json` and its token; starts the daemon when none runs
    /// ([`coffer_runtime::connect::detect_or_spawn`]). What an MCP client the user set up gets.
    Owner,
    /// A managed agent's: `agent-access/agent.json` and its token, which the edge accepts on
    /// `/mcp` only ([`coffer_runtime::connect::connect_agent`]); never starts a daemon. Chosen
    /// by `COFFER_AGENT_SHIM=1`, which Coffer writes into the agents' MCP configs: the agent
    /// sandbox does not let the agent (or its shim) read `daemon.json`.
    Agent,
}

impl Access {
    /// [`Access::Agent`] when `COFFER_AGENT_SHIM` is set to anything but empty or `0`, else
    /// [`Access::Owner`].
    pub fn from_env() -> Self {
        match std::env::var_os(coffer_runtime::env::AGENT_SHIM) {
            Some(v) if !v.is_empty() && v != "0" => Self::Agent,
            _ => Self::Owner,
        }
    }
}

/// The conversation named by `COFFER_CONVERSATION` (set by Coffer in a managed agent's MCP
/// config), as the `X-Coffer-Conversation` value the shim sends on `/mcp`; `None` when unset or
/// not a valid conversation id. Read once per process.
pub fn conversation_header() -> Option<reqwest::header::HeaderValue> {
    static ONCE: OnceLock<Option<reqwest::header::HeaderValue>> = OnceLock::new();
    ONCE.get_or_init(|| {
        let v = std::env::var(coffer_runtime::env::CONVERSATION).ok()?;
        if !coffer_types::mcp::valid_conversation_id(&v) {
            return None;
        }
        reqwest::header::HeaderValue::from_str(&v).ok()
    })
    .clone()
}

/// The production connector: detect-or-spawn on `COFFER_HOME` (see
/// [`coffer_runtime::connect::detect_or_spawn`]), starting `coffer-daemon` when none runs; or,
/// for a managed agent ([`Access::Agent`]), the running daemon through `agent.json` only.
pub struct DaemonConnector {
    home: Result<CofferHome, String>,
    access: Access,
    warned_version: AtomicBool,
    /// The client for `/mcp`, built on first use and kept across re-connections.
    http: OnceLock<reqwest::Client>,
}

/// The client the shim talks to `/mcp` with: HTTP/2 over cleartext TCP with prior knowledge
/// (h2c, RFC 9113 §3.3), so all requests of the session are streams on one connection: the
/// frames of requests (and answers) in flight together travel in one write and one read, where
/// HTTP/1.1 needs a connection, a write and a read per request.
pub fn mcp_client() -> reqwest::Client {
    coffer_runtime::tls::ensure_provider();
    reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .connect_timeout(std::time::Duration::from_secs(2))
        .pool_idle_timeout(std::time::Duration::from_secs(30))
        .tcp_nodelay(true)
        .build()
        .expect("reqwest client builds")
}

impl DaemonConnector {
    /// A connector for `COFFER_HOME` (default `~/.coffer`) with the access `COFFER_AGENT_SHIM`
    /// selects ([`Access::from_env`]). A home that cannot be determined is reported on each
    /// connection attempt rather than here, so the shim still answers the client with a
    /// JSON-RPC error.
    pub fn from_env() -> Self {
        Self {
            home: CofferHome::from_env().map_err(|e| e.to_string()),
            access: Access::from_env(),
            warned_version: AtomicBool::new(false),
            http: OnceLock::new(),
        }
    }

    /// A connector for an explicit home with the owner's access.
    pub fn new(home: CofferHome) -> Self {
        Self { home: Ok(home), access: Access::Owner, warned_version: AtomicBool::new(false), http: OnceLock::new() }
    }

    /// This connector with `access`.
    #[must_use]
    pub fn with_access(self, access: Access) -> Self {
        Self { access, ..self }
    }

    /// The access it connects with.
    pub fn access(&self) -> Access {
        self.access
    }
}

impl Connector for DaemonConnector {
    /// `COFFER_HOME/cache/shim`, scoped by this shim's version, arguments and `COFFER_PROFILE`
    /// (what selects the session's view). None for a managed agent: its daemon always runs
    /// (it is never started by its shim) and its sandbox may not let it write the home.
    fn memory(&self) -> Option<Memory> {
        let home = self.home.as_ref().ok()?;
        if self.access != Access::Owner {
            return None;
        }
        let args: Vec<String> = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
        let profile = std::env::var("COFFER_PROFILE").ok();
        let scope = serde_json::json!([coffer_runtime::VERSION, args, profile]).to_string();
        Some(Memory::new(home.root().join("cache").join("shim"), scope))
    }

    /// A daemon holds `daemon.lock` and has written `daemon.json` (it does once every service is
    /// healthy): [`coffer_runtime::connect::ready_daemon`].
    fn daemon_ready(&self) -> bool {
        self.home.as_ref().is_ok_and(|home| coffer_runtime::connect::ready_daemon(home).is_some())
    }

    async fn connect(&self) -> Result<Endpoint, BoxError> {
        let home = self.home.as_ref().map_err(|e| BoxError::from(e.clone()))?;
        let daemon = match self.access {
            Access::Owner => coffer_runtime::connect::detect_or_spawn(home).await?,
            Access::Agent => coffer_runtime::connect::connect_agent(home).await?,
        };
        if daemon.version_mismatch() && !self.warned_version.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                shim_version = coffer_runtime::VERSION,
                daemon_version = %daemon.info.version,
                "The running coffer-daemon is another version than this shim; run `coffer daemon restart` to use one version."
            );
        }
        let http = self.http.get_or_init(mcp_client).clone();
        Ok(Endpoint {
            base_url: daemon.base_url,
            token: daemon.info.token,
            http,
            stream: true,
            socket: daemon.info.socket,
        })
    }
}
