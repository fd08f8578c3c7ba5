//! A chat message's details in a real headless Chromium against a real daemon with the scripted
//! agent (`coffer-test-daemon scripted-chat`, script in `coffer_tests::chat`), issue 35 §4:
//! every message shows its time (`<time datetime>`, the full date in its title); a reply names
//! the agent, the model and its token usage, kept by the store so a reload shows the same, and
//! hides usage it does not know; a code block's Copy button puts the code on the clipboard (the
//! Clipboard API, and the `execCommand` fallback), from the keyboard too; a stopped turn says
//! "stopped" once; a tool call whose result will not come says why, live and after a reload;
//! relative times move on with the clock through one ticker that does not redraw the thread and
//! stops while the tab is hidden. Screenshots at 390×844 and 1280×800 in light and dark, with
//! no sideways overflow.
use anyhow::{Context, ensure};
use coffer_tests::browser::{Browser, DESKTOP, keys};
use coffer_tests::{Api, SendExt, TestHome, chat};
use serde_json::{Value, json};

/// A daemon with the scripted agent and a signed-in browser on the chat page.
struct Ui {
    _home: TestHome,
    api: Api,
    b: Browser,
}

async fn ui() -> anyhow::Result<Ui> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    Ok(Ui { _home: home, api, b })
}

/// A scripted conversation created over REST; its id.
async fn create(api: &Api, title: &str) -> anyhow::Result<String> {
    let r = api.post_json("/v1/conversations", &json!({"agent_key": chat::SCRIPTED, "title": title})).reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    Ok(r.json()?["id"].as_str().context("id")?.to_owned())
}

async fn send(api: &Api, id: &str, text: &str) -> anyhow::Result<()> {
    let r = api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": text})).reply().await?;
    ensure!(r.status == 202, "send: {} {}", r.status, r.text);
    Ok(())
}

/// Opens conversation `id` and waits for its thread.
async fn open(b: &Browser, id: &str) -> anyhow::Result<()> {
    b.open_conversation(id).await
}

/// Waits until the thread shows `n` finished replies.
async fn replies_done(b: &Browser, n: usize) -> anyhow::Result<()> {
    b.wait_until(&format!(
        "document.querySelectorAll('article.msg.assistant:not([data-status=\"streaming\"])').length >= {n}"
    ))
    .await
}

/// The stored messages of conversation `id` (oldest first).
async fn stored(api: &Api, id: &str) -> anyhow::Result<Vec<Value>> {
    let v = api.get(&format!("/v1/conversations/{id}/messages")).reply().await?.json()?;
    Ok(v["items"].as_array().context("items")?.clone())
}

/// What the footer of the `i`th reply says, as `{status, agent, model, usage, time, datetime, title, text}`.
async fn reply_meta(b: &Browser, i: usize) -> anyhow::Result<Value> {
    b.eval(
        "const m = document.querySelectorAll('article.msg.assistant')[arguments[0]];\
         const f = m.querySelector('.msg-foot'); const q = (s) => f.querySelector(s);\
         const t = q('time.when');\
         return {status: q('.msg-status')?.textContent ?? null, agent: q('.msg-agent')?.textContent ?? null,\
                 model: q('.msg-model')?.textContent ?? null, usage: q('.usage')?.textContent ?? null,\
                 time: t?.textContent ?? null, datetime: t?.getAttribute('datetime') ?? null,\
                 title: t?.title ?? null, text: m.textContent};",
        vec![json!(i)],
    )
    .await
}

