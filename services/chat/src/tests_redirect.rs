//! In-process tests of stop-then-send and send-now (issue 34 §3) on the real [`Engine`] over the
//! in-memory store of [`crate::tests`]: a message sent while no turn runs starts at once even
//! when the queue is paused (after a stop, a turn error, a restart), the waiting items stay
//! paused; send-now interrupts the turn in flight and runs next, before the queue.
use std::sync::Arc;
use std::time::Duration;

use coffer_proto::chat::event::Kind;
use coffer_proto::chat::send_message_reply::Outcome;
use coffer_proto::store::{MessageRole, MessageStatus};

use crate::engine::Engine;
use crate::tests::{Rig, Tiny, rig, said, stored_text, until_end};

/// The texts of the conversation's pending items, and whether the queue is paused.
async fn queue(r: &Rig, id: &str) -> (Vec<String>, bool) {
    let q = r.engine.pending(&r.engine.conv(id).await.unwrap()).await;
    (q.items.into_iter().map(|p| p.text).collect(), q.paused)
}

/// `(user text, assistant status)` of every turn stored, in order.
fn turns(r: &Rig, id: &str) -> Vec<(String, i32)> {
    let msgs = r.messages(id);
    msgs.chunks(2)
        .map(|p| {
            assert_eq!(p[0].role, MessageRole::User as i32, "{msgs:?}");
            (stored_text(&p[0]), p.get(1).map_or(-1, |a| a.status))
        })
        .collect()
}

const DONE: i32 = MessageStatus::Complete as i32;
const INTERRUPTED: i32 = MessageStatus::Interrupted as i32;
const FAILED: i32 = MessageStatus::Failed as i32;

/// Starts a `hang` turn with `queued` waiting behind it; returns once the turn streams.
async fn hanging_with(r: &Rig, id: &str, sub: &mut crate::bus::Subscription, queued: &[&str]) {
    r.engine.send(id, "hang".into(), "api".into()).await.unwrap();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.unwrap().unwrap();
        if matches!(e.kind, Some(Kind::TextDelta(_))) {
            break;
        }
    }
    for t in queued {
        let reply = r.engine.send(id, (*t).into(), "api".into()).await.unwrap();
        assert!(matches!(reply.outcome, Some(Outcome::Pending(_))), "{t} queues behind the running turn");
    }
}

#[tokio::test]
async fn after_a_stop_a_new_message_runs_at_once_and_the_waiting_items_stay_paused() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    hanging_with(&r, &id, &mut sub, &["say:a", "say:b"]).await;
    assert!(r.engine.interrupt(&id).await.unwrap());
    until_end(&mut sub).await;
    assert_eq!(queue(&r, &id).await, (vec!["say:a".into(), "say:b".into()], true));

    let reply = r.engine.send(&id, "say:do this instead".into(), "web".into()).await.unwrap();
    let Some(Outcome::Message(m)) = reply.outcome else { panic!("started at once: {reply:?}") };
    assert_eq!(m.source, "web");
    assert!(reply.queue.is_some_and(|q| q.paused && q.items.len() == 2), "the waiting items stay paused");
    let turn = until_end(&mut sub).await;
    assert_eq!(said(&turn).trim(), "do this instead");
    assert!(matches!(&turn.last().unwrap().kind, Some(Kind::TurnDone(_))));
    // Nothing else starts: the paused items wait for resume or discard.
    assert_eq!(queue(&r, &id).await, (vec!["say:a".into(), "say:b".into()], true));
    assert!(!r.engine.view(&r.engine.store().get(&id).await.unwrap()).turn_running);
    assert_eq!(turns(&r, &id), [("hang".into(), INTERRUPTED), ("say:do this instead".into(), DONE)]);

    // A message sent during the new turn queues behind the paused items; resume runs them all.
    hanging_with(&r, &id, &mut sub, &["say:c"]).await;
    assert_eq!(queue(&r, &id).await.0, ["say:a", "say:b", "say:c"]);
    r.engine.interrupt(&id).await.unwrap();
    until_end(&mut sub).await;
    let items = r.engine.pending(&r.engine.conv(&id).await.unwrap()).await.items;
    r.engine.set_pending(&id, items, false).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(said(&until_end(&mut sub).await).trim().to_owned());
    }
    assert_eq!(got, ["a", "b", "c"]);
}

