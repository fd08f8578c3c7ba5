//! The gateway-wide capability catalog as sessions see it: first lists from it, deadlines for
//! servers not listed yet, the cache file across a restart, capability sets never seen.
use coffer_api::servers::CatalogPhase;

use super::*;

#[tokio::test]
async fn a_new_session_s_list_comes_from_the_gateway_catalog_under_policy_and_its_fresh_list_follows() {
    let (up, url) = fake(&["echo", "hidden"], 0).await;
    let mut h = Harness::new(snapshot(vec![server("fs", &url)], &[("fs", Kind::Tool, "hidden", false)]));
    let first = h.session();
    assert_eq!(names(&first.list(ListKind::Tools).await), ["coffer__search_tools", "fs__echo"]);
    first.close().await;
    let inits = up.count("initialize");

    // The server's tools change; a new session is shown what the catalog knows, under policy,
    // without any upstream contact.
    up.tools.lock().unwrap().push(json!({"name": "added", "inputSchema": {"type": "object"}}));
    let s = h.session();
    let (_, mut notes) = s.outbound.subscribe(None);
    let all = s.list_all(ListKind::Tools).await;
    assert_eq!(
        all.iter().map(|l| (l.item["name"].as_str().unwrap(), l.enabled)).collect::<Vec<_>>(),
        [("coffer__search_tools", true), ("fs__echo", true), ("fs__hidden", false)]
    );
    assert_eq!(up.count("initialize"), inits, "nothing started for a list");
    assert_eq!(error(call(&s, "fs__hidden", json!({})).await).code, TOOL_DISABLED);
    let _ = h.record();

    // Its first call starts its own upstream, whose fresh list differs: list_changed.
    assert!(matches!(call(&s, "fs__echo", json!({})).await, Answer::Result(_)));
    let _ = h.record();
    assert!(next_note(&mut notes).await.contains("notifications/tools/list_changed"));
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "fs__echo", "fs__added"]);
    // Later sessions see the new list from the catalog.
    let later = h.session();
    assert_eq!(names(&later.list(ListKind::Tools).await), ["coffer__search_tools", "fs__echo", "fs__added"]);
    s.close().await;
    later.close().await;
}

#[tokio::test]
async fn a_server_not_listed_yet_costs_a_list_at_most_the_first_list_deadline_and_arrives_as_list_changed() {
    let (fast, fast_url) = fake(&["echo"], 0).await;
    let (slow, slow_url) = fake(&["late"], 0).await;
    slow.init_delay_ms.store(2_000, std::sync::atomic::Ordering::Relaxed);
    let snap = snapshot(vec![server("fast", &fast_url), server("slow", &slow_url)], &[]);
    let h = Harness::new(with_settings(snap, &[("gateway.first_list_timeout_ms", "600")]));
    let s = h.session();
    let (_, mut notes) = s.outbound.subscribe(None);
    let t = std::time::Instant::now();
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "fast__echo"]);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(600) && took < Duration::from_millis(1_500), "{took:?}");
    assert!(next_note(&mut notes).await.contains("notifications/tools/list_changed"));
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "fast__echo", "slow__late"]);
    assert_eq!((fast.count("initialize"), slow.count("initialize")), (1, 1), "each started once, in the background");
    assert!(s.running_upstreams().is_empty());
    s.close().await;
}

