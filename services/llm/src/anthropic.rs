//! The Anthropic Messages wire, following Anthropic's API reference: "Messages"
//! (<https://docs.anthropic.com/en/api/messages>), "Streaming Messages"
//! (<https://docs.anthropic.com/en/docs/build-with-claude/streaming>), "Tool use"
//! (<https://docs.anthropic.com/en/docs/build-with-claude/tool-use>), "List Models"
//! (<https://docs.anthropic.com/en/api/models-list>) and "Errors"
//! (<https://docs.anthropic.com/en/api/errors>).
//!
//! Request: `POST /v1/messages` with `x-api-key` and `anthropic-version: 2023-06-01`, body
//! `{model, max_tokens, system?, messages: [{role, content: [blocks]}], tools?: [{name,
//! description, input_schema}], stream: true}`; a tool result is a `tool_result` block
//! (`tool_use_id`, `content`, `is_error`) in a user message.
//!
//! Stream: `message_start` (usage: `input_tokens`, cache counts), per content block
//! `content_block_start` / `content_block_delta` (`text_delta`; `input_json_delta` pieces of a
//! `tool_use` block's input) / `content_block_stop`, then `message_delta` (`stop_reason`,
//! cumulative `usage.output_tokens`) and `message_stop`; `ping` and unknown events are
//! skipped; `error` carries `{type, message}` (`overloaded_error`, …). Thinking blocks are
//! skipped.
//!
//! Models: `GET /v1/models?limit=1000` → `{data: [{id}], has_more, last_id}`, paged with
//! `after_id`.
use std::collections::HashMap;

use reqwest::header::HeaderMap;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

use crate::error::Detail;
use crate::wire::{Adapter, DecodeError, Decoder, Frame, header, json, sensitive};
use crate::{Block, Request, Role, StopReason, StreamEvent, Usage};

/// The API version sent with every request.
pub(crate) const VERSION: &str = "2023-06-01";

/// The Anthropic Messages adapter.
pub(crate) struct Anthropic;

impl Adapter for Anthropic {
    fn chat_path(&self) -> &'static str {
        "/v1/messages"
    }

    fn models_path(&self) -> &'static str {
        "/v1/models"
    }

    fn terminal(&self) -> &'static str {
        "message_stop"
    }

    fn auth_headers(&self, secret: Option<&SecretString>) -> Result<HeaderMap, String> {
        let mut h = HeaderMap::new();
        let (name, value) = header("anthropic-version", VERSION);
        h.insert(name, value);
        if let Some(s) = secret {
            h.insert("x-api-key", sensitive(s.expose_secret())?);
        }
        Ok(h)
    }

    fn body(&self, request: &Request, _base: &url::Url) -> Value {
        let messages: Vec<Value> = request
            .messages
            .iter()
            .map(|m| {
                let role = match m.role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                };
                let content: Vec<Value> = m.content.iter().filter_map(block).collect();
                json!({"role": role, "content": content})
            })
            .collect();
        let mut body = json!({
            "model": request.model,
            "max_tokens": request.max_tokens.max(1),
            "messages": messages,
            "stream": true,
        });
        if let Some(system) = request.system.as_deref().filter(|s| !s.is_empty()) {
            body["system"] = json!(system);
        }
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
                .collect();
            body["tools"] = json!(tools);
        }
        body
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(AnthropicDecoder::default())
    }

    fn parse_models(&self, body: &Value) -> Result<(Vec<String>, Option<String>), String> {
        let data = body["data"].as_array().ok_or("no `data` array")?;
        let ids = data.iter().filter_map(|m| m["id"].as_str()).map(str::to_owned).collect();
        let next = (body["has_more"] == true).then(|| body["last_id"].as_str().map(str::to_owned)).flatten();
        Ok((ids, next))
    }

    fn models_query(&self, cursor: Option<&str>) -> Vec<(&'static str, String)> {
        let mut q = vec![("limit", "1000".to_owned())];
        if let Some(c) = cursor {
            q.push(("after_id", c.to_owned()));
        }
        q
    }
}

