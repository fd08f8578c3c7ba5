//! Continuing the sessions the user already has (issue 34 §5), end to end: the real Claude Code
//! and Codex CLIs write sessions in the test's private `HOME` against fake model APIs; the
//! shipped daemon lists them (`GET /v1/agent-sessions`, beside hostile transcript files),
//! imports one (`POST /v1/conversations/import`: history as read-only messages; twice → 409
//! naming the conversation; unknown → 404; a path as id → 400), and the next turn resumes the
//! session with the real CLI (the fake model's request carries the earlier history) — from a
//! Telegram chat through `/sessions` and `/import N` (the fake Bot API), and through REST for
//! Codex. The project picker (`GET /v1/projects`, `/projects`, `/new N`) is checked on the same
//! daemon.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::anthropic::FakeAnthropic;
use coffer_tests::fake_telegram::FakeTelegram;
use coffer_tests::openai::FakeOpenAi;
use coffer_tests::peers::ClaudeCode;
use coffer_tests::{SendExt, TestHome, chat};
use reqwest::Method;
use serde_json::{Value, json};

const TOKEN: &str = "4242:fake-token-BBBB";
const OWNER: i64 = 1001;
const WAIT: Duration = Duration::from_secs(30);
const REAL: Duration = Duration::from_secs(120);

