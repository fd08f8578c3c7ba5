//! The Telegram adapter (see [`super`]): Bot API long polling.
//!
//! - **Polling.** `getMe` once (the status's `bot_username`), then `getUpdates` with
//!   `timeout` [`POLL_TIMEOUT_S`], `allowed_updates: ["message", "edited_message",
//!   "callback_query"]` and
//!   `offset` = the record's
//!   `cursor`. A batch is handled in order, then `SetCursor(last update_id + 1)` persists the
//!   offset; an update below the cursor (redelivered after a crash between the two) is skipped,
//!   so none is handled twice. Cancellation is heard only between batches.
//! - **Faults.** 5xx, timeouts and refused connections back off exponentially
//!   ([`BACKOFF_FIRST`] doubling to [`BACKOFF_MAX`], state `backoff` with `retry_at_ms`); a 429
//!   waits its `parameters.retry_after`; 401/404 (the token) leave the adapter `failed` until
//!   the coordinator restarts it; 409 Conflict (another `getUpdates` poller or a webhook on the
//!   same bot token) shows `failed` naming that cause, with `retry_at_ms`, and is tried again
//!   with the same backoff (the other poller may go away).
//! - **Replies** ([`TelegramReplier`]): a turn gets one progress message ("…", then
//!   `editMessageText` at most once per [`EDIT_INTERVAL`] per chat, unchanged text skipped),
//!   then its final text split by [`format::split`] and rendered by [`format::to_html`]
//!   (`parse_mode: HTML`; a 400 "can't parse entities" falls back to plain text), the first
//!   piece replacing the progress message. A progress message still open when the adapter
//!   stops (disabled or restarted mid-turn) is ended with [`STOPPED_NOTE`], not left on "…".
//!   Open progress messages are kept on disk ([`journal`]): after a crash of `coffer-chat` the
//!   next adapter finishes each with the text it showed and the turn's failure. A long answer
//!   keeps its start: past [`PROGRESS_CHARS`] a piece is settled in the progress message and
//!   the answer goes on in a new one ([`long`]).
//! - **Approvals** ([`TelegramReplier`]'s `approval`): a request is a new message (it
//!   notifies) "Waiting for your approval: Bash `rm -rf build`" with inline buttons Allow /
//!   Deny / Always whose `callback_data` is [`callback_data`] (`ap:<conversation>:<number>:<a|d|A>`,
//!   at most 52 bytes of Telegram's 64). A press (`callback_query`) goes to
//!   [`Bridge::answer`] (only the paired owner, only this chat's conversation); the query is
//!   answered with the outcome ("Denied.", "Already decided: allowed by the web console.", a
//!   refusal for anyone else). Every decision, whoever made it (a button, `/allow N`, the
//!   console, the timeout), edits the request's message to say it and who, without buttons.
//! - **Photos and files** ([`with_files`], [`download`]): a `photo` (the largest size within
//!   `chat.attachment_max_bytes`) or a `document`, its caption the message text, is fetched
//!   from the owner's chat only (the owner gate runs first: [`Bridge::handle_files`]) with
//!   `getFile` and `GET {base}/file/bot<token>/<file_path>` (read at most the limit), and sent
//!   to the agent as an attachment ([`crate::attachments`]). Past the limit the chat is told
//!   which limit and nothing reaches the agent.
//! - **Not text.** A sticker, voice message, video or an edit is not run: the owner is told
//!   [`ONLY_TEXT`] once per chat per adapter run ([`Bridge::unsupported`]); others are refused
//!   as for text.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_runtime::Backoff;
use futures_util::future::BoxFuture;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use super::bridge::{Answered, Bridge};
use super::{AdapterCtx, AdapterHandle, ApprovalView, ChannelError, Inbound, Replier, StatusCell, TurnState, TurnView};

#[path = "telegram_format.rs"]
pub mod format;
#[path = "telegram_journal.rs"]
pub mod journal;
#[path = "telegram_long.rs"]
pub mod long;

/// The public Bot API.
pub const DEFAULT_API: &str = "https://api.telegram.org";
/// `getUpdates`' long-poll timeout, seconds.
pub const POLL_TIMEOUT_S: u64 = 30;
/// The HTTP timeout beyond a long poll's own.
const POLL_SLACK: Duration = Duration::from_secs(15);
/// Timeout of every other call.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// First backoff after a failure, doubled each time up to [`BACKOFF_MAX`].
pub const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// Longest backoff.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Least time between two edits of one chat's messages (the Bot API's ~1 message/s per chat).
pub const EDIT_INTERVAL: Duration = Duration::from_secs(1);
/// Tries of one send or edit on 429 / 5xx before it is given up.
const SEND_TRIES: u32 = 5;
/// Longest 429 wait honoured inside a reply (a longer one gives the message up).
const MAX_RETRY_AFTER: u64 = 120;
/// Most characters of a turn's text one progress message shows: past it a piece is settled
/// and the answer continues in a new message ([`long`]).
pub const PROGRESS_CHARS: usize = 3500;
const PLATFORM: &str = "Telegram";

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A small Bot API client: `POST {base}/bot{token}/{method}` with a JSON body, answers
/// `{ok, result}` or `{ok: false, error_code, description, parameters: {retry_after}}`.
pub struct Api {
    http: reqwest::Client,
    base: String,
    token: SecretString,
}

#[derive(Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default)]
    result: Value,
    #[serde(default)]
    error_code: u16,
    #[serde(default)]
    description: String,
    #[serde(default)]
    parameters: Option<Params>,
}

#[derive(Deserialize)]
struct Params {
    #[serde(default)]
    retry_after: Option<u64>,
}

/// One `Update` (`message`, `edited_message` and `callback_query` are asked for; an edit is
/// answered with a note, not run).
#[derive(Debug, Deserialize)]
pub struct Update {
    pub update_id: i64,
    #[serde(default)]
    pub message: Option<Message>,
    #[serde(default)]
    pub edited_message: Option<Message>,
    #[serde(default)]
    pub callback_query: Option<CallbackQuery>,
}

/// A `CallbackQuery`: an inline keyboard button pressed (`data` is the button's
/// `callback_data`; `message` the bot message it was under, absent when too old).
#[derive(Debug, Deserialize)]
pub struct CallbackQuery {
    pub id: String,
    pub from: User,
    #[serde(default)]
    pub message: Option<Message>,
    #[serde(default)]
    pub data: Option<String>,
}

/// The `callback_data` of an approval button: `ap:<conversation>:<number>:<a|d|A>` (allow,
/// deny, allow always); 52 bytes at most for a 26-character conversation id.
pub fn callback_data(conversation: &str, number: u64, decision: &str) -> String {
    let d = match decision {
        "allow" => "a",
        "allow_always" => "A",
        _ => "d",
    };
    format!("ap:{conversation}:{number}:{d}")
}

/// The (conversation, number, decision) of an approval button's `callback_data`.
pub fn parse_callback_data(data: &str) -> Option<(String, u64, &'static str)> {
    let mut parts = data.strip_prefix("ap:")?.split(':');
    let (conv, number, d) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || conv.is_empty() || conv.len() > 40 {
        return None;
    }
    let decision = match d {
        "a" => "allow",
        "A" => "allow_always",
        "d" => "deny",
        _ => return None,
    };
    Some((conv.to_owned(), number.parse().ok()?, decision))
}

