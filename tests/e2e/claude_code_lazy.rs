//! Issue 36 §2, done when: the real Claude Code CLI (`claude -p`, on a scripted model API) in
//! lazy tool mode is offered only Coffer's three meta tools, and finds, describes and calls
//! `time__get_current_time` and `git__git_log` through them (search → describe → call); the
//! real upstreams (mcp-server-time, mcp-server-git) answer, and the invocation log records the
//! upstream calls as direct calls are recorded.
//!
//! The lazy mode comes from the `default` profile (the profile of a session naming none) set to
//! `mode: lazy`.
use std::time::Duration;

use coffer_tests::anthropic::{FakeAnthropic, step_id};
use coffer_tests::mcp::register_stdio;
use coffer_tests::peers::{ClaudeCode, Sdk, venv_bin};
use coffer_tests::{SendExt, TestHome, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

use crate::peers::git_repo_with_one_commit;

const SEARCH: &str = "mcp__coffer__coffer__search_tools";
const DESCRIBE: &str = "mcp__coffer__coffer__describe_tool";
const CALL: &str = "mcp__coffer__coffer__call_tool";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_claude_code_finds_describes_and_calls_two_upstream_tools_through_the_meta_tools() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let repo = home.temp().join("repo");
    let head = git_repo_with_one_commit(&home, &repo)?;
    let time = venv_bin(Sdk::V1, "mcp-server-time")?;
    register_stdio(&api, "time", &time, &["--local-timezone".into(), "UTC".into()], json!({})).await?;
    let git = venv_bin(Sdk::V1, "mcp-server-git")?;
    register_stdio(&api, "git", &git, &["--repository".into(), repo.display().to_string()], json!({})).await?;
    // The `default` profile (every session that names none) in lazy mode.
    api.request(Method::PUT, "/v1/mcp/profiles/default").json(&json!({"mode": "lazy"})).reply().await?.ok_json()?;

    let repo_path = repo.display().to_string();
    let steps = [
        (SEARCH, json!({"query": "what time is it in Tokyo"})),
        (DESCRIBE, json!({"name": "time__get_current_time"})),
        (CALL, json!({"name": "time__get_current_time", "arguments": {"timezone": "Asia/Tokyo"}})),
        (SEARCH, json!({"query": "show the latest commits of the repository"})),
        (DESCRIBE, json!({"name": "git__git_log"})),
        (CALL, json!({"name": "git__git_log", "arguments": {"repo_path": repo_path, "max_count": 5}})),
    ];
    let model = FakeAnthropic::sequence(steps.iter().map(|(t, i)| ((*t).to_owned(), i.clone())).collect()).await?;
    let claude = ClaudeCode::new(&home, &model.url)?;
    claude.add_coffer(&home).await?;
    let prompt = "What time is it in Tokyo, and what is the latest commit of the repository?";
    let allowed = format!("{SEARCH},{DESCRIBE},{CALL}");
    let args = ["-p", prompt, "--allowedTools", &allowed, "--output-format", "stream-json", "--verbose"];
    let out = claude.run(&home, &args, Duration::from_secs(180)).await?;
    let context = || format!("{out}\n{}", home.diagnostics());
    assert_eq!(out.code, Some(0), "{}", context());

    // Claude Code got Coffer's three meta tools and no upstream tool: its session init lists
    // every tool it has.
    let events: Vec<Value> = out.stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let init = events.iter().find(|e| e["type"] == "system" && e["subtype"] == "init").expect("an init event");
    let mut coffer: Vec<&str> = init["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|t| t.starts_with("mcp__coffer__"))
        .collect();
    coffer.sort_unstable();
    assert_eq!(coffer, [CALL, DESCRIBE, SEARCH], "{}", context());
    let turns = model.turns();
    let first = turns.first().expect("the model was asked");
    assert!(first.offers(SEARCH) && !first.offers("mcp__coffer__time__get_current_time"), "{:?}", first.tools());

    // Every step's answer, as the model got it back.
    let results: Vec<(String, String)> = turns.iter().flat_map(|t| t.tool_results()).collect();
    let answer = |i: usize| {
        let id = step_id(i);
        let found = results.iter().find(|(r, _)| *r == id).map(|(_, c)| c.clone());
        found.unwrap_or_else(|| panic!("no result of step {i} ({:?})\n{}", steps[i], context()))
    };
    assert!(answer(0).contains("time__get_current_time"), "search found the time tool: {}", answer(0));
    assert!(answer(1).contains("inputSchema") && answer(1).contains("timezone"), "{}", answer(1));
    // The real mcp-server-time answered.
    assert!(answer(2).contains("Asia/Tokyo") && answer(2).contains("datetime"), "{}", answer(2));
    assert!(answer(2).contains("+09:00"), "Tokyo's offset: {}", answer(2));
    assert!(answer(3).contains("git__git_log"), "search found git_log: {}", answer(3));
    assert!(answer(4).contains("repo_path"), "{}", answer(4));
    // The real mcp-server-git answered with the repository's commit.
    assert!(answer(5).contains(&head) && answer(5).contains("first commit from coffer-tests"), "{}", answer(5));
    let done = events.iter().find(|e| e["type"] == "result");
    assert_eq!(done.map(|d| d["subtype"].clone()), Some(json!("success")), "{}", context());

    // The upstream calls are in the invocation log as direct calls are, once each: the meta
    // call that routed them is not logged beside them.
    let api = home.api()?;
    for (target, server) in [("time__get_current_time", "time"), ("git__git_log", "git")] {
        let path = format!("/v1/invocations?target={target}");
        let items = wait_for(&format!("{target} in the invocation log"), Duration::from_secs(10), || async {
            let v: Value = api.get(&path).reply().await?.json()?;
            let items: Vec<Value> = v["items"].as_array().cloned().unwrap_or_default();
            Ok((!items.is_empty()).then_some(items))
        })
        .await?;
        for i in &items {
            assert_eq!((i["server"].as_str(), i["outcome"].as_str()), (Some(server), Some("ok")), "{i}");
        }
    }
    let meta: Value = api.get("/v1/invocations?target=coffer__call_tool").reply().await?.json()?;
    assert_eq!(meta["items"], json!([]), "the meta calls are logged as the tools they called");
    Ok(())
}
