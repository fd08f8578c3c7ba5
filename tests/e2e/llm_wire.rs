//! The provider clients of `coffer-llm` against the fake providers of
//! `coffer_tests::fake_llm` over real HTTP on loopback. For each wire: streamed text with usage,
//! a scripted multi-step tool-use exchange, a rule-driven model that reads a tool's result,
//! every provider fault (401 with the key in the provider's message, 404, 429 with
//! `retry-after` in seconds and as an HTTP date, 500, garbage, a stream cut mid-way, a stall, an
//! error event mid-stream, a hang past the request timeout) — each its `ErrorKind` and a
//! message naming the provider and the cause, never the key — `models` (sorted, deduplicated;
//! 404 → NotFound; a base URL ending in `/v1`) and `test`. Once: a base URL that refuses
//! connections, a TLS handshake with a server that speaks plain HTTP, and the Anthropic client
//! against the fake that drives the real Claude Code CLI.
use std::time::Duration;

use coffer_llm::{
    Block, Client, Endpoint, ErrorKind, LlmError, Message, Request, Role, StopReason, StreamEvent, ToolSpec, Usage,
    Wire,
};
use coffer_tests::anthropic::FakeAnthropic;
use coffer_tests::fake_llm::{Call, FakeLlm, Fault, INPUT_TOKENS, OUTPUT_TOKENS, Reply};
use futures_util::StreamExt;
use secrecy::SecretString;
use serde_json::json;

const KEY: &str = "sk-fake-secret-4242";
const WIRES: [Wire; 4] = [Wire::Anthropic, Wire::OpenAiResponses, Wire::OpenAiChat, Wire::Ollama];

fn endpoint(wire: Wire, base: &str, key: Option<&str>) -> Endpoint {
    Endpoint {
        wire,
        base_url: url::Url::parse(base).unwrap_or_else(|e| panic!("{base}: {e}")),
        secret: key.map(|k| SecretString::from(k.to_owned())),
        request_timeout: Duration::from_secs(10),
        stall_timeout: Duration::from_secs(5),
    }
}

async fn fake(wire: Wire) -> (FakeLlm, Client) {
    let fake = FakeLlm::start(wire).await.unwrap_or_else(|e| panic!("{e}"));
    fake.require_key(KEY);
    let client = Client::new(endpoint(wire, &fake.url, Some(KEY)));
    (fake, client)
}

fn tools() -> Vec<ToolSpec> {
    ["search", "read"]
        .iter()
        .map(|n| ToolSpec {
            name: (*n).to_owned(),
            description: format!("The {n} tool."),
            input_schema: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        })
        .collect()
}

fn ask(text: &str) -> Request {
    Request {
        model: "fake-model".into(),
        system: Some("You answer from the notes.".into()),
        messages: vec![Message { role: Role::User, content: vec![Block::Text(text.into())] }],
        tools: tools(),
        max_tokens: 256,
    }
}

const USAGE: Usage = Usage { input_tokens: INPUT_TOKENS, output_tokens: OUTPUT_TOKENS };

