//! The `coffer` CLI against real daemons: lifecycle commands, entry points racing to start a
//! daemon from nothing, and `coffer daemon stop` with requests in flight.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use coffer_tests::{CliOutput, SendExt, TestHome, wait_for};
use serde_json::{Value, json};

/// Runs `coffer <args>` `n` times at once; returns the outputs in completion order.
async fn run_concurrently(home: &TestHome, args: &[&str], n: usize) -> anyhow::Result<Vec<CliOutput>> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let child = home.cli_command(args)?.spawn().context("starting coffer")?;
        set.spawn(async move { tokio::time::timeout(coffer_tests::CLI_TIMEOUT, child.wait_with_output()).await });
    }
    let mut outs = Vec::new();
    while let Some(r) = set.join_next().await {
        let out = r?.context("coffer ran too long")??;
        outs.push(CliOutput {
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(outs)
}

#[tokio::test]
async fn daemon_lifecycle_through_the_cli() -> anyhow::Result<()> {
    let home = TestHome::new()?;

    // Read-only commands never start a daemon.
    let st = home.cli(&["daemon", "status"]).await?;
    assert_eq!(st.code, Some(5), "{st}");
    assert!(st.stdout.contains("not running"), "{st}");
    let stop = home.cli(&["daemon", "stop", "--json"]).await?.ok()?;
    assert_eq!(stop.json()?, json!({"running": false, "stopped": false}));
    assert!(home.processes().is_empty(), "no daemon started: {:?}", home.processes());

    let start = home.cli(&["daemon", "start", "--json"]).await?.ok()?;
    let j = start.json()?;
    assert_eq!((&j["running"], &j["already_running"]), (&json!(true), &json!(false)), "{start}");
    let info = home.daemon_info()?;
    assert_eq!(j["pid"], info.pid);
    assert_eq!(j["port"], info.port);
    let daemons = home.daemon_processes();
    assert_eq!(daemons.iter().map(|p| p.pid as u32).collect::<Vec<_>>(), [info.pid], "the daemon outlives the CLI");

    let again = home.cli(&["daemon", "start", "--json"]).await?.ok()?.json()?;
    assert_eq!((&again["already_running"], &again["pid"]), (&json!(true), &json!(info.pid)));
    // The human output says what to do next: the console's URL and `coffer ui`, `coffer status`.
    let human = home.cli(&["daemon", "start"]).await?.ok()?;
    let url = format!("http://127.0.0.1:{}/ui", info.port);
    for next in ["already running", "coffer ui", url.as_str(), "coffer status", "coffer connect claude-code"] {
        assert!(human.stdout.contains(next), "daemon start names {next:?}: {human}");
    }

    // --json prints the REST body unchanged.
    let st = home.cli(&["daemon", "status", "--json"]).await?.ok()?.json()?;
    assert_eq!(st["daemon"]["pid"], info.pid);
    assert_eq!(st["services"].as_array().map(Vec::len), Some(5), "{st}");
    let human = home.cli(&["status"]).await?.ok()?;
    assert!(human.stdout.contains(&format!("pid {}", info.pid)), "{human}");

    let stop = home.cli(&["daemon", "stop", "--json"]).await?.ok()?;
    assert_eq!(stop.json()?, json!({"running": false, "stopped": true}));
    assert!(home.processes().is_empty(), "stop returns once everything is down: {:?}", home.processes());
    assert!(!home.daemon_json_path().exists(), "daemon.json removed");
    Ok(())
}

#[tokio::test]
async fn two_daemon_starts_at_once_make_one_daemon() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let outs = run_concurrently(&home, &["daemon", "start", "--json"], 2).await?;
    let mut pids = BTreeSet::new();
    for o in &outs {
        assert!(o.success(), "{o}");
        pids.insert(o.json()?["pid"].as_u64().context("pid")?);
    }
    assert_eq!(pids.len(), 1, "both report the same daemon: {outs:?}");
    let daemons = home.daemon_processes();
    assert_eq!(daemons.len(), 1, "exactly one daemon: {daemons:?}");
    assert_eq!(Some(daemons[0].pid as u64), pids.first().copied());
    assert_eq!(home.daemon_info()?.pid as u64, daemons[0].pid as u64);
    Ok(())
}

#[tokio::test]
async fn ten_status_at_once_against_no_daemon_make_one_daemon() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let started = Instant::now();
    let outs = run_concurrently(&home, &["status", "--json"], 10).await?;
    let took = started.elapsed();
    let mut pids = BTreeSet::new();
    for o in &outs {
        assert!(o.success(), "{o}");
        let body = o.json()?;
        pids.insert(body["daemon"]["pid"].as_u64().context("daemon.pid")?);
        assert_eq!(body["services"].as_array().map(Vec::len), Some(5), "{o}");
    }
    assert_eq!(pids.len(), 1, "all ten saw the same daemon: {pids:?}");
    let daemons = home.daemon_processes();
    assert_eq!(daemons.len(), 1, "exactly one daemon: {daemons:?}");
    assert_eq!(Some(daemons[0].pid as u64), pids.first().copied());
    let stdio = std::fs::read_to_string(home.logs_dir().join("daemon.stdio")).unwrap_or_default();
    let losers = stdio.matches("already running").count();
    eprintln!(
        "10 concurrent `coffer status` took {} ms; {losers} extra daemon(s) started and lost the lock",
        took.as_millis()
    );
    Ok(())
}

