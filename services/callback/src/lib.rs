//! `coffer-callback`, the SeaTalk webhook listener (seeds: process model §callback listener,
//! ADR-031). An on-demand service: the supervisor runs it only while a SeaTalk channel is
//! enabled (coffer-chat's adapter coordinator asks for it with `StartService`, giving the
//! signing secrets in its environment, and stops it with the last SeaTalk channel).
//!
//! What it serves, on `127.0.0.1:<COFFER_CALLBACK_PORT, default 8787>` (the user points a tunnel
//! such as cloudflared at it), is exactly `POST /seatalk/{channel}`; every other method or path
//! answers 404. A request is handled in this order:
//!
//! 1. **Host** — accepted: the loopback names `localhost`, `127.0.0.1`, `::1` (`[::1]`), with
//!    any port, and the names listed in `COFFER_CALLBACK_HOSTS` (comma-separated, e.g. the
//!    tunnel's public host name; `*` accepts any). Anything else, or no Host: 421 (a page on
//!    another origin that resolves to loopback gets nothing).
//! 2. **Body** — at most 1 MiB ([`BODY_LIMIT`]); larger: 413 and nothing read further.
//! 3. **Channel and signature** — the `{channel}` path segment must name a channel of
//!    `COFFER_CALLBACK_SECRETS` (a running SeaTalk channel), and SeaTalk's event callback signs
//!    each request with the header `Signature: <lowercase hex sha256(raw body ‖ signing
//!    secret)>` (SeaTalk Open Platform, "Event Callback" → "Verify the signature"), compared in
//!    constant time. An unknown or disabled channel, a missing or a wrong signature: the same
//!    401, nothing forwarded — the answer does not tell which channel names exist.
//! 5. **Shape** — the body must be a JSON object with a string `event_type` (SeaTalk's event
//!    envelope: `event_id`, `event_type`, `timestamp`, `app_id`, `event`); otherwise 400.
//! 6. **Verification** — `event_type: "event_verification"` (sent when the callback URL is
//!    saved in the SeaTalk developer console) is answered at once with 200 and
//!    `{"seatalk_challenge": <event.seatalk_challenge>}`, as the platform requires; not
//!    forwarded.
//! 7. **Age** — an event whose envelope `timestamp` (Unix seconds) is more than
//!    [`MAX_EVENT_AGE`] (10 minutes) from now is refused with 400 and not forwarded: a signed
//!    body captured once cannot be replayed later (redeliveries within the window are dropped
//!    by `event_id` in coffer-chat). The `timestamp` is required: an event without one, or
//!    with one that is not an integer (a string, a fraction), is refused with 400 the same way.
//! 8. **Any other event** — answered 200 `{}` at once, then forwarded over loopback to
//!    coffer-chat's `ChannelAdapters.DeliverSeatalkEvent` (raw body, channel, receive time) with
//!    this service's internal identity, retried for a while if chat is UNAVAILABLE
//!    ([`FORWARD_RETRY_FOR`]) or the channel's adapter is not running ([`RESTART_GRACE`]: it
//!    may be restarting). A full forwarding queue answers 503 instead of 200, so the
//!    platform redelivers (chat drops redeliveries by `event_id`).
//!
//! Configuration comes only from the environment, never from a file: `COFFER_CALLBACK_SECRETS`
//! is a JSON object `{"<channel>": "<signing secret>", …}` ([`Config::from_lookup`]). Secrets are
//! never logged, never in an error message, never on disk. It holds no other state and never
//! opens the database. Its internal listener serves only the gRPC health check, and only once
//! the public port is bound.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use coffer_proto::channel::SeatalkEvent;
use coffer_proto::channel::channel_adapters_client::ChannelAdaptersClient;
use coffer_runtime::authz::Policy;
use coffer_runtime::identity::Identity;
use coffer_runtime::logging::clip;
use coffer_runtime::service::ServiceCtx;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

