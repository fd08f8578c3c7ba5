//! The web console's vault pages in a real browser (headless Chromium through
//! `coffer_tests::browser`) against a real daemon with a real upstream (`coffer-tiny-upstream`)
//! and real notes in a temporary knowledge base: one test per flow of ISSUE 16 §2–§5 (servers,
//! tools, activity, knowledge, memory, skills, settings, credentials, status), and hostile
//! strings from every source the pages render (tool names and results from an upstream, its
//! stderr, file paths, note text, a server name) staying inert. Every test ends with
//! `assert_clean()` (no console error, no request to another origin) and leaves screenshots of
//! its page at 1280 and 360 px in `target/ui-screenshots/`.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::browser::Browser;
use coffer_tests::embeddings::{FakeEmbeddings, Mode};
use coffer_tests::mcp::{McpSession, register_tiny};
use coffer_tests::{Api, SendExt, TestHome, bin, wait_for, write_file};
use serde_json::{Value, json};

/// How long a page may take to show what a step waits for.
const STEP: Duration = Duration::from_secs(20);
/// How long indexing a few hundred notes may take on a loaded machine.
const INDEXING: Duration = Duration::from_secs(90);

/// A browser signed in to the daemon of `api`, on `/ui/<page>` (`page` may carry a query:
/// `knowledge?tab=bases`).
async fn browser(api: &Api, page: &str) -> anyhow::Result<Browser> {
    let b = Browser::start().await?;
    let name = page.split('?').next().unwrap_or(page);
    b.login(api.base_url(), api.token(), name).await?;
    if name != page {
        b.goto(&format!("/ui/{page}")).await?;
        b.wait_for_page(name).await?;
    }
    Ok(b)
}

/// Runs `script` (a function body; `arguments[i]` are `args`) in the page; its return value.
async fn js(b: &Browser, script: &str, args: Vec<Value>) -> anyhow::Result<Value> {
    b.eval(script, args).await
}

/// The text of the first element matching `css` ("" when there is none).
async fn text(b: &Browser, css: &str) -> anyhow::Result<String> {
    let v = js(b, "const el = document.querySelector(arguments[0]); return el ? el.innerText : '';", vec![json!(css)])
        .await?;
    Ok(v.as_str().unwrap_or_default().to_owned())
}

/// Marks the console line Chromium writes for an error answer the test provokes on purpose
/// (`<path> - Failed to load resource: … status of <status>`) as expected: the page shows the
/// refusal itself.
fn expect_refusal(b: &Browser, path: &str, status: u16) {
    b.allow_console(&format!("{path} - Failed to load resource: the server responded with a status of {status}"));
}

/// Nothing hostile ran: no element a payload would have made, and no payload flag set.
async fn inert(b: &Browser) -> anyhow::Result<()> {
    let v = js(
        b,
        "return {pwned: window.__pwned || 0, img: document.querySelectorAll('#page img, dialog img').length,
                 script: document.querySelectorAll('#page script, dialog script').length,
                 b: document.querySelectorAll('#page b, dialog b').length,
                 onattr: [...document.querySelectorAll('#page *, dialog *')].filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length};",
        vec![],
    )
    .await?;
    ensure!(
        v == json!({"pwned": 0, "img": 0, "script": 0, "b": 0, "onattr": 0}),
        "a hostile string was not inert: {v}"
    );
    Ok(())
}

/// A payload that sets `window.__pwned` if it ever runs as HTML.
const XSS: &str = "<img src=x onerror=\"window.__pwned=1\"><script>window.__pwned=1</script>";

async fn tools_listed(api: &Api) -> anyhow::Result<Vec<String>> {
    McpSession::latest(api).await?.tool_names().await
}

// ---------------------------------------------------------------------------------------------
// Servers.

