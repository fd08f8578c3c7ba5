//! The web console's shell in a real headless Chromium against a real daemon: the one-time
//! login, the refusal and signed-out screens, every page of the navigation at desktop and phone
//! widths, the keyboard, the content security policy, and a forged cross-origin POST.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::browser::{self, Browser, DESKTOP, PHONE, keys};
use coffer_tests::{Api, SendExt, TestHome, wait_for};
use serde_json::{Value, json};

/// The navigation's pages, in order (the first is the landing page).
const PAGES: &[(&str, &str)] = &[
    ("chat", "Chat"),
    ("servers", "Servers"),
    ("tools", "Tools"),
    ("activity", "Activity"),
    ("knowledge", "Knowledge"),
    ("settings", "Settings"),
];

async fn daemon() -> anyhow::Result<(TestHome, Api)> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    Ok((home, api))
}

/// The console message Chromium logs when a document or fetch answers `status`, for `path`.
fn failed_load(path: &str, status: u16) -> String {
    format!("{path} - Failed to load resource: the server responded with a status of {status}")
}

#[tokio::test]
async fn ui_shell_login_lands_on_chat_and_a_used_link_is_refused() -> anyhow::Result<()> {
    let (home, _api) = daemon().await?;
    let b = Browser::start().await?;
    // What a user does: `coffer ui` prints the link (here as JSON, not opened), the browser
    // follows it.
    let printed = home.cli(&["ui", "--no-open", "--json"]).await?.ok()?.json()?;
    let url = printed["url"].as_str().with_context(|| format!("no url in {printed}"))?.to_owned();
    assert!(printed["expires_in_s"].as_u64().is_some_and(|s| s > 0), "{printed}");
    b.set_origin(&url)?;
    b.goto(&url).await?;
    b.wait_for_page("chat").await?;
    let at = b.current_url().await?;
    assert_eq!(at.path(), "/ui/chat", "landed on {at}");
    assert_eq!(at.query(), None, "the code must not stay in the address bar: {at}");
    let current = b.wait_for("#nav a[aria-current=\"page\"]").await?;
    assert_eq!(current.attr("data-page").await?.as_deref(), Some("chat"));

    // The session cookie: HttpOnly (the page cannot read it), SameSite=Strict, Path=/.
    let cookies = b.cookies().await?;
    let c = cookies.iter().find(|c| c["name"] == "coffer_session").with_context(|| format!("{cookies:?}"))?;
    assert_eq!(c["httpOnly"], true, "{c}");
    assert_eq!(c["sameSite"], "Strict", "{c}");
    assert_eq!(c["path"], "/", "{c}");
    let visible = b.eval("return document.cookie;", vec![]).await?;
    assert!(!visible.as_str().unwrap_or_default().contains("coffer_session"), "script sees the cookie: {visible}");
    // The cookie alone signs nothing in (every local port receives it): the page sends the
    // session key too, which the login handed over in the fragment and the page moved to the
    // origin's localStorage (not left in the address).
    assert_eq!(at.fragment(), None, "the session key must not stay in the address bar: {at}");
    let key = b.eval("return localStorage.getItem('coffer.sessionKey');", vec![]).await?;
    let key = key.as_str().with_context(|| format!("no session key kept: {key}"))?.to_owned();
    assert!(key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
    let via = b
        .eval_async(
            "const done = arguments[arguments.length - 1]; \
             fetch('/v1/ui/session', {headers: {'X-Coffer-Session-Key': arguments[0]}}) \
               .then(r => r.json()).then(done, e => done(String(e)));",
            vec![json!(key)],
        )
        .await?;
    assert_eq!(via, json!({"via": "cookie"}));
    let alone = b
        .eval_async(
            "const done = arguments[arguments.length - 1]; \
             fetch('/v1/ui/session').then(r => r.json()).then(done, e => done(String(e)));",
            vec![],
        )
        .await?;
    assert_eq!(alone["error"]["details"]["reason"], "session_key_missing", "{alone}");
    b.allow_console(&failed_load("/v1/ui/session", 401));

    // The same link again in this signed-in browser (a reloaded login tab): back on the page,
    // and no new session.
    b.goto(&url).await?;
    b.wait_for_page("chat").await?;
    assert_eq!(b.current_url().await?.path(), "/ui/chat");
    let again = b.cookies().await?;
    let c2 = again.iter().find(|c| c["name"] == "coffer_session").context("the cookie is gone")?;
    assert_eq!(c2["value"], c["value"], "a used link made a new session");
    // A second tab shares the cookie: signed in there too, and the first tab is still there.
    let first = b.current_tab().await?;
    let second = b.new_tab().await?;
    assert_ne!(first, second);
    b.goto("/ui/servers").await?;
    b.wait_for_page("servers").await?;
    b.switch_to(&first).await?;
    assert_eq!(b.current_url().await?.path(), "/ui/chat");

    // A browser that has the cookie but lost the key (storage cleared) is not signed in, and
    // says so: the cookie alone never is.
    b.eval("localStorage.clear(); return null;", vec![]).await?;
    b.refresh().await?;
    b.wait_for_text("#page .notice", "This browser is not signed in").await?;
    b.wait_for_text("#page .notice", "coffer ui").await?;

    // The same link in a browser without the session: refused, with a page that says what to do.
    b.delete_cookies().await?;
    b.goto(&url).await?;
    b.wait_for_text("h1", "This login link is not valid").await?;
    b.wait_for_text("main", "coffer ui").await?;
    b.screenshot("shell-login-refused-1280").await?;
    let code = url.split("code=").nth(1).context("no code in the URL")?;
    b.allow_console(&failed_load(&format!("/ui/login?code={code}"), 401));
    b.assert_clean().await;
    Ok(())
}

/// What `coffer ui` really does with a browser: the opener gets `file://` of a 0600 redirect
/// page in `COFFER_HOME` (never the link), Chromium follows its `meta` refresh from `file://` to
/// `http://127.0.0.1`, lands signed in (cookie, and the key moved to `localStorage`, out of the
/// address), the page's API calls work, and the redirect page is gone once the link is used.
#[tokio::test]
async fn ui_shell_coffer_ui_s_redirect_page_signs_the_browser_in() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    let seen = home.temp().join("opened.txt");
    let opener = home.temp().join("opener.sh");
    std::fs::write(
        &opener,
        format!("#!/bin/sh\nprintf '%s' \"$1\" > {s}.tmp && mv {s}.tmp {s}\n", s = seen.display()),
    )?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&opener, std::fs::Permissions::from_mode(0o755))?;
    let mut cmd = home.cli_command(&["ui", "--page", "servers"])?;
    cmd.env("BROWSER", &opener).env_remove("DISPLAY").env_remove("WAYLAND_DISPLAY");
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await??;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let file_url =
        wait_for("the opener to run", Duration::from_secs(10), || async { Ok(std::fs::read_to_string(&seen).ok()) })
            .await?;
    let page = file_url.strip_prefix("file://").with_context(|| format!("not a file URL: {file_url}"))?.to_owned();
    ensure!(std::path::Path::new(&page).starts_with(home.root()), "{page}");

    let b = Browser::start().await?;
    b.set_origin(api.base_url())?;
    b.allow_origin(&file_url)?;
    b.goto(&file_url).await?;
    b.wait_for_page("servers").await?;
    let at = b.current_url().await?;
    assert_eq!((at.path(), at.query(), at.fragment()), ("/ui/servers", None, None), "landed on {at}");
    b.wait_for_text(".vault-empty", "coffer mcp import").await?;
    let key = b.eval("return localStorage.getItem('coffer.sessionKey');", vec![]).await?;
    assert!(key.as_str().is_some_and(|k| k.len() == 64), "no session key kept: {key}");
    wait_for("the redirect page to be removed", Duration::from_secs(10), || async {
        Ok((!std::path::Path::new(&page).exists()).then_some(()))
    })
    .await?;
    b.assert_clean().await;
    Ok(())
}

