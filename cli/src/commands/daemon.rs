//! `coffer daemon start|stop|status|restart`: the daemon's lifecycle.
//!
//! Only `start` and `restart` ever start a daemon. `stop` asks the daemon to stop over REST and
//! then watches `daemon.lock` — the daemon holds it until its very last moment, so a released
//! lock means every service is down and `daemon.json` is gone.
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use coffer_api::daemon::{ServiceRestart, ServiceStatus, Status};
use coffer_runtime::daemon_file::{DaemonInfo, lock_is_held};
use serde_json::json;

use crate::api::ApiClient;
use crate::context::Ctx;
use crate::error::{CliError, exit};
use crate::output;

/// How long `stop` waits for the daemon to release its lock after the stop request (and again
/// after SIGTERM).
pub const STOP_DEADLINE: Duration = Duration::from_secs(15);
/// How long `stop` waits for a daemon that holds the lock but does not answer yet (still
/// starting) before falling back to SIGTERM.
const UNRESPONSIVE_DEADLINE: Duration = Duration::from_secs(15);
/// Interval of the local lock probe.
const POLL: Duration = Duration::from_millis(50);
/// How long `restart gateway` waits for the new gateway to answer and be healthy.
pub const GATEWAY_RESTART_DEADLINE: Duration = Duration::from_secs(15);
/// Deadline of one probe while the gateway restarts.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Interval of those probes.
const GATEWAY_POLL: Duration = Duration::from_millis(100);

#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
    /// Start the daemon unless it is already running.
    Start(NoArgs),
    /// Stop the daemon and every process it started; never starts one.
    Stop(NoArgs),
    /// Show the daemon's status; exits 5 without starting it when it is not running, or runs but
    /// does not answer (`--json`: `"running": true, "answering": false`).
    Status(NoArgs),
    /// Stop the daemon (if running), then start it (e.g. after an upgrade); with SERVICE,
    /// restart only that service of the running daemon.
    #[command(after_help = RESTART_EXAMPLES)]
    Restart(RestartArgs),
}

const RESTART_EXAMPLES: &str = "\
Examples:
  coffer daemon restart
  coffer daemon restart store
  coffer daemon restart gateway

With SERVICE, waits until the service is healthy again. Restarting the gateway ends every MCP
session (clients reconnect) and waits up to 15 s for the new gateway to answer.";

#[derive(Debug, Args)]
pub struct RestartArgs {
    /// A service of the running daemon to restart alone (store, retrieval, chat, gateway).
    pub service: Option<String>,
}

#[derive(Debug, Args)]
pub struct NoArgs {}

/// Runs one `coffer daemon …` command.
///
/// # Errors
/// Exit 5 when a daemon cannot be started or reached, 1 when it does not stop.
pub async fn run(ctx: &Ctx, cmd: DaemonCommand) -> Result<(), CliError> {
    match cmd {
        DaemonCommand::Start(_) => start(ctx).await,
        DaemonCommand::Stop(_) => {
            ctx.check_home()?;
            let was_running = stop(ctx).await?;
            report_stopped(ctx, was_running)
        }
        DaemonCommand::Status(_) => status(ctx).await,
        DaemonCommand::Restart(RestartArgs { service: Some(name) }) => restart_service(ctx, &name).await,
        DaemonCommand::Restart(RestartArgs { service: None }) => {
            // With --json only the final state is printed: one JSON document per command.
            if stop(ctx).await? && !ctx.json {
                output::println("Coffer daemon stopped")?;
            }
            start(ctx).await
        }
    }
}

async fn start(ctx: &Ctx) -> Result<(), CliError> {
    let (api, already) = match ctx.detect().await {
        Some(api) => (api, true),
        None => (ctx.connect().await?, false),
    };
    let info = &api.daemon().info;
    if ctx.json {
        return output::print_json(
            &json!({"running": true, "already_running": already, "pid": info.pid, "port": info.port}),
        );
    }
    let what = if already { "already running" } else { "running" };
    output::print(&format!(
        "Coffer daemon {what} (pid {}, port {})\n{}",
        info.pid,
        info.port,
        next_steps(&format!("http://127.0.0.1:{}/ui", info.port))
    ))
}