#[tokio::test]
async fn a_hung_server_costs_lists_nothing_after_its_first_failure() {
    let (_ok, ok_url) = fake(&["echo"], 0).await;
    let (hung, hung_url) = fake(&["never"], 0).await;
    hung.init_delay_ms.store(u64::MAX, std::sync::atomic::Ordering::Relaxed);
    let snap = snapshot(vec![server("hung", &hung_url), server("ok", &ok_url)], &[]);
    // The waits are far apart (3 s to give a start up, 20 s for the whole first list), so the
    // bounds below tell them apart on a loaded machine too.
    let settings = [("gateway.list_timeout_ms", "3000"), ("gateway.first_list_timeout_ms", "20000")];
    let h = Harness::new(with_settings(snap, &settings));
    let s = h.session();
    // The first list waits for it until its start is given up (3 s), not the whole first-list
    // deadline (20 s).
    let t = std::time::Instant::now();
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "ok__echo"]);
    assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
    let generation = h.shared.snapshot.current().generation(&server("hung", &hung_url));
    wait_until("the hung server's failure", || h.shared.lists.status("hung", generation).state == CatalogPhase::Failed)
        .await;
    let status = h.shared.lists.status("hung", generation);
    assert!(status.error.as_deref().unwrap().contains("3000 ms"), "{status:?}");
    // Every later list, in this session or a new one, answers without waiting for it again
    // (which would take the 3 s start wait).
    for session in [s.clone(), h.session(), h.session()] {
        let t = std::time::Instant::now();
        assert_eq!(names(&session.list(ListKind::Tools).await), ["coffer__search_tools", "ok__echo"]);
        assert!(t.elapsed() < Duration::from_millis(1500), "{:?}", t.elapsed());
    }
    assert_eq!(hung.count("initialize"), 1, "not retried during its backoff");
    s.close().await;
}

/// A server that never answers `initialize` is reported as such by the catalog's background
/// start, not as a list that took too long (newcomer finding).
#[tokio::test]
async fn a_server_that_never_answers_initialize_is_reported_as_not_started() {
    let home = tempfile::tempdir().unwrap();
    let hung = McpServer {
        name: "hung".into(),
        transport: coffer_proto::store::Transport::Stdio as i32,
        command: "/bin/sh".into(),
        args: vec!["-c".into(), "exec sleep 30".into()],
        cwd: home.path().display().to_string(),
        enabled: true,
        version: 1,
        ..Default::default()
    };
    let snap = with_settings(snapshot(vec![hung.clone()], &[]), &[("gateway.list_timeout_ms", "300")]);
    let h = Harness::new(snap);
    let client =
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}});
    crate::mcp::gateway_catalog::warm(h.shared.clone(), hung, client).await;
    let st = upstream_status(&h, "hung");
    let error = st["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("did not start and answer initialize within 300 ms"), "{st}");
    assert!(!error.contains("tools/list"), "{st}");
}

/// The tool names of `s`'s lists once the catalog's cache file names `tool` (written by the
/// persist task after a list).
async fn wait_cached(home: &std::path::Path, tool: &str) {
    let path = home.join(crate::mcp::gateway_catalog::CACHE_FILE);
    wait_until("the catalog's cache file", || std::fs::read_to_string(&path).is_ok_and(|t| t.contains(tool))).await;
}

#[tokio::test]
async fn after_a_restart_the_first_list_comes_from_the_cache_file_and_a_changed_list_follows() {
    use std::os::unix::fs::PermissionsExt as _;
    let (up, url) = fake(&["echo", "add"], 0).await;
    let home = tempfile::tempdir().unwrap();
    // The long first-list deadline would show here if the list waited for the upstream.
    let snap = || with_settings(snapshot(vec![server("s", &url)], &[]), &[("gateway.first_list_timeout_ms", "5000")]);
    let stop = tokio_util::sync::CancellationToken::new();
    {
        let h = Harness::running_at(home.path(), snap(), &stop);
        let s = h.session_with(json!({}));
        assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "s__echo", "s__add"]);
        wait_cached(home.path(), "\"add\"").await;
        s.close().await;
    }
    stop.cancel();
    let path = home.path().join(crate::mcp::gateway_catalog::CACHE_FILE);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);

    // The restarted gateway: the upstream now takes 1.5 s to start and lists one more tool.
    let lists_before = up.count("tools/list");
    up.init_delay_ms.store(1_500, std::sync::atomic::Ordering::Relaxed);
    up.tools.lock().unwrap().push(json!({"name": "added", "inputSchema": {"type": "object"}}));
    let stop = tokio_util::sync::CancellationToken::new();
    let h = Harness::running_at(home.path(), snap(), &stop);
    let s = h.session_with(json!({}));
    let (_, mut notes) = s.outbound.subscribe(None);
    assert_eq!(
        names(&s.list(ListKind::Tools).await),
        ["coffer__search_tools", "s__echo", "s__add"],
        "answered from the cache file"
    );
    assert_eq!(up.count("tools/list"), lists_before, "without waiting for the upstream");
    // The background refresh lists the server afresh; the difference reaches the client.
    assert!(next_note(&mut notes).await.contains("notifications/tools/list_changed"));
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "s__echo", "s__add", "s__added"]);
    wait_cached(home.path(), "\"added\"").await;
    s.close().await;
    stop.cancel();
}