/// Add a server on the page (a secret env value goes to the credential store, not the record)
/// → test it → disable one of its tools on the server's page → the tool is gone from
/// `tools/list` through `/mcp` → its stderr tail is shown → remove it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_servers_add_test_toggle_log_remove() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let b = browser(&api, "servers").await?;
    b.wait_for_text(".vault-empty", "coffer mcp import").await?;
    b.shots("vault-servers-empty").await?;

    b.click_text(".vault-head button", "Add server").await?;
    b.wait_for("dialog[open] .server-form").await?;
    // Controls sit with their labels: a field's label right above its control, left edges
    // aligned; a checkbox its own size, its label text right beside it on the same line.
    let misplaced = b
        .eval(
            "const d = document.querySelector('dialog[open]'); const bad = [];\
             for (const w of d.querySelectorAll('.vfield')) {\
               if (!w.offsetParent) continue;\
               const l = w.querySelector(':scope > label').getBoundingClientRect();\
               const c = w.querySelector(':scope > input, :scope > textarea, :scope > select').getBoundingClientRect();\
               if (c.top - l.bottom > 12 || c.top < l.bottom - 2 || Math.abs(c.left - l.left) > 4) bad.push(w.dataset.field || w.textContent);\
             }\
             for (const c of d.querySelectorAll('input[type=checkbox]')) {\
               if (!c.offsetParent) continue;\
               const l = d.querySelector(`label[for=\"${c.id}\"]`);\
               if (!l) { bad.push('no label for a checkbox'); continue; }\
               const r = document.createRange(); r.selectNodeContents(l);\
               const t = r.getBoundingClientRect(), b = c.getBoundingClientRect();\
               const gap = t.left - b.right, dy = Math.abs((t.top + t.bottom) / 2 - (b.top + b.bottom) / 2);\
               if (b.width > 40 || gap < 0 || gap > 24 || dy > 8) bad.push(`checkbox ${l.textContent}: width ${b.width}, gap ${gap}, dy ${dy}`);\
             }\
             return bad;",
            vec![],
        )
        .await?;
    assert_eq!(misplaced, serde_json::json!([]), "controls away from their labels");
    b.fill("dialog[open] [data-field=name] input", "tiny").await?;
    b.fill("dialog[open] [data-field=command] input", &bin("coffer-tiny-upstream")?.display().to_string()).await?;
    b.click_text("dialog[open] .kv-add", "").await?;
    b.fill("dialog[open] .kv-row .kv-key", "API_TOKEN").await?;
    // A name that says TOKEN makes the value a secret by default.
    b.wait_until("document.querySelector('dialog[open] .kv-mode').value === 'secret'").await?;
    b.fill("dialog[open] .kv-row .kv-secret", "s3cret-value-77").await?;
    b.shots("vault-servers-add").await?;
    b.click_text("dialog[open] button[type=submit]", "Add server").await?;
    b.wait_until("location.search.includes('name=tiny')").await?;
    // Once the catalog has listed it, the page says what MCP clients are now offered.
    b.wait_for_text("#toasts", "tiny offers 14 tools").await?;
    b.shots("vault-servers-added").await?;

    let server = api.get("/v1/mcp/servers/tiny").reply().await?.ok_json()?;
    assert_eq!(server["env"]["API_TOKEN"], json!({"credential_ref": "tiny-API_TOKEN"}), "{server}");
    let page = js(&b, "return document.documentElement.outerHTML;", vec![]).await?;
    ensure!(!page.as_str().unwrap_or_default().contains("s3cret-value-77"), "the secret is in the DOM");

    b.click_text(".vault-head button", "Test").await?;
    b.wait_for(".probe[data-ok=true]").await?;
    let report = text(&b, ".probe").await?;
    ensure!(report.contains("Tools") && report.contains("14") && report.contains("ms"), "{report}");

    b.wait_for(".caps tr[data-key=echo] input.switch").await?;
    ensure!(tools_listed(&api).await?.contains(&"tiny__echo".to_owned()), "echo listed before");
    b.click_text(".caps tr[data-key=echo] input.switch", "").await?;
    wait_for("tiny__echo to leave tools/list", STEP, || async {
        Ok((!tools_listed(&api).await?.contains(&"tiny__echo".to_owned())).then_some(()))
    })
    .await?;
    let t = api.get("/v1/tools?server=tiny").reply().await?.ok_json()?;
    let echo = t["items"].as_array().context("items")?.iter().find(|t| t["original_name"] == "echo").cloned();
    assert_eq!(echo.context("echo")?["enabled"], false);

    // The upstream's stderr, followed live: its tail (every tools/list writes a line), then a
    // call's stderr as it is written.
    b.click_text("#log-follow", "").await?;
    b.wait_for_text(".log-card", "following").await?;
    b.wait_for_text("pre.log", "tools/list received").await?;
    let mcp = McpSession::latest(&api).await?;
    let r = mcp.tool("tiny__stderr", json!({"lines": 2})).await?;
    ensure!(r.get("result").is_some(), "{r}");
    b.wait_for_text("pre.log", "stderr line 1 yyyy").await?;
    b.shots("vault-server-detail").await?;
    b.set_dark(true).await?;
    js(&b, "document.getElementById('page').scrollTop = 0; return true;", vec![]).await?;
    b.screenshot("vault-server-detail-dark-1280").await?;
    b.set_dark(false).await?;

    b.click_text(".vault-head button", "Remove").await?;
    b.wait_for("dialog[open]").await?;
    b.click_text("dialog[open] button[type=submit]", "Remove").await?;
    b.wait_until("location.pathname === '/ui/servers' && !location.search").await?;
    b.wait_for(".vault-empty").await?;
    let list = api.get("/v1/mcp/servers").reply().await?.ok_json()?;
    assert_eq!(list["items"], json!([]));
    b.assert_clean().await;
    Ok(())
}