/// The largest callback body accepted (1 MiB); larger ones are answered 413.
pub const BODY_LIMIT: usize = 1024 * 1024;
/// Largest distance between an event's `timestamp` (Unix seconds, in SeaTalk's envelope) and
/// now: an older (or later) signed event is refused, so a captured body cannot be replayed once
/// its `event_id` has left the store's de-duplication window.
pub const MAX_EVENT_AGE: Duration = Duration::from_secs(600);
/// Longest a client may take to send a request's head (request line and headers) before the
/// connection is closed: a stalled or trickling sender (slowloris) holds no connection longer.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest one request may take once its head arrived, body included; then 408.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Most connections served at once (see [`serve_public`]).
pub const MAX_CONNECTIONS: usize = LIMITS.max_connections;
/// The public listener's limits.
pub const LIMITS: coffer_runtime::limits::Limits = coffer_runtime::limits::Limits {
    header_read_timeout: HEADER_READ_TIMEOUT,
    ..coffer_runtime::limits::Limits::CALLBACK
};
/// The public port when `COFFER_CALLBACK_PORT` is not set.
pub const DEFAULT_PORT: u16 = 8787;
/// How long an event is retried while coffer-chat answers UNAVAILABLE (starting, restarting).
pub const FORWARD_RETRY_FOR: Duration = Duration::from_secs(30);
/// How long an event is retried while coffer-chat answers FAILED_PRECONDITION (the channel's
/// adapter is not running): a disabled channel's events are then dropped, but an adapter
/// restarting (a pairing, a configuration change) is back within this.
pub const RESTART_GRACE: Duration = Duration::from_secs(5);
/// Events accepted but not yet forwarded; beyond this the platform is answered 503.
pub const QUEUE_DEPTH: usize = 256;
/// At shutdown, how long queued events still get to reach chat.
const DRAIN_FOR: Duration = Duration::from_secs(5);

/// A configuration that cannot run (the message names the variable, never a secret).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{var} is not set: coffer-callback needs at least one SeaTalk channel's signing secret")]
    NoSecrets { var: &'static str },
    #[error("{var} is not a JSON object of channel name to signing secret (strings): {reason}")]
    BadSecrets { var: &'static str, reason: String },
    #[error("{var} names channel {channel:?} with an empty signing secret")]
    EmptySecret { var: &'static str, channel: String },
    #[error("{var}={value:?} is not a port number (1-65535)")]
    BadPort { var: &'static str, value: String },
}

/// What coffer-callback runs with, read from its environment.
pub struct Config {
    /// The public loopback port.
    pub port: u16,
    /// Channel name → signing secret.
    pub secrets: BTreeMap<String, SecretString>,
    /// Extra accepted `Host` names (lowercase, without port), beyond the loopback ones.
    pub hosts: Vec<String>,
    /// `COFFER_CALLBACK_HOSTS` contains `*`: any Host is accepted.
    pub any_host: bool,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("port", &self.port)
            .field("channels", &self.secrets.keys().collect::<Vec<_>>())
            .field("hosts", &self.hosts)
            .field("any_host", &self.any_host)
            .finish()
    }
}

impl Config {
    /// From the process environment ([`Config::from_lookup`] over `std::env::var`).
    ///
    /// # Errors
    /// As [`Config::from_lookup`].
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// From `get` (a variable's value by name): `COFFER_CALLBACK_SECRETS` (required, a JSON
    /// object of channel name → non-empty signing secret), `COFFER_CALLBACK_PORT` (default
    /// 8787), `COFFER_CALLBACK_HOSTS` (comma-separated host names; `*` = any).
    ///
    /// # Errors
    /// [`ConfigError`] naming the variable and the rule.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        use coffer_runtime::env::{CALLBACK_HOSTS, CALLBACK_PORT, CALLBACK_SECRETS};
        let raw = get(CALLBACK_SECRETS).filter(|s| !s.trim().is_empty());
        let raw = raw.ok_or(ConfigError::NoSecrets { var: CALLBACK_SECRETS })?;
        // Parsed as strings only: serde's error for a wrong type names the position, not the value.
        let map: BTreeMap<String, String> = serde_json::from_str(&raw).map_err(|e| ConfigError::BadSecrets {
            var: CALLBACK_SECRETS,
            reason: format!("at line {} column {}", e.line(), e.column()),
        })?;
        if map.is_empty() {
            return Err(ConfigError::NoSecrets { var: CALLBACK_SECRETS });
        }
        if let Some((channel, _)) = map.iter().find(|(_, v)| v.is_empty()) {
            return Err(ConfigError::EmptySecret { var: CALLBACK_SECRETS, channel: channel.clone() });
        }
        let secrets = map.into_iter().map(|(k, v)| (k, SecretString::from(v))).collect();
        let port = match get(CALLBACK_PORT).filter(|p| !p.is_empty()) {
            None => DEFAULT_PORT,
            Some(p) => p
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or(ConfigError::BadPort { var: CALLBACK_PORT, value: p })?,
        };
        let listed: Vec<String> = get(CALLBACK_HOSTS)
            .unwrap_or_default()
            .split(',')
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .collect();
        let any_host = listed.iter().any(|h| h == "*");
        let hosts = listed.into_iter().filter(|h| h != "*").collect();
        Ok(Self { port, secrets, hosts, any_host })
    }
}

/// SeaTalk's signature of `body` under `secret`: lowercase hex of `sha256(body ‖ secret)`.
pub fn signature(body: &[u8], secret: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(body);
    h.update(secret);
    hex::encode(h.finalize())
}

/// Whether `header` is the signature of `body` under `secret`, compared in constant time
/// (only the length, which is public, is compared first).
pub fn signature_matches(body: &[u8], secret: &[u8], header: &[u8]) -> bool {
    let expected = signature(body, secret);
    expected.len() == header.len() && bool::from(expected.as_bytes().ct_eq(header))
}

/// Whether `host` (a `Host` header value) is one coffer-callback answers (see the module docs).
pub fn host_accepted(host: &str, extra: &[String], any: bool) -> bool {
    if any {
        return true;
    }
    let host = host.trim().to_ascii_lowercase();
    let name = if let Some(rest) = host.strip_prefix('[') {
        // `[::1]` or `[::1]:8787`.
        rest.split_once(']').map(|(n, _)| n).unwrap_or(rest)
    } else if host.matches(':').count() > 1 {
        host.as_str()
    } else {
        host.split_once(':').map_or(host.as_str(), |(n, _)| n)
    };
    matches!(name, "localhost" | "127.0.0.1" | "::1") || extra.iter().any(|h| h == name)
}

/// One event accepted for coffer-chat.
#[derive(Debug)]
pub struct Accepted {
    pub channel: String,
    pub body: Bytes,
    pub received_ms: i64,
}

/// The HTTP side's state.
#[derive(Clone)]
pub struct AppState {
    secrets: Arc<BTreeMap<String, SecretString>>,
    hosts: Arc<Vec<String>>,
    any_host: bool,
    queue: mpsc::Sender<Accepted>,
}

impl AppState {
    /// State over `config`'s secrets and hosts, queueing accepted events on `queue`.
    pub fn new(config: &Config, queue: mpsc::Sender<Accepted>) -> Self {
        Self {
            secrets: Arc::new(config.secrets.clone()),
            hosts: Arc::new(config.hosts.clone()),
            any_host: config.any_host,
            queue,
        }
    }
}

/// The public router: `POST /seatalk/{channel}` (see the module docs); everything else 404.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/seatalk/{channel}", axum::routing::any(seatalk))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(within_request_timeout))
        .with_state(state)
}