/// The parts of a `Message` the adapter reads.
#[derive(Debug, Deserialize)]
pub struct Message {
    pub message_id: i64,
    #[serde(default)]
    pub from: Option<User>,
    pub chat: Chat,
    #[serde(default)]
    pub text: Option<String>,
    /// A photo's or document's caption (the message's text then).
    #[serde(default)]
    pub caption: Option<String>,
    /// A photo: the sizes Telegram made of it, smallest first.
    #[serde(default)]
    pub photo: Option<Vec<PhotoSize>>,
    /// A file sent as a document.
    #[serde(default)]
    pub document: Option<Document>,
}

/// One size of a photo (`PhotoSize`).
#[derive(Debug, Clone, Deserialize)]
pub struct PhotoSize {
    pub file_id: String,
    #[serde(default)]
    pub width: u32,
    #[serde(default)]
    pub height: u32,
    /// Bytes, when Telegram says.
    #[serde(default)]
    pub file_size: Option<u64>,
}

/// A `Document` (any file).
#[derive(Debug, Clone, Deserialize)]
pub struct Document {
    pub file_id: String,
    #[serde(default)]
    pub file_name: Option<String>,
    #[serde(default)]
    pub mime_type: Option<String>,
    #[serde(default)]
    pub file_size: Option<u64>,
}

/// A `User`.
#[derive(Debug, Deserialize)]
pub struct User {
    pub id: i64,
    #[serde(default)]
    pub is_bot: bool,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub first_name: String,
}

/// A `Chat`.
#[derive(Debug, Deserialize)]
pub struct Chat {
    pub id: i64,
    #[serde(rename = "type", default)]
    pub kind: String,
}

impl Api {
    /// A client of the Bot API at `base` (empty: [`DEFAULT_API`]) for `token`.
    pub fn new(base: &str, token: SecretString) -> Self {
        coffer_runtime::tls::ensure_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .build()
            .unwrap_or_default();
        let base = if base.trim().is_empty() { DEFAULT_API } else { base.trim() };
        Self { http, base: base.trim_end_matches('/').to_owned(), token }
    }

    /// Calls `method`; the errors never carry the token (the URL is dropped from them).
    ///
    /// # Errors
    /// [`ChannelError::RateLimited`] (429), [`ChannelError::Auth`] (401, 404: the bot token was
    /// refused), [`ChannelError::Conflict`] (409: another poller of the token),
    /// [`ChannelError::Unavailable`] (5xx, timeouts, no connection, an unreadable
    /// answer), [`ChannelError::Rejected`] (other 4xx, with Telegram's description).
    pub async fn call(&self, method: &str, body: &Value, timeout: Duration) -> Result<Value, ChannelError> {
        let url = format!("{}/bot{}/{method}", self.base, self.token.expose_secret());
        let unavailable = |e: reqwest::Error| ChannelError::Unavailable {
            platform: PLATFORM,
            message: format!("{method} at {}: {}", self.base, describe(e)),
        };
        let resp = self.http.post(url).timeout(timeout).json(body).send().await.map_err(unavailable)?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(unavailable)?;
        let answer: Option<Answer> = serde_json::from_slice(&bytes).ok();
        match answer {
            Some(a) if a.ok => Ok(a.result),
            a => {
                let (code, description, retry) = match a {
                    Some(a) => {
                        let code = if a.error_code == 0 { status } else { a.error_code };
                        (code, a.description, a.parameters.and_then(|p| p.retry_after))
                    }
                    None => (status, format!("HTTP {status} without a Bot API answer"), None),
                };
                Err(classify(method, code, &description, retry))
            }
        }
    }

    /// `getMe`: the bot's username.
    ///
    /// # Errors
    /// As [`Api::call`].
    pub async fn get_me(&self) -> Result<String, ChannelError> {
        let me = self.call("getMe", &json!({}), CALL_TIMEOUT).await?;
        Ok(me.get("username").and_then(Value::as_str).unwrap_or_default().to_owned())
    }

    /// `getUpdates` from `offset`, waiting up to [`POLL_TIMEOUT_S`].
    ///
    /// # Errors
    /// As [`Api::call`].
    pub async fn get_updates(&self, offset: i64) -> Result<Vec<Update>, ChannelError> {
        let mut body = json!({ "timeout": POLL_TIMEOUT_S,
            "allowed_updates": ["message", "edited_message", "callback_query"] });
        if offset > 0 {
            body["offset"] = json!(offset);
        }
        let timeout = Duration::from_secs(POLL_TIMEOUT_S) + POLL_SLACK;
        let result = self.call("getUpdates", &body, timeout).await?;
        // One malformed update must not stall the rest: each is read on its own.
        let list = result.as_array().cloned().unwrap_or_default();
        Ok(list
            .into_iter()
            .filter_map(|u| match serde_json::from_value::<Update>(u.clone()) {
                Ok(up) => Some(up),
                Err(e) => {
                    let id = u.get("update_id").and_then(Value::as_i64)?;
                    tracing::warn!(update_id = id, error = %e, "An unreadable Telegram update was skipped.");
                    Some(Update { update_id: id, message: None, edited_message: None, callback_query: None })
                }
            })
            .collect())
    }
}

/// A transport error with its causes ("error sending request: … connection refused"), without
/// the URL (it holds the token).
fn describe(e: reqwest::Error) -> String {
    let timeout = e.is_timeout();
    let e = e.without_url();
    let mut out = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !out.contains(&c_text) {
            out.push_str(": ");
            out.push_str(&c_text);
        }
        cause = c.source();
    }
    if timeout && !out.contains("timed out") {
        out.push_str(" (timed out)");
    }
    out
}

/// A failed call, classified.
fn classify(method: &str, code: u16, description: &str, retry_after: Option<u64>) -> ChannelError {
    match code {
        429 => ChannelError::RateLimited { platform: PLATFORM, retry_after_s: retry_after.unwrap_or(1).max(1) },
        401 | 404 => ChannelError::Auth { platform: PLATFORM, message: "the bot token was refused".into() },
        409 => ChannelError::Conflict {
            platform: PLATFORM,
            message: format!(
                "{method}: 409 {} — another program or Coffer channel polls the same bot token (or a webhook \
                 is set); Telegram serves one poller per bot: give each channel its own bot (@BotFather) or \
                 stop the other one",
                description.chars().take(200).collect::<String>()
            ),
        },
        500..=599 => {
            ChannelError::Unavailable { platform: PLATFORM, message: format!("{method}: {code} {description}") }
        }
        _ => ChannelError::Rejected { platform: PLATFORM, message: format!("{method}: {code} {description}") },
    }
}

/// Telegram's chat id as JSON: a number when it is one.
fn chat_ref(chat_id: &str) -> Value {
    chat_id.parse::<i64>().map_or_else(|_| json!(chat_id), |n| json!(n))
}

/// An update as the bridge reads it; `None` for what is not a person's text message in a
/// private chat with the bot. Groups are not served at all, the owner's messages there included:
/// an agent with the owner's permissions would post what it reads (files, notes) to everyone in
/// the group.
pub fn inbound(channel: &str, bot_username: &str, u: &Update) -> Option<Inbound> {
    let m = u.message.as_ref()?;
    let from = m.from.as_ref()?;
    if from.is_bot || m.chat.kind != "private" {
        return None;
    }
    let mut text = m.text.clone()?;
    if !bot_username.is_empty() {
        text = text.replace(&format!("@{bot_username} "), "").replace(&format!("@{bot_username}"), "");
    }
    let display = from.username.as_ref().map_or_else(|| from.first_name.clone(), |u| format!("@{u}"));
    Some(Inbound {
        channel: channel.to_owned(),
        chat_id: m.chat.id.to_string(),
        sender_id: from.id.to_string(),
        sender_display: display,
        text: text.trim().to_owned(),
        message_id: m.message_id.to_string(),
        group: m.chat.kind != "private",
    })
}

