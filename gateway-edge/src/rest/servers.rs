//! `/v1/mcp/servers…`: the MCP server registry (CRUD with versions and `If-Match`) and the
//! per-capability enable/disable preferences, over the store's typed RPCs.
//!
//! Every mutation answers only once the gateway's snapshot holds it (read-your-writes for
//! policy, see [`settle`]). The acting party recorded in the audit log is `api` unless the
//! request says otherwise in `X-Coffer-Actor`.
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use coffer_api::servers::{self as api, McpServerCreate, McpServerPatch};
use coffer_api::{Page, tools};
use coffer_proto::store::{
    CreateServerRequest, DeleteServerRequest, GetServerRequest, ListPreferencesRequest, ListServersRequest, McpServer,
    Preference, SetPreferenceRequest, Transport, UpdateServerRequest,
};
use serde_json::json;

use crate::credentials::{self, WireValue};
use crate::error::{ApiError, Code, JsonBody};
use crate::rest::logs::Params;
use crate::snapshot::Kind;
use crate::state::AppState;

/// How long a mutation waits for the snapshot to reflect it before answering anyway.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest per-call timeout a server may carry (ms): one day.
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;
/// Request header naming the acting party for the audit log.
pub use coffer_types::header::ACTOR as ACTOR_HEADER;
/// Actors a request may claim; `daemon` is reserved for the daemon's own entries.
pub const ACTORS: &[&str] = &["cli", "api", "ui", "mcp", "agent", "channel"];
/// The built-in server whose capabilities (`coffer__*`) are not in the registry.
use coffer_types::BUILTIN_SERVER;
/// Attempts of a `PATCH` without `If-Match` that loses a race with another writer.
const PATCH_ATTEMPTS: usize = 3;

/// Registry and preference routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/mcp/servers", get(list_servers).post(create_server))
        .route("/v1/mcp/servers/{name}", get(get_server).patch(patch_server).delete(delete_server))
        .route("/v1/mcp/servers/{name}/preferences", get(list_preferences))
        .route("/v1/mcp/servers/{name}/capabilities/{kind}", put(put_preference_by_query))
        .route("/v1/mcp/servers/{name}/capabilities/{kind}/{capname}", put(put_preference))
}

// ---------------------------------------------------------------------------------------------
// Shared helpers (also used by the settings routes).

/// The actor for the audit log: `X-Coffer-Actor` when it is one of [`ACTORS`], else `api`.
pub fn actor(headers: &HeaderMap) -> String {
    headers
        .get(ACTOR_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| ACTORS.contains(&v.as_str()))
        .unwrap_or_else(|| "api".to_owned())
}

/// Waits until the gateway's snapshot reflects store change `seq` (at most [`SETTLE_TIMEOUT`]).
/// On timeout it logs a warning and returns: the write is committed, only policy may briefly
/// lag behind it.
pub async fn settle(st: &AppState, seq: u64) {
    if !st.snapshot.wait_for(seq, SETTLE_TIMEOUT).await {
        tracing::warn!(
            seq,
            timeout_ms = SETTLE_TIMEOUT.as_millis() as u64,
            "Snapshot did not reflect a write in time."
        );
    }
}

/// Parses `If-Match`: absent or `*` → `None` (no version check); `"3"` or `3` → `Some(3)`.
///
/// # Errors
/// `INVALID_ARGUMENT` for anything else: weak tags (`W/"3"`, which never match a write
/// precondition), lists, non-numeric or negative versions.
pub fn parse_if_match(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    let mut values = headers.get_all(header::IF_MATCH).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    let bad = || {
        ApiError::invalid("If-Match must be one version tag like \"3\" (the server's ETag) or *")
            .with_details(json!({"header": "If-Match"}))
    };
    if values.next().is_some() {
        return Err(bad());
    }
    let s = v.to_str().map_err(|_| bad())?.trim();
    if s == "*" {
        return Ok(None);
    }
    let inner = s.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(s);
    if inner.is_empty() || !inner.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    inner.parse::<i64>().map(Some).map_err(|_| bad())
}

/// The 409 of a write at a stale `If-Match`: "`<noun>` "`name`" is at version `current`, not
/// `expected`; re-read it and retry", both versions in `details` (`expected_version`,
/// `current_version`).
pub fn version_conflict(noun: &str, name: &str, expected: i64, current: i64) -> ApiError {
    ApiError::new(
        Code::Conflict,
        format!("{noun} {name:?} is at version {current}, not {expected}; re-read it and retry"),
    )
    .with_details(json!({"expected_version": expected, "current_version": current}))
}

