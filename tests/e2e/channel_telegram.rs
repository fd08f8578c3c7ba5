//! Telegram channels end to end: a real daemon (`coffer-test-daemon scripted-chat`: the real
//! store, the chat service with the test-only `scripted` agent), the channel resource written
//! through the store's `Channels` service (with the gateway's identity, as the edge writes it),
//! its bot token a real credential, and the adapter polling the fake Bot API
//! (`coffer_tests::fake_telegram`) over loopback HTTP. Covers issue 18's Telegram faults:
//! pairing (wrong, reused code), a non-owner refused once and audited without the text,
//! throttled streaming edits, a queued second message, `/stop`, `/resume`, `/new`, `/model`, a
//! 20,000-character reply, hostile markdown, 429/500/timeouts without a lost or duplicated
//! update (and a chat restart mid-stream), a channel disabled mid-turn, a token change, and a
//! web subscriber seeing the same turn. One test runs the shipped chat service instead, with the
//! real Claude Code CLI on the fake Anthropic API behind the channel.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_proto::chat as c;
use coffer_proto::store::channels_client::ChannelsClient;
use coffer_proto::store::{self as st, ChannelKind, ChannelRecord};
use coffer_runtime::grpc::AuthChannel;
use coffer_tests::chat::{self, Client};
use coffer_tests::fake_telegram::{FakeTelegram, Fault, Shown};
use coffer_tests::{Api, SendExt, TestHome, procs, wait_for};
use reqwest::Method;
use secrecy::SecretString;
use serde_json::json;

const TOKEN: &str = "4242:fake-token-AAAA";
const OWNER: i64 = 1001;
const STRANGER: i64 = 2002;
const WAIT: Duration = Duration::from_secs(30);

struct Rig {
    home: TestHome,
    api: Api,
    fake: FakeTelegram,
    channels: ChannelsClient<AuthChannel>,
    chat: Client,
}

/// A Channels client with the gateway's identity (its token and the store's address, read from
/// the gateway's environment).
async fn channels_client(api: &Api) -> anyhow::Result<ChannelsClient<AuthChannel>> {
    let pid = api.service("gateway").await?["pid"].as_i64().context("gateway pid")? as i32;
    let env = procs::environ(pid);
    let token = SecretString::from(env.get("COFFER_INTERNAL_TOKEN").context("COFFER_INTERNAL_TOKEN")?.clone());
    let addr = env.get("COFFER_STORE_ADDR").context("COFFER_STORE_ADDR")?;
    Ok(ChannelsClient::new(coffer_runtime::grpc::channel(addr, &token)?))
}

async fn put_credential(api: &Api, name: &str, value: &str) -> anyhow::Result<()> {
    let r = api
        .request(Method::PUT, &format!("/v1/credentials/{name}"))
        .header("X-Coffer-Actor", "cli")
        .json(&json!({ "value": value }))
        .reply()
        .await?;
    ensure!(r.status.is_success(), "PUT credential: {} {}", r.status, r.text);
    Ok(())
}

fn record(fake: &FakeTelegram) -> ChannelRecord {
    ChannelRecord {
        name: "tg".into(),
        kind: ChannelKind::Telegram as i32,
        enabled: true,
        bot_token_ref: "tg-token".into(),
        api_base_url: fake.url.clone(),
        default_agent: chat::SCRIPTED.into(),
        ..Default::default()
    }
}

/// A daemon with an enabled Telegram channel `tg` on the fake, polling.
async fn rig() -> anyhow::Result<Rig> {
    let home = TestHome::new()?;
    let fake = FakeTelegram::start(TOKEN, "coffer_bot").await?;
    let api = chat::start_daemon(&home).await?;
    put_credential(&api, "tg-token", TOKEN).await?;
    let mut channels = channels_client(&api).await?;
    channels.create_channel(st::CreateChannelRequest { channel: Some(record(&fake)), actor: "cli".into() }).await?;
    fake.wait("the adapter's first long poll", WAIT, |f| !f.calls_of("getUpdates").is_empty()).await?;
    ensure!(!fake.calls_of("getMe").is_empty(), "getMe first");
    let chat = chat::client(&api).await?;
    Ok(Rig { home, api, fake, channels, chat })
}