/// What the adapter answers (once per chat per run) to a message it cannot run.
pub const ONLY_TEXT: &str = "Only text messages, photos and files are read: stickers, voice messages, videos and edited messages are not. Send your request as a new message.";

/// A message from a person in a private chat that is not a text message the adapter runs: a
/// photo, sticker, file, voice message… (no `text`), or an edit of an earlier message. Returned
/// as an [`Inbound`] with empty text, for [`Bridge::unsupported`] (owner gate, one note).
pub fn unsupported(channel: &str, u: &Update) -> Option<Inbound> {
    let m = match (&u.message, &u.edited_message) {
        (Some(m), _) if m.text.is_none() && m.photo.is_none() && m.document.is_none() => m,
        (None, Some(m)) => m,
        _ => return None,
    };
    let from = m.from.as_ref()?;
    if from.is_bot || m.chat.kind != "private" {
        return None;
    }
    let display = from.username.as_ref().map_or_else(|| from.first_name.clone(), |u| format!("@{u}"));
    Some(Inbound {
        channel: channel.to_owned(),
        chat_id: m.chat.id.to_string(),
        sender_id: from.id.to_string(),
        sender_display: display,
        text: String::new(),
        message_id: m.message_id.to_string(),
        group: false,
    })
}

/// A file of a message to fetch: its Bot API `file_id`, the name and type it is saved under,
/// and its size when Telegram said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRef {
    pub file_id: String,
    pub name: String,
    pub mime: String,
    pub size: Option<u64>,
}

/// What a message's files are, before any download: `Ok(None)` when it has none, `Err` with the
/// owner's explanation when none fits `max_bytes` (a photo all of whose sizes are larger, a
/// document Telegram says is larger).
///
/// # Errors
/// The refusal text, naming the limit and its setting.
pub fn files_of(m: &Message, max_bytes: u64) -> Result<Option<Vec<FileRef>>, String> {
    use crate::attachments::human;
    let over = |what: &str, size: u64| {
        format!(
            "{what} is {}, over the limit of {} per file (chat.attachment_max_bytes); nothing was sent to the agent.",
            human(size),
            human(max_bytes)
        )
    };
    if let Some(sizes) = &m.photo {
        // Telegram lists sizes smallest first; the largest that fits is taken.
        let mut fitting: Vec<&PhotoSize> =
            sizes.iter().filter(|p| p.file_size.is_none_or(|s| s <= max_bytes)).collect();
        fitting.sort_by_key(|p| (p.width as u64 * p.height as u64, p.file_size.unwrap_or(0)));
        let Some(best) = fitting.last() else {
            let smallest = sizes.iter().filter_map(|p| p.file_size).min().unwrap_or(0);
            return Err(over("The photo (even its smallest size)", smallest));
        };
        // Telegram's photos are JPEG; the saved name's extension follows the bytes.
        let f = FileRef {
            file_id: best.file_id.clone(),
            name: "photo.jpg".into(),
            mime: "image/jpeg".into(),
            size: best.file_size,
        };
        return Ok(Some(vec![f]));
    }
    if let Some(d) = &m.document {
        let name = d.file_name.clone().unwrap_or_else(|| "file".into());
        if let Some(size) = d.file_size.filter(|s| *s > max_bytes) {
            return Err(over(&format!("The file {name}"), size));
        }
        let f = FileRef {
            file_id: d.file_id.clone(),
            name,
            mime: d.mime_type.clone().unwrap_or_default(),
            size: d.file_size,
        };
        return Ok(Some(vec![f]));
    }
    Ok(None)
}

/// A photo or document message from a person in a private chat: the message (its text the
/// caption, without the bot's mention) and what [`files_of`] says of its files. `None` for
/// anything else.
pub fn with_files(
    channel: &str,
    bot_username: &str,
    u: &Update,
    max_bytes: u64,
) -> Option<(Inbound, Result<Vec<FileRef>, String>)> {
    let m = u.message.as_ref()?;
    let from = m.from.as_ref()?;
    if from.is_bot || m.chat.kind != "private" || (m.photo.is_none() && m.document.is_none()) {
        return None;
    }
    let mut text = m.caption.clone().unwrap_or_default();
    if !bot_username.is_empty() {
        text = text.replace(&format!("@{bot_username} "), "").replace(&format!("@{bot_username}"), "");
    }
    let display = from.username.as_ref().map_or_else(|| from.first_name.clone(), |u| format!("@{u}"));
    let msg = Inbound {
        channel: channel.to_owned(),
        chat_id: m.chat.id.to_string(),
        sender_id: from.id.to_string(),
        sender_display: display,
        text: text.trim().to_owned(),
        message_id: m.message_id.to_string(),
        group: false,
    };
    let files = files_of(m, max_bytes).map(Option::unwrap_or_default);
    Some((msg, files))
}

/// Fetches `files` (`getFile`, then the file's bytes from `{base}/file/bot<token>/<file_path>`),
/// reading at most `max_bytes` of each.
///
/// # Errors
/// What to tell the owner: a file over the limit (nothing is kept), or Telegram refusing or
/// failing the download. Never the token.
pub async fn download(
    api: &Api,
    files: Vec<FileRef>,
    max_bytes: u64,
) -> Result<Vec<coffer_proto::chat::AttachmentUpload>, String> {
    use crate::attachments::human;
    use futures_util::StreamExt as _;
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let info = api
            .call("getFile", &json!({ "file_id": f.file_id }), CALL_TIMEOUT)
            .await
            .map_err(|e| format!("Could not fetch {} from Telegram ({e}); nothing was sent to the agent.", f.name))?;
        let size = info.get("file_size").and_then(Value::as_u64).or(f.size);
        let over = |size: u64| {
            format!(
                "The file {} is {}, over the limit of {} per file (chat.attachment_max_bytes); nothing was sent to the agent.",
                f.name,
                human(size),
                human(max_bytes)
            )
        };
        if let Some(s) = size.filter(|s| *s > max_bytes) {
            return Err(over(s));
        }
        let Some(path) = info.get("file_path").and_then(Value::as_str).filter(|p| !p.is_empty()) else {
            return Err(format!("Telegram gave no download path for {}; nothing was sent to the agent.", f.name));
        };
        let url = format!("{}/file/bot{}/{}", api.base, api.token.expose_secret(), path.trim_start_matches('/'));
        let failed = |e: reqwest::Error| {
            format!("Could not download {} from Telegram ({}); nothing was sent to the agent.", f.name, describe(e))
        };
        let resp = api.http.get(url).timeout(DOWNLOAD_TIMEOUT).send().await.map_err(failed)?;
        if !resp.status().is_success() {
            return Err(format!(
                "Telegram answered {} to the download of {}; nothing was sent to the agent.",
                resp.status().as_u16(),
                f.name
            ));
        }
        let mut data = Vec::new();
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            data.extend_from_slice(&chunk.map_err(failed)?);
            if data.len() as u64 > max_bytes {
                return Err(over(data.len() as u64));
            }
        }
        out.push(coffer_proto::chat::AttachmentUpload { name: f.name, mime: f.mime, data });
    }
    Ok(out)
}

/// Timeout of one file download.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// The note that ends a progress message the adapter stops following before its turn ended.
pub const STOPPED_NOTE: &str = "(Stopped here: this channel's adapter stopped — disabled or restarted. The whole reply is in Coffer's web console.)";

