//! The `coffer.sync.v1.Sync` gRPC service (`proto/sync.proto`) over the [`Engine`]; errors map
//! to status codes once, in `crate::error`.
use std::sync::Arc;

use coffer_proto::sync::sync_server::Sync;
use coffer_proto::sync::{InitRequest, SyncReport, SyncRequest, SyncStatus, SyncStatusRequest};
use tonic::{Request, Response, Status};

use super::Engine;

/// The service: one engine, one sync at a time.
pub struct SyncService {
    pub engine: Arc<Engine>,
}

#[tonic::async_trait]
impl Sync for SyncService {
    async fn init(&self, req: Request<InitRequest>) -> Result<Response<SyncReport>, Status> {
        let r = req.into_inner();
        Ok(Response::new(self.engine.init(&r.remote, &r.machine_name).await?))
    }

    async fn sync(&self, _req: Request<SyncRequest>) -> Result<Response<SyncReport>, Status> {
        Ok(Response::new(self.engine.sync().await?))
    }

    async fn status(&self, _req: Request<SyncStatusRequest>) -> Result<Response<SyncStatus>, Status> {
        Ok(Response::new(self.engine.status().await?))
    }
}