/// Every wire's events for a streamed text: several deltas, then `Done` with the usage.
#[tokio::test]
async fn streamed_text_and_usage_on_every_wire() {
    for wire in WIRES {
        let (fake, client) = fake(wire).await;
        fake.push(Reply::text("Notes say the sky is green."));
        let mut stream = client.stream(&ask("what do my notes say?")).await.unwrap_or_else(|e| panic!("{wire:?}: {e}"));
        let mut events = Vec::new();
        while let Some(e) = stream.next().await {
            events.push(e.unwrap_or_else(|e| panic!("{wire:?}: {e}")));
        }
        let deltas: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::TextDelta(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert!(deltas.len() >= 5, "{wire:?}: {events:?}");
        assert_eq!(deltas.concat(), "Notes say the sky is green.", "{wire:?}");
        assert_eq!(events.last(), Some(&StreamEvent::Done { stop: StopReason::EndTurn, usage: USAGE }), "{wire:?}");

        let reqs = fake.model_requests();
        assert_eq!(reqs.len(), 1, "{wire:?}");
        let r = &reqs[0];
        assert!(r.carried_key(KEY), "{wire:?}: {:?}", r.key);
        assert_eq!(r.key.as_ref().map(|k| k.matches), Some(Some(true)));
        assert!(r.headers.iter().all(|(_, v)| !v.contains(KEY)), "{wire:?}: a header holds the key");
        let seen = r.seen.as_ref().unwrap_or_else(|| panic!("{wire:?}: not a model request"));
        assert_eq!((seen.model.as_str(), seen.stream), ("fake-model", true), "{wire:?}");
        assert_eq!(seen.system.as_deref(), Some("You answer from the notes."), "{wire:?}");
        assert_eq!(seen.last_user_text(), "what do my notes say?", "{wire:?}");
        assert_eq!(seen.tools, vec!["search", "read"], "{wire:?}");
        if wire == Wire::Anthropic {
            assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
            assert_eq!(r.key.as_ref().map(|k| k.header.as_str()), Some("x-api-key"));
        } else {
            assert_eq!(r.key.as_ref().map(|k| k.header.as_str()), Some("authorization"), "{wire:?}");
        }

        // A model cut by its token limit.
        fake.push(Reply::MaxTokens("Half an".into()));
        let r = client.complete(&ask("more")).await.unwrap_or_else(|e| panic!("{wire:?}: {e}"));
        assert_eq!((r.stop, r.content), (StopReason::MaxTokens, vec![Block::Text("Half an".into())]), "{wire:?}");
    }
}

/// The assistant message of an answer and the results of its calls (`result` of each call).
fn turn(r: &coffer_llm::Response, result: impl Fn(&str, &serde_json::Value) -> String) -> [Message; 2] {
    let results = r
        .content
        .iter()
        .filter_map(|b| match b {
            Block::ToolUse { id, name, input } => Some(Block::ToolResult {
                id: id.clone(),
                content: result(name, input),
                is_error: name == "read" && input["q"] == "missing",
            }),
            _ => None,
        })
        .collect();
    [Message { role: Role::Assistant, content: r.content.clone() }, Message { role: Role::User, content: results }]
}

/// A scripted exchange on every wire: the model searches (with text first), gets the result,
/// reads two documents at once (one read fails), then answers; each request carries the
/// results of the calls before it.
#[tokio::test]
async fn multi_step_tool_use_on_every_wire() {
    for wire in WIRES {
        let (fake, client) = fake(wire).await;
        fake.script([
            Reply::Tools { text: Some("Let me look.".into()), calls: vec![Call::new("search", json!({"q": "sky"}))] },
            Reply::tools(vec![Call::new("read", json!({"q": "a.md"})), Call::new("read", json!({"q": "missing"}))]),
            Reply::text("The sky is green (a.md)."),
        ]);
        let mut request = ask("what colour is the sky?");
        let result =
            |name: &str, input: &serde_json::Value| format!("{name} result for {}", input["q"].as_str().unwrap_or("?"));

        let r1 = client.complete(&request).await.unwrap_or_else(|e| panic!("{wire:?}: {e}"));
        assert_eq!(r1.stop, StopReason::ToolUse, "{wire:?}");
        assert_eq!(r1.usage, USAGE, "{wire:?}");
        assert_eq!(r1.content.len(), 2, "{wire:?}: {:?}", r1.content);
        assert_eq!(r1.content[0], Block::Text("Let me look.".into()), "{wire:?}");
        let Block::ToolUse { id: first_id, name, input } = &r1.content[1] else { panic!("{wire:?}: {:?}", r1.content) };
        assert_eq!((name.as_str(), input), ("search", &json!({"q": "sky"})), "{wire:?}");
        request.messages.extend(turn(&r1, result));

        let r2 = client.complete(&request).await.unwrap_or_else(|e| panic!("{wire:?}: {e}"));
        assert_eq!(r2.stop, StopReason::ToolUse, "{wire:?}");
        let calls: Vec<(&str, &serde_json::Value)> = r2
            .content
            .iter()
            .filter_map(|b| match b {
                Block::ToolUse { name, input, .. } => Some((name.as_str(), input)),
                _ => None,
            })
            .collect();
        assert_eq!(calls, vec![("read", &json!({"q": "a.md"})), ("read", &json!({"q": "missing"}))], "{wire:?}");
        let ids: Vec<&str> = r2
            .content
            .iter()
            .filter_map(|b| match b {
                Block::ToolUse { id, .. } => Some(id.as_str()),
                _ => None,
            })
            .collect();
        assert!(ids[0] != ids[1] && !ids.contains(&first_id.as_str()), "{wire:?}: ids repeat: {ids:?} {first_id}");
        request.messages.extend(turn(&r2, result));

        let r3 = client.complete(&request).await.unwrap_or_else(|e| panic!("{wire:?}: {e}"));
        assert_eq!((r3.stop, r3.content), (StopReason::EndTurn, vec![Block::Text("The sky is green (a.md).".into())]));

        let seen: Vec<_> = fake.model_requests().into_iter().filter_map(|r| r.seen).collect();
        assert_eq!(seen.len(), 3, "{wire:?}");
        let results: Vec<_> = seen[1].new_tool_results().into_iter().map(|r| r.content.clone()).collect();
        assert_eq!(results, vec!["search result for sky"], "{wire:?}");
        let results: Vec<_> = seen[2].new_tool_results().into_iter().map(|r| r.content.clone()).collect();
        let failed =
            if wire == Wire::Anthropic { "read result for missing" } else { "[tool error] read result for missing" };
        assert_eq!(results, vec!["read result for a.md", failed], "{wire:?}");
        if wire == Wire::Anthropic {
            assert!(seen[2].new_tool_results()[1].is_error);
        }
        // The earlier calls went back with the conversation (Ollama matches results by name).
        assert_eq!(seen[2].tool_calls().len(), 3, "{wire:?}");
        let want_id = if wire == Wire::Ollama { "search" } else { first_id.as_str() };
        assert_eq!(seen[1].new_tool_results()[0].id, want_id, "{wire:?}");
        assert_eq!(fake.queued(), 0);
    }
}

/// A rule plays a model that searches, reads the tool's result and cites it.
#[tokio::test]
async fn a_rule_reads_the_tool_result_on_every_wire() {
    for wire in WIRES {
        let (fake, client) = fake(wire).await;
        fake.set_rule(|seen| match seen.new_tool_results().first() {
            None if seen.offers("search") => Reply::tool("search", json!({"q": seen.last_user_text()})),
            None => Reply::text("I have no search tool."),
            Some(r) => Reply::Text(format!("Found: {}", r.content)),
        });
        let mut request = ask("sky colour");
        let r = client.complete(&request).await.unwrap_or_else(|e| panic!("{wire:?}: {e}"));
        let Some(Block::ToolUse { input, .. }) = r.content.first() else { panic!("{wire:?}: {:?}", r.content) };
        assert_eq!(input, &json!({"q": "sky colour"}));
        request.messages.extend(turn(&r, |_, _| "notes/sky.md: green".to_owned()));
        let r = client.complete(&request).await.unwrap_or_else(|e| panic!("{wire:?}: {e}"));
        assert_eq!(r.content, vec![Block::Text("Found: notes/sky.md: green".into())], "{wire:?}");
        request.tools.clear();
        request.messages.truncate(1);
        let r = client.complete(&request).await.unwrap_or_else(|e| panic!("{wire:?}: {e}"));
        assert_eq!(r.content, vec![Block::Text("I have no search tool.".into())], "{wire:?}");
    }
}

fn check(wire: Wire, client: &Client, e: &LlmError, kind: ErrorKind, words: &str) {
    assert_eq!(e.kind, kind, "{wire:?}: {e}");
    assert!(e.message.starts_with(client.provider()), "{wire:?}: {e}");
    assert!(e.message.contains(words), "{wire:?}: {e} (wanted {words:?})");
    assert!(!e.message.contains(KEY), "{wire:?}: the key leaked: {e}");
    assert!(!format!("{e:?}").contains(KEY), "{wire:?}: the key leaked in Debug");
}

async fn fails(client: &Client) -> LlmError {
    client.complete(&ask("hello")).await.err().unwrap_or_else(|| panic!("{}: no error", client.provider()))
}

/// Every provider fault, on every wire, is its kind with a message naming provider and cause.
#[tokio::test]
async fn provider_faults_on_every_wire() {
    for wire in WIRES {
        let (fake, client) = fake(wire).await;
        // 401, with the key quoted back in the provider's message.
        fake.push(Reply::Fault(Fault::Status {
            status: 401,
            retry_after: None,
            message: Some(format!("Incorrect API key provided: {KEY}")),
        }));
        let e = fails(&client).await;
        check(wire, &client, &e, ErrorKind::Auth, "refused the key (401");
        assert!(e.message.contains("[redacted]"), "{wire:?}: {e}");
        assert_eq!(e.http_status, Some(401));
        // The fake's own key check: a wrong key.
        let wrong = Client::new(endpoint(wire, &fake.url, Some("sk-wrong")));
        assert_eq!(fails(&wrong).await.kind, ErrorKind::Auth);
        let none = Client::new(endpoint(wire, &fake.url, None));
        let e = fails(&none).await;
        assert!(e.message.contains("wants a key and the connection has none"), "{wire:?}: {e}");

        fake.push(Reply::status(404));
        let e = fails(&client).await;
        check(wire, &client, &e, ErrorKind::NotFound, "no such model or endpoint (404");
        if matches!(wire, Wire::OpenAiChat | Wire::OpenAiResponses) {
            assert!(e.message.contains("(404 model_not_found: fake error 404)"), "{wire:?}: {e}");
        }

        fake.push(Reply::rate_limited("7"));
        let e = fails(&client).await;
        check(wire, &client, &e, ErrorKind::RateLimited, "rate limiting requests (429");
        assert_eq!(e.retry_after, Some(Duration::from_secs(7)), "{wire:?}");
        assert!(e.message.contains("retry after 7 s"), "{wire:?}: {e}");
        let at = std::time::SystemTime::now() + Duration::from_secs(120);
        fake.push(Reply::rate_limited(&httpdate::fmt_http_date(at)));
        let e = fails(&client).await;
        let wait = e.retry_after.unwrap_or_else(|| panic!("{wire:?}: no retry_after: {e}"));
        assert!(wait > Duration::from_secs(100) && wait <= Duration::from_secs(120), "{wire:?}: {wait:?}");

        fake.push(Reply::status(500));
        let e = fails(&client).await;
        check(wire, &client, &e, ErrorKind::Server, "failed on its side (HTTP 500");
        // A huge error body is read bounded and quoted short.
        fake.push(Reply::Fault(Fault::Status {
            status: 503,
            retry_after: None,
            message: Some("overloaded ".repeat(100_000)),
        }));
        let e = fails(&client).await;
        check(wire, &client, &e, ErrorKind::Server, "failed on its side (HTTP 503");
        assert!(e.message.len() < 600, "{wire:?}: {} bytes", e.message.len());
        fake.push(Reply::status(400));
        check(wire, &client, &fails(&client).await, ErrorKind::BadResponse, "rejected the request (HTTP 400");

        fake.push(Reply::fault(Fault::Garbage));
        let e = fails(&client).await;
        check(wire, &client, &e, ErrorKind::BadResponse, &format!("is not the {} wire", wire.as_str()));

        fake.push(Reply::fault(Fault::Cut));
        let e = fails(&client).await;
        check(wire, &client, &e, ErrorKind::BadResponse, "cut the answer short");

        fake.push(Reply::fault(Fault::StreamError));
        let e = fails(&client).await;
        check(wire, &client, &e, ErrorKind::Server, "reported an error mid-answer");

        // The stream's text before the cut still arrived, in order, before the error.
        fake.push(Reply::fault(Fault::Cut));
        let mut stream = client.stream(&ask("hello")).await.unwrap_or_else(|e| panic!("{wire:?}: {e}"));
        let mut items = Vec::new();
        while let Some(i) = stream.next().await {
            items.push(i);
        }
        assert!(matches!(items.first(), Some(Ok(StreamEvent::TextDelta(_)))), "{wire:?}: {items:?}");
        assert!(matches!(items.last(), Some(Err(e)) if e.kind == ErrorKind::BadResponse), "{wire:?}: {items:?}");

        // A stall: the stream starts, then goes silent.
        let mut ep = endpoint(wire, &fake.url, Some(KEY));
        ep.stall_timeout = Duration::from_millis(300);
        let stalling = Client::new(ep);
        fake.push(Reply::fault(Fault::Stall));
        let started = std::time::Instant::now();
        let e = fails(&stalling).await;
        check(wire, &stalling, &e, ErrorKind::Timeout, "stream stalled");
        assert!(started.elapsed() < Duration::from_secs(5), "{wire:?}: {:?}", started.elapsed());

        // A hang: not even headers, past the request timeout.
        let mut ep = endpoint(wire, &fake.url, Some(KEY));
        ep.request_timeout = Duration::from_millis(400);
        let hanging = Client::new(ep);
        fake.push(Reply::fault(Fault::Hang));
        let e = fails(&hanging).await;
        check(wire, &hanging, &e, ErrorKind::Timeout, "did not answer within 400 ms");
        assert_eq!(fake.queued(), 0, "{wire:?}");
    }
}

/// `models` sorted and deduplicated, with or without `/v1` in the base URL; 404 → NotFound;
/// `test` sends one minimal request.
#[tokio::test]
async fn models_and_test_on_every_wire() {
    for wire in WIRES {
        let (fake, client) = fake(wire).await;
        fake.set_models(Some(vec!["zeta".into(), "alpha".into(), "zeta".into(), "mid".into()]));
        assert_eq!(client.models().await.unwrap_or_else(|e| panic!("{wire:?}: {e}")), ["alpha", "mid", "zeta"]);
        let v1 = Client::new(endpoint(wire, &fake.url_v1(), Some(KEY)));
        assert_eq!(v1.models().await.unwrap_or_else(|e| panic!("{wire:?}: {e}")), ["alpha", "mid", "zeta"]);
        let v1_slash = Client::new(endpoint(wire, &format!("{}/", fake.url_v1()), Some(KEY)));
        assert_eq!(v1_slash.models().await.unwrap_or_else(|e| panic!("{wire:?}: {e}")).len(), 3);
        let listing = fake.requests().into_iter().find(|r| r.method == "GET").unwrap_or_else(|| panic!("no GET"));
        let path = if wire == Wire::Ollama { "/api/tags" } else { "/v1/models" };
        assert!(listing.path.starts_with(path), "{wire:?}: {}", listing.path);
        assert!(listing.carried_key(KEY));

        fake.set_models(None);
        let e = client.models().await.err().unwrap_or_else(|| panic!("{wire:?}: listed"));
        check(wire, &client, &e, ErrorKind::NotFound, "no model listing (404");

        let took = client.test("fake-model").await.unwrap_or_else(|e| panic!("{wire:?}: {e}"));
        assert!(took < Duration::from_secs(10));
        let seen = fake.model_requests().pop().and_then(|r| r.seen).unwrap_or_else(|| panic!("{wire:?}: no request"));
        let min = if wire == Wire::OpenAiResponses { 16 } else { 1 };
        assert_eq!((seen.max_tokens, seen.model.as_str()), (Some(min), "fake-model"), "{wire:?}");
        assert_eq!(seen.last_user_text(), coffer_llm::TEST_PROMPT);
        assert!(seen.tools.is_empty());
        fake.push(Reply::status(404));
        let e = client.test("no-such-model").await.err().unwrap_or_else(|| panic!("{wire:?}: passed"));
        assert_eq!(e.kind, ErrorKind::NotFound, "{wire:?}: {e}");
    }
}

/// The fakes also answer non-streamed requests in each wire's JSON shape (real clients, such
/// as the agent CLIs, send some).
#[tokio::test]
async fn the_fakes_answer_unstreamed_requests() {
    coffer_runtime::tls::ensure_provider();
    for wire in WIRES {
        let fake = FakeLlm::start(wire).await.unwrap_or_else(|e| panic!("{e}"));
        fake.push(Reply::tool("search", json!({"q": "x"})));
        let (path, body) = match wire {
            Wire::Anthropic => (
                "/v1/messages",
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
            ),
            Wire::OpenAiResponses => ("/v1/responses", json!({"model": "m", "input": "hi"})),
            Wire::OpenAiChat => {
                ("/v1/chat/completions", json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
            }
            Wire::Ollama => {
                ("/api/chat", json!({"model": "m", "stream": false, "messages": [{"role": "user", "content": "hi"}]}))
            }
        };
        let r = reqwest::Client::new()
            .post(format!("{}{path}", fake.url))
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{wire:?}: {e}"));
        assert_eq!(r.status(), 200, "{wire:?}");
        let v: serde_json::Value = r.json().await.unwrap_or_else(|e| panic!("{wire:?}: {e}"));
        let name = match wire {
            Wire::Anthropic => &v["content"][0]["name"],
            Wire::OpenAiResponses => &v["output"][0]["name"],
            Wire::OpenAiChat => &v["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
            Wire::Ollama => &v["message"]["tool_calls"][0]["function"]["name"],
        };
        assert_eq!(name, "search", "{wire:?}: {v}");
        let r =
            reqwest::Client::new().get(format!("{}/nowhere", fake.url)).send().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.status(), 404);
    }
}

/// A base URL nothing listens on is Unreachable; a TLS handshake with a plain HTTP server is
/// Tls; a key that cannot be a header value is Auth — each naming the provider.
#[tokio::test]
async fn unreachable_tls_and_a_bad_key() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        l.local_addr().unwrap_or_else(|e| panic!("{e}")).port()
    };
    for wire in WIRES {
        let client = Client::new(endpoint(wire, &format!("http://127.0.0.1:{port}"), Some(KEY)));
        let e = fails(&client).await;
        check(wire, &client, &e, ErrorKind::Unreachable, "is unreachable");
        assert!(e.message.to_lowercase().contains("refused"), "{e}");
        assert_eq!(client.models().await.err().map(|e| e.kind), Some(ErrorKind::Unreachable));
    }
    let fake = FakeLlm::start(Wire::Anthropic).await.unwrap_or_else(|e| panic!("{e}"));
    let tls = Client::new(endpoint(Wire::Anthropic, &fake.url.replace("http://", "https://"), Some(KEY)));
    let e = fails(&tls).await;
    check(Wire::Anthropic, &tls, &e, ErrorKind::Tls, "TLS handshake");
    let bad = Client::new(endpoint(Wire::OpenAiChat, &fake.url, Some("sk-with\nnewline")));
    let e = fails(&bad).await;
    assert_eq!(e.kind, ErrorKind::Auth, "{e}");
    assert!(e.message.contains("not a valid HTTP header value") && !e.message.contains("newline"), "{e}");
}

