//! One supervised service (a row of [`crate::table`]): spawn it through the spawn helper, wait
//! for its gRPC health check, restart it with exponential backoff when it exits, mark it
//! `failed` after repeated crashes; start and stop it on request (on-demand services).
//!
//! Restarts: a service that exits is restarted on the same listener after a delay (`Backoff`, a
//! pure policy with its own unit tests): 100 ms, doubling per crash up to 10 s while it keeps
//! dying, and back to 100 ms once it had been healthy for 10 s before the crash, so an isolated
//! crash comes back at once while a crash loop still backs off; five crashes within a minute mark
//! a `may_fail` service `failed` (60 s healthy clears that count).
//!
//! On demand: an `OnDemand` row (`coffer-callback`, while a SeaTalk channel is enabled; it depends
//! on chat) shows `stopped` with pid 0 in status (REST `on_demand: true`; `coffer doctor` counts
//! that as fine) until the control RPC's `StartService` starts it (once its dependencies are
//! healthy; the answer waits for its health check); `StopService` stops it. `StartService.env` is
//! extra environment for it (rules in [`crate::control`]), kept in the supervisor's memory only and
//! given again on every respawn after a crash; a `StartService` with a different env restarts a
//! running service, the same env leaves it; `StopService` forgets it. A stopped on-demand service
//! is not restarted by `RestartService` (`FAILED_PRECONDITION`). Like every service it is recorded
//! in `upstream-pids/`, so a crashed daemon's listener is swept at the next start (and dies with
//! the daemon by `PDEATHSIG` anyway). The daemon's `COFFER_CALLBACK_PORT` and
//! `COFFER_CALLBACK_HOSTS` are passed on to its services. An always-on service cannot be started or
//! stopped alone (`FAILED_PRECONDITION`; it has `RestartService`).
use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coffer_runtime::Backoff;
use coffer_runtime::home::CofferHome;

use crate::table::{ServiceSpec, Start};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// First restart delay; doubles per consecutive crash up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// The health check's polling: 5 ms doubling to 100 ms between checks.
const HEALTH_POLL: Backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(100));
/// Healthy this long before a crash resets the restart delay to [`BACKOFF_START`]: an
/// isolated crash comes back in about 100 ms, while a crash loop (a process that dies before
/// or soon after it is healthy) still backs off.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(10);
/// Healthy this long before a crash clears the crash window.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// This many crashes inside [`CRASH_WINDOW`] mark a service `failed`.
const CRASH_LIMIT: usize = 5;
const CRASH_WINDOW: Duration = Duration::from_secs(60);
/// How long a service may take to answer its health check after spawning.
const HEALTH_DEADLINE: Duration = Duration::from_secs(60);
/// Grace between SIGTERM and SIGKILL when stopping a service.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The restart policy of one service: the delay before each restart and the crashes of the
/// last [`CRASH_WINDOW`]. Pure (the caller passes the clock), so it is tested without processes.
#[derive(Debug)]
struct RestartPolicy {
    /// The delays of the crashes in a row.
    delay: Backoff,
    crashes: Vec<Instant>,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self { delay: Backoff::new(BACKOFF_START, BACKOFF_MAX), crashes: Vec::new() }
    }
}

impl RestartPolicy {
    /// Records a crash at `now` of a process that had been healthy for `healthy_for` (`None`:
    /// it never answered its health check). Returns the delay before the restart (100 ms after
    /// [`BACKOFF_RESET_AFTER`] healthy, else doubling per crash up to [`BACKOFF_MAX`]) and how
    /// many crashes the last [`CRASH_WINDOW`] holds, this one included (none before it when the
    /// process had been healthy for [`STABLE_AFTER`]).
    fn crashed(&mut self, now: Instant, healthy_for: Option<Duration>) -> (Duration, usize) {
        let healthy_for = healthy_for.unwrap_or_default();
        if healthy_for >= BACKOFF_RESET_AFTER {
            self.delay.reset();
        }
        if healthy_for >= STABLE_AFTER {
            self.crashes.clear();
        }
        self.crashes.retain(|t| now.saturating_duration_since(*t) < CRASH_WINDOW);
        self.crashes.push(now);
        (self.delay.next_delay(), self.crashes.len())
    }
}

