//! The console's approval surfaces (issue 34 §1) in a real headless Chromium against a real
//! daemon with the scripted agent (`APPROVE[Tool: text]` asks and says `approved` or
//! `denied: <message>`): the mode picker in the header and the new-conversation dialog (PATCH /
//! create with `permission_mode`), the approval card appearing in the thread, `a` allowing it,
//! `d` denying the focused one, a decision made over REST (another surface) updating the card,
//! and the list's "waiting for you" badge coming and going. Screenshots (desktop, a 390 px
//! phone, dark) go to `target/ui-screenshots/approval-*.png`.
use anyhow::{Context, ensure};
use coffer_tests::browser::{Browser, keys};
use coffer_tests::{SendExt, TestHome, chat};
use serde_json::json;

/// Reads conversation `id`'s permission mode over REST.
async fn mode(api: &coffer_tests::Api, id: &str) -> anyhow::Result<String> {
    let v = api.get(&format!("/v1/conversations/{id}")).reply().await?.json()?;
    Ok(v["conversation"]["agent_config"]["permission_mode"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_approval_cards_keys_rest_decisions_badge_and_mode() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;

    // A conversation from the new-conversation dialog, in ask mode.
    b.find(".new-conv").await?.click().await?;
    b.wait_for("dialog.modal #new-mode").await?;
    b.choose("#new-agent", chat::SCRIPTED).await?;
    b.choose("#new-mode", "ask").await?;
    b.find("#new-title").await?.send_keys("Approvals").await?;
    b.screenshot("approval-new-dialog").await?;
    b.find("dialog.modal button[type=submit]").await?.click().await?;
    b.wait_gone("dialog.modal").await?;
    b.wait_until("document.querySelector('.thread-title')?.textContent === 'Approvals'").await?;
    let id = b
        .eval("return document.querySelector('.conv-item[aria-current=\"true\"]').dataset.id;", vec![])
        .await?
        .as_str()
        .context("the selected conversation")?
        .to_owned();
    assert_eq!(mode(&api, &id).await?, "ask", "created in ask mode");
    assert_eq!(b.find(".mode-select").await?.prop("value").await?, json!("ask"));

    // The header's picker changes it (from the next turn).
    b.choose(".mode-select", "read_only").await?;
    coffer_tests::wait_for("the mode to be read_only", std::time::Duration::from_secs(20), || async {
        Ok((mode(&api, &id).await? == "read_only").then_some(()))
    })
    .await?;
    b.choose(".mode-select", "ask").await?;
    coffer_tests::wait_for("the mode to be ask", std::time::Duration::from_secs(20), || async {
        Ok((mode(&api, &id).await? == "ask").then_some(()))
    })
    .await?;

    // A request: the card appears with the tool and the command; the list says it waits.
    let send = |text: &'static str| {
        let api = api.clone();
        let id = id.clone();
        async move {
            let r =
                api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({ "text": text })).reply().await?;
            ensure!(r.status == 202, "send: {} {}", r.status, r.text);
            anyhow::Ok(())
        }
    };
    send("APPROVE[Bash: rm -rf build]").await?;
    let card = b.wait_for(".approval-card.waiting").await?;
    let text = card.text().await?;
    ensure!(
        text.contains("Bash") && text.contains("rm -rf build") && text.contains("Waiting for your approval"),
        "{text}"
    );
    b.wait_for(&format!(".conv-item[data-id=\"{id}\"] .waiting-you")).await?;
    b.screenshot("approval-card-desktop").await?;
    b.set_dark(true).await?;
    b.screenshot("approval-card-dark").await?;
    b.set_dark(false).await?;
    b.set_viewport(390, 844).await?;
    ensure!(b.horizontal_overflow().await? <= 0, "no sideways scrolling at 390 px");
    b.screenshot("approval-card-390").await?;
    b.set_viewport(1280, 800).await?;

    // `a` (nothing focused that takes text) allows the newest waiting card.
    b.eval("document.activeElement && document.activeElement.blur(); return true;", vec![]).await?;
    b.press("a").await?;
    b.wait_for(".approval-card.decided.allowed").await?;
    b.wait_for_text(".approval-card.allowed .approval-outcome", "Allowed by the web console").await?;
    b.wait_until(
        "[...document.querySelectorAll('article.msg.assistant')].some(m => m.textContent.includes('approved'))",
    )
    .await?;
    b.wait_gone(&format!(".conv-item[data-id=\"{id}\"] .waiting-you")).await?;
    ensure!(
        b.eval("return document.querySelector('.approval-card.allowed .approval-allow').disabled;", vec![]).await?
            == json!(true),
        "a decided card's buttons are disabled"
    );

    // Typing an `a` in the composer is text, not an answer.
    send("APPROVE[Write: /srv/app/config.toml]").await?;
    b.wait_for(".approval-card.waiting").await?;
    // (Focused from the page: a toast may cover the composer's middle.)
    b.eval("document.querySelector('#composer').focus(); return true;", vec![]).await?;
    let composer = b.find("#composer").await?;
    composer.send_keys("a").await?;
    ensure!(b.count(".approval-card.waiting").await? == 1, "a key in the composer answers nothing");
    composer.clear().await?;

    // Decided elsewhere (REST, as the CLI or a channel would): the card says so, disabled.
    let number = b
        .eval("return document.querySelector('.approval-card.waiting').dataset.number;", vec![])
        .await?
        .as_str()
        .context("number")?
        .to_owned();
    let r = api
        .post_json(
            &format!("/v1/conversations/{id}/approvals/{number}"),
            &json!({"decision": "deny", "message": "not that file"}),
        )
        .reply()
        .await?;
    ensure!(r.status == 200, "answer: {} {}", r.status, r.text);
    b.wait_for(&format!(".approval-card.denied[data-number=\"{number}\"]")).await?;
    let outcome = b.find(&format!(".approval-card[data-number=\"{number}\"] .approval-outcome")).await?.text().await?;
    ensure!(outcome.contains("Denied by") && outcome.contains("not that file"), "{outcome}");
    b.wait_until("[...document.querySelectorAll('article.msg.assistant')].some(m => m.textContent.includes('denied: not that file'))")
        .await?;

    // `d` on the focused card denies it (with the message typed into it, Enter in the field).
    send("APPROVE[Bash: git push --force]").await?;
    let card = b.wait_for(".approval-card.waiting").await?;
    b.eval("document.querySelector('.approval-card.waiting').focus(); return true;", vec![]).await?;
    let _ = card;
    b.press("d").await?;
    b.wait_for_text(".approval-card.denied:last-of-type .approval-outcome", "Denied by the web console").await?;
    b.wait_until("[...document.querySelectorAll('article.msg.assistant')].some(m => m.textContent.includes('denied: The user denied'))")
        .await?;

    // After a reload, a waiting request is shown again; decided ones are not.
    send("APPROVE[Bash: make deploy]").await?;
    b.wait_for(".approval-card.waiting").await?;
    b.refresh().await?;
    b.wait_for(".approval-card.waiting").await?;
    ensure!(b.count(".approval-card").await? == 1, "only the waiting request after a reload");
    b.eval("document.querySelector('.approval-card.waiting .approval-message').focus(); return true;", vec![]).await?;
    let field = b.find(".approval-card.waiting .approval-message").await?;
    field.send_keys("deploy tomorrow").await?;
    b.press(keys::ENTER).await?;
    b.wait_for_text(".approval-card.denied .approval-outcome", "deploy tomorrow").await?;
    b.screenshot("approval-decided-desktop").await?;
    b.set_viewport(390, 844).await?;
    ensure!(b.horizontal_overflow().await? <= 0, "no sideways scrolling at 390 px");
    b.screenshot("approval-decided-390").await?;
    b.assert_clean().await;
    Ok(())
}
