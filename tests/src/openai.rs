//! A fake OpenAI Responses API on loopback (real HTTP), for driving the real Codex CLI in tests
//! without a model: `POST /v1/responses` with `"stream": true` answered with the server-sent
//! events the API documents — `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`, `response.output_text.delta`
//! (one per word), `response.output_text.done`, `response.content_part.done`,
//! `response.output_item.done`, `response.completed` (with `usage`) — and for a tool call a
//! `function_call` output item whose arguments come as `response.function_call_arguments.delta`
//! and `.done`; Codex answers it in its next request with a `function_call_output` input item.
//! Codex offers an MCP server's tools inside one `namespace` tool (`mcp__coffer` holding
//! `coffer__search_tools`, …): the fake matches such a function as `<namespace>__<name>` and calls
//! it by its own name with `namespace` set on the item, as the API does.
//!
//! What it answers is chosen by the prompt convention of [`crate::script`] (directives in the
//! latest user message: text, `TOOL[…]`, `ERROR[401]`, `SLOW[ms]`, `HANG`, `MALFORMED`). Every
//! request is recorded, in order. [`FakeOpenAi::codex_config`] is the `config.toml` that points
//! Codex at it and keeps it offline.
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::script::{Script, default_text, deltas, resolve_tool, stream_sse};

/// The `call_id` of the fake's tool call.
pub const CALL_ID: &str = "call_fake_1";

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Path and query, e.g. `/v1/responses`.
    pub path: String,
    /// The JSON body.
    pub body: Value,
    /// The request's credential headers (`authorization`), as sent.
    pub auth: Vec<(String, String)>,
}

impl Recorded {
    /// Names of the request's tools (a `namespace` tool, as Codex offers an MCP server's tools,
    /// by its own name).
    pub fn tools(&self) -> Vec<&str> {
        self.body["tools"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect()
    }

    /// Every callable function: `(namespace, name)`, the functions inside a `namespace` tool
    /// (e.g. `mcp__coffer` holding `coffer__search_tools`) with it.
    pub fn functions(&self) -> Vec<(Option<&str>, &str)> {
        let mut out = Vec::new();
        for t in self.body["tools"].as_array().into_iter().flatten() {
            match (t["type"].as_str(), t["name"].as_str()) {
                (Some("namespace"), Some(ns)) => {
                    let inner = t["tools"].as_array().into_iter().flatten().filter_map(|f| f["name"].as_str());
                    out.extend(inner.map(|f| (Some(ns), f)));
                }
                (_, Some(name)) => out.push((None, name)),
                _ => {}
            }
        }
        out
    }

    /// The text of every user message of the input, in order.
    pub fn user_texts(&self) -> Vec<String> {
        let items = self.body["input"].as_array().into_iter().flatten();
        items
            .filter(|i| i["role"] == "user")
            .map(|m| match &m["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"),
                _ => String::new(),
            })
            .collect()
    }

    /// The output of the fake's call, when the request's input carries it.
    pub fn call_output(&self) -> Option<String> {
        let mut items = self.body["input"].as_array().into_iter().flatten();
        items.rfind(|i| i["type"] == "function_call_output" && i["call_id"] == CALL_ID).map(|i| match &i["output"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n"),
            other => other.to_string(),
        })
    }
}

struct Inner {
    requests: Mutex<Vec<Recorded>>,
}

/// The fake API (ends when dropped).
pub struct FakeOpenAi {
    /// Its base URL including `/v1`, for a Codex model provider's `base_url`:
    /// `http://127.0.0.1:<port>/v1`.
    pub url: String,
    inner: Arc<Inner>,
    task: JoinHandle<()>,
}

impl FakeOpenAi {
    /// Starts the fake on a free loopback port.
    ///
    /// # Errors
    /// When no port can be bound.
    pub async fn start() -> anyhow::Result<Self> {
        let inner = Arc::new(Inner { requests: Mutex::default() });
        let app = Router::new()
            .route("/v1/responses", axum::routing::post(responses))
            .fallback(|uri: Uri| async move {
                (StatusCode::NOT_FOUND, axum::Json(error_body(&format!("no such endpoint {uri}"), "not_found")))
            })
            .with_state(inner.clone());
        let (url, task) = crate::http::serve_on_loopback(app).await?;
        let url = format!("{url}/v1");
        Ok(Self { url, inner, task })
    }

    /// Every request so far, in the order received.
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.requests.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A Codex `config.toml` using this fake as model provider `fake` (model `model`, the key from
    /// `OPENAI_API_KEY`, no retries, no update check, analytics and the start-up features that
    /// reach remote hosts off).
    pub fn codex_config(&self, model: &str) -> String {
        format!(
            r#"model = "{model}"
model_provider = "fake"
check_for_update_on_startup = false

[model_providers.fake]
name = "Fake"
base_url = "{url}"
wire_api = "responses"
env_key = "OPENAI_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false
"#,
            url = self.url
        )
    }
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn error_body(message: &str, code: &str) -> Value {
    json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}})
}

