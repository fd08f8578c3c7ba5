//! The console as a phone app (issue 35 §3) in a real headless Chromium against a real daemon:
//! at 390×844 and 1280×800, light and dark, every main page (chat list, a thread with messages,
//! servers, knowledge, settings, activity) has no horizontal overflow by the DOM (the document's
//! scroll width, and no visible element's right edge past the viewport), the navigation is a
//! bottom tab bar on the phone and the top bar on the desktop, the thread header is compact, an
//! Activity row is one list row, the composer's Enter is a new line on a touch screen (the Send
//! button sends) and sends on the desktop, and the web app manifest and its icons load before
//! sign-in with their content types. Screenshots: `target/ui-screenshots/phone-*.png`.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::browser::{Browser, keys};
use coffer_tests::mcp::{self, McpSession};
use coffer_tests::{Api, SendExt, TestHome, chat, wait_for, write_file};
use serde_json::{Value, json};

const PHONE: (u32, u32) = (390, 844);
const DESKTOP: (u32, u32) = (1280, 800);

/// Scrolls to the top, clears toasts, then fails naming every visible element whose right edge
/// passes the viewport (beyond 1 px of rounding) or when the document scrolls sideways.
async fn assert_fits(b: &Browser, what: &str) -> anyhow::Result<()> {
    let v = b
        .eval(
            "document.getElementById('toasts')?.replaceChildren(); const p = document.getElementById('page'); if (p) p.scrollTop = 0; window.scrollTo(0, 0);
             const de = document.documentElement, vw = de.clientWidth;
             const bad = [];
             for (const e of document.querySelectorAll('body *')) {
               const r = e.getBoundingClientRect();
               if (!r.width || !r.height || getComputedStyle(e).visibility === 'hidden') continue;
               // Inside a sideways-scrolling box (tabs, a table, a code block) is fine: the box fits.
               let clipped = false;
               for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
                 const o = getComputedStyle(a).overflowX;
                 if (o !== 'visible') { const ar = a.getBoundingClientRect(); if (r.left >= ar.right - 1 || r.right > ar.right + 1) { clipped = true; break; } }
               }
               if (!clipped && r.right > vw + 1) bad.push(`${e.tagName.toLowerCase()}.${[...e.classList].join('.')} right=${Math.round(r.right)}`);
             }
             return { scroll: de.scrollWidth, client: vw, bad: bad.slice(0, 8) };",
            vec![],
        )
        .await?;
    ensure!(v["scroll"].as_u64() <= v["client"].as_u64(), "{what}: the document scrolls sideways: {v}");
    ensure!(v["bad"].as_array().is_some_and(Vec::is_empty), "{what}: elements past the viewport's right edge: {v}");
    Ok(())
}

/// A conversation of the scripted agent with two finished turns; its id.
async fn conversation(api: &Api) -> anyhow::Result<String> {
    let r = api
        .post_json(
            "/v1/conversations",
            &json!({"agent_key": chat::SCRIPTED, "title": "Fix the flaky deploy script on staging"}),
        )
        .reply()
        .await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let id = r.json()?["id"].as_str().context("id")?.to_owned();
    for (i, text) in ["Why does the deploy fail on staging?", "Show me the fix as a patch, please."].iter().enumerate()
    {
        let r = api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": text})).reply().await?;
        ensure!(r.status == 202, "send: {} {}", r.status, r.text);
        let want = 2 * (i as u64 + 1);
        wait_for("the turn to end", Duration::from_secs(30), || async {
            let v: Value = api.get(&format!("/v1/conversations/{id}")).reply().await?.json()?;
            let c = &v["conversation"];
            Ok((c["turn_running"] == false && c["message_count"].as_u64().unwrap_or(0) >= want).then_some(()))
        })
        .await?;
    }
    Ok(id)
}