/// The `ETag` value for a version: `"<version>"`.
pub fn etag(version: i64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{version}\"")).expect("digits are a valid header value")
}

/// Checks a stdio `command` and returns it as it is stored: as given.
///
/// A bare name (`npx`) must be found with `lookup` (the daemon's `PATH` in production) and is
/// stored bare, so that each machine a synced registry reaches resolves it on its own `PATH`
/// when the server starts; an absolute path must name an existing executable file; a relative
/// path with a `/` (`./server`) is refused because the daemon's working directory means
/// nothing to the user.
///
/// # Errors
/// `INVALID_ARGUMENT` naming the command and what is wrong with it.
pub fn resolve_command(command: &str, lookup: impl Fn(&str) -> Option<PathBuf>) -> Result<String, ApiError> {
    let shown = truncate(command, 200);
    let err = |msg: String| ApiError::invalid(msg).with_details(json!({"field": "command", "command": shown}));
    if command.trim().is_empty() {
        return Err(err("a stdio server needs a command".into()));
    }
    if command.contains('\0') {
        return Err(err("command contains a NUL byte".into()));
    }
    if command.starts_with('/') {
        let p = FsPath::new(command);
        return match std::fs::metadata(p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(err(format!("command {shown} does not exist"))),
            Err(e) => Err(err(format!("command {shown} cannot be inspected: {e}"))),
            Ok(m) if !m.is_file() => Err(err(format!("command {shown} is not a file"))),
            Ok(m) if !is_executable(&m) => Err(err(format!("command {shown} is not executable"))),
            Ok(_) => Ok(command.to_owned()),
        };
    }
    if command.contains('/') {
        return Err(err(format!("command {shown} is a relative path; give an absolute path")));
    }
    match lookup(command) {
        Some(p) if p.is_absolute() => Ok(command.to_owned()),
        Some(p) => Err(err(format!(
            "command {shown} resolves to the relative path {} on the daemon's PATH; give an absolute path",
            p.display()
        ))),
        None => Err(err(format!("command {shown} not found on PATH; give an absolute path"))),
    }
}

fn is_executable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    m.permissions().mode() & 0o111 != 0
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_owned() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

/// Converts a per-call timeout given in seconds or milliseconds to milliseconds.
///
/// # Errors
/// `INVALID_ARGUMENT` when both are given, or the value is not within 1 ms ..= 24 h.
pub fn timeout_ms(timeout_s: Option<f64>, timeout_ms: Option<u64>) -> Result<Option<u64>, ApiError> {
    // The field named is the one that was sent.
    let field = if timeout_s.is_some() { "timeout_s" } else { "timeout_ms" };
    let range = || {
        ApiError::invalid(format!(
            "{field} must be between 1 ms and {} s; omit it for the default",
            MAX_TIMEOUT_MS / 1000
        ))
        .with_details(json!({"field": field}))
    };
    match (timeout_s, timeout_ms) {
        (Some(_), Some(_)) => Err(ApiError::invalid("give timeout_s or timeout_ms, not both")
            .with_details(json!({"field": "timeout_ms", "conflicts_with": "timeout_s"}))),
        (Some(s), None) => {
            if !s.is_finite() || s <= 0.0 {
                return Err(range());
            }
            let ms = (s * 1000.0).round();
            if ms < 1.0 || ms > MAX_TIMEOUT_MS as f64 { Err(range()) } else { Ok(Some(ms as u64)) }
        }
        (None, Some(ms)) if (1..=MAX_TIMEOUT_MS).contains(&ms) => Ok(Some(ms)),
        (None, Some(_)) => Err(range()),
        (None, None) => Ok(None),
    }
}

pub use crate::mcp::transport_view;

/// A server as REST answers it ([`api::McpServer`]). Fields that do not apply or hold the
/// default are `None` (null on the wire): `command` of an http server, `url` of a stdio server,
/// `cwd` and `timeout_ms` when the default, `sandbox` of an http server. `sandbox` is whether a
/// stdio server runs in the vault sandbox; it is `true` unless the registration opted out, even
/// where the kernel has no Landlock (`GET /v1/status` `sandbox` says whether it is enforced).
/// `env`/`headers` values that reference a credential are `{"credential_ref": name}`.
pub fn server_view(s: &McpServer) -> api::McpServer {
    let opt = |v: &str| (!v.is_empty()).then(|| v.to_owned());
    api::McpServer {
        name: s.name.clone(),
        transport: transport_view(s.transport()),
        command: opt(&s.command),
        args: s.args.clone(),
        env: credentials::render(&s.env),
        cwd: opt(&s.cwd),
        url: opt(&s.url),
        headers: credentials::render(&s.headers),
        enabled: s.enabled,
        timeout_ms: (s.timeout_ms != 0).then_some(s.timeout_ms),
        sandbox: (s.transport() == Transport::Stdio).then_some(!s.no_sandbox),
        version: s.version,
        created_at: s.created_at.clone(),
        updated_at: s.updated_at.clone(),
    }
}