impl Rig {
    /// Pairs chat [`OWNER`] through `/pair` with a fresh code.
    async fn pair(&mut self) -> anyhow::Result<String> {
        let code = self
            .channels
            .start_pairing(st::StartPairingRequest { name: "tg".into(), ttl_s: 600, actor: "cli".into() })
            .await?
            .into_inner()
            .code;
        self.fake.push_text(OWNER, &format!("/pair {code}"));
        self.wait_bot(OWNER, "Paired").await?;
        Ok(code)
    }

    /// Waits until a bot message in `chat_id` shows `needle`; that message.
    async fn wait_bot(&self, chat_id: i64, needle: &str) -> anyhow::Result<Shown> {
        self.fake
            .wait(&format!("a bot message with {needle:?} in chat {chat_id}"), WAIT, |f| {
                f.bot_messages(chat_id).iter().any(|m| m.visible().contains(needle))
            })
            .await?;
        self.fake.bot_messages(chat_id).into_iter().rfind(|m| m.visible().contains(needle)).context("found")
    }

    /// The conversations bound to (tg, chat_id), newest first.
    async fn bound(&mut self, chat_id: i64) -> anyhow::Result<Vec<c::Conversation>> {
        let list = self.chat.list_conversations(c::ListConversationsRequest::default()).await?.into_inner();
        Ok(list
            .conversations
            .into_iter()
            .filter(|c| c.channel_name == "tg" && c.peer_chat_id == chat_id.to_string())
            .collect())
    }

    /// The user messages of conversation `id`, their texts in order.
    async fn user_texts(&mut self, id: &str) -> anyhow::Result<Vec<String>> {
        let v = chat::get(&mut self.chat, id).await?;
        Ok(v.messages.iter().filter(|m| m.role == c::Role::User as i32).map(chat::message_text).collect())
    }

    async fn adapter(&self) -> anyhow::Result<serde_json::Value> {
        self.api.service("chat").await
    }
}

