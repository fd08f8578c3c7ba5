//! Stop, then redirect; send now (issue 34 §3), over REST and the CLI of a real daemon
//! (`coffer-test-daemon scripted-chat`): a message sent while no turn runs starts at once after a
//! stop, a turn error or a daemon restart, while the items already waiting stay paused;
//! `{"now": true}` / `coffer chat send --now` interrupts the running turn (kept `interrupted`)
//! and runs next, before the queue; two at once end with the later one running.
use std::time::Duration;

use anyhow::Context;
use coffer_proto::chat::event::Kind;
use coffer_tests::chat::{self, rest_create, rest_send};
use coffer_tests::{Api, SendExt, TestHome};
use serde_json::{Value, json};

/// `POST …/messages` with `now: true`; the reply's JSON.
async fn send_now(api: &Api, id: &str, text: &str) -> anyhow::Result<Value> {
    let r =
        api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": text, "now": true})).reply().await?;
    anyhow::ensure!(r.status == 202, "send now: {} {}", r.status, r.text);
    r.json()
}

/// The conversation as `GET /v1/conversations/{id}` shows it with its newest 50 messages.
async fn view(api: &Api, id: &str) -> anyhow::Result<Value> {
    api.get(&format!("/v1/conversations/{id}?messages=50")).reply().await?.ok_json()
}

/// The pending texts and whether the queue is paused.
fn queue_of(v: &Value) -> (Vec<String>, bool) {
    let items = v["pending"]["items"].as_array().cloned().unwrap_or_default();
    let texts = items.iter().filter_map(|i| i["text"].as_str().map(str::to_owned)).collect();
    (texts, v["pending"]["paused"] == true)
}

/// `(user text, assistant status)` of every turn shown, oldest first.
fn turns_of(v: &Value) -> Vec<(String, String)> {
    let msgs = v["messages"].as_array().cloned().unwrap_or_default();
    let text = |m: &Value| {
        m["blocks"]
            .as_array()
            .map(|b| b.iter().filter_map(|b| b["text"].as_str()).collect::<String>())
            .unwrap_or_default()
    };
    msgs.chunks(2)
        .map(|p| (text(&p[0]), p.get(1).and_then(|a| a["status"].as_str()).unwrap_or("none").to_owned()))
        .collect()
}

/// Starts `say:working\nhang` and waits until it streams; then queues `queued` behind it.
async fn hanging(api: &Api, w: &mut chat::Watch, id: &str, queued: &[&str]) -> anyhow::Result<()> {
    let r = rest_send(api, id, "say:working\nhang").await?;
    anyhow::ensure!(r["message"].is_object(), "started: {r}");
    w.until_kind("text_delta").await?;
    for t in queued {
        let r = rest_send(api, id, t).await?;
        anyhow::ensure!(r["pending"].is_object(), "{t} queues behind the running turn: {r}");
    }
    Ok(())
}

