//! The web console's Chat page in a real headless Chromium (`coffer_tests::browser`) against a
//! real daemon: the scripted agent (`coffer-test-daemon scripted-chat`, script in
//! `coffer_tests::chat`) for most flows, the real Claude Code CLI on `FakeAnthropic` for one
//! full streamed turn. Streaming; messages queued during a turn, edited, removed; stop, resume,
//! discard; a second tab mid-turn; an SSE drop mid-turn (the gateway restarts) and a daemon
//! restart; create, rename, archive, restore, delete; the list live from another tab; the
//! no-agent empty state; hostile strings rendered inert; a 5 MB reply and a 2,000-message
//! conversation staying responsive. Every test ends with `assert_clean()` (no console error or
//! warning, no request to another origin); screenshots go to `target/ui-screenshots/`.
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use coffer_tests::browser::{Browser, PHONE, keys};
use coffer_tests::{Api, SendExt, TestHome, chat};
use reqwest::Method;
use serde_json::{Value, json};

/// How long a turn of the real Claude Code CLI on the fake model may take on a loaded machine.
const REAL_TURN: Duration = Duration::from_secs(90);

/// A daemon with the scripted agent and a signed-in browser on the chat page.
struct Ui {
    home: TestHome,
    api: Api,
    b: Browser,
}

async fn ui() -> anyhow::Result<Ui> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    Ok(Ui { home, api, b })
}

/// A scripted conversation created over REST; its id.
async fn create(api: &Api, title: &str) -> anyhow::Result<String> {
    let r = api.post_json("/v1/conversations", &json!({"agent_key": chat::SCRIPTED, "title": title})).reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    Ok(r.json()?["id"].as_str().context("id")?.to_owned())
}

async fn send(api: &Api, id: &str, text: &str) -> anyhow::Result<Value> {
    let r = api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": text})).reply().await?;
    ensure!(r.status == 202, "send: {} {}", r.status, r.text);
    r.json()
}

/// Opens conversation `id` and waits for its thread.
async fn open(b: &Browser, id: &str) -> anyhow::Result<()> {
    b.open_conversation(id).await
}

/// Types `text` into the composer (a new line as Shift+Enter, as a user would) and presses Enter.
async fn type_and_send(b: &Browser, text: &str) -> anyhow::Result<()> {
    let composer = b.find("#composer").await?;
    composer.click().await?;
    let lines: Vec<&str> = text.split('\n').collect();
    for (i, line) in lines.iter().enumerate() {
        composer.send_keys(line).await?;
        if i + 1 < lines.len() {
            b.chord(&[keys::SHIFT, keys::ENTER]).await?;
        }
    }
    b.press(keys::ENTER).await
}

/// A JSON array from a script.
async fn strings(b: &Browser, script: &str) -> anyhow::Result<Vec<String>> {
    let v = b.eval(script, vec![]).await?;
    Ok(v.as_array().context("an array")?.iter().map(|s| s.as_str().unwrap_or_default().to_owned()).collect())
}

async fn pending_texts(b: &Browser) -> anyhow::Result<Vec<String>> {
    strings(b, "return [...document.querySelectorAll('.pending-item .pending-text')].map(e => e.textContent);").await
}

/// The text of each finished assistant message, in order.
async fn replies(b: &Browser) -> anyhow::Result<Vec<String>> {
    strings(
        b,
        "return [...document.querySelectorAll('article.msg.assistant:not([data-status=\"streaming\"]) .msg-body')]\
         .map(e => e.textContent.trim());",
    )
    .await
}

/// The pending queue over REST: `(texts, paused)`.
async fn queue(api: &Api, id: &str) -> anyhow::Result<(Vec<String>, bool)> {
    let v = api.get(&format!("/v1/conversations/{id}")).reply().await?.json()?;
    let items = v["pending"]["items"].as_array().context("items")?;
    Ok((
        items.iter().map(|i| i["text"].as_str().unwrap_or_default().to_owned()).collect(),
        v["pending"]["paused"] == true,
    ))
}

/// Waits until conversation `id` has no turn running and holds at least two messages.
async fn idle(api: &Api, id: &str) -> anyhow::Result<()> {
    coffer_tests::wait_for("the turn to end", Duration::from_secs(30), || async {
        let v = api.get(&format!("/v1/conversations/{id}")).reply().await?.json()?;
        let c = &v["conversation"];
        Ok((c["turn_running"] == false && c["message_count"].as_u64().unwrap_or(0) >= 2).then_some(()))
    })
    .await
}

