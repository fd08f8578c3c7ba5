//! Settings → Profiles in a real browser (headless Chromium through `coffer_tests::browser`)
//! against a real daemon: `default` listed from the start, create a profile with selections
//! and lazy mode, a bad glob refused next to its field (nothing written), edit, the overrides
//! card (add an override with a new name, an appended description, a hidden parameter and an
//! annotation; a bad new name refused next to its field), a hostile description staying inert,
//! remove with a confirmation, `default` without a Remove button. Ends with `assert_clean()`;
//! screenshots at 1280, 390 and 360 px, light and dark, in `target/ui-screenshots/`.
use anyhow::{Context, ensure};
use coffer_tests::browser::Browser;
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
