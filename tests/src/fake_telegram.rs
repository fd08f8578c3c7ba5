//! A fake Telegram Bot API on loopback (real HTTP), following the documented wire format:
//! `GET` or `POST` (JSON body, or query/form parameters) `/bot<token>/<method>` answering
//! `{"ok": true, "result": …}` or `{"ok": false, "error_code": N, "description": "…",
//! "parameters": {"retry_after": S}}`.
//!
//! Methods: `getMe`, `getUpdates` (long polling: answers as soon as an update at or above
//! `offset` exists, or after `timeout` seconds with `[]`; updates below `offset` are confirmed
//! and forgotten; as Telegram, `allowed_updates` is remembered across calls and an update of a
//! type not asked for is never delivered), `sendMessage`, `editMessageText`,
//! `editMessageReplyMarkup`, `deleteMessage`, `answerCallbackQuery`.
//!
//! Inline keyboards: `reply_markup: {"inline_keyboard": [[{"text", "callback_data"}]]}` (an
//! object, or its JSON text in a form field) on `sendMessage`, `editMessageText` and
//! `editMessageReplyMarkup` is checked (every button has a text and exactly one action;
//! `callback_data` 1-64 bytes, else 400 `BUTTON_DATA_INVALID`) and kept on the message
//! ([`Shown::keyboard`]); an edit without `reply_markup` removes the keyboard, as Telegram does.
//! A test presses a button with [`FakeTelegram::press`] (a `callback_query` update from a user,
//! on a bot message, with its `data`); `answerCallbackQuery` answers a pending query once
//! (text 0-200 characters), and an unknown or already answered id gets Telegram's 400 "query is
//! too old and response timeout expired or query ID is invalid" ([`FakeTelegram::answers`]
//! lists the answers). `getFile` (a `File` with its `file_path`; 400 "wrong file_id" for an
//! unknown one) and the file download `GET /file/bot<token>/<file_path>` (the bytes a test
//! pushed with [`FakeTelegram::push_photo`] or [`FakeTelegram::push_document`]; 404
//! otherwise). Message text is checked
//! as Telegram does: 1-4096 characters after entity parsing, and with `parse_mode: "HTML"` only
//! Telegram's tags, balanced, with `<>&` escaped (else 400 "can't parse entities"); an edit to
//! the same text is 400 "message is not modified". A token other than the fake's is 401. As
//! Telegram, it serves one poller per bot: a `getUpdates` arriving while another is pending
//! ends the pending one with 409 Conflict ([`CONFLICT`]).
//!
//! Tests push user messages ([`FakeTelegram::push_text`]), inject faults for the next calls
//! of a method ([`FakeTelegram::fail_next`]: a status such as 429 with `retry_after`, 500, or a
//! stall that holds the request), and read the log of every call with its time
//! ([`FakeTelegram::calls`]) and the chat as a person would see it ([`FakeTelegram::chat`]).
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Longest long poll the fake holds (a test's own timeouts are shorter).
const MAX_POLL: Duration = Duration::from_secs(60);
/// Telegram's message limit, characters after entity parsing.
pub const MAX_CHARS: usize = 4096;
/// The tags Telegram's HTML style knows.
const TAGS: &[&str] = &[
    "b",
    "strong",
    "i",
    "em",
    "u",
    "ins",
    "s",
    "strike",
    "del",
    "span",
    "tg-spoiler",
    "a",
    "code",
    "pre",
    "blockquote",
    "tg-emoji",
];

/// A fault for the next call(s) of a method.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer this status with Telegram's error body (`retry_after` in `parameters` for 429).
    Status { code: u16, retry_after: Option<u64> },
    /// Hold the request this long, then answer 502 (a client with a shorter timeout sees a
    /// timeout).
    Stall(Duration),
}

/// One call the fake received.
#[derive(Debug, Clone)]
pub struct Call {
    /// Since the fake started.
    pub at: Duration,
    pub method: String,
    /// The parameters (JSON body, or the query/form pairs as strings).
    pub params: Value,
    /// Whether the token was the fake's.
    pub token_ok: bool,
    /// The HTTP status answered (0 while the call is under way).
    pub status: u16,
    /// The error's description (empty when it succeeded).
    pub description: String,
}

/// One inline keyboard button: its label and its `callback_data` (empty for a URL button).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Button {
    pub text: String,
    pub data: String,
}

/// A bot's answer to a callback query (`answerCallbackQuery`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackAnswer {
    /// The query's id (from [`FakeTelegram::press`]).
    pub id: String,
    /// The notification text (empty: none shown).
    pub text: String,
    pub show_alert: bool,
}

