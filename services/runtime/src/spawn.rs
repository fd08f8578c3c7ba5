//! The one spawn helper. Every child process Coffer starts — its own services, upstream MCP
//! servers, agent CLIs, the callback listener, a detached daemon — goes through [`spawn`].
//!
//! A spawned child:
//! - runs in its own process group (so a kill reaches its own children too), or for a detached
//!   daemon in its own session;
//! - on Linux gets `PR_SET_PDEATHSIG = SIGKILL`, so it dies with its parent. The signal fires
//!   when the spawning *thread* exits, so spawn only from long-lived threads (tokio runtime
//!   workers or the main thread; never from `spawn_blocking`);
//! - is recorded under `upstream-pids/<pid>.json` with its start time, so a later daemon can
//!   sweep it after a crash without ever killing a recycled pid ([`sweep_orphans`]);
//! - never sees a `COFFER_*` variable from our environment: they are stripped, and only the ones
//!   in [`SpawnSpec::env`] are passed (the supervisor passes its services theirs explicitly;
//!   upstreams and agents get none);
//! - with [`SpawnSpec::sandbox`] set (upstream servers and agent CLIs), runs confined by Linux
//!   Landlock so that it cannot read `COFFER_HOME` beyond what it is given (see
//!   [`crate::sandbox`]); the ruleset is built here, before the fork, and only enforced in the
//!   child;
//! - is ended by [`ManagedChild::terminate`]: SIGTERM to the group, wait, SIGKILL; or SIGKILL to
//!   the group when the handle is dropped.
use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// What to start.
pub struct SpawnSpec {
    /// Absolute path of the program.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Extra environment, applied after every inherited `COFFER_*` variable is removed.
    pub env: Vec<(OsString, OsString)>,
    /// Clear the whole inherited environment first (then apply `env`).
    pub env_clear: bool,
    pub cwd: Option<PathBuf>,
    pub stdin: Stdio,
    pub stdout: Stdio,
    pub stderr: Stdio,
    /// Descriptors to pass: `(source fd in this process, fd number in the child)`.
    pub fds: Vec<(RawFd, RawFd)>,
    /// Record kind (`service`, `upstream`, `agent`, `daemon`) and name, for the pid record.
    pub kind: String,
    pub name: String,
    /// Folder for the pid record (`COFFER_HOME/upstream-pids`); `None` writes no record.
    pub pid_dir: Option<PathBuf>,
    /// Start in a new session with no death signal (the daemon started by an entry point must
    /// outlive it).
    pub detached: bool,
    /// Confine the child with this sandbox (`None`: not confined). Where the kernel has no
    /// Landlock the child runs unconfined and a warning is logged once per process.
    pub sandbox: Option<crate::sandbox::Sandbox>,
}

impl SpawnSpec {
    /// A spec with null stdio, no extra env and no pid record.
    pub fn new(program: impl Into<PathBuf>, kind: &str, name: &str) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            env_clear: false,
            cwd: None,
            stdin: Stdio::null(),
            stdout: Stdio::null(),
            stderr: Stdio::null(),
            fds: Vec::new(),
            kind: kind.to_owned(),
            name: name.to_owned(),
            pid_dir: None,
            detached: false,
            sandbox: None,
        }
    }
}

/// Error starting a child.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot start {program}: {source}")]
    Start { program: PathBuf, source: std::io::Error },
    /// The sandbox could not be built; the child is not started (fail closed).
    #[error("cannot sandbox {program}: {source}")]
    Sandbox { program: PathBuf, source: crate::sandbox::SandboxError },
}

/// The on-disk pid record of a spawned child.
#[derive(Debug, Serialize, Deserialize)]
pub struct PidRecord {
    pub pid: i32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22); `None` off Linux.
    pub start_time: Option<u64>,
    pub kind: String,
    pub name: String,
    /// Pid of the process that spawned it.
    pub parent: i32,
}

/// A running child. Dropping it kills its whole process group with SIGKILL and removes the pid
/// record; call [`ManagedChild::terminate`] for a graceful stop.
pub struct ManagedChild {
    child: tokio::process::Child,
    pid: i32,
    group: bool,
    record: Option<PathBuf>,
    reaped: bool,
}

