//! SeaTalk: `coffer-callback` under the real supervisor (started and stopped over the control
//! RPC as coffer-chat does, signed callbacks from the fake platform's side), and the SeaTalk
//! adapter's client and replier against the fake SeaTalk Open Platform (`fake_seatalk.rs`).
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use coffer_chat::channels::seatalk::{ACK_TEXT, CallbackManager, Client, Format, ONLY_TEXT, SeatalkReplier, Target};
use coffer_chat::channels::{ChannelError, Replier, StatusCell, TurnState, TurnView};
use coffer_proto::control::control_client::ControlClient;
use coffer_proto::control::{StartServiceRequest, StopServiceRequest};
use coffer_tests::fake_seatalk::{self, Callback, FakeSeatalk};
use coffer_tests::{Api, TestHome, ports, procs, wait_for};
use secrecy::SecretString;

const APP_ID: &str = "fake-app-id";
const APP_SECRET: &str = "fake-app-secret-7f3a";

async fn service_env(api: &Api, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let pid = api.service(name).await?["pid"].as_i64().context("pid")? as i32;
    let env = procs::environ(pid);
    ensure!(!env.is_empty(), "cannot read the environment of {name} (pid {pid})");
    Ok(env)
}

/// The control RPC as coffer-chat calls it (chat's own internal token).
async fn control_as_chat(api: &Api) -> anyhow::Result<ControlClient<coffer_runtime::grpc::AuthChannel>> {
    let env = service_env(api, "chat").await?;
    let addr = env.get("COFFER_CONTROL_ADDR").context("COFFER_CONTROL_ADDR")?;
    let token = SecretString::from(env.get("COFFER_INTERNAL_TOKEN").context("COFFER_INTERNAL_TOKEN")?.clone());
    Ok(ControlClient::new(coffer_runtime::grpc::channel(addr, &token)?))
}

fn secrets(pairs: &[(&str, &str)]) -> BTreeMap<String, SecretString> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), SecretString::from(*v))).collect()
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t)
                    if t.is_file()
                        && std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes())) =>
                {
                    hits.push(p.display().to_string());
                }
                _ => {}
            }
        }
    }
    hits
}

/// Lines of coffer-callback's log saying an event went to chat (delivered or refused there).
fn forwarded_lines(home: &TestHome) -> usize {
    home.log_text("callback")
        .lines()
        .filter(|l| l.contains("Forwarded a SeaTalk event") || l.contains("Chat refused a SeaTalk event"))
        .count()
}

async fn callback_pid(api: &Api) -> anyhow::Result<i64> {
    let s = api.service("callback").await?;
    ensure!(s["state"] == "healthy", "callback is not healthy: {s}");
    s["pid"].as_i64().context("pid")
}

