//! Fake LLM providers on loopback (real HTTP), one per wire of `coffer_llm::Wire`, speaking the
//! documented formats the clients of `services/llm` follow: Anthropic Messages (`POST
//! /v1/messages`, `GET /v1/models`), OpenAI Responses (`POST /v1/responses`), OpenAI Chat
//! Completions (`POST /v1/chat/completions`; both OpenAI wires `GET /v1/models`) and Ollama
//! (`POST /api/chat`, `GET /api/tags`) — streamed (server-sent events; Ollama's
//! newline-delimited JSON) or not, as the request asks.
//!
//! What the fake model answers is decided per model request, in this order:
//! 1. the **script**: a queue of [`Reply`]s ([`FakeLlm::push`], [`FakeLlm::script`]), one per
//!    request — text (streamed one delta per word), tool calls (one or several, with
//!    arguments; streamed in pieces), or a [`Fault`] (an HTTP status with the wire's error
//!    body and `retry-after`, garbage, a stream cut mid-way, a stall, a hang, an error event
//!    mid-stream);
//! 2. else the **rule** ([`FakeLlm::set_rule`]): a closure that sees the request in a
//!    wire-neutral form ([`Seen`]: messages, tool calls and results, tools offered) and picks
//!    the reply — a model that searches, reads the tool's result and then cites it;
//! 3. else the **default** ([`FakeLlm::set_default`]; initially the text
//!    `Hello from the fake model (model=M).`).
//!
//! Anthropic's fake also answers `POST /v1/messages/count_tokens` (Claude Code asks it), so
//! the real CLI can be pointed at it. Every request is recorded ([`Recorded`]): method, path, headers without the key, which auth
//! header carried a key and the SHA-256 of that key (never the key), whether it matched the key
//! the fake expects ([`FakeLlm::require_key`]: a request without it is answered 401), and the
//! body. The models endpoints answer [`FakeLlm::set_models`]'s list (`None`: 404). Token usage
//! is [`INPUT_TOKENS`] and [`OUTPUT_TOKENS`] on every answer.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use coffer_llm::Wire;
use serde_json::{Value, json};
use sha2::Digest;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The input tokens every answer reports.
pub const INPUT_TOKENS: u64 = 25;
/// The output tokens every answer reports.
pub const OUTPUT_TOKENS: u64 = 7;
/// Longest a [`Fault::Hang`] or [`Fault::Stall`] holds its connection (the fake's drop ends it
/// sooner): a bound, so a test that forgets its timeout still ends.
const HOLD_AT_MOST: Duration = Duration::from_secs(120);

/// A tool call the fake model makes.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The call id; `None` = made up (`toolu_fake_N`, `call_fake_N`; Ollama sends none).
    pub id: Option<String>,
    /// The tool's name.
    pub name: String,
    /// The arguments (a JSON object).
    pub input: Value,
}

impl Call {
    /// A call of `name` with `input` and a made-up id.
    pub fn new(name: &str, input: Value) -> Self {
        Self { id: None, name: name.to_owned(), input }
    }
}

/// A failure the fake provider plays.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// That HTTP status with the wire's JSON error body (its error type for the status, and
    /// `message`, default `fake error N`), and a `retry-after` header when given (seconds or
    /// an HTTP date, sent as is).
    Status {
        /// The HTTP status.
        status: u16,
        /// The `retry-after` header's value.
        retry_after: Option<String>,
        /// The error body's message.
        message: Option<String>,
    },
    /// Status 200 and a body that is not the wire's format.
    Garbage,
    /// The stream's start and two text deltas, then the body ends before its terminal event.
    Cut,
    /// The stream's start and one text delta, then nothing, the connection held open.
    Stall,
    /// No answer at all (not even headers), the connection held open.
    Hang,
    /// The stream's start, one text delta, then the wire's error event (`overloaded_error`,
    /// `response.failed` with `server_error`, an `error` chunk or line).
    StreamError,
    /// A whole answer whose one text delta is [`OVERSIZED_DELTA_BYTES`] long (over the
    /// clients' 16 MiB bound on one event or line).
    Oversized,
}

/// The length of [`Fault::Oversized`]'s one text delta, bytes.
pub const OVERSIZED_DELTA_BYTES: usize = 17 << 20;

/// What the fake model answers to one model request.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Text, stop reason end of turn.
    Text(String),
    /// Text cut by the token limit (stop reason `max_tokens` / `length` / incomplete).
    MaxTokens(String),
    /// Optional text, then tool calls, stop reason tool use.
    Tools {
        /// Text before the calls.
        text: Option<String>,
        /// The calls, in order.
        calls: Vec<Call>,
    },
    /// A failure.
    Fault(Fault),
}

impl Reply {
    /// Text.
    pub fn text(t: &str) -> Self {
        Self::Text(t.to_owned())
    }

    /// One tool call with a made-up id.
    pub fn tool(name: &str, input: Value) -> Self {
        Self::Tools { text: None, calls: vec![Call::new(name, input)] }
    }

    /// Several tool calls.
    pub fn tools(calls: Vec<Call>) -> Self {
        Self::Tools { text: None, calls }
    }

    /// An HTTP status with the wire's error body.
    pub fn status(status: u16) -> Self {
        Self::Fault(Fault::Status { status, retry_after: None, message: None })
    }

    /// A 429 with `retry-after: value`.
    pub fn rate_limited(retry_after: &str) -> Self {
        Self::Fault(Fault::Status { status: 429, retry_after: Some(retry_after.to_owned()), message: None })
    }

