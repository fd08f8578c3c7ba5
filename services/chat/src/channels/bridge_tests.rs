//! The bridge over the real engine and the in-memory store of `crate::tests` (loopback gRPC),
//! with the scripted `tiny` agent (`say:<words>`, `hang`) and a replier that records what a chat
//! would show.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::store::{ChannelKind, ChannelRecord};
use futures_util::future::BoxFuture;
use tokio::sync::{Notify, watch};

use super::Bridge;
use crate::channels::{ChannelError, Inbound, Replier, TurnState, TurnView};
use crate::tests::{Rig, rig};

/// What the chat saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Shown {
    Notice(String, String),
    /// chat, the final snapshot, how many distinct snapshots were seen before it.
    Turn(String, TurnView),
}

#[derive(Default)]
struct Recorder {
    shown: Mutex<Vec<Shown>>,
    changed: Notify,
}

impl Recorder {
    fn push(&self, s: Shown) {
        self.shown.lock().unwrap().push(s);
        self.changed.notify_waiters();
    }

    fn all(&self) -> Vec<Shown> {
        self.shown.lock().unwrap().clone()
    }

    /// Waits (10 s at most) until `n` things were shown; returns them all.
    async fn until(&self, n: usize) -> Vec<Shown> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let wait = self.changed.notified();
            let now = self.all();
            if now.len() >= n {
                return now;
            }
            assert!(tokio::time::timeout_at(deadline, wait).await.is_ok(), "only {} shown: {now:#?}", now.len());
        }
    }

    fn notices(&self) -> Vec<String> {
        self.all()
            .into_iter()
            .filter_map(|s| match s {
                Shown::Notice(_, t) => Some(t),
                Shown::Turn(..) => None,
            })
            .collect()
    }

    fn turns(&self) -> Vec<TurnView> {
        self.all()
            .into_iter()
            .filter_map(|s| match s {
                Shown::Turn(_, v) => Some(v),
                Shown::Notice(..) => None,
            })
            .collect()
    }
}

impl Replier for Recorder {
    fn notice<'a>(&'a self, chat_id: &'a str, text: &'a str) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(async move {
            self.push(Shown::Notice(chat_id.to_owned(), text.to_owned()));
            Ok(())
        })
    }

    fn turn<'a>(
        &'a self,
        chat_id: &'a str,
        mut views: watch::Receiver<TurnView>,
    ) -> BoxFuture<'a, Result<(), ChannelError>> {
        Box::pin(async move {
            loop {
                let v = views.borrow_and_update().clone();
                if v.state.is_final() {
                    self.push(Shown::Turn(chat_id.to_owned(), v));
                    return Ok(());
                }
                if views.changed().await.is_err() {
                    return Ok(());
                }
            }
        })
    }
}

