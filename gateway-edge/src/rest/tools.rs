//! REST over the gateway: the aggregated tool list (original and exposed names), calling a
//! tool, toggling a tool by its exposed name, and one server's live capabilities. Served
//! through the tool broker ([`crate::mcp::broker`]) in-process, one broker session per acting
//! party (`X-Coffer-Actor`: `api` unless it says `cli`, `ui`, …; the same actor the audit log
//! records), so they obey the same routing and policy as `/mcp` and the invocation log names
//! who called.
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::routing::{get, patch, post};
use axum::{Json, Router};
use coffer_api::Page;
use coffer_api::servers::{Capabilities, Capability, CatalogState, ProbeReport};
use coffer_api::tools::{CallToolResult, EnabledFlag, Refreshed, Tool, ToolCall, ToolState};
use coffer_proto::store::{CapabilityKind, Preference, SetPreferenceRequest};
use serde::Deserialize;
use serde_json::{Value, json};

use coffer_runtime::identity::Identity;

use crate::error::{ApiError, Code, JsonBody};
use crate::mcp::broker::{self, Failure, Lease, Located};
use crate::mcp::session::{Answer, ListKind};
use crate::state::AppState;

/// The REST caller's broker session: the gateway's own (in-process), keyed by the acting party
/// of the request, whose invocations it records.
pub(crate) fn rest_session(st: &AppState, headers: &HeaderMap) -> Result<Lease, ApiError> {
    let actor = crate::rest::servers::actor(headers);
    st.gateway.broker.lease(Identity::Gateway, &actor, &actor).map_err(ApiError::internal)
}

/// `/v1/tools*` and `/v1/mcp/servers/{name}/capabilities`.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/tools", get(list_tools))
        .route("/v1/tools/call", post(call_tool))
        .route("/v1/tools/{name}", patch(patch_tool))
        .route("/v1/mcp/servers/{name}/capabilities", get(capabilities))
        .route("/v1/mcp/refresh", post(refresh))
        .route("/v1/mcp/servers/{name}/test", post(test_server))
        .route("/v1/mcp/servers/{name}/catalog", get(catalog_state))
}

