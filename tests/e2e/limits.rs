//! Every listener has timeouts and limits, and logs cannot fill the disk (issue 32 parts 3 and
//! 4), as the owner's own uid: the edge's Unix socket under a flood, slowloris and oversized
//! heads; unauthenticated requests with 60 KB paths; a knowledge-base pass that keeps failing.
//! The same attacks from another uid are in `hostile/listeners.rs` and `hostile/logs.rs`.
use std::time::Duration;

use coffer_tests::attack::{Attack, Mode, Target, dir_bytes, gateway_pid, owner_is_served, rss_kib};
use coffer_tests::{SendExt, TestHome, wait_for};

/// Thousands of idle connections and a slowloris on the edge's Unix socket (from the owner's
/// uid: no other uid can reach it): the cap closes the oldest unauthenticated ones, slow heads
/// are closed after the head timeout, and the token holder is answered on the socket and the
/// port throughout. The head timeout is [`HEAD_TIMEOUT_MS`] here (10 s by default: the same
/// reaper closes them either way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_survives_a_flood_and_a_slowloris() -> anyhow::Result<()> {
    let home = TestHome::builder().env("COFFER_HEAD_TIMEOUT_MS", HEAD_TIMEOUT_MS.to_string()).build()?;
    let api = home.start_daemon().await?;
    let socket = home.root().join("gateway.sock");
    let target = Target::Unix(socket.clone());
    let flood = Attack::start(Mode::Flood, &target, 3_000, 15, false).await?;
    let slow = Attack::start(Mode::Slowloris, &target, 300, 15, false).await?;
    assert!(flood.ready().opened >= 2_000, "the flood opened {:?}", flood.ready());
    for _ in 0..5 {
        owner_is_served(&api, Some(&socket)).await?;
    }
    // The slowloris ends once the server has closed all of its connections (or after 15 s);
    // the flood is held until then.
    let slow = slow.finish().await?;
    owner_is_served(&api, Some(&socket)).await?;
    let flood = flood.stop().await?;
    // Beyond the cap of 1,024 (plus 64 for the owner's uid) the oldest were closed.
    assert!(flood.closed + 1_200 >= flood.opened, "{flood:?}");
    assert!(slow.closed >= 250, "slow heads were closed after the {HEAD_TIMEOUT_MS} ms head timeout: {slow:?}");
    owner_is_served(&api, Some(&socket)).await?;
    Ok(())
}

/// The request-head timeout the slowloris tests give the daemon (`COFFER_HEAD_TIMEOUT_MS`), ms:
/// long enough for any honest head on a loaded machine, short enough not to wait out 10 s.
pub const HEAD_TIMEOUT_MS: u64 = 2_000;

/// Request heads larger than 64 KiB are answered 431 and not buffered: 500 connections each
/// sending 300 KB of one header grow the gateway by far less than the 150 MB they send, and
/// the memory is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_are_refused_and_memory_stays_bounded() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let gw = gateway_pid(&home)?;
    owner_is_served(&api, None).await?;
    let before = rss_kib(gw);
    let big = Attack::start(Mode::BigHead { kib: 300 }, &Target::Tcp(api.port()), 500, 10, false).await?;
    owner_is_served(&api, None).await?;
    let during = rss_kib(gw);
    let report = big.finish().await?;
    assert!(report.closed >= 450, "oversized heads were answered and closed: {report:?}");
    owner_is_served(&api, None).await?;
    let after = rss_kib(gw);
    eprintln!("gateway RSS: before {before} KiB, during {during} KiB, after {after} KiB");
    assert!(during.saturating_sub(before) < 64 * 1024, "RSS grew from {before} to {during} KiB");
    assert!(after.saturating_sub(before) < 48 * 1024, "RSS stayed at {after} KiB (before: {before})");
    Ok(())
}