/// One content block as the API takes it; empty text is dropped (the API rejects it).
fn block(b: &Block) -> Option<Value> {
    Some(match b {
        Block::Text(t) if t.is_empty() => return None,
        Block::Text(t) => json!({"type": "text", "text": t}),
        Block::ToolUse { id, name, input } => {
            let input = if input.is_object() { input.clone() } else { json!({}) };
            json!({"type": "tool_use", "id": id, "name": name, "input": input})
        }
        Block::ToolResult { id, content, is_error } => {
            let mut v = json!({"type": "tool_result", "tool_use_id": id, "content": content});
            if *is_error {
                v["is_error"] = json!(true);
            }
            v
        }
    })
}

/// A content block being streamed.
enum Open {
    Text,
    Tool { id: String, name: String, json: String, initial: Value },
    Other,
}

#[derive(Default)]
struct AnthropicDecoder {
    open: HashMap<u64, Open>,
    usage: Usage,
    stop: Option<String>,
}

fn tokens(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

impl Decoder for AnthropicDecoder {
    fn feed(&mut self, frame: Frame<'_>, out: &mut Vec<StreamEvent>) -> Result<(), DecodeError> {
        let Frame::Sse { event, data } = frame else {
            return Err(DecodeError::Garbage("a line where server-sent events were expected".into()));
        };
        let v = json(data)?;
        let kind = v["type"].as_str().unwrap_or(event).to_owned();
        let index = v["index"].as_u64().unwrap_or(0);
        match kind.as_str() {
            "message_start" => {
                let u = &v["message"]["usage"];
                self.usage.input_tokens = tokens(&u["input_tokens"])
                    + tokens(&u["cache_creation_input_tokens"])
                    + tokens(&u["cache_read_input_tokens"]);
                self.usage.output_tokens = tokens(&u["output_tokens"]);
            }
            "content_block_start" => {
                let b = &v["content_block"];
                let open = match b["type"].as_str() {
                    Some("text") => {
                        if let Some(t) = b["text"].as_str().filter(|t| !t.is_empty()) {
                            out.push(StreamEvent::TextDelta(t.to_owned()));
                        }
                        Open::Text
                    }
                    Some("tool_use") => Open::Tool {
                        id: b["id"].as_str().unwrap_or_default().to_owned(),
                        name: b["name"].as_str().unwrap_or_default().to_owned(),
                        json: String::new(),
                        initial: b["input"].clone(),
                    },
                    _ => Open::Other,
                };
                self.open.insert(index, open);
            }
            "content_block_delta" => {
                let d = &v["delta"];
                match (self.open.get_mut(&index), d["type"].as_str()) {
                    (Some(Open::Text) | None, Some("text_delta")) => {
                        if let Some(t) = d["text"].as_str().filter(|t| !t.is_empty()) {
                            out.push(StreamEvent::TextDelta(t.to_owned()));
                        }
                    }
                    (Some(Open::Tool { json, .. }), Some("input_json_delta")) => {
                        json.push_str(d["partial_json"].as_str().unwrap_or_default());
                    }
                    (None, Some("input_json_delta")) => {
                        return Err(DecodeError::Garbage(format!("input_json_delta for block {index}, never started")));
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some(Open::Tool { id, name, json, initial }) = self.open.remove(&index) {
                    let input = if json.trim().is_empty() {
                        if initial.is_object() { initial } else { serde_json::json!({}) }
                    } else {
                        crate::wire::arguments(&json)
                    };
                    out.push(StreamEvent::ToolUse { id, name, input });
                }
            }
            "message_delta" => {
                if let Some(s) = v["delta"]["stop_reason"].as_str() {
                    self.stop = Some(s.to_owned());
                }
                let u = &v["usage"];
                if u["output_tokens"].is_u64() {
                    self.usage.output_tokens = tokens(&u["output_tokens"]);
                }
                if u["input_tokens"].is_u64() {
                    self.usage.input_tokens = tokens(&u["input_tokens"])
                        + tokens(&u["cache_creation_input_tokens"])
                        + tokens(&u["cache_read_input_tokens"]);
                }
            }
            "message_stop" => {
                let stop = match self.stop.as_deref() {
                    Some("end_turn") => StopReason::EndTurn,
                    Some("tool_use") => StopReason::ToolUse,
                    Some("max_tokens") => StopReason::MaxTokens,
                    Some(other) => StopReason::Other(other.to_owned()),
                    None => StopReason::Other("none".to_owned()),
                };
                out.push(StreamEvent::Done { stop, usage: self.usage });
            }
            "error" => {
                let d = Detail::from_body(&v).unwrap_or(Detail { kind: None, message: v.to_string() });
                return Err(DecodeError::Provider(d));
            }
            _ => {} // `ping`, and events added to the API later.
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, ToolSpec};

    fn request() -> Request {
        Request {
            model: "claude-x".into(),
            system: Some("be brief".into()),
            messages: vec![
                Message { role: Role::User, content: vec![Block::Text("hi".into())] },
                Message {
                    role: Role::Assistant,
                    content: vec![
                        Block::Text(String::new()),
                        Block::ToolUse { id: "toolu_1".into(), name: "search".into(), input: json!({"q": "x"}) },
                    ],
                },
                Message {
                    role: Role::User,
                    content: vec![Block::ToolResult {
                        id: "toolu_1".into(),
                        content: "nothing".into(),
                        is_error: true,
                    }],
                },
            ],
            tools: vec![ToolSpec {
                name: "search".into(),
                description: "finds".into(),
                input_schema: json!({"type": "object"}),
            }],
            max_tokens: 100,
        }
    }

    #[test]
    fn request_shape() {
        let base = url::Url::parse("https://api.anthropic.com").unwrap_or_else(|e| panic!("{e}"));
        let body = Anthropic.body(&request(), &base);
        assert_eq!(
            body,
            json!({
                "model": "claude-x", "max_tokens": 100, "stream": true, "system": "be brief",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "x"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "nothing", "is_error": true}]},
                ],
                "tools": [{"name": "search", "description": "finds", "input_schema": {"type": "object"}}],
            })
        );
        let h = Anthropic.auth_headers(Some(&SecretString::from("sk-ant"))).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(h["x-api-key"], "sk-ant");
        assert!(h["x-api-key"].is_sensitive());
        assert_eq!(h["anthropic-version"], VERSION);
    }

    fn feed(events: &[Value]) -> Result<Vec<StreamEvent>, DecodeError> {
        let mut d = AnthropicDecoder::default();
        let mut out = Vec::new();
        for e in events {
            let data = e.to_string();
            d.feed(Frame::Sse { event: e["type"].as_str().unwrap_or_default(), data: data.as_bytes() }, &mut out)?;
        }
        Ok(out)
    }

    #[test]
    fn folds_text_tools_and_usage() {
        let out = feed(&[
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "ping"}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "look."}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_9", "name": "search", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"q\": "}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"x\"}"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 12}}),
            json!({"type": "message_stop"}),
        ])
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            out,
            vec![
                StreamEvent::TextDelta("Let me ".into()),
                StreamEvent::TextDelta("look.".into()),
                StreamEvent::ToolUse { id: "toolu_9".into(), name: "search".into(), input: json!({"q": "x"}) },
                StreamEvent::Done { stop: StopReason::ToolUse, usage: Usage { input_tokens: 15, output_tokens: 12 } },
            ]
        );
        let err = feed(&[json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})]);
        assert_eq!(
            err,
            Err(DecodeError::Provider(Detail { kind: Some("overloaded_error".into()), message: "Overloaded".into() }))
        );
    }
}