/// One message in a chat as a person sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    pub message_id: i64,
    /// From the bot (else a pushed user message).
    pub from_bot: bool,
    /// The text as sent (HTML source when `html`).
    pub text: String,
    pub html: bool,
    /// How many times it was edited.
    pub edits: u32,
    /// The inline keyboard under it, row by row (empty: none).
    pub keyboard: Vec<Vec<Button>>,
}

impl Shown {
    /// Every button of the inline keyboard, row after row.
    pub fn buttons(&self) -> Vec<Button> {
        self.keyboard.iter().flatten().cloned().collect()
    }

    /// The button labelled `label` (case-insensitive), if any.
    pub fn button(&self, label: &str) -> Option<Button> {
        self.buttons().into_iter().find(|b| b.text.eq_ignore_ascii_case(label))
    }

    /// The text a person reads (tags removed, entities decoded when HTML).
    pub fn visible(&self) -> String {
        if self.html { visible(&self.text) } else { self.text.clone() }
    }
}

struct State {
    token: String,
    username: String,
    updates: Vec<Value>,
    next_update: i64,
    next_message: i64,
    chats: BTreeMap<i64, Vec<Shown>>,
    calls: Vec<Call>,
    faults: VecDeque<(String, Fault)>,
    /// Bumped by every `getUpdates`: a pending long poll whose number is no longer the latest
    /// was overtaken by another poller of the token.
    poll_gen: u64,
    /// The update types the poller asked for (`None`: never said; Telegram then sends every
    /// type but a few special ones).
    allowed: Option<Vec<String>>,
    /// Callback queries pushed and not answered yet, by id.
    open_queries: std::collections::HashSet<String>,
    next_query: u64,
    answers: Vec<CallbackAnswer>,
    /// Files the bot may fetch: file_id → (file_path, bytes).
    files: BTreeMap<String, (String, Vec<u8>)>,
    /// How many times each file_path was downloaded.
    downloads: BTreeMap<String, u32>,
}

struct Inner {
    started: Instant,
    state: Mutex<State>,
    /// Bumped on every change (a pushed update, a call): long polls and test waits follow it.
    version: watch::Sender<u64>,
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }
}

/// The fake Bot API server; stops when dropped.
pub struct FakeTelegram {
    /// `http://127.0.0.1:port` (the channel's `api_base_url`).
    pub url: String,
    inner: Arc<Inner>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.task.abort();
    }
}

fn ok(result: Value) -> (u16, Value) {
    (200, json!({ "ok": true, "result": result }))
}

fn err(code: u16, description: &str) -> (u16, Value) {
    (code, json!({ "ok": false, "error_code": code, "description": description }))
}

/// The visible text of Telegram HTML.
pub fn visible(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&amp;", "&")
}

/// Checks Telegram HTML as the Bot API parses it; the problem, as Telegram words it.
pub fn check_html(html: &str) -> Result<(), String> {
    let mut stack: Vec<String> = Vec::new();
    let mut i = 0;
    let b = html.as_bytes();
    while i < b.len() {
        match b[i] {
            b'<' => {
                let end = html[i..].find('>').ok_or("unclosed start tag")? + i;
                let tag = &html[i + 1..end];
                if let Some(name) = tag.strip_prefix('/') {
                    let top = stack.pop().ok_or_else(|| format!("unexpected end tag {name}"))?;
                    if top != name.trim() {
                        return Err(format!("unmatched end tag at byte offset {i}, expected \"</{top}>\""));
                    }
                } else {
                    let name = tag.split([' ', '\n']).next().unwrap_or_default();
                    if !TAGS.contains(&name) {
                        return Err(format!("unsupported start tag \"{name}\" at byte offset {i}"));
                    }
                    stack.push(name.to_owned());
                }
                i = end + 1;
            }
            b'>' => return Err(format!("character '>' is reserved at byte offset {i}")),
            b'&' => {
                let rest = &html[i..];
                let known = ["&lt;", "&gt;", "&amp;", "&quot;"].iter().find(|e| rest.starts_with(**e));
                let numeric = rest.starts_with("&#") && rest[2..].find(';').is_some_and(|j| j > 0 && j < 8);
                match known {
                    Some(e) => i += e.len(),
                    None if numeric => i += 2,
                    None => return Err(format!("unsupported entity at byte offset {i}")),
                }
            }
            _ => i += 1,
        }
    }
    match stack.pop() {
        Some(t) => Err(format!("can't find end tag corresponding to start tag \"{t}\"")),
        None => Ok(()),
    }
}