/// The harness's own checks can fail: a console error, a console warning and a request to
/// another origin are each caught, and `assert_clean` then panics.
#[tokio::test]
async fn ui_shell_harness_catches_console_errors_and_foreign_requests() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    b.assert_clean().await;
    b.eval("console.error('harness check: an error'); console.warn('harness check: a warning'); return null;", vec![])
        .await?;
    // Another origin. Nothing listens there, so the navigation itself fails (WebDriver reports
    // the browser's error page); the request it made is what counts.
    let other = format!("http://127.0.0.1:{}/elsewhere", coffer_tests::ports::free_port());
    let refused = b.goto(&other).await.expect_err("nothing listens on the other port");
    ensure!(format!("{refused:#}").contains("ERR_CONNECTION_REFUSED"), "{refused:#}");
    let errors = b.console_errors().await?;
    browser::expect_one(&errors, "harness check: an error")?;
    browser::expect_one(&errors, "harness check: a warning")?;
    let foreign = b.foreign_requests().await?;
    ensure!(foreign.iter().any(|u| u == &other), "{other} not among {foreign:?}");
    let outcome = tokio::spawn(async move { b.assert_clean().await }).await;
    ensure!(outcome.is_err_and(|e| e.is_panic()), "assert_clean passed a dirty browser");
    Ok(())
}