/// Clicks the button in `scope` whose text is `label`.
async fn click_button(b: &Browser, scope: &str, label: &str) -> anyhow::Result<()> {
    let script = "return [...document.querySelectorAll(arguments[0] + ' button')]\
        .find(e => e.textContent.trim() === arguments[1] && !e.hidden) || null;";
    let el = coffer_tests::wait_for(&format!("a button {label:?} in {scope}"), Duration::from_secs(20), || async {
        let v = b.eval(script, vec![json!(scope), json!(label)]).await?;
        Ok((!v.is_null()).then_some(v))
    })
    .await?;
    b.element(&el)?.click().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_streams_queues_edits_removes_stops_resumes_and_discards() -> anyhow::Result<()> {
    let Ui { home: _home, api, b } = ui().await?;
    let id = create(&api, "Queue and stop").await?;
    open(&b, &id).await?;

    // Streaming: words appear while the turn runs (as markdown shortly after), then the stored
    // reply with model and usage.
    // Paced so that the reply is still streaming after the checks below on a loaded machine
    // (each browser round trip may take a few hundred ms): 14 words, 400 ms apart.
    type_and_send(&b, "slow:400\nsay:**alpha** beta gamma delta epsilon eta theta iota kappa lambda mu nu xi zeta")
        .await?;
    b.wait_until("(document.querySelector('.streaming-text') || {}).textContent?.includes('beta')").await?;
    b.wait_for(".streaming-text strong").await?;
    let partial = b.eval("return document.querySelector('.streaming-text').textContent;", vec![]).await?;
    assert!(!partial.as_str().unwrap_or_default().contains("zeta"), "text streams in: {partial}");
    assert!(b.find(".stop").await?.is_displayed().await?, "a stop button while the turn runs");
    b.screenshot("chat-streaming").await?;
    b.wait_until("[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('zeta'))").await?;
    let foot = b.find("article.msg.assistant[data-status=\"complete\"] .msg-foot").await?.text().await?;
    assert!(foot.contains("scripted-model") && foot.contains("out"), "model and usage per reply: {foot}");
    assert_eq!(
        replies(&b).await?.last().map(String::as_str),
        Some("alpha beta gamma delta epsilon eta theta iota kappa lambda mu nu xi zeta")
    );

    // A turn that hangs; three messages typed meanwhile become pending items, one per line, and
    // the composer stays usable.
    type_and_send(&b, "hang").await?;
    b.wait_until("!document.querySelector('.stop').hidden").await?;
    for t in ["say:one", "say:two", "say:three"] {
        type_and_send(&b, t).await?;
    }
    b.wait_until("document.querySelectorAll('.pending-item').length === 3").await?;
    assert_eq!(pending_texts(&b).await?, ["say:one", "say:two", "say:three"]);
    let composer = b.find("#composer").await?;
    assert_eq!(composer.prop("disabled").await?, json!(false), "the composer never locks");
    assert_eq!(composer.prop("value").await?, json!(""));
    b.screenshot("chat-pending").await?;

    // Remove the second; edit the first: it comes back into the composer, and sending it puts
    // it at the end of the queue.
    let remove =
        "return document.querySelectorAll('.pending-item')[1].querySelector('button[aria-label^=\"Remove\"]');";
    b.element(&b.eval(remove, vec![]).await?)?.click().await?;
    b.wait_until("document.querySelectorAll('.pending-item').length === 2").await?;
    assert_eq!(queue(&api, &id).await?.0, ["say:one", "say:three"]);
    let edit = "return document.querySelectorAll('.pending-item')[0].querySelector('button[aria-label^=\"Edit\"]');";
    b.element(&b.eval(edit, vec![]).await?)?.click().await?;
    b.wait_until("document.querySelector('#composer').value === 'say:one'").await?;
    b.wait_until("document.querySelectorAll('.pending-item').length === 1").await?;
    let composer = b.find("#composer").await?;
    composer.send_keys(" edited").await?;
    b.press(keys::ENTER).await?;
    b.wait_until("document.querySelectorAll('.pending-item').length === 2").await?;
    assert_eq!(pending_texts(&b).await?, ["say:three", "say:one edited"]);
    assert_eq!(queue(&api, &id).await?, (vec!["say:three".to_owned(), "say:one edited".to_owned()], false));

    // Stop: the hung reply is kept as stopped, the queue pauses and offers resume and discard.
    b.find(".stop").await?.click().await?;
    b.wait_for("article.msg.assistant[data-status=\"interrupted\"]").await?;
    b.wait_for(".pending-head.paused").await?;
    assert!(b.find(".stop").await?.attr("hidden").await?.is_some(), "no stop button when idle");
    assert!(queue(&api, &id).await?.1, "the queue is paused");
    b.screenshot("chat-paused").await?;

    // Resume: both run, in order, one turn each.
    click_button(&b, ".pending-head", "Resume").await?;
    b.wait_until("[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('one edited'))").await?;
    let all = replies(&b).await?;
    let three = all.iter().position(|t| t.starts_with("three")).context("three ran")?;
    let one = all.iter().position(|t| t.starts_with("one edited")).context("one edited ran")?;
    assert!(three < one, "in queue order: {all:?}");
    b.wait_until("document.querySelector('.pending').hidden").await?;

    // Discard: another stop (Escape in the composer) with one waiting; discard empties it.
    type_and_send(&b, "hang").await?;
    b.wait_until("!document.querySelector('.stop').hidden").await?;
    type_and_send(&b, "say:never").await?;
    b.wait_until("document.querySelectorAll('.pending-item').length === 1").await?;
    b.find("#composer").await?.click().await?;
    b.press(keys::ESCAPE).await?;
    b.wait_for(".pending-head.paused").await?;
    click_button(&b, ".pending-head", "Discard").await?;
    b.wait_until("document.querySelector('.pending').hidden").await?;
    assert_eq!(queue(&api, &id).await?, (vec![], false));
    assert!(!replies(&b).await?.iter().any(|t| t.contains("never")), "a discarded message never runs");
    b.assert_clean().await;
    Ok(())
}

/// After a revoke the page speaks plainly and the composer's draft is not lost: a 401 in the
/// page says the session ended and how to sign in again, the sign-in screen says the draft is
/// kept, and signing in again in the same tab brings it back into the composer. A draft in a
/// conversation deleted elsewhere stays on the empty view, to copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_a_draft_survives_a_revoke_and_a_deletion_elsewhere() -> anyhow::Result<()> {
    let Ui { home, api, b } = ui().await?;
    let id = create(&api, "Draft kept").await?;
    open(&b, &id).await?;
    b.find("#composer").await?.send_keys("half a thought").await?;
    b.allow_console("the server responded with a status of 401");
    home.cli(&["ui", "--logout-all"]).await?.ok()?;
    // The page's next call answers 401: its message is for a person, not for the CLI.
    let message = b
        .eval_async(
            "const done = arguments[arguments.length - 1];              import('/ui/assets/js/api.js').then(m => m.get('/v1/status')).then(() => done('no error'), e => done(e.message));",
            vec![],
        )
        .await?;
    assert_eq!(message, json!("Your session ended. Run `coffer ui` to sign in again."));
    b.wait_for_text("#page h1", "Sign in to Coffer").await?;
    b.wait_for_text("#page .draft-note", "unsent message is kept").await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    open(&b, &id).await?;
    b.wait_until("document.querySelector('#composer').value === 'half a thought'").await?;

    // Deleted elsewhere while a draft is in the composer.
    b.find("#composer").await?.send_keys(", and more").await?;
    let r = api.request(Method::DELETE, &format!("/v1/conversations/{id}")).reply().await?;
    ensure!(r.status.is_success(), "delete: {} {}", r.status, r.text);
    b.wait_for_text(".draft-kept", "was deleted").await?;
    b.wait_until("document.querySelector('.draft-kept textarea').value === 'half a thought, and more'").await?;
    b.wait_for(".thread-empty-state").await?;
    b.screenshot("chat-draft-kept").await?;
    click_button(&b, ".draft-kept", "Discard").await?;
    b.wait_gone(".draft-kept").await?;
    b.assert_clean().await;
    Ok(())
}

/// A message over the 2 MiB body limit: the page says which limit, and the composer keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_a_message_over_the_limit_names_it_and_stays_in_the_composer() -> anyhow::Result<()> {
    let Ui { home: _home, api, b } = ui().await?;
    let id = create(&api, "Too big").await?;
    open(&b, &id).await?;
    // The messages route takes bodies up to 56 MiB (attachments), so the chat service refuses
    // the text itself (400), naming its 1 MiB limit.
    b.allow_console("the server responded with a status of 400");
    // Typing 2 MiB through WebDriver takes too long: the text is put in, as a paste would.
    b.eval(
        "const c = document.querySelector('#composer'); c.value = 'x'.repeat(2200000);          c.dispatchEvent(new Event('input')); c.focus(); return null;",
        vec![],
    )
    .await?;
    b.press(keys::ENTER).await?;
    b.wait_for_text("#toasts", "over the limit of 1 MiB").await?;
    b.wait_until("document.querySelector('#composer').value.length === 2200000").await?;
    assert_eq!(queue(&api, &id).await?.0.len(), 0, "nothing was queued");
    b.assert_clean().await;
    Ok(())
}

