//! `/v1/agents`, `/v1/conversations…`: REST and SSE over `coffer-chat` (`proto/chat.proto`).
//! Each route reads its body as a `coffer_api::chat` request type, checks its parameters, makes
//! one Chat call and answers with the reply as a `coffer_api::chat` type (converted by
//! [`crate::chat`]; events too); a failed call is the envelope of [`ApiError::from_chat`] (400
//! `INVALID_ARGUMENT`, 404 `NOT_FOUND`, 409 `CONFLICT`, 429 `TOO_MANY_REQUESTS`, 503
//! `SERVICE_UNAVAILABLE` while the service is not running). The edge keeps no chat state: turns,
//! the queue and the event bus are the service's.
//!
//! Archiving and restoring are `PATCH {archived}` (no separate routes); so is the permission
//! mode (`PATCH {permission_mode}`). An approval is answered with `POST …/approvals/{number}`
//! ([`answer_approval`]): its source is the surface (`web` for a console session, else the
//! request's actor), its actor who (the session's label, or `daemon token`). A message's `source`
//! is the request's actor (`X-Coffer-Actor`: `cli`, `api`, `ui`, …). `DELETE …/allowed-tools`
//! forgets the tools an `allow_always` answer allowed ([`forget_allowed_tools`]); a message's
//! saved files come back as bytes from `GET …/messages/{message_id}/attachments/{name}`
//! ([`attachment`]: the chat service reads them, confined to the message's folder; the edge sets
//! the headers).
//!
//! `GET …/events` is SSE from the service's `Subscribe` stream ([`event_stream`]): one frame
//! per event (`id: <seq>`, `event: <kind>`, `data: <event JSON>`), a `: keep-alive` comment
//! after [`KEEPALIVE`] without an event, resumption from `Last-Event-ID` (or `?after=`). It ends
//! after a `reset` with reason `lagged` or `deleted`, when the service ends or breaks the
//! stream, or at shutdown; a client that goes away drops the gRPC stream and nothing else.
//!
//! `GET /v1/conversations/events` is SSE from `WatchConversations` ([`change_stream`]): the
//! conversation list, live (`conversation`, `deleted`, `reset` frames, no ids; the web console's
//! list).
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use coffer_proto::chat::list_conversations_request::Archived;
use coffer_proto::chat::{
    AgentConfig, AnswerApprovalRequest, AttachmentUpload, ConversationChange, ConversationRef,
    CreateConversationRequest, Event, GetConversationRequest, ListAgentsRequest, ListConversationsRequest,
    ListMessagesRequest, PendingItem, SendMessageRequest, SetPendingRequest, SubscribeRequest,
    UpdateConversationRequest, WatchConversationsRequest,
};
use futures_util::{Stream, StreamExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::chat::{self, call};
use crate::error::{ApiError, Code, JsonBody};
use crate::middleware::Via;
use crate::rest::logs::Params;
use crate::rest::servers::{actor, etag, parse_if_match};
use crate::state::AppState;
use coffer_api::Page;
use coffer_api::chat::{self as api, ConversationCreate, ConversationPatch, MessageSend, PendingSet};

/// How long an event stream may stay silent before the edge sends a `: keep-alive` comment
/// (proxies and clients then know the connection lives between turns).
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// Default and largest page of `GET /v1/conversations` (the service's bounds).
pub const CONVERSATIONS_PAGE: u64 = 50;
pub const MAX_CONVERSATIONS_PAGE: u64 = 200;
/// Default and largest page of `GET …/messages` (the store's bounds).
pub const MESSAGES_PAGE: u64 = 100;
pub const MAX_MESSAGES_PAGE: u64 = 500;
/// Values of `?archived=`.
pub const ARCHIVED: &[&str] = &["active", "archived", "all"];

/// The routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/agents", get(list_agents))
        .route("/v1/conversations", get(list_conversations).post(create_conversation))
        .route("/v1/conversations/events", get(conversation_events))
        .route("/v1/conversations/{id}", get(get_conversation).patch(patch_conversation).delete(delete_conversation))
        .route(
            "/v1/conversations/{id}/messages",
            get(list_messages).post(send_message).layer(axum::extract::DefaultBodyLimit::max(MESSAGE_BODY_LIMIT)),
        )
        .route("/v1/conversations/{id}/pending", put(set_pending))
        .route("/v1/conversations/{id}/interrupt", post(interrupt))
        .route("/v1/conversations/{id}/events", get(events))
        .route("/v1/conversations/{id}/approvals/{number}", post(answer_approval))
        .route("/v1/conversations/{id}/messages/{message_id}/diff", get(file_diff))
        .route("/v1/conversations/{id}/messages/{message_id}/attachments/{name}", get(attachment))
        .route("/v1/conversations/{id}/allowed-tools", axum::routing::delete(forget_allowed_tools))
}

/// A response with `ETag: "<version>"`.
fn with_etag(status: StatusCode, body: impl serde::Serialize, version: u64) -> Response {
    let mut r = (status, Json(body)).into_response();
    r.headers_mut().insert(header::ETAG, etag(version as i64));
    r
}