/// The code blocks' Copy buttons: by mouse and from the keyboard the code goes on the clipboard
/// with "Copied" shown; without the Clipboard API the `execCommand` fallback does it. Each
/// message's time; the reply's agent, model and usage, the same after a reload (stored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_messages_show_time_agent_model_usage_and_copy_code() -> anyhow::Result<()> {
    let Ui { _home, api, b } = ui().await?;
    let id = create(&api, "Meta and copy").await?;
    open(&b, &id).await?;
    send(&api, &id, "say:Run this:\nnl\nnl\nsay:```sh\nnl\nsay:echo hello world\nnl\nsay:```\nnl\nnl\nsay:Then this:\nnl\nnl\nsay:```\nnl\nsay:ls -la\nnl\nsay:```").await?;
    replies_done(&b, 1).await?;
    b.wait_until("document.querySelectorAll('article.msg.assistant .code-wrap .code-copy').length === 2").await?;

    // Times: the user's message and the reply each carry a <time> with the exact instant.
    let user = b
        .eval(
            "const t = document.querySelector('article.msg.user time.when');\
             return t && {text: t.textContent, datetime: t.getAttribute('datetime'), title: t.title};",
            vec![],
        )
        .await?;
    assert_eq!(user["text"], "just now", "{user}");
    let dt = user["datetime"].as_str().context("datetime")?;
    assert!(dt.ends_with('Z') && dt.len() == 24, "an ISO instant: {dt}");
    assert!(user["title"].as_str().unwrap_or_default().len() > 12, "the full date on hover: {user}");

    let msgs = stored(&api, &id).await?;
    let reply = msgs.iter().find(|m| m["role"] == "assistant").context("a reply")?;
    assert_eq!(reply["agent_key"], chat::SCRIPTED, "the store keeps who answered: {reply}");
    assert!(reply.get("connection").is_none(), "no LLM connection: its own login: {reply}");
    let meta = reply_meta(&b, 0).await?;
    assert_eq!(meta["status"], Value::Null, "a complete reply has no status word: {meta}");
    assert_eq!(meta["agent"], chat::SCRIPTED);
    assert_eq!(meta["model"], "scripted-model");
    let usage = meta["usage"].as_str().context("usage shown")?;
    assert!(usage.contains(" in · ") && usage.ends_with(" out") && !usage.starts_with("0 in · 0 out"), "{usage}");
    assert_eq!(meta["time"], "just now");
    assert_eq!(meta["datetime"].as_str().map(str::len), Some(24));

    // Copy with the mouse: the first block's code is on the clipboard, the button says so.
    let origin = b.origin().context("origin")?;
    b.cdp(
        "Browser.grantPermissions",
        json!({"origin": origin, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]}),
    )
    .await?;
    let read_clipboard = "const done = arguments[arguments.length - 1];\
                          navigator.clipboard.readText().then(done, (e) => done('ERR ' + e.message));";
    assert_eq!(b.eval("return window.isSecureContext;", vec![]).await?, json!(true), "loopback is a secure context");
    let buttons = b.find_all("article.msg.assistant .code-copy").await?;
    buttons[0].click().await?;
    b.wait_until("document.querySelectorAll('.code-copy')[0].textContent === 'Copied'").await?;
    assert_eq!(b.eval_async(read_clipboard, vec![]).await?.as_str().map(str::trim), Some("echo hello world"));
    // "Copied" goes back to "Copy".
    b.wait_until("document.querySelectorAll('.code-copy')[0].textContent === 'Copy'").await?;

    // From the keyboard: Tab reaches the next block's button, which shows itself; Enter copies.
    b.eval("document.querySelectorAll('.code-copy')[0].focus(); return null;", vec![]).await?;
    b.press(keys::TAB).await?;
    b.wait_until(
        "document.activeElement === document.querySelectorAll('.code-copy')[1] && getComputedStyle(document.activeElement).opacity === '1'",
    )
    .await?;
    b.press(keys::ENTER).await?;
    b.wait_until("document.querySelectorAll('.code-copy')[1].textContent === 'Copied'").await?;
    b.screenshot("messages-copied").await?;
    assert_eq!(b.eval_async(read_clipboard, vec![]).await?.as_str().map(str::trim), Some("ls -la"));

    // Without the Clipboard API (refused), the selected-textarea fallback copies.
    b.eval("navigator.clipboard.writeText = () => Promise.reject(new Error('refused')); return null;", vec![]).await?;
    b.wait_until("document.querySelectorAll('.code-copy')[0].textContent === 'Copy'").await?;
    buttons[0].click().await?;
    b.wait_until("document.querySelectorAll('.code-copy')[0].textContent === 'Copied'").await?;
    assert_eq!(b.eval_async(read_clipboard, vec![]).await?.as_str().map(str::trim), Some("echo hello world"));
    assert_eq!(b.count(".copy-buffer").await?, 0, "the fallback's textarea is gone");

    // A reload shows the same line (from the store), with the copy buttons.
    b.refresh().await?;
    open(&b, &id).await?;
    replies_done(&b, 1).await?;
    let again = reply_meta(&b, 0).await?;
    for k in ["agent", "model", "usage", "datetime"] {
        assert_eq!(again[k], meta[k], "{k} after a reload");
    }
    assert_eq!(b.count("article.msg.assistant .code-copy").await?, 2);
    b.set_viewport(DESKTOP.0, DESKTOP.1).await?;
    b.assert_clean().await;
    Ok(())
}