fn channel(r: &Rig, owner: &str) -> ChannelRecord {
    let cwd = r._home.path().display().to_string();
    ChannelRecord {
        name: "tg".into(),
        kind: ChannelKind::Telegram as i32,
        enabled: true,
        default_agent: "tiny".into(),
        agent_config_json: format!(r#"{{"cwd":{cwd:?},"model":"m1"}}"#),
        owner_id: owner.into(),
        ..Default::default()
    }
}

fn msg(from: &str, text: &str) -> Inbound {
    Inbound {
        channel: "tg".into(),
        chat_id: from.into(),
        sender_id: from.into(),
        sender_display: format!("user {from}"),
        text: text.into(),
        message_id: String::new(),
        group: false,
    }
}

#[tokio::test]
async fn strangers_are_refused_once_and_audited_without_content_then_pairing_makes_an_owner() {
    let r = rig(600).await;
    r.fake.db().pairing = Some(("GOODCODE".into(), 5));
    let rec = Arc::new(Recorder::default());
    let bridge = Bridge::new(r.engine.clone(), rec.clone());
    let ch = channel(&r, "");
    bridge.handle(&ch, msg("100", "secret plans")).await.unwrap();
    bridge.handle(&ch, msg("100", "more secret plans")).await.unwrap();
    let n = rec.notices();
    assert_eq!(n.len(), 1, "one refusal per sender: {n:?}");
    assert!(n[0].contains("not paired"), "{n:?}");
    let audit = r.fake.db().audit.clone();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (audit[0].actor.as_str(), audit[0].action.as_str(), audit[0].target.as_str()),
        ("channel", "channel.refused", "tg")
    );
    assert!(audit[0].detail.contains("\"100\"") && !audit[0].detail.contains("secret"), "{}", audit[0].detail);
    assert!(r.fake.db().convs.is_empty(), "nothing reached a conversation");

    bridge.handle(&ch, msg("100", "/pair WRONG")).await.unwrap();
    assert!(rec.notices().last().unwrap().contains("4 tries left"), "{:?}", rec.notices());
    bridge.handle(&ch, msg("100", "/pair goodcode")).await.unwrap();
    assert!(rec.notices().last().unwrap().starts_with("Paired"), "{:?}", rec.notices());
    assert_eq!(r.fake.db().owner.as_deref(), Some("100"));
    bridge.handle(&ch, msg("100", "/pair goodcode")).await.unwrap();
    let last = rec.notices().last().unwrap().clone();
    assert!(last.contains("Pairing failed: no code is waiting") && !last.contains("tg"), "{:?}", rec.notices());
    // Said once per sender: a repeated refused claim gets no answer.
    let before = rec.notices().len();
    bridge.handle(&ch, msg("100", "/pair goodcode")).await.unwrap();
    assert_eq!(rec.notices().len(), before, "{:?}", rec.notices());

    // The owner is heard at once (the adapter's record is still the unpaired one); others not.
    bridge.handle(&ch, msg("100", "say:hi there")).await.unwrap();
    bridge.handle(&ch, msg("200", "let me in")).await.unwrap();
    bridge.handle(&ch, msg("200", "please")).await.unwrap();
    let all = rec.until(6).await;
    let turns = rec.turns();
    assert_eq!(turns.len(), 1, "{all:#?}");
    assert_eq!(turns[0].text, "hi there ");
    assert_eq!(turns[0].state, TurnState::Done { stop_reason: "end_turn".into() });
    let refusals: Vec<_> = rec.notices().into_iter().filter(|n| n.contains("only answers its owner")).collect();
    assert_eq!(refusals.len(), 1, "{:?}", rec.notices());
    let conv = r.fake.db().convs.values().next().cloned().unwrap();
    assert_eq!(
        (conv.channel_name.as_str(), conv.peer_chat_id.as_str(), conv.agent_key.as_str()),
        ("tg", "100", "tiny")
    );
    assert!(conv.agent_config_json.contains("\"model\":\"m1\""), "{}", conv.agent_config_json);
    let user = r.fake.db().messages[&conv.id][0].clone();
    assert_eq!(user.source, "channel:tg");
    // Unpaired elsewhere (the CLI): the next message is refused at once, no restart needed.
    r.fake.db().owner = Some(String::new());
    bridge.handle(&ch, msg("100", "say:after the unpairing")).await.unwrap();
    assert!(rec.notices().last().unwrap().contains("not paired"), "{:?}", rec.notices());
    assert_eq!(r.fake.db().messages[&conv.id].len(), 2, "nothing more reached the conversation");
}

