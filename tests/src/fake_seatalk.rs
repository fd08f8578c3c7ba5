//! A fake SeaTalk Open Platform on loopback (real HTTP), following the documented wire format
//! the SeaTalk adapter (`services/chat/src/channels/seatalk.rs`) speaks:
//!
//! - `POST /auth/app_access_token` `{app_id, app_secret}` → `{code: 0, app_access_token,
//!   expire}` (Unix seconds; lifetime [`FakeSeatalk::set_token_ttl`], default 7,200 s); a wrong
//!   app id or secret → `{code: 1, message}` with HTTP 200 as the platform does;
//! - `POST /messaging/v2/single_chat` `{employee_code, message}` and
//!   `POST /messaging/v2/group_chat` `{group_id, message}`, `Authorization: Bearer <token>`:
//!   a token it issued that is neither expired nor revoked ([`FakeSeatalk::revoke_tokens`]) →
//!   `{code: 0, message_id}` and the message logged ([`FakeSeatalk::messages`]); else HTTP 200
//!   `{code: 100, message: "app access token expired"}`; a text `content` over 4,096 bytes →
//!   `{code: 4, message}` (logged as refused). A `message` is `{tag: "text", text: {format,
//!   content}}` or an interactive message card `{tag: "interactive_message",
//!   interactive_message: {elements}}` whose elements are `title` `{text}`, `description`
//!   `{format?, text}` and `button` `{button_type: "callback", text, value}` (or `redirect`);
//!   anything else in a card is refused (`code: 4`);
//! - `POST /messaging/v2/update` `{message_id, message: {interactive_message: {elements}}}`
//!   (SeaTalk's "Update Message"): a card this fake sent → `{code: 0}`, the card's elements
//!   replaced ([`FakeSeatalk::card`], [`FakeSeatalk::updates`]); another id, a text message or
//!   any update after [`FakeSeatalk::refuse_updates`] → `{code: 4}`;
//! - `GET /messaging/v2/file/{id}` with a valid `Bearer` token: the bytes of a file
//!   [`FakeSeatalk::add_file`] registered, with its `Content-Type` (downloads counted,
//!   [`FakeSeatalk::downloads`]); HTTP 401 without a valid token, 404 for an unknown id.
//!
//! And the other direction, the platform calling Coffer: [`signed_callback`] /
//! [`Callback`] POST an event callback, signed as SeaTalk signs them (`Signature` =
//! lowercase hex `sha256(body ‖ signing secret)`), to coffer-callback's port.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sha2::Digest;
use tokio::task::JoinHandle;

/// One message the fake received on a send-message endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// `single_chat` or `group_chat`.
    pub endpoint: String,
    /// The employee code or group id it went to.
    pub to: String,
    /// `message.text.format` (1 markdown, 2 plain) and `message.text.content`; for a card,
    /// format 0 and its visible text ([`card_text`]) as sent.
    pub format: i64,
    pub content: String,
    /// Whether the fake accepted it (`code: 0`).
    pub accepted: bool,
    /// The `message_id` it answered (empty when refused).
    pub message_id: String,
    /// An interactive message card's elements as sent (`None` for a text message).
    pub card: Option<Value>,
}

/// One `POST /messaging/v2/update` the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub message_id: String,
    /// The new elements' visible text ([`card_text`]).
    pub content: String,
    pub accepted: bool,
}

/// A card's visible text: each title and description on its own line, then each button as
/// `[label]`.
pub fn card_text(elements: &Value) -> String {
    let mut lines = Vec::new();
    for e in elements.as_array().into_iter().flatten() {
        match e["element_type"].as_str() {
            Some("title") => lines.push(e["title"]["text"].as_str().unwrap_or("").to_owned()),
            Some("description") => lines.push(e["description"]["text"].as_str().unwrap_or("").to_owned()),
            Some("button") => lines.push(format!("[{}]", e["button"]["text"].as_str().unwrap_or(""))),
            _ => {}
        }
    }
    lines.join("\n")
}

