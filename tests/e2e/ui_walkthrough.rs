//! The web console walked through as one person's session in a real headless Chromium: `coffer ui`
//! prints a login link; the browser lands signed in on the chat page; a conversation with the
//! real Claude Code CLI (on the fake Anthropic API) streams; two messages queued during the turn
//! wait as pending items; the turn is stopped; the queue is resumed; a second tab shows the same
//! live stream; a tool is disabled on the servers page (and so leaves `tools/list` through
//! `/mcp`); the person's notes are searched on the knowledge page. Screenshots of each step go
//! to `target/ui-screenshots/done-*.png` (a few are copied into `docs/`).
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::browser::{Browser, keys};
use coffer_tests::mcp::McpSession;
use coffer_tests::{SendExt, TestHome, wait_for, write_file};
use reqwest::Method;
use serde_json::json;

/// How long one step of the real Claude Code CLI on the fake model may take on a loaded machine.
const REAL: Duration = Duration::from_secs(90);

/// Types `text` in the composer and presses Enter.
async fn send(b: &Browser, text: &str) -> anyhow::Result<()> {
    let composer = b.find("#composer").await?;
    composer.click().await?;
    composer.send_keys(text).await?;
    b.press(keys::ENTER).await
}

/// Clicks the first element matching `css` whose trimmed text is `label` (any when empty).
async fn click(b: &Browser, css: &str, label: &str) -> anyhow::Result<()> {
    let find = "return [...document.querySelectorAll(arguments[0])]\
        .find(e => (!arguments[1] || e.textContent.trim() === arguments[1]) && !e.hidden) || null;";
    let el = wait_for(&format!("{css} {label:?} to click"), Duration::from_secs(30), || async {
        let v = b.eval(find, vec![json!(css), json!(label)]).await?;
        Ok((!v.is_null()).then_some(v))
    })
    .await?;
    b.element(&el)?.click().await
}

