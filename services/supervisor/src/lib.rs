//! The supervisor (`coffer-daemon`): binds the listeners, spawns and watches the services,
//! restarts a crashed one with backoff, owns `daemon.json`/`daemon.lock`, sweeps orphans at
//! start, serves the control RPC, and shuts everything down in order. No domain logic.
//!
//! What it runs is one declarative table ([`table::SERVICES`]). Start-up: prepare `COFFER_HOME`
//! → take `daemon.lock` → remove a stale `daemon.json` → sweep orphans → bind listeners (one
//! internal listener per row) → generate one internal token per service → start the always-on
//! services in dependency order (store first; each once its dependencies answer the standard
//! gRPC health check) → write `daemon.json`. On-demand services start and stop through the
//! control RPC. Shutdown (SIGTERM/SIGINT or the `Stop` RPC): the reverse order — gateway first
//! (stops accepting, drains), store last; SIGKILL what does not exit in time; remove
//! `daemon.json`; release the lock by exiting.
//!
//! Two public tokens per run, both only in the edge's environment and one file each: the
//! owner's (`daemon.json`: every route) and the agents' (`agent-access/agent.json`: `/mcp`
//! only). Managed agents are sandboxed with read access to `agent-access/` but not to
//! `daemon.json`, so an agent following a hostile prompt can call tools but not act as the
//! owner (register a server that runs outside the sandbox, read credentials).

mod control;
mod service;
pub mod table;

use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use coffer_runtime::daemon_file::{DaemonInfo, DaemonLock};
use coffer_runtime::env as cenv;
use coffer_runtime::home::CofferHome;
use coffer_runtime::identity::{Identity, PeerDigests};
use secrecy::{ExposeSecret, SecretString};
use tokio_util::sync::CancellationToken;

pub use service::{ServiceState, ServiceStatusView};
pub use table::{SERVICES, ServiceSpec, Start};

/// Exit code when another daemon already holds the lock.
pub const EXIT_ALREADY_RUNNING: u8 = 3;

/// Process entry: runs the supervisor over [`SERVICES`] to completion and maps failures to an
/// exit code with a clear message on stderr.
pub fn main_entry() -> std::process::ExitCode {
    main_entry_with(SERVICES.to_vec())
}