/// `None` (`null`) for an empty cursor.
fn cursor(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

// ---------------------------------------------------------------------------------------------
// Agents.

/// `GET /v1/agents` → `{"items":[Agent…],"next_cursor":null}`: every registered agent provider,
/// available or not (with the reason).
async fn list_agents(State(st): State<Arc<AppState>>) -> Result<Json<Page<api::Agent>>, ApiError> {
    let r = call(st.chat.clone().list_agents(ListAgentsRequest {})).await.map_err(ApiError::from_chat)?;
    Ok(Json(Page::all(r.agents.iter().map(chat::agent).collect())))
}

// ---------------------------------------------------------------------------------------------
// Conversations.

/// The `CreateConversation` request of a `POST /v1/conversations` body; `first_message` is
/// sent at once with the request's actor as its source. (`agent_config` has no `session_id`:
/// it is the agent's to set.) Whether the agent exists and the `cwd` is a folder is the
/// service's to say.
pub fn create_request(body: ConversationCreate, actor: String) -> CreateConversationRequest {
    let cfg = body.agent_config.unwrap_or_default();
    let first_message = body.first_message.unwrap_or_default();
    CreateConversationRequest {
        agent_key: body.agent_key,
        title: body.title.unwrap_or_default(),
        agent_config: Some(AgentConfig {
            cwd: cfg.cwd.unwrap_or_default(),
            model: cfg.model.unwrap_or_default(),
            session_id: String::new(),
            permission_mode: cfg.permission_mode.unwrap_or_default(),
        }),
        channel_name: body.channel_name.unwrap_or_default(),
        peer_chat_id: body.peer_chat_id.unwrap_or_default(),
        source: if first_message.is_empty() { String::new() } else { actor },
        first_message,
    }
}

/// `POST /v1/conversations` → 201 Conversation with its `ETag`.
async fn create_conversation(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<ConversationCreate>,
) -> Result<Response, ApiError> {
    let req = create_request(body, actor(&headers));
    let c = call(st.chat.clone().create_conversation(req)).await.map_err(ApiError::from_chat)?;
    tracing::info!(conversation = %c.id, agent = %c.agent_key, "Conversation created.");
    Ok(with_etag(StatusCode::CREATED, chat::conversation(&c), c.version))
}

/// The `ListConversations` request of `GET /v1/conversations?archived=&q=&cursor=&limit=`.
///
/// # Errors
/// `INVALID_ARGUMENT` naming an unknown or repeated parameter, an `archived` outside
/// [`ARCHIVED`] or a bad limit.
pub fn list_request(p: &Params) -> Result<ListConversationsRequest, ApiError> {
    let archived = match p.one_of("archived", ARCHIVED)?.as_str() {
        "archived" => Archived::Archived,
        "all" => Archived::All,
        _ => Archived::Active,
    };
    Ok(ListConversationsRequest {
        archived: archived as i32,
        query: p.filter("q"),
        cursor: p.filter("cursor"),
        limit: p.int_in("limit", CONVERSATIONS_PAGE, MAX_CONVERSATIONS_PAGE)? as u32,
    })
}

/// `GET /v1/conversations?archived=active|archived|all&q=&cursor=&limit=` →
/// `{"items":[Conversation…],"next_cursor":…}`, newest activity first.
async fn list_conversations(
    State(st): State<Arc<AppState>>,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<Page<api::Conversation>>, ApiError> {
    let p = Params::from_query(q, &["archived", "q", "cursor", "limit"])?;
    let r = call(st.chat.clone().list_conversations(list_request(&p)?)).await.map_err(ApiError::from_chat)?;
    Ok(Json(Page {
        items: r.conversations.iter().map(chat::conversation).collect(),
        next_cursor: cursor(&r.next_cursor),
    }))
}

/// `GET /v1/conversations/{id}?messages=N` → ConversationView (the newest N messages, 1-500,
/// default 100) with the conversation's `ETag`.
async fn get_conversation(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = Params::from_query(q, &["messages"])?;
    let message_limit = p.int_in("messages", MESSAGES_PAGE, MAX_MESSAGES_PAGE)? as u32;
    let v = call(st.chat.clone().get_conversation(GetConversationRequest { id, message_limit }))
        .await
        .map_err(ApiError::from_chat)?;
    let view = chat::view(&v).map_err(ApiError::internal)?;
    let version = view.conversation.version;
    Ok(with_etag(StatusCode::OK, view, version))
}

/// The `UpdateConversation` request of a `PATCH /v1/conversations/{id}` body with the
/// `If-Match` version.
///
/// # Errors
/// `INVALID_ARGUMENT` for an empty patch or a malformed `If-Match`.
pub fn update_request(
    id: String,
    body: ConversationPatch,
    headers: &HeaderMap,
) -> Result<UpdateConversationRequest, ApiError> {
    let req = UpdateConversationRequest {
        id,
        expected_version: parse_if_match(headers)?.map(|v| v as u64),
        title: body.title,
        model: body.model,
        archived: body.archived,
        permission_mode: body.permission_mode,
    };
    if req.title.is_none() && req.model.is_none() && req.archived.is_none() && req.permission_mode.is_none() {
        return Err(ApiError::invalid("nothing to change: give title, model, archived or permission_mode"));
    }
    Ok(req)
}

/// `PATCH /v1/conversations/{id} {title?, model?, archived?}` (`If-Match: "<version>"`
/// optional) → Conversation with its new `ETag`; a stale version is 409 `CONFLICT`. `model: ""`
/// is the agent's own default; `archived: false` restores.
async fn patch_conversation(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<ConversationPatch>,
) -> Result<Response, ApiError> {
    let req = update_request(id, body, &headers)?;
    let c = call(st.chat.clone().update_conversation(req)).await.map_err(ApiError::from_chat)?;
    Ok(with_etag(StatusCode::OK, chat::conversation(&c), c.version))
}

/// `DELETE /v1/conversations/{id}` → `{deleted, turn_cancelled}`: the in-flight turn is
/// cancelled, every row is gone, subscribers get `reset` (`deleted`).
async fn delete_conversation(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<api::ConversationDeleted>, ApiError> {
    let r = call(st.chat.clone().delete_conversation(ConversationRef { id: id.clone() }))
        .await
        .map_err(ApiError::from_chat)?;
    if !r.deleted {
        return Err(ApiError::not_found(format!("no conversation {:?}", id.chars().take(64).collect::<String>())));
    }
    tracing::info!(conversation = %id, turn_cancelled = r.turn_cancelled, "Conversation deleted.");
    Ok(Json(api::ConversationDeleted { deleted: r.deleted, turn_cancelled: r.turn_cancelled }))
}

// ---------------------------------------------------------------------------------------------
// Messages, the pending queue, interrupt.

/// `GET /v1/conversations/{id}/messages?after=&limit=` → `{"items":[Message…],"next_cursor":…}`,
/// oldest first; `after` (or `cursor`) is the id of the last message already read.
async fn list_messages(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<Page<api::Message>>, ApiError> {
    let p = Params::from_query(q, &["after", "cursor", "limit"])?;
    if p.get("after").is_some() && p.get("cursor").is_some() {
        return Err(ApiError::invalid("give after or cursor, not both (they are the same)")
            .with_details(json!({"parameter": "cursor"})));
    }
    let req = ListMessagesRequest {
        conversation_id: id,
        after_id: p.get("after").or(p.get("cursor")).unwrap_or_default().to_owned(),
        limit: p.int_in("limit", MESSAGES_PAGE, MAX_MESSAGES_PAGE)? as u32,
    };
    let r = call(st.chat.clone().list_messages(req)).await.map_err(ApiError::from_chat)?;
    Ok(Json(Page { items: r.messages.iter().map(chat::message).collect(), next_cursor: cursor(&r.next_after_id) }))
}

/// Body limit of `POST /v1/conversations/{id}/messages` (bytes): a message's attachments (at
/// most 40 MiB in all, `coffer_chat`'s `attachments::MAX_TOTAL_BYTES`) as base64, plus its text.
/// Every other REST route keeps [`crate::REST_BODY_LIMIT`].
pub const MESSAGE_BODY_LIMIT: usize = 56 * 1024 * 1024;

/// Whether a request is `POST /v1/conversations/{id}/messages` (the route with
/// [`MESSAGE_BODY_LIMIT`]).
pub fn is_message_post(method: &axum::http::Method, path: &str) -> bool {
    method == axum::http::Method::POST
        && path
            .strip_prefix("/v1/conversations/")
            .and_then(|rest| rest.strip_suffix("/messages"))
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

/// The `SendMessage` request of a `POST …/messages` body, the actor as its source. The text's
/// length (1 byte to 1 MiB) and the attachments' limits and names are the service's to check.
///
/// # Errors
/// `INVALID_ARGUMENT` naming `attachments[i].data_base64` when it is not standard base64.
pub fn send_request(id: String, body: MessageSend, actor: String) -> Result<SendMessageRequest, ApiError> {
    use base64::Engine as _;
    let mut attachments = Vec::new();
    for (i, a) in body.attachments.unwrap_or_default().into_iter().enumerate() {
        let data = base64::engine::general_purpose::STANDARD.decode(a.data_base64.trim()).map_err(|e| {
            ApiError::invalid(format!("attachments[{i}].data_base64: not standard base64 (with padding): {e}"))
        })?;
        attachments.push(AttachmentUpload { name: a.name, mime: a.mime.unwrap_or_default(), data });
    }
    Ok(SendMessageRequest {
        conversation_id: id,
        text: body.text,
        source: actor,
        now: body.now.unwrap_or(false),
        attachments,
    })
}

/// `POST /v1/conversations/{id}/messages {text, now?, attachments?}` → 202 `{"message": Message,
/// "queue"}` (a turn started, or with `now` will start next) or `{"pending": PendingItem,
/// "queue"}` (queued behind the running turn). Never streams: follow the turn on `…/events`. Its body may be up to
/// [`MESSAGE_BODY_LIMIT`] (files as base64). With `Idempotency-Key`, a retry of the same body
/// within minutes is answered with the first answer (`Idempotent-Replayed: true`), not queued
/// again ([`crate::rest::idempotency`]).
async fn send_message(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<MessageSend>,
) -> Result<Response, ApiError> {
    use crate::rest::idempotency::{self, Begin};
    // With an Idempotency-Key, a retried send gets the first one's answer (see that module).
    let first = match idempotency::key_of(&headers)? {
        None => None,
        Some(key) => match st.sends.begin(&id, &key, idempotency::fingerprint(&body)).await? {
            Begin::Replay(reply) => {
                let mut resp = (StatusCode::ACCEPTED, Json(*reply)).into_response();
                resp.headers_mut().insert(idempotency::REPLAYED, header::HeaderValue::from_static("true"));
                return Ok(resp);
            }
            Begin::First(first) => Some(first),
        },
    };
    let req = send_request(id, body, actor(&headers))?;
    let r = call(st.chat.clone().send_message(req)).await.map_err(ApiError::from_chat)?;
    let reply = chat::send_reply(&r);
    if let Some(first) = first {
        first.finish(&reply);
    }
    Ok((StatusCode::ACCEPTED, Json(reply)).into_response())
}

/// The `SetPending` request of a `PUT …/pending` body (an item without an `id` is new).
pub fn pending_request(id: String, body: PendingSet) -> SetPendingRequest {
    let items = body
        .items
        .into_iter()
        .map(|item| PendingItem {
            id: item.id.unwrap_or_default(),
            text: item.text,
            created_ms: 0,
            source: String::new(),
        })
        .collect();
    SetPendingRequest { conversation_id: id, items, paused: body.paused.unwrap_or(false) }
}

/// `PUT /v1/conversations/{id}/pending {items: [{id?, text}], paused?}` → the queue `{items,
/// paused}`: the ordered pending texts replaced (an item with an `id` keeps it; one without is
/// new), un-paused unless `paused: true`, the next turn started when idle, `queue_changed`
/// broadcast.
async fn set_pending(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<PendingSet>,
) -> Result<Json<api::PendingQueue>, ApiError> {
    let req = pending_request(id, body);
    let q = call(st.chat.clone().set_pending(req)).await.map_err(ApiError::from_chat)?;
    Ok(Json(chat::queue(Some(&q))))
}

/// `POST /v1/conversations/{id}/interrupt` → `{interrupted}`: the in-flight turn stops (its
/// partial message kept as `interrupted`) and the queue pauses; when idle, `false` and nothing
/// changes.
async fn interrupt(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<api::Interrupted>, ApiError> {
    let r = call(st.chat.clone().interrupt(ConversationRef { id })).await.map_err(ApiError::from_chat)?;
    Ok(Json(api::Interrupted { interrupted: r.interrupted }))
}

/// `GET /v1/conversations/{id}/messages/{message_id}/diff?path=src/a.rs` → `{path, diff}`: one
/// file's unified diff of the turn that wrote that assistant message (issue 34 §4). 400 for a
/// missing path or one outside the conversation's folder (absolute, `..`); 404 when the turn's
/// diffs are not kept or it did not change that path.
async fn file_diff(
    State(st): State<Arc<AppState>>,
    Path((id, message_id)): Path<(String, String)>,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<api::FileDiff>, ApiError> {
    let p = Params::from_query(q, &["path"])?;
    let Some(path) = p.get("path").filter(|p| !p.is_empty()) else {
        return Err(ApiError::invalid("give the file's path: ?path=src/a.rs (as listed in files_changed)")
            .with_details(json!({"parameter": "path"})));
    };
    let req = coffer_proto::chat::GetFileDiffRequest { conversation_id: id, message_id, path: path.to_owned() };
    let r = call(st.chat.clone().get_file_diff(req)).await.map_err(ApiError::from_chat)?;
    Ok(Json(api::FileDiff { path: r.path, diff: r.diff }))
}

/// `GET /v1/conversations/{id}/messages/{message_id}/attachments/{name}` → the bytes of a file
/// attached to that user message (its block's `name`), as saved under
/// `<cwd>/.coffer/attachments/<message id>/` (the service reads it: only a plain file name, no
/// symlink, nothing outside that folder). `Content-Type` is the file's type (sniffed for images,
/// else from its name: never the sender's word); an image is `inline`, anything else an
/// `attachment` download; with `X-Content-Type-Options: nosniff`, a `sandbox` CSP (an HTML file
/// opened anyway runs nothing) and `Cache-Control: private, no-store`. 400 for a bad id or a
/// name that is a path; 404 for an unknown conversation, message (or one of another
/// conversation) or file.
async fn attachment(
    State(st): State<Arc<AppState>>,
    Path((id, message_id, name)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let req = coffer_proto::chat::GetAttachmentRequest { conversation_id: id, message_id, name };
    let f = call(st.chat.clone().get_attachment(req))
        .await
        .map_err(|s| path_error(s, &[("conversation_id", "id"), ("message_id", "message_id"), ("name", "name")]))?;
    let image = matches!(f.mime.as_str(), "image/png" | "image/jpeg" | "image/gif" | "image/webp");
    let disposition = content_disposition(if image { "inline" } else { "attachment" }, &f.name);
    let mime = header::HeaderValue::from_str(&f.mime)
        .unwrap_or_else(|_| header::HeaderValue::from_static("application/octet-stream"));
    let mut r = f.data.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, mime);
    h.insert(header::CONTENT_DISPOSITION, disposition);
    h.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    h.insert(header::CONTENT_SECURITY_POLICY, header::HeaderValue::from_static("sandbox; default-src 'none'"));
    h.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("private, no-store"));
    Ok(r)
}

/// A chat service error about a request built from path parameters: a 400 whose message
/// starts with the service's field name (`name: …`, see `coffer_chat`'s checks) gets
/// `details: {"parameter": P}`, P the path parameter of that field (`fields`: service field →
/// path parameter). Other errors as [`ApiError::from_chat`].
fn path_error(s: tonic::Status, fields: &[(&str, &str)]) -> ApiError {
    let invalid = s.code() == tonic::Code::InvalidArgument;
    let field = fields.iter().find(|(f, _)| s.message().strip_prefix(f).is_some_and(|r| r.starts_with(':')));
    let err = ApiError::from_chat(s);
    match field {
        Some((_, parameter)) if invalid => err.with_details(json!({"parameter": parameter})),
        _ => err,
    }
}

/// `inline|attachment; filename="<ASCII stand-in>"; filename*=UTF-8''<percent-encoded>`
/// (RFC 6266 with RFC 8187): the stand-in keeps letters, digits and `.-_ ` and turns anything
/// else (quotes, backslashes, control and non-ASCII characters) into `_`, so no name can break
/// the header.
pub fn content_disposition(kind: &'static str, name: &str) -> header::HeaderValue {
    let plain: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ' ') { c } else { '_' })
        .collect();
    let mut encoded = String::with_capacity(name.len() * 3);
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    header::HeaderValue::from_str(&format!("{kind}; filename=\"{plain}\"; filename*=UTF-8''{encoded}"))
        .unwrap_or_else(|_| header::HeaderValue::from_static("attachment"))
}

/// `DELETE /v1/conversations/{id}/allowed-tools` → `{forgotten}`: the tools an `allow_always`
/// answer allowed in this conversation are forgotten (their next requests ask again); 404 for
/// an unknown conversation.
async fn forget_allowed_tools(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<api::AllowedToolsForgotten>, ApiError> {
    let r = call(st.chat.clone().forget_allowed_tools(ConversationRef { id })).await.map_err(ApiError::from_chat)?;
    Ok(Json(api::AllowedToolsForgotten { forgotten: r.forgotten }))
}

// ---------------------------------------------------------------------------------------------
// Approvals.

/// The `AnswerApproval` request of a `POST …/approvals/{number}` body: `source` `web` for a
/// console session (else the request's actor: `cli`, `api`…), `actor` the session's label or
/// `daemon token`. The decision word is the service's to check (it names the allowed ones).
///
/// # Errors
/// `INVALID_ARGUMENT` naming `number` when it is not a positive integer.
pub fn answer_request(
    id: String,
    number: &str,
    body: api::ApprovalAnswer,
    headers: &HeaderMap,
    via: Option<&Via>,
) -> Result<AnswerApprovalRequest, ApiError> {
    let number = number.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
        ApiError::invalid(format!(
            "number: {:?} is not an approval number (the seq of its approval_requested event)",
            number.chars().take(32).collect::<String>()
        ))
        .with_details(json!({"parameter": "number"}))
    })?;
    let (source, actor) = match via {
        Some(Via::Session(s)) => ("web".to_owned(), format!("session:{}", s.label())),
        _ => {
            let a = actor(headers);
            (if a == "ui" { "web".to_owned() } else { a }, "daemon token".to_owned())
        }
    };
    Ok(AnswerApprovalRequest {
        conversation_id: id,
        number,
        decision: body.decision,
        message: body.message.unwrap_or_default(),
        source,
        actor,
    })
}

/// `POST /v1/conversations/{id}/approvals/{number} {decision, message?}` → 200
/// `ApprovalResolved`: the first answer decides (the agent is told, `approval_resolved` goes to
/// every surface). 404 `NOT_FOUND`: no such request; 409 `ALREADY_DECIDED` with details
/// `{decision, decided_by}`: answered before, timed out, interrupted or the turn ended; 400 for a
/// decision other than `allow`, `allow_always`, `deny`.
async fn answer_approval(
    State(st): State<Arc<AppState>>,
    Path((id, number)): Path<(String, String)>,
    headers: HeaderMap,
    via: Option<axum::Extension<Via>>,
    JsonBody(body): JsonBody<api::ApprovalAnswer>,
) -> Result<Json<api::ApprovalResolved>, ApiError> {
    let req = answer_request(id, &number, body, &headers, via.as_deref())?;
    match call(st.chat.clone().answer_approval(req)).await {
        Ok(r) => Ok(Json(chat::approval_resolved(&r))),
        Err(s) if s.code() == tonic::Code::AlreadyExists => {
            let first: Option<coffer_proto::chat::ApprovalResolved> = prost::Message::decode(s.details()).ok();
            let details = first.map_or_else(
                || json!({}),
                |f| json!({"number": f.number, "decision": f.decision, "decided_by": f.decided_by, "actor": (!f.actor.is_empty()).then_some(f.actor)}),
            );
            Err(ApiError::new(Code::AlreadyDecided, s.message()).with_details(details))
        }
        Err(s) => Err(ApiError::from_chat(s)),
    }
}

// ---------------------------------------------------------------------------------------------
// Events (SSE).

/// `GET /v1/conversations/{id}/events` (`Last-Event-ID` or `?after=N`) → `text/event-stream`
/// of the conversation's events; see the module docs. An unknown conversation is 404 before any
/// stream starts.
async fn events(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = Params::from_query(q, &["after"])?;
    let last = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(v.to_str().map_err(|_| {
            ApiError::invalid("Last-Event-ID must be an event sequence number")
                .with_details(json!({"header": "Last-Event-ID"}))
        })?),
    };
    let after_seq = chat::after_seq(last, p.get("after")).map_err(|m| {
        let what = if last.is_some() { json!({"header": "Last-Event-ID"}) } else { json!({"parameter": "after"}) };
        ApiError::invalid(m).with_details(what)
    })?;
    let stream = call(st.chat.clone().subscribe(SubscribeRequest { conversation_id: id.clone(), after_seq }))
        .await
        .map_err(ApiError::from_chat)?;
    tracing::debug!(conversation = %id, after_seq, "Event stream opened.");
    let counted = st.streams.conversation.hold();
    Ok(crate::rest::events::counted(event_stream(stream, KEEPALIVE, st.shutdown.clone()), counted))
}

/// A `text/event-stream` response (axum's [`Sse`]: uncached) over `events`, unbuffered by
/// proxies, with a `: keep-alive` comment after `keepalive` without an event.
fn sse_response<S>(events: S, keepalive: Duration) -> Response
where
    S: Stream<Item = Result<SseEvent, std::convert::Infallible>> + Send + 'static,
{
    let sse = Sse::new(events).keep_alive(KeepAlive::new().interval(keepalive).text("keep-alive"));
    ([("x-accel-buffering", "no")], sse).into_response()
}

/// `GET /v1/conversations/events` → `text/event-stream` of the conversation list's changes
/// ([`change_stream`]): `event: conversation` (an item of `GET /v1/conversations`), `event:
/// deleted` (`{"id"}`), `event: reset` (`{"reason"}`, then the stream ends: reload the list).
/// It starts live when the response starts: open it, then list.
async fn conversation_events(
    State(st): State<Arc<AppState>>,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    Params::from_query(q, &[])?;
    let stream =
        call(st.chat.clone().watch_conversations(WatchConversationsRequest {})).await.map_err(ApiError::from_chat)?;
    tracing::debug!("Conversation list stream opened.");
    let counted = st.streams.list.hold();
    Ok(crate::rest::events::counted(change_stream(stream, KEEPALIVE, st.shutdown.clone()), counted))
}

/// The SSE response of a `WatchConversations` stream: one [`chat::change_frame`] per change,
/// `: keep-alive\n\n` after `keepalive` without one; ends after a `reset`, when `changes` ends
/// or fails, or when `shutdown` fires.
pub fn change_stream<S>(changes: S, keepalive: Duration, shutdown: CancellationToken) -> Response
where
    S: Stream<Item = Result<ConversationChange, tonic::Status>> + Send + Unpin + 'static,
{
    sse_response(sse_events(changes, shutdown, chat::change_frame), keepalive)
}

/// The SSE response of a `Subscribe` stream: one [`chat::sse_frame`] per event,
/// `: keep-alive\n\n` after `keepalive` without one. Ends after an event that
/// [`chat::ends_stream`], when `events` ends or fails (the client reconnects with
/// `Last-Event-ID`), or when `shutdown` fires. Events of a kind this edge does not know are
/// skipped. Dropping the body drops `events` (the gRPC stream is cancelled; the service frees
/// the subscriber).
pub fn event_stream<S>(events: S, keepalive: Duration, shutdown: CancellationToken) -> Response
where
    S: Stream<Item = Result<Event, tonic::Status>> + Send + Unpin + 'static,
{
    sse_response(sse_events(events, shutdown, |e: &Event| Some((chat::sse_frame(e)?, chat::ends_stream(e)))), keepalive)
}

/// SSE events from a gRPC stream: `frame` gives each item's event (`None`: skipped) and whether
/// the stream ends after it; ends when the stream ends or fails, or when `shutdown` fires.
fn sse_events<T, S>(
    events: S,
    shutdown: CancellationToken,
    frame: fn(&T) -> Option<(SseEvent, bool)>,
) -> impl Stream<Item = Result<SseEvent, std::convert::Infallible>> + Send + 'static
where
    T: Send + 'static,
    S: Stream<Item = Result<T, tonic::Status>> + Send + Unpin + 'static,
{
    struct St<S> {
        events: S,
        shutdown: CancellationToken,
        done: bool,
    }
    futures_util::stream::unfold(St { events, shutdown, done: false }, move |mut s| async move {
        loop {
            if s.done {
                return None;
            }
            let frame = tokio::select! {
                biased;
                () = s.shutdown.cancelled() => return None,
                next = s.events.next() => match next {
                    Some(Ok(e)) => match frame(&e) {
                        Some((f, ends)) => {
                            s.done = ends;
                            f
                        }
                        None => continue,
                    },
                    Some(Err(status)) => {
                        tracing::info!(code = ?status.code(), error = %status.message(), "Chat event stream broke; the client resumes with Last-Event-ID.");
                        return None;
                    }
                    None => return None,
                },
            };
            return Some((Ok(frame), s));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn body<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
        Ok(coffer_api::body::from_value(v)?)
    }
    fn create(v: Value, actor: String) -> Result<CreateConversationRequest, ApiError> {
        body(v).map(|b| create_request(b, actor))
    }
    fn update(id: String, v: Value, h: &HeaderMap) -> Result<UpdateConversationRequest, ApiError> {
        update_request(id, body(v)?, h)
    }
    fn send(id: String, v: Value, actor: String) -> Result<SendMessageRequest, ApiError> {
        body(v).and_then(|b| send_request(id, b, actor))
    }
    fn pending(id: String, v: Value) -> Result<SetPendingRequest, ApiError> {
        body(v).map(|b| pending_request(id, b))
    }
    use axum::body::Bytes;
    use axum::http::HeaderValue;
    use coffer_proto::chat::{Reset, TextDelta, event};

    fn text(seq: u64, t: &str) -> Result<Event, tonic::Status> {
        Ok(Event {
            seq,
            conversation_id: "01C".into(),
            turn_id: "01T".into(),
            kind: Some(event::Kind::TextDelta(TextDelta { text: t.into() })),
            ..Default::default()
        })
    }

    fn reset(seq: u64, reason: &str) -> Result<Event, tonic::Status> {
        Ok(Event { seq, kind: Some(event::Kind::Reset(Reset { reason: reason.into() })), ..Default::default() })
    }

    async fn collect(events: Vec<Result<Event, tonic::Status>>) -> String {
        let r = event_stream(futures_util::stream::iter(events), Duration::from_secs(60), CancellationToken::new());
        let frames: Vec<_> = r.into_body().into_data_stream().collect().await;
        frames.into_iter().map(|f| String::from_utf8(f.unwrap().to_vec()).unwrap()).collect()
    }

    /// `(id, event)` of each frame, through the shared SSE parser.
    fn parse(body: &str) -> Vec<(String, String, Value)> {
        let mut p = coffer_types::sse::SseParser::new();
        let mut out = Vec::new();
        let mut evs = Vec::new();
        for line in body.split_inclusive("\n\n") {
            p.push(line.as_bytes(), &mut evs);
            for e in evs.drain(..) {
                let data: Value = serde_json::from_slice(&e.data).unwrap();
                out.push((p.last_event_id().unwrap_or_default().to_owned(), e.event.clone(), data));
            }
        }
        out
    }

    #[tokio::test]
    async fn frames_carry_seq_kind_and_json_and_end_after_a_final_reset() {
        let body = collect(vec![text(4, "Hel"), text(5, "lo\nthere"), reset(6, "lagged"), text(7, "never")]).await;
        let frames = parse(&body);
        assert_eq!(frames.len(), 3, "{body}");
        assert_eq!((frames[0].0.as_str(), frames[0].1.as_str()), ("4", "text_delta"));
        assert_eq!(frames[1].2["text_delta"]["text"], "lo\nthere");
        assert_eq!((frames[2].0.as_str(), frames[2].1.as_str()), ("6", "reset"));
        assert_eq!(frames[2].2["reset"]["reason"], "lagged");
        assert!(!body.contains("never"));
        // too_old is followed by the live stream; a kindless event is skipped.
        let body = collect(vec![
            reset(1, "too_old"),
            Ok(Event { seq: 2, ..Default::default() }),
            text(3, "x"),
            reset(4, "deleted"),
        ])
        .await;
        let ids: Vec<String> = parse(&body).into_iter().map(|f| f.0).collect();
        assert_eq!(ids, ["1", "3", "4"]);
    }

    #[tokio::test]
    async fn a_broken_grpc_stream_ends_the_body_after_what_it_delivered() {
        let body = collect(vec![text(1, "a"), Err(tonic::Status::unavailable("gone")), text(2, "b")]).await;
        assert_eq!(parse(&body).len(), 1, "{body}");
    }

    #[tokio::test]
    async fn silence_gets_keep_alive_comments_and_shutdown_ends_the_stream() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, tonic::Status>>(4);
        let shutdown = CancellationToken::new();
        let r =
            event_stream(tokio_stream::wrappers::ReceiverStream::new(rx), Duration::from_millis(20), shutdown.clone());
        assert_eq!(r.headers()[header::CONTENT_TYPE], "text/event-stream");
        assert_eq!(r.headers()[header::CACHE_CONTROL], "no-cache");
        assert_eq!(r.headers()["x-accel-buffering"], "no");
        let mut s = r.into_body().into_data_stream();
        async fn next<S: Stream<Item = Result<Bytes, axum::Error>> + Unpin>(s: &mut S) -> Option<Bytes> {
            let f = tokio::time::timeout(Duration::from_secs(10), StreamExt::next(s));
            f.await.expect("a frame within the deadline").map(|b| b.unwrap())
        }
        assert_eq!(next(&mut s).await.unwrap(), Bytes::from_static(b": keep-alive\n\n"));
        tx.send(text(9, "x")).await.unwrap();
        let f = next(&mut s).await.unwrap();
        assert!(f.starts_with(b"id: 9\nevent: text_delta\n"), "{f:?}");
        assert_eq!(next(&mut s).await.unwrap(), Bytes::from_static(b": keep-alive\n\n"));
        shutdown.cancel();
        assert!(next(&mut s).await.is_none());
        // The gRPC stream was dropped with the body's state.
        drop(s);
        assert!(tx.send(text(10, "y")).await.is_err());
    }

    #[test]
    fn create_bodies_are_checked_and_session_id_is_not_the_callers() {
        let r = create(
            json!({"agent_key": "codex", "agent_config": {"cwd": "/w", "model": "o4"}, "first_message": "hi"}),
            "cli".into(),
        )
        .unwrap();
        let cfg = r.agent_config.unwrap();
        assert_eq!((r.agent_key.as_str(), cfg.cwd.as_str(), cfg.model.as_str()), ("codex", "/w", "o4"));
        assert_eq!((r.first_message.as_str(), r.source.as_str()), ("hi", "cli"));
        let r = create(json!({"agent_key": "claude_code"}), "api".into()).unwrap();
        assert_eq!((r.source.as_str(), r.agent_config.unwrap()), ("", AgentConfig::default()));
        let e = create(json!({"agent_key": "x", "agent_config": {"session_id": "s"}}), "api".into()).unwrap_err();
        assert_eq!((e.code, &e.details["field"]), (Code::UnknownField, &json!("agent_config.session_id")));
        let e = create(json!({"agent_key": "x", "agent_config": {"cwd": 1}}), "api".into()).unwrap_err();
        assert_eq!(e.message, "field \"agent_config.cwd\" must be a string, not an integer");
        let e = create(json!({"agent_key": "x", "agent_config": "/w"}), "api".into()).unwrap_err();
        assert_eq!(e.message, "field \"agent_config\" must be an object, not a string");
        let e = create(json!({}), "api".into()).unwrap_err();
        assert_eq!(e.message, "field \"agent_key\" is required");
        assert_eq!(create(json!({"agent": "x"}), "api".into()).unwrap_err().code, Code::UnknownField);
    }

    #[test]
    fn list_parameters_are_checked() {
        let pairs = |p: &[(&str, &str)]| p.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<Vec<_>>();
        let allowed = &["archived", "q", "cursor", "limit"];
        let r = list_request(
            &Params::parse(pairs(&[("archived", "all"), ("q", "build"), ("limit", "7")]), allowed).unwrap(),
        )
        .unwrap();
        assert_eq!((r.archived(), r.query.as_str(), r.limit), (Archived::All, "build", 7));
        let r = list_request(&Params::parse(Vec::new(), allowed).unwrap()).unwrap();
        assert_eq!((r.archived(), r.limit), (Archived::Active, 50));
        for bad in [&[("archived", "yes")][..], &[("limit", "0")], &[("limit", "201")]] {
            let e = list_request(&Params::parse(pairs(bad), allowed).unwrap()).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{bad:?}");
            assert!(e.details.get("parameter").is_some());
        }
    }

    #[test]
    fn patches_need_a_change_and_take_if_match() {
        let mut h = HeaderMap::new();
        h.insert(header::IF_MATCH, HeaderValue::from_static("\"3\""));
        let r = update("01C".into(), json!({"title": "New", "archived": true}), &h).unwrap();
        assert_eq!(
            (r.expected_version, r.title.as_deref(), r.model, r.archived),
            (Some(3), Some("New"), None, Some(true))
        );
        let r = update("01C".into(), json!({"model": ""}), &HeaderMap::new()).unwrap();
        assert_eq!((r.expected_version, r.model.as_deref()), (None, Some("")));
        assert_eq!(update("01C".into(), json!({}), &h).unwrap_err().code, Code::InvalidArgument);
        assert_eq!(update("01C".into(), json!({"archived": "yes"}), &h).unwrap_err().code, Code::InvalidArgument);
        assert_eq!(update("01C".into(), json!({"cwd": "/x"}), &h).unwrap_err().code, Code::UnknownField);
        h.insert(header::IF_MATCH, HeaderValue::from_static("W/\"3\""));
        assert_eq!(update("01C".into(), json!({"title": "x"}), &h).unwrap_err().code, Code::InvalidArgument);
    }

    #[test]
    fn messages_need_text_and_carry_the_actor() {
        let r = send("01C".into(), json!({"text": "hello"}), "ui".into()).unwrap();
        assert_eq!((r.conversation_id.as_str(), r.text.as_str(), r.source.as_str()), ("01C", "hello", "ui"));
        assert!(!r.now, "a plain send");
        assert!(send("01C".into(), json!({"text": "x", "now": true}), "ui".into()).unwrap().now);
        assert!(!send("01C".into(), json!({"text": "x", "now": false}), "ui".into()).unwrap().now);
        assert_eq!(
            send("01C".into(), json!({"text": "x", "now": "yes"}), "api".into()).unwrap_err().code,
            Code::InvalidArgument
        );
        // Empty text is the service's to refuse (it names the limit).
        assert_eq!(send("01C".into(), json!({"text": ""}), "api".into()).unwrap().text, "");
        assert_eq!(send("01C".into(), json!({}), "api".into()).unwrap_err().code, Code::InvalidArgument);
        assert_eq!(send("01C".into(), json!({"text": 5}), "api".into()).unwrap_err().code, Code::InvalidArgument);
        assert_eq!(
            send("01C".into(), json!({"text": "x", "source": "web"}), "api".into()).unwrap_err().code,
            Code::UnknownField
        );
    }

    #[test]
    fn pending_bodies_are_ordered_items() {
        let r = pending("01C".into(), json!({"items": [{"id": "01P", "text": "a"}, {"text": "b"}]})).unwrap();
        let got: Vec<(&str, &str)> = r.items.iter().map(|i| (i.id.as_str(), i.text.as_str())).collect();
        assert_eq!((got, r.paused), (vec![("01P", "a"), ("", "b")], false));
        let r = pending("01C".into(), json!({"items": [], "paused": true})).unwrap();
        assert_eq!((r.items.len(), r.paused), (0, true));
        let e = pending("01C".into(), json!({"paused": false})).unwrap_err();
        assert_eq!(e.details["field"], "items");
        let e = pending("01C".into(), json!({"items": "a"})).unwrap_err();
        assert_eq!(e.details["field"], "items");
        let e = pending("01C".into(), json!({"items": [{"id": "x"}]})).unwrap_err();
        assert_eq!(e.message, "field \"items[0].text\" is required");
        let e = pending("01C".into(), json!({"items": [{"text": "a"}, {"text": "b", "when": 1}]})).unwrap_err();
        assert_eq!((e.code, &e.details["field"]), (Code::UnknownField, &json!("items[1].when")));
        let e = pending("01C".into(), json!({"items": [{"text": 1}]})).unwrap_err();
        assert_eq!(e.message, "field \"items[0].text\" must be a string, not an integer");
        assert_eq!(pending("01C".into(), json!({"items": [3]})).unwrap_err().code, Code::InvalidArgument);
    }

    #[test]
    fn a_file_name_cannot_break_its_content_disposition() {
        let h = |kind, name: &str| content_disposition(kind, name).to_str().unwrap().to_owned();
        assert_eq!(h("inline", "shot.png"), "inline; filename=\"shot.png\"; filename*=UTF-8''shot.png");
        assert_eq!(
            h("attachment", "a\"b\\c;\r\nX-Evil: 1é.txt"),
            "attachment; filename=\"a_b_c___X-Evil_ 1_.txt\"; filename*=UTF-8''a%22b%5Cc%3B%0D%0AX-Evil%3A%201%C3%A9.txt"
        );
    }
}