/// A stopped turn says "stopped" once and never "0 in · 0 out"; tool calls whose result will
/// not come (stopped, or the agent died mid-tool) say why, live and after a reload. Then the
/// screenshots of such a thread, phone and desktop, light and dark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_messages_stopped_once_no_unknown_usage_and_tools_without_results_say_so() -> anyhow::Result<()> {
    let Ui { _home, api, b } = ui().await?;
    let id = create(&api, "Stops and orphans").await?;
    open(&b, &id).await?;

    // Stopped before any output: "stopped" once, no usage (it is not known).
    send(&api, &id, "hang").await?;
    b.wait_until("!document.querySelector('.stop').hidden").await?;
    b.find(".stop").await?.click().await?;
    b.wait_for("article.msg.assistant[data-status=\"interrupted\"]").await?;
    // The stop pauses the queue; a new message runs at once anyway.
    let meta = reply_meta(&b, 0).await?;
    let text = meta["text"].as_str().unwrap_or_default();
    assert_eq!(meta["status"], "stopped", "{meta}");
    assert_eq!(text.matches("stopped").count(), 1, "\"stopped\" once: {text}");
    assert!(!text.contains("interrupted"), "{text}");
    assert_eq!(meta["usage"], Value::Null, "unknown usage is not shown: {meta}");
    assert!(!text.contains("0 in"), "{text}");
    assert_eq!(meta["agent"], chat::SCRIPTED, "who answered is known even so: {meta}");

    // A tool call, then a stop while it runs: the card says the result will not come.
    send(&api, &id, "call:Read {\"file_path\": \"notes.txt\"}\nhang").await?;
    b.wait_for("article.msg.assistant[data-status=\"streaming\"] details.tool").await?;
    let waiting = b
        .eval("return document.querySelector('article.msg.assistant[data-status=\"streaming\"] .tool-result').textContent;", vec![])
        .await?;
    assert!(waiting.as_str().unwrap_or_default().contains("waiting"), "while the turn runs the card waits: {waiting}");
    b.find(".stop").await?.click().await?;
    b.wait_until("document.querySelectorAll('article.msg.assistant[data-status=\"interrupted\"]').length === 2")
        .await?;
    // The agent dying mid-tool (no result, no end): the turn fails, the card says so.
    send(&api, &id, "call:Bash {\"command\": \"make\"}\nexit").await?;
    b.wait_for("article.msg.assistant[data-status=\"failed\"] details.tool.orphan").await?;

    let orphans = "return [...document.querySelectorAll('details.tool')].map(d => [d.closest('article').dataset.status,\
                   d.querySelector('.tool-status').textContent, d.querySelector('.tool-result').textContent]);";
    let expected = json!([
        ["interrupted", "no result", "No result: the turn was stopped."],
        ["failed", "no result", "No result: the turn failed."],
    ]);
    b.wait_until("document.querySelectorAll('details.tool.orphan').length === 2").await?;
    assert_eq!(b.eval(orphans, vec![]).await?, expected, "live");
    let stopped = reply_meta(&b, 1).await?;
    assert_eq!(
        stopped["text"].as_str().unwrap_or_default().matches("stopped").count(),
        2,
        "the badge and the card: {stopped}"
    );
    assert_eq!(stopped["status"], "stopped");

    // A reply with a code block, for the screenshots.
    send(&api, &id, "say:Build it with:\nnl\nnl\nsay:```sh\nnl\nsay:cargo build --release\nnl\nsay:```").await?;
    replies_done(&b, 4).await?;

    // The same after a reload.
    b.refresh().await?;
    open(&b, &id).await?;
    replies_done(&b, 4).await?;
    assert_eq!(b.eval(orphans, vec![]).await?, expected, "after a reload");
    assert_eq!(reply_meta(&b, 0).await?["usage"], Value::Null);
    assert_eq!(b.count("details.tool .tool-status.warn").await?, 2);

    // Screenshots: the thread at the phone size and at the desktop, light and dark, with one
    // tool card opened; nothing overflows sideways.
    b.eval("document.querySelectorAll('details.tool')[0].open = true; return null;", vec![]).await?;
    for dark in [false, true] {
        b.set_dark(dark).await?;
        for (w, h) in [(390, 844), DESKTOP] {
            b.set_viewport(w, h).await?;
            b.eval("const s = document.querySelector('.scroller'); s.scrollTop = s.scrollHeight; return null;", vec![])
                .await?;
            assert_eq!(b.horizontal_overflow().await?, 0, "{w}×{h} dark={dark}: no sideways overflow");
            let wide = b
                .eval(
                    "return [...document.querySelectorAll('article.msg')].filter(m => m.scrollWidth > m.clientWidth + 1).length;",
                    vec![],
                )
                .await?;
            assert_eq!(wide, json!(0), "{w}×{h}: no message wider than its box");
            b.screenshot(&format!("messages-{w}-{}", if dark { "dark" } else { "light" })).await?;
        }
    }
    b.set_viewport(DESKTOP.0, DESKTOP.1).await?;
    b.assert_clean().await;
    Ok(())
}