/// The Anthropic client also speaks to the fake that drives the real Claude Code CLI.
#[tokio::test]
async fn anthropic_against_the_cli_fake() {
    let fake = FakeAnthropic::scripted().await.unwrap_or_else(|e| panic!("{e}"));
    let client = Client::new(endpoint(Wire::Anthropic, &fake.url, Some("sk-test")));
    let r = client.complete(&ask("SAY[hello there world]")).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.content, vec![Block::Text("hello there world".into())]);
    assert_eq!(r.stop, StopReason::EndTurn);
    let r = client.complete(&ask(r#"TOOL[search {"q": "hi"}]"#)).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.stop, StopReason::ToolUse);
    assert!(matches!(&r.content[0], Block::ToolUse { name, input, .. } if name == "search" && input["q"] == "hi"));
    let e = client.complete(&ask("ERROR[401]")).await.err().unwrap_or_else(|| panic!("no error"));
    assert_eq!(e.kind, ErrorKind::Auth, "{e}");
    let e = client.complete(&ask("MALFORMED")).await.err().unwrap_or_else(|| panic!("no error"));
    assert_eq!(e.kind, ErrorKind::BadResponse, "{e}");
}

/// One client serves many requests at once; each answer is its own, and a paced stream arrives
/// as it is produced.
#[tokio::test]
async fn concurrent_requests_on_one_client() {
    for wire in WIRES {
        let (fake, client) = fake(wire).await;
        fake.set_rule(|seen| Reply::Text(format!("echo {}", seen.last_user_text())));
        fake.set_pace(Some(Duration::from_millis(5)));
        let asks: Vec<_> = (0..8).map(|i| ask(&format!("question{i}"))).collect();
        let answers = futures_util::future::join_all(asks.iter().map(|r| client.complete(r))).await;
        for (i, a) in answers.into_iter().enumerate() {
            let a = a.unwrap_or_else(|e| panic!("{wire:?}: {e}"));
            assert_eq!(a.content, vec![Block::Text(format!("echo question{i}"))], "{wire:?}");
        }
        assert_eq!(fake.model_requests().len(), 8);
    }
}

/// The real Claude Code CLI on the fake Anthropic provider (its documented wire is what both
/// follow): a rule plays a model that has Claude Code read a note with its `Read` tool, then
/// quotes it; the fake saw the bound model name and Claude Code's key.
#[tokio::test]
async fn real_claude_code_runs_a_tool_exchange_on_the_fake() -> anyhow::Result<()> {
    let home = coffer_tests::TestHome::new()?;
    let fake = FakeLlm::start(Wire::Anthropic).await?;
    std::fs::create_dir_all(home.root())?;
    let note = home.root().join("note.txt");
    std::fs::write(&note, "kumquat 42\n")?;
    let path = note.display().to_string();
    fake.set_rule(move |seen| match seen.new_tool_results().first() {
        Some(r) => Reply::Text(format!("The note says: {}", r.content.trim())),
        None if seen.offers("Read") && seen.last_user_text().contains("note") => {
            Reply::tool("Read", json!({"file_path": path}))
        }
        None => Reply::text("pong"),
    });
    let claude = coffer_tests::peers::ClaudeCode::new(&home, &fake.url)?;
    let prompt = format!("Read the note at {} and tell me what it says.", note.display());
    let args = ["-p", prompt.as_str(), "--allowedTools", "Read", "--model", "fake-bound-model"];
    let out = claude.run(&home, &args, Duration::from_secs(120)).await?;
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.stdout.contains("The note says:") && out.stdout.contains("kumquat 42"), "{out}");
    let turns: Vec<_> =
        fake.model_requests().into_iter().filter(|r| r.seen.as_ref().is_some_and(|s| s.offers("Read"))).collect();
    assert!(turns.len() >= 2, "{} turns", turns.len());
    for t in &turns {
        assert_eq!(t.seen.as_ref().map(|s| s.model.as_str()), Some("fake-bound-model"));
        assert!(t.carried_key("sk-ant-test-not-a-real-key"), "{:?}", t.key);
        assert_eq!(t.key.as_ref().map(|k| k.header.as_str()), Some("x-api-key"));
    }
    Ok(())
}