#[tokio::test]
async fn a_stop_with_nothing_waiting_leaves_no_pause_behind_the_next_message() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    hanging_with(&r, &id, &mut sub, &[]).await;
    r.engine.interrupt(&id).await.unwrap();
    until_end(&mut sub).await;
    assert_eq!(queue(&r, &id).await, (vec![], true), "an interrupt pauses");
    // The redirect starts at once, and the empty pause is over: what is sent during its turn
    // runs after it.
    let reply = r.engine.send(&id, "hang".into(), "api".into()).await.unwrap();
    assert!(matches!(reply.outcome, Some(Outcome::Message(_))));
    assert_eq!(queue(&r, &id).await, (vec![], false));
    r.engine.send(&id, "say:then this".into(), "api".into()).await.unwrap();
    // A stop pauses again; resume runs the waiting one.
    r.engine.interrupt(&id).await.unwrap();
    until_end(&mut sub).await;
    assert_eq!(queue(&r, &id).await, (vec!["say:then this".into()], true));
}

#[tokio::test]
async fn after_a_turn_error_a_new_message_runs_at_once() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "fail:the model API answered 500".into(), "api".into()).await.unwrap();
    let ev = until_end(&mut sub).await;
    assert!(matches!(&ev.last().unwrap().kind, Some(Kind::TurnError(_))), "{ev:?}");
    assert!(queue(&r, &id).await.1, "a turn error pauses");
    let reply = r.engine.send(&id, "say:try again".into(), "api".into()).await.unwrap();
    assert!(matches!(reply.outcome, Some(Outcome::Message(_))), "{reply:?}");
    assert_eq!(said(&until_end(&mut sub).await).trim(), "try again");
    assert_eq!(turns(&r, &id)[1], ("say:try again".into(), DONE));
}

#[tokio::test]
async fn after_a_restart_a_new_message_runs_at_once_and_the_restored_queue_stays_paused() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    hanging_with(&r, &id, &mut sub, &["say:waiting"]).await;
    // A second engine over the same store, as the chat service after a crash: the cut turn is
    // failed, the queue restored paused.
    let (_keep, rx) = tokio::sync::watch::channel(Arc::new(crate::config::Config::default()));
    let registry = Arc::new(crate::providers::Registry::new(
        vec![crate::providers::Entry::new(Arc::new(Tiny))],
        r._home.path().to_path_buf(),
    ));
    let engine = Engine::new(r.engine.store().clone(), registry, rx, r._home.path().to_path_buf());
    engine.recover().await.unwrap();
    let q = engine.pending(&engine.conv(&id).await.unwrap()).await;
    assert!(q.paused && q.items.len() == 1, "{q:?}");
    let mut sub2 = engine.subscribe(&id, 0).await.unwrap();
    let reply = engine.send(&id, "say:after the restart".into(), "api".into()).await.unwrap();
    assert!(matches!(reply.outcome, Some(Outcome::Message(_))), "{reply:?}");
    assert_eq!(said(&until_end(&mut sub2).await).trim(), "after the restart");
    let q = engine.pending(&engine.conv(&id).await.unwrap()).await;
    assert!(q.paused && q.items[0].text == "say:waiting", "{q:?}");
    assert_eq!(turns(&r, &id)[0].1, FAILED, "the cut turn");
    assert_eq!(turns(&r, &id)[1], ("say:after the restart".into(), DONE));
    // The first engine's hanging turn goes (its process would be gone).
    r.engine.delete(&id).await.ok();
}

#[tokio::test]
async fn send_now_interrupts_the_running_turn_and_runs_before_the_queue() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    hanging_with(&r, &id, &mut sub, &["say:queued"]).await;
    let reply = r.engine.send_now(&id, "say:now this".into(), "cli".into()).await.unwrap();
    let Some(Outcome::Message(m)) = reply.outcome else { panic!("{reply:?}") };
    assert_eq!(m.source, "cli");
    let hang = until_end(&mut sub).await;
    assert!(
        matches!(&hang.last().unwrap().kind, Some(Kind::TurnDone(d)) if d.stop_reason == "interrupted"),
        "{hang:?}"
    );
    assert_eq!(said(&until_end(&mut sub).await).trim(), "now this");
    // The queue was not paused by the send-now: its item runs next.
    assert_eq!(said(&until_end(&mut sub).await).trim(), "queued");
    assert_eq!(
        turns(&r, &id),
        [("hang".into(), INTERRUPTED), ("say:now this".into(), DONE), ("say:queued".into(), DONE)]
    );
    assert_eq!(stored_text(&r.messages(&id)[1]), "partial ", "the interrupted answer is kept");
}