async fn responses(State(f): State<Arc<Inner>>, uri: Uri, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, axum::Json(error_body("body is not JSON", "invalid_json"))).into_response();
    };
    let req = Recorded { path: uri.to_string(), body, auth: auth_headers(&headers) };
    let n = {
        let mut requests = f.requests.lock().unwrap_or_else(|e| e.into_inner());
        requests.push(req.clone());
        requests.len()
    };
    let script = Script::parse(req.user_texts().last().map(String::as_str).unwrap_or_default());
    let model = req.body["model"].as_str().unwrap_or_default().to_owned();
    if let Some(status) = script.error {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let code = match status.as_u16() {
            401 => "invalid_api_key",
            429 => "rate_limit_exceeded",
            _ => "server_error",
        };
        return (status, axum::Json(error_body(&format!("fake error {}", status.as_u16()), code))).into_response();
    }
    if script.malformed {
        let body = "event: response.created\ndata: {not json at all\n\nevent: ???\ndata: \u{0}\n\n";
        return ([("content-type", "text/event-stream")], body).into_response();
    }
    let id = format!("resp_fake_{n}");
    let mut seq = 0u64;
    let mut ev = |kind: &'static str, mut data: Value| {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(seq);
        seq += 1;
        (kind, data)
    };
    let response = |status: &str, output: Value| json!({"id": id, "object": "response", "created_at": 1, "status": status, "model": model, "output": output});
    let mut events = vec![ev("response.created", json!({"response": response("in_progress", json!([]))}))];
    if script.hang {
        return stream_sse(events, None, true);
    }
    events.push(ev("response.in_progress", json!({"response": response("in_progress", json!([]))})));
    let output_tokens;
    let item = match (&script.tool, req.call_output()) {
        (Some((wanted, _)), None) => {
            // A namespaced function is matched by `<namespace>__<name>` and called by its own
            // name with the namespace beside it.
            let functions = req.functions();
            let full: Vec<String> =
                functions.iter().map(|(ns, f)| ns.map_or_else(|| (*f).to_owned(), |ns| format!("{ns}__{f}"))).collect();
            let names: Vec<&str> = full.iter().map(String::as_str).collect();
            let found = resolve_tool(wanted, &names).and_then(|n| names.iter().position(|m| *m == n));
            match found.map(|i| functions[i]) {
                Some((namespace, name)) => {
                    let args = script.tool_input().to_string();
                    let item_id = format!("fc_fake_{n}");
                    let mut added = json!({"id": item_id, "type": "function_call", "status": "in_progress",
                        "call_id": CALL_ID, "name": name, "arguments": ""});
                    if let Some(ns) = namespace {
                        added["namespace"] = json!(ns);
                    }
                    events.push(ev("response.output_item.added", json!({"output_index": 0, "item": added})));
                    events.push(ev(
                        "response.function_call_arguments.delta",
                        json!({"item_id": item_id, "output_index": 0, "delta": args}),
                    ));
                    events.push(ev(
                        "response.function_call_arguments.done",
                        json!({"item_id": item_id, "output_index": 0, "arguments": args}),
                    ));
                    output_tokens = 5;
                    let mut done = added.clone();
                    done["status"] = json!("completed");
                    done["arguments"] = json!(args);
                    done
                }
                None => {
                    let text = format!("No tool named {wanted} was offered.");
                    output_tokens = deltas(&text).len();
                    message(&mut events, &mut ev, n, &text)
                }
            }
        }
        (Some(_), Some(output)) => {
            let text = format!("Tool result: {output}");
            output_tokens = deltas(&text).len();
            message(&mut events, &mut ev, n, &text)
        }
        (None, _) => {
            let text = script.say.clone().unwrap_or_else(|| default_text(&model));
            output_tokens = deltas(&text).len();
            message(&mut events, &mut ev, n, &text)
        }
    };
    events.push(ev("response.output_item.done", json!({"output_index": 0, "item": item})));
    let mut done = response("completed", json!([item]));
    done["usage"] = json!({"input_tokens": 20, "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 20 + output_tokens});
    events.push(ev("response.completed", json!({"response": done})));
    stream_sse(events, script.slow, false)
}

/// Pushes the events of an assistant message streaming `text` (one delta per word) and returns
/// the completed message item.
fn message(
    events: &mut Vec<(&'static str, Value)>,
    ev: &mut impl FnMut(&'static str, Value) -> (&'static str, Value),
    n: usize,
    text: &str,
) -> Value {
    let item_id = format!("msg_fake_{n}");
    let added = json!({"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []});
    events.push(ev("response.output_item.added", json!({"output_index": 0, "item": added})));
    let part = |t: &str| json!({"type": "output_text", "text": t, "annotations": []});
    events.push(ev(
        "response.content_part.added",
        json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part("")}),
    ));
    for d in deltas(text) {
        events.push(ev(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0, "delta": d}),
        ));
    }
    events.push(ev(
        "response.output_text.done",
        json!({"item_id": item_id, "output_index": 0, "content_index": 0, "text": text}),
    ));
    events.push(ev(
        "response.content_part.done",
        json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part(text)}),
    ));
    json!({"id": item_id, "type": "message", "status": "completed", "role": "assistant", "content": [part(text)]})
}

/// The credential headers of a request (`x-api-key`, `authorization`), lower-case names.
fn auth_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    ["x-api-key", "authorization"]
        .iter()
        .filter_map(|k| headers.get(*k).map(|v| ((*k).to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned())))
        .collect()
}
