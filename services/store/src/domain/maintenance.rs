//! The `Maintenance` service: retention passes on request ([`crate::retention`], which also
//! runs at start and hourly) and backups ([`crate::backup`]). Both are audited
//! (`maintenance.prune`, `backup.create`).
use coffer_proto::store::maintenance_server::Maintenance;
use coffer_proto::store::*;
use tonic::{Request, Response, Status};

use super::{audit, trace};
use crate::backup::BackupError;
use crate::db::Db;

impl From<BackupError> for Status {
    fn from(e: BackupError) -> Self {
        match e {
            BackupError::Invalid(m) => Status::invalid_argument(m),
            BackupError::Exists(m) => Status::already_exists(m),
            // The target is the caller's choice: say what is wrong with it.
            BackupError::Target { .. } => Status::failed_precondition(format!("cannot write the backup: {e}")),
            BackupError::Source { .. } => {
                tracing::error!(error = %e, "Backup failed reading the home.");
                Status::internal(format!("backup failed: {e}"))
            }
            BackupError::Store(e) => e.into(),
        }
    }
}

/// The `Maintenance` gRPC service.
pub struct MaintenanceService {
    db: Db,
}

impl MaintenanceService {
    /// The service over `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn prune_now(&self, req: Request<PruneNowRequest>) -> Result<Response<PruneNowReply>, Status> {
        let trace = trace();
        let actor = req.into_inner().actor;
        let p = crate::retention::prune_now(&self.db, &actor, &trace).await?;
        tracing::info!(
            invocations = p.invocations,
            audit = p.audit,
            conversations_archived = p.conversations_archived,
            conversations_deleted = p.conversations_deleted,
            "Pruned on request."
        );
        Ok(Response::new(PruneNowReply {
            invocations: p.invocations,
            audit: p.audit,
            conversations_archived: p.conversations_archived,
            conversations_deleted: p.conversations_deleted,
        }))
    }

    async fn backup(&self, req: Request<BackupRequest>) -> Result<Response<BackupReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        let started = std::time::Instant::now();
        let out = crate::backup::backup(&self.db, &r.path).await?;
        let dir = out.dir.display().to_string();
        tracing::info!(
            dir = %dir,
            secret_key = out.secret_key_included,
            skipped = out.skipped.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "Backup written."
        );
        let target = dir.clone();
        self.db.write(move |t, _| audit::record(t, &trace, &r.actor, "backup.create", &target)).await?;
        Ok(Response::new(BackupReply {
            path: dir,
            manifest_json: out.manifest_json,
            secret_key_included: out.secret_key_included,
            skipped: out.skipped,
        }))
    }
}
