//! In-process tests of approvals (`engine::approvals`): the real engine over the in-memory store
//! of [`crate::tests`], with the `tiny` agent's `ask:<Tool> <command>` lines.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use coffer_proto::chat::{self as c, Event, event::Kind};

use crate::engine::Tuning;
use crate::error::Error;
use crate::tests::{Rig, kind_name, rig_values, until_end};

async fn rig_with(approval_timeout_s: u64) -> Rig {
    let values = HashMap::from([
        ("chat.turn_timeout_s".to_owned(), "1".to_owned()),
        ("chat.approval_timeout_s".to_owned(), approval_timeout_s.to_string()),
    ]);
    rig_values(values, Tuning::default()).await
}

/// The next event of `kind`, skipping others.
async fn next_of(sub: &mut crate::bus::Subscription, kind: &str) -> Arc<Event> {
    loop {
        let e = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("an event").expect("open");
        if kind_name(&e) == kind {
            return e;
        }
    }
}

fn approval(e: &Event) -> c::Approval {
    match &e.kind {
        Some(Kind::ApprovalRequested(a)) => a.approval.clone().unwrap(),
        other => panic!("{other:?}"),
    }
}

fn resolved(e: &Event) -> c::ApprovalResolved {
    match &e.kind {
        Some(Kind::ApprovalResolved(r)) => r.clone(),
        other => panic!("{other:?}"),
    }
}

fn answer(id: &str, number: u64, decision: &str, message: &str) -> c::AnswerApprovalRequest {
    c::AnswerApprovalRequest {
        conversation_id: id.into(),
        number,
        decision: decision.into(),
        message: message.into(),
        source: "cli".into(),
        actor: "daemon token".into(),
    }
}