/// How an adapter shows things in Telegram chats.
pub struct TelegramReplier {
    api: Arc<Api>,
    status: Arc<StatusCell>,
    /// When each chat's messages may next be edited or sent (throttling across turns).
    next_slot: Mutex<HashMap<String, Instant>>,
    /// Progress messages of turns not shown to their end yet, by chat (kept in `journal`).
    open: Mutex<journal::Open>,
    /// Where `open` is kept on disk for the next run after a crash (set by [`run`]).
    journal: std::sync::OnceLock<journal::Journal>,
    /// Approval request messages, by (conversation, number): (chat, message id). Edited when
    /// the request is decided; a request already here is not sent again (a replay).
    approvals: Mutex<HashMap<(String, u64), (String, i64)>>,
}

/// Approval messages remembered per adapter run (the oldest are forgotten beyond: their
/// decision is then not shown on them).
const MAX_APPROVAL_MESSAGES: usize = 4096;

fn is_unmodified(e: &ChannelError) -> bool {
    matches!(e, ChannelError::Rejected { message, .. } if message.contains("message is not modified"))
}

fn is_parse_error(e: &ChannelError) -> bool {
    matches!(e, ChannelError::Rejected { message, .. } if message.to_ascii_lowercase().contains("can't parse entities"))
}

impl TelegramReplier {
    /// A replier over `api`, recording outbound times in `status`.
    pub fn new(api: Arc<Api>, status: Arc<StatusCell>) -> Arc<Self> {
        Arc::new(Self {
            api,
            status,
            next_slot: Mutex::new(HashMap::new()),
            open: Mutex::new(journal::Open::new()),
            journal: std::sync::OnceLock::new(),
            approvals: Mutex::new(HashMap::new()),
        })
    }

    fn open(&self) -> std::sync::MutexGuard<'_, journal::Open> {
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps the open progress messages in `j` from now on.
    pub fn keep_journal(&self, j: journal::Journal) {
        let _ = self.journal.set(j);
    }

    /// Writes the open progress messages to the journal, if one is kept.
    fn save_open(&self) {
        if let Some(j) = self.journal.get() {
            j.save(&self.open());
        }
    }

    /// Finishes the progress messages a previous run of this channel left open (it was killed
    /// mid-turn): each is edited to the text it showed and a one-line reason — the failure
    /// stored on its conversation's newest assistant message (the restart marked the cut turn
    /// `failed`), else [`journal::CRASHED_NOTE`]. Each edit is tried with the usual retries; one
    /// that fails is logged and left.
    pub async fn finish_left(&self, engine: &crate::engine::Engine, left: journal::Open) {
        for (chat_id, p) in left {
            let page = engine
                .store()
                .messages(coffer_proto::store::ListMessagesRequest {
                    conversation_id: p.conversation_id.clone(),
                    limit: 10,
                    newest: true,
                    ..Default::default()
                })
                .await;
            let error = page.ok().and_then(|page| {
                let m = page
                    .messages
                    .iter()
                    .rev()
                    .find(|m| m.role == coffer_proto::store::MessageRole::Assistant as i32)?;
                (m.status == coffer_proto::store::MessageStatus::Failed as i32).then(|| m.error.clone())
            });
            let text = journal::finished_text(&p.shown, &journal::reason(error.as_deref()));
            self.slot(&chat_id).await;
            let body = json!({ "chat_id": chat_ref(&chat_id), "message_id": p.message_id, "text": text });
            match self.send("editMessageText", &body).await {
                Ok(_) => {}
                Err(e) if is_unmodified(&e) => {}
                Err(e) => tracing::warn!(error = %e, "Cannot finish a progress message left open by a crash."),
            }
        }
    }

    /// Ends every progress message left open (the bridge was dropped mid-turn: the adapter is
    /// stopping) with [`STOPPED_NOTE`] instead of a lasting "…", each edit tried once within
    /// `within` in all.
    pub async fn finish_open(&self, within: Duration) {
        let open: Vec<(String, journal::OpenProgress)> = std::mem::take(&mut *self.open()).into_iter().collect();
        if open.is_empty() {
            return;
        }
        let edits = async {
            for (chat_id, journal::OpenProgress { message_id, shown, .. }) in open {
                let so_far = shown.trim_end_matches('…').trim_end();
                let text =
                    if so_far.is_empty() { STOPPED_NOTE.to_owned() } else { format!("{so_far}\n\n{STOPPED_NOTE}") };
                let body = json!({ "chat_id": chat_ref(&chat_id), "message_id": message_id, "text": text });
                if let Err(e) = self.api.call("editMessageText", &body, within).await {
                    tracing::warn!(error = %e, "Cannot end a progress message of a stopping adapter.");
                }
            }
        };
        if tokio::time::timeout(within, edits).await.is_err() {
            tracing::warn!("Ending the open progress messages took too long; left as they are.");
        }
        // Finished (or given up on) by this run: nothing for the next one.
        self.save_open();
    }

