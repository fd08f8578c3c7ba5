//! The agent loop on a scripted model and scripted tools: multi-step tool use, citations, the
//! bounds (iterations, context budget, oversized results), refused and failing tools, provider
//! failures.
use std::collections::VecDeque;
use std::sync::Mutex;

use coffer_llm::{ErrorKind, Usage};
use serde_json::json;

use super::*;

/// A model that answers from a script, one response per request, and keeps every request.
struct Scripted {
    answers: Mutex<VecDeque<Result<Response, LlmError>>>,
    seen: Mutex<Vec<Request>>,
}

impl Scripted {
    fn new(answers: Vec<Result<Response, LlmError>>) -> Self {
        Self { answers: Mutex::new(answers.into()), seen: Mutex::default() }
    }
    fn requests(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

impl Model for Scripted {
    fn complete<'a>(&'a self, request: &'a Request) -> BoxFuture<'a, Result<Response, LlmError>> {
        self.seen.lock().unwrap().push(request.clone());
        let next = self.answers.lock().unwrap().pop_front().expect("the script ran out: the loop asked once too often");
        Box::pin(async move { next })
    }
}

fn usage(i: u64, o: u64) -> Usage {
    Usage { input_tokens: i, output_tokens: o }
}

fn tool_use(id: &str, name: &str, input: Value) -> Block {
    Block::ToolUse { id: id.into(), name: name.into(), input }
}

fn calls(blocks: Vec<Block>) -> Result<Response, LlmError> {
    Ok(Response { content: blocks, stop: StopReason::ToolUse, usage: usage(100, 10) })
}

fn answer(text: &str) -> Result<Response, LlmError> {
    Ok(Response { content: vec![Block::Text(text.into())], stop: StopReason::EndTurn, usage: usage(200, 20) })
}

/// Tools: the retrieval built-ins listed (unless disabled), fixed answers, every call kept.
struct FakeTools {
    disabled: Vec<&'static str>,
    big: Option<usize>,
    seen: Mutex<Vec<(String, Value)>>,
}

impl FakeTools {
    fn new() -> Self {
        Self { disabled: Vec::new(), big: None, seen: Mutex::default() }
    }
    fn calls(&self) -> Vec<(String, Value)> {
        self.seen.lock().unwrap().clone()
    }
}

fn listed(original: &str, server: &str) -> ListedTool {
    let name = format!("{server}__{original}");
    ListedTool {
        definition: json!({"name": name, "description": format!("{original} tool"), "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}}}),
        name,
        server: server.into(),
        original: original.into(),
    }
}

impl Tools for FakeTools {
    fn list(&self) -> BoxFuture<'_, Result<Vec<ListedTool>, String>> {
        Box::pin(async move {
            let mut all = vec![
                listed("ask", "coffer"),
                listed("search_knowledge", "coffer"),
                listed("recall", "coffer"),
                listed("remember", "coffer"),
                listed("search_tools", "coffer"),
                listed("echo", "tiny"),
            ];
            all.retain(|t| !self.disabled.contains(&t.original.as_str()));
            Ok(all)
        })
    }

    fn call<'a>(&'a self, name: &'a str, arguments: &'a Value) -> BoxFuture<'a, Result<Value, String>> {
        self.seen.lock().unwrap().push((name.to_owned(), arguments.clone()));
        Box::pin(async move {
            let original = name.trim_start_matches("coffer__");
            if self.disabled.contains(&original) {
                return Err(format!("{name} is disabled by the person's Coffer policy"));
            }
            if let Some(n) = self.big {
                return Ok(json!({"content": [{"type": "text", "text": "x".repeat(n)}]}));
            }
            match original {
                "search_knowledge" => {
                    let q = arguments["query"].as_str().unwrap_or_default();
                    let results = if q.contains("rotate") {
                        json!([
                            {"kb": "notes", "path": "ops/keys.md", "title": "Keys", "heading_path": ["Keys", "Rotation"], "line_start": 12, "line_end": 20, "snippet": "Rotate the API keys every **90 days**.", "fact_id": null},
                            {"kb": "notes", "path": "misc.md", "title": "Misc", "heading_path": [], "line_start": 1, "line_end": 3, "snippet": "unrelated", "fact_id": null}
                        ])
                    } else {
                        json!([])
                    };
                    Ok(
                        json!({"content": [{"type": "text", "text": "raw text"}], "structuredContent": {"results": results}}),
                    )
                }
                "recall" => {
                    Ok(json!({"content": [{"type": "text", "text": "1 fact"}], "structuredContent": {"results": [
                        {"kb": "memory", "path": "01JFACT.md", "fact_id": "01JFACT", "snippet": "The person rotates keys on Mondays.", "line_start": 1, "line_end": 1}
                    ]}}))
                }
                "fails" => Ok(json!({"content": [{"type": "text", "text": "the index is gone"}], "isError": true})),
                _ => Err(format!("There is no tool named {name:?}")),
            }
        })
    }
}

fn params(max_iterations: u32) -> Params {
    Params {
        model: "m-1".into(),
        question: "what do my notes say about key rotation?".into(),
        kb: None,
        max_iterations,
        context_tokens: 32_000,
    }
}

fn results_of(req: &Request) -> Vec<(String, bool)> {
    req.messages
        .last()
        .unwrap()
        .content
        .iter()
        .filter_map(|b| match b {
            Block::ToolResult { content, is_error, .. } => Some((content.clone(), *is_error)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_multi_step_run_searches_reads_and_answers_with_renumbered_citations() {
    let model = Scripted::new(vec![
        calls(vec![
            Block::Text("Let me search.".into()),
            tool_use("t1", "coffer__search_knowledge", json!({"query": "rotate keys"})),
            tool_use("t2", "coffer__recall", json!({"query": "keys"})),
        ]),
        calls(vec![tool_use("t3", "coffer__search_knowledge", json!({"query": "nothing here"}))]),
        answer("Your notes say to rotate the API keys every 90 days [1], on Mondays [3]."),
    ]);
    let tools = FakeTools::new();
    let out = run(&model, &tools, &params(8)).await.unwrap();
    assert_eq!(out.stop_reason, "end_turn");
    assert_eq!(out.answer, "Your notes say to rotate the API keys every 90 days [1], on Mondays [2].");
    assert_eq!(out.citations.len(), 2);
    let c = &out.citations[0];
    assert_eq!((c.source.as_str(), c.kb.as_str(), c.path.as_str()), ("knowledge", "notes", "ops/keys.md"));
    assert_eq!((c.heading.as_str(), c.line_start, c.line_end), ("Keys > Rotation", 12, 20));
    assert_eq!(c.snippet, "Rotate the API keys every **90 days**.");
    assert_eq!((out.citations[1].source.as_str(), out.citations[1].path.as_str()), ("memory", "01JFACT"));
    assert_eq!((out.iterations, out.tool_calls), (3, 3));
    assert_eq!((out.input_tokens, out.output_tokens), (400, 40), "usage summed over the run");

    let reqs = model.requests();
    assert_eq!(reqs.len(), 3);
    let offered: Vec<&str> = reqs[0].tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        offered,
        ["coffer__search_knowledge", "coffer__recall"],
        "read-only retrieval only: never ask, remember or upstream tools"
    );
    assert_eq!(reqs[0].model, "m-1");
    assert!(reqs[0].system.as_deref().unwrap().contains("[1]"), "the prompt asks for numbered citations");
    let first = results_of(&reqs[1]);
    assert!(first[0].0.contains("[1] notes:ops/keys.md:12-20 > Keys > Rotation"), "{first:?}");
    assert!(first[1].0.contains("[3] memory fact 01JFACT"), "{first:?}");
    assert!(!first[0].1 && !first[1].1);
    assert!(results_of(&reqs[2])[0].0.starts_with("No passages"), "an empty search says so");
}

#[tokio::test]
async fn refused_unknown_disabled_and_failing_tools_go_back_to_the_model_and_the_run_goes_on() {
    let model = Scripted::new(vec![
        calls(vec![
            tool_use("a", "coffer__ask", json!({"question": "recursion?"})),
            tool_use("b", "no_such_tool", json!({})),
            tool_use("c", "tiny__echo", json!({"message": "hi"})),
            tool_use("d", "coffer__recall", json!({"query": "x"})),
            tool_use("e", "coffer__search_knowledge", json!("not an object")),
        ]),
        answer("I could not find it."),
    ]);
    let mut tools = FakeTools::new();
    tools.disabled = vec!["recall"];
    let out = run(&model, &tools, &params(8)).await.unwrap();
    assert_eq!(out.stop_reason, "end_turn");
    assert_eq!(out.answer, "I could not find it.");
    assert!(out.citations.is_empty());
    assert_eq!(out.tool_calls, 5);
    let results = results_of(&model.requests()[1]);
    assert_eq!(results.len(), 5, "one result per call, in order");
    assert!(results[0].1 && results[0].0.contains("cannot be called from inside it"), "{:?}", results[0]);
    assert!(results[1].1 && results[1].0.contains("no tool named \"no_such_tool\""), "{:?}", results[1]);
    assert!(results[2].1 && results[2].0.contains("no tool named \"tiny__echo\""), "not offered: {:?}", results[2]);
    assert!(results[3].1 && results[3].0.contains("disabled"), "the broker's refusal: {:?}", results[3]);
    assert!(!results[4].1, "arguments that are not an object become {{}}: {:?}", results[4]);
    let sent: Vec<String> = tools.calls().into_iter().map(|(n, _)| n).collect();
    assert_eq!(sent, ["coffer__recall", "coffer__search_knowledge"], "ask and unoffered tools never reach the broker");
    assert!(!model.requests()[0].tools.iter().any(|t| t.name == "coffer__recall"), "a disabled tool is not offered");
}

#[tokio::test]
async fn a_tool_error_result_is_passed_on_marked_as_an_error() {
    struct Failing;
    impl Tools for Failing {
        fn list(&self) -> BoxFuture<'_, Result<Vec<ListedTool>, String>> {
            Box::pin(async { Ok(vec![listed("search_knowledge", "coffer")]) })
        }
        fn call<'a>(&'a self, _: &'a str, _: &'a Value) -> BoxFuture<'a, Result<Value, String>> {
            Box::pin(async {
                Ok(
                    json!({"content": [{"type": "text", "text": "the retrieval service is unavailable"}], "isError": true, "structuredContent": {"results": []}}),
                )
            })
        }
    }
    let model = Scripted::new(vec![
        calls(vec![tool_use("a", "coffer__search_knowledge", json!({"query": "q"}))]),
        answer("Search is down."),
    ]);
    let out = run(&model, &Failing, &params(8)).await.unwrap();
    assert_eq!(out.answer, "Search is down.");
    let r = results_of(&model.requests()[1]);
    assert_eq!(r, [("the retrieval service is unavailable".to_owned(), true)]);
}

#[tokio::test]
async fn a_loop_that_never_ends_stops_cleanly_at_max_iterations_with_what_it_found() {
    let looping: Vec<_> = (0..3)
        .map(|i| calls(vec![tool_use(&format!("t{i}"), "coffer__search_knowledge", json!({"query": "rotate"}))]))
        .collect();
    let model = Scripted::new(looping);
    let out = run(&model, &FakeTools::new(), &params(3)).await.unwrap();
    assert_eq!(out.stop_reason, "max_iterations");
    assert_eq!(out.iterations, 3);
    assert_eq!(out.tool_calls, 2, "the last request's calls are not run: no request follows them");
    assert!(out.answer.contains("limit of 3 model requests"), "{}", out.answer);
    assert!(out.answer.contains("[1] notes:ops/keys.md:12-20"), "{}", out.answer);
    assert_eq!(out.citations.len(), 2, "what was found is listed");

    // With text on the way, the best answer so far is the answer.
    let model = Scripted::new(vec![
        calls(vec![tool_use("a", "coffer__search_knowledge", json!({"query": "rotate"}))]),
        Ok(Response {
            content: vec![
                Block::Text("Every 90 days [1].".into()),
                tool_use("b", "coffer__recall", json!({"query": "k"})),
            ],
            stop: StopReason::ToolUse,
            usage: usage(1, 1),
        }),
    ]);
    let out = run(&model, &FakeTools::new(), &params(2)).await.unwrap();
    assert_eq!((out.stop_reason, out.answer.as_str()), ("max_iterations", "Every 90 days [1]."));
    assert_eq!(out.citations[0].path, "ops/keys.md");
}

#[tokio::test]
async fn an_oversized_tool_result_is_cut_for_the_model_with_a_marker() {
    let model = Scripted::new(vec![
        calls(vec![tool_use("a", "coffer__search_knowledge", json!({"query": "q"}))]),
        answer("Done."),
    ]);
    let mut tools = FakeTools::new();
    tools.big = Some(2 * 1024 * 1024);
    let mut p = params(4);
    p.context_tokens = 8_000;
    let out = run(&model, &tools, &p).await.unwrap();
    assert_eq!(out.stop_reason, "end_turn");
    let (content, is_error) = results_of(&model.requests()[1]).remove(0);
    assert!(!is_error);
    assert!(content.len() < 8_000 * 4 / 4 + 200, "cut to its share of the budget: {} bytes", content.len());
    let cut = 2 * 1024 * 1024 - 8_000;
    assert!(content.ends_with(&format!("[… {cut} more bytes of this tool result were cut to fit the context budget; search more narrowly for the rest]")), "{}", &content[content.len() - 200..]);
}

#[tokio::test]
async fn old_steps_are_dropped_with_a_marker_when_the_history_outgrows_the_budget() {
    let mut script: Vec<_> = (0..6)
        .map(|i| calls(vec![tool_use(&format!("t{i}"), "coffer__search_knowledge", json!({"query": "q"}))]))
        .collect();
    script.push(answer("Nothing."));
    let model = Scripted::new(script);
    let mut tools = FakeTools::new();
    tools.big = Some(5_000);
    let mut p = params(10);
    p.context_tokens = 2_000; // 8,000 characters: each result is cut to 2,000, a few steps fit
    let out = run(&model, &tools, &p).await.unwrap();
    assert_eq!(out.stop_reason, "end_turn");
    let reqs = model.requests();
    let last = reqs.last().unwrap();
    let Block::Text(q) = &last.messages[0].content[0] else { panic!("the question comes first") };
    assert!(q.starts_with("what do my notes say"), "{q}");
    assert!(q.contains("earlier steps were dropped to stay within the context budget"), "{q}");
    assert!(last.messages.len() < 13, "older steps are gone: {} messages", last.messages.len());
    assert_eq!(last.messages.len() % 2, 1, "question, then whole steps (a call and its results)");
    let total: usize = last.messages.iter().map(message_chars).sum();
    assert!(total <= 8_000, "{total} characters");
}

#[tokio::test]
async fn a_budget_too_small_for_one_step_ends_with_context_budget() {
    let model = Scripted::new(vec![calls(vec![
        tool_use("a", "coffer__search_knowledge", json!({"query": "q"})),
        tool_use("b", "coffer__search_knowledge", json!({"query": "q"})),
        tool_use("c", "coffer__search_knowledge", json!({"query": "q"})),
        tool_use("d", "coffer__search_knowledge", json!({"query": "q"})),
        tool_use("e", "coffer__search_knowledge", json!({"query": "q"})),
        tool_use("f", "coffer__search_knowledge", json!({"query": "q"})),
    ])]);
    let mut tools = FakeTools::new();
    tools.big = Some(100_000);
    let mut p = params(5);
    p.context_tokens = 1_000; // each result keeps its 1,000-character floor: six exceed 4,000
    let out = run(&model, &tools, &p).await.unwrap();
    assert_eq!(out.stop_reason, "context_budget");
    assert_eq!(out.iterations, 1);
    assert!(out.answer.contains("context budget"), "{}", out.answer);
}

#[tokio::test]
async fn a_kb_restriction_is_forced_on_every_search() {
    let model = Scripted::new(vec![
        calls(vec![tool_use("a", "coffer__search_knowledge", json!({"query": "rotate", "kb": ["other"]}))]),
        answer("ok"),
    ]);
    let tools = FakeTools::new();
    let mut p = params(3);
    p.kb = Some("notes".into());
    run(&model, &tools, &p).await.unwrap();
    assert_eq!(tools.calls()[0].1["kb"], json!(["notes"]));
    assert!(model.requests()[0].system.as_deref().unwrap().contains("\"notes\""));
}

#[tokio::test]
async fn a_provider_failure_ends_the_run_with_its_error_and_max_tokens_is_a_stop_reason() {
    let e = LlmError {
        kind: ErrorKind::RateLimited,
        message: "anthropic at http://127.0.0.1:9 is rate limited (429)".into(),
        http_status: Some(429),
        retry_after: Some(std::time::Duration::from_secs(7)),
    };
    let model = Scripted::new(vec![calls(vec![tool_use("a", "coffer__recall", json!({"query": "x"}))]), Err(e)]);
    match run(&model, &FakeTools::new(), &params(5)).await {
        Err(AgentError::Provider(e)) => assert_eq!(e.http_status, Some(429)),
        other => panic!("{other:?}"),
    }
    let model = Scripted::new(vec![Ok(Response {
        content: vec![Block::Text("Partial".into())],
        stop: StopReason::MaxTokens,
        usage: usage(1, 4096),
    })]);
    let out = run(&model, &FakeTools::new(), &params(5)).await.unwrap();
    assert_eq!((out.stop_reason, out.answer.as_str()), ("max_tokens", "Partial"));
}

#[tokio::test]
async fn a_broker_that_cannot_list_fails_the_run() {
    struct Down;
    impl Tools for Down {
        fn list(&self) -> BoxFuture<'_, Result<Vec<ListedTool>, String>> {
            Box::pin(async { Err("the gateway did not answer within 120 s".to_owned()) })
        }
        fn call<'a>(&'a self, _: &'a str, _: &'a Value) -> BoxFuture<'a, Result<Value, String>> {
            unreachable!()
        }
    }
    let model = Scripted::new(vec![]);
    let e = run(&model, &Down, &params(5)).await.unwrap_err();
    assert_eq!(e.to_string(), "the gateway's tool broker: the gateway did not answer within 120 s");
}

#[test]
fn cut_result_keeps_short_text_and_cuts_on_a_character_boundary() {
    assert_eq!(cut_result("short", 10), "short");
    let s = "é".repeat(10); // 20 bytes
    let cut = cut_result(&s, 5);
    assert!(cut.starts_with("éé\n[… 16 more bytes"), "{cut}");
}
