//! The servers page's "Install from registry" dialog in a real browser (headless Chromium
//! through `coffer_tests::browser`) against a real daemon whose `gateway.mcp_registry_url` is a
//! fake MCP Registry over real HTTP (`coffer_tests::fake_registry`). Its npm entry is run by a
//! stand-in `npx` on the daemon's PATH that starts `coffer-tiny-upstream` (tests never reach a
//! package registry). Search, pick, fill a secret input, install: the server is registered, its
//! secret is a credential, a client lists its tools. A hostile entry (markup in its title and
//! description, a package name with shell metacharacters) renders inert and cannot be picked.
//! Screenshots at 1280, 390 and 360 px in `target/ui-screenshots/`.
use anyhow::ensure;
use coffer_tests::browser::{Browser, keys};
use coffer_tests::fake_registry::FakeRegistry;
use coffer_tests::mcp::McpSession;
use coffer_tests::{SendExt, TestHome, bin};
use reqwest::Method;
use serde_json::json;

const SECRET: &str = "tiny-token-93e1b7";
const XSS: &str = "<img src=x onerror=\"window.__pwned=1\"><b>bold</b>";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_registry_search_pick_fill_and_install() -> anyhow::Result<()> {
    let registry = FakeRegistry::start(vec![
        json!({
            "name": "io.github.coffer-test/tiny",
            "title": "Tiny",
            "description": "A tiny MCP server for tests",
            "version": "1.0.0",
            "packages": [{
                "registryType": "npm", "identifier": "@coffer-test/tiny", "version": "1.0.0",
                "runtimeHint": "npx", "transport": {"type": "stdio"},
                "environmentVariables": [
                    {"name": "API_TOKEN", "description": "Your token", "isRequired": true, "isSecret": true}
                ]
            }]
        }),
        json!({
            "name": "io.github.coffer-test/tiny-evil",
            "title": XSS,
            "description": XSS,
            "version": "1.0.0",
            "packages": [{
                "registryType": "npm", "identifier": "tiny;$(curl evil)", "version": "1.0.0",
                "transport": {"type": "stdio"}
            }]
        }),
    ])
    .await?;
    let mut home = TestHome::new()?;
    let dir = home.temp().join("runtimes");
    std::fs::create_dir_all(&dir)?;
    let npx = dir.join("npx");
    std::fs::write(
        &npx,
        format!(
            "#!/bin/sh\n# Stand-in for npx: a local server, never the network.\n[ \"$1\" = -y ] && shift\n\
             [ \"$1\" = @coffer-test/tiny@1.0.0 ] || {{ echo \"npx stand-in: no copy of $1\" >&2; exit 1; }}\nshift\nexec '{}' \"$@\"\n",
            bin("coffer-tiny-upstream")?.display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&npx, std::fs::Permissions::from_mode(0o755))?;
    home.set_env("PATH", format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default()));
    let api = home.start_daemon().await?;
    api.request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"gateway.mcp_registry_url": registry.url}}))
        .reply()
        .await?
        .ok_json()?;

    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "servers").await?;
    b.click_text(".vault-head button", "Install from registry").await?;
    b.wait_for("dialog[open] .registry-dialog").await?;
    b.fill("dialog[open] input[type=search]", "tiny").await?;
    b.press(keys::ENTER).await?;
    b.wait_for_text("dialog[open] .registry-results", "A tiny MCP server for tests").await?;
    // The hostile entry is shown as text and cannot be picked.
    b.wait_for_text("dialog[open] .registry-item.unusable", "is not a valid npm name").await?;
    let inert = b
        .eval(
            "return {pwned: window.__pwned || 0, img: document.querySelectorAll('dialog img').length, b: document.querySelectorAll('dialog b').length,\
             disabled: document.querySelector('dialog .registry-item.unusable input').disabled};",
            vec![],
        )
        .await?;
    assert_eq!(inert, json!({"pwned": 0, "img": 0, "b": 0, "disabled": true}), "the hostile entry was not inert");
    b.shots("registry-results").await?;
    // A user clicks the entry's title: its label picks the radio.
    b.click_text("dialog[open] .registry-item label strong", "Tiny").await?;
    b.wait_for("dialog[open] [data-field=API_TOKEN] input[type=password]").await?;
    let hint =
        b.eval("return document.querySelector('dialog[open] [data-field=API_TOKEN]').innerText;", vec![]).await?;
    ensure!(hint.as_str().is_some_and(|h| h.contains("Your token") && h.contains("credential store")), "{hint}");
    let runs = b
        .eval(
            "return document.querySelector('dialog[open] [data-field=option] select').selectedOptions[0].textContent;",
            vec![],
        )
        .await?;
    assert_eq!(runs, json!("npm @coffer-test/tiny@1.0.0 via npx"));

    // Installing without the required secret: the daemon's message, the dialog stays open.
    b.allow_console("/v1/mcp/registry/install - Failed to load resource: the server responded with a status of 400");
    b.click_text("dialog[open] button[type=submit]", "Install").await?;
    b.wait_for_text("dialog[open] .dialog-error", "needs a value for API_TOKEN").await?;
    b.fill("dialog[open] [data-field=API_TOKEN] input", SECRET).await?;
    b.shots("registry-install-dialog").await?;
    b.set_viewport(390, 844).await?;
    ensure!(b.horizontal_overflow().await? <= 0, "the dialog overflows sideways at 390 px");
    b.screenshot("registry-install-dialog-390").await?;
    b.set_viewport(1280, 800).await?;
    b.click_text("dialog[open] button[type=submit]", "Install").await?;
    b.wait_until("location.search.includes('name=tiny')").await?;
    b.wait_for_text("#toasts", "tiny offers").await?;
    b.shots("registry-installed").await?;

    let server = api.get("/v1/mcp/servers/tiny").reply().await?.ok_json()?;
    assert_eq!(server["command"], "npx");
    assert_eq!(server["env"]["API_TOKEN"], json!({"credential_ref": "tiny.API_TOKEN"}));
    ensure!(!server.to_string().contains(SECRET));
    let tools = McpSession::latest(&api).await?.tool_names().await?;
    ensure!(tools.iter().any(|t| t.starts_with("tiny__")), "{tools:?}");
    let page = b.eval("return document.body.innerText;", vec![]).await?;
    ensure!(!page.to_string().contains(SECRET), "the page shows the secret");
    b.assert_clean().await;
    Ok(())
}