/// Whether `elements` follow the card rules this fake checks: a non-empty array of known
/// elements, each with its non-empty text; a callback button with a `value` of 1–256 bytes.
fn card_ok(elements: &Value) -> bool {
    let Some(list) = elements.as_array().filter(|l| !l.is_empty() && l.len() <= 20) else { return false };
    let text = |v: &Value| v.as_str().is_some_and(|t| !t.is_empty());
    list.iter().all(|e| match e["element_type"].as_str() {
        Some("title") => text(&e["title"]["text"]),
        Some("description") => {
            text(&e["description"]["text"])
                && e["description"].get("format").is_none_or(|f| matches!(f.as_i64(), Some(1 | 2)))
        }
        Some("button") => match e["button"]["button_type"].as_str() {
            Some("callback") => {
                text(&e["button"]["text"])
                    && e["button"]["value"].as_str().is_some_and(|v| !v.is_empty() && v.len() <= 256)
            }
            Some("redirect") => text(&e["button"]["text"]),
            _ => false,
        },
        _ => false,
    })
}

/// A file registered with [`FakeSeatalk::add_file`].
struct File {
    data: Vec<u8>,
    content_type: String,
}

#[derive(Default)]
struct State {
    app_id: String,
    app_secret: String,
    ttl_s: i64,
    /// Card updates are answered `code: 4` (as SeaTalk answers one past its 7 days).
    refuse_updates: bool,
    /// Issued tokens: (token, expire Unix s, revoked).
    tokens: Vec<(String, i64, bool)>,
    token_requests: usize,
    messages: Vec<Sent>,
    updates: Vec<Update>,
    /// Cards by message id: their current elements.
    cards: std::collections::HashMap<String, Value>,
    files: std::collections::HashMap<String, File>,
    downloads: Vec<String>,
}