/// Answers 408 when a request (its body read included) takes longer than [`REQUEST_TIMEOUT`].
async fn within_request_timeout(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
        Ok(r) => r,
        Err(_) => error(StatusCode::REQUEST_TIMEOUT, "the request took too long to arrive"),
    }
}

/// Serves `app` on `listener` until `shutdown` under [`LIMITS`] (the listener limits every
/// Coffer listener applies, `coffer_runtime::limits`): at most [`MAX_CONNECTIONS`] at once — at
/// the cap the oldest connection that never carried a correctly signed request is closed to
/// make room — each closed when its request head takes longer than [`HEADER_READ_TIMEOUT`]
/// (`COFFER_HEAD_TIMEOUT_MS` when set, `coffer_runtime::limits::Limits::with_env_head_timeout`) or
/// it stays idle 30 s; on shutdown the open connections finish their request (5 s at most).
///
/// # Errors
/// None today; the signature keeps the caller's `?`.
pub async fn serve_public(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    serve_public_under(listener, app, shutdown, LIMITS.with_env_head_timeout()).await;
    Ok(())
}

/// [`serve_public`] under `limits` (tests prove the head timeout with a short one).
pub(crate) async fn serve_public_under(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: tokio_util::sync::CancellationToken,
    limits: coffer_runtime::limits::Limits,
) {
    use coffer_runtime::limits::{Connections, Listener, serve_http};
    let conns = Connections::new("callback", limits);
    serve_http(Listener::Tcp(listener), conns, app, shutdown, Duration::from_secs(5)).await;
}

/// Log lines about refused callbacks (anyone who reaches the port can cause them): bursts of
/// 100, 20 a second on average; past that, the next line written says how many were suppressed.
static REFUSALS: coffer_runtime::logging::LogBudget = coffer_runtime::logging::LogBudget::new(20, 100);

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not found: coffer-callback serves only POST /seatalk/{channel}")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