/// What to do after `daemon start`: open the console (its URL, and `coffer ui` which opens it
/// logged in), check the daemon, connect a client.
fn next_steps(console: &str) -> String {
    format!(
        "Next:\n  coffer ui                       open the web console, logged in ({console})\n  coffer status                   what runs, and what is wrong if anything is\n  coffer connect claude-code      give Claude Code Coffer's tools (or codex, …)\n"
    )
}

/// `POST /v1/daemon/services/{name}/restart`, which answers once the service is healthy again
/// (or has given up) — except for the gateway, which serves that very request: it answers 202
/// and restarts, and this waits ([`wait_for_new_gateway`]) until the new one answers, healthy.
/// Never starts a daemon.
async fn restart_service(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    ctx.check_home()?;
    let api = ctx.detect().await.ok_or(CliError::NotRunning)?;
    let before = if name == GATEWAY { service_of(&api.get_as::<Status>("/v1/status").await?, GATEWAY) } else { None };
    let path = format!("/v1/daemon/services/{}/restart", crate::api::path_segment(name));
    let resp = api.send(api.request(reqwest::Method::POST, &path)).await?;
    let resp_body = if resp.status == 202 && name == GATEWAY {
        let old_pid = before.as_ref().map_or(0, |s| s.pid);
        let s = wait_for_new_gateway(&api, old_pid, GATEWAY_RESTART_DEADLINE).await?;
        let restarted = ServiceRestart { name: GATEWAY.into(), pid: s.pid, state: s.state, restarts: s.restarts };
        crate::api::ApiResponse { status: 200, trace: resp.trace, body: json!(restarted).to_string() }
    } else {
        resp
    };
    if ctx.json {
        return output::print_body(&resp_body.body);
    }
    let s: ServiceRestart = resp_body.parse()?;
    output::println(&format!(
        "Restarted {} (pid {}, {})",
        output::text_cell(&s.name, 40),
        s.pid,
        output::text_cell(&s.state, 20)
    ))
}

/// The service the gateway runs as.
const GATEWAY: &str = "gateway";

/// The entry of `name` in a `/v1/status` body.
fn service_of(status: &Status, name: &str) -> Option<ServiceStatus> {
    status.services.iter().find(|s| s.name == name).cloned()
}

/// True when a `/v1/status` body shows a gateway other than `old_pid`, healthy.
pub fn is_new_healthy_gateway(status: &Status, old_pid: u32) -> bool {
    service_of(status, GATEWAY).is_some_and(|g| g.state == "healthy" && g.pid != 0 && g.pid != old_pid)
}

/// After a 202 to `restart gateway`: polls until `GET /v1/health` answers again and
/// `/v1/status` shows the gateway healthy with a pid other than `old_pid`; returns its entry.
/// Connection errors while the old gateway drains and the new one starts are expected.
///
/// # Errors
/// After `deadline`: exit 5 when the daemon did not answer the last probe, exit 1 when it
/// answered but the gateway did not become healthy (with what the status last showed).
pub async fn wait_for_new_gateway(
    api: &ApiClient,
    old_pid: u32,
    deadline: Duration,
) -> Result<ServiceStatus, CliError> {
    let until = Instant::now() + deadline;
    let mut last: Option<ServiceStatus> = None;
    loop {
        let health = api.send(api.request(reqwest::Method::GET, "/v1/health").timeout(PROBE_TIMEOUT)).await;
        let answered = health.is_ok();
        if answered
            && let Ok(status) = api.send(api.request(reqwest::Method::GET, "/v1/status").timeout(PROBE_TIMEOUT)).await
            && let Ok(status) = status.parse::<Status>()
        {
            let gateway = service_of(&status, GATEWAY);
            if is_new_healthy_gateway(&status, old_pid)
                && let Some(g) = gateway
            {
                return Ok(g);
            }
            last = gateway;
        }
        if Instant::now() >= until {
            let secs = deadline.as_secs();
            if !answered {
                return Err(CliError::Unreachable(format!(
                    "no answer {secs}s after the gateway restart; see `coffer logs gateway`"
                )));
            }
            let shown = last.map_or_else(
                || "unknown".to_owned(),
                |g| format!("{}, pid {}", output::text_cell(&g.state, 20), g.pid),
            );
            return Err(CliError::Failed(format!(
                "the gateway was not healthy again within {secs}s (last seen: {shown}); see `coffer logs gateway`"
            )));
        }
        tokio::time::sleep(GATEWAY_POLL).await;
    }
}

