//! The chat service's turn engine end to end: a real daemon (`coffer-test-daemon scripted-chat`,
//! whose chat service registers the test-only `scripted` agent), the real store, the
//! `coffer.chat.v1.Chat` service called over gRPC with the gateway's identity. Each fault of
//! issue 15 that is the engine's: bad creates, 1 MiB and empty messages, 50 messages during one
//! turn (in order, one turn each), interrupt idle and twice, delete during a turn, a hang past the
//! turn timeout, an agent exiting mid-turn, 10 subscribers attaching mid-turn, a reconnect with
//! `after_seq` mid-turn, kill -9 of the chat service mid-turn, a daemon restart with a paused
//! queue.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_proto::chat::{self as c, event::Kind, send_message_reply::Outcome};
use coffer_tests::chat::{self, Client, SCRIPTED, SCRIPTED_MISSING};
use coffer_tests::{Api, SendExt, TestHome, procs, wait_for};
use nix::sys::signal::Signal;
use serde_json::json;
use tonic::Code;

fn create_req(cwd: &str) -> c::CreateConversationRequest {
    c::CreateConversationRequest {
        agent_key: SCRIPTED.into(),
        agent_config: Some(c::AgentConfig { cwd: cwd.into(), ..Default::default() }),
        ..Default::default()
    }
}

async fn pending(cl: &mut Client, id: &str) -> anyhow::Result<c::PendingQueue> {
    chat::get(cl, id).await?.pending.context("pending")
}