fn text(events: &[Arc<Event>]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::TextDelta(t)) => Some(t.text.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_request_waits_for_the_first_answer_and_is_audited() {
    let r = rig_with(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "ask:Bash rm -rf build\nask:Bash ls".into(), "api".into()).await.unwrap();
    let asked = next_of(&mut sub, "approval_requested").await;
    let a = approval(&asked);
    assert_eq!((a.number, a.tool.as_str(), a.summary.as_str()), (asked.seq, "Bash", "Bash: rm -rf build"));
    assert!(a.expires_ms - a.requested_ms == 600_000 && !a.cwd.is_empty(), "{a:?}");
    // The live state shows it waiting; the turn timeout (1 s) does not run meanwhile.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let conv = r.engine.conv(&id).await.unwrap();
    assert_eq!(r.engine.approvals(&conv).len(), 1);
    let rec = r.engine.store().get(&id).await.unwrap();
    assert_eq!(r.engine.view(&rec).approvals_waiting, 1);

    let first = r.engine.answer_approval(answer(&id, a.number, "deny", "not now")).await.unwrap();
    assert_eq!(
        (first.decision.as_str(), first.message.as_str(), first.decided_by.as_str()),
        ("deny", "not now", "cli")
    );
    let e = r.engine.answer_approval(answer(&id, a.number, "allow", "")).await.unwrap_err();
    let Error::AlreadyDecided(m, was) = e else { panic!("{e:?}") };
    assert!(m.contains("already decided: deny by cli"), "{m}");
    assert_eq!(was.decision, "deny");
    let e = r.engine.answer_approval(answer(&id, 999_999, "allow", "")).await.unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
    let e = r.engine.answer_approval(answer(&id, a.number, "maybe", "")).await.unwrap_err();
    assert!(e.to_string().contains("allow, allow_always, deny"), "{e}");

    let second = approval(&*next_of(&mut sub, "approval_requested").await);
    r.engine.answer_approval(answer(&id, second.number, "allow", "")).await.unwrap();
    let events = until_end(&mut sub).await;
    assert_eq!(text(&events), "approved ", "the first answer's text came before");
    assert_eq!(kind_name(events.last().unwrap()), "turn_done");
    let msgs = r.messages(&id);
    let blocks = format!("{:?}", msgs[1].blocks);
    assert!(blocks.contains("denied: not now") && blocks.contains("approved"), "{blocks}");
    // After the turn: decided, not found again.
    let e = r.engine.answer_approval(answer(&id, second.number, "deny", "")).await.unwrap_err();
    assert!(matches!(e, Error::AlreadyDecided(..)), "{e:?}");
    let audit: Vec<_> = r.fake.db().audit.iter().filter(|a| a.action == "chat.approval").cloned().collect();
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert_eq!(audit[0].actor, "cli");
    assert!(audit[0].detail.contains(r#""decision":"deny""#) && audit[0].detail.contains("daemon token"));
    let rec = r.engine.store().get(&id).await.unwrap();
    assert_eq!(r.engine.view(&rec).approvals_waiting, 0);
}

#[tokio::test]
async fn an_unanswered_request_times_out_denied() {
    let r = rig_with(1).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "ask:Bash touch x".into(), "api".into()).await.unwrap();
    let a = approval(&*next_of(&mut sub, "approval_requested").await);
    let res = resolved(&*next_of(&mut sub, "approval_resolved").await);
    assert_eq!((res.number, res.decision.as_str(), res.decided_by.as_str()), (a.number, "deny", "timeout"));
    assert!(res.message.contains("No answer within 1 s"), "{res:?}");
    let events = until_end(&mut sub).await;
    assert!(text(&events).starts_with("denied: No answer within"), "{}", text(&events));
    let e = r.engine.answer_approval(answer(&id, a.number, "allow", "")).await.unwrap_err();
    let Error::AlreadyDecided(_, first) = e else { panic!() };
    assert_eq!(first.decided_by, "timeout");
}

#[tokio::test]
async fn an_interrupt_denies_what_is_open() {
    let r = rig_with(600).await;
    let id = r.conversation().await;
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "ask:Bash sleep 100".into(), "api".into()).await.unwrap();
    let a = approval(&*next_of(&mut sub, "approval_requested").await);
    assert!(r.engine.interrupt(&id).await.unwrap());
    let res = resolved(&*next_of(&mut sub, "approval_resolved").await);
    assert_eq!((res.number, res.decision.as_str(), res.decided_by.as_str()), (a.number, "deny", "interrupt"));
    let done = next_of(&mut sub, "turn_done").await;
    let Some(Kind::TurnDone(d)) = &done.kind else { panic!() };
    assert_eq!(d.stop_reason, "interrupted");
    let conv = r.engine.conv(&id).await.unwrap();
    assert!(r.engine.approvals(&conv).is_empty());
}

#[tokio::test]
async fn read_only_denies_at_once_and_allow_always_remembers_the_tool() {
    let r = rig_with(600).await;
    let id = r.conversation().await;
    let set = |mode: &str| c::UpdateConversationRequest {
        id: id.clone(),
        permission_mode: Some(mode.into()),
        ..Default::default()
    };
    let e = r.engine.update_conversation(set("sometimes")).await.unwrap_err();
    assert!(e.to_string().contains("permission_mode") && e.to_string().contains("read_only"), "{e}");
    let c = r.engine.update_conversation(set("read-only")).await.unwrap();
    assert_eq!(c.agent_config.unwrap().permission_mode, "read_only");
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "ask:Bash rm x".into(), "api".into()).await.unwrap();
    let events = until_end(&mut sub).await;
    assert!(!events.iter().any(|e| kind_name(e).starts_with("approval")), "no event in read_only");
    assert!(text(&events).starts_with("denied: This conversation is read-only"), "{}", text(&events));

    r.engine.update_conversation(set("ask")).await.unwrap();
    r.engine.send(&id, "ask:Write a\nask:Write b\nask:Bash c".into(), "api".into()).await.unwrap();
    let a = approval(&*next_of(&mut sub, "approval_requested").await);
    assert_eq!(a.tool, "Write");
    r.engine.answer_approval(answer(&id, a.number, "allow_always", "")).await.unwrap();
    // The second Write is allowed without asking; the Bash asks.
    let b = approval(&*next_of(&mut sub, "approval_requested").await);
    assert_eq!(b.tool, "Bash");
    r.engine.answer_approval(answer(&id, b.number, "deny", "")).await.unwrap();
    until_end(&mut sub).await;
    let last = r.messages(&id).last().cloned().unwrap();
    let said = format!("{:?}", last.blocks);
    assert!(said.contains("approved approved denied: The user denied this action. "), "{said}");
    let remembered = r.fake.db().audit.iter().filter(|a| a.detail.contains(r#""decided_by":"remembered""#)).count();
    assert_eq!(remembered, 1);
}

#[tokio::test]
async fn tools_allowed_always_are_stored_and_forgotten_by_a_mode_change_or_on_request() {
    let r = rig_with(600).await;
    let id = r.conversation().await;
    let set = |mode: &str| c::UpdateConversationRequest {
        id: id.clone(),
        permission_mode: Some(mode.into()),
        ..Default::default()
    };
    let stored = |r: &Rig| r.fake.db().allowed.get(&id).map(|t| t.iter().map(|t| t.tool.clone()).collect::<Vec<_>>());
    let held = |r: &Rig, conv: &crate::engine::Conv| {
        r.engine.allowed_tools(conv).into_iter().map(|t| (t.tool, t.decided_by)).collect::<Vec<_>>()
    };
    r.engine.update_conversation(set("ask")).await.unwrap();
    let mut sub = r.engine.subscribe(&id, 0).await.unwrap();
    r.engine.send(&id, "ask:Bash a".into(), "api".into()).await.unwrap();
    let a = approval(&*next_of(&mut sub, "approval_requested").await);
    r.engine.answer_approval(answer(&id, a.number, "allow_always", "")).await.unwrap();
    until_end(&mut sub).await;
    assert_eq!(stored(&r), Some(vec!["Bash".to_owned()]), "stored before the agent went on");
    let conv = r.engine.conv(&id).await.unwrap();
    assert_eq!(held(&r, &conv), [("Bash".to_owned(), "cli".to_owned())]);
    // The same mode again keeps them; another mode forgets them.
    r.engine.update_conversation(set("ask")).await.unwrap();
    assert_eq!(held(&r, &conv).len(), 1);
    r.engine.update_conversation(set("bypass")).await.unwrap();
    assert!(held(&r, &conv).is_empty() && stored(&r).is_none(), "a mode change forgets them");
    let audited = r.fake.db().audit.iter().filter(|a| a.action == "chat.approval.forget").count();
    assert_eq!(audited, 1);
    // Forgotten on request (none left: 0), and an unknown conversation is NOT_FOUND.
    r.engine.update_conversation(set("ask")).await.unwrap();
    r.engine.send(&id, "ask:Edit b".into(), "api".into()).await.unwrap();
    let b = approval(&*next_of(&mut sub, "approval_requested").await);
    r.engine.answer_approval(answer(&id, b.number, "allow_always", "")).await.unwrap();
    until_end(&mut sub).await;
    assert_eq!(r.engine.forget_allowed_tools(&id, "cli").await.unwrap(), 1);
    assert_eq!(r.engine.forget_allowed_tools(&id, "cli").await.unwrap(), 0);
    assert!(held(&r, &conv).is_empty());
    let e = r.engine.forget_allowed_tools(&crate::engine::new_id(), "cli").await.unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e:?}");
}