#[tokio::test]
async fn commands_drive_the_bound_conversation_and_queued_turns_show_in_order() {
    let r = rig(600).await;
    let rec = Arc::new(Recorder::default());
    let bridge = Bridge::new(r.engine.clone(), rec.clone());
    let ch = channel(&r, "7");
    bridge.handle(&ch, msg("7", "/status")).await.unwrap();
    assert!(rec.notices()[0].contains("No conversation yet"), "{:?}", rec.notices());
    bridge.handle(&ch, msg("7", "hang")).await.unwrap();
    said_something(&r).await;
    bridge.handle(&ch, msg("7", "say:second")).await.unwrap();
    bridge.handle(&ch, msg("7", "say:third")).await.unwrap();
    let n = rec.notices();
    assert_eq!(&n[1..], ["Queued (1 ahead).", "Queued (2 ahead)."], "{n:?}");
    bridge.handle(&ch, msg("7", "/queue")).await.unwrap();
    let q = rec.notices().pop().unwrap();
    assert!(q.contains("1. say:second") && q.contains("2. say:third"), "{q}");
    bridge.handle(&ch, msg("7", "/status")).await.unwrap();
    let s = rec.notices().pop().unwrap();
    assert!(s.contains("Turn: running") && s.contains("Queue: 2") && s.contains("Model: m1"), "{s}");
    bridge.handle(&ch, msg("7", "/stop")).await.unwrap();
    assert!(rec.notices().pop().unwrap().starts_with("Stopped"));
    let shown = rec.until(7).await;
    let turns = rec.turns();
    assert_eq!(turns.len(), 1, "{shown:#?}");
    assert_eq!((turns[0].text.as_str(), &turns[0].state), ("partial ", &TurnState::Interrupted));
    bridge.handle(&ch, msg("7", "/stop")).await.unwrap();
    assert_eq!(rec.notices().pop().unwrap(), "Nothing is running.");
    bridge.handle(&ch, msg("7", "/resume")).await.unwrap();
    assert_eq!(rec.notices().pop().unwrap(), "Resumed: 2 queued.");
    rec.until(11).await;
    let texts: Vec<String> = rec.turns().into_iter().map(|t| t.text).collect();
    assert_eq!(texts, ["partial ", "second ", "third "], "in order, one turn each");

    bridge.handle(&ch, msg("7", "/model  m2 ")).await.unwrap();
    assert!(rec.notices().pop().unwrap().starts_with("Model set to m2"));
    let first = r.fake.db().convs.values().next().cloned().unwrap();
    assert!(first.agent_config_json.contains("\"model\":\"m2\""), "{}", first.agent_config_json);

    bridge.handle(&ch, msg("7", "/new")).await.unwrap();
    assert!(rec.notices().pop().unwrap().starts_with("New conversation with tiny (model: m1)"));
    bridge.handle(&ch, msg("7", "say:fresh")).await.unwrap();
    rec.until(14).await;
    let second = {
        let db = r.fake.db();
        assert_eq!(db.convs.len(), 2);
        let second = db.convs.values().find(|c| c.id != first.id).cloned().unwrap();
        assert_eq!(db.messages[&second.id].len(), 2, "the new one took the message");
        assert_eq!(db.messages[&first.id].len(), 6, "the first kept its three turns");
        second
    };
    assert_eq!(rec.turns().last().unwrap().text, "fresh ");

    // A turn started elsewhere (the web page) on the bound conversation shows in the chat too.
    r.engine.send(&second.id, "say:from the web".into(), "web".into()).await.unwrap();
    rec.until(15).await;
    let last = rec.turns().pop().unwrap();
    assert_eq!((last.text.as_str(), last.conversation_id.as_str()), ("from the web ", second.id.as_str()));
    bridge.handle(&ch, msg("7", "/help")).await.unwrap();
    assert!(rec.notices().pop().unwrap().contains("/resume"));
}

#[tokio::test]
async fn a_dropped_bridge_shows_nothing_more_and_a_new_one_resumes_the_in_flight_turn() {
    let r = rig(600).await;
    let rec = Arc::new(Recorder::default());
    let bridge = Bridge::new(r.engine.clone(), rec.clone());
    let ch = channel(&r, "7");
    bridge.handle(&ch, msg("7", "hang")).await.unwrap();
    let id = r.fake.db().convs.keys().next().cloned().unwrap();
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    while !matches!(sub.next().await.unwrap().kind, Some(coffer_proto::chat::event::Kind::TextDelta(_))) {}
    drop(bridge);
    // The adapter restarted: the new bridge follows the owner's chat before it says anything.
    let rec2 = Arc::new(Recorder::default());
    let bridge2 = Bridge::new(r.engine.clone(), rec2.clone());
    bridge2.resume(&ch).await.unwrap();
    r.engine.interrupt(&id).await.unwrap();
    rec2.until(1).await;
    assert_eq!(rec2.turns()[0].state, TurnState::Interrupted);
    assert_eq!(rec2.turns()[0].text, "partial ");
    assert!(rec.all().is_empty(), "the dropped bridge sent nothing: {:?}", rec.all());
    // Bad input: an over-long message is refused with a notice naming the limit.
    let long = "x".repeat(crate::engine::MAX_TEXT_BYTES + 1);
    bridge2.handle(&ch, msg("7", &long)).await.unwrap();
    assert!(rec2.notices().pop().unwrap().contains("1 MiB"));
    bridge2.handle(&ch, msg("7", "/pair")).await.unwrap();
    assert!(rec2.notices().pop().unwrap().contains("followed by the code"));
}

