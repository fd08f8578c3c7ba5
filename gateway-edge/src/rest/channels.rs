//! `/v1/channels…`: the IM channels the owner drives conversations from (the store's `Channels`,
//! `proto/store_channels.proto`) — CRUD with versions and `If-Match`, enable/disable, pairing
//! (a one-time code the owner sends to the bot) and unpairing. A channel's JSON merges its
//! adapter's live state from coffer-chat's `ChannelAdapters.ListAdapters`
//! (`proto/channel.proto`); while chat is down or does not serve it, `adapter` is null.
//!
//! Secrets are write-once body fields (`bot_token`, `app_id`, `app_secret`, `signing_secret`):
//! each is stored as a credential — under the matching `*_ref` when the body names one, else
//! under `channel-<name>-<field>` (e.g. `channel-home-bot-token`), which the channel then names
//! — never in the channel row, never echoed or logged; a response says only
//! `credentials_set: {bot_token: true, …}`. A secret in a query string is refused. The acting
//! party in the audit log is `api` unless `X-Coffer-Actor` says otherwise. The bodies are the
//! `coffer_api::channels` types.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use coffer_api::Page;
use coffer_api::channels as api;
use coffer_proto::channel::{AdapterStatus, ListAdaptersRequest};
use coffer_proto::store::{
    ChannelKind, ChannelRecord, CreateChannelRequest, DeleteChannelRequest, GetChannelRequest, ListChannelsRequest,
    StartPairingRequest, UnpairRequest, UpdateChannelRequest,
};
use coffer_types::channels as rules;
use serde_json::{Value, json};

use crate::error::{ApiError, Code, JsonBody};
use crate::rest::owned_credentials::{credential_names, drop_if_unused, store_secret};
use crate::rest::servers::{actor, etag, parse_if_match, settle, version_conflict};
use crate::state::AppState;

/// Attempts of a write without `If-Match` that loses a race with another writer.
const WRITE_ATTEMPTS: usize = 3;

/// How long a listing waits for coffer-chat's adapter states before it shows `adapter: null`.
const ADAPTERS_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest secret a body may carry (bytes): the credential store's value limit.
pub const MAX_SECRET_LEN: usize = 65_536;

/// Channel routes; every one refuses a secret in its query string.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/channels", get(list).post(create))
        .route("/v1/channels/{name}", get(get_one).patch(patch).delete(delete))
        .route("/v1/channels/{name}/enable", post(enable))
        .route("/v1/channels/{name}/disable", post(disable))
        .route("/v1/channels/{name}/pair", post(pair).delete(unpair))
        .route_layer(axum::middleware::from_fn(no_secret_in_query))
}

/// Refuses a request whose query string names a secret field (`?bot_token=…`): URLs end up in
/// shell histories, proxies' logs and browser history. The value is never echoed.
async fn no_secret_in_query(req: Request, next: Next) -> Response {
    if let Some(q) = req.uri().query() {
        let named = q.split('&').filter_map(|kv| kv.split('=').next()).find_map(|k| {
            let k = k.to_ascii_lowercase();
            rules::SECRET_FIELDS.iter().find(|f| f.1 == k || f.2 == k).map(|f| f.1)
        });
        if let Some(field) = named {
            return ApiError::invalid(format!(
                "{field} must not be sent in a URL (query strings end up in logs and histories); send it once in \
                 the JSON body"
            ))
            .with_details(json!({"field": field}))
            .into_response();
        }
    }
    next.run(req).await
}

// ---------------------------------------------------------------------------------------------
// JSON.

/// The adapter's live state as REST answers it (`null` times for 0).
pub fn adapter(a: &AdapterStatus) -> api::Adapter {
    let ms = |v: i64| (v > 0).then_some(v);
    let opt = |v: &str| (!v.is_empty()).then(|| v.to_owned());
    api::Adapter {
        state: a.state.clone(),
        last_error: opt(&a.last_error),
        started_ms: ms(a.started_ms),
        last_inbound_ms: ms(a.last_inbound_ms),
        last_outbound_ms: ms(a.last_outbound_ms),
        retry_at_ms: ms(a.retry_at_ms),
        bot_username: opt(&a.bot_username),
    }
}

/// A record's credential reference in field `field` (`bot_token_ref`, …).
fn ref_of<'a>(c: &'a ChannelRecord, field: &str) -> &'a str {
    match field {
        "bot_token_ref" => &c.bot_token_ref,
        "app_id_ref" => &c.app_id_ref,
        "app_secret_ref" => &c.app_secret_ref,
        "signing_secret_ref" => &c.signing_secret_ref,
        _ => "",
    }
}

fn set_ref(c: &mut ChannelRecord, field: &str, value: String) {
    match field {
        "bot_token_ref" => c.bot_token_ref = value,
        "app_id_ref" => c.app_id_ref = value,
        "app_secret_ref" => c.app_secret_ref = value,
        "signing_secret_ref" => c.signing_secret_ref = value,
        _ => {}
    }
}

/// `(secret field, ref field, generated credential)` of `c`'s kind.
fn kind_fields(c: &ChannelRecord) -> Vec<(&'static str, &'static str, String)> {
    let kind = c.kind().as_str();
    rules::SECRET_FIELDS
        .iter()
        .filter(|f| f.0 == kind)
        .map(|f| (f.1, f.2, rules::generated_credential(&c.name, f.1).unwrap_or_default()))
        .collect()
}

