//! Telegram progress messages at their limits, end to end: a real daemon (`coffer-test-daemon
//! scripted-chat`), a Telegram channel on the fake Bot API (`coffer_tests::fake_telegram`) over
//! loopback HTTP. A long answer keeps its start while it streams (past about 3,500 characters
//! the answer continues in a new message; read in order the messages are the whole answer,
//! none over Telegram's 4,096 characters), and a `coffer-chat` killed with SIGKILL mid-turn
//! leaves no progress message on "…": the restarted service finishes it with the text it
//! showed and a one-line reason.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_proto::store::channels_client::ChannelsClient;
use coffer_proto::store::{self as st, ChannelKind, ChannelRecord};
use coffer_runtime::grpc::AuthChannel;
use coffer_tests::fake_telegram::{FakeTelegram, Shown};
use coffer_tests::{Api, SendExt, TestHome, chat, procs, wait_for};
use reqwest::Method;
use secrecy::SecretString;
use serde_json::json;

const TOKEN: &str = "4343:fake-token-BBBB";
const OWNER: i64 = 3003;
const WAIT: Duration = Duration::from_secs(40);

/// A daemon with the enabled Telegram channel `tg` on `fake`, paired with [`OWNER`].
async fn rig(home: &TestHome, fake: &FakeTelegram) -> anyhow::Result<Api> {
    let api = chat::start_daemon(home).await?;
    let r = api
        .request(Method::PUT, "/v1/credentials/tg-token")
        .header("X-Coffer-Actor", "cli")
        .json(&json!({ "value": TOKEN }))
        .reply()
        .await?;
    ensure!(r.status.is_success(), "PUT credential: {} {}", r.status, r.text);
    // The Channels service with the gateway's identity, as the edge writes channels.
    let pid = api.service("gateway").await?["pid"].as_i64().context("gateway pid")? as i32;
    let env = procs::environ(pid);
    let token = SecretString::from(env.get("COFFER_INTERNAL_TOKEN").context("COFFER_INTERNAL_TOKEN")?.clone());
    let addr = env.get("COFFER_STORE_ADDR").context("COFFER_STORE_ADDR")?;
    let mut channels: ChannelsClient<AuthChannel> = ChannelsClient::new(coffer_runtime::grpc::channel(addr, &token)?);
    let record = ChannelRecord {
        name: "tg".into(),
        kind: ChannelKind::Telegram as i32,
        enabled: true,
        bot_token_ref: "tg-token".into(),
        api_base_url: fake.url.clone(),
        default_agent: chat::SCRIPTED.into(),
        ..Default::default()
    };
    channels.create_channel(st::CreateChannelRequest { channel: Some(record), actor: "cli".into() }).await?;
    let code = channels
        .start_pairing(st::StartPairingRequest { name: "tg".into(), ttl_s: 600, actor: "cli".into() })
        .await?
        .into_inner()
        .code;
    fake.push_text(OWNER, &format!("/pair {code}"));
    wait_bot(fake, "Paired").await?;
    Ok(api)
}

async fn wait_bot(fake: &FakeTelegram, needle: &str) -> anyhow::Result<Shown> {
    fake.wait(&format!("a bot message with {needle:?}"), WAIT, |f| {
        f.bot_messages(OWNER).iter().any(|m| m.visible().contains(needle))
    })
    .await?;
    fake.bot_messages(OWNER).into_iter().rfind(|m| m.visible().contains(needle)).context("found")
}

