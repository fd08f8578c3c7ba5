//! Issue 35 §4 (the designer's pass), bullets four to six, in a real headless Chromium against a
//! real daemon:
//! - the server page's tools table fits its card at 1280 px with real-length descriptions (no
//!   sideways scroll of the table, every toggle inside the card, long descriptions clamped with
//!   a working "More"), and at 390 px each tool is one list row; light and dark;
//! - Activity names who made each call: a chat agent's call (the scripted agent calling a tool
//!   through the real `coffer-mcp-shim` with its turn's MCP config) names its conversation,
//!   linked to the thread, live and after a reload; an MCP client's names the client; the page
//!   follows the log on the tab's one multiplexed stream, with no EventSource of its own; REST
//!   (`?conversation=`) and `coffer invocations --conversation` show it too;
//! - every `coffer …` command the console shows (elements marked `data-cli`, collected from the
//!   pages of a fresh home and from the console's sources) parses with the real CLI's parser.
//!
//! Screenshots: `target/ui-screenshots/pages-*.png`.
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::browser::Browser;
use coffer_tests::mcp::{self, McpSession};
use coffer_tests::{Api, SendExt, TestHome, chat, wait_for};
use serde_json::{Value, json};

const PHONE: (u32, u32) = (390, 844);
const DESKTOP: (u32, u32) = (1280, 800);

/// The document and the capability table's box do not scroll sideways, every toggle lies inside
/// the card, and (on the desktop) the table is a table; on the phone each row is a list row.
async fn assert_caps_fit(b: &Browser, what: &str, phone: bool) -> anyhow::Result<()> {
    let v = b
        .eval(
            "const de = document.documentElement, card = document.querySelector('section.caps');
             const wrap = card.querySelector('.table-wrap'), cr = card.getBoundingClientRect();
             const toggles = [...card.querySelectorAll('td.cap-on input.switch')].map(t => t.getBoundingClientRect());
             const row = card.querySelector('tbody tr');
             return { doc: [de.scrollWidth, de.clientWidth], card: [card.scrollWidth, card.clientWidth], wrap: [wrap.scrollWidth, wrap.clientWidth],
                      toggles: toggles.length, inside: toggles.every(r => r.width > 0 && r.left >= cr.left && r.right <= cr.right + 0.5),
                      head: getComputedStyle(card.querySelector('thead')).display, row: getComputedStyle(row).display };",
            vec![],
        )
        .await?;
    for k in ["doc", "card", "wrap"] {
        ensure!(v[k][0].as_u64() <= v[k][1].as_u64(), "{what}: {k} scrolls sideways: {v}");
    }
    ensure!(v["toggles"].as_u64() >= Some(16) && v["inside"] == true, "{what}: every toggle inside the card: {v}");
    if phone {
        ensure!(v["head"] == "none" && v["row"] == "grid", "{what}: on a phone each tool is a list row: {v}");
    } else {
        ensure!(v["head"] == "table-header-group" && v["row"] == "table-row", "{what}: a table on the desktop: {v}");
    }
    Ok(())
}

