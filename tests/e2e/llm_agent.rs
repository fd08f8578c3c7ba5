//! The internal agent behind `coffer__ask`, end to end: a real daemon, the person's notes in a
//! knowledge base, a fake provider (`coffer_tests::fake_llm`, real HTTP on loopback) as the
//! internal-default LLM connection, and a real MCP client (the Python SDK) through the shim.
//! Issue 17's done-when (an answer citing the right note, its tool calls in the invocation log
//! with actor `agent`, the run's usage on the `coffer__ask` row and in `coffer invocations`),
//! scripted multi-step tool use on every wire, and the faults that concern the agent.
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_llm::Wire;
use coffer_tests::fake_llm::{Call, FakeLlm, Fault, INPUT_TOKENS, OUTPUT_TOKENS, Reply, Seen};
use coffer_tests::http::Api;
use coffer_tests::mcp::set_tool_enabled;
use coffer_tests::peers::{PyClient, texts};
use coffer_tests::{SendExt, TestHome, wait_for, write_file as write};
use reqwest::Method;
use serde_json::{Value, json};

/// How long indexing a small folder may take on a loaded machine.
const INDEXED: Duration = Duration::from_secs(60);

/// The person's notes: the answer is in `recipes/bread.md`, under `Sourdough > Feeding`.
fn notes(dir: &Path) -> anyhow::Result<()> {
    write(
        &dir.join("recipes/bread.md"),
        "# Sourdough\n\nA loaf a week.\n\n## Feeding\n\nFeed the starter twelve hours before baking, with equal weights of flour and water.\n\n## Baking\n\nBake at 250 degrees for forty minutes.\n",
    )?;
    write(&dir.join("projects/gateway.md"), "# Gateway\n\nEvery upstream is started lazily, per session.\n")?;
    write(&dir.join("garden.md"), "# Garden\n\nWater the tomatoes every morning in July.\n")?;
    Ok(())
}

/// A daemon with the notes indexed as KB `notes`.
async fn daemon_with_notes() -> anyhow::Result<(TestHome, Api, tempfile::TempDir)> {
    let home = TestHome::new()?;
    let outside = tempfile::tempdir()?;
    notes(outside.path())?;
    let api = home.start_daemon().await?;
    let folder = outside.path().to_str().context("utf-8 path")?;
    let added = home.cli(&["kb", "add", "notes", "--path", folder]).await?;
    ensure!(added.code == Some(0), "{added:?}");
    wait_for("the notes indexed", INDEXED, || async {
        let out = home.cli(&["kb", "status", "notes", "--json"]).await?;
        let v: Value = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
        Ok((v["progress"]["state"] == "idle" && v["documents"] == 3).then_some(()))
    })
    .await?;
    Ok((home, api, outside))
}

/// Adds connection `name` on `fake` (model `fake-model`), the internal default when `default`.
async fn add_connection(api: &Api, name: &str, fake: &FakeLlm, default: bool) -> anyhow::Result<()> {
    let body = json!({"name": name, "wire": fake.wire.as_str(), "base_url": fake.url, "model": "fake-model",
                      "internal_default": default});
    let r = api.post_json("/v1/llm/connections", &body).reply().await?;
    ensure!(r.status == 201, "POST /v1/llm/connections: {} {}", r.status, r.text);
    Ok(())
}

async fn set_settings(api: &Api, set: Value) -> anyhow::Result<()> {
    let r = api.request(reqwest::Method::PATCH, "/v1/settings").json(&json!({"set": set})).reply().await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    Ok(())
}

