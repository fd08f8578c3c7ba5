//! Retention end to end: rows older than the age limits are gone after the store's start-up
//! pass, and `POST /v1/maintenance/prune` keeps only the newest `retention.*_max_rows`,
//! reporting what it deleted and auditing itself.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::{Api, SendExt, TestHome, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

async fn calls(api: &Api, n: usize) -> anyhow::Result<()> {
    for i in 0..n {
        let body = json!({"name": "tiny__echo", "arguments": {"message": format!("call {i}")}});
        api.post_json("/v1/tools/call", &body).reply().await?.ok_json()?;
    }
    Ok(())
}

async fn list(api: &Api, path: &str) -> anyhow::Result<Vec<Value>> {
    let r = api.get(path).reply().await?.ok_json()?;
    Ok(r["items"].as_array().context("items")?.clone())
}

/// Waits until `/v1/invocations` lists exactly `n` rows (they are written in batches).
async fn invocations(api: &Api, n: usize) -> anyhow::Result<Vec<Value>> {
    wait_for(&format!("{n} invocation rows"), Duration::from_secs(20), || async {
        let items = list(api, "/v1/invocations?limit=500").await?;
        Ok((items.len() == n).then_some(items))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_prunes_by_age_at_start_and_by_count_on_demand() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    ensure!(api.post_json("/v1/mcp/servers", &json!({"name": "tiny", "command": tiny})).reply().await?.status == 201);
    calls(&api, 6).await?;
    invocations(&api, 6).await?;
    home.terminate_daemon(Duration::from_secs(20)).await?;

    // Age four invocations and add three year-old audit rows while the daemon is stopped.
    {
        // The daemon is stopped: the test backdates rows in its file directly.
        #[allow(clippy::disallowed_methods)]
        let c = rusqlite::Connection::open(home.root().join("coffer.db"))?;
        c.execute(
            "UPDATE mcp_invocations SET at = '2020-01-01T00:00:00.000Z' WHERE id IN (SELECT id FROM mcp_invocations ORDER BY id LIMIT 4)",
            [],
        )?;
        for _ in 0..3 {
            c.execute(
                "INSERT INTO audit_log (at, actor, action, target, outcome) VALUES ('2020-01-01T00:00:00.000Z', 'cli', 'e2e.old', 'x', 'ok')",
                [],
            )?;
        }
    }

    // The store prunes at start: the aged rows go, the recent ones stay.
    let api = home.start_daemon().await?;
    let left = invocations(&api, 2).await?;
    ensure!(left.iter().all(|i| i["at"].as_str().is_some_and(|a| !a.starts_with("2020"))), "{left:?}");
    assert!(list(&api, "/v1/audit?action=e2e.old").await?.is_empty());
    home.wait_for_log_line("store", &["Retention pruned", "invocations=4", "audit=3"], Duration::from_secs(10)).await?;

    // By count, on demand.
    let r = api
        .request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"retention.invocations_max_rows": "3", "retention.audit_max_rows": "2"}}))
        .reply()
        .await?;
    r.ok_json()?;
    // More audited changes, so the audit limit has something to cut.
    for i in 0..3 {
        let r = api
            .request(Method::PATCH, "/v1/settings")
            .json(&json!({"set": {"e2e.n": i.to_string()}, "force": true}))
            .reply()
            .await?;
        r.ok_json()?;
    }
    calls(&api, 5).await?;
    let all = invocations(&api, 7).await?;
    let audit_before = list(&api, "/v1/audit?limit=500").await?.len();
    ensure!(audit_before > 2, "{audit_before} audit rows");
    let r = api.post("/v1/maintenance/prune").header("X-Coffer-Actor", "cli").reply().await?.ok_json()?;
    assert_eq!(r, json!({"deleted": {"invocations": 4, "audit": audit_before - 2}}));
    let kept = list(&api, "/v1/invocations").await?;
    assert_eq!(kept, all[..3].to_vec(), "the newest three are kept");
    let audit = list(&api, "/v1/audit").await?;
    assert_eq!(audit.len(), 3, "two kept, plus the prune's own row: {audit:?}");
    assert_eq!((&audit[0]["action"], &audit[0]["actor"]), (&json!("maintenance.prune"), &json!("cli")));
    assert_eq!(
        audit[0]["detail"],
        json!({"invocations": 4, "audit": audit_before - 2, "conversations_archived": 0, "conversations_deleted": 0})
    );

    // A second pass has nothing left to do but its own audit row beyond the limit.
    let r = api.post("/v1/maintenance/prune").reply().await?.ok_json()?;
    assert_eq!(r["deleted"]["invocations"], 0);
    Ok(())
}
