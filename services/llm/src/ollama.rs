//! Ollama's native wire, following Ollama's API documentation
//! (<https://github.com/ollama/ollama/blob/main/docs/api.md>, "Generate a chat completion" and
//! "List Local Models") and its tool-calling guide
//! (<https://docs.ollama.com/capabilities/tool-calling>).
//!
//! Request: `POST /api/chat` (bearer when a key is set, as Ollama's cloud wants), body `{model,
//! messages, tools?: [{type: "function", function: {name, description, parameters}}], stream:
//! true, options: {num_predict}}`. Messages: `system`, `user`, `assistant` (`content`,
//! `tool_calls: [{function: {name, arguments}}]`, arguments as a JSON object) and one `tool`
//! message per result (`content`, `tool_name`: Ollama matches results by tool name).
//!
//! Stream: newline-delimited JSON objects, each `{message: {content, tool_calls?}, done:
//! false}`, the last `{done: true, done_reason, prompt_eval_count, eval_count}`; a line
//! `{error}` reports a failure. Ollama gives calls no id (newer versions may): the adapter
//! makes up a process-unique `ollama_call_N`.
//!
//! Models: `GET /api/tags` → `{models: [{name}]}`.
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};

use crate::error::Detail;
use crate::wire::{Adapter, DecodeError, Decoder, Frame, Framing, function_tools, json, result_text, tool_name_of};
use crate::{Block, Request, Role, StopReason, StreamEvent, Usage};

/// The next made-up call id's number (process-wide, so ids never repeat in a conversation).
static NEXT_CALL: AtomicU64 = AtomicU64::new(1);

/// The Ollama adapter.
pub(crate) struct Ollama;

impl Adapter for Ollama {
    fn chat_path(&self) -> &'static str {
        "/api/chat"
    }

    fn models_path(&self) -> &'static str {
        "/api/tags"
    }

    fn terminal(&self) -> &'static str {
        "\"done\": true"
    }

    fn framing(&self) -> Framing {
        Framing::Ndjson
    }

    fn base_suffixes(&self) -> &'static [&'static str] {
        // `…/api` is Ollama's native root, `…/v1` its OpenAI-compatible one.
        &["/api", "/v1"]
    }

    fn body(&self, request: &Request, _base: &url::Url) -> Value {
        let mut messages: Vec<Value> = Vec::new();
        if let Some(system) = request.system.as_deref().filter(|s| !s.is_empty()) {
            messages.push(json!({"role": "system", "content": system}));
        }
        for m in &request.messages {
            match m.role {
                Role::Assistant => {
                    let mut text = String::new();
                    let mut calls = Vec::new();
                    for b in &m.content {
                        match b {
                            Block::Text(t) => text.push_str(t),
                            Block::ToolUse { name, input, .. } => {
                                let args = if input.is_object() { input.clone() } else { json!({}) };
                                calls.push(json!({"function": {"name": name, "arguments": args}}));
                            }
                            Block::ToolResult { .. } => {}
                        }
                    }
                    let mut msg = json!({"role": "assistant", "content": text});
                    if !calls.is_empty() {
                        msg["tool_calls"] = json!(calls);
                    }
                    messages.push(msg);
                }
                Role::User => {
                    let mut text = String::new();
                    for b in &m.content {
                        match b {
                            Block::Text(t) => text.push_str(t),
                            Block::ToolResult { id, content, is_error } => {
                                let mut msg = json!({"role": "tool", "content": result_text(content, *is_error)});
                                if let Some(name) = tool_name_of(request, id) {
                                    msg["tool_name"] = json!(name);
                                }
                                messages.push(msg);
                            }
                            Block::ToolUse { .. } => {}
                        }
                    }
                    if !text.is_empty() {
                        messages.push(json!({"role": "user", "content": text}));
                    }
                }
            }
        }
        let mut body = json!({
            "model": request.model,
            "messages": messages,
            "stream": true,
            "options": {"num_predict": request.max_tokens.max(1)},
        });
        if !request.tools.is_empty() {
            body["tools"] = function_tools(request);
        }
        body
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(OllamaDecoder::default())
    }

    fn parse_models(&self, body: &Value) -> Result<(Vec<String>, Option<String>), String> {
        let models = body["models"].as_array().ok_or("no `models` array")?;
        let ids = models.iter().filter_map(|m| m["name"].as_str().or_else(|| m["model"].as_str())).map(str::to_owned);
        Ok((ids.collect(), None))
    }
}

