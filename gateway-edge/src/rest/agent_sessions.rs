//! `/v1/agent-sessions`, `POST /v1/conversations/import` and `/v1/projects` (issue 34 §5): the
//! user's own Claude Code and Codex sessions, importing one as a conversation bound to it, and
//! the project picker's working directories, over `coffer-chat` (`ListAgentSessions`,
//! `ImportAgentSession`, `ListProjects` in `proto/chat.proto`). Errors as the other chat routes
//! ([`ApiError::from_chat`]): an unknown session is 404 `NOT_FOUND`, one already imported 409
//! `CONFLICT` naming its conversation, a session id with path characters 400.
use std::sync::Arc;

use axum::extract::State;
use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router, extract::Query};
use coffer_api::agent_sessions as api;
use coffer_proto::chat::{
    AgentSession, ImportAgentSessionRequest, ListAgentSessionsRequest, ListProjectsRequest, Project,
};

use crate::chat::{self, call};
use crate::error::{ApiError, JsonBody};
use crate::rest::logs::Params;
use crate::rest::servers::etag;
use crate::state::AppState;

/// Values of `?agent=`.
pub const AGENTS: &[&str] = &["claude_code", "codex"];
/// Default and largest `limit` of both lists.
pub const DEFAULT_LIMIT: u64 = 50;
pub const MAX_LIMIT: u64 = 200;

/// The routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/agent-sessions", get(list_sessions))
        .route("/v1/conversations/import", post(import))
        .route("/v1/projects", get(list_projects))
}

fn none_if_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// An `AgentSession` in its REST form (empty strings as null).
pub fn session(s: AgentSession) -> api::AgentSession {
    api::AgentSession {
        agent_key: s.agent_key,
        session_id: s.session_id,
        cwd: none_if_empty(s.cwd),
        first_prompt: none_if_empty(s.first_prompt),
        last_activity_ms: s.last_activity_ms,
        message_count: s.message_count,
        size_bytes: s.size_bytes,
        partial: s.partial,
        conversation_id: none_if_empty(s.conversation_id),
    }
}

/// A `Project` in its REST form (`last_used_ms` 0 as null).
pub fn project(p: Project) -> api::Project {
    api::Project {
        path: p.path,
        name: p.name,
        git: p.git,
        last_used_ms: (p.last_used_ms != 0).then_some(p.last_used_ms),
        sources: p.sources,
    }
}

/// `GET /v1/agent-sessions?agent=claude_code|codex&limit=N` → AgentSessionList.
async fn list_sessions(
    State(st): State<Arc<AppState>>,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<api::AgentSessionList>, ApiError> {
    let p = Params::from_query(q, &["agent", "limit"])?;
    let agent_key = p.one_of("agent", AGENTS)?;
    let limit = p.int_in("limit", DEFAULT_LIMIT, MAX_LIMIT)? as u32;
    let r = call(st.chat.clone().list_agent_sessions(ListAgentSessionsRequest { agent_key, limit }))
        .await
        .map_err(ApiError::from_chat)?;
    Ok(Json(api::AgentSessionList {
        items: r.sessions.into_iter().map(session).collect(),
        skipped_files: r.skipped_files,
        skipped_lines: r.skipped_lines,
        truncated: r.truncated,
    }))
}

/// `POST /v1/conversations/import {agent_key, session_id, title?, model?}` → 201 Conversation
/// with its `ETag`.
async fn import(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody<api::SessionImport>,
) -> Result<Response, ApiError> {
    let req = ImportAgentSessionRequest {
        agent_key: body.agent_key,
        session_id: body.session_id,
        title: body.title.unwrap_or_default(),
        model: body.model.unwrap_or_default(),
        ..Default::default()
    };
    let c = call(st.chat.clone().import_agent_session(req)).await.map_err(ApiError::from_chat)?;
    tracing::info!(conversation = %c.id, agent = %c.agent_key, "Agent session imported.");
    let mut r = (StatusCode::CREATED, Json(chat::conversation(&c))).into_response();
    r.headers_mut().insert(axum::http::header::ETAG, etag(c.version as i64));
    Ok(r)
}

/// `GET /v1/projects?limit=N` → ProjectList.
async fn list_projects(
    State(st): State<Arc<AppState>>,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<api::ProjectList>, ApiError> {
    let p = Params::from_query(q, &["limit"])?;
    let limit = p.int_in("limit", DEFAULT_LIMIT, MAX_LIMIT)? as u32;
    let r = call(st.chat.clone().list_projects(ListProjectsRequest { limit })).await.map_err(ApiError::from_chat)?;
    Ok(Json(api::ProjectList { items: r.projects.into_iter().map(project).collect(), root: none_if_empty(r.root) }))
}