/// Longest `wait_ms` of `GET /v1/mcp/servers/{name}/catalog` (ms).
pub const MAX_CATALOG_WAIT_MS: u64 = 120_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogQuery {
    wait_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsQuery {
    server: Option<String>,
}

/// `GET /v1/tools[?server=S]` → `{"items":[{name, server, original_name, title, description,
/// enabled}], "next_cursor": null}`; `name` is the exposed name.
async fn list_tools(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Query(q): Query<ToolsQuery>,
) -> Result<Json<Page<Tool>>, ApiError> {
    let session = rest_session(&st, &headers)?;
    let items: Vec<Tool> = session
        .list_all(ListKind::Tools)
        .await
        .into_iter()
        .filter(|l| q.server.as_deref().is_none_or(|s| s == l.server))
        .map(|l| Tool {
            name: l.item["name"].as_str().unwrap_or_default().to_owned(),
            server: l.server.to_string(),
            original_name: l.original.to_string(),
            title: l.item.get("title").and_then(Value::as_str).map(str::to_owned),
            description: l.item.get("description").and_then(Value::as_str).map(str::to_owned),
            enabled: l.enabled,
        })
        .collect();
    Ok(Json(Page::all(items)))
}

/// `POST /v1/tools/call {name, arguments}` → the tool's `CallToolResult`, verbatim. Gateway
/// errors map to the envelope: TOOL_DISABLED 403, unknown tool 404, UPSTREAM_UNAVAILABLE 502,
/// UPSTREAM_TIMEOUT 504; an upstream JSON-RPC error is 502 with the error in `details`. The
/// invocation is recorded with the request's actor (`api`, or `cli` from the CLI).
async fn call_tool(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<ToolCall>,
) -> Result<Json<CallToolResult>, ApiError> {
    let arguments = body.arguments.map(|a| serde_json::value::to_raw_value(&a).expect("json"));
    let session = rest_session(&st, &headers)?;
    match broker::call(&session, ListKind::Tools, &body.name, arguments.as_deref()).await {
        // A `CallToolResult` is an object (the broker passes on only what parses as one).
        Answer::Result(r) => Ok(Json(serde_json::from_str(r.get()).unwrap_or_default())),
        Answer::UpstreamError(e) => {
            let e: Value = serde_json::from_str(e.get()).unwrap_or(Value::Null);
            Err(ApiError::new(
                Code::UpstreamUnavailable,
                format!("upstream error: {}", e["message"].as_str().unwrap_or("unknown")),
            )
            .with_details(e))
        }
        // REST calls carry no JSON-RPC id, so no client can cancel them.
        Answer::Cancelled => Err(ApiError::new(Code::UpstreamUnavailable, "the call was cancelled")),
        Answer::Error(e) => {
            let code = match Failure::of(&e) {
                Failure::Disabled => Code::ToolDisabled,
                Failure::Timeout => Code::UpstreamTimeout,
                Failure::Unavailable => Code::UpstreamUnavailable,
                Failure::NotFound => Code::NotFound,
                Failure::Invalid => Code::InvalidArgument,
            };
            Err(ApiError::new(code, e.message).with_details(e.data.unwrap_or_else(|| json!({}))))
        }
    }
}

/// `PATCH /v1/tools/{exposed name} {"enabled": bool}` → `{name, server, original_name,
/// enabled}` once the gateway's policy holds the change (read-your-writes). The name is
/// resolved without the policy check (a disabled tool must be re-enableable), through the
/// session's name map or by listing only the server its prefix names.
async fn patch_tool(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<EnabledFlag>,
) -> Result<Json<ToolState>, ApiError> {
    let session = rest_session(&st, &headers)?;
    let (server, original) = match broker::locate_tool(&session, &name).await {
        Located::Tool { server, original } => (server, original),
        Located::ServerDisabled { server } => {
            return Err(ApiError::new(
                Code::Conflict,
                format!("server {server:?} is disabled; enable the server to toggle its tools"),
            ));
        }
        Located::Unknown(e) => return Err(ApiError::not_found(e.message)),
    };
    drop(session);
    let actor = crate::rest::servers::actor(&headers);
    let reply = st
        .store
        .registry
        .clone()
        .set_preference(SetPreferenceRequest {
            preference: Some(Preference {
                server: server.clone(),
                kind: CapabilityKind::Tool.into(),
                name: original.clone(),
                enabled: body.enabled,
                updated_at: String::new(),
            }),
            actor,
        })
        .await?
        .into_inner();
    if !st.snapshot.wait_for(reply.seq, std::time::Duration::from_secs(5)).await {
        tracing::warn!(seq = reply.seq, "Policy snapshot did not catch up within 5 s.");
    }
    Ok(Json(ToolState { name, server, original_name: original, enabled: body.enabled }))
}

/// `GET /v1/mcp/servers/{name}/capabilities` → the upstream's live `{tools, prompts}` with
/// `enabled` flags, fetched through the caller's broker session (starting the upstream if
/// needed).
async fn capabilities(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<Capabilities>, ApiError> {
    let snap = st.snapshot.current();
    let Some(server) = snap.servers.get(&name).cloned() else {
        return Err(ApiError::not_found(format!("no MCP server {name:?}")));
    };
    let session = rest_session(&st, &headers)?;
    let mut lists = Vec::with_capacity(2);
    for kind in [ListKind::Tools, ListKind::Prompts] {
        let items = session
            .fetch_server(&server, kind)
            .await
            .map_err(|e| ApiError::new(Code::UpstreamUnavailable, e.to_string()))?;
        let listed: Vec<Capability> = items
            .iter()
            .map(|i| {
                let original = i["name"].as_str().unwrap_or_default();
                Capability {
                    name: original.to_owned(),
                    exposed_name: crate::mcp::naming::expose_one(&name, original, st.gateway.shared.max_name_len()),
                    description: i.get("description").and_then(Value::as_str).map(str::to_owned),
                    enabled: snap.preference(&name, kind.kind(), original),
                }
            })
            .collect();
        lists.push(listed);
    }
    let prompts = lists.pop().unwrap_or_default();
    let tools = lists.pop().unwrap_or_default();
    Ok(Json(Capabilities { server: name, tools, prompts, resources: Vec::new() }))
}

/// `POST /v1/mcp/refresh` → invalidates every session's capability cache and tells every
/// client its lists changed.
async fn refresh(State(st): State<Arc<AppState>>) -> Json<Refreshed> {
    Json(Refreshed { sessions: st.gateway.refresh_all() as u64 })
}

/// `GET /v1/mcp/servers/{name}/catalog[?wait_ms=N]` → what the gateway's capability catalog
/// holds of the server: `{server, state: "ready"|"listing"|"failed"|"unknown", tools, prompts,
/// resources, resource_templates (counts, null while not listed), error?, retry_in_ms?,
/// restored?}`. With `wait_ms` (at most [`MAX_CATALOG_WAIT_MS`]) it first waits until the
/// catalog has listed the server afresh (starting it in the background if nobody is) or failed
/// to; `state` is still `listing` when the time ran out. A disabled server is `unknown`; an
/// unknown one 404; a `wait_ms` over the bound, not a whole number, repeated, or another
/// parameter 400 `INVALID_ARGUMENT`.
async fn catalog_state(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    q: Result<Query<CatalogQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<CatalogState>, ApiError> {
    // The structured error, not axum's plain-text 400 (`wait_ms=abc`, `wait_ms=-1`, a repeated
    // or unknown parameter).
    let Query(q) = q.map_err(|e| ApiError::invalid(format!("malformed query string: {}", e.body_text())))?;
    let Some(server) = st.snapshot.current().servers.get(&name).cloned() else {
        return Err(ApiError::not_found(format!("no MCP server {name:?}")));
    };
    let shared = st.gateway.shared.clone();
    let body = match q.wait_ms {
        Some(ms) if ms > MAX_CATALOG_WAIT_MS => {
            return Err(ApiError::new(
                Code::InvalidArgument,
                format!("wait_ms must be at most {MAX_CATALOG_WAIT_MS}, not {ms}"),
            ));
        }
        Some(ms) if ms > 0 => {
            crate::mcp::gateway_catalog::wait_listed(shared, &name, std::time::Duration::from_millis(ms)).await
        }
        _ => {
            let generation = st.snapshot.current().generation(&server);
            crate::mcp::gateway_catalog::summary(&shared, &name, generation)
        }
    };
    Ok(Json(body))
}

/// `POST /v1/mcp/servers/{name}/test` → starts the server once in a fresh session (no cache) and
/// reports `{server, ok, error, protocol_version, server_info, capabilities, counts:{tools,
/// prompts, resources}, initialize_ms, elapsed_ms}`. A server that fails still answers 200 with
/// `ok: false` and the error; an unknown server is 404.
async fn test_server(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<ProbeReport>, ApiError> {
    let Some(server) = st.snapshot.current().servers.get(&name).cloned() else {
        return Err(ApiError::not_found(format!("no MCP server {name:?}")));
    };
    Ok(Json(st.gateway.probe(&server).await))
}
