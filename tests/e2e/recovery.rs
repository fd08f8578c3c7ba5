//! Crash recovery: a service killed with SIGKILL is restarted by the supervisor on the same
//! listener (same socket, hence same address), reported with `restarts ≥ 1`, and healthy again
//! quickly; while the gateway is down the public port keeps its listener.
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use coffer_tests::{Api, SendExt, TestHome, procs, service_in, wait_for};
use nix::sys::signal::Signal;

/// Recovery must finish within this (first restart backoff is 100 ms).
const RECOVERY_BUDGET: Duration = Duration::from_secs(2);

/// The inherited listener descriptors of each service (see the supervisor's `run_with`): the
/// internal listener on fd 3, and the edge's public listener on fd 4.
fn listener_fds(service: &str) -> &'static [i32] {
    if service == "gateway" { &[3, 4] } else { &[3] }
}

fn sockets(pid: i32, service: &str) -> anyhow::Result<Vec<String>> {
    listener_fds(service)
        .iter()
        .map(|fd| {
            let t = procs::fd_target(pid, *fd).with_context(|| format!("{service} pid {pid} has no fd {fd}"))?;
            ensure!(t.starts_with("socket:["), "{service} fd {fd} is {t}, not a socket");
            Ok(t)
        })
        .collect()
}

/// Kills `service` with SIGKILL and waits until `/v1/status` shows a new, healthy process with
/// `restarts ≥ 1` that holds the very same listening socket(s). Returns the recovery time.
async fn kill_and_recover(api: &Api, service: &str) -> anyhow::Result<Duration> {
    let before = api.service(service).await?;
    assert_eq!(before["state"], "healthy");
    let old_pid = before["pid"].as_i64().context("pid")? as i32;
    let old_proc = procs::proc_info(old_pid).context("service process")?;
    let old_sockets = sockets(old_pid, service)?;

    let killed_at = Instant::now();
    procs::signal(old_pid, Signal::SIGKILL);
    let after = wait_for(&format!("{service} to be restarted and healthy"), Duration::from_secs(10), || async {
        // While the gateway itself is down, /v1/status cannot answer: that is the gap.
        let s = api.service(service).await?;
        let healthy = s["state"] == "healthy" && s["pid"] != old_pid && s["restarts"].as_u64() >= Some(1);
        Ok(healthy.then_some(s))
    })
    .await?;
    let took = killed_at.elapsed();
    eprintln!("{service}: recovered in {} ms", took.as_millis());

    ensure!(!procs::still_alive(&old_proc), "old {service} process is gone");
    let new_pid = after["pid"].as_i64().context("pid")? as i32;
    let new_proc = procs::proc_info(new_pid).context("new service process")?;
    assert_eq!(new_proc.name, format!("coffer-{service}"));
    assert_eq!(sockets(new_pid, service)?, old_sockets, "{service} serves on the same listener after restart");
    assert!(after["last_error"].as_str().is_some_and(|e| e.contains("signal 9")), "last_error names the kill: {after}");
    let status = api.status().await?;
    for other in ["store", "retrieval", "chat", "gateway"] {
        assert_eq!(service_in(&status, other)?["state"], "healthy", "{other} after {service} recovered: {status}");
    }
    Ok(took)
}

async fn recovers(service: &str) -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let took = kill_and_recover(&api, service).await?;
    assert!(took < RECOVERY_BUDGET, "{service} recovered in {took:?}, budget {RECOVERY_BUDGET:?}");
    // A second crash is also recovered (backoff grows but stays well inside the budget).
    let took = kill_and_recover(&api, service).await?;
    assert!(took < RECOVERY_BUDGET, "{service} recovered the second time in {took:?}");
    assert!(api.service(service).await?["restarts"].as_u64() >= Some(2));
    Ok(())
}

#[tokio::test]
async fn store_killed_is_restarted_on_same_address() -> anyhow::Result<()> {
    recovers("store").await
}

#[tokio::test]
async fn retrieval_killed_is_restarted_on_same_address() -> anyhow::Result<()> {
    recovers("retrieval").await
}

#[tokio::test]
async fn chat_killed_is_restarted_on_same_address() -> anyhow::Result<()> {
    recovers("chat").await
}

#[tokio::test]
async fn gateway_killed_is_restarted_and_public_port_keeps_answering() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let port = api.port();
    let took = kill_and_recover(&api, "gateway").await?;
    assert!(took < RECOVERY_BUDGET, "gateway recovered in {took:?}, budget {RECOVERY_BUDGET:?}");
    assert_eq!(home.daemon_info()?.port, port, "daemon.json keeps the port");
    // The public port answers again, with the same token, for open and authenticated routes.
    let health = api.health().await?;
    assert_eq!(health["pid"], home.daemon_info()?.pid);
    for _ in 0..20 {
        let r = api.get("/v1/status").reply().await?;
        assert_eq!(r.status, 200, "{}", r.text);
        r.trace_id()?;
    }
    Ok(())
}
