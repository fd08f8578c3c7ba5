//! `coffer__ask {question, kb?}`: the person's knowledge and memory answered by Coffer's
//! internal agent (coffer-chat's `Llm.Ask`, `proto/llm.proto`), with citations.
//!
//! The run happens in coffer-chat, on the internal-default LLM connection; its own tool calls
//! come back through the tool broker (actor `agent`), so they are checked by policy and logged
//! like any call. The result is the answer as text with its sources listed, plus
//! `structuredContent` `{answer, citations[{source, kb, path, heading, line_start, line_end,
//! snippet}], stop_reason, usage{connection, model, input_tokens, output_tokens, iterations,
//! tool_calls}, took_ms}`; the run's usage also goes on the invocation record
//! ([`Provider::call_metered`]). Every failure is a tool error (`isError`) whose text says what
//! to do: no internal connection configured, a provider that refused or is down, coffer-chat
//! not answering. The agent itself cannot call `coffer__ask` (no recursion): a broker session
//! with actor `agent` gets a tool error.
use coffer_proto::llm::{AskReply, AskRequest};
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::mcp::answer::Answer;
use crate::mcp::builtin::retrieval_tools::MAX_NAME_CHARS;
use crate::mcp::builtin::{Caller, Invalid, Provider, Registry, Reply, input_schema, tool_error};
use crate::mcp::invocations::Usage;

/// Longest question (bytes), as the service takes it.
pub const MAX_QUESTION: usize = 16 * 1024;
/// The broker actor of the internal agent's own calls.
const AGENT_ACTOR: &str = "agent";

/// `registry` with `coffer__ask` calling `client`.
pub fn register(registry: Registry, client: crate::clients::llm::Client) -> Registry {
    registry.with(Ask(client))
}

/// The `coffer__ask` provider.
pub struct Ask(pub crate::clients::llm::Client);

/// The arguments of `coffer__ask`; its `inputSchema` is derived from them.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskArgs {
    #[schemars(
        length(min = 1, max = MAX_QUESTION),
        description = "The question, in natural language, e.g. \"what do my notes say about rotating the API keys?\"."
    )]
    question: String,
    #[serde(default)]
    #[schemars(
        with = "String",
        length(max = MAX_NAME_CHARS),
        description = "Only this knowledge base (its name); default: all of them and memory."
    )]
    kb: Option<String>,
}

impl Provider for Ask {
    fn name(&self) -> &'static str {
        "ask"
    }

    fn definition(&self) -> Value {
        json!({
            "name": "ask",
            "title": "Ask the user's notes",
            "description": "Answer a question from the user's own notes, documents and remembered facts, with citations. \
        A research assistant inside Coffer searches the user's knowledge bases and memory several times, reads the passages and writes a short answer citing them as [1], [2]; \
        the sources (knowledge base, file, heading, lines) follow the answer. \
        Use it for questions like \"what do my notes say about X?\" or \"what did we decide about Y?\", when one search would not be enough; \
        for a quick lookup of exact words, coffer__search_knowledge is faster. Takes several seconds. Needs an internal LLM connection in Coffer (the error says how to add one).",
            "inputSchema": input_schema::<AskArgs>(),
            "annotations": {"readOnlyHint": true, "openWorldHint": true}
        })
    }

    fn call<'a>(&'a self, caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply> {
        Box::pin(async move { self.call_metered(caller, arguments).await.0 })
    }

    fn call_metered<'a>(
        &'a self,
        caller: &'a dyn Caller,
        arguments: Option<&'a str>,
    ) -> BoxFuture<'a, (Reply, Option<Box<Usage>>)> {
        Box::pin(async move {
            let invalid = |msg: String| (Err(Invalid(msg)), None);
            if caller.actor() == AGENT_ACTOR {
                return invalid("coffer__ask cannot be called by the internal agent itself".into());
            }
            let a: AskArgs = match serde_json::from_str(arguments.unwrap_or("{}")) {
                Ok(a) => a,
                Err(e) => {
                    let msg = e.to_string();
                    let msg = msg.split(" at line ").next().unwrap_or(&msg).to_owned();
                    return invalid(format!("coffer__ask: invalid arguments: {msg}"));
                }
            };
            if a.question.trim().is_empty() {
                return invalid("coffer__ask: question must not be empty".into());
            }
            if a.question.len() > MAX_QUESTION {
                return invalid(format!(
                    "coffer__ask: question is {} bytes, over the limit of {MAX_QUESTION} bytes",
                    a.question.len()
                ));
            }
            let req = AskRequest {
                question: a.question,
                origin: format!("{}:{}", caller.actor(), caller.session_id()),
                kb: a.kb.unwrap_or_default(),
            };
            match crate::clients::llm::call(crate::clients::llm::ASK_TIMEOUT, self.0.clone().ask(req)).await {
                Ok(reply) => {
                    let usage = reply.usage.as_ref().map(|u| {
                        Box::new(Usage {
                            connection: u.connection.clone(),
                            model: u.model.clone(),
                            input_tokens: u.input_tokens,
                            output_tokens: u.output_tokens,
                            iterations: u.iterations,
                        })
                    });
                    (Ok(Answer::ok(result_json(&reply))), usage)
                }
                Err(s) => (Ok(tool_error(&failure_text(&s))), None),
            }
        })
    }
}

/// What a failed run says to the calling model (and through it, the person).
pub fn failure_text(s: &tonic::Status) -> String {
    use tonic::Code;
    match s.code() {
        // The service's own words: how to configure a connection, which provider refused why.
        Code::FailedPrecondition | Code::InvalidArgument | Code::NotFound | Code::ResourceExhausted => {
            format!("coffer__ask: {}", s.message())
        }
        Code::DeadlineExceeded => format!("coffer__ask timed out: {}", s.message()),
        Code::Unavailable => format!("coffer__ask is unavailable: {}", s.message()),
        _ => format!("coffer__ask failed: {}", s.message()),
    }
}

