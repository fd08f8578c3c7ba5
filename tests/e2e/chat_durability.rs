//! Chat loses nothing it acknowledged (issue 31): a real daemon (`coffer-test-daemon
//! scripted-chat`) whose real `coffer-test-chat` or `coffer-store` process is killed with SIGKILL
//! while the turn engine is held at the exact window a fault-injection run hit (the pause hook of
//! `coffer_tests::chat`: `take-pending` — the next item chosen, nothing written —,
//! `pending-taken` — the item's turn started in the store, no event yet —, `final-write` — the
//! turn's answer about to be stored; the store is frozen with SIGSTOP until the answer's write
//! sits in its receive queue, so the write is in flight when it dies). Every check goes through
//! the REST API: each acknowledged pending item is either still pending or a stored user message,
//! exactly once and in the order sent; an assistant message ends `complete` with its text, or
//! `failed` (a turn cut by a chat crash), and is never left `streaming` while no turn runs;
//! `turn_done` names a stored answer.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::chat::{self, Step, rest_create, rest_send};
use coffer_tests::{Api, SendExt, TestHome, procs, wait_for};
use nix::sys::signal::Signal;
use reqwest::Method;
use serde_json::{Value, json};

/// How long a service restart, a hold or a read may take.
const BUDGET: Duration = Duration::from_secs(30);
/// How long a queue of [`QUEUED`] scripted turns may take to drain.
const DRAIN: Duration = Duration::from_secs(180);
/// Items queued behind a stopped turn (the fault-injection run's queue).
const QUEUED: usize = 40;

/// An acknowledged pending item: its id and text, as the 202 reply gave them.
type Acked = Vec<(String, String)>;

/// The daemon's process of `service` once it is healthy and is not `old` (0: any).
async fn healthy_pid(api: &Api, service: &str, old: i32) -> anyhow::Result<i32> {
    wait_for(&format!("{service} healthy (not pid {old})"), BUDGET, || async {
        let s = api.service(service).await?;
        let pid = s["pid"].as_i64().unwrap_or(0) as i32;
        Ok((s["state"] == "healthy" && pid > 0 && pid != old).then_some(pid))
    })
    .await
}

/// SIGKILL of the daemon's `service` process (the real binary: `coffer-store`, or the tests'
/// chat service `coffer-test-chat`); its pid. The supervisor restarts it.
async fn kill(api: &Api, service: &str) -> anyhow::Result<i32> {
    let pid = healthy_pid(api, service, 0).await?;
    let p = procs::proc_info(pid).context("the service's process")?;
    let binary = if service == "chat" { "coffer-test-chat" } else { "coffer-store" };
    ensure!(p.name == binary, "pid {pid} is {}, not {binary}", p.name);
    procs::signal(pid, Signal::SIGKILL);
    wait_for("the killed process to be gone", BUDGET, || async { Ok((!procs::still_alive(&p)).then_some(())) }).await?;
    Ok(pid)
}

/// Lets the engine held at `step` go on with the store frozen (SIGSTOP) and kills the store
/// (SIGKILL) once the engine's next write sits in the frozen store's receive queue: that write
/// is in flight when the store dies, on every run (a store killed while the engine waits may
/// instead be replaced before the engine writes).
async fn kill_store_under_the_next_write(api: &Api, home: &TestHome, step: Step) -> anyhow::Result<()> {
    let store = healthy_pid(api, "store", 0).await?;
    let chat_pid = healthy_pid(api, "chat", 0).await?;
    procs::signal(store, Signal::SIGSTOP);
    chat::release(home, step)?;
    wait_for("the engine's write to reach the frozen store", BUDGET, || async {
        Ok((procs::unread_between(chat_pid, store) > 0).then_some(()))
    })
    .await?;
    kill(api, "store").await?;
    Ok(())
}

/// `GET /v1/conversations/{id}?messages=500`, retried while a service restarts.
async fn view(api: &Api, id: &str) -> anyhow::Result<Value> {
    let path = format!("/v1/conversations/{id}?messages=500");
    wait_for("the conversation over REST", BUDGET, || async { api.get(&path).reply().await?.ok_json().map(Some) }).await
}

/// Waits until the conversation's queue is empty and no turn runs.
async fn drained(api: &Api, id: &str) -> anyhow::Result<Value> {
    let path = format!("/v1/conversations/{id}?messages=500");
    wait_for("the queue to drain", DRAIN, || async {
        let v = api.get(&path).reply().await?.ok_json()?;
        let idle = v["conversation"]["turn_running"] == false
            && v["pending"]["items"].as_array().is_some_and(|a| a.is_empty());
        Ok(idle.then_some(v))
    })
    .await
}

/// A message's text blocks joined.
fn text_of(m: &Value) -> String {
    m["blocks"]
        .as_array()
        .map(|b| b.iter().filter(|b| b["type"] == "text").filter_map(|b| b["text"].as_str()).collect())
        .unwrap_or_default()
}

