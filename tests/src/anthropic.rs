//! A fake Anthropic Messages API on loopback (real HTTP), for driving real agent CLIs (Claude
//! Code) in tests without a model: `POST /v1/messages` answered as the API documents it —
//! JSON, or with `"stream": true` server-sent events `message_start`, `content_block_start`,
//! `content_block_delta` (`text_delta`, `input_json_delta`), `content_block_stop`,
//! `message_delta`, `message_stop` — plus `POST /v1/messages/count_tokens`.
//!
//! The fake plays a model that wants one tool (`FakeAnthropic::start`'s `tool`, e.g.
//! `mcp__coffer__tiny1__echo`): while the request offers it in `tools`, it asks for a call
//! (`tool_use`, id [`CALL_ID`], input `{"message": ECHO_MESSAGE}`, or the input given to
//! [`FakeAnthropic::start_calling`]); while the tool is only
//! deferred (named in the request's text, `ToolSearch` in `tools`: Claude Code's tool search),
//! it first asks `ToolSearch` to load it (`select:<tool>`); once the request carries the call's
//! `tool_result`, it answers with text quoting it. Every request is recorded, in order.
//!
//! [`FakeAnthropic::sequence`] plays a model that makes several calls one after another (each
//! once the previous one's result came back).
//!
//! [`FakeAnthropic::scripted`] plays a model driven by the prompt instead: the directives of
//! [`crate::script`] in the latest user message choose streamed text (one delta per word), a tool
//! call (loaded through `ToolSearch` first when Claude Code defers it), an HTTP error, a slow
//! stream, a hang or malformed server-sent events.
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// The `tool_use` id of the call to the wanted tool.
pub const CALL_ID: &str = "toolu_fake_call";
/// The `tool_use` id of the `ToolSearch` that loads a deferred tool.
pub const SEARCH_ID: &str = "toolu_fake_search";
/// The `message` argument of the call (echo tools send it back).
pub const ECHO_MESSAGE: &str = "hello from the fake model";

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Path and query, e.g. `/v1/messages?beta=true`.
    pub path: String,
    /// The JSON body.
    pub body: Value,
    /// The request's credential headers (`x-api-key`, `authorization`), as sent.
    pub auth: Vec<(String, String)>,
}

impl Recorded {
    /// Names of the tools in the request's `tools`.
    pub fn tools(&self) -> Vec<&str> {
        self.body["tools"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect()
    }

    /// Whether the request offers `tool`: in `tools`, or deferred (named in its system prompt or
    /// messages, to be loaded with `ToolSearch`).
    pub fn offers(&self, tool: &str) -> bool {
        self.tools().contains(&tool) || (self.tools().contains(&"ToolSearch") && self.mentions(tool))
    }

    fn mentions(&self, tool: &str) -> bool {
        self.body["system"].to_string().contains(tool) || self.body["messages"].to_string().contains(tool)
    }

    /// The `tool_result` blocks of its messages: `(tool_use_id, content as JSON text)`.
    pub fn tool_results(&self) -> Vec<(String, String)> {
        let messages = self.body["messages"].as_array().into_iter().flatten();
        let blocks = messages.filter_map(|m| m["content"].as_array()).flatten();
        blocks
            .filter(|b| b["type"] == "tool_result")
            .map(|b| (b["tool_use_id"].as_str().unwrap_or_default().to_owned(), b["content"].to_string()))
            .collect()
    }
}

struct Inner {
    tool: String,
    input: Value,
    /// Tool calls to ask for one after another ([`FakeAnthropic::sequence`]); empty: the one
    /// call of `tool`.
    steps: Vec<(String, Value)>,
    /// Answer by the prompt's directives ([`crate::script`]) instead of wanting `tool`.
    scripted: bool,
    requests: Mutex<Vec<Recorded>>,
}

/// The fake API (ends when dropped).
pub struct FakeAnthropic {
    /// Its base URL, for `ANTHROPIC_BASE_URL`: `http://127.0.0.1:<port>`.
    pub url: String,
    inner: Arc<Inner>,
    task: JoinHandle<()>,
}

impl FakeAnthropic {
    /// Starts the fake on a free loopback port, wanting to call `tool`.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start(tool: &str) -> anyhow::Result<Self> {
        Self::start_calling(tool, json!({"message": ECHO_MESSAGE})).await
    }

