//! The SeaTalk adapter (see [`super`]): events forwarded by `coffer-callback`, normalised into
//! [`Inbound`] and handed to the bridge; ack-then-final replies through the SeaTalk Open
//! Platform's send-message API; `coffer-callback` kept running while SeaTalk channels are
//! ([`CallbackManager`]).
//!
//! Wire format followed (SeaTalk Open Platform docs, "Event Callback", "Get App Access Token",
//! "Send Message to Bot Subscriber", "Send Message to Group Chat"):
//! - every callback body is an envelope `{event_id, event_type, timestamp, app_id, event}`;
//!   the adapter reads three event types:
//!   - `message_from_bot_subscriber` (a one-to-one chat with the bot): `event.employee_code`,
//!     `event.email`, `event.message.{message_id, tag, text.content}`; `tag` `image`
//!     (`image.content`: a download URL) and `file` (`file.content`, `file.filename`) are files
//!     sent to the bot (see "Images and files" below);
//!   - `new_mentioned_message_received_from_group_chat` (the bot mentioned in a group):
//!     `event.group_id`, `event.message.{message_id, sender.{employee_code, email}, tag,
//!     text.{plain_text, mentioned_list[].username}}` — the bot's mention is removed from the
//!     text (see [`strip_mentions`]);
//!   - `interactive_message_click` (a callback button of a card was clicked):
//!     `event.{message_id, employee_code, email, value, group_id}` (`group_id` empty in a
//!     one-to-one chat);
//!
//!   a message that is not read (a video, a sticker, an image in a group…) gets [`ONLY_TEXT`]
//!   once per chat per adapter run (others are refused as for text); other event types are
//!   logged and dropped;
//! - `POST {base}/auth/app_access_token` `{app_id, app_secret}` →
//!   `{code: 0, app_access_token, expire}` (`expire`: Unix seconds);
//! - `POST {base}/messaging/v2/single_chat` `{employee_code, message}` and
//!   `POST {base}/messaging/v2/group_chat` `{group_id, message}` with
//!   `Authorization: Bearer <token>`, `message = {tag: "text", text: {format, content}}`
//!   (`format` 1 = markdown, 2 = plain text; `content` at most 4,096 bytes of UTF-8, so longer
//!   replies are split, [`split_text`]) or an interactive message card `{tag:
//!   "interactive_message", interactive_message: {elements}}` ([`approval_card`]) → `{code: 0,
//!   message_id}`; `POST {base}/messaging/v2/update` `{message_id, message:
//!   {interactive_message: {elements}}}` → `{code: 0}` replaces a card's elements ("Update
//!   Message": the bot's own card, within 7 days). A non-zero `code` is an error; HTTP 401 or the
//!   token codes ([`TOKEN_CODES`]) mean the access token was refused;
//! - `GET <file URL>` with `Authorization: Bearer <token>`: the bytes of an image or file sent to
//!   the bot (URLs under `{base}/messaging/v2/file/`, valid 7 days).
//!
//! Behaviour: each forwarded body is parsed ([`parse_event`]); redeliveries are dropped through
//! the store's `RecordEvent`, and the [`Inbound`] goes to the bridge in order. The replier sends
//! [`ACK_TEXT`] when a turn starts and the final text at its end (`format` 1 markdown; an
//! interrupted or failed turn as a short notice) to the single or group chat. The app access token
//! is cached until `TOKEN_MARGIN` before its `expire` and fetched again once when a send is
//! refused. The adapter asks for an access token before it says `running`: app credentials SeaTalk
//! refuses leave it `failed` with the cause (until they change; SeaTalk out of reach is `backoff`
//! with its retry), and a reply that cannot be sent later turns it `failed` with the cause until a
//! send succeeds — so a wrong app secret shows in `coffer channel list`, status and doctor instead
//! of a `running` adapter losing every reply. Bodies still in a stopping adapter's inbox go to the
//! channel's next adapter (60 s at most), since SeaTalk was already answered 200.
//!
//! Approvals ([`SeatalkReplier`]'s `approval`): in a one-to-one chat a request is an interactive
//! card ([`approval_card`]: "Waiting for your approval", Bash `rm -rf build` (#1042), the
//! `/allow N` / `/deny N` / `/always N` commands, and callback buttons Allow / Deny / Always whose
//! `value` is `ap:<conversation>:<number>:<a|d|A>`). A click ([`Event::Click`]) goes to
//! [`Bridge::answer`] (only the paired owner, only the conversation bound to that chat; the
//! first answer from any surface wins); a click on a request already decided is told the first
//! decision; anyone else is told once that only the owner answers. Every decision, whoever made
//! it (a click, a command, the console, the CLI, the timeout), updates the card to say it and
//! who, without buttons. In a group, or when SeaTalk refuses the card (or its update), the
//! request and its decision are plain text with the commands, as before.
//!
//! Images and files: an `image` or `file` message from a person in a one-to-one chat goes
//! through the bridge's owner gate first ([`Bridge::handle_files`]: a stranger's file is never
//! fetched), then is downloaded ([`Client::download`]: only from this app's
//! `/messaging/v2/file/` URLs, so the token goes nowhere else; at most
//! `chat.attachment_max_bytes`, refused by `Content-Length` or while reading) and sent to the
//! agent as an attachment ([`crate::attachments`]: saved under the conversation's working
//! directory, an image named `image.<ext>` by its bytes and given to the agent as an image, a
//! file under its sanitised `filename`). A refusal (over the limit, not an image, a failed
//! download) is told to the chat and nothing reaches the agent.
//! [`CallbackManager::sync`] starts `coffer-callback` with `COFFER_CALLBACK_SECRETS` (a JSON object
//! channel → signing secret) only when the set changed, and stops it when the set is empty.
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::control::control_client::ControlClient;
use coffer_proto::control::{StartServiceRequest, StopServiceRequest};
use coffer_proto::store::channels_client::ChannelsClient;
use coffer_proto::store::{ChannelRecord, RecordEventRequest};
use coffer_runtime::Backoff;
use coffer_runtime::grpc::AuthChannel;
use futures_util::future::BoxFuture;
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use super::bridge::Bridge;
use super::{AdapterCtx, AdapterHandle, ChannelError, Inbound, Replier, StatusCell, TurnState, TurnView};

/// The public SeaTalk Open Platform API, when a record's `api_base_url` is empty.
pub const PUBLIC_BASE: &str = "https://openapi.seatalk.io";
/// The platform's name in [`ChannelError`]s.
const PLATFORM: &str = "SeaTalk";
/// The largest text message content, in bytes of UTF-8.
pub const TEXT_LIMIT: usize = 4096;
/// SeaTalk response codes that mean the app access token is expired or invalid: the token is
/// fetched again once and the request retried.
pub const TOKEN_CODES: &[i64] = &[100, 101];
/// A cached token is refreshed this long before its `expire`.
const TOKEN_MARGIN: Duration = Duration::from_secs(60);
/// The acknowledgement sent when a turn starts.
pub const ACK_TEXT: &str = "Working on it…";
/// Bodies waiting for the adapter; beyond this `DeliverSeatalkEvent` answers UNAVAILABLE.
pub const INBOX_DEPTH: usize = 64;
/// The supervisor's name of the callback listener.
pub const CALLBACK_SERVICE: &str = "callback";

/// `format` of a SeaTalk text message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Markdown = 1,
    Plain = 2,
}

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A one-to-one chat with the bot: the subscriber's employee code.
    Single(String),
    /// A group chat: its group id.
    Group(String),
}

struct Token {
    value: SecretString,
    /// Unix seconds.
    expire: i64,
}

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A SeaTalk Open Platform client for one app: the app access token cached until shortly
/// before its `expire` and fetched again once when a call says it was refused.
pub struct Client {
    http: reqwest::Client,
    base: String,
    app_id: SecretString,
    app_secret: SecretString,
    token: tokio::sync::Mutex<Option<Token>>,
}