/// Lifecycle state, as shown by `/v1/status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceState {
    Starting,
    Healthy,
    Restarting,
    Failed,
    Stopped,
}

impl ServiceState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Healthy => "healthy",
            Self::Restarting => "restarting",
            Self::Failed => "failed",
            Self::Stopped => "stopped",
        }
    }
}

/// A snapshot of one service for status replies.
#[derive(Debug, Clone)]
pub struct ServiceStatusView {
    pub name: String,
    pub pid: u32,
    pub state: ServiceState,
    pub uptime_s: u64,
    pub restarts: u32,
    pub last_error: String,
    pub address: String,
    /// Whether it runs only on demand (stopped until `StartService`).
    pub on_demand: bool,
}

/// What every supervision loop needs: the home, the supervisor's own token (its health checks
/// present it), and the daemon's shutdown.
#[derive(Clone)]
pub(crate) struct Context {
    pub home: CofferHome,
    pub supervisor_token: crate::Token,
    pub shutdown: CancellationToken,
}

enum Command {
    Restart(oneshot::Sender<()>),
    Stop(oneshot::Sender<()>),
}

struct Inner {
    pid: u32,
    restarts: u32,
    last_error: String,
    healthy_since: Option<Instant>,
}

/// Handle to a supervised service; cheap to clone.
#[derive(Clone)]
pub(crate) struct ServiceHandle {
    pub name: &'static str,
    pub spec: ServiceSpec,
    fds: Arc<Vec<(RawFd, RawFd)>>,
    env: Arc<Vec<(String, String)>>,
    /// Extra environment of an on-demand service (`StartService`'s `env`): memory only, added
    /// after `env` on every spawn (a respawn after a crash gets it again).
    extra_env: Arc<Mutex<BTreeMap<String, String>>>,
    pub address: String,
    inner: Arc<Mutex<Inner>>,
    state_tx: Arc<watch::Sender<ServiceState>>,
    cmd_tx: mpsc::Sender<Command>,
    cmd_rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Command>>>,
    /// The running supervision loop, if any. Held across start, restart and stop so that they
    /// never interleave (an on-demand service may be asked for both at once).
    runner: Arc<tokio::sync::Mutex<Option<JoinHandle<()>>>>,
}

impl ServiceHandle {
    /// A handle for `spec`, whose child gets descriptors `fds` (source, number in the child) and
    /// environment `env`, and serves its health check at `address`. Nothing runs until
    /// [`ServiceHandle::start`].
    pub fn new(spec: ServiceSpec, fds: Vec<(RawFd, RawFd)>, env: Vec<(String, String)>, address: String) -> Self {
        let (cmd_tx, cmd_rx) = mpsc::channel(8);
        Self {
            name: spec.name(),
            spec,
            fds: Arc::new(fds),
            env: Arc::new(env),
            extra_env: Arc::new(Mutex::new(BTreeMap::new())),
            address,
            inner: Arc::new(Mutex::new(Inner { pid: 0, restarts: 0, last_error: String::new(), healthy_since: None })),
            state_tx: Arc::new(watch::channel(ServiceState::Stopped).0),
            cmd_tx,
            cmd_rx: Arc::new(tokio::sync::Mutex::new(cmd_rx)),
            runner: Arc::new(tokio::sync::Mutex::new(None)),
        }
    }

    pub fn view(&self) -> ServiceStatusView {
        let i = self.inner.lock().expect("service state lock");
        let state = *self.state_tx.borrow();
        ServiceStatusView {
            name: self.name.into(),
            pid: i.pid,
            state,
            uptime_s: match (state, i.healthy_since) {
                (ServiceState::Healthy, Some(t)) => t.elapsed().as_secs(),
                _ => 0,
            },
            restarts: i.restarts,
            last_error: i.last_error.clone(),
            address: self.address.clone(),
            on_demand: self.spec.start == Start::OnDemand,
        }
    }

    /// The extra environment the next spawn gets (see [`ServiceHandle::set_extra_env`]).
    pub fn extra_env(&self) -> BTreeMap<String, String> {
        self.extra_env.lock().expect("service env lock").clone()
    }