/// A JS predicate: a finished reply of the assistant holds `word`.
fn reply_with(word: &str) -> String {
    format!(
        "[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('{word}'))"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_user_chats_queues_stops_resumes_watches_toggles_and_searches() -> anyhow::Result<()> {
    let fake = coffer_tests::anthropic::FakeAnthropic::scripted().await?;
    let mut home = TestHome::new()?;
    coffer_tests::chat::offline_claude_code(&mut home, &fake.url);
    // The person's notes and one upstream MCP server.
    let notes = home.temp().join("notes");
    write_file(
        &notes.join("ops/deploy.md"),
        "# Operations\n\n## Deploying\n\nThe staging deploy uses the flamingo key.\n",
    )?;
    write_file(&notes.join("garden.md"), "# Garden\n\nTomatoes want sun.\n")?;

    // 1. `coffer ui` starts the daemon and prints a one-time link; opening it signs in.
    let out = home.cli(&["ui", "--no-open", "--json"]).await?.ok()?;
    let url = out.json()?["url"].as_str().context("url")?.to_owned();
    let api = home.api()?;
    let claude = coffer_tests::peers::claude_code()?.display().to_string();
    api.request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.claude_code_path": claude}}))
        .reply()
        .await?
        .ok_json()?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let r = api.post_json("/v1/mcp/servers", &json!({"name": "tiny", "command": tiny})).reply().await?;
    ensure!(r.status == 201, "register: {} {}", r.status, r.text);
    let r =
        api.post_json("/v1/knowledge", &json!({"name": "notes", "path": notes.display().to_string()})).reply().await?;
    ensure!(r.status == 201, "knowledge: {} {}", r.status, r.text);

    let b = Browser::start().await?;
    b.set_origin(api.base_url())?;
    b.goto(&url).await?;
    b.wait_for_page("chat").await?;
    ensure!(b.current_url().await?.path() == "/ui/chat", "landed on the chat page");
    b.screenshot("done-1-landed").await?;

    // 2. A conversation with Claude Code, from the new-conversation dialog.
    b.wait_for(".thread-empty-state .primary").await?.click().await?;
    b.wait_for("dialog.modal #new-agent").await?;
    b.eval(
        "const s = document.querySelector('#new-agent'); s.value = 'claude_code'; s.dispatchEvent(new Event('change'));",
        vec![],
    )
    .await?;
    b.find("#new-title").await?.send_keys("Deploy questions").await?;
    b.find("dialog.modal button[type=submit]").await?.click().await?;
    b.wait_for_text(".thread-title", "Deploy questions").await?;

    // 3. It streams: a slow reply, word by word.
    let words: Vec<String> = (1..=40).map(|i| format!("w{i:02}")).collect();
    send(&b, &format!("SLOW[250] SAY[{}]", words.join(" "))).await?;
    b.wait_until_within("(document.querySelector('.streaming-text') || {}).textContent?.includes('w02')", REAL).await?;
    b.screenshot("done-2-streaming").await?;

    // 4. Two messages typed during the turn wait as pending items; the composer stays usable.
    send(&b, "SLOW[300] SAY[q1a q1b q1c q1d q1e q1f q1g q1h q1i q1j]").await?;
    send(&b, "SAY[q2 done]").await?;
    b.wait_until("document.querySelectorAll('.pending-item').length === 2").await?;
    ensure!(b.find("#composer").await?.prop("disabled").await? == json!(false), "the composer never locks");
    b.screenshot("done-3-queued").await?;

    // 5. Stop: the partial reply is kept as interrupted; the queue pauses with resume/discard.
    b.find(".stop").await?.click().await?;
    b.wait_for("article.msg.assistant[data-status=\"interrupted\"]").await?;
    b.wait_for(".pending-head.paused").await?;
    let partial = b.find("article.msg.assistant[data-status=\"interrupted\"]").await?.text().await?;
    ensure!(partial.contains("w01") && !partial.contains("w40"), "stopped part-way: {partial}");
    b.screenshot("done-4-stopped").await?;

    // 6. Resume; a second tab on the same conversation sees the same live stream.
    let first = b.current_tab().await?;
    let conv = b.current_url().await?.query_pairs().find(|(k, _)| k == "c").map(|(_, v)| v.into_owned());
    let conv = conv.context("the chat page names the open conversation in ?c=")?;
    click(&b, ".pending-head button", "Resume").await?;
    let second = b.new_tab().await?;
    b.goto(&format!("/ui/chat?c={conv}")).await?;
    b.wait_until_within("(document.querySelector('.streaming-text') || {}).textContent?.includes('q1b')", REAL).await?;
    let live = b.eval("return document.querySelector('.streaming-text').textContent;", vec![]).await?;
    ensure!(!live.as_str().unwrap_or_default().contains("q1j"), "the second tab joined mid-turn: {live}");
    b.screenshot("done-5-second-tab").await?;
    b.wait_until_within(&reply_with("q1j"), REAL).await?;
    b.wait_until_within(&reply_with("q2"), REAL).await?;
    b.switch_to(&first).await?;
    b.wait_until_within(&reply_with("q2"), REAL).await?;
    b.wait_until("document.querySelector('.pending').hidden").await?;
    b.screenshot("done-6-resumed").await?;

    // 7. Disable a tool on the servers page: it leaves tools/list through /mcp.
    ensure!(McpSession::latest(&api).await?.tool_names().await?.contains(&"tiny__echo".to_owned()), "echo listed");
    b.goto("/ui/servers?name=tiny").await?;
    b.wait_for(".caps tr[data-key=echo] input.switch").await?;
    click(&b, ".caps tr[data-key=echo] input.switch", "").await?;
    wait_for("tiny__echo to leave tools/list", Duration::from_secs(30), || async {
        Ok((!McpSession::latest(&api).await?.tool_names().await?.contains(&"tiny__echo".to_owned())).then_some(()))
    })
    .await?;
    b.screenshot("done-7-tool-disabled").await?;

    // 8. Search the notes on the knowledge page.
    b.goto("/ui/knowledge").await?;
    b.wait_for("#kb-query").await?.send_keys("flamingo").await?;
    click(&b, "form.search-form button[type=submit]", "Search").await?;
    b.wait_for_text(".results li.result", "ops/deploy.md").await?;
    let hit = b.find(".results li.result").await?.text().await?;
    ensure!(hit.contains("notes") && hit.contains("flamingo"), "the note is found: {hit}");
    b.screenshot("done-8-knowledge-search").await?;

    b.assert_clean().await;
    b.switch_to(&second).await?;
    b.assert_clean().await;
    Ok(())
}