#[derive(Default)]
struct OllamaDecoder {
    called: bool,
}

impl Decoder for OllamaDecoder {
    fn feed(&mut self, frame: Frame<'_>, out: &mut Vec<StreamEvent>) -> Result<(), DecodeError> {
        let Frame::Line(line) = frame else {
            return Err(DecodeError::Garbage("a server-sent event where JSON lines were expected".into()));
        };
        let v = json(line)?;
        if !v.is_object() {
            return Err(DecodeError::Garbage("a stream line that is not a JSON object".into()));
        }
        if !v["error"].is_null() {
            return Err(DecodeError::Provider(Detail::from_body(&v).unwrap_or_default()));
        }
        let message = &v["message"];
        if let Some(t) = message["content"].as_str().filter(|t| !t.is_empty()) {
            out.push(StreamEvent::TextDelta(t.to_owned()));
        }
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            let f = &call["function"];
            let Some(name) = f["name"].as_str().filter(|n| !n.is_empty()) else {
                return Err(DecodeError::Garbage("a tool call without a function name".into()));
            };
            let input = match &f["arguments"] {
                Value::Null => json!({}),
                Value::String(s) => crate::wire::arguments(s),
                other => other.clone(),
            };
            let id = call["id"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map_or_else(|| format!("ollama_call_{}", NEXT_CALL.fetch_add(1, Ordering::Relaxed)), str::to_owned);
            self.called = true;
            out.push(StreamEvent::ToolUse { id, name: name.to_owned(), input });
        }
        if v["done"] == true {
            let stop = match v["done_reason"].as_str().unwrap_or("stop") {
                "stop" | "" if self.called => StopReason::ToolUse,
                "stop" | "" => StopReason::EndTurn,
                "length" => StopReason::MaxTokens,
                other => StopReason::Other(other.to_owned()),
            };
            let usage = Usage {
                input_tokens: v["prompt_eval_count"].as_u64().unwrap_or(0),
                output_tokens: v["eval_count"].as_u64().unwrap_or(0),
            };
            out.push(StreamEvent::Done { stop, usage });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Message;

    #[test]
    fn request_shape_names_the_tool_of_each_result() {
        let request = Request {
            model: "llama3".into(),
            system: None,
            messages: vec![
                Message { role: Role::User, content: vec![Block::Text("hi".into())] },
                Message {
                    role: Role::Assistant,
                    content: vec![Block::ToolUse {
                        id: "ollama_call_1".into(),
                        name: "search".into(),
                        input: json!({"q": "x"}),
                    }],
                },
                Message {
                    role: Role::User,
                    content: vec![Block::ToolResult {
                        id: "ollama_call_1".into(),
                        content: "r".into(),
                        is_error: false,
                    }],
                },
            ],
            tools: Vec::new(),
            max_tokens: 1,
        };
        let base = url::Url::parse("http://127.0.0.1:11434").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            Ollama.body(&request, &base),
            json!({
                "model": "llama3", "stream": true, "options": {"num_predict": 1},
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "search", "arguments": {"q": "x"}}}]},
                    {"role": "tool", "content": "r", "tool_name": "search"},
                ],
            })
        );
    }

    #[test]
    fn folds_lines() {
        let mut d = OllamaDecoder::default();
        let mut out = Vec::new();
        for line in [
            json!({"message": {"role": "assistant", "content": "Hi"}, "done": false}),
            json!({"message": {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "search", "arguments": {"q": "x"}}}]}, "done": false}),
            json!({"message": {"role": "assistant", "content": ""}, "done": true, "done_reason": "stop", "prompt_eval_count": 26, "eval_count": 7}),
        ] {
            let data = line.to_string();
            d.feed(Frame::Line(data.as_bytes()), &mut out).unwrap_or_else(|e| panic!("{e:?}"));
        }
        assert_eq!(out.len(), 3);
        assert_eq!(out[0], StreamEvent::TextDelta("Hi".into()));
        assert!(
            matches!(&out[1], StreamEvent::ToolUse { id, name, input } if id.starts_with("ollama_call_") && name == "search" && *input == json!({"q": "x"}))
        );
        assert_eq!(
            out[2],
            StreamEvent::Done { stop: StopReason::ToolUse, usage: Usage { input_tokens: 26, output_tokens: 7 } }
        );
        assert_eq!(
            OllamaDecoder::default().feed(Frame::Line(br#"{"error":"model not found"}"#), &mut out),
            Err(DecodeError::Provider(Detail { kind: None, message: "model not found".into() }))
        );
    }
}