#[tokio::test]
async fn after_new_the_old_in_flight_turn_is_still_shown_first_then_the_new_conversations() {
    let r = rig(600).await;
    let rec = Arc::new(Recorder::default());
    let bridge = Bridge::new(r.engine.clone(), rec.clone());
    let ch = channel(&r, "7");
    bridge.handle(&ch, msg("7", "hang")).await.unwrap();
    let old = r.fake.db().convs.keys().next().cloned().unwrap();
    bridge.handle(&ch, msg("7", "/new")).await.unwrap();
    bridge.handle(&ch, msg("7", "say:fresh one")).await.unwrap();
    // The fresh turn ended, but the chat shows turns in order: the old one must end first.
    let fresh = r.fake.db().convs.keys().find(|k| **k != old).cloned().unwrap();
    let mut sub = r.engine.subscribe(&fresh, 0).await.unwrap();
    let _ = sub.next().await;
    assert!(rec.turns().is_empty(), "nothing shown while the old turn runs: {:?}", rec.all());
    r.engine.interrupt(&old).await.unwrap();
    rec.until(3).await;
    let turns = rec.turns();
    assert_eq!(turns.len(), 2, "{:?}", rec.all());
    assert_eq!((turns[0].conversation_id.as_str(), &turns[0].state), (old.as_str(), &TurnState::Interrupted));
    assert_eq!((turns[1].conversation_id.as_str(), turns[1].text.as_str()), (fresh.as_str(), "fresh one "));
    // The old conversation is no longer followed: a web turn there is not shown in the chat.
    r.engine.send(&old, "say:elsewhere".into(), "web".into()).await.unwrap();
    bridge.handle(&ch, msg("7", "say:marker")).await.unwrap();
    rec.until(4).await;
    assert_eq!(rec.turns().last().unwrap().text, "marker ");
    assert!(rec.turns().iter().all(|t| t.text != "elsewhere "), "{:?}", rec.turns());
}

/// Waits (10 s at most) until the rig's one conversation's turn has said something: its agent
/// started (a turn first waits for the snapshot of its folder, `crate::changes`).
async fn said_something(r: &Rig) {
    let id = r.fake.db().convs.keys().next().cloned().expect("a conversation");
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.unwrap().unwrap();
        if matches!(e.kind, Some(coffer_proto::chat::event::Kind::TextDelta(_))) {
            return;
        }
    }
}

/// Sets the rig's `chat.notify_after_s` (the settings follower's job in the service).
fn notify_after(r: &Rig, seconds: u64) {
    let values = std::collections::HashMap::from([
        ("chat.turn_timeout_s".to_owned(), "600".to_owned()),
        ("chat.notify_after_s".to_owned(), seconds.to_string()),
    ]);
    r._config.send_replace(Arc::new(crate::config::Config::from_values(&values)));
}