async fn seatalk(
    State(st): State<AppState>,
    method: Method,
    Path(channel): Path<String>,
    headers: HeaderMap,
    conn: Option<axum::Extension<coffer_runtime::limits::ConnHandle>>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let host = headers.get(axum::http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    if !host_accepted(host, &st.hosts, st.any_host) {
        if let Some(suppressed) = REFUSALS.allow() {
            tracing::warn!(host = %clip(host), suppressed, "Refused a callback for another host.");
        }
        return error(StatusCode::MISDIRECTED_REQUEST, "this Host is not served here (see COFFER_CALLBACK_HOSTS)");
    }
    if method != Method::POST {
        return not_found().await;
    }
    let body = match body {
        Ok(b) => b,
        Err(rej) => {
            let status = rej.status();
            if let Some(suppressed) = REFUSALS.allow() {
                tracing::warn!(channel = %clip(&channel), %status, suppressed, "Refused a callback body.");
            }
            let msg =
                if status == StatusCode::PAYLOAD_TOO_LARGE { "body larger than 1 MiB" } else { "unreadable body" };
            return error(status, msg);
        }
    };
    // An unknown or disabled channel is answered exactly as a wrong signature (there is no
    // secret it could match): the answers do not tell which channel names exist.
    let Some(secret) = st.secrets.get(&channel) else {
        if let Some(suppressed) = REFUSALS.allow() {
            tracing::warn!(channel = %clip(&channel), suppressed, "Refused a callback for a channel that is not running.");
        }
        return error(StatusCode::UNAUTHORIZED, "missing or wrong Signature");
    };
    let sig = headers.get("signature").map(|v| v.as_bytes()).unwrap_or_default();
    if sig.is_empty() || !signature_matches(&body, secret.expose_secret().as_bytes(), sig) {
        if let Some(suppressed) = REFUSALS.allow() {
            tracing::warn!(%channel, bytes = body.len(), present = !sig.is_empty(), suppressed, "Refused a callback: bad signature.");
        }
        return error(StatusCode::UNAUTHORIZED, "missing or wrong Signature");
    }
    // Signed by the platform: this connection is never closed to make room for others.
    if let Some(conn) = conn {
        conn.mark_trusted();
    }
    let parsed: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(%channel, bytes = body.len(), error = %e, "Refused a signed callback: not JSON.");
            return error(StatusCode::BAD_REQUEST, "the body is not JSON");
        }
    };
    let Some(event_type) = parsed.get("event_type").and_then(|t| t.as_str()) else {
        tracing::warn!(%channel, "Refused a signed callback: no event_type.");
        return error(StatusCode::BAD_REQUEST, "the body is not a SeaTalk event (no string event_type)");
    };
    if event_type == "event_verification" {
        let challenge = parsed.pointer("/event/seatalk_challenge").and_then(|c| c.as_str());
        let Some(challenge) = challenge else {
            return error(StatusCode::BAD_REQUEST, "event_verification without event.seatalk_challenge");
        };
        tracing::info!(%channel, "Answered SeaTalk's callback verification.");
        return axum::Json(serde_json::json!({ "seatalk_challenge": challenge })).into_response();
    }
    // The replay window needs a time to measure: a signed body without an integer `timestamp`
    // (missing, a string, a fraction) would have no age and could be replayed forever.
    let ts = match parsed.get("timestamp") {
        Some(v) => match v.as_i64() {
            Some(ts) => ts,
            None => {
                tracing::warn!(%channel, %event_type, "Refused a signed callback: its timestamp is not an integer.");
                return error(
                    StatusCode::BAD_REQUEST,
                    "the event's timestamp must be an integer (Unix seconds, SeaTalk's event envelope)",
                );
            }
        },
        None => {
            tracing::warn!(%channel, %event_type, "Refused a signed callback: no timestamp.");
            return error(
                StatusCode::BAD_REQUEST,
                "the event has no timestamp (Unix seconds, SeaTalk's event envelope)",
            );
        }
    };
    let skew = (now_ms() / 1000).saturating_sub(ts).saturating_abs();
    if skew > MAX_EVENT_AGE.as_secs() as i64 {
        tracing::warn!(%channel, %event_type, skew_s = skew, "Refused a signed callback: its timestamp is out of bounds.");
        return error(StatusCode::BAD_REQUEST, "the event's timestamp is more than 10 minutes from now (a replay?)");
    }
    let event_type = event_type.to_owned();
    let accepted = Accepted { channel: channel.clone(), body, received_ms: now_ms() };
    match st.queue.try_send(accepted) {
        Ok(()) => {
            tracing::debug!(%channel, %event_type, "Accepted a SeaTalk event.");
            axum::Json(serde_json::json!({})).into_response()
        }
        Err(_) => {
            tracing::warn!(%channel, %event_type, "Forwarding queue full; asked SeaTalk to redeliver.");
            error(StatusCode::SERVICE_UNAVAILABLE, "busy; deliver again later")
        }
    }
}

