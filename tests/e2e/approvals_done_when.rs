//! Issue 34 §1's "done when", end to end with real parts: the shipped chat service runs the real
//! Claude Code CLI (the pinned peer) on the fake Anthropic API; a Telegram channel on the fake
//! Bot API whose default permission mode is `ask`; a real headless Chromium on the console. The
//! agent asks to run a command: the owner denies it from Telegram (the agent is told, the
//! command does not run, the message shows the decision); the next request is allowed from the
//! console's approval card in the browser, and it runs.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::browser::Browser;
use coffer_tests::fake_telegram::FakeTelegram;
use coffer_tests::{SendExt, TestHome, chat};
use serde_json::json;

const TOKEN: &str = "4242:fake-token-DONEWHEN";
const OWNER: i64 = 1001;
/// A real Claude Code turn on a loaded machine.
const REAL: Duration = Duration::from_secs(120);

/// Whether the model was told `text` in a tool result.
fn told(fake: &coffer_tests::anthropic::FakeAnthropic, text: &str) -> bool {
    fake.requests().iter().any(|r| {
        r.body["messages"].as_array().into_iter().flatten().any(|m| {
            m["content"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|b| b["type"] == "tool_result" && b.to_string().contains(text))
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_claude_code_asks_denied_from_telegram_then_allowed_from_the_console() -> anyhow::Result<()> {
    let anthropic = coffer_tests::anthropic::FakeAnthropic::scripted().await?;
    let fake = FakeTelegram::start(TOKEN, "coffer_bot").await?;
    let mut home = TestHome::new()?;
    chat::offline_claude_code(&mut home, &anthropic.url);
    let api = home.start_daemon().await?;
    let claude = coffer_tests::peers::claude_code()?.display().to_string();
    api.request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.claude_code_path": claude}}))
        .reply()
        .await?
        .ok_json()?;
    let cwd = home.temp().join("ws");
    std::fs::create_dir_all(&cwd)?;
    // The channel's own default mode: its conversations ask.
    let body = json!({ "name": "tg", "kind": "telegram", "bot_token": TOKEN, "api_base_url": fake.url,
        "default_agent": "claude_code", "agent_config": {"cwd": cwd.display().to_string(), "permission_mode": "ask"} });
    let r = api.post_json("/v1/channels", &body).header("X-Coffer-Actor", "cli").reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let code = api.post("/v1/channels/tg/pair").reply().await?.ok_json()?["code"].as_str().context("code")?.to_owned();
    fake.wait("the adapter's first long poll", REAL, |f| !f.calls_of("getUpdates").is_empty()).await?;
    fake.push_text(OWNER, &format!("/pair {code}"));
    fake.wait("paired", REAL, |f| f.bot_messages(OWNER).iter().any(|m| m.visible().contains("Paired"))).await?;
    let touch = |name: &str| {
        let input = json!({"command": format!("touch {}", cwd.join(name).display())});
        format!("TOOL[Bash {input}]")
    };

    // The agent asks; the owner denies from Telegram: told, not run, the message says so.
    fake.push_text(OWNER, &touch("denied.txt"));
    fake.wait("the request with its buttons", REAL, |f| {
        f.bot_messages(OWNER)
            .iter()
            .any(|m| m.visible().contains("Waiting for your approval") && !m.keyboard.is_empty())
    })
    .await?;
    let req = fake.bot_messages(OWNER).into_iter().rfind(|m| m.visible().contains("Waiting")).context("request")?;
    ensure!(req.visible().contains("Bash") && req.visible().contains("denied.txt"), "{}", req.visible());
    let list = api.get("/v1/conversations").reply().await?.ok_json()?;
    let conv = list["items"].as_array().and_then(|a| a.iter().find(|c| c["channel_name"] == "tg")).context("conv")?;
    ensure!(conv["agent_config"]["permission_mode"] == "ask", "the channel's default mode: {conv}");
    let id = conv["id"].as_str().context("id")?.to_owned();
    let q = fake.press(OWNER, req.message_id, &req.button("Deny").context("Deny")?.data);
    fake.wait("the press answered", REAL, |f| f.answer_of(&q).is_some()).await?;
    assert_eq!(fake.answer_of(&q).context("answer")?.text, "Denied.");
    fake.wait("the decision on the message", REAL, |f| {
        f.bot_messages(OWNER).iter().any(|m| m.message_id == req.message_id && m.keyboard.is_empty())
    })
    .await?;
    coffer_tests::wait_for("the model to be told", REAL, || async {
        Ok(told(&anthropic, "The user denied this action.").then_some(()))
    })
    .await?;
    coffer_tests::wait_for("the turn to end", REAL, || async {
        let v = api.get(&format!("/v1/conversations/{id}")).reply().await?.ok_json()?;
        Ok((v["conversation"]["turn_running"] == false).then_some(()))
    })
    .await?;
    ensure!(!cwd.join("denied.txt").exists(), "a denied command ran");

    // The next request, from Telegram again, is allowed from the console in the browser.
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    b.goto(&format!("/ui/chat?c={id}")).await?;
    b.wait_for(&format!(".conv-item[aria-current=\"true\"][data-id=\"{id}\"]")).await?;
    fake.push_text(OWNER, &touch("allowed.txt"));
    b.wait_until_within("!!document.querySelector('.approval-card.waiting')", REAL).await?;
    b.wait_for(&format!(".conv-item[data-id=\"{id}\"] .waiting-you")).await?;
    let card = b.find(".approval-card.waiting").await?.text().await?;
    ensure!(card.contains("Bash") && card.contains("allowed.txt"), "{card}");
    b.screenshot("approval-real-claude-card").await?;
    b.find(".approval-card.waiting .approval-allow").await?.click().await?;
    b.wait_for_text(".approval-card.allowed .approval-outcome", "Allowed by the web console").await?;
    coffer_tests::wait_for("the allowed command to run", REAL, || async {
        Ok(cwd.join("allowed.txt").exists().then_some(()))
    })
    .await?;
    // Telegram's request message shows the console's decision too.
    fake.wait("the console's decision in Telegram", REAL, |f| {
        f.bot_messages(OWNER)
            .iter()
            .any(|m| m.visible().contains("allowed.txt") && m.visible().contains("Allowed") && m.keyboard.is_empty())
    })
    .await?;
    b.screenshot("approval-real-claude-allowed").await?;
    b.assert_clean().await;
    home.cli(&["daemon", "stop"]).await?.ok()?;
    home.wait_no_processes(REAL).await?;
    Ok(())
}