/// [`server_view`] with the transport the server speaks as far as the gateway knows: `sse`
/// for an `http` registration found to speak the legacy HTTP+SSE transport
/// ([`crate::mcp::Health::transport`]).
pub fn seen_view(st: &AppState, s: &McpServer) -> api::McpServer {
    api::McpServer { transport: transport_view(st.gateway.shared.health.transport(s)), ..server_view(s) }
}

/// A single-server response with its `ETag`.
fn with_etag(st: &AppState, status: StatusCode, s: &McpServer) -> Response {
    let mut r = (status, Json(seen_view(st, s))).into_response();
    r.headers_mut().insert(header::ETAG, etag(s.version));
    r
}

// ---------------------------------------------------------------------------------------------
// Registry.

/// `GET /v1/mcp/servers` → `{"items":[server…],"next_cursor":null}`, sorted by name.
///
/// Errors: `SERVICE_UNAVAILABLE` while the store restarts.
async fn list_servers(State(st): State<Arc<AppState>>) -> Result<Json<Page<api::McpServer>>, ApiError> {
    let servers = st.store.registry.clone().list_servers(ListServersRequest {}).await?.into_inner().servers;
    Ok(Json(Page::all(servers.iter().map(|s| seen_view(&st, s)).collect())))
}

/// Refuses `args` that look like secrets ([`coffer_types::secrets::secret_args`]) unless
/// `allow`: an argument is stored in the registry in plaintext, synced to other machines, and
/// readable by every local user in `ps` while the upstream runs. The message names the
/// argument by index and option, never its value.
///
/// # Errors
/// `INVALID_ARGUMENT` with details `{field: "args", index, flag, reason: "secret_in_args"}`.
pub fn check_args(args: &[String], allow: bool) -> Result<(), ApiError> {
    if allow {
        return Ok(());
    }
    let Some(found) = coffer_types::secrets::secret_args(args).into_iter().next() else { return Ok(()) };
    let what = match &found.flag {
        Some(flag) => format!("args[{}] (the value of {flag})", found.index),
        None => format!("args[{}]", found.index),
    };
    Err(ApiError::invalid(format!(
        "{what} looks like a secret: arguments are stored in plaintext, synced, and visible to every local user in `ps`; \
         pass it in the environment if the server reads one (env {{\"VAR\": {{\"credential_ref\": \"NAME\"}}}}; CLI: \
         --env-credential VAR=NAME after `coffer credentials set NAME`), or keep it as an argument with \
         allow_secret_args: true (CLI: --allow-secret-args)"
    ))
    .with_details(json!({"field": "args", "index": found.index, "flag": found.flag, "reason": "secret_in_args"})))
}

/// Checks that a body's fields fit its transport; returns the transport.
fn check_transport_fields(b: &McpServerCreate) -> Result<Transport, ApiError> {
    let transport = match (b.transport.as_deref(), &b.command, &b.url) {
        (Some(word), ..) => Transport::parse(word).ok_or_else(|| {
            ApiError::invalid(format!("transport {:?} is not one of stdio, http, sse", truncate(word, 20)))
                .with_details(json!({"field": "transport"}))
        })?,
        (None, Some(_), _) => Transport::Stdio,
        (None, None, Some(_)) => Transport::Http,
        (None, None, None) => {
            return Err(ApiError::invalid("give a command (stdio server) or a url (http server)"));
        }
    };
    let misplaced: Vec<&str> = if transport == Transport::Stdio {
        [("url", b.url.is_some()), ("headers", !b.headers.is_empty())]
            .into_iter()
            .filter(|f| f.1)
            .map(|f| f.0)
            .collect()
    } else {
        [
            ("command", b.command.is_some()),
            ("args", !b.args.is_empty()),
            ("env", !b.env.is_empty()),
            ("cwd", b.cwd.is_some()),
            ("sandbox", b.sandbox.is_some()),
        ]
        .into_iter()
        .filter(|f| f.1)
        .map(|f| f.0)
        .collect()
    };
    if let Some(f) = misplaced.first() {
        return Err(ApiError::invalid(format!("{f} does not apply to a {} server", transport.as_str()))
            .with_details(json!({"field": f})));
    }
    if transport != Transport::Stdio && b.url.is_none() {
        return Err(ApiError::invalid(format!("an {} server needs a url", transport.as_str()))
            .with_details(json!({"field": "url"})));
    }
    Ok(transport)
}