/// A refused registration shows the daemon's message next to the field and registers nothing;
/// a secret made for it is removed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_servers_refused_add_leaves_nothing_behind() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let b = browser(&api, "servers").await?;
    expect_refusal(&b, "/v1/mcp/servers", 400);
    b.click_text(".vault-head button", "Add server").await?;
    b.wait_for("dialog[open] .server-form").await?;
    b.fill("dialog[open] [data-field=name] input", "ghost").await?;
    b.fill("dialog[open] [data-field=command] input", "no-such-binary-anywhere-xyz").await?;
    b.click_text("dialog[open] .kv-add", "").await?;
    b.fill("dialog[open] .kv-row .kv-key", "SECRET_KEY").await?;
    b.fill("dialog[open] .kv-row .kv-secret", "v").await?;
    b.click_text("dialog[open] button[type=submit]", "Add server").await?;
    b.wait_for_text("dialog[open] [data-field=command] .field-error", "no-such-binary-anywhere-xyz").await?;
    let list = api.get("/v1/mcp/servers").reply().await?.ok_json()?;
    assert_eq!(list["items"], json!([]));
    let creds = api.get("/v1/credentials").reply().await?.ok_json()?;
    assert_eq!(creds["items"], json!([]), "the credential made for the refused server is gone");
    b.assert_clean().await;
    Ok(())
}

/// An HTTP server with a secret header (stored as a credential), edited on the page, then
/// disabled and enabled again from the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_servers_http_with_secret_header_edit_and_disable() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let b = browser(&api, "servers").await?;
    b.click_text(".vault-head button", "Add server").await?;
    b.wait_for("dialog[open] .server-form").await?;
    b.fill("dialog[open] [data-field=name] input", "remote").await?;
    b.choose("dialog[open] [data-field=transport] select", "http").await?;
    b.wait_until("document.querySelector('dialog[open] .stdio-part').hidden").await?;
    b.fill("dialog[open] [data-field=url] input", "http://127.0.0.1:9/mcp").await?;
    b.click_text("dialog[open] .http-part .kv-add", "").await?;
    b.fill("dialog[open] .http-part .kv-row .kv-key", "Authorization").await?;
    b.wait_until("document.querySelector('dialog[open] .http-part .kv-mode').value === 'secret'").await?;
    b.fill("dialog[open] .http-part .kv-row .kv-secret", "Bearer abc-123-secret").await?;
    b.click_text("dialog[open] .http-part .kv-add", "").await?;
    b.fill("dialog[open] .http-part .kv-row:nth-child(2) .kv-key", "X-Team").await?;
    b.fill("dialog[open] .http-part .kv-row:nth-child(2) .kv-text", "blue").await?;
    b.click_text("dialog[open] button[type=submit]", "Add server").await?;
    // Nothing listens at the URL: the capabilities request is refused (502) and the page says so.
    expect_refusal(&b, "/v1/mcp/servers/remote/capabilities", 502);
    b.wait_until("location.search.includes('name=remote')").await?;
    b.wait_for_text(".caps .error-box", "unreachable").await?;
    let s = api.get("/v1/mcp/servers/remote").reply().await?.ok_json()?;
    assert_eq!(s["transport"], "http");
    assert_eq!(
        s["headers"],
        json!({"Authorization": {"credential_ref": "remote-Authorization"}, "X-Team": "blue"}),
        "{s}"
    );
    b.wait_for_text("dl.facts", "credential remote-Authorization").await?;

    // Edit: a new URL; the credential reference stays as it was.
    b.click_text(".vault-head button", "Edit").await?;
    b.wait_for("dialog[open] .server-form").await?;
    b.wait_until("document.querySelector('dialog[open] .http-part .kv-ref').value === 'remote-Authorization'").await?;
    b.fill("dialog[open] [data-field=url] input", "http://127.0.0.1:9/v2/mcp").await?;
    b.click_text("dialog[open] button[type=submit]", "Save").await?;
    b.wait_for_text("dl.facts", "/v2/mcp").await?;
    let s = api.get("/v1/mcp/servers/remote").reply().await?.ok_json()?;
    assert_eq!((&s["url"], &s["version"]), (&json!("http://127.0.0.1:9/v2/mcp"), &json!(2)));
    assert_eq!(s["headers"]["Authorization"], json!({"credential_ref": "remote-Authorization"}));

    // Disable from the list, then enable again.
    b.goto("/ui/servers").await?;
    b.wait_for("tr[data-key=remote] input.switch").await?;
    b.click_text("tr[data-key=remote] input.switch", "").await?;
    wait_for("remote disabled", STEP, || async {
        let s = api.get("/v1/mcp/servers/remote").reply().await?.ok_json()?;
        Ok((s["enabled"] == false).then_some(()))
    })
    .await?;
    b.wait_for_text("tr[data-key=remote]", "disabled").await?;
    b.shots("vault-servers").await?;
    b.click_text("tr[data-key=remote] input.switch", "").await?;
    wait_for("remote enabled", STEP, || async {
        let s = api.get("/v1/mcp/servers/remote").reply().await?.ok_json()?;
        Ok((s["enabled"] == true).then_some(()))
    })
    .await?;
    b.assert_clean().await;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tools.

