//! Issue 37 in the console: an HTTP server behind OAuth (the Python SDK peer
//! `tests/peers/oauth_server.py`) on its server page in a real browser (headless Chromium through
//! `coffer_tests::browser`). The page shows its sign-in state; the "Sign in" button starts the
//! daemon's sign-in, opens the authorization URL in a new tab (the peer's consent step redirects
//! straight to the daemon's loopback listener), and says when it is done; a revoked grant shows
//! "needs sign-in" with the command, and the button signs in again. Screenshots at 1280, 390 and
//! 360 px in `target/ui-screenshots/`.
use anyhow::ensure;
use coffer_tests::browser::Browser;
use coffer_tests::{SendExt, TestHome};
use serde_json::json;

use crate::oauth::{peer_post, start_peer_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_server_page_signs_in_and_shows_needs_sign_in() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let (mut peer, base) = start_peer_with(&home, &[])?;
    let r = api.post_json("/v1/mcp/servers", &json!({"name": "secure", "url": format!("{base}/mcp")})).reply().await?;
    ensure!(r.status.is_success(), "{}", r.text);

    let b = Browser::start().await?;
    // The sign-in tab goes to the peer (authorization endpoint) and the daemon's loopback
    // listener: both expected.
    b.allow_origin(&base)?;
    // Its capabilities cannot be listed while it needs sign-in: the page says so (a 502).
    b.allow_console(
        "/v1/mcp/servers/secure/capabilities - Failed to load resource: the server responded with a status of 502",
    );
    b.login(api.base_url(), api.token(), "servers").await?;
    b.goto("/ui/servers?name=secure").await?;
    b.wait_for_text("dl.facts", "not signed in").await?;
    // Its first start asked for a sign-in: the page says so, with the command.
    b.wait_for_text("dl.facts .last-error", "coffer mcp auth secure").await?;

    b.click_text("dl.facts button", "Sign in").await?;
    // The daemon started the sign-in (the page says so once it has the URL).
    b.wait_for_text("#toasts", "Sign in to secure in the new tab").await?;
    b.wait_for_text("#toasts", "Signed in to secure.").await?;
    allow_loopback_callbacks(&b).await?;
    let auth = api.get("/v1/mcp/servers/secure/auth").reply().await?.ok_json()?;
    assert_eq!(auth["state"], "signed_in", "{auth}");
    let r = api
        .post_json("/v1/tools/call", &json!({"name": "secure__echo", "arguments": {"message": "hi"}}))
        .reply()
        .await?;
    ensure!(r.text.contains("Echo: hi"), "{}", r.text);
    b.refresh().await?;
    b.wait_for_text("dl.facts", "signed in").await?;
    b.wait_for_text("dl.facts button", "Sign out").await?;
    b.shots("server-signed-in").await?;

    // Revoked: the next call is refused, the page says "needs sign-in" and how.
    peer_post(&base, "/test/revoke").await?;
    peer_post(&base, "/test/expire").await?;
    let r = api
        .post_json("/v1/tools/call", &json!({"name": "secure__echo", "arguments": {"message": "x"}}))
        .reply()
        .await?;
    ensure!(r.text.contains("needs sign-in"), "{}", r.text);
    b.refresh().await?;
    b.wait_for_text("dl.facts .last-error", "needs sign-in (its refresh was refused").await?;
    b.wait_for_text("dl.facts", "coffer mcp auth secure").await?;
    let primary = b
        .eval("return [...document.querySelectorAll('dl.facts button')].filter(x => x.textContent === 'Sign in').map(x => x.className);", vec![])
        .await?;
    assert_eq!(primary, json!(["primary"]), "the sign-in button is not the page's call to action");
    b.shots("server-needs-sign-in").await?;
    b.set_viewport(390, 844).await?;
    ensure!(b.horizontal_overflow().await? <= 0, "the page overflows sideways at 390 px");
    b.screenshot("server-needs-sign-in-390").await?;
    b.set_viewport(1280, 800).await?;

    b.eval("document.getElementById('toasts')?.replaceChildren(); return true;", vec![]).await?;
    b.click_text("dl.facts button", "Sign in").await?;
    b.wait_for_text("#toasts", "Sign in to secure in the new tab").await?;
    b.wait_for_text("#toasts", "Signed in to secure.").await?;
    allow_loopback_callbacks(&b).await?;
    let r = api
        .post_json("/v1/tools/call", &json!({"name": "secure__echo", "arguments": {"message": "again"}}))
        .reply()
        .await?;
    ensure!(r.text.contains("Echo: again"), "{}", r.text);
    b.assert_clean().await;
    peer.kill()?;
    peer.wait()?;
    Ok(())
}

/// Marks the daemon's sign-in listener (`http://127.0.0.1:<port>/callback?…`, a fresh port per
/// sign-in, gone once it is done) as an expected origin, after the fact: the flow may finish
/// before a test could read its `redirect_uri`. Whether the sign-in tab's requests are in the
/// browser's log at all depends on the tab chromedriver reads; the sign-in itself is checked by
/// its toast and the calls that follow.
async fn allow_loopback_callbacks(b: &Browser) -> anyhow::Result<()> {
    for u in b.requests().await? {
        if u.starts_with("http://127.0.0.1:") && u.contains("/callback?") {
            b.allow_origin(&u)?;
        }
    }
    Ok(())
}