/// A channel as REST answers it: the refs of its kind present (null when unset), those of the
/// other kind absent; `credentials_set` maps each of the kind's secret fields to whether its
/// credential has a value (`have` holds the credential names that have one). Never a secret.
pub fn channel(c: &ChannelRecord, have: &BTreeSet<String>, live: Option<&AdapterStatus>) -> api::Channel {
    let opt = |v: &str| (!v.is_empty()).then(|| v.to_owned());
    let mut out = api::Channel {
        name: c.name.clone(),
        kind: c.kind().as_str().to_owned(),
        enabled: c.enabled,
        api_base_url: opt(&c.api_base_url),
        default_agent: opt(&c.default_agent),
        agent_config: serde_json::from_str(&c.agent_config_json).ok(),
        paired: !c.owner_id.is_empty(),
        owner: (!c.owner_id.is_empty()).then(|| api::Owner {
            id: c.owner_id.clone(),
            display: opt(&c.owner_display),
            paired_at: c.paired_at.clone(),
        }),
        pairing: api::Pairing { pending: c.pairing_pending, expires_at: opt(&c.pairing_expires_at) },
        version: c.version,
        created_at: c.created_at.clone(),
        updated_at: c.updated_at.clone(),
        adapter: live.map(adapter),
        bot_token_ref: None,
        app_id_ref: None,
        app_secret_ref: None,
        signing_secret_ref: None,
        credentials_set: Default::default(),
    };
    for (secret, field, _) in kind_fields(c) {
        let r = ref_of(c, field);
        let slot = match field {
            "bot_token_ref" => &mut out.bot_token_ref,
            "app_id_ref" => &mut out.app_id_ref,
            "app_secret_ref" => &mut out.app_secret_ref,
            _ => &mut out.signing_secret_ref,
        };
        *slot = Some(opt(r));
        out.credentials_set.insert(secret.to_owned(), !r.is_empty() && have.contains(r));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Refuses to make `generated` the home of a new secret when a credential of that name already
/// exists: it may be someone else's, which replacing would lose.
async fn refuse_taken_credential(st: &AppState, field: &str, generated: &str) -> Result<(), ApiError> {
    if credential_names(st).await?.contains(generated) {
        return Err(ApiError::new(
            Code::Conflict,
            format!(
                "a credential named {generated:?} already exists; to keep the secret there, name it with {field}_ref \
                 \"{generated}\", or remove it first (coffer credentials delete {generated})"
            ),
        )
        .with_details(json!({"field": field, "credential": generated})));
    }
    Ok(())
}

/// Refuses a secret the credential store would refuse, before anything is written. The message
/// never quotes the value.
fn check_secret(field: &str, value: &str) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::invalid(m).with_details(json!({"field": field})));
    if value.is_empty() || value.len() > MAX_SECRET_LEN {
        return bad(format!("{field} must be 1-{MAX_SECRET_LEN} bytes, not {}", value.len()));
    }
    if value.chars().any(char::is_control) {
        return bad(format!("{field} must not contain control characters (a trailing newline?)"));
    }
    if value.trim().is_empty() {
        return bad(format!("{field} is only whitespace; give the real value"));
    }
    if value.trim() != value {
        return bad(format!("{field} must not start or end with whitespace (a stray space when pasting?)"));
    }
    Ok(())
}