/// The aggregated tools with exposed and original names; the search filters; the toggle is
/// what `/mcp` clients see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_tools_search_and_toggle() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({"TINY_EXTRA_TOOLS": "3"})).await?;
    let b = browser(&api, "tools").await?;
    b.wait_for("tr[data-key=tiny__tool_2]").await?;
    let all = js(&b, "return document.querySelectorAll('tbody tr').length;", vec![]).await?;
    ensure!(all.as_u64() >= Some(16), "every tool listed: {all}");
    let row = text(&b, "tr[data-key=tiny__add]").await?;
    ensure!(
        row.contains("tiny__add") && row.contains("add") && row.contains("tiny") && row.contains("Adds two numbers"),
        "{row}"
    );

    b.fill("#tool-search", "extra tool").await?;
    b.wait_until("document.querySelectorAll('tbody tr').length === 3").await?;
    let keys = js(&b, "return [...document.querySelectorAll('tbody tr')].map(r => r.dataset.key);", vec![]).await?;
    assert_eq!(keys, json!(["tiny__tool_0", "tiny__tool_1", "tiny__tool_2"]));
    b.fill("#tool-search", "no tool is called this").await?;
    b.wait_for(".vault-empty").await?;
    b.fill("#tool-search", "tool_1").await?;
    b.wait_for("tr[data-key=tiny__tool_1]").await?;
    b.shots("vault-tools").await?;

    b.click_text("tr[data-key=tiny__tool_1] input.switch", "").await?;
    wait_for("tiny__tool_1 to leave tools/list", STEP, || async {
        Ok((!tools_listed(&api).await?.contains(&"tiny__tool_1".to_owned())).then_some(()))
    })
    .await?;
    // The switch works from the keyboard too: focused, Space turns the tool back on.
    b.wait_until("!document.querySelector('tr[data-key=tiny__tool_1] input.switch').disabled").await?;
    js(&b, "document.querySelector('tr[data-key=tiny__tool_1] input.switch').focus(); return true;", vec![]).await?;
    b.press(" ").await?;
    wait_for("tiny__tool_1 back in tools/list", STEP, || async {
        Ok(tools_listed(&api).await?.contains(&"tiny__tool_1".to_owned()).then_some(()))
    })
    .await?;
    b.assert_clean().await;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Activity.

/// An invocation appears on the activity page, live, after a `tools/call` through `/mcp`; the
/// audit log lists the registration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_activity_shows_invocations_live_and_the_audit_log() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let b = browser(&api, "activity").await?;
    b.wait_for(".live-state .badge.ok").await?;
    b.wait_for(".vault-empty").await?;
    let mcp = McpSession::latest(&api).await?;
    let r = mcp.tool("tiny__echo", json!({"message": "hello"})).await?;
    ensure!(r.get("result").is_some(), "{r}");
    b.wait_for_text("tbody tr", "tiny__echo").await?;
    let row = text(&b, "tbody tr").await?;
    ensure!(row.contains("tiny") && row.contains("ok"), "{row}");
    // The Caller column names the MCP client (McpSession's clientInfo: coffer-tests 1).
    let caller = js(&b, "const c = document.querySelector('tbody tr .caller'); return c ? c.textContent : document.querySelector('tbody tr').outerHTML;", vec![]).await?;
    ensure!(caller.as_str().is_some_and(|c| c.contains("coffer-tests 1")), "the caller: {caller}");
    let failed = mcp.tool("tiny__fail", json!({})).await?;
    ensure!(failed.get("result").is_some(), "{failed}");
    b.wait_for_text("tbody tr", "tiny__fail").await?;
    b.shots("vault-activity").await?;

    // Filtered to one outcome: only those.
    b.choose("#inv-outcome", "ok").await?;
    b.wait_until("[...document.querySelectorAll('tbody tr')].length > 0 && [...document.querySelectorAll('tbody tr')].every(r => r.innerText.includes('tiny__echo'))").await?;

    // Older calls page in: 60 more than one page holds.
    for i in 0..60 {
        let r = api
            .post_json("/v1/tools/call", &json!({"name": "tiny__add", "arguments": {"a": i, "b": 1}}))
            .reply()
            .await?;
        ensure!(r.status == 200, "{} {}", r.status, r.text);
    }
    b.choose("#inv-outcome", "").await?;
    b.wait_until("document.querySelectorAll('tbody tr').length >= 50").await?;
    b.goto("/ui/activity").await?;
    b.wait_for_text(".more button", "Load older").await?;
    let first = js(&b, "return document.querySelectorAll('tbody tr').length;", vec![]).await?;
    assert_eq!(first, 50, "one page");
    b.click_text(".more button", "Load older").await?;
    b.wait_until("document.querySelectorAll('tbody tr').length === 62").await?;
    ensure!(text(&b, ".more").await?.is_empty(), "no more pages");

    b.click_text(".tabs button", "Audit log").await?;
    b.wait_for_text("tbody tr", "server.create").await?;
    b.shots("vault-audit").await?;
    b.assert_clean().await;
    Ok(())
}