async fn invocations(api: &Api, query: &str) -> anyhow::Result<Vec<Value>> {
    let v = api.get(&format!("/v1/invocations?{query}")).reply().await?.ok_json()?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

/// The number a search result gave the passage of `path` (`[n] notes:path:…`), if any.
fn number_of(result: &str, path: &str) -> Option<String> {
    result.lines().find(|l| l.starts_with('[') && l.contains(path)).and_then(|l| Some(l[1..l.find(']')?].to_owned()))
}

/// A model that researches: it searches the notes, then recalls, then answers citing the
/// passage of `recipes/bread.md` by the number the search gave it.
fn researcher(seen: &Seen) -> Reply {
    let results = seen.tool_results();
    match results.len() {
        0 => Reply::Tools {
            text: Some("Let me look in your notes.".into()),
            calls: vec![Call::new("coffer__search_knowledge", json!({"query": "feed the sourdough starter"}))],
        },
        1 => Reply::tool("coffer__recall", json!({"query": "sourdough"})),
        _ => match results.iter().find_map(|r| number_of(&r.content, "recipes/bread.md")) {
            Some(n) => Reply::text(&format!("Your notes say to feed the starter twelve hours before baking [{n}].")),
            None => Reply::text("The notes do not say."),
        },
    }
}

/// `coffer__ask`'s `{"result": …}` (or `{"error": …}`) through `client`.
async fn ask(client: &mut PyClient, question: &str) -> anyhow::Result<Value> {
    let r = client.call("coffer__ask", json!({"question": question})).await?;
    r.get("result").cloned().with_context(|| format!("coffer__ask was not a tool result: {r}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_through_the_shim_cites_the_right_note_and_logs_its_calls_as_agent_with_usage() -> anyhow::Result<()> {
    let (home, api, _notes) = daemon_with_notes().await?;
    let fake = FakeLlm::start(Wire::Anthropic).await?;
    fake.set_rule(researcher);
    let mut client = PyClient::through_shim(&home, &[]).await?;
    ensure!(client.tools().await?.contains(&"coffer__ask".to_owned()));

    // No internal connection yet: a tool error that says how to configure one.
    let none = ask(&mut client, "what do my notes say about feeding the sourdough starter?").await?;
    ensure!(none["isError"] == true, "{none}");
    ensure!(texts(&none).contains("coffer llm add"), "{none}");

    add_connection(&api, "local", &fake, true).await?;
    let result = ask(&mut client, "what do my notes say about feeding the sourdough starter?").await?;
    ensure!(result["isError"] != true, "{result}\n{}", home.diagnostics());
    let s = &result["structuredContent"];
    assert_eq!(s["answer"], "Your notes say to feed the starter twelve hours before baking [1].", "{s}");
    assert_eq!(s["stop_reason"], "end_turn");
    let cites = s["citations"].as_array().context("citations")?;
    ensure!(cites.len() == 1, "{s}");
    let c = &cites[0];
    assert_eq!(
        (c["source"].as_str(), c["kb"].as_str(), c["path"].as_str()),
        (Some("knowledge"), Some("notes"), Some("recipes/bread.md"))
    );
    assert_eq!(c["heading"], "Sourdough > Feeding", "{c}");
    assert_eq!((c["line_start"].as_u64(), c["line_end"].as_u64()), (Some(5), Some(7)), "{c}");
    ensure!(c["snippet"].as_str().is_some_and(|t| t.contains("twelve hours")), "{c}");
    let text = texts(&result);
    ensure!(text.contains("[1] notes:recipes/bread.md:5-7 > Sourdough > Feeding"), "{text}");
    let usage = &s["usage"];
    assert_eq!(usage["connection"], "local");
    assert_eq!(usage["model"], "fake-model");
    assert_eq!((usage["iterations"].as_u64(), usage["tool_calls"].as_u64()), (Some(3), Some(2)), "{usage}");
    assert_eq!(usage["input_tokens"].as_u64(), Some(3 * INPUT_TOKENS));
    assert_eq!(usage["output_tokens"].as_u64(), Some(3 * OUTPUT_TOKENS));

    // The provider saw the connection's model, the retrieval tools and never coffer__ask.
    let reqs = fake.model_requests();
    ensure!(reqs.len() == 3, "{} model requests", reqs.len());
    let first = reqs[0].seen.clone().context("a model request")?;
    assert_eq!(first.model, "fake-model");
    let offered: Vec<&str> = first.tools.iter().map(String::as_str).collect();
    ensure!(offered.contains(&"coffer__search_knowledge") && offered.contains(&"coffer__recall"), "{offered:?}");
    ensure!(!offered.contains(&"coffer__ask") && !offered.contains(&"coffer__remember"), "{offered:?}");

    // The agent's calls are in the log with actor agent, in one broker session; the ask row
    // (the MCP client's) carries the run's usage.
    let agent = invocations(&api, "actor=agent").await?;
    let targets: Vec<&str> = agent.iter().filter_map(|i| i["target"].as_str()).collect();
    assert_eq!(targets, ["coffer__recall", "coffer__search_knowledge"], "newest first: {agent:?}");
    ensure!(agent.iter().all(|i| i["outcome"] == "ok" && i["usage"].is_null()), "{agent:?}");
    ensure!(agent[0]["session_id"] == agent[1]["session_id"], "one broker session per run: {agent:?}");
    let asks = invocations(&api, "target=coffer__ask").await?;
    ensure!(asks.len() == 2, "{asks:?}");
    assert_eq!(asks[0]["actor"], "mcp");
    assert_eq!(
        asks[0]["usage"],
        json!({"connection": "local", "model": "fake-model", "input_tokens": 3 * INPUT_TOKENS,
               "output_tokens": 3 * OUTPUT_TOKENS, "iterations": 3})
    );
    ensure!(asks[1]["usage"].is_null(), "the refused run used nothing: {asks:?}");
    let out = home.cli(&["invocations", "--tool", "coffer__ask"]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    let expected = format!("local/fake-model {}+{} tok, 3 req", 3 * INPUT_TOKENS, 3 * OUTPUT_TOKENS);
    ensure!(out.stdout.contains("USAGE") && out.stdout.contains(&expected), "{}", out.stdout);
    let out = home.cli(&["invocations", "--tool", "coffer__ask", "--json"]).await?;
    let v: Value = serde_json::from_str(&out.stdout)?;
    assert_eq!(v["items"][0]["usage"]["iterations"], 3);
    client.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_multi_step_tool_use_works_on_every_wire() -> anyhow::Result<()> {
    let (home, api, _notes) = daemon_with_notes().await?;
    let mut client = PyClient::through_shim(&home, &[]).await?;
    for (i, wire) in [Wire::Anthropic, Wire::OpenAiResponses, Wire::OpenAiChat, Wire::Ollama].into_iter().enumerate() {
        let fake = FakeLlm::start(wire).await?;
        // Two searches in one step, then a recall, then the answer.
        fake.script([
            Reply::tools(vec![
                Call::new("coffer__search_knowledge", json!({"query": "tomatoes"})),
                Call::new("coffer__search_knowledge", json!({"query": "sourdough starter"})),
            ]),
            Reply::tool("coffer__recall", json!({"query": "garden"})),
        ]);
        fake.set_rule(|seen: &Seen| {
            let results = seen.tool_results();
            let garden = results.iter().find_map(|r| number_of(&r.content, "garden.md"));
            let bread = results.iter().find_map(|r| number_of(&r.content, "recipes/bread.md"));
            match (garden, bread) {
                (Some(g), Some(b)) => {
                    Reply::text(&format!("Water the tomatoes in July [{g}]; feed the starter [{b}]."))
                }
                _ => Reply::text(&format!("missing passages in {results:?}")),
            }
        });
        let name = format!("w{i}");
        add_connection(&api, &name, &fake, true).await?;
        let result = ask(&mut client, "what do my notes say about the garden and the starter?").await?;
        ensure!(result["isError"] != true, "{}: {result}", wire.as_str());
        let s = &result["structuredContent"];
        assert_eq!(s["answer"], "Water the tomatoes in July [1]; feed the starter [2].", "{}: {s}", wire.as_str());
        let paths: Vec<&str> =
            s["citations"].as_array().context("citations")?.iter().filter_map(|c| c["path"].as_str()).collect();
        assert_eq!(paths, ["garden.md", "recipes/bread.md"], "{}", wire.as_str());
        assert_eq!(s["usage"]["iterations"], 3, "{}", wire.as_str());
        assert_eq!(s["usage"]["tool_calls"], 3, "{}", wire.as_str());
        assert_eq!(s["usage"]["connection"], name.as_str());
        ensure!(fake.model_requests().len() == 3, "{}: {} requests", wire.as_str(), fake.model_requests().len());
    }
    client.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_s_faults_are_tool_results_or_clear_errors_and_runs_go_on() -> anyhow::Result<()> {
    let (home, api, _notes) = daemon_with_notes().await?;
    let fake = FakeLlm::start(Wire::Anthropic).await?;
    add_connection(&api, "local", &fake, true).await?;
    let mut client = PyClient::through_shim(&home, &[]).await?;
    let q = "what do my notes say about the starter?";

    // A disabled tool and one that does not exist: errors back to the model, the run goes on.
    set_tool_enabled(&api, "coffer__recall", false).await?;
    fake.script([
        Reply::tools(vec![Call::new("coffer__recall", json!({"query": "x"})), Call::new("nope__missing", json!({}))]),
        Reply::text("Neither worked."),
    ]);
    let result = ask(&mut client, q).await?;
    ensure!(result["isError"] != true, "{result}");
    assert_eq!(result["structuredContent"]["answer"], "Neither worked.");
    let second = fake.model_requests()[1].seen.clone().context("a model request")?;
    let results = second.new_tool_results();
    ensure!(results.len() == 2 && results.iter().all(|r| r.is_error), "{results:?}");
    ensure!(results[0].content.contains("disabled by the person's Coffer policy"), "{results:?}");
    ensure!(results[1].content.contains("no tool named \"nope__missing\""), "{results:?}");
    let refused = invocations(&api, "actor=agent&outcome=disabled").await?;
    ensure!(
        refused.len() == 1 && refused[0]["target"] == "coffer__recall",
        "the broker refused it under policy: {refused:?}"
    );
    set_tool_enabled(&api, "coffer__recall", true).await?;

    // A loop that never ends stops cleanly at llm.ask_max_iterations.
    set_settings(&api, json!({"llm.ask_max_iterations": "2"})).await?;
    fake.set_rule(|_| Reply::tool("coffer__search_knowledge", json!({"query": "starter"})));
    let before = fake.model_requests().len();
    let result = ask(&mut client, q).await?;
    ensure!(result["isError"] != true, "{result}");
    assert_eq!(result["structuredContent"]["stop_reason"], "max_iterations");
    ensure!(texts(&result).contains("limit of 2 model requests"), "{result}");
    assert_eq!(fake.model_requests().len() - before, 2);
    set_settings(&api, json!({"llm.ask_max_iterations": "8"})).await?;

    // An oversized tool result is cut for the model with a marker (a 64 KiB skill, a small budget).
    write(
        &home.root().join("skills/huge/SKILL.md"),
        format!("---\nname: huge\ndescription: A very long skill.\n---\n# Huge\n\n{}\n", "lorem ipsum ".repeat(6000)),
    )?;
    set_settings(&api, json!({"llm.ask_context_tokens": "3000"})).await?;
    fake.script([Reply::tool("coffer__load_skill", json!({"name": "huge"})), Reply::text("Long.")]);
    let before = fake.model_requests().len();
    let result = ask(&mut client, q).await?;
    ensure!(result["isError"] != true, "{result}");
    let seen = fake.model_requests()[before + 1].seen.clone().context("a model request")?;
    let cut = &seen.new_tool_results()[0].content;
    ensure!(
        cut.contains("more bytes of this tool result were cut to fit the context budget"),
        "{}",
        &cut[cut.len().saturating_sub(300)..]
    );
    ensure!(cut.len() < 3_300, "cut to its share of the budget (3,000 characters): {} bytes", cut.len());
    set_settings(&api, json!({"llm.ask_context_tokens": "32000"})).await?;
    fake.set_rule(researcher);

    // Provider failures end the run with a tool error naming the provider and the cause.
    set_settings(&api, json!({"llm.stall_timeout_s": "1", "llm.request_timeout_s": "3"})).await?;
    let cases: Vec<(Reply, &str)> = vec![
        (Reply::status(401), "401"),
        (Reply::rate_limited("7"), "retry after 7 s"),
        (Reply::status(500), "500"),
        (Reply::fault(Fault::Cut), "coffer__ask is unavailable"),
        (Reply::fault(Fault::Stall), "timed out"),
    ];
    for (reply, expect) in cases {
        fake.script([Reply::tool("coffer__search_knowledge", json!({"query": "starter"})), reply]);
        let result = ask(&mut client, q).await?;
        ensure!(result["isError"] == true, "{expect}: {result}");
        let t = texts(&result);
        ensure!(t.contains(expect) && t.contains("anthropic") && t.contains(&fake.url), "{expect}: {t}");
    }
    // … and the next run works.
    let result = ask(&mut client, q).await?;
    ensure!(result["isError"] != true, "{result}");
    client.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_asks_at_once_and_the_connection_deleted_mid_run() -> anyhow::Result<()> {
    let (home, api, _notes) = daemon_with_notes().await?;
    let fake = FakeLlm::start(Wire::Anthropic).await?;
    fake.set_rule(researcher);
    add_connection(&api, "local", &fake, true).await?;
    let mut a = PyClient::through_shim(&home, &[]).await?;
    let mut b = PyClient::through_shim(&home, &[]).await?;
    let q = "what do my notes say about feeding the sourdough starter?";

    // Two runs at once: both answer, each in its own broker session.
    let (ra, rb) = tokio::join!(ask(&mut a, q), ask(&mut b, q));
    for r in [ra?, rb?] {
        ensure!(r["isError"] != true, "{r}");
        assert_eq!(r["structuredContent"]["citations"][0]["path"], "recipes/bread.md", "{r}");
    }
    let sessions: std::collections::BTreeSet<String> = invocations(&api, "actor=agent")
        .await?
        .iter()
        .filter_map(|i| i["session_id"].as_str().map(str::to_owned))
        .collect();
    ensure!(sessions.len() == 2, "one broker session per run: {sessions:?}");

    // Deleted mid-run: the run finishes on the endpoint it resolved at its start; the next
    // run finds no internal connection.
    fake.set_pace(Some(Duration::from_millis(300)));
    let before = fake.model_requests().len();
    let run = tokio::spawn(async move {
        let r = ask(&mut a, q).await;
        (a, r)
    });
    wait_for("the run's first model request", Duration::from_secs(30), || async {
        Ok((fake.model_requests().len() > before).then_some(()))
    })
    .await?;
    let r = api.request(reqwest::Method::DELETE, "/v1/llm/connections/local").reply().await?;
    ensure!(r.status == 204 || r.status == 200, "{} {}", r.status, r.text);
    let (a, result) = run.await?;
    let result = result?;
    ensure!(result["isError"] != true, "{result}");
    assert_eq!(result["structuredContent"]["citations"][0]["path"], "recipes/bread.md");
    let after = ask(&mut b, q).await?;
    ensure!(after["isError"] == true && texts(&after).contains("no internal LLM connection"), "{after}");
    a.close().await?;
    b.close().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_and_models_probe_through_coffer_chat_and_report_provider_failures_as_failures() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let fake = FakeLlm::start(Wire::Anthropic).await?;
    fake.require_key("sk-test-key-1234567890");
    let body = json!({"name": "keyed", "wire": "anthropic", "base_url": fake.url, "model": "fake-model",
                      "api_key": "sk-test-key-1234567890"});
    let r = api.post_json("/v1/llm/connections", &body).reply().await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);

    // Success: the latency, the model; the key reached the provider (by hash) and nothing else.
    let t = api.post("/v1/llm/connections/keyed/test").reply().await?.ok_json()?;
    ensure!(t["ok"] == true && t["model"] == "fake-model" && t["failure"].is_null(), "{t}");
    ensure!(t["latency_ms"].is_u64(), "{t}");
    ensure!(fake.requests().iter().all(|r| r.carried_key("sk-test-key-1234567890")), "the connection's key was sent");
    let m = api.get("/v1/llm/connections/keyed/models").reply().await?.ok_json()?;
    assert_eq!(m["items"], json!([{"id": "fake-large"}, {"id": "fake-small"}]), "sorted, deduplicated: {m}");

    // A wrong key: 200 with the failure naming the provider and the cause.
    let body = json!({"name": "wrong", "wire": "anthropic", "base_url": fake.url, "model": "fake-model", "api_key": "sk-wrong-key-0000000000"});
    let r = api.post_json("/v1/llm/connections", &body).reply().await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    let t = api.post("/v1/llm/connections/wrong/test").reply().await?.ok_json()?;
    ensure!(t["ok"] == false && t["failure"]["kind"] == "auth" && t["failure"]["http_status"] == 401, "{t}");
    let msg = t["failure"]["message"].as_str().unwrap_or_default();
    ensure!(msg.contains("anthropic") && msg.contains(&fake.url) && !msg.contains("sk-wrong"), "{msg}");

    // No model listing: an empty list with a hint, not an error.
    fake.set_models(None);
    let m = api.get("/v1/llm/connections/keyed/models").reply().await?.ok_json()?;
    ensure!(m["items"] == json!([]) && m["hint"].as_str().is_some_and(|h| h.contains("type the model id")), "{m}");

    // Unreachable, as a draft (nothing saved).
    let draft = json!({"wire": "ollama", "base_url": "http://127.0.0.1:9", "model": "llama3"});
    let t = api.post_json("/v1/llm/connections/test", &draft).reply().await?.ok_json()?;
    ensure!(t["ok"] == false && t["failure"]["kind"] == "unreachable", "{t}");

    // An unknown name is 404; a credential without a value is a conflict naming it.
    let r = api.post("/v1/llm/connections/absent/test").reply().await?;
    ensure!(r.status == 404 && r.text.contains("absent"), "{} {}", r.status, r.text);
    let r = api.post("/v1/llm/connections/nokey-absent/test").reply().await?;
    ensure!(r.status == 404, "{} {}", r.status, r.text);
    Ok(())
}

/// Issue 32: a draft probe (`POST /v1/llm/connections/test` and `…/models`) naming a stored
/// credential is refused with a 400 naming `credential_ref`, whatever its base URL: the stored
/// key never reaches the draft's URL (a fake provider standing for any URL records every
/// request). A key sent in the same request is used, for that probe only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_probe_never_sends_a_stored_credential() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let stored = "sk-stored-secret-0123456789";
    let r = api.request(Method::PUT, "/v1/credentials/llm-claude").json(&json!({"value": stored})).reply().await?;
    ensure!(r.status.is_success(), "{} {}", r.status, r.text);
    let thief = FakeLlm::start(Wire::Anthropic).await?;
    for route in ["/v1/llm/connections/test", "/v1/llm/connections/models"] {
        let draft = json!({"wire": "anthropic", "base_url": thief.url, "model": "m", "credential_ref": "llm-claude"});
        let r = api.post_json(route, &draft).reply().await?;
        ensure!(r.status == 400, "{route}: {} {}", r.status, r.text);
        let e: Value = serde_json::from_str(&r.text)?;
        ensure!(
            e["error"]["code"] == "INVALID_ARGUMENT"
                && e["error"]["details"]["field"] == "credential_ref"
                && e["error"]["details"]["reason"] == "stored_credential_in_draft",
            "{route}: {e}"
        );
        ensure!(!r.text.contains(stored), "never the secret");
    }
    ensure!(thief.requests().is_empty(), "nothing reached the draft's URL: {} requests", thief.requests().len());

    // A key sent with the draft is the one used.
    let typed = "sk-typed-here-9876543210";
    let draft = json!({"wire": "anthropic", "base_url": thief.url, "model": "fake-model", "api_key": typed});
    let t = api.post_json("/v1/llm/connections/test", &draft).reply().await?.ok_json()?;
    ensure!(t["ok"] == true, "{t}");
    let seen = thief.requests();
    ensure!(
        !seen.is_empty() && seen.iter().all(|r| r.carried_key(typed) && !r.carried_key(stored)),
        "only the typed key"
    );
    Ok(())
}
