//! REST over the gateway: the aggregated tool list (original and exposed names), calling a
//! tool, toggling a tool by its exposed name, and one server's live capabilities. Served
//! through a long-lived internal admin session, so they obey the same routing and policy as
//! `/mcp`.
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::routing::{get, patch, post};
use axum::{Json, Router};
use coffer_proto::store::{CapabilityKind, Preference, SetPreferenceRequest};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, Code, JsonBody};
use crate::mcp::jsonrpc;
use crate::mcp::session::{Answer, ListKind};
use crate::state::AppState;

/// `/v1/tools*` and `/v1/mcp/servers/{name}/capabilities`.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/tools", get(list_tools))
        .route("/v1/tools/call", post(call_tool))
        .route("/v1/tools/{name}", patch(patch_tool))
        .route("/v1/mcp/servers/{name}/capabilities", get(capabilities))
        .route("/v1/mcp/refresh", post(refresh))
        .route("/v1/mcp/servers/{name}/test", post(test_server))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsQuery {
    server: Option<String>,
}

/// `GET /v1/tools[?server=S]` → `{"items":[{name, server, original_name, title, description,
/// enabled}], "next_cursor": null}`; `name` is the exposed name.
async fn list_tools(State(st): State<Arc<AppState>>, Query(q): Query<ToolsQuery>) -> Json<Value> {
    let session = st.gateway.admin_session().await;
    let items: Vec<Value> = session
        .list_all(ListKind::Tools)
        .await
        .into_iter()
        .filter(|l| q.server.as_deref().is_none_or(|s| s == l.server))
        .map(|l| {
            json!({
                "name": l.item["name"], "server": l.server, "original_name": l.original,
                "title": l.item.get("title").cloned().unwrap_or(Value::Null),
                "description": l.item.get("description").cloned().unwrap_or(Value::Null),
                "enabled": l.enabled,
            })
        })
        .collect();
    Json(json!({"items": items, "next_cursor": null}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallBody {
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

/// `POST /v1/tools/call {name, arguments}` → the tool's `CallToolResult`, verbatim. Gateway
/// errors map to the envelope: TOOL_DISABLED 403, unknown tool 404, UPSTREAM_UNAVAILABLE 502,
/// UPSTREAM_TIMEOUT 504; an upstream JSON-RPC error is 502 with the error in `details`.
async fn call_tool(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody<CallBody>,
) -> Result<Json<Value>, ApiError> {
    let session = st.gateway.admin_session().await;
    let mut params = json!({"name": body.name});
    if let Some(a) = body.arguments {
        if !a.is_object() {
            return Err(ApiError::invalid("arguments must be a JSON object"));
        }
        params["arguments"] = a;
    }
    let raw = serde_json::value::RawValue::from_string(params.to_string()).expect("json");
    match session.route_call(ListKind::Tools, Some(&raw)).await {
        Answer::Result(r) => Ok(Json(serde_json::from_str(r.get()).unwrap_or(Value::Null))),
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
            let code = match e.code {
                jsonrpc::TOOL_DISABLED => Code::ToolDisabled,
                jsonrpc::UPSTREAM_TIMEOUT => Code::UpstreamTimeout,
                jsonrpc::UPSTREAM_UNAVAILABLE => Code::UpstreamUnavailable,
                jsonrpc::INVALID_PARAMS if e.message.starts_with("Unknown") => Code::NotFound,
                _ => Code::InvalidArgument,
            };
            Err(ApiError::new(code, e.message).with_details(e.data.unwrap_or_else(|| json!({}))))
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchTool {
    enabled: bool,
}

/// `PATCH /v1/tools/{exposed name} {"enabled": bool}` → `{name, server, original_name,
/// enabled}` once the gateway's policy holds the change (read-your-writes).
async fn patch_tool(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: axum::http::HeaderMap,
    JsonBody(body): JsonBody<PatchTool>,
) -> Result<Json<Value>, ApiError> {
    let session = st.gateway.admin_session().await;
    // Resolve without the policy check: a disabled tool must be re-enableable.
    session.list_all(ListKind::Tools).await;
    let (server, original) = match session.resolve(ListKind::Tools, &name).await {
        Ok(p) => p,
        Err(e) if e.code == jsonrpc::TOOL_DISABLED => {
            let data = e.data.unwrap_or_default();
            let server = data["server"].as_str().unwrap_or_default().to_owned();
            let listed = session.list_all(ListKind::Tools).await;
            match listed.into_iter().find(|l| l.item["name"] == name.as_str()) {
                Some(l) => (l.server, l.original),
                None => {
                    return Err(ApiError::new(
                        Code::Conflict,
                        format!("server {server:?} is disabled; enable the server to toggle its tools"),
                    ));
                }
            }
        }
        Err(e) => return Err(ApiError::not_found(e.message)),
    };
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
    Ok(Json(json!({"name": name, "server": server, "original_name": original, "enabled": body.enabled})))
}

/// `GET /v1/mcp/servers/{name}/capabilities` → the upstream's live `{tools, prompts}` with
/// `enabled` flags, fetched through the admin session (starting the upstream if needed).
async fn capabilities(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let snap = st.snapshot.current();
    let Some(server) = snap.servers.get(&name).cloned() else {
        return Err(ApiError::not_found(format!("no MCP server {name:?}")));
    };
    let session = st.gateway.admin_session().await;
    let mut out = json!({"server": name});
    for kind in [ListKind::Tools, ListKind::Prompts] {
        let items = session
            .fetch_server(&server, kind)
            .await
            .map_err(|e| ApiError::new(Code::UpstreamUnavailable, e.to_string()))?;
        let listed: Vec<Value> = items
            .iter()
            .map(|i| {
                let original = i["name"].as_str().unwrap_or_default();
                json!({
                    "name": original,
                    "exposed_name": crate::mcp::naming::expose_one(&name, original, st.gateway.shared.max_name_len()),
                    "description": i.get("description").cloned().unwrap_or(Value::Null),
                    "enabled": snap.preference(&name, kind.kind(), original),
                })
            })
            .collect();
        out[kind.key()] = Value::Array(listed);
    }
    out["resources"] = json!([]);
    Ok(Json(out))
}

/// `POST /v1/mcp/refresh` → invalidates every session's capability cache and tells every
/// client its lists changed.
async fn refresh(State(st): State<Arc<AppState>>) -> Json<Value> {
    let n = st.gateway.refresh_all();
    Json(json!({"sessions": n}))
}

/// `POST /v1/mcp/servers/{name}/test` → starts the server once in a fresh session (no cache) and
/// reports `{server, ok, error, protocol_version, server_info, capabilities, counts:{tools,
/// prompts, resources}, initialize_ms, elapsed_ms}`. A server that fails still answers 200 with
/// `ok: false` and the error; an unknown server is 404.
async fn test_server(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let Some(server) = st.snapshot.current().servers.get(&name).cloned() else {
        return Err(ApiError::not_found(format!("no MCP server {name:?}")));
    };
    Ok(Json(st.gateway.probe(&server).await))
}