/// A `coffer__ask` run's LLM usage and the MCP client that made the call show on its activity
/// row (live, from the SSE feed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_activity_shows_an_ask_run_s_llm_usage() -> anyhow::Result<()> {
    use coffer_tests::fake_llm::{FakeLlm, INPUT_TOKENS, OUTPUT_TOKENS, Reply};
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let fake = FakeLlm::start(coffer_llm::Wire::Anthropic).await?;
    fake.set_default(Reply::text("Your notes say nothing about it yet."));
    let body = json!({"name": "local", "wire": "anthropic", "base_url": fake.url, "model": "fake-model", "internal_default": true});
    let r = api.post_json("/v1/llm/connections", &body).reply().await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    let b = browser(&api, "activity").await?;
    b.wait_for(".live-state .badge.ok").await?;
    let mcp = McpSession::latest(&api).await?;
    let r = mcp.tool("coffer__ask", json!({"question": "what about the garden?"})).await?;
    ensure!(r["result"]["isError"] != true && r.get("result").is_some(), "{r}");
    b.wait_for_text("tbody tr", "coffer__ask").await?;
    let row = text(&b, "tbody tr").await?;
    let usage = format!("{INPUT_TOKENS} in / {OUTPUT_TOKENS} out tokens · 1 req");
    ensure!(row.contains("local/fake-model") && row.contains(&usage), "{row}");
    // The MCP client that made the call, by its clientInfo (McpSession's: coffer-tests 1).
    ensure!(row.contains("coffer-tests 1"), "the Client column: {row}");
    b.shots("vault-activity-usage").await?;
    b.assert_clean().await;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Knowledge, memory, skills.

/// Add a KB of notes on the page, reindex it with a live progress bar, search: each result
/// shows its KB, path, heading, snippet and the engines that found it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_knowledge_add_reindex_and_search() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    for i in 0..300 {
        write_file(
            &dir.join(format!("n{i:03}.md")),
            format!("# Note {i}\n\n## Filler\n\n{}\n", "lorem ipsum dolor ".repeat(200)),
        )?;
    }
    write_file(
        &dir.join("ops/deploy.md"),
        "# Operations\n\n## Deploying\n\nThe staging deploy uses the flamingo key.\n",
    )?;
    let api = home.start_daemon().await?;
    let b = browser(&api, "knowledge?tab=bases").await?;
    b.wait_for("tr[data-key=memory]").await?;
    // Record every state of the progress bar the page shows.
    js(&b, "window.__bars = []; new MutationObserver(() => { const p = document.querySelector('tr[data-key=notes] progress'); if (p) window.__bars.push([p.value, p.max]); }).observe(document.getElementById('page'), {subtree: true, childList: true, attributes: true}); return true;", vec![]).await?;
    b.click_text("button", "Add knowledge base").await?;
    b.wait_for("dialog[open]").await?;
    b.fill("dialog[open] [data-field=name] input", "notes").await?;
    b.fill("dialog[open] [data-field=path] input", &dir.display().to_string()).await?;
    b.click_text("dialog[open] button[type=submit]", "Add").await?;
    b.wait_until_within("(() => { const r = document.querySelector('tr[data-key=notes]'); return r && r.querySelector('.kb-progress[data-state=idle]') && r.innerText.includes('301 ('); })()", INDEXING).await?;
    let bars = js(&b, "return window.__bars;", vec![]).await?;
    ensure!(bars.as_array().is_some_and(|b| !b.is_empty()), "a progress bar was shown while indexing: {bars}");

    js(&b, "window.__bars = []; return true;", vec![]).await?;
    b.click_text("tr[data-key=notes] button.reindex", "Reindex").await?;
    // The bar may come and go between two polls of the driver (a pass over unchanged files is
    // quick): the page's own observer records it, and the pass is over once the row is idle
    // again after the bar was seen.
    b.wait_until_within(
        "window.__bars.length > 0 && !!document.querySelector('tr[data-key=notes] .kb-progress[data-state=idle]')",
        INDEXING,
    )
    .await?;
    b.shots("vault-knowledge-reindex").await?;
    let row = text(&b, "tr[data-key=notes]").await?;
    ensure!(row.contains("301") && row.contains("up to date"), "{row}");

    b.click_text(".tabs button", "Search").await?;
    b.fill("#kb-query", "flamingo").await?;
    b.click_text("form.search-form button[type=submit]", "Search").await?;
    b.wait_for(".results li.result").await?;
    let first = text(&b, ".results li.result").await?;
    ensure!(first.contains("notes"), "KB: {first}");
    ensure!(first.contains("ops/deploy.md"), "path: {first}");
    ensure!(first.contains("Operations › Deploying"), "heading: {first}");
    ensure!(first.contains("flamingo"), "snippet: {first}");
    b.wait_for_text(".results li.result .snippet mark", "flamingo").await?;
    ensure!(first.contains("keyword #1"), "engines: {first}");
    let engines = text(&b, ".engines").await?;
    ensure!(engines.contains("keyword: ") && engines.contains("vector"), "{engines}");
    b.shots("vault-knowledge-search").await?;

    // With embeddings (a fake OpenAI-compatible endpoint) the vector engine finds it too; when
    // the endpoint then fails, the page names the engine and why, and the others' results
    // still show.
    let fake = FakeEmbeddings::start(32, None).await?;
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"retrieval.embeddings.url": fake.url, "retrieval.embeddings.model": "fake-bow", "retrieval.embeddings.dimensions": "32"}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    wait_for("every chunk embedded", Duration::from_secs(60), || async {
        let v = api.get("/v1/knowledge/notes").reply().await?.ok_json()?;
        Ok((v["chunks"].as_u64() > Some(0) && v["embedded"] == v["chunks"]).then_some(()))
    })
    .await?;
    b.click_text("form.search-form button[type=submit]", "Search").await?;
    b.wait_for(".engines [data-engine=vector][data-state=ok]").await?;
    b.wait_for_text(".results li.result", "vector #").await?;
    fake.set_mode(Mode::Http500);
    b.click_text("form.search-form button[type=submit]", "Search").await?;
    b.wait_for(".engine-failed[data-engine=vector]").await?;
    let warning = text(&b, ".engine-failed[data-engine=vector]").await?;
    ensure!(warning.contains("vector engine failed") && warning.contains("HTTP 500"), "{warning}");
    ensure!(text(&b, ".results li.result").await?.contains("ops/deploy.md"), "keyword results still shown");
    b.shots("vault-knowledge-engine-failed").await?;

    // Remove it: the KB is gone, the files stay.
    b.click_text(".tabs button", "Knowledge bases").await?;
    b.click_text("tr[data-key=notes] button.danger", "Remove").await?;
    b.wait_for("dialog[open]").await?;
    b.click_text("dialog[open] button[type=submit]", "Remove").await?;
    b.wait_until("document.querySelector('tr[data-key=memory]') && !document.querySelector('tr[data-key=notes]')")
        .await?;
    api.get("/v1/knowledge/notes").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    ensure!(dir.join("ops/deploy.md").exists(), "no file is deleted");
    b.assert_clean().await;
    Ok(())
}