/// 2,000 unauthenticated requests with 60 KB paths (each once wrote 120 KB of log) grow the
/// logs folder by less than 1 MB: paths are clipped and refusals rate-limited. The daemon
/// keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_requests_with_huge_paths_do_not_fill_the_logs() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let logs = home.logs_dir();
    let before = settled_size(&logs).await?;
    let path = format!("/v1/{}", "x".repeat(60 * 1024));
    let mut sent = 0;
    let mut statuses = std::collections::BTreeMap::new();
    for _batch in 0..100 {
        let replies =
            futures_util::future::join_all((0..20).map(|_| api.anon(reqwest::Method::GET, &path).reply())).await;
        for r in replies {
            *statuses.entry(r?.status.as_u16()).or_insert(0) += 1;
            sent += 1;
        }
    }
    assert_eq!(sent, 2_000);
    assert_eq!(statuses.get(&401), Some(&2_000), "{statuses:?}");
    owner_is_served(&api, None).await?;
    let grown = settled_size(&logs).await?.saturating_sub(before);
    eprintln!("logs grew by {grown} bytes for 2,000 requests");
    assert!(grown < 1024 * 1024, "the logs grew by {grown} bytes");
    let text = home.log_text("gateway");
    assert!(text.contains("…[+"), "a clipped path shows the marker");
    assert!(text.contains("suppressed="), "refusal lines say how many were suppressed");
    Ok(())
}

/// The size of `dir` once it stops changing (the log writers flush in the background), within 10 s.
pub async fn settled_size(dir: &std::path::Path) -> anyhow::Result<u64> {
    let mut last = u64::MAX;
    wait_for("the logs folder to stop growing", Duration::from_secs(10), || {
        let now = dir_bytes(dir);
        let settled = now == last;
        last = now;
        async move {
            if !settled {
                // Polled again after wait_for's interval: a change between two polls means
                // a writer is still flushing.
                return Ok(None);
            }
            Ok(Some(now))
        }
    })
    .await
}

/// A knowledge base whose file cannot be read (even by root: a write-only sysctl) makes every
/// pass fail. The pass is retried with backoff and logged once, not every 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_file_is_a_file_error_and_passes_over_it_neither_fail_nor_warn() -> anyhow::Result<()> {
    // A file that cannot be read (root reads everything but a write-only /proc file) once made
    // every pass fail, retried every 2 s with a warning each time (issue 38 §3). It is now that
    // file's error, and the passes go on: none fails, none warns, rescans included.
    let home = TestHome::builder().log_filter("info,coffer_retrieval=debug").build()?;
    let api = home.start_daemon().await?;
    let out = home.cli(&["kb", "add", "sysctl", "--path", "/proc/sys/vm", "--include", "compact_memory"]).await?;
    anyhow::ensure!(out.success(), "kb add: {}", out.stderr);
    let status = || async {
        let out = home.cli(&["kb", "status", "sysctl", "--json"]).await?;
        anyhow::ensure!(out.success(), "kb status: {}", out.stderr);
        out.json()
    };
    let first = wait_for("the pass to end with the file's error", Duration::from_secs(30), || async {
        let s = status().await?;
        Ok((s["progress"]["state"] == "idle" && s["errors"].as_array().is_some_and(|e| !e.is_empty())).then_some(s))
    })
    .await?;
    assert_eq!(first["errors"][0]["path"], "compact_memory", "{first}");
    assert!(first["errors"][0]["error"].as_str().is_some_and(|e| e.starts_with("cannot read")), "{first}");
    // Rescans every second: three more passes over the same unreadable file.
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&serde_json::json!({"set": {"retrieval.rescan_interval_s": "1"}}))
        .reply()
        .await?;
    anyhow::ensure!(r.status == 200, "{} {}", r.status, r.text);
    let job = first["progress"]["job"].as_u64().unwrap_or_default();
    let last = wait_for("three more passes", Duration::from_secs(30), || async {
        let s = status().await?;
        Ok((s["progress"]["job"].as_u64().unwrap_or_default() >= job + 3 && s["progress"]["state"] == "idle")
            .then_some(s))
    })
    .await?;
    assert_eq!(last["errors"], first["errors"], "the same error, once: {last}");
    let text = home.log_text("retrieval");
    let sysctl: Vec<&str> = text.lines().filter(|l| l.contains("kb=sysctl")).collect();
    assert!(
        !sysctl
            .iter()
            .any(|l| l.contains("Reconcile pass failed") || l.contains("The pass failed") || l.contains(" WARN ")),
        "no pass failed or warned: {sysctl:#?}"
    );
    assert!(sysctl.iter().filter(|l| l.contains("Reconcile pass done")).count() >= 4, "{sysctl:#?}");
    Ok(())
}
