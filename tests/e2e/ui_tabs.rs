//! Any number of console tabs in one real headless Chromium (`coffer_tests::browser`) against a
//! real daemon with the scripted agent (issue 35 §2). A browser opens at most six HTTP/1.1
//! connections per host for all its tabs; the console therefore holds ONE multiplexed event
//! stream per browser (`GET /v1/events`, held by the tab elected with Web Locks, events passed to
//! the others by BroadcastChannel), and every send carries an Idempotency-Key, shows
//! "Sending…", is retried with backoff, and ends "Not sent" with Retry when it cannot go.
//!
//! Six tabs on four conversations (two pairs on the same one) each send and receive, while the
//! daemon counts exactly one event stream open (`GET /v1/events/streams`); the hub tab closes
//! and another takes over. A send whose answer is lost is retried with the same key and lands
//! once; a send while the network is down retries visibly and lands once when it is back, and
//! past its tries shows Retry; a send the daemon got but the page never heard back from is sent
//! again after a reload and still lands once.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::browser::{Browser, keys};
use coffer_tests::{Api, SendExt, TestHome, chat};
use serde_json::{Value, json};

async fn ui() -> anyhow::Result<(TestHome, Api, Browser)> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    Ok((home, api, b))
}

async fn create(api: &Api, title: &str) -> anyhow::Result<String> {
    let r = api.post_json("/v1/conversations", &json!({"agent_key": chat::SCRIPTED, "title": title})).reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    Ok(r.json()?["id"].as_str().context("id")?.to_owned())
}

/// Opens conversation `id` in the current tab and waits for its thread.
async fn open(b: &Browser, id: &str) -> anyhow::Result<()> {
    b.open_conversation(id).await
}

async fn type_and_send(b: &Browser, text: &str) -> anyhow::Result<()> {
    let composer = b.find("#composer").await?;
    composer.click().await?;
    composer.send_keys(text).await?;
    b.press(keys::ENTER).await
}

/// Waits until the current tab shows a finished reply containing `text`.
async fn wait_reply(b: &Browser, text: &str) -> anyhow::Result<()> {
    b.wait_until(&format!(
        "[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes({}))",
        json!(text)
    ))
    .await
}

/// How many stored user messages of conversation `id` say exactly `text`.
async fn stored(api: &Api, id: &str, text: &str) -> anyhow::Result<usize> {
    let v = api.get(&format!("/v1/conversations/{id}/messages?limit=500")).reply().await?.json()?;
    let items = v["items"].as_array().context("items")?;
    Ok(items
        .iter()
        .filter(|m| m["role"] == "user")
        .filter(|m| m["blocks"].as_array().is_some_and(|b| b.iter().any(|b| b["text"] == text)))
        .count())
}

/// The daemon's count of open chat event streams.
async fn streams(api: &Api) -> anyhow::Result<Value> {
    let r = api.get("/v1/events/streams").reply().await?;
    ensure!(r.status == 200, "streams: {} {}", r.status, r.text);
    r.json()
}

/// Waits until the daemon serves exactly one multiplexed stream with `subs` subscriptions (any
/// number for `None`) and no single-purpose chat stream.
async fn one_stream(api: &Api, subs: impl Into<Option<u64>>) -> anyhow::Result<()> {
    let subs = subs.into();
    let last = std::sync::Mutex::new(Value::Null);
    let got = coffer_tests::wait_for("one event stream for the whole browser", Duration::from_secs(30), || async {
        let now = streams(api).await?;
        let done = now["multiplexed"] == 1
            && now["conversation"] == 0
            && now["list"] == 0
            && subs.is_none_or(|n| now["subscriptions"] == n);
        *last.lock().unwrap_or_else(|e| e.into_inner()) = now;
        Ok(done.then_some(()))
    })
    .await;
    got.with_context(|| format!("the daemon counts {}", last.lock().unwrap_or_else(|e| e.into_inner())))
}