/// Remember a fact, recall it, forget it — all on the page; the files follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_memory_remember_recall_forget() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let b = browser(&api, "knowledge?tab=memory").await?;
    b.wait_for_text(".vault-empty", "Nothing remembered yet").await?;
    b.fill("form.remember textarea", "The staging database listens on port 5433").await?;
    b.fill("form.remember input", "work, db").await?;
    b.click_text("form.remember button[type=submit]", "Remember").await?;
    b.wait_for_text(".fact-text", "port 5433").await?;
    let facts = api.get("/v1/memory").reply().await?.ok_json()?;
    let fact = facts["items"][0].clone();
    assert_eq!(fact["tags"], json!(["work", "db"]));
    assert_eq!(fact["source"], "ui");

    // The same again is not saved twice.
    b.fill("form.remember textarea", "The staging database listens on port 5433").await?;
    b.click_text("form.remember button[type=submit]", "Remember").await?;
    b.wait_for_text("form.remember", "Already remembered").await?;

    b.fill("#recall-query", "staging database port").await?;
    b.click_text("form.search-form button[type=submit]", "Recall").await?;
    b.wait_for_text(".results li.result", "5433").await?;
    b.shots("vault-memory").await?;
    b.click_text(".results li.result button.danger", "Forget").await?;
    b.wait_for("dialog[open]").await?;
    b.click_text("dialog[open] button[type=submit]", "Forget").await?;
    b.wait_for_text(".vault-empty", "Nothing remembered yet").await?;
    let facts = api.get("/v1/memory").reply().await?.ok_json()?;
    assert_eq!(facts["items"], json!([]));
    let path = fact["path"].as_str().context("path")?;
    ensure!(!std::path::Path::new(path).exists(), "{path} was removed");
    b.assert_clean().await;
    Ok(())
}

/// The skills list and one skill's text; a malformed one is named, not listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_skills_list_and_view() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    write_file(
        &home.root().join("skills/deploy/SKILL.md"),
        format!(
            "---\nname: deploy\ndescription: How to deploy the app\n---\n# Deploy\n\n1. Run `make deploy`\n2. {XSS}\n3. [docs](javascript:window.__pwned=1)\n"
        ),
    )?;
    write_file(&home.root().join("skills/deploy/checklist.md"), "- [ ] tests\n")?;
    write_file(&home.root().join("skills/broken/SKILL.md"), "no front matter here\n")?;
    let api = home.start_daemon().await?;
    let b = browser(&api, "knowledge?tab=skills").await?;
    b.wait_for("button.skill[data-name=deploy]").await?;
    b.wait_for_text(".skills-list .warn-box", "broken").await?;
    let list = text(&b, ".skills-list").await?;
    ensure!(list.contains("How to deploy the app") && list.contains("no front matter"), "{list}");
    b.click_text("button.skill[data-name=deploy]", "").await?;
    // Rendered as markdown: a heading, a numbered list, code; its raw HTML stays text and its
    // `javascript:` link goes nowhere.
    b.wait_for_text(".skill-body code", "make deploy").await?;
    let shape = js(
        &b,
        "const m = document.querySelector('.skill-body'); return [m.querySelector('h1')?.textContent, m.querySelectorAll('ol > li').length,
          [...m.querySelectorAll('a')].filter(a => /^javascript:/i.test(a.getAttribute('href') || '')).length];",
        vec![],
    )
    .await?;
    assert_eq!(shape, json!(["Deploy", 3, 0]));
    let body = text(&b, ".skill-body").await?;
    ensure!(body.contains("<script>"), "the skill's raw HTML is shown as text: {body}");
    // The skill's other files, listed under a collapsed "1 more file".
    let more = js(&b, "return document.querySelector('article.skill').textContent;", vec![]).await?;
    ensure!(more.as_str().is_some_and(|m| m.contains("1 more file") && m.contains("checklist.md")), "{more}");
    inert(&b).await?;
    b.shots("vault-skills").await?;
    b.assert_clean().await;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Settings, credentials, status, backup.

