//! Detect-or-spawn, shared by `coffer-mcp-shim` and the `coffer` CLI.
//!
//! 1. If `daemon.lock` is held and `daemon.json` is valid and `GET /v1/health` answers with the
//!    same pid, connect with its token.
//! 2. Otherwise start `coffer-daemon` detached (new session; raw stdout/stderr appended to
//!    `logs/daemon.stdio`), and wait — on the lock and the health check, with a deadline — for
//!    a valid `daemon.json`.
//!
//! A managed agent's shim uses [`connect_agent`] instead: the same check on
//! `agent-access/agent.json` (the `/mcp`-only agent token), and never a spawn.
//!
//! Two entry points racing are safe: only the holder of `daemon.lock` creates `daemon.json`, and
//! a second daemon that cannot take the lock exits. Entry points also serialise the spawn itself
//! on `spawn.lock`, so a burst of them started against no daemon starts exactly one.
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use secrecy::ExposeSecret;

use crate::daemon_file::{DaemonInfo, lock_is_held};
use crate::home::CofferHome;

/// How long an entry point waits for a daemon it started (or saw starting).
pub const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long a daemon that is running and was ready (it holds the lock and wrote `daemon.json`)
/// may leave its health check unanswered before an entry point gives up on it: far longer than
/// a restart of its gateway takes (~0.1 s), far shorter than [`START_DEADLINE`].
pub const UNRESPONSIVE_PATIENCE: Duration = Duration::from_secs(6);

/// A connection to a running daemon.
#[derive(Clone)]
pub struct Daemon {
    pub info: DaemonInfo,
    /// `http://127.0.0.1:<port>`
    pub base_url: String,
    pub http: reqwest::Client,
}

/// Error reaching the daemon. Entry points map every variant to exit code 5.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Home(#[from] crate::home::HomeError),
    #[error("cannot find the coffer-daemon executable (looked next to {exe} and on PATH); set COFFER_DAEMON_BIN")]
    NoDaemonBinary { exe: String },
    #[error("cannot start coffer-daemon: {0}")]
    Spawn(#[from] crate::spawn::SpawnError),
    #[error("coffer-daemon exited during start-up ({status}){detail}")]
    StartFailed { status: String, detail: String },
    #[error("coffer-daemon did not become ready within {0:?}; see {1}")]
    Timeout(Duration, String),
    #[error(
        "the Coffer daemon is not running (no process holds {lock}); a managed agent's shim never starts it: \
         it runs while the daemon that started the agent does"
    )]
    NotRunning { lock: String },
    #[error(
        "coffer-daemon (pid {pid}) is running but its HTTP edge on 127.0.0.1:{port} has not answered for {waited:?} \
         (its gateway may be stopped, hung or overloaded); `coffer daemon restart` restarts it, logs are in {logs}"
    )]
    Unresponsive { pid: u32, port: u16, waited: Duration, logs: String },
}

impl Daemon {
    /// True when this entry point's version differs from the daemon's.
    pub fn version_mismatch(&self) -> bool {
        self.info.version != crate::VERSION
    }

    /// A request to `path` (e.g. `/v1/status`) carrying the daemon's token.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.base_url, path))
            .header(coffer_types::header::TOKEN, self.info.token.expose_secret())
    }
}

/// An HTTP client for loopback use: no proxy, no TLS.
pub fn http_client() -> reqwest::Client {
    crate::tls::ensure_provider();
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(2))
        .pool_idle_timeout(Duration::from_secs(30))
        .tcp_nodelay(true)
        .build()
        .expect("reqwest client builds")
}

/// The daemon that holds `daemon.lock` and wrote `daemon.json`, whether or not it answers now.
/// It writes that file only once every service is healthy, so this daemon was ready: silence
/// from it is not a start-up.
pub fn ready_daemon(home: &CofferHome) -> Option<DaemonInfo> {
    if !lock_is_held(&home.daemon_lock()) {
        return None;
    }
    DaemonInfo::read(&home.daemon_json()).ok()
}