/// `coffer daemon stop` while reads and writes are in flight: it exits 0 once everything is
/// down; every request gets either its normal answer or a connection error (never a 5xx), and
/// every acknowledged write is still there after the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_stop_with_requests_in_flight() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    home.cli(&["daemon", "start"]).await?.ok()?;
    let api = home.api()?;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));

    let mut load = tokio::task::JoinSet::new();
    for w in 0..6 {
        let (api, stop, done) = (api.clone(), stop.clone(), done.clone());
        load.spawn(async move {
            let mut acked = Vec::new();
            let mut answers: Vec<(u16, String)> = Vec::new();
            let mut transport_errors = 0usize;
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let (req, name) = if w % 2 == 0 {
                    (api.get("/v1/status"), None)
                } else {
                    let name = format!("s{w}-{i}");
                    i += 1;
                    (
                        api.post_json("/v1/mcp/servers", &json!({"name": name, "url": "http://127.0.0.1:9/mcp"})),
                        Some(name),
                    )
                };
                match req.reply().await {
                    Ok(r) => {
                        if r.status.is_success() {
                            acked.extend(name);
                        }
                        answers.push((r.status.as_u16(), r.text));
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    // Refused or reset connections are how a stopped server says no.
                    Err(_) => transport_errors += 1,
                }
            }
            (acked, answers, transport_errors)
        });
    }
    wait_for("40 requests answered", Duration::from_secs(30), || {
        let n = done.load(Ordering::Relaxed);
        async move { Ok((n >= 40).then_some(())) }
    })
    .await?;

    let out = home.cli(&["daemon", "stop"]).await?;
    stop.store(true, Ordering::Relaxed);
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("stopped"), "{out}");
    assert!(home.processes().is_empty(), "stop returned with processes left: {:?}", home.processes());
    assert!(!home.daemon_json_path().exists());

    let mut acked = Vec::new();
    let mut bad = Vec::new();
    let mut answered = 0;
    while let Some(r) = load.join_next().await {
        let (a, answers, _transport_errors) = r?;
        acked.extend(a);
        answered += answers.len();
        bad.extend(answers.into_iter().filter(|(s, _)| !matches!(s, 200 | 201)));
    }
    assert!(bad.is_empty(), "requests answered with an error during stop: {bad:?}");

    let api = home.start_daemon().await?;
    let list: Value = api.get("/v1/mcp/servers").reply().await?.ok_json()?;
    let stored: BTreeSet<&str> =
        list["items"].as_array().context("items")?.iter().filter_map(|s| s["name"].as_str()).collect();
    let lost: Vec<_> = acked.iter().filter(|n| !stored.contains(n.as_str())).collect();
    assert!(lost.is_empty(), "acknowledged writes lost across stop: {lost:?}");
    eprintln!("{answered} requests answered during the run, {} writes acknowledged", acked.len());
    Ok(())
}
