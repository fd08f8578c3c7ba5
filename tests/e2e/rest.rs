//! The REST registry under bad, hostile and concurrent input: every refusal is a structured
//! envelope naming the problem, and nothing is half-written. Also the pinned
//! `server-filesystem` peer through Coffer.
use anyhow::{Context, ensure};
use coffer_tests::mcp::{McpSession, register_stdio};
use coffer_tests::{SendExt, TestHome, bin};
use serde_json::{Value, json};

fn tiny_body(name: &str) -> anyhow::Result<Value> {
    Ok(json!({"name": name, "command": bin("coffer-tiny-upstream")?}))
}

#[tokio::test]
async fn registry_refuses_bad_input_with_named_errors() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
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
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
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

#[tokio::test]
async fn settings_patches_are_checked_against_the_settings_table() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let patch = |body: Value| api.request(reqwest::Method::PATCH, "/v1/settings").json(&body).reply();

    // An unknown key (a typo): refused, naming the key and listing the known ones.
    let e = patch(json!({"set": {"gateway.call_timout_ms": "5"}})).await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(
        (&e["details"]["key"], &e["details"]["problem"]),
        (&json!("gateway.call_timout_ms"), &json!("unknown_key"))
    );
    ensure!(e["details"]["known"].as_array().is_some_and(|k| k.contains(&json!("gateway.call_timeout_ms"))), "{e}");
    // The wrong type, and out of bounds: refused, naming the key, the value and the bounds.
    for (value, problem) in [("soon", "not_an_integer"), ("1.5", "not_an_integer"), ("-1", "not_an_integer")] {
        let e = patch(json!({"set": {"gateway.max_tool_name_len": value}}))
            .await?
            .expect_envelope(400, "INVALID_ARGUMENT")?;
        assert_eq!(
            (&e["details"]["key"], &e["details"]["problem"]),
            (&json!("gateway.max_tool_name_len"), &json!(problem)),
            "{e}"
        );
        assert_eq!(e["details"]["value"], value, "{e}");
    }
    for value in ["39", "65"] {
        let e = patch(json!({"set": {"gateway.max_tool_name_len": value}}))
            .await?
            .expect_envelope(400, "INVALID_ARGUMENT")?;
        assert_eq!(e["details"]["problem"], "out_of_range", "{e}");
        assert_eq!((&e["details"]["min"], &e["details"]["max"]), (&json!(40), &json!(64)), "{e}");
        ensure!(
            e["message"].as_str().is_some_and(|m| m.contains("gateway.max_tool_name_len") && m.contains("40 to 64")),
            "{e}"
        );
    }
    // A URL setting takes only an http(s) URL or empty; the message names the setting and what
    // is allowed.
    for value in ["anything", "ftp://host/v1", "javascript:alert(1)"] {
        let e = patch(json!({"set": {"retrieval.embeddings.url": value}}))
            .await?
            .expect_envelope(400, "INVALID_ARGUMENT")?;
        assert_eq!(
            (&e["details"]["key"], &e["details"]["problem"]),
            (&json!("retrieval.embeddings.url"), &json!("bad_url")),
            "{e}"
        );
        ensure!(
            e["message"]
                .as_str()
                .is_some_and(|m| m.contains("retrieval.embeddings.url") && m.contains("http:// or https://")),
            "{e}"
        );
    }
    // `force` stores a key Coffer does not read, never a bad value of one it does.
    let e = patch(json!({"set": {"retention.audit_days": "-1"}, "force": true}))
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["details"]["key"], "retention.audit_days", "{e}");
    // A refused patch writes nothing, not even its valid part.
    let e = patch(json!({"set": {"gateway.call_timeout_ms": "5000", "retention.audit_days": "x"}}))
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["details"]["key"], "retention.audit_days", "{e}");
    assert_eq!(api.get("/v1/settings").reply().await?.ok_json()?, json!({"values": {}}));

    // A valid patch.
    let body = json!({"set": {"gateway.call_timeout_ms": "5000", "retention.audit_days": "0", "my.own.key": "x"}, "force": true});
    let values = patch(body).await?.ok_json()?;
    let want = json!({"values": {"gateway.call_timeout_ms": "5000", "my.own.key": "x", "retention.audit_days": "0"}});
    assert_eq!(values, want);
    assert_eq!(api.get("/v1/settings").reply().await?.ok_json()?, want);
    // Removing is not checked against the table: it is how a forced key goes away.
    let values = patch(json!({"remove": ["my.own.key", "never.set"]})).await?.ok_json()?;
    assert_eq!(values, json!({"values": {"gateway.call_timeout_ms": "5000", "retention.audit_days": "0"}}));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_settings_patches_lose_nothing() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    const N: usize = 24;
    let mut patches = tokio::task::JoinSet::new();
    for i in 0..N {
        let api = api.clone();
        patches.spawn(async move {
            // Each patch sets a key of its own and, all at once, the same known key.
            let body = json!({"set": {format!("e2e.concurrent.{i:02}"): i.to_string(), "gateway.call_timeout_ms": (1000 + i).to_string()}, "force": true});
            api.request(reqwest::Method::PATCH, "/v1/settings").json(&body).reply().await
        });
    }
    while let Some(r) = patches.join_next().await {
        r??.ok_json()?;
    }
    let values = api.get("/v1/settings").reply().await?.ok_json()?;
    let values = values["values"].as_object().context("values")?;
    for i in 0..N {
        assert_eq!(values.get(&format!("e2e.concurrent.{i:02}")), Some(&json!(i.to_string())), "{values:?}");
    }
    let shared = values["gateway.call_timeout_ms"].as_str().context("the shared key")?.parse::<usize>()?;
    ensure!((1000..1000 + N).contains(&shared), "the shared key holds one patch's value: {shared}");
    assert_eq!(values.len(), N + 1, "{values:?}");
    Ok(())
}

#[tokio::test]
async fn filesystem_peer_through_coffer() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let dir = home.temp().join("shared-files");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("note.txt"), "hello from a file")?;
    let node = coffer_runtime::connect::which_on_path("node").context("node is not on PATH")?;
    let entry = coffer_tests::peer("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")?;
    register_stdio(&api, "fs", &node, &[entry.display().to_string(), dir.display().to_string()], json!({})).await?;
    // A new session waits 1 s for a server never listed; a cold node server can take longer here.
    coffer_tests::mcp::wait_catalog_ready(&api, "fs", std::time::Duration::from_secs(30)).await?;
    let s = McpSession::latest(&api).await?;
    let names = s.tool_names().await?;
    let read =
        names.iter().find(|n| *n == "fs__read_text_file" || *n == "fs__read_file").context("a read tool")?.clone();
    let file = dir.join("note.txt").canonicalize()?;
    let r = s.tool(&read, json!({"path": file})).await?;
    let text = r["result"]["content"][0]["text"].as_str().unwrap_or_default();
    ensure!(text.contains("hello from a file"), "{r}");
    // Outside the allowed folder: the upstream's own error comes back unchanged (isError).
    let r = s.tool(&read, json!({"path": "/etc/hostname"})).await?;
    ensure!(r["result"]["isError"] == true || r["error"].is_object(), "{r}");
    Ok(())
}