/// The fake platform; stops when dropped.
pub struct FakeSeatalk {
    /// Its base URL (`http://127.0.0.1:port`), the channel's `api_base_url`.
    pub url: String,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for FakeSeatalk {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

impl FakeSeatalk {
    /// A fake for the app `app_id` / `app_secret`, listening on a free loopback port.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(app_id: &str, app_secret: &str) -> anyhow::Result<Self> {
        let state = Arc::new(Mutex::new(State {
            app_id: app_id.to_owned(),
            app_secret: app_secret.to_owned(),
            ttl_s: 7200,
            ..State::default()
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let st = state.clone();
        let app = axum::Router::new()
            .route("/auth/app_access_token", axum::routing::post(token))
            .route("/messaging/v2/{endpoint}", axum::routing::post(send))
            .route("/messaging/v2/file/{id}", axum::routing::get(file))
            .with_state(st);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, state, task })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The lifetime of tokens issued from now on (seconds; ≤ 60 makes the adapter's 60 s
    /// margin treat them as expired at once, so each send fetches a fresh one).
    pub fn set_token_ttl(&self, ttl_s: i64) {
        self.lock().ttl_s = ttl_s;
    }

    /// Accepts `app_secret` from now on (the app's secret was rotated on the platform: the old
    /// one is refused at the next token request).
    pub fn set_app_secret(&self, app_secret: &str) {
        self.lock().app_secret = app_secret.to_owned();
    }

    /// Revokes every token issued so far: the next send with one is answered code 100.
    pub fn revoke_tokens(&self) {
        for t in &mut self.lock().tokens {
            t.2 = true;
        }
    }

    /// How many access-token requests it answered (right credentials or not).
    pub fn token_requests(&self) -> usize {
        self.lock().token_requests
    }

    /// Every message sent to it, in order.
    pub fn messages(&self) -> Vec<Sent> {
        self.lock().messages.clone()
    }

    /// Refuses every card update from now on (`{code: 4}`, as for a card older than 7 days).
    pub fn refuse_updates(&self) {
        self.lock().refuse_updates = true;
    }

    /// Every card update it received, in order.
    pub fn updates(&self) -> Vec<Update> {
        self.lock().updates.clone()
    }

    /// The current visible text of the card `message_id` (after its accepted updates).
    pub fn card(&self, message_id: &str) -> Option<String> {
        self.lock().cards.get(message_id).map(card_text)
    }

    /// Serves `data` as `Content-Type: content_type` at a new file URL of this fake (what an
    /// image or file message sent to the bot carries); returns the URL.
    pub fn add_file(&self, data: &[u8], content_type: &str) -> String {
        let mut st = self.lock();
        let id = format!("f{}x{:08x}", st.files.len(), fastrand::u32(..));
        st.files.insert(id.clone(), File { data: data.to_vec(), content_type: content_type.to_owned() });
        format!("{}/messaging/v2/file/{id}", self.url)
    }

    /// How many files were downloaded (with a valid token).
    pub fn downloads(&self) -> usize {
        self.lock().downloads.len()
    }

    /// Waits until the card `message_id` shows `needle`.
    ///
    /// # Errors
    /// At the deadline, with the card's text.
    pub async fn wait_card(&self, message_id: &str, needle: &str, timeout: Duration) -> anyhow::Result<String> {
        crate::wait_for(&format!("card {message_id} showing {needle:?}"), timeout, || async {
            Ok(self.card(message_id).filter(|c| c.contains(needle)))
        })
        .await
    }

    /// Waits until `pred` holds for the message log, or `timeout` passes.
    ///
    /// # Errors
    /// At the deadline, with the log.
    pub async fn wait_messages(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&[Sent]) -> bool,
    ) -> anyhow::Result<Vec<Sent>> {
        crate::wait_for(what, timeout, || async {
            let m = self.messages();
            Ok(pred(&m).then_some(m))
        })
        .await
    }
}

async fn token(axum::extract::State(st): axum::extract::State<Arc<Mutex<State>>>, body: axum::body::Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut st = st.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    st.token_requests += 1;
    let (id, secret) = (v["app_id"].as_str().unwrap_or(""), v["app_secret"].as_str().unwrap_or(""));
    if id != st.app_id || secret != st.app_secret {
        return axum::Json(json!({ "code": 1, "message": "invalid app_id or app_secret" })).into_response();
    }
    let n = st.tokens.len();
    let t = format!("fake-token-{n}-{:08x}", fastrand::u32(..));
    let expire = now_s() + st.ttl_s;
    st.tokens.push((t.clone(), expire, false));
    axum::Json(json!({ "code": 0, "app_access_token": t, "expire": expire })).into_response()
}

async fn send(
    axum::extract::State(st): axum::extract::State<Arc<Mutex<State>>>,
    axum::extract::Path(endpoint): axum::extract::Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if endpoint != "single_chat" && endpoint != "group_chat" && endpoint != "update" {
        return StatusCode::NOT_FOUND.into_response();
    }
    let mut st = st.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !st.bearer_ok(&headers) {
        return axum::Json(json!({ "code": 100, "message": "app access token expired" })).into_response();
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, axum::Json(json!({ "code": 2, "message": "bad json" }))).into_response();
    };
    let invalid = || axum::Json(json!({ "code": 4, "message": "invalid message" })).into_response();
    if endpoint == "update" {
        let message_id = v["message_id"].as_str().unwrap_or("").to_owned();
        let elements = v.pointer("/message/interactive_message/elements").cloned().unwrap_or(Value::Null);
        let accepted = !st.refuse_updates && st.cards.contains_key(&message_id) && card_ok(&elements);
        st.updates.push(Update { message_id: message_id.clone(), content: card_text(&elements), accepted });
        if !accepted {
            return invalid();
        }
        st.cards.insert(message_id, elements);
        return axum::Json(json!({ "code": 0 })).into_response();
    }
    let to_key = if endpoint == "single_chat" { "employee_code" } else { "group_id" };
    let to = v[to_key].as_str().unwrap_or("").to_owned();
    let n = st.messages.len();
    let message_id = format!("msg-{n}");
    let (format, content, card, accepted) = match v.pointer("/message/tag").and_then(Value::as_str) {
        Some("text") => {
            let content = v.pointer("/message/text/content").and_then(Value::as_str).unwrap_or("").to_owned();
            let format = v.pointer("/message/text/format").and_then(Value::as_i64).unwrap_or(0);
            let ok = !content.is_empty() && content.len() <= 4096 && matches!(format, 1 | 2);
            (format, content, None, ok)
        }
        Some("interactive_message") => {
            let elements = v.pointer("/message/interactive_message/elements").cloned().unwrap_or(Value::Null);
            let ok = card_ok(&elements);
            (0, card_text(&elements), Some(elements), ok)
        }
        _ => (0, String::new(), None, false),
    };
    let accepted = accepted && !to.is_empty();
    if accepted && let Some(elements) = &card {
        st.cards.insert(message_id.clone(), elements.clone());
    }
    let message_id = if accepted { message_id } else { String::new() };
    st.messages.push(Sent {
        endpoint: endpoint.clone(),
        to,
        format,
        content,
        accepted,
        message_id: message_id.clone(),
        card,
    });
    if accepted { axum::Json(json!({ "code": 0, "message_id": message_id })).into_response() } else { invalid() }
}

impl State {
    /// Whether the request carries a token this fake issued that is neither expired nor
    /// revoked.
    fn bearer_ok(&self, headers: &HeaderMap) -> bool {
        let bearer = headers
            .get("authorization")
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .unwrap_or("");
        self.tokens.iter().any(|(t, exp, revoked)| t == bearer && *exp > now_s() && !revoked)
    }
}

async fn file(
    axum::extract::State(st): axum::extract::State<Arc<Mutex<State>>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    let mut st = st.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !st.bearer_ok(&headers) {
        return (StatusCode::UNAUTHORIZED, axum::Json(json!({ "code": 100, "message": "app access token expired" })))
            .into_response();
    }
    let Some(f) = st.files.get(&id) else { return StatusCode::NOT_FOUND.into_response() };
    let answer = ([(axum::http::header::CONTENT_TYPE, f.content_type.clone())], f.data.clone()).into_response();
    st.downloads.push(id);
    answer
}

/// SeaTalk's signature of `body` under `signing_secret`.
pub fn sign(body: &[u8], signing_secret: &str) -> String {
    let mut h = sha2::Sha256::new();
    h.update(body);
    h.update(signing_secret.as_bytes());
    hex::encode(h.finalize())
}

/// The event envelope SeaTalk posts: `{event_id, event_type, timestamp, app_id, event}`.
pub fn envelope(event_id: &str, event_type: &str, event: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "event_id": event_id, "event_type": event_type, "timestamp": now_s(), "app_id": "fake-app", "event": event,
    }))
    .expect("json")
}