/// Refuses an `agent_config.cwd` that is not an existing folder on this machine (the agent would
/// fail to start in it at the owner's first message). Empty or absent: the agent's default.
async fn check_cwd(config_json: &str) -> Result<(), ApiError> {
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(config_json) else { return Ok(()) };
    let Some(cwd) = map.get("cwd").and_then(Value::as_str).filter(|c| !c.is_empty()) else { return Ok(()) };
    // The store checks the shape (absolute, no control characters, length); this checks the folder.
    if !cwd.starts_with('/') || cwd.chars().any(char::is_control) || cwd.len() > rules::MAX_CWD_LEN {
        return Ok(());
    }
    let shown: String = cwd.chars().take(200).collect();
    let bad = |why: &str| {
        Err(ApiError::invalid(format!("agent_config.cwd {shown:?} {why}; give an existing folder (--cwd)"))
            .with_details(json!({"field": "agent_config.cwd"})))
    };
    match tokio::fs::metadata(cwd).await {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bad("is not a folder"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bad("does not exist"),
        Err(_) => bad("cannot be read"),
    }
}

/// Refuses a Telegram channel whose bot token is the token of another channel: Telegram serves
/// one `getUpdates` poller per bot and answers the other 409 Conflict, so the two channels would
/// take turns failing. `new_value` is the token the request is about to store (else the value of
/// `c.bot_token_ref` as stored). The values are compared here, in the gateway — one of the
/// services that may resolve credentials — in constant time, and never returned or logged; a
/// credential that does not exist yet is not compared (the adapter reports a clash later).
///
/// Errors: `CONFLICT` naming the other channel (`details.field` `bot_token`, `details.channel`).
async fn refuse_shared_token(st: &AppState, c: &ChannelRecord, new_value: Option<&str>) -> Result<(), ApiError> {
    use secrecy::{ExposeSecret, SecretString};
    use subtle::ConstantTimeEq;
    if c.kind() != ChannelKind::Telegram {
        return Ok(());
    }
    let all = st.store.channels.clone().list_channels(ListChannelsRequest {}).await?.into_inner().channels;
    let others: Vec<&ChannelRecord> = all
        .iter()
        .filter(|o| o.name != c.name && o.kind() == ChannelKind::Telegram && !o.bot_token_ref.is_empty())
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    let shared = |other: &str| {
        ApiError::new(
            Code::Conflict,
            format!(
                "bot_token: channel {other:?} already uses this bot token; Telegram serves one poller per bot \
                 (the second gets 409 Conflict), so create another bot with @BotFather for this channel, or \
                 remove channel {other:?} first"
            ),
        )
        .with_details(json!({"field": "bot_token", "channel": other}))
    };
    // The same credential named twice is the same token, whatever its value.
    if new_value.is_none()
        && let Some(o) = others.iter().find(|o| o.bot_token_ref == c.bot_token_ref)
    {
        return Err(shared(&o.name));
    }
    let resolve = |name: String| {
        let mut client = st.store.credentials.clone();
        async move {
            match client
                .resolve_credentials(coffer_proto::store::ResolveCredentialsRequest { names: vec![name.clone()] })
                .await
            {
                Ok(r) => Ok(r.into_inner().values.remove(&name).map(SecretString::from)),
                Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
                Err(s) => Err(ApiError::from(s)),
            }
        }
    };
    let mine = match new_value {
        Some(v) => SecretString::from(v.to_owned()),
        None => match resolve(c.bot_token_ref.clone()).await? {
            Some(v) => v,
            None => return Ok(()),
        },
    };
    for o in others {
        let Some(theirs) = resolve(o.bot_token_ref.clone()).await? else { continue };
        if bool::from(theirs.expose_secret().as_bytes().ct_eq(mine.expose_secret().as_bytes())) {
            return Err(shared(&o.name));
        }
    }
    Ok(())
}

/// The kind a body names.
fn parse_kind(word: &str) -> Result<ChannelKind, ApiError> {
    ChannelKind::parse(word).ok_or_else(|| {
        let shown: String = word.chars().take(40).collect();
        ApiError::invalid(format!("kind {shown:?} is not one of {}", rules::KINDS.join(", ")))
            .with_details(json!({"field": "kind", "allowed": rules::KINDS}))
    })
}

/// The fields a store refusal may name; its message starts with the field.
const FIELDS: &[&str] = &[
    "name",
    "kind",
    "bot_token_ref",
    "app_id_ref",
    "app_secret_ref",
    "signing_secret_ref",
    "api_base_url",
    "default_agent",
    "ttl_s",
];

/// A store write's refusal as an envelope whose `details.field` names the field the message
/// starts with (`agent_config_json…` is the body's `agent_config`).
fn refused(s: tonic::Status) -> ApiError {
    let e = ApiError::from(s);
    if e.code != Code::InvalidArgument {
        return e;
    }
    if e.message.starts_with("agent_config_json") {
        let message = e.message.replacen("agent_config_json", "agent_config", 1);
        return ApiError::invalid(message).with_details(json!({"field": "agent_config"}));
    }
    let first = e.message.split([' ', ':']).next().unwrap_or_default().to_owned();
    match FIELDS.iter().find(|f| **f == first) {
        Some(f) => e.with_details(json!({"field": f})),
        None => e,
    }
}

async fn fetch(st: &AppState, name: &str) -> Result<ChannelRecord, ApiError> {
    Ok(st.store.channels.clone().get_channel(GetChannelRequest { name: name.to_owned() }).await?.into_inner())
}

/// Every adapter's live state, or `None` when coffer-chat does not answer (down, starting, or
/// not serving `ListAdapters` yet).
async fn adapters(st: &AppState) -> Option<Vec<AdapterStatus>> {
    let mut c = st.adapters.clone();
    let ask = c.list_adapters(ListAdaptersRequest {});
    match coffer_runtime::grpc::call_within("chat service (channel adapters)", ADAPTERS_TIMEOUT, ask).await {
        Ok(r) => Some(r.adapters),
        Err(e) => {
            tracing::debug!(code = ?e.code(), error = %e.message(), "No adapter states from the chat service.");
            None
        }
    }
}

async fn rendered(st: &AppState, c: &ChannelRecord) -> Result<api::Channel, ApiError> {
    let have = credential_names(st).await?;
    let live = adapters(st).await.unwrap_or_default();
    Ok(channel(c, &have, live.iter().find(|a| a.channel == c.name)))
}

/// A single-channel response with its `ETag`.
async fn with_etag(st: &AppState, status: StatusCode, c: &ChannelRecord) -> Result<Response, ApiError> {
    let mut r = (status, Json(rendered(st, c).await?)).into_response();
    r.headers_mut().insert(header::ETAG, etag(c.version));
    Ok(r)
}

/// `agent_config` of a body as the store's `agent_config_json` (null/absent → empty; the
/// store checks the shape).
fn config_json(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(v) => v.to_string(),
    }
}