    /// A fault.
    pub fn fault(f: Fault) -> Self {
        Self::Fault(f)
    }
}

/// A tool result the model was sent.
#[derive(Debug, Clone, PartialEq)]
pub struct SeenResult {
    /// The call id it answers (Ollama: the tool's name, it has no ids).
    pub id: String,
    /// Its text.
    pub content: String,
    /// Whether it was marked failed (Anthropic `is_error`; other wires have no flag).
    pub is_error: bool,
}

/// One message of a request, whatever the wire.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SeenMessage {
    /// `user` or `assistant` (tool results are in `user` messages, as Anthropic has them).
    pub role: String,
    /// Its text parts, joined.
    pub text: String,
    /// The tool calls of an assistant message.
    pub tool_calls: Vec<Call>,
    /// The tool results of a user message.
    pub tool_results: Vec<SeenResult>,
}

/// A model request, whatever the wire.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Seen {
    /// The `model`.
    pub model: String,
    /// The system prompt (Anthropic `system`, Responses `instructions`, a `system` message).
    pub system: Option<String>,
    /// The conversation.
    pub messages: Vec<SeenMessage>,
    /// Names of the tools offered.
    pub tools: Vec<String>,
    /// Whether it asked for a stream.
    pub stream: bool,
    /// Its token limit (`max_tokens`, `max_output_tokens`, `max_completion_tokens`,
    /// `options.num_predict`).
    pub max_tokens: Option<u64>,
}

impl Seen {
    /// The text of the latest user message that has text.
    pub fn last_user_text(&self) -> &str {
        self.messages.iter().rev().find(|m| m.role == "user" && !m.text.is_empty()).map_or("", |m| m.text.as_str())
    }

    /// Every tool result in the conversation, in order.
    pub fn tool_results(&self) -> Vec<&SeenResult> {
        self.messages.iter().flat_map(|m| m.tool_results.iter()).collect()
    }

    /// The tool results after the model's latest message (what it has not answered yet).
    pub fn new_tool_results(&self) -> Vec<&SeenResult> {
        let start = self.messages.iter().rposition(|m| m.role == "assistant").map_or(0, |i| i + 1);
        self.messages[start..].iter().flat_map(|m| m.tool_results.iter()).collect()
    }

    /// Every tool call the model made in the conversation, in order.
    pub fn tool_calls(&self) -> Vec<&Call> {
        self.messages.iter().flat_map(|m| m.tool_calls.iter()).collect()
    }

    /// Whether `tool` is offered.
    pub fn offers(&self, tool: &str) -> bool {
        self.tools.iter().any(|t| t == tool)
    }
}

/// The key a request carried, as recorded (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenKey {
    /// The header it came in: `x-api-key` or `authorization` (bearer).
    pub header: String,
    /// Hex SHA-256 of the key (the bearer token without `Bearer `).
    pub sha256: String,
    /// Whether it is the key [`FakeLlm::require_key`] expects (`None` when none is expected).
    pub matches: Option<bool>,
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// `GET`, `POST`.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers, lowercase names, without `x-api-key` and `authorization`.
    pub headers: Vec<(String, String)>,
    /// The key it carried.
    pub key: Option<SeenKey>,
    /// The JSON body (`Null` when none or not JSON).
    pub body: Value,
    /// The model request, wire-neutral (`None` for other requests).
    pub seen: Option<Seen>,
}

impl Recorded {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Whether it carried exactly `key`.
    pub fn carried_key(&self, key: &str) -> bool {
        self.key.as_ref().is_some_and(|k| k.sha256 == sha256_hex(key))
    }
}

/// Decides the reply to a model request the script does not cover.
pub type Rule = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

struct State {
    script: VecDeque<Reply>,
    rule: Option<Rule>,
    default: Reply,
    models: Option<Vec<String>>,
    key_sha256: Option<String>,
    requests: Vec<Recorded>,
    calls_made: u64,
    pace: Option<Duration>,
}