/// Finds a running daemon without ever starting one (`daemon stop`, `daemon status`, `logs`).
pub async fn detect(home: &CofferHome) -> Option<Daemon> {
    detect_with(home, &home.daemon_json()).await
}

/// [`detect`] with the daemon file at `file` (`daemon.json`, or `agent-access/agent.json`).
async fn detect_with(home: &CofferHome, file: &std::path::Path) -> Option<Daemon> {
    if !lock_is_held(&home.daemon_lock()) {
        return None;
    }
    let info = DaemonInfo::read(file).ok()?;
    let http = http_client();
    let base_url = format!("http://127.0.0.1:{}", info.port);
    let resp = http.get(format!("{base_url}/v1/health")).timeout(Duration::from_secs(2)).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let body: serde_json::Value = resp.json().await.ok()?;
    (body.get("pid").and_then(|p| p.as_u64()) == Some(u64::from(info.pid))).then_some(Daemon { info, base_url, http })
}

/// The running daemon as a managed agent's shim reaches it: through `agent-access/agent.json`
/// ([`CofferHome::agent_json`]), whose token the edge accepts on `/mcp` only. Reads only that
/// file and `daemon.lock` (all the agent sandbox grants of the daemon's files) and never starts
/// a daemon. A daemon that holds the lock but does not answer (its gateway restarting) is
/// waited for up to [`UNRESPONSIVE_PATIENCE`]. The file is read again on every call, so a shim
/// that lost its daemon finds the next one's token.
///
/// # Errors
/// [`ConnectError::NotRunning`] when no daemon holds the lock; [`ConnectError::Unresponsive`]
/// when it holds it but has not answered (or written `agent.json`) in time.
pub async fn connect_agent(home: &CofferHome) -> Result<Daemon, ConnectError> {
    let began = Instant::now();
    loop {
        if !lock_is_held(&home.daemon_lock()) {
            return Err(ConnectError::NotRunning { lock: home.daemon_lock().display().to_string() });
        }
        if let Some(d) = detect_with(home, &home.agent_json()).await {
            return Ok(d);
        }
        if began.elapsed() >= UNRESPONSIVE_PATIENCE {
            let info = DaemonInfo::read(&home.agent_json()).ok();
            return Err(ConnectError::Unresponsive {
                pid: info.as_ref().map_or(0, |i| i.pid),
                port: info.as_ref().map_or(0, |i| i.port),
                waited: Duration::from_secs(began.elapsed().as_secs()),
                logs: home.logs().display().to_string(),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Finds the running daemon or starts one and waits for it (at most [`START_DEADLINE`]).
///
/// # Errors
/// [`ConnectError`] when the home cannot be prepared, the daemon binary is missing, or the
/// daemon does not come up (the message carries the tail of its start-up output).
pub async fn detect_or_spawn(home: &CofferHome) -> Result<Daemon, ConnectError> {
    let began = Instant::now();
    if let Some(d) = detect(home).await {
        return Ok(d);
    }
    home.ensure()?;
    let deadline = Instant::now() + START_DEADLINE;
    let mut child: Option<crate::spawn::ManagedChild> = None;
    // Only what our daemon writes is reported on failure, not earlier runs' lines.
    let stdio_start = std::fs::metadata(home.daemon_stdio()).map(|m| m.len()).unwrap_or(0);
    // Held from our spawn until we return, so entry points racing from nothing start one daemon
    // between them instead of one each (the extras would lose the daemon.lock race and exit,
    // but only after the lock's patience).
    let mut _spawn_guard: Option<Flock<File>> = None;
    // Since when a daemon that was ready (lock held, daemon.json written) has not answered: from
    // the first health check when it was ready then already.
    let mut silent_since: Option<Instant> = ready_daemon(home).map(|_| began);
    loop {
        if let Some(d) = detect(home).await {
            return Ok(d);
        }
        let held = lock_is_held(&home.daemon_lock());
        match ready_daemon(home) {
            Some(info) => {
                let since = *silent_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= UNRESPONSIVE_PATIENCE {
                    return Err(ConnectError::Unresponsive {
                        pid: info.pid,
                        port: info.port,
                        waited: Duration::from_secs(since.elapsed().as_secs()),
                        logs: home.logs().display().to_string(),
                    });
                }
            }
            None => silent_since = None,
        }
        match child.as_mut() {
            None if !held => {
                if let Some(guard) = try_spawn_lock(home) {
                    // Re-check under the spawn lock: the previous holder's daemon may hold
                    // daemon.lock by now.
                    if !lock_is_held(&home.daemon_lock()) {
                        child = Some(spawn_daemon(home)?);
                        _spawn_guard = guard;
                    }
                }
            }
            Some(c) if !held => {
                if let Ok(Some(status)) = c.inner().try_wait() {
                    return Err(ConnectError::StartFailed {
                        status: status.to_string(),
                        detail: tail_of(&home.daemon_stdio(), stdio_start),
                    });
                }
            }
            _ => {}
        }
        if Instant::now() >= deadline {
            return Err(ConnectError::Timeout(START_DEADLINE, home.daemon_stdio().display().to_string()));
        }
        // Poll the lock and the health endpoint; both are cheap local checks.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Takes `spawn.lock` (an exclusive `flock`, released when the guard drops or the process dies)
/// without waiting. `None` when another entry point is starting a daemon right now; `Some(None)`
/// when the file cannot be opened — spawn unserialised then, `daemon.lock` still leaves one.
fn try_spawn_lock(home: &CofferHome) -> Option<Option<Flock<File>>> {
    use std::os::unix::fs::OpenOptionsExt;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(home.root().join("spawn.lock"));
    match opened {
        Ok(file) => Flock::lock(file, FlockArg::LockExclusiveNonblock).ok().map(Some),
        Err(_) => Some(None),
    }
}

fn spawn_daemon(home: &CofferHome) -> Result<crate::spawn::ManagedChild, ConnectError> {
    let program = find_binary("coffer-daemon", Some(crate::env::DAEMON_BIN))
        .ok_or_else(|| ConnectError::NoDaemonBinary { exe: exe_dir().display().to_string() })?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(home.daemon_stdio())
        .map_err(|source| crate::home::HomeError::NotWritable { path: home.daemon_stdio(), source })?;
    let err =
        out.try_clone().map_err(|source| crate::home::HomeError::NotWritable { path: home.daemon_stdio(), source })?;
    let mut spec = crate::spawn::SpawnSpec::new(program, "daemon", "coffer-daemon");
    spec.detached = true;
    spec.stdout = Stdio::from(out);
    spec.stderr = Stdio::from(err);
    // The daemon outlives this entry point and serves every later client: it starts from the
    // documented base environment (crate::base_env), never from this client's whole one.
    spec.env_clear = true;
    spec.env = crate::base_env::base_environment(std::env::vars_os());
    spec.env.push((crate::env::HOME.into(), home.root().as_os_str().to_owned()));
    Ok(crate::spawn::spawn(spec)?)
}

/// The last lines written to `path` after byte `from`, as `": a | b"` (empty when none).
fn tail_of(path: &std::path::Path, from: u64) -> String {
    let Ok(bytes) = std::fs::read(path) else { return String::new() };
    let text = String::from_utf8_lossy(bytes.get(from as usize..).unwrap_or_default()).into_owned();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    if lines.is_empty() {
        return String::new();
    }
    let mut out = String::from(": ");
    out.push_str(&lines.into_iter().rev().collect::<Vec<_>>().join(" | "));
    out
}

fn exe_dir() -> PathBuf {
    std::env::current_exe().ok().and_then(|p| p.parent().map(PathBuf::from)).unwrap_or_default()
}

/// Finds an executable: the path in `override_var` if set, else next to the current executable,
/// else on `PATH`.
pub fn find_binary(name: &str, override_var: Option<&str>) -> Option<PathBuf> {
    if let Some(v) = override_var.and_then(std::env::var_os).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(v));
    }
    let beside = exe_dir().join(name);
    if is_executable(&beside) {
        return Some(beside);
    }
    which_on_path(name)
}

/// Resolves `name` on `PATH` to an absolute path.
pub fn which_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| is_executable(p))
}

fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