    /// Replaces the extra environment; every later spawn (a start, a restart, a respawn after
    /// a crash) gets it. Returns whether it differs from the previous one. Memory only.
    pub fn set_extra_env(&self, env: BTreeMap<String, String>) -> bool {
        let mut cur = self.extra_env.lock().expect("service env lock");
        let changed = *cur != env;
        *cur = env;
        changed
    }

    fn set_state(&self, s: ServiceState) {
        self.state_tx.send_replace(s);
    }

    /// Waits until the service is healthy.
    ///
    /// # Errors
    /// When it becomes `failed` or `deadline` passes; the message carries its last error.
    pub async fn wait_healthy(&self, deadline: Duration) -> anyhow::Result<()> {
        let mut rx = self.state_tx.subscribe();
        let res =
            tokio::time::timeout(deadline, rx.wait_for(|s| matches!(s, ServiceState::Healthy | ServiceState::Failed)))
                .await;
        match res {
            Ok(Ok(s)) if *s == ServiceState::Healthy => Ok(()),
            _ => anyhow::bail!("{} is {}: {}", self.name, self.view().state.as_str(), self.view().last_error),
        }
    }

    /// Whether a supervision loop is running (the service is starting, healthy, restarting or
    /// failed, as opposed to stopped).
    pub async fn is_running(&self) -> bool {
        self.runner.lock().await.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Starts the supervision loop (spawn, health, restart on crash) unless one runs already;
    /// returns at once. Returns whether it started one.
    pub async fn start(&self, ctx: &Context) -> bool {
        let mut runner = self.runner.lock().await;
        if runner.as_ref().is_some_and(|h| !h.is_finished()) || ctx.shutdown.is_cancelled() {
            return false;
        }
        // A command that reached the previous loop too late must not stop this one.
        if let Ok(mut rx) = self.cmd_rx.try_lock() {
            while rx.try_recv().is_ok() {}
        }
        *runner = Some(tokio::spawn(self.clone().run(ctx.clone())));
        true
    }

    /// Restarts the service now (SIGTERM, wait, respawn); also revives a `failed` one and
    /// starts a stopped one. Cancellation-safe: the loop's handle never leaves `runner` while
    /// this waits (the control RPC spawns it anyway, so that a caller that goes away — the
    /// gateway restarting itself — does not cut it short).
    pub async fn restart(&self, ctx: &Context) {
        let mut runner = self.runner.lock().await;
        let Some(h) = runner.as_mut().filter(|h| !h.is_finished()) else {
            drop(runner);
            self.start(ctx).await;
            return;
        };
        let (tx, rx) = oneshot::channel();
        if self.cmd_tx.send(Command::Restart(tx)).await.is_ok() {
            // The loop may end (shutdown) without reading the command.
            tokio::select! {
                _ = rx => {}
                _ = h => *runner = None,
            }
        }
    }

    /// Stops the service and waits for its loop to end; status then shows it `stopped`. Does
    /// nothing when it is not running. Cancellation-safe like [`ServiceHandle::restart`].
    pub async fn stop(&self) {
        let mut runner = self.runner.lock().await;
        let Some(h) = runner.as_mut() else { return };
        if !h.is_finished() {
            let (tx, rx) = oneshot::channel();
            if self.cmd_tx.send(Command::Stop(tx)).await.is_ok() {
                tokio::select! {
                    _ = rx => {}
                    _ = &mut *h => {
                        *runner = None;
                        return;
                    }
                }
            }
        }
        let _ = h.await;
        *runner = None;
    }

    fn spawn_child(&self, ctx: &Context) -> anyhow::Result<coffer_runtime::spawn::ManagedChild> {
        let binary = self.spec.binary;
        let program = coffer_runtime::connect::find_binary(binary, None)
            .ok_or_else(|| anyhow::anyhow!("cannot find {binary} next to coffer-daemon or on PATH"))?;
        let stdio_path = ctx.home.logs().join(format!("{}.stdio", self.name));
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&stdio_path)?;
        let mut spec = coffer_runtime::spawn::SpawnSpec::new(program, "service", self.name);
        spec.args = vec![];
        spec.env = self.env.iter().map(|(k, v)| (k.into(), v.into())).collect();
        // Given to the child's environment only: never in argv, never written to a file.
        spec.env.extend(self.extra_env().into_iter().map(|(k, v)| (k.into(), v.into())));
        spec.fds = self.fds.as_ref().clone();
        spec.stdout = Stdio::from(out.try_clone()?);
        spec.stderr = Stdio::from(out);
        spec.pid_dir = Some(ctx.home.pids());
        Ok(coffer_runtime::spawn::spawn(spec)?)
    }

