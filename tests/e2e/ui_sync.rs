//! The web console's Sync tab (Settings → Sync) in headless Chromium: on a machine that adopted
//! another's sync remote it shows the remote, the last sync and the credential to set here;
//! "Sync now" pulls what the other machine pushed since and shows the summary.
use anyhow::ensure;
use coffer_tests::browser::Browser;
use coffer_tests::{SendExt, TestHome};
use reqwest::Method;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_sync_shows_status_missing_credentials_and_syncs_now() -> anyhow::Result<()> {
    let a = TestHome::new()?;
    let api_a = a.start_daemon().await?;
    let b_home = TestHome::new()?;
    let api_b = b_home.start_daemon().await?;
    let remote = a.temp().join("remote.git");
    std::fs::create_dir_all(&remote)?;
    // Test setup: the bare remote.
    #[allow(clippy::disallowed_methods)]
    let ok =
        std::process::Command::new("git").args(["init", "-q", "--bare", "-b", "main"]).current_dir(&remote).status()?;
    ensure!(ok.success());
    let url = format!("file://{}", remote.display());
    let r = api_a.request(Method::PUT, "/v1/credentials/ui-sync-token").json(&json!({"value": "v"})).reply().await?;
    ensure!(r.status == 201, "{}", r.text);
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let body = json!({"name": "tiny", "command": tiny, "env": {"T": {"credential_ref": "ui-sync-token"}}});
    ensure!(api_a.post_json("/v1/mcp/servers", &body).reply().await?.status == 201);
    api_a.post_json("/v1/sync/init", &json!({"remote": url})).reply().await?.ok_json()?;
    api_b.post_json("/v1/sync/init", &json!({"remote": url})).reply().await?.ok_json()?;

    let b = Browser::start().await?;
    b.login(api_b.base_url(), api_b.token(), "settings").await?;
    b.goto("/ui/settings?tab=sync").await?;
    b.wait_for_page("settings").await?;
    b.wait_for_text("#sync-status", &url).await?;
    b.wait_for_text(".missing-credential", "ui-sync-token").await?;
    b.wait_for_text(".missing-credential", "set this credential here").await?;
    b.shots("sync-status").await?;

    // A pushes a fact; B's "Sync now" pulls it.
    let r = api_a.post_json("/v1/memory", &json!({"text": "The console can sync now."})).reply().await?;
    ensure!(r.status == 201, "{}", r.text);
    api_a.post_json("/v1/sync", &json!({})).reply().await?.ok_json()?;
    b.click_text("#sync-now", "Sync now").await?;
    b.wait_for_text("#sync-summary", "Pulled: files +1").await?;
    b.shots("sync-now").await?;
    let found = api_b.post_json("/v1/memory/recall", &json!({"query": "console can sync"})).reply().await?.ok_json()?;
    let snippet = found["results"][0]["snippet"].as_str().unwrap_or_default();
    ensure!(snippet.contains("**console** can **sync** now"), "{found}");
    b.assert_clean().await;
    Ok(())
}