/// Starts `spec`. Must be called inside a tokio runtime, from a long-lived thread.
///
/// # Errors
/// [`SpawnError::Start`] naming the program when it cannot be executed.
pub fn spawn(spec: SpawnSpec) -> Result<ManagedChild, SpawnError> {
    // The one spawn helper: every child process of Coffer starts here.
    #[allow(clippy::disallowed_methods)]
    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args);
    if spec.env_clear {
        cmd.env_clear();
    } else {
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("COFFER_") {
                cmd.env_remove(&k);
            }
        }
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    cmd.stdin(spec.stdin).stdout(spec.stdout).stderr(spec.stderr);
    cmd.kill_on_drop(false);
    if !spec.detached {
        cmd.process_group(0);
    }
    // Built before the fork (it allocates and opens descriptors); kept open until the child has
    // exec'd (the descriptor is close-on-exec in the child), closed when this returns.
    let prepared = match &spec.sandbox {
        Some(sandbox) => {
            let p =
                sandbox.prepare().map_err(|source| SpawnError::Sandbox { program: spec.program.clone(), source })?;
            if !p.is_active() {
                warn_unsandboxed_once();
            }
            Some(p)
        }
        None => None,
    };
    pre_exec::install(&mut cmd, spec.fds.clone(), spec.detached, prepared.as_ref().and_then(|p| p.raw_fd()));

    let child = cmd.spawn().map_err(|source| SpawnError::Start { program: spec.program.clone(), source })?;
    drop(prepared);
    let pid = child.id().map(|p| p as i32).unwrap_or(0);
    let record = match (&spec.pid_dir, spec.detached) {
        (Some(dir), false) => write_record(dir, pid, &spec.kind, &spec.name),
        _ => None,
    };
    Ok(ManagedChild { child, pid, group: !spec.detached, record, reaped: false })
}

/// Logs once per process that children asked to be sandboxed run unconfined (no Landlock).
fn warn_unsandboxed_once() {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!("This kernel has no Landlock: upstreams and agents run unsandboxed and can read COFFER_HOME.");
    });
}

fn write_record(dir: &Path, pid: i32, kind: &str, name: &str) -> Option<PathBuf> {
    let rec = PidRecord {
        pid,
        start_time: process_start_time(pid),
        kind: kind.to_owned(),
        name: name.to_owned(),
        parent: std::process::id() as i32,
    };
    let path = dir.join(format!("{pid}.json"));
    let body = serde_json::to_vec(&rec).ok()?;
    match std::fs::write(&path, body) {
        Ok(()) => Some(path),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "Cannot write pid record.");
            None
        }
    }
}

impl ManagedChild {
    /// Operating-system pid (also the process group id unless detached).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Mutable access to the child's stdio handles.
    pub fn inner(&mut self) -> &mut tokio::process::Child {
        &mut self.child
    }

    /// Waits for the child to exit, then kills what is left of its process group and removes
    /// the pid record.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let status = self.child.wait().await;
        self.finish();
        status
    }

    /// Graceful stop: SIGTERM to the group, then SIGCONT (as systemd does: a stopped process,
    /// e.g. one frozen with SIGSTOP or a shell's Ctrl-Z, handles the SIGTERM instead of waiting
    /// out the grace), wait up to `grace`, then SIGKILL to the group.
    pub async fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        if self.reaped {
            return None;
        }
        self.signal(Signal::SIGTERM);
        self.signal(Signal::SIGCONT);
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(s) => s.ok(),
            Err(_) => {
                tracing::warn!(
                    pid = self.pid,
                    grace_ms = grace.as_millis() as u64,
                    "Child did not stop in time; killing."
                );
                self.signal(Signal::SIGKILL);
                self.child.wait().await.ok()
            }
        };
        self.finish();
        status
    }

    /// Sends `sig` to the child's process group (or to the child alone when detached).
    pub fn signal(&self, sig: Signal) {
        if self.pid <= 0 {
            return;
        }
        let _ = if self.group {
            killpg(Pid::from_raw(self.pid), sig)
        } else {
            nix::sys::signal::kill(Pid::from_raw(self.pid), sig)
        };
    }

    fn finish(&mut self) {
        if self.reaped {
            return;
        }
        self.reaped = true;
        // Members of the group that outlived the leader (e.g. a node child of npx) go too.
        if self.group {
            self.signal(Signal::SIGKILL);
        }
        if let Some(p) = self.record.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for ManagedChild {
    fn drop(&mut self) {
        // A detached child (the daemon started by an entry point) is meant to outlive us.
        if !self.reaped && self.group {
            self.signal(Signal::SIGKILL);
            // Reap without blocking where possible; tokio reaps orphaned children in the
            // background otherwise.
            let _ = self.child.start_kill();
            let _ = self.child.try_wait();
            if let Some(p) = self.record.take() {
                let _ = std::fs::remove_file(p);
            }
            self.reaped = true;
        }
    }
}

/// Start time of `pid` in clock ticks since boot, from `/proc/<pid>/stat` field 22.
#[cfg(target_os = "linux")]
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Start time is not tracked off Linux; records then match on pid alone.
#[cfg(not(target_os = "linux"))]
pub fn process_start_time(_pid: i32) -> Option<u64> {
    None
}

/// Kills every process recorded in `pid_dir` whose pid *and* start time still match (a recycled
/// pid is left alone), and removes every record. Returns how many were killed.
pub fn sweep_orphans(pid_dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(pid_dir) else { return 0 };
    let mut killed = 0;
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let rec: Option<PidRecord> = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(rec) = rec
            && rec.pid > 1
            && rec.start_time.is_some()
            && process_start_time(rec.pid) == rec.start_time
        {
            tracing::info!(pid = rec.pid, kind = %rec.kind, name = %rec.name, "Killing orphan from a previous run.");
            let _ = killpg(Pid::from_raw(rec.pid), Signal::SIGKILL);
            let _ = nix::sys::signal::kill(Pid::from_raw(rec.pid), Signal::SIGKILL);
            killed += 1;
        }
        let _ = std::fs::remove_file(&path);
    }
    killed
}