/// Checks a view against the acknowledged items and returns how many are stored messages. Each
/// item is exactly once either pending (its id) or a stored user message (the engine stores it
/// under the item's id), never neither and never twice; stored ones then pending ones read in
/// the order sent; each stored one is followed by its assistant message, which is not
/// `streaming` unless a turn runs.
fn check(view: &Value, acked: &Acked) -> anyhow::Result<usize> {
    let pending: Vec<(&str, &str)> = view["pending"]["items"]
        .as_array()
        .context("pending items")?
        .iter()
        .map(|p| (p["id"].as_str().unwrap_or_default(), p["text"].as_str().unwrap_or_default()))
        .collect();
    let messages = view["messages"].as_array().context("messages")?;
    let running = view["conversation"]["turn_running"] == true;
    let mut order = Vec::new();
    let mut stored = 0;
    for (i, m) in messages.iter().enumerate() {
        let text = text_of(m);
        let Some((id, _)) = acked.iter().find(|(_, t)| *t == text).filter(|_| m["role"] == "user") else { continue };
        ensure!(m["id"] == id.as_str(), "item {text:?} is stored under another id: {m}");
        let reply = messages.get(i + 1).context("a user message without its assistant message")?;
        ensure!(reply["role"] == "assistant", "{text:?} is followed by {reply}");
        let last = i + 2 == messages.len();
        ensure!(
            reply["status"] != "streaming" || (running && last),
            "the answer to {text:?} is streaming while no turn runs: {reply}"
        );
        order.push(text);
        stored += 1;
    }
    order.extend(pending.iter().filter(|(id, _)| acked.iter().any(|(a, _)| a == id)).map(|(_, t)| (*t).to_owned()));
    let sent: Vec<String> = acked.iter().map(|(_, t)| t.clone()).collect();
    ensure!(order == sent, "every acknowledged item once, in order: got {order:?}\nview: {view}");
    Ok(stored)
}

/// A conversation whose first turn hangs and is interrupted with [`QUEUED`] items sent during
/// it: the queue is paused, every item acknowledged (202 `pending`).
async fn queue_behind_a_stopped_turn(api: &Api) -> anyhow::Result<(String, Acked)> {
    let id = rest_create(api).await?["id"].as_str().context("id")?.to_owned();
    let first = rest_send(api, &id, "say:first\nhang").await?;
    ensure!(first["message"].is_object(), "the first message starts a turn: {first}");
    let mut acked = Vec::new();
    for i in 0..QUEUED {
        let r = rest_send(api, &id, &format!("say:m{i}")).await?;
        let p = &r["pending"];
        ensure!(p.is_object(), "message {i} is queued: {r}");
        acked.push((p["id"].as_str().context("id")?.to_owned(), p["text"].as_str().context("text")?.to_owned()));
    }
    let r = api.post(&format!("/v1/conversations/{id}/interrupt")).reply().await?.ok_json()?;
    ensure!(r["interrupted"] == true, "{r}");
    let v = view(api, &id).await?;
    ensure!(v["pending"]["paused"] == true && check(&v, &acked)? == 0, "paused with every item: {v}");
    Ok((id, acked))
}

/// `PUT …/pending` resuming the queue as it stands, in a task of its own: with the engine held
/// at a pause point the request waits there (or fails when the chat service is killed under
/// it). Its status.
async fn resume(api: &Api, id: &str) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<u16>>> {
    let v = view(api, id).await?;
    let items: Vec<Value> = v["pending"]["items"]
        .as_array()
        .context("items")?
        .iter()
        .map(|p| json!({"id": p["id"], "text": p["text"]}))
        .collect();
    let req = api
        .request(Method::PUT, &format!("/v1/conversations/{id}/pending"))
        .json(&json!({"items": items, "paused": false}));
    Ok(tokio::spawn(async move { Ok(req.reply().await?.status.as_u16()) }))
}