async fn status(ctx: &Ctx) -> Result<(), CliError> {
    ctx.check_home()?;
    match ctx.detect().await {
        Some(api) => super::status::show(ctx, &api).await,
        // Running (the lock is held) but not answering: say so, never "not running".
        None if lock_is_held(&ctx.home.daemon_lock()) => {
            let info = DaemonInfo::read(&ctx.home.daemon_json()).ok();
            if ctx.json {
                output::print_json(&json!({
                    "running": true,
                    "answering": false,
                    "pid": info.as_ref().map(|i| i.pid),
                    "port": info.as_ref().map(|i| i.port),
                }))?;
            } else {
                match &info {
                    Some(i) => output::println(&format!(
                        "Coffer daemon (pid {}) is running but its HTTP edge on 127.0.0.1:{} does not answer \
                         (its gateway may be stopped, hung or overloaded); `coffer daemon restart` restarts it",
                        i.pid, i.port
                    ))?,
                    None => output::println("Coffer daemon is starting (it holds its lock but is not ready yet)")?,
                }
            }
            Err(CliError::Quiet(exit::UNREACHABLE))
        }
        None => {
            if ctx.json {
                output::print_json(&json!({"running": false}))?;
            } else {
                output::println("Coffer daemon is not running")?;
            }
            Err(CliError::Quiet(exit::UNREACHABLE))
        }
    }
}

/// Stops the running daemon, if any; true when one was running (and is now stopped).
async fn stop(ctx: &Ctx) -> Result<bool, CliError> {
    let lock = ctx.home.daemon_lock();
    let api = match ctx.detect_quietly().await {
        Some(api) => api,
        None if !lock_is_held(&lock) => return Ok(false),
        // The lock is held but nothing answers: a daemon still starting (it writes daemon.json
        // only once every service is healthy) or a wedged one.
        None => match wait_until_reachable(ctx).await {
            Reach::Gone => return Ok(false),
            Reach::Up(api) => api,
            Reach::Silent => return terminate_unresponsive(ctx).await,
        },
    };
    let pid = api.daemon().info.pid;
    if let Err(e) = request_stop(&api).await {
        crate::eprintln_printable!("warning: the stop request failed ({e}); sending SIGTERM to pid {pid}");
        return sigterm_and_wait(ctx, pid).await;
    }
    if wait_until_gone(ctx, pid, STOP_DEADLINE).await {
        note_successor(ctx, pid);
        return Ok(true);
    }
    crate::eprintln_printable!(
        "warning: the daemon did not stop within {}s; sending SIGTERM to pid {pid}",
        STOP_DEADLINE.as_secs()
    );
    sigterm_and_wait(ctx, pid).await
}

/// Whether daemon `pid` is gone: the lock is free, or no live process `pid` is left (an MCP
/// client's shim may already have started the next daemon, which then holds the lock).
fn daemon_gone(ctx: &Ctx, pid: u32) -> bool {
    !lock_is_held(&ctx.home.daemon_lock()) || !process_alive(pid)
}

/// Whether process `pid` exists and has not exited (a zombie has).
fn process_alive(pid: u32) -> bool {
    let Ok(p) = i32::try_from(pid) else { return false };
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
        // `pid (comm) S …`: the state follows the last ')'.
        return stat.rfind(')').and_then(|i| stat[i + 1..].trim_start().chars().next()).is_some_and(|st| st != 'Z');
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None) {
        Ok(()) | Err(nix::errno::Errno::EPERM) => true,
        Err(_) => false,
    }
}