#[tokio::test]
async fn ui_phone_every_page_fits_390_and_1280_in_light_and_dark() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    // Something on every page: a server, a knowledge base, tool calls in Activity, a thread.
    mcp::register_tiny(&api, "tiny", json!({})).await?;
    mcp::wait_listed(&api, "tiny").await?;
    let s = McpSession::latest(&api).await?;
    for word in ["hello", "a somewhat longer argument to make the row realistic"] {
        s.tool("tiny__echo", json!({"message": word})).await?;
    }
    let notes = home.temp().join("phone-notes");
    write_file(&notes.join("deploy.md"), "# Deploying\n\nStaging uses the flamingo key.\n")?;
    let r =
        api.post_json("/v1/knowledge", &json!({"name": "notes", "path": notes.display().to_string()})).reply().await?;
    ensure!(r.status == 201, "knowledge: {} {}", r.status, r.text);
    let id = conversation(&api).await?;

    let b = Browser::start().await?;
    // 1. Installable, before sign-in: the page links the manifest; it and its icons load with
    //    their content types and no session (and the CSP's manifest-src allows it).
    b.set_origin(api.base_url())?;
    // The signed-out page asks whether it has a session first: that one 401 is expected.
    b.allow_console("/v1/ui/session - Failed to load resource: the server responded with a status of 401");
    b.goto(&format!("{}/ui/chat", api.base_url())).await?;
    let m = b
        .eval_async(
            "const done = arguments[0]; (async () => {
               const link = document.querySelector('link[rel=manifest]');
               const r = await fetch(link.href, { credentials: 'omit' });
               const m = await r.json();
               const icons = [];
               for (const i of m.icons) { const x = await fetch(i.src, { credentials: 'omit' }); const bm = await createImageBitmap(await x.blob()); icons.push([i.sizes, x.status, x.headers.get('content-type'), bm.width, bm.height]); }
               done({ status: r.status, type: r.headers.get('content-type'), name: m.name, start: m.start_url, display: m.display, theme: m.theme_color, icons });
             })().catch(e => done({ error: String(e) }));",
            vec![],
        )
        .await?;
    ensure!(m["status"] == 200 && m["type"] == "application/manifest+json", "manifest: {m}");
    ensure!(
        m["name"] == "Coffer" && m["start"] == "/ui/chat" && m["display"] == "standalone" && m["theme"].is_string(),
        "{m}"
    );
    ensure!(
        m["icons"] == json!([["192x192", 200, "image/png", 192, 192], ["512x512", 200, "image/png", 512, 512]]),
        "icons: {m}"
    );

    b.login(api.base_url(), api.token(), "chat").await?;
    let pages: &[(&str, &str)] = &[
        ("chat", "/ui/chat"),
        ("thread", &format!("/ui/chat?c={id}")),
        ("servers", "/ui/servers"),
        ("knowledge", "/ui/knowledge"),
        ("settings", "/ui/settings"),
        ("activity", "/ui/activity"),
    ];
    for dark in [false, true] {
        b.set_dark(dark).await?;
        let theme = if dark { "dark" } else { "light" };
        for (w, h) in [PHONE, DESKTOP] {
            b.set_viewport(w, h).await?;
            for (name, path) in pages {
                b.goto(path).await?;
                let page = if *name == "thread" { "chat" } else { name };
                b.wait_for_page(page).await?;
                b.wait_settled().await?;
                match *name {
                    "thread" => {
                        b.wait_until(
                            "document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]').length >= 2",
                        )
                        .await?
                    }
                    "chat" => b.wait_for(".conv-item").await.map(drop)?,
                    "activity" => b.wait_for(".vtable tbody tr").await.map(drop)?,
                    "servers" => b.wait_for_text("#page", "tiny").await.map(drop)?,
                    "knowledge" => b.wait_for_text("#page", "notes").await.map(drop)?,
                    _ => {}
                }
                let what = format!("{name} at {w}×{h} {theme}");
                assert_fits(&b, &what).await?;
                b.screenshot(&format!("phone-{name}-{w}-{theme}")).await?;
                // The navigation: every link visible and inside the viewport; at the bottom on a phone.
                let nav = b
                    .eval(
                        "const rs = [...document.querySelectorAll('#nav a')].map(a => a.getBoundingClientRect());
                         return { n: rs.length, inside: rs.every(r => r.width > 0 && r.left >= 0 && r.right <= innerWidth && r.bottom <= innerHeight),
                                  bottom: rs.every(r => r.bottom >= innerHeight - 2), top: rs.every(r => r.top < 60) };",
                        vec![],
                    )
                    .await?;
                ensure!(nav["n"] == 6 && nav["inside"] == true, "{what}: navigation {nav}");
                if w == PHONE.0 {
                    ensure!(nav["bottom"] == true, "{what}: the phone's navigation is a bottom bar: {nav}");
                } else {
                    ensure!(nav["top"] == true, "{what}: the desktop's navigation is at the top: {nav}");
                }
                if *name == "thread" {
                    let head = b
                        .eval("return document.querySelector('.thread-head').getBoundingClientRect().height;", vec![])
                        .await?;
                    let max = if w == PHONE.0 { 90.0 } else { 110.0 };
                    ensure!(head.as_f64().is_some_and(|px| px <= max), "{what}: the thread header is {head} px high");
                    ensure!(b.find("button.send").await?.is_displayed().await?, "{what}: a visible Send button");
                }
                if *name == "activity" && w == PHONE.0 {
                    let row = b
                        .eval(
                            "return document.querySelector('.vtable tbody tr').getBoundingClientRect().height;",
                            vec![],
                        )
                        .await?;
                    ensure!(row.as_f64().is_some_and(|px| px <= 80.0), "{what}: an Activity row is {row} px high");
                }
            }
        }
    }

    // 2. The composer: on the desktop Enter sends; on a touch screen Enter is a new line and the
    //    Send button sends.
    b.set_dark(false).await?;
    b.set_viewport(DESKTOP.0, DESKTOP.1).await?;
    b.goto(&format!("/ui/chat?c={id}")).await?;
    b.wait_until("document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]').length >= 2").await?;
    let composer = b.find("#composer").await?;
    composer.click().await?;
    composer.send_keys("desktop enter").await?;
    b.press(keys::ENTER).await?;
    b.wait_until("document.querySelector('#composer').value === '' && [...document.querySelectorAll('article.msg.user')].some(m => m.textContent.includes('desktop enter'))").await?;
    b.wait_until("document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]').length >= 3").await?;

    b.cdp("Emulation.setTouchEmulationEnabled", json!({"enabled": true, "maxTouchPoints": 5})).await?;
    b.set_viewport(PHONE.0, PHONE.1).await?;
    b.refresh().await?;
    b.wait_until("matchMedia('(pointer: coarse)').matches").await?;
    b.wait_until("document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]').length >= 3").await?;
    let composer = b.find("#composer").await?;
    composer.click().await?;
    composer.send_keys("first line").await?;
    b.press(keys::ENTER).await?;
    composer.send_keys("second line").await?;
    let v = b.eval("return document.querySelector('#composer').value;", vec![]).await?;
    ensure!(v == "first line\nsecond line", "Enter on a touch screen is a new line: {v}");
    let placeholder = b.eval("return document.querySelector('#composer').placeholder;", vec![]).await?;
    ensure!(
        !placeholder.as_str().unwrap_or_default().contains("Shift"),
        "no Shift+Enter hint on a phone: {placeholder}"
    );
    b.screenshot("phone-composer-390-touch").await?;
    b.find("button.send").await?.click().await?;
    b.wait_until("document.querySelector('#composer').value === '' && [...document.querySelectorAll('article.msg.user')].some(m => m.textContent.includes('second line'))").await?;
    b.assert_clean().await;
    Ok(())
}
