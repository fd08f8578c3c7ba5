//! `/v1/invocations`, `/v1/audit` (filtered, paginated store logs), `/v1/invocations/events`
//! (the invocation log live, over SSE), `/v1/logs/{service}` (tail, optionally followed over
//! SSE, of a process's rotated log file) and `/v1/mcp/servers/{name}/log` (the same for an
//! upstream's stderr log), plus the strict query-string parsing they share.
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use coffer_api::Page;
use coffer_api::logs as api;
use coffer_proto::store::{GetServerRequest, Invocation, InvocationOutcome, ListAuditRequest, ListInvocationsRequest};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::state::AppState;

/// Default page size of the list routes.
pub const DEFAULT_LIMIT: u32 = 50;
/// Largest page size of the list routes (the store's own maximum).
pub const MAX_LIMIT: u32 = 500;
/// Services whose logs `/v1/logs/{service}` serves.
pub const SERVICES: &[&str] = &["daemon", "gateway", "store", "chat", "retrieval", "callback"];
/// Default and largest line counts of a log tail.
pub const DEFAULT_TAIL: usize = 200;
pub const MAX_TAIL: usize = 10_000;
/// Most bytes a tail reads from the end of a file (guards against pathological line lengths).
const TAIL_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// How often a followed log is polled for growth and rotation.
const FOLLOW_POLL: Duration = Duration::from_millis(250);
/// Invocation outcomes the store records.
pub const OUTCOMES: &[&str] = coffer_types::Outcome::NAMES;
/// Actors the audit log records.
pub const AUDIT_ACTORS: &[&str] = &["cli", "api", "ui", "mcp", "agent", "channel", "daemon"];

/// Log routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/invocations", get(list_invocations))
        .route("/v1/audit", get(list_audit))
        .route("/v1/invocations/events", get(invocation_events))
        .route("/v1/logs/{service}", get(log_tail))
        .route("/v1/mcp/servers/{name}/log", get(server_log_tail))
}

// ---------------------------------------------------------------------------------------------
// Query parameters.

/// A query string with every name known and given at most once. Empty values count as absent.
#[derive(Debug, Default)]
pub struct Params(HashMap<String, String>);

/// Whether `id` is a conversation (or message) id: a ULID in its canonical form.
pub fn is_conversation_id(id: &str) -> bool {
    ulid::Ulid::from_string(id).is_ok_and(|u| u.to_string() == id)
}

fn bad_param(name: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(msg).with_details(json!({"parameter": name}))
}

impl Params {
    /// Builds from an axum `Query` extraction.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming an unknown or repeated parameter, or an undecodable query.
    pub fn from_query(
        q: Result<Query<Vec<(String, String)>>, QueryRejection>,
        allowed: &[&str],
    ) -> Result<Self, ApiError> {
        let Query(pairs) = q.map_err(|e| ApiError::invalid(format!("malformed query string: {}", e.body_text())))?;
        Self::parse(pairs, allowed)
    }

    /// Builds from decoded `(name, value)` pairs.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming an unknown or repeated parameter.
    pub fn parse(pairs: Vec<(String, String)>, allowed: &[&str]) -> Result<Self, ApiError> {
        let mut map = HashMap::new();
        for (k, v) in pairs {
            if !allowed.contains(&k.as_str()) {
                let shown: String = k.chars().take(40).collect();
                return Err(bad_param(
                    &shown,
                    format!("unknown parameter {shown:?}; expected one of {}", allowed.join(", ")),
                ));
            }
            if map.insert(k.clone(), v).is_some() {
                return Err(bad_param(&k, format!("parameter {k:?} is given more than once")));
            }
        }
        Ok(Self(map))
    }

    /// The value of `name`, `None` when absent or empty.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// The value as a string for a store filter (empty = no filter).
    pub fn filter(&self, name: &str) -> String {
        self.get(name).unwrap_or_default().to_owned()
    }

    /// A conversation id filter (empty = no filter): a conversation id is a ULID in its
    /// canonical form (26 uppercase Crockford base-32 characters), so anything else matches no
    /// conversation and is refused rather than answered with an empty page.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the parameter and quoting the value.
    pub fn conversation(&self, name: &str) -> Result<String, ApiError> {
        match self.get(name) {
            None => Ok(String::new()),
            Some(v) if is_conversation_id(v) => Ok(v.to_owned()),
            Some(v) => Err(bad_param(
                name,
                format!("{name} {:?} is not a conversation id (a 26-character ULID)", truncate(v, 40)),
            )),
        }
    }

    /// A filter restricted to `allowed` values.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the parameter and listing the allowed values.
    pub fn one_of(&self, name: &str, allowed: &[&str]) -> Result<String, ApiError> {
        match self.get(name) {
            None => Ok(String::new()),
            Some(v) if allowed.contains(&v) => Ok(v.to_owned()),
            Some(v) => {
                Err(bad_param(name, format!("{name} {:?} is not one of {}", truncate(v, 40), allowed.join(", "))))
            }
        }
    }