/// [`main_entry`] over another service table (tests run one with a service marked on demand).
pub fn main_entry_with(table: Vec<ServiceSpec>) -> std::process::ExitCode {
    // Everything Coffer writes (DB, logs, keys, pid records) is for this user only.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let home = match CofferHome::from_env().and_then(|h| h.ensure().map(|_| h)) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("coffer-daemon: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let _guard = match coffer_runtime::logging::init_file(&home, "daemon") {
        Ok(g) => g,
        Err(e) => {
            eprintln!("coffer-daemon: cannot open logs in {}: {e:#}", home.logs().display());
            return std::process::ExitCode::from(1);
        }
    };
    // Connection caps, not the descriptor limit, should decide when a flood is turned away:
    // the soft limit goes up to the hard one, for this process and the services it starts.
    match coffer_runtime::limits::raise_fd_limit() {
        Ok((soft, hard)) => tracing::info!(soft, hard, "Open-file limit."),
        Err(e) => tracing::warn!(error = %e, "Cannot raise the open-file limit; keeping it."),
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    match rt.block_on(run_with(home, table)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            if let Some(coffer_runtime::daemon_file::DaemonFileError::Locked { .. }) = e.downcast_ref() {
                eprintln!("coffer-daemon: another coffer-daemon is already running ({e})");
                tracing::info!("Another daemon holds the lock; exiting.");
                return std::process::ExitCode::from(EXIT_ALREADY_RUNNING);
            }
            tracing::error!(error = %format!("{e:#}"), "Daemon failed.");
            eprintln!("coffer-daemon: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

/// Everything the supervisor shares between its tasks.
pub(crate) struct Shared {
    pub pid: u32,
    pub port: u16,
    pub started_at: String,
    pub shutdown: CancellationToken,
    /// One handle per table row, in table order.
    pub services: Vec<service::ServiceHandle>,
    /// What each supervision loop needs (also for services started on demand).
    pub ctx: service::Context,
}

impl Shared {
    pub fn service(&self, name: &str) -> Option<&service::ServiceHandle> {
        self.services.iter().find(|h| h.name == name)
    }
}

/// Runs the daemon over [`SERVICES`] until shutdown.
///
/// # Errors
/// As [`run_with`].
pub async fn run(home: CofferHome) -> anyhow::Result<()> {
    run_with(home, SERVICES.to_vec()).await
}

/// Runs the daemon over `table` until shutdown: every always-on service is started once the
/// services it depends on are healthy, on-demand ones wait for `StartService`; shutdown stops
/// them in the reverse order.
///
/// # Errors
/// When the table cannot run ([`table::TableError`]), the lock is held by another daemon, a
/// listener cannot be bound, or an always-on service never becomes healthy.
pub async fn run_with(home: CofferHome, table: Vec<ServiceSpec>) -> anyhow::Result<()> {
    let order = table::start_order(&table)?;
    let lock = DaemonLock::acquire(&home.daemon_lock(), Duration::from_secs(2))?;
    // We hold the lock, so any daemon.json (and agent.json) is stale (its daemon is dead).
    let _ = std::fs::remove_file(home.daemon_json());
    let _ = std::fs::remove_file(home.agent_json());
    let swept = coffer_runtime::spawn::sweep_orphans(&home.pids());
    if swept > 0 {
        tracing::warn!(count = swept, "Swept orphan processes of a previous run.");
    }

    let public = bind_public()?;
    let port = public.local_addr()?.port();
    let socket = bind_socket(&home.gateway_socket());
    let bind_internal = || TcpListener::bind("127.0.0.1:0").context("binding an internal loopback listener");
    let addr = |l: &TcpListener| l.local_addr().map(|a| a.to_string());
    // One internal listener per row (in table order), and the control RPC's.
    let listeners = table.iter().map(|_| bind_internal()).collect::<anyhow::Result<Vec<_>>>()?;
    let addresses = listeners.iter().map(addr).collect::<std::io::Result<Vec<_>>>()?;
    let control_l = bind_internal()?;
    let control_a = addr(&control_l)?;

    // One token per identity, generated for this run, never written anywhere: each child gets
    // its own in its environment, and the digests of all of them.
    let supervisor_token = coffer_runtime::token::random_token();
    let tokens: Vec<SecretString> = table.iter().map(|_| coffer_runtime::token::random_token()).collect();
    let digests = PeerDigests::from_tokens(
        std::iter::once((Identity::Supervisor, &supervisor_token))
            .chain(table.iter().map(|s| s.identity).zip(tokens.iter())),
    );
    let public_token = coffer_runtime::token::random_token();
    let agent_token = coffer_runtime::token::random_token();
    let pid = std::process::id();
    let started_at = coffer_runtime::now_rfc3339();

    let mut base_env: Vec<(String, String)> = vec![
        (cenv::HOME.into(), home.root().display().to_string()),
        (cenv::PEER_DIGESTS.into(), digests.to_env()),
        (cenv::CONTROL_ADDR.into(), control_a.clone()),
        (cenv::SUPERVISOR_PID.into(), pid.to_string()),
        (cenv::STARTED_AT.into(), started_at.clone()),
        (cenv::LISTEN_FD.into(), "3".into()),
    ];
    for (spec, a) in table.iter().zip(&addresses) {
        base_env.push((spec.identity.addr_var().into(), a.clone()));
    }
    // The callback's port and accepted host names are settings of the daemon's environment
    // (no secret): passed on like the log filter.
    for var in [
        cenv::LOG,
        cenv::LOG_MAX_FILE_MB,
        cenv::LOG_MAX_TOTAL_MB,
        cenv::MAX_CONNECTIONS,
        cenv::HEAD_TIMEOUT_MS,
        cenv::RETRIEVAL_PING_MS,
        cenv::SCHED_SLICE_US,
        cenv::BACKGROUND_NICE,
        cenv::CALLBACK_PORT,
        cenv::CALLBACK_HOSTS,
    ] {
        if let Ok(v) = std::env::var(var) {
            base_env.push((var.into(), v));
        }
    }
    let mut services = Vec::with_capacity(table.len());
    for (i, spec) in table.iter().enumerate() {
        let mut env = base_env.clone();
        env.push((cenv::INTERNAL_TOKEN.into(), tokens[i].expose_secret().to_owned()));
        env.push((cenv::FLAVOR.into(), spec.flavor.as_str().into()));
        let mut fds = vec![(listeners[i].as_raw_fd(), 3)];
        if spec.edge {
            env.push((cenv::PUBLIC_FD.into(), "4".into()));
            env.push((cenv::PUBLIC_TOKEN.into(), public_token.expose_secret().to_owned()));
            env.push((cenv::AGENT_TOKEN.into(), agent_token.expose_secret().to_owned()));
            env.push((cenv::PUBLIC_PORT.into(), port.to_string()));
            fds.push((public.as_raw_fd(), 4));
            if let Some(s) = &socket {
                fds.push((s.listener.as_raw_fd(), 5));
                env.push((cenv::SOCKET_FD.into(), "5".into()));
            }
        }
        services.push(service::ServiceHandle::new(*spec, fds, env, addresses[i].clone()));
    }

    let shutdown = CancellationToken::new();
    let ctx = service::Context { home: home.clone(), supervisor_token, shutdown: shutdown.clone() };
    let shared =
        Arc::new(Shared { pid, port, started_at: started_at.clone(), shutdown: shutdown.clone(), services, ctx });

    // Control RPC first, so status works while services start.
    let control_listener = tokio::net::TcpListener::from_std({
        control_l.set_nonblocking(true)?;
        control_l
    })?;
    let control_task = tokio::spawn(control::serve(control_listener, Arc::new(digests), shared.clone()));

    let start = std::time::Instant::now();
    for &i in &order {
        let svc = &shared.services[i];
        if svc.spec.start != Start::Always {
            continue;
        }
        for dep in svc.spec.depends_on {
            let d = shared.service(dep.as_str()).expect("start_order checked the dependencies");
            d.wait_healthy(Duration::from_secs(60))
                .await
                .with_context(|| format!("{dep} did not become healthy (needed by {})", svc.name))?;
        }
        svc.start(&shared.ctx).await;
    }
    for &i in &order {
        let svc = &shared.services[i];
        if svc.spec.start == Start::Always {
            svc.wait_healthy(Duration::from_secs(60))
                .await
                .with_context(|| format!("{} did not become healthy", svc.name))?;
        }
    }
    tracing::info!(port, elapsed_ms = start.elapsed().as_millis() as u64, "All services healthy.");

    let info = DaemonInfo {
        pid,
        port,
        token: public_token,
        started_at,
        version: coffer_runtime::VERSION.into(),
        socket: socket.as_ref().map(|_| home.gateway_socket()),
    };
    info.create_exclusive(&home.daemon_json()).context("writing daemon.json")?;
    // After daemon.json, so that entry points (a cold MCP client's shim) wait for no more than
    // before; an agent started by a turn in between (a channel message needs no entry point)
    // has its shim wait for this file while the daemon holds the lock (`connect_agent`).
    let for_agents = DaemonInfo { token: agent_token, ..info.clone() };
    for_agents.create_exclusive(&home.agent_json()).context("writing agent-access/agent.json")?;
    tracing::info!(port, pid, "Daemon ready.");

    wait_for_stop(&shutdown).await;
    tracing::info!("Shutting down.");
    shutdown.cancel();
    for &i in order.iter().rev() {
        shared.services[i].stop().await;
    }
    let _ = std::fs::remove_file(home.daemon_json());
    let _ = std::fs::remove_file(home.agent_json());
    control_task.abort();
    tracing::info!("Daemon stopped.");
    drop((public, socket, listeners));
    drop(lock);
    Ok(())
}

async fn wait_for_stop(shutdown: &CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received."),
        _ = int.recv() => tracing::info!("SIGINT received."),
        _ = shutdown.cancelled() => tracing::info!("Stop requested."),
    }
}

/// The edge's bound Unix-domain socket; its file is removed when this is dropped (at the end of
/// the daemon's life, and on every early return of a failed start).
struct SocketFile {
    listener: std::os::unix::net::UnixListener,
    path: std::path::PathBuf,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the edge's Unix-domain socket at `path` (0600, in the 0700 home), replacing a stale
/// one: the caller holds the daemon lock, so no live daemon owns it. `None`, with a warning,
/// when it cannot be bound (a home path longer than a socket address allows, a file system
/// without sockets): clients then use the TCP port only.
fn bind_socket(path: &std::path::Path) -> Option<SocketFile> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            let _ = std::fs::remove_file(path);
        }
        Ok(_) => {
            tracing::warn!(path = %path.display(), "Not binding the edge socket: something that is not a socket has its name; using the TCP port only.");
            return None;
        }
        Err(_) => {}
    }
    let bound = std::os::unix::net::UnixListener::bind(path)
        .and_then(|l| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map(|()| l));
    match bound {
        Ok(listener) => Some(SocketFile { listener, path: path.to_path_buf() }),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "Cannot bind the edge socket; using the TCP port only.");
            let _ = std::fs::remove_file(path);
            None
        }
    }
}

