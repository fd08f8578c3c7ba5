//! `/v1/settings` under bad and concurrent input: every value is checked against the settings
//! table, a refused patch writes nothing, concurrent patches lose nothing.
use anyhow::{Context, ensure};
use coffer_tests::SendExt;
use coffer_tests::inproc::Edge;
use serde_json::{Value, json};

#[tokio::test]
async fn settings_patches_are_checked_against_the_settings_table() -> anyhow::Result<()> {
    let edge = Edge::start().await?;
    let api = edge.api();
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
    let edge = Edge::start().await?;
    let api = edge.api();
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