/// The secrets a body carries: `(secret field, value)`.
type Secrets = Vec<(&'static str, String)>;

/// Checks the secrets of a body against `kind` and their rules.
fn check_secrets(kind: ChannelKind, secrets: &Secrets) -> Result<(), ApiError> {
    for (field, value) in secrets {
        let belongs = rules::SECRET_FIELDS.iter().any(|f| f.0 == kind.as_str() && f.1 == *field);
        if !belongs {
            return Err(ApiError::invalid(format!("{field} is not used by a {} channel", kind.as_str()))
                .with_details(json!({"field": field})));
        }
        check_secret(field, value)?;
    }
    Ok(())
}

/// Where each secret goes: the record's ref for its field, or the generated credential (which
/// the record then names). Returns `(credential, value, generated)` per secret.
fn place_secrets(c: &mut ChannelRecord, secrets: Secrets) -> Vec<(String, String, bool)> {
    let fields = kind_fields(c);
    let mut out = Vec::new();
    for (secret, value) in secrets {
        let Some((_, field, generated)) = fields.iter().find(|f| f.0 == secret) else { continue };
        if ref_of(c, field).is_empty() {
            set_ref(c, field, generated.clone());
        }
        let name = ref_of(c, field).to_owned();
        let is_generated = name == *generated;
        out.push((name, value, is_generated));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// CRUD.

/// `GET /v1/channels` → `{"items":[channel…],"next_cursor":null}`, sorted by name, each with its
/// adapter's live state (`adapter` null while coffer-chat does not say).
///
/// Errors: `SERVICE_UNAVAILABLE` while the store restarts.
async fn list(State(st): State<Arc<AppState>>) -> Result<Json<Page<api::Channel>>, ApiError> {
    let all = st.store.channels.clone().list_channels(ListChannelsRequest {}).await?.into_inner().channels;
    let have = credential_names(&st).await?;
    let live = if all.is_empty() { Vec::new() } else { adapters(&st).await.unwrap_or_default() };
    let items = all.iter().map(|c| channel(c, &have, live.iter().find(|a| a.channel == c.name))).collect();
    Ok(Json(Page::all(items)))
}

/// `GET /v1/channels/{name}` → the channel with `ETag: "<version>"`.
///
/// Errors: `NOT_FOUND`.
async fn get_one(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let c = fetch(&st, &name).await?;
    with_etag(&st, StatusCode::OK, &c).await
}

fn secrets_of(
    bot_token: Option<String>,
    app_id: Option<String>,
    app_secret: Option<String>,
    signing_secret: Option<String>,
) -> Secrets {
    [("bot_token", bot_token), ("app_id", app_id), ("app_secret", app_secret), ("signing_secret", signing_secret)]
        .into_iter()
        .filter_map(|(f, v)| v.map(|v| (f, v)))
        .collect()
}

/// Refuses a `default_agent` that names no registered agent (coffer-chat's `ListAgents`), so a
/// typo is said when the channel is written, not at the owner's first message. Empty means the
/// default (claude_code). When coffer-chat does not answer the name is taken as it is (the
/// first message says so then).
async fn check_agent(st: &AppState, agent: &str) -> Result<(), ApiError> {
    if agent.is_empty() {
        return Ok(());
    }
    let Ok(r) = crate::chat::call(st.chat.clone().list_agents(coffer_proto::chat::ListAgentsRequest {})).await else {
        return Ok(());
    };
    if r.agents.iter().any(|a| a.agent_key == agent) {
        return Ok(());
    }
    let known: Vec<&str> = r.agents.iter().map(|a| a.agent_key.as_str()).collect();
    Err(ApiError::invalid(format!("default_agent: no agent {agent:?} (known: {})", known.join(", ")))
        .with_details(json!({"field": "default_agent"})))
}

/// `POST /v1/channels` with `{name, kind, enabled?, bot_token? | bot_token_ref?, app_id? |
/// app_id_ref?, app_secret? | app_secret_ref?, signing_secret? | signing_secret_ref?,
/// api_base_url?, default_agent?, agent_config?}` → 201 with the channel, `ETag` and
/// `Location`. A new channel is unpaired.
///
/// Errors: `INVALID_ARGUMENT` (unknown kind, a secret missing or of the other kind, the store's
/// validation, a blank secret, an `agent_config.cwd` that is no existing folder),
/// `UNKNOWN_FIELD`, `BAD_REQUEST`, `ALREADY_EXISTS`, `CONFLICT` (a generated credential name is
/// taken; the bot token is another Telegram channel's).
async fn create(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<api::ChannelCreate>,
) -> Result<Response, ApiError> {
    rules::check_name(&b.name).map_err(|m| ApiError::invalid(m).with_details(json!({"field": "name"})))?;
    let kind = parse_kind(&b.kind)?;
    let secrets = secrets_of(b.bot_token, b.app_id, b.app_secret, b.signing_secret);
    check_secrets(kind, &secrets)?;
    let mut c = ChannelRecord {
        name: b.name,
        kind: kind.into(),
        enabled: b.enabled,
        bot_token_ref: b.bot_token_ref.unwrap_or_default(),
        app_id_ref: b.app_id_ref.unwrap_or_default(),
        app_secret_ref: b.app_secret_ref.unwrap_or_default(),
        signing_secret_ref: b.signing_secret_ref.unwrap_or_default(),
        api_base_url: b.api_base_url.unwrap_or_default(),
        default_agent: b.default_agent.unwrap_or_default(),
        agent_config_json: config_json(b.agent_config.as_ref()),
        ..Default::default()
    };
    check_agent(&st, &c.default_agent).await?;
    // A duplicate name is ALREADY_EXISTS before anything else is looked at (the store says so
    // again, atomically, if another create wins meanwhile).
    match st.store.channels.clone().get_channel(GetChannelRequest { name: c.name.clone() }).await {
        Ok(_) => return Err(ApiError::new(Code::AlreadyExists, format!("channel {:?} already exists", c.name))),
        Err(e) if e.code() == tonic::Code::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let placed = place_secrets(&mut c, secrets);
    for (name, _, generated) in &placed {
        if *generated {
            let field = kind_fields(&c).into_iter().find(|f| f.2 == *name).map(|f| f.0).unwrap_or_default();
            refuse_taken_credential(&st, field, name).await?;
        }
    }
    check_cwd(&c.agent_config_json).await?;
    let new_token = placed.iter().find(|(n, _, _)| *n == c.bot_token_ref).map(|(_, v, _)| v.as_str());
    refuse_shared_token(&st, &c, new_token).await?;
    // The secrets first, then the record: coffer-chat starts an adapter when its record appears,
    // and a record whose credentials are not written yet would show as a failed adapter
    // ("credential … is missing") until they land. A record the store refuses takes the
    // credentials this create wrote with it (the generated names only: they were free, checked
    // above, so nothing else uses them).
    let mut written: Vec<String> = Vec::new();
    for (name, value, generated) in placed {
        if let Err(e) = store_secret(&st, &name, value, &headers).await {
            undo_written(&st, &written, &headers).await;
            return Err(e);
        }
        if generated {
            written.push(name);
        }
    }
    let reply = match st
        .store
        .channels
        .clone()
        .create_channel(CreateChannelRequest { channel: Some(c), actor: actor(&headers) })
        .await
    {
        Ok(r) => r.into_inner(),
        Err(e) => {
            undo_written(&st, &written, &headers).await;
            return Err(refused(e));
        }
    };
    let c = reply.channel.unwrap_or_default();
    settle(&st, reply.seq).await;
    tracing::info!(channel = %c.name, kind = c.kind().as_str(), "Channel added.");
    let mut r = with_etag(&st, StatusCode::CREATED, &c).await?;
    if let Ok(loc) = HeaderValue::from_str(&format!("/v1/channels/{}", c.name)) {
        r.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(r)
}

/// Removes the credentials a failed create wrote (`names`: generated, so used by nothing else);
/// a failure is logged, not returned: the create's own error is what the caller needs.
async fn undo_written(st: &AppState, names: &[String], headers: &HeaderMap) {
    for name in names {
        if let Err(e) = drop_if_unused(st, name, headers).await {
            tracing::warn!(credential = %name, error = %e.message, "Could not remove a credential of a channel that was not created.");
        }
    }
}

/// Applies `p` to `cur`, secrets aside (see [`place_secrets`]).
fn apply_patch(cur: &ChannelRecord, p: &api::ChannelPatch) -> Result<ChannelRecord, ApiError> {
    if p.name.as_deref().is_some_and(|n| n != cur.name) {
        return Err(ApiError::invalid("a channel cannot be renamed; remove it and add it under the new name")
            .with_details(json!({"field": "name"})));
    }
    if let Some(k) = &p.kind
        && parse_kind(k)? != cur.kind()
    {
        return Err(ApiError::invalid(format!(
            "kind cannot change: channel {:?} is a {} channel (remove it and add a new one)",
            cur.name,
            cur.kind().as_str()
        ))
        .with_details(json!({"field": "kind"})));
    }
    let mut c = cur.clone();
    if let Some(e) = p.enabled {
        c.enabled = e;
    }
    for (field, v) in [
        ("bot_token_ref", &p.bot_token_ref),
        ("app_id_ref", &p.app_id_ref),
        ("app_secret_ref", &p.app_secret_ref),
        ("signing_secret_ref", &p.signing_secret_ref),
    ] {
        if let Some(v) = v {
            set_ref(&mut c, field, v.clone().unwrap_or_default());
        }
    }
    if let Some(u) = &p.api_base_url {
        c.api_base_url = u.clone().unwrap_or_default();
    }
    if let Some(a) = &p.default_agent {
        c.default_agent = a.clone().unwrap_or_default();
    }
    if let Some(cfg) = &p.agent_config {
        c.agent_config_json = config_json(cfg.as_ref());
    }
    Ok(c)
}

/// `PATCH /v1/channels/{name}` with a partial body → the channel after the change with its new
/// `ETag`. With `If-Match: "<version>"` the write happens only at that version; without it the
/// patch applies to the current version (retried if another writer wins). A secret replaces its
/// credential's value (alone it leaves the record and its version as they are). A credential
/// Coffer made for the channel goes once the channel names another.
///
/// Errors: `NOT_FOUND`, `CONFLICT` (stale `If-Match`; a generated credential name taken; the
/// bot token is another Telegram channel's), `INVALID_ARGUMENT` (as for create),
/// `UNKNOWN_FIELD`, `BAD_REQUEST`.
async fn patch(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    JsonBody(mut p): JsonBody<api::ChannelPatch>,
) -> Result<Response, ApiError> {
    let expected = parse_if_match(&headers)?;
    let secrets = secrets_of(p.bot_token.take(), p.app_id.take(), p.app_secret.take(), p.signing_secret.take());
    let mut attempt = 0;
    let (before, c, placed) = loop {
        attempt += 1;
        let cur = fetch(&st, &name).await?;
        if let Some(e) = expected
            && e != cur.version
        {
            return Err(version_conflict("channel", &name, e, cur.version));
        }
        check_secrets(cur.kind(), &secrets)?;
        let mut next = apply_patch(&cur, &p)?;
        if next.default_agent != cur.default_agent {
            check_agent(&st, &next.default_agent).await?;
        }
        let placed = place_secrets(&mut next, secrets.clone());
        for (cred, _, generated) in &placed {
            let was = kind_fields(&cur).iter().any(|f| ref_of(&cur, f.1) == cred);
            if *generated && !was {
                let field = kind_fields(&next).into_iter().find(|f| f.2 == *cred).map(|f| f.0).unwrap_or_default();
                refuse_taken_credential(&st, field, cred).await?;
            }
        }
        if next.agent_config_json != cur.agent_config_json {
            check_cwd(&next.agent_config_json).await?;
        }
        let new_token = placed.iter().find(|(n, _, _)| *n == next.bot_token_ref).map(|(_, v, _)| v.as_str());
        if new_token.is_some() || next.bot_token_ref != cur.bot_token_ref {
            refuse_shared_token(&st, &next, new_token).await?;
        }
        if next == cur {
            break (cur.clone(), cur, placed);
        }
        let req =
            UpdateChannelRequest { channel: Some(next), expected_version: Some(cur.version), actor: actor(&headers) };
        match st.store.channels.clone().update_channel(req).await {
            Ok(r) => {
                let r = r.into_inner();
                settle(&st, r.seq).await;
                let c = r.channel.unwrap_or_default();
                tracing::info!(channel = %c.name, version = c.version, "Channel updated.");
                break (cur, c, placed);
            }
            Err(e) if e.code() == tonic::Code::Aborted && expected.is_none() && attempt < WRITE_ATTEMPTS => continue,
            Err(e) => return Err(refused(e)),
        }
    };
    for (cred, value, _) in placed {
        store_secret(&st, &cred, value, &headers).await?;
        tracing::info!(channel = %c.name, credential = %cred, "Channel secret replaced.");
    }
    // The credentials Coffer kept for this channel go once it names others (or none).
    for (_, field, generated) in kind_fields(&before) {
        if ref_of(&before, field) == generated && ref_of(&c, field) != generated {
            drop_if_unused(&st, &generated, &headers).await?;
        }
    }
    with_etag(&st, StatusCode::OK, &c).await
}

/// `DELETE /v1/channels/{name}` → 204. Honours `If-Match`. The channel's state (owner, pending
/// code, cursor, seen events) goes with it; conversations bound to it keep their history. The
/// credentials Coffer made for it (`channel-<name>-…`) go too unless something else references
/// them; credentials the person named stay.
///
/// Errors: `NOT_FOUND`, `CONFLICT` (stale `If-Match`), `INVALID_ARGUMENT` (bad `If-Match`).
async fn delete(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let expected = parse_if_match(&headers)?;
    let cur = fetch(&st, &name).await?;
    if let Some(e) = expected
        && e != cur.version
    {
        return Err(version_conflict("channel", &name, e, cur.version));
    }
    let req = DeleteChannelRequest { name: name.clone(), expected_version: Some(cur.version), actor: actor(&headers) };
    let seq = st.store.channels.clone().delete_channel(req).await.map_err(refused)?.into_inner().seq;
    settle(&st, seq).await;
    tracing::info!(channel = %name, "Channel removed.");
    for (_, field, generated) in kind_fields(&cur) {
        if ref_of(&cur, field) == generated {
            drop_if_unused(&st, &generated, &headers).await?;
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Sets the enabled flag (retrying a lost race); nothing is written when it already is.
async fn set_enabled(st: &AppState, name: &str, enabled: bool, headers: &HeaderMap) -> Result<Response, ApiError> {
    let mut attempt = 0;
    let c = loop {
        attempt += 1;
        let cur = fetch(st, name).await?;
        if cur.enabled == enabled {
            break cur;
        }
        let version = cur.version;
        let next = ChannelRecord { enabled, ..cur };
        let req = UpdateChannelRequest { channel: Some(next), expected_version: Some(version), actor: actor(headers) };
        match st.store.channels.clone().update_channel(req).await {
            Ok(r) => {
                let r = r.into_inner();
                settle(st, r.seq).await;
                tracing::info!(channel = %name, enabled, "Channel {}.", if enabled { "enabled" } else { "disabled" });
                break r.channel.unwrap_or_default();
            }
            Err(e) if e.code() == tonic::Code::Aborted && attempt < WRITE_ATTEMPTS => continue,
            Err(e) => return Err(refused(e)),
        }
    };
    with_etag(st, StatusCode::OK, &c).await
}

/// `POST /v1/channels/{name}/enable` → the channel, enabled (coffer-chat's coordinator starts
/// its adapter). Idempotent.
///
/// Errors: `NOT_FOUND`.
async fn enable(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    set_enabled(&st, &name, true, &headers).await
}

/// `POST /v1/channels/{name}/disable` → the channel, disabled (its adapter stops; a running
/// turn finishes, nothing more is sent). Idempotent.
///
/// Errors: `NOT_FOUND`.
async fn disable(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    set_enabled(&st, &name, false, &headers).await
}

/// What the owner is to do with `code`, for people (the CLI and the console show it).
pub fn instruction(kind: ChannelKind, code: &str, bot: &str, ttl_s: u32) -> String {
    let within = if ttl_s.is_multiple_of(60) { format!("{} minutes", ttl_s / 60) } else { format!("{ttl_s} seconds") };
    let to = match (kind, bot.is_empty()) {
        (ChannelKind::Telegram, false) => format!("the bot @{bot} in Telegram"),
        (ChannelKind::Telegram, true) => "the channel's bot in Telegram".to_owned(),
        _ => "the channel's bot in SeaTalk".to_owned(),
    };
    format!("Send `/pair {code}` to {to} within {within}; the chat that sends it becomes the channel's owner.")
}

/// An adapter state as words after "the channel's adapter …" (`is retrying after a failure`).
fn adapter_phrase(state: &str) -> String {
    match state {
        "backoff" => "is retrying after a failure".to_owned(),
        "failed" => "failed".to_owned(),
        "stopped" => "is stopped".to_owned(),
        other => format!("is {other}"),
    }
}

/// `POST /v1/channels/{name}/pair` with an optional `{ttl_s}` (default 600, 60-3600) →
/// `{channel, code, expires_at, ttl_s, instruction, warning}`: a fresh one-time code (replacing
/// any pending one). The first chat that sends `/pair <code>` to the bot becomes the owner
/// (replacing the previous one); five wrong tries void the code. `warning` says why the code
/// cannot arrive yet (the channel is disabled, its adapter not running), else null.
///
/// Errors: `NOT_FOUND`, `INVALID_ARGUMENT` (`ttl_s`), `UNKNOWN_FIELD`, `BAD_REQUEST`.
async fn pair(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<api::PairingCode>, ApiError> {
    let b: api::PairingRequest = if body.iter().all(u8::is_ascii_whitespace) {
        api::PairingRequest::default()
    } else {
        crate::error::parse_json(&body)?
    };
    let ttl_s = b.ttl_s.unwrap_or(rules::PAIRING_TTL_DEFAULT_S);
    if ttl_s == 0 {
        return Err(ApiError::invalid(format!(
            "ttl_s must be {}-{} seconds, not 0",
            rules::PAIRING_TTL_MIN_S,
            rules::PAIRING_TTL_MAX_S
        ))
        .with_details(json!({"field": "ttl_s"})));
    }
    let req = StartPairingRequest { name: name.clone(), ttl_s, actor: actor(&headers) };
    let r = st.store.channels.clone().start_pairing(req).await.map_err(refused)?.into_inner();
    settle(&st, r.seq).await;
    tracing::info!(channel = %name, ttl_s, "Pairing code issued.");
    let c = fetch(&st, &name).await?;
    let live = adapters(&st).await;
    let adapter = live.as_ref().and_then(|l| l.iter().find(|a| a.channel == name).cloned());
    let bot = adapter.as_ref().map(|a| a.bot_username.clone()).unwrap_or_default();
    let warning = if !c.enabled {
        Some(format!(
            "channel {name:?} is disabled: enable it (coffer channel enable {name}) so its adapter receives the code"
        ))
    } else {
        match adapter.as_ref().map(|a| a.state.as_str()) {
            Some("running") => None,
            Some(state) => Some(format!(
                "the channel's adapter {}{}: the code is kept, but it can only be received once the adapter runs",
                adapter_phrase(state),
                adapter
                    .as_ref()
                    .filter(|a| !a.last_error.is_empty())
                    .map(|a| format!(" ({})", a.last_error))
                    .unwrap_or_default()
            )),
            None => None,
        }
    };
    Ok(Json(api::PairingCode {
        channel: name,
        instruction: instruction(c.kind(), &r.code, &bot, ttl_s),
        code: r.code,
        expires_at: r.expires_at,
        ttl_s,
        warning,
    }))
}

/// `DELETE /v1/channels/{name}/pair` → 204: the owner is forgotten (and any pending code);
/// every chat is refused until the next pairing.
///
/// Errors: `NOT_FOUND`.
async fn unpair(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let req = UnpairRequest { name: name.clone(), actor: actor(&headers) };
    let seq = st.store.channels.clone().unpair(req).await.map_err(refused)?.into_inner().seq;
    settle(&st, seq).await;
    tracing::info!(channel = %name, "Channel unpaired.");
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ChannelRecord {
        ChannelRecord {
            name: "home".into(),
            kind: ChannelKind::Telegram.into(),
            enabled: true,
            bot_token_ref: "channel-home-bot-token".into(),
            version: 3,
            ..Default::default()
        }
    }

    fn patch_body(v: Value) -> Result<api::ChannelPatch, ApiError> {
        crate::error::parse_json(v.to_string().as_bytes())
    }

    #[test]
    fn shape() {
        let have: BTreeSet<String> = ["channel-home-bot-token".to_owned()].into();
        let v = serde_json::to_value(channel(&record(), &have, None)).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "adapter",
                "agent_config",
                "api_base_url",
                "bot_token_ref",
                "created_at",
                "credentials_set",
                "default_agent",
                "enabled",
                "kind",
                "name",
                "owner",
                "paired",
                "pairing",
                "updated_at",
                "version"
            ]
        );
        assert_eq!(v["credentials_set"], json!({"bot_token": true}));
        assert_eq!((&v["adapter"], &v["owner"], &v["paired"]), (&Value::Null, &Value::Null, &json!(false)));
        let s = ChannelRecord {
            kind: ChannelKind::Seatalk.into(),
            bot_token_ref: String::new(),
            app_id_ref: "a".into(),
            owner_id: "E1".into(),
            agent_config_json: r#"{"cwd":"/w"}"#.into(),
            ..record()
        };
        let a = AdapterStatus { channel: "home".into(), state: "running".into(), ..Default::default() };
        let v = serde_json::to_value(channel(&s, &have, Some(&a))).unwrap();
        assert_eq!(v["credentials_set"], json!({"app_id": false, "app_secret": false, "signing_secret": false}));
        assert_eq!((&v["app_secret_ref"], &v["bot_token_ref"]), (&Value::Null, &Value::Null));
        assert_eq!(v["owner"]["id"], "E1");
        assert_eq!(v["agent_config"], json!({"cwd": "/w"}));
        assert_eq!(v["adapter"]["state"], "running");
        assert_eq!(v["adapter"]["started_ms"], Value::Null);
    }

    #[test]
    fn patches() {
        let cur = record();
        let c = apply_patch(&cur, &patch_body(json!({"enabled": false, "api_base_url": "http://x"})).unwrap()).unwrap();
        assert_eq!((c.enabled, c.api_base_url.as_str()), (false, "http://x"));
        let c = apply_patch(&cur, &patch_body(json!({"bot_token_ref": null, "agent_config": {"model": "m"}})).unwrap())
            .unwrap();
        assert_eq!((c.bot_token_ref.as_str(), c.agent_config_json.as_str()), ("", r#"{"model":"m"}"#));
        assert_eq!(apply_patch(&cur, &patch_body(json!({})).unwrap()).unwrap(), cur);
        let e = apply_patch(&cur, &patch_body(json!({"kind": "seatalk"})).unwrap()).unwrap_err();
        assert!(e.message.starts_with("kind cannot change"), "{}", e.message);
        let e = apply_patch(&cur, &patch_body(json!({"kind": "slack"})).unwrap()).unwrap_err();
        assert_eq!(e.details["field"], "kind");
        let e = apply_patch(&cur, &patch_body(json!({"name": "other"})).unwrap()).unwrap_err();
        assert!(e.message.contains("renamed"));
        assert_eq!(patch_body(json!({"bogus": 1})).err().unwrap().code, Code::UnknownField);
    }

    #[test]
    fn secrets_are_placed_checked_and_never_quoted() {
        let mut c = ChannelRecord { bot_token_ref: String::new(), ..record() };
        let placed = place_secrets(&mut c, vec![("bot_token", "123:abc".into())]);
        assert_eq!(c.bot_token_ref, "channel-home-bot-token");
        assert_eq!(placed, [("channel-home-bot-token".to_owned(), "123:abc".to_owned(), true)]);
        let mut c = ChannelRecord { bot_token_ref: "mine".into(), ..record() };
        let placed = place_secrets(&mut c, vec![("bot_token", "x".into())]);
        assert_eq!(placed[0].0, "mine");
        assert!(!placed[0].2);
        let e = check_secrets(ChannelKind::Telegram, &vec![("app_id", "1".into())]).unwrap_err();
        assert_eq!(e.details["field"], "app_id");
        let e = check_secrets(ChannelKind::Telegram, &vec![("bot_token", "sekrit\n".into())]).unwrap_err();
        assert!(e.message.contains("control") && !e.message.contains("sekrit"));
        assert!(check_secrets(ChannelKind::Telegram, &vec![("bot_token", String::new())]).is_err());
    }

    #[test]
    fn store_refusals_name_their_field() {
        let e = refused(tonic::Status::invalid_argument("api_base_url \"x\" is not an absolute URL"));
        assert_eq!(e.details["field"], "api_base_url");
        let e = refused(tonic::Status::invalid_argument("agent_config_json.cwd \"x\" must be an absolute path"));
        assert_eq!(
            (e.details["field"].as_str(), e.message.as_str()),
            (Some("agent_config"), "agent_config.cwd \"x\" must be an absolute path")
        );
        let e = refused(tonic::Status::invalid_argument("bot_token_ref is required for a telegram channel"));
        assert_eq!(e.details["field"], "bot_token_ref");
    }

    #[test]
    fn adapter_states_read_as_words() {
        assert_eq!(adapter_phrase("backoff"), "is retrying after a failure");
        assert_eq!(adapter_phrase("failed"), "failed");
        assert_eq!(adapter_phrase("starting"), "is starting");
    }

    #[test]
    fn instructions() {
        let t = instruction(ChannelKind::Telegram, "7KQ2M9XD", "coffer_bot", 600);
        assert!(t.starts_with("Send `/pair 7KQ2M9XD` to the bot @coffer_bot in Telegram within 10 minutes"), "{t}");
        let s = instruction(ChannelKind::Seatalk, "7KQ2M9XD", "", 90);
        assert!(s.contains("SeaTalk within 90 seconds"), "{s}");
    }
}
