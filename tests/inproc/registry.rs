//! The REST registry under bad, hostile and concurrent input: every refusal is a structured
//! envelope naming the problem, and nothing is half-written.
use anyhow::{Context, ensure};
use coffer_tests::SendExt;
use coffer_tests::inproc::Edge;
use serde_json::{Value, json};

/// A server whose command exists (the registry checks it) and exits at once: nothing here
/// calls it.
fn tiny_body(name: &str) -> anyhow::Result<Value> {
    Ok(json!({"name": name, "command": "/bin/true"}))
}

#[tokio::test]
async fn registry_refuses_bad_input_with_named_errors() -> anyhow::Result<()> {
    let edge = Edge::start().await?;
    let api = edge.api();
    let post = |body: Value| api.post_json("/v1/mcp/servers", &body).reply();

    let mut b = tiny_body("ok")?;
    b["comand"] = json!("typo");
    let r = post(b).await?;
    let e = r.expect_envelope(400, "UNKNOWN_FIELD")?;
    assert_eq!(e["details"]["field"], "comand", "{e}");

    let mut b = tiny_body("ok")?;
    b["enabled"] = json!("yes");
    post(b).await?.expect_envelope(400, "INVALID_ARGUMENT")?;

    for bad in ["a__b", "Upper", &"a".repeat(200), "coffer", "-lead", ""] {
        let r = post(tiny_body(bad)?).await?;
        let e = r.expect_envelope(400, "INVALID_ARGUMENT")?;
        ensure!(e["message"].as_str().is_some_and(|m| m.contains("name") || m.contains("reserved")), "{bad}: {e}");
    }
    let r = post(json!({"name": "ghost", "command": "no-such-binary-anywhere-xyz"})).await?;
    let e = r.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("no-such-binary-anywhere-xyz")), "{e}");

    let r = api.post("/v1/mcp/servers").header("Content-Type", "application/json").body("{\"name\": ").reply().await?;
    r.expect_envelope(400, "BAD_REQUEST")?;
    let r = api
        .post("/v1/mcp/servers")
        .header("Content-Type", "text/plain")
        .body(tiny_body("plain")?.to_string())
        .reply()
        .await?;
    r.expect_envelope(415, "UNSUPPORTED_MEDIA_TYPE")?;

    let r = post(tiny_body("tiny")?).await?;
    assert_eq!(r.status, 201, "{}", r.text);
    post(tiny_body("tiny")?).await?.expect_envelope(409, "ALREADY_EXISTS")?;

    // Nothing half-written: only the one valid server exists.
    let list = api.get("/v1/mcp/servers").reply().await?.ok_json()?;
    let names: Vec<&str> =
        list["items"].as_array().context("items")?.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, vec!["tiny"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_conflicting_edits_one_wins_the_other_gets_409() -> anyhow::Result<()> {
    let edge = Edge::start().await?;
    let api = edge.api();
    let created = api.post_json("/v1/mcp/servers", &tiny_body("tiny")?).reply().await?;
    assert_eq!(created.status, 201);
    let etag = created.headers.get("etag").context("ETag")?.to_str()?.to_owned();
    let edit = |timeout_ms: u64| {
        let api = api.clone();
        let etag = etag.clone();
        tokio::spawn(async move {
            api.request(reqwest::Method::PATCH, "/v1/mcp/servers/tiny")
                .header("If-Match", etag)
                .json(&json!({"timeout_ms": timeout_ms}))
                .reply()
                .await
        })
    };
    let (a, b) = (edit(1000), edit(2000));
    let (a, b) = (a.await??, b.await??);
    let mut statuses = vec![a.status.as_u16(), b.status.as_u16()];
    statuses.sort();
    assert_eq!(statuses, vec![200, 409], "a: {} b: {}", a.text, b.text);
    let loser = if a.status == 409 { &a } else { &b };
    loser.expect_envelope(409, "CONFLICT")?;
    let winner: Value = if a.status == 200 { a.json()? } else { b.json()? };
    let now = api.get("/v1/mcp/servers/tiny").reply().await?.ok_json()?;
    assert_eq!(now["timeout_ms"], winner["timeout_ms"], "the stored value is the winner's");
    assert_eq!(now["version"], 2);
    // A stale delete is refused too; a current one works.
    let r =
        api.request(reqwest::Method::DELETE, "/v1/mcp/servers/tiny").header("If-Match", etag.as_str()).reply().await?;
    r.expect_envelope(409, "CONFLICT")?;
    let r = api.request(reqwest::Method::DELETE, "/v1/mcp/servers/tiny").header("If-Match", "\"2\"").reply().await?;
    assert_eq!(r.status, 204, "{}", r.text);
    Ok(())
}
