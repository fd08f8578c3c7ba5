//! `/v1/credentials…`: the encrypted credential store over the store's typed RPCs. Values are
//! write-only: no response, error message or log line carries one (the store encrypts them and
//! hands them out only to start an upstream, see `mcp::Shared::resolve_server`).
//!
//! The acting party recorded in the audit log is `api` unless `X-Coffer-Actor` says otherwise.
use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::get;
use axum::{Json, Router};
use coffer_api::Page;
use coffer_api::credentials::{Credential, CredentialPut, CredentialSet};
use coffer_proto::store::{CredentialInfo, DeleteCredentialRequest, ListCredentialsRequest, SetCredentialRequest};
use serde_json::json;

use crate::error::{ApiError, Code, JsonBody};
use crate::rest::servers::{actor, settle};
use crate::state::AppState;

/// Longest credential value (bytes), as the store enforces.
pub const MAX_VALUE_BYTES: usize = coffer_api::credentials::MAX_VALUE_BYTES;

/// Credential routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/credentials", get(list))
        .route("/v1/credentials/{name}", get(get_one).put(put).delete(delete))
}

fn info(c: &CredentialInfo) -> Credential {
    Credential {
        name: c.name.clone(),
        version: c.version,
        created_at: c.created_at.clone(),
        updated_at: c.updated_at.clone(),
    }
}

async fn all(st: &AppState) -> Result<Vec<CredentialInfo>, ApiError> {
    Ok(st.store.credentials.clone().list_credentials(ListCredentialsRequest {}).await?.into_inner().items)
}

/// Fails unless every credential in `names` exists: for registering servers whose `env` or
/// `headers` reference credentials (checked at registration, not only when an upstream starts).
///
/// # Errors
/// `INVALID_ARGUMENT` naming the first name that is not a valid credential name or does not
/// exist (details `{"credential": name}`); store errors.
pub async fn require_credentials(st: &AppState, names: &BTreeSet<String>) -> Result<(), ApiError> {
    if names.is_empty() {
        return Ok(());
    }
    if let Some(bad) = names.iter().find(|n| !crate::credentials::valid_name(n)) {
        let shown: String = bad.chars().take(80).collect();
        return Err(ApiError::invalid(format!("{shown:?} is not a valid credential name"))
            .with_details(json!({"credential": shown})));
    }
    let existing: BTreeSet<String> = all(st).await?.into_iter().map(|c| c.name).collect();
    crate::credentials::require_existing(names, &existing)
}

/// `GET /v1/credentials` → `{"items":[{name, version, created_at, updated_at}…],
/// "next_cursor":null}`, sorted by name; never a value.
///
/// Errors: `SERVICE_UNAVAILABLE` while the store restarts.
async fn list(State(st): State<Arc<AppState>>) -> Result<Json<Page<Credential>>, ApiError> {
    Ok(Json(Page::all(all(&st).await?.iter().map(info).collect())))
}

/// `GET /v1/credentials/{name}` → `{name, version, created_at, updated_at}`; never the value.
///
/// Errors: `NOT_FOUND`.
async fn get_one(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<Credential>, ApiError> {
    all(&st)
        .await?
        .iter()
        .find(|c| c.name == name)
        .map(|c| Json(info(c)))
        .ok_or_else(|| ApiError::not_found(format!("credential {:?} not found", shown(&name))))
}

/// `PUT /v1/credentials/{name}` with `{"value": "…"}` (1-65536 bytes) → `{name, version,
/// updated_at}`: 201 when it created the credential, 200 when it replaced the value (the version
/// goes up by one). The value is never echoed.
///
/// Errors: `INVALID_ARGUMENT` (name, value length or content, body shape — the message never
/// quotes the body), `UNKNOWN_FIELD`, `CONFLICT` when `secret.key` is unusable (the message
/// names the file and what is wrong with it), `ALREADY_EXISTS` with `If-None-Match: *` when the
/// name exists (its value untouched).
async fn put(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<JsonBody<CredentialPut>, ApiError>,
) -> Result<(StatusCode, Json<CredentialSet>), ApiError> {
    let JsonBody(body) = body.map_err(|e| match e.code {
        // serde's type errors may quote what was sent: say what is expected instead.
        Code::InvalidArgument => ApiError::invalid("the body must be {\"value\": \"<1-65536 bytes>\"}"),
        _ => e,
    })?;
    let len = body.value.len();
    if len == 0 || len > MAX_VALUE_BYTES {
        return Err(ApiError::invalid(format!("value must be 1-{MAX_VALUE_BYTES} bytes, not {len}"))
            .with_details(json!({"field": "value"})));
    }
    // Moved, not copied, into the request, whose `Debug` prints no value (coffer-proto); the
    // store wraps it in a `SecretString` on arrival.
    // `If-None-Match: *` (RFC 9110 §13.1.2): create only; an existing name is not replaced.
    let create_only = headers.get(header::IF_NONE_MATCH).is_some_and(|v| v.as_bytes().trim_ascii() == b"*");
    let req = SetCredentialRequest { name, value: body.value, actor: actor(&headers), create_only };
    let reply = match st.store.credentials.clone().set_credential(req).await {
        Ok(r) => r.into_inner(),
        Err(e) if e.code() == tonic::Code::AlreadyExists => {
            return Err(ApiError::new(Code::AlreadyExists, format!("{} (If-None-Match: *)", e.message())));
        }
        Err(e) => return Err(e.into()),
    };
    settle(&st, reply.seq).await;
    let c = reply.credential.unwrap_or_default();
    tracing::info!(credential = %c.name, version = c.version, "Credential set.");
    let status = if c.version == 1 { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(CredentialSet { name: c.name, version: c.version, updated_at: c.updated_at })))
}

/// `DELETE /v1/credentials/{name}` → 204. Servers that reference it then fail to start with an
/// error naming it until it is set again.
///
/// Errors: `NOT_FOUND`.
async fn delete(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let req = DeleteCredentialRequest { name: name.clone(), actor: actor(&headers) };
    let seq = st.store.credentials.clone().delete_credential(req).await?.into_inner().seq;
    settle(&st, seq).await;
    tracing::info!(credential = %name, "Credential removed.");
    Ok(StatusCode::NO_CONTENT)
}

fn shown(name: &str) -> String {
    name.chars().take(80).collect()
}
