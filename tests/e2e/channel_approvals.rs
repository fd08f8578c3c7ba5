//! Approvals from the channels (issue 34 §1 surfaces), end to end: a real daemon
//! (`coffer-test-daemon scripted-chat`: the scripted agent's `APPROVE[Tool: text]` asks for an
//! approval, waits, and says `approved` or `denied: <message>`), the Telegram adapter polling
//! the fake Bot API over loopback HTTP (inline keyboards, `callback_query`, `answerCallbackQuery`),
//! and the SeaTalk adapter behind the real `coffer-callback` with the fake Open Platform.
//!
//! Covered: the request arrives as a new message with Allow / Deny / Always buttons; the owner's
//! Deny tells the agent and edits the message with the decision and who; Allow approves; a
//! stranger's press is refused and decides nothing; a second press and a press after the turn
//! ended are answered "already decided" and change nothing; a decision made over REST (the
//! console's route) edits the Telegram message; `/allow N`, `/deny N message`, `/mode`; SeaTalk's
//! request message with its commands, `/deny N`, `/allow N`, a stranger's `/allow` refused.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::fake_seatalk::{self, Callback, FakeSeatalk};
use coffer_tests::fake_telegram::{FakeTelegram, Shown};
use coffer_tests::{Api, SendExt, TestHome, chat, ports, wait_for};
use serde_json::json;

const TOKEN: &str = "4242:fake-token-APPROVALS";
const OWNER: i64 = 1001;
const STRANGER: i64 = 2002;
const WAIT: Duration = Duration::from_secs(30);

struct Tg {
    _home: TestHome,
    api: Api,
    fake: FakeTelegram,
}

/// A daemon with the Telegram channel `tg` (scripted agent) on the fake, paired to [`OWNER`].
async fn telegram() -> anyhow::Result<Tg> {
    let home = TestHome::new()?;
    let fake = FakeTelegram::start(TOKEN, "coffer_bot").await?;
    let api = chat::start_daemon(&home).await?;
    let body = json!({ "name": "tg", "kind": "telegram", "enabled": true, "bot_token": TOKEN,
        "api_base_url": fake.url, "default_agent": chat::SCRIPTED });
    let r = api.post_json("/v1/channels", &body).reply().await?;
    ensure!(r.status == 201, "POST /v1/channels: {} {}", r.status, r.text);
    fake.wait("the adapter's first long poll", WAIT, |f| !f.calls_of("getUpdates").is_empty()).await?;
    let p = api.post("/v1/channels/tg/pair").reply().await?;
    ensure!(p.status == 200, "pair: {} {}", p.status, p.text);
    let code = p.json()?["code"].as_str().context("code")?.to_owned();
    fake.push_text(OWNER, &format!("/pair {code}"));
    let tg = Tg { _home: home, api, fake };
    tg.wait_bot("Paired").await?;
    Ok(tg)
}

impl Tg {
    /// Waits until a bot message in the owner's chat shows `needle`; the newest such.
    async fn wait_bot(&self, needle: &str) -> anyhow::Result<Shown> {
        self.fake
            .wait(&format!("a bot message with {needle:?}"), WAIT, |f| {
                f.bot_messages(OWNER).iter().any(|m| m.visible().contains(needle))
            })
            .await?;
        self.fake.bot_messages(OWNER).into_iter().rfind(|m| m.visible().contains(needle)).context("found")
    }

    /// The owner's chat's message `id` as it is now.
    fn message(&self, id: i64) -> anyhow::Result<Shown> {
        self.fake.bot_messages(OWNER).into_iter().find(|m| m.message_id == id).context("the message")
    }

    /// Waits until message `id` satisfies `done`; the message then.
    async fn wait_message(&self, id: i64, what: &str, done: impl Fn(&Shown) -> bool) -> anyhow::Result<Shown> {
        self.fake.wait(what, WAIT, |f| f.bot_messages(OWNER).iter().any(|m| m.message_id == id && done(m))).await?;
        self.message(id)
    }