fn status_of(m: &c::Message) -> c::MessageStatus {
    c::MessageStatus::try_from(m.status).unwrap_or(c::MessageStatus::Unspecified)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_are_listed_and_bad_creates_are_refused_naming_the_problem() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let agents = cl.list_agents(c::ListAgentsRequest {}).await?.into_inner().agents;
    let scripted = agents.iter().find(|a| a.agent_key == SCRIPTED).context("scripted listed")?;
    assert!(scripted.available && scripted.reason.is_empty(), "{scripted:?}");
    let missing = agents.iter().find(|a| a.agent_key == SCRIPTED_MISSING).context("missing listed")?;
    assert!(!missing.available && missing.reason.contains("never available"), "{missing:?}");

    let refuse = |req: c::CreateConversationRequest| {
        let mut cl = cl.clone();
        async move { cl.create_conversation(req).await.expect_err("refused") }
    };
    let e = refuse(c::CreateConversationRequest { agent_key: "nope".into(), ..Default::default() }).await;
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("\"nope\"") && e.message().contains(SCRIPTED), "{}", e.message());
    let e = refuse(c::CreateConversationRequest { agent_key: SCRIPTED_MISSING.into(), ..Default::default() }).await;
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("never available"), "{}", e.message());
    let file = home.temp().join("a-file");
    std::fs::write(&file, "x")?;
    for (cwd, says) in [
        ("relative/dir", "not an absolute path"),
        ("/no/such/dir/anywhere", "does not exist"),
        (file.to_str().context("utf-8")?, "not a directory"),
    ] {
        let e = refuse(create_req(cwd)).await;
        assert_eq!(e.code(), Code::InvalidArgument, "{cwd}");
        assert!(e.message().contains("agent_config.cwd") && e.message().contains(says), "{cwd}: {}", e.message());
    }
    let mut with_session = create_req("");
    with_session.agent_config.as_mut().context("config")?.session_id = "abc".into();
    assert_eq!(refuse(with_session).await.code(), Code::InvalidArgument);
    let e = refuse(c::CreateConversationRequest {
        agent_key: SCRIPTED.into(),
        first_message: "x".repeat((1 << 20) + 1),
        ..Default::default()
    })
    .await;
    assert!(e.code() == Code::InvalidArgument && e.message().contains("1 MiB"), "{}", e.message());
    let listed = cl
        .list_conversations(c::ListConversationsRequest {
            archived: c::list_conversations_request::Archived::All as i32,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(listed.conversations.is_empty(), "nothing persisted: {listed:?}");

    // The default working directory is created on first use.
    let conv = chat::create(&mut cl).await?;
    let cwd = conv.agent_config.context("config")?.cwd;
    assert_eq!(std::path::Path::new(&cwd), home.root().join("workspace"));
    assert!(home.root().join("workspace").is_dir());
    let e = cl.get_conversation(c::GetConversationRequest { id: "../etc".into(), message_limit: 0 }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_streams_tools_and_text_is_persisted_titled_and_audited() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let conv = chat::create(&mut cl).await?;
    assert!(conv.title.is_empty());
    let mut w = chat::watch(&mut cl, &conv.id, 0).await?;
    let script = "say:Looking it up\ntool:coffer__search_tools {\"query\":\"notes\"}\nsay:found two notes";
    let reply = chat::send(&mut cl, &conv.id, script).await?;
    let Some(Outcome::Message(user)) = reply.outcome else { anyhow::bail!("a turn starts: {reply:?}") };
    let events = w.turn().await?;
    let kinds = chat::kinds(&events);
    assert_eq!(kinds[..2], ["message_created", "turn_started"], "{kinds:?}");
    assert!(kinds.contains(&"tool_call") && kinds.contains(&"tool_result"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"turn_done"));
    assert_eq!(chat::text(&events), "Looking it upfound two notes");
    assert!(events.windows(2).all(|p| p[1].seq > p[0].seq), "increasing seqs");
    assert!(events.iter().all(|e| e.turn_id == events[0].turn_id), "one turn id");
    let Some(Kind::TurnDone(done)) = &events.last().context("last")?.kind else { unreachable!() };
    assert_eq!((done.stop_reason.as_str(), done.model.as_str()), ("end_turn", "scripted-model"));

    let view = chat::get(&mut cl, &conv.id).await?;
    let c = view.conversation.context("conversation")?;
    assert_eq!(c.title, "say:Looking it up", "the first line of the first message");
    assert!(c.agent_config.context("config")?.session_id.starts_with("scripted-"), "session persisted");
    assert_eq!(view.messages.len(), 2);
    assert_eq!(view.messages[0].id, user.id);
    let a = &view.messages[1];
    assert_eq!(status_of(a), c::MessageStatus::Complete);
    assert_eq!(a.blocks.len(), 4, "text, tool_use, tool_result, text: {:?}", a.blocks);
    assert!(
        matches!(&a.blocks[1].block, Some(c::content_block::Block::ToolUse(t)) if t.name == "coffer__search_tools" && t.input_json.contains("notes"))
    );
    assert_eq!(a.model, "scripted-model");
    assert!(view.last_seq >= events.last().context("last")?.seq);

    let audit = api.get("/v1/audit?actor=agent").reply().await?.ok_json()?;
    let items = audit["items"].as_array().context("items")?;
    assert_eq!(items.len(), 1, "{audit}");
    assert_eq!((items[0]["action"].as_str(), items[0]["target"].as_str()), (Some("chat.turn"), Some(conv.id.as_str())));
    assert!(!audit.to_string().contains("found two notes"), "no message text in the audit log");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stamped_deltas_carry_the_time_the_adapter_sent_them() -> anyhow::Result<()> {
    // The benchmark's emit times (`coffer-bench --only chat`): each `stamped:` delta is stamped
    // when the scripted adapter sends it, in order, between the send and the receipt.
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let conv = chat::create(&mut cl).await?;
    let mut w = chat::watch(&mut cl, &conv.id, 0).await?;
    let before = chat::unix_micros();
    chat::send(&mut cl, &conv.id, "slow:2\nstamped:20").await?;
    let mut stamps = Vec::new();
    for e in w.turn().await? {
        let arrived = chat::unix_micros();
        if let Some(Kind::TextDelta(d)) = &e.kind {
            let stamp = chat::stamp_of(&d.text).with_context(|| format!("not a stamp: {:?}", d.text))?;
            assert!((before..=arrived).contains(&stamp), "{before} <= {stamp} <= {arrived}");
            stamps.push(stamp);
        }
    }
    assert_eq!(stamps.len(), 20);
    assert!(stamps.windows(2).all(|p| p[1] >= p[0] + 1_000), "paced by slow:2 (≥ 2 ms apart, 1 ms slack): {stamps:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_one_mib_pass_and_empty_or_larger_ones_are_refused() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let conv = chat::create(&mut cl).await?;
    for (text, says) in [(String::new(), "empty"), ("x".repeat((1 << 20) + 1), "1 MiB")] {
        let e = chat::send(&mut cl, &conv.id, &text).await.unwrap_err();
        let s = e.downcast_ref::<tonic::Status>().context("a status")?;
        assert!(s.code() == Code::InvalidArgument && s.message().contains(says), "{}", s.message());
    }
    assert_eq!(chat::get(&mut cl, &conv.id).await?.messages.len(), 0, "nothing stored");
    let mut w = chat::watch(&mut cl, &conv.id, 0).await?;
    let big = format!("say:big\n{}", "y".repeat((1 << 20) - 8));
    assert_eq!(big.len(), 1 << 20);
    chat::send(&mut cl, &conv.id, &big).await?;
    let events = w.turn().await?;
    assert_eq!(chat::kinds(&events).last(), Some(&"turn_done"));
    let view = chat::get(&mut cl, &conv.id).await?;
    assert_eq!(chat::message_text(&view.messages[0]).len(), 1 << 20, "stored whole");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_messages_sent_during_a_turn_all_run_in_order_one_turn_each() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let conv = chat::create(&mut cl).await?;
    let mut w = chat::watch(&mut cl, &conv.id, 0).await?;
    // The first turn runs until it is stopped, so every message below is sent during it,
    // whatever the machine's load (a timed first turn ended early on a busy machine).
    chat::send(&mut cl, &conv.id, "say:first\nhang").await?;
    w.until_kind("turn_started").await?;
    let mut items = Vec::new();
    for i in 0..50 {
        let r = chat::send(&mut cl, &conv.id, &format!("say:m{i}")).await?;
        let Some(Outcome::Pending(p)) = r.outcome else { anyhow::bail!("message {i} is queued: {r:?}") };
        assert_eq!(r.queue.context("queue")?.items.len(), i + 1);
        items.push(p);
    }
    // Stopping the turn pauses the queue; resuming it as it is runs the fifty.
    let id = c::ConversationRef { id: conv.id.clone() };
    assert!(cl.interrupt(id).await?.into_inner().interrupted);
    let paused = chat::get(&mut cl, &conv.id).await?.pending.context("pending")?;
    assert!(paused.paused && paused.items.len() == 50, "{paused:?}");
    cl.set_pending(c::SetPendingRequest { conversation_id: conv.id.clone(), items, paused: false }).await?;
    let events = w.until(Duration::from_secs(120), |e| chat::text(std::slice::from_ref(e)) == "m49").await?;
    let events = [events, w.turn().await?].concat();
    let created = chat::created_texts(&events);
    let want: Vec<String> = (0..50).map(|i| format!("say:m{i}")).collect();
    assert_eq!(created, want, "each queued message became its own turn, in order");
    let turns = events.iter().filter(|e| chat::kind(e) == "turn_started").count();
    assert_eq!(turns, 50, "one turn each (the first was already running)");
    let view = chat::get(&mut cl, &conv.id).await?;
    let c = view.conversation.context("c")?;
    assert_eq!(c.message_count, 102, "51 turns of two messages");
    assert!(view.pending.context("pending")?.items.is_empty());
    assert!(!c.turn_running);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_keeps_the_partial_message_pauses_the_queue_and_is_a_no_op_when_idle_or_twice() -> anyhow::Result<()>
{
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let conv = chat::create(&mut cl).await?;
    let id = c::ConversationRef { id: conv.id.clone() };
    assert!(!cl.interrupt(id.clone()).await?.into_inner().interrupted, "idle: a no-op");
    let mut w = chat::watch(&mut cl, &conv.id, 0).await?;
    chat::send(&mut cl, &conv.id, "say:partial words\ntool:Bash {\"command\":\"ls\"}\nhang").await?;
    w.until_kind("tool_result").await?;
    chat::send(&mut cl, &conv.id, "say:queued").await?;
    assert!(cl.interrupt(id.clone()).await?.into_inner().interrupted);
    assert!(!cl.interrupt(id.clone()).await?.into_inner().interrupted, "twice: a no-op");
    let rest = w.turn().await?;
    let Some(Kind::TurnDone(done)) = &rest.last().context("end")?.kind else { anyhow::bail!("{rest:?}") };
    assert_eq!(done.stop_reason, "interrupted");
    let m = done.message.as_ref().context("message")?;
    assert_eq!(status_of(m), c::MessageStatus::Interrupted);
    assert_eq!(chat::message_text(m), "partial words");
    assert_eq!(m.blocks.len(), 3, "text and the completed tool blocks: {:?}", m.blocks);
    let q = w.until_kind("queue_changed").await?;
    let Some(Kind::QueueChanged(qc)) = &q.last().context("q")?.kind else { unreachable!() };
    assert!(qc.queue.as_ref().is_some_and(|q| q.paused && q.items.len() == 1), "{qc:?}");
    let view = chat::get(&mut cl, &conv.id).await?;
    assert_eq!(status_of(&view.messages[1]), c::MessageStatus::Interrupted);
    assert!(!view.conversation.context("c")?.turn_running);

    // Resume: the queued message runs (after the old adapter task ended).
    let items = pending(&mut cl, &conv.id).await?.items;
    cl.set_pending(c::SetPendingRequest { conversation_id: conv.id.clone(), items, paused: false }).await?;
    let next = w.turn().await?;
    assert_eq!(chat::created_texts(&next), ["say:queued"]);
    assert_eq!(chat::text(&next), "queued");
    assert!(!pending(&mut cl, &conv.id).await?.paused);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_during_a_turn_cancels_it_resets_subscribers_and_leaves_nothing() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let conv = chat::create(&mut cl).await?;
    let mut w = chat::watch(&mut cl, &conv.id, 0).await?;
    chat::send(&mut cl, &conv.id, "say:working\nhang").await?;
    chat::send(&mut cl, &conv.id, "queued").await?;
    w.until_kind("text_delta").await?;
    let r = cl.delete_conversation(c::ConversationRef { id: conv.id.clone() }).await?.into_inner();
    assert!(r.deleted && r.turn_cancelled, "{r:?}");
    let ev = w.until_kind("reset").await?;
    let Some(Kind::Reset(reset)) = &ev.last().context("reset")?.kind else { unreachable!() };
    assert_eq!(reset.reason, "deleted");
    assert!(w.next().await?.is_none(), "the stream ends");
    let e = cl.get_conversation(c::GetConversationRequest { id: conv.id.clone(), message_limit: 0 }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = chat::send(&mut cl, &conv.id, "again").await.unwrap_err();
    assert_eq!(e.downcast_ref::<tonic::Status>().map(tonic::Status::code), Some(Code::NotFound));
    Ok(())
}

/// Sets `chat.turn_timeout_s` and restarts the chat service, which reads settings before it
/// serves.
async fn short_timeout(api: &Api, seconds: u32) -> anyhow::Result<()> {
    api.request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"chat.turn_timeout_s": seconds.to_string()}}))
        .reply()
        .await?
        .ok_json()?;
    let r = api.post("/v1/daemon/services/chat/restart").reply().await?;
    ensure!(r.status.is_success(), "restart chat: {} {}", r.status, r.text);
    wait_for("chat healthy again", Duration::from_secs(20), || async {
        Ok((api.service("chat").await?["state"] == "healthy").then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_times_out_and_an_exit_mid_turn_is_cli_exited_and_the_conversation_stays_usable() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    short_timeout(&api, 1).await?;
    let mut cl = chat::client(&api).await?;
    let conv = chat::create(&mut cl).await?;
    let mut w = chat::watch(&mut cl, &conv.id, 0).await?;
    let resume = |mut cl: Client, id: String| async move {
        cl.set_pending(c::SetPendingRequest { conversation_id: id, items: vec![], paused: false }).await
    };

    chat::send(&mut cl, &conv.id, "say:thinking\nhang").await?;
    let ev = w.turn().await?;
    let Some(Kind::TurnError(err)) = &ev.last().context("end")?.kind else { anyhow::bail!("{ev:?}") };
    assert_eq!(err.code, "timeout");
    assert!(err.message.contains("chat.turn_timeout_s"), "{}", err.message);
    let m = err.message_record.as_ref().context("record")?;
    assert_eq!((status_of(m), chat::message_text(m).as_str()), (c::MessageStatus::Failed, "thinking"));
    assert!(pending(&mut cl, &conv.id).await?.paused, "paused after turn_error");
    resume(cl.clone(), conv.id.clone()).await?;

    chat::send(&mut cl, &conv.id, "say:half\nexit").await?;
    let ev = w.turn().await?;
    let Some(Kind::TurnError(err)) = &ev.last().context("end")?.kind else { anyhow::bail!("{ev:?}") };
    assert_eq!(err.code, "cli_exited");
    resume(cl.clone(), conv.id.clone()).await?;

    chat::send(&mut cl, &conv.id, "fail:auth the model API answered 401").await?;
    let ev = w.turn().await?;
    let Some(Kind::TurnError(err)) = &ev.last().context("end")?.kind else { anyhow::bail!("{ev:?}") };
    assert_eq!((err.code.as_str(), err.message.as_str()), ("auth", "the model API answered 401"));
    resume(cl.clone(), conv.id.clone()).await?;

    chat::send(&mut cl, &conv.id, "say:still here").await?;
    let ev = w.turn().await?;
    assert_eq!((chat::kinds(&ev).last().copied(), chat::text(&ev).as_str()), (Some("turn_done"), "still here"));
    let view = chat::get(&mut cl, &conv.id).await?;
    assert!(view.messages.iter().all(|m| status_of(m) != c::MessageStatus::Streaming), "none left streaming");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_subscribers_attaching_mid_turn_and_a_reconnect_see_the_same_events() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let conv = chat::create(&mut cl).await?;
    let mut first = chat::watch(&mut cl, &conv.id, 0).await?;
    chat::send(&mut cl, &conv.id, "slow:20\ndeltas:100").await?;
    let early = first.until(chat::EVENT_TIMEOUT, |e| chat::text(std::slice::from_ref(e)) == "w10 ").await?;
    let mut late = Vec::new();
    for _ in 0..10 {
        late.push(chat::watch(&mut cl, &conv.id, 0).await?);
    }
    // A reconnect with the last seq seen mid-turn.
    let resume_after = early[5].seq;
    let mut resumed = chat::watch(&mut cl, &conv.id, resume_after).await?;
    let rest = first.turn().await?;
    let all: Vec<c::Event> = [early, rest].concat();
    let seqs = |v: &[c::Event]| v.iter().map(|e| e.seq).collect::<Vec<_>>();
    for (i, w) in late.iter_mut().enumerate() {
        let got = w.turn().await?;
        assert_eq!(seqs(&got), seqs(&all), "subscriber {i} saw the whole turn");
        assert_eq!(got, all, "identical events");
    }
    let got = resumed.turn().await?;
    assert_eq!(seqs(&got), seqs(&all[6..]), "everything after {resume_after}, nothing twice");
    assert_eq!(chat::text(&all), (0..100).map(|i| format!("w{i} ")).collect::<String>());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_chat_service_mid_turn_fails_the_turn_restores_the_queue_paused_and_resumes_the_session()
-> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let conv = chat::create(&mut cl).await?;
    let mut w = chat::watch(&mut cl, &conv.id, 0).await?;
    chat::send(&mut cl, &conv.id, "say:before the crash\nhang").await?;
    chat::send(&mut cl, &conv.id, "session").await?;
    let seen = w.until_kind("text_delta").await?;
    let session = wait_for("the session id persisted", Duration::from_secs(10), || {
        let mut cl = cl.clone();
        let id = conv.id.clone();
        async move {
            let c = chat::get(&mut cl, &id).await?.conversation.context("c")?;
            let s = c.agent_config.context("config")?.session_id;
            Ok((!s.is_empty()).then_some(s))
        }
    })
    .await?;
    let old = api.service("chat").await?;
    let old_pid = old["pid"].as_i64().context("pid")? as i32;
    procs::signal(old_pid, Signal::SIGKILL);
    wait_for("chat restarted", Duration::from_secs(20), || async {
        let s = api.service("chat").await?;
        Ok((s["state"] == "healthy" && s["pid"] != old_pid).then_some(()))
    })
    .await?;
    // The old stream ends with the process (what it still held first, never a turn end).
    while let Ok(Some(e)) = w.next().await {
        assert!(!chat::is_turn_end(&e), "the killed turn never ended: {e:?}");
    }

    let view = chat::get(&mut cl, &conv.id).await?;
    assert_eq!(view.messages.len(), 2);
    assert_eq!(status_of(&view.messages[1]), c::MessageStatus::Failed, "{:?}", view.messages[1]);
    let q = view.pending.context("pending")?;
    assert!(q.paused && q.items.len() == 1 && q.items[0].text == "session", "restored paused: {q:?}");
    assert!(view.last_seq > seen.last().context("seen")?.seq, "seqs keep increasing across the restart");
    let mut old_watch = chat::watch(&mut cl, &conv.id, seen.last().context("seen")?.seq).await?;
    let first = old_watch.next().await?.context("an event")?;
    assert!(matches!(&first.kind, Some(Kind::Reset(r)) if r.reason == "too_old"), "{first:?}");

    // Resuming the queue runs the queued message, which resumes the agent session.
    let mut w = chat::watch(&mut cl, &conv.id, view.last_seq).await?;
    cl.set_pending(c::SetPendingRequest { conversation_id: conv.id.clone(), items: q.items, paused: false }).await?;
    let ev = w.turn().await?;
    assert!(ev.iter().all(|e| e.seq > view.last_seq));
    assert_eq!(chat::text(&ev), format!("session={session}"));
    chat::send(&mut cl, &conv.id, "say:and more").await?;
    assert_eq!(chat::text(&w.turn().await?), "and more");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_restart_keeps_conversations_and_restores_a_paused_queue() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let conv = chat::create(&mut cl).await?;
    let mut w = chat::watch(&mut cl, &conv.id, 0).await?;
    chat::send(&mut cl, &conv.id, "say:one").await?;
    w.turn().await?;
    // Pause with two items queued (the queue was set paused by hand).
    let items =
        ["say:two", "say:three"].iter().map(|t| c::PendingItem { text: (*t).into(), ..Default::default() }).collect();
    cl.set_pending(c::SetPendingRequest { conversation_id: conv.id.clone(), items, paused: true }).await?;
    let before = chat::get(&mut cl, &conv.id).await?;
    drop(w);
    home.terminate_daemon(Duration::from_secs(20)).await?;

    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let view = chat::get(&mut cl, &conv.id).await?;
    assert_eq!(view.messages, before.messages, "messages kept");
    let q = view.pending.clone().context("pending")?;
    assert!(q.paused, "still paused");
    assert_eq!(q.items.iter().map(|i| i.text.as_str()).collect::<Vec<_>>(), ["say:two", "say:three"]);
    assert!(view.last_seq > before.last_seq, "seqs never go backwards");
    let mut w = chat::watch(&mut cl, &conv.id, view.last_seq).await?;
    cl.set_pending(c::SetPendingRequest { conversation_id: conv.id.clone(), items: q.items, paused: false }).await?;
    assert_eq!(chat::text(&w.turn().await?), "two");
    assert_eq!(chat::text(&w.turn().await?), "three");
    Ok(())
}

/// Resident memory of a process, KiB (`VmRSS`).
fn rss_kib(pid: i32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("VmRSS")?;
    line.split_whitespace().nth(1).context("value")?.parse().context("KiB")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_conversations_keep_the_chat_service_small_and_a_turn_starts_fast() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let cl = chat::client(&api).await?;
    let pid = api.service("chat").await?["pid"].as_i64().context("pid")? as i32;
    let before = rss_kib(pid)?;
    let mut tasks = Vec::new();
    for part in 0..4 {
        let mut cl = cl.clone();
        tasks.push(tokio::spawn(async move {
            let mut started = Vec::new();
            for _ in 0..250 {
                let conv = chat::create(&mut cl).await?;
                let mut w = chat::watch(&mut cl, &conv.id, 0).await?;
                let t0 = std::time::Instant::now();
                chat::send(&mut cl, &conv.id, &format!("say:hello from part {part}")).await?;
                w.until_kind("turn_started").await?;
                started.push(t0.elapsed());
                let end = w.turn().await?;
                ensure!(chat::kinds(&end).last() == Some(&"turn_done"), "{end:?}");
            }
            anyhow::Ok(started)
        }));
    }
    let mut started = Vec::new();
    for t in tasks {
        started.extend(t.await??);
    }
    started.sort();
    let after = rss_kib(pid)?;
    let p50 = started[started.len() / 2];
    let p99 = started[started.len() * 99 / 100];
    eprintln!(
        "coffer-chat RSS: {before} KiB at start, {after} KiB with 1,000 idle conversations (one turn each); \
         SendMessage to turn_started: p50 {p50:?}, p99 {p99:?} (4 clients at once, debug build)"
    );
    assert!(after < 50 * 1024, "1,000 idle conversations: {after} KiB, floor 50 MiB");
    let listed = cl
        .clone()
        .list_conversations(c::ListConversationsRequest { limit: 200, ..Default::default() })
        .await?
        .into_inner();
    assert_eq!(listed.conversations.len(), 200);
    assert!(listed.conversations.iter().all(|c| !c.turn_running && c.message_count == 2 && !c.title.is_empty()));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_model_archive_restore_and_stale_versions() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let conv = cl
        .create_conversation(c::CreateConversationRequest {
            agent_key: SCRIPTED.into(),
            first_message: "Plan the week\nwith details".into(),
            source: "cli".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(conv.title, "Plan the week");
    let mut w = chat::watch(&mut cl, &conv.id, 0).await?;
    // The first message may have started before the watch: wait for its end either way.
    let view = wait_for("the first turn to end", Duration::from_secs(20), || {
        let (mut cl, id) = (cl.clone(), conv.id.clone());
        async move {
            let v = chat::get(&mut cl, &id).await?;
            // The agent's session id is persisted (the conversation's version 2) when the adapter
            // reports it, which may be after the reply is complete: wait for both, so that the
            // version read below is the one the updates must name.
            let session =
                v.conversation.as_ref().and_then(|c| c.agent_config.as_ref()).map(|a| !a.session_id.is_empty());
            let done = v.messages.len() == 2 && status_of(&v.messages[1]) == c::MessageStatus::Complete;
            Ok((done && session == Some(true)).then_some(v))
        }
    })
    .await?;
    assert_eq!(view.messages[0].source, "cli");
    let c0 = view.conversation.context("c")?;
    let shared = cl.clone();
    let update = |req: c::UpdateConversationRequest| {
        let mut cl = shared.clone();
        async move { cl.update_conversation(req).await.map(tonic::Response::into_inner) }
    };
    let renamed = update(c::UpdateConversationRequest {
        id: conv.id.clone(),
        expected_version: Some(c0.version),
        title: Some("Week plan".into()),
        model: Some("big-model".into()),
        ..Default::default()
    })
    .await?;
    assert_eq!(renamed.title, "Week plan");
    let cfg = renamed.agent_config.clone().context("config")?;
    assert_eq!(cfg.model, "big-model");
    assert_eq!(cfg.session_id, c0.agent_config.context("config")?.session_id, "session kept");
    let stale = update(c::UpdateConversationRequest {
        id: conv.id.clone(),
        expected_version: Some(c0.version),
        title: Some("again".into()),
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert_eq!(stale.code(), Code::Aborted, "{}", stale.message());
    let e = update(c::UpdateConversationRequest {
        id: conv.id.clone(),
        title: Some("t".repeat(201)),
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    chat::send(&mut cl, &conv.id, "say:with the new model").await?;
    let ev = w.until(chat::EVENT_TIMEOUT, |e| chat::text(std::slice::from_ref(e)) == "model").await?;
    let ev = [ev, w.turn().await?].concat();
    let Some(Kind::TurnDone(done)) = &ev.last().context("end")?.kind else { anyhow::bail!("{ev:?}") };
    assert_eq!(done.model, "big-model");

    let archived =
        update(c::UpdateConversationRequest { id: conv.id.clone(), archived: Some(true), ..Default::default() })
            .await?;
    assert!(archived.archived);
    let e = chat::send(&mut cl, &conv.id, "hello").await.unwrap_err();
    assert_eq!(e.downcast_ref::<tonic::Status>().map(tonic::Status::code), Some(Code::FailedPrecondition));
    let list = |archived: c::list_conversations_request::Archived| {
        let mut cl = shared.clone();
        async move {
            let r = cl
                .list_conversations(c::ListConversationsRequest { archived: archived as i32, ..Default::default() })
                .await?
                .into_inner();
            anyhow::Ok(r.conversations.into_iter().map(|c| c.id).collect::<Vec<_>>())
        }
    };
    use c::list_conversations_request::Archived;
    assert!(list(Archived::Active).await?.is_empty());
    assert_eq!(list(Archived::Archived).await?, std::slice::from_ref(&conv.id));
    update(c::UpdateConversationRequest { id: conv.id.clone(), archived: Some(false), ..Default::default() }).await?;
    assert_eq!(list(Archived::Unspecified).await?, std::slice::from_ref(&conv.id), "restored: active");
    let page = cl
        .list_messages(c::ListMessagesRequest { conversation_id: conv.id.clone(), after_id: String::new(), limit: 2 })
        .await?
        .into_inner();
    assert_eq!(page.messages.len(), 2);
    let next = cl
        .list_messages(c::ListMessagesRequest {
            conversation_id: conv.id.clone(),
            after_id: page.next_after_id,
            limit: 2,
        })
        .await?
        .into_inner();
    assert_eq!(next.messages.len(), 2, "four messages in two pages");
    assert_eq!(chat::message_text(&next.messages[0]), "say:with the new model");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_gets_lagged_and_slows_nobody_and_a_full_queue_is_refused() -> anyhow::Result<()>
{
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let conv = chat::create(&mut cl).await?;
    let mut stalled = chat::watch(&mut cl, &conv.id, 0).await?;
    let mut reader = chat::watch(&mut cl, &conv.id, 0).await?;
    let n = 30_000;
    let started = std::time::Instant::now();
    chat::send(&mut cl, &conv.id, &format!("deltas:{n}")).await?;
    let turn = reader.until(Duration::from_secs(60), chat::is_turn_end).await?;
    eprintln!("{n} deltas to a reading subscriber in {:?} while another stalled", started.elapsed());
    assert_eq!(turn.iter().filter(|e| chat::kind(e) == "text_delta").count(), n, "the reader got every delta");
    assert_eq!(chat::kinds(&turn).last(), Some(&"turn_done"));
    // The stalled one, read now: what its buffer held, then `reset{lagged}`, then the end.
    let mut last = None;
    while let Some(e) = stalled.next().await? {
        ensure!(!chat::is_turn_end(&e), "the stalled subscriber should have been dropped before the turn's end");
        last = Some(e);
    }
    let last = last.context("some events")?;
    assert!(matches!(&last.kind, Some(Kind::Reset(r)) if r.reason == "lagged"), "{last:?}");

    // The queue holds 100 items; the 101st is refused naming the limit.
    chat::send(&mut cl, &conv.id, "hang").await?;
    for i in 0..100 {
        chat::send(&mut cl, &conv.id, &format!("q{i}")).await?;
    }
    let e = chat::send(&mut cl, &conv.id, "one too many").await.unwrap_err();
    let s = e.downcast_ref::<tonic::Status>().context("status")?;
    assert!(s.code() == Code::ResourceExhausted && s.message().contains("100"), "{}", s.message());
    assert_eq!(pending(&mut cl, &conv.id).await?.items.len(), 100, "nothing lost");
    Ok(())
}