    /// The supervision loop; ends after [`ServiceHandle::stop`].
    async fn run(self, ctx: Context) {
        let mut rx = self.cmd_rx.clone().lock_owned().await;
        let mut backoff = RestartPolicy::default();
        let mut first = true;
        'outer: loop {
            self.set_state(if first { ServiceState::Starting } else { ServiceState::Restarting });
            first = false;
            let mut child = match self.spawn_child(&ctx) {
                Ok(c) => c,
                Err(e) => {
                    self.note_error(format!("spawn failed: {e:#}"));
                    tracing::error!(service = self.name, error = %format!("{e:#}"), "Cannot start service.");
                    self.set_state(ServiceState::Failed);
                    // Wait for an explicit restart or stop.
                    match rx.recv().await {
                        Some(Command::Restart(ack)) => {
                            let _ = ack.send(());
                            continue;
                        }
                        Some(Command::Stop(ack)) => {
                            let _ = ack.send(());
                            break;
                        }
                        None => break,
                    }
                }
            };
            let pid = child.pid() as u32;
            self.inner.lock().expect("state").pid = pid;
            tracing::info!(service = self.name, pid, "Service started.");

            // Wait for health, a premature exit, or a command.
            let health = self.await_health(&ctx);
            tokio::pin!(health);
            let exited_early = tokio::select! {
                ok = &mut health => {
                    if ok {
                        let mut i = self.inner.lock().expect("state");
                        i.healthy_since = Some(Instant::now());
                        drop(i);
                        self.set_state(ServiceState::Healthy);
                        tracing::info!(service = self.name, pid, "Service healthy.");
                        None
                    } else {
                        self.note_error(format!("no healthy answer within {}s", HEALTH_DEADLINE.as_secs()));
                        child.terminate(STOP_GRACE).await;
                        Some("unhealthy".to_owned())
                    }
                }
                status = child.wait() => Some(describe_exit(status)),
                cmd = rx.recv() => {
                    child.terminate(STOP_GRACE).await;
                    match cmd {
                        Some(Command::Restart(ack)) => {
                            self.set_state(ServiceState::Restarting);
                            let _ = ack.send(());
                            continue 'outer;
                        }
                        Some(Command::Stop(ack)) => { self.stopped(); let _ = ack.send(()); break 'outer; }
                        None => break 'outer,
                    }
                }
            };

            let reason = match exited_early {
                Some(r) => r,
                None => tokio::select! {
                    status = child.wait() => describe_exit(status),
                    cmd = rx.recv() => {
                        child.terminate(STOP_GRACE).await;
                        match cmd {
                            Some(Command::Restart(ack)) => {
                                self.inner.lock().expect("state").restarts += 1;
                                tracing::info!(service = self.name, "Service restarted on request.");
                                // Before the ack: a caller waiting for health next must not see
                                // the old process's `healthy`.
                                self.set_state(ServiceState::Restarting);
                                let _ = ack.send(());
                                continue 'outer;
                            }
                            Some(Command::Stop(ack)) => { self.stopped(); let _ = ack.send(()); break 'outer; }
                            None => break 'outer,
                        }
                    }
                },
            };

            if ctx.shutdown.is_cancelled() {
                // Shutting down: the stop command will arrive.
                self.stopped();
                if let Some(Command::Stop(ack) | Command::Restart(ack)) = rx.recv().await {
                    let _ = ack.send(());
                }
                break;
            }
            // A crash.
            let now = Instant::now();
            let healthy_for = self.inner.lock().expect("state").healthy_since.map(|t| now.saturating_duration_since(t));
            let (delay, crashes) = backoff.crashed(now, healthy_for);
            {
                let mut i = self.inner.lock().expect("state");
                i.restarts += 1;
                i.pid = 0;
                i.healthy_since = None;
                i.last_error = format!("exited: {reason}");
            }
            if self.spec.may_fail && crashes >= CRASH_LIMIT {
                self.set_state(ServiceState::Failed);
                tracing::error!(service = self.name, crashes, window_s = CRASH_WINDOW.as_secs(), %reason,
                    "Service crashed repeatedly; marked failed. Restart it with `coffer daemon restart`.");
                match rx.recv().await {
                    Some(Command::Restart(ack)) => {
                        backoff = RestartPolicy::default();
                        let _ = ack.send(());
                        continue;
                    }
                    Some(Command::Stop(ack)) => {
                        let _ = ack.send(());
                        break;
                    }
                    None => break,
                }
            }
            self.set_state(ServiceState::Restarting);
            tracing::warn!(service = self.name, %reason, backoff_ms = delay.as_millis() as u64, "Service exited; restarting.");
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                cmd = rx.recv() => match cmd {
                    Some(Command::Restart(ack)) => { let _ = ack.send(()); }
                    Some(Command::Stop(ack)) => { self.stopped(); let _ = ack.send(()); break; }
                    None => break,
                }
            }
        }
        self.stopped();
    }