struct Inner {
    wire: Wire,
    state: Mutex<State>,
    shutdown: watch::Receiver<bool>,
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A fake provider of one wire (ends, with every connection it holds, when dropped).
pub struct FakeLlm {
    /// Its base URL, without `/v1`: `http://127.0.0.1:<port>`.
    pub url: String,
    /// The wire it speaks.
    pub wire: Wire,
    inner: Arc<Inner>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

fn sha256_hex(s: &str) -> String {
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

impl FakeLlm {
    /// Starts a fake of `wire` on a free loopback port, with an empty script, no rule, the
    /// default text reply, models `["fake-large", "fake-small"]` and no key required.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(wire: Wire) -> anyhow::Result<Self> {
        let (shutdown, rx) = watch::channel(false);
        let inner = Arc::new(Inner {
            wire,
            state: Mutex::new(State {
                script: VecDeque::new(),
                rule: None,
                default: Reply::Text(String::new()),
                models: Some(vec!["fake-small".into(), "fake-large".into(), "fake-small".into()]),
                key_sha256: None,
                requests: Vec::new(),
                calls_made: 0,
                pace: None,
            }),
            shutdown: rx,
        });
        let app = axum::Router::new().fallback(handle).with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let mut stop = shutdown.subscribe();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.changed().await;
                })
                .await;
        });
        Ok(Self { url, wire, inner, shutdown, task })
    }

    /// The base URL with `/v1` (as OpenAI clients and Codex take it).
    pub fn url_v1(&self) -> String {
        format!("{}/v1", self.url)
    }

    /// Queues one reply (the next model request without a queued reply gets it).
    pub fn push(&self, reply: Reply) {
        self.inner.lock().script.push_back(reply);
    }

    /// Queues replies, in order.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.inner.lock().script.extend(replies);
    }

    /// Replies queued and not yet used.
    pub fn queued(&self) -> usize {
        self.inner.lock().script.len()
    }

    /// Decides the replies the script does not cover.
    pub fn set_rule(&self, rule: impl Fn(&Seen) -> Reply + Send + Sync + 'static) {
        self.inner.lock().rule = Some(Arc::new(rule));
    }

    /// The reply when neither the script nor a rule decides (`Reply::Text("")` = the
    /// default text naming the model).
    pub fn set_default(&self, reply: Reply) {
        self.inner.lock().default = reply;
    }

    /// The models listing (`None`: the models endpoint answers 404).
    pub fn set_models(&self, models: Option<Vec<String>>) {
        self.inner.lock().models = models;
    }

    /// Waits `pace` before each stream frame after the first (a model producing tokens; `None`
    /// = as fast as possible), so a test can act while an answer is under way.
    pub fn set_pace(&self, pace: Option<Duration>) {
        self.inner.lock().pace = pace;
    }

    /// Answers 401 (the wire's error body) to every request that does not carry `key`.
    pub fn require_key(&self, key: &str) {
        self.inner.lock().key_sha256 = Some(sha256_hex(key));
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.lock().requests.clone()
    }

    /// The model requests so far (not the listings), in order.
    pub fn model_requests(&self) -> Vec<Recorded> {
        self.requests().into_iter().filter(|r| r.seen.is_some()).collect()
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.task.abort();
    }
}

/// The chat path and models path of a wire.
fn paths(wire: Wire) -> (&'static str, &'static str) {
    match wire {
        Wire::Anthropic => ("/v1/messages", "/v1/models"),
        Wire::OpenAiResponses => ("/v1/responses", "/v1/models"),
        Wire::OpenAiChat => ("/v1/chat/completions", "/v1/models"),
        Wire::Ollama => ("/api/chat", "/api/tags"),
    }
}

async fn handle(
    axum::extract::State(f): axum::extract::State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let wire = f.wire;
    let (chat_path, models_path) = paths(wire);
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let key = key_of(wire, &headers);
    let is_chat = method == Method::POST && uri.path() == chat_path;
    let seen = is_chat.then(|| seen(wire, &body));
    let (authorized, reply, models, n, pace) = {
        let mut st = f.lock();
        let expected = st.key_sha256.clone();
        let key =
            key.map(|(header, sha256)| SeenKey { matches: expected.as_ref().map(|e| *e == sha256), header, sha256 });
        let headers = headers
            .iter()
            .filter(|(n, _)| *n != "x-api-key" && *n != "authorization")
            .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let authorized = expected.is_none() || key.as_ref().is_some_and(|k| k.matches == Some(true));
        st.requests.push(Recorded {
            method: method.to_string(),
            path: uri.to_string(),
            headers,
            key,
            body: body.clone(),
            seen: seen.clone(),
        });
        let reply = match (&seen, authorized) {
            (_, false) => None,
            (Some(s), true) => Some(match st.script.pop_front() {
                Some(r) => r,
                None => match st.rule.clone() {
                    Some(rule) => {
                        drop(st);
                        let r = rule(s);
                        st = f.lock();
                        r
                    }
                    None => st.default.clone(),
                },
            }),
            (None, true) => None,
        };
        let n = st.calls_made;
        st.calls_made += 1;
        (authorized, reply, st.models.clone(), n, st.pace)
    };
    if !authorized {
        let message = "invalid key (the fake expects another)";
        return error_response(wire, 401, None, Some(message));
    }
    if wire == Wire::Anthropic && method == Method::POST && uri.path() == "/v1/messages/count_tokens" {
        // Claude Code counts tokens before some turns; a rough count is enough.
        return axum::Json(json!({"input_tokens": body.to_string().len() / 4})).into_response();
    }
    if method == Method::GET && uri.path() == models_path {
        return match models {
            Some(list) => axum::Json(models_body(wire, &list)).into_response(),
            None => error_response(wire, 404, None, Some("this server has no model listing")),
        };
    }
    let (Some(seen), Some(reply)) = (seen, reply) else {
        return error_response(wire, 404, None, Some(&format!("no such endpoint: {method} {}", uri.path())));
    };
    if body.is_null() {
        return error_response(wire, 400, None, Some("the body is not JSON"));
    }
    answer(&f, wire, &seen, reply, n, pace).await
}

/// The auth header a request carried and the SHA-256 of its key.
fn key_of(wire: Wire, headers: &HeaderMap) -> Option<(String, String)> {
    let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    if wire == Wire::Anthropic
        && let Some(k) = get("x-api-key")
    {
        return Some(("x-api-key".into(), sha256_hex(k)));
    }
    let bearer = get("authorization")?;
    let token = bearer.strip_prefix("Bearer ").unwrap_or(bearer);
    Some(("authorization".into(), sha256_hex(token)))
}