    /// Presses the button labelled `label` of message `m` as `user`; the query's answer text and
    /// whether it was an alert.
    async fn press(&self, user: i64, m: &Shown, label: &str) -> anyhow::Result<(String, bool)> {
        let b = m.button(label).with_context(|| format!("no {label} button on {m:?}"))?;
        let q = self.fake.press_in(OWNER, user, m.message_id, &b.data);
        self.fake.wait("the callback query's answer", WAIT, |f| f.answer_of(&q).is_some()).await?;
        let a = self.fake.answer_of(&q).context("answer")?;
        Ok((a.text, a.show_alert))
    }

    /// The conversation bound to the owner's chat.
    async fn conversation(&self) -> anyhow::Result<String> {
        let list = self.api.get("/v1/conversations").reply().await?.json()?;
        let items = list["items"].as_array().context("items")?;
        let c = items
            .iter()
            .find(|c| {
                c["channel_name"] == "tg" && c["peer_chat_id"].as_str().and_then(|s| s.parse().ok()) == Some(OWNER)
            })
            .context("the bound conversation")?;
        Ok(c["id"].as_str().context("id")?.to_owned())
    }
}

/// The approval number an approval button's `callback_data` (`ap:<conv>:<n>:<d>`) carries.
fn number_of(m: &Shown) -> anyhow::Result<u64> {
    let data = m.button("Allow").context("an Allow button")?.data;
    data.split(':').nth(2).context("number")?.parse().context("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_buttons_deny_then_allow_strangers_and_second_presses_change_nothing() -> anyhow::Result<()> {
    let tg = telegram().await?;
    tg.fake.push_text(OWNER, "/mode ask");
    tg.wait_bot("Mode set to ask").await?;
    let polls = tg.fake.calls_of("getUpdates");
    let asked = &polls.last().context("a poll")?.params["allowed_updates"];
    ensure!(asked.as_array().is_some_and(|a| a.iter().any(|v| v == "callback_query")), "{asked}");

    // The request: a new message with the three buttons, data within Telegram's 64 bytes.
    tg.fake.push_text(OWNER, "APPROVE[Bash: rm -rf build]");
    let req = tg.wait_bot("Waiting for your approval").await?;
    ensure!(req.visible().contains("Waiting for your approval: Bash rm -rf build"), "{}", req.visible());
    let labels: Vec<String> = req.buttons().iter().map(|b| b.text.clone()).collect();
    assert_eq!(labels, ["Allow", "Deny", "Always"]);
    ensure!(req.buttons().iter().all(|b| !b.data.is_empty() && b.data.len() <= 64), "{:?}", req.buttons());
    let conv = tg.conversation().await?;
    let list = tg.api.get("/v1/conversations").reply().await?.json()?;
    let item = list["items"].as_array().context("items")?.iter().find(|c| c["id"] == conv.as_str()).cloned();
    assert_eq!(item.context("listed")?["approvals_waiting"], 1, "the list's waiting badge");

    // A stranger's press: refused as an alert, nothing decided, the message untouched.
    let (text, alert) = tg.press(STRANGER, &req, "Deny").await?;
    ensure!(alert && text.contains("owner"), "{text}");
    let still = tg.message(req.message_id)?;
    assert_eq!((still.edits, still.keyboard.len()), (0, 1), "a stranger changes nothing");

    // The owner denies: the agent is told, the message says the decision and who, no buttons.
    let (text, _) = tg.press(OWNER, &req, "Deny").await?;
    assert_eq!(text, "Denied.");
    tg.wait_bot("denied: The user denied this action.").await?;
    let edited = tg.wait_message(req.message_id, "the decision on the request", |m| m.keyboard.is_empty()).await?;
    let shown = edited.visible();
    ensure!(shown.contains("Denied") && shown.contains("rm -rf build") && shown.contains("user 1001 in tg"), "{shown}");

    // Pressed again (a stale keyboard), after the turn ended: already decided, nothing changes.
    let edits = edited.edits;
    let (text, alert) = tg.press(OWNER, &req, "Allow").await?;
    ensure!(!alert && text.starts_with("Already decided: denied by user 1001 in tg"), "{text}");
    assert_eq!(tg.message(req.message_id)?.edits, edits, "an answer after the decision edits nothing");

    // The next request is allowed with its button.
    tg.fake.push_text(OWNER, "APPROVE[Bash: make test]");
    let req2 = tg.wait_bot("make test").await?;
    ensure!(req2.message_id != req.message_id, "a new message (it notifies)");
    let (text, _) = tg.press(OWNER, &req2, "Allow").await?;
    assert_eq!(text, "Allowed.");
    tg.wait_bot("approved").await?;
    let done = tg.wait_message(req2.message_id, "the allowed request", |m| m.keyboard.is_empty()).await?;
    ensure!(done.visible().contains("Allowed"), "{}", done.visible());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegram_shows_decisions_made_elsewhere_and_answers_allow_and_deny_commands() -> anyhow::Result<()> {
    let tg = telegram().await?;
    // Decided in the console (its REST route): the Telegram message is edited the same way.
    tg.fake.push_text(OWNER, "APPROVE[Bash: ls -la]");
    let req = tg.wait_bot("ls -la").await?;
    let conv = tg.conversation().await?;
    let n = number_of(&req)?;
    let r = tg
        .api
        .post_json(&format!("/v1/conversations/{conv}/approvals/{n}"), &json!({ "decision": "allow" }))
        .reply()
        .await?;
    ensure!(r.status == 200, "answer over REST: {} {}", r.status, r.text);
    let edited = tg.wait_message(req.message_id, "the REST decision on the message", |m| m.keyboard.is_empty()).await?;
    ensure!(edited.visible().contains("Allowed"), "{}", edited.visible());
    tg.wait_bot("approved").await?;
    // A press now: already decided.
    let (text, _) = tg.press(OWNER, &req, "Deny").await?;
    ensure!(text.starts_with("Already decided: allowed by"), "{text}");

    // `/deny N message`: the agent gets the message; the request's message says it.
    tg.fake.push_text(OWNER, "APPROVE[Write: /etc/hosts]");
    let req = tg.wait_bot("/etc/hosts").await?;
    let n = number_of(&req)?;
    tg.fake.push_text(OWNER, &format!("/deny {n} not that file"));
    tg.wait_bot(&format!("Denied #{n}.")).await?;
    tg.wait_bot("denied: not that file").await?;
    let edited = tg.wait_message(req.message_id, "the /deny decision", |m| m.keyboard.is_empty()).await?;
    ensure!(edited.visible().contains("not that file"), "{}", edited.visible());
    // `/allow` without a number answers the only waiting request.
    tg.fake.push_text(OWNER, "APPROVE[Bash: cargo build]");
    let req = tg.wait_bot("cargo build").await?;
    let n = number_of(&req)?;
    // `/status` lists the waiting request, its number and the commands that answer it.
    tg.fake.push_text(OWNER, "/status");
    let status = tg.wait_bot("Waiting for your approval: 1").await?;
    let shown = status.visible();
    ensure!(
        shown.contains(&format!("#{n} Bash: cargo build"))
            && shown.contains(&format!("/allow {n}"))
            && shown.contains(&format!("/deny {n}"))
            && shown.contains(&format!("/always {n}")),
        "{shown}"
    );
    tg.fake.push_text(OWNER, &format!("/allow {n}"));
    tg.wait_bot(&format!("Allowed #{n}.")).await?;
    tg.fake.push_text(OWNER, &format!("/allow {n}"));
    tg.wait_bot(&format!("#{n} was already decided")).await?;
    tg.fake.push_text(OWNER, "/mode");
    tg.wait_bot("Mode: bypass").await?;
    tg.fake.push_text(OWNER, "/mode sometimes");
    tg.wait_bot("Unknown mode").await?;
    Ok(())
}

/// Whether `m` is an accepted message to `to` containing `text`.
fn says(m: &fake_seatalk::Sent, to: &str, text: &str) -> bool {
    m.accepted && m.to == to && m.content.contains(text)
}

/// A daemon with the SeaTalk channel `team` (scripted agent) behind the real coffer-callback and
/// the fake Open Platform, paired to employee `E1`.
struct St {
    _home: TestHome,
    api: Api,
    fake: FakeSeatalk,
    cb: Callback,
    signing: String,
    events: std::sync::atomic::AtomicU32,
}

impl St {
    async fn start() -> anyhow::Result<St> {
        let port = ports::free_port();
        let home = TestHome::builder().env("COFFER_CALLBACK_PORT", port.to_string()).build()?;
        let api = chat::start_daemon(&home).await?;
        let fake = FakeSeatalk::start("app-id", "app-secret").await?;
        let signing = format!("signing-{:016x}", fastrand::u64(..));
        let body = json!({ "name": "team", "kind": "seatalk", "enabled": true, "app_id": "app-id",
            "app_secret": "app-secret", "signing_secret": signing, "api_base_url": fake.url,
            "default_agent": chat::SCRIPTED });
        let r = api.post_json("/v1/channels", &body).reply().await?;
        ensure!(r.status == 201, "POST /v1/channels: {} {}", r.status, r.text);
        wait_for("coffer-callback to run for the channel", WAIT, || async {
            Ok((api.service("callback").await?["state"] == "healthy").then_some(()))
        })
        .await?;
        let st = St { _home: home, api, fake, cb: Callback::new(port), signing, events: Default::default() };
        let p = st.api.post("/v1/channels/team/pair").reply().await?;
        ensure!(p.status == 200, "pair: {} {}", p.status, p.text);
        let code = p.json()?["code"].as_str().context("code")?.to_owned();
        st.text("E1", &format!("/pair {code}")).await?;
        st.said("E1", "Paired").await?;
        Ok(st)
    }

    fn event_id(&self) -> String {
        format!("ev-{}", self.events.fetch_add(1, std::sync::atomic::Ordering::SeqCst))
    }

    /// Posts `body`, signed, to coffer-callback: answered 200.
    async fn post(&self, body: Vec<u8>) -> anyhow::Result<()> {
        let a = self.cb.signed("team", body, &self.signing).await?;
        ensure!(a.status == 200, "callback: {a:?}");
        Ok(())
    }

    async fn text(&self, from: &str, text: &str) -> anyhow::Result<()> {
        self.post(fake_seatalk::single_message(&self.event_id(), from, text)).await
    }

    /// `from` clicks the button `label` of the card `card`.
    async fn click(&self, from: &str, card: &fake_seatalk::Sent, label: &str) -> anyhow::Result<()> {
        let buttons = card.card.as_ref().and_then(|c| c.as_array()).context("a card")?;
        let value = buttons
            .iter()
            .find(|e| e["element_type"] == "button" && e["button"]["text"] == label)
            .and_then(|e| e["button"]["value"].as_str())
            .with_context(|| format!("a {label} button on {buttons:?}"))?;
        self.post(fake_seatalk::click(&self.event_id(), from, &card.message_id, value)).await
    }

    /// Waits for an accepted message to `to` containing `needle`; every message so far.
    async fn said(&self, to: &str, needle: &str) -> anyhow::Result<Vec<fake_seatalk::Sent>> {
        self.fake.wait_messages(&format!("{needle:?} to {to}"), WAIT, |m| m.iter().any(|s| says(s, to, needle))).await
    }

    /// How many accepted messages to `to` contain `needle`.
    fn count(&self, to: &str, needle: &str) -> usize {
        self.fake.messages().iter().filter(|s| says(s, to, needle)).count()
    }

    /// The newest card sent to `to` whose text contains `needle`.
    async fn card(&self, to: &str, needle: &str) -> anyhow::Result<fake_seatalk::Sent> {
        let m = self.said(to, needle).await?;
        m.into_iter().rfind(|s| s.card.is_some() && says(s, to, needle)).context("a card")
    }

    /// The conversation bound to the channel.
    async fn conversation(&self) -> anyhow::Result<String> {
        let list = self.api.get("/v1/conversations").reply().await?.json()?;
        let conv = list["items"].as_array().context("items")?.iter().find(|c| c["channel_name"] == "team");
        Ok(conv.context("conv")?["id"].as_str().context("id")?.to_owned())
    }
}

/// The request number `(#N)` a card or message shows.
fn number_in(text: &str) -> anyhow::Result<u64> {
    text.split("(#")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("a number in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seatalk_shows_requests_with_their_commands_and_only_the_owner_answers() -> anyhow::Result<()> {
    let st = St::start().await?;
    // The request: a card naming it, with its buttons and the commands that answer it too.
    st.text("E1", "APPROVE[Bash: rm -rf build]").await?;
    let card = st.card("E1", "Waiting for your approval").await?;
    let req = card.content.clone();
    ensure!(req.contains("Bash `rm -rf build`") && req.contains("/allow") && req.contains("/deny"), "{req}");
    ensure!(req.contains("[Allow]") && req.contains("[Deny]") && req.contains("[Always]"), "{req}");
    let n = number_in(&req)?;
    // A stranger's /allow: refused, nothing decided.
    st.text("E2", &format!("/allow {n}")).await?;
    st.said("E2", "Sorry").await?;
    // The owner denies with a message: the agent is told, the card says so.
    st.text("E1", &format!("/deny {n} use cargo clean")).await?;
    st.said("E1", "denied: use cargo clean").await?;
    ensure!(st.count("E1", &format!("Denied #{n}.")) == 1, "the command is answered");
    ensure!(st.count("E1", "approved") == 0, "not allowed by the stranger");
    let shown = st.fake.wait_card(&card.message_id, "The agent was told: use cargo clean", WAIT).await?;
    ensure!(
        shown.starts_with("Denied\n") && shown.contains("by user E1 in team") && !shown.contains("[Allow]"),
        "{shown}"
    );
    // A decision made elsewhere updates the card.
    st.text("E1", "APPROVE[Bash: cargo clean]").await?;
    let card2 = st.card("E1", "cargo clean`").await?;
    let n2 = number_in(&card2.content)?;
    let conv = st.conversation().await?;
    let r = st
        .api
        .post_json(&format!("/v1/conversations/{conv}/approvals/{n2}"), &json!({"decision": "allow"}))
        .reply()
        .await?;
    ensure!(r.status == 200, "REST answer: {} {}", r.status, r.text);
    st.fake.wait_card(&card2.message_id, &format!("Allowed: Bash `cargo clean` (#{n2}), by the API"), WAIT).await?;
    st.said("E1", "approved").await?;
    st.text("E1", &format!("/allow {n2}")).await?;
    st.said("E1", "already decided").await?;
    Ok(())
}

/// The interactive card's buttons (issue 34 §1 on SeaTalk): a stranger's click is refused and
/// decides nothing; the owner's Deny tells the agent and updates the card with the decision
/// and who; a second click and a click after the turn ended are answered with the first
/// decision and change nothing; Allow approves; Always is remembered; a decision made over
/// REST (the console's route) updates the card too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seatalk_cards_are_answered_by_the_owner_s_click_once_and_updated_from_anywhere() -> anyhow::Result<()> {
    let st = St::start().await?;
    st.text("E1", "APPROVE[Bash: rm -rf build]").await?;
    let card = st.card("E1", "Waiting for your approval").await?;
    ensure!(card.endpoint == "single_chat" && card.content.contains("Bash `rm -rf build`"), "{card:?}");
    let n = number_in(&card.content)?;

    // A stranger's click (as if the card had reached them): refused in their own chat, once;
    // the card still waits and the agent was told nothing.
    st.click("E2", &card, "Allow").await?;
    st.said("E2", "Only this bot's owner can answer its requests.").await?;
    st.click("E2", &card, "Deny").await?;
    ensure!(st.fake.card(&card.message_id).is_some_and(|c| c.contains("Waiting")), "the card still waits");
    ensure!(st.fake.updates().is_empty(), "no card was updated: {:?}", st.fake.updates());

    // The owner's Deny: the agent is told, the card updated (no buttons), no extra message.
    st.click("E1", &card, "Deny").await?;
    st.said("E1", "denied: The user denied this action.").await?;
    let shown = st.fake.wait_card(&card.message_id, "Denied", WAIT).await?;
    ensure!(shown.contains(&format!("Bash `rm -rf build` (#{n}), by user E1 in team")), "{shown}");
    ensure!(!shown.contains('['), "no buttons left: {shown}");
    ensure!(st.count("E2", "Only this bot's owner") == 1, "the stranger was told once");
    ensure!(st.count("E1", "approved") == 0, "the stranger's Allow decided nothing");

    // Clicked again after the turn ended: answered with the first decision, nothing changes.
    let updates = st.fake.updates().len();
    st.click("E1", &card, "Allow").await?;
    st.said("E1", &format!("#{n} was already decided: denied by user E1 in team.")).await?;
    ensure!(st.fake.updates().len() == updates, "the card was not changed again");
    ensure!(st.count("E1", "approved") == 0);

    // Allow on the next request runs it; a click racing it in the same turn gets the first.
    st.text("E1", "APPROVE[Bash: cargo clean]\nAPPROVE[Bash: cargo build]").await?;
    let card2 = st.card("E1", "cargo clean`").await?;
    st.click("E1", &card2, "Allow").await?;
    st.click("E1", &card2, "Deny").await?;
    let n2 = number_in(&card2.content)?;
    st.said("E1", &format!("#{n2} was already decided: allowed by user E1 in team.")).await?;
    st.fake.wait_card(&card2.message_id, "Allowed: Bash `cargo clean`", WAIT).await?;
    // Always on the third: allowed, and the card says so.
    let card3 = st.card("E1", "cargo build`").await?;
    st.click("E1", &card3, "Always").await?;
    st.fake.wait_card(&card3.message_id, "Allowed always: Bash `cargo build`", WAIT).await?;
    st.said("E1", "approved").await?;

    // Decided over REST with a message: the card shows it, by whom, and what the agent was told.
    st.text("E1", "APPROVE[Edit: src/main.rs]").await?;
    let card4 = st.card("E1", "src/main.rs`").await?;
    let n4 = number_in(&card4.content)?;
    let conv = st.conversation().await?;
    let body = json!({"decision": "deny", "message": "not that file"});
    let r = st.api.post_json(&format!("/v1/conversations/{conv}/approvals/{n4}"), &body).reply().await?;
    ensure!(r.status == 200, "REST answer: {} {}", r.status, r.text);
    let shown = st.fake.wait_card(&card4.message_id, "The agent was told: not that file", WAIT).await?;
    ensure!(shown.contains(&format!("Denied: Edit `src/main.rs` (#{n4}), by the API")), "{shown}");
    st.said("E1", "denied: not that file").await?;
    // A click on it afterwards: the REST decision stands.
    st.click("E1", &card4, "Allow").await?;
    st.said("E1", &format!("#{n4} was already decided: denied by the API")).await?;
    ensure!(st.fake.updates().iter().all(|u| u.accepted), "every update was accepted: {:?}", st.fake.updates());
    Ok(())
}

/// A card SeaTalk will not update any more (past its 7 days): the decision is said in a
/// message instead, and the request still ran as decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seatalk_card_that_cannot_be_updated_gets_its_decision_as_a_message() -> anyhow::Result<()> {
    let st = St::start().await?;
    st.text("E1", "APPROVE[Bash: make deploy]").await?;
    let card = st.card("E1", "Waiting for your approval").await?;
    let n = number_in(&card.content)?;
    st.fake.refuse_updates();
    st.click("E1", &card, "Allow").await?;
    st.said("E1", &format!("Allowed: Bash `make deploy` (#{n}), by user E1 in team.")).await?;
    st.said("E1", "approved").await?;
    let updates = st.fake.updates();
    ensure!(updates.len() == 1 && !updates[0].accepted, "one refused update: {updates:?}");
    ensure!(st.fake.card(&card.message_id).is_some_and(|c| c.contains("Waiting")), "the card is as it was");
    Ok(())
}