/// A bad value shows the daemon's message next to the field and changes nothing; a good one is
/// saved; "Use default" removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_settings_bad_value_shows_the_daemons_message() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let before = api.get("/v1/settings").reply().await?.ok_json()?;
    let b = browser(&api, "settings").await?;
    expect_refusal(&b, "/v1/settings", 400);
    let row = "form.setting[data-key='gateway.call_timeout_ms']";
    b.wait_for(row).await?;
    ensure!(text(&b, row).await?.contains("60000"), "the default is shown");
    b.fill(&format!("{row} input"), "soon").await?;
    b.click_text(&format!("{row} button[type=submit]"), "Save").await?;
    b.wait_for_text(&format!("{row} .field-error"), "must be an integer from 1 to 86400000").await?;
    b.shots("vault-settings-refused").await?;
    assert_eq!(api.get("/v1/settings").reply().await?.ok_json()?, before, "nothing changed");

    b.fill(&format!("{row} input"), "45000").await?;
    b.click_text(&format!("{row} button[type=submit]"), "Save").await?;
    b.wait_for_text(&format!("{row} .setting-badge"), "set").await?;
    ensure!(text(&b, &format!("{row} .field-error")).await?.is_empty(), "the old message is gone");
    let now = api.get("/v1/settings").reply().await?.ok_json()?;
    assert_eq!(now["values"]["gateway.call_timeout_ms"], "45000");
    b.click_text(&format!("{row} button"), "Use default").await?;
    b.wait_for_text(&format!("{row} .setting-badge"), "default").await?;
    assert_eq!(api.get("/v1/settings").reply().await?.ok_json()?, before);
    b.assert_clean().await;
    Ok(())
}

/// Set and delete a credential: the list shows names only and the value is never in the DOM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_credentials_set_and_delete_never_show_the_value() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let b = browser(&api, "settings?tab=credentials").await?;
    b.wait_for(".vault-empty").await?;
    const VALUE: &str = "sk-live-0123456789-do-not-show";
    b.click_text("button", "Add credential").await?;
    b.wait_for("dialog[open]").await?;
    b.fill("dialog[open] [data-field=name] input", "github").await?;
    b.fill("dialog[open] [data-field=value] input", VALUE).await?;
    ensure!(
        js(&b, "return document.querySelector('dialog[open] [data-field=value] input').type;", vec![]).await?
            == "password"
    );
    b.click_text("dialog[open] button[type=submit]", "Add").await?;
    b.wait_for("tr[data-key=github]").await?;
    let everything = js(
        &b,
        "return document.documentElement.outerHTML + [...document.querySelectorAll('input, textarea')].map(i => i.value).join('|');",
        vec![],
    )
    .await?;
    ensure!(!everything.as_str().unwrap_or_default().contains(VALUE), "the value is in the page");
    assert_eq!(api.get("/v1/credentials/github").reply().await?.ok_json()?["version"], 1);
    b.shots("vault-credentials").await?;

    b.click_text("tr[data-key=github] button", "Replace value").await?;
    b.wait_for("dialog[open]").await?;
    b.fill("dialog[open] [data-field=value] input", "another-value").await?;
    b.click_text("dialog[open] button[type=submit]", "Replace").await?;
    b.wait_until("!document.querySelector('dialog[open]')").await?;
    wait_for("version 2", STEP, || async {
        let v = api.get("/v1/credentials/github").reply().await?.ok_json()?;
        Ok((v["version"] == 2).then_some(()))
    })
    .await?;

    b.click_text("tr[data-key=github] button", "Delete").await?;
    b.wait_for("dialog[open]").await?;
    b.click_text("dialog[open] button[type=submit]", "Delete").await?;
    b.wait_for(".vault-empty").await?;
    let r = api.get("/v1/credentials/github").reply().await?;
    assert_eq!(r.status, 404);
    let logs = ["gateway", "store"].map(|s| home.log_text(s)).join("\n");
    ensure!(!logs.contains(VALUE) && !logs.contains("another-value"), "a value reached a log");
    b.assert_clean().await;
    Ok(())
}

