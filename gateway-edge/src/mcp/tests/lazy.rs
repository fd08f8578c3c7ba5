//! The lazy tool mode (issue 36 §2) through a real session: a `default` profile in `lazy` mode
//! (built in-process, as the store will load it) lists the meta tools only, and a model finds,
//! describes and calls upstream tools through them — with the same policy, routing, records and
//! errors as a direct `tools/call`.
use super::*;
use coffer_api::profiles::{DEFAULT_PROFILE, Profile, ProfileSpec, ToolMode};

fn with_profile(mut snap: Snapshot, mode: ToolMode) -> Snapshot {
    let spec = ProfileSpec { mode, ..Default::default() };
    let p = Profile { name: DEFAULT_PROFILE.into(), spec, version: 1, updated_at: String::new() };
    snap.profiles.insert(DEFAULT_PROFILE.into(), p);
    snap
}

async fn tools_list(s: &Arc<Session>) -> Vec<String> {
    let v = result(s.handle_request("tools/list", None).await);
    v["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect()
}

fn text(v: &Value) -> &str {
    v["content"][0]["text"].as_str().unwrap()
}

/// Two fake upstreams with the tools of the real time and git servers' names.
async fn upstreams() -> (Arc<Fake>, Arc<Fake>, Snapshot) {
    let time = vec![
        json!({"name": "get_current_time", "description": "Get current time in a specific timezone",
               "inputSchema": {"type": "object", "properties": {"timezone": {"type": "string", "description": "IANA timezone name"}}, "required": ["timezone"]}}),
        json!({"name": "convert_time", "description": "Convert time between timezones", "inputSchema": {"type": "object"}}),
    ];
    let git = vec![json!({"name": "git_log", "description": "Shows the commit logs",
                          "inputSchema": {"type": "object", "properties": {"repo_path": {"type": "string"}}}})];
    let (t, t_url) = fake_listing(time, 0).await;
    let (g, g_url) = fake_listing(git, 0).await;
    let snap =
        snapshot(vec![server("time", &t_url), server("git", &g_url)], &[("time", Kind::Tool, "convert_time", false)]);
    (t, g, snap)
}

#[tokio::test]
async fn a_lazy_session_lists_the_meta_tools_and_finds_describes_and_calls_through_them() {
    let (time, git, snap) = upstreams().await;
    let mut h = Harness::new(with_profile(snap, ToolMode::Lazy));
    let s = h.session();
    assert_eq!(tools_list(&s).await, ["coffer__search_tools", "coffer__describe_tool", "coffer__call_tool"]);

    // search → describe → call, as a model would.
    let found = result(call(&s, "coffer__search_tools", json!({"query": "what time is it in Tokyo"})).await);
    let matches = found["structuredContent"]["matches"].as_array().unwrap();
    assert!(matches.iter().take(2).any(|m| m["name"] == "time__get_current_time"), "{found}");
    assert_eq!(h.record().target, "coffer__search_tools");
    let described = result(call(&s, "coffer__describe_tool", json!({"name": "time__get_current_time"})).await);
    assert_eq!(described["structuredContent"]["tool"]["inputSchema"]["required"], json!(["timezone"]));
    assert!(text(&described).contains("coffer__call_tool"), "{described}");
    let _ = h.record();
    let called = result(
        call(
            &s,
            "coffer__call_tool",
            json!({"name": "time__get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}),
        )
        .await,
    );
    // The upstream's answer, verbatim: it got the original name and the arguments.
    assert_eq!(
        called["structuredContent"],
        json!({"name": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}})
    );
    let inner = h.record();
    assert_eq!(
        (inner.target.as_str(), inner.server.as_str(), inner.outcome.as_str()),
        ("time__get_current_time", "time", "ok")
    );
    assert_eq!(inner.session_id, s.id);
    // Recorded once: the meta call itself is not (it routed the call).
    assert!(h.records.try_recv().is_err(), "the meta call recorded beside the call it routed");

    // Upstream tools stay callable by their exposed names.
    let direct = result(call(&s, "git__git_log", json!({"repo_path": "/r"})).await);
    assert_eq!(direct["structuredContent"]["name"], "git_log");
    assert_eq!(h.record().target, "git__git_log");
    assert_eq!((time.count("tools/call"), git.count("tools/call")), (1, 1));

    // A disabled tool is refused exactly as a direct call refuses it, and never reaches its upstream.
    let direct = error(call(&s, "time__convert_time", json!({})).await);
    let _ = h.record();
    let meta = error(call(&s, "coffer__call_tool", json!({"name": "time__convert_time"})).await);
    assert_eq!((meta.code, &meta.message, &meta.data), (direct.code, &direct.message, &direct.data));
    assert_eq!(meta.code, TOOL_DISABLED);
    let inner = h.record();
    assert_eq!((inner.target.as_str(), inner.outcome.as_str()), ("time__convert_time", "disabled"));
    assert!(h.records.try_recv().is_err(), "one record of a refused call");
    // So is a name that names nothing.
    let direct = error(call(&s, "ghost__x", json!({})).await);
    let meta = error(call(&s, "coffer__call_tool", json!({"name": "ghost__x"})).await);
    assert_eq!((meta.code, meta.message), (direct.code, direct.message));
    assert_eq!(time.count("tools/call"), 1);
    let (direct, meta) = (h.record(), h.record());
    assert_eq!((direct.target.as_str(), meta.target.as_str()), ("ghost__x", "ghost__x"));
    assert!(h.records.try_recv().is_err(), "one record each");
    // A meta call that routes nothing (its own arguments are wrong) is the caller's mistake,
    // recorded as itself.
    let bad = result(call(&s, "coffer__call_tool", json!({"name": "time__get_current_time", "arguments": 7})).await);
    assert_eq!(bad["isError"], true, "{bad}");
    let r = h.record();
    assert_eq!((r.target.as_str(), r.outcome.as_str()), ("coffer__call_tool", "invalid"));
    assert_eq!(time.count("tools/call"), 1);
    s.close().await;
}

#[tokio::test]
async fn a_full_session_lists_every_tool_but_describe_and_call() {
    for mode in [Some(ToolMode::Full), None] {
        let (_time, _git, snap) = upstreams().await;
        let h = Harness::new(match mode {
            Some(m) => with_profile(snap, m),
            None => snap,
        });
        let s = h.session();
        assert_eq!(
            tools_list(&s).await,
            ["coffer__search_tools", "git__git_log", "time__get_current_time"],
            "{mode:?}"
        );
        s.close().await;
    }
}