#[tokio::test]
async fn coffer_callback_verifies_signatures_and_lives_and_dies_with_the_supervisor() -> anyhow::Result<()> {
    let port = ports::free_port();
    let home = TestHome::builder().env("COFFER_CALLBACK_PORT", port.to_string()).build()?;
    let api = home.start_daemon().await?;
    let s = api.service("callback").await?;
    assert_eq!((s["state"].as_str(), s["pid"].as_i64()), (Some("stopped"), Some(0)), "on demand: {s}");
    ensure!(ports::port_is_free(port), "nothing listens before a SeaTalk channel is up");

    // Started the way the adapter coordinator does it (its CallbackManager over chat's identity).
    let signing = format!("signing-{:016x}", fastrand::u64(..));
    let mut control = control_as_chat(&api).await?;
    let mut manager = CallbackManager::default();
    manager.sync(&mut control, &secrets(&[("team", &signing)])).await?;
    let pid = callback_pid(&api).await?;
    let cb = Callback::new(port);

    // The verification event, answered at once with the challenge.
    let t = Instant::now();
    let a = cb.signed("team", fake_seatalk::verification("chal-1"), &signing).await?;
    assert_eq!((a.status, &a.body), (200, &serde_json::json!({"seatalk_challenge": "chal-1"})));
    ensure!(t.elapsed() < Duration::from_secs(5), "verification took {:?}", t.elapsed());
    // Wrong signatures, missing ones, oversized and malformed bodies, unknown channels.
    let a = cb.signed("team", fake_seatalk::verification("chal-2"), "not-the-secret").await?;
    assert_eq!(a.status, 401, "a verification with a wrong signature: {a:?}");
    let msg = fake_seatalk::single_message("ev-1", "E1", "hello");
    assert_eq!(cb.post("team", msg.clone(), None).await?.status, 401);
    assert_eq!(cb.post("team", msg.clone(), Some(&"0".repeat(64))).await?.status, 401);
    assert_eq!(cb.signed("team", vec![b' '; 5 * 1024 * 1024], &signing).await?.status, 413);
    assert_eq!(cb.signed("team", b"{\"event_type\": ".to_vec(), &signing).await?.status, 400);
    // An unknown channel reads as a bad signature: the answers do not tell which names exist.
    assert_eq!(cb.signed("nope", msg.clone(), &signing).await?.status, 401);
    assert_eq!(forwarded_lines(&home), 0, "nothing was forwarded to chat");
    // A good one is acknowledged and goes to chat.
    assert_eq!(cb.signed("team", msg.clone(), &signing).await?.status, 200);
    wait_for("the event to reach chat", Duration::from_secs(20), || async {
        Ok((forwarded_lines(&home) == 1).then_some(()))
    })
    .await?;

    // The secret is in the process's environment only: not in any argv, not in any file.
    for p in home.processes() {
        ensure!(!p.cmdline.join(" ").contains(&signing), "the secret is in the argv of {} ({})", p.name, p.pid);
    }
    let leaked = files_containing(home.root(), &signing);
    ensure!(leaked.is_empty(), "the signing secret is on disk: {leaked:?}");

    // The same set changes nothing; a new secret restarts it with the new environment.
    manager.sync(&mut control, &secrets(&[("team", &signing)])).await?;
    assert_eq!(callback_pid(&api).await?, pid, "same secrets: left as it is");
    let signing2 = format!("signing-{:016x}", fastrand::u64(..));
    manager.sync(&mut control, &secrets(&[("team", &signing2)])).await?;
    let pid2 = callback_pid(&api).await?;
    ensure!(pid2 != pid, "a secret change restarts coffer-callback");
    assert_eq!(cb.signed("team", fake_seatalk::verification("c"), &signing).await?.status, 401, "old secret");
    assert_eq!(cb.signed("team", fake_seatalk::verification("c"), &signing2).await?.status, 200, "new secret");

    // Killed: the supervisor respawns it with the same environment.
    procs::signal(pid2 as i32, nix::sys::signal::Signal::SIGKILL);
    let pid3 = wait_for("coffer-callback to be respawned", Duration::from_secs(30), || async {
        let s = api.service("callback").await?;
        let p = s["pid"].as_i64().unwrap_or(0);
        Ok((s["state"] == "healthy" && p != 0 && p != pid2).then_some(p))
    })
    .await?;
    assert_eq!(cb.signed("team", fake_seatalk::verification("again"), &signing2).await?.status, 200);
    let s = api.service("callback").await?;
    ensure!(s["restarts"].as_u64() >= Some(1), "{s}");

    // The last SeaTalk channel gone: stopped, and the port is free again.
    manager.sync(&mut control, &BTreeMap::new()).await?;
    assert_eq!(api.service("callback").await?["state"], "stopped");
    wait_for("the callback port to be free", Duration::from_secs(10), || async {
        Ok((ports::port_is_free(port) && procs::proc_info(pid3 as i32).is_none()).then_some(()))
    })
    .await?;

    // Running again when the daemon is killed: no listener survives it, the next daemon
    // starts with coffer-callback stopped and the port free.
    manager.sync(&mut control, &secrets(&[("team", &signing2)])).await?;
    let pid4 = callback_pid(&api).await? as i32;
    let daemon = home.daemon_processes().first().cloned().context("the daemon")?;
    procs::signal(daemon.pid, nix::sys::signal::Signal::SIGKILL);
    let api = home.start_daemon().await?;
    ensure!(procs::proc_info(pid4).is_none_or(|p| p.name != "coffer-callback"), "the old listener was reaped");
    assert_eq!(api.service("callback").await?["state"], "stopped");
    ensure!(ports::port_is_free(port), "no orphan listener on the callback port");
    ensure!(!home.processes().iter().any(|p| p.name == "coffer-callback"));

    // Started once more, then `coffer daemon stop` leaves nothing behind.
    let mut control = control_as_chat(&api).await?;
    CallbackManager::default().sync(&mut control, &secrets(&[("team", &signing2)])).await?;
    callback_pid(&api).await?;
    home.cli(&["daemon", "stop"]).await?.ok()?;
    home.wait_no_processes(Duration::from_secs(20)).await?;
    ensure!(ports::port_is_free(port));
    Ok(())
}

