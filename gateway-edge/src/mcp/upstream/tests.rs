//! Unit tests of the transport-independent core: response matching, the event queue, exits.
use super::stdio::describe_exit;
use super::*;

#[test]
fn the_core_matches_responses_by_id_and_hands_on_everything_else() {
    let (events, mut rx) = events(EVENT_QUEUE);
    let core = Core::new("srv", events);
    let (tx1, mut reply1) = oneshot::channel();
    let (tx2, mut reply2) = oneshot::channel();
    core.pending.lock().unwrap().extend([(1, tx1), (2, tx2)]);

    core.dispatch(b"  {\"jsonrpc\":\"2.0\",\"id\":2,\"error\":{\"code\":-1, \"message\":\"raw\"}}\r\n");
    core.dispatch(b"not json at all");
    core.dispatch(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"a\": [1]}}");
    assert!(matches!(reply1.try_recv(), Ok(Reply::Result(r)) if r.get() == "{\"a\": [1]}"), "out of order is fine");
    assert!(matches!(reply2.try_recv(), Ok(Reply::Error(e)) if e.get() == "{\"code\":-1, \"message\":\"raw\"}"));
    assert!(!core.is_pending(1) && !core.is_pending(2));
    core.dispatch(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}"); // late duplicate: ignored
    assert_eq!(core.heard.load(Ordering::Relaxed), 4, "every message counts as heard");

    core.dispatch(b"{\"jsonrpc\":\"2.0\",\"id\":\"s-1\",\"method\":\"roots/list\"}");
    core.dispatch(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}");
    assert!(
        matches!(rx.try_recv(), Ok(UpstreamEvent::Request { id, method, .. }) if id.get() == "\"s-1\"" && method == "roots/list")
    );
    assert!(matches!(rx.try_recv(), Ok(UpstreamEvent::Notification { server, .. }) if server == "srv"));
    assert!(rx.try_recv().is_err(), "responses and junk raise no event");

    let (tx3, mut reply3) = oneshot::channel();
    core.pending.lock().unwrap().insert(3, tx3);
    core.close("exited (stdout closed)");
    assert!(!core.is_alive());
    assert!(reply3.try_recv().is_err(), "a request in flight fails at once");
    assert!(matches!(rx.try_recv(), Ok(UpstreamEvent::Closed { .. })));
    let UpstreamError::Closed { reason, .. } = core.closed_error() else { panic!("closed") };
    assert_eq!(reason, "exited (stdout closed)");
}

#[tokio::test]
async fn a_full_event_queue_drops_notifications_but_keeps_list_changes_and_the_end() {
    let (tx, mut rx) = events(2);
    let note = |method: &str| UpstreamEvent::Notification { server: "s".into(), method: method.into(), params: None };
    tx.send(note("notifications/message"));
    tx.send(note("notifications/progress"));
    for _ in 0..100 {
        tx.send(note("notifications/message"));
        tx.send(note("notifications/tools/list_changed"));
    }
    tx.send(UpstreamEvent::Closed { server: "s".into() });
    assert_eq!(rx.dropped(), 100, "the log messages over the limit");
    let mut got = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        got.push(match ev {
            UpstreamEvent::Notification { method, .. } => method,
            UpstreamEvent::Closed { .. } => "closed".into(),
            UpstreamEvent::Request { .. } => "request".into(),
        });
    }
    assert_eq!(
        got,
        ["notifications/message", "notifications/progress", "notifications/tools/list_changed", "closed"],
        "what was queued, then what was kept aside, once each"
    );
    drop(tx);
    assert!(rx.recv().await.is_none());
}

#[test]
fn a_stop_coffer_asked_for_is_no_fault_and_non_protocol_lines_are_counted() {
    let (events, _rx) = events(EVENT_QUEUE);
    let core = Core::new("srv", events);
    core.dispatch(b"Server listening on stdio");
    core.dispatch(b"{\"not\": \"json-rpc\"}");
    core.dispatch(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}");
    assert_eq!(core.junk(), (2, Some("Server listening on stdio".to_owned())));
    core.stop("its session ended");
    core.close("exited (stdout closed)"); // too late: the first reason stays
    let e = core.closed_error();
    assert!(matches!(&e, UpstreamError::Stopped { reason, .. } if reason == "its session ended"), "{e:?}");
    assert!(!e.is_fault());
    assert!(UpstreamError::Closed { server: "s".into(), reason: "x".into() }.is_fault());
}

#[test]
fn exits_are_said_by_status_or_signal() {
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(describe_exit(std::process::ExitStatus::from_raw(3 << 8)), "exited with status 3");
    assert_eq!(describe_exit(std::process::ExitStatus::from_raw(9)), "was killed by signal 9");
}

#[test]
fn lines_are_trimmed_of_surrounding_whitespace_only() {
    assert_eq!(trim_line(b" \t{\"a\": 1}\r\n"), b"{\"a\": 1}");
    assert_eq!(trim_line(b"\r\n"), b"");
}