/// The parameters of a request: the JSON body, else form or query pairs.
fn params(uri: &Uri, body: &Bytes) -> Value {
    if let Ok(v) = serde_json::from_slice::<Value>(body)
        && v.is_object()
    {
        return v;
    }
    let form = if body.is_empty() { uri.query().unwrap_or_default().as_bytes() } else { &body[..] };
    let mut map = serde_json::Map::new();
    for (k, v) in url::form_urlencoded::parse(form) {
        // Telegram reads JSON-serialized values (numbers, arrays) from form fields too.
        let value = serde_json::from_str::<Value>(&v).unwrap_or(Value::String(v.into_owned()));
        map.insert(k.into_owned(), value);
    }
    Value::Object(map)
}

fn int(v: &Value) -> Option<i64> {
    v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

async fn handle(axum::extract::State(inner): axum::extract::State<Arc<Inner>>, uri: Uri, body: Bytes) -> Response {
    let path = uri.path().trim_start_matches('/').to_owned();
    if let Some(rest) = path.strip_prefix("file/bot") {
        return download(&inner, rest);
    }
    let (token, method) = match path.strip_prefix("bot").and_then(|p| p.split_once('/')) {
        Some((t, m)) => (t.to_owned(), m.to_owned()),
        None => {
            let (code, body) = err(404, "Not Found");
            return (StatusCode::from_u16(code).unwrap(), axum::Json(body)).into_response();
        }
    };
    let p = params(&uri, &body);
    // Logged on arrival (status 0 until answered): a long poll shows at once.
    let index = {
        let mut st = inner.lock();
        let token_ok = token == st.token;
        let at = inner.started.elapsed();
        let (method, params) = (method.clone(), p.clone());
        st.calls.push(Call { at, method, params, token_ok, status: 0, description: String::new() });
        st.calls.len() - 1
    };
    inner.bump();
    let (code, answer) = answer(&inner, &token, &method, &p).await;
    if let Some(c) = inner.lock().calls.get_mut(index) {
        c.status = code;
        c.description = answer["description"].as_str().unwrap_or_default().to_owned();
    }
    inner.bump();
    (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(answer)).into_response()
}

async fn answer(inner: &Arc<Inner>, token: &str, method: &str, p: &Value) -> (u16, Value) {
    if token != inner.lock().token {
        return err(401, "Unauthorized");
    }
    let fault = {
        let mut st = inner.lock();
        let i = st.faults.iter().position(|(m, _)| m == method);
        i.and_then(|i| st.faults.remove(i)).map(|(_, f)| f)
    };
    match fault {
        Some(Fault::Status { code: 429, retry_after }) => {
            let s = retry_after.unwrap_or(1);
            let description = format!("Too Many Requests: retry after {s}");
            let body = json!({ "ok": false, "error_code": 429, "description": description,
                "parameters": { "retry_after": s } });
            return (429, body);
        }
        Some(Fault::Status { code, .. }) => return err(code, "Internal Server Error"),
        Some(Fault::Stall(d)) => {
            tokio::time::sleep(d).await;
            return err(502, "Bad Gateway");
        }
        None => {}
    }
    match method {
        "getMe" => {
            let username = inner.lock().username.clone();
            ok(json!({ "id": 4242, "is_bot": true, "first_name": "Coffer", "username": username }))
        }
        "getUpdates" => get_updates(inner, p).await,
        "sendMessage" => {
            let Some(chat) = p.get("chat_id").and_then(int) else { return err(400, "Bad Request: chat not found") };
            let (text, html) = match checked_text(p) {
                Ok(t) => t,
                Err(e) => return e,
            };
            let keyboard = match keyboard(p) {
                Ok(k) => k,
                Err(e) => return e,
            };
            let mut st = inner.lock();
            st.next_message += 1;
            let id = st.next_message;
            let shown = Shown { message_id: id, from_bot: true, text, html, edits: 0, keyboard };
            let answer = message_json(chat, &shown);
            st.chats.entry(chat).or_default().push(shown);
            ok(answer)
        }
        "editMessageText" => {
            let (Some(chat), Some(id)) = (p.get("chat_id").and_then(int), p.get("message_id").and_then(int)) else {
                return err(400, "Bad Request: message to edit not found");
            };
            let (text, html) = match checked_text(p) {
                Ok(t) => t,
                Err(e) => return e,
            };
            // Without `reply_markup` the edited message has no keyboard any more.
            let keyboard = match keyboard(p) {
                Ok(k) => k,
                Err(e) => return e,
            };
            let mut st = inner.lock();
            let Some(m) = st.chats.get_mut(&chat).and_then(|c| c.iter_mut().find(|m| m.message_id == id && m.from_bot))
            else {
                return err(400, "Bad Request: message to edit not found");
            };
            if m.text == text && m.html == html && m.keyboard == keyboard {
                return err(400, NOT_MODIFIED);
            }
            m.text = text;
            m.html = html;
            m.keyboard = keyboard;
            m.edits += 1;
            ok(message_json(chat, m))
        }
        "editMessageReplyMarkup" => {
            let (Some(chat), Some(id)) = (p.get("chat_id").and_then(int), p.get("message_id").and_then(int)) else {
                return err(400, "Bad Request: message to edit not found");
            };
            let keyboard = match keyboard(p) {
                Ok(k) => k,
                Err(e) => return e,
            };
            let mut st = inner.lock();
            let Some(m) = st.chats.get_mut(&chat).and_then(|c| c.iter_mut().find(|m| m.message_id == id && m.from_bot))
            else {
                return err(400, "Bad Request: message to edit not found");
            };
            if m.keyboard == keyboard {
                return err(400, NOT_MODIFIED);
            }
            m.keyboard = keyboard;
            m.edits += 1;
            ok(message_json(chat, m))
        }
        "answerCallbackQuery" => {
            let id = match p.get("callback_query_id") {
                Some(Value::String(s)) => s.clone(),
                Some(v @ Value::Number(_)) => v.to_string(),
                _ => return err(400, "Bad Request: parameter \"callback_query_id\" is required"),
            };
            let text = p.get("text").and_then(Value::as_str).unwrap_or_default().to_owned();
            if text.chars().count() > 200 {
                return err(400, "Bad Request: MESSAGE_TOO_LONG");
            }
            let show_alert = p.get("show_alert").is_some_and(|v| v.as_bool() == Some(true) || v == "true");
            let mut st = inner.lock();
            if !st.open_queries.remove(&id) {
                return err(400, QUERY_TOO_OLD);
            }
            st.answers.push(CallbackAnswer { id, text, show_alert });
            ok(json!(true))
        }
        "getFile" => {
            let id = p.get("file_id").and_then(Value::as_str).unwrap_or_default();
            match inner.lock().files.get(id) {
                Some((path, bytes)) => ok(json!({ "file_id": id, "file_unique_id": format!("u-{id}"),
                    "file_size": bytes.len(), "file_path": path })),
                None => err(400, "Bad Request: wrong file_id or the file is temporarily unavailable"),
            }
        }
        "deleteMessage" => {
            let (Some(chat), Some(id)) = (p.get("chat_id").and_then(int), p.get("message_id").and_then(int)) else {
                return err(400, "Bad Request: message to delete not found");
            };
            let mut st = inner.lock();
            let Some(list) = st.chats.get_mut(&chat) else {
                return err(400, "Bad Request: message to delete not found");
            };
            let before = list.len();
            list.retain(|m| m.message_id != id);
            if list.len() == before {
                return err(400, "Bad Request: message to delete not found");
            }
            ok(json!(true))
        }
        _ => err(404, "Not Found"),
    }
}

/// Telegram's answer to an edit that changes nothing.
pub const NOT_MODIFIED: &str = "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message";

/// Telegram's answer to `answerCallbackQuery` for an unknown or already answered query.
pub const QUERY_TOO_OLD: &str = "Bad Request: query is too old and response timeout expired or query ID is invalid";

/// A sent or edited message as the Bot API returns it.
fn message_json(chat: i64, m: &Shown) -> Value {
    let mut v = json!({ "message_id": m.message_id, "date": 0, "chat": { "id": chat, "type": "private" },
        "from": { "id": 4242, "is_bot": true, "first_name": "Coffer" }, "text": m.visible() });
    if !m.keyboard.is_empty() {
        let rows: Vec<Value> = m
            .keyboard
            .iter()
            .map(|r| r.iter().map(|b| json!({ "text": b.text, "callback_data": b.data })).collect())
            .collect();
        v["reply_markup"] = json!({ "inline_keyboard": rows });
    }
    v
}

/// The `reply_markup` inline keyboard of a request, checked as the Bot API does (empty when
/// there is none); Telegram's 400 otherwise.
fn keyboard(p: &Value) -> Result<Vec<Vec<Button>>, (u16, Value)> {
    let markup = match p.get("reply_markup") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        // A form field carries the JSON as text.
        Some(Value::String(s)) => serde_json::from_str::<Value>(s)
            .map_err(|_| err(400, "Bad Request: can't parse reply keyboard markup JSON object"))?,
        Some(v) => v.clone(),
    };
    let Some(rows) = markup.get("inline_keyboard") else {
        // Reply keyboards (`keyboard`, `remove_keyboard`) are not inline: nothing to show here.
        return Ok(Vec::new());
    };
    let rows = rows.as_array().ok_or_else(|| err(400, "Bad Request: field \"inline_keyboard\" must be an Array"))?;
    let mut out = Vec::new();
    for row in rows {
        let row = row
            .as_array()
            .ok_or_else(|| err(400, "Bad Request: field \"inline_keyboard\" must be an Array of Arrays"))?;
        let mut buttons = Vec::new();
        for b in row {
            let text = b.get("text").and_then(Value::as_str).unwrap_or_default();
            if text.is_empty() {
                return Err(err(400, "Bad Request: can't parse inline keyboard button: Text must be non-empty"));
            }
            let actions = ["callback_data", "url", "switch_inline_query", "web_app", "login_url", "pay", "copy_text"];
            if actions.iter().filter(|a| b.get(**a).is_some()).count() != 1 {
                return Err(err(
                    400,
                    "Bad Request: can't parse inline keyboard button: InlineKeyboardButton must have exactly one of the optional fields",
                ));
            }
            let data = match b.get("callback_data") {
                Some(d) => {
                    let d = d.as_str().unwrap_or_default();
                    if d.is_empty() || d.len() > 64 {
                        return Err(err(400, "Bad Request: BUTTON_DATA_INVALID"));
                    }
                    d.to_owned()
                }
                None => String::new(),
            };
            buttons.push(Button { text: text.to_owned(), data });
        }
        out.push(buttons);
    }
    Ok(out)
}

