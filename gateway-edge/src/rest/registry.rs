//! `/v1/mcp/registry/…`: searching an MCP Registry and installing a server from it (see
//! [`crate::registry`] for the registry's API and what is checked). The registry is the one
//! the `gateway.mcp_registry_url` setting names, the official one when it is empty.
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use coffer_api::Page;
use coffer_api::registry::{RegistryInstall, RegistryInstalled, RegistryServer};
use coffer_proto::store::{CreateServerRequest, DeleteCredentialRequest, SetCredentialRequest};
use coffer_types::settings::{MCP_REGISTRY_URL, OFFICIAL_MCP_REGISTRY};
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::json;

use crate::error::{ApiError, Code, JsonBody};
use crate::registry::{self, RegistryClient, RegistryError};
use crate::rest::servers::{actor, server_view, settle};
use crate::state::AppState;

/// The registry routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/mcp/registry/servers", get(search))
        .route("/v1/mcp/registry/servers/{name}", get(show))
        .route("/v1/mcp/registry/install", post(install))
}

/// Default number of entries one search returns.
const DEFAULT_LIMIT: u32 = 30;
/// Longest search text (bytes).
const MAX_QUERY: usize = 200;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchQuery {
    #[serde(default)]
    search: Option<String>,
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default)]
    cursor: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShowQuery {
    #[serde(default)]
    version: Option<String>,
}

/// The client of the configured registry.
fn client(st: &AppState) -> Result<RegistryClient, ApiError> {
    let stored = st.gateway.shared.snapshot.current().settings.get(MCP_REGISTRY_URL.key).cloned();
    let url = MCP_REGISTRY_URL.text_or_default(stored.as_deref());
    let url = if url.is_empty() { OFFICIAL_MCP_REGISTRY.to_owned() } else { url };
    RegistryClient::new(&url).map_err(api_error)
}

/// One conversion from [`RegistryError`] to the envelope: the registry's own failures are
/// `UPSTREAM_UNAVAILABLE` (502) with the reason, never opaque: the user must know the registry
/// is at fault, not Coffer.
fn api_error(e: RegistryError) -> ApiError {
    match e {
        RegistryError::Unavailable(m) | RegistryError::Malformed(m) => {
            ApiError::new(Code::UpstreamUnavailable, m).with_details(json!({"reason": "registry"}))
        }
        RegistryError::NotFound(m) => ApiError::new(Code::NotFound, m),
        RegistryError::Invalid(m) => ApiError::invalid(m),
    }
}

fn lookup(program: &str) -> Option<std::path::PathBuf> {
    coffer_runtime::connect::which_on_path(program)
}

/// `GET /v1/mcp/registry/servers?search=&limit=&cursor=` → `{"items":[RegistryServer…],
/// "next_cursor"}`: the latest version of each server whose name contains `search`, each with
/// its options and whether this machine can run them.
///
/// Errors: `INVALID_ARGUMENT` (a search longer than 200 bytes, a limit outside 1-100),
/// `UPSTREAM_UNAVAILABLE` (the registry is unreachable or answered something malformed).
async fn search(
    State(st): State<Arc<AppState>>,
    Query(q): Query<SearchQuery>,
) -> Result<Json<Page<RegistryServer>>, ApiError> {
    let text = q.search.unwrap_or_default();
    if text.len() > MAX_QUERY {
        return Err(ApiError::invalid(format!("search is longer than {MAX_QUERY} bytes")));
    }
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=registry::MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid(format!("limit must be 1-{}", registry::MAX_LIMIT)));
    }
    let page = client(&st)?.search(text.trim(), limit, q.cursor.as_deref()).await.map_err(api_error)?;
    let items = page.items.iter().map(|e| registry::describe_entry(e, &lookup)).collect();
    Ok(Json(Page { items, next_cursor: page.next_cursor }))
}