/// Whether the current tab holds the browser's event stream (js/chat/events.js).
async fn holds_stream(b: &Browser) -> anyhow::Result<bool> {
    let v = b
        .eval_async(
            "const done = arguments[arguments.length - 1];\
             import('/ui/assets/js/chat/events.js').then(m => done(m.holdsStream()), e => done(String(e)));",
            vec![],
        )
        .await?;
    v.as_bool().with_context(|| format!("holdsStream: {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_tabs_six_tabs_send_and_receive_over_one_event_stream() -> anyhow::Result<()> {
    let (_home, api, b) = ui().await?;
    let mut convs = Vec::new();
    for i in 0..4 {
        convs.push(create(&api, &format!("Tab conversation {i}")).await?);
    }
    // Tabs 0 and 1 show conversation 0; tabs 2 and 5 conversation 1; tabs 3 and 4 their own.
    let plan = [0, 0, 1, 2, 3, 1];
    let mut tabs = vec![b.current_tab().await?];
    open(&b, &convs[plan[0]]).await?;
    for &c in &plan[1..] {
        tabs.push(b.new_tab().await?);
        open(&b, &convs[c]).await?;
    }
    // Six tabs, each following the list and a thread: one stream, twelve subscriptions.
    one_stream(&api, 12).await?;
    let mut hubs = Vec::new();
    for t in &tabs {
        b.switch_to(t).await?;
        hubs.push(holds_stream(&b).await?);
    }
    ensure!(hubs.iter().filter(|h| **h).count() == 1, "exactly one tab holds the stream: {hubs:?}");

    // Each tab sends; every send leaves at once and is answered.
    for (i, t) in tabs.iter().enumerate() {
        b.switch_to(t).await?;
        type_and_send(&b, &format!("say:hello from tab {i}")).await?;
    }
    for (i, t) in tabs.iter().enumerate() {
        b.switch_to(t).await?;
        wait_reply(&b, &format!("hello from tab {i}")).await?;
        // A tab on the same conversation as another sees the other's turn too.
        for (j, &c) in plan.iter().enumerate() {
            if j != i && c == plan[i] {
                wait_reply(&b, &format!("hello from tab {j}")).await?;
            }
        }
        ensure!(b.count("article.msg.outgoing").await? == 0, "tab {i}: nothing left on its way");
    }
    for (i, &c) in plan.iter().enumerate() {
        let n = stored(&api, &convs[c], &format!("say:hello from tab {i}")).await?;
        ensure!(n == 1, "tab {i}'s message is stored once, not {n} times");
    }
    b.screenshot("tabs-six").await?;

    // The tab holding the stream closes: another takes it over (still one stream, now with the
    // five remaining tabs' ten subscriptions), and sending and receiving go on.
    let hub = hubs.iter().position(|h| *h).context("a hub")?;
    b.switch_to(&tabs[hub]).await?;
    b.close_tab().await?;
    let left: Vec<usize> = (0..tabs.len()).filter(|&i| i != hub).collect();
    b.switch_to(&tabs[left[0]]).await?;
    one_stream(&api, 10).await?;
    for &i in &left {
        b.switch_to(&tabs[i]).await?;
        type_and_send(&b, &format!("say:again from tab {i}")).await?;
    }
    for &i in &left {
        b.switch_to(&tabs[i]).await?;
        wait_reply(&b, &format!("again from tab {i}")).await?;
        ensure!(
            stored(&api, &convs[plan[i]], &format!("say:again from tab {i}")).await? == 1,
            "tab {i}'s second message is stored once"
        );
    }
    b.assert_clean().await;
    Ok(())
}

/// Replaces the page's `fetch` for message sends (`POST …/messages`) with `mode`:
/// `drop-first-answer` sends the first for real but loses its answer (as a dropped connection
/// would), `hang` sends each for real and never tells the page. Every send is recorded in
/// `window.__sends` as `{key, status, replayed}`; `window.__landed` counts answers.
async fn patch_fetch(b: &Browser, mode: &str) -> anyhow::Result<()> {
    b.eval(
        "const mode = arguments[0];\
         window.__sends = []; window.__landed = 0;\
         const real = window.fetch.bind(window); let dropped = false;\
         window.fetch = async (url, init) => {\
           const send = init && init.method === 'POST' && /\\/messages$/.test(String(url));\
           if (!send) return real(url, init);\
           const key = init.headers['Idempotency-Key'];\
           const go = real(url, init).then(r => { window.__landed += 1;\
             window.__sends.push({ key, status: r.status, replayed: r.headers.get('Idempotent-Replayed') }); return r; });\
           if (mode === 'hang') return new Promise(() => {});\
           const r = await go;\
           if (mode === 'drop-first-answer' && !dropped) { dropped = true; throw new TypeError('Failed to fetch'); }\
           return r;\
         }; return null;",
        vec![json!(mode)],
    )
    .await
    .map(drop)
}

async fn offline(b: &Browser, off: bool) -> anyhow::Result<()> {
    b.cdp("Network.enable", json!({})).await?;
    b.cdp(
        "Network.emulateNetworkConditions",
        json!({"offline": off, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}),
    )
    .await
    .map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_tabs_a_send_is_retried_visibly_and_lands_once() -> anyhow::Result<()> {
    let (_home, api, b) = ui().await?;
    // Offline, every request fails in the console (expected here).
    for expected in ["ERR_INTERNET_DISCONNECTED", "Failed to load resource", "/v1/events"] {
        b.allow_console(expected);
    }
    let id = create(&api, "Retries").await?;
    open(&b, &id).await?;

    // The daemon gets the send but its answer is lost: the page tries again with the same key,
    // the daemon answers with the first answer, and the message is queued once.
    patch_fetch(&b, "drop-first-answer").await?;
    type_and_send(&b, "say:exactly once").await?;
    wait_reply(&b, "exactly once").await?;
    // The reply may stream in before the retry is answered: wait for it.
    b.wait_gone("article.msg.outgoing").await?;
    let sends = b.eval("return window.__sends;", vec![]).await?;
    let sends = sends.as_array().context("sends")?;
    ensure!(sends.len() == 2, "one try and one retry: {sends:?}");
    ensure!(sends[0]["key"] == sends[1]["key"] && sends[0]["key"].as_str().is_some_and(|k| k.len() == 32), "{sends:?}");
    ensure!(sends[1]["replayed"] == "true" && sends[1]["status"] == 202, "the retry got the first answer: {sends:?}");
    ensure!(stored(&api, &id, "say:exactly once").await? == 1, "stored once");

    // The network goes away: the message shows it is on its way
    // and being tried again; when the network is back it lands, once, and the reply streams in.
    offline(&b, true).await?;
    type_and_send(&b, "say:after the outage").await?;
    b.wait_for_text("article.msg.outgoing[data-state=\"sending\"] .send-state", "trying again").await?;
    b.screenshot("tabs-sending-retry").await?;
    offline(&b, false).await?;
    wait_reply(&b, "after the outage").await?;
    b.wait_gone("article.msg.outgoing").await?;
    ensure!(stored(&api, &id, "say:after the outage").await? == 1, "stored once");

    // Past its tries the message says it was not sent, with Retry; Retry sends it (once). The
    // page's waits between tries are shortened (its five tries stay): 0.4 s instead of 7.5 s.
    b.shorten_chat_backoffs(None, Some(25)).await?;
    offline(&b, true).await?;
    type_and_send(&b, "say:by hand").await?;
    b.wait_until_within(
        "document.querySelector('article.msg.outgoing[data-state=\"failed\"] button.retry-send') !== null",
        Duration::from_secs(40),
    )
    .await?;
    b.wait_for_text(".toast.error", "Not sent").await?;
    let state = b.find("article.msg.outgoing .send-state").await?.text().await?;
    ensure!(state.starts_with("Not sent:"), "the failed state says so: {state}");
    b.screenshot("tabs-send-failed").await?;
    ensure!(stored(&api, &id, "say:by hand").await? == 0, "nothing stored while offline");
    offline(&b, false).await?;
    b.find("article.msg.outgoing button.retry-send").await?.click().await?;
    wait_reply(&b, "by hand").await?;
    b.wait_gone("article.msg.outgoing").await?;
    ensure!(stored(&api, &id, "say:by hand").await? == 1, "stored once");
    b.assert_clean().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_tabs_a_send_unconfirmed_at_a_reload_is_sent_again_and_lands_once() -> anyhow::Result<()> {
    let (_home, api, b) = ui().await?;
    let id = create(&api, "Reload mid-send").await?;
    open(&b, &id).await?;
    // The send reaches the daemon, but the page never hears back (the stuck request of the
    // issue); the user reloads.
    patch_fetch(&b, "hang").await?;
    type_and_send(&b, "say:sent before the reload").await?;
    b.wait_until("window.__landed === 1").await?;
    b.wait_for_text("article.msg.outgoing[data-state=\"sending\"]", "sent before the reload").await?;
    let kept = b.eval(&format!("return sessionStorage.getItem('coffer.outbox.{id}');"), vec![]).await?;
    ensure!(kept.as_str().is_some_and(|k| k.contains("sent before the reload")), "kept for a reload: {kept}");
    b.refresh().await?;
    b.wait_for(&format!(".conv-item[aria-current=\"true\"][data-id=\"{id}\"]")).await?;
    // The page sends it again with its key: the daemon answers with the first answer.
    wait_reply(&b, "sent before the reload").await?;
    b.wait_gone("article.msg.outgoing").await?;
    let kept = b.eval(&format!("return sessionStorage.getItem('coffer.outbox.{id}');"), vec![]).await?;
    ensure!(kept.is_null(), "nothing left to send: {kept}");
    ensure!(stored(&api, &id, "say:sent before the reload").await? == 1, "stored once, not twice");
    let shown = b
        .eval(
            "return [...document.querySelectorAll('article.msg.user')].filter(m => m.textContent.includes('sent before the reload')).length;",
            vec![],
        )
        .await?;
    ensure!(shown == json!(1), "shown once: {shown}");
    b.assert_clean().await;
    Ok(())
}

/// Whether the current tab becomes the one holding the stream within the wait.
async fn wait_holds_stream(b: &Browser) -> anyhow::Result<()> {
    coffer_tests::wait_for("this tab to hold the event stream", Duration::from_secs(20), || async {
        Ok(holds_stream(b).await?.then_some(()))
    })
    .await
}

/// A page frozen by the browser (as Android Chrome freezes background tabs; here through the
/// DevTools lifecycle command) hands the stream to another tab, which goes on sending and
/// receiving; resumed, the frozen tab catches up with what happened meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_tabs_a_frozen_tab_hands_the_stream_over_and_catches_up_when_resumed() -> anyhow::Result<()> {
    let (_home, api, b) = ui().await?;
    let id = create(&api, "Frozen").await?;
    let first = b.current_tab().await?;
    open(&b, &id).await?;
    let second = b.new_tab().await?;
    open(&b, &id).await?;
    one_stream(&api, 4).await?;
    b.switch_to(&first).await?;
    let (hub, other) = if holds_stream(&b).await? { (first, second) } else { (second, first) };

    b.switch_to(&hub).await?;
    b.cdp("Page.setWebLifecycleState", json!({"state": "frozen"})).await?;
    b.switch_to(&other).await?;
    wait_holds_stream(&b).await?;
    // (Whether the frozen tab's subscriptions are still held depends on how far it got before
    // it froze: it may have re-announced them; either way one stream.)
    one_stream(&api, None).await?;
    type_and_send(&b, "say:while frozen").await?;
    wait_reply(&b, "while frozen").await?;

    b.switch_to(&hub).await?;
    b.cdp("Page.setWebLifecycleState", json!({"state": "active"})).await?;
    wait_reply(&b, "while frozen").await?;
    one_stream(&api, 4).await?;
    ensure!(stored(&api, &id, "say:while frozen").await? == 1, "stored once");
    b.assert_clean().await;
    Ok(())
}
