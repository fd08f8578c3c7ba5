//! Issue 35 §4, second and third points, in a real headless Chromium (`coffer_tests::browser`)
//! against a real daemon: the model combobox of the thread header (the bound LLM connection's
//! models from the fake provider's `GET /v1/models`, a typed model outside the list, the next
//! turn of the real Claude Code CLI reaching the provider with the chosen model), the
//! new-conversation dialog offering the same list and default; the Settings page in its sections
//! with human labels and help (no backticks, no keys as labels), with pickers for on/off, modes
//! and connections; the LLM connections tab naming the agents each connection is bound to and
//! binding with a picker. Screenshots at 390×844 and 1280×800 in light and dark, with the DOM's
//! scroll widths checked; every test ends with `assert_clean()`.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_llm::Wire;
use coffer_tests::browser::{Browser, DESKTOP};
use coffer_tests::fake_llm::FakeLlm;
use coffer_tests::{Api, SendExt, TestHome, chat, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

/// The phone of issue 35.
const PHONE: (u32, u32) = (390, 844);
/// How long a turn of the real Claude Code CLI on the fake model may take on a loaded machine.
const REAL_TURN: Duration = Duration::from_secs(90);
/// The connection's key (it becomes a credential).
const KEY: &str = "sk-modelset-connection-key-0123456789";

async fn set(api: &Api, values: Value) -> anyhow::Result<()> {
    let r = api.request(Method::PATCH, "/v1/settings").json(&json!({ "set": values })).reply().await?;
    ensure!(r.status == 200, "settings: {} {}", r.status, r.text);
    Ok(())
}

async fn add_connection(api: &Api, body: Value) -> anyhow::Result<()> {
    let r = api.post_json("/v1/llm/connections", &body).reply().await?;
    ensure!(r.status == 201, "POST /v1/llm/connections: {} {}", r.status, r.text);
    Ok(())
}

/// The conversation's stored model.
async fn model_of(api: &Api, id: &str) -> anyhow::Result<String> {
    let v = api.get(&format!("/v1/conversations/{id}")).reply().await?.ok_json()?;
    Ok(v["conversation"]["agent_config"]["model"].as_str().unwrap_or_default().to_owned())
}

/// Waits until the conversation's stored model is `want`.
async fn model_becomes(api: &Api, id: &str, want: &str) -> anyhow::Result<()> {
    wait_for(&format!("the conversation's model to be {want:?}"), Duration::from_secs(20), || async {
        Ok((model_of(api, id).await? == want).then_some(()))
    })
    .await
}

/// The option texts of the open model list of the picker `input` (a CSS selector).
async fn options(b: &Browser, input: &str) -> anyhow::Result<Vec<String>> {
    b.find(input).await?.click().await?;
    let list = format!(
        "#{}",
        b.eval("return document.querySelector(arguments[0]).getAttribute('aria-controls');", vec![json!(input)])
            .await?
            .as_str()
            .context("aria-controls")?
    );
    b.wait_until(&format!(
        "!document.querySelector('{list}').hidden && document.querySelectorAll('{list} [role=option]').length > 1"
    ))
    .await?;
    let v = b
        .eval(
            "return [...document.querySelectorAll(arguments[0] + ' [role=option]')].map(o => o.textContent);",
            vec![json!(list)],
        )
        .await?;
    Ok(serde_json::from_value(v)?)
}

/// No sideways scrolling, and nothing past the viewport's right edge outside a scrolling box.
async fn assert_fits(b: &Browser, what: &str) -> anyhow::Result<()> {
    let v = b
        .eval(
            "const de = document.documentElement, vw = de.clientWidth; const bad = [];
             for (const e of document.querySelectorAll('body *')) {
               const r = e.getBoundingClientRect();
               if (!r.width || !r.height || getComputedStyle(e).visibility === 'hidden' || getComputedStyle(e).position === 'fixed') continue;
               let clipped = false;
               for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
                 if (getComputedStyle(a).overflowX !== 'visible') { const ar = a.getBoundingClientRect(); if (r.left >= ar.right - 1 || r.right > ar.right + 1) { clipped = true; break; } }
               }
               if (!clipped && r.right > vw + 1) bad.push(`${e.tagName.toLowerCase()}.${[...e.classList].join('.')} right=${Math.round(r.right)}`);
             }
             return { scroll: de.scrollWidth, client: vw, bad: bad.slice(0, 8) };",
            vec![],
        )
        .await?;
    ensure!(v["scroll"].as_u64() <= v["client"].as_u64(), "{what}: the document scrolls sideways: {v}");
    ensure!(v["bad"].as_array().is_some_and(Vec::is_empty), "{what}: elements past the right edge: {v}");
    Ok(())
}