#[tokio::test]
async fn an_unchanged_list_refreshed_after_a_restart_sends_no_list_changed() {
    let (up, url) = fake(&["echo"], 0).await;
    let home = tempfile::tempdir().unwrap();
    let snap = || snapshot(vec![server("s", &url)], &[]);
    let stop = tokio_util::sync::CancellationToken::new();
    {
        let h = Harness::running_at(home.path(), snap(), &stop);
        let s = h.session_with(json!({}));
        assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "s__echo"]);
        wait_cached(home.path(), "echo").await;
        s.close().await;
    }
    stop.cancel();
    let inits = up.count("initialize");
    let stop = tokio_util::sync::CancellationToken::new();
    let h = Harness::running_at(home.path(), snap(), &stop);
    let s = h.session_with(json!({}));
    let (_, mut notes) = s.outbound.subscribe(None);
    assert_eq!(names(&s.list(ListKind::Tools).await), ["coffer__search_tools", "s__echo"]);
    let generation = h.shared.snapshot.current().generation(&server("s", &url));
    // Refreshed: listed afresh by the background start, no longer the restored copy.
    wait_until("the refresh", || {
        let summary = crate::mcp::gateway_catalog::summary(&h.shared, "s", generation);
        summary.status.state == CatalogPhase::Ready && !summary.restored && summary.prompts.is_some()
    })
    .await;
    assert!(up.count("initialize") > inits, "the server was started again to refresh its lists");
    assert!(notes.try_recv().is_err(), "nothing changed, so the client is told nothing");
    s.close().await;
    stop.cancel();
}

#[tokio::test]
async fn a_capability_set_never_seen_is_answered_from_another_s_list_at_once() {
    let (up, url) = fake(&["echo", "add"], 0).await;
    let snap = with_settings(snapshot(vec![server("s", &url)], &[]), &[("gateway.first_list_timeout_ms", "5000")]);
    let home = tempfile::tempdir().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let h = Harness::running_at(home.path(), snap, &stop);
    let plain = h.session_with(json!({}));
    assert_eq!(names(&plain.list(ListKind::Tools).await), ["coffer__search_tools", "s__echo", "s__add"]);
    let lists = up.count("tools/list");
    up.init_delay_ms.store(1_500, std::sync::atomic::Ordering::Relaxed);
    // A client declaring roots, sampling and elicitation: a profile the catalog has no list of.
    let rich = h.session_with(json!({"roots": {"listChanged": true}, "sampling": {}, "elicitation": {}}));
    let (_, mut notes) = rich.outbound.subscribe(None);
    assert_eq!(names(&rich.list(ListKind::Tools).await), ["coffer__search_tools", "s__echo", "s__add"]);
    assert_eq!(up.count("tools/list"), lists, "answered without waiting for its own list");
    // Its own list is fetched in the background (the same here: no list_changed).
    wait_until("the profile's own list", || up.count("tools/list") > lists).await;
    let generation = h.shared.snapshot.current().generation(&server("s", &url));
    let profile = crate::mcp::gateway_catalog::Profile::of(
        &json!({"capabilities": {"roots": {"listChanged": true}, "sampling": {}, "elicitation": {}}}),
    );
    wait_until("the profile's list in the catalog", || {
        matches!(
            h.shared.lists.lookup("s", generation, &profile, ListKind::Tools),
            crate::mcp::gateway_catalog::Known::Ready(_)
        )
    })
    .await;
    assert!(notes.try_recv().is_err(), "the same list: nothing to tell");
    plain.close().await;
    rich.close().await;
    stop.cancel();
}