/// A verification event (`event_verification` with `seatalk_challenge`).
pub fn verification(challenge: &str) -> Vec<u8> {
    envelope(&format!("verify-{challenge}"), "event_verification", json!({ "seatalk_challenge": challenge }))
}

/// A one-to-one message from `employee_code` to the bot.
pub fn single_message(event_id: &str, employee_code: &str, text: &str) -> Vec<u8> {
    from_subscriber(event_id, employee_code, json!({ "tag": "text", "text": { "content": text } }))
}

/// An image sent to the bot in a one-to-one chat by `employee_code` (a message whose `tag` is
/// `image`, its content the download URL `url`, e.g. from [`FakeSeatalk::add_file`]).
pub fn single_image(event_id: &str, employee_code: &str, url: &str) -> Vec<u8> {
    from_subscriber(event_id, employee_code, json!({ "tag": "image", "image": { "content": url } }))
}

/// A file sent to the bot in a one-to-one chat (`tag` `file`, `file.content` the download URL,
/// `file.filename` as the sender named it).
pub fn single_file(event_id: &str, employee_code: &str, url: &str, filename: &str) -> Vec<u8> {
    from_subscriber(event_id, employee_code, json!({ "tag": "file", "file": { "content": url, "filename": filename } }))
}

/// A video sent to the bot in a one-to-one chat (`tag` `video`, a URL of the platform's).
pub fn single_video(event_id: &str, employee_code: &str) -> Vec<u8> {
    let url = format!("https://openapi.seatalk.io/messaging/v2/file/{event_id}");
    from_subscriber(event_id, employee_code, json!({ "tag": "video", "video": { "content": url } }))
}