/// The stop reason of a turn's last event (`turn_done`), or the error code (`turn_error`).
fn ending(turn: &[coffer_proto::chat::Event]) -> String {
    match turn.last().and_then(|e| e.kind.as_ref()) {
        Some(Kind::TurnDone(d)) => d.stop_reason.clone(),
        Some(Kind::TurnError(e)) => format!("error:{}", e.code),
        other => format!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_stop_or_a_failed_turn_a_new_message_runs_at_once_and_the_waiting_ones_stay_paused()
-> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let id = rest_create(&api).await?["id"].as_str().context("id")?.to_owned();
    let mut w = chat::watch(&mut cl, &id, 0).await?;

    // Stop (REST) with one message waiting; the next message (REST) runs at once.
    hanging(&api, &mut w, &id, &["say:waiting"]).await?;
    let r = api.post(&format!("/v1/conversations/{id}/interrupt")).reply().await?.ok_json()?;
    assert_eq!(r, json!({"interrupted": true}));
    assert_eq!(ending(&w.turn().await?), "interrupted");
    let r = rest_send(&api, &id, "say:do this instead").await?;
    assert!(r["message"].is_object() && r.get("pending").is_none(), "started at once: {r}");
    assert_eq!(
        (r["queue"]["paused"].clone(), r["queue"]["items"][0]["text"].clone()),
        (json!(true), json!("say:waiting"))
    );
    let turn = w.turn().await?;
    assert_eq!((chat::text(&turn).trim(), ending(&turn).as_str()), ("do this instead", "end_turn"));
    let v = view(&api, &id).await?;
    assert_eq!(queue_of(&v), (vec!["say:waiting".to_owned()], true), "the waiting one stays paused");
    assert_eq!(v["conversation"]["turn_running"], false, "nothing else started");

    // A failed turn: the CLI's next message runs at once too.
    rest_send(&api, &id, "fail:provider the model API answered 500").await?;
    assert_eq!(ending(&w.turn().await?), "error:provider");
    let out = home.cli(&["chat", "send", &id, "say:try again"]).await?.ok()?;
    assert!(out.stdout.starts_with("Sent; the turn started"), "{out}");
    assert_eq!(chat::text(&w.turn().await?).trim(), "try again");

    // `coffer chat stop`, then `coffer chat send --watch`: the redirect runs and is followed.
    hanging(&api, &mut w, &id, &[]).await?;
    let out = home.cli(&["chat", "stop", &id]).await?.ok()?;
    assert!(out.stdout.contains("The next message you send runs at once"), "{out}");
    assert_eq!(ending(&w.turn().await?), "interrupted");
    let out = home.cli(&["chat", "send", &id, "say:redirected from the cli", "--watch"]).await?.ok()?;
    assert!(out.stdout.contains("redirected from the cli") && out.stdout.contains("✓ done"), "{out}");
    w.turn().await?;
    let v = view(&api, &id).await?;
    assert_eq!(queue_of(&v), (vec!["say:waiting".to_owned()], true), "still waiting for resume or discard");
    assert_eq!(
        turns_of(&v).into_iter().map(|t| t.1).collect::<Vec<_>>(),
        ["interrupted", "complete", "failed", "complete", "interrupted", "complete"]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_daemon_restart_a_new_message_runs_at_once_and_the_restored_queue_stays_paused() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let id = rest_create(&api).await?["id"].as_str().context("id")?.to_owned();
    let mut w = chat::watch(&mut cl, &id, 0).await?;
    hanging(&api, &mut w, &id, &["say:waiting"]).await?;
    drop(w);
    home.terminate_daemon(Duration::from_secs(20)).await?;

    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let v = view(&api, &id).await?;
    assert_eq!(queue_of(&v), (vec!["say:waiting".to_owned()], true), "restored paused: {v}");
    let mut w = chat::watch(&mut cl, &id, v["last_seq"].as_u64().context("last_seq")?).await?;
    let r = rest_send(&api, &id, "say:after the restart").await?;
    assert!(r["message"].is_object(), "started at once: {r}");
    assert_eq!(chat::text(&w.turn().await?).trim(), "after the restart");
    let v = view(&api, &id).await?;
    assert_eq!(queue_of(&v), (vec!["say:waiting".to_owned()], true));
    assert_eq!(turns_of(&v).into_iter().map(|t| t.1).collect::<Vec<_>>(), ["failed", "complete"], "{v}");
    // Resume runs what waited.
    let q = home.cli(&["chat", "pending", &id, "--resume", "--json"]).await?.ok()?.json()?;
    assert_eq!(q["paused"], false, "{q}");
    assert_eq!(chat::text(&w.turn().await?).trim(), "waiting");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_now_interrupts_the_turn_runs_next_before_the_queue_and_of_two_the_later_runs() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let mut cl = chat::client(&api).await?;
    let id = rest_create(&api).await?["id"].as_str().context("id")?.to_owned();
    let mut w = chat::watch(&mut cl, &id, 0).await?;

    // Idle: a plain send.
    let r = send_now(&api, &id, "say:idle now").await?;
    assert!(r["message"].is_object(), "{r}");
    let turn = w.turn().await?;
    assert_eq!((chat::text(&turn).trim(), ending(&turn).as_str()), ("idle now", "end_turn"));

    // Mid-turn with an item queued: the turn is interrupted (its partial answer kept), the
    // send-now runs next, then the queue goes on (it was not paused).
    hanging(&api, &mut w, &id, &["say:queued"]).await?;
    let r = send_now(&api, &id, "say:now this").await?;
    assert_eq!(r["message"]["blocks"][0]["text"], "say:now this", "{r}");
    assert_eq!(r["queue"], json!({"items": [r["queue"]["items"][0].clone()], "paused": false}), "{r}");
    let cut = w.turn().await?;
    assert_eq!(ending(&cut), "interrupted");
    let Some(Kind::TurnDone(d)) = &cut.last().context("end")?.kind else { unreachable!() };
    assert_eq!(chat::message_text(d.message.as_ref().context("message")?), "working");
    let next = w.turn().await?;
    assert_eq!(
        (chat::created_texts(&next), chat::text(&next).trim().to_owned()),
        (vec!["say:now this".to_owned()], "now this".to_owned())
    );
    assert_eq!(chat::text(&w.turn().await?).trim(), "queued");

    // The CLI's --now.
    hanging(&api, &mut w, &id, &[]).await?;
    let out = home.cli(&["chat", "send", &id, "--now", "say:from the cli"]).await?.ok()?;
    assert!(out.stdout.starts_with("Sent now: it runs next"), "{out}");
    assert_eq!(ending(&w.turn().await?), "interrupted");
    assert_eq!(chat::text(&w.turn().await?).trim(), "from the cli");

    // Two at once: the one taken second runs; the first's turn is interrupted (started or not).
    hanging(&api, &mut w, &id, &[]).await?;
    let (x, y) = tokio::join!(send_now(&api, &id, "say:x"), send_now(&api, &id, "say:y"));
    assert!(x?["message"].is_object() && y?["message"].is_object());
    let ends: Vec<String> = [w.turn().await?, w.turn().await?, w.turn().await?].iter().map(|t| ending(t)).collect();
    assert_eq!(ends, ["interrupted", "interrupted", "end_turn"]);
    let v = view(&api, &id).await?;
    let t = turns_of(&v);
    let last3 = &t[t.len() - 3..];
    assert_eq!(last3[0], ("say:working\nhang".to_owned(), "interrupted".to_owned()));
    assert_eq!(last3[1].1, "interrupted", "the earlier send-now: {t:?}");
    assert_eq!(last3[2].1, "complete", "the later one runs: {t:?}");
    let mut both = vec![last3[1].0.clone(), last3[2].0.clone()];
    both.sort();
    assert_eq!(both, ["say:x", "say:y"]);
    assert_eq!(queue_of(&v), (vec![], false));
    assert_eq!(v["conversation"]["turn_running"], false);

    // A bad `now` is refused naming the field.
    let r =
        api.post_json(&format!("/v1/conversations/{id}/messages"), &json!({"text": "x", "now": "yes"})).reply().await?;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.text.contains("now"), "{}", r.text);
    Ok(())
}