impl Client {
    /// A client of the API at `base_url` (empty: [`PUBLIC_BASE`]) for the app `app_id`.
    pub fn new(base_url: &str, app_id: SecretString, app_secret: SecretString) -> Self {
        coffer_runtime::tls::ensure_provider();
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("reqwest client builds");
        let base = if base_url.is_empty() { PUBLIC_BASE } else { base_url };
        Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            app_id,
            app_secret,
            token: tokio::sync::Mutex::new(None),
        }
    }

    fn unavailable(e: reqwest::Error) -> ChannelError {
        ChannelError::Unavailable { platform: PLATFORM, message: e.without_url().to_string() }
    }

    /// The cached token, or a fresh one when there is none, it is about to expire, or `stale`
    /// is the one just refused.
    async fn token(&self, stale: Option<&str>) -> Result<SecretString, ChannelError> {
        let mut cur = self.token.lock().await;
        if let Some(t) = cur.as_ref()
            && t.expire - (TOKEN_MARGIN.as_secs() as i64) > now_s()
            && stale != Some(t.value.expose_secret())
        {
            return Ok(t.value.clone());
        }
        let body = serde_json::json!({
            "app_id": self.app_id.expose_secret(),
            "app_secret": self.app_secret.expose_secret(),
        });
        let r = self
            .http
            .post(format!("{}/auth/app_access_token", self.base))
            .json(&body)
            .send()
            .await
            .map_err(Self::unavailable)?;
        let status = r.status();
        if status.is_server_error() {
            return Err(ChannelError::Unavailable {
                platform: PLATFORM,
                message: format!("access token: HTTP {status}"),
            });
        }
        let v: Value = r.json().await.map_err(Self::unavailable)?;
        let code = v.get("code").and_then(Value::as_i64).unwrap_or(-1);
        let token = v.get("app_access_token").and_then(Value::as_str).filter(|t| !t.is_empty());
        match (code, token) {
            (0, Some(t)) if status.is_success() => {
                let expire = v.get("expire").and_then(Value::as_i64).unwrap_or_else(|| now_s() + 7200);
                let value = SecretString::from(t.to_owned());
                *cur = Some(Token { value: value.clone(), expire });
                Ok(value)
            }
            _ => Err(ChannelError::Auth {
                platform: PLATFORM,
                message: format!("the app id and secret were refused (HTTP {status}, code {code})"),
            }),
        }
    }

    /// Sends one text message; returns SeaTalk's `message_id` (or empty).
    ///
    /// # Errors
    /// [`ChannelError::Auth`] when the token is refused again after one refresh (or the app
    /// credentials are), `Unavailable` for 5xx and transport failures, `RateLimited` for 429,
    /// `Rejected` for any other non-zero code.
    pub async fn send_text(&self, to: &Target, content: &str, format: Format) -> Result<String, ChannelError> {
        let message = serde_json::json!({ "tag": "text", "text": { "format": format as i64, "content": content } });
        self.send_message(to, message).await
    }

    /// Sends an interactive message card (`message = {tag: "interactive_message",
    /// interactive_message: {elements}}`, SeaTalk's "Send Message to Bot User" / "Send Message
    /// to Group Chat"); returns its `message_id` (what [`Client::update_card`] and the
    /// `interactive_message_click` event name).
    ///
    /// # Errors
    /// As [`Client::send_text`].
    pub async fn send_card(&self, to: &Target, elements: Vec<Value>) -> Result<String, ChannelError> {
        let message =
            serde_json::json!({ "tag": "interactive_message", "interactive_message": { "elements": elements } });
        self.send_message(to, message).await
    }

    /// Replaces the elements of an interactive message card this app sent (`POST
    /// {base}/messaging/v2/update` `{message_id, message: {interactive_message: {elements}}}` →
    /// `{code: 0}`; SeaTalk's "Update Message": the bot must be the card's sender, within 7 days).
    ///
    /// # Errors
    /// As [`Client::send_text`] (a card SeaTalk will not update any more is `Rejected`).
    pub async fn update_card(&self, message_id: &str, elements: Vec<Value>) -> Result<(), ChannelError> {
        let body = serde_json::json!({ "message_id": message_id,
            "message": { "interactive_message": { "elements": elements } } });
        self.call("update", &body).await.map(|_| ())
    }

    async fn send_message(&self, to: &Target, message: Value) -> Result<String, ChannelError> {
        let (path, mut body) = match to {
            Target::Single(code) => ("single_chat", serde_json::json!({ "employee_code": code })),
            Target::Group(id) => ("group_chat", serde_json::json!({ "group_id": id })),
        };
        body["message"] = message;
        let v = self.call(path, &body).await?;
        Ok(v.get("message_id").and_then(Value::as_str).unwrap_or_default().to_owned())
    }

    /// `POST {base}/messaging/v2/{path}` with `body` and the app access token (fetched again
    /// once when refused); the answer's JSON when its `code` is 0.
    async fn call(&self, path: &str, body: &Value) -> Result<Value, ChannelError> {
        let url = format!("{}/messaging/v2/{path}", self.base);
        let mut refused: Option<SecretString> = None;
        loop {
            let token = self.token(refused.as_ref().map(|t| t.expose_secret())).await?;
            let r = self
                .http
                .post(&url)
                .bearer_auth(token.expose_secret())
                .json(body)
                .send()
                .await
                .map_err(Self::unavailable)?;
            let status = r.status();
            if status.is_server_error() {
                return Err(ChannelError::Unavailable { platform: PLATFORM, message: format!("HTTP {status}") });
            }
            if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
                let after = r
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1);
                return Err(ChannelError::RateLimited { platform: PLATFORM, retry_after_s: after });
            }
            let v: Value = if status == reqwest::StatusCode::UNAUTHORIZED {
                Value::Null
            } else {
                r.json().await.map_err(Self::unavailable)?
            };
            let code = v.get("code").and_then(Value::as_i64).unwrap_or(-1);
            let token_refused = status == reqwest::StatusCode::UNAUTHORIZED || TOKEN_CODES.contains(&code);
            if token_refused {
                if refused.is_some() {
                    return Err(ChannelError::Auth {
                        platform: PLATFORM,
                        message: format!(
                            "the app access token was refused after a refresh (HTTP {status}, code {code})"
                        ),
                    });
                }
                tracing::info!("SeaTalk refused the app access token; fetching a new one.");
                refused = Some(token);
                continue;
            }
            if code != 0 || !status.is_success() {
                let msg = v.get("message").and_then(Value::as_str).unwrap_or("").chars().take(200).collect::<String>();
                return Err(ChannelError::Rejected {
                    platform: PLATFORM,
                    message: format!("HTTP {status}, code {code}: {msg}"),
                });
            }
            return Ok(v);
        }
    }

    /// Whether `url` is a file of this app's API: the same origin as the client's base and a
    /// path under `/messaging/v2/file/` (where SeaTalk serves the images and files sent to a
    /// bot). The app access token is only ever sent to such a URL.
    pub fn is_file_url(&self, url: &str) -> bool {
        let (Ok(u), Ok(base)) = (reqwest::Url::parse(url), reqwest::Url::parse(&self.base)) else { return false };
        let prefix = format!("{}/messaging/v2/file/", base.path().trim_end_matches('/'));
        u.origin() == base.origin()
            && u.username().is_empty()
            && u.password().is_none()
            && u.path().starts_with(&prefix)
            && u.path().len() > prefix.len()
            && !u.path().split('/').any(|seg| seg == ".." || seg == "." || seg.eq_ignore_ascii_case("%2e%2e"))
    }

    /// Downloads a file sent to the bot (`GET <url>` with `Authorization: Bearer <token>`, the
    /// token fetched again once when refused), reading at most `max_bytes`; its bytes and the
    /// answer's `Content-Type` (essence only, lowercase; empty when absent or not a media type).
    ///
    /// # Errors
    /// [`DownloadError::NotAFile`] for a URL outside [`Client::is_file_url`] (nothing is
    /// fetched), [`DownloadError::Over`] past `max_bytes` (by `Content-Length` before reading,
    /// or while reading), [`DownloadError::Failed`] for a refusal or transport failure (never
    /// the token).
    pub async fn download(&self, url: &str, max_bytes: u64) -> Result<(Vec<u8>, String), DownloadError> {
        use futures_util::StreamExt as _;
        if !self.is_file_url(url) {
            return Err(DownloadError::NotAFile);
        }
        let failed = |e: reqwest::Error| DownloadError::Failed(e.without_url().to_string());
        let mut refused: Option<SecretString> = None;
        let resp = loop {
            let token = self
                .token(refused.as_ref().map(|t| t.expose_secret()))
                .await
                .map_err(|e| DownloadError::Failed(e.to_string()))?;
            let r = self
                .http
                .get(url)
                .bearer_auth(token.expose_secret())
                .timeout(DOWNLOAD_TIMEOUT)
                .send()
                .await
                .map_err(failed)?;
            if r.status() == reqwest::StatusCode::UNAUTHORIZED && refused.is_none() {
                refused = Some(token);
                continue;
            }
            if !r.status().is_success() {
                return Err(DownloadError::Failed(format!("SeaTalk answered HTTP {}", r.status().as_u16())));
            }
            break r;
        };
        if let Some(len) = resp.content_length().filter(|l| *l > max_bytes) {
            return Err(DownloadError::Over(len));
        }
        let mime = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(media_type)
            .unwrap_or_default();
        let mut data = Vec::new();
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            data.extend_from_slice(&chunk.map_err(failed)?);
            if data.len() as u64 > max_bytes {
                return Err(DownloadError::Over(data.len() as u64));
            }
        }
        Ok((data, mime))
    }
}