/// `GET /v1/mcp/registry/servers/{name}[?version=V]` → [`RegistryServer`] (the latest version
/// unless `version`). `name` is the registry's name, percent-encoded (`io.github.user%2Fweather`).
///
/// Errors: `NOT_FOUND`, `UPSTREAM_UNAVAILABLE`.
async fn show(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(q): Query<ShowQuery>,
) -> Result<Json<RegistryServer>, ApiError> {
    let entry = client(&st)?.server(&name, q.version.as_deref()).await.map_err(api_error)?;
    Ok(Json(registry::describe_entry(&entry, &lookup)))
}

/// `POST /v1/mcp/registry/install` with [`RegistryInstall`] → 201 [`RegistryInstalled`]:
/// fetches the entry, plans its option ([`registry::plan`]), stores each secret input as a
/// credential `<server>.<input>`, registers the server. Nothing stays behind when a step fails
/// (the credentials made are removed). The server starts when the gateway lists it; `GET
/// /v1/mcp/servers/{server}/catalog?wait_ms=` waits for that.
///
/// Errors: `INVALID_ARGUMENT` (a bad server name, a missing or unknown input, no option that
/// runs here, a hostile entry), `NOT_FOUND`, `ALREADY_EXISTS` (409), `UPSTREAM_UNAVAILABLE`.
async fn install(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<RegistryInstall>,
) -> Result<Response, ApiError> {
    let entry = client(&st)?.server(&b.name, b.version.as_deref()).await.map_err(api_error)?;
    let name = b.server.clone().unwrap_or_else(|| registry::suggested_name(&b.name));
    let mut planned = registry::plan(&entry, &name, b.option.as_deref(), &b.inputs, &lookup).map_err(api_error)?;
    planned.server.enabled = b.enabled.unwrap_or(true);
    let who = actor(&headers);
    let mut store = st.store.clone();
    let mut made: Vec<String> = Vec::new();
    let mut last_seq = 0u64;
    let mut failure: Option<ApiError> = None;
    for (cred, value) in &planned.credentials {
        // The request's `Debug` prints no value (coffer-proto).
        let req = SetCredentialRequest {
            name: cred.clone(),
            value: value.expose_secret().to_owned(),
            actor: who.clone(),
            create_only: true,
        };
        match store.credentials.set_credential(req).await {
            Ok(r) => {
                last_seq = last_seq.max(r.into_inner().seq);
                made.push(cred.clone());
            }
            Err(e) => {
                let e = ApiError::from(e);
                failure = Some(if e.code == Code::AlreadyExists {
                    ApiError::new(
                        Code::AlreadyExists,
                        format!(
                            "a credential named {cred} exists already; remove it or install under another name (server)"
                        ),
                    )
                } else {
                    e
                });
                break;
            }
        }
    }
    let created = match failure {
        Some(e) => Err(e),
        None => store
            .registry
            .create_server(CreateServerRequest { server: Some(planned.server.clone()), actor: who.clone() })
            .await
            .map(|r| r.into_inner())
            .map_err(ApiError::from),
    };
    let reply = match created {
        Ok(r) => r,
        Err(e) => {
            for cred in made {
                let req = DeleteCredentialRequest { name: cred.clone(), actor: who.clone() };
                if let Err(e) = store.credentials.delete_credential(req).await {
                    tracing::warn!(credential = %cred, error = %e.message(), "Could not remove a credential of a failed install.");
                }
            }
            return Err(e);
        }
    };
    settle(&st, last_seq.max(reply.seq)).await;
    let server = reply.server.unwrap_or_default();
    tracing::info!(
        server = %server.name,
        registry_name = %entry_name(&b.name),
        option = %planned.option.id,
        credentials = made.len(),
        "Server installed from the MCP Registry."
    );
    let body = RegistryInstalled {
        server: server_view(&server),
        registry_name: b.name.clone(),
        registry_version: registry::describe_entry(&entry, &lookup).version,
        option: planned.option,
        credentials_created: made,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// A registry name fit for a log line.
fn entry_name(name: &str) -> String {
    name.chars().filter(|c| !c.is_control()).take(200).collect()
}