/// The text deltas of the in-flight (or next) turn of conversation `id`, read from the web
/// console's stream `GET /v1/conversations/{id}/events` until its `turn_done`.
async fn web_turn(api: &Api, id: &str) -> anyhow::Result<String> {
    let mut resp = api.get(&format!("/v1/conversations/{id}/events")).send().await?;
    ensure!(resp.status() == 200, "events: {}", resp.status());
    let mut parser = coffer_types::sse::SseParser::new();
    let mut text = String::new();
    loop {
        let chunk = tokio::time::timeout(WAIT, resp.chunk()).await.context("no frame in time")??;
        let bytes = chunk.context("the stream ended before the turn did")?;
        let mut frames = Vec::new();
        parser.push(&bytes, &mut frames);
        for f in frames {
            let data: serde_json::Value = serde_json::from_slice(&f.data)?;
            match f.event.as_str() {
                "text_delta" => text.push_str(data["text_delta"]["text"].as_str().unwrap_or_default()),
                "turn_done" | "turn_error" => return Ok(text),
                _ => {}
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pairing_gates_the_chat_and_strangers_are_refused_once_and_audited_without_their_text() -> anyhow::Result<()> {
    let mut r = rig().await?;
    // Unpaired: everyone is refused.
    r.fake.push_text(OWNER, "hello before pairing");
    r.wait_bot(OWNER, "not paired").await?;
    let code = r
        .channels
        .start_pairing(st::StartPairingRequest { name: "tg".into(), ttl_s: 600, actor: "cli".into() })
        .await?
        .into_inner()
        .code;
    r.fake.push_text(OWNER, "/pair WRONGCODE");
    r.wait_bot(OWNER, "tries left").await?;
    r.fake.push_text(OWNER, &format!("/pair {code}"));
    r.wait_bot(OWNER, "Paired").await?;
    r.fake.push_text(STRANGER, &format!("/pair {code}"));
    r.wait_bot(STRANGER, "Pairing failed").await?;
    let ch = r.channels.get_channel(st::GetChannelRequest { name: "tg".into() }).await?.into_inner();
    assert_eq!(ch.owner_id, OWNER.to_string(), "the reused code did not take the channel");

    r.fake.push_text(STRANGER, "my secret plans");
    r.fake.push_text(STRANGER, "more secret plans");
    r.fake.push_text(OWNER, "say:owner speaks");
    r.wait_bot(OWNER, "owner speaks").await?;
    r.wait_bot(STRANGER, "only answers its owner").await?;
    let refusals = r.fake.bot_messages(STRANGER).iter().filter(|m| m.text.contains("only answers")).count();
    assert_eq!(refusals, 1, "one refusal per sender: {:?}", r.fake.bot_messages(STRANGER));
    assert!(r.bound(STRANGER).await?.is_empty(), "a stranger reaches no conversation");

    let audit = r.api.get("/v1/audit?actor=channel&limit=50").reply().await?;
    let text = audit.text.clone();
    assert!(text.contains("channel.refused"), "{text}");
    assert!(!text.contains("secret plans") && !text.contains("hello before"), "no message text in the audit: {text}");
    assert!(!text.contains(&code), "never the code");
    Ok(())
}

/// Issue 32: a stranger who found the bot sends five wrong codes (and then the right one, had it
/// leaked): its tries end, the owner's code does not — the owner still pairs with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_wrong_pairing_codes_never_void_the_owners_code() -> anyhow::Result<()> {
    let r = rig().await?;
    let code = r
        .channels
        .clone()
        .start_pairing(st::StartPairingRequest { name: "tg".into(), ttl_s: 600, actor: "cli".into() })
        .await?
        .into_inner()
        .code;
    for (i, wrong) in ["AAAAAAAA", "BBBBBBBB", "CCCCCCCC", "DDDDDDDD"].iter().enumerate() {
        r.fake.push_text(STRANGER, &format!("/pair {wrong}"));
        r.wait_bot(STRANGER, &format!("{} tries left", 4 - i)).await?;
    }
    r.fake.push_text(STRANGER, "/pair EEEEEEEE");
    r.wait_bot(STRANGER, "no tries left for this chat").await?;
    r.fake.push_text(STRANGER, &format!("/pair {code}"));
    r.wait_bot(STRANGER, "Pairing failed").await?;
    let ch = r.channels.clone().get_channel(st::GetChannelRequest { name: "tg".into() }).await?.into_inner();
    ensure!(
        ch.owner_id.is_empty() && ch.pairing_pending,
        "the code is still pending and nobody owns the channel: {ch:?}"
    );
    r.fake.push_text(OWNER, &format!("/pair {code}"));
    r.wait_bot(OWNER, "Paired").await?;
    let ch = r.channels.clone().get_channel(st::GetChannelRequest { name: "tg".into() }).await?.into_inner();
    assert_eq!(ch.owner_id, OWNER.to_string());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_telegram_conversation_streams_throttled_edits_queues_stops_resumes_and_starts_anew() -> anyhow::Result<()> {
    let mut r = rig().await?;
    r.pair().await?;
    // Ask: 12 deltas over ~3.6 s → a few throttled edits, then the final text.
    r.fake.push_text(OWNER, "slow:300\ndeltas:12");
    let conv = wait_for("the bound conversation", WAIT, || async {
        let mut cl = r.chat.clone();
        let list = cl.list_conversations(c::ListConversationsRequest::default()).await?.into_inner();
        Ok(list.conversations.into_iter().find(|c| c.channel_name == "tg"))
    })
    .await?;
    // A web subscriber (the console's SSE) sees the same turn live.
    let web = web_turn(&r.api, &conv.id).await?;
    assert!(web.contains("w0 ") && web.contains("w11"), "{web}");
    let done = r.wait_bot(OWNER, "w11").await?;
    assert!(done.edits >= 2, "the progress message was edited while streaming: {done:?}");
    let edits: Vec<Duration> = r.fake.calls_of("editMessageText").iter().map(|c| c.at).collect();
    for w in edits.windows(2) {
        assert!(w[1] - w[0] >= Duration::from_millis(950), "edits at most once a second: {edits:?}");
    }
    // A turn started from the web page shows in the chat too.
    chat::send(&mut r.chat, &conv.id, "say:typed on the web").await?;
    r.wait_bot(OWNER, "typed on the web").await?;
    // A second message while a turn runs is queued and runs after it, in order.
    r.fake.push_text(OWNER, "slow:200\ndeltas:8");
    r.fake.push_text(OWNER, "say:second answer");
    r.wait_bot(OWNER, "Queued (1 ahead)").await?;
    r.wait_bot(OWNER, "second answer").await?;
    let shown: Vec<String> = r.fake.bot_messages(OWNER).iter().map(Shown::visible).collect();
    let first = shown.iter().rposition(|t| t.contains("w7")).context("first turn")?;
    let second = shown.iter().rposition(|t| t.contains("second answer")).context("second turn")?;
    assert!(first < second, "in order: {shown:?}");

    // /stop interrupts; the queue pauses; /resume runs what waited.
    r.fake.push_text(OWNER, "say:partial words\nhang");
    r.wait_bot(OWNER, "partial words").await?;
    r.fake.push_text(OWNER, "say:after the resume");
    r.wait_bot(OWNER, "Queued").await?;
    r.fake.push_text(OWNER, "/stop");
    r.wait_bot(OWNER, "Stopped").await?;
    r.wait_bot(OWNER, "(interrupted)").await?;
    r.fake.push_text(OWNER, "/queue");
    r.wait_bot(OWNER, "1. say:after the resume").await?;
    r.fake.push_text(OWNER, "/resume");
    r.wait_bot(OWNER, "Resumed: 1 queued").await?;
    r.wait_bot(OWNER, "after the resume").await?;

    // /model sets the bound conversation's model; /status shows it.
    r.fake.push_text(OWNER, "/model fake-large");
    r.wait_bot(OWNER, "Model set to fake-large").await?;
    let view = chat::get(&mut r.chat, &conv.id).await?;
    assert_eq!(view.conversation.context("conv")?.agent_config.context("cfg")?.model, "fake-large");
    r.fake.push_text(OWNER, "/status");
    r.wait_bot(OWNER, "Model: fake-large").await?;

    // /new binds a fresh conversation.
    r.fake.push_text(OWNER, "/new");
    r.wait_bot(OWNER, "New conversation").await?;
    r.fake.push_text(OWNER, "say:in the new one");
    r.wait_bot(OWNER, "in the new one").await?;
    let bound = r.bound(OWNER).await?;
    assert_eq!(bound.len(), 2, "{bound:?}");
    let fresh = bound.iter().find(|b| b.id != conv.id).context("the new conversation")?;
    assert_eq!(r.user_texts(&fresh.id).await?, ["say:in the new one"]);
    let old = r.user_texts(&conv.id).await?;
    assert_eq!(old.len(), 6, "{old:?}");
    // Every message from the chat is recorded as from the channel.
    let v = chat::get(&mut r.chat, &fresh.id).await?;
    assert_eq!(v.messages[0].source, "channel:tg");
    // `coffer daemon stop` leaves no process behind.
    r.home.cli(&["daemon", "stop"]).await?.ok()?;
    r.home.wait_no_processes(WAIT).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_and_hostile_replies_are_split_in_order_and_rendered_safely() -> anyhow::Result<()> {
    let mut r = rig().await?;
    r.pair().await?;
    r.fake.push_text(OWNER, "big:20000");
    r.fake
        .wait("the long reply's last line", WAIT, |f| {
            f.bot_messages(OWNER).iter().any(|m| m.visible().contains("line 334 of"))
        })
        .await?;
    let pieces: Vec<String> =
        r.fake.bot_messages(OWNER).iter().map(Shown::visible).filter(|t| t.contains(" of a long reply")).collect();
    assert!(pieces.len() >= 5, "{} pieces", pieces.len());
    let mut numbers = Vec::new();
    for p in &pieces {
        assert!(p.chars().count() <= 4096, "{}", p.chars().count());
        for l in p.lines() {
            if let Some(n) =
                l.strip_prefix("line ").and_then(|s| s.split(' ').next()).and_then(|n| n.parse::<u32>().ok())
            {
                numbers.push(n);
            }
        }
    }
    let want: Vec<u32> = (1..=numbers.len() as u32).collect();
    assert_eq!(numbers, want, "every line once, in order");

    let hostile = "say:<script>alert(1)</script> & *unbalanced _under `tick [link](javascript:alert(1))\nnl\nnl\nsay:```rust\nnl\nsay:fn main() { if a < b && c > d {} }\nnl\nsay:```\nnl\nnl\nsay:end-of-hostile";
    r.fake.push_text(OWNER, hostile);
    let m = r.wait_bot(OWNER, "end-of-hostile").await?;
    let v = m.visible();
    assert!(v.contains("<script>alert(1)</script>"), "shown as text: {v}");
    assert!(v.contains("a < b && c > d"), "{v}");
    assert!(!m.text.contains("<script") && !m.text.contains("href=\"javascript"), "{}", m.text);
    assert!(m.html, "sent as HTML (no plain-text fallback was needed)");
    let refused: Vec<String> =
        r.fake.calls().iter().filter(|c| c.status == 400).map(|c| c.description.clone()).collect();
    assert!(refused.iter().all(|d| d.contains("not modified")), "Telegram parsed every message: {refused:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_lose_and_duplicate_no_update_across_backoff_and_a_chat_restart() -> anyhow::Result<()> {
    let mut r = rig().await?;
    r.pair().await?;
    r.fake.push_text(OWNER, "say:one");
    r.wait_bot(OWNER, "one").await?;
    // The poll under way takes "two"; the next three polls fail (500, 429 retry_after 1, a
    // stall then 502) while "three" waits in the fake: it arrives once, after the backoff.
    r.fake.fail_next("getUpdates", Fault::Status { code: 500, retry_after: None });
    r.fake.fail_next("getUpdates", Fault::Status { code: 429, retry_after: Some(1) });
    r.fake.fail_next("getUpdates", Fault::Stall(Duration::from_secs(2)));
    r.fake.push_text(OWNER, "say:two");
    r.wait_bot(OWNER, "two").await?;
    r.fake.push_text(OWNER, "say:three");
    r.wait_bot(OWNER, "three").await?;
    let polls: Vec<u16> = r.fake.calls_of("getUpdates").iter().map(|c| c.status).collect();
    for code in [500, 429, 502] {
        assert!(polls.contains(&code), "the fault {code} was met: {polls:?}");
    }
    let at: Vec<Duration> = r.fake.calls_of("getUpdates").iter().map(|c| c.at).collect();
    let after_429 = polls.iter().position(|c| *c == 429).context("429")?;
    assert!(at[after_429 + 1] - at[after_429] >= Duration::from_millis(950), "retry_after honoured: {at:?}");
    // A 429 on a reply is honoured too.
    r.fake.fail_next("sendMessage", Fault::Status { code: 429, retry_after: Some(1) });
    r.fake.push_text(OWNER, "say:after a slow down");
    r.wait_bot(OWNER, "after a slow down").await?;

    // The chat service is killed mid-stream; the next one resumes from the persisted offset.
    r.fake.push_text(OWNER, "slow:200\ndeltas:30");
    r.wait_bot(OWNER, "w2").await?;
    let old = r.adapter().await?;
    let old_pid = old["pid"].as_i64().context("pid")? as i32;
    procs::signal(old_pid, nix::sys::signal::Signal::SIGKILL);
    wait_for("chat restarted", WAIT, || async {
        let s = r.api.service("chat").await?;
        Ok((s["state"] == "healthy" && s["pid"] != old_pid).then_some(()))
    })
    .await?;
    r.chat = chat::client(&r.api).await?;
    r.fake.push_text(OWNER, "say:four");
    r.wait_bot(OWNER, "four").await?;
    let conv = r.bound(OWNER).await?.into_iter().next().context("bound")?;
    let texts = r.user_texts(&conv.id).await?;
    let want = ["say:one", "say:two", "say:three", "say:after a slow down", "slow:200\ndeltas:30", "say:four"];
    // The killed turn's message went to the queue or failed; either way each update once.
    for w in want {
        assert_eq!(texts.iter().filter(|t| t.as_str() == w).count(), 1, "{w:?} once in {texts:?}");
    }
    let ch = r.channels.get_channel(st::GetChannelRequest { name: "tg".into() }).await?.into_inner();
    let max_update =
        r.fake.calls_of("getUpdates").iter().filter_map(|c| c.params["offset"].as_i64()).max().unwrap_or(0);
    assert!(ch.cursor >= max_update && ch.cursor > 0, "cursor {} persisted (polled at {max_update})", ch.cursor);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabling_mid_turn_sends_nothing_more_and_a_token_change_restarts_the_adapter() -> anyhow::Result<()> {
    let mut r = rig().await?;
    r.pair().await?;
    r.fake.push_text(OWNER, "slow:300\ndeltas:15");
    r.wait_bot(OWNER, "w1").await?;
    let mut rec = r.channels.get_channel(st::GetChannelRequest { name: "tg".into() }).await?.into_inner();
    rec.enabled = false;
    r.channels
        .update_channel(st::UpdateChannelRequest {
            channel: Some(rec.clone()),
            expected_version: None,
            actor: "cli".into(),
        })
        .await?;
    let conv = r.bound(OWNER).await?.into_iter().next().context("bound")?;
    // The turn finishes in the engine…
    wait_for("the turn finished", WAIT, || async {
        let mut cl = r.chat.clone();
        let v = chat::get(&mut cl, &conv.id).await?;
        Ok((!v.conversation.context("c")?.turn_running).then_some(()))
    })
    .await?;
    // …the adapter is reported stopped (its task has ended: the coordinator awaits it)…
    let stopped = wait_for("the adapter stopped", WAIT, || async {
        let v = r.api.get("/v1/channels/tg").reply().await?.ok_json()?;
        Ok((v["adapter"]["state"] == "stopped").then_some(v))
    })
    .await?;
    // …its progress message was ended with a note instead of being left on "…"…
    let progress = r.fake.bot_messages(OWNER).into_iter().rfind(|m| m.visible().contains("w1")).context("progress")?;
    ensure!(progress.visible().contains("Stopped here") && !progress.visible().ends_with('…'), "{progress:?}");
    // …and nothing more reaches the chat, even a message pushed now: no poll picks it up.
    let sent = |f: &FakeTelegram| f.calls().iter().filter(|c| c.method != "getUpdates").count();
    let before = sent(&r.fake);
    let polled = r.fake.calls_of("getUpdates").len();
    r.fake.push_text(OWNER, "say:while disabled");
    let _ = r.api.get("/v1/channels/tg").reply().await?; // one more round trip through the daemon
    assert_eq!(sent(&r.fake), before, "nothing sent after the channel was disabled");
    assert_eq!(r.fake.calls_of("getUpdates").len(), polled, "no polling while disabled");
    assert!(stopped["adapter"]["last_error"].is_null() && stopped["adapter"]["retry_at_ms"].is_null(), "{stopped}");

    // The token changes (credential and fake): the adapter restarts with the new one.
    const NEW: &str = "4242:new-token-BBBB";
    r.fake.set_token(NEW);
    put_credential(&r.api, "tg-token", NEW).await?;
    rec.enabled = true;
    r.channels
        .update_channel(st::UpdateChannelRequest { channel: Some(rec), expected_version: None, actor: "cli".into() })
        .await?;
    r.wait_bot(OWNER, "while disabled").await?;
    let after: Vec<bool> = r.fake.calls_of("getMe").iter().map(|c| c.token_ok).collect();
    assert_eq!(after.last(), Some(&true), "{after:?}");

    // An unreachable Bot API: backoff naming the cause (never the token); disabled: stopped.
    let mut rec = r.channels.get_channel(st::GetChannelRequest { name: "tg".into() }).await?.into_inner();
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://{}", l.local_addr()?)
    };
    rec.api_base_url = dead.clone();
    r.channels
        .update_channel(st::UpdateChannelRequest {
            channel: Some(rec.clone()),
            expected_version: None,
            actor: "cli".into(),
        })
        .await?;
    let backoff = wait_for("the adapter in backoff", WAIT, || async {
        let c = r.api.get("/v1/channels/tg").reply().await?.ok_json()?;
        Ok((c["adapter"]["state"] == "backoff").then_some(c))
    })
    .await?;
    let why = backoff["adapter"]["last_error"].as_str().unwrap_or_default().to_owned();
    assert!(why.contains(&dead) && why.to_lowercase().contains("refused"), "{why}");
    assert!(!why.contains(NEW) && backoff["adapter"]["retry_at_ms"].is_i64(), "{backoff}");
    rec.enabled = false;
    r.channels
        .update_channel(st::UpdateChannelRequest { channel: Some(rec), expected_version: None, actor: "cli".into() })
        .await?;
    wait_for("the adapter stopped", WAIT, || async {
        let c = r.api.get("/v1/channels/tg").reply().await?.ok_json()?;
        let a = &c["adapter"];
        Ok((a["state"] == "stopped" && a["last_error"].is_null() && a["retry_at_ms"].is_null()).then_some(()))
    })
    .await?;
    let _ = &r.home;
    Ok(())
}

/// The turns behind a channel are real: the shipped chat service runs the real Claude Code CLI
/// on the fake Anthropic API, the channel is added and paired through REST as the CLI and the
/// console do, and the answer Claude Code streams comes back to the Telegram chat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_claude_code_answers_a_paired_telegram_chat() -> anyhow::Result<()> {
    const REAL: Duration = Duration::from_secs(90);
    let anthropic = coffer_tests::anthropic::FakeAnthropic::scripted().await?;
    let fake = FakeTelegram::start(TOKEN, "coffer_bot").await?;
    let mut home = TestHome::new()?;
    chat::offline_claude_code(&mut home, &anthropic.url);
    home.cli(&["status"]).await?.ok()?;
    let api = home.api()?;
    let claude = coffer_tests::peers::claude_code()?.display().to_string();
    api.request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.claude_code_path": claude}}))
        .reply()
        .await?
        .ok_json()?;
    let work = home.temp().join("work");
    std::fs::create_dir_all(&work)?;
    let body = json!({
        "name": "tg", "kind": "telegram", "bot_token": TOKEN, "api_base_url": fake.url,
        "default_agent": "claude_code", "agent_config": {"cwd": work.display().to_string()},
    });
    let r = api.post_json("/v1/channels", &body).header("X-Coffer-Actor", "cli").reply().await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let code = api.post("/v1/channels/tg/pair").reply().await?.ok_json()?["code"].as_str().context("code")?.to_owned();
    fake.wait("the adapter's first long poll", WAIT, |f| !f.calls_of("getUpdates").is_empty()).await?;
    fake.push_text(OWNER, &format!("/pair {code}"));
    fake.wait("the pairing answer", WAIT, |f| f.bot_messages(OWNER).iter().any(|m| m.visible().contains("Paired")))
        .await?;

    fake.push_text(OWNER, "SAY[the real agent answers through Telegram]");
    fake.wait("Claude Code's answer in the chat", REAL, |f| {
        f.bot_messages(OWNER).iter().any(|m| m.visible().contains("the real agent answers through Telegram"))
    })
    .await?;
    let list = api.get("/v1/conversations").reply().await?.ok_json()?;
    let conv = list["items"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["channel_name"] == "tg"))
        .with_context(|| format!("a conversation bound to the channel: {list}"))?;
    ensure!(
        conv["agent_key"] == "claude_code" && conv["peer_chat_id"].as_str() == Some(OWNER.to_string().as_str()),
        "{conv}"
    );
    for log in std::fs::read_dir(home.root().join("logs"))? {
        let path = log?.path();
        if path.is_file() {
            let text = String::from_utf8_lossy(&std::fs::read(&path)?).into_owned();
            ensure!(!text.contains(TOKEN), "the bot token is in {}", path.display());
        }
    }
    home.cli(&["daemon", "stop"]).await?.ok()?;
    home.wait_no_processes(WAIT).await?;
    Ok(())
}

/// Issue 34 §2, §3 on Telegram: `/now` interrupts the running turn and runs next; after `/stop`
/// the next message runs at once; a turn that ran at least `chat.notify_after_s` is followed by
/// a new (notifying) "Done in …" message, a short one by nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn now_redirects_and_a_long_turn_ends_with_a_new_done_message() -> anyhow::Result<()> {
    let mut r = rig().await?;
    r.pair().await?;
    // /now mid-turn: the running turn ends interrupted, the /now text runs next.
    r.fake.push_text(OWNER, "say:working on it\nhang");
    r.wait_bot(OWNER, "working on it").await?;
    r.fake.push_text(OWNER, "/now say:do this instead");
    r.wait_bot(OWNER, "do this instead").await?;
    r.wait_bot(OWNER, "(interrupted)").await?;
    let conv = r.bound(OWNER).await?.into_iter().next().context("bound")?;
    // The user message is the text after the command.
    assert_eq!(r.user_texts(&conv.id).await?, ["say:working on it\nhang", "say:do this instead"]);
    // /stop, then a plain message: it runs at once (no "Queued").
    r.fake.push_text(OWNER, "say:again\nhang");
    r.wait_bot(OWNER, "again").await?;
    r.fake.push_text(OWNER, "/stop");
    r.wait_bot(OWNER, "Your next message runs at once").await?;
    r.fake.push_text(OWNER, "say:redirected");
    r.wait_bot(OWNER, "redirected").await?;
    assert!(
        !r.fake.bot_messages(OWNER).iter().any(|m| m.visible().starts_with("Queued")),
        "nothing was queued: {:?}",
        r.fake.bot_messages(OWNER)
    );
    assert!(
        !r.fake.bot_messages(OWNER).iter().any(|m| m.visible().contains("Done in")),
        "short turns under the default 30 s say nothing more"
    );

    // One second: a short turn says nothing more; a 1.5 s one gets a new message after its text.
    r.api
        .request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.notify_after_s": "1"}}))
        .reply()
        .await?
        .ok_json()?;
    let sends = || r.fake.calls_of("sendMessage").len();
    r.fake.push_text(OWNER, "say:quick one");
    r.wait_bot(OWNER, "quick one").await?;
    r.fake.push_text(OWNER, "wait:1500\nsay:slow one");
    let answer = r.wait_bot(OWNER, "slow one").await?;
    let done = r.wait_bot(OWNER, "Done in").await?;
    assert!(done.message_id > answer.message_id && done.edits == 0, "a new message: {done:?} after {answer:?}");
    assert!(
        done.visible() == "Done in 1s" || done.visible() == "Done in 2s",
        "one line with the time: {:?}",
        done.visible()
    );
    let before = sends();
    // A marker turn: were a notice due for the quick turn, it would have come before this.
    r.fake.push_text(OWNER, "/status");
    r.wait_bot(OWNER, "Conversation:").await?;
    let notices: Vec<String> =
        r.fake.bot_messages(OWNER).iter().map(Shown::visible).filter(|t| t.contains("Done in")).collect();
    assert_eq!(notices.len(), 1, "the quick turn got none: {notices:?}");
    assert!(sends() > before);
    // A failure after the threshold says why.
    r.fake.push_text(OWNER, "wait:1200\nfail:provider the model API answered 500");
    let failed = r.wait_bot(OWNER, "Failed after 1s").await?;
    assert!(failed.visible().ends_with("the model API answered 500"), "{failed:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_s_changed_files_are_summarised_and_diff_sends_a_file_s_diff() -> anyhow::Result<()> {
    let mut r = rig().await?;
    r.pair().await?;
    r.fake.push_text(OWNER, "/diff");
    r.wait_bot(OWNER, "No turn has changed files yet.").await?;

    // The scripted agent writes two files in the conversation's folder (the default workspace).
    r.fake.push_text(OWNER, "write:src/a.rs fn a() {}\\nfn b() {}\nwrite:notes.md # notes\nsay:written");
    let summary = r.wait_bot(OWNER, "2 files changed: +3 \u{2212}0 · /diff notes.md").await?;
    let done = r.wait_bot(OWNER, "written").await?;
    ensure!(done.message_id < summary.message_id, "the summary follows the turn's answer");

    r.fake.push_text(OWNER, "/diff");
    let list = r.wait_bot(OWNER, "Send /diff <path>").await?;
    ensure!(list.visible().contains("added src/a.rs  +2 \u{2212}0"), "{}", list.visible());

    r.fake.push_text(OWNER, "/diff src/a.rs");
    let diff = r.wait_bot(OWNER, "+fn b() {}").await?;
    ensure!(diff.html && diff.text.contains("<pre><code class=\"language-diff\">"), "{}", diff.text);
    ensure!(diff.visible().starts_with("src/a.rs"), "{}", diff.visible());

    r.fake.push_text(OWNER, "/diff ../../etc/passwd");
    r.wait_bot(OWNER, "not a relative path inside the conversation's folder").await?;
    r.fake.push_text(OWNER, "/diff never.txt");
    r.wait_bot(OWNER, "did not change \"never.txt\"").await?;
    Ok(())
}