/// Binds the public listener: `COFFER_PORT` exactly, else the first free port of
/// `COFFER_PORT_RANGE` (default `8000-8009`).
fn bind_public() -> anyhow::Result<TcpListener> {
    if let Ok(p) = std::env::var(cenv::PORT) {
        let port: u16 = p.parse().with_context(|| format!("{}={p:?} is not a port number", cenv::PORT))?;
        return TcpListener::bind(("127.0.0.1", port))
            .with_context(|| format!("cannot listen on 127.0.0.1:{port} ({} is set)", cenv::PORT));
    }
    let range = std::env::var(cenv::PORT_RANGE).unwrap_or_else(|_| "8000-8009".into());
    let (a, b) = range
        .split_once('-')
        .and_then(|(a, b)| Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?)))
        .filter(|(a, b)| a <= b && *a > 0)
        .with_context(|| format!("{}={range:?} is not START-END", cenv::PORT_RANGE))?;
    for port in a..=b {
        match TcpListener::bind(("127.0.0.1", port)) {
            Ok(l) => {
                if port != a {
                    tracing::info!(port, preferred = a, "Preferred port taken; using the next free one.");
                }
                return Ok(l);
            }
            Err(e) => tracing::debug!(port, error = %e, "Port unavailable."),
        }
    }
    anyhow::bail!("no free port in 127.0.0.1:{a}-{b}; set {} to choose one", cenv::PORT)
}

/// An internal token wrapped for sharing; kept out of `Debug` output.
pub(crate) type Token = SecretString;