/// The tool result of a run: the answer and its sources as text, the reply as
/// `structuredContent`.
pub fn result_json(reply: &AskReply) -> Value {
    let mut text = reply.answer.trim().to_owned();
    if !reply.citations.is_empty() {
        text.push_str("\n\nSources:");
        for (i, c) in reply.citations.iter().enumerate() {
            if c.source == "memory" {
                text.push_str(&format!("\n[{}] memory fact {}", i + 1, c.path));
            } else {
                text.push_str(&format!("\n[{}] {}:{}:{}-{}", i + 1, c.kb, c.path, c.line_start, c.line_end));
                if !c.heading.is_empty() {
                    text.push_str(&format!(" > {}", c.heading));
                }
            }
        }
    }
    let citations: Vec<Value> = reply
        .citations
        .iter()
        .map(|c| {
            json!({"source": c.source, "kb": c.kb, "path": c.path, "heading": c.heading,
                   "line_start": c.line_start, "line_end": c.line_end, "snippet": c.snippet})
        })
        .collect();
    let usage = reply.usage.as_ref().map(|u| {
        json!({"connection": u.connection, "model": u.model, "input_tokens": u.input_tokens,
               "output_tokens": u.output_tokens, "iterations": u.iterations, "tool_calls": u.tool_calls})
    });
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": {
            "answer": reply.answer, "citations": citations, "stop_reason": reply.stop_reason,
            "usage": usage, "took_ms": reply.took_ms,
        },
    })
}

#[cfg(test)]
mod tests {
    use coffer_proto::llm::{Citation, RunUsage};

    use super::*;

    #[test]
    fn the_result_lists_the_sources_and_carries_the_reply() {
        let reply = AskReply {
            answer: "Rotate every 90 days [1]; on Mondays [2].".into(),
            citations: vec![
                Citation {
                    source: "knowledge".into(),
                    kb: "notes".into(),
                    path: "ops/keys.md".into(),
                    heading: "Keys > Rotation".into(),
                    line_start: 12,
                    line_end: 20,
                    snippet: "Rotate the API keys every 90 days.".into(),
                },
                Citation { source: "memory".into(), path: "01JFACT".into(), ..Default::default() },
            ],
            stop_reason: "end_turn".into(),
            usage: Some(RunUsage {
                connection: "local".into(),
                model: "m".into(),
                input_tokens: 10,
                output_tokens: 2,
                iterations: 2,
                tool_calls: 1,
            }),
            took_ms: 5,
        };
        let v = result_json(&reply);
        assert_eq!(
            v["content"][0]["text"],
            "Rotate every 90 days [1]; on Mondays [2].\n\nSources:\n[1] notes:ops/keys.md:12-20 > Keys > Rotation\n[2] memory fact 01JFACT"
        );
        let s = &v["structuredContent"];
        assert_eq!(s["citations"][0]["line_start"], 12);
        assert_eq!(s["citations"][0]["heading"], "Keys > Rotation");
        assert_eq!(s["stop_reason"], "end_turn");
        assert_eq!(s["usage"]["tool_calls"], 1);
        assert!(v.get("isError").is_none());
    }

    /// A caller with a fixed actor.
    struct As(&'static str);

    impl Caller for As {
        fn session_id(&self) -> &str {
            "s-1"
        }
        fn list_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String)>> {
            Box::pin(async { Vec::new() })
        }
        fn actor(&self) -> &str {
            self.0
        }
    }

    #[tokio::test]
    async fn bad_calls_are_tool_errors_before_any_request() {
        // Nothing listens there: each case must answer without calling coffer-chat.
        let token = secrecy::SecretString::from("t".to_owned());
        let tool = Ask(crate::clients::llm::client("127.0.0.1:9", &token).unwrap());
        let cases: [(&'static str, Option<&str>, &str); 5] = [
            ("agent", Some(r#"{"question":"q"}"#), "cannot be called by the internal agent"),
            ("mcp", None, "missing field `question`"),
            ("mcp", Some(r#"{"question":"  "}"#), "must not be empty"),
            ("mcp", Some(r#"{"question":"q","extra":1}"#), "unknown field `extra`"),
            ("mcp", Some(r#"{"question":5}"#), "invalid type"),
        ];
        for (actor, args, expect) in cases {
            let (reply, usage) = tool.call_metered(&As(actor), args).await;
            let Err(Invalid(t)) = reply else { panic!("{args:?}: the caller's mistake") };
            assert!(t.contains(expect), "{args:?}: {t}");
            assert!(usage.is_none());
        }
        let long = json!({"question": "x".repeat(MAX_QUESTION + 1)}).to_string();
        let (reply, _) = tool.call_metered(&As("mcp"), Some(&long)).await;
        let Err(Invalid(t)) = reply else { panic!("too long a question is the caller's mistake") };
        assert!(t.contains("over the limit of 16384 bytes"), "{t}");
    }

    #[test]
    fn failures_keep_the_service_s_words() {
        let s = tonic::Status::failed_precondition(
            "no internal LLM connection is configured: add one with `coffer llm add`",
        );
        assert_eq!(
            failure_text(&s),
            "coffer__ask: no internal LLM connection is configured: add one with `coffer llm add`"
        );
        let s = tonic::Status::unavailable("the chat service did not answer");
        assert!(failure_text(&s).starts_with("coffer__ask is unavailable: "));
    }
}