#[tokio::test]
async fn ui_shell_no_cookie_sees_the_sign_in_screen() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let b = Browser::start().await?;
    b.set_origin(api.base_url())?;
    // The shell asks `GET /v1/ui/session` first; without a cookie that is a 401 by design.
    b.allow_console(&failed_load("/v1/ui/session", 401));
    for page in ["chat", "servers", "settings"] {
        b.goto(&format!("/ui/{page}")).await?;
        b.wait_for_text("h1", "Sign in to Coffer").await?;
        b.wait_for_text("#page code", "coffer ui").await?;
        // No page was mounted, and the navigation is hidden.
        let mounted = b.eval("return document.getElementById('page').dataset.page || null;", vec![]).await?;
        assert_eq!(mounted, Value::Null, "{page}: a page was mounted without a session");
        assert!(!b.find("#nav a[data-page=chat]").await?.is_displayed().await?, "{page}: the navigation shows");
    }
    b.screenshot("shell-signed-out-1280").await?;

    // A session revoked while the page is open: the next load shows the same screen.
    b.login(api.base_url(), api.token(), "chat").await?;
    // The chat page's first requests (the list, the agents) are answered before the revoke: one
    // still in flight would be a 401 in the console.
    b.wait_until("performance.getEntriesByName('coffer:conversations-drawn').length > 0").await?;
    b.wait_for(".thread-empty-state").await?;
    // A request of the page's that still races the revoke is a 401 that sends it to the sign-in
    // screen too.
    b.allow_console("the server responded with a status of 401");
    let revoked = api.request(reqwest::Method::DELETE, "/v1/ui/sessions").reply().await?.ok_json()?;
    assert_eq!(revoked["revoked"], 1, "{revoked}");
    b.refresh().await?;
    b.wait_for_text("h1", "Sign in to Coffer").await?;
    b.wait_gone("#page[data-page]").await?;
    assert_eq!(b.count("#nav a").await?, PAGES.len());
    b.assert_clean().await;
    Ok(())
}

/// The daemon stops while a tab is open, and the user goes to a page not loaded yet: the page
/// says Coffer is not answering and how to start it, with a Retry button (no "Loading…" forever,
/// no error of ours in the console); once the daemon is back the page leaves the notice by
/// itself for the sign-in screen (a sign-in lasts one run of the daemon), and a new login link
/// opens the page.
#[tokio::test]
async fn ui_shell_a_page_opened_while_the_daemon_is_down_says_so_and_asks_for_a_new_sign_in_after() -> anyhow::Result<()>
{
    let (home, api) = daemon().await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    b.wait_settled().await?;
    // Each request while the daemon is gone fails in the console (the browser's own lines).
    for expected in ["ERR_CONNECTION_REFUSED", "Failed to load resource", "/events"] {
        b.allow_console(expected);
    }
    home.cli(&["daemon", "stop"]).await?.ok()?;
    home.wait_no_processes(Duration::from_secs(15)).await?;
    b.find("#nav a[data-page=servers]").await?.click().await?;
    b.wait_for_text("#page h1", "Coffer is not answering").await?;
    b.wait_for_text("#page code", "coffer daemon start").await?;
    b.wait_for_text("#page button", "Retry").await?;
    assert_eq!(b.count("#page .loading").await?, 0, "still Loading…");
    b.screenshot("shell-unreachable-1280").await?;
    // The Retry button works while the daemon is still away: it says so, and stays.
    b.find("#page .unreachable button").await?.click().await?;
    b.wait_for_text("#page [role=status]", "Still not answering").await?;

    // A sign-in lasts one run of the daemon (while it was down, another program could have taken
    // the port and read this origin's storage): once the new daemon answers, the page leaves the
    // notice for the sign-in screen, which says why; a new login link brings it back.
    b.allow_console("the server responded with a status of 401");
    let again = home.start_daemon().await?;
    ensure!(again.port() == api.port(), "the daemon came back on another port: {} vs {}", again.port(), api.port());
    b.wait_until_within("document.body.classList.contains('signed-out')", Duration::from_secs(30))
        .await
        .context("the page did not leave the notice once the daemon answered")?;
    b.wait_for_text("h1", "Sign in to Coffer").await?;
    b.wait_for_text("#page p", "daemon stopped or restarted").await?;
    b.wait_for_text("#page code", "coffer ui").await?;
    b.login(again.base_url(), again.token(), "servers").await?;
    b.wait_for_page("servers").await?;
    assert_eq!(b.current_url().await?.path(), "/ui/servers");
    b.assert_clean().await;
    Ok(())
}