/// Where accepted events go (coffer-chat in production; a recorder in tests).
pub trait Deliver: Send + 'static {
    /// Delivers one event; the status is chat's answer.
    fn deliver(&mut self, event: SeatalkEvent)
    -> impl std::future::Future<Output = Result<bool, tonic::Status>> + Send;
}

/// coffer-chat's `ChannelAdapters` client (internal identity `callback`).
pub struct ChatDeliver(pub ChannelAdaptersClient<coffer_runtime::grpc::AuthChannel>);

impl Deliver for ChatDeliver {
    async fn deliver(&mut self, event: SeatalkEvent) -> Result<bool, tonic::Status> {
        Ok(self.0.deliver_seatalk_event(event).await?.into_inner().duplicate)
    }
}

/// Forwards queued events in order until the queue closes; an UNAVAILABLE answer is retried
/// with backoff for up to [`FORWARD_RETRY_FOR`], FAILED_PRECONDITION (no running adapter) for
/// up to [`RESTART_GRACE`]; any other refusal, or one that lasts, is logged and the event
/// dropped (chat's message names the cause). `shutdown` cuts retries short after [`DRAIN_FOR`].
pub async fn forward(
    mut rx: mpsc::Receiver<Accepted>,
    mut to: impl Deliver,
    shutdown: tokio_util::sync::CancellationToken,
) {
    while let Some(ev) = rx.recv().await {
        let channel = ev.channel.clone();
        let msg = SeatalkEvent { channel: ev.channel, body: ev.body.to_vec(), received_ms: ev.received_ms };
        let start = tokio::time::Instant::now();
        let give_up = start + FORWARD_RETRY_FOR;
        let mut backoff = coffer_runtime::Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        loop {
            let now = tokio::time::Instant::now();
            match to.deliver(msg.clone()).await {
                Ok(duplicate) => {
                    tracing::info!(%channel, duplicate, "Forwarded a SeaTalk event to chat.");
                    break;
                }
                Err(s)
                    if (s.code() == tonic::Code::Unavailable && now < give_up)
                        || (s.code() == tonic::Code::FailedPrecondition && now < start + RESTART_GRACE) =>
                {
                    tracing::debug!(%channel, message = s.message(), "Chat unavailable; retrying the event.");
                    let cut = if shutdown.is_cancelled() { tokio::time::Instant::now() + DRAIN_FOR } else { give_up };
                    tokio::select! {
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                        _ = tokio::time::sleep_until(cut) => { tracing::warn!(%channel, "Gave up on an event at shutdown."); break; }
                    }
                }
                Err(s) => {
                    tracing::warn!(%channel, code = ?s.code(), message = s.message(), "Chat refused a SeaTalk event; dropped.");
                    break;
                }
            }
        }
    }
}

/// Runs coffer-callback: reads [`Config`], binds the public port, then serves it and the
/// health check until shutdown, forwarding accepted events to coffer-chat.
///
/// # Errors
/// A bad configuration, a port that cannot be bound (named), chat's address missing.
pub async fn run(ctx: ServiceCtx) -> anyhow::Result<()> {
    let ServiceCtx { listener, internal, shutdown, .. } = ctx;
    let config = Config::from_env()?;
    let public = tokio::net::TcpListener::bind(("127.0.0.1", config.port))
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on 127.0.0.1:{} (COFFER_CALLBACK_PORT): {e}", config.port))?;
    tracing::info!(port = config.port, channels = ?config.secrets.keys().collect::<Vec<_>>(), "Listening for SeaTalk callbacks.");
    let chat = ChatDeliver(ChannelAdaptersClient::new(internal.channel(Identity::Chat)?));
    let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
    let app = router(AppState::new(&config, tx));
    let forwarder = tokio::spawn(forward(rx, chat, shutdown.clone()));
    let http = {
        let shutdown = shutdown.clone();
        async move { serve_public(public, app, shutdown).await }
    };
    let auth = internal.auth_layer(Policy::ANY_SERVICE);
    let health = coffer_runtime::grpc::serve_with_health(listener, auth, tonic::service::Routes::default(), shutdown);
    let (h, g) = tokio::join!(http, health);
    h?;
    g?;
    // The router (and its queue sender) is gone: the forwarder drains and ends.
    let _ = forwarder.await;
    Ok(())
}

/// Process entry: [`run`] as service `callback`.
pub fn main_entry() -> std::process::ExitCode {
    coffer_runtime::service::service_main(Identity::Callback, run)
}

#[cfg(test)]
mod tests;
