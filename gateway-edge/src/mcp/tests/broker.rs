//! The tool broker on the same seams: sessions per (caller, key) recording their actor,
//! policy as for any client, idle reaping and closing, malformed input, locating a tool.
use std::borrow::Cow;

use coffer_runtime::identity::Identity;

use super::*;
use crate::mcp::broker::{self, Broker, BrokerError, Failure, Located, MAX_SESSIONS_PER_CALLER};

async fn call(s: &Arc<Session>, name: &str, arguments: Value) -> Answer {
    let arguments = serde_json::value::to_raw_value(&arguments).unwrap();
    broker::call(s, ListKind::Tools, name, Some(&arguments)).await
}

#[tokio::test]
async fn a_broker_session_records_its_actor_and_obeys_policy_like_any_client() {
    let (up, url) = fake(&["echo", "add"], 0).await;
    let mut h = Harness::new(snapshot(vec![server("fs", &url)], &[("fs", Kind::Tool, "add", false)]));
    let b = Broker::new(h.shared.clone());
    let s = b.lease(Identity::Chat, "conversation-1", "agent").unwrap();
    assert_eq!(s.actor, "agent");
    assert!(s.id.starts_with("broker-"), "{}", s.id);
    let listed: Vec<String> = broker::list_enabled(&s, ListKind::Tools)
        .await
        .into_iter()
        .map(|l| l.item["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, ["coffer__search_tools", "fs__echo"], "the disabled tool is not listed");

    let out = result(call(&s, "fs__echo", json!({"message": "hi"})).await);
    assert_eq!(out["structuredContent"], json!({"name": "echo", "arguments": {"message": "hi"}}));
    let r = h.record();
    assert_eq!((r.target.as_str(), r.outcome.as_str(), r.actor.as_ref()), ("fs__echo", "ok", "agent"));
    assert_eq!(r.session_id, s.id);

    let e = error(call(&s, "fs__add", json!({})).await);
    assert_eq!((e.code, Failure::of(&e)), (TOOL_DISABLED, Failure::Disabled));
    let r = h.record();
    assert_eq!((r.outcome.as_str(), r.actor.as_ref()), ("disabled", "agent"));
    let e = error(call(&s, "fs__nope", json!({})).await);
    assert_eq!(Failure::of(&e), Failure::NotFound, "{}", e.message);
    let e = error(call(&s, "ghost__echo", json!({})).await);
    assert_eq!(Failure::of(&e), Failure::NotFound, "{}", e.message);
    let _ = (h.record(), h.record());
    assert_eq!(up.count("tools/call"), 1);

    // The key is the caller's: the same key with another actor is refused; another service's
    // same key is another session, with its own upstream.
    let e = b.lease(Identity::Chat, "conversation-1", "channel:telegram").err().unwrap();
    assert_eq!(
        e,
        BrokerError::ActorMismatch {
            key: "conversation-1".into(),
            open: "agent".into(),
            asked: "channel:telegram".into()
        }
    );
    let other = b.lease(Identity::Gateway, "conversation-1", "api").unwrap();
    assert_ne!(other.id, s.id);
    let started = up.count("initialize");
    assert!(matches!(call(&other, "fs__echo", json!({})).await, Answer::Result(_)));
    assert_eq!(h.record().actor.as_ref(), "api");
    assert_eq!(up.count("initialize"), started + 1, "two sessions never share an upstream");
    assert_eq!(b.count(), 2);

    // An MCP client session's actor is borrowed: recording it allocates nothing.
    let mcp = h.session();
    assert!(matches!(super::call(&mcp, "fs__echo", json!({})).await, Answer::Result(_)));
    let r = h.record();
    assert!(matches!(r.actor, Cow::Borrowed("mcp")), "{:?}", r.actor);
    mcp.close().await;
    drop((s, other));
    b.close_all().await;
    assert_eq!(b.count(), 0);
}

#[tokio::test]
async fn broker_sessions_end_when_idle_or_closed_and_their_upstreams_with_them() {
    let (_up, url) = fake(&["echo"], 0).await;
    let h = Harness::new(snapshot(vec![server("fs", &url)], &[]));
    let b = Broker::new(h.shared.clone());
    let lease = b.lease(Identity::Chat, "c1", "agent").unwrap();
    assert!(lease.running_upstreams().is_empty(), "upstreams start lazily");
    assert!(matches!(call(&lease, "fs__echo", json!({})).await, Answer::Result(_)));
    assert_eq!(lease.running_upstreams(), ["fs"]);
    let session = Arc::clone(&lease);
    assert_eq!(b.reap_idle(Duration::ZERO).await, 0, "a session with a request in flight is kept");
    drop(lease);
    assert_eq!(b.reap_idle(Duration::from_secs(3600)).await, 0, "not idle for that long");
    assert_eq!(b.reap_idle(Duration::ZERO).await, 1);
    assert!(session.running_upstreams().is_empty() && session.closed.is_cancelled());
    assert_eq!(b.count(), 0);

    // Reopened under the same key: a new session. Closed by the caller: gone, upstreams too.
    let again = b.lease(Identity::Chat, "c1", "agent").unwrap();
    assert_ne!(again.id, session.id);
    assert!(matches!(call(&again, "fs__echo", json!({})).await, Answer::Result(_)));
    let session = Arc::clone(&again);
    drop(again);
    assert!(!b.close(Identity::Gateway, "c1").await, "another caller's key is not this one");
    assert!(b.close(Identity::Chat, "c1").await);
    assert!(!b.close(Identity::Chat, "c1").await, "closing twice is no error");
    assert!(session.running_upstreams().is_empty());
    assert_eq!(b.count(), 0);
}

#[tokio::test]
async fn malformed_broker_input_is_refused_clearly() {
    for bad in ["", "a b", "tab\t", "é", &"x".repeat(65)] {
        assert!(matches!(broker::check_actor(bad), Err(BrokerError::InvalidActor(_))), "{bad:?}");
    }
    for good in ["agent", "channel:telegram", &"x".repeat(64)] {
        assert_eq!(broker::check_service_actor(good), Ok(()), "{good:?}");
    }
    for reserved in ["mcp", "api", "cli", "ui", "daemon"] {
        assert_eq!(broker::check_actor(reserved), Ok(()));
        let e = broker::check_service_actor(reserved).unwrap_err();
        assert_eq!(e, BrokerError::ReservedActor(reserved.into()));
    }
    let e = broker::check_actor("").unwrap_err().to_string();
    assert_eq!(
        e,
        "actor must be 1-64 printable ASCII characters without spaces (agent, channel:<name>, …): it is empty"
    );
    assert!(broker::check_key(&"k".repeat(128)).is_ok());
    for bad in ["", "two words", &"k".repeat(129)] {
        assert!(matches!(broker::check_key(bad), Err(BrokerError::InvalidKey(_))), "{bad:?}");
    }
    assert_eq!(broker::parse_arguments("").unwrap().map(|r| r.get().to_owned()), None);
    assert_eq!(broker::parse_arguments(" {\"a\": 1} ").unwrap().unwrap().get(), "{\"a\": 1}");
    for bad in ["nope", "[1]", "\"text\"", "{\"a\":", "{} {}"] {
        assert!(matches!(broker::parse_arguments(bad), Err(BrokerError::InvalidArguments(_))), "{bad:?}");
    }

    let h = Harness::new(snapshot(vec![], &[]));
    let b = Broker::new(h.shared.clone());
    assert!(matches!(b.lease(Identity::Chat, "", "agent"), Err(BrokerError::InvalidKey(_))));
    assert!(matches!(b.lease(Identity::Chat, "k", "a\u{7f}"), Err(BrokerError::InvalidActor(_))));
    assert_eq!(b.count(), 0, "nothing opened for a refused request");
    for i in 0..MAX_SESSIONS_PER_CALLER {
        drop(b.lease(Identity::Chat, &format!("k{i}"), "agent").unwrap());
    }
    let e = b.lease(Identity::Chat, "one-more", "agent").err().unwrap();
    assert_eq!(e, BrokerError::TooManySessions { caller: Identity::Chat });
    assert!(b.lease(Identity::Chat, "k0", "agent").is_ok(), "an open key still works");
    assert!(b.lease(Identity::Gateway, "one-more", "api").is_ok(), "the limit is per caller");
    b.close_all().await;
}

#[tokio::test]
async fn a_tool_is_located_for_toggling_by_listing_only_its_server() {
    let (a_up, a_url) = fake(&["echo", "read file"], 0).await;
    let (b_up, b_url) = fake(&["echo"], 0).await;
    let mut off = server("off", &b_url);
    off.enabled = false;
    let h = Harness::new(snapshot(
        vec![server("a", &a_url), server("b", &b_url), off],
        &[("a", Kind::Tool, "echo", false)],
    ));
    let b = Broker::new(h.shared.clone());
    let s = b.lease(Identity::Gateway, "api", "api").unwrap();
    // A disabled tool is found (it must be re-enableable), and so is a rewritten name.
    for (exposed, original) in [("a__echo", "echo"), ("a__read_file", "read file")] {
        match broker::locate_tool(&s, exposed).await {
            Located::Tool { server, original: o } => assert_eq!((server.as_str(), o.as_str()), ("a", original)),
            other => panic!("{exposed}: {other:?}"),
        }
    }
    assert_eq!(a_up.count("tools/list"), 1, "listed once, then from the name map");
    assert_eq!(b_up.count("initialize"), 0, "no other upstream was started");
    assert!(
        matches!(broker::locate_tool(&s, "off__echo").await, Located::ServerDisabled { server } if server == "off")
    );
    let coffer = broker::locate_tool(&s, "coffer__search_tools").await;
    assert!(matches!(coffer, Located::Tool { ref server, .. } if server == BUILTIN_SERVER), "{coffer:?}");
    for (exposed, message) in [
        ("a__nope", "Unknown tool \"a__nope\""),
        ("ghost__echo", "Unknown server \"ghost\" in tool \"ghost__echo\""),
        ("echo", "Unknown tool \"echo\": exposed names look like <server>__<name>"),
    ] {
        match broker::locate_tool(&s, exposed).await {
            Located::Unknown(e) => assert_eq!(e.message, message),
            other => panic!("{exposed}: {other:?}"),
        }
    }
    assert_eq!(b_up.count("initialize"), 0);
    drop(s);
    b.close_all().await;
}