/// Timeout of one file download.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// Why a file sent to the bot was not downloaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownloadError {
    /// The event's URL is not a file of this app's SeaTalk API: not fetched.
    #[error("the link is not a SeaTalk file of this app")]
    NotAFile,
    /// Larger than the limit (bytes announced or read so far).
    #[error("{0} bytes is over the limit")]
    Over(u64),
    /// SeaTalk refused or failed the download.
    #[error("{0}")]
    Failed(String),
}

/// The essence of a `Content-Type` value (`image/png` of `image/png; charset=x`), lowercase;
/// empty unless it is `type/subtype` of token characters.
pub fn media_type(header: &str) -> String {
    let essence = header.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let token = |s: &str| {
        !s.is_empty() && s.len() <= 127 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    match essence.split_once('/') {
        Some((t, sub)) if token(t) && token(sub) => essence,
        _ => String::new(),
    }
}

/// Splits `text` into pieces of at most `limit` bytes, in order, preferring a paragraph break
/// (`\n\n`), then a line break, then a space, and never cutting a UTF-8 character. Empty text
/// gives no piece.
pub fn split_text(text: &str, limit: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text.trim_end();
    while rest.len() > limit {
        let mut cut = limit;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let window = &rest[..cut];
        let at = [("\n\n", 2), ("\n", 1), (" ", 1)]
            .iter()
            .find_map(|(sep, n)| window.rfind(sep).filter(|&i| i > 0).map(|i| (i, i + n)));
        let (end, next) = at.unwrap_or((cut, cut));
        out.push(rest[..end].trim_end().to_owned());
        rest = rest[next..].trim_start_matches('\n');
    }
    if !rest.trim().is_empty() {
        out.push(rest.to_owned());
    }
    out.retain(|p| !p.is_empty());
    out
}

/// Removes the bot's mention from a group message's text: the `@username` mentions of
/// `mentioned` at the start of the text (SeaTalk puts the mention where the user typed it,
/// usually first); when none is at the start, the first mention anywhere. The rest is kept as
/// typed (trimmed).
pub fn strip_mentions(text: &str, mentioned: &[String]) -> String {
    let mut rest = text.trim_start();
    let mut stripped = false;
    loop {
        let hit = mentioned
            .iter()
            .find(|u| !u.is_empty() && rest.strip_prefix('@').is_some_and(|r| r.starts_with(u.as_str())));
        match hit {
            Some(u) => {
                rest = rest[1 + u.len()..].trim_start();
                stripped = true;
            }
            None => break,
        }
    }
    if stripped {
        return rest.trim().to_owned();
    }
    for u in mentioned.iter().filter(|u| !u.is_empty()) {
        let m = format!("@{u}");
        if let Some(i) = text.find(&m) {
            let mut s = String::with_capacity(text.len());
            s.push_str(&text[..i]);
            s.push_str(&text[i + m.len()..]);
            return s.split_whitespace().collect::<Vec<_>>().join(" ");
        }
    }
    text.trim().to_owned()
}

/// A parsed callback body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message for the bridge, with the event's id (for de-duplication).
    Message { event_id: String, inbound: Inbound },
    /// A message from a person that is not text (an image, a file, a sticker…), with its
    /// event's id and tag: the sender is told once that only text is read ([`ONLY_TEXT`]).
    Unsupported { event_id: String, inbound: Inbound, tag: String },
    /// A well-formed event this adapter does not act on (another type, an empty message).
    Ignored { event_id: String, reason: String },
    /// An image or a file sent to the bot in a one-to-one chat (`tag` `image` or `file`): the
    /// message (empty text: SeaTalk's image and file messages carry none) and what to fetch.
    Files { event_id: String, inbound: Inbound, files: Vec<FileRef> },
    /// A callback button of an interactive message card was clicked
    /// (`interactive_message_click`): who clicked, in which chat (`message_id` is the card's),
    /// and the button's `value` (at most 256 bytes).
    Click { event_id: String, who: Inbound, value: String },
}

/// A file of a message sent to the bot, before any download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRef {
    /// SeaTalk's download URL (`image.content` / `file.content`); fetched only when it is a
    /// file of this app's API ([`Client::is_file_url`]).
    pub url: String,
    /// The name it is saved under before [`crate::attachments::sanitize`]: `image` (the
    /// extension follows the bytes), or the file's `filename` as the sender gave it.
    pub name: String,
    /// `true` for an image message: its bytes must be a PNG, JPEG, GIF or WebP image.
    pub image: bool,
}

/// What the owner's chat is told, once per adapter run, about a message that is not read.
pub const ONLY_TEXT: &str = "Only text messages, and images and files sent to the bot in a private chat, are read: \
                             videos, stickers and other kinds of message are not. Send your request as a text message.";