    fn stopped(&self) {
        self.inner.lock().expect("state").pid = 0;
        self.set_state(ServiceState::Stopped);
    }

    fn note_error(&self, e: String) {
        self.inner.lock().expect("state").last_error = e;
    }

    /// Polls the standard gRPC health check until SERVING or the deadline.
    async fn await_health(&self, ctx: &Context) -> bool {
        let deadline = Instant::now() + HEALTH_DEADLINE;
        let mut poll = HEALTH_POLL;
        while Instant::now() < deadline {
            if coffer_runtime::grpc::check_health(&self.address, &ctx.supervisor_token).await {
                return true;
            }
            tokio::time::sleep(poll.next_delay()).await;
        }
        false
    }
}

fn describe_exit(status: std::io::Result<std::process::ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            _ => s.to_string(),
        },
        Err(e) => format!("wait failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A crash loop (the process dies before it is healthy) doubles the delay up to the cap.
    #[test]
    fn a_crash_loop_backs_off_to_the_cap() {
        let mut b = RestartPolicy::default();
        let t0 = Instant::now();
        let delays: Vec<Duration> = (0..10).map(|i| b.crashed(t0 + i * 100 * MS, None).0).collect();
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000]);
    }

    /// Crashes of a process that was healthy for a short while (under 10 s) keep backing off;
    /// one that was healthy for 10 s comes back after the first delay again.
    #[test]
    fn ten_seconds_healthy_resets_the_delay() {
        let mut b = RestartPolicy::default();
        let t0 = Instant::now();
        for _ in 0..6 {
            b.crashed(t0, Some(2 * 1000 * MS));
        }
        let (delay, _) = b.crashed(t0, Some(9_999 * MS));
        assert_eq!(delay, BACKOFF_MAX.min(6400 * MS), "still backing off under 10 s healthy");
        let (delay, _) = b.crashed(t0 + 20_000 * MS, Some(BACKOFF_RESET_AFTER));
        assert_eq!(delay, BACKOFF_START);
        let (delay, _) = b.crashed(t0 + 20_500 * MS, Some(300 * MS));
        assert_eq!(delay, 2 * BACKOFF_START, "the next quick crash backs off from there");
    }

    /// Isolated crashes (each after a while healthy) always restart after about 100 ms.
    #[test]
    fn isolated_crashes_restart_quickly() {
        let mut b = RestartPolicy::default();
        let t0 = Instant::now();
        for i in 0..20u32 {
            let (delay, _) = b.crashed(t0 + i * 12_000 * MS, Some(11_000 * MS));
            assert_eq!(delay, BACKOFF_START, "crash {i}");
        }
    }

    /// The crash window counts crashes of the last minute; 60 s healthy clears it.
    #[test]
    fn the_crash_window_counts_the_last_minute() {
        let mut b = RestartPolicy::default();
        let t0 = Instant::now();
        let counts: Vec<usize> = (0..5u32).map(|i| b.crashed(t0 + i * 1000 * MS, None).1).collect();
        assert_eq!(counts, [1, 2, 3, 4, 5]);
        assert_eq!(b.crashed(t0 + CRASH_WINDOW + 2500 * MS, None).1, 3, "the oldest crashes left the window");
        assert_eq!(b.crashed(t0 + CRASH_WINDOW + 3000 * MS, Some(STABLE_AFTER)).1, 1);
    }
}