/// The wire's error type for a status.
fn error_type(wire: Wire, status: u16) -> &'static str {
    match (wire, status) {
        (Wire::Anthropic, 401) => "authentication_error",
        (Wire::Anthropic, 403) => "permission_error",
        (Wire::Anthropic, 404) => "not_found_error",
        (Wire::Anthropic, 429) => "rate_limit_error",
        (Wire::Anthropic, 529) => "overloaded_error",
        (Wire::Anthropic, 500..=599) => "api_error",
        (Wire::Anthropic, _) => "invalid_request_error",
        (_, 401) => "invalid_api_key",
        (_, 404) => "model_not_found",
        (_, 429) => "rate_limit_exceeded",
        (_, 500..=599) => "server_error",
        _ => "invalid_request_error",
    }
}

/// The wire's JSON error body.
fn error_body(wire: Wire, status: u16, message: &str) -> Value {
    let kind = error_type(wire, status);
    match wire {
        Wire::Anthropic => json!({"type": "error", "error": {"type": kind, "message": message}}),
        Wire::OpenAiResponses | Wire::OpenAiChat => {
            let t = if status >= 500 { "server_error" } else { "invalid_request_error" };
            json!({"error": {"message": message, "type": t, "param": null, "code": kind}})
        }
        Wire::Ollama => json!({"error": message}),
    }
}

fn error_response(wire: Wire, status: u16, retry_after: Option<&str>, message: Option<&str>) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let message = message.map_or_else(|| format!("fake error {status}"), str::to_owned);
    let mut resp = (code, axum::Json(error_body(wire, status, &message))).into_response();
    if let Some(v) = retry_after.and_then(|v| axum::http::HeaderValue::from_str(v).ok()) {
        resp.headers_mut().insert("retry-after", v);
    }
    resp
}

fn models_body(wire: Wire, list: &[String]) -> Value {
    match wire {
        Wire::Anthropic => {
            let data: Vec<Value> = list
                .iter()
                .map(|id| json!({"type": "model", "id": id, "display_name": id, "created_at": "2025-01-01T00:00:00Z"}))
                .collect();
            json!({"data": data, "has_more": false, "first_id": list.first(), "last_id": list.last()})
        }
        Wire::OpenAiResponses | Wire::OpenAiChat => {
            let data: Vec<Value> = list
                .iter()
                .map(|id| json!({"id": id, "object": "model", "created": 1_700_000_000, "owned_by": "fake"}))
                .collect();
            json!({"object": "list", "data": data})
        }
        Wire::Ollama => {
            let models: Vec<Value> = list
                .iter()
                .map(|id| json!({"name": id, "model": id, "modified_at": "2025-01-01T00:00:00Z", "size": 1, "digest": "0"}))
                .collect();
            json!({"models": models})
        }
    }
}

/// Text of a content value: a string, or an array of parts with `text`.
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join(""),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Arguments sent as JSON text or as an object.
fn args_of(v: &Value) -> Value {
    match v {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
        Value::Null => json!({}),
        other => other.clone(),
    }
}

/// Appends `m`, merging it into the previous message of the same role.
fn push_merged(out: &mut Vec<SeenMessage>, m: SeenMessage) {
    match out.last_mut() {
        Some(last) if last.role == m.role => {
            last.text.push_str(&m.text);
            last.tool_calls.extend(m.tool_calls);
            last.tool_results.extend(m.tool_results);
        }
        _ => out.push(m),
    }
}

