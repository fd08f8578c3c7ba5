//! `POST /v1/backup` (a consistent backup of the home, written by the store) and
//! `POST /v1/maintenance/prune` (one retention pass now). Restoring is offline only:
//! `coffer restore` runs against a stopped daemon, so there is no restore route.
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use coffer_api::maintenance::{Backup, BackupManifest, BackupRequest as BackupBody, Pruned, PrunedRows};
use coffer_proto::store::{BackupRequest, PruneNowRequest};

use crate::error::{ApiError, JsonBody};
use crate::rest::servers::actor;
use crate::state::AppState;

/// Backup and maintenance routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/backup", post(backup)).route("/v1/maintenance/prune", post(prune))
}

/// `POST /v1/backup` with `{"path": "/abs/dir"}` → 201 `{path, manifest, secret_key_included,
/// skipped}`: the store wrote `coffer.db` (a consistent snapshot), copies of `knowledge/`,
/// `memory/`, `skills/` and `secret.key` (when present), and `manifest.json` (`manifest` in the
/// answer) into the directory, created 0700 with files 0600. `secret_key_included: true` means
/// whoever holds the backup can decrypt its credentials. `skipped` lists entries of the
/// markdown folders that were not copied (symlinks, special files).
///
/// Errors: `INVALID_ARGUMENT` (a relative path, `..`, a directory inside a copied folder),
/// `ALREADY_EXISTS` (409: the target is a file or a non-empty directory), `CONFLICT` (409: the
/// target cannot be created or written; the message says why), `UNKNOWN_FIELD`.
async fn backup(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<BackupBody>,
) -> Result<(StatusCode, Json<Backup>), ApiError> {
    let req = BackupRequest { path: b.path, actor: actor(&headers) };
    let r = st.store.maintenance.clone().backup(req).await?.into_inner();
    let manifest: BackupManifest = serde_json::from_str(&r.manifest_json).map_err(ApiError::internal)?;
    tracing::info!(dir = %r.path, secret_key = r.secret_key_included, "Backup written.");
    Ok((
        StatusCode::CREATED,
        Json(Backup { path: r.path, manifest, secret_key_included: r.secret_key_included, skipped: r.skipped }),
    ))
}

/// `POST /v1/maintenance/prune` (no body) → `{"deleted": {"invocations": n, "audit": n}}`: one
/// retention pass now, with the `retention.*` settings (the store also runs one at start and
/// hourly). Recorded in the audit log as `maintenance.prune`.
///
/// Errors: `SERVICE_UNAVAILABLE` while the store restarts.
async fn prune(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Result<Json<Pruned>, ApiError> {
    let r = st.store.maintenance.clone().prune_now(PruneNowRequest { actor: actor(&headers) }).await?.into_inner();
    Ok(Json(Pruned { deleted: PrunedRows { invocations: r.invocations, audit: r.audit } }))
}