#[tokio::test]
async fn ui_shell_every_page_loads_at_desktop_and_phone_width() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    for (w, h) in [DESKTOP, PHONE] {
        b.set_viewport(w, h).await?;
        // Back to the landing page by the brand link, then every page by its navigation link.
        b.find("header .brand").await?.click().await?;
        b.wait_for_page("chat").await?;
        for (page, label) in PAGES {
            let link = b.wait_for_text("#nav a", label).await?;
            link.click().await?;
            b.wait_for_page(page).await?;
            b.wait_settled().await?;
            let at = b.current_url().await?;
            assert_eq!(at.path(), format!("/ui/{page}"), "at {w}px");
            assert_eq!(link.attr("aria-current").await?.as_deref(), Some("page"), "{page} at {w}px");
            let title = b.eval("return document.title;", vec![]).await?;
            assert!(title.as_str().is_some_and(|t| t.contains(label)), "{page} at {w}px: title {title}");
            let overflow = b.horizontal_overflow().await?;
            assert!(overflow <= 0, "{page} at {w}px scrolls sideways by {overflow} px");
            b.screenshot(&format!("shell-{page}-{w}")).await?;
        }
        // A page loaded directly (not through the router) mounts the same way.
        b.goto("/ui/settings").await?;
        b.wait_for_page("settings").await?;
    }
    // Dark mode follows the system's preference.
    b.set_viewport(DESKTOP.0, DESKTOP.1).await?;
    let light = b.eval("return getComputedStyle(document.body).backgroundColor;", vec![]).await?;
    b.set_dark(true).await?;
    let dark = b.eval("return getComputedStyle(document.body).backgroundColor;", vec![]).await?;
    assert_ne!(light, dark, "the background did not change with prefers-color-scheme");
    b.screenshot("shell-settings-1280-dark").await?;
    b.assert_clean().await;
    Ok(())
}

#[tokio::test]
async fn ui_shell_keyboard_reaches_the_navigation() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    // Tab from the top of the page until the Servers link has the focus.
    let mut reached = false;
    for _ in 0..20 {
        b.press(keys::TAB).await?;
        let focused = b.active_element().await?;
        if focused.attr("data-page").await?.as_deref() == Some("servers") {
            reached = true;
            break;
        }
    }
    assert!(reached, "20 Tabs did not reach the Servers link");
    // Keyboard focus is visible.
    let outline = b.eval("return getComputedStyle(document.activeElement).outlineStyle;", vec![]).await?;
    assert_ne!(outline, "none", "the focused link shows no outline");
    b.screenshot("shell-keyboard-focus-1280").await?;
    b.press(keys::ENTER).await?;
    b.wait_for_page("servers").await?;
    assert_eq!(b.current_url().await?.path(), "/ui/servers");
    // Shift+Tab walks back to Chat; Enter follows it.
    b.chord(&[keys::SHIFT, keys::TAB]).await?;
    assert_eq!(b.active_element().await?.attr("data-page").await?.as_deref(), Some("chat"));
    b.press(keys::ENTER).await?;
    b.wait_for_page("chat").await?;
    b.assert_clean().await;
    Ok(())
}