/// Waits until daemon `pid` is gone; false when `deadline` passes first.
async fn wait_until_gone(ctx: &Ctx, pid: u32, deadline: Duration) -> bool {
    let until = Instant::now() + deadline;
    loop {
        if daemon_gone(ctx, pid) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Says so when another daemon holds the lock once daemon `pid` is gone (an MCP client started
/// it on its next request).
fn note_successor(ctx: &Ctx, pid: u32) {
    if !lock_is_held(&ctx.home.daemon_lock()) {
        return;
    }
    let next = DaemonInfo::read(&ctx.home.daemon_json()).ok().map(|i| i.pid).filter(|&p| p != pid);
    match next {
        Some(next) => crate::eprintln_printable!(
            "note: the daemon (pid {pid}) stopped, and an MCP client has started a new one (pid {next}); \
             close your MCP clients first to keep it stopped"
        ),
        None => crate::eprintln_printable!(
            "note: the daemon (pid {pid}) stopped, and a new one is starting (an MCP client asked for it); \
             close your MCP clients first to keep it stopped"
        ),
    }
}

async fn request_stop(api: &ApiClient) -> Result<(), CliError> {
    api.post("/v1/daemon/stop", None).await.map(|_| ())
}

enum Reach {
    Up(ApiClient),
    Gone,
    Silent,
}

async fn wait_until_reachable(ctx: &Ctx) -> Reach {
    // A daemon that was ready is not starting: it gets the shorter patience.
    let patience = match coffer_runtime::connect::ready_daemon(&ctx.home) {
        Some(info) => {
            crate::eprintln_printable!(
                "The daemon (pid {}) is running but its HTTP edge does not answer; waiting up to {}s…",
                info.pid,
                coffer_runtime::connect::UNRESPONSIVE_PATIENCE.as_secs()
            );
            coffer_runtime::connect::UNRESPONSIVE_PATIENCE
        }
        None => {
            crate::eprintln_printable!("The daemon holds its lock but does not answer yet (still starting?); waiting…");
            UNRESPONSIVE_DEADLINE
        }
    };
    let deadline = Instant::now() + patience;
    loop {
        if let Some(api) = ctx.detect_quietly().await {
            return Reach::Up(api);
        }
        if !lock_is_held(&ctx.home.daemon_lock()) {
            return Reach::Gone;
        }
        if Instant::now() >= deadline {
            return Reach::Silent;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The lock is held, the daemon never answered: SIGTERM the pid in `daemon.json` if there is
/// one (only the lock holder writes that file, so the pid is the holder's).
async fn terminate_unresponsive(ctx: &Ctx) -> Result<bool, CliError> {
    match DaemonInfo::read(&ctx.home.daemon_json()) {
        Ok(info) => {
            crate::eprintln_printable!("warning: the daemon does not answer; sending SIGTERM to pid {}", info.pid);
            sigterm_and_wait(ctx, info.pid).await
        }
        Err(_) => Err(CliError::Failed(format!(
            "a coffer-daemon holds {} but does not answer and wrote no daemon.json; see {}",
            ctx.home.daemon_lock().display(),
            ctx.home.logs().join("daemon.*.log").display()
        ))),
    }
}

/// SIGTERM to `pid`, then waits until it is gone. Only signals while that daemon is still
/// there (lock held, process alive): once it is gone, `pid` may already belong to someone else.
async fn sigterm_and_wait(ctx: &Ctx, pid: u32) -> Result<bool, CliError> {
    if daemon_gone(ctx, pid) {
        note_successor(ctx, pid);
        return Ok(true);
    }
    if let Ok(p) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGTERM);
    }
    if wait_until_gone(ctx, pid, STOP_DEADLINE).await {
        note_successor(ctx, pid);
        return Ok(true);
    }
    Err(CliError::Failed(format!(
        "the Coffer daemon (pid {pid}) did not stop within {}s of SIGTERM; see {}",
        STOP_DEADLINE.as_secs(),
        ctx.home.logs().display()
    )))
}

fn report_stopped(ctx: &Ctx, was_running: bool) -> Result<(), CliError> {
    if ctx.json {
        return output::print_json(&json!({"running": false, "stopped": was_running}));
    }
    output::println(if was_running { "Coffer daemon stopped" } else { "Coffer daemon is not running" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A `/v1/status` body whose gateway has `pid`, `state` and `restarts`.
    fn status(pid: u64, state: &str, restarts: u64) -> Value {
        let service = |name: &str, pid: u64, state: &str, restarts: u64| {
            json!({"name": name, "pid": pid, "state": state, "uptime_s": 0, "restarts": restarts,
                "last_error": null, "on_demand": false})
        };
        json!({"daemon": {"pid": 1, "version": "0.1.0", "started_at": "x", "port": 1}, "services": [
            service("store", 10, "healthy", 0),
            service("gateway", pid, state, restarts),
        ], "upstreams": [], "sandbox": {"landlock_abi": null, "summary": "x",
            "agents": {"claude_code": "unavailable", "codex": "unavailable"}}, "sync": null})
    }

    fn parsed(v: Value) -> Status {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_process_that_exited_is_not_alive_even_before_it_is_reaped() {
        assert!(process_alive(std::process::id()));
        // A throwaway child to make a zombie of; it needs none of the spawn helper's care.
        #[allow(clippy::disallowed_methods)]
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        // Exited but not yet reaped: a zombie, which counts as gone.
        while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z")) {
            std::thread::yield_now();
        }
        assert!(!process_alive(pid), "a zombie is not alive");
        child.wait().expect("reap");
        assert!(!process_alive(pid), "a reaped pid is not alive");
        assert!(!process_alive(u32::MAX));
    }

    #[test]
    fn a_new_gateway_is_a_healthy_one_with_another_pid() {
        assert!(!is_new_healthy_gateway(&parsed(status(7, "healthy", 0)), 7));
        assert!(!is_new_healthy_gateway(&parsed(status(8, "starting", 1)), 7));
        assert!(!is_new_healthy_gateway(&parsed(status(0, "healthy", 1)), 7));
        let mut no_gateway = parsed(status(8, "healthy", 1));
        no_gateway.services.retain(|s| s.name != GATEWAY);
        assert!(!is_new_healthy_gateway(&no_gateway, 7));
        assert!(is_new_healthy_gateway(&parsed(status(8, "healthy", 1)), 7));
    }

    /// A fake daemon on a free port: `answer(path, n)` gives the body for the n-th request
    /// (from 0), `None` to drop the connection unanswered (a gateway that is gone).
    async fn fake_daemon(answer: impl Fn(&str, usize) -> Option<Value> + Send + Sync + 'static) -> ApiClient {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let answer = Arc::new(answer);
        let n = Arc::new(AtomicUsize::new(0));
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let (answer, n) = (answer.clone(), n.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => buf.extend_from_slice(&chunk[..k]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf).into_owned();
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                    let Some(body) = answer(&path, n.fetch_add(1, Ordering::SeqCst)) else { return };
                    let body = body.to_string();
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        client(port)
    }

    fn client(port: u16) -> ApiClient {
        let info = DaemonInfo {
            pid: 1,
            port,
            token: secrecy::SecretString::from("t".to_owned()),
            started_at: String::new(),
            version: String::new(),
            socket: None,
        };
        ApiClient::new(coffer_runtime::connect::Daemon {
            info,
            base_url: format!("http://127.0.0.1:{port}"),
            http: coffer_runtime::connect::http_client(),
        })
    }

    #[tokio::test]
    async fn waits_through_the_gap_for_the_new_gateway() {
        // Requests 0-3 find no gateway; then the old one is still listed, then the new one
        // starts, then it is healthy.
        let api = fake_daemon(|path, n| match (path, n) {
            (_, 0..=3) => None,
            ("/v1/health", _) => Some(json!({"status": "ok", "pid": 1})),
            ("/v1/status", 0..=5) => Some(status(7, "healthy", 0)),
            ("/v1/status", 6..=7) => Some(status(8, "starting", 1)),
            ("/v1/status", _) => Some(status(8, "healthy", 1)),
            _ => None,
        })
        .await;
        let g = wait_for_new_gateway(&api, 7, Duration::from_secs(10)).await.unwrap();
        assert_eq!((g.pid, g.state.as_str()), (8, "healthy"));
    }

    #[tokio::test]
    async fn a_gateway_that_stays_unhealthy_fails_with_exit_1() {
        let api = fake_daemon(|path, _| match path {
            "/v1/health" => Some(json!({"status": "ok"})),
            _ => Some(status(8, "failed", 5)),
        })
        .await;
        let e = wait_for_new_gateway(&api, 7, Duration::from_millis(400)).await.unwrap_err();
        assert_eq!(e.exit_code(), exit::ERROR);
        assert!(e.to_string().contains("failed, pid 8"), "{e}");
    }

    #[tokio::test]
    async fn a_daemon_that_never_answers_again_is_unreachable() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = wait_for_new_gateway(&client(port), 7, Duration::from_millis(300)).await.unwrap_err();
        assert_eq!(e.exit_code(), exit::UNREACHABLE);
    }
}