/// Services and upstreams status; restarting a service; a backup with its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_status_restart_and_backup() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let b = browser(&api, "settings?tab=status").await?;
    for s in ["store", "retrieval", "chat", "gateway"] {
        b.wait_for_text(&format!("tr[data-key={s}]"), "healthy").await?;
    }
    b.wait_for("tr[data-key=tiny]").await?;
    b.shots("vault-status").await?;
    let before = api.status().await?;
    let pid = |v: &Value| {
        v["services"].as_array().and_then(|s| s.iter().find(|x| x["name"] == "retrieval")).map(|x| x["pid"].clone())
    };
    b.click_text("tr[data-key=retrieval] button", "Restart").await?;
    b.wait_for("dialog[open]").await?;
    b.click_text("dialog[open] button[type=submit]", "Restart").await?;
    wait_for("retrieval restarted", STEP, || async {
        let s = api.status().await?;
        Ok((pid(&s) != pid(&before)).then_some(()))
    })
    .await?;
    b.wait_until("(() => { const r = document.querySelector('tr[data-key=retrieval]'); return r && r.innerText.includes('healthy') && r.innerText.includes('1'); })()").await?;

    expect_refusal(&b, "/v1/backup", 400);
    b.click_text(".tabs button", "Backup").await?;
    b.wait_for("form.backup-form").await?;
    b.fill("form.backup-form input", "not/absolute").await?;
    b.click_text("form.backup-form button[type=submit]", "Back up now").await?;
    b.wait_for_text("form.backup-form .field-error", "absolute").await?;
    let target = home.temp().join("backup-1");
    b.fill("form.backup-form input", &target.display().to_string()).await?;
    b.click_text("form.backup-form button[type=submit]", "Back up now").await?;
    b.wait_for_text(".backup-result", "Backup written").await?;
    let result = text(&b, ".backup-result").await?;
    ensure!(result.contains(&target.display().to_string()) && result.contains("included"), "{result}");
    ensure!(target.join("manifest.json").exists(), "the backup is on disk");
    b.shots("vault-backup").await?;
    b.assert_clean().await;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Hostile strings.

/// Hostile tool names and results from an upstream, its stderr, file paths and note text, and a
/// hostile server name typed into the form: all shown as text, none run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_vault_hostile_strings_are_rendered_inert() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("evil");
    write_file(
        &dir.join(format!("{XSS}.md").replace('/', "_")),
        format!("# {XSS}\n\n## <b>bold</b> heading\n\nThe hostile pangolin says {XSS}\n"),
    )?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "evil", json!({"TINY_REPEAT_TOOL": XSS, "TINY_ECHO_ENV": XSS})).await?;
    let r = api.post_json("/v1/knowledge", &json!({"name": "evil", "path": dir.display().to_string()})).reply().await?;
    ensure!(r.status == 201, "{}", r.text);
    // Upstream stderr with the payload in it.
    let mcp = McpSession::latest(&api).await?;
    mcp.tool("evil__stderr_env", json!({})).await?;

    // Tool names (original and exposed) on the tools page; the result of a call.
    let b = browser(&api, "tools").await?;
    b.wait_for("tr[data-key=evil__echo]").await?;
    b.wait_until("[...document.querySelectorAll('tbody code')].some(c => c.textContent.includes('<img'))").await?;
    inert(&b).await?;
    b.click_text("tr[data-key=evil__echo] button", "Try").await?;
    b.wait_for("dialog[open] textarea").await?;
    b.fill("dialog[open] textarea", &json!({"message": XSS}).to_string()).await?;
    b.click_text("dialog[open] button[type=submit]", "Call").await?;
    b.wait_for_text("dialog[open] .result-block", "<script>").await?;
    inert(&b).await?;
    js(&b, "document.querySelector('dialog[open]').close(); return true;", vec![]).await?;

    // The server's page: capabilities and the stderr tail.
    b.goto(&api.url("/ui/servers?name=evil")).await?;
    b.wait_until("[...document.querySelectorAll('.caps code')].some(c => c.textContent.includes('<img'))").await?;
    b.wait_for_text("pre.log", "onerror").await?;
    inert(&b).await?;

    // A hostile server name: the daemon's refusal quotes it, as text.
    expect_refusal(&b, "/v1/mcp/servers", 400);
    b.goto(&api.url("/ui/servers")).await?;
    b.click_text(".vault-head button", "Add server").await?;
    b.wait_for("dialog[open] .server-form").await?;
    b.fill("dialog[open] [data-field=name] input", XSS).await?;
    b.fill("dialog[open] [data-field=command] input", &bin("coffer-tiny-upstream")?.display().to_string()).await?;
    b.click_text("dialog[open] button[type=submit]", "Add server").await?;
    b.wait_until(
        "!!document.querySelector('dialog[open] .field-error:not(:empty), dialog[open] .dialog-error:not(:empty)')",
    )
    .await?;
    inert(&b).await?;
    js(&b, "document.querySelector('dialog[open]').close(); return true;", vec![]).await?;

    // File paths and note text in search results.
    wait_for("the hostile note indexed", STEP, || async {
        let v = api.get("/v1/knowledge/evil").reply().await?.ok_json()?;
        Ok((v["documents"] == 1 && v["progress"]["state"] == "idle").then_some(()))
    })
    .await?;
    b.goto(&api.url("/ui/knowledge?q=pangolin")).await?;
    b.wait_for(".results li.result").await?;
    let card = text(&b, ".results li.result").await?;
    ensure!(card.contains("<img") && card.contains(".md"), "the path and text are shown as text: {card}");
    inert(&b).await?;
    b.shots("vault-hostile-search").await?;
    b.assert_clean().await;
    Ok(())
}