#[tokio::test]
async fn ui_shell_csp_stops_injected_inline_script() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    // What an injection would add to the page: an inline script and an inline event handler.
    b.eval(
        "const s = document.createElement('script'); s.textContent = 'window.__pwned = \"script\"'; \
         document.body.append(s); \
         const d = document.createElement('div'); d.id = 'inj'; \
         d.innerHTML = '<img src=\"data:,\" onerror=\"window.__pwned = &quot;handler&quot;\">'; \
         document.body.append(d); return null;",
        vec![],
    )
    .await?;
    // The image has failed to load (so its handler would have run) once `complete` is true.
    b.wait_until("document.querySelector('#inj img').complete").await?;
    let pwned = b.eval("return window.__pwned === undefined ? null : window.__pwned;", vec![]).await?;
    assert_eq!(pwned, Value::Null, "injected code ran");
    // Exactly the two refusals, and nothing else.
    let errors = b.console_errors().await?;
    browser::expect_one(&errors, "Executing inline script violates the following Content Security Policy")?;
    browser::expect_one(&errors, "Executing inline event handler violates the following Content Security Policy")?;
    ensure!(errors.len() == 2, "other console errors: {errors:#?}");
    b.allow_console("violates the following Content Security Policy directive 'script-src 'self''");
    b.assert_clean().await;
    Ok(())
}

/// A page on another loopback origin that tries to change Coffer with the browser's cookie:
/// a simple (no preflight) `text/plain` POST and a JSON POST that needs a preflight.
fn attacker_page(coffer: &str) -> String {
    format!(
        r#"<!doctype html><html><head><title>attacker</title><link rel="icon" href="data:,"></head><body><script>
const target = "{coffer}/v1/memory";
const body = JSON.stringify({{ text: "planted by another origin" }});
const results = {{}};
Promise.all([
  fetch(target, {{ method: "POST", mode: "no-cors", credentials: "include",
                   headers: {{ "Content-Type": "text/plain" }}, body }})
    .then(r => results.simple = r.type, e => results.simple = "error: " + e),
  fetch(target, {{ method: "POST", credentials: "include",
                   headers: {{ "Content-Type": "application/json" }}, body }})
    .then(r => results.json = r.status, e => results.json = "error: " + e),
]).then(() => {{ window.__results = results; }});
</script></body></html>"#
    )
}

#[tokio::test]
async fn ui_shell_forged_cross_origin_post_is_refused() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    let facts = || async { Ok::<_, anyhow::Error>(api.get("/v1/memory").reply().await?.ok_json()?.to_string()) };

    // Control: the same POST from Coffer's own page works (with the session key it keeps), so
    // the refusal below means something; without the key even the console's page is refused.
    let post = |with_key: bool| {
        b.eval_async(
            "const [withKey, done] = arguments; \
             const headers = {'Content-Type': 'application/json'}; \
             if (withKey) headers['X-Coffer-Session-Key'] = localStorage.getItem('coffer.sessionKey'); \
             fetch('/v1/memory', {method: 'POST', headers, \
               body: JSON.stringify({text: 'written by the console'})}).then(r => done(r.status), e => done(String(e)));",
            vec![json!(with_key)],
        )
    };
    assert_eq!(post(false).await?, 401, "the cookie alone was enough");
    b.allow_console(&failed_load("/v1/memory", 401));
    let status = post(true).await?;
    assert_eq!(status, 201, "the console's own POST failed");
    ensure!(facts().await?.contains("written by the console"));

    // The attacker: a tiny server of our own on another port of the same loopback address
    // (same site, so the SameSite=Strict cookie is sent: only the Origin check stands).
    let page = attacker_page(api.base_url());
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let page = page.clone();
            async move { axum::response::Html(page) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let attacker = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    b.allow_origin(&attacker)?;

    b.goto(&format!("{attacker}/")).await?;
    b.wait_until("window.__results !== undefined").await?;
    let results = b.eval("return window.__results;", vec![]).await?;
    // The simple POST went out (opaque answer); the JSON one died at its preflight.
    assert_eq!(results["simple"], "opaque", "{results}");
    assert!(results["json"].as_str().is_some_and(|s| s.starts_with("error")), "{results}");
    // Coffer saw the simple one and refused it for its Origin.
    wait_for("the gateway to log the foreign Origin", Duration::from_secs(10), || async {
        Ok(home.log_text("gateway").contains("Refused: foreign Origin.").then_some(()))
    })
    .await?;
    let after = facts().await?;
    ensure!(!after.contains("planted by another origin"), "the forged POST was saved: {after}");
    ensure!(after.contains("written by the console"), "{after}");
    server.abort();

    // Only the attacker's own failures are in the console.
    b.allow_console(&format!("from origin '{attacker}' has been blocked by CORS policy"));
    b.allow_console(&failed_load("/v1/memory", 403));
    b.allow_console("/v1/memory - Failed to load resource: net::ERR_FAILED");
    b.assert_clean().await;
    Ok(())
}