#[tokio::test]
async fn send_now_leaves_a_paused_queue_paused() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    hanging_with(&r, &id, &mut sub, &["say:held"]).await;
    r.engine.interrupt(&id).await.unwrap();
    until_end(&mut sub).await;
    hanging_with(&r, &id, &mut sub, &[]).await;
    r.engine.send_now(&id, "say:redirected".into(), "api".into()).await.unwrap();
    until_end(&mut sub).await;
    assert_eq!(said(&until_end(&mut sub).await).trim(), "redirected");
    assert_eq!(queue(&r, &id).await, (vec!["say:held".into()], true));
}

#[tokio::test]
async fn send_now_while_idle_just_sends() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    let reply = r.engine.send_now(&id, "say:plain".into(), "api".into()).await.unwrap();
    assert!(matches!(reply.outcome, Some(Outcome::Message(_))));
    let turn = until_end(&mut sub).await;
    assert_eq!(said(&turn).trim(), "plain");
    assert!(!turn.iter().any(|e| matches!(&e.kind, Some(Kind::TurnDone(d)) if d.stop_reason == "interrupted")));
    assert_eq!(turns(&r, &id), [("say:plain".into(), DONE)]);
    let e = r.engine.send_now(&id, String::new(), "api".into()).await.unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
}

/// Two sends-now at once: the one the engine takes second runs; the first one's turn is
/// interrupted (whether or not it had started), as is the turn they both interrupted.
#[tokio::test]
async fn two_concurrent_sends_now_end_with_the_later_one_running() {
    for round in 0..5 {
        let r = rig(600).await;
        let id = r.conversation().await;
        let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
        hanging_with(&r, &id, &mut sub, &[]).await;
        let (x, y) = tokio::join!(
            r.engine.send_now(&id, "say:x".into(), "api".into()),
            r.engine.send_now(&id, "say:y".into(), "api".into())
        );
        assert!(matches!(x.unwrap().outcome, Some(Outcome::Message(_))));
        assert!(matches!(y.unwrap().outcome, Some(Outcome::Message(_))));
        // Three turns end: the hang, the earlier send-now (interrupted), the later one (done).
        let mut ends = Vec::new();
        while ends.len() < 3 {
            let turn = until_end(&mut sub).await;
            ends.push(turn.last().unwrap().kind.clone());
        }
        let t = turns(&r, &id);
        assert_eq!(t.len(), 3, "round {round}: {t:?}");
        assert_eq!(t[0], ("hang".into(), INTERRUPTED));
        assert_eq!(t[1].1, INTERRUPTED, "round {round}: the earlier one: {t:?}");
        assert_eq!(t[2].1, DONE, "round {round}: the later one runs: {t:?}");
        assert!(matches!(&ends[2], Some(Kind::TurnDone(d)) if d.stop_reason == "end_turn"), "{ends:?}");
        assert_eq!(queue(&r, &id).await, (vec![], false), "nothing queued, nothing paused");
        assert!(!r.engine.view(&r.engine.store().get(&id).await.unwrap()).turn_running);
    }
}

/// A stop reaches a turn that was announced but waits for the last one's task to drain (as
/// after a send-now): it ends `interrupted` and never runs.
#[tokio::test]
async fn a_stop_right_after_send_now_stops_the_new_turn_too() {
    let r = rig(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    hanging_with(&r, &id, &mut sub, &[]).await;
    r.engine.send_now(&id, "hang".into(), "api".into()).await.unwrap();
    assert!(r.engine.interrupt(&id).await.unwrap(), "the new turn, started or about to");
    until_end(&mut sub).await;
    let second = until_end(&mut sub).await;
    assert!(
        matches!(&second.last().unwrap().kind, Some(Kind::TurnDone(d)) if d.stop_reason == "interrupted"),
        "{second:?}"
    );
    assert_eq!(turns(&r, &id).iter().map(|t| t.1).collect::<Vec<_>>(), [INTERRUPTED, INTERRUPTED]);
    assert!(!r.engine.interrupt(&id).await.unwrap(), "nothing left to stop");
}