#[tokio::test]
async fn ui_pages_the_tools_table_fits_its_card_at_1280_and_is_a_list_at_390() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    mcp::register_tiny(&api, "tiny", json!({"TINY_LONG_DESCRIPTIONS": "1"})).await?;
    mcp::wait_listed(&api, "tiny").await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "servers").await?;
    for dark in [false, true] {
        b.set_dark(dark).await?;
        let theme = if dark { "dark" } else { "light" };
        for (w, h) in [DESKTOP, PHONE] {
            b.set_viewport(w, h).await?;
            b.goto("/ui/servers?name=tiny").await?;
            b.wait_for_page("servers").await?;
            b.wait_for("section.caps tr[data-key=read_multiple_files_with_metadata_and_sizes]").await?;
            b.wait_settled().await?;
            let what = format!("the server page at {w}×{h} {theme}");
            assert_caps_fit(&b, &what, w == PHONE.0).await?;
            b.screenshot(&format!("pages-server-tools-{w}-{theme}")).await?;
        }
    }
    // The long description is clamped with "More", which opens it (and the table still fits);
    // a short one has no button.
    b.set_dark(false).await?;
    b.set_viewport(DESKTOP.0, DESKTOP.1).await?;
    b.goto("/ui/servers?name=tiny").await?;
    let long = "section.caps tr[data-key=read_multiple_files_with_metadata_and_sizes]";
    b.wait_until(&format!("!document.querySelector('{long} .more-toggle').hidden")).await?;
    let clamped = b
        .eval(
            &format!("const d = document.querySelector('{long} .desc'); return [d.scrollHeight, d.clientHeight];"),
            vec![],
        )
        .await?;
    ensure!(clamped[0].as_u64() > clamped[1].as_u64(), "the long description is clamped: {clamped}");
    ensure!(
        b.eval("return document.querySelector('section.caps tr[data-key=echo] .more-toggle').hidden;", vec![]).await?
            == true,
        "a one-line description has no More"
    );
    b.find(&format!("{long} .more-toggle")).await?.click().await?;
    b.wait_until(&format!(
        "((d) => d.classList.contains('open') && d.scrollHeight <= d.clientHeight + 1)(document.querySelector('{long} .desc'))
           && document.querySelector('{long} .more-toggle').textContent === 'Less'"
    ))
    .await?;
    assert_caps_fit(&b, "with the long description open", false).await?;
    b.screenshot("pages-server-tools-open-1280-light").await?;
    // The tools still toggle from the table.
    b.find("section.caps tr[data-key=echo] input.switch").await?.click().await?;
    wait_for("tiny__echo disabled", Duration::from_secs(10), || async {
        let v: Value = api.get("/v1/tools").reply().await?.json()?;
        let t = v["items"].as_array().and_then(|a| a.iter().find(|t| t["name"] == "tiny__echo").cloned());
        Ok(t.filter(|t| t["enabled"] == false).map(drop))
    })
    .await?;
    b.assert_clean().await;
    b.close().await
}

/// Sends `text` to conversation `id` and waits until its turn has ended with `messages` messages.
async fn turn(api: &Api, id: &str, text: &str, messages: u64) -> anyhow::Result<()> {
    let r = api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": text})).reply().await?;
    ensure!(r.status == 202, "send: {} {}", r.status, r.text);
    wait_for("the turn to end", Duration::from_secs(60), || async {
        let v: Value = api.get(&format!("/v1/conversations/{id}")).reply().await?.json()?;
        let c = &v["conversation"];
        Ok((c["turn_running"] == false && c["message_count"].as_u64().unwrap_or(0) >= messages).then_some(()))
    })
    .await
}

/// The text of the tool results of conversation `id`'s last turn (as the thread shows them).
async fn tool_results(api: &Api, id: &str) -> anyhow::Result<String> {
    let v: Value = api.get(&format!("/v1/conversations/{id}/messages")).reply().await?.json()?;
    Ok(v.to_string())
}

