//! `coffer daemon start|stop|status|restart`: the daemon's lifecycle.
//!
//! Only `start` and `restart` ever start a daemon. `stop` asks the daemon to stop over REST and
//! then watches `daemon.lock` — the daemon holds it until its very last moment, so a released
//! lock means every service is down and `daemon.json` is gone.
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
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

#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
    /// Start the daemon unless it is already running.
    Start(NoArgs),
    /// Stop the daemon and every process it started; never starts one.
    Stop(NoArgs),
    /// Show the daemon's status; exits 5 without starting it when it is not running.
    Status(NoArgs),
    /// Stop the daemon (if running), then start it (e.g. after an upgrade); with SERVICE,
    /// restart only that service of the running daemon.
    Restart(RestartArgs),
}

#[derive(Debug, Args)]
pub struct RestartArgs {
    /// A service of the running daemon to restart alone (store, retrieval, chat).
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
    output::println(&format!("Coffer daemon {what} (pid {}, port {})", info.pid, info.port))
}

/// `POST /v1/daemon/services/{name}/restart`, which answers once the service is healthy again
/// (or has given up). Never starts a daemon.
async fn restart_service(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let api = ctx.detect().await.ok_or(CliError::NotRunning)?;
    let path = format!("/v1/daemon/services/{}/restart", crate::api::path_segment(name));
    let resp = api.send(api.request(reqwest::Method::POST, &path)).await?;
    if ctx.json {
        return output::print_body(&resp.body);
    }
    let s = resp.json()?;
    output::println(&format!(
        "Restarted {} (pid {}, {})",
        output::cell(s.get("name"), 40),
        output::cell(s.get("pid"), 20),
        output::cell(s.get("state"), 20)
    ))
}

async fn status(ctx: &Ctx) -> Result<(), CliError> {
    match ctx.detect().await {
        Some(api) => super::status::show(ctx, &api).await,
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
        eprintln!("warning: the stop request failed ({e}); sending SIGTERM to pid {pid}");
        return sigterm_and_wait(ctx, pid).await;
    }
    if wait_for_lock_release(ctx, STOP_DEADLINE).await {
        return Ok(true);
    }
    eprintln!("warning: the daemon did not stop within {}s; sending SIGTERM to pid {pid}", STOP_DEADLINE.as_secs());
    sigterm_and_wait(ctx, pid).await
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
    eprintln!("The daemon holds its lock but does not answer yet (still starting?); waiting…");
    let deadline = Instant::now() + UNRESPONSIVE_DEADLINE;
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
            eprintln!("warning: the daemon does not answer; sending SIGTERM to pid {}", info.pid);
            sigterm_and_wait(ctx, info.pid).await
        }
        Err(_) => Err(CliError::Failed(format!(
            "a coffer-daemon holds {} but does not answer and wrote no daemon.json; see {}",
            ctx.home.daemon_lock().display(),
            ctx.home.logs().join("daemon.*.log").display()
        ))),
    }
}

/// SIGTERM to `pid`, then waits for the lock. Only signals while the lock is held: once it is
/// free the daemon is gone and `pid` may already belong to someone else.
async fn sigterm_and_wait(ctx: &Ctx, pid: u32) -> Result<bool, CliError> {
    if !lock_is_held(&ctx.home.daemon_lock()) {
        return Ok(true);
    }
    if let Ok(p) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGTERM);
    }
    if wait_for_lock_release(ctx, STOP_DEADLINE).await {
        return Ok(true);
    }
    Err(CliError::Failed(format!(
        "the Coffer daemon (pid {pid}) did not stop within {}s of SIGTERM; see {}",
        STOP_DEADLINE.as_secs(),
        ctx.home.logs().display()
    )))
}

/// Polls the local lock probe until the lock is free; false when `deadline` passes first.
async fn wait_for_lock_release(ctx: &Ctx, deadline: Duration) -> bool {
    let lock = ctx.home.daemon_lock();
    let until = Instant::now() + deadline;
    loop {
        if !lock_is_held(&lock) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

fn report_stopped(ctx: &Ctx, was_running: bool) -> Result<(), CliError> {
    if ctx.json {
        return output::print_json(&json!({"running": false, "stopped": was_running}));
    }
    output::println(if was_running { "Coffer daemon stopped" } else { "Coffer daemon is not running" })
}