/// A request body in wire-neutral form.
fn seen(wire: Wire, body: &Value) -> Seen {
    let mut s = Seen {
        model: body["model"].as_str().unwrap_or_default().to_owned(),
        stream: match wire {
            Wire::Ollama => body["stream"] != false,
            _ => body["stream"] == true,
        },
        ..Seen::default()
    };
    s.max_tokens = ["max_tokens", "max_output_tokens", "max_completion_tokens"]
        .iter()
        .find_map(|k| body[*k].as_u64())
        .or_else(|| body["options"]["num_predict"].as_u64());
    let tools = body["tools"].as_array().into_iter().flatten();
    s.tools = tools
        .filter_map(|t| t["name"].as_str().or_else(|| t["function"]["name"].as_str()).map(str::to_owned))
        .collect();
    let mut messages = Vec::new();
    match wire {
        Wire::Anthropic => {
            s.system = (!body["system"].is_null()).then(|| text_of(&body["system"]));
            for m in body["messages"].as_array().into_iter().flatten() {
                let mut sm =
                    SeenMessage { role: m["role"].as_str().unwrap_or_default().to_owned(), ..Default::default() };
                match &m["content"] {
                    Value::String(t) => sm.text.clone_from(t),
                    Value::Array(blocks) => {
                        for b in blocks {
                            match b["type"].as_str() {
                                Some("text") => sm.text.push_str(b["text"].as_str().unwrap_or_default()),
                                Some("tool_use") => sm.tool_calls.push(Call {
                                    id: b["id"].as_str().map(str::to_owned),
                                    name: b["name"].as_str().unwrap_or_default().to_owned(),
                                    input: b["input"].clone(),
                                }),
                                Some("tool_result") => sm.tool_results.push(SeenResult {
                                    id: b["tool_use_id"].as_str().unwrap_or_default().to_owned(),
                                    content: text_of(&b["content"]),
                                    is_error: b["is_error"] == true,
                                }),
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
                push_merged(&mut messages, sm);
            }
        }
        Wire::OpenAiResponses => {
            s.system = body["instructions"].as_str().map(str::to_owned);
            let items = match &body["input"] {
                Value::String(t) => vec![json!({"type": "message", "role": "user", "content": t})],
                Value::Array(items) => items.clone(),
                _ => Vec::new(),
            };
            for i in &items {
                let sm = match i["type"].as_str() {
                    Some("function_call") => SeenMessage {
                        role: "assistant".into(),
                        tool_calls: vec![Call {
                            id: i["call_id"].as_str().map(str::to_owned),
                            name: i["name"].as_str().unwrap_or_default().to_owned(),
                            input: args_of(&i["arguments"]),
                        }],
                        ..Default::default()
                    },
                    Some("function_call_output") => SeenMessage {
                        role: "user".into(),
                        tool_results: vec![SeenResult {
                            id: i["call_id"].as_str().unwrap_or_default().to_owned(),
                            content: text_of(&i["output"]),
                            is_error: false,
                        }],
                        ..Default::default()
                    },
                    _ if i["role"] == "system" || i["role"] == "developer" => {
                        s.system = Some(text_of(&i["content"]));
                        continue;
                    }
                    _ => SeenMessage {
                        role: i["role"].as_str().unwrap_or("user").to_owned(),
                        text: text_of(&i["content"]),
                        ..Default::default()
                    },
                };
                push_merged(&mut messages, sm);
            }
        }
        Wire::OpenAiChat | Wire::Ollama => {
            for m in body["messages"].as_array().into_iter().flatten() {
                let role = m["role"].as_str().unwrap_or_default();
                let sm = match role {
                    "system" | "developer" => {
                        s.system = Some(text_of(&m["content"]));
                        continue;
                    }
                    "tool" => SeenMessage {
                        role: "user".into(),
                        tool_results: vec![SeenResult {
                            id: m["tool_call_id"]
                                .as_str()
                                .or_else(|| m["tool_name"].as_str())
                                .unwrap_or_default()
                                .to_owned(),
                            content: text_of(&m["content"]),
                            is_error: false,
                        }],
                        ..Default::default()
                    },
                    _ => SeenMessage {
                        role: role.to_owned(),
                        text: text_of(&m["content"]),
                        tool_calls: m["tool_calls"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|c| Call {
                                id: c["id"].as_str().map(str::to_owned),
                                name: c["function"]["name"].as_str().unwrap_or_default().to_owned(),
                                input: args_of(&c["function"]["arguments"]),
                            })
                            .collect(),
                        ..Default::default()
                    },
                };
                push_merged(&mut messages, sm);
            }
        }
    }
    s.messages = messages;
    s
}

/// The stop of a planned answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    End,
    Tool,
    Max,
}

/// A planned answer, wire-neutral.
struct Plan {
    deltas: Vec<String>,
    calls: Vec<(String, String, Value)>,
    stop: Stop,
}

/// How a stream ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// All of it.
    Whole,
    /// The start and `n` text deltas, then the body ends.
    Cut(usize),
    /// The start and `n` text deltas, then silence.
    Stall(usize),
    /// The start and `n` text deltas, then the wire's error event.
    Error(usize),
}

fn plan(wire: Wire, seen: &Seen, reply: &Reply, n: u64) -> Plan {
    let id = |i: usize, c: &Call| {
        c.id.clone().unwrap_or_else(|| match wire {
            Wire::Anthropic => format!("toolu_fake_{n}_{i}"),
            _ => format!("call_fake_{n}_{i}"),
        })
    };
    match reply {
        Reply::Text(t) | Reply::MaxTokens(t) => {
            let text = if t.is_empty() { crate::script::default_text(&seen.model) } else { t.clone() };
            let stop = if matches!(reply, Reply::MaxTokens(_)) { Stop::Max } else { Stop::End };
            Plan { deltas: crate::script::deltas(&text), calls: Vec::new(), stop }
        }
        Reply::Tools { text, calls } => Plan {
            deltas: text.as_deref().map(crate::script::deltas).unwrap_or_default(),
            calls: calls.iter().enumerate().map(|(i, c)| (id(i, c), c.name.clone(), c.input.clone())).collect(),
            stop: Stop::Tool,
        },
        Reply::Fault(Fault::Oversized) => {
            Plan { deltas: vec!["x".repeat(OVERSIZED_DELTA_BYTES)], calls: Vec::new(), stop: Stop::End }
        }
        // Faults that stream: some text first.
        Reply::Fault(_) => {
            Plan { deltas: crate::script::deltas("This answer will not end well."), calls: Vec::new(), stop: Stop::End }
        }
    }
}

async fn answer(f: &Inner, wire: Wire, seen: &Seen, reply: Reply, n: u64, pace: Option<Duration>) -> Response {
    let tail = match &reply {
        Reply::Fault(Fault::Status { status, retry_after, message }) => {
            return error_response(wire, *status, retry_after.as_deref(), message.as_deref());
        }
        Reply::Fault(Fault::Hang) => {
            hold(f.shutdown.clone(), None).await;
            return (StatusCode::SERVICE_UNAVAILABLE, "the fake is shutting down").into_response();
        }
        Reply::Fault(Fault::Garbage) => {
            let (ct, body) = match (wire, seen.stream) {
                (Wire::Ollama, true) => ("application/x-ndjson", "this is not JSON\n{\"message\": oops}\n"),
                (_, true) => {
                    ("text/event-stream", "event: message\ndata: {this is not json\n\n<html>teapot</html>\n\n")
                }
                (_, false) => ("application/json", "{\"id\": oops, this is not JSON"),
            };
            return ([("content-type", ct)], body).into_response();
        }
        Reply::Fault(Fault::Cut) => Tail::Cut(2),
        Reply::Fault(Fault::Stall) => Tail::Stall(1),
        Reply::Fault(Fault::StreamError) => Tail::Error(1),
        Reply::Fault(Fault::Oversized) => Tail::Whole,
        _ => Tail::Whole,
    };
    let plan = plan(wire, seen, &reply, n);
    if !seen.stream {
        return match tail {
            Tail::Whole => axum::Json(whole(wire, &seen.model, &plan, n)).into_response(),
            Tail::Error(_) => error_response(wire, 500, None, Some("the fake failed mid-answer")),
            Tail::Cut(_) | Tail::Stall(_) => {
                let text = whole(wire, &seen.model, &plan, n).to_string();
                let half = text[..text.len() / 2].to_owned();
                let hold_open = matches!(tail, Tail::Stall(_));
                stream_body("application/json", vec![half], None, hold_open.then(|| f.shutdown.clone()))
            }
        };
    }
    let frames = frames(wire, &seen.model, &plan, n, tail);
    let ct = if wire == Wire::Ollama { "application/x-ndjson" } else { "text/event-stream" };
    let hold_open = matches!(tail, Tail::Stall(_));
    stream_body(ct, frames, pace, hold_open.then(|| f.shutdown.clone()))
}

/// Waits until the fake shuts down, the client goes (`closed`), or [`HOLD_AT_MOST`] passes.
async fn hold(
    mut shutdown: watch::Receiver<bool>,
    closed: Option<tokio::sync::mpsc::Sender<Result<String, std::io::Error>>>,
) {
    let client_gone = async {
        match &closed {
            Some(tx) => tx.closed().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = shutdown.wait_for(|s| *s) => {}
        () = client_gone => {}
        () = tokio::time::sleep(HOLD_AT_MOST) => {}
    }
}

/// A streamed body of `frames`, written by a task of its own, `pace` before each frame after
/// the first; with `hold_open`, the connection then stays open, silent, until the client goes
/// or the fake shuts down.
fn stream_body(
    content_type: &'static str,
    frames: Vec<String>,
    pace: Option<Duration>,
    hold_open: Option<watch::Receiver<bool>>,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(64);
    tokio::spawn(async move {
        for (i, frame) in frames.into_iter().enumerate() {
            if let (Some(p), true) = (pace, i > 0) {
                // A simulated model's pace, not a wait for readiness.
                tokio::time::sleep(p).await;
            }
            if tx.send(Ok(frame)).await.is_err() {
                return;
            }
        }
        if let Some(shutdown) = hold_open {
            hold(shutdown, Some(tx)).await;
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    ([("content-type", content_type), ("cache-control", "no-cache")], body).into_response()
}

fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// A JSON text in two pieces (arguments streamed in parts).
fn halves(s: &str) -> (String, String) {
    let mut cut = s.len() / 2;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    (s[..cut].to_owned(), s[cut..].to_owned())
}

/// The stream of a planned answer in the wire's format, ended as `tail` says.
#[allow(clippy::too_many_lines)] // one arm per wire, each the wire's documented event order
fn frames(wire: Wire, model: &str, plan: &Plan, n: u64, tail: Tail) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let text: String = plan.deltas.concat();
    let keep = match tail {
        Tail::Whole => usize::MAX,
        Tail::Cut(k) | Tail::Stall(k) | Tail::Error(k) => k,
    };
    let deltas = || plan.deltas.iter().take(keep);
    match wire {
        Wire::Anthropic => {
            let id = format!("msg_fake_{n}");
            out.push(sse(
                Some("message_start"),
                &json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant",
                    "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": 1}}}),
            ));
            out.push(sse(Some("ping"), &json!({"type": "ping"})));
            let mut index = 0;
            if !plan.deltas.is_empty() {
                out.push(sse(
                    Some("content_block_start"),
                    &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ));
                for d in deltas() {
                    out.push(sse(
                        Some("content_block_delta"),
                        &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}}),
                    ));
                }
                if keep != usize::MAX {
                    return anthropic_tail(out, tail);
                }
                out.push(sse(Some("content_block_stop"), &json!({"type": "content_block_stop", "index": 0})));
                index = 1;
            }
            for (i, (cid, name, input)) in plan.calls.iter().enumerate() {
                let index = index + i;
                out.push(sse(
                    Some("content_block_start"),
                    &json!({"type": "content_block_start", "index": index,
                        "content_block": {"type": "tool_use", "id": cid, "name": name, "input": {}}}),
                ));
                let (a, b) = halves(&input.to_string());
                for piece in [a, b] {
                    out.push(sse(
                        Some("content_block_delta"),
                        &json!({"type": "content_block_delta", "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": piece}}),
                    ));
                }
                out.push(sse(Some("content_block_stop"), &json!({"type": "content_block_stop", "index": index})));
            }
            let stop = match plan.stop {
                Stop::End => "end_turn",
                Stop::Tool => "tool_use",
                Stop::Max => "max_tokens",
            };
            out.push(sse(
                Some("message_delta"),
                &json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                    "usage": {"output_tokens": OUTPUT_TOKENS}}),
            ));
            out.push(sse(Some("message_stop"), &json!({"type": "message_stop"})));
        }
        Wire::OpenAiResponses => {
            let id = format!("resp_fake_{n}");
            let mut seq = 0u64;
            let mut ev = |out: &mut Vec<String>, kind: &str, mut v: Value| {
                v["type"] = json!(kind);
                v["sequence_number"] = json!(seq);
                seq += 1;
                out.push(sse(Some(kind), &v));
            };
            let response = |status: &str, output: Value| {
                json!({"id": id, "object": "response", "created_at": 1_700_000_000, "status": status, "model": model,
                    "output": output, "usage": if status == "in_progress" { Value::Null } else {
                        json!({"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS, "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS})}})
            };
            ev(&mut out, "response.created", json!({"response": response("in_progress", json!([]))}));
            ev(&mut out, "response.in_progress", json!({"response": response("in_progress", json!([]))}));
            let mut output = Vec::new();
            let mut index = 0;
            if !plan.deltas.is_empty() {
                let item_id = format!("msg_fake_{n}");
                ev(
                    &mut out,
                    "response.output_item.added",
                    json!({"output_index": 0, "item": {"id": item_id, "type": "message",
                    "status": "in_progress", "role": "assistant", "content": []}}),
                );
                ev(
                    &mut out,
                    "response.content_part.added",
                    json!({"item_id": item_id, "output_index": 0, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}}),
                );
                for d in deltas() {
                    ev(
                        &mut out,
                        "response.output_text.delta",
                        json!({"item_id": item_id, "output_index": 0, "content_index": 0, "delta": d}),
                    );
                }
                if keep != usize::MAX {
                    if let Tail::Error(_) = tail {
                        ev(
                            &mut out,
                            "response.failed",
                            json!({"response": {"id": id, "object": "response", "status": "failed",
                            "error": {"code": "server_error", "message": "The fake failed mid-answer."}}}),
                        );
                    }
                    return out;
                }
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                ev(
                    &mut out,
                    "response.output_text.done",
                    json!({"item_id": item_id, "output_index": 0, "content_index": 0, "text": text}),
                );
                ev(
                    &mut out,
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
                );
                let item = json!({"id": item_id, "type": "message", "status": "completed", "role": "assistant", "content": [part]});
                ev(&mut out, "response.output_item.done", json!({"output_index": 0, "item": item}));
                output.push(item);
                index = 1;
            }
            for (i, (cid, name, input)) in plan.calls.iter().enumerate() {
                let index = index + i;
                let item_id = format!("fc_fake_{n}_{i}");
                let args = input.to_string();
                ev(
                    &mut out,
                    "response.output_item.added",
                    json!({"output_index": index, "item": {"id": item_id,
                    "type": "function_call", "status": "in_progress", "call_id": cid, "name": name, "arguments": ""}}),
                );
                let (a, b) = halves(&args);
                for piece in [a, b] {
                    ev(
                        &mut out,
                        "response.function_call_arguments.delta",
                        json!({"item_id": item_id, "output_index": index, "delta": piece}),
                    );
                }
                ev(
                    &mut out,
                    "response.function_call_arguments.done",
                    json!({"item_id": item_id, "output_index": index, "arguments": args}),
                );
                let item = json!({"id": item_id, "type": "function_call", "status": "completed", "call_id": cid, "name": name, "arguments": args});
                ev(&mut out, "response.output_item.done", json!({"output_index": index, "item": item}));
                output.push(item);
            }
            if plan.stop == Stop::Max {
                let mut r = response("incomplete", json!(output));
                r["incomplete_details"] = json!({"reason": "max_output_tokens"});
                ev(&mut out, "response.incomplete", json!({"response": r}));
            } else {
                ev(&mut out, "response.completed", json!({"response": response("completed", json!(output))}));
            }
        }
        Wire::OpenAiChat => {
            let chunk = |delta: Value, finish: Value| {
                json!({"id": format!("chatcmpl-fake-{n}"), "object": "chat.completion.chunk", "created": 1_700_000_000,
                    "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            };
            out.push(sse(None, &chunk(json!({"role": "assistant", "content": ""}), Value::Null)));
            for d in deltas() {
                out.push(sse(None, &chunk(json!({"content": d}), Value::Null)));
            }
            if keep != usize::MAX {
                if let Tail::Error(_) = tail {
                    out.push(sse(None, &json!({"error": {"message": "The fake failed mid-answer.", "type": "server_error", "code": "server_error"}})));
                }
                return out;
            }
            for (i, (cid, name, input)) in plan.calls.iter().enumerate() {
                let first = json!({"tool_calls": [{"index": i, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}]});
                out.push(sse(None, &chunk(first, Value::Null)));
                let (a, b) = halves(&input.to_string());
                for piece in [a, b] {
                    out.push(sse(
                        None,
                        &chunk(json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}), Value::Null),
                    ));
                }
            }
            let finish = match plan.stop {
                Stop::End => "stop",
                Stop::Tool => "tool_calls",
                Stop::Max => "length",
            };
            out.push(sse(None, &chunk(json!({}), json!(finish))));
            out.push(sse(
                None,
                &json!({"id": format!("chatcmpl-fake-{n}"), "object": "chat.completion.chunk", "created": 1_700_000_000,
                    "model": model, "choices": [], "usage": {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
                    "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}}),
            ));
            out.push("data: [DONE]\n\n".to_owned());
        }
        Wire::Ollama => {
            let line = |v: Value| format!("{v}\n");
            let at = "2025-01-01T00:00:00Z";
            for d in deltas() {
                out.push(line(json!({"model": model, "created_at": at, "message": {"role": "assistant", "content": d}, "done": false})));
            }
            if keep != usize::MAX {
                if let Tail::Error(_) = tail {
                    out.push(line(json!({"error": "the fake failed mid-answer"})));
                }
                return out;
            }
            if !plan.calls.is_empty() {
                let calls: Vec<Value> = plan
                    .calls
                    .iter()
                    .map(|(_, name, input)| json!({"function": {"name": name, "arguments": input}}))
                    .collect();
                out.push(line(json!({"model": model, "created_at": at,
                    "message": {"role": "assistant", "content": "", "tool_calls": calls}, "done": false})));
            }
            let reason = if plan.stop == Stop::Max { "length" } else { "stop" };
            out.push(line(json!({"model": model, "created_at": at, "message": {"role": "assistant", "content": ""},
                "done": true, "done_reason": reason, "total_duration": 1000, "prompt_eval_count": INPUT_TOKENS,
                "eval_count": OUTPUT_TOKENS})));
        }
    }
    out
}

/// An Anthropic stream cut after its deltas: nothing more, or the `error` event.
fn anthropic_tail(mut out: Vec<String>, tail: Tail) -> Vec<String> {
    if let Tail::Error(_) = tail {
        out.push(sse(
            Some("error"),
            &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ));
    }
    out
}

/// The non-streamed answer in the wire's format.
fn whole(wire: Wire, model: &str, plan: &Plan, n: u64) -> Value {
    let text: String = plan.deltas.concat();
    match wire {
        Wire::Anthropic => {
            let mut content = Vec::new();
            if !text.is_empty() {
                content.push(json!({"type": "text", "text": text}));
            }
            for (id, name, input) in &plan.calls {
                content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
            }
            let stop = match plan.stop {
                Stop::End => "end_turn",
                Stop::Tool => "tool_use",
                Stop::Max => "max_tokens",
            };
            json!({"id": format!("msg_fake_{n}"), "type": "message", "role": "assistant", "model": model,
                "content": content, "stop_reason": stop, "stop_sequence": null,
                "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS}})
        }
        Wire::OpenAiResponses => {
            let mut output = Vec::new();
            if !text.is_empty() {
                output.push(
                    json!({"id": format!("msg_fake_{n}"), "type": "message", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}),
                );
            }
            for (i, (id, name, input)) in plan.calls.iter().enumerate() {
                output.push(json!({"id": format!("fc_fake_{n}_{i}"), "type": "function_call", "status": "completed",
                    "call_id": id, "name": name, "arguments": input.to_string()}));
            }
            let status = if plan.stop == Stop::Max { "incomplete" } else { "completed" };
            json!({"id": format!("resp_fake_{n}"), "object": "response", "status": status, "model": model, "output": output,
                "incomplete_details": if plan.stop == Stop::Max { json!({"reason": "max_output_tokens"}) } else { Value::Null },
                "usage": {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS, "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}})
        }
        Wire::OpenAiChat => {
            let calls: Vec<Value> = plan
                .calls
                .iter()
                .map(|(id, name, input)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}))
                .collect();
            let mut message =
                json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }});
            if !calls.is_empty() {
                message["tool_calls"] = json!(calls);
            }
            let finish = match plan.stop {
                Stop::End => "stop",
                Stop::Tool => "tool_calls",
                Stop::Max => "length",
            };
            json!({"id": format!("chatcmpl-fake-{n}"), "object": "chat.completion", "created": 1_700_000_000, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS, "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}})
        }
        Wire::Ollama => {
            let mut message = json!({"role": "assistant", "content": text});
            if !plan.calls.is_empty() {
                let calls: Vec<Value> = plan
                    .calls
                    .iter()
                    .map(|(_, name, input)| json!({"function": {"name": name, "arguments": input}}))
                    .collect();
                message["tool_calls"] = json!(calls);
            }
            json!({"model": model, "created_at": "2025-01-01T00:00:00Z", "message": message, "done": true,
                "done_reason": if plan.stop == Stop::Max { "length" } else { "stop" },
                "prompt_eval_count": INPUT_TOKENS, "eval_count": OUTPUT_TOKENS})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_is_wire_neutral() {
        let anthropic = json!({"model": "m", "stream": true, "max_tokens": 5, "system": "s",
            "tools": [{"name": "search"}],
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "search", "input": {"a": 1}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "r"}], "is_error": true}]}]});
        let chat = json!({"model": "m", "stream": true, "max_tokens": 5,
            "tools": [{"type": "function", "function": {"name": "search"}}],
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "search", "arguments": "{\"a\":1}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "r"}]});
        let responses = json!({"model": "m", "stream": true, "max_output_tokens": 5, "instructions": "s",
            "tools": [{"type": "function", "name": "search"}],
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
                {"type": "function_call", "call_id": "t1", "name": "search", "arguments": "{\"a\":1}"},
                {"type": "function_call_output", "call_id": "t1", "output": "r"}]});
        for (wire, body) in [(Wire::Anthropic, anthropic), (Wire::OpenAiChat, chat), (Wire::OpenAiResponses, responses)]
        {
            let s = seen(wire, &body);
            assert_eq!(
                (s.model.as_str(), s.system.as_deref(), s.max_tokens, s.stream),
                ("m", Some("s"), Some(5), true)
            );
            assert_eq!(s.tools, vec!["search"]);
            assert_eq!(s.last_user_text(), "q");
            assert_eq!(s.tool_calls()[0].input, json!({"a": 1}));
            assert_eq!(s.new_tool_results()[0].content, "r");
            assert_eq!(s.messages.len(), 3, "{wire:?}");
        }
    }
}
