//! Settings → Profiles in a real browser (headless Chromium through `coffer_tests::browser`)
//! against a real daemon: `default` listed from the start, create a profile with selections
//! and lazy mode, a bad glob refused next to its field (nothing written), edit, the overrides
//! card (add an override with a new name, an appended description, a hidden parameter and an
//! annotation; a bad new name refused next to its field), a hostile description staying inert,
//! remove with a confirmation, `default` without a Remove button. The Tools page edits a
//! tool's override in a chosen profile (what a client of that profile then lists and calls; a
//! concurrent change refused with a message, nothing lost) and Settings → Status shows who is
//! connected with which profile. Ends with `assert_clean()`; screenshots at 1280, 390 and 360
//! px, light and dark, in `target/ui-screenshots/`.
use anyhow::{Context, ensure};
use coffer_tests::browser::Browser;
use coffer_tests::mcp::{register_tiny, wait_listed};
use coffer_tests::{Api, SendExt, TestHome};
use serde_json::{Value, json};

/// A payload that sets `window.__pwned` if it ever runs as HTML.
const XSS: &str = "<img src=x onerror=\"window.__pwned=1\"><b>bold</b>";

async fn profile(api: &Api, name: &str) -> anyhow::Result<Value> {
    api.get(&format!("/v1/mcp/profiles/{name}")).reply().await?.ok_json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_profiles_create_edit_override_remove() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "settings").await?;
    b.goto("/ui/settings?tab=profiles").await?;
    b.wait_for_page("settings").await?;
    b.wait_for("tr[data-key=default]").await?;
    ensure!(b.count("tr[data-key=default] button.danger").await? == 0, "default offers Remove");

    // A bad glob is refused next to its field; nothing is written.
    b.allow_console("/v1/mcp/profiles - Failed to load resource: the server responded with a status of 400");
    b.click_text("button", "New profile").await?;
    b.wait_for("dialog[open] .profile-form").await?;
    b.fill("dialog[open] [data-field=name] input", "work").await?;
    b.fill("dialog[open] [data-field='servers.include'] textarea", "git\ntime[").await?;
    b.click_text("dialog[open] button[type=submit]", "Create").await?;
    b.wait_for_text("dialog[open] [data-field='servers.include'] .field-error", "is not a glob").await?;
    api.get("/v1/mcp/profiles/work").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    // Fixed in place: created with its selections and lazy mode.
    b.fill("dialog[open] [data-field='servers.include'] textarea", "git\ntime*").await?;
    b.fill("dialog[open] [data-field='tools.exclude'] textarea", "git__git_push").await?;
    b.fill("dialog[open] [data-field=description] input", "Work tools").await?;
    b.choose("dialog[open] [data-field=mode] select", "lazy").await?;
    b.shots("profiles-create").await?;
    b.click_text("dialog[open] button[type=submit]", "Create").await?;
    b.wait_for("tr[data-key=work] [data-mode=lazy]").await?;
    b.wait_gone("dialog[open]").await?;
    let p = profile(&api, "work").await?;
    assert_eq!(
        (p["servers"].clone(), p["tools"].clone(), p["mode"].as_str(), p["description"].as_str()),
        (json!({"include": ["git", "time*"]}), json!({"exclude": ["git__git_push"]}), Some("lazy"), Some("Work tools")),
        "{p}"
    );

    // Edit: back to full mode.
    b.click_text("tr[data-key=work] button", "Edit").await?;
    b.wait_for("dialog[open] .profile-form").await?;
    b.choose("dialog[open] [data-field=mode] select", "full").await?;
    b.click_text("dialog[open] button[type=submit]", "Save").await?;
    b.wait_for("tr[data-key=work] [data-mode=full]").await?;
    assert_eq!(profile(&api, "work").await?["version"], 2);

    // Overrides: a bad new name is refused next to its field, then saved fixed.
    b.allow_console("/v1/mcp/profiles/work - Failed to load resource: the server responded with a status of 400");
    b.click_text("tr[data-key=work] button", "Overrides").await?;
    b.wait_for_text(".profile-overrides", "No override").await?;
    b.click_text(".profile-overrides button", "Add override").await?;
    b.wait_for("dialog[open] .profile-form").await?;
    b.fill("dialog[open] [data-field=tool] input", "time__get_current_time").await?;
    b.fill("dialog[open] [data-field=name] input", "what time").await?;
    b.click_text("dialog[open] button[type=submit]", "Save").await?;
    b.wait_for_text("dialog[open] [data-field=name] .field-error", "must match").await?;
    b.fill("dialog[open] [data-field=name] input", "now").await?;
    b.fill("dialog[open] [data-field=description_append] textarea", "Use it for any clock question.").await?;
    b.fill("dialog[open] [data-field=hide_params] input", "timezone").await?;
    b.choose("dialog[open] [data-field=read_only] select", "true").await?;
    b.shots("profiles-override").await?;
    b.click_text("dialog[open] button[type=submit]", "Save").await?;
    b.wait_gone("dialog[open]").await?;
    b.wait_for_text(".profile-overrides tr[data-key=time__get_current_time]", "now").await?;
    let o = profile(&api, "work").await?["overrides"]["time__get_current_time"].clone();
    assert_eq!(
        o,
        json!({"name": "now", "description_append": "Use it for any clock question.", "hide_params": ["timezone"], "annotations": {"read_only": true}}),
        "{o}"
    );

    // A hostile description (written over REST) is shown as text.
    let r = api
        .request(reqwest::Method::PUT, "/v1/mcp/profiles/default")
        .json(&json!({"description": XSS, "overrides": {"git__git_log": {"description": XSS}}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{}", r.text);
    b.refresh().await?;
    b.wait_for("tr[data-key=default]").await?;
    b.click_text("tr[data-key=default] button", "Overrides").await?;
    b.wait_for(".profile-overrides tr[data-key=git__git_log]").await?;
    let v = b.eval("return {pwned: window.__pwned || 0, img: document.querySelectorAll('#page img').length, b: document.querySelectorAll('#page b').length};", vec![]).await?;
    assert_eq!(v, json!({"pwned": 0, "img": 0, "b": 0}), "the description was not inert");
    b.click_text(".profile-overrides button", "Close").await?;
    b.click_text("tr[data-key=work] button", "Overrides").await?;
    b.wait_for(".profile-overrides tr[data-key=time__get_current_time]").await?;
    b.shots("profiles-list").await?;
    for dark in [false, true] {
        b.set_dark(dark).await?;
        b.set_viewport(390, 844).await?;
        b.screenshot(&format!("profiles-list-390-{}", if dark { "dark" } else { "light" })).await?;
        let w = b.eval("return [document.documentElement.scrollWidth, window.innerWidth];", vec![]).await?;
        ensure!(w[0].as_u64() <= w[1].as_u64(), "overflows sideways at 390 px: {w}");
        b.set_viewport(1280, 800).await?;
        b.screenshot(&format!("profiles-list-1280-{}", if dark { "dark" } else { "light" })).await?;
    }
    b.set_dark(false).await?;

    // Remove with a confirmation.
    b.click_text("tr[data-key=work] button", "Remove").await?;
    b.wait_for_text("dialog[open]", "Remove work?").await?;
    b.click_text("dialog[open] button[type=submit]", "Remove").await?;
    b.wait_gone("tr[data-key=work]").await?;
    api.get("/v1/mcp/profiles/work").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    let audit = api.get("/v1/audit?actor=ui&limit=50").reply().await?.ok_json()?;
    let actions: Vec<&str> =
        audit["items"].as_array().context("items")?.iter().filter_map(|e| e["action"].as_str()).collect();
    ensure!(
        actions.contains(&"profile.create") && actions.contains(&"profile.delete"),
        "the console is the actor: {actions:?}"
    );
    b.assert_clean().await;
    b.close().await?;
    Ok(())
}

/// One JSON-RPC request over `/mcp` (session `session`, none for `initialize`) with `headers`;
/// the answer's session id (from `initialize`) and body.
async fn mcp(
    api: &Api,
    session: Option<&str>,
    headers: &[(&str, &str)],
    body: Value,
) -> anyhow::Result<(Option<String>, Value)> {
    let mut req = api
        .post("/mcp")
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2025-11-25")
        .json(&body);
    if let Some(s) = session {
        req = req.header("Mcp-Session-Id", s);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await?;
    let id = r.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let text = r.text().await?;
    Ok((id, serde_json::from_str(&text).with_context(|| format!("a JSON answer: {text}"))?))
}

/// An MCP session of client `client` naming profile `profile` (`Coffer-Profile`); its id.
async fn connect(api: &Api, client: &str, profile: &str) -> anyhow::Result<String> {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": client, "version": "4.2"}}});
    let (id, v) = mcp(api, None, &[("Coffer-Profile", profile)], init).await?;
    let id = id.with_context(|| format!("initialize: {v}"))?;
    mcp(api, Some(&id), &[], json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await.ok();
    Ok(id)
}

/// `tools/list` of session `id`: name → tool.
async fn listed(api: &Api, id: &str) -> anyhow::Result<std::collections::BTreeMap<String, Value>> {
    let (_, v) = mcp(api, Some(id), &[], json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})).await?;
    let tools = v["result"]["tools"].as_array().with_context(|| format!("tools/list: {v}"))?;
    Ok(tools.iter().map(|t| (t["name"].as_str().unwrap_or_default().to_owned(), t.clone())).collect())
}

/// The Tools page (issue 36 §3, "The console's Tools page edits them"): in a chosen profile each
/// tool shows its override (its own, or `default`'s inherited), "Override" edits it through
/// `PUT /v1/mcp/profiles/{name}` at the version read, and what it saves is what that profile's
/// MCP client lists and calls (both ways); a change made elsewhere meanwhile is refused with a
/// message and kept, and saving again writes over the profile as it now is. Settings → Status
/// shows each connected client with its profile (a hostile client name stays text).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_profiles_tools_page_edits_overrides_and_status_shows_clients() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    wait_listed(&api, "tiny").await?;
    let r =
        api.post_json("/v1/mcp/profiles", &json!({"name": "work", "servers": {"include": ["tiny"]}})).reply().await?;
    ensure!(r.status == 201, "{}", r.text);
    // default's override applies in every profile: shown in work as inherited.
    let r = api
        .request(reqwest::Method::PUT, "/v1/mcp/profiles/default")
        .json(&json!({"overrides": {"tiny__echo": {"description_append": "Say it twice."}}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{}", r.text);
    let work = connect(&api, "work-client", "work").await?;
    let _hostile = connect(&api, XSS, "default").await?;

    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "tools").await?;
    b.goto("/ui/tools?profile=work").await?;
    b.wait_for_page("tools").await?;
    b.wait_for("tr[data-key=tiny__add]").await?;
    b.wait_until("document.getElementById('tool-profile').value === 'work'").await?;
    b.wait_for("tr[data-key=tiny__echo] [data-override=inherited]").await?;
    ensure!(b.count("tr[data-key=tiny__add] .tool-override").await? == 0, "add is not overridden yet");

    // Override add in work: a new name, an appended description, a hidden parameter, read-only.
    b.click_text("tr[data-key=tiny__add] button", "Override").await?;
    b.wait_for_text("dialog[open] h2", "tiny__add in work").await?;
    b.fill("dialog[open] [data-field=name] input", "sum").await?;
    b.fill("dialog[open] [data-field=description_append] textarea", "Only a is needed.").await?;
    b.fill("dialog[open] [data-field=hide_params] input", "b").await?;
    b.choose("dialog[open] [data-field=read_only] select", "true").await?;
    b.shots("tools-override-dialog").await?;
    b.click_text("dialog[open] button[type=submit]", "Save").await?;
    b.wait_gone("dialog[open]").await?;
    b.wait_for_text("tr[data-key=tiny__add] [data-override=own] .shown-as", "sum").await?;
    let p = profile(&api, "work").await?;
    assert_eq!(
        p["overrides"],
        json!({"tiny__add": {"name": "sum", "description_append": "Only a is needed.", "hide_params": ["b"], "annotations": {"read_only": true}}}),
        "{p}"
    );
    // Both ways for work's client: listed as sum (b hidden, described, read-only), called as sum.
    let tools = listed(&api, &work).await?;
    let sum = tools.get("sum").with_context(|| format!("sum listed: {:?}", tools.keys()))?;
    ensure!(!tools.contains_key("tiny__add"), "the old name is gone: {:?}", tools.keys());
    ensure!(sum["inputSchema"]["properties"].get("b").is_none(), "b hidden: {sum}");
    ensure!(sum["description"].as_str().is_some_and(|d| d.ends_with("Only a is needed.")), "{sum}");
    ensure!(sum["annotations"]["readOnlyHint"] == true, "{sum}");
    let (_, v) = mcp(
        &api,
        Some(&work),
        &[],
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "sum", "arguments": {"a": 2}}}),
    )
    .await?;
    ensure!(v["result"]["content"][0]["text"] == "2", "sum called through the override: {v}");

    // Only overridden: add (work's own) and echo (default's).
    b.click_text("label[for=tool-overridden]", "").await?;
    b.wait_until("document.querySelectorAll('tbody tr').length === 2").await?;
    let keys = b.eval("return [...document.querySelectorAll('tbody tr')].map(r => r.dataset.key);", vec![]).await?;
    assert_eq!(keys, json!(["tiny__echo", "tiny__add"]), "in the upstream's order");
    b.shots("tools-overridden").await?;
    for dark in [false, true] {
        b.set_dark(dark).await?;
        b.set_viewport(390, 844).await?;
        b.screenshot(&format!("tools-overridden-390-{}", if dark { "dark" } else { "light" })).await?;
        ensure!(b.horizontal_overflow().await? <= 0, "the tools page overflows sideways at 390 px");
        b.set_viewport(1280, 800).await?;
    }
    b.set_dark(false).await?;

    // A change made elsewhere while the dialog is open: refused with a message, nothing lost.
    b.click_text("tr[data-key=tiny__add] button", "Edit override").await?;
    b.wait_for("dialog[open] [data-field=name] input").await?;
    let mut spec = profile(&api, "work").await?;
    for k in ["name", "version", "updated_at"] {
        spec.as_object_mut().context("a profile")?.remove(k);
    }
    spec["description"] = json!("changed in a terminal");
    let r = api.request(reqwest::Method::PUT, "/v1/mcp/profiles/work").json(&spec).reply().await?;
    ensure!(r.status == 200, "{}", r.text);
    b.allow_console("/v1/mcp/profiles/work - Failed to load resource: the server responded with a status of 409");
    b.fill("dialog[open] [data-field=name] input", "add_numbers").await?;
    b.click_text("dialog[open] button[type=submit]", "Save").await?;
    b.wait_for_text("dialog[open] .dialog-error", "changed elsewhere").await?;
    b.shots("tools-override-conflict").await?;
    let p = profile(&api, "work").await?;
    ensure!(p["overrides"]["tiny__add"]["name"] == "sum" && p["version"] == 3, "nothing written: {p}");
    // Saving again writes over the profile as it is now: the other change stays.
    b.click_text("dialog[open] button[type=submit]", "Save").await?;
    b.wait_gone("dialog[open]").await?;
    b.wait_for_text("tr[data-key=tiny__add] .shown-as", "add_numbers").await?;
    let p = profile(&api, "work").await?;
    ensure!(p["overrides"]["tiny__add"]["name"] == "add_numbers" && p["description"] == "changed in a terminal", "{p}");

    // Clearing every field removes the override.
    b.click_text("tr[data-key=tiny__add] button", "Edit override").await?;
    b.wait_for("dialog[open] [data-field=name] input").await?;
    b.fill("dialog[open] [data-field=name] input", "").await?;
    b.fill("dialog[open] [data-field=description_append] textarea", "").await?;
    b.fill("dialog[open] [data-field=hide_params] input", "").await?;
    b.choose("dialog[open] [data-field=read_only] select", "").await?;
    b.click_text("dialog[open] button[type=submit]", "Save").await?;
    b.wait_gone("dialog[open]").await?;
    b.wait_gone("tr[data-key=tiny__add]").await?;
    ensure!(profile(&api, "work").await?["overrides"].get("tiny__add").is_none(), "removed");

    // Who is connected: both clients with their profiles, the hostile name as text.
    b.goto("/ui/settings?tab=status").await?;
    b.wait_for_page("settings").await?;
    b.wait_for_text(".clients-card", "work-client").await?;
    let row = b
        .eval(
            "return [...document.querySelectorAll('.clients-card tbody tr')].map(r => [r.querySelector('strong').textContent, r.querySelector('[data-profile]').dataset.profile]);",
            vec![],
        )
        .await?;
    let rows = row.as_array().context("rows")?;
    ensure!(rows.contains(&json!(["work-client", "work"])) && rows.contains(&json!([XSS, "default"])), "{row}");
    let v = b
        .eval("return {pwned: window.__pwned || 0, img: document.querySelectorAll('#page img').length};", vec![])
        .await?;
    assert_eq!(v, json!({"pwned": 0, "img": 0}), "the client name was not inert");
    b.shots("status-clients").await?;
    b.set_viewport(390, 844).await?;
    b.screenshot("status-clients-390").await?;
    ensure!(b.horizontal_overflow().await? <= 0, "the status tab overflows sideways at 390 px");
    b.set_viewport(1280, 800).await?;
    // A profile link leads to its tools.
    b.click_text(".clients-card a[data-profile=work]", "work").await?;
    b.wait_for_page("tools").await?;
    b.wait_until("document.getElementById('tool-profile').value === 'work'").await?;
    b.assert_clean().await;
    b.close().await?;
    Ok(())
}
