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
use coffer_proto::sync::sync_client::SyncClient;
use coffer_proto::sync::{
    Conflict, ConflictKind, Counts, Direction, InitRequest, SyncReport, SyncRequest, SyncStatus, SyncStatusRequest,
    WorkerState,
};
use coffer_runtime::grpc::AuthChannel;
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::error::{ApiError, Code, JsonBody};
use crate::state::AppState;

/// The Sync client type.
pub type Client = SyncClient<AuthChannel>;

/// Deadline of `init` and `sync` (a first push of thousands of notes over a slow link).
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(900);
/// Deadline of `status`.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

/// A lazily connecting client of the Sync service at `addr` presenting `token`.
///
/// # Errors
/// When `addr` is not a valid authority.
pub fn client(addr: &str, token: &SecretString) -> Result<Client, tonic::transport::Error> {
    let ch = coffer_runtime::grpc::watched_channel(addr, token, Duration::from_secs(1), Duration::from_secs(2))?;
    Ok(SyncClient::new(ch).max_decoding_message_size(crate::retrieval::MAX_REPLY))
}

/// The routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/sync", post(sync)).route("/v1/sync/init", post(init)).route("/v1/sync/status", get(status))
}

fn counts_json(c: Option<&Counts>) -> Value {
    let c = c.cloned().unwrap_or_default();
    json!({"added": c.added, "changed": c.changed, "removed": c.removed})
}

fn direction_json(d: Option<&Direction>) -> Value {
    let d = d.cloned().unwrap_or_default();
    json!({"files": counts_json(d.files.as_ref()), "vault": counts_json(d.vault.as_ref()), "paths": d.paths})
}

fn conflict_json(c: &Conflict) -> Value {
    let kind = match c.kind() {
        ConflictKind::BothKept => "both_kept",
        ConflictKind::NewerKept => "newer_kept",
        ConflictKind::Unspecified => "unknown",
    };
    json!({"kind": kind, "path": c.path, "sibling": c.sibling, "detail": c.detail})
}

fn ms(v: i64) -> Value {
    if v > 0 { json!(v) } else { Value::Null }
}

/// The JSON of a sync's report (REST and the CLI's `--json`).
pub fn report_json(r: &SyncReport) -> Value {
    json!({
        "pushed": direction_json(r.pushed.as_ref()),
        "pulled": direction_json(r.pulled.as_ref()),
        "conflicts": r.conflicts.iter().map(conflict_json).collect::<Vec<_>>(),
        "commit": r.commit,
        "finished_ms": ms(r.finished_ms),
        "missing_credentials": r.missing_credentials,
        "remote": r.remote,
    })
}

/// The worker state's word.
pub fn worker_word(w: WorkerState) -> &'static str {
    match w {
        WorkerState::Off | WorkerState::Unspecified => "off",
        WorkerState::Idle => "idle",
        WorkerState::Waiting => "waiting",
        WorkerState::Syncing => "syncing",
        WorkerState::BackingOff => "backing_off",
    }
}

/// The JSON of the sync status (REST, `/v1/status`'s `sync`, the CLI's `--json`).
pub fn status_json(s: &SyncStatus) -> Value {
    json!({
        "initialized": s.initialized,
        "remote": s.remote,
        "ahead": s.ahead,
        "behind": s.behind,
        "last_sync_ms": ms(s.last_sync_ms),
        "last_error": if s.last_error.is_empty() { Value::Null } else { json!(s.last_error) },
        "conflicts": s.conflicts.iter().map(conflict_json).collect::<Vec<_>>(),
        "worker": worker_word(s.worker()),
        "next_attempt_ms": ms(s.next_attempt_ms),
        "machine": s.machine,
        "missing_credentials": s.missing_credentials,
        "running": s.running,
        "failures": s.failures,
    })
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
    JsonBody(body): JsonBody<coffer_api::sync::SyncInit>,
) -> Result<Json<Value>, ApiError> {
    let remote = body.remote;
    let machine_name = body.machine_name.unwrap_or_default();
    let r = coffer_runtime::grpc::call_within(
        "retrieval service",
        SYNC_TIMEOUT,
        st.sync.clone().init(InitRequest { remote, machine_name }),
    )
    .await
    .map_err(from_sync)?;
    Ok(Json(report_json(&r)))
}

async fn sync(State(st): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let r = coffer_runtime::grpc::call_within("retrieval service", SYNC_TIMEOUT, st.sync.clone().sync(SyncRequest {}))
        .await
        .map_err(from_sync)?;
    Ok(Json(report_json(&r)))
}

async fn status(State(st): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let s = coffer_runtime::grpc::call_within(
        "retrieval service",
        STATUS_TIMEOUT,
        st.sync.clone().status(SyncStatusRequest {}),
    )
    .await
    .map_err(ApiError::from_retrieval)?;
    Ok(Json(status_json(&s)))
}
