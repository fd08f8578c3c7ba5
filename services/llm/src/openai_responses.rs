//! The OpenAI Responses wire, following OpenAI's API reference: "Create a model response"
//! (<https://platform.openai.com/docs/api-reference/responses/create>), "Streaming events"
//! (<https://platform.openai.com/docs/api-reference/responses-streaming>), the function
//! calling guide (<https://platform.openai.com/docs/guides/function-calling>), "List models"
//! (<https://platform.openai.com/docs/api-reference/models/list>) and "Error codes"
//! (<https://platform.openai.com/docs/guides/error-codes>).
//!
//! Request: `POST /v1/responses` (bearer), body `{model, instructions?, input: [items],
//! tools?: [{type: "function", name, description, parameters, strict: false}],
//! max_output_tokens, stream: true, store: false}`. Input items: messages `{type: "message",
//! role, content}`, the model's earlier calls `{type: "function_call", call_id, name,
//! arguments}` (arguments as JSON text) and their results `{type: "function_call_output",
//! call_id, output}`. `max_output_tokens` is at least 16, the API's minimum.
//!
//! Stream: `response.output_text.delta` (text), `response.output_item.added` /
//! `response.function_call_arguments.delta|done` / `response.output_item.done` for a
//! `function_call` item (emitted whole at `output_item.done`), then `response.completed`
//! (`usage.input_tokens`, `usage.output_tokens`) or `response.incomplete`
//! (`incomplete_details.reason`); `response.failed` and `error` carry `{code, message}`.
//!
//! Models: `GET /v1/models` → `{data: [{id}]}`.
use std::collections::HashMap;

use serde_json::{Value, json};

use crate::error::Detail;
use crate::wire::{Adapter, DecodeError, Decoder, Frame, arguments, json, result_text};
use crate::{Block, Request, Role, StopReason, StreamEvent, Usage};

/// The API's smallest `max_output_tokens`.
pub(crate) const MIN_OUTPUT_TOKENS: u32 = 16;

/// The OpenAI Responses adapter.
pub(crate) struct Responses;

impl Adapter for Responses {
    fn chat_path(&self) -> &'static str {
        "/v1/responses"
    }

    fn models_path(&self) -> &'static str {
        "/v1/models"
    }

    fn terminal(&self) -> &'static str {
        "response.completed"
    }

    fn body(&self, request: &Request, _base: &url::Url) -> Value {
        let mut input: Vec<Value> = Vec::new();
        for m in &request.messages {
            let (role, part) = match m.role {
                Role::User => ("user", "input_text"),
                Role::Assistant => ("assistant", "output_text"),
            };
            let mut texts: Vec<Value> = Vec::new();
            let flush = |texts: &mut Vec<Value>, input: &mut Vec<Value>| {
                if !texts.is_empty() {
                    input.push(json!({"type": "message", "role": role, "content": std::mem::take(texts)}));
                }
            };
            for b in &m.content {
                match b {
                    Block::Text(t) if t.is_empty() => {}
                    Block::Text(t) => texts.push(json!({"type": part, "text": t})),
                    Block::ToolUse { id, name, input: args } => {
                        flush(&mut texts, &mut input);
                        input.push(json!({"type": "function_call", "call_id": id, "name": name, "arguments": args.to_string()}));
                    }
                    Block::ToolResult { id, content, is_error } => {
                        flush(&mut texts, &mut input);
                        input.push(json!({"type": "function_call_output", "call_id": id, "output": result_text(content, *is_error)}));
                    }
                }
            }
            flush(&mut texts, &mut input);
        }
        let mut body = json!({
            "model": request.model,
            "input": input,
            "max_output_tokens": request.max_tokens.max(MIN_OUTPUT_TOKENS),
            "stream": true,
            "store": false,
        });
        if let Some(system) = request.system.as_deref().filter(|s| !s.is_empty()) {
            body["instructions"] = json!(system);
        }
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "name": t.name, "description": t.description,
                        "parameters": t.input_schema, "strict": false})
                })
                .collect();
            body["tools"] = json!(tools);
        }
        body
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(ResponsesDecoder::default())
    }
}

/// A function call being streamed.
#[derive(Default)]
struct Call {
    call_id: String,
    name: String,
    arguments: String,
}

#[derive(Default)]
struct ResponsesDecoder {
    /// By output index.
    calls: HashMap<u64, Call>,
    called: bool,
}

fn usage(response: &Value) -> Usage {
    let u = &response["usage"];
    Usage {
        input_tokens: u["input_tokens"].as_u64().unwrap_or(0),
        output_tokens: u["output_tokens"].as_u64().unwrap_or(0),
    }
}