/// `POST /v1/mcp/servers` with `{name, transport?, command?, args?, env?, cwd?, url?,
/// headers?, enabled? (true), timeout_s? | timeout_ms?, allow_secret_args? (false), sandbox?
/// (true)}` → 201 with the server, `ETag` and `Location`. Secret-looking `args` are refused
/// unless `allow_secret_args` ([`check_args`]).
///
/// A stdio `command` that is a bare name is resolved on the daemon's `PATH` (the CLI sends an
/// already absolute path, resolved against the user's shell).
///
/// `env` and `headers` values are strings or `{"credential_ref": name}` (stored as a reference,
/// resolved only when an upstream starts).
///
/// Errors: `INVALID_ARGUMENT` (bad name, transport, command not found or not executable, field
/// that does not fit the transport, timeout out of range, a reference to a credential that does
/// not exist, a secret-looking argument, the store's validation message),
/// `UNKNOWN_FIELD`, `ALREADY_EXISTS` (409) for a duplicate name.
async fn create_server(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<McpServerCreate>,
) -> Result<Response, ApiError> {
    let transport = check_transport_fields(&b)?;
    check_args(&b.args, b.allow_secret_args)?;
    let timeout = timeout_ms(b.timeout_s, b.timeout_ms)?;
    let command = match (transport, &b.command) {
        (Transport::Stdio, Some(c)) => resolve_command(c, coffer_runtime::connect::which_on_path)?,
        (Transport::Stdio, None) => {
            return Err(ApiError::invalid("a stdio server needs a command").with_details(json!({"field": "command"})));
        }
        _ => String::new(),
    };
    let env = credentials::to_stored("env", b.env)?;
    let server_headers = credentials::to_stored("headers", b.headers)?;
    super::credentials::require_credentials(&st, &credentials::referenced([&env, &server_headers])).await?;
    let server = McpServer {
        name: b.name,
        transport: transport.into(),
        command,
        args: b.args,
        env,
        cwd: b.cwd.unwrap_or_default(),
        url: b.url.unwrap_or_default(),
        headers: server_headers,
        enabled: b.enabled.unwrap_or(true),
        timeout_ms: timeout.unwrap_or(0),
        no_sandbox: b.sandbox == Some(false),
        ..Default::default()
    };
    let reply = st
        .store
        .registry
        .clone()
        .create_server(CreateServerRequest { server: Some(server), actor: actor(&headers) })
        .await?
        .into_inner();
    settle(&st, reply.seq).await;
    let s = reply.server.unwrap_or_default();
    tracing::info!(server = %s.name, transport = s.transport().as_str(), "Server registered.");
    let mut r = with_etag(&st, StatusCode::CREATED, &s);
    if let Ok(loc) = HeaderValue::from_str(&format!("/v1/mcp/servers/{}", s.name)) {
        r.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(r)
}

/// `GET /v1/mcp/servers/{name}` → the server, with `ETag: "<version>"`.
///
/// Errors: `NOT_FOUND`.
async fn get_server(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let s = st.store.registry.clone().get_server(GetServerRequest { name }).await?.into_inner();
    Ok(with_etag(&st, StatusCode::OK, &s))
}

/// Applies `p` to `cur`; `command` is the already resolved command when the patch sets one.
fn apply_patch(cur: &McpServer, p: &McpServerPatch, command: Option<&str>) -> Result<McpServer, ApiError> {
    if p.name.as_deref().is_some_and(|n| n != cur.name) {
        return Err(ApiError::invalid("a server cannot be renamed; remove it and add it under the new name")
            .with_details(json!({"field": "name"})));
    }
    if p.transport.as_deref().is_some_and(|t| t != cur.transport().as_str()) {
        return Err(ApiError::invalid("a server's transport cannot be changed; remove it and add it again")
            .with_details(json!({"field": "transport"})));
    }
    let stdio = cur.transport() == Transport::Stdio;
    let misplaced: &[(&str, bool)] = if stdio {
        &[("url", p.url.is_some()), ("headers", p.headers.is_some())]
    } else {
        &[
            ("command", p.command.is_some()),
            ("args", p.args.is_some()),
            ("env", p.env.is_some()),
            ("cwd", p.cwd.as_ref().is_some_and(Option::is_some)),
            ("sandbox", p.sandbox.is_some()),
        ]
    };
    if let Some((f, _)) = misplaced.iter().find(|f| f.1) {
        return Err(ApiError::invalid(format!("{f} does not apply to a {} server", cur.transport().as_str()))
            .with_details(json!({"field": f})));
    }
    let mut s = cur.clone();
    if let Some(e) = p.enabled {
        s.enabled = e;
    }
    if let Some(c) = command {
        s.command = c.to_owned();
    }
    if let Some(a) = &p.args {
        check_args(a, p.allow_secret_args)?;
        s.args = a.clone();
    }
    if let Some(e) = &p.env {
        s.env = credentials::to_stored("env", e.clone())?;
    }
    if let Some(c) = &p.cwd {
        s.cwd = c.clone().unwrap_or_default();
    }
    if let Some(u) = &p.url {
        s.url = u.clone();
    }
    if let Some(b) = p.sandbox {
        s.no_sandbox = !b;
    }
    if let Some(h) = &p.headers {
        s.headers = credentials::to_stored("headers", h.clone())?;
    }
    match (p.timeout_s, p.timeout_ms) {
        (None, None) => {}
        (Some(None), None) | (None, Some(None)) => s.timeout_ms = 0,
        (ts, tm) => s.timeout_ms = timeout_ms(ts.flatten(), tm.flatten())?.unwrap_or(0),
    }
    Ok(s)
}

/// `PATCH /v1/mcp/servers/{name}` with a partial body ([`McpServerPatch`]) → the updated server
/// with its new `ETag`. With `If-Match: "<version>"` the write happens only at that version;
/// without it the patch applies to the current version (retried if another writer wins the
/// race). A patch that changes nothing writes nothing.
///
/// Errors: `NOT_FOUND`, `CONFLICT` (409, stale `If-Match`; details carry both versions),
/// `INVALID_ARGUMENT` (a field that does not fit the transport, a rename, a bad command or
/// timeout, a reference to a credential that does not exist, the store's validation),
/// `UNKNOWN_FIELD`.
async fn patch_server(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    JsonBody(p): JsonBody<McpServerPatch>,
) -> Result<Response, ApiError> {
    let expected = parse_if_match(&headers)?;
    let command = match &p.command {
        Some(c) => Some(resolve_command(c, coffer_runtime::connect::which_on_path)?),
        None => None,
    };
    // Only references this patch sets are checked: an unrelated patch (`enabled`) of a server
    // whose credential was removed since still applies.
    let refs: std::collections::BTreeSet<String> = [&p.env, &p.headers]
        .into_iter()
        .flatten()
        .flat_map(|m| m.values())
        .filter_map(|v| match v {
            WireValue::Ref(r) => Some(r.credential_ref.clone()),
            WireValue::Literal(_) => None,
        })
        .collect();
    super::credentials::require_credentials(&st, &refs).await?;
    let mut store = st.store.registry.clone();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let cur = store.get_server(GetServerRequest { name: name.clone() }).await?.into_inner();
        if let Some(e) = expected
            && e != cur.version
        {
            return Err(version_conflict("server", &name, e, cur.version));
        }
        let next = apply_patch(&cur, &p, command.as_deref())?;
        if next == cur {
            return Ok(with_etag(&st, StatusCode::OK, &cur));
        }
        let req =
            UpdateServerRequest { server: Some(next), expected_version: Some(cur.version), actor: actor(&headers) };
        match store.update_server(req).await {
            Ok(r) => {
                let r = r.into_inner();
                settle(&st, r.seq).await;
                let s = r.server.unwrap_or_default();
                tracing::info!(server = %s.name, version = s.version, "Server updated.");
                return Ok(with_etag(&st, StatusCode::OK, &s));
            }
            // Without If-Match the caller asked for "whatever is current": lost races retry.
            Err(e) if e.code() == tonic::Code::Aborted && expected.is_none() && attempt < PATCH_ATTEMPTS => {
                continue;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// `DELETE /v1/mcp/servers/{name}` → 204. Honours `If-Match`. Removes the server's
/// preferences too.
///
/// Errors: `NOT_FOUND`, `CONFLICT` (stale `If-Match`).
async fn delete_server(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let expected = parse_if_match(&headers)?;
    let mut store = st.store.registry.clone();
    if let Some(e) = expected {
        // Checked here too only for a helpful answer; the store checks again atomically.
        let cur = store.get_server(GetServerRequest { name: name.clone() }).await?.into_inner();
        if cur.version != e {
            return Err(version_conflict("server", &name, e, cur.version));
        }
    }
    let req = DeleteServerRequest { name: name.clone(), expected_version: expected, actor: actor(&headers) };
    let seq = store.delete_server(req).await?.into_inner().seq;
    settle(&st, seq).await;
    // Its OAuth grant goes with it: a server added later under the same name may be another.
    let oauth = &st.gateway.shared.oauth;
    if let Err(e) = oauth.server(&name).sign_out().await {
        tracing::warn!(server = %name, error = %e, "The removed server's OAuth grant could not be deleted.");
    }
    oauth.forget(&name);
    tracing::info!(server = %name, "Server removed.");
    Ok(StatusCode::NO_CONTENT)
}

// ---------------------------------------------------------------------------------------------
// Preferences.

/// Fails with `NOT_FOUND` unless `name` is registered (or the built-in `coffer`).
async fn require_server(st: &AppState, name: &str) -> Result<(), ApiError> {
    if name == BUILTIN_SERVER {
        return Ok(());
    }
    st.store.registry.clone().get_server(GetServerRequest { name: name.to_owned() }).await?;
    Ok(())
}

/// `GET /v1/mcp/servers/{name}/preferences` → `{"items":[{server, kind, name, enabled,
/// updated_at}…],"next_cursor":null}`: the explicit preferences (a capability without one is
/// enabled).
///
/// Errors: `NOT_FOUND` for an unknown server.
async fn list_preferences(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Json<Page<tools::Preference>>, ApiError> {
    require_server(&st, &name).await?;
    let prefs = st
        .store
        .registry
        .clone()
        .list_preferences(ListPreferencesRequest { server: name })
        .await?
        .into_inner()
        .preferences;
    let items = prefs
        .into_iter()
        .map(|p| tools::Preference {
            kind: p.kind().as_str().to_owned(),
            server: p.server,
            name: p.name,
            enabled: p.enabled,
            updated_at: p.updated_at,
        })
        .collect();
    Ok(Json(Page::all(items)))
}

/// `PUT /v1/mcp/servers/{name}/capabilities/{kind}/{capname}` with `{"enabled": bool}` →
/// `{server, kind, name, enabled}`. `kind` is `tool`, `prompt` or `resource` (plurals
/// accepted); `capname` is the original (unprefixed) name, percent-decoded.
///
/// Errors: `NOT_FOUND` (unknown server), `INVALID_ARGUMENT` (kind, name length),
/// `UNKNOWN_FIELD`.
async fn put_preference(
    State(st): State<Arc<AppState>>,
    Path((server, kind, capname)): Path<(String, String, String)>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<tools::EnabledFlag>,
) -> Result<Json<tools::PreferenceSet>, ApiError> {
    set_preference(&st, server, &kind, capname, b.enabled, &headers).await
}

/// `PUT /v1/mcp/servers/{name}/capabilities/{kind}?name=<original>` — the same as
/// [`put_preference`] for names that a path segment carries badly (resource URIs with `/`).
///
/// Errors: as [`put_preference`]; `INVALID_ARGUMENT` when `name` is missing.
async fn put_preference_by_query(
    State(st): State<Arc<AppState>>,
    Path((server, kind)): Path<(String, String)>,
    query: Result<Query<Vec<(String, String)>>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<tools::EnabledFlag>,
) -> Result<Json<tools::PreferenceSet>, ApiError> {
    let q = Params::from_query(query, &["name"])?;
    let capname = q.get("name").map(str::to_owned).ok_or_else(|| {
        ApiError::invalid("give the capability's original name as ?name=… or as the last path segment")
            .with_details(json!({"parameter": "name"}))
    })?;
    set_preference(&st, server, &kind, capname, b.enabled, &headers).await
}

async fn set_preference(
    st: &AppState,
    server: String,
    kind: &str,
    name: String,
    enabled: bool,
    headers: &HeaderMap,
) -> Result<Json<tools::PreferenceSet>, ApiError> {
    let kind = Kind::parse(kind).ok_or_else(|| {
        ApiError::invalid(format!("kind {:?} is not one of tool, prompt, resource", truncate(kind, 20)))
            .with_details(json!({"parameter": "kind"}))
    })?;
    require_server(st, &server).await?;
    let preference = Preference {
        server: server.clone(),
        kind: kind.to_proto().into(),
        name: name.clone(),
        enabled,
        updated_at: String::new(),
    };
    let seq = st
        .store
        .registry
        .clone()
        .set_preference(SetPreferenceRequest { preference: Some(preference), actor: actor(headers) })
        .await?
        .into_inner()
        .seq;
    settle(st, seq).await;
    tracing::info!(server = %server, kind = kind.as_str(), enabled, "Capability preference set.");
    Ok(Json(tools::PreferenceSet { server, kind: kind.as_str().to_owned(), name, enabled }))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn hm(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn if_match() {
        assert_eq!(parse_if_match(&hm(&[])).unwrap(), None);
        assert_eq!(parse_if_match(&hm(&[("if-match", "*")])).unwrap(), None);
        assert_eq!(parse_if_match(&hm(&[("if-match", "\"3\"")])).unwrap(), Some(3));
        assert_eq!(parse_if_match(&hm(&[("if-match", " 12 ")])).unwrap(), Some(12));
        for bad in ["W/\"3\"", "\"3\", \"4\"", "abc", "\"\"", "-1", "\"3", "99999999999999999999"] {
            let e = parse_if_match(&hm(&[("if-match", bad)])).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{bad}");
        }
        assert!(parse_if_match(&hm(&[("if-match", "\"1\""), ("if-match", "\"2\"")])).is_err());
        assert_eq!(etag(7), HeaderValue::from_static("\"7\""));
    }

    #[test]
    fn actors() {
        assert_eq!(actor(&hm(&[])), "api");
        assert_eq!(actor(&hm(&[("x-coffer-actor", "cli")])), "cli");
        assert_eq!(actor(&hm(&[("x-coffer-actor", "UI")])), "ui");
        assert_eq!(actor(&hm(&[("x-coffer-actor", "daemon")])), "api");
        assert_eq!(actor(&hm(&[("x-coffer-actor", "root")])), "api");
    }

    /// A temporary directory holding an executable, a non-executable file and a folder.
    struct Fixture(PathBuf);
    impl Fixture {
        fn new() -> Self {
            use std::os::unix::fs::PermissionsExt;
            let d = std::env::temp_dir().join(format!("coffer-servers-test-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(d.join("dir")).unwrap();
            std::fs::write(d.join("tool"), "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(d.join("tool"), std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::write(d.join("plain"), "x").unwrap();
            std::fs::set_permissions(d.join("plain"), std::fs::Permissions::from_mode(0o644)).unwrap();
            Fixture(d)
        }
        fn p(&self, name: &str) -> String {
            self.0.join(name).to_string_lossy().into_owned()
        }
    }
    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn command_resolution() {
        let f = Fixture::new();
        let tool = f.p("tool");
        let lookup = |n: &str| (n == "tool").then(|| PathBuf::from(&tool));
        assert_eq!(resolve_command(&tool, lookup).unwrap(), tool);
        assert_eq!(resolve_command("tool", lookup).unwrap(), "tool", "a bare name is stored as given");
        let msg = |c: &str| resolve_command(c, lookup).unwrap_err().message;
        assert_eq!(msg("nope"), "command nope not found on PATH; give an absolute path");
        assert!(msg(&f.p("missing")).ends_with("does not exist"));
        assert!(msg(&f.p("plain")).ends_with("is not executable"));
        assert!(msg(&f.p("dir")).ends_with("is not a file"));
        assert!(msg("./tool").contains("relative path"));
        assert!(msg("bin/tool").contains("relative path"));
        assert!(msg("").contains("needs a command"));
        assert!(resolve_command("x", |_| Some(PathBuf::from("rel/x"))).is_err());
    }

    #[test]
    fn timeouts() {
        assert_eq!(timeout_ms(None, None).unwrap(), None);
        assert_eq!(timeout_ms(Some(1.5), None).unwrap(), Some(1500));
        assert_eq!(timeout_ms(None, Some(250)).unwrap(), Some(250));
        assert!(timeout_ms(Some(1.0), Some(1000)).is_err());
        for s in [0.0, -1.0, f64::NAN, f64::INFINITY, 86_401.0, 0.0001] {
            assert!(timeout_ms(Some(s), None).is_err(), "{s}");
        }
        assert!(timeout_ms(None, Some(0)).is_err());
        assert!(timeout_ms(None, Some(MAX_TIMEOUT_MS + 1)).is_err());
    }

    fn stdio() -> McpServer {
        McpServer {
            name: "fs".into(),
            transport: Transport::Stdio.into(),
            command: "/bin/true".into(),
            args: vec!["a".into()],
            enabled: true,
            timeout_ms: 5000,
            cwd: "/tmp".into(),
            version: 3,
            ..Default::default()
        }
    }

    fn patch(v: Value) -> Result<McpServerPatch, ApiError> {
        crate::error::parse_json(v.to_string().as_bytes())
    }

    #[test]
    fn patches() {
        let cur = stdio();
        let p = patch(json!({"enabled": false, "args": ["b"], "cwd": null, "timeout_ms": null})).unwrap();
        let s = apply_patch(&cur, &p, None).unwrap();
        assert!(!s.enabled);
        assert_eq!(s.args, vec!["b".to_owned()]);
        assert_eq!(s.cwd, "");
        assert_eq!(s.timeout_ms, 0);
        assert_eq!(s.command, "/bin/true");

        let p = patch(json!({"timeout_s": 2})).unwrap();
        assert_eq!(apply_patch(&cur, &p, None).unwrap().timeout_ms, 2000);
        let p = patch(json!({})).unwrap();
        assert_eq!(apply_patch(&cur, &p, None).unwrap(), cur);
        let p = patch(json!({"name": "fs", "transport": "stdio"})).unwrap();
        assert_eq!(apply_patch(&cur, &p, Some("/bin/false")).unwrap().command, "/bin/false");

        for bad in
            [json!({"name": "other"}), json!({"transport": "http"}), json!({"url": "http://x"}), json!({"headers": {}})]
        {
            assert!(apply_patch(&cur, &patch(bad.clone()).unwrap(), None).is_err(), "{bad}");
        }
        let e = patch(json!({"bogus": 1})).unwrap_err();
        assert_eq!(e.code, Code::UnknownField);
        assert_eq!(e.details["field"], "bogus");
        assert_eq!(patch(json!({"enabled": "yes"})).unwrap_err().code, Code::InvalidArgument);

        let http =
            McpServer { transport: Transport::Http.into(), command: String::new(), url: "http://a".into(), ..stdio() };
        assert!(apply_patch(&http, &patch(json!({"args": ["x"]})).unwrap(), None).is_err());
        assert!(apply_patch(&http, &patch(json!({"cwd": "/x"})).unwrap(), None).is_err());
        assert!(apply_patch(&http, &patch(json!({"cwd": null})).unwrap(), None).is_ok());
        assert_eq!(apply_patch(&http, &patch(json!({"url": "https://b"})).unwrap(), None).unwrap().url, "https://b");
    }

    fn create(v: Value) -> McpServerCreate {
        crate::error::parse_json(v.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn transports() {
        assert_eq!(check_transport_fields(&create(json!({"name": "a", "command": "x"}))).unwrap().as_str(), "stdio");
        assert_eq!(check_transport_fields(&create(json!({"name": "a", "url": "http://x"}))).unwrap().as_str(), "http");
        assert_eq!(
            check_transport_fields(&create(json!({"name": "a", "transport": "http", "url": "http://x"})))
                .unwrap()
                .as_str(),
            "http"
        );
        // The legacy HTTP+SSE transport (MCP 2024-11-05) is chosen by name.
        assert_eq!(
            check_transport_fields(&create(json!({"name": "a", "transport": "sse", "url": "http://x"})))
                .unwrap()
                .as_str(),
            "sse"
        );
        for bad in [
            json!({"name": "a"}),
            json!({"name": "a", "transport": "sse"}),
            json!({"name": "a", "command": "x", "url": "http://x"}),
            json!({"name": "a", "command": "x", "headers": {"a": "b"}}),
            json!({"name": "a", "url": "http://x", "args": ["y"]}),
            json!({"name": "a", "transport": "http"}),
        ] {
            assert!(check_transport_fields(&create(bad.clone())).is_err(), "{bad}");
        }
    }

    #[test]
    fn server_shape() {
        let v = serde_json::to_value(server_view(&McpServer { timeout_ms: 0, cwd: String::new(), ..stdio() })).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut want = [
            "name",
            "transport",
            "command",
            "args",
            "env",
            "cwd",
            "url",
            "headers",
            "enabled",
            "timeout_ms",
            "sandbox",
            "version",
            "created_at",
            "updated_at",
        ];
        want.sort_unstable();
        assert_eq!(keys, want);
        assert_eq!(v["url"], Value::Null);
        assert_eq!(v["cwd"], Value::Null);
        assert_eq!(v["timeout_ms"], Value::Null);
        assert_eq!(v["sandbox"], true);
        assert_eq!(v["version"], 3);
    }
}
