//! The MCP gateway: one downstream MCP server aggregating every enabled upstream.
pub mod http;
pub mod jsonrpc;

use std::sync::Arc;

use coffer_proto::store::store_client::StoreClient;
use coffer_runtime::grpc::AuthChannel;
use coffer_runtime::home::CofferHome;
use tokio_util::sync::CancellationToken;

use crate::snapshot::SnapshotHandle;

/// Owner of every downstream session.
pub struct Gateway {
    #[allow(dead_code)]
    home: CofferHome,
    #[allow(dead_code)]
    store: StoreClient<AuthChannel>,
    #[allow(dead_code)]
    snapshot: SnapshotHandle,
    #[allow(dead_code)]
    shutdown: CancellationToken,
}

impl Gateway {
    pub fn new(home: CofferHome, store: StoreClient<AuthChannel>, snapshot: SnapshotHandle, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(Self { home, store, snapshot, shutdown })
    }

    /// Ends every session and its upstream children.
    pub async fn close_all(&self) {}

    /// Per-upstream status for `/v1/status`.
    pub fn upstream_status(&self) -> serde_json::Value {
        serde_json::Value::Array(vec![])
    }
}