#[tokio::test]
async fn ui_pages_activity_names_the_conversation_of_an_agent_call_and_the_client_of_a_client_call()
-> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    mcp::register_tiny(&api, "tiny", json!({})).await?;
    mcp::wait_listed(&api, "tiny").await?;
    const TITLE: &str = "Fix the flaky deploy script";
    let r = api.post_json("/v1/conversations", &json!({"agent_key": chat::SCRIPTED, "title": TITLE})).reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let id = r.json()?["id"].as_str().context("id")?.to_owned();

    // 1. The agent calls a tool through its turn's MCP config (the real shim, the agent token).
    turn(&api, &id, r#"mcp:tiny__echo {"message":"from the agent"}"#, 2).await?;
    let results = tool_results(&api, &id).await?;
    ensure!(results.contains("from the agent"), "the agent's call went through Coffer: {results}");
    // An MCP client's call names the client (clientInfo `coffer-tests 1`).
    McpSession::latest(&api).await?.tool("tiny__echo", json!({"message": "from a client"})).await?;

    // REST: the agent's call names its conversation with its title, and is found by it.
    let v: Value = api.get(&format!("/v1/invocations?conversation={id}")).reply().await?.json()?;
    let items = v["items"].as_array().context("items")?;
    ensure!(items.len() == 1, "one call of the conversation: {v}");
    ensure!(items[0]["conversation"] == json!({"id": id, "title": TITLE}) && items[0]["target"] == "tiny__echo", "{v}");
    ensure!(items[0]["outcome"] == "ok" && items[0]["actor"] == "mcp", "{v}");
    ensure!(items[0]["client"]["name"] == "scripted-agent", "the agent's own clientInfo is kept too: {v}");
    let v: Value = api.get("/v1/invocations?client=coffer-tests").reply().await?.json()?;
    ensure!(v["items"][0]["conversation"].is_null(), "a client's call names no conversation: {v}");
    // The CLI shows it too.
    let out = home.cli(&["invocations", "--conversation", &id]).await?;
    ensure!(out.code == Some(0) && out.stdout.contains(&format!("conversation \"{TITLE}\"")), "{out:?}");
    let out = home.cli(&["invocations", "--conversation", &id, "--json"]).await?;
    let j: Value = serde_json::from_str(&out.stdout).context("--json")?;
    ensure!(j["items"][0]["conversation"]["title"] == TITLE, "{j}");

    // 2. The page: the conversation (linked to its thread) and the client, each on its row.
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "activity").await?;
    for dark in [false, true] {
        b.set_dark(dark).await?;
        let theme = if dark { "dark" } else { "light" };
        for (w, h) in [DESKTOP, PHONE] {
            b.set_viewport(w, h).await?;
            b.goto("/ui/activity").await?;
            b.wait_for_page("activity").await?;
            b.wait_for("a.caller-conv").await?;
            b.wait_settled().await?;
            let v = b
                .eval(
                    "const a = document.querySelector('a.caller-conv'), c = document.querySelector('.caller-client');
                     const de = document.documentElement;
                     return { href: a.getAttribute('href'), text: a.innerText, client: c ? c.innerText : null,
                              scroll: de.scrollWidth, width: de.clientWidth };",
                    vec![],
                )
                .await?;
            let what = format!("Activity at {w}×{h} {theme}");
            ensure!(
                v["href"] == format!("/ui/chat?c={id}") && v["text"].as_str().is_some_and(|t| t.contains(TITLE)),
                "{what}: {v}"
            );
            ensure!(v["client"].as_str().is_some_and(|t| t.contains("coffer-tests 1")), "{what}: {v}");
            ensure!(v["scroll"].as_u64() <= v["width"].as_u64(), "{what}: the page scrolls sideways: {v}");
            b.screenshot(&format!("pages-activity-{w}-{theme}")).await?;
        }
    }
    b.set_dark(false).await?;
    b.set_viewport(DESKTOP.0, DESKTOP.1).await?;
    b.goto("/ui/servers").await?;
    b.wait_for_page("servers").await?;
    // Every EventSource the page opens from here is counted; Activity is reached in the page
    // (the router mounts it without a reload).
    b.eval(
        "window.__sources = []; const E = window.EventSource;
         window.EventSource = function (url, o) { window.__sources.push(String(url)); return new E(url, o); };
         window.EventSource.prototype = E.prototype;",
        vec![],
    )
    .await?;
    b.find("#nav a[href='/ui/activity']").await?.click().await?;
    b.wait_for_page("activity").await?;
    b.wait_for("a.caller-conv").await?;
    b.wait_for(".live-state .badge.ok").await?;
    // 3. Live: a new call of the agent arrives on the open page, named with the title (which the
    //    live row does not carry: the page asks for it).
    turn(&api, &id, r#"mcp:tiny__add {"a":2,"b":3}"#, 4).await?;
    b.wait_until(
        "[...document.querySelectorAll('.vtable tbody tr')].some(r => r.innerText.includes('tiny__add')
           && r.querySelector('a.caller-conv')?.innerText.includes('Fix the flaky deploy script'))",
    )
    .await?;
    // …over the tab's one multiplexed stream: no EventSource of its own.
    let sources = b.eval("return window.__sources;", vec![]).await?;
    ensure!(
        sources.as_array().is_some_and(|s| s.iter().all(|u| u.as_str().is_some_and(|u| u.contains("/v1/events?")))),
        "Activity opened a stream of its own: {sources}"
    );
    let streams: Value = api.get("/v1/events/streams").reply().await?.json()?;
    ensure!(streams["multiplexed"] == 1 && streams["subscriptions"].as_u64() >= Some(1), "{streams}");
    // The link opens the thread.
    b.find("a.caller-conv").await?.click().await?;
    b.wait_for_page("chat").await?;
    let at = b.current_url().await?;
    ensure!(at.query().is_some_and(|q| q.contains(&id)), "the link opened {at}");
    b.assert_clean().await;
    b.close().await
}

/// `command` (`coffer kb add NAME --path FOLDER`) as the CLI's argv: placeholders (words in
/// CAPITALS, `${…}` of a template) become example values.
fn argv(command: &str) -> Vec<String> {
    command
        .split_whitespace()
        .map(|w| {
            if w.contains("${") {
                "/tmp/example".to_owned()
            } else if w.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && w.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            {
                "example".to_owned()
            } else {
                w.to_owned()
            }
        })
        .collect()
}

