//! `/v1/sync`, `/v1/sync/init`, `/v1/sync/status`: REST over coffer-retrieval's `Sync` service
//! (`proto/sync.proto`), for the CLI (`coffer sync …`) and the console's Settings page. A sync
//! runs git against the user's remote, so its deadline is long ([`SYNC_TIMEOUT`]); status
//! answers at once. Failures are the envelope of [`ApiError::from_retrieval`]: 400 a bad remote
//! or a malformed vault file pulled (named), 409 not set up, 503 the remote unreachable (git's
//! message; nothing lost) or the service not running.
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use coffer_api::sync as api;
use coffer_proto::sync::sync_client::SyncClient;
use coffer_proto::sync::{
    Conflict, ConflictKind, Counts, Direction, InitRequest, SyncReport, SyncRequest, SyncStatus, SyncStatusRequest,
    WorkerState,
};
use coffer_runtime::grpc::AuthChannel;

use crate::error::{ApiError, Code, JsonBody};
use crate::state::AppState;

/// The Sync client type.
pub type Client = SyncClient<AuthChannel>;

/// Deadline of `init` and `sync` (a first push of thousands of notes over a slow link).
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(900);
/// Deadline of `status`.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

/// The routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/sync", post(sync)).route("/v1/sync/init", post(init)).route("/v1/sync/status", get(status))
}

fn counts(c: Option<&Counts>) -> api::Counts {
    let c = c.cloned().unwrap_or_default();
    api::Counts { added: c.added, changed: c.changed, removed: c.removed }
}

fn direction(d: Option<&Direction>) -> api::Direction {
    let d = d.cloned().unwrap_or_default();
    api::Direction { files: counts(d.files.as_ref()), vault: counts(d.vault.as_ref()), paths: d.paths }
}

fn conflict(c: &Conflict) -> api::SyncConflict {
    let kind = match c.kind() {
        ConflictKind::BothKept => api::ConflictKind::BothKept,
        ConflictKind::NewerKept => api::ConflictKind::NewerKept,
        ConflictKind::LocalKept => api::ConflictKind::LocalKept,
        ConflictKind::Unspecified => api::ConflictKind::Unknown,
    };
    api::SyncConflict { kind, path: c.path.clone(), sibling: c.sibling.clone(), detail: c.detail.clone() }
}

/// Unix ms, `None` for 0 (never, unknown).
fn ms(v: i64) -> Option<i64> {
    (v > 0).then_some(v)
}

/// A sync's report as REST answers it.
pub fn report(r: &SyncReport) -> api::SyncReport {
    api::SyncReport {
        pushed: direction(r.pushed.as_ref()),
        pulled: direction(r.pulled.as_ref()),
        conflicts: r.conflicts.iter().map(conflict).collect(),
        commit: r.commit.clone(),
        finished_ms: ms(r.finished_ms),
        missing_credentials: r.missing_credentials.clone(),
        remote: r.remote.clone(),
    }
}

/// The worker state as REST names it.
pub fn worker(w: WorkerState) -> api::Worker {
    match w {
        WorkerState::Off | WorkerState::Unspecified => api::Worker::Off,
        WorkerState::Idle => api::Worker::Idle,
        WorkerState::Waiting => api::Worker::Waiting,
        WorkerState::Syncing => api::Worker::Syncing,
        WorkerState::BackingOff => api::Worker::BackingOff,
    }
}

/// The sync status as REST answers it (`/v1/sync/status`, `/v1/status`'s `sync`).
pub fn status_view(s: &SyncStatus) -> api::SyncStatus {
    api::SyncStatus {
        initialized: s.initialized,
        remote: s.remote.clone(),
        ahead: s.ahead,
        behind: s.behind,
        last_sync_ms: ms(s.last_sync_ms),
        last_error: (!s.last_error.is_empty()).then(|| s.last_error.clone()),
        conflicts: s.conflicts.iter().map(conflict).collect(),
        worker: worker(s.worker()),
        next_attempt_ms: ms(s.next_attempt_ms),
        machine: s.machine.clone(),
        missing_credentials: s.missing_credentials.clone(),
        running: s.running,
        failures: s.failures,
    }
}

/// The sync status, for `/v1/status` (`None` while retrieval does not answer).
pub async fn current_status(st: &AppState) -> Option<SyncStatus> {
    coffer_runtime::grpc::call_within(
        "retrieval service",
        Duration::from_secs(5),
        st.sync.clone().status(SyncStatusRequest {}),
    )
    .await
    .ok()
}

/// The envelope of a failed sync call: the remote unreachable is 502 `UPSTREAM_UNAVAILABLE`
/// with git's message (the engine's `UNAVAILABLE` starts "cannot reach/push to the sync
/// remote"), a git failure 500 with git's message (never a secret: git prints none, URLs are
/// redacted); the rest as [`ApiError::from_retrieval`].
pub fn from_sync(s: tonic::Status) -> ApiError {
    let m = s.message();
    match s.code() {
        tonic::Code::Unavailable if m.starts_with("cannot reach the sync remote") || m.starts_with("cannot push") => {
            ApiError::new(Code::UpstreamUnavailable, m)
        }
        tonic::Code::Internal if m.starts_with("git ") => ApiError::new(Code::Internal, m),
        _ => ApiError::from_retrieval(s),
    }
}

async fn init(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody<api::SyncInit>,
) -> Result<Json<api::SyncReport>, ApiError> {
    let remote = body.remote;
    let machine_name = body.machine_name.unwrap_or_default();
    let r = coffer_runtime::grpc::call_within(
        "retrieval service",
        SYNC_TIMEOUT,
        st.sync.clone().init(InitRequest { remote, machine_name }),
    )
    .await
    .map_err(from_sync)?;
    Ok(Json(report(&r)))
}

async fn sync(State(st): State<Arc<AppState>>) -> Result<Json<api::SyncReport>, ApiError> {
    let r = coffer_runtime::grpc::call_within("retrieval service", SYNC_TIMEOUT, st.sync.clone().sync(SyncRequest {}))
        .await
        .map_err(from_sync)?;
    Ok(Json(report(&r)))
}

async fn status(State(st): State<Arc<AppState>>) -> Result<Json<api::SyncStatus>, ApiError> {
    let s = coffer_runtime::grpc::call_within(
        "retrieval service",
        STATUS_TIMEOUT,
        st.sync.clone().status(SyncStatusRequest {}),
    )
    .await
    .map_err(ApiError::from_retrieval)?;
    Ok(Json(status_view(&s)))
}