    /// Starts the fake on a free loopback port, wanting to call `tool` with `input` (the
    /// tool's arguments, a JSON object).
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start_calling(tool: &str, input: Value) -> anyhow::Result<Self> {
        Self::serve(Inner {
            tool: tool.to_owned(),
            input,
            steps: Vec::new(),
            scripted: false,
            requests: Mutex::default(),
        })
        .await
    }

    /// Starts the fake on a free loopback port, answering by the prompt convention of
    /// [`crate::script`].
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn scripted() -> anyhow::Result<Self> {
        Self::serve(Inner {
            tool: String::new(),
            input: json!({}),
            steps: Vec::new(),
            scripted: true,
            requests: Mutex::default(),
        })
        .await
    }

    /// Starts the fake on a free loopback port, playing a model that calls `steps` (`(tool,
    /// input)`) one after another, each once the previous one's result came back (`tool_use` id
    /// [`step_id`]`(i)`; a tool Claude Code defers is loaded with `ToolSearch` first), then
    /// answers with text quoting every result.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn sequence(steps: Vec<(String, Value)>) -> anyhow::Result<Self> {
        Self::serve(Inner { tool: String::new(), input: json!({}), steps, scripted: false, requests: Mutex::default() })
            .await
    }

    async fn serve(inner: Inner) -> anyhow::Result<Self> {
        let inner = Arc::new(inner);
        let app = Router::new()
            .route("/v1/messages", axum::routing::post(messages))
            .route("/v1/messages/count_tokens", axum::routing::post(count_tokens))
            .fallback(|| async { (StatusCode::NOT_FOUND, axum::Json(error("not_found_error", "no such endpoint"))) })
            .with_state(inner.clone());
        let (url, task) = crate::http::serve_on_loopback(app).await?;
        Ok(Self { url, inner, task })
    }

    /// Every request so far, in the order received.
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.requests.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The Messages requests that carried tools (the agent's turns, not side requests).
    pub fn turns(&self) -> Vec<Recorded> {
        self.requests().into_iter().filter(|r| r.path.starts_with("/v1/messages") && !r.tools().is_empty()).collect()
    }
}