/// Relative times move on with the clock: one ticker rewrites them in the thread and in the
/// conversation list without redrawing either, stops while the tab is hidden and catches up
/// when it is shown. The clock is moved in the page (`Date.now`), and the ticker's period
/// shortened through the module's own `setTickMs`: nothing waits minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_messages_relative_times_stay_current() -> anyhow::Result<()> {
    let Ui { _home, api, b } = ui().await?;
    let id = create(&api, "Ticking").await?;
    open(&b, &id).await?;
    send(&api, &id, "say:hi").await?;
    replies_done(&b, 1).await?;
    let times = "return [document.querySelector('article.msg.user time.when').textContent,\
                 document.querySelector('.conv-item[aria-current=\"true\"] time.when').textContent];";
    b.wait_until(
        "document.querySelector('.conv-item[aria-current=\"true\"] time.when') && document.querySelector('article.msg.user time.when')",
    )
    .await?;
    assert_eq!(b.eval(times, vec![]).await?, json!(["just now", "just now"]));

    // Mark the thread's nodes: a redraw would replace them.
    b.eval("window.__marks = [document.querySelector('article.msg.user'), document.querySelector('article.msg.assistant')]; return null;", vec![])
        .await?;
    let ticking = b
        .eval_async(
            "const done = arguments[arguments.length - 1];\
             import('/ui/assets/js/clock.js').then(m => { m.setTickMs(100); done(m.ticking()); }, e => done('ERR ' + e.message));",
            vec![],
        )
        .await?;
    assert_eq!(ticking, json!(true), "the ticker runs while the tab is shown");
    b.eval("const real = Date.now.bind(Date); Date.now = () => real() + 5 * 60000; return null;", vec![]).await?;
    b.wait_until("document.querySelector('article.msg.user time.when').textContent === '5 min ago'").await?;
    b.wait_until("document.querySelector('.conv-item[aria-current=\"true\"] time.when').textContent === '5 min ago'")
        .await?;
    let same = b
        .eval(
            "return window.__marks[0] === document.querySelector('article.msg.user') && window.__marks[1] === document.querySelector('article.msg.assistant') && window.__marks[0].isConnected;",
            vec![],
        )
        .await?;
    assert_eq!(same, json!(true), "the times changed in place: nothing was redrawn");

    // Hidden: the ticker stops. Shown again: every time catches up at once.
    let hidden = b
        .eval_async(
            "const done = arguments[arguments.length - 1];\
             Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});\
             Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'hidden'});\
             document.dispatchEvent(new Event('visibilitychange'));\
             import('/ui/assets/js/clock.js').then(m => done(m.ticking()));",
            vec![],
        )
        .await?;
    assert_eq!(hidden, json!(false), "no ticking while the tab is hidden");
    let shown = b
        .eval_async(
            "const done = arguments[arguments.length - 1];\
             const real = Date.now; Date.now = () => real() + 60 * 60000;\
             delete document.hidden; delete document.visibilityState;\
             document.dispatchEvent(new Event('visibilitychange'));\
             import('/ui/assets/js/clock.js').then(m => done([m.ticking(), document.querySelector('article.msg.user time.when').textContent]));",
            vec![],
        )
        .await?;
    let shown = shown.as_array().context("an array")?;
    assert_eq!(shown[0], json!(true), "ticking again once shown");
    let text = shown[1].as_str().unwrap_or_default();
    ensure!(
        text != "5 min ago" && !text.contains("ago"),
        "an hour and five minutes later the time is a clock time, at once: {text}"
    );
    b.wait_until("document.querySelector('.conv-item[aria-current=\"true\"] time.when').textContent === '1 h ago'")
        .await?;
    b.assert_clean().await;
    Ok(())
}