/// The type of an update: the name of its one field besides `update_id`.
fn update_type(u: &Value) -> String {
    u.as_object().and_then(|o| o.keys().find(|k| *k != "update_id").cloned()).unwrap_or_default()
}

/// `GET /file/bot<token>/<file_path>`: the pushed bytes (404 for another token or path).
fn download(inner: &Arc<Inner>, rest: &str) -> Response {
    let mut st = inner.lock();
    let found = rest.split_once('/').and_then(|(token, path)| {
        let bytes =
            (token == st.token).then(|| st.files.values().find(|(p, _)| p == path).map(|(_, b)| b.clone()))??;
        Some((path.to_owned(), bytes))
    });
    match found {
        Some((path, bytes)) => {
            *st.downloads.entry(path).or_default() += 1;
            drop(st);
            inner.bump();
            (StatusCode::OK, bytes).into_response()
        }
        None => {
            (StatusCode::NOT_FOUND, axum::Json(json!({"ok": false, "error_code": 404, "description": "Not Found"})))
                .into_response()
        }
    }
}

fn visible_if(text: &str, html: bool) -> String {
    if html { visible(text) } else { text.to_owned() }
}

/// The `text` and whether it is HTML, checked; Telegram's 400 otherwise.
fn checked_text(p: &Value) -> Result<(String, bool), (u16, Value)> {
    let text = p.get("text").and_then(Value::as_str).unwrap_or_default().to_owned();
    let mode = p.get("parse_mode").and_then(Value::as_str).unwrap_or_default();
    let html = mode.eq_ignore_ascii_case("html");
    if !mode.is_empty() && !html {
        return Err(err(400, &format!("Bad Request: unsupported parse_mode {mode:?} in this fake")));
    }
    if html && let Err(e) = check_html(&text) {
        return Err(err(400, &format!("Bad Request: can't parse entities: {e}")));
    }
    let shown = visible_if(&text, html);
    if shown.trim().is_empty() {
        return Err(err(400, "Bad Request: message text is empty"));
    }
    if shown.chars().count() > MAX_CHARS {
        return Err(err(400, "Bad Request: message is too long"));
    }
    Ok((text, html))
}