/// Every command in the console's sources: the argument of each `cli('…')` / ``cli(`…`)`` and the
/// text of each element marked `'data-cli': ''`; fails on a `coffer …` code element not marked.
fn commands_in_sources(dir: &Path, out: &mut Vec<(String, String)>) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            commands_in_sources(&p, out)?;
            continue;
        }
        if p.extension().is_none_or(|x| x != "js") {
            continue;
        }
        let text = std::fs::read_to_string(&p)?;
        let file = p.file_name().unwrap_or_default().to_string_lossy().into_owned();
        for marker in ["cli('", "cli(`", "'data-cli': '' }, '", "'data-cli': '' }, `"] {
            let quote = marker.chars().last().unwrap_or('\'');
            let mut rest = text.as_str();
            while let Some(at) = rest.find(marker) {
                rest = &rest[at + marker.len()..];
                let end = rest.find(quote).context("an unterminated command literal")?;
                out.push((file.clone(), rest[..end].to_owned()));
            }
        }
        for (n, line) in text.lines().enumerate() {
            ensure!(
                !line.contains("h('code', null, 'coffer ") && !line.contains("h('code', null, `coffer "),
                "{file}:{}: a `coffer …` command not marked data-cli (use cli() from vault/common.js): {line}",
                n + 1
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn ui_pages_every_command_the_console_shows_parses_with_the_real_cli() -> anyhow::Result<()> {
    // The check catches the command this was found with, and takes its fix.
    ensure!(coffer_cli::check_args(argv("coffer kb add NAME PATH")).is_err(), "the old Knowledge command must fail");
    ensure!(coffer_cli::check_args(argv("coffer kb add NAME --path FOLDER")).is_ok());

    // 1. The sources: every command marked, each one parses.
    let ui = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gateway-edge/ui/js");
    let mut found = Vec::new();
    commands_in_sources(&ui, &mut found)?;
    ensure!(found.len() >= 8, "the console's commands: {found:?}");
    for (file, command) in &found {
        ensure!(command.starts_with("coffer "), "{file}: a marked command that is not `coffer …`: {command:?}");
        coffer_cli::check_args(argv(command))
            .map_err(|e| anyhow::anyhow!("{file}: `{command}` does not parse:\n{e}"))?;
    }

    // 2. The pages of a fresh home (every empty state there is) and each of their tabs: what the
    //    browser shows parses too.
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "servers").await?;
    let mut shown = Vec::new();
    for page in ["servers", "tools", "knowledge", "settings", "activity"] {
        b.goto(&format!("/ui/{page}")).await?;
        b.wait_for_page(page).await?;
        b.wait_settled().await?;
        if page == "knowledge" || page == "servers" {
            // Their empty states come once the lists have loaded.
            b.wait_for("[data-cli]").await?;
        }
        let tabs = b.count("#page .tabs button").await?;
        for t in 0..tabs.max(1) {
            // The first tab is the one the page opened on: collected as it stands.
            if t > 0 {
                b.eval("document.querySelectorAll('#page .tabs button')[arguments[0]].click();", vec![json!(t)])
                    .await?;
                b.wait_settled().await?;
            }
            let v =
                b.eval("return [...document.querySelectorAll('[data-cli]')].map(e => e.textContent);", vec![]).await?;
            for c in v.as_array().into_iter().flatten().filter_map(Value::as_str) {
                shown.push((format!("/ui/{page} tab {t}"), c.to_owned()));
            }
        }
        if page == "servers" {
            b.screenshot("pages-empty-servers-1280-light").await?;
        }
        if page == "knowledge" {
            b.goto("/ui/knowledge").await?;
            b.wait_for("[data-cli]").await?;
            b.screenshot("pages-empty-knowledge-1280-light").await?;
        }
    }
    let texts: Vec<&str> = shown.iter().map(|(_, c)| c.as_str()).collect();
    for want in ["coffer mcp import CONFIG_FILE", "coffer kb add NAME --path FOLDER"] {
        ensure!(texts.contains(&want), "the empty states show {want:?}: {shown:?}");
    }
    for (where_, command) in &shown {
        coffer_cli::check_args(argv(command))
            .map_err(|e| anyhow::anyhow!("{where_}: `{command}` does not parse:\n{e}"))?;
    }
    b.assert_clean().await;
    b.close().await
}
