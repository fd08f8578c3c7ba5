//! Profiles reach the edge's policy snapshot (what MCP sessions read): the store's `default`
//! from the start, then every REST write — create, replace, delete — by the time its answer
//! comes (a write waits for the snapshot to hold its change).
use anyhow::Context;
use coffer_api::profiles::ToolMode;
use coffer_tests::SendExt;
use coffer_tests::inproc::Edge;
use serde_json::json;

#[tokio::test]
async fn the_snapshot_holds_the_profiles_and_follows_their_writes() -> anyhow::Result<()> {
    let edge = Edge::start().await?;
    let api = edge.api();
    let snap = edge.snapshot().current();
    let d = snap.profiles.get("default").context("default is in the snapshot before anything wrote it")?;
    assert_eq!((d.version, d.spec.mode, d.spec.tools.is_all()), (0, ToolMode::Full, true));

    let body = json!({"name": "work", "mode": "lazy", "tools": {"exclude": ["git__git_push"]},
        "overrides": {"time__get_current_time": {"name": "now"}}});
    let r = api.post_json("/v1/mcp/profiles", &body).reply().await?;
    assert_eq!(r.status, 201, "{}", r.text);
    let snap = edge.snapshot().current();
    let w = snap.profiles.get("work").context("work reached the snapshot")?;
    assert_eq!((w.spec.mode, w.spec.tools.exclude.clone()), (ToolMode::Lazy, vec!["git__git_push".to_owned()]));
    assert_eq!(w.spec.overrides["time__get_current_time"].name.as_deref(), Some("now"));

    let r = api.request(reqwest::Method::PUT, "/v1/mcp/profiles/work").json(&json!({"mode": "full"})).reply().await?;
    assert_eq!(r.status, 200, "{}", r.text);
    let snap = edge.snapshot().current();
    assert_eq!((snap.profiles["work"].version, snap.profiles["work"].spec.mode), (2, ToolMode::Full));

    let r = api.request(reqwest::Method::DELETE, "/v1/mcp/profiles/work").reply().await?;
    assert_eq!(r.status, 204, "{}", r.text);
    let snap = edge.snapshot().current();
    assert!(!snap.profiles.contains_key("work") && snap.profiles.contains_key("default"), "{:?}", snap.profiles.keys());
    edge.stop().await
}