/// Small things: the keys help has one close button; a title with bidi overrides is isolated
/// on the page and stripped from the tab's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_keys_help_has_one_close_button_and_titles_are_bidi_isolated() -> anyhow::Result<()> {
    let Ui { home: _home, api, b } = ui().await?;
    let id = create(&api, "evil \u{202E}txt.exe\u{2066} name").await?;
    open(&b, &id).await?;
    for css in [".thread-title", &format!(".conv-item[data-id=\"{id}\"] .conv-title")] {
        let el = b.find(css).await?;
        assert_eq!(el.attr("dir").await?.as_deref(), Some("auto"), "{css}");
        let bidi = b.eval("return getComputedStyle(arguments[0]).unicodeBidi;", vec![el.arg()]).await?;
        assert_eq!(bidi, json!("isolate"), "{css}");
    }
    let tab = b.eval("return document.title;", vec![]).await?;
    let tab = tab.as_str().unwrap_or_default();
    assert!(tab.contains("txt.exe") && !tab.contains('\u{202E}') && !tab.contains('\u{2066}'), "{tab:?}");

    click_button(&b, ".convs-head", "?").await?;
    b.wait_for("dialog.modal").await?;
    assert_eq!(b.count("dialog.modal button").await?, 1, "one close button");
    b.find("dialog.modal button").await?.click().await?;
    b.wait_gone("dialog.modal").await?;
    b.assert_clean().await;
    Ok(())
}

/// Six messages typed as fast as WebDriver can during a hanging turn: the pending queue, on the
/// page and over REST, holds them in the order typed (the page sends one after another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_messages_typed_quickly_keep_their_order() -> anyhow::Result<()> {
    let Ui { home: _home, api, b } = ui().await?;
    let id = create(&api, "Quick typing").await?;
    open(&b, &id).await?;
    let expected: Vec<String> = (0..6).map(|i| format!("say:m{i}")).collect();
    for round in 0..3 {
        type_and_send(&b, "hang").await?;
        b.wait_until("!document.querySelector('.stop').hidden").await?;
        // One WebDriver call types all six, each ended by Enter.
        let burst: String = expected.iter().map(|t| format!("{t}{}", keys::ENTER)).collect();
        b.find("#composer").await?.send_keys(&burst).await?;
        b.wait_until("document.querySelectorAll('.pending-item').length === 6").await?;
        assert_eq!(pending_texts(&b).await?, expected, "round {round}: the page's queue");
        assert_eq!(queue(&api, &id).await?.0, expected, "round {round}: the stored queue");
        // Stop and discard before the next round.
        b.find(".stop").await?.click().await?;
        b.wait_for(".pending-head.paused").await?;
        click_button(&b, ".pending-head", "Discard").await?;
        b.wait_until("document.querySelector('.pending').hidden").await?;
    }
    b.assert_clean().await;
    Ok(())
}