#[tokio::test]
async fn start_service_refuses_foreign_env_names_and_callers() -> anyhow::Result<()> {
    let home = TestHome::builder().env("COFFER_CALLBACK_PORT", ports::free_port().to_string()).build()?;
    let api = home.start_daemon().await?;
    let mut control = control_as_chat(&api).await?;
    let env = [("LD_PRELOAD".to_owned(), "/tmp/x.so".to_owned())].into();
    let e = control.start_service(StartServiceRequest { name: "callback".into(), env }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    ensure!(e.message().contains("LD_PRELOAD") && !e.message().contains("/tmp/x.so"), "{e:?}");
    assert_eq!(api.service("callback").await?["state"], "stopped", "nothing started");
    // Without secrets it cannot run: the supervisor reports it did not become healthy.
    let e = control.start_service(StartServiceRequest { name: "callback".into(), env: Default::default() }).await;
    let e = e.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    control.stop_service(StopServiceRequest { name: "callback".into() }).await?;
    let stdio = std::fs::read_to_string(home.logs_dir().join("callback.stdio")).unwrap_or_default();
    ensure!(stdio.contains("COFFER_CALLBACK_SECRETS is not set"), "the cause is named: {stdio}");
    Ok(())
}

#[tokio::test]
async fn the_seatalk_client_caches_its_token_and_refreshes_it_when_refused_or_expired() -> anyhow::Result<()> {
    let fake = FakeSeatalk::start(APP_ID, APP_SECRET).await?;
    let client = Client::new(&fake.url, SecretString::from(APP_ID), SecretString::from(APP_SECRET));
    client.send_text(&Target::Single("E1".into()), "one", Format::Plain).await?;
    client.send_text(&Target::Group("G1".into()), "**two**", Format::Markdown).await?;
    assert_eq!(fake.token_requests(), 1, "the token is cached");
    let m = fake.messages();
    assert_eq!(
        m.iter()
            .map(|s| (s.endpoint.as_str(), s.to.as_str(), s.format, s.content.as_str(), s.accepted))
            .collect::<Vec<_>>(),
        [("single_chat", "E1", 2, "one", true), ("group_chat", "G1", 1, "**two**", true)]
    );
    // Revoked: refused once, fetched again, sent.
    fake.revoke_tokens();
    client.send_text(&Target::Single("E1".into()), "three", Format::Plain).await?;
    assert_eq!(fake.token_requests(), 2);
    // Tokens that expire within the refresh margin are fetched again before each use.
    fake.set_token_ttl(30);
    fake.revoke_tokens();
    client.send_text(&Target::Single("E1".into()), "four", Format::Plain).await?;
    client.send_text(&Target::Single("E1".into()), "five", Format::Plain).await?;
    // "four": the cached token is revoked → one refresh (a 30 s token); "five": that one is
    // inside the margin → fetched again before use.
    assert_eq!(fake.token_requests(), 4);
    let sent: Vec<_> = fake.messages().into_iter().filter(|s| s.accepted).map(|s| s.content).collect();
    assert_eq!(sent, ["one", "**two**", "three", "four", "five"]);

    // Wrong app credentials: an Auth error naming no secret, nothing sent.
    let bad = Client::new(&fake.url, SecretString::from(APP_ID), SecretString::from("wrong-secret-9"));
    let e = bad.send_text(&Target::Single("E1".into()), "six", Format::Plain).await.unwrap_err();
    assert!(matches!(e, ChannelError::Auth { .. }), "{e:?}");
    ensure!(!e.to_string().contains("wrong-secret-9") && !e.to_string().contains(APP_SECRET), "{e}");
    assert_eq!(fake.messages().len(), 5);
    // An unreachable platform is Unavailable (backoff), not Auth.
    let down = Client::new(
        &format!("http://127.0.0.1:{}", ports::free_port()),
        SecretString::from(APP_ID),
        SecretString::from(APP_SECRET),
    );
    let e = down.send_text(&Target::Single("E1".into()), "x", Format::Plain).await.unwrap_err();
    assert!(matches!(e, ChannelError::Unavailable { .. }), "{e:?}");
    Ok(())
}

#[tokio::test]
async fn the_replier_acknowledges_a_turn_then_sends_its_final_text_split_in_order() -> anyhow::Result<()> {
    let fake = FakeSeatalk::start(APP_ID, APP_SECRET).await?;
    let status = StatusCell::new("team", "seatalk");
    let client = Client::new(&fake.url, SecretString::from(APP_ID), SecretString::from(APP_SECRET));
    let replier = Arc::new(SeatalkReplier::new(client, status.clone()));
    replier.note_chat("G9", true);

    let (tx, rx) = tokio::sync::watch::channel(TurnView { turn_id: "t1".into(), ..Default::default() });
    let r = replier.clone();
    let turn = tokio::spawn(async move { r.turn("E1", rx).await });
    fake.wait_messages("the acknowledgement", Duration::from_secs(10), |m| !m.is_empty()).await?;
    assert_eq!((fake.messages()[0].content.as_str(), fake.messages()[0].format), (ACK_TEXT, 2));
    let para = |c: char| std::iter::repeat_n(c, 3000).collect::<String>();
    let long = format!("{}\n\n{}\n\n{}", para('a'), para('b'), para('c'));
    tx.send_replace(TurnView { text: "partial".into(), ..Default::default() });
    tx.send_replace(TurnView {
        text: long,
        state: TurnState::Done { stop_reason: "end_turn".into() },
        ..Default::default()
    });
    turn.await??;
    let m = fake.messages();
    assert_eq!(
        m.iter().map(|s| s.content.chars().next().unwrap_or(' ')).collect::<String>(),
        "Wabc",
        "ack then the pieces in order"
    );
    ensure!(m.iter().all(|s| s.accepted && s.to == "E1" && s.endpoint == "single_chat"), "{m:?}");
    assert_eq!(m[1..].iter().map(|s| s.format).collect::<Vec<_>>(), [1, 1, 1], "the final text is markdown");
    ensure!(status.get().last_outbound_ms > 0);

    // A failed turn in a group: the acknowledgement, then a short notice, to the group.
    let (tx, rx) = tokio::sync::watch::channel(TurnView::default());
    let r = replier.clone();
    let turn = tokio::spawn(async move { r.turn("G9", rx).await });
    fake.wait_messages("the group acknowledgement", Duration::from_secs(10), |m| m.len() == 5).await?;
    tx.send_replace(TurnView {
        state: TurnState::Failed { message: "the agent exited (code 1)".into() },
        ..Default::default()
    });
    turn.await??;
    let m = fake.messages();
    assert_eq!(
        m[4..].iter().map(|s| (s.endpoint.as_str(), s.to.as_str(), s.content.as_str())).collect::<Vec<_>>(),
        [("group_chat", "G9", ACK_TEXT), ("group_chat", "G9", "The turn failed: the agent exited (code 1)")]
    );

    // The adapter stopping mid-turn (the views close): nothing more is sent.
    let (tx, rx) = tokio::sync::watch::channel(TurnView::default());
    let r = replier.clone();
    let turn = tokio::spawn(async move { r.turn("E1", rx).await });
    fake.wait_messages("the third acknowledgement", Duration::from_secs(10), |m| m.len() == 7).await?;
    drop(tx);
    turn.await??;
    assert_eq!(fake.messages().len(), 7, "nothing after the acknowledgement");
    Ok(())
}

/// Whether `m` is an accepted message to `to` whose content, trimmed, is `text`.
fn said(m: &fake_seatalk::Sent, to: &str, text: &str) -> bool {
    m.accepted && m.to == to && m.content.trim() == text
}

#[tokio::test]
async fn a_full_seatalk_conversation_verification_pairing_ack_then_final_and_shutdown() -> anyhow::Result<()> {
    use coffer_proto::chat::ListConversationsRequest;
    use coffer_tests::SendExt;
    use coffer_tests::chat;

    let port = ports::free_port();
    let home = TestHome::builder().env("COFFER_CALLBACK_PORT", port.to_string()).build()?;
    let api = chat::start_daemon(&home).await?;
    let fake = FakeSeatalk::start(APP_ID, APP_SECRET).await?;
    let signing = format!("signing-{:016x}", fastrand::u64(..));
    // The channel resource through REST, its secrets given once (stored as credentials).
    let body = serde_json::json!({
        "name": "team", "kind": "seatalk", "enabled": true, "app_id": APP_ID, "app_secret": APP_SECRET,
        "signing_secret": signing, "api_base_url": fake.url, "default_agent": chat::SCRIPTED,
    });
    let r = api.post_json("/v1/channels", &body).reply().await?;
    ensure!(r.status == 201, "POST /v1/channels: {} {}", r.status, r.text);
    // The coordinator starts coffer-callback for it; SeaTalk verifies the URL.
    wait_for("coffer-callback to run for the channel", Duration::from_secs(30), || async {
        Ok((api.service("callback").await?["state"] == "healthy").then_some(()))
    })
    .await?;
    let cb = Callback::new(port);
    let t = Instant::now();
    let a = cb.signed("team", fake_seatalk::verification("hello-seatalk"), &signing).await?;
    assert_eq!((a.status, a.body["seatalk_challenge"].as_str()), (200, Some("hello-seatalk")));
    ensure!(t.elapsed() < Duration::from_secs(5));

    // Unpaired: refused. Then the owner pairs with a one-time code.
    let post =
        |id: &str, from: &str, text: &str| cb.signed("team", fake_seatalk::single_message(id, from, text), &signing);
    assert_eq!(post("ev-0", "E1", "say:too early").await?.status, 200);
    fake.wait_messages("the unpaired refusal", Duration::from_secs(20), |m| {
        m.iter().any(|s| s.to == "E1" && s.content.starts_with("Sorry"))
    })
    .await?;
    let p = api.post("/v1/channels/team/pair").reply().await?;
    ensure!(p.status == 200, "pair: {} {}", p.status, p.text);
    let code = p.json()?["code"].as_str().context("code")?.to_owned();
    assert_eq!(post("ev-pair", "E1", &format!("/pair {code}")).await?.status, 200);
    fake.wait_messages("the pairing notice", Duration::from_secs(20), |m| {
        m.iter().any(|s| s.to == "E1" && s.content.starts_with("Paired"))
    })
    .await?;

    // The owner asks: an acknowledgement at once, then the agent's final answer.
    assert_eq!(post("ev-1", "E1", "say:hello from the agent").await?.status, 200);
    let m = fake
        .wait_messages("ack then final", Duration::from_secs(30), |m| {
            m.iter().any(|s| said(s, "E1", "hello from the agent"))
        })
        .await?;
    let to_e1: Vec<_> = m.iter().filter(|s| s.to == "E1").map(|s| s.content.trim().to_owned()).collect();
    let n = to_e1.len();
    assert_eq!(to_e1[n - 2..], [ACK_TEXT.to_owned(), "hello from the agent".to_owned()], "{to_e1:?}");

    // Someone else (after the adapter's restart on the new owner: a refusal is once per sender
    // per adapter run): refused once, no turn.
    assert_eq!(post("ev-x1", "E2", "say:let me in").await?.status, 200);
    assert_eq!(post("ev-x2", "E2", "say:please").await?.status, 200);

    // The web console's view of the same conversation: it sees the next SeaTalk turn live.
    let mut c = chat::client(&api).await?;
    let convs = c.list_conversations(ListConversationsRequest::default()).await?.into_inner().conversations;
    let conv =
        convs.iter().find(|v| v.channel_name == "team" && v.peer_chat_id == "E1").context("the bound conversation")?;
    let view = chat::get(&mut c, &conv.id).await?;
    let mut web = chat::watch(&mut c, &conv.id, view.last_seq).await?;

    // A redelivery of ev-1 is dropped; the next message is one more turn.
    assert_eq!(post("ev-1", "E1", "say:hello from the agent").await?.status, 200);
    assert_eq!(post("ev-2", "E1", "say:second answer").await?.status, 200);
    let turn = web.turn().await?;
    assert_eq!(chat::text(&turn).trim(), "second answer", "the web subscriber sees the channel's turn");
    let m = fake
        .wait_messages("the second final", Duration::from_secs(30), |m| {
            m.iter().any(|s| said(s, "E1", "second answer"))
        })
        .await?;
    assert_eq!(m.iter().filter(|s| said(s, "E1", "hello from the agent")).count(), 1, "the replay made no turn");
    assert_eq!(m.iter().filter(|s| said(s, "E1", ACK_TEXT)).count(), 2);
    let to_e2: Vec<_> = m.iter().filter(|s| s.to == "E2").collect();
    assert_eq!(to_e2.len(), 1, "one refusal for the non-owner, nothing else: {to_e2:?}");
    ensure!(to_e2[0].content != ACK_TEXT && !to_e2[0].content.is_empty());

    // A group mention: the mention stripped, the reply to the group.
    let g = fake_seatalk::group_mention("ev-g1", "G1", "E1", "Coffer", "say:group answer");
    assert_eq!(cb.signed("team", g, &signing).await?.status, 200);
    let m = fake
        .wait_messages("the group's final", Duration::from_secs(30), |m| {
            m.iter().any(|s| said(s, "G1", "group answer"))
        })
        .await?;
    let g1: Vec<_> = m.iter().filter(|s| s.to == "G1").collect();
    ensure!(g1.iter().all(|s| s.endpoint == "group_chat") && g1.len() == 2 && g1[0].content == ACK_TEXT, "{g1:?}");

    // The platform revokes the token: the adapter fetches a new one and the reply still arrives.
    let before = fake.token_requests();
    fake.revoke_tokens();
    assert_eq!(post("ev-3", "E1", "say:after revocation").await?.status, 200);
    fake.wait_messages("the reply after the revocation", Duration::from_secs(30), |m| {
        m.iter().any(|s| said(s, "E1", "after revocation"))
    })
    .await?;
    ensure!(fake.token_requests() > before, "a new token was fetched");
    // Two videos from the owner: told once what is read, no turn; the next text message still
    // runs (events are handled in order, so its answer comes after both).
    for id in ["ev-vid1", "ev-vid2"] {
        assert_eq!(cb.signed("team", fake_seatalk::single_video(id, "E1"), &signing).await?.status, 200);
    }
    assert_eq!(post("ev-4", "E1", "say:after the videos").await?.status, 200);
    let m = fake
        .wait_messages("the answer after the videos", Duration::from_secs(30), |m| {
            m.iter().any(|s| said(s, "E1", "after the videos"))
        })
        .await?;
    assert_eq!(m.iter().filter(|s| said(s, "E1", ONLY_TEXT)).count(), 1, "told once: {m:?}");
    assert_eq!(m.iter().filter(|s| said(s, "E1", ACK_TEXT)).count(), 4, "no turn for the videos");
    // Malformed JSON, even signed, is refused by coffer-callback and reaches nobody.
    let sent = fake.messages().len();
    assert_eq!(cb.signed("team", b"{not json".to_vec(), &signing).await?.status, 400);

    // The last SeaTalk channel disabled: coffer-callback stopped, its port free.
    let r = api.post("/v1/channels/team/disable").reply().await?;
    ensure!(r.status == 200, "disable: {} {}", r.status, r.text);
    wait_for("coffer-callback to stop with the last SeaTalk channel", Duration::from_secs(30), || async {
        Ok((api.service("callback").await?["state"] == "stopped" && ports::port_is_free(port)).then_some(()))
    })
    .await?;
    assert_eq!(fake.messages().len(), sent, "nothing more was sent");
    // The secrets are encrypted credentials and env of a process: in no file in the clear.
    for secret in [signing.as_str(), APP_SECRET] {
        let leaked = files_containing(home.root(), secret);
        ensure!(leaked.is_empty(), "a secret is on disk in the clear: {leaked:?}");
    }
    home.cli(&["daemon", "stop"]).await?.ok()?;
    home.wait_no_processes(Duration::from_secs(20)).await?;
    Ok(())
}