/// Why a body is not a SeaTalk event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("the body is not JSON: {0}")]
    Json(String),
    #[error("the event has no {0}")]
    Missing(&'static str),
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

/// Parses one forwarded callback body of `channel` (see the module docs for the shapes).
///
/// # Errors
/// [`EventError`] for a body that is not JSON or lacks `event_id` / `event_type` / the sender.
pub fn parse_event(channel: &str, body: &[u8]) -> Result<Event, EventError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| EventError::Json(e.to_string()))?;
    let event_id = str_at(&v, "/event_id");
    if event_id.is_empty() || event_id.len() > 256 {
        return Err(EventError::Missing("event_id (1-256 bytes)"));
    }
    let event_id = event_id.to_owned();
    let event_type = str_at(&v, "/event_type");
    if event_type.is_empty() {
        return Err(EventError::Missing("event_type"));
    }
    let ignored = |reason: String| Ok(Event::Ignored { event_id: event_id.clone(), reason });
    if event_type == "interactive_message_click" {
        let code = str_at(&v, "/event/employee_code");
        if code.is_empty() {
            return Err(EventError::Missing("event.employee_code"));
        }
        let value = str_at(&v, "/event/value");
        if value.is_empty() || value.len() > 256 {
            return Err(EventError::Missing("event.value (1-256 bytes)"));
        }
        let group_id = str_at(&v, "/event/group_id");
        let email = str_at(&v, "/event/email");
        let who = Inbound {
            channel: channel.to_owned(),
            chat_id: if group_id.is_empty() { code } else { group_id }.to_owned(),
            sender_id: code.to_owned(),
            sender_display: if email.is_empty() { code } else { email }.to_owned(),
            text: String::new(),
            message_id: str_at(&v, "/event/message_id").to_owned(),
            group: !group_id.is_empty(),
        };
        return Ok(Event::Click { event_id, who, value: value.to_owned() });
    }
    let (group, chat_id, sender, display, message_id, text, tag) = match event_type {
        "message_from_bot_subscriber" => {
            let code = str_at(&v, "/event/employee_code");
            if code.is_empty() {
                return Err(EventError::Missing("event.employee_code"));
            }
            let tag = str_at(&v, "/event/message/tag");
            let email = str_at(&v, "/event/email");
            let text = str_at(&v, "/event/message/text/content").trim().to_owned();
            (
                false,
                code,
                code,
                if email.is_empty() { code } else { email },
                str_at(&v, "/event/message/message_id"),
                text,
                tag,
            )
        }
        "new_mentioned_message_received_from_group_chat" => {
            let group_id = str_at(&v, "/event/group_id");
            let code = str_at(&v, "/event/message/sender/employee_code");
            if group_id.is_empty() {
                return Err(EventError::Missing("event.group_id"));
            }
            if code.is_empty() {
                return Err(EventError::Missing("event.message.sender.employee_code"));
            }
            let tag = str_at(&v, "/event/message/tag");
            let mentioned: Vec<String> = v
                .pointer("/event/message/text/mentioned_list")
                .and_then(Value::as_array)
                .map(|l| l.iter().filter_map(|m| m.get("username")?.as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
            let text = strip_mentions(str_at(&v, "/event/message/text/plain_text"), &mentioned);
            let email = str_at(&v, "/event/message/sender/email");
            (
                true,
                group_id,
                code,
                if email.is_empty() { code } else { email },
                str_at(&v, "/event/message/message_id"),
                text,
                tag,
            )
        }
        other => return ignored(format!("event type {other:?}")),
    };
    let inbound = |text: String| Inbound {
        channel: channel.to_owned(),
        chat_id: chat_id.to_owned(),
        sender_id: sender.to_owned(),
        sender_display: display.to_owned(),
        text,
        message_id: message_id.to_owned(),
        group,
    };
    if !group && (tag == "image" || tag == "file") {
        let url = str_at(&v, &format!("/event/message/{tag}/content")).to_owned();
        let name =
            if tag == "image" { "image".to_owned() } else { str_at(&v, "/event/message/file/filename").to_owned() };
        let file = FileRef { url, name, image: tag == "image" };
        return Ok(Event::Files { event_id, inbound: inbound(String::new()), files: vec![file] });
    }
    if tag != "text" {
        let tag: String = tag.chars().take(64).collect();
        return Ok(Event::Unsupported { event_id, inbound: inbound(String::new()), tag });
    }
    if text.is_empty() {
        return ignored("an empty message".into());
    }
    Ok(Event::Message { event_id, inbound: inbound(text) })
}

/// How the adapter shows things in SeaTalk: notices as plain text; a turn as an immediate
/// acknowledgement ([`ACK_TEXT`]) and, at its end, the final text as markdown (split at
/// [`TEXT_LIMIT`]) or a short notice for an interrupted or failed turn.
pub struct SeatalkReplier {
    client: Client,
    /// Chats known to be groups (their replies go to the group-chat endpoint).
    groups: Mutex<HashMap<String, bool>>,
    status: Arc<StatusCell>,
    /// Approval cards sent, by (conversation, number): the card's `message_id`. Updated when
    /// the request is decided; a request already here is not sent again (a replay).
    cards: Mutex<HashMap<(String, u64), String>>,
    /// Senders told that only the owner answers the cards (once each per adapter run).
    click_refused: Mutex<std::collections::HashSet<String>>,
}

/// Approval cards remembered per adapter run (beyond, the oldest are forgotten: their decision
/// is then said in a notice instead of on the card).
const MAX_CARDS: usize = 4096;

/// The button labels of an approval card and the decisions they send.
pub const CARD_BUTTONS: [(&str, &str); 3] = [("Allow", "allow"), ("Deny", "deny"), ("Always", "allow_always")];

/// The elements of an approval card (SeaTalk's interactive message: `title`, `description`
/// (`format` 1, markdown) and `button` elements). Waiting: "Waiting for your approval", what
/// the agent would do with its number and the commands that answer it too, and three
/// `callback` buttons Allow / Deny / Always whose `value` is
/// [`super::telegram::callback_data`] (`ap:<conversation>:<number>:<a|d|A>`). Decided: the
/// outcome as the title, what, by whom and what the agent was told, no buttons.
pub fn approval_card(view: &super::ApprovalView) -> Vec<Value> {
    let n = view.number;
    let title = |t: &str| serde_json::json!({ "element_type": "title", "title": { "text": t } });
    let description =
        |t: String| serde_json::json!({ "element_type": "description", "description": { "format": 1, "text": t } });
    if view.decided.is_some() {
        return vec![title(view.outcome()), description(super::approval_decided_text(view))];
    }
    let mut elements = vec![
        title("Waiting for your approval"),
        description(format!(
            "{} (#{n})\nOr answer /allow {n}, /deny {n} [a message for the agent] or /always {n}.",
            view.what_md()
        )),
    ];
    for (label, decision) in CARD_BUTTONS {
        let value = super::telegram::callback_data(&view.conversation_id, n, decision);
        elements.push(serde_json::json!({ "element_type": "button",
            "button": { "button_type": "callback", "text": label, "value": value } }));
    }
    elements
}

impl SeatalkReplier {
    /// A replier sending through `client`, noting sends in `status`.
    pub fn new(client: Client, status: Arc<StatusCell>) -> Self {
        Self {
            client,
            groups: Mutex::new(HashMap::new()),
            status,
            cards: Mutex::new(HashMap::new()),
            click_refused: Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// The client (downloads of the files sent to the bot).
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn cards(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u64), String>> {
        self.cards.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes a platform call's outcome in the status: a failure turns the adapter `failed`
    /// with the cause, a success after one back to `running`.
    fn note_sent<T>(&self, r: &Result<T, ChannelError>) {
        match r {
            Err(e) => {
                let why = format!("a reply could not be sent: {e}");
                tracing::warn!(error = %e, "A SeaTalk reply could not be sent.");
                self.status.update(|s| {
                    s.state = "failed".into();
                    s.last_error = why;
                    s.retry_at_ms = 0;
                });
            }
            Ok(_) => self.status.update(|s| {
                s.last_outbound_ms = now_ms();
                if s.state == "failed" {
                    s.state = "running".into();
                    s.last_error.clear();
                }
            }),
        }
    }

    /// An approval request in a one-to-one chat as an interactive card with Allow / Deny /
    /// Always buttons ([`approval_card`]); its decision, whoever made it, updates that card.
    /// A request in a group chat, a card SeaTalk refuses, or a decision on a card this run did
    /// not send (or SeaTalk will not update) falls back to the text of [`Replier::approval`]'s
    /// default.
    async fn show_approval(
        &self,
        chat_id: &str,
        view: &super::ApprovalView,
        channel: &str,
    ) -> Result<(), ChannelError> {
        let key = (view.conversation_id.clone(), view.number);
        let single = matches!(self.target(chat_id), Target::Single(_));
        if view.decided.is_none() {
            if self.cards().contains_key(&key) {
                return Ok(());
            }
            if single {
                let sent = self.client.send_card(&self.target(chat_id), approval_card(view)).await;
                match sent {
                    Ok(id) => {
                        self.note_sent(&Ok::<(), ChannelError>(()));
                        let mut cards = self.cards();
                        if cards.len() >= MAX_CARDS {
                            cards.clear();
                        }
                        cards.insert(key, id);
                        return Ok(());
                    }
                    Err(ChannelError::Rejected { message, .. }) => {
                        tracing::warn!(%message, "SeaTalk refused an approval card; sending the request as text.");
                    }
                    Err(e) => {
                        self.note_sent(&Err::<(), _>(e.clone()));
                        return Err(e);
                    }
                }
            }
            return self.send(chat_id, &super::approval_request_text(view), Format::Plain).await;
        }
        let card = self.cards().get(&key).cloned();
        if let Some(message_id) = card {
            let updated = self.client.update_card(&message_id, approval_card(view)).await;
            match updated {
                Ok(()) => {
                    self.note_sent(&updated);
                    return Ok(());
                }
                Err(ChannelError::Rejected { message, .. }) => {
                    tracing::warn!(%message, "SeaTalk refused to update an approval card; saying the decision.");
                    return self.send(chat_id, &super::approval_decided_text(view), Format::Plain).await;
                }
                Err(e) => {
                    self.note_sent(&Err::<(), _>(e.clone()));
                    return Err(e);
                }
            }
        }
        match &view.decided {
            Some(d) if d.decided_by == format!("channel:{channel}") => Ok(()),
            _ => self.send(chat_id, &super::approval_decided_text(view), Format::Plain).await,
        }
    }

    /// Whether `sender` is to be told (the first time this run) that only the owner answers.
    fn first_click_refusal(&self, sender: &str) -> bool {
        let mut told = self.click_refused.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        told.len() < 1024 && told.insert(sender.to_owned())
    }

    /// Records whether `chat_id` is a group (from an inbound message).
    pub fn note_chat(&self, chat_id: &str, group: bool) {
        self.groups.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(chat_id.to_owned(), group);
    }

    fn target(&self, chat_id: &str) -> Target {
        let group = self.groups.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(chat_id).copied();
        if group == Some(true) { Target::Group(chat_id.to_owned()) } else { Target::Single(chat_id.to_owned()) }
    }

    /// Sends `text` (split at [`TEXT_LIMIT`]). A refusal (the app credentials or the access
    /// token refused, or any other failed send) puts the adapter in `failed` with the cause, so
    /// `coffer channel list`, status and doctor say that replies are being lost; the next send
    /// that succeeds puts it back to `running`.
    async fn send(&self, chat_id: &str, text: &str, format: Format) -> Result<(), ChannelError> {
        let to = self.target(chat_id);
        for piece in split_text(text, TEXT_LIMIT) {
            let sent = self.client.send_text(&to, &piece, format).await;
            self.note_sent(&sent);
            sent?;
        }
        Ok(())
    }

    /// The final message of a turn that ended as `view` says.
    pub fn final_text(view: &TurnView) -> (String, Format) {
        match &view.state {
            TurnState::Done { .. } if view.text.trim().is_empty() => ("(no reply)".into(), Format::Plain),
            TurnState::Done { .. } => (view.text.clone(), Format::Markdown),
            TurnState::Interrupted if view.text.trim().is_empty() => ("Stopped.".into(), Format::Plain),
            TurnState::Interrupted => (format!("{}\n\n_(stopped)_", view.text.trim_end()), Format::Markdown),
            TurnState::Failed { message } => {
                let short: String = message.chars().take(300).collect();
                (format!("The turn failed: {short}"), Format::Plain)
            }
            TurnState::Running => (String::new(), Format::Plain),
        }
    }
}

impl Replier for SeatalkReplier {
    fn approval<'a>(
        &'a self,
        chat_id: &'a str,
        view: &'a super::ApprovalView,
        channel: &'a str,
    ) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(self.show_approval(chat_id, view, channel))
    }

    fn notice<'a>(&'a self, chat_id: &'a str, text: &'a str) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(self.send(chat_id, text, Format::Plain))
    }

    fn turn<'a>(
        &'a self,
        chat_id: &'a str,
        mut views: tokio::sync::watch::Receiver<TurnView>,
    ) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(async move {
            // The turn may already be over (a very short one): then no acknowledgement.
            if !views.borrow().state.is_final() {
                self.send(chat_id, ACK_TEXT, Format::Plain).await?;
            }
            let last = match views.wait_for(|v| v.state.is_final()).await {
                Ok(v) => v.clone(),
                // The adapter is stopping: send nothing more.
                Err(_) => return Ok(()),
            };
            let (text, format) = Self::final_text(&last);
            self.send(chat_id, &text, format).await
        })
    }
}