/// An `interactive_message_click`: `employee_code` clicked the button whose `value` is `value`
/// on the card `message_id` (in a one-to-one chat: `group_id` empty).
pub fn click(event_id: &str, employee_code: &str, message_id: &str, value: &str) -> Vec<u8> {
    envelope(
        event_id,
        "interactive_message_click",
        json!({
            "message_id": message_id, "employee_code": employee_code,
            "email": format!("{employee_code}@example.com"), "value": value,
            "seatalk_id": format!("st-{employee_code}"), "group_id": "", "thread_id": "",
        }),
    )
}

/// A `message_from_bot_subscriber` event from `employee_code` carrying `message` (its fields
/// besides `message_id`, which is made from `event_id`).
fn from_subscriber(event_id: &str, employee_code: &str, mut message: serde_json::Value) -> Vec<u8> {
    message["message_id"] = json!(format!("m-{event_id}"));
    envelope(
        event_id,
        "message_from_bot_subscriber",
        json!({
            "seatalk_id": format!("st-{employee_code}"), "employee_code": employee_code,
            "email": format!("{employee_code}@example.com"), "message": message,
        }),
    )
}

/// A group message from `employee_code` in `group_id` that mentions the bot `bot_name`
/// (`@bot_name text`).
pub fn group_mention(event_id: &str, group_id: &str, employee_code: &str, bot_name: &str, text: &str) -> Vec<u8> {
    envelope(
        event_id,
        "new_mentioned_message_received_from_group_chat",
        json!({
            "group_id": group_id,
            "message": {
                "message_id": format!("m-{event_id}"), "tag": "text",
                "sender": { "seatalk_id": format!("st-{employee_code}"), "employee_code": employee_code, "email": "" },
                "text": { "plain_text": format!("@{bot_name} {text}"), "mentioned_list": [{ "username": bot_name, "seatalk_id": "st-bot" }] },
            },
        }),
    )
}

/// The platform's side of coffer-callback: POSTs event callbacks to `127.0.0.1:port`.
pub struct Callback {
    pub port: u16,
    http: reqwest::Client,
}

/// coffer-callback's answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Callback {
    /// A client of coffer-callback on `port`. Every request on a fresh connection (as a webhook
    /// sender makes them): a body refused unread (413) leaves its connection unusable, and a
    /// pooled one could otherwise be reset under the next request.
    pub fn new(port: u16) -> Self {
        coffer_runtime::tls::ensure_provider();
        let http = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            .build()
            .expect("reqwest client builds");
        Self { port, http }
    }

    /// POSTs `body` to `/seatalk/{channel}` with the `Signature` header `signature` (none when
    /// `None`).
    ///
    /// # Errors
    /// Transport failures.
    pub async fn post(&self, channel: &str, body: Vec<u8>, signature: Option<&str>) -> anyhow::Result<Answer> {
        let mut req = self
            .http
            .post(format!("http://127.0.0.1:{}/seatalk/{channel}", self.port))
            .body(body)
            .header("content-type", "application/json");
        if let Some(s) = signature {
            req = req.header("Signature", s);
        }
        let r = req.send().await?;
        let status = r.status().as_u16();
        let body = r.json().await.unwrap_or(Value::Null);
        Ok(Answer { status, body })
    }

    /// POSTs `body` signed with `signing_secret`, as SeaTalk does.
    ///
    /// # Errors
    /// Transport failures.
    pub async fn signed(&self, channel: &str, body: Vec<u8>, signing_secret: &str) -> anyhow::Result<Answer> {
        let sig = sign(&body, signing_secret);
        self.post(channel, body, Some(&sig)).await
    }
}

/// POSTs a signed event callback to coffer-callback on `port` (see [`Callback::signed`]).
///
/// # Errors
/// Transport failures.
pub async fn signed_callback(port: u16, channel: &str, body: Vec<u8>, signing_secret: &str) -> anyhow::Result<Answer> {
    Callback::new(port).signed(channel, body, signing_secret).await
}