impl Decoder for ResponsesDecoder {
    fn feed(&mut self, frame: Frame<'_>, out: &mut Vec<StreamEvent>) -> Result<(), DecodeError> {
        let Frame::Sse { event, data } = frame else {
            return Err(DecodeError::Garbage("a line where server-sent events were expected".into()));
        };
        let v = json(data)?;
        let kind = v["type"].as_str().unwrap_or(event).to_owned();
        let index = v["output_index"].as_u64().unwrap_or(0);
        match kind.as_str() {
            "response.output_text.delta" | "response.refusal.delta" => {
                if let Some(t) = v["delta"].as_str().filter(|t| !t.is_empty()) {
                    out.push(StreamEvent::TextDelta(t.to_owned()));
                }
            }
            "response.output_item.added" if v["item"]["type"] == "function_call" => {
                let item = &v["item"];
                self.calls.insert(
                    index,
                    Call {
                        call_id: item["call_id"].as_str().unwrap_or_default().to_owned(),
                        name: item["name"].as_str().unwrap_or_default().to_owned(),
                        arguments: item["arguments"].as_str().unwrap_or_default().to_owned(),
                    },
                );
            }
            "response.function_call_arguments.delta" => {
                let call = self.calls.entry(index).or_default();
                call.arguments.push_str(v["delta"].as_str().unwrap_or_default());
            }
            "response.function_call_arguments.done" => {
                if let Some(a) = v["arguments"].as_str() {
                    self.calls.entry(index).or_default().arguments = a.to_owned();
                }
            }
            "response.output_item.done" if v["item"]["type"] == "function_call" => {
                let item = &v["item"];
                let call = self.calls.remove(&index).unwrap_or_default();
                let pick = |field: &str, streamed: String| {
                    item[field].as_str().filter(|s| !s.is_empty()).map_or(streamed, str::to_owned)
                };
                let (call_id, name) = (pick("call_id", call.call_id), pick("name", call.name));
                let args = pick("arguments", call.arguments);
                if call_id.is_empty() || name.is_empty() {
                    return Err(DecodeError::Garbage("a function_call item without call_id or name".into()));
                }
                self.called = true;
                out.push(StreamEvent::ToolUse { id: call_id, name, input: arguments(&args) });
            }
            "response.completed" => {
                let stop = if self.called { StopReason::ToolUse } else { StopReason::EndTurn };
                out.push(StreamEvent::Done { stop, usage: usage(&v["response"]) });
            }
            "response.incomplete" => {
                let reason = v["response"]["incomplete_details"]["reason"].as_str().unwrap_or("incomplete");
                let stop = match reason {
                    "max_output_tokens" => StopReason::MaxTokens,
                    other => StopReason::Other(other.to_owned()),
                };
                out.push(StreamEvent::Done { stop, usage: usage(&v["response"]) });
            }
            "response.failed" => {
                let e = &v["response"]["error"];
                return Err(DecodeError::Provider(Detail {
                    kind: e["code"].as_str().map(str::to_owned),
                    message: e["message"].as_str().unwrap_or("the response failed").to_owned(),
                }));
            }
            "error" => {
                let d = Detail::from_body(&v).unwrap_or_else(|| Detail {
                    kind: v["code"].as_str().map(str::to_owned),
                    message: v["message"].as_str().unwrap_or_default().to_owned(),
                });
                return Err(DecodeError::Provider(d));
            }
            _ => {} // created, in_progress, content parts, reasoning, later additions.
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Message, ToolSpec};

    #[test]
    fn request_shape() {
        let request = Request {
            model: "gpt-x".into(),
            system: Some("be brief".into()),
            messages: vec![
                Message { role: Role::User, content: vec![Block::Text("hi".into())] },
                Message {
                    role: Role::Assistant,
                    content: vec![
                        Block::Text("Looking.".into()),
                        Block::ToolUse { id: "call_1".into(), name: "search".into(), input: json!({"q": "x"}) },
                    ],
                },
                Message {
                    role: Role::User,
                    content: vec![Block::ToolResult { id: "call_1".into(), content: "found".into(), is_error: false }],
                },
            ],
            tools: vec![ToolSpec {
                name: "search".into(),
                description: "finds".into(),
                input_schema: json!({"type": "object"}),
            }],
            max_tokens: 1,
        };
        let base = url::Url::parse("https://api.openai.com").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            Responses.body(&request, &base),
            json!({
                "model": "gpt-x", "instructions": "be brief", "max_output_tokens": 16, "stream": true, "store": false,
                "input": [
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
                    {"type": "function_call", "call_id": "call_1", "name": "search", "arguments": "{\"q\":\"x\"}"},
                    {"type": "function_call_output", "call_id": "call_1", "output": "found"},
                ],
                "tools": [{"type": "function", "name": "search", "description": "finds", "parameters": {"type": "object"}, "strict": false}],
            })
        );
    }

    #[test]
    fn folds_calls_and_usage() {
        let mut d = ResponsesDecoder::default();
        let mut out = Vec::new();
        for e in [
            json!({"type": "response.created", "response": {}}),
            json!({"type": "response.output_text.delta", "output_index": 0, "delta": "Hi"}),
            json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "function_call", "id": "fc_1", "call_id": "call_7", "name": "search", "arguments": ""}}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "{\"q\":"}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "\"x\"}"}),
            json!({"type": "response.output_item.done", "output_index": 1, "item": {"type": "function_call", "call_id": "call_7", "name": "search"}}),
            json!({"type": "response.completed", "response": {"usage": {"input_tokens": 30, "output_tokens": 4}}}),
        ] {
            let data = e.to_string();
            d.feed(Frame::Sse { event: "", data: data.as_bytes() }, &mut out).unwrap_or_else(|e| panic!("{e:?}"));
        }
        assert_eq!(
            out,
            vec![
                StreamEvent::TextDelta("Hi".into()),
                StreamEvent::ToolUse { id: "call_7".into(), name: "search".into(), input: json!({"q": "x"}) },
                StreamEvent::Done { stop: StopReason::ToolUse, usage: Usage { input_tokens: 30, output_tokens: 4 } },
            ]
        );
        let failed =
            json!({"type": "response.failed", "response": {"error": {"code": "server_error", "message": "boom"}}});
        let data = failed.to_string();
        assert_eq!(
            ResponsesDecoder::default().feed(Frame::Sse { event: "", data: data.as_bytes() }, &mut out),
            Err(DecodeError::Provider(Detail { kind: Some("server_error".into()), message: "boom".into() }))
        );
    }
}