/// Starts the adapter of one enabled SeaTalk channel (`ctx.secrets` holds its app id, app
/// secret and signing secret by reference name); its [`AdapterHandle::inbox`] receives the
/// bodies `coffer-callback` forwarded. Called only by the coordinator.
///
/// Each body is parsed ([`parse_event`]; malformed ones are logged and dropped), recorded
/// through the store's `RecordEvent` (a redelivered `event_id` is dropped), and a message is
/// handed to the bridge in arrival order. A missing app id or secret, or app credentials
/// SeaTalk refuses (an access token is asked for before the adapter says `running`), leave the
/// adapter `failed` (naming the reference or the refusal) until the coordinator restarts it;
/// SeaTalk out of reach at start is `backoff` with its retry time. A reply that cannot be sent
/// later turns the adapter `failed` with the cause until a send succeeds again. Bodies still in the
/// inbox when it stops are handed to the channel's next adapter ([`CARRY_FOR`]).
pub fn spawn(ctx: AdapterCtx) -> AdapterHandle {
    let (tx, rx) = tokio::sync::mpsc::channel(INBOX_DEPTH);
    let task = tokio::spawn(run(ctx, rx));
    AdapterHandle { task, inbox: Some(tx) }
}

async fn run(ctx: AdapterCtx, mut inbox: tokio::sync::mpsc::Receiver<Vec<u8>>) {
    let AdapterCtx { record, secrets, engine, store, status, cancel } = ctx;
    let secret = |r: &str| secrets.get(r).cloned();
    let (Some(app_id), Some(app_secret)) = (secret(&record.app_id_ref), secret(&record.app_secret_ref)) else {
        let missing = if secret(&record.app_id_ref).is_none() { &record.app_id_ref } else { &record.app_secret_ref };
        status.update(|s| {
            s.state = "failed".into();
            s.last_error = format!("credential {missing:?} is missing");
        });
        cancel.cancelled().await;
        carry_over(&record.name, &mut inbox);
        return;
    };
    let client = Client::new(&record.api_base_url, app_id, app_secret);
    // The app credentials are tried before the adapter says `running`: a wrong app secret is a
    // `failed` adapter naming the cause at once, not a running one that loses every reply.
    let mut backoff = Backoff::new(START_BACKOFF_FIRST, START_BACKOFF_MAX);
    loop {
        let got = tokio::select! {
            () = cancel.cancelled() => {
                carry_over(&record.name, &mut inbox);
                return stopped(&status);
            }
            got = client.token(None) => got,
        };
        match got {
            Ok(_) => break,
            Err(e @ ChannelError::Auth { .. }) => {
                tracing::warn!(channel = %record.name, error = %e, "The SeaTalk adapter cannot run.");
                status.update(|s| {
                    s.state = "failed".into();
                    s.last_error = e.to_string();
                    s.retry_at_ms = 0;
                });
                // Until the credentials change (the coordinator then starts a new adapter, which
                // handles the events that waited here first).
                cancel.cancelled().await;
                carry_over(&record.name, &mut inbox);
                return;
            }
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(channel = %record.name, error = %e, wait_ms = delay.as_millis() as u64, "SeaTalk cannot be reached; backing off.");
                status.update(|s| {
                    s.state = "backoff".into();
                    s.last_error = e.to_string();
                    s.retry_at_ms = now_ms() + delay.as_millis() as i64;
                });
                tokio::select! {
                    () = cancel.cancelled() => {
                        carry_over(&record.name, &mut inbox);
                        return stopped(&status);
                    }
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    let replier = Arc::new(SeatalkReplier::new(client, status.clone()));
    let bridge = Bridge::new(engine.clone(), replier.clone());
    let mut channels = ChannelsClient::new(store);
    status.update(|s| {
        s.state = "running".into();
        s.last_error.clear();
        s.retry_at_ms = 0;
        s.started_ms = now_ms();
    });
    tracing::info!(channel = %record.name, "SeaTalk adapter running.");
    // Turns the web page starts in the owner's conversation show in the owner's chat too.
    if let Err(e) = bridge.resume(&record).await {
        tracing::warn!(channel = %record.name, error = %e, "Cannot follow the owner's conversation yet.");
    }
    for body in carried_take(&record.name) {
        let max_bytes = engine.config().attachments.max_bytes;
        handle_body(&record, &body, &mut channels, &bridge, &replier, &status, max_bytes).await;
    }
    loop {
        let body = tokio::select! {
            _ = cancel.cancelled() => break,
            b = inbox.recv() => match b { Some(b) => b, None => break },
        };
        let max_bytes = engine.config().attachments.max_bytes;
        handle_body(&record, &body, &mut channels, &bridge, &replier, &status, max_bytes).await;
    }
    carry_over(&record.name, &mut inbox);
    stopped(&status);
}

fn stopped(status: &StatusCell) {
    status.update(|s| {
        s.state = "stopped".into();
        s.last_error.clear();
        s.retry_at_ms = 0;
    });
    tracing::info!(channel = %status.get().channel, "SeaTalk adapter stopped.");
}

/// First wait after SeaTalk could not be reached for the start's token check, doubled up to
/// [`START_BACKOFF_MAX`].
const START_BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// Longest wait between two start checks.
const START_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// First wait before recording an event's id again while the store is unavailable, doubled
/// per try; tries stop once the wait would reach [`RECORD_RETRY_UNTIL`] (100 ms … 1.6 s).
const RECORD_RETRY_FIRST: Duration = Duration::from_millis(100);
const RECORD_RETRY_UNTIL: Duration = Duration::from_secs(3);

/// How long bodies a stopping adapter had accepted but not handled wait for the channel's
/// next adapter ([`carry_over`]); older ones are dropped (the channel was disabled, not
/// restarted).
pub const CARRY_FOR: Duration = Duration::from_secs(60);

/// Bodies set aside for one channel, each with when it was set aside.
type Carried = Vec<(std::time::Instant, Vec<u8>)>;

/// Bodies set aside by stopped adapters, by channel name.
static CARRIED: Mutex<BTreeMap<String, Carried>> = Mutex::new(BTreeMap::new());

/// Sets aside what is still in a stopping adapter's inbox: each body was already acknowledged
/// to SeaTalk (which will not send it again), so the channel's next adapter — the coordinator
/// restarts one on a pairing or configuration change — handles it first instead of it being
/// lost. The inbox is closed first, so a late delivery is refused (UNAVAILABLE: redelivered).
fn carry_over(channel: &str, inbox: &mut tokio::sync::mpsc::Receiver<Vec<u8>>) {
    inbox.close();
    let mut left = Vec::new();
    while let Ok(b) = inbox.try_recv() {
        left.push((std::time::Instant::now(), b));
    }
    if left.is_empty() {
        return;
    }
    tracing::info!(channel, count = left.len(), "Set aside SeaTalk events for the channel's next adapter.");
    CARRIED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(channel.to_owned())
        .or_default()
        .extend(left);
}

/// The bodies set aside for `channel` less than [`CARRY_FOR`] ago, oldest first (and forgets
/// them all).
fn carried_take(channel: &str) -> Vec<Vec<u8>> {
    let taken = CARRIED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(channel).unwrap_or_default();
    let n = taken.len();
    let fresh: Vec<Vec<u8>> = taken.into_iter().filter(|(t, _)| t.elapsed() < CARRY_FOR).map(|(_, b)| b).collect();
    if n > fresh.len() {
        tracing::warn!(channel, dropped = n - fresh.len(), "Dropped SeaTalk events set aside too long ago.");
    }
    fresh
}

async fn handle_body(
    record: &ChannelRecord,
    body: &[u8],
    channels: &mut ChannelsClient<AuthChannel>,
    bridge: &Bridge,
    replier: &SeatalkReplier,
    status: &StatusCell,
    max_bytes: u64,
) {
    let channel = record.name.as_str();
    let event = match parse_event(channel, body) {
        Ok(Event::Ignored { event_id, reason }) => {
            tracing::debug!(channel, %event_id, %reason, "Ignored a SeaTalk event.");
            return;
        }
        Err(e) => {
            tracing::warn!(channel, bytes = body.len(), error = %e, "Dropped a malformed SeaTalk event.");
            return;
        }
        Ok(event) => event,
    };
    let event_id = match &event {
        Event::Message { event_id, .. }
        | Event::Unsupported { event_id, .. }
        | Event::Files { event_id, .. }
        | Event::Click { event_id, .. }
        | Event::Ignored { event_id, .. } => event_id.clone(),
    };
    // De-duplication: the platform redelivers an event it did not see acknowledged in time.
    let mut backoff = Backoff::new(RECORD_RETRY_FIRST, Duration::MAX);
    let first = loop {
        match channels.record_event(RecordEventRequest { name: channel.to_owned(), event_id: event_id.clone() }).await {
            Ok(r) => break r.into_inner().first,
            Err(s) if s.code() == tonic::Code::Unavailable && backoff.peek() < RECORD_RETRY_UNTIL => {
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(s) => {
                tracing::warn!(channel, %event_id, code = ?s.code(), message = s.message(), "Cannot record a SeaTalk event; dropped.");
                status.update(|st| st.last_error = format!("recording an event failed: {}", s.message()));
                return;
            }
        }
    };
    if !first {
        tracing::info!(channel, %event_id, "Dropped a redelivered SeaTalk event.");
        return;
    }
    status.update(|s| s.last_inbound_ms = now_ms());
    let handled = match event {
        Event::Click { who, value, .. } => {
            click(record, bridge, replier, &who, &value).await;
            Ok(())
        }
        Event::Unsupported { inbound, tag, .. } => {
            replier.note_chat(&inbound.chat_id, inbound.group);
            tracing::debug!(channel, %event_id, %tag, "A SeaTalk message that is not read.");
            bridge.unsupported(record, inbound, ONLY_TEXT).await
        }
        Event::Files { inbound, files, .. } => {
            replier.note_chat(&inbound.chat_id, inbound.group);
            // The owner gate runs before the fetch: a stranger's file is never downloaded.
            let fetch = download_files(replier.client(), files, max_bytes);
            bridge.handle_files(record, inbound, Box::pin(fetch)).await
        }
        Event::Message { inbound, .. } => {
            replier.note_chat(&inbound.chat_id, inbound.group);
            bridge.handle(record, inbound).await
        }
        Event::Ignored { .. } => Ok(()),
    };
    if let Err(e) = handled {
        tracing::warn!(channel, %event_id, error = %e, "The bridge could not handle a SeaTalk event.");
        status.update(|s| s.last_error = e.to_string());
    }
}

/// Fetches the files of an owner's message ([`Client::download`], at most `max_bytes` each) as
/// attachments: an image's declared type is `image/*` (its bytes must be one, or it is refused
/// by [`crate::attachments::check`]); a file's is the download's `Content-Type` unless that is
/// empty or `application/octet-stream` (then guessed from its name).
///
/// # Errors
/// What to tell the owner: a link that is not a SeaTalk file of this app, a file over the limit
/// (nothing kept) or a failed download; never the token.
async fn download_files(
    client: &Client,
    files: Vec<FileRef>,
    max_bytes: u64,
) -> Result<Vec<coffer_proto::chat::AttachmentUpload>, String> {
    use crate::attachments::human;
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let what = if f.image {
            "The image".to_owned()
        } else {
            format!("The file {}", crate::attachments::sanitize(&f.name))
        };
        let (data, mime) = match client.download(&f.url, max_bytes).await {
            Ok(got) => got,
            Err(DownloadError::Over(size)) => {
                return Err(format!(
                    "{what} is {}, over the limit of {} per file (chat.attachment_max_bytes); nothing was sent to the agent.",
                    human(size),
                    human(max_bytes)
                ));
            }
            Err(DownloadError::NotAFile) => {
                return Err(format!(
                    "{what} has no SeaTalk download link this bot can use; nothing was sent to the agent."
                ));
            }
            Err(DownloadError::Failed(why)) => {
                return Err(format!(
                    "Could not download {} from SeaTalk ({why}); nothing was sent to the agent.",
                    what.to_lowercase()
                ));
            }
        };
        let mime = if f.image {
            if mime.starts_with("image/") { mime } else { "image/unknown".to_owned() }
        } else if mime == "application/octet-stream" {
            String::new()
        } else {
            mime
        };
        out.push(coffer_proto::chat::AttachmentUpload { name: f.name, mime, data });
    }
    Ok(out)
}

/// A click on an approval card's button: the button's value names the request
/// ([`super::telegram::parse_callback_data`]); [`Bridge::answer`] decides it for the paired
/// owner in a one-to-one chat with the conversation bound to it (the first answer from any
/// surface wins; the card is then updated through the bus like any decision). A click already
/// decided is told the first decision; anyone else is told once that only the owner answers
/// (audited by the bridge); a value that is not an approval button is dropped.
async fn click(record: &ChannelRecord, bridge: &Bridge, replier: &SeatalkReplier, who: &Inbound, value: &str) {
    use super::bridge::Answered;
    let Some((conversation, number, decision)) = super::telegram::parse_callback_data(value) else {
        tracing::debug!(channel = %record.name, "A click on a button that is not an approval's; dropped.");
        return;
    };
    let answered = bridge.answer(record, who, &conversation, number, decision, "").await;
    let view = |d: &super::Decided| super::ApprovalView { number, decided: Some(d.clone()), ..Default::default() };
    let (to, text) = match &answered {
        Answered::Decided(_) => return,
        Answered::Already(d) => {
            let v = view(d);
            (
                who.chat_id.as_str(),
                format!("#{number} was already decided: {} by {}.", v.outcome().to_lowercase(), v.by_whom()),
            )
        }
        Answered::NotOwner => {
            if !replier.first_click_refusal(&who.sender_id) {
                return;
            }
            // To the clicker's own chat: a group is not told about one member's click.
            (who.sender_id.as_str(), "Only this bot's owner can answer its requests.".to_owned())
        }
        Answered::NotFound(m) | Answered::Failed(m) => (who.chat_id.as_str(), m.clone()),
    };
    if let Err(e) = replier.notice(to, &text).await {
        tracing::warn!(channel = %record.name, error = %e, "A click on an approval card was not answered.");
    }
}

/// Keeps `coffer-callback` matching the running SeaTalk adapters. The coordinator owns one and
/// calls [`CallbackManager::sync`] after every tick.
#[derive(Default)]
pub struct CallbackManager {
    /// What the supervisor was last told: `None` before the first call, then `Some(None)`
    /// (stopped) or `Some(Some(env))` (started with this `COFFER_CALLBACK_SECRETS`).
    last: Option<Option<SecretString>>,
}

impl CallbackManager {
    /// The `COFFER_CALLBACK_SECRETS` value for `signing_secrets`: a JSON object, channel name →
    /// signing secret, keys in order (so the same set gives the same value).
    pub fn secrets_env(signing_secrets: &BTreeMap<String, SecretString>) -> SecretString {
        let map: serde_json::Map<String, Value> =
            signing_secrets.iter().map(|(k, v)| (k.clone(), Value::String(v.expose_secret().to_owned()))).collect();
        SecretString::from(Value::Object(map).to_string())
    }

    /// Starts `coffer-callback` (the supervisor's `StartService`, with its environment: each
    /// channel's signing secret, the port) when `signing_secrets` (channel name → signing
    /// secret) is not empty, restarts it when the set changed since the last call, stops it
    /// (`StopService`) when it is empty. A call with the same set as the last does nothing
    /// (the first call always tells the supervisor, so a restarted chat stops a leftover
    /// listener). The port is the daemon's `COFFER_CALLBACK_PORT`, which the supervisor passes
    /// to coffer-callback itself.
    ///
    /// # Errors
    /// `Unavailable` when the supervisor could not be reached or the listener did not become
    /// healthy (the next tick tries again: nothing is remembered), `Internal` for a refusal.
    pub async fn sync(
        &mut self,
        control: &mut ControlClient<AuthChannel>,
        signing_secrets: &BTreeMap<String, SecretString>,
    ) -> Result<(), ChannelError> {
        let want = (!signing_secrets.is_empty()).then(|| Self::secrets_env(signing_secrets));
        let same = match (&self.last, &want) {
            (Some(None), None) => true,
            (Some(Some(a)), Some(b)) => a.expose_secret() == b.expose_secret(),
            _ => false,
        };
        if same {
            return Ok(());
        }
        let map_err = |s: tonic::Status| match s.code() {
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::FailedPrecondition => {
                ChannelError::Unavailable { platform: "the supervisor", message: s.message().to_owned() }
            }
            _ => ChannelError::Internal(format!("the supervisor refused: {}", s.message())),
        };
        match &want {
            Some(env) => {
                let env = [(coffer_runtime::env::CALLBACK_SECRETS.to_owned(), env.expose_secret().to_owned())].into();
                control
                    .start_service(StartServiceRequest { name: CALLBACK_SERVICE.into(), env })
                    .await
                    .map_err(map_err)?;
                tracing::info!(channels = ?signing_secrets.keys().collect::<Vec<_>>(), "coffer-callback running for these SeaTalk channels.");
            }
            None => {
                control.stop_service(StopServiceRequest { name: CALLBACK_SERVICE.into() }).await.map_err(map_err)?;
                if self.last.as_ref().is_some_and(Option::is_some) {
                    tracing::info!("No SeaTalk channel left; coffer-callback stopped.");
                }
            }
        }
        self.last = Some(want);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_splits_at_paragraphs_in_order_within_the_byte_limit() {
        let para = |c: char, n: usize| std::iter::repeat_n(c, n).collect::<String>();
        let text = format!("{}\n\n{}\n\n{}\n{}", para('a', 3000), para('b', 3000), para('c', 100), para('d', 2000));
        let parts = split_text(&text, TEXT_LIMIT);
        // Cut at the last paragraph break that fits; what follows fits whole; nothing lost.
        let c_d = format!("{}\n{}", para('c', 100), para('d', 2000));
        assert!(
            parts == [para('a', 3000), para('b', 3000), c_d],
            "{:?}",
            parts.iter().map(String::len).collect::<Vec<_>>()
        );
        let lines = format!("{}\n{}", para('x', 4000), para('y', 200));
        assert!(
            split_text(&lines, TEXT_LIMIT) == [para('x', 4000), para('y', 200)],
            "a line break when no paragraph fits"
        );
        // One unbroken run of multi-byte characters is cut at character boundaries.
        let wide = para('é', 5000);
        let parts = split_text(&wide, TEXT_LIMIT);
        assert!(parts.iter().all(|p| p.len() <= TEXT_LIMIT), "{:?}", parts.iter().map(String::len).collect::<Vec<_>>());
        assert_eq!(parts.concat(), wide);
        assert!(split_text("  \n", TEXT_LIMIT).is_empty());
        assert_eq!(split_text("short", TEXT_LIMIT), ["short"]);
    }

    #[test]
    fn the_bots_mention_is_removed_from_a_group_message() {
        let bot = ["Coffer Bot".to_owned()];
        assert_eq!(strip_mentions("@Coffer Bot  what is up?", &bot), "what is up?");
        assert_eq!(strip_mentions("hey @Coffer Bot look", &bot), "hey look");
        assert_eq!(strip_mentions("no mention", &bot), "no mention");
        assert_eq!(strip_mentions("@Coffer Bot", &bot), "");
    }

    fn body(v: Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn single_chat_and_group_mention_events_become_inbound_messages() {
        let single = body(serde_json::json!({
            "event_id": "e1", "event_type": "message_from_bot_subscriber", "timestamp": 1, "app_id": "a",
            "event": { "seatalk_id": "9", "employee_code": "E100", "email": "o@example.com",
                       "message": { "message_id": "m1", "tag": "text", "text": { "content": " hello " } } }
        }));
        let Event::Message { event_id, inbound } = parse_event("st", &single).unwrap() else { panic!() };
        assert_eq!(event_id, "e1");
        assert_eq!(
            inbound,
            Inbound {
                channel: "st".into(),
                chat_id: "E100".into(),
                sender_id: "E100".into(),
                sender_display: "o@example.com".into(),
                text: "hello".into(),
                message_id: "m1".into(),
                group: false,
            }
        );
        let group = body(serde_json::json!({
            "event_id": "e2", "event_type": "new_mentioned_message_received_from_group_chat", "timestamp": 1,
            "event": { "group_id": "G7", "message": { "message_id": "m2", "tag": "text",
                "sender": { "employee_code": "E100", "email": "" },
                "text": { "plain_text": "@Coffer ship it", "mentioned_list": [{ "username": "Coffer", "seatalk_id": "1" }] } } }
        }));
        let Event::Message { inbound, .. } = parse_event("st", &group).unwrap() else { panic!() };
        assert_eq!(
            (inbound.chat_id.as_str(), inbound.sender_id.as_str(), inbound.text.as_str(), inbound.group),
            ("G7", "E100", "ship it", true)
        );
        assert_eq!(inbound.sender_display, "E100");
    }

    #[test]
    fn malformed_and_other_events_are_named_or_ignored() {
        assert!(matches!(parse_event("st", b"{not json"), Err(EventError::Json(_))));
        assert_eq!(parse_event("st", b"{}"), Err(EventError::Missing("event_id (1-256 bytes)")));
        let long_id = body(serde_json::json!({ "event_id": "x".repeat(257), "event_type": "t" }));
        assert_eq!(parse_event("st", &long_id), Err(EventError::Missing("event_id (1-256 bytes)")));
        let no_sender =
            body(serde_json::json!({ "event_id": "e", "event_type": "message_from_bot_subscriber", "event": {} }));
        assert_eq!(parse_event("st", &no_sender), Err(EventError::Missing("event.employee_code")));
        let other = body(serde_json::json!({ "event_id": "e", "event_type": "bot_added_to_group_chat", "event": {} }));
        assert!(matches!(parse_event("st", &other), Ok(Event::Ignored { .. })));
        let video = body(serde_json::json!({ "event_id": "e", "event_type": "message_from_bot_subscriber",
            "event": { "employee_code": "E", "message": { "tag": "video", "video": { "content": "u" } } } }));
        match parse_event("st", &video) {
            Ok(Event::Unsupported { inbound, tag, .. }) => {
                assert_eq!((tag.as_str(), inbound.chat_id.as_str(), inbound.group), ("video", "E", false));
            }
            other => panic!("a video is a message that is not read: {other:?}"),
        }
        let file =
            body(serde_json::json!({ "event_id": "e", "event_type": "new_mentioned_message_received_from_group_chat",
            "event": { "group_id": "G", "message": { "tag": "file", "sender": { "employee_code": "E" } } } }));
        assert!(matches!(parse_event("st", &file), Ok(Event::Unsupported { inbound, .. }) if inbound.group));
        let no_tag = body(serde_json::json!({ "event_id": "e", "event_type": "message_from_bot_subscriber",
            "event": { "employee_code": "E", "message": {} } }));
        assert!(matches!(parse_event("st", &no_tag), Ok(Event::Unsupported { tag, .. }) if tag.is_empty()));
        let empty = body(serde_json::json!({ "event_id": "e", "event_type": "message_from_bot_subscriber",
            "event": { "employee_code": "E", "message": { "tag": "text", "text": { "content": "  " } } } }));
        assert!(matches!(parse_event("st", &empty), Ok(Event::Ignored { .. })));
    }

    #[test]
    fn images_and_files_in_a_private_chat_are_files_to_fetch() {
        let image = body(serde_json::json!({ "event_id": "e1", "event_type": "message_from_bot_subscriber",
            "event": { "employee_code": "E", "email": "e@x", "message": { "message_id": "m", "tag": "image",
                "image": { "content": "https://openapi.seatalk.io/messaging/v2/file/abc" } } } }));
        let Ok(Event::Files { inbound, files, .. }) = parse_event("st", &image) else { panic!("an image is a file") };
        assert_eq!((inbound.chat_id.as_str(), inbound.text.as_str(), inbound.group), ("E", "", false));
        assert_eq!(
            files,
            [FileRef {
                url: "https://openapi.seatalk.io/messaging/v2/file/abc".into(),
                name: "image".into(),
                image: true
            }]
        );
        let file = body(serde_json::json!({ "event_id": "e2", "event_type": "message_from_bot_subscriber",
            "event": { "employee_code": "E", "message": { "tag": "file",
                "file": { "content": "u", "filename": "../../r.pdf" } } } }));
        let Ok(Event::Files { files, .. }) = parse_event("st", &file) else { panic!("a file") };
        assert_eq!((files[0].name.as_str(), files[0].image), ("../../r.pdf", false), "sanitised when saved");
        // Without a link: still the owner's file to refuse (the download says why).
        let bare = body(serde_json::json!({ "event_id": "e3", "event_type": "message_from_bot_subscriber",
            "event": { "employee_code": "E", "message": { "tag": "image" } } }));
        assert!(matches!(parse_event("st", &bare), Ok(Event::Files { files, .. }) if files[0].url.is_empty()));
    }

    #[test]
    fn a_card_click_names_who_where_and_the_value() {
        let click = |group: &str, value: &str| {
            body(serde_json::json!({ "event_id": "c1", "event_type": "interactive_message_click", "timestamp": 1,
                "event": { "message_id": "card-1", "employee_code": "E1", "email": "o@x", "value": value,
                    "seatalk_id": "9", "group_id": group, "thread_id": "" } }))
        };
        let Ok(Event::Click { who, value, .. }) = parse_event("st", &click("", "ap:c:7:d")) else { panic!() };
        assert_eq!(value, "ap:c:7:d");
        assert_eq!(
            (who.chat_id.as_str(), who.sender_id.as_str(), who.message_id.as_str(), who.group),
            ("E1", "E1", "card-1", false)
        );
        let Ok(Event::Click { who, .. }) = parse_event("st", &click("G1", "v")) else { panic!() };
        assert_eq!((who.chat_id.as_str(), who.group), ("G1", true), "a group's click is the group's");
        assert_eq!(parse_event("st", &click("", "")), Err(EventError::Missing("event.value (1-256 bytes)")));
        assert!(parse_event("st", &click("", &"v".repeat(257))).is_err());
        let anonymous = body(serde_json::json!({ "event_id": "c", "event_type": "interactive_message_click",
            "event": { "value": "v" } }));
        assert_eq!(parse_event("st", &anonymous), Err(EventError::Missing("event.employee_code")));
    }

    #[test]
    fn approval_cards_carry_the_request_its_buttons_then_the_decision() {
        let mut v = super::super::ApprovalView {
            conversation_id: "01JCONV".into(),
            number: 42,
            tool: "Bash".into(),
            summary: "Bash: rm -rf build".into(),
            detail: "rm -rf build".into(),
            decided: None,
        };
        let card = approval_card(&v);
        assert_eq!(card[0]["title"]["text"], "Waiting for your approval");
        let text = card[1]["description"]["text"].as_str().unwrap();
        assert!(text.starts_with("Bash `rm -rf build` (#42)") && text.contains("/deny 42"), "{text}");
        let buttons: Vec<(&str, &str)> = card[2..]
            .iter()
            .map(|b| (b["button"]["text"].as_str().unwrap(), b["button"]["value"].as_str().unwrap()))
            .collect();
        assert_eq!(buttons, [("Allow", "ap:01JCONV:42:a"), ("Deny", "ap:01JCONV:42:d"), ("Always", "ap:01JCONV:42:A")]);
        assert!(card[2..].iter().all(|b| b["button"]["button_type"] == "callback"));
        for (_, value) in buttons {
            assert!(
                super::super::telegram::parse_callback_data(value).is_some_and(|(c, n, _)| c == "01JCONV" && n == 42)
            );
        }
        v.decided = Some(super::super::Decided {
            decision: "deny".into(),
            decided_by: "web".into(),
            actor: String::new(),
            message: "not now".into(),
        });
        let card = approval_card(&v);
        assert_eq!(card.len(), 2, "no buttons once decided: {card:?}");
        assert_eq!(card[0]["title"]["text"], "Denied");
        let text = card[1]["description"]["text"].as_str().unwrap();
        assert!(text.contains("by the web console") && text.contains("The agent was told: not now"), "{text}");
    }

    #[test]
    fn only_this_apps_file_urls_are_fetched_and_content_types_are_checked() {
        let c = Client::new("http://127.0.0.1:4000", SecretString::from("a"), SecretString::from("b"));
        assert!(c.is_file_url("http://127.0.0.1:4000/messaging/v2/file/abc"));
        assert!(c.is_file_url("http://127.0.0.1:4000/messaging/v2/file/abc?seq=2"));
        for bad in [
            "",
            "not a url",
            "http://127.0.0.1:4001/messaging/v2/file/abc",
            "https://127.0.0.1:4000/messaging/v2/file/abc",
            "http://evil.example/messaging/v2/file/abc",
            "http://127.0.0.1:4000/messaging/v2/file/",
            "http://127.0.0.1:4000/messaging/v2/single_chat",
            "http://user:pw@127.0.0.1:4000/messaging/v2/file/abc",
            "http://127.0.0.1:4000/messaging/v2/filex/abc",
        ] {
            assert!(!c.is_file_url(bad), "{bad}");
        }
        let public = Client::new("", SecretString::from("a"), SecretString::from("b"));
        assert!(public.is_file_url("https://openapi.seatalk.io/messaging/v2/file/asjewnJHe7dfjs"));
        assert!(!public.is_file_url("http://openapi.seatalk.io/messaging/v2/file/asjewnJHe7dfjs"));
        assert_eq!(media_type("Text/Plain; charset=utf-8"), "text/plain");
        assert_eq!(media_type("image/png"), "image/png");
        for bad in ["", "text", "text/", "/plain", "te xt/plain", "text/pl\u{0}ain", "a/b/c"] {
            assert_eq!(media_type(bad), "", "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_link_outside_the_api_is_refused_before_any_request() {
        // An unreachable base: any request would fail as `Failed`, not `NotAFile`.
        let c = Client::new("http://127.0.0.1:9", SecretString::from("a"), SecretString::from("b"));
        let got = c.download("http://127.0.0.1:1/messaging/v2/file/x", 10).await;
        assert_eq!(got, Err(DownloadError::NotAFile));
    }

    #[test]
    fn a_turn_ends_with_its_text_or_a_short_notice() {
        let view = |text: &str, state| TurnView { text: text.into(), state, ..Default::default() };
        let done = TurnState::Done { stop_reason: "end_turn".into() };
        assert_eq!(SeatalkReplier::final_text(&view("**hi**", done.clone())), ("**hi**".into(), Format::Markdown));
        assert_eq!(SeatalkReplier::final_text(&view("", done)).1, Format::Plain);
        assert_eq!(SeatalkReplier::final_text(&view("", TurnState::Interrupted)), ("Stopped.".into(), Format::Plain));
        let failed = SeatalkReplier::final_text(&view("x", TurnState::Failed { message: "agent exited".into() }));
        assert_eq!(failed, ("The turn failed: agent exited".into(), Format::Plain));
    }

    #[test]
    fn bodies_left_in_a_stopping_adapters_inbox_go_to_its_successor_in_order() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        tx.try_send(b"one".to_vec()).unwrap();
        tx.try_send(b"two".to_vec()).unwrap();
        carry_over("carry-test", &mut rx);
        assert!(tx.try_send(b"late".to_vec()).is_err(), "a closed inbox refuses late deliveries");
        assert_eq!(carried_take("carry-test"), [b"one".to_vec(), b"two".to_vec()]);
        assert!(carried_take("carry-test").is_empty(), "taken once");
        let (_tx, mut empty) = tokio::sync::mpsc::channel::<Vec<u8>>(1);
        carry_over("carry-test-2", &mut empty);
        assert!(carried_take("carry-test-2").is_empty());
    }

    #[test]
    fn the_callback_env_is_one_json_object_in_channel_order() {
        let s: BTreeMap<_, _> =
            [("b".to_owned(), SecretString::from("2")), ("a".to_owned(), SecretString::from("1\"x"))].into();
        assert_eq!(CallbackManager::secrets_env(&s).expose_secret(), r#"{"a":"1\"x","b":"2"}"#);
    }
}