/// `coffer ui --logout-all` while a chat tab follows a running turn: the edge ends that
/// session's streams, and the tab shows the sign-in screen by itself (no click, no reload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_a_revoke_signs_an_open_tab_out_without_a_click() -> anyhow::Result<()> {
    let Ui { home, api, b } = ui().await?;
    let id = create(&api, "Revoked mid-turn").await?;
    open(&b, &id).await?;
    type_and_send(&b, "hang").await?;
    b.wait_until("!document.querySelector('.stop').hidden").await?;
    // The streams' reconnections and the session probe answer 401 by design.
    b.allow_console("the server responded with a status of 401");
    home.cli(&["ui", "--logout-all"]).await?.ok()?;
    b.wait_until_within(
        "[...document.querySelectorAll('h1')].some(e => e.textContent.includes('Sign in to Coffer'))",
        Duration::from_secs(10),
    )
    .await
    .context("the open tab did not show the sign-in screen after the revoke")?;
    b.wait_gone("#page[data-page]").await?;
    b.screenshot("chat-revoked").await?;
    b.assert_clean().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_a_second_tab_sees_the_same_stream_and_the_list_updates_live() -> anyhow::Result<()> {
    let Ui { home: _home, api, b } = ui().await?;
    let id = create(&api, "Two tabs").await?;
    open(&b, &id).await?;
    let first = b.current_tab().await?;
    // Long enough (24 words, 400 ms apart: about 10 s) for a second tab to open mid-turn on a
    // loaded machine.
    let words: Vec<String> = (1..=24).map(|i| format!("w{i:02}")).collect();
    send(&api, &id, &format!("slow:400\nsay:{}", words.join(" "))).await?;
    b.wait_until("(document.querySelector('.streaming-text') || {}).textContent?.includes('w02')").await?;

    // A second tab joins mid-turn: it replays the turn so far and follows it live.
    let second = b.new_tab().await?;
    open(&b, &id).await?;
    b.wait_until("(document.querySelector('.streaming-text') || {}).textContent?.includes('w01')").await?;
    b.wait_until("[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('w24'))").await?;
    let want = words.join(" ");
    assert!(replies(&b).await?.iter().any(|t| t.starts_with(&want)), "the whole reply, once: {:?}", replies(&b).await?);
    b.switch_to(&first).await?;
    b.wait_until("[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('w24'))").await?;
    assert!(replies(&b).await?.iter().any(|t| t.starts_with(&want)));

    // The second tab starts a conversation through the dialog and renames it; the first tab's
    // list follows without a reload.
    b.switch_to(&second).await?;
    b.find(".new-conv").await?.click().await?;
    b.wait_for("dialog.modal #new-agent").await?;
    b.eval(
        "const s = document.querySelector('#new-agent'); s.value = 'scripted'; s.dispatchEvent(new Event('change'));",
        vec![],
    )
    .await?;
    b.find("#new-title").await?.send_keys("Made in tab two").await?;
    b.find("dialog.modal button[type=submit]").await?.click().await?;
    b.wait_until("!document.querySelector('dialog.modal')").await?;
    b.wait_for_text(".thread-title", "Made in tab two").await?;
    let url = b.current_url().await?;
    let new_id = url.query_pairs().find(|(k, _)| k == "c").map(|(_, v)| v.into_owned()).context("?c= in the URL")?;
    b.switch_to(&first).await?;
    b.wait_for_text(&format!(".conv-item[data-id=\"{new_id}\"]"), "Made in tab two").await?;
    b.switch_to(&second).await?;
    click_button(&b, ".thread-actions", "Rename").await?;
    let title = b.wait_for("#edit-title").await?;
    title.clear().await?;
    title.send_keys("Renamed in tab two").await?;
    b.find("dialog.modal button[type=submit]").await?.click().await?;
    b.switch_to(&first).await?;
    b.wait_for_text(&format!(".conv-item[data-id=\"{new_id}\"]"), "Renamed in tab two").await?;
    b.assert_clean().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_recovers_from_a_gateway_restart_mid_turn_and_keeps_everything_across_a_daemon_restart()
-> anyhow::Result<()> {
    let Ui { home, api, b } = ui().await?;
    // The dropped stream shows as a failed request while the gateway is away (expected).
    b.allow_console("/events");
    b.allow_console("ERR_CONNECTION_REFUSED");
    b.allow_console("ERR_INCOMPLETE_CHUNKED_ENCODING");
    let id = create(&api, "Survives restarts").await?;
    open(&b, &id).await?;
    let words: Vec<String> = (1..=16).map(|i| format!("r{i:02}")).collect();
    type_and_send(&b, &format!("slow:250\nsay:{}", words.join(" "))).await?;
    b.wait_until("(document.querySelector('.streaming-text') || {}).textContent?.includes('r02')").await?;

    // The gateway restarts (the turn runs on in coffer-chat): the page reconnects with
    // Last-Event-ID and shows the complete reply, once.
    let r = api.post("/v1/daemon/services/gateway/restart").reply().await?;
    ensure!(r.status.as_u16() < 300, "restart: {} {}", r.status, r.text);
    b.wait_until_within(
        "[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('r16'))",
        Duration::from_secs(60),
    )
    .await?;
    let want = words.join(" ");
    let got = replies(&b).await?;
    assert!(got.iter().any(|t| t.starts_with(&want)), "the complete reply after the drop: {got:?}");
    assert_eq!(
        b.eval("return document.querySelectorAll('.thinking').length;", vec![]).await?,
        json!(0),
        "nothing spins"
    );
    b.wait_until("document.querySelector('.stream-banner').hidden").await?;

    // A turn that hangs with a message queued behind it when the daemon stops.
    type_and_send(&b, "hang").await?;
    b.wait_until("!document.querySelector('.stop').hidden").await?;
    type_and_send(&b, "say:queued before the restart").await?;
    b.wait_until("document.querySelectorAll('.pending-item').length === 1").await?;

    // The daemon restarts: after a reload everything is there — the finished reply, the cut
    // turn marked failed, the queue restored paused — and resuming runs the queued message.
    // A sign-in lasts one run of the daemon: the open page's streams, reconnecting to the new
    // one before the new login below, are refused (401), and the browser signs in again.
    b.allow_console("the server responded with a status of 401");
    home.terminate_daemon(Duration::from_secs(30)).await?;
    let api = chat::start_daemon(&home).await?;
    b.set_origin(api.base_url())?;
    b.login(api.base_url(), api.token(), "chat").await?;
    open(&b, &id).await?;
    b.wait_until("document.querySelectorAll('article.msg').length === 4").await?;
    let got = replies(&b).await?;
    assert!(got.iter().any(|t| t.starts_with(&want)), "stored: {got:?}");
    b.wait_for("article.msg.assistant[data-status=\"failed\"]").await?;
    b.wait_for(".pending-head.paused").await?;
    assert_eq!(pending_texts(&b).await?, ["say:queued before the restart"]);
    b.screenshot("chat-after-restart").await?;
    click_button(&b, ".pending-head", "Resume").await?;
    b.wait_until("[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('queued before the restart'))").await?;
    b.assert_clean().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_a_reply_never_spins_when_coffer_goes_away() -> anyhow::Result<()> {
    let Ui { home, api, b } = ui().await?;
    // Every request while the daemon is gone fails in the console (expected here).
    for expected in ["ERR_CONNECTION_REFUSED", "/events", "Failed to load resource"] {
        b.allow_console(expected);
    }
    let id = create(&api, "Coffer goes away").await?;
    open(&b, &id).await?;
    // The page's backoffs, shortened (the numbers of tries stay the page's): the stream's ten
    // reconnections give up in about 2 s instead of 28 s, a send's five tries in 0.4 s
    // instead of 7.5 s.
    b.shorten_chat_backoffs(Some((50, 200)), Some(25)).await?;
    let words: Vec<String> = (1..=40).map(|i| format!("g{i:02}")).collect();
    type_and_send(&b, &format!("slow:300\nsay:{}", words.join(" "))).await?;
    b.wait_until("(document.querySelector('.streaming-text') || {}).textContent?.includes('g02')").await?;
    home.terminate_daemon(Duration::from_secs(30)).await?;

    // The retries are bounded: the page says live updates stopped, keeps what streamed, and
    // nothing goes on spinning.
    b.wait_until_within(
        "document.querySelector('.stream-banner.err') && !document.querySelector('.stream-banner').hidden",
        Duration::from_secs(90),
    )
    .await?;
    assert_eq!(b.eval("return document.querySelectorAll('.thinking').length;", vec![]).await?, json!(0));
    b.wait_for_text("article.msg.assistant[data-status=\"streaming\"] .msg-foot", "live updates stopped").await?;
    let kept = b.find("article.msg.assistant[data-status=\"streaming\"] .msg-body").await?.text().await?;
    assert!(kept.contains("g02"), "what streamed stays: {kept}");
    // The list gave up at the same moment (one stream for both) and said so in a toast over
    // the composer: it goes by itself.
    b.wait_gone(".toast").await?;
    // The composer still works; a message that cannot be sent is tried again, then stays in
    // the thread marked "Not sent" with Retry (and Edit, to take it back into the composer).
    type_and_send(&b, "are you there").await?;
    b.wait_for_text(".toast.error", "Not sent").await?;
    b.wait_for_text("article.msg.outgoing[data-state=\"failed\"]", "are you there").await?;
    b.wait_for("article.msg.outgoing button.retry-send").await?;
    b.screenshot("chat-offline").await?;
    b.assert_clean().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_creates_renames_archives_restores_and_deletes() -> anyhow::Result<()> {
    let Ui { home, api, b } = ui().await?;
    let cwd = home.temp().join("project");
    std::fs::create_dir_all(&cwd)?;
    b.find(".new-conv").await?.click().await?;
    b.wait_for("dialog.modal #new-agent").await?;
    // The never-available agent is listed, disabled, with its reason.
    let missing = b.find("#new-agent option[value=\"scripted_missing\"]").await?;
    assert_eq!(missing.prop("disabled").await?, json!(true));
    b.find("dialog.modal details.unavailable summary").await?.click().await?;
    b.wait_for_text("dialog.modal details.unavailable li", "never available").await?;
    b.eval(
        "const s = document.querySelector('#new-agent'); s.value = 'scripted'; s.dispatchEvent(new Event('change'));",
        vec![],
    )
    .await?;
    b.find("#new-model").await?.send_keys("model-x").await?;
    // A bad working directory is refused with the daemon's message, the dialog stays open.
    b.allow_console("/v1/conversations - Failed to load resource: the server responded with a status of 400");
    b.find("#new-cwd").await?.send_keys("relative/dir").await?;
    b.find("dialog.modal button[type=submit]").await?.click().await?;
    b.wait_for_text("dialog.modal .error-box", "absolute").await?;
    b.screenshot("chat-new-dialog").await?;
    let cwd_in = b.find("#new-cwd").await?;
    cwd_in.clear().await?;
    cwd_in.send_keys(&cwd.display().to_string()).await?;
    b.find("#new-title").await?.send_keys("Lifecycle").await?;
    b.find("dialog.modal button[type=submit]").await?.click().await?;
    b.wait_for_text(".thread-title", "Lifecycle").await?;
    // The header's model picker shows the model the dialog set.
    b.wait_until("(document.querySelector('#thread-model') || {}).value === 'model-x'").await?;
    let list = api.get("/v1/conversations").reply().await?.json()?;
    let conv = list["items"]
        .as_array()
        .context("items")?
        .iter()
        .find(|c| c["title"] == "Lifecycle")
        .context("created")?
        .clone();
    assert_eq!(conv["agent_config"]["cwd"], cwd.display().to_string());
    assert_eq!(conv["agent_config"]["model"], "model-x");
    let id = conv["id"].as_str().context("id")?.to_owned();

    click_button(&b, ".thread-actions", "Rename").await?;
    let t = b.wait_for("#edit-title").await?;
    t.clear().await?;
    t.send_keys("Lifecycle renamed").await?;
    b.find("dialog.modal button[type=submit]").await?.click().await?;
    b.wait_for_text(".thread-title", "Lifecycle renamed").await?;
    b.wait_for_text(&format!(".conv-item[data-id=\"{id}\"]"), "Lifecycle renamed").await?;

    click_button(&b, ".thread-actions", "Archive").await?;
    b.wait_for_text(".thread-meta", "archived").await?;
    b.wait_until(&format!("!document.querySelector('.conv-item[data-id=\"{id}\"]')")).await?;
    let filter = b.find("#conv-filter").await?;
    b.eval("const s = arguments[0]; s.value = 'archived'; s.dispatchEvent(new Event('change'));", vec![filter.arg()])
        .await?;
    b.wait_for(&format!(".conv-item[data-id=\"{id}\"]")).await?;
    click_button(&b, ".thread-actions", "Restore").await?;
    b.wait_until(&format!("!document.querySelector('.conv-item[data-id=\"{id}\"]')")).await?;
    b.eval("const s = arguments[0]; s.value = 'active'; s.dispatchEvent(new Event('change'));", vec![filter.arg()])
        .await?;
    b.wait_for(&format!(".conv-item[data-id=\"{id}\"]")).await?;

    // Title search.
    create(&api, "Something else").await?;
    b.wait_for_text(".conv-item", "Something else").await?;
    b.find("#conv-search").await?.send_keys("renamed").await?;
    b.wait_until("document.querySelectorAll('.conv-item').length === 1").await?;
    b.find("#conv-search").await?.clear().await?;
    b.eval("document.querySelector('#conv-search').dispatchEvent(new Event('input'))", vec![]).await?;
    b.wait_until("document.querySelectorAll('.conv-item').length === 2").await?;

    // The keys help names Enter, Shift+Enter and Escape.
    b.find(".convs-head .help").await?.click().await?;
    let help = b.wait_for("dialog.modal").await?.text().await?;
    assert!(help.contains("Shift+Enter") && help.contains("Escape"), "{help}");
    b.press(keys::ESCAPE).await?;
    b.wait_until("!document.querySelector('dialog.modal')").await?;

    click_button(&b, ".thread-actions", "Delete").await?;
    b.wait_for_text("dialog.modal", "cannot be undone").await?;
    b.find("dialog.modal button[type=submit]").await?.click().await?;
    b.wait_until(&format!("!document.querySelector('.conv-item[data-id=\"{id}\"]')")).await?;
    api.get(&format!("/v1/conversations/{id}")).reply().await?.expect_envelope(404, "NOT_FOUND")?;
    b.assert_clean().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_without_an_agent_says_how_to_get_one() -> anyhow::Result<()> {
    // The shipped agents only, neither CLI where Coffer looks.
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let r = api
        .request(Method::PATCH, "/v1/settings")
        .json(
            &json!({"set": {"chat.claude_code_path": "/nonexistent/claude", "chat.codex_path": "/nonexistent/codex"}}),
        )
        .reply()
        .await?;
    ensure!(r.status == 200, "settings: {}", r.text);
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    b.wait_for(".no-agent").await?;
    let text = b.find(".no-agent").await?.text().await?;
    for want in [
        "No coding agent is available",
        "npm install -g @anthropic-ai/claude-code",
        "npm install -g @openai/codex",
        "chat.claude_code_path",
        "chat.codex_path",
    ] {
        assert!(text.contains(want), "the empty state says {want:?}: {text}");
    }
    b.screenshot("chat-no-agent").await?;
    // Pointing Coffer at a real Claude Code from the page makes it available.
    let claude = coffer_tests::peers::claude_code()?.display().to_string();
    b.find("#path-claude_code").await?.send_keys(&claude).await?;
    b.press(keys::ENTER).await?;
    b.wait_for_text(".thread-empty-state", "New conversation").await?;
    let agents = api.get("/v1/agents").reply().await?.json()?;
    let cc = agents["items"]
        .as_array()
        .context("items")?
        .iter()
        .find(|a| a["agent_key"] == "claude_code")
        .context("listed")?
        .clone();
    assert_eq!(cc["available"], true, "{cc}");
    b.assert_clean().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_renders_hostile_strings_inert() -> anyhow::Result<()> {
    let Ui { home: _home, api, b } = ui().await?;
    let title = "<img src=x onerror=\"window.__xss='title'\"><script>window.__xss='title2'</script>";
    let id = create(&api, title).await?;
    let script = [
        // A line opening with <script> is a raw HTML block: shown as its text.
        "say:<script>window.__xss='md-script'</script> <img src=x onerror=window.__xss='md-img'>",
        "nl",
        "nl",
        "say:**bold** [click](javascript:window.__xss='md-link') [data](data:text/html,<script>window.__xss=1</script>) [ok](https://example.com/a)",
        "nl",
        "nl",
        "say:![pic](https://example.com/pic.png) <a href=\"javascript:window.__xss='a'\">raw</a> <div style=\"color:red\" onclick=\"window.__xss='div'\">div</div>",
        "nl",
        "nl",
        "tool:<img/src=x/onerror=window.__xss='tool'> {\"path\":\"<img src=x onerror=window.__xss='input'>\"}",
        "say:```html",
        "nl",
        "say:<b onmouseover=x>code</b>",
        "nl",
        "say:```",
    ]
    .join("\n");
    send(&api, &id, &script).await?;
    idle(&api, &id).await?;
    open(&b, &id).await?;
    b.wait_for("article.msg.assistant[data-status=\"complete\"]").await?;
    b.eval("document.querySelectorAll('details.tool').forEach(d => d.open = true)", vec![]).await?;
    // The title is its text.
    assert_eq!(b.find(".thread-title").await?.text().await?, title);
    let checks = json!(b
        .eval(
            "const page = document.getElementById('page');\
             const attrs = [...page.querySelectorAll('*')].flatMap(e => [...e.attributes].map(a => [e.tagName, a.name, a.value]));\
             return {\
               xss: window.__xss === undefined ? null : String(window.__xss),\
               img: page.querySelectorAll('img').length,\
               script: page.querySelectorAll('script').length,\
               div_in_md: [...page.querySelectorAll('.md div')].filter(d => !(d.classList.contains('code-wrap') && d.children.length === 2 && d.children[0].tagName === 'PRE' && d.children[1].matches('button.code-copy'))).length,\
               on_attrs: attrs.filter(([, n]) => n.startsWith('on')).length,\
               style_attrs: attrs.filter(([, n]) => n === 'style').length,\
               bad_links: [...page.querySelectorAll('a[href]')].map(a => a.getAttribute('href')).filter(h => !/^(https?:|mailto:|\\/ui)/.test(h)),\
               ext_links: [...page.querySelectorAll('.md a[href^=\"https:\"]')].map(a => a.target + ' ' + a.rel),\
               tool_name: (document.querySelector('.tool-name') || {}).textContent,\
             };",
            vec![],
        )
        .await?);
    assert_eq!(checks["xss"], Value::Null, "no script ran: {checks}");
    // `div_in_md` leaves out the console's own wrapper of a code block and its Copy button.
    for k in ["img", "script", "div_in_md", "on_attrs", "style_attrs"] {
        assert_eq!(checks[k], 0, "{k}: {checks}");
    }
    assert_eq!(checks["bad_links"], json!([]), "{checks}");
    assert!(
        checks["ext_links"]
            .as_array()
            .is_some_and(|l| !l.is_empty() && l.iter().all(|x| x == "_blank noopener noreferrer")),
        "{checks}"
    );
    assert_eq!(checks["tool_name"], "<img/src=x/onerror=window.__xss='tool'>", "{checks}");
    let body = b.find("article.msg.assistant .msg-body").await?.text().await?;
    assert!(body.contains("<script>window.__xss='md-script'</script>"), "raw HTML shows as text: {body}");
    assert!(body.contains("bold") && !body.contains("**bold**"), "markdown still renders: {body}");
    b.wait_for("article.msg.assistant pre code.hljs").await?;
    b.screenshot("chat-hostile").await?;
    b.assert_clean().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_stays_responsive_with_a_5mb_reply_and_2000_messages() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let id = create(&api, "Long history").await?;
    home.terminate_daemon(Duration::from_secs(30)).await?;
    seed_messages(&home.root().join("coffer.db"), &id, 2000)?;
    let api = chat::start_daemon(&home).await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    let t0 = Instant::now();
    open(&b, &id).await?;
    b.wait_until("document.querySelectorAll('article.msg').length > 0").await?;
    let opened = t0.elapsed();
    let in_dom: i64 =
        b.eval("return document.querySelectorAll('article.msg').length;", vec![]).await?.as_i64().unwrap_or(0);
    assert!(in_dom <= 100, "a page of the history, not all of it: {in_dom}");
    assert!(opened < Duration::from_secs(10), "opened in {opened:?}");
    // Scrolling up loads older messages, keeping the DOM bounded.
    for _ in 0..3 {
        let before: i64 =
            b.eval("return document.querySelectorAll('article.msg').length;", vec![]).await?.as_i64().unwrap_or(0);
        b.eval(
            "const s = document.querySelector('.scroller'); s.scrollTop = 0; s.dispatchEvent(new Event('scroll'));",
            vec![],
        )
        .await?;
        b.wait_until(&format!("document.querySelectorAll('article.msg').length > {before}")).await?;
    }
    b.wait_for_text("article.msg", "history message 1850").await?;

    // A 5 MB reply streams in and is shown (cut, with "Show all"), and the page still answers.
    send(&api, &id, "big:5242880").await?;
    b.wait_until_within(
        "!!document.querySelector('article.msg.assistant[data-status=\"complete\"] .huge')",
        Duration::from_secs(60),
    )
    .await?;
    let t = Instant::now();
    let composer = b.find("#composer").await?;
    composer.click().await?;
    composer.send_keys("still typing").await?;
    assert_eq!(composer.prop("value").await?, json!("still typing"));
    let typed = t.elapsed();
    let handled = b
        .eval_async(
            "const done = arguments[arguments.length - 1]; const t0 = performance.now();\
             const btn = document.querySelector('.list-toggle');\
             btn.addEventListener('click', () => requestAnimationFrame(() => done(performance.now() - t0)), {once: true});\
             btn.click();",
            vec![],
        )
        .await?;
    let click_ms = handled.as_f64().context("ms")?;
    assert!(typed < Duration::from_secs(3), "typing answered in {typed:?}");
    assert!(click_ms < 500.0, "a click handled and painted in {click_ms} ms");
    // That click collapsed the conversation list.
    assert_eq!(b.eval("return !!document.querySelector('.chat.list-collapsed');", vec![]).await?, json!(true));
    b.screenshot("chat-5mb").await?;
    b.find(".show-all").await?.click().await?;
    b.wait_until("document.querySelector('.huge .plain').textContent.length >= 5242880").await?;
    b.assert_clean().await;
    Ok(())
}

/// Appends `n` messages (alternating user and assistant, `history message <i>`) to conversation
/// `id` in the stopped daemon's database.
fn seed_messages(db: &std::path::Path, id: &str, n: usize) -> anyhow::Result<()> {
    // The daemon is stopped: the test writes its file directly, as a long history would be.
    #[allow(clippy::disallowed_methods)]
    let mut c = rusqlite::Connection::open(db)?;
    let tx = c.transaction()?;
    let now = 1_796_000_000_000_i64;
    for i in 0..n {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        let blocks = json!([{"type": "text", "text": format!("history message {i}")}]).to_string();
        tx.execute(
            "INSERT INTO messages (id, conversation_id, role, status, blocks_json, model, created_ms, updated_ms) \
             VALUES (?1, ?2, ?3, 'complete', ?4, 'scripted-model', ?5, ?5)",
            rusqlite::params![coffer_chat::engine::new_id(), id, role, blocks, now + i as i64],
        )?;
    }
    tx.execute(
        "UPDATE conversations SET message_count = message_count + ?1, last_message_ms = ?2 WHERE id = ?3",
        rusqlite::params![n as i64, now + n as i64, id],
    )?;
    tx.commit()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_streams_a_real_claude_code_turn() -> anyhow::Result<()> {
    let fake = coffer_tests::anthropic::FakeAnthropic::scripted().await?;
    let mut home = TestHome::new()?;
    chat::offline_claude_code(&mut home, &fake.url);
    let api = home.start_daemon().await?;
    let claude = coffer_tests::peers::claude_code()?.display().to_string();
    let r = api
        .request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.claude_code_path": claude}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "settings: {}", r.text);
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;

    // Start a Claude Code conversation from the dialog.
    b.wait_for(".thread-empty-state .primary").await?.click().await?;
    b.wait_for("dialog.modal #new-agent").await?;
    b.eval("const s = document.querySelector('#new-agent'); s.value = 'claude_code'; s.dispatchEvent(new Event('change'));", vec![]).await?;
    b.find("#new-title").await?.send_keys("With Claude Code").await?;
    b.find("dialog.modal button[type=submit]").await?.click().await?;
    b.wait_for_text(".thread-title", "With Claude Code").await?;

    let words: Vec<String> = (1..=10).map(|i| format!("cc{i:02}")).collect();
    type_and_send(&b, &format!("SLOW[150] SAY[{}]", words.join(" "))).await?;
    b.wait_until_within("(document.querySelector('.streaming-text') || {}).textContent?.includes('cc02')", REAL_TURN)
        .await?;
    let partial = b.eval("return document.querySelector('.streaming-text').textContent;", vec![]).await?;
    assert!(!partial.as_str().unwrap_or_default().contains("cc10"), "it streams: {partial}");
    b.screenshot("chat-claude-code").await?;
    b.wait_until_within(
        "[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('cc10'))",
        REAL_TURN,
    )
    .await?;
    let foot = b.find("article.msg.assistant[data-status=\"complete\"] .msg-foot").await?.text().await?;
    assert!(foot.contains(" in") && foot.contains(" out"), "usage per reply: {foot}");

    // Screenshots of the page: desktop, phone, dark.
    b.screenshot("chat-desktop").await?;
    b.set_dark(true).await?;
    b.screenshot("chat-dark").await?;
    b.set_dark(false).await?;
    b.set_viewport(PHONE.0, PHONE.1).await?;
    assert!(b.horizontal_overflow().await? <= 0, "no sideways scrolling at 360 px");
    b.screenshot("chat-360").await?;
    b.assert_clean().await;
    Ok(())
}

/// Issue 34 §6: images and files in the composer. An image picked with the attach button (the
/// file picker, as on a phone) and one pasted show as thumbnails with remove buttons; a file
/// over the limit is refused inline naming it; removing one drops it; sending carries the rest
/// (saved in the working directory with their bytes), and the sent message shows the image.
/// Screenshots at desktop and 390 px phone width.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_picked_pasted_previewed_refused_past_the_limit_and_shown_once_sent() -> anyhow::Result<()> {
    use base64::Engine as _;
    let Ui { home, api, b } = ui().await?;
    let id = create(&api, "Photos").await?;
    open(&b, &id).await?;
    let picked = coffer_tests::images::png(320, 200, [230, 90, 40], [40, 120, 230]);
    let file = home.temp().join("sunset.png");
    std::fs::write(&file, &picked)?;
    // The attach button opens a file picker; WebDriver sets the picker's file as a user would.
    b.find(".attach-btn").await?;
    b.find("input.attach-picker").await?.send_keys(&file.display().to_string()).await?;
    b.wait_for(".attach-item img.attach-img").await?;
    // A pasted image joins it; an 11 MB one is refused inline, naming the limit.
    let pasted = coffer_tests::images::png(48, 48, [20, 160, 90], [250, 240, 80]);
    let b64 = base64::engine::general_purpose::STANDARD.encode(&pasted);
    b.eval(
        "const bytes = Uint8Array.from(atob(arguments[0]), c => c.charCodeAt(0));
         const dt = new DataTransfer();
         dt.items.add(new File([bytes], 'clip.png', {type: 'image/png'}));
         dt.items.add(new File([new Uint8Array(11 * 1024 * 1024)], 'huge.png', {type: 'image/png'}));
         document.getElementById('composer').dispatchEvent(new ClipboardEvent('paste', {clipboardData: dt, bubbles: true, cancelable: true}));
         return true;",
        vec![json!(b64)],
    )
    .await?;
    b.wait_until("document.querySelectorAll('.attach-item').length === 2").await?;
    let error = b.wait_for(".attach-error:not([hidden])").await?.text().await?;
    ensure!(error.contains("huge.png") && error.contains("over the limit of 10.0 MB per file"), "{error}");
    // A dropped file joins too, then is removed with its button.
    b.eval(
        "const dt = new DataTransfer();
         dt.items.add(new File(['notes'], 'notes.txt', {type: 'text/plain'}));
         document.querySelector('form.composer').dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));
         return true;",
        vec![],
    )
    .await?;
    b.wait_until("document.querySelectorAll('.attach-item').length === 3").await?;
    b.find("#composer").await?.send_keys("say:nice pictures").await?;
    b.set_viewport(1280, 800).await?;
    b.screenshot("chat-attach-tray-1280").await?;
    b.set_viewport(390, 844).await?;
    ensure!(b.horizontal_overflow().await? <= 0, "no sideways scrolling at 390 px with the tray");
    b.screenshot("chat-attach-tray-390").await?;
    b.find("button.attach-remove[aria-label=\"Remove notes.txt\"]").await?.click().await?;
    b.wait_until("document.querySelectorAll('.attach-item').length === 2").await?;
    b.find("#composer").await?.click().await?;
    b.press(keys::ENTER).await?;

    // The sent message shows both images; the files are in the working directory.
    b.wait_until("document.querySelectorAll('article.msg.user figure.attachment img.attach-img').length === 2").await?;
    b.wait_for_text("article.msg.assistant[data-status=\"complete\"]", "nice pictures").await?;
    ensure!(b.count(".attach-item").await? == 0, "the tray is empty after sending");
    let v = api.get(&format!("/v1/conversations/{id}")).reply().await?.ok_json()?;
    let cwd = std::path::PathBuf::from(v["conversation"]["agent_config"]["cwd"].as_str().context("cwd")?);
    let blocks: Vec<Value> = v["messages"][0]["blocks"].as_array().context("blocks")?.clone();
    let paths: Vec<&str> = blocks.iter().filter_map(|b| b["attachment"]["path"].as_str()).collect();
    ensure!(paths.len() == 2, "{blocks:?}");
    ensure!(std::fs::read(cwd.join(paths[0]))? == picked && std::fs::read(cwd.join(paths[1]))? == pasted);
    b.set_viewport(1280, 800).await?;
    b.screenshot("chat-attach-sent-1280").await?;
    b.set_viewport(390, 844).await?;
    ensure!(b.horizontal_overflow().await? <= 0, "no sideways scrolling at 390 px with images");
    b.screenshot("chat-attach-sent-390").await?;
    b.set_viewport(1280, 800).await?;

    // After a reload the page has no previews of its own: the saved images come from the
    // attachments route (as data: URLs, with the session's key), and a file gets a Download button.
    let body = json!({"text": "say:and a file", "attachments": [{"name": "notes.txt", "data_base64": base64::engine::general_purpose::STANDARD.encode(b"the notes")}]});
    let r = api.post_json(&format!("/v1/conversations/{id}/messages"), &body).reply().await?;
    ensure!(r.status == 202, "{} {}", r.status, r.text);
    b.wait_for_text("article.msg.user figure.attachment", "notes.txt").await?;
    b.refresh().await?;
    b.wait_until("[...document.querySelectorAll('article.msg.user figure.attachment img.attach-img')].filter(i => i.src.startsWith('data:image/png;base64,') && i.complete && i.naturalWidth > 0).length === 2").await?;
    let widths = b.eval("return [...document.querySelectorAll('article.msg.user figure.attachment img.attach-img')].map(i => i.naturalWidth);", vec![]).await?;
    ensure!(widths == json!([320, 48]), "the saved images, decoded: {widths}");
    let file = b.wait_for("article.msg.user figure.attachment:not(.image) button.attach-download").await?;
    ensure!(file.text().await? == "Download");
    let fetched = b
        .eval_async(
            "const done = arguments[arguments.length - 1];
             (async () => {
               const m = await import('/ui/assets/js/api.js');
               const conv = new URLSearchParams(location.search).get('c');
               const user = [...document.querySelectorAll('article.msg.user')].pop().dataset.id;
               const blob = await m.fetchBlob(`/v1/conversations/${conv}/messages/${user}/attachments/notes.txt`);
               return [blob.type, await blob.text()];
             })().then(done, (e) => done(['error', String(e)]));",
            vec![],
        )
        .await?;
    ensure!(fetched == json!(["text/plain", "the notes"]), "{fetched}");
    b.screenshot("chat-attach-reloaded-1280").await?;
    b.set_viewport(390, 844).await?;
    ensure!(b.horizontal_overflow().await? <= 0, "no sideways scrolling at 390 px after the reload");
    b.screenshot("chat-attach-reloaded-390").await?;
    b.set_viewport(1280, 800).await?;
    b.assert_clean().await;
    Ok(())
}

/// Issue 34 §3 in the console: after Stop a typed message runs at once while the waiting one
/// stays paused; "Send now" (the button shown while a turn runs, and Ctrl+Enter) interrupts
/// the turn and runs the message next. Screenshots at desktop and phone (390 px) width.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_stop_then_send_runs_at_once_and_send_now_interrupts() -> anyhow::Result<()> {
    let Ui { home: _home, api, b } = ui().await?;
    let id = create(&api, "Redirect").await?;
    open(&b, &id).await?;
    assert!(b.find(".send-now").await?.attr("hidden").await?.is_some(), "no send-now while idle");
    type_and_send(&b, "say:working\nhang").await?;
    b.wait_until("!document.querySelector('.stop').hidden && !document.querySelector('.send-now').hidden").await?;
    assert_eq!(b.find("button.send").await?.text().await?, "Queue", "Enter queues while a turn runs");
    type_and_send(&b, "say:waits").await?;
    b.wait_until("document.querySelectorAll('.pending-item').length === 1").await?;
    b.find("#composer").await?.send_keys("say:now please").await?;
    b.screenshot("chat-send-now").await?;
    b.set_viewport(390, 844).await?;
    let w = b.eval("return [document.documentElement.scrollWidth, window.innerWidth];", vec![]).await?;
    ensure!(w[0].as_u64() <= w[1].as_u64(), "the composer overflows sideways at 390 px: {w}");
    b.screenshot("chat-send-now-390").await?;
    b.set_viewport(1280, 800).await?;

    // Send now: the hanging turn ends interrupted, the message runs next, the queue goes on.
    b.find(".send-now").await?.click().await?;
    b.wait_for("article.msg.assistant[data-status=\"interrupted\"]").await?;
    b.wait_until("[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('now please'))").await?;
    b.wait_until("[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('waits'))").await?;
    let all = replies(&b).await?;
    let now = all.iter().position(|t| t == "now please").context("send-now ran")?;
    let waited = all.iter().position(|t| t == "waits").context("the queued one ran")?;
    assert!(now < waited, "send-now runs before the queue: {all:?}");

    // Stop with one waiting, then a typed message: it runs at once; the waiting one stays paused.
    type_and_send(&b, "say:again\nhang").await?;
    b.wait_until("!document.querySelector('.stop').hidden").await?;
    type_and_send(&b, "say:held").await?;
    b.wait_until("document.querySelectorAll('.pending-item').length === 1").await?;
    b.find(".stop").await?.click().await?;
    b.wait_for(".pending-head.paused").await?;
    b.wait_until("document.querySelectorAll('article.msg.assistant[data-status=\"interrupted\"]').length === 2")
        .await?;
    b.screenshot("chat-stopped-redirect").await?;
    type_and_send(&b, "say:instead").await?;
    b.wait_until("[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('instead'))").await?;
    idle(&api, &id).await?;
    assert_eq!(queue(&api, &id).await?, (vec!["say:held".to_owned()], true), "the waiting one stays paused");
    assert_eq!(pending_texts(&b).await?, ["say:held"]);

    // Ctrl+Enter is send-now while a turn runs.
    type_and_send(&b, "say:third\nhang").await?;
    b.wait_until("!document.querySelector('.send-now').hidden").await?;
    b.find("#composer").await?.send_keys("say:by keys").await?;
    b.chord(&[keys::CONTROL, keys::ENTER]).await?;
    b.wait_until("document.querySelectorAll('article.msg.assistant[data-status=\"interrupted\"]').length === 3")
        .await?;
    b.wait_until("[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('by keys'))").await?;
    b.screenshot("chat-after-redirects").await?;
    b.assert_clean().await;
    Ok(())
}

/// Issue 34 §2 in the console: the bell asks for notification permission (granted here through
/// CDP) and remembers the choice; while the tab is hidden, every conversation whose turn ends
/// is counted in the title ("(2) …") and shown as a notification; seeing the tab clears it.
/// Headless Chromium keeps a tab visible, so the test makes `document.visibilityState` read
/// `hidden` (and records notifications) in the page: what is checked is the page's own logic
/// over the real list stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_chat_turns_ending_in_a_hidden_tab_badge_the_title_and_notify_once_allowed() -> anyhow::Result<()> {
    let Ui { home: _home, api, b } = ui().await?;
    let a = create(&api, "First job").await?;
    let c = create(&api, "Second job").await?;
    open(&b, &a).await?;
    b.wait_for(".bell[aria-pressed=\"false\"]").await?;
    let origin = api.base_url().trim_end_matches('/').to_owned();
    b.cdp("Browser.grantPermissions", json!({"permissions": ["notifications"], "origin": origin})).await?;
    b.find(".bell").await?.click().await?;
    b.wait_for(".bell[aria-pressed=\"true\"]").await?;
    assert_eq!(b.eval("return localStorage.getItem('coffer.notify');", vec![]).await?, json!("on"));
    b.screenshot("chat-bell-on").await?;

    // The tab goes to the background; notifications are recorded instead of shown.
    b.eval(
        "window.__shown = [];\
         const Real = window.Notification;\
         window.Notification = function (title, o) { window.__shown.push({ title, body: o.body }); this.close = () => {}; };\
         window.Notification.permission = Real.permission;\
         window.Notification.requestPermission = () => Real.requestPermission();\
         Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => 'hidden' });\
         document.dispatchEvent(new Event('visibilitychange'));\
         return true;",
        vec![],
    )
    .await?;
    let before = b.eval("return document.title;", vec![]).await?;
    assert!(!before.as_str().unwrap_or_default().starts_with('('), "no badge yet: {before}");
    send(&api, &a, "slow:300\nsay:one two three").await?;
    send(&api, &c, "slow:300\nsay:four five six\nfail:provider the model API answered 500").await?;
    b.wait_until("document.title.startsWith('(2) ')").await?;
    let shown = b.eval("return window.__shown;", vec![]).await?;
    let titles: Vec<&str> = shown.as_array().context("shown")?.iter().filter_map(|n| n["title"].as_str()).collect();
    assert_eq!(titles.len(), 2, "{shown}");
    assert!(titles.contains(&"First job") && titles.contains(&"Second job"), "{shown}");
    let failed = shown.as_array().context("shown")?.iter().find(|n| n["title"] == "Second job").context("second")?;
    assert_eq!(failed["body"], "The turn ended; the queue is paused.", "{shown}");

    // Seen again: the badge goes.
    b.eval(
        "Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => 'visible' });\
         document.dispatchEvent(new Event('visibilitychange')); return true;",
        vec![],
    )
    .await?;
    b.wait_until("!document.title.startsWith('(')").await?;
    // A turn that ends while the tab is seen is not counted.
    send(&api, &a, "slow:200\nsay:seen").await?;
    idle(&api, &a).await?;
    b.wait_until("[...document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]')].some(m => m.textContent.includes('seen'))").await?;
    assert!(!b.eval("return document.title;", vec![]).await?.as_str().unwrap_or_default().starts_with('('));
    // Off again: remembered.
    b.find(".bell").await?.click().await?;
    b.wait_for(".bell[aria-pressed=\"false\"]").await?;
    assert_eq!(b.eval("return localStorage.getItem('coffer.notify');", vec![]).await?, json!("off"));
    b.assert_clean().await;
    Ok(())
}