/// Screenshots of what is on screen at the phone and the desktop size, light and dark, each
/// checked for sideways overflow; `prepare` runs after each resize (to reopen a list).
async fn four_shots(b: &Browser, name: &str, prepare: &str) -> anyhow::Result<()> {
    for dark in [false, true] {
        b.set_dark(dark).await?;
        for (w, h) in [PHONE, DESKTOP] {
            b.set_viewport(w, h).await?;
            if !prepare.is_empty() {
                b.eval(prepare, vec![]).await?;
            }
            b.wait_settled().await?;
            let what = format!("{name} at {w}×{h} {}", if dark { "dark" } else { "light" });
            assert_fits(b, &what).await?;
            b.screenshot(&format!("{name}-{w}-{}", if dark { "dark" } else { "light" })).await?;
        }
    }
    b.set_dark(false).await?;
    b.set_viewport(DESKTOP.0, DESKTOP.1).await
}

/// The header's combobox lists the bound connection's models (the fake provider's list), a pick
/// is saved and the next turn of the real Claude Code reaches the provider with it; a typed
/// model outside the list is kept; the default option clears it; the new-conversation dialog
/// offers the same list and default; the phone's header stays compact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_model_picker_offers_the_connection_s_models_and_the_next_turn_uses_the_pick() -> anyhow::Result<()> {
    let fake = FakeLlm::start(Wire::Anthropic).await?;
    fake.set_models(Some(vec!["fake-beta".into(), "fake-alpha".into(), "fake-gamma".into()]));
    let mut home = TestHome::new()?;
    chat::offline_claude_code(&mut home, &fake.url);
    let api = home.start_daemon().await?;
    let claude = coffer_tests::peers::claude_code()?.display().to_string();
    set(&api, json!({"chat.claude_code_path": claude})).await?;
    add_connection(
        &api,
        json!({"name": "work", "wire": "anthropic", "base_url": fake.url, "api_key": KEY, "model": "fake-alpha"}),
    )
    .await?;
    set(&api, json!({"chat.claude_code_connection": "work"})).await?;
    wait_for("ListAgents to show the binding", Duration::from_secs(20), || async {
        let agents = api.get("/v1/agents").reply().await?.ok_json()?;
        let bound =
            agents["items"].as_array().into_iter().flatten().any(|a| {
                a["agent_key"] == "claude_code" && a["available"] == true && a["binding"]["connection"] == "work"
            });
        Ok(bound.then_some(()))
    })
    .await?;
    let r =
        api.post_json("/v1/conversations", &json!({"agent_key": "claude_code", "title": "Model pick"})).reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let id = r.json()?["id"].as_str().context("id")?.to_owned();

    // A model the daemon refuses is a structured error naming it; nothing changes.
    let r = api
        .request(Method::PATCH, &format!("/v1/conversations/{id}"))
        .json(&json!({"model": "two\nlines"}))
        .reply()
        .await?;
    let e = r.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("model")), "{e}");
    let r = api.request(Method::PATCH, &format!("/v1/conversations/{id}")).json(&json!({"model": 7})).reply().await?;
    r.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(model_of(&api, &id).await?.is_empty(), "a refused model was stored");

    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    b.goto(&format!("/ui/chat?c={id}")).await?;
    b.wait_for_text(".thread-title", "Model pick").await?;
    // The default is the connection's model; the list: the default, then the connection's model,
    // then what the provider lists.
    b.wait_until("document.querySelector('#thread-model').placeholder === 'Default: fake-alpha'").await?;
    b.wait_until("document.querySelector('.thread-actions .model-pick').dataset.loaded === 'true'").await?;
    let header = options(&b, "#thread-model").await?;
    assert_eq!(header, ["Default: fake-alpha", "fake-alpha", "fake-beta", "fake-gamma"]);
    ensure!(b.count("#thread-model").await? == 1 && b.count(".thread-actions button").await? >= 3, "header");
    ensure!(
        b.eval("return document.querySelector('#thread-model').getAttribute('role') + ' ' + document.querySelector('#thread-model').getAttribute('aria-expanded');", vec![]).await? == "combobox true",
        "an ARIA combobox, expanded"
    );
    four_shots(&b, "model-header-open", "const i = document.querySelector('#thread-model'); i.blur(); i.click();")
        .await?;

    // A pick is saved at once and is the next turn's model.
    b.find("#thread-model").await?.click().await?;
    b.click_text("[role=listbox]:not([hidden]) [role=option]", "fake-beta").await?;
    model_becomes(&api, &id, "fake-beta").await?;
    b.wait_until("document.querySelector('#thread-model').value === 'fake-beta'").await?;
    ensure!(b.count("dialog[open]").await? == 0, "no dialog");
    let composer = b.find("#composer").await?;
    composer.send_keys("hello from the pick").await?;
    b.eval("document.getElementById('toasts')?.replaceChildren();", vec![]).await?;
    b.find("button.send").await?.click().await?;
    b.wait_until_within(
        "document.querySelectorAll('article.msg.assistant[data-status=\"complete\"]').length >= 1",
        REAL_TURN,
    )
    .await
    .with_context(|| home.diagnostics())?;
    // The turn's requests (those carrying the message; Claude Code may make others with its
    // fast model) name the pick.
    let turn: Vec<String> = fake
        .model_requests()
        .iter()
        .filter(|r| r.body.to_string().contains("hello from the pick"))
        .map(|r| r.body["model"].as_str().unwrap_or_default().to_owned())
        .collect();
    ensure!(!turn.is_empty() && turn.iter().all(|m| m == "fake-beta"), "the turn's models: {turn:?}");
    // The reply says which model answered.
    b.wait_for_text("article.msg.assistant[data-status=\"complete\"]", "model=fake-beta").await?;

    // A name outside the list, typed and confirmed with Enter.
    b.eval("const i = document.querySelector('#thread-model'); i.focus(); i.value = ''; i.dispatchEvent(new Event('input'));", vec![])
        .await?;
    for c in "my-own-model".chars() {
        b.press(&c.to_string()).await?;
    }
    b.wait_until("document.querySelectorAll('[role=listbox]:not([hidden]) [role=option]').length === 1").await?;
    b.press(coffer_tests::browser::keys::ENTER).await?;
    model_becomes(&api, &id, "my-own-model").await?;
    // The keyboard: down to the default option, Enter: back to the connection's model.
    b.eval("document.activeElement.blur(); document.getElementById('toasts')?.replaceChildren();", vec![]).await?;
    let input = b.find("#thread-model").await?;
    input.click().await?;
    b.wait_until("document.querySelector('#thread-model').getAttribute('aria-expanded') === 'true'").await?;
    b.press(coffer_tests::browser::keys::ARROW_DOWN).await?;
    b.wait_until("document.querySelector('#thread-model').getAttribute('aria-activedescendant')?.endsWith('-0')")
        .await?;
    b.press(coffer_tests::browser::keys::ENTER).await?;
    model_becomes(&api, &id, "").await?;
    b.wait_until("document.querySelector('#thread-model').value === ''").await?;
    // Rename holds only the title.
    b.click_text(".thread-actions button", "Rename").await?;
    b.wait_for("dialog.modal #edit-title").await?;
    ensure!(b.count("dialog.modal input").await? == 1, "the rename dialog holds only the title");
    b.press(coffer_tests::browser::keys::ESCAPE).await?;
    b.wait_gone("dialog.modal").await?;

    // The new-conversation dialog: the same list, the same default.
    b.find(".new-conv").await?.click().await?;
    b.wait_for("dialog.modal #new-agent").await?;
    b.eval("const s = document.querySelector('#new-agent'); s.value = 'claude_code'; s.dispatchEvent(new Event('change'));", vec![])
        .await?;
    b.wait_until("document.querySelector('#new-model').placeholder === 'Default: fake-alpha' && document.querySelector('dialog.modal .model-pick').dataset.loaded === 'true'")
        .await?;
    let dialog = options(&b, "#new-model").await?;
    assert_eq!(dialog, header, "the dialog and the header offer the same models");
    four_shots(&b, "model-dialog-open", "const i = document.querySelector('#new-model'); i.blur(); i.click();").await?;
    b.click_text("[role=listbox]:not([hidden]) [role=option]", "fake-gamma").await?;
    b.find("#new-title").await?.send_keys("Second").await?;
    b.find("dialog.modal button[type=submit]").await?.click().await?;
    b.wait_for_text(".thread-title", "Second").await?;
    b.wait_until("document.querySelector('#thread-model').value === 'fake-gamma'").await?;

    // The phone: the header stays one title line over one row of actions.
    b.set_viewport(PHONE.0, PHONE.1).await?;
    b.wait_settled().await?;
    let head = b.eval("return document.querySelector('.thread-head').getBoundingClientRect().height;", vec![]).await?;
    ensure!(head.as_f64().is_some_and(|px| px <= 90.0), "the phone's thread header is {head} px high");
    assert_fits(&b, "the thread at 390").await?;
    b.set_viewport(DESKTOP.0, DESKTOP.1).await?;
    b.assert_clean().await;
    b.close().await?;
    Ok(())
}

