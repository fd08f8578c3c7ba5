//! Streamable HTTP upstreams (MCP 2025-11-25 basic/transports §Streamable HTTP, client side):
//! a per-session client session with the same semantics as a stdio upstream.
//!
//! Placeholder transport: every send fails until the HTTP client is built.
use std::sync::Arc;

use coffer_proto::store::McpServer;

use super::upstream::{Core, UpstreamError};

/// Client side of one upstream Streamable HTTP session.
pub struct HttpTransport {
    core: Arc<Core>,
}

impl HttpTransport {
    /// Prepares a client for `server.url` with `server.headers`; connects on the first send.
    ///
    /// # Errors
    /// A message when the URL or headers are unusable.
    pub fn new(server: &McpServer, core: Arc<Core>) -> Result<Self, String> {
        let _ = server;
        Ok(Self { core })
    }

    /// Records the negotiated protocol version (sent as `MCP-Protocol-Version` from now on).
    pub fn initialized(&self, _protocol_version: &str) {}

    /// POSTs one JSON-RPC message; answers are fed to the core.
    ///
    /// # Errors
    /// [`UpstreamError::Closed`] when the upstream cannot be reached.
    pub async fn send(&self, _line: String, _request_id: Option<u64>) -> Result<(), UpstreamError> {
        Err(UpstreamError::Closed { server: self.core.server.clone(), reason: "HTTP upstreams are not supported yet".into() })
    }

    /// Ends the upstream session (`DELETE`).
    pub async fn close(&self) {}
}
