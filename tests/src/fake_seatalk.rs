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
//!   `{code: 4, message}` (logged as refused).
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
    /// `message.text.format` (1 markdown, 2 plain) and `message.text.content`.
    pub format: i64,
    pub content: String,
    /// Whether the fake accepted it (`code: 0`).
    pub accepted: bool,
}

#[derive(Default)]
struct State {
    app_id: String,
    app_secret: String,
    ttl_s: i64,
    /// Issued tokens: (token, expire Unix s, revoked).
    tokens: Vec<(String, i64, bool)>,
    token_requests: usize,
    messages: Vec<Sent>,
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
    if endpoint != "single_chat" && endpoint != "group_chat" {
        return StatusCode::NOT_FOUND.into_response();
    }
    let bearer = headers
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .unwrap_or("")
        .to_owned();
    let mut st = st.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let valid = st.tokens.iter().any(|(t, exp, revoked)| *t == bearer && *exp > now_s() && !revoked);
    if !valid {
        return axum::Json(json!({ "code": 100, "message": "app access token expired" })).into_response();
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, axum::Json(json!({ "code": 2, "message": "bad json" }))).into_response();
    };
    let to_key = if endpoint == "single_chat" { "employee_code" } else { "group_id" };
    let to = v[to_key].as_str().unwrap_or("").to_owned();
    let content = v.pointer("/message/text/content").and_then(Value::as_str).unwrap_or("").to_owned();
    let format = v.pointer("/message/text/format").and_then(Value::as_i64).unwrap_or(0);
    let tag_ok = v.pointer("/message/tag").and_then(Value::as_str) == Some("text");
    let accepted = tag_ok && !to.is_empty() && !content.is_empty() && content.len() <= 4096 && matches!(format, 1 | 2);
    let n = st.messages.len();
    st.messages.push(Sent { endpoint: endpoint.clone(), to, format, content, accepted });
    if accepted {
        axum::Json(json!({ "code": 0, "message_id": format!("msg-{n}") })).into_response()
    } else {
        axum::Json(json!({ "code": 4, "message": "invalid message" })).into_response()
    }
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
/// `image`, its content a URL of the platform's).
pub fn single_image(event_id: &str, employee_code: &str) -> Vec<u8> {
    let url = format!("https://openapi.seatalk.io/messaging/v2/file/{event_id}");
    from_subscriber(event_id, employee_code, json!({ "tag": "image", "image": { "content": url } }))
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