    /// A positive integer within `1..=max` (`u64::MAX`: any), `default` when absent.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the parameter.
    pub fn int_in(&self, name: &str, default: u64, max: u64) -> Result<u64, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(default);
        };
        match v.parse::<u64>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ if max == u64::MAX => {
                Err(bad_param(name, format!("{name} must be a positive integer, not {:?}", truncate(v, 40))))
            }
            _ => Err(bad_param(name, format!("{name} must be an integer from 1 to {max}, not {:?}", truncate(v, 40)))),
        }
    }

    /// `limit`: 1 ..= [`MAX_LIMIT`], default [`DEFAULT_LIMIT`].
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming `limit`.
    pub fn limit(&self) -> Result<u32, ApiError> {
        self.int_in("limit", u64::from(DEFAULT_LIMIT), u64::from(MAX_LIMIT)).map(|n| n as u32)
    }

    /// `cursor`: the opaque `next_cursor` of the previous page (0 = from the newest).
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming `cursor`.
    pub fn cursor(&self) -> Result<i64, ApiError> {
        let Some(v) = self.get("cursor") else {
            return Ok(0);
        };
        match v.parse::<i64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(bad_param("cursor", "cursor is not one this server returned; pass next_cursor back unchanged")),
        }
    }

    /// A point in time (see [`parse_time`]) normalised to the store's RFC 3339 UTC form.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the parameter.
    pub fn time(&self, name: &str, now_ms: i64) -> Result<String, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(String::new());
        };
        parse_time(v, now_ms).map_err(|why| bad_param(name, format!("{name} {:?}: {why}", truncate(v, 40))))
    }

    /// A boolean: `true`/`false`/`1`/`0`, `false` when absent.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the parameter.
    pub fn flag(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None | Some("false" | "0") => Ok(false),
            Some("true" | "1") => Ok(true),
            Some(v) => Err(bad_param(name, format!("{name} must be true or false, not {:?}", truncate(v, 40)))),
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_owned() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

/// The opaque `next_cursor` for a store's `next_before_id` (0 = no further page).
pub fn next_cursor(next_before_id: i64) -> Option<String> {
    (next_before_id > 0).then(|| next_before_id.to_string())
}

/// Parses a point in time to RFC 3339 UTC with milliseconds (`2026-11-30T09:31:36.123Z`), the
/// form the store keeps, so that its string comparisons are time comparisons. Accepts:
/// - a duration ago: `90s`, `15m`, `2h`, `7d`;
/// - a date `2026-11-30` (its midnight UTC);
/// - RFC 3339 `2026-11-30T09:31[:36[.123]]` with `Z` or `±hh:mm` (`T` may be a space).
///
/// # Errors
/// A short reason.
pub fn parse_time(s: &str, now_ms: i64) -> Result<String, String> {
    let s = s.trim();
    if let Some(unit) = s.chars().last().filter(|c| c.is_ascii_alphabetic())
        && s.len() > 1
        && s[..s.len() - 1].bytes().all(|b| b.is_ascii_digit())
    {
        let n: i64 = s[..s.len() - 1].parse().map_err(|_| "duration too large")?;
        let unit_ms = match unit {
            's' => 1_000,
            'm' => 60_000,
            'h' => 3_600_000,
            'd' => 86_400_000,
            _ => return Err("a duration ends in s, m, h or d".into()),
        };
        let ms = n.checked_mul(unit_ms).and_then(|d| now_ms.checked_sub(d)).ok_or("duration too large")?;
        return Ok(coffer_runtime::rfc3339_from_unix_ms(ms.max(0)));
    }
    let expected = "expected RFC 3339 (2026-11-30T09:31:36Z), a date (2026-11-30) or a duration ago (15m, 2h, 7d)";
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let part = b.get(r).ok_or(expected)?;
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return Err(expected.into());
        }
        Ok(std::str::from_utf8(part).expect("digits").parse().expect("digits"))
    };
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return Err(expected.into());
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) {
        return Err("no such date".into());
    }
    let day_ms = coffer_runtime::days_from_civil(y, mo, d) * 86_400_000;
    if b.len() == 10 {
        return Ok(coffer_runtime::rfc3339_from_unix_ms(day_ms));
    }
    if !matches!(b[10], b'T' | b't' | b' ') || b.len() < 16 || b[13] != b':' {
        return Err(expected.into());
    }
    let (h, mi) = (num(11..13)?, num(14..16)?);
    let mut i = 16;
    let mut sec = 0;
    let mut frac_ms = 0;
    if b.get(i) == Some(&b':') {
        sec = num(i + 1..i + 3)?;
        i += 3;
        if b.get(i) == Some(&b'.') {
            let start = i + 1;
            i = start;
            while b.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == start {
                return Err(expected.into());
            }
            // Milliseconds: the first three digits, right-padded.
            let digits = &s[start..i.min(start + 3)];
            frac_ms = format!("{digits:0<3}").parse::<i64>().expect("digits");
        }
    }
    if h > 23 || mi > 59 || sec > 60 {
        return Err("no such time of day".into());
    }
    let offset_ms = match &b[i..] {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if oh > 23 || om > 59 {
                return Err("no such UTC offset".into());
            }
            let o = (oh * 60 + om) * 60_000;
            if *sign == b'+' { o } else { -o }
        }
        [] => return Err("give a UTC offset: Z or ±hh:mm".into()),
        _ => return Err(expected.into()),
    };
    let ms = day_ms + ((h * 60 + mi) * 60 + sec.min(59)) * 1000 + frac_ms - offset_ms;
    Ok(coffer_runtime::rfc3339_from_unix_ms(ms))
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Invocations and audit.