/// The real Codex CLI (`codex exec`) on the fake OpenAI Responses provider: it streams the
/// fake's answer, with the configured model and key.
#[tokio::test]
async fn real_codex_answers_from_the_fake_responses_provider() -> anyhow::Result<()> {
    let home = coffer_tests::TestHome::new()?;
    let fake = FakeLlm::start(Wire::OpenAiResponses).await?;
    fake.set_rule(|_| Reply::text("pong from the fake responses wire"));
    let codex_home = home.root().join("codex-home");
    std::fs::create_dir_all(&codex_home)?;
    let config = format!(
        r#"model = "fake-codex-model"
model_provider = "fake"
check_for_update_on_startup = false

[model_providers.fake]
name = "Fake"
base_url = "{}"
wire_api = "responses"
env_key = "FAKE_LLM_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false
"#,
        fake.url_v1()
    );
    std::fs::write(codex_home.join("config.toml"), config)?;
    let codex_home = codex_home.display().to_string();
    let args = ["exec", "--skip-git-repo-check", "Say pong."];
    let env = [("CODEX_HOME", codex_home.as_str()), ("FAKE_LLM_KEY", KEY)];
    let out = coffer_tests::peers::run_codex(&home, &args, &env, Duration::from_secs(120)).await?;
    assert_eq!(out.code, Some(0), "codex exec failed: {out}");
    assert!(out.stdout.contains("pong from the fake responses wire"), "{out}");
    let reqs = fake.model_requests();
    assert!(!reqs.is_empty());
    for r in &reqs {
        assert_eq!(r.seen.as_ref().map(|s| (s.model.as_str(), s.stream)), Some(("fake-codex-model", true)));
        assert!(r.carried_key(KEY), "{:?}", r.key);
    }
    Ok(())
}

/// An event (SSE) or line (NDJSON) over the clients' 16 MiB bound is refused, naming the bound.
#[tokio::test]
async fn an_oversized_event_is_refused() {
    for wire in [Wire::Anthropic, Wire::Ollama] {
        let (fake, client) = fake(wire).await;
        fake.push(Reply::fault(Fault::Oversized));
        let e = fails(&client).await;
        check(wire, &client, &e, ErrorKind::BadResponse, "larger than 16 MiB");
    }
}