/// The Settings page in its sections, in order, each with its help; every setting with a human
/// label (no backtick, not its key), a help line without raw backticks and its key small;
/// on/off, mode and connection settings are pickers that save when changed. The REST table
/// carries the same words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_settings_are_grouped_with_human_labels_help_and_pickers() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    add_connection(&api, json!({"name": "work", "wire": "anthropic", "base_url": "http://127.0.0.1:9", "model": "m"}))
        .await?;
    let table = api.get("/v1/settings/table").reply().await?.ok_json()?;
    let rows = table["items"].as_array().context("items")?;
    for r in rows {
        for f in ["group", "group_title", "group_help", "label"] {
            ensure!(r[f].as_str().is_some_and(|s| !s.is_empty() && !s.contains('`')), "{f} of {r}");
        }
        ensure!(r["label"] != r["key"], "{r}");
    }

    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "settings").await?;
    b.goto("/ui/settings").await?;
    b.wait_for_page("settings").await?;
    b.wait_for("form.setting[data-key='sync.machine_name']").await?;
    let groups = b
        .eval("return [...document.querySelectorAll('section.settings-group')].map(s => [s.dataset.group, s.querySelector('h2').textContent, s.querySelector('.settings-group-help')?.textContent.length || 0]);", vec![])
        .await?;
    let order: Vec<&str> = groups.as_array().context("groups")?.iter().filter_map(|g| g[0].as_str()).collect();
    assert_eq!(order, ["chat", "gateway", "knowledge", "channels", "sync", "advanced"], "{groups}");
    let titles: Vec<&str> = groups.as_array().context("groups")?.iter().filter_map(|g| g[1].as_str()).collect();
    assert_eq!(titles, ["Chat and agents", "MCP gateway", "Knowledge", "Channels", "Sync", "Advanced"]);
    ensure!(
        groups.as_array().context("groups")?.iter().all(|g| g[2].as_u64() > Some(20)),
        "a help line each: {groups}"
    );
    let rows_ui = b
        .eval("return [...document.querySelectorAll('form.setting')].map(f => ({key: f.dataset.key, label: f.querySelector('.setting-name label').textContent, help: f.querySelector('.setting-help').textContent, code: f.querySelectorAll('.setting-help code').length, shown: f.querySelector('.setting-key')?.textContent, raw: f.querySelector('.setting-label').textContent.includes('`')}));", vec![])
        .await?;
    let rows_ui = rows_ui.as_array().context("rows")?;
    ensure!(rows_ui.len() == rows.len(), "{} rows on the page, {} in the table", rows_ui.len(), rows.len());
    for (ui, rest) in rows_ui.iter().zip(rows) {
        let label = ui["label"].as_str().unwrap_or_default();
        ensure!(ui["key"] == rest["key"] && label == rest["label"], "{ui} vs {rest}");
        ensure!(!label.contains('`') && label != ui["key"] && !label.contains('_'), "a raw label: {ui}");
        ensure!(!ui["help"].as_str().unwrap_or("`").contains('`') && ui["raw"] == false, "raw backticks: {ui}");
        ensure!(ui["shown"] == ui["key"], "the key, small: {ui}");
    }
    // Code spans of the help are code.
    let row = rows_ui.iter().find(|r| r["key"] == "gateway.call_timeout_ms").context("call timeout")?;
    ensure!(row["code"].as_u64() == Some(1), "{row}");

    // Pickers: the connection an agent runs on, on/off, a mode; each saves when it changes.
    let conn = "form.setting[data-key='chat.claude_code_connection'] select";
    let opts = b
        .eval("return [...document.querySelector(arguments[0]).options].map(o => o.value);", vec![json!(conn)])
        .await?;
    assert_eq!(opts, json!(["", "work"]));
    b.choose(conn, "work").await?;
    b.wait_for_text("form.setting[data-key='chat.claude_code_connection'] .setting-badge", "set").await?;
    let on = "form.setting[data-key='chat.files_changed'] select";
    b.choose(on, "0").await?;
    b.wait_for_text("form.setting[data-key='chat.files_changed'] .setting-badge", "set").await?;
    b.choose("form.setting[data-key='chat.codex_permission_mode'] select", "ask").await?;
    b.wait_for_text("form.setting[data-key='chat.codex_permission_mode'] .setting-badge", "set").await?;
    let v = api.get("/v1/settings").reply().await?.ok_json()?;
    assert_eq!(
        (
            &v["values"]["chat.claude_code_connection"],
            &v["values"]["chat.files_changed"],
            &v["values"]["chat.codex_permission_mode"]
        ),
        (&json!("work"), &json!("0"), &json!("ask")),
        "{v}"
    );
    b.click_text("form.setting[data-key='chat.claude_code_connection'] button", "Use default").await?;
    b.wait_for_text("form.setting[data-key='chat.claude_code_connection'] .setting-badge", "default").await?;
    ensure!(
        api.get("/v1/settings").reply().await?.ok_json()?["values"].get("chat.claude_code_connection").is_none(),
        "unbound"
    );
    // The section links go where the rest is set up.
    b.click_text("section[data-group=channels] button.link", "Channels →").await?;
    b.wait_until("document.querySelector('#tab-channels').getAttribute('aria-selected') === 'true'").await?;
    b.goto("/ui/settings").await?;
    b.wait_for("form.setting[data-key='sync.machine_name']").await?;
    four_shots(&b, "settings-grouped", "window.scrollTo(0, 0); document.getElementById('page')?.scrollTo(0, 0);")
        .await?;
    b.assert_clean().await;
    b.close().await?;
    Ok(())
}