/// `GET /v1/invocations?server=&target=&outcome=&actor=&client=&conversation=&since=&until=&limit=&cursor=` →
/// `{"items":[{id, at, target, method, server, session_id, duration_ms, outcome, trace_id,
/// actor, client, conversation, usage}…], "next_cursor": "<opaque>"|null}`, newest first. `actor` is who called (`mcp` for
/// an MCP client session); `client` is that MCP client's `{name, version}` as its `clientInfo`
/// gave them (`null` when it gave neither, and for broker sessions); `client=` keeps only the
/// calls of one client name (exact); `conversation` is `{id, title}` of the conversation whose
/// agent turn made the call (`null` otherwise), `conversation=` keeps only that conversation's; `usage` is what an internal-agent run used (`coffer__ask`:
/// `{connection, model, input_tokens, output_tokens, iterations}`), `null` for other calls. `since` is inclusive, `until` exclusive
/// (see [`parse_time`] for the forms); `limit` 1-500, default 50. Every call answered before
/// the request arrived is in it: the invocation writer is asked to write what it has queued
/// first (bounded by [`crate::mcp::invocations::FLUSH_WAIT`]).
///
/// Errors: `INVALID_ARGUMENT` naming a bad or unknown parameter.
async fn list_invocations(
    State(st): State<Arc<AppState>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<Page<api::Invocation>>, ApiError> {
    let p = Params::from_query(
        query,
        &[
            "server",
            "target",
            "outcome",
            "actor",
            "client",
            "conversation",
            "profile",
            "since",
            "until",
            "limit",
            "cursor",
        ],
    )?;
    let now = now_ms();
    // `one_of` admits only the words of `OUTCOMES`; absent is Unspecified ("any").
    let outcome = InvocationOutcome::parse(&p.one_of("outcome", OUTCOMES)?).unwrap_or_default();
    let req = ListInvocationsRequest {
        server: p.filter("server"),
        target: p.filter("target"),
        outcome: outcome.into(),
        actor: p.filter("actor"),
        client_name: p.filter("client"),
        conversation_id: p.conversation("conversation")?,
        profile: p.filter("profile"),
        since: p.time("since", now)?,
        until: p.time("until", now)?,
        before_id: p.cursor()?,
        limit: p.limit()?,
    };
    st.gateway.shared.flush_invocations().await;
    let r = st.store.invocations.clone().list_invocations(req).await?.into_inner();
    let items = r.items.iter().map(invocation).collect();
    Ok(Json(Page { items, next_cursor: next_cursor(r.next_before_id) }))
}

/// One invocation as the REST API shows it (an item of `GET /v1/invocations`, the data of an
/// `invocation` event).
pub fn invocation(i: &Invocation) -> api::Invocation {
    api::Invocation {
        id: i.id,
        at: i.at.clone(),
        target: i.target.clone(),
        method: i.method().as_str().to_owned(),
        server: i.server.clone(),
        session_id: i.session_id.clone(),
        duration_ms: i.duration_ms,
        outcome: i.outcome().as_str().to_owned(),
        trace_id: i.trace_id.clone(),
        actor: i.actor.clone(),
        client: (!i.client_name.is_empty() || !i.client_version.is_empty())
            .then(|| api::InvocationClient { name: i.client_name.clone(), version: i.client_version.clone() }),
        conversation: (!i.conversation_id.is_empty()).then(|| api::InvocationConversation {
            id: i.conversation_id.clone(),
            title: i.conversation_title.clone(),
        }),
        profile: (!i.profile.is_empty()).then(|| i.profile.clone()),
        usage: i.usage.as_ref().map(|u| api::InvocationUsage {
            connection: u.connection.clone(),
            model: u.model.clone(),
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            iterations: u.iterations,
        }),
    }
}

/// An SSE event whose data is `v` as one line of JSON.
fn json_event(name: &'static str, v: &impl serde::Serialize) -> Event {
    Event::default().event(name).data(serde_json::to_string(v).unwrap_or_default())
}

/// `GET /v1/invocations/events?server=&outcome=` → SSE: `event: invocation` per invocation as
/// the gateway's writer records it (data: [`invocation`], the list's item, `id` included),
/// optionally only those of one server or outcome; `event: lagged` (data `{"missed": n}`) when
/// this client fell [`crate::mcp::invocations::LIVE_BUFFER`] rows behind (the stream goes on);
/// keep-alive comments; ends at shutdown or when the client goes away. Subscribing costs the
/// request path nothing (see [`crate::mcp::invocations`]).
///
/// Errors: `INVALID_ARGUMENT` naming a bad or unknown parameter.
async fn invocation_events(
    State(st): State<Arc<AppState>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let p = Params::from_query(query, &["server", "outcome"])?;
    let server = p.get("server").map(str::to_owned);
    let outcome = InvocationOutcome::parse(&p.one_of("outcome", OUTCOMES)?);
    let rx = st.gateway.shared.watch_invocations();
    let shutdown = st.shutdown.clone();
    let wanted = move |i: &Invocation| {
        server.as_deref().is_none_or(|s| i.server == s) && outcome.is_none_or(|o| i.outcome() == o)
    };
    let stream = futures_util::stream::unfold((rx, shutdown), move |(mut rx, shutdown)| {
        let wanted = wanted.clone();
        async move {
            loop {
                let got = tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    got = rx.recv() => got,
                };
                let event = match got {
                    Ok(i) if wanted(&i) => json_event("invocation", &invocation(&i)),
                    Ok(_) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        json_event("lagged", &api::Lagged { missed: n })
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                };
                return Some((Ok::<_, Infallible>(event), (rx, shutdown)));
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

/// `GET /v1/audit?actor=&action=&limit=&cursor=` → `{"items":[{id, at, actor, auth, action,
/// target, outcome, trace_id, detail}…],"next_cursor": "<opaque>"|null}`, newest first;
/// `detail` is a JSON object; `auth` how the request was authenticated (`token`,
/// `session:<hash>`, `internal:<service>`; empty for old rows), `actor` the label it gave.
///
/// Errors: `INVALID_ARGUMENT` naming a bad or unknown parameter.
async fn list_audit(
    State(st): State<Arc<AppState>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<Page<api::AuditEntry>>, ApiError> {
    let p = Params::from_query(query, &["actor", "action", "limit", "cursor"])?;
    let req = ListAuditRequest {
        actor: p.one_of("actor", AUDIT_ACTORS)?,
        action: p.filter("action"),
        before_id: p.cursor()?,
        limit: p.limit()?,
    };
    let r = st.store.audit.clone().list_audit(req).await?.into_inner();
    let items = r
        .items
        .into_iter()
        .map(|e| {
            let outcome = e.outcome().as_str().to_owned();
            let detail = serde_json::from_str::<Value>(&e.detail).unwrap_or(Value::String(e.detail));
            api::AuditEntry {
                id: e.id,
                at: e.at,
                actor: e.actor,
                auth: e.auth,
                action: e.action,
                target: e.target,
                outcome,
                trace_id: e.trace_id,
                detail,
            }
        })
        .collect();
    Ok(Json(Page { items, next_cursor: next_cursor(r.next_before_id) }))
}

// ---------------------------------------------------------------------------------------------
// Log files.

/// True when `file_name` is one of `service`'s log files: `<service>.log` or the daily
/// `<service>.<date>.log` that `tracing-appender` writes.
pub fn is_log_of(file_name: &str, service: &str) -> bool {
    let Some(rest) = file_name.strip_prefix(service).and_then(|r| r.strip_prefix('.')) else {
        return false;
    };
    let Some(mid) = rest.strip_suffix("log") else {
        return false;
    };
    mid.is_empty() || (mid.ends_with('.') && mid.len() > 1 && !mid[..mid.len() - 1].contains('.'))
}

/// The newest log file of `service` in `dir` (by modification time, then name), if any.
///
/// # Errors
/// When `dir` exists but cannot be read.
pub fn newest_log(dir: &FsPath, service: &str) -> std::io::Result<Option<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut best: Option<(std::time::SystemTime, String, PathBuf)> = None;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_log_of(&name, service) {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let key = (meta.modified().unwrap_or(std::time::UNIX_EPOCH), name);
        if best.as_ref().is_none_or(|b| (&key.0, &key.1) > (&b.0, &b.1)) {
            best = Some((key.0, key.1, entry.path()));
        }
    }
    Ok(best.map(|b| b.2))
}

/// The last `n` lines of `r` (read backwards in chunks, at most `max_bytes`), and the offset
/// up to which they were read. With `include_partial` an unterminated last line is included;
/// without it, it is left for a follower to read once complete (the offset stops before it).
///
/// # Errors
/// I/O errors of `r`.
pub fn tail_lines<R: Read + Seek>(
    r: &mut R,
    n: usize,
    max_bytes: u64,
    include_partial: bool,
) -> std::io::Result<(Vec<String>, u64)> {
    const CHUNK: u64 = 64 * 1024;
    let len = r.seek(SeekFrom::End(0))?;
    let mut start = len;
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut newlines = 0;
    // n lines need n + 1 newlines: the one ending the line before them marks their start.
    while start > 0 && len - start < max_bytes && newlines <= n {
        let step = CHUNK.min(start).min(max_bytes - (len - start));
        start -= step;
        r.seek(SeekFrom::Start(start))?;
        let mut chunk = vec![0; step as usize];
        r.read_exact(&mut chunk)?;
        newlines += chunk.iter().filter(|&&b| b == b'\n').count();
        chunks.push(chunk);
    }
    let mut buf: Vec<u8> = chunks.into_iter().rev().flatten().collect();
    let mut end = len;
    if !include_partial && !buf.ends_with(b"\n") {
        let keep = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        end = start + keep as u64;
        buf.truncate(keep);
    }
    let text = buf.strip_suffix(b"\n").unwrap_or(&buf);
    let mut pieces: Vec<&[u8]> =
        if text.is_empty() && start == 0 { Vec::new() } else { text.split(|&b| b == b'\n').collect() };
    // Reading began mid-file: the first piece is the tail of a longer line.
    if start > 0 && !pieces.is_empty() {
        pieces.remove(0);
    }
    let skip = pieces.len().saturating_sub(n);
    let lines = pieces[skip..]
        .iter()
        .map(|l| String::from_utf8_lossy(l.strip_suffix(b"\r").unwrap_or(l)).into_owned())
        .collect();
    Ok((lines, end))
}

/// `GET /v1/logs/{service}?n=200&follow=false` → `{"service", "file": <path>|null, "lines":
/// […]}`: the last `n` (1-10000) lines of the service's newest log file (`file` is null and
/// `lines` empty when it has written none yet). With `follow=true` the answer is an SSE
/// stream instead: `event: file` (data: the path) whenever the file is (re)opened, then
/// `event: line` per line — the tail first, then new lines as they are written; rotation is
/// followed. The stream ends at shutdown or when the client goes away.
///
/// Errors: `NOT_FOUND` for an unknown service (the message lists the valid ones),
/// `INVALID_ARGUMENT` naming a bad parameter.
async fn log_tail(
    State(st): State<Arc<AppState>>,
    Path(service): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    if !SERVICES.contains(&service.as_str()) {
        return Err(ApiError::not_found(format!(
            "no service {:?}; valid services: {}",
            truncate(&service, 40),
            SERVICES.join(", ")
        ))
        .with_details(json!({"valid": SERVICES})));
    }
    let source = Source::Newest { dir: st.home.logs(), service: service.clone() };
    tail_response(&st, source, query, |file, lines| Json(api::LogTail { service, file, lines }).into_response()).await
}

/// `GET /v1/mcp/servers/{name}/log?n=200&follow=false` → `{"server", "file": <path>|null,
/// "lines": […]}`: the last `n` (1-10000) lines of what the server's stdio process wrote on
/// stderr (`COFFER_HOME/logs/upstreams/NAME.log`, written and redacted by the upstream's
/// stderr drain; `file` null and `lines` empty while there is none: an HTTP server, the
/// built-in `coffer`, a server never started). `follow=true` streams like `/v1/logs/{service}`
/// (`file`, then `line` events); the file being replaced when the server restarts (rotation to
/// `NAME.log.1`) is followed.
///
/// Errors: `NOT_FOUND` for a server that is not registered, `INVALID_ARGUMENT` naming a bad
/// parameter.
async fn server_log_tail(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    // The registry names the file: a name it does not hold never becomes a path.
    let file = if name == coffer_types::BUILTIN_SERVER {
        None
    } else {
        let server = st.store.registry.clone().get_server(GetServerRequest { name: name.clone() }).await?;
        let server = server.into_inner();
        Some(st.home.upstream_logs().join(format!("{}.log", server.name)))
    };
    let source = file.map_or(Source::Nothing, Source::Fixed);
    tail_response(&st, source, query, |file, lines| {
        Json(api::ServerLogTail { server: name, file, lines }).into_response()
    })
    .await
}

/// The answer of a log tail route: `tail(file, lines)` (the route's body: the file read, null
/// when there is none, and its last lines) or, with `follow=true`, the SSE stream. Parameters
/// `n` (1-…, at most [`MAX_TAIL`] served) and `follow`.
async fn tail_response(
    st: &AppState,
    source: Source,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    tail: impl FnOnce(Option<String>, Vec<String>) -> Response,
) -> Result<Response, ApiError> {
    let p = Params::from_query(query, &["n", "follow"])?;
    // More than MAX_TAIL is not an error: the caller gets as many lines as are served.
    let n = p.int_in("n", DEFAULT_TAIL as u64, u64::MAX)?.min(MAX_TAIL as u64) as usize;
    let follow = p.flag("follow")?;
    let (lines, follower) = tokio::task::spawn_blocking(move || Follower::start(source, n, !follow))
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)?;
    if !follow {
        let file = follower.file.as_ref().map(|f| f.to_string_lossy().into_owned());
        return Ok(tail(file, lines));
    }
    let mut pending: VecDeque<FollowItem> = VecDeque::new();
    if let Some(f) = &follower.file {
        pending.push_back(FollowItem::File(f.to_string_lossy().into_owned()));
    }
    pending.extend(lines.into_iter().map(FollowItem::Line));
    Ok(Sse::new(follow_stream(follower, pending, st.shutdown.clone())).keep_alive(KeepAlive::default()).into_response())
}

/// What a followed log produces.
#[derive(Debug, PartialEq)]
enum FollowItem {
    /// The file now being followed (at start and after rotation).
    File(String),
    Line(String),
}

impl FollowItem {
    fn event(self) -> Event {
        match self {
            FollowItem::File(f) => Event::default().event("file").data(f.replace('\r', "")),
            FollowItem::Line(l) => Event::default().event("line").data(l.replace('\r', "")),
        }
    }
}

/// Which file a tail reads.
#[derive(Debug, Clone)]
enum Source {
    /// A service's newest log file in `dir` ([`newest_log`]); rotation moves to a new name.
    Newest { dir: PathBuf, service: String },
    /// One path (an upstream's stderr log); rotation replaces the file at that path.
    Fixed(PathBuf),
    /// No file, ever (a server that writes no stderr log).
    Nothing,
}

impl Source {
    /// The file to read now, if there is one.
    fn current(&self) -> std::io::Result<Option<PathBuf>> {
        match self {
            Source::Newest { dir, service } => newest_log(dir, service),
            Source::Fixed(p) => Ok(p.is_file().then(|| p.clone())),
            Source::Nothing => Ok(None),
        }
    }
}

/// Position in a followed log.
struct Follower {
    source: Source,
    file: Option<PathBuf>,
    /// Inode of `file` when last read: another one at the same path is a new file.
    ino: Option<u64>,
    offset: u64,
    /// Bytes after the last newline, waiting for the rest of their line.
    partial: Vec<u8>,
}

impl Follower {
    /// Longest unterminated line kept before it is emitted anyway (bytes).
    const MAX_PARTIAL: usize = 1024 * 1024;
    /// Most bytes read per poll.
    const MAX_READ: u64 = 4 * 1024 * 1024;

    /// The last `n` lines of `source`'s current file and a follower positioned after them
    /// (with `include_partial`, an unterminated last line is among them; a follower leaves it
    /// to read once complete).
    fn start(source: Source, n: usize, include_partial: bool) -> std::io::Result<(Vec<String>, Self)> {
        use std::os::unix::fs::MetadataExt as _;
        let mut me = Self { source, file: None, ino: None, offset: 0, partial: Vec::new() };
        let Some(file) = me.source.current()? else {
            return Ok((Vec::new(), me));
        };
        let mut f = match std::fs::File::open(&file) {
            Ok(f) => f,
            // Rotated away between finding and opening it: the follower finds the next one.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), me)),
            Err(e) => return Err(e),
        };
        me.ino = Some(f.metadata()?.ino());
        let (lines, offset) = tail_lines(&mut f, n, TAIL_MAX_BYTES, include_partial)?;
        me.file = Some(file);
        me.offset = offset;
        Ok((lines, me))
    }

    /// Reads what was appended since the last poll; switches to a newer file after draining
    /// the old one.
    fn poll(&mut self) -> std::io::Result<Vec<FollowItem>> {
        let mut out = Vec::new();
        if self.file.is_some() {
            self.read_more(&mut out)?;
        }
        let newest = self.source.current()?;
        if newest.is_some() && newest != self.file {
            self.file = newest;
            self.offset = 0;
            self.ino = None;
            if !self.partial.is_empty() {
                out.push(FollowItem::Line(String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned()));
            }
            out.push(FollowItem::File(self.file.as_ref().expect("set").to_string_lossy().into_owned()));
            self.read_more(&mut out)?;
        }
        Ok(out)
    }

    fn read_more(&mut self, out: &mut Vec<FollowItem>) -> std::io::Result<()> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let mut f = match std::fs::File::open(path) {
            Ok(f) => f,
            // Rotated away and pruned: the next poll picks up the newest file.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let meta = f.metadata()?;
        let ino = std::os::unix::fs::MetadataExt::ino(&meta);
        if self.ino.is_some_and(|seen| seen != ino) {
            // Another file at the same path (rotated away and created afresh): read it whole.
            if !self.partial.is_empty() {
                out.push(FollowItem::Line(String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned()));
            }
            out.push(FollowItem::File(path.to_string_lossy().into_owned()));
            self.offset = 0;
        }
        self.ino = Some(ino);
        let len = meta.len();
        if len < self.offset {
            // Truncated in place: start over.
            self.offset = 0;
            self.partial.clear();
        }
        if len == self.offset {
            return Ok(());
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut data = Vec::new();
        f.take(Self::MAX_READ).read_to_end(&mut data)?;
        self.offset += data.len() as u64;
        self.partial.extend_from_slice(&data);
        if let Some(last) = self.partial.iter().rposition(|&b| b == b'\n') {
            let rest = self.partial.split_off(last + 1);
            let complete = std::mem::replace(&mut self.partial, rest);
            for l in complete[..complete.len() - 1].split(|&b| b == b'\n') {
                out.push(FollowItem::Line(String::from_utf8_lossy(l.strip_suffix(b"\r").unwrap_or(l)).into_owned()));
            }
        }
        if self.partial.len() > Self::MAX_PARTIAL {
            out.push(FollowItem::Line(String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned()));
        }
        Ok(())
    }
}

/// The SSE stream of a followed log: `pending` first, then polls every [`FOLLOW_POLL`] until
/// `shutdown` (or the client disconnects, which drops the stream).
fn follow_stream(
    follower: Follower,
    pending: VecDeque<FollowItem>,
    shutdown: CancellationToken,
) -> impl futures_util::Stream<Item = Result<Event, Infallible>> {
    struct S {
        follower: Option<Follower>,
        pending: VecDeque<FollowItem>,
        shutdown: CancellationToken,
    }
    let init = S { follower: Some(follower), pending, shutdown };
    futures_util::stream::unfold(init, |mut s| async move {
        loop {
            if let Some(item) = s.pending.pop_front() {
                return Some((Ok(item.event()), s));
            }
            tokio::select! {
                _ = s.shutdown.cancelled() => return None,
                _ = tokio::time::sleep(FOLLOW_POLL) => {}
            }
            let mut f = s.follower.take()?;
            let (f, r) = tokio::task::spawn_blocking(move || {
                let r = f.poll();
                (f, r)
            })
            .await
            .ok()?;
            match r {
                Ok(items) => s.pending.extend(items),
                Err(e) => {
                    tracing::warn!(error = %e, "Log follow failed; ending the stream.");
                    return None;
                }
            }
            s.follower = Some(f);
        }
    })
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;
    use crate::error::Code;

    /// An invocation keeps the wire it had as a `json!` literal: every key, in order, `client`
    /// and `usage` null when unknown.
    #[test]
    fn invocations_keep_their_wire() {
        let i = Invocation {
            id: 7,
            at: "2026-11-30T09:57:00.211Z".into(),
            method: coffer_proto::store::InvocationMethod::ToolsCall as i32,
            outcome: InvocationOutcome::Ok as i32,
            actor: "mcp".into(),
            ..Default::default()
        };
        let text = serde_json::to_string(&invocation(&i)).unwrap();
        assert_eq!(
            text,
            r#"{"id":7,"at":"2026-11-30T09:57:00.211Z","target":"","method":"tools/call","server":"","session_id":"","duration_ms":0,"outcome":"ok","trace_id":"","actor":"mcp","client":null,"conversation":null,"usage":null}"#
        );
        let i = Invocation { client_name: "claude-code".into(), ..i };
        let v = serde_json::to_value(invocation(&i)).unwrap();
        assert_eq!(v["client"], json!({"name": "claude-code", "version": ""}));
        let i = Invocation { conversation_id: "c1".into(), conversation_title: "Deploy".into(), ..i };
        let v = serde_json::to_value(invocation(&i)).unwrap();
        assert_eq!(v["conversation"], json!({"id": "c1", "title": "Deploy"}));
        let i = Invocation { profile: "work".into(), ..i };
        assert_eq!(serde_json::to_value(invocation(&i)).unwrap()["profile"], "work");
    }

    fn params(q: &[(&str, &str)], allowed: &[&str]) -> Result<Params, ApiError> {
        Params::parse(q.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(), allowed)
    }

    #[test]
    fn query_parameters() {
        let all = ["limit", "cursor", "outcome", "n", "follow"];
        let p = params(&[], &all).unwrap();
        assert_eq!(p.limit().unwrap(), 50);
        assert_eq!(p.cursor().unwrap(), 0);
        assert!(!p.flag("follow").unwrap());
        let p = params(&[("limit", "500"), ("cursor", "42"), ("outcome", "ok"), ("follow", "true")], &all).unwrap();
        assert_eq!(p.limit().unwrap(), 500);
        assert_eq!(p.cursor().unwrap(), 42);
        assert_eq!(p.one_of("outcome", OUTCOMES).unwrap(), "ok");
        assert!(p.flag("follow").unwrap());
        let p = params(&[("limit", "")], &all).unwrap();
        assert_eq!(p.limit().unwrap(), 50);

        for bad in ["0", "501", "-1", "abc", "1.5"] {
            let e = params(&[("limit", bad)], &all).unwrap().limit().unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument);
            assert_eq!(e.details["parameter"], "limit", "{bad}");
        }
        for bad in ["0", "-3", "x"] {
            assert_eq!(params(&[("cursor", bad)], &all).unwrap().cursor().unwrap_err().details["parameter"], "cursor");
        }
        assert!(params(&[("outcome", "great")], &all).unwrap().one_of("outcome", OUTCOMES).is_err());
        assert!(params(&[("follow", "yes")], &all).unwrap().flag("follow").is_err());
        let e = params(&[("limt", "5")], &all).unwrap_err();
        assert_eq!(e.details["parameter"], "limt");
        assert!(e.message.contains("unknown parameter"));
        assert!(params(&[("limit", "5"), ("limit", "6")], &all).unwrap_err().message.contains("more than once"));
        assert_eq!(params(&[("n", "20000")], &all).unwrap().int_in("n", 200, u64::MAX).unwrap(), 20000);
        assert_eq!(next_cursor(0), None);
        assert_eq!(next_cursor(17).as_deref(), Some("17"));
    }

    #[test]
    fn times() {
        let now = 1_764_495_096_123; // 2025-11-30T09:31:36.123Z
        assert_eq!(coffer_runtime::rfc3339_from_unix_ms(now), "2025-11-30T09:31:36.123Z");
        let t = |s: &str| parse_time(s, now);
        assert_eq!(t("2025-11-30").unwrap(), "2025-11-30T00:00:00.000Z");
        assert_eq!(t("2025-11-30T09:31:36Z").unwrap(), "2025-11-30T09:31:36.000Z");
        assert_eq!(t("2025-11-30t09:31z").unwrap(), "2025-11-30T09:31:00.000Z");
        assert_eq!(t("2025-11-30 09:31:36.5Z").unwrap(), "2025-11-30T09:31:36.500Z");
        assert_eq!(t("2025-11-30T09:31:36.123456Z").unwrap(), "2025-11-30T09:31:36.123Z");
        assert_eq!(t("2025-11-30T01:00:00+02:00").unwrap(), "2025-11-29T23:00:00.000Z");
        assert_eq!(t("2025-11-30T23:30:00-01:00").unwrap(), "2025-12-01T00:30:00.000Z");
        assert_eq!(t("2024-02-29").unwrap(), "2024-02-29T00:00:00.000Z");
        assert_eq!(t("1970-01-01").unwrap(), "1970-01-01T00:00:00.000Z");
        assert_eq!(t("2h").unwrap(), "2025-11-30T07:31:36.123Z");
        assert_eq!(t("15m").unwrap(), "2025-11-30T09:16:36.123Z");
        assert_eq!(t("7d").unwrap(), "2025-11-23T09:31:36.123Z");
        assert_eq!(t("30s").unwrap(), "2025-11-30T09:31:06.123Z");
        for bad in [
            "",
            "yesterday",
            "2025-13-01",
            "2025-02-29",
            "2025-11-31",
            "2025-11-30T25:00Z",
            "2025-11-30T09:31:36",
            "2025-11-30T09:31:36.Z",
            "2025-11-30T09:31:36+2",
            "5y",
            "99999999999999999999d",
            "2025/11/30",
            "2025-11-30Tab:cdZ",
        ] {
            assert!(t(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn log_file_names() {
        assert!(is_log_of("gateway.2026-11-30.log", "gateway"));
        assert!(is_log_of("gateway.log", "gateway"));
        assert!(!is_log_of("gateway.2026-11-30.log", "store"));
        assert!(!is_log_of("gateway-x.2026-11-30.log", "gateway"));
        assert!(!is_log_of("gatewayx.log", "gateway"));
        assert!(!is_log_of("gateway.a.b.log", "gateway"));
        assert!(!is_log_of("gateway..log", "gateway"));
        assert!(!is_log_of("daemon.stdio", "daemon"));
        assert!(!is_log_of("gateway.2026-11-30.log.gz", "gateway"));
    }

    fn tail(s: &str, n: usize, max: u64, partial: bool) -> (Vec<String>, u64) {
        tail_lines(&mut Cursor::new(s.as_bytes().to_vec()), n, max, partial).unwrap()
    }

    #[test]
    fn tails() {
        assert_eq!(tail("", 5, 1 << 20, true), (vec![], 0));
        assert_eq!(tail("a\nb\nc\n", 2, 1 << 20, true).0, ["b", "c"]);
        assert_eq!(tail("a\nb\nc\n", 10, 1 << 20, true).0, ["a", "b", "c"]);
        assert_eq!(tail("a\r\nb\r\n", 10, 1 << 20, true).0, ["a", "b"]);
        assert_eq!(tail("a\n\nc\n", 10, 1 << 20, true).0, ["a", "", "c"]);
        // An unterminated last line: included, or left for the follower.
        assert_eq!(tail("a\nb\npart", 2, 1 << 20, true), (vec!["b".to_owned(), "part".to_owned()], 8));
        assert_eq!(tail("a\nb\npart", 2, 1 << 20, false), (vec!["a".to_owned(), "b".to_owned()], 4));
        assert_eq!(tail("part", 2, 1 << 20, false), (vec![], 0));
        // The byte cap drops the line cut in half.
        assert_eq!(tail("aaaa\nbb\ncc\n", 10, 7, true).0, ["bb", "cc"]);
        // Many chunks.
        let big: String = (0..50_000).map(|i| format!("line {i}\n")).collect();
        let (lines, end) = tail(&big, 3, 1 << 30, true);
        assert_eq!(lines, ["line 49997", "line 49998", "line 49999"]);
        assert_eq!(end, big.len() as u64);
        assert_eq!(tail(&big, 10_000, 1 << 30, true).0.len(), 10_000);
        assert_eq!(tail(&big, 10_000, 1 << 30, true).0[0], "line 40000");
    }

    #[test]
    fn follower_reads_appends_and_rotation() {
        let dir = std::env::temp_dir().join(format!("coffer-logs-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let old = dir.join("store.2026-01-01.log");
        std::fs::write(&old, "one\ntw").unwrap();
        std::fs::write(dir.join("gateway.2026-01-02.log"), "other\n").unwrap();
        let mut f = Follower {
            source: Source::Newest { dir: dir.clone(), service: "store".into() },
            file: Some(old.clone()),
            ino: None,
            offset: 0,
            partial: Vec::new(),
        };
        assert_eq!(f.poll().unwrap(), [FollowItem::Line("one".into())]);
        assert_eq!(f.poll().unwrap(), []);
        std::fs::write(&old, "one\ntwo\nthree\n").unwrap();
        assert_eq!(f.poll().unwrap(), [FollowItem::Line("two".into()), FollowItem::Line("three".into())]);
        // Rotation: the new file is newer by name at equal mtimes, or by mtime.
        let new = dir.join("store.2026-01-02.log");
        std::fs::write(&new, "fresh\n").unwrap();
        let items = f.poll().unwrap();
        assert_eq!(items, [FollowItem::File(new.to_string_lossy().into_owned()), FollowItem::Line("fresh".into())]);
        assert_eq!(newest_log(&dir, "store").unwrap(), Some(new));
        assert_eq!(newest_log(&dir, "chat").unwrap(), None);
        assert_eq!(newest_log(&dir.join("missing"), "chat").unwrap(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fixed_file_replaced_at_its_path_is_read_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("tiny.log");
        // No file yet: nothing, then the file once it appears.
        let (lines, mut f) = Follower::start(Source::Fixed(log.clone()), 10, false).unwrap();
        assert!(lines.is_empty() && f.file.is_none());
        assert_eq!(f.poll().unwrap(), []);
        std::fs::write(&log, "a\nb\n").unwrap();
        let shown = log.to_string_lossy().into_owned();
        assert_eq!(
            f.poll().unwrap(),
            [FollowItem::File(shown.clone()), FollowItem::Line("a".into()), FollowItem::Line("b".into())]
        );
        // Rotated away (renamed) and created afresh, longer than what was read: read whole.
        std::fs::rename(&log, dir.path().join("tiny.log.1")).unwrap();
        assert_eq!(f.poll().unwrap(), []);
        std::fs::write(&log, "first of the new\nsecond\n").unwrap();
        assert_eq!(
            f.poll().unwrap(),
            [FollowItem::File(shown), FollowItem::Line("first of the new".into()), FollowItem::Line("second".into())]
        );
        // The tail of an existing file, and no file for `Nothing`.
        let (lines, _) = Follower::start(Source::Fixed(log.clone()), 1, true).unwrap();
        assert_eq!(lines, ["second"]);
        let (lines, mut f) = Follower::start(Source::Nothing, 10, true).unwrap();
        assert!(lines.is_empty() && f.poll().unwrap().is_empty());
    }
}
