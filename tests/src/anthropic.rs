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
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
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
        let inner = Arc::new(Inner { tool: tool.to_owned(), input, requests: Mutex::default() });
        let app = Router::new()
            .route("/v1/messages", axum::routing::post(messages))
            .route("/v1/messages/count_tokens", axum::routing::post(count_tokens))
            .fallback(|| async { (StatusCode::NOT_FOUND, axum::Json(error("not_found_error", "no such endpoint"))) })
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
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

async fn count_tokens(State(f): State<Arc<Inner>>, uri: Uri, body: axum::body::Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let tokens = body.to_string().len() / 4;
    f.requests.lock().unwrap_or_else(|e| e.into_inner()).push(Recorded { path: uri.to_string(), body });
    axum::Json(json!({"input_tokens": tokens})).into_response()
}

/// What the fake model answers to one request: its content block and stop reason.
fn reply(f: &Inner, req: &Recorded) -> (Value, &'static str) {
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

async fn messages(State(f): State<Arc<Inner>>, uri: Uri, body: axum::body::Bytes) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, axum::Json(error("invalid_request_error", "body is not JSON")))
            .into_response();
    };
    let req = Recorded { path: uri.to_string(), body };
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