    fn approvals(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u64), (String, i64)>> {
        self.approvals.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new approval request message with its buttons; a decision edits that message (no
    /// buttons any more).
    async fn show_approval(&self, chat_id: &str, view: &ApprovalView) -> Result<(), ChannelError> {
        let key = (view.conversation_id.clone(), view.number);
        let html = format::approval_html(view);
        if view.decided.is_none() {
            if self.approvals().contains_key(&key) {
                return Ok(());
            }
            let row: Vec<Value> = [("Allow", "allow"), ("Deny", "deny"), ("Always", "allow_always")]
                .iter()
                .map(|(label, d)| json!({ "text": label, "callback_data": callback_data(&view.conversation_id, view.number, d) }))
                .collect();
            self.slot(chat_id).await;
            let body = json!({ "chat_id": chat_ref(chat_id), "text": html, "parse_mode": "HTML",
                "link_preview_options": { "is_disabled": true }, "reply_markup": { "inline_keyboard": [row] } });
            let sent = self.send("sendMessage", &body).await?;
            let id = sent.get("message_id").and_then(Value::as_i64).unwrap_or_default();
            let mut map = self.approvals();
            if map.len() >= MAX_APPROVAL_MESSAGES {
                map.clear();
            }
            map.insert(key, (chat_id.to_owned(), id));
            return Ok(());
        }
        let Some((chat, message_id)) = self.approvals().get(&key).cloned() else {
            tracing::debug!(number = view.number, "A decision on a request this adapter did not show.");
            return Ok(());
        };
        self.slot(&chat).await;
        let body = json!({ "chat_id": chat_ref(&chat), "message_id": message_id, "text": html, "parse_mode": "HTML",
            "link_preview_options": { "is_disabled": true } });
        match self.send("editMessageText", &body).await {
            Ok(_) => Ok(()),
            Err(e) if is_unmodified(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Answers a callback query (the button's spinner stops; `text`, if any, shows as a
    /// notification, or an alert when `alert`). At most 200 characters of `text` are sent.
    async fn answer_query(&self, id: &str, text: &str, alert: bool) {
        let text: String = text.chars().take(200).collect();
        let mut body = json!({ "callback_query_id": id });
        if !text.is_empty() {
            body["text"] = json!(text);
        }
        if alert {
            body["show_alert"] = json!(true);
        }
        if let Err(e) = self.send("answerCallbackQuery", &body).await {
            tracing::warn!(error = %e, "Cannot answer a Telegram callback query.");
        }
    }

    /// Waits for the chat's next slot and takes it.
    async fn slot(&self, chat_id: &str) {
        let at = {
            let mut slots = self.next_slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            let at = slots.get(chat_id).copied().filter(|t| *t > now).unwrap_or(now);
            slots.insert(chat_id.to_owned(), at + EDIT_INTERVAL);
            at
        };
        tokio::time::sleep_until(at).await;
    }

    /// One call with its retries: 429 waits `retry_after`, 5xx and timeouts back off; the rest
    /// fail at once.
    async fn send(&self, method: &str, body: &Value) -> Result<Value, ChannelError> {
        let mut backoff = Backoff::new(BACKOFF_FIRST, BACKOFF_MAX);
        let mut tries = 0;
        loop {
            tries += 1;
            match self.api.call(method, body, CALL_TIMEOUT).await {
                Ok(v) => {
                    self.status.update(|s| s.last_outbound_ms = now_ms());
                    return Ok(v);
                }
                Err(ChannelError::RateLimited { retry_after_s, .. })
                    if tries < SEND_TRIES && retry_after_s <= MAX_RETRY_AFTER =>
                {
                    tokio::time::sleep(Duration::from_secs(retry_after_s)).await;
                }
                Err(ChannelError::Unavailable { .. }) if tries < SEND_TRIES => {
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `sendMessage` of one HTML piece (plain text when Telegram cannot parse it); the new
    /// message's id.
    async fn send_piece(&self, chat_id: &str, md: &str) -> Result<i64, ChannelError> {
        let body = json!({ "chat_id": chat_ref(chat_id), "text": format::to_html(md), "parse_mode": "HTML",
            "link_preview_options": { "is_disabled": true } });
        let sent = match self.send("sendMessage", &body).await {
            Err(e) if is_parse_error(&e) => {
                self.send("sendMessage", &json!({ "chat_id": chat_ref(chat_id), "text": md })).await?
            }
            r => r?,
        };
        Ok(sent.get("message_id").and_then(Value::as_i64).unwrap_or_default())
    }

    /// `editMessageText` of the progress message into one HTML piece (plain on a parse error).
    async fn edit_piece(&self, chat_id: &str, message_id: i64, md: &str) -> Result<(), ChannelError> {
        let body = json!({ "chat_id": chat_ref(chat_id), "message_id": message_id, "text": format::to_html(md),
            "parse_mode": "HTML", "link_preview_options": { "is_disabled": true } });
        match self.send("editMessageText", &body).await {
            Err(e) if is_parse_error(&e) => {
                let plain = json!({ "chat_id": chat_ref(chat_id), "message_id": message_id, "text": md });
                match self.send("editMessageText", &plain).await {
                    Err(e) if is_unmodified(&e) => Ok(()),
                    r => r.map(drop),
                }
            }
            Err(e) if is_unmodified(&e) => Ok(()),
            r => r.map(drop),
        }
    }
}

/// `v` with only its text not settled in earlier messages ([`long::Chain`]).
fn long_view(chain: &long::Chain, v: &TurnView) -> TurnView {
    TurnView { text: chain.rest(&v.text), ..v.clone() }
}

impl TelegramReplier {
    /// Settles every piece of `v`'s text past [`PROGRESS_CHARS`] ([`long::Chain::settle`]): the
    /// progress message `id` is edited to the piece's final rendering and a new progress
    /// message carries on. The new progress message and the text it shows; `None` when nothing
    /// was settled. When the new message cannot be sent, `(None, "")`: the rest of the answer
    /// comes as new messages at the end.
    async fn settle(
        &self,
        chat_id: &str,
        mut id: i64,
        chain: &mut long::Chain,
        v: &TurnView,
    ) -> Option<(Option<i64>, String)> {
        let mut out = None;
        while let Some(piece) = chain.settle(&v.text, PROGRESS_CHARS) {
            if out.is_some() {
                self.slot(chat_id).await;
            }
            if let Err(e) = self.edit_piece(chat_id, id, &piece).await {
                tracing::warn!(error = %e, "Cannot settle a piece of a long answer.");
            }
            self.slot(chat_id).await;
            let shown = progress_text(&long_view(chain, v));
            let sent = self.send("sendMessage", &json!({ "chat_id": chat_ref(chat_id), "text": shown })).await;
            let Some(next) = sent.ok().and_then(|m| m.get("message_id").and_then(Value::as_i64)) else {
                tracing::warn!("Cannot send the next progress message of a long answer.");
                self.open().remove(chat_id);
                self.save_open();
                return Some((None, String::new()));
            };
            if let Some(o) = self.open().get_mut(chat_id) {
                o.message_id = next;
                o.shown = shown.clone();
            }
            self.save_open();
            id = next;
            out = Some((Some(next), shown));
        }
        out
    }
}

/// The progress message's plain text: the tail of the text so far and the last tools.
pub fn progress_text(v: &TurnView) -> String {
    let n = v.text.chars().count();
    let mut out = if n > PROGRESS_CHARS {
        format!("…{}", v.text.chars().skip(n - PROGRESS_CHARS).collect::<String>())
    } else {
        v.text.trim_end().to_owned()
    };
    if !v.tools.is_empty() {
        let last: Vec<&str> = v.tools.iter().rev().take(3).rev().map(String::as_str).collect();
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(&format!("⚙ {}", last.join(", ")));
    }
    if out.trim().is_empty() { "…".to_owned() } else { format!("{out} …") }
}

/// The final markdown of an ended turn: its text and, unless it simply finished, how it ended.
pub fn final_markdown(v: &TurnView) -> String {
    let text = v.text.trim_end();
    let note = match &v.state {
        TurnState::Done { stop_reason } if stop_reason == "max_tokens" => {
            Some("_(cut at the model's token limit)_".into())
        }
        TurnState::Done { .. } | TurnState::Running => None,
        TurnState::Interrupted => Some("_(interrupted)_".to_owned()),
        TurnState::Failed { message } => Some(format!("⚠ The turn failed: {}", format::escape_md(message))),
    };
    match (text.is_empty(), note) {
        (true, None) => "(no text)".to_owned(),
        (true, Some(n)) => n,
        (false, None) => text.to_owned(),
        (false, Some(n)) => format!("{text}\n\n{n}"),
    }
}

/// Most messages one `/diff` sends (a longer diff ends with a line saying where the rest is).
pub const MAX_DIFF_MESSAGES: usize = 5;

/// The markdown pieces of one file's diff: the path, then the diff in a `diff` code block
/// (fenced longer than any backtick run inside it), split at [`format::MAX_CHARS`] with each
/// piece fenced again, at most [`MAX_DIFF_MESSAGES`] (then a line saying how much was left out).
pub fn diff_pieces(path: &str, diff: &str) -> Vec<String> {
    let longest = diff.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat((longest + 1).max(3));
    let md = format!("{}\n\n{fence}diff\n{}\n{fence}", format::escape_md(path), diff.trim_end());
    let mut pieces = format::split(&md, format::MAX_CHARS);
    if pieces.len() > MAX_DIFF_MESSAGES {
        let left = pieces.len() - MAX_DIFF_MESSAGES;
        pieces.truncate(MAX_DIFF_MESSAGES);
        pieces.push(format!(
            "… the diff goes on for about {left} more message{}: the whole diff is in the web console (or `coffer chat diff`).",
            if left == 1 { "" } else { "s" }
        ));
    }
    pieces
}

/// What a callback query is answered after the bridge handled its press.
pub fn callback_answer(answered: &Answered, tool: &str) -> (String, bool) {
    let view =
        |d: &super::Decided| ApprovalView { tool: tool.to_owned(), decided: Some(d.clone()), ..Default::default() };
    match answered {
        Answered::Decided(d) if d.decision == "allow_always" && !tool.is_empty() => {
            (format!("Allowed, and {tool} from now on in this conversation."), false)
        }
        Answered::Decided(d) => (format!("{}.", view(d).outcome()), false),
        Answered::Already(d) => {
            let v = view(d);
            (format!("Already decided: {} by {}.", v.outcome().to_lowercase(), v.by_whom()), false)
        }
        Answered::NotOwner => ("Only this bot's owner can answer its requests.".into(), true),
        Answered::NotFound(m) | Answered::Failed(m) => (m.clone(), true),
    }
}

impl Replier for TelegramReplier {
    fn approval<'a>(
        &'a self,
        chat_id: &'a str,
        view: &'a ApprovalView,
        _channel: &'a str,
    ) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(self.show_approval(chat_id, view))
    }

    fn diff<'a>(&'a self, chat_id: &'a str, path: &'a str, diff: &'a str) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(async move {
            for piece in diff_pieces(path, diff) {
                self.slot(chat_id).await;
                self.send_piece(chat_id, &piece).await?;
            }
            Ok(())
        })
    }

    fn notice<'a>(&'a self, chat_id: &'a str, text: &'a str) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(async move {
            for piece in format::split(text, format::MAX_CHARS) {
                self.slot(chat_id).await;
                self.send("sendMessage", &json!({ "chat_id": chat_ref(chat_id), "text": piece })).await?;
            }
            Ok(())
        })
    }

    fn turn<'a>(
        &'a self,
        chat_id: &'a str,
        mut views: watch::Receiver<TurnView>,
    ) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(async move {
            self.slot(chat_id).await;
            let first = views.borrow_and_update().clone();
            let mut shown = if first.state.is_final() { String::new() } else { progress_text(&first) };
            let mut progress = None;
            if !first.state.is_final() {
                let sent = self.send("sendMessage", &json!({ "chat_id": chat_ref(chat_id), "text": shown })).await;
                match sent {
                    Ok(m) => progress = m.get("message_id").and_then(Value::as_i64),
                    Err(e) => tracing::warn!(error = %e, "Cannot send a progress message."),
                }
                if let Some(id) = progress {
                    let p = journal::OpenProgress {
                        message_id: id,
                        shown: shown.clone(),
                        conversation_id: first.conversation_id.clone(),
                    };
                    self.open().insert(chat_id.to_owned(), p);
                    self.save_open();
                }
            }
            // The answer's start stays where it was read: past PROGRESS_CHARS a piece is
            // settled in the progress message and the answer goes on in a new one.
            let mut chain = long::Chain::default();
            let last = loop {
                let v = views.borrow_and_update().clone();
                if v.state.is_final() {
                    break v;
                }
                if views.changed().await.is_err() {
                    return Ok(());
                }
                self.slot(chat_id).await;
                let v = views.borrow_and_update().clone();
                if v.state.is_final() {
                    break v;
                }
                if let Some(id) = progress {
                    (progress, shown) = self.settle(chat_id, id, &mut chain, &v).await.unwrap_or((progress, shown));
                }
                let text = progress_text(&long_view(&chain, &v));
                if let Some(id) = progress
                    && text != shown
                {
                    let body = json!({ "chat_id": chat_ref(chat_id), "message_id": id, "text": text });
                    match self.send("editMessageText", &body).await {
                        Ok(_) => shown = text,
                        Err(e) if is_unmodified(&e) => shown = text,
                        Err(e) => tracing::warn!(error = %e, "Cannot edit a progress message."),
                    }
                    if let Some(o) = self.open().get_mut(chat_id) {
                        o.shown = shown.clone();
                    }
                    self.save_open();
                }
            };
            self.open().remove(chat_id);
            self.save_open();
            let pieces = format::split(&final_markdown(&long_view(&chain, &last)), format::MAX_CHARS);
            for (i, piece) in pieces.iter().enumerate() {
                if i > 0 || progress.is_some() {
                    self.slot(chat_id).await;
                }
                match (i, progress) {
                    (0, Some(id)) => self.edit_piece(chat_id, id, piece).await?,
                    _ => {
                        self.send_piece(chat_id, piece).await?;
                    }
                }
            }
            Ok(())
        })
    }
}

/// Starts the adapter of one enabled Telegram channel (`ctx.secrets[bot_token_ref]` is the bot
/// token). Called only by the coordinator.
pub fn spawn(ctx: AdapterCtx) -> AdapterHandle {
    AdapterHandle { task: tokio::spawn(run(ctx)), inbox: None }
}

/// Waits `d` unless cancelled first (`false` then).
async fn pause(ctx: &AdapterCtx, d: Duration) -> bool {
    tokio::select! {
        () = ctx.cancel.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}

/// Enters backoff after `e` for the delay it asks (429) or the next of `backoff` (counting
/// the failure); `false` when cancelled meanwhile.
async fn back_off(ctx: &AdapterCtx, e: &ChannelError, backoff: &mut Backoff) -> bool {
    let wait = match e {
        ChannelError::RateLimited { retry_after_s, .. } => Duration::from_secs(*retry_after_s),
        _ => backoff.next_delay(),
    };
    let msg = e.to_string();
    // A conflict is not a passing fault: it lasts as long as the other poller, so it reads as
    // a failure (with its retry time), not as a backoff.
    let state = if matches!(e, ChannelError::Conflict { .. }) { "failed" } else { "backoff" };
    ctx.status.update(|s| {
        s.state = state.into();
        s.last_error = msg;
        s.retry_at_ms = now_ms() + wait.as_millis() as i64;
    });
    tracing::warn!(channel = %ctx.record.name, error = %e, wait_ms = wait.as_millis() as u64, "Telegram failed; backing off.");
    pause(ctx, wait).await
}

/// Stays `failed` (naming `why`) until cancelled.
async fn fail(ctx: &AdapterCtx, why: String) {
    tracing::warn!(channel = %ctx.record.name, error = %why, "The Telegram adapter cannot run.");
    ctx.status.update(|s| {
        s.state = "failed".into();
        s.last_error = why;
        s.retry_at_ms = 0;
    });
    ctx.cancel.cancelled().await;
}

async fn run(ctx: AdapterCtx) {
    let name = ctx.record.name.clone();
    ctx.status.update(|s| {
        s.started_ms = now_ms();
        s.state = "running".into();
        s.last_error.clear();
    });
    let Some(token) = ctx.secrets.get(&ctx.record.bot_token_ref).cloned() else {
        let why = format!("the bot token credential {:?} is missing", ctx.record.bot_token_ref);
        return fail(&ctx, why).await;
    };
    let api = Arc::new(Api::new(&ctx.record.api_base_url, token));
    let mut backoff = Backoff::new(BACKOFF_FIRST, BACKOFF_MAX);
    let username = loop {
        let me = tokio::select! {
            () = ctx.cancel.cancelled() => return stopped(&ctx),
            me = api.get_me() => me,
        };
        match me {
            Ok(u) => break u,
            Err(ChannelError::Auth { message, .. }) => return fail(&ctx, message).await,
            Err(e) => {
                if !back_off(&ctx, &e, &mut backoff).await {
                    return stopped(&ctx);
                }
            }
        }
    };
    ctx.status.update(|s| {
        s.state = "running".into();
        s.bot_username = username.clone();
        s.last_error.clear();
        s.retry_at_ms = 0;
    });
    tracing::info!(channel = %name, bot = %username, "The Telegram adapter is polling.");
    let replier = TelegramReplier::new(api.clone(), ctx.status.clone());
    // Progress messages a killed run left on "…" are finished first, then kept from now on.
    let kept = journal::Journal::new(ctx.engine.home(), &name);
    let left = kept.take();
    replier.keep_journal(kept);
    if !left.is_empty() {
        tracing::info!(channel = %name, messages = left.len(), "Finishing progress messages left open by a crash.");
        replier.finish_left(&ctx.engine, left).await;
    }
    let bridge = Bridge::new(ctx.engine.clone(), replier.clone());
    if let Err(e) = bridge.resume(&ctx.record).await {
        tracing::warn!(channel = %name, error = %e, "Cannot follow the owner's conversation yet.");
    }
    let mut channels = coffer_proto::store::channels_client::ChannelsClient::new(ctx.store.clone());
    let mut cursor = ctx.record.cursor;
    backoff.reset();
    loop {
        let got = tokio::select! {
            () = ctx.cancel.cancelled() => break,
            got = api.get_updates(cursor) => got,
        };
        let updates = match got {
            Ok(u) => u,
            Err(ChannelError::Auth { message, .. }) => {
                drop(bridge);
                return fail(&ctx, message).await;
            }
            Err(e) => {
                if !back_off(&ctx, &e, &mut backoff).await {
                    break;
                }
                continue;
            }
        };
        if backoff.failures() > 0 || ctx.status.get().state != "running" {
            backoff.reset();
            ctx.status.update(|s| {
                s.state = "running".into();
                s.last_error.clear();
                s.retry_at_ms = 0;
            });
        }
        let mut next = cursor;
        for u in &updates {
            if u.update_id < cursor {
                tracing::debug!(channel = %name, update_id = u.update_id, "A redelivered update was skipped.");
                continue;
            }
            next = next.max(u.update_id + 1);
            if let Some(q) = &u.callback_query {
                ctx.status.update(|s| s.last_inbound_ms = now_ms());
                press(&ctx, &bridge, &replier, q).await;
                continue;
            }
            let max_bytes = ctx.engine.config().attachments.max_bytes;
            if let Some((msg, files)) = with_files(&name, &username, u, max_bytes) {
                ctx.status.update(|s| s.last_inbound_ms = now_ms());
                let fetch = async {
                    match files {
                        Ok(files) => download(&api, files, max_bytes).await,
                        Err(why) => Err(why),
                    }
                };
                if let Err(e) = bridge.handle_files(&ctx.record, msg, Box::pin(fetch)).await {
                    tracing::warn!(channel = %name, error = %e, "A Telegram photo or file was not fully handled.");
                }
                continue;
            }
            if let Some(msg) = unsupported(&name, u) {
                ctx.status.update(|s| s.last_inbound_ms = now_ms());
                if let Err(e) = bridge.unsupported(&ctx.record, msg, ONLY_TEXT).await {
                    tracing::warn!(channel = %name, error = %e, "A non-text Telegram message was not answered.");
                }
                continue;
            }
            let Some(msg) = inbound(&name, &username, u) else { continue };
            ctx.status.update(|s| s.last_inbound_ms = now_ms());
            if let Err(e) = bridge.handle(&ctx.record, msg).await {
                tracing::warn!(channel = %name, error = %e, "A Telegram message was not fully handled.");
            }
        }
        if next > cursor {
            cursor = next;
            // Persisted after handling: a crash in between redelivers the batch, and the
            // updates below the stored cursor are skipped on the next start.
            let req = coffer_proto::store::SetCursorRequest { name: name.clone(), cursor };
            if let Err(s) = channels.set_cursor(req).await {
                tracing::warn!(channel = %name, code = %s.code(), error = %s.message(), "Cannot persist the Telegram offset.");
            }
        }
    }
    drop(bridge);
    // A turn shown mid-way stays readable: its progress message says it stopped being followed.
    replier.finish_open(FINISH_WITHIN).await;
    stopped(&ctx);
}

/// A button press: an approval button goes to the bridge (owner and chat checked there), and
/// the query is answered with the outcome; any other data is answered as stale.
async fn press(ctx: &AdapterCtx, bridge: &Bridge, replier: &TelegramReplier, q: &CallbackQuery) {
    let parsed = q.data.as_deref().and_then(parse_callback_data);
    let (Some((conversation, number, decision)), Some(m)) = (parsed, q.message.as_ref()) else {
        replier.answer_query(&q.id, "This button is no longer in use.", false).await;
        return;
    };
    let display = q.from.username.as_ref().map_or_else(|| q.from.first_name.clone(), |u| format!("@{u}"));
    let who = Inbound {
        channel: ctx.record.name.clone(),
        chat_id: m.chat.id.to_string(),
        sender_id: q.from.id.to_string(),
        sender_display: display,
        text: String::new(),
        message_id: m.message_id.to_string(),
        group: m.chat.kind != "private" || q.from.is_bot,
    };
    let answered = bridge.answer(&ctx.record, &who, &conversation, number, decision, "").await;
    // The tool, for "Allowed, and Bash from now on": the message's first bold word.
    let tool = m
        .text
        .as_deref()
        .and_then(|t| t.strip_prefix("⏳ Waiting for your approval: "))
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or_default();
    let (text, alert) = callback_answer(&answered, tool);
    replier.answer_query(&q.id, &text, alert).await;
}

/// How long a stopping adapter spends ending its open progress messages (well within the
/// coordinator's stop grace).
const FINISH_WITHIN: Duration = Duration::from_secs(3);

fn stopped(ctx: &AdapterCtx) {
    ctx.status.update(|s| {
        s.state = "stopped".into();
        s.last_error.clear();
        s.retry_at_ms = 0;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_become_inbound_messages() {
        let u: Update = serde_json::from_value(json!({"update_id": 5, "message": {"message_id": 9,
            "from": {"id": 42, "is_bot": false, "first_name": "Ann", "username": "ann"},
            "chat": {"id": -100, "type": "group"}, "text": "@coffer_bot /status"}}))
        .unwrap();
        assert!(inbound("tg", "coffer_bot", &u).is_none(), "groups are not served");
        let u: Update = serde_json::from_value(json!({"update_id": 5, "message": {"message_id": 9,
            "from": {"id": 42, "is_bot": false, "first_name": "Ann", "username": "ann"},
            "chat": {"id": 42, "type": "private"}, "text": "@coffer_bot /status"}}))
        .unwrap();
        let m = inbound("tg", "coffer_bot", &u).unwrap();
        assert_eq!((m.chat_id.as_str(), m.sender_id.as_str(), m.text.as_str()), ("42", "42", "/status"));
        assert!(!m.group && m.sender_display == "@ann");
        let bot: Update = serde_json::from_value(json!({"update_id": 6, "message": {"message_id": 1,
            "from": {"id": 1, "is_bot": true, "first_name": "B"}, "chat": {"id": 1, "type": "private"}, "text": "x"}}))
        .unwrap();
        assert!(inbound("tg", "", &bot).is_none(), "bots are not heard");
        let photo: Update = serde_json::from_value(json!({"update_id": 7, "message": {"message_id": 1,
            "from": {"id": 1, "first_name": "B"}, "chat": {"id": 1, "type": "private"}}}))
        .unwrap();
        assert!(inbound("tg", "", &photo).is_none(), "no text, nothing to do");
    }

    #[test]
    fn photos_take_the_largest_size_within_the_limit_and_documents_their_name() {
        let msg = |content: Value| -> Message {
            let mut m = json!({"message_id": 3, "from": {"id": 42, "first_name": "Ann"},
                "chat": {"id": 42, "type": "private"}, "caption": "@coffer_bot look"});
            m.as_object_mut().unwrap().extend(content.as_object().unwrap().clone());
            serde_json::from_value(m).unwrap()
        };
        let photo = msg(json!({"photo": [
            {"file_id": "s", "width": 90, "height": 60, "file_size": 1_000},
            {"file_id": "m", "width": 800, "height": 600, "file_size": 90_000},
            {"file_id": "l", "width": 2560, "height": 1920, "file_size": 900_000}]}));
        let f = files_of(&photo, 100_000).unwrap().unwrap();
        assert_eq!((f[0].file_id.as_str(), f[0].size), ("m", Some(90_000)));
        assert_eq!(files_of(&photo, 10_000_000).unwrap().unwrap()[0].file_id, "l");
        let e = files_of(&photo, 500).unwrap_err();
        assert!(e.contains("chat.attachment_max_bytes") && e.contains("nothing was sent"), "{e}");
        let doc = msg(
            json!({"document": {"file_id": "d", "file_name": "../r.pdf", "mime_type": "application/pdf", "file_size": 5}}),
        );
        let f = files_of(&doc, 100).unwrap().unwrap();
        assert_eq!((f[0].name.as_str(), f[0].mime.as_str()), ("../r.pdf", "application/pdf"), "sanitised when saved");
        let e = files_of(&doc, 4).unwrap_err();
        assert!(e.contains("../r.pdf") && e.contains("5 bytes"), "{e}");
        let u = Update { update_id: 1, message: Some(doc), edited_message: None, callback_query: None };
        let (m, files) = with_files("tg", "coffer_bot", &u, 100).unwrap();
        assert_eq!((m.text.as_str(), files.unwrap().len()), ("look", 1), "the caption without the mention");
        assert!(unsupported("tg", &u).is_none(), "a document is not 'unsupported'");
    }

    #[test]
    fn errors_are_classified_without_the_token() {
        assert!(matches!(classify("getUpdates", 429, "", Some(7)), ChannelError::RateLimited { retry_after_s: 7, .. }));
        assert!(matches!(classify("getMe", 401, "Unauthorized", None), ChannelError::Auth { .. }));
        assert!(matches!(classify("getMe", 404, "Not Found", None), ChannelError::Auth { .. }));
        assert!(matches!(classify("x", 502, "Bad Gateway", None), ChannelError::Unavailable { .. }));
        let e = classify("getUpdates", 409, "Conflict: terminated by other getUpdates request", None);
        let m = e.to_string();
        assert!(matches!(e, ChannelError::Conflict { .. }), "{m}");
        assert!(m.contains("409 Conflict") && m.contains("same bot token"), "{m}");
        let e = classify("sendMessage", 400, "Bad Request: can't parse entities", None);
        assert!(is_parse_error(&e), "{e}");
    }

    #[tokio::test]
    async fn a_refused_connection_names_the_cause_and_never_the_token() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let api = Api::new(&format!("http://127.0.0.1:{port}/"), SecretString::from("4242:SECRET-TOKEN"));
        let e = api.get_me().await.unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, ChannelError::Unavailable { .. }), "{m}");
        assert!(
            m.contains(&format!("getMe at http://127.0.0.1:{port}")) && m.to_lowercase().contains("refused"),
            "{m}"
        );
        assert!(!m.contains("SECRET"), "{m}");
    }

    #[test]
    fn approval_buttons_fit_telegrams_64_bytes_and_parse_back() {
        let conv = "01KCAXR4W3M9E8V2T6Y5QZ7N0P";
        for d in ["allow", "deny", "allow_always"] {
            let data = callback_data(conv, u64::MAX, d);
            assert!(data.len() <= 64, "{data}: {} bytes", data.len());
            assert_eq!(parse_callback_data(&data), Some((conv.to_owned(), u64::MAX, d)));
        }
        for bad in ["", "ap:", "ap:x:1", "ap:x:n:a", "ap:x:1:z", "ap:x:1:a:extra", "other:x:1:a"] {
            assert_eq!(parse_callback_data(bad), None, "{bad}");
        }
        let q: Update = serde_json::from_value(json!({"update_id": 9, "callback_query": {"id": "77",
            "from": {"id": 1001, "is_bot": false, "first_name": "O"}, "chat_instance": "-5",
            "message": {"message_id": 3, "chat": {"id": 1001, "type": "private"}, "text": "x"},
            "data": "ap:C:5:d"}}))
        .unwrap();
        let q = q.callback_query.unwrap();
        assert_eq!((q.id.as_str(), q.from.id, q.data.as_deref()), ("77", 1001, Some("ap:C:5:d")));
    }

    #[test]
    fn approval_messages_say_what_and_who_in_telegram_html() {
        let mut v = ApprovalView {
            conversation_id: "C".into(),
            number: 1042,
            tool: "Bash".into(),
            summary: "Bash: rm -rf build".into(),
            detail: "rm -rf <build> && echo".into(),
            decided: None,
        };
        let h = format::approval_html(&v);
        assert!(
            h.starts_with(
                "⏳ Waiting for your approval: <b>Bash</b> <code>rm -rf &lt;build&gt; &amp;&amp; echo</code>"
            ),
            "{h}"
        );
        v.decided = Some(crate::channels::Decided {
            decision: "deny".into(),
            decided_by: "channel:tg".into(),
            actor: "1001".into(),
            message: "not <now>".into(),
        });
        let h = format::approval_html(&v);
        assert!(
            h.contains("<b>Denied</b>") && h.contains("by user 1001 in tg") && h.contains("not &lt;now&gt;"),
            "{h}"
        );
        let d = |by: &str| crate::channels::Decided {
            decision: "allow".into(),
            decided_by: by.into(),
            ..Default::default()
        };
        let (t, alert) = callback_answer(&Answered::Already(d("web")), "Bash");
        assert_eq!((t.as_str(), alert), ("Already decided: allowed by the web console.", false));
        let (t, alert) = callback_answer(&Answered::NotOwner, "Bash");
        assert!(alert && t.contains("owner"), "{t}");
    }

    #[test]
    fn a_diff_is_a_pre_block_split_and_bounded() {
        let diff = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a < b\n+```\n";
        let pieces = diff_pieces("src/x_y.md", diff);
        assert_eq!(pieces.len(), 1);
        let html = format::to_html(&pieces[0]);
        assert!(
            html.contains(
                "<pre><code class=\"language-diff\">--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a &lt; b\n+```</code></pre>"
            ),
            "{html}"
        );
        let long: String = (0..5000).map(|i| format!("+line {i}\n")).collect();
        let pieces = diff_pieces("big.txt", &long);
        assert_eq!(pieces.len(), MAX_DIFF_MESSAGES + 1);
        assert!(pieces.iter().all(|p| p.chars().count() <= format::MAX_CHARS));
        assert!(pieces[1].starts_with("````diff\n") || pieces[1].starts_with("```diff\n"), "{}", &pieces[1][..20]);
        assert!(pieces.last().unwrap().contains("more messages"));
    }

    #[test]
    fn progress_and_final_texts() {
        let mut v = TurnView { text: "Hello".into(), tools: vec!["Bash".into(), "Read".into()], ..Default::default() };
        assert_eq!(progress_text(&v), "Hello\n\n⚙ Bash, Read …");
        v.text = "x".repeat(5000);
        assert!(progress_text(&v).chars().count() < format::MAX_CHARS);
        assert_eq!(progress_text(&TurnView::default()), "…");
        v.text = "done".into();
        v.state = TurnState::Interrupted;
        assert_eq!(final_markdown(&v), "done\n\n_(interrupted)_");
        v.state = TurnState::Failed { message: "the agent *crashed* <x>".into() };
        let f = final_markdown(&v);
        let h = format::to_html(&f);
        assert!(h.contains("&lt;x&gt;") && !h.contains("<i>crashed"), "{h}");
    }
}