fn items(v: &Value) -> Vec<Value> {
    v["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_claude_code_session_is_imported_and_continued_from_telegram() -> anyhow::Result<()> {
    let anthropic = FakeAnthropic::scripted().await?;
    let fake = FakeTelegram::start(TOKEN, "coffer_bot").await?;
    let mut home = TestHome::new()?;
    chat::offline_claude_code(&mut home, &anthropic.url);

    // The user's own session, made by the real Claude Code outside Coffer.
    let claude = ClaudeCode::new(&home, &anthropic.url)?;
    let first = "SAY[the answer from before Coffer] please refactor the parser";
    let out = claude.run(&home, &["-p", first, "--output-format", "json"], REAL).await?;
    ensure!(out.code == Some(0), "claude -p: {out}");
    let session_id =
        serde_json::from_str::<Value>(&out.stdout)?["session_id"].as_str().context("session_id")?.to_owned();
    let folder = home.temp().display().to_string();

    // Hostile neighbours in its projects folder: garbage, a symlink loop, a partial last line.
    let projects = std::path::PathBuf::from(&home.env()["HOME"]).join(".claude/projects");
    std::fs::create_dir_all(projects.join("junk"))?;
    std::fs::write(projects.join("junk/garbage.jsonl"), b"\x00\xffnot json\n{{{\n")?;
    std::os::unix::fs::symlink(&projects, projects.join("junk/loop"))?;
    std::fs::write(
        projects.join("junk/partial.jsonl"),
        b"{\"type\":\"user\",\"cwd\":\"/nowhere\",\"message\":{\"content\":\"hi\"}}\n{\"type\":",
    )?;
    // Older than the real session, which is then the newest: number 1 of `/sessions`.
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    std::fs::File::options().write(true).open(projects.join("junk/partial.jsonl"))?.set_modified(old)?;

    home.cli(&["status"]).await?.ok()?;
    let api = home.api()?;
    let claude_path = coffer_tests::peers::claude_code()?.display().to_string();
    api.request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.claude_code_path": claude_path}}))
        .reply()
        .await?
        .ok_json()?;

    // Listed with its folder and first prompt.
    let list = api.get("/v1/agent-sessions?agent=claude_code").reply().await?.ok_json()?;
    let listed = items(&list).into_iter().find(|s| s["session_id"] == session_id.as_str());
    let listed = listed.with_context(|| format!("the session in {list}"))?;
    ensure!(listed["cwd"] == folder.as_str(), "{listed}");
    ensure!(listed["first_prompt"] == first, "{listed}");
    ensure!(listed["message_count"] == 2 && listed["conversation_id"].is_null(), "{listed}");
    ensure!(list["skipped_files"].as_u64() >= Some(1), "the garbage file is counted: {list}");
    // Bad input.
    let r = api
        .post_json("/v1/conversations/import", &json!({"agent_key": "claude_code", "session_id": "no-such-session"}))
        .reply()
        .await?;
    ensure!(r.status == 404, "unknown: {} {}", r.status, r.text);
    let r = api
        .post_json("/v1/conversations/import", &json!({"agent_key": "claude_code", "session_id": "../../.ssh/id_rsa"}))
        .reply()
        .await?;
    ensure!(r.status == 400 && r.text.contains("session_id"), "traversal: {} {}", r.status, r.text);
    let r = api.get("/v1/agent-sessions?agent=gemini").reply().await?;
    ensure!(r.status == 400, "bad agent: {} {}", r.status, r.text);

    // The Telegram chat: /sessions, /import 1, then a message continues the session.
    let body = json!({
        "name": "tg", "kind": "telegram", "bot_token": TOKEN, "api_base_url": fake.url,
        "default_agent": "claude_code",
    });
    let r = api.post_json("/v1/channels", &body).header("X-Coffer-Actor", "cli").reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let code = api.post("/v1/channels/tg/pair").reply().await?.ok_json()?["code"].as_str().context("code")?.to_owned();
    fake.wait("the adapter's first long poll", WAIT, |f| !f.calls_of("getUpdates").is_empty()).await?;
    fake.push_text(OWNER, &format!("/pair {code}"));
    let shows = |needle: &'static str| {
        move |f: &FakeTelegram| f.bot_messages(OWNER).iter().any(|m| m.visible().contains(needle))
    };
    fake.wait("the pairing answer", WAIT, shows("Paired")).await?;
    fake.push_text(OWNER, "/sessions");
    fake.wait("the numbered sessions", WAIT, shows("/import N")).await?;
    let shown = fake.bot_messages(OWNER).into_iter().rfind(|m| m.visible().contains("/import N")).context("list")?;
    ensure!(
        shown.visible().contains("1. Claude Code") && shown.visible().contains("1. Claude Code · coffer-e2e"),
        "{}",
        shown.visible()
    );
    fake.push_text(OWNER, "/import 1");
    fake.wait("the import's answer", WAIT, shows("Imported")).await?;

    let convs = api.get("/v1/conversations").reply().await?.ok_json()?;
    let conv = items(&convs).into_iter().find(|c| c["channel_name"] == "tg").with_context(|| format!("{convs}"))?;
    let id = conv["id"].as_str().context("id")?.to_owned();
    ensure!(
        conv["agent_config"]["session_id"] == session_id.as_str() && conv["agent_config"]["cwd"] == folder.as_str(),
        "{conv}"
    );
    // The history, read-only, above the new turns.
    let view = api.get(&format!("/v1/conversations/{id}")).reply().await?.ok_json()?;
    let msgs = view["messages"].as_array().context("messages")?;
    let said: Vec<(String, String, bool)> = msgs
        .iter()
        .map(|m| {
            let text =
                m["blocks"].as_array().into_iter().flatten().filter_map(|b| b["text"].as_str()).collect::<String>();
            (m["role"].as_str().unwrap_or_default().to_owned(), text, m["imported"] == true)
        })
        .collect();
    ensure!(
        said == [
            ("user".to_owned(), first.to_owned(), true),
            ("assistant".to_owned(), "the answer from before Coffer".to_owned(), true)
        ],
        "{said:?}"
    );
    // Imported twice: 409 naming the conversation.
    let r = api
        .post_json("/v1/conversations/import", &json!({"agent_key": "claude_code", "session_id": session_id}))
        .reply()
        .await?;
    ensure!(r.status == 409 && r.text.contains(&id), "twice: {} {}", r.status, r.text);
    let list = api.get("/v1/agent-sessions").reply().await?.ok_json()?;
    ensure!(items(&list).iter().any(|s| s["conversation_id"] == id.as_str()), "{list}");

    let before = anthropic.requests().len();
    fake.push_text(OWNER, "SAY[continued from the phone]");
    fake.wait("Claude Code's answer in the chat", REAL, shows("continued from the phone")).await?;
    // The real Claude Code resumed the session: the model saw the earlier turn.
    let resumed = anthropic
        .requests()
        .into_iter()
        .skip(before)
        .rev()
        .find(|r| r.path.starts_with("/v1/messages") && !r.tools().is_empty());
    let history = resumed.context("a model request for the new turn")?.body["messages"].to_string();
    ensure!(
        history.contains("the answer from before Coffer") && history.contains("continued from the phone"),
        "{history}"
    );
    let conv = api.get(&format!("/v1/conversations/{id}")).reply().await?.ok_json()?;
    ensure!(conv["conversation"]["agent_config"]["session_id"] == session_id.as_str(), "the same session: {conv}");

    // The project picker: the session's folder is offered; `/new 1` starts a conversation there.
    let projects = api.get("/v1/projects").reply().await?.ok_json()?;
    let offered =
        items(&projects).into_iter().find(|p| p["path"] == folder.as_str()).with_context(|| format!("{projects}"))?;
    ensure!(offered["sources"].as_array().is_some_and(|s| s.contains(&json!("claude_code"))), "{offered}");
    fake.push_text(OWNER, "/projects");
    fake.wait("the numbered projects", WAIT, shows("/new N")).await?;
    let shown = fake.bot_messages(OWNER).into_iter().rfind(|m| m.visible().contains("/new N")).context("projects")?;
    let n = shown
        .visible()
        .lines()
        .find(|l| l.contains(&folder))
        .and_then(|l| l.split('.').next().map(str::to_owned))
        .with_context(|| shown.visible())?;
    fake.push_text(OWNER, &format!("/new {n}"));
    fake.wait("the new conversation", WAIT, shows("New conversation with claude_code in")).await?;
    let convs = api.get("/v1/conversations").reply().await?.ok_json()?;
    let newest = items(&convs).into_iter().find(|c| c["channel_name"] == "tg" && c["id"] != id.as_str());
    ensure!(newest.is_some_and(|c| c["agent_config"]["cwd"] == folder.as_str()), "{convs}");

    home.cli(&["daemon", "stop"]).await?.ok()?;
    home.wait_no_processes(WAIT).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_codex_session_is_listed_imported_and_resumed_with_the_cli() -> anyhow::Result<()> {
    let model = FakeOpenAi::start().await?;
    let mut home = TestHome::new()?;
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("OPENAI_") || k.starts_with("CODEX_") {
            home.unset_env(&k);
        }
    }
    home.set_env("OPENAI_API_KEY", "sk-test-not-a-real-key");
    home.set_env("COFFER_PASS_ENV", "OPENAI_API_KEY");
    let user_home = std::path::PathBuf::from(&home.env()["HOME"]);
    coffer_tests::write_file(&user_home.join(".codex/config.toml"), model.codex_config("fake-model"))?;

    // The user's own Codex thread, made by the real Codex outside Coffer.
    let prompt = "fix the flaky test in the codex project";
    let args = ["exec", "--skip-git-repo-check", "--json", prompt];
    let out =
        coffer_tests::peers::run_codex(&home, &args, &[("OPENAI_API_KEY", "sk-test-not-a-real-key")], REAL).await?;
    ensure!(out.code == Some(0), "codex exec: {out}");
    let thread = out
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|e| e["thread_id"].as_str().map(str::to_owned))
        .context("thread.started")?;

    home.cli(&["status"]).await?.ok()?;
    let api = home.api()?;
    let codex = coffer_tests::peers::codex()?.display().to_string();
    api.request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.codex_path": codex}}))
        .reply()
        .await?
        .ok_json()?;

    let list = api.get("/v1/agent-sessions?agent=codex").reply().await?.ok_json()?;
    let listed =
        items(&list).into_iter().find(|s| s["session_id"] == thread.as_str()).with_context(|| format!("{list}"))?;
    ensure!(
        listed["cwd"] == home.temp().display().to_string().as_str() && listed["first_prompt"] == prompt,
        "{listed}"
    );

    let out = home.cli(&["chat", "import", "codex", &thread, "--json"]).await?;
    let conv: Value = serde_json::from_str(&out.ok()?.stdout)?;
    let id = conv["id"].as_str().context("id")?.to_owned();
    ensure!(conv["message_count"] == 2 && conv["agent_config"]["session_id"] == thread.as_str(), "{conv}");
    let again = home.cli(&["chat", "import", "codex", &thread]).await?;
    ensure!(again.code == Some(4) && again.stderr.contains(&id), "twice: {again:?}");
    let table = home.cli(&["chat", "sessions", "--agent", "codex"]).await?.ok()?.stdout;
    ensure!(table.contains(&thread) && table.contains(&id), "{table}");

    let before = model.requests().len();
    let out = home.cli(&["chat", "send", &id, "and now the second codex question", "--watch"]).await?;
    out.ok()?;
    let asked = model.requests().into_iter().skip(before).last().context("a model request")?;
    let texts = asked.user_texts();
    ensure!(
        texts.iter().any(|t| t.contains(prompt)) && texts.iter().any(|t| t.contains("second codex question")),
        "thread/resume carried the history: {texts:?}"
    );
    home.cli(&["daemon", "stop"]).await?.ok()?;
    home.wait_no_processes(WAIT).await?;
    Ok(())
}