/// What Telegram answers a `getUpdates` that another poller of the same token overtook.
pub const CONFLICT: &str =
    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running";

async fn get_updates(inner: &Arc<Inner>, p: &Value) -> (u16, Value) {
    let offset = p.get("offset").and_then(int).unwrap_or(0);
    let timeout = Duration::from_secs(p.get("timeout").and_then(int).unwrap_or(0).max(0) as u64).min(MAX_POLL);
    let limit = p.get("limit").and_then(int).unwrap_or(100).clamp(1, 100) as usize;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut version = inner.version.subscribe();
    let me = {
        let mut st = inner.lock();
        // Telegram keeps the last `allowed_updates` a poller sent until another one is sent.
        let asked = match p.get("allowed_updates") {
            Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok(),
            v => v.cloned(),
        };
        if let Some(Value::Array(list)) = asked {
            st.allowed = Some(list.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect());
        }
        st.poll_gen += 1;
        st.poll_gen
    };
    // Wakes a pending poll so it sees it was overtaken.
    inner.bump();
    loop {
        {
            let mut st = inner.lock();
            // Telegram serves one poller per bot: a newer getUpdates ends the pending one.
            if st.poll_gen != me {
                return err(409, CONFLICT);
            }
            // An offset confirms every update below it.
            if offset > 0 {
                st.updates.retain(|u| u["update_id"].as_i64().unwrap_or(0) >= offset);
            }
            // An empty list means every type (but the special ones no test uses).
            let allowed = st.allowed.clone().filter(|a| !a.is_empty());
            let wanted = |u: &Value| allowed.as_ref().is_none_or(|a| a.contains(&update_type(u)));
            let ready: Vec<Value> = st.updates.iter().filter(|u| wanted(u)).take(limit).cloned().collect();
            if !ready.is_empty() {
                return ok(Value::Array(ready));
            }
        }
        if tokio::time::timeout_at(deadline, version.changed()).await.is_err() {
            return ok(json!([]));
        }
    }
}