#[allow(unsafe_code)]
mod pre_exec {
    use std::os::fd::RawFd;

    /// Marks every descriptor from 3 up close-on-exec except the targets in `fds`: the child
    /// gets its stdio and what it was given, never what the spawning process inherited from its
    /// own parent without close-on-exec (a shell's or a test runner's pipes) or opened without
    /// it. Best effort and async-signal-safe (`close_range(2)` with `CLOSE_RANGE_CLOEXEC`,
    /// Linux 5.11+; elsewhere nothing happens); no allocation.
    fn cloexec_all_but(fds: &[(RawFd, RawFd)]) {
        #[cfg(target_os = "linux")]
        {
            let mut targets = [RawFd::MAX; 8];
            for (slot, &(_, dst)) in targets.iter_mut().zip(fds) {
                *slot = dst;
            }
            targets.sort_unstable();
            let mut from: libc::c_uint = 3;
            for &dst in targets.iter().take_while(|&&d| d != RawFd::MAX) {
                let dst = dst as libc::c_uint;
                if dst > from {
                    // SAFETY: a plain syscall on this (forked) process's descriptor table.
                    unsafe { libc::syscall(libc::SYS_close_range, from, dst - 1, libc::CLOSE_RANGE_CLOEXEC) };
                }
                from = from.max(dst + 1);
            }
            // SAFETY: as above.
            unsafe { libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) };
        }
        #[cfg(not(target_os = "linux"))]
        let _ = fds;
    }

    /// Installs the pre-exec hook: the Landlock restriction when `landlock` holds a prepared
    /// ruleset descriptor (`prctl(PR_SET_NO_NEW_PRIVS)`, required by an unprivileged
    /// `landlock_restrict_self(2)`, then the restriction itself: raw syscalls, because the
    /// crate's `restrict_self` consumes its ruleset and builds status values we cannot use
    /// here), descriptor passing, new session for detached children, and the parent-death
    /// signal on Linux.
    pub(super) fn install(
        cmd: &mut tokio::process::Command,
        fds: Vec<(RawFd, RawFd)>,
        detached: bool,
        landlock: Option<RawFd>,
    ) {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec and only calls
        // async-signal-safe functions (dup2, fcntl, setsid, prctl, getppid, _exit, and the
        // landlock_restrict_self syscall); it does not allocate (the Vec was moved in before
        // fork).
        unsafe {
            cmd.pre_exec(move || {
                // First, while no descriptor has been moved yet (a target number may be the
                // ruleset's): the restriction covers the child and everything it executes.
                #[cfg(target_os = "linux")]
                if let Some(ruleset) = landlock {
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0 as libc::c_uint) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                #[cfg(not(target_os = "linux"))]
                let _ = landlock;
                // First move every source out of the way (a source may sit on a target number),
                // then place each copy on its target; dup2 leaves the target without CLOEXEC.
                let mut moved = [-1 as RawFd; 8];
                if fds.len() > moved.len() {
                    return Err(std::io::Error::from_raw_os_error(libc::EMFILE));
                }
                for (i, &(src, _)) in fds.iter().enumerate() {
                    moved[i] = libc::fcntl(src, libc::F_DUPFD_CLOEXEC, 100);
                    if moved[i] < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                for (i, &(_, dst)) in fds.iter().enumerate() {
                    if libc::dup2(moved[i], dst) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                cloexec_all_but(&fds);
                if detached {
                    if libc::setsid() < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else {
                    #[cfg(target_os = "linux")]
                    {
                        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        // The parent may have died between fork and prctl.
                        if libc::getppid() != parent {
                            libc::_exit(1);
                        }
                    }
                }
                let _ = parent;
                Ok(())
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn strips_coffer_env_and_records_pid() {
        let dir = tempfile::tempdir().unwrap();
        // SAFETY-free: set_var is unsafe in edition 2024; use a child env instead.
        let mut spec = SpawnSpec::new("/bin/sh", "upstream", "t");
        spec.args = vec!["-c".into(), "env; sleep 30".into()];
        spec.env = vec![("VISIBLE".into(), "1".into())];
        spec.stdout = Stdio::piped();
        spec.pid_dir = Some(dir.path().to_path_buf());
        let mut child = spawn(spec).unwrap();
        let rec_path = dir.path().join(format!("{}.json", child.pid()));
        let rec: PidRecord = serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
        assert_eq!(rec.pid, child.pid());
        assert_eq!(rec.start_time, process_start_time(child.pid()));
        let status = child.terminate(Duration::from_secs(5)).await;
        assert!(status.is_some());
        assert!(!rec_path.exists(), "record removed after terminate");
    }

    /// A real child under the sandbox, on a tree like a user's home with the vault inside it:
    /// what it may and may not do, as the shell reports it.
    #[tokio::test]
    async fn sandboxed_child_cannot_read_the_vault() {
        if crate::sandbox::kernel_abi().is_none() {
            panic!("this test needs a kernel with Landlock (none here): the sandbox cannot be tested");
        }
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let vault = home.join(".coffer");
        std::fs::create_dir_all(vault.join("workspace")).unwrap();
        std::fs::write(vault.join("secret.key"), "k").unwrap();
        std::fs::write(home.join("notes.txt"), "notes").unwrap();
        let script = "cat notes.txt; echo; cat .coffer/secret.key && echo READ-KEY; \
             echo w > .coffer/workspace/out && echo WROTE-WS; echo new > new-entry && echo CREATED; \
             ls .coffer >/dev/null && echo LISTED; rm .coffer/secret.key 2>/dev/null || echo NO-RM";
        let mut spec = SpawnSpec::new("/bin/sh", "upstream", "t");
        spec.args = vec!["-c".into(), script.into()];
        spec.cwd = Some(home.clone());
        spec.stdout = Stdio::piped();
        spec.sandbox = Some(crate::sandbox::Sandbox::hiding(&vault).allow(vault.join("workspace")));
        let mut child = spawn(spec).unwrap();
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(child.inner().stdout.as_mut().unwrap(), &mut out).await.unwrap();
        child.wait().await.unwrap();
        assert!(out.contains("notes"), "the rest of the home is readable: {out}");
        assert!(!out.contains("READ-KEY"), "the vault is hidden: {out}");
        assert!(out.contains("WROTE-WS"), "the workspace is writable: {out}");
        assert!(!out.contains("CREATED"), "a new entry directly in an ancestor is not covered: {out}");
        assert!(out.contains("LISTED") && out.contains("NO-RM"), "{out}");
        assert!(vault.join("secret.key").exists());
    }

    #[test]
    fn sweep_skips_recycled_pid() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        let rec = PidRecord { pid: me, start_time: Some(1), kind: "x".into(), name: "y".into(), parent: 1 };
        std::fs::write(dir.path().join(format!("{me}.json")), serde_json::to_vec(&rec).unwrap()).unwrap();
        // Start time 1 does not match ours: we must survive and the record must go.
        assert_eq!(sweep_orphans(dir.path()), 0);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