/// The LLM connections tab: which agent runs on which connection, changed with a picker, and
/// each connection naming the agents bound to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_llm_connections_show_their_agents_and_bind_with_a_picker() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    add_connection(
        &api,
        json!({"name": "work", "wire": "anthropic", "base_url": "http://127.0.0.1:9", "model": "claude-x"}),
    )
    .await?;
    add_connection(
        &api,
        json!({"name": "oai", "wire": "openai-responses", "base_url": "http://127.0.0.1:9/v1", "model": "gpt-x"}),
    )
    .await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "settings").await?;
    b.goto("/ui/settings?tab=llm").await?;
    b.wait_for_page("settings").await?;
    let claude = ".llm-bind[data-agent=claude_code] select";
    let codex = ".llm-bind[data-agent=codex] select";
    b.wait_for(claude).await?;
    let opts = b
        .eval("return [...document.querySelector(arguments[0]).options].map(o => o.value);", vec![json!(claude)])
        .await?;
    assert_eq!(opts, json!(["", "oai", "work"]), "its own login, then the connections by name");
    ensure!(b.count("tr[data-key=work] [data-bound-agent='']").await? == 1, "nothing bound yet");

    b.choose(claude, "work").await?;
    b.wait_for("tr[data-key=work] [data-bound-agent=claude_code]").await?;
    b.wait_for(codex).await?;
    b.choose(codex, "oai").await?;
    b.wait_for("tr[data-key=oai] [data-bound-agent=codex]").await?;
    let v = api.get("/v1/settings").reply().await?.ok_json()?;
    assert_eq!(
        (&v["values"]["chat.claude_code_connection"], &v["values"]["chat.codex_connection"]),
        (&json!("work"), &json!("oai"))
    );
    // The chat service takes the binding up: ListAgents names the connection.
    wait_for("ListAgents to show both bindings", Duration::from_secs(20), || async {
        let a = api.get("/v1/agents").reply().await?.ok_json()?;
        let of = |k: &str| {
            a["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|x| x["agent_key"] == k)
                .map(|x| x["binding"]["connection"].clone())
        };
        Ok((of("claude_code") == Some(json!("work")) && of("codex") == Some(json!("oai"))).then_some(()))
    })
    .await?;
    b.refresh().await?;
    b.wait_for("tr[data-key=work] [data-bound-agent=claude_code]").await?;
    ensure!(
        b.eval("return document.querySelector(arguments[0]).value;", vec![json!(claude)]).await? == "work",
        "the picker shows the binding after a reload"
    );
    four_shots(&b, "llm-bindings", "window.scrollTo(0, 0);").await?;

    // Back to its own login.
    b.choose(claude, "").await?;
    b.wait_for("tr[data-key=work] [data-bound-agent='']").await?;
    ensure!(
        api.get("/v1/settings").reply().await?.ok_json()?["values"].get("chat.claude_code_connection").is_none(),
        "unbound"
    );
    b.assert_clean().await;
    b.close().await?;
    Ok(())
}