impl Drop for FakeAnthropic {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn error(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

async fn count_tokens(State(f): State<Arc<Inner>>, uri: Uri, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let tokens = body.to_string().len() / 4;
    f.requests.lock().unwrap_or_else(|e| e.into_inner()).push(Recorded {
        path: uri.to_string(),
        body,
        auth: auth_headers(&headers),
    });
    axum::Json(json!({"input_tokens": tokens})).into_response()
}

/// The `tool_use` id of step `i` of [`FakeAnthropic::sequence`].
pub fn step_id(i: usize) -> String {
    format!("toolu_fake_step_{i}")
}

/// [`reply`] of a sequence: the first step whose result is not in the request yet, or the text.
fn next_step(f: &Inner, req: &Recorded) -> (Value, &'static str) {
    let results = req.tool_results();
    let done = (0..f.steps.len()).take_while(|&i| results.iter().any(|(id, _)| *id == step_id(i))).count();
    let Some((tool, input)) = f.steps.get(done) else {
        let text =
            format!("The tools answered: {}", results.iter().map(|(_, c)| c.as_str()).collect::<Vec<_>>().join(" | "));
        return (json!({"type": "text", "text": text}), "end_turn");
    };
    if req.tools().contains(&tool.as_str()) {
        return (json!({"type": "tool_use", "id": step_id(done), "name": tool, "input": input}), "tool_use");
    }
    // Deferred (Claude Code's tool search): load it first, once per step.
    let load = format!("toolu_fake_load_{done}");
    if req.offers(tool) && !results.iter().any(|(id, _)| *id == load) {
        let input = json!({"query": format!("select:{tool}"), "max_results": 1});
        return (json!({"type": "tool_use", "id": load, "name": "ToolSearch", "input": input}), "tool_use");
    }
    (json!({"type": "text", "text": format!("No tool named {tool} was offered.")}), "end_turn")
}

/// What the fake model answers to one request: its content block and stop reason.
fn reply(f: &Inner, req: &Recorded) -> (Value, &'static str) {
    if !f.steps.is_empty() {
        return next_step(f, req);
    }
    let results = req.tool_results();
    if let Some((_, content)) = results.iter().find(|(id, _)| id == CALL_ID) {
        let text = format!("The tool answered: {content}");
        return (json!({"type": "text", "text": text}), "end_turn");
    }
    if req.tools().contains(&f.tool.as_str()) {
        let call = json!({"type": "tool_use", "id": CALL_ID, "name": f.tool, "input": f.input});
        return (call, "tool_use");
    }
    if req.offers(&f.tool) && !results.iter().any(|(id, _)| id == SEARCH_ID) {
        let input = json!({"query": format!("select:{}", f.tool), "max_results": 1});
        return (json!({"type": "tool_use", "id": SEARCH_ID, "name": "ToolSearch", "input": input}), "tool_use");
    }
    (json!({"type": "text", "text": format!("No tool named {} was offered.", f.tool)}), "end_turn")
}

async fn messages(State(f): State<Arc<Inner>>, uri: Uri, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, axum::Json(error("invalid_request_error", "body is not JSON")))
            .into_response();
    };
    let req = Recorded { path: uri.to_string(), body, auth: auth_headers(&headers) };
    if f.scripted {
        return scripted(&f, req);
    }
    let (block, stop) = reply(&f, &req);
    let n = f.requests.lock().unwrap_or_else(|e| e.into_inner()).len();
    let model = req.body["model"].clone();
    let stream = req.body["stream"] == true;
    f.requests.lock().unwrap_or_else(|e| e.into_inner()).push(req);
    let id = format!("msg_fake_{n}");
    let usage = json!({"input_tokens": 10, "output_tokens": 5});
    if !stream {
        let message = json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": [block],
            "stop_reason": stop, "stop_sequence": null, "usage": usage});
        return axum::Json(message).into_response();
    }
    // The block opens empty and its content comes as one delta, as the API streams it.
    let (start, delta) = match block["type"].as_str() {
        Some("tool_use") => (
            json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
            json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
        ),
        _ => (json!({"type": "text", "text": ""}), json!({"type": "text_delta", "text": block["text"]})),
    };
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant",
            "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 1}}}),
        ),
        ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": start})),
        ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": delta})),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": 5}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    let text: String = events.iter().map(|(event, data)| format!("event: {event}\ndata: {data}\n\n")).collect();
    ([("content-type", "text/event-stream"), ("cache-control", "no-cache")], text).into_response()
}

/// The text of the latest user message that has text and is not a tool's answer (Claude Code
/// adds text blocks to the message carrying a tool result).
fn prompt(req: &Recorded) -> String {
    let messages = req.body["messages"].as_array().into_iter().flatten().rev();
    let answers = |m: &Value| m["content"].as_array().is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result"));
    for m in messages.filter(|m| m["role"] == "user" && !answers(m)) {
        let text: Vec<&str> = match &m["content"] {
            Value::String(s) => vec![s.as_str()],
            Value::Array(blocks) => {
                blocks.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect()
            }
            _ => Vec::new(),
        };
        if !text.is_empty() {
            return text.join("\n");
        }
    }
    String::new()
}