impl FakeTelegram {
    /// Starts a fake that accepts `token` for the bot `@username`.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start(token: &str, username: &str) -> anyhow::Result<Self> {
        let (shutdown, mut stop) = watch::channel(false);
        let inner = Arc::new(Inner {
            started: Instant::now(),
            state: Mutex::new(State {
                token: token.to_owned(),
                username: username.to_owned(),
                updates: Vec::new(),
                next_update: 1000,
                next_message: 0,
                chats: BTreeMap::new(),
                calls: Vec::new(),
                faults: VecDeque::new(),
                poll_gen: 0,
                allowed: None,
                open_queries: std::collections::HashSet::new(),
                next_query: 0,
                answers: Vec::new(),
                files: BTreeMap::new(),
                downloads: BTreeMap::new(),
            }),
            version: watch::channel(0).0,
        });
        let app = axum::Router::new().fallback(handle).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.changed().await;
                })
                .await;
        });
        Ok(Self { url, inner, shutdown, task })
    }

    /// Accepts `token` from now on (the old one gets 401).
    pub fn set_token(&self, token: &str) {
        self.inner.lock().token = token.to_owned();
        self.inner.bump();
    }

    /// A user's text message in a private chat (chat id = user id); its update_id.
    pub fn push_text(&self, user_id: i64, text: &str) -> i64 {
        self.push_message(user_id, user_id, "private", text)
    }

    /// A user's text message in chat `chat_id` of `kind` (`private`, `group`); its update_id.
    pub fn push_message(&self, chat_id: i64, user_id: i64, kind: &str, text: &str) -> i64 {
        let id = {
            let mut st = self.inner.lock();
            st.next_update += 1;
            st.next_message += 1;
            let (update_id, message_id) = (st.next_update, st.next_message);
            st.updates.push(json!({ "update_id": update_id, "message": {
                "message_id": message_id, "date": 0,
                "from": { "id": user_id, "is_bot": false, "first_name": format!("User {user_id}"), "username": format!("user{user_id}") },
                "chat": { "id": chat_id, "type": kind },
                "text": text,
            }}));
            st.chats.entry(chat_id).or_default().push(Shown {
                message_id,
                from_bot: false,
                text: text.to_owned(),
                html: false,
                edits: 0,
                keyboard: Vec::new(),
            });
            update_id
        };
        self.inner.bump();
        id
    }

    /// A raw update (e.g. malformed, or a photo without text); its update_id.
    pub fn push_raw(&self, mut update: Value) -> i64 {
        let mut st = self.inner.lock();
        st.next_update += 1;
        let id = st.next_update;
        update["update_id"] = json!(id);
        st.updates.push(update);
        drop(st);
        self.inner.bump();
        id
    }

    /// User `user_id` presses the inline button with `data` under bot message `message_id` of
    /// its private chat (chat id = user id): a `callback_query` update, as Telegram sends it
    /// (`id`, `from`, `message` as it is now, `chat_instance`, `data`). Returns the query's id
    /// (for [`FakeTelegram::answer_of`]). Like a Telegram client, the press may carry data no
    /// button has now (a stale keyboard): the bot must cope.
    ///
    /// # Panics
    /// When chat `user_id` has no bot message `message_id` (a test mistake).
    pub fn press(&self, user_id: i64, message_id: i64, data: &str) -> String {
        self.press_in(user_id, user_id, message_id, data)
    }

    /// As [`FakeTelegram::press`], for a message in chat `chat_id` that `user_id` can see.
    ///
    /// # Panics
    /// When chat `chat_id` has no bot message `message_id`.
    pub fn press_in(&self, chat_id: i64, user_id: i64, message_id: i64, data: &str) -> String {
        let id = {
            let mut st = self.inner.lock();
            let m = st
                .chats
                .get(&chat_id)
                .and_then(|c| c.iter().find(|m| m.message_id == message_id && m.from_bot))
                .cloned()
                .unwrap_or_else(|| panic!("chat {chat_id} has no bot message {message_id}"));
            st.next_query += 1;
            let id = format!("{}{:06}", 8_700_000_000_000u64 + user_id.unsigned_abs(), st.next_query);
            st.next_update += 1;
            let update_id = st.next_update;
            let mut message = message_json(chat_id, &m);
            message["chat"]["type"] = json!(if chat_id == user_id { "private" } else { "group" });
            st.updates.push(json!({ "update_id": update_id, "callback_query": {
                "id": id,
                "from": { "id": user_id, "is_bot": false, "first_name": format!("User {user_id}"), "username": format!("user{user_id}") },
                "message": message,
                "chat_instance": format!("-{}", chat_id.unsigned_abs() + 77),
                "data": data,
            }}));
            st.open_queries.insert(id.clone());
            id
        };
        self.inner.bump();
        id
    }

    /// Every `answerCallbackQuery` accepted so far, in order.
    pub fn answers(&self) -> Vec<CallbackAnswer> {
        self.inner.lock().answers.clone()
    }

    /// The answer to callback query `id`, once the bot answered it.
    pub fn answer_of(&self, id: &str) -> Option<CallbackAnswer> {
        self.answers().into_iter().find(|a| a.id == id)
    }

    /// A file the bot may fetch (`getFile` then the download); its `file_path`.
    pub fn put_file(&self, file_id: &str, bytes: &[u8]) -> String {
        let path = format!("documents/{file_id}");
        self.inner.lock().files.insert(file_id.to_owned(), (path.clone(), bytes.to_vec()));
        path
    }

    /// A user's photo in a private chat: one `PhotoSize` per `(width, height, bytes)` (smallest
    /// first, as Telegram lists them), each fetchable, with an optional caption; its update_id.
    pub fn push_photo(&self, user_id: i64, sizes: &[(u32, u32, &[u8])], caption: Option<&str>) -> i64 {
        let n = self.inner.lock().next_update;
        let photo: Vec<Value> = sizes
            .iter()
            .enumerate()
            .map(|(i, (w, h, bytes))| {
                let id = format!("photo-{n}-{i}");
                let path = format!("photos/file_{n}_{i}.jpg");
                self.inner.lock().files.insert(id.clone(), (path, bytes.to_vec()));
                json!({ "file_id": id, "file_unique_id": format!("u-{id}"), "width": w, "height": h, "file_size": bytes.len() })
            })
            .collect();
        let mut message = self.user_message(user_id);
        message["photo"] = json!(photo);
        if let Some(c) = caption {
            message["caption"] = json!(c);
        }
        self.push_raw(json!({ "message": message }))
    }

    /// A user's file sent as a document (`name`, `mime`), fetchable, with an optional caption;
    /// `declared_size` overrides the `file_size` Telegram states (a lie, or a file too big to
    /// hand over); its update_id.
    pub fn push_document(
        &self,
        user_id: i64,
        name: &str,
        mime: &str,
        bytes: &[u8],
        caption: Option<&str>,
        declared_size: Option<u64>,
    ) -> i64 {
        let n = self.inner.lock().next_update;
        let id = format!("doc-{n}");
        self.put_file(&id, bytes);
        let mut message = self.user_message(user_id);
        message["document"] = json!({ "file_id": id, "file_unique_id": format!("u-{id}"), "file_name": name,
            "mime_type": mime, "file_size": declared_size.unwrap_or(bytes.len() as u64) });
        if let Some(c) = caption {
            message["caption"] = json!(c);
        }
        self.push_raw(json!({ "message": message }))
    }

    /// How many times the file at `file_path` was downloaded; every download when `None`.
    pub fn downloads(&self, file_path: Option<&str>) -> u32 {
        let st = self.inner.lock();
        match file_path {
            Some(p) => st.downloads.get(p).copied().unwrap_or(0),
            None => st.downloads.values().sum(),
        }
    }

    /// A private-chat message from `user_id` without content yet (the caller adds it).
    fn user_message(&self, user_id: i64) -> Value {
        let mut st = self.inner.lock();
        st.next_message += 1;
        json!({ "message_id": st.next_message, "date": 0,
            "from": { "id": user_id, "is_bot": false, "first_name": format!("User {user_id}"), "username": format!("user{user_id}") },
            "chat": { "id": user_id, "type": "private" } })
    }

    /// Answers the next call of `method` with `fault` (queued faults apply in order).
    pub fn fail_next(&self, method: &str, fault: Fault) {
        self.inner.lock().faults.push_back((method.to_owned(), fault));
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.inner.lock().calls.clone()
    }

    /// The calls of `method` so far.
    pub fn calls_of(&self, method: &str) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.method == method).collect()
    }

    /// Chat `chat_id` as a person sees it, oldest first.
    pub fn chat(&self, chat_id: i64) -> Vec<Shown> {
        self.inner.lock().chats.get(&chat_id).cloned().unwrap_or_default()
    }

    /// The bot's messages in chat `chat_id`, oldest first.
    pub fn bot_messages(&self, chat_id: i64) -> Vec<Shown> {
        self.chat(chat_id).into_iter().filter(|m| m.from_bot).collect()
    }

    /// Waits until `done` holds of the fake (checked after every change), at most `timeout`.
    ///
    /// # Errors
    /// When the deadline passes; the message says `what` and shows the last calls.
    pub async fn wait(&self, what: &str, timeout: Duration, done: impl Fn(&Self) -> bool) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut version = self.inner.version.subscribe();
        loop {
            if done(self) {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, version.changed()).await.is_err() {
                let calls: Vec<String> = self
                    .calls()
                    .iter()
                    .rev()
                    .take(12)
                    .rev()
                    .map(|c| format!("{:?} {} {} {}", c.at, c.method, c.status, c.params))
                    .collect();
                anyhow::bail!("timed out waiting for {what}; last calls:\n{}", calls.join("\n"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telegram_html_is_checked_as_the_bot_api_does() {
        assert!(check_html("<b>bold</b> &lt;script&gt; &amp; <a href=\"https://x\">l</a>").is_ok());
        assert!(check_html("<pre><code class=\"language-rust\">x</code></pre>").is_ok());
        assert!(check_html("<script>x</script>").unwrap_err().contains("unsupported start tag"));
        assert!(check_html("<b>open").unwrap_err().contains("end tag"));
        assert!(check_html("<b><i>x</b></i>").unwrap_err().contains("unmatched"));
        assert!(check_html("a & b").unwrap_err().contains("entity"));
        assert!(check_html("a > b").is_err());
        assert_eq!(visible("<b>a</b> &lt;&amp;"), "a <&");
    }

    #[test]
    fn inline_keyboards_are_checked_as_the_bot_api_does() {
        let p = json!({ "reply_markup": { "inline_keyboard": [[{ "text": "Allow", "callback_data": "a:1" },
            { "text": "Docs", "url": "https://x" }]] } });
        let k = keyboard(&p).unwrap();
        assert_eq!(k[0][0], Button { text: "Allow".into(), data: "a:1".into() });
        assert_eq!(k[0][1].data, "");
        let form = json!({ "reply_markup": "{\"inline_keyboard\":[[{\"text\":\"x\",\"callback_data\":\"y\"}]]}" });
        assert_eq!(keyboard(&form).unwrap()[0][0].data, "y");
        let long =
            json!({ "reply_markup": { "inline_keyboard": [[{ "text": "x", "callback_data": "d".repeat(65) }]] } });
        assert!(keyboard(&long).unwrap_err().1["description"].as_str().unwrap().contains("BUTTON_DATA_INVALID"));
        let two =
            json!({ "reply_markup": { "inline_keyboard": [[{ "text": "x", "callback_data": "d", "url": "u" }]] } });
        assert!(keyboard(&two).is_err());
        assert!(keyboard(&json!({})).unwrap().is_empty());
        assert_eq!(update_type(&json!({ "update_id": 1, "callback_query": {} })), "callback_query");
    }
}