#[tokio::test]
async fn now_interrupts_and_runs_next_and_after_a_stop_the_next_message_runs_at_once() {
    let r = rig(600).await;
    let rec = Arc::new(Recorder::default());
    let bridge = Bridge::new(r.engine.clone(), rec.clone());
    let ch = channel(&r, "7");
    bridge.handle(&ch, msg("7", "/now")).await.unwrap();
    assert!(rec.notices()[0].starts_with("Send /now followed by your message"), "{:?}", rec.notices());
    bridge.handle(&ch, msg("7", "hang")).await.unwrap();
    said_something(&r).await;
    bridge.handle(&ch, msg("7", "say:queued")).await.unwrap();
    bridge.handle(&ch, msg("7", "/now say:instead")).await.unwrap();
    assert_eq!(rec.notices().len(), 2, "a send-now is not acknowledged, its turn shows: {:?}", rec.notices());
    rec.until(5).await;
    let turns: Vec<(String, TurnState)> = rec.turns().into_iter().map(|t| (t.text, t.state)).collect();
    let done = TurnState::Done { stop_reason: "end_turn".into() };
    assert_eq!(
        turns,
        [
            ("partial ".to_owned(), TurnState::Interrupted),
            ("instead ".to_owned(), done.clone()),
            ("queued ".to_owned(), done.clone())
        ],
        "interrupted, the /now text next, then the queue"
    );

    // /stop with one queued: said; the next message runs at once, the queued one waits.
    bridge.handle(&ch, msg("7", "hang")).await.unwrap();
    bridge.handle(&ch, msg("7", "say:waits")).await.unwrap();
    bridge.handle(&ch, msg("7", "/stop")).await.unwrap();
    let stopped = rec.notices().pop().unwrap();
    assert_eq!(
        stopped,
        "Stopped. Your next message runs at once; 1 queued waits: /resume runs them, /queue shows them."
    );
    rec.until(8).await;
    let before = rec.notices().len();
    bridge.handle(&ch, msg("7", "say:redirected")).await.unwrap();
    rec.until(9).await;
    assert_eq!(rec.turns().last().unwrap().text, "redirected ");
    assert_eq!(rec.notices().len(), before, "not queued: {:?}", rec.notices());
    bridge.handle(&ch, msg("7", "/queue")).await.unwrap();
    assert!(rec.notices().pop().unwrap().contains("1. say:waits"));
    // Sent while the paused item waits: it runs at once too, then joins behind it when stopped.
    bridge.handle(&ch, msg("7", "hang")).await.unwrap();
    bridge.handle(&ch, msg("7", "say:also")).await.unwrap();
    bridge.handle(&ch, msg("7", "/stop")).await.unwrap();
    assert!(rec.notices().pop().unwrap().contains("2 queued wait:"), "{:?}", rec.notices());
    bridge.handle(&ch, msg("7", "/help")).await.unwrap();
    assert!(rec.notices().pop().unwrap().contains("/now <text>"));
}

#[tokio::test]
async fn a_turn_past_notify_after_is_announced_with_a_new_message_after_its_output() {
    let r = rig(600).await;
    let rec = Arc::new(Recorder::default());
    let bridge = Bridge::new(r.engine.clone(), rec.clone());
    let ch = channel(&r, "7");
    // The default (30 s): a short turn says nothing more.
    bridge.handle(&ch, msg("7", "say:quick")).await.unwrap();
    rec.until(1).await;
    // 0: every turn, done, interrupted or failed, right after its output.
    notify_after(&r, 0);
    bridge.handle(&ch, msg("7", "say:slow")).await.unwrap();
    let shown = rec.until(3).await;
    assert!(matches!(&shown[1], Shown::Turn(_, v) if v.text == "slow "), "{shown:#?}");
    assert!(matches!(&shown[2], Shown::Notice(c, t) if c == "7" && t == "Done in 0s"), "{shown:#?}");
    bridge.handle(&ch, msg("7", "hang")).await.unwrap();
    bridge.handle(&ch, msg("7", "/stop")).await.unwrap();
    rec.until(6).await;
    assert!(rec.notices().contains(&"Interrupted after 0s".to_owned()), "{:?}", rec.notices());
    bridge.handle(&ch, msg("7", "fail:the model API answered 500")).await.unwrap();
    rec.until(8).await;
    assert_eq!(rec.notices().pop().unwrap(), "Failed after 0s: the model API answered 500");
    // Back to an hour: nothing more.
    notify_after(&r, 3600);
    bridge.handle(&ch, msg("7", "say:quiet")).await.unwrap();
    rec.until(9).await;
    bridge.handle(&ch, msg("7", "/status")).await.unwrap();
    let all = rec.until(10).await;
    assert!(matches!(&all[8], Shown::Turn(_, v) if v.text == "quiet "), "{all:#?}");
    assert!(matches!(&all[9], Shown::Notice(_, t) if t.starts_with("Conversation:")), "{all:#?}");
}