/// The `tool_result` blocks of the last message: `(tool_use_id, content as text)`.
fn last_results(req: &Recorded) -> Vec<(String, String)> {
    let last = req.body["messages"].as_array().and_then(|m| m.last());
    let blocks = last.and_then(|m| m["content"].as_array()).into_iter().flatten();
    blocks
        .filter(|b| b["type"] == "tool_result")
        .map(|b| {
            let content = match &b["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => {
                    parts.iter().map(|p| p["text"].as_str().unwrap_or_default()).collect::<Vec<_>>().join("\n")
                }
                other => other.to_string(),
            };
            (b["tool_use_id"].as_str().unwrap_or_default().to_owned(), content)
        })
        .collect()
}

/// The scripted answer to one request (see [`crate::script`]).
fn scripted(f: &Inner, req: Recorded) -> Response {
    use crate::script::{Script, resolve_tool};
    let script = Script::parse(&prompt(&req));
    let model = req.body["model"].as_str().unwrap_or_default().to_owned();
    let n = {
        let mut requests = f.requests.lock().unwrap_or_else(|e| e.into_inner());
        requests.push(req.clone());
        requests.len()
    };
    if let Some(status) = script.error {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let kind = match status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        };
        return (status, axum::Json(error(kind, &format!("fake error {}", status.as_u16())))).into_response();
    }
    let id = format!("msg_fake_{n}");
    let start = json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant",
        "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 1}}});
    if script.malformed {
        let body = "event: message_start\ndata: {\"type\": \"message_start\", \"message\": {oops\n\nthis is not an event stream\n\n";
        return ([("content-type", "text/event-stream")], body).into_response();
    }
    let mut events: Vec<(&str, Value)> = vec![("message_start", start)];
    if script.hang {
        return crate::script::stream_sse(events, None, true);
    }
    let results = last_results(&req);
    let offered = req.tools();
    let (block_start, block_deltas, stop) = match (&script.tool, results.iter().find(|(id, _)| id == CALL_ID)) {
        (Some(_), Some((_, content))) => text_block(&format!("Tool result: {content}")),
        (Some((wanted, _)), None) => {
            let searched = results.iter().any(|(id, _)| id == SEARCH_ID);
            match resolve_tool(wanted, &offered) {
                Some(name) => tool_block(CALL_ID, name, &script.tool_input()),
                None if offered.contains(&"ToolSearch") && !searched => {
                    let input = json!({"query": format!("select:{wanted}"), "max_results": 1});
                    tool_block(SEARCH_ID, "ToolSearch", &input)
                }
                None => text_block(&format!("No tool named {wanted} was offered.")),
            }
        }
        (None, _) => text_block(&script.say.clone().unwrap_or_else(|| crate::script::default_text(&model))),
    };
    events.push((
        "content_block_start",
        json!({"type": "content_block_start", "index": 0, "content_block": block_start}),
    ));
    let count = block_deltas.len();
    for delta in block_deltas {
        events.push(("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": delta})));
    }
    events.push(("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
    events.push((
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": count.max(1)}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    crate::script::stream_sse(events, script.slow, false)
}

/// A text block opened empty, its text one delta per word, stop reason `end_turn`.
fn text_block(text: &str) -> (Value, Vec<Value>, &'static str) {
    let deltas = crate::script::deltas(text).into_iter().map(|d| json!({"type": "text_delta", "text": d})).collect();
    (json!({"type": "text", "text": ""}), deltas, "end_turn")
}

/// A `tool_use` block opened with empty input, the input as one JSON delta, stop `tool_use`.
fn tool_block(id: &str, name: &str, input: &Value) -> (Value, Vec<Value>, &'static str) {
    let start = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
    (start, vec![json!({"type": "input_json_delta", "partial_json": input.to_string()})], "tool_use")
}

/// The credential headers of a request (`x-api-key`, `authorization`), lower-case names.
fn auth_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    ["x-api-key", "authorization"]
        .iter()
        .filter_map(|k| headers.get(*k).map(|v| ((*k).to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned())))
        .collect()
}
