//! Settings → LLM connections in a real browser (headless Chromium through
//! `coffer_tests::browser`) against a real daemon: add with a key (it becomes a credential and
//! leaves the page), a refusal shown next to its field, edit, the models button and the test
//! button on an endpoint that refuses connections (the failure is shown, whichever part —
//! coffer-chat or the provider — reports it), make default, a hostile model id staying inert,
//! remove with a confirmation. Ends with `assert_clean()`; screenshots at 1280 and 360 px in
//! `target/ui-screenshots/`.

use anyhow::{Context, ensure};
use coffer_tests::browser::Browser;
use coffer_tests::{Api, SendExt, TestHome};
use serde_json::{Value, json};

/// A key that must never reach the page once sent.
const KEY: &str = "sk-ant-ui-7f3e1c9b5a2d8e4f6a0c";
/// A payload that sets `window.__pwned` if it ever runs as HTML.
const XSS: &str = "<img src=x onerror=\"window.__pwned=1\"><b>bold</b>";

async fn js(b: &Browser, script: &str, args: Vec<Value>) -> anyhow::Result<Value> {
    b.eval(script, args).await
}

async fn connection(api: &Api, name: &str) -> anyhow::Result<Value> {
    api.get(&format!("/v1/llm/connections/{name}")).reply().await?.ok_json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_llm_connections_add_edit_test_default_remove() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "settings").await?;
    b.goto("/ui/settings?tab=llm").await?;
    b.wait_for_page("settings").await?;
    b.wait_for_text(".vault-empty", "No LLM connection yet").await?;

    // Add with a key: it becomes credential llm-claude, and the page no longer holds it.
    b.click_text("button", "Add connection").await?;
    b.wait_for("dialog[open] .llm-form").await?;
    b.fill("dialog[open] [data-field=name] input", "claude").await?;
    b.fill("dialog[open] [data-field=api_key] input", KEY).await?;
    b.fill("dialog[open] [data-field=model] input", "claude-sonnet-4-5").await?;
    b.click_text("dialog[open] button[type=submit]", "Add").await?;
    b.wait_for("tr[data-key=claude] [data-key=set]").await?;
    let c = connection(&api, "claude").await?;
    assert_eq!((c["credential_ref"].as_str(), c["credential_set"].as_bool()), (Some("llm-claude"), Some(true)), "{c}");
    let held = js(&b, "return document.documentElement.outerHTML.includes(arguments[0]) || [...document.querySelectorAll('input')].some(i => i.value === arguments[0]);", vec![json!(KEY)]).await?;
    assert_eq!(held, json!(false), "the key is still on the page");

    // A refusal stays in the dialog, next to the field it names; nothing is written.
    b.allow_console("/v1/llm/connections - Failed to load resource: the server responded with a status of 400");
    b.click_text("button", "Add connection").await?;
    b.wait_for("dialog[open] .llm-form").await?;
    b.fill("dialog[open] [data-field=name] input", "local").await?;
    b.choose("dialog[open] [data-field=wire] select", "ollama").await?;
    b.fill("dialog[open] [data-field=model] input", "llama3.2").await?;
    b.click_text("dialog[open] button[type=submit]", "Add").await?;
    b.wait_for_text("dialog[open] [data-field=base_url] .field-error", "base_url is required for an ollama").await?;
    b.shots("llm-refused").await?;
    api.get("/v1/llm/connections/local").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    // Fixed in place: the dialog saves once the base URL is given.
    b.fill("dialog[open] [data-field=base_url] input", "http://127.0.0.1:9").await?;
    b.click_text("dialog[open] button[type=submit]", "Add").await?;
    b.wait_for("tr[data-key=local] [data-key=none]").await?;
    b.wait_gone("dialog[open]").await?;

    // Test on an endpoint that refuses connections: a failure is shown under the row.
    b.allow_console("/v1/llm/connections/local/test - Failed to load resource");
    b.click_text("tr[data-key=local] button", "Test").await?;
    b.wait_for("[data-result=local] .llm-test[data-ok=false]").await?;
    let shown = js(&b, "return document.querySelector('[data-result=local]').innerText;", vec![]).await?;
    ensure!(shown.as_str().is_some_and(|t| t.len() > 10), "an empty failure: {shown}");

    // Edit: the models button says why it has no list; the new model is saved.
    b.allow_console("/v1/llm/connections/local/models - Failed to load resource");
    b.click_text("tr[data-key=local] button", "Edit").await?;
    b.wait_for("dialog[open] .llm-form").await?;
    b.click_text("dialog[open] .llm-list-models", "List models").await?;
    b.wait_until("(document.querySelector('dialog[open] .llm-models-hint') || {}).innerText?.length > 0 && !document.querySelector('dialog[open] .llm-models-hint').innerText.startsWith('Asking')").await?;
    b.fill("dialog[open] [data-field=model] input", "llama3.2:1b").await?;
    b.fill("dialog[open] [data-field=fast_model] input", "llama3.2:1b").await?;
    b.shots("llm-edit").await?;
    b.click_text("dialog[open] button[type=submit]", "Save").await?;
    b.wait_gone("dialog[open]").await?;
    let l = connection(&api, "local").await?;
    assert_eq!(
        (l["model"].as_str(), l["fast_model"].as_str(), l["version"].as_i64()),
        (Some("llama3.2:1b"), Some("llama3.2:1b"), Some(2)),
        "{l}"
    );

    // Make default, then another one takes the flag.
    b.click_text("tr[data-key=claude] button", "Make default").await?;
    b.wait_for("tr[data-key=claude] [data-default=true]").await?;
    assert_eq!(connection(&api, "claude").await?["internal_default"], true);
    b.click_text("tr[data-key=local] button", "Make default").await?;
    b.wait_for("tr[data-key=local] [data-default=true]").await?;
    ensure!(b.count("tr[data-key=claude] [data-default=true]").await? == 0, "two defaults shown");

    // A hostile model id (added over REST) is shown as text.
    let r = api
        .post_json(
            "/v1/llm/connections",
            &json!({"name": "odd", "wire": "openai-chat", "base_url": "http://127.0.0.1:9/v1", "model": XSS}),
        )
        .reply()
        .await?;
    ensure!(r.status == 201, "{}", r.text);
    b.refresh().await?;
    b.wait_for("tr[data-key=odd]").await?;
    let v = js(&b, "return {pwned: window.__pwned || 0, img: document.querySelectorAll('#page img').length, b: document.querySelectorAll('#page b').length};", vec![]).await?;
    assert_eq!(v, json!({"pwned": 0, "img": 0, "b": 0}), "the model id was not inert");
    ensure!(
        js(&b, "return document.querySelector('tr[data-key=odd]').innerText;", vec![])
            .await?
            .as_str()
            .is_some_and(|t| t.contains("<img")),
        "the model id is not shown as text"
    );
    b.shots("llm-list").await?;

    // Remove with a confirmation: the connection and its generated credential go.
    b.click_text("tr[data-key=claude] button", "Remove").await?;
    b.wait_for_text("dialog[open]", "llm-claude").await?;
    b.click_text("dialog[open] button[type=submit]", "Remove").await?;
    b.wait_gone("tr[data-key=claude]").await?;
    api.get("/v1/llm/connections/claude").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    let creds = api.get("/v1/credentials").reply().await?.ok_json()?;
    assert_eq!(creds["items"], json!([]), "llm-claude went with its connection");
    let audit = api.get("/v1/audit?actor=ui&limit=50").reply().await?.ok_json()?;
    let actions: Vec<&str> =
        audit["items"].as_array().context("items")?.iter().filter_map(|e| e["action"].as_str()).collect();
    ensure!(
        actions.contains(&"llm.create") && actions.contains(&"llm.remove"),
        "the console is the actor: {actions:?}"
    );
    b.assert_clean().await;
    b.close().await?;
    Ok(())
}