fn words(s: &str) -> Vec<&str> {
    s.split_whitespace().filter(|w| *w != "…").collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_streamed_answer_keeps_its_start_and_continues_in_new_messages() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let fake = FakeTelegram::start(TOKEN, "coffer_bot").await?;
    let _api = rig(&home, &fake).await?;
    let before = fake.bot_messages(OWNER).len();
    // 70 paragraphs of about 110 characters (~7,700 in all), streamed word by word over ~10 s.
    let mut script = String::from("slow:8\n");
    let mut answer = String::new();
    for i in 0..70 {
        let p = format!(
            "Paragraph {i:02} begins here and goes on with enough words to fill most of a line, then ends p{i:02}."
        );
        script.push_str(&format!("say:{p}\nnl\nnl\n"));
        answer.push_str(&p);
        answer.push_str("\n\n");
    }
    fake.push_text(OWNER, &script);
    // While it streams: a second progress message carries on, the first keeps the start.
    fake.wait("a second message while the answer streams", WAIT, |f| {
        let turn = &f.bot_messages(OWNER)[before..];
        turn.len() >= 2
            && turn.last().is_some_and(|m| m.visible().trim_end().ends_with('…'))
            && turn[0].visible().starts_with("Paragraph 00 begins")
            && !turn[0].visible().trim_end().ends_with('…')
    })
    .await?;
    let last = wait_bot(&fake, "then ends p69.").await?;
    fake.wait("the answer's last message finished", WAIT, |f| {
        f.bot_messages(OWNER).iter().any(|m| m.message_id == last.message_id && !m.visible().trim_end().ends_with('…'))
    })
    .await?;
    let turn: Vec<Shown> = fake.bot_messages(OWNER)[before..].to_vec();
    ensure!(turn.len() >= 2, "{turn:?}");
    for m in &turn {
        let n = m.visible().chars().count();
        ensure!(n <= 4096, "a message of {n} characters");
        ensure!(!m.visible().trim_end().ends_with('…'), "none left on …: {}", m.visible());
    }
    ensure!(turn[0].visible().starts_with("Paragraph 00 begins"), "the start: {}", turn[0].visible());
    let shown: String = turn.iter().map(Shown::visible).collect::<Vec<_>>().join("\n\n");
    assert_eq!(words(&shown), words(&answer), "read in order, the messages are the whole answer, each word once");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_service_killed_mid_turn_finishes_the_progress_message_on_restart() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let fake = FakeTelegram::start(TOKEN, "coffer_bot").await?;
    let api = rig(&home, &fake).await?;
    fake.push_text(OWNER, "slow:300\ndeltas:200");
    let progress = wait_bot(&fake, "w4 ").await?;
    ensure!(progress.visible().trim_end().ends_with('…'), "a progress message: {}", progress.visible());
    // The store holds the answer so far while it streams (stored about every second).
    let list = api.get("/v1/conversations").reply().await?.ok_json()?;
    let conv = list["items"][0]["id"].as_str().context("the channel's conversation")?.to_owned();
    let kept = wait_for("the streaming answer stored with w4", WAIT, || async {
        let (status, text, _) = answer(&api, &conv).await?;
        Ok((status == "streaming" && text.contains("w4 ")).then_some(text))
    })
    .await?;
    ensure!(kept.starts_with("w0 w1 w2 w3 w4 "), "{kept}");
    let old = api.service("chat").await?["pid"].as_i64().context("pid")? as i32;
    procs::signal(old, nix::sys::signal::Signal::SIGKILL);
    wait_for("chat restarted", WAIT, || async {
        let s = api.service("chat").await?;
        Ok((s["state"] == "healthy" && s["pid"] != old).then_some(()))
    })
    .await?;
    let id = progress.message_id;
    fake.wait("the progress message finished", WAIT, |f| {
        f.bot_messages(OWNER).iter().any(|m| m.message_id == id && !m.visible().trim_end().ends_with('…'))
    })
    .await?;
    let m = fake.bot_messages(OWNER).into_iter().find(|m| m.message_id == id).context("the message")?;
    let v = m.visible();
    ensure!(v.starts_with("w0 w1 w2 w3 w4"), "the text it showed is kept: {v}");
    let reason = v.lines().last().unwrap_or_default();
    ensure!(
        reason == "⚠ The turn failed: The chat service stopped during this turn; the turn did not finish.",
        "one line saying why: {v}"
    );
    // The stored answer keeps the text that had streamed (what was stored before the kill, or
    // more), marked failed with the reason: not only "stopped".
    let (status, text, error) = answer(&api, &conv).await?;
    ensure!(status == "failed" && text.starts_with(&kept), "stored: {status} {text:?} (kept before: {kept:?})");
    ensure!(error == "The chat service stopped during this turn; the turn did not finish.", "{error}");
    // The console shows it after a reload: the text, the failed badge and the reason.
    let b = coffer_tests::browser::Browser::start().await?;
    b.login(api.base_url(), api.token(), "chat").await?;
    b.goto(&format!("/ui/chat?c={conv}")).await?;
    let shown = b.wait_for_text(".msg.assistant[data-status=\"failed\"]", "w0 w1 w2 w3 w4").await?;
    let shown = shown.text().await?;
    ensure!(
        shown.contains("failed") && shown.contains("The chat service stopped during this turn"),
        "the console shows the kept text with the failure: {shown}"
    );
    // Finished once: the next restart has nothing left to finish.
    let edits = m.edits;
    let journal = home.root().join("chat/channels/tg.progress.json");
    ensure!(!journal.exists(), "the journal is taken");
    fake.push_text(OWNER, "say:after the crash");
    wait_bot(&fake, "after the crash").await?;
    let again = fake.bot_messages(OWNER).into_iter().find(|m| m.message_id == id).context("the message")?;
    assert_eq!(again.edits, edits, "not edited again");
    Ok(())
}

/// The newest assistant message of conversation `id` as stored: (status, its text blocks
/// joined, error).
async fn answer(api: &Api, id: &str) -> anyhow::Result<(String, String, String)> {
    let v = api.get(&format!("/v1/conversations/{id}?messages=10")).reply().await?.ok_json()?;
    let m = v["messages"]
        .as_array()
        .context("messages")?
        .iter()
        .rev()
        .find(|m| m["role"] == "assistant")
        .context("an assistant message")?
        .clone();
    let text: String = m["blocks"]
        .as_array()
        .context("blocks")?
        .iter()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str())
        .collect();
    let s = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
    Ok((s("status"), text, s("error")))
}
