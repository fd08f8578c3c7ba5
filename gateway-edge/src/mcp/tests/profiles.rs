//! Profiles on the session side (issue 36 §1 and §3): a session's profile narrows what it lists
//! and refuses what it does not select with a disabled tool's code, naming the profile; overrides rename, re-describe, hide
//! parameters and set annotations on the way out and are reversed on the way in, invisible to
//! the (fake, wire-speaking) upstream.
use std::collections::BTreeMap;

use coffer_api::profiles::{Annotations, Profile, ProfileSpec, Selection, ToolOverride};

use super::*;

fn profile(name: &str, spec: ProfileSpec) -> (String, Profile) {
    (name.to_owned(), Profile { name: name.into(), spec, version: 1, updated_at: "2026-12-07T00:00:00Z".into() })
}

fn globs(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn error(answer: Answer) -> RpcError {
    match answer {
        Answer::Error(e) => e,
        _ => panic!("expected an error"),
    }
}

#[tokio::test]
async fn two_sessions_with_different_profiles_list_and_call_different_tools() {
    let (_fs, fs_url) = fake(&["read", "write", "secret"], 0).await;
    let (_time, time_url) = fake(&["now"], 0).await;
    let make =
        || snapshot(vec![server("fs", &fs_url), server("time", &time_url)], &[("fs", Kind::Tool, "secret", false)]);
    let mut snap = make();
    let reader = ProfileSpec {
        tools: Selection { include: vec![], exclude: globs(&["fs__write*"]) },
        servers: Selection { include: globs(&["fs"]), exclude: vec![] },
        builtins: Selection { include: vec![], exclude: globs(&["*"]) },
        ..Default::default()
    };
    snap.profiles.extend([profile("reader", reader.clone())]);
    let mut h = Harness::new(snap);
    let (a, b) = (h.session(), h.session());
    b.select_profile(Arc::from("reader"));
    assert_eq!(&*a.profile_name(), "default");
    assert_eq!(names(&a.list(ListKind::Tools).await), ["coffer__search_tools", "fs__read", "fs__write", "time__now"]);
    assert_eq!(names(&b.list(ListKind::Tools).await), ["fs__read"], "the disabled fs__secret is hidden in both");

    // Refused with a disabled tool's code, before any upstream contact, naming the profile;
    // a tool disabled for everyone is refused as disabled.
    for name in ["fs__write", "time__now", "coffer__search_tools"] {
        let e = error(call(&b, name, json!({})).await);
        assert_eq!(
            (e.code, e.message.clone()),
            (
                TOOL_DISABLED,
                format!("Tool {name} is not in profile reader (coffer profile show reader lists what it selects)")
            ),
            "{name}"
        );
        let data = e.data.clone().unwrap();
        assert_eq!((data["reason"].as_str(), data["profile"].as_str()), (Some("not_in_profile"), Some("reader")));
        assert_eq!(h.record().outcome.as_str(), "disabled", "{name}");
    }
    let e = error(call(&b, "fs__secret", json!({})).await);
    assert_eq!((e.code, e.message.clone()), (TOOL_DISABLED, "Tool fs__secret is disabled".to_owned()));
    assert_eq!(h.record().outcome.as_str(), "disabled");
    assert_eq!(result(call(&b, "fs__read", json!({})).await)["structuredContent"]["name"], "read");
    h.record();

    // The profile is edited: the live session's list follows, and its client hears of it.
    let (_, mut notes) = b.outbound.subscribe(None);
    let mut edited = make();
    let mut wider = reader;
    wider.servers.include.push("time".into());
    edited.profiles.extend([profile("reader", wider)]);
    h.policy.send(Arc::new(edited)).unwrap();
    let note = tokio::time::timeout(Duration::from_secs(10), notes.recv()).await.expect("list_changed").unwrap();
    assert!(note.1.contains("notifications/tools/list_changed"), "{}", note.1);
    assert_eq!(names(&b.list(ListKind::Tools).await), ["fs__read", "time__now"]);

    // The profile is removed: the session sees nothing and is refused everything.
    h.policy.send(Arc::new(make())).unwrap();
    assert!(b.list(ListKind::Tools).await.is_empty());
    let e = error(call(&b, "fs__read", json!({})).await);
    assert_eq!(e.code, TOOL_DISABLED);
    assert!(
        e.message.starts_with("Profile reader was removed after this session started")
            && e.message.contains("coffer profile list"),
        "the refusal names the removed profile, not the tool: {}",
        e.message
    );
    assert_eq!(e.data, Some(json!({"profile": "reader", "reason": "profile_removed"})));
    assert_eq!(h.record().outcome.as_str(), "disabled");
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn overrides_rename_redescribe_and_hide_out_and_are_reversed_in() {
    let tree = json!({"name": "directory_tree", "description": "Upstream words.", "inputSchema": {
        "type": "object", "properties": {"path": {"type": "string"}, "depth": {"type": "integer"}}, "required": ["path"]}});
    let read = json!({"name": "read", "description": "Read.", "inputSchema": {"type": "object"}});
    let (up, url) = fake_listing(vec![tree, read], 0).await;
    let mut snap = snapshot(vec![server("fs", &url)], &[]);
    let default = ProfileSpec {
        overrides: BTreeMap::from([(
            "fs__directory_tree".to_owned(),
            ToolOverride {
                name: Some("tree".into()),
                description: Some("Shows a folder as a tree.".into()),
                ..Default::default()
            },
        )]),
        ..Default::default()
    };
    let work = ProfileSpec {
        overrides: BTreeMap::from([
            (
                "fs__directory_tree".to_owned(),
                ToolOverride {
                    description_append: Some("Prefer it to listing folder by folder.".into()),
                    hide_params: vec!["depth".into()],
                    annotations: Some(Annotations { read_only: Some(true), ..Default::default() }),
                    ..Default::default()
                },
            ),
            // Collides with a listed tool: skipped, the original name kept.
            ("fs__read".to_owned(), ToolOverride { name: Some("tree".into()), ..Default::default() }),
        ]),
        ..Default::default()
    };
    // Stored before its tool was ever listed (the REST check could not see it): hides the
    // required `path`, which is never hidden.
    let strict = ProfileSpec {
        overrides: BTreeMap::from([(
            "fs__directory_tree".to_owned(),
            ToolOverride { hide_params: vec!["path".into(), "depth".into()], ..Default::default() },
        )]),
        ..Default::default()
    };
    snap.profiles.extend([profile("default", default), profile("work", work), profile("strict", strict)]);
    let mut h = Harness::new(snap);
    let s = h.session();
    s.select_profile(Arc::from("work"));
    let listed = s.listed_tools().await;
    let names: Vec<&str> = listed.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["coffer__search_tools", "tree", "fs__read"]);
    let t = &listed[1];
    assert_eq!(t["description"], "Shows a folder as a tree.\n\nPrefer it to listing folder by folder.");
    assert_eq!(t["inputSchema"]["properties"], json!({"path": {"type": "string"}}));
    assert_eq!(t["inputSchema"]["required"], json!(["path"]));
    assert_eq!(t["annotations"], json!({"readOnlyHint": true}));

    // In: the new name reaches the upstream under its own name; the record names the client's.
    let out = result(call(&s, "tree", json!({"path": "/w"})).await);
    assert_eq!(out["structuredContent"], json!({"name": "directory_tree", "arguments": {"path": "/w"}}));
    let r = h.record();
    assert_eq!((r.target.as_str(), r.server.as_str(), r.outcome.as_str()), ("tree", "fs", "ok"));
    // A hidden parameter is the client's error, and never reaches the upstream.
    let calls = up.count("tools/call");
    let e = error(call(&s, "tree", json!({"path": "/w", "depth": 9})).await);
    assert_eq!(e.code, INVALID_PARAMS);
    assert!(e.message.contains("\"depth\"") && e.message.contains("profile work"), "{}", e.message);
    assert_eq!(up.count("tools/call"), calls);
    assert_eq!(h.record().outcome.as_str(), "invalid");

    // A session of another profile (none named: default) gets default's override only.
    let d = h.session();
    let listed = d.listed_tools().await;
    assert_eq!(listed[1]["name"], "tree");
    assert_eq!(listed[1]["description"], "Shows a folder as a tree.");
    assert!(listed[1]["inputSchema"]["properties"]["depth"].is_object());
    // A renamed tool called before any list resolves too.
    let fresh = h.session();
    fresh.select_profile(Arc::from("work"));
    assert_eq!(result(call(&fresh, "tree", json!({"path": "/"})).await)["structuredContent"]["name"], "directory_tree");
    // A session that never listed calls with the required parameter a profile names: judged as
    // if it had listed (a newcomer's session was refused every call of such a tool).
    let cold = h.session();
    cold.select_profile(Arc::from("strict"));
    let out = result(call(&cold, "tree", json!({"path": "/c"})).await);
    assert_eq!(out["structuredContent"]["arguments"], json!({"path": "/c"}));
    let e = error(call(&cold, "tree", json!({"path": "/c", "depth": 1})).await);
    assert!(e.message.contains("\"depth\"") && e.message.contains("profile strict"), "{}", e.message);
    for x in [s, d, fresh, cold] {
        x.close().await;
    }
}