/// After the drain: every item ran once, in order, and its answer is stored `complete` with the
/// text its script says.
fn every_answer_is_stored(v: &Value, acked: &Acked, failed: &[&str]) -> anyhow::Result<()> {
    ensure!(check(v, acked)? == acked.len(), "every item stored: {v}");
    let messages = v["messages"].as_array().context("messages")?;
    for (i, m) in messages.iter().enumerate().filter(|(_, m)| m["role"] == "user") {
        let text = text_of(m);
        let Some(said) = text.strip_prefix("say:").filter(|t| !t.contains('\n')) else { continue };
        let reply = &messages[i + 1];
        if failed.contains(&text.as_str()) {
            ensure!(reply["status"] == "failed", "the turn cut by the crash is failed: {reply}");
        } else {
            ensure!(reply["status"] == "complete" && text_of(reply).trim() == said, "the answer to {text:?}: {reply}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_chat_before_and_after_a_pending_item_starts_loses_and_repeats_nothing() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let (id, acked) = queue_behind_a_stopped_turn(&api).await?;

    // Killed with the next item chosen and nothing written: it is still pending.
    chat::arm(&home, Step::TakePending)?;
    let put = resume(&api, &id).await?;
    assert_eq!(chat::reached(&home, Step::TakePending, BUDGET).await?, id);
    let old = kill(&api, "chat").await?;
    healthy_pid(&api, "chat", old).await?;
    let put = put.await??;
    assert!(put >= 500, "the resume died with the service: {put}");
    let v = view(&api, &id).await?;
    assert_eq!(check(&v, &acked)?, 0, "nothing started");
    assert_eq!(v["pending"]["paused"], true, "restored paused: {v}");

    // Killed right after the item's turn started in the store: it is a stored user message,
    // once, and its answer is a stored failure (the restart rule), not a `streaming` leftover.
    chat::arm(&home, Step::PendingTaken)?;
    let put = resume(&api, &id).await?;
    assert_eq!(chat::reached(&home, Step::PendingTaken, BUDGET).await?, id);
    let old = kill(&api, "chat").await?;
    healthy_pid(&api, "chat", old).await?;
    put.await??;
    let v = view(&api, &id).await?;
    assert_eq!(check(&v, &acked)?, 1, "exactly the first item started");
    let messages = v["messages"].as_array().context("messages")?;
    let answer = messages.last().context("answer")?;
    assert_eq!((&answer["role"], &answer["status"]), (&json!("assistant"), &json!("failed")), "{answer}");

    // The rest drains once the owner resumes: each item once, in order, each answer stored.
    let status = resume(&api, &id).await?.await??;
    assert_eq!(status, 200);
    let v = drained(&api, &id).await?;
    every_answer_is_stored(&v, &acked, &["say:m0"])?;
    assert_eq!(v["conversation"]["message_count"], json!(2 + 2 * QUEUED as u64));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_restarts_before_and_after_a_pending_item_starts_lose_and_repeat_nothing() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let (id, acked) = queue_behind_a_stopped_turn(&api).await?;
    let restarts = api.service("store").await?["restarts"].as_u64().unwrap_or(0);

    // The store dies under the move (StartTurn in flight), and again right after it (the
    // engine let go at once, its next reads and writes meet a store coming back).
    chat::arm(&home, Step::TakePending)?;
    chat::arm(&home, Step::PendingTaken)?;
    let put = resume(&api, &id).await?;
    assert_eq!(chat::reached(&home, Step::TakePending, BUDGET).await?, id);
    kill_store_under_the_next_write(&api, &home, Step::TakePending).await?;
    assert_eq!(chat::reached(&home, Step::PendingTaken, BUDGET).await?, id);
    kill(&api, "store").await?;
    chat::release(&home, Step::PendingTaken)?;
    assert_eq!(put.await??, 200, "the owner's resume went through");
    home.wait_for_log_line("chat", &["retrying", "start the turn"], BUDGET).await?;
    let v = drained(&api, &id).await?;
    every_answer_is_stored(&v, &acked, &[])?;
    assert_eq!(v["conversation"]["message_count"], json!(2 + 2 * QUEUED as u64), "nothing twice");
    let after = api.service("store").await?["restarts"].as_u64().unwrap_or(0);
    assert!(after >= restarts + 2, "the store was restarted twice: {restarts} → {after}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_restart_at_the_end_of_a_turn_delays_turn_done_until_the_answer_is_stored() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let id = rest_create(&api).await?["id"].as_str().context("id")?.to_owned();
    let mut cl = chat::client(&api).await?;
    let mut w = chat::watch(&mut cl, &id, 0).await?;

    // The store is frozen, the engine let go, and once the answer's write is in the frozen
    // store's receive queue the store is killed: the write in flight fails, every time.
    chat::arm(&home, Step::FinalWrite)?;
    rest_send(&api, &id, "say:the answer survives").await?;
    assert_eq!(chat::reached(&home, Step::FinalWrite, BUDGET).await?, id);
    kill_store_under_the_next_write(&api, &home, Step::FinalWrite).await?;
    let events = w.turn().await?;
    let end = events.last().context("the turn's end")?;
    let Some(coffer_proto::chat::event::Kind::TurnDone(done)) = &end.kind else { anyhow::bail!("{end:?}") };
    let answer = done.message.as_ref().context("the stored message")?;
    assert_eq!(chat::message_text(answer), "the answer survives");
    assert_eq!(answer.status, coffer_proto::chat::MessageStatus::Complete as i32);

    // What turn_done named is what the store holds.
    let v = view(&api, &id).await?;
    let messages = v["messages"].as_array().context("messages")?;
    assert_eq!(messages.len(), 2, "{v}");
    assert_eq!((&messages[1]["id"], &messages[1]["status"]), (&json!(answer.id), &json!("complete")), "{v}");
    assert_eq!(text_of(&messages[1]), "the answer survives");
    home.wait_for_log_line("chat", &["retrying", "store the answer"], BUDGET).await?;
    assert_eq!(v["conversation"]["turn_running"], false);

    // The conversation goes on; the event numbers kept moving forward.
    rest_send(&api, &id, "say:and again").await?;
    let next = w.turn().await?;
    assert_eq!(chat::text(&next), "and again");
    assert!(next.first().context("an event")?.seq > end.seq, "seqs never go backwards");
    Ok(())
}
