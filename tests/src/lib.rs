//! Harness for Coffer's end-to-end tests: real binaries, a temporary `COFFER_HOME`, free ports,
//! and cleanup that leaves no process behind.
//!
//! Run the suite with
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p coffer-tests
//! ```
//!
//! (`cargo test` does not build other packages' binaries; a missing one fails with a message
//! naming `cargo build --workspace --bins`, and an outdated one prints a warning.)
//!
//! A typical test:
//!
//! ```no_run
//! # async fn t() -> anyhow::Result<()> {
//! use coffer_tests::{SendExt, TestHome};
//! let home = TestHome::new()?;              // tempdir COFFER_HOME, free port range
//! let api = home.start_daemon().await?;     // spawns coffer-daemon, waits until ready
//! let r = api.get("/v1/status").reply().await?;
//! assert_eq!(r.status, 200);
//! let out = home.cli(&["status", "--json"]).await?;   // the `coffer` CLI on this home
//! # Ok(()) }                                 // Drop: SIGTERM, then SIGKILL what is left
//! ```
//!
//! Rules the harness enforces or makes easy: nothing touches `~/.coffer` (every process gets
//! `COFFER_HOME` and a private `HOME`); ports come from [`ports`]; readiness is awaited with
//! [`wait_for`] (poll with a deadline), never a blind sleep; every process of the home is found
//! through `/proc` ([`TestHome::processes`]) and ended when the [`TestHome`] drops, even when
//! the test panics. Set `COFFER_TEST_KEEP=1` to keep the temporary directory for inspection.

pub mod anthropic;
pub mod attack;
pub mod bench;
pub mod bins;
pub mod browser;
pub mod chat;
pub mod console;
pub mod embeddings;
pub mod fake_llm;
pub mod fake_registry;
pub mod fake_seatalk;
pub mod fake_telegram;
pub mod hostile;
pub mod http;
pub mod images;
pub mod inproc;
pub mod mcp;
pub mod model_hub;
pub mod openai;
pub mod peers;
pub mod ports;
pub mod procs;
pub mod script;
pub mod stream;
pub mod wait;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use coffer_runtime::daemon_file::{DaemonInfo, lock_is_held};
use nix::sys::signal::Signal;
use secrecy::ExposeSecret;

pub use bins::{BUILD_COMMAND, bin, peer, peers_dir};
pub use http::{Api, Reply, SendExt, service_in};
pub use procs::ProcInfo;
pub use wait::{abort, wait_for};

/// Writes `text` to `path`, creating its folders first (tests' note, skill and fact files).
///
/// # Errors
/// When a folder or the file cannot be written (the message names the path).
pub fn write_file(path: &Path, text: impl AsRef<[u8]>) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The check named `name` in a `coffer doctor --json` report (`{"checks": [{"name", "status",
/// "message", "fix"}, …]}`).
///
/// # Errors
/// When the report has no such check (the message shows the report).
pub fn doctor_check<'a>(report: &'a serde_json::Value, name: &str) -> anyhow::Result<&'a serde_json::Value> {
    report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .with_context(|| format!("no check {name:?} in {report}"))
}

/// How long a daemon may take to become ready (all services healthy, `daemon.json` written).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a CLI invocation may take before the harness kills it and fails.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(60);
/// How long cleanup waits after SIGTERM before it SIGKILLs what is left.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How many consecutive ports each home's `COFFER_PORT_RANGE` spans.
const PORT_BLOCK: u16 = 5;

/// Builder for a [`TestHome`] with extra environment or an unusual `COFFER_HOME` path.
#[derive(Debug, Default)]
pub struct TestHomeBuilder {
    env: BTreeMap<String, String>,
    unset: Vec<String>,
    home_at: Option<PathBuf>,
    honour_permissions: bool,
}

impl TestHomeBuilder {
    /// Sets `key=value` for every process the home starts (overrides the defaults).
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.unset.retain(|k| k != key);
        self.env.insert(key.to_owned(), value.into());
        self
    }

    /// Removes `key` from the environment of every process the home starts (including a
    /// default such as `COFFER_PORT_RANGE`).
    pub fn unset(mut self, key: &str) -> Self {
        self.env.remove(key);
        self.unset.push(key.to_owned());
        self
    }

    /// `COFFER_LOG` (a `tracing` filter such as `debug`) for every process.
    pub fn log_filter(self, filter: &str) -> Self {
        self.env("COFFER_LOG", filter)
    }

    /// `COFFER_PORT=port` (exact port) instead of the default free range.
    pub fn port(self, port: u16) -> Self {
        self.unset("COFFER_PORT_RANGE").env("COFFER_PORT", port.to_string())
    }

    /// `COFFER_PORT_RANGE=a-b` instead of the default free range.
    pub fn port_range(self, a: u16, b: u16) -> Self {
        self.unset("COFFER_PORT").env("COFFER_PORT_RANGE", format!("{a}-{b}"))
    }

    /// Makes file permissions bind the home's processes even when the tests run as root (CI and
    /// this machine do): every process it starts runs under `setpriv` without the
    /// `CAP_DAC_OVERRIDE` and `CAP_DAC_READ_SEARCH` capabilities (dropped from the bounding and
    /// inheritable sets, so the daemon's children lack them too), so a `chmod 000` file or
    /// folder is unreadable to them as it would be to a user's daemon. Not root: nothing to do.
    pub fn honour_file_permissions(mut self) -> Self {
        self.honour_permissions = true;
        self
    }

    /// Uses `<tempdir>/<relative>` as `COFFER_HOME` instead of `<tempdir>/home` (for homes
    /// that cannot be created; the path need not exist).
    pub fn home_at(mut self, relative: impl Into<PathBuf>) -> Self {
        self.home_at = Some(relative.into());
        self
    }

    /// Creates the temporary directory and picks a free port block. `COFFER_HOME` itself is not
    /// created: the daemon (or CLI) creates it.
    ///
    /// # Errors
    /// When a Coffer binary is missing (naming `cargo build --workspace --bins`) or the
    /// temporary directory cannot be created.
    pub fn build(self) -> anyhow::Result<TestHome> {
        bins::require_daemon_binaries()?;
        let temp =
            tempfile::Builder::new().prefix("coffer-e2e-").tempdir().context("creating a temporary directory")?;
        let temp_path = temp.path().to_path_buf();
        let root = temp_path.join(self.home_at.unwrap_or_else(|| PathBuf::from("home")));
        let user_home = temp_path.join("user-home");
        std::fs::create_dir(&user_home)?;
        // A private TMPDIR: with COFFER_HOME under /tmp, /tmp is an ancestor of the vault, where
        // the vault sandbox lets upstreams and agents create nothing new (docs/SECURITY.md,
        // "The vault sandbox"); a real ~/.coffer has /tmp as a sibling.
        let tmp = temp_path.join("tmp");
        std::fs::create_dir(&tmp)?;
        let port = ports::free_port_block(PORT_BLOCK);

        let mut env = BTreeMap::new();
        env.insert("COFFER_HOME".to_owned(), root.display().to_string());
        env.insert("COFFER_PORT_RANGE".to_owned(), format!("{port}-{}", port + PORT_BLOCK - 1));
        env.insert("COFFER_DAEMON_BIN".to_owned(), bins::bin("coffer-daemon")?.display().to_string());
        // A private HOME: whatever ignores COFFER_HOME still cannot reach the real ~/.coffer.
        env.insert("HOME".to_owned(), user_home.display().to_string());
        env.insert("TMPDIR".to_owned(), tmp.display().to_string());
        // No test downloads a model from a real hub (the built-in embedding engine would, on
        // first use); a test of downloads unsets it and names its fake hub.
        env.insert("HF_HUB_OFFLINE".to_owned(), "1".to_owned());
        for k in &self.unset {
            env.remove(k);
        }
        env.extend(self.env);
        Ok(TestHome {
            temp: Some(temp),
            temp_path,
            root,
            port,
            env,
            drop_dac: self.honour_permissions && nix::unistd::geteuid().is_root(),
            unset: self.unset,
            children: Mutex::new(Vec::new()),
            seq: AtomicUsize::new(0),
        })
    }
}

/// A process the harness started directly (not through the CLI), with its output files.
#[derive(Debug, Clone)]
pub struct Spawned {
    pub pid: i32,
    pub stdout_path: PathBuf,
    pub stderr_path: PathBuf,
}

impl Spawned {
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }
}

/// How a process the harness waited for ended.
#[derive(Debug, Clone)]
pub struct Exited {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Exited {
    /// Exit code (`None` when killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Output of one `coffer` CLI run.
#[derive(Debug, Clone)]
pub struct CliOutput {
    pub args: Vec<String>,
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// stdout parsed as JSON (for `--json`).
    ///
    /// # Errors
    /// When stdout is not JSON.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_str(&self.stdout).with_context(|| format!("stdout of {self} is not JSON"))
    }

    /// Fails unless the exit code is 0.
    ///
    /// # Errors
    /// Describing the run (args, code, stdout, stderr).
    pub fn ok(self) -> anyhow::Result<Self> {
        if !self.success() {
            bail!("{self} failed");
        }
        Ok(self)
    }
}

impl std::fmt::Display for CliOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`coffer {}` (exit {:?})\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.args.join(" "),
            self.code,
            self.stdout,
            self.stderr
        )
    }
}

/// One temporary `COFFER_HOME` with a free port range, and everything the tests start on it.
///
/// Dropping it stops every process of the home: SIGTERM to each `coffer-daemon` of this home,
/// a wait, then SIGKILL to every process that is left (found through `/proc`, see
/// [`TestHome::processes`]). On a panicking test it also prints the tails of the logs.
pub struct TestHome {
    temp: Option<tempfile::TempDir>,
    temp_path: PathBuf,
    root: PathBuf,
    port: u16,
    env: BTreeMap<String, String>,
    /// Processes run without the capabilities that bypass file permissions
    /// ([`TestHomeBuilder::honour_file_permissions`]).
    drop_dac: bool,
    unset: Vec<String>,
    children: Mutex<Vec<Child>>,
    seq: AtomicUsize,
}

impl TestHome {
    /// A home with the default environment. See [`TestHomeBuilder::build`].
    ///
    /// # Errors
    /// As [`TestHomeBuilder::build`].
    pub fn new() -> anyhow::Result<Self> {
        Self::builder().build()
    }

    pub fn builder() -> TestHomeBuilder {
        TestHomeBuilder::default()
    }

    /// `COFFER_HOME` (may not exist before the first start).
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// The temporary directory holding the home; free for scratch files.
    pub fn temp(&self) -> &Path {
        &self.temp_path
    }
    /// First port of this home's `COFFER_PORT_RANGE`.
    pub fn port(&self) -> u16 {
        self.port
    }
    /// The environment every started process gets (on top of the inherited one minus every
    /// `COFFER_*`).
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }
    /// Changes the environment for processes started from now on.
    pub fn set_env(&mut self, key: &str, value: impl Into<String>) {
        self.unset.retain(|k| k != key);
        self.env.insert(key.to_owned(), value.into());
    }
    /// Removes `key` from the environment of processes started from now on.
    pub fn unset_env(&mut self, key: &str) {
        self.env.remove(key);
        self.unset.push(key.to_owned());
    }

    pub fn daemon_json_path(&self) -> PathBuf {
        self.root.join("daemon.json")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn pids_dir(&self) -> PathBuf {
        self.root.join("upstream-pids")
    }

    /// `daemon.json` parsed and validated by the runtime's reader.
    ///
    /// # Errors
    /// When missing, corrupt or incomplete.
    pub fn daemon_info(&self) -> anyhow::Result<DaemonInfo> {
        Ok(DaemonInfo::read(&self.daemon_json_path())?)
    }

    /// `daemon.json` as raw JSON (to check its exact fields).
    ///
    /// # Errors
    /// When missing or not JSON.
    pub fn daemon_json(&self) -> anyhow::Result<serde_json::Value> {
        let p = self.daemon_json_path();
        let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_slice(&bytes).with_context(|| format!("{} is not JSON", p.display()))
    }

    /// An [`Api`] for the daemon that `daemon.json` names right now (no readiness check).
    ///
    /// # Errors
    /// As [`TestHome::daemon_info`].
    pub fn api(&self) -> anyhow::Result<Api> {
        let info = self.daemon_info()?;
        Ok(Api::new(info.port, info.token.expose_secret()))
    }

    /// A command for `program` with this home's environment: every inherited `COFFER_*` removed,
    /// the home's variables set, the temporary directory as working directory, stdin null.
    pub fn command(&self, program: &Path) -> std::process::Command {
        // Tests launch the binaries under test (which then use the spawn helper themselves).
        #[allow(clippy::disallowed_methods)]
        let mut cmd = if self.drop_dac {
            let mut c = std::process::Command::new("setpriv");
            const CAPS: &str = "-dac_override,-dac_read_search";
            c.args([format!("--inh-caps={CAPS}"), format!("--bounding-set={CAPS}"), "--".into()]).arg(program);
            c
        } else {
            std::process::Command::new(program)
        };
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("COFFER_") {
                cmd.env_remove(&k);
            }
        }
        for k in &self.unset {
            cmd.env_remove(k);
        }
        cmd.envs(&self.env).current_dir(&self.temp_path).stdin(Stdio::null());
        cmd
    }

    /// Starts `coffer-daemon` directly (stdout/stderr to files in the temporary directory) and
    /// returns at once. The process is reaped and killed by the home.
    ///
    /// # Errors
    /// When the binary is missing or cannot be executed.
    pub fn spawn_daemon(&self) -> anyhow::Result<Spawned> {
        self.spawn_binary("coffer-daemon", &[])
    }

    /// Starts a built binary `name` with `args` and this home's environment, like
    /// [`TestHome::spawn_daemon`].
    ///
    /// # Errors
    /// When the binary is missing or cannot be executed.
    pub fn spawn_binary(&self, name: &str, args: &[&str]) -> anyhow::Result<Spawned> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let stdout_path = self.temp_path.join(format!("{name}-{n}.stdout"));
        let stderr_path = self.temp_path.join(format!("{name}-{n}.stderr"));
        let mut cmd = self.command(&bin(name)?);
        cmd.args(args).stdout(std::fs::File::create(&stdout_path)?).stderr(std::fs::File::create(&stderr_path)?);
        die_with_test_thread(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let pid = child.id() as i32;
        self.children.lock().unwrap_or_else(|e| e.into_inner()).push(child);
        Ok(Spawned { pid, stdout_path, stderr_path })
    }

    /// The exit status of a process started by [`TestHome::spawn_binary`], if it has exited
    /// (reaps it).
    pub fn try_exit(&self, p: &Spawned) -> Option<ExitStatus> {
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        children.iter_mut().find(|c| c.id() as i32 == p.pid).and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits (polling, with a deadline) for a process started by [`TestHome::spawn_binary`] to
    /// exit.
    ///
    /// # Errors
    /// When it is still running after `timeout` (it is then killed).
    pub async fn wait_exit(&self, p: &Spawned, timeout: Duration) -> anyhow::Result<Exited> {
        let waited = wait_for(&format!("pid {} to exit", p.pid), timeout, || async { Ok(self.try_exit(p)) }).await;
        match waited {
            Ok(status) => Ok(Exited { status, stdout: p.stdout(), stderr: p.stderr() }),
            Err(e) => {
                procs::signal(p.pid, Signal::SIGKILL);
                Err(e.context(format!("stderr so far: {}", p.stderr())))
            }
        }
    }

    /// Runs `coffer-daemon` expecting it to exit on its own (a start-up failure), and returns
    /// how it ended.
    ///
    /// # Errors
    /// When it cannot be started, or is still running after `timeout` (it is then killed).
    pub async fn run_daemon_to_exit(&self, timeout: Duration) -> anyhow::Result<Exited> {
        let d = self.spawn_daemon()?;
        self.wait_exit(&d, timeout).await
    }

    /// Starts `coffer-daemon` and waits until it is ready: it holds `daemon.lock`, `daemon.json`
    /// names its pid, and `GET /v1/health` answers with that pid. Returns a client for it.
    ///
    /// # Errors
    /// When the daemon exits during start-up (with its stderr) or is not ready within
    /// [`START_TIMEOUT`]; both carry [`TestHome::diagnostics`].
    pub async fn start_daemon(&self) -> anyhow::Result<Api> {
        self.start_daemon_binary("coffer-daemon").await
    }

    /// [`TestHome::start_daemon`] with another supervisor binary (`coffer-test-daemon`).
    ///
    /// # Errors
    /// As [`TestHome::start_daemon`].
    pub async fn start_daemon_binary(&self, name: &str) -> anyhow::Result<Api> {
        self.start_daemon_args(name, &[]).await
    }

    /// [`TestHome::start_daemon_binary`] with arguments (`coffer-test-daemon scripted-chat`).
    ///
    /// # Errors
    /// As [`TestHome::start_daemon`].
    pub async fn start_daemon_args(&self, name: &str, args: &[&str]) -> anyhow::Result<Api> {
        let d = self.spawn_binary(name, args)?;
        let ready = wait_for("coffer-daemon to become ready", START_TIMEOUT, || async {
            if let Some(status) = self.try_exit(&d) {
                return Err(abort(format!("coffer-daemon exited during start-up ({status}); stderr: {}", d.stderr())));
            }
            self.probe_ready(Some(d.pid)).await
        })
        .await;
        ready.map_err(|e| e.context(self.diagnostics()))
    }

    /// Waits until some daemon of this home is ready (e.g. one the CLI started).
    ///
    /// # Errors
    /// When none is ready within `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<Api> {
        wait_for("a daemon of this home to become ready", timeout, || self.probe_ready(None))
            .await
            .map_err(|e| e.context(self.diagnostics()))
    }

    /// One readiness probe, the same test entry points use (`coffer_runtime::connect`).
    async fn probe_ready(&self, pid: Option<i32>) -> anyhow::Result<Option<Api>> {
        if !lock_is_held(&self.root.join("daemon.lock")) {
            return Ok(None);
        }
        let info = self.daemon_info()?;
        if pid.is_some_and(|p| p as u32 != info.pid) {
            return Ok(None);
        }
        let api = Api::new(info.port, info.token.expose_secret());
        let health = api.health().await?;
        Ok((health["pid"] == info.pid).then_some(api))
    }

    /// A `coffer` CLI command with this home's environment (for concurrent or long runs).
    ///
    /// # Errors
    /// When the binary is missing.
    pub fn cli_command(&self, args: &[&str]) -> anyhow::Result<tokio::process::Command> {
        let mut cmd = self.command(&bin("coffer")?);
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        Ok(cmd)
    }

    /// Runs `coffer <args>` on this home and captures its output.
    ///
    /// # Errors
    /// When it cannot be started or runs longer than [`CLI_TIMEOUT`] (it is then killed).
    pub async fn cli(&self, args: &[&str]) -> anyhow::Result<CliOutput> {
        let child = self.cli_command(args)?.spawn().context("starting coffer")?;
        let out = tokio::time::timeout(CLI_TIMEOUT, child.wait_with_output())
            .await
            .with_context(|| format!("`coffer {}` ran longer than {CLI_TIMEOUT:?}", args.join(" ")))??;
        Ok(CliOutput {
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Every live process of this home: those whose environment holds this `COFFER_HOME`
    /// (the daemon, its services, CLI runs), plus those recorded under `upstream-pids/` whose
    /// start time still matches (upstreams and agents do not get `COFFER_*` variables).
    pub fn processes(&self) -> Vec<ProcInfo> {
        let mut v = procs::with_env("COFFER_HOME", &self.root.display().to_string());
        for rec in self.pid_records() {
            if let Some(p) = procs::proc_info(rec.pid)
                && Some(p.start_time) == rec.start_time
                && !v.iter().any(|q| q.pid == p.pid)
            {
                v.push(p);
            }
        }
        v.sort_by_key(|p| p.pid);
        v
    }

    /// The live supervisor processes (`coffer-daemon`, or the tests' `coffer-test-daemon`) of
    /// this home.
    pub fn daemon_processes(&self) -> Vec<ProcInfo> {
        self.processes().into_iter().filter(|p| p.name == "coffer-daemon" || p.name == "coffer-test-daemon").collect()
    }

    /// The pid records under `upstream-pids/`.
    pub fn pid_records(&self) -> Vec<coffer_runtime::spawn::PidRecord> {
        let Ok(rd) = std::fs::read_dir(self.pids_dir()) else { return Vec::new() };
        rd.flatten()
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|b| serde_json::from_slice(&b).ok())
            .collect()
    }

    /// Waits until no process of this home is left.
    ///
    /// # Errors
    /// Listing the survivors after `timeout`.
    pub async fn wait_no_processes(&self, timeout: Duration) -> anyhow::Result<()> {
        wait_for("every process of this home to exit", timeout, || async {
            let left = self.processes();
            if left.is_empty() { Ok(Some(())) } else { Err(anyhow::anyhow!("still running: {}", list(&left))) }
        })
        .await
    }

    /// Sends SIGTERM to every `coffer-daemon` of this home and waits until every process of the
    /// home has exited (the graceful path: the daemon stops its services itself).
    ///
    /// # Errors
    /// When something is still running after `timeout`.
    pub async fn terminate_daemon(&self, timeout: Duration) -> anyhow::Result<()> {
        for d in self.daemon_processes() {
            procs::signal(d.pid, Signal::SIGTERM);
        }
        self.wait_no_processes(timeout).await?;
        self.reap_children();
        Ok(())
    }

    /// Concatenated text of `logs/<service>.*.log` (the daily-rotated files), oldest first.
    pub fn log_text(&self, service: &str) -> String {
        let Ok(rd) = std::fs::read_dir(self.logs_dir()) else { return String::new() };
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{service}.")) && n.ends_with(".log"))
            })
            .collect();
        files.sort();
        files.iter().filter_map(|f| std::fs::read_to_string(f).ok()).collect()
    }

    /// Waits until a line of `logs/<service>.*.log` contains every string of `needles`, and
    /// returns that line (logs are written by a background thread, so poll).
    ///
    /// # Errors
    /// When no such line appears within `timeout`.
    pub async fn wait_for_log_line(
        &self,
        service: &str,
        needles: &[&str],
        timeout: Duration,
    ) -> anyhow::Result<String> {
        wait_for(&format!("a line in logs/{service}.*.log containing {needles:?}"), timeout, || async {
            Ok(self.log_text(service).lines().find(|l| needles.iter().all(|n| l.contains(n))).map(str::to_owned))
        })
        .await
    }

    /// Waits until `logs/upstreams/<server>.log` (an upstream's stderr) holds `needle` at least
    /// `count` times (the gateway drains it continuously, so poll).
    ///
    /// # Errors
    /// When it does not within `timeout`.
    pub async fn wait_for_upstream_log(
        &self,
        server: &str,
        needle: &str,
        count: usize,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let log = self.logs_dir().join("upstreams").join(format!("{server}.log"));
        wait_for(&format!("{count}× {needle:?} in logs/upstreams/{server}.log"), timeout, || async {
            Ok((std::fs::read_to_string(&log).unwrap_or_default().matches(needle).count() >= count).then_some(()))
        })
        .await
    }

    /// A report for failure messages: processes of the home and the tail of every log and
    /// captured output.
    pub fn diagnostics(&self) -> String {
        let mut out = format!(
            "--- diagnostics for COFFER_HOME={} ---\nprocesses: {}\n",
            self.root.display(),
            list(&self.processes())
        );
        let mut files: Vec<PathBuf> = Vec::new();
        for dir in [self.logs_dir(), self.temp_path.clone()] {
            if let Ok(rd) = std::fs::read_dir(dir) {
                files.extend(rd.flatten().map(|e| e.path()).filter(|p| p.is_file()));
            }
        }
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            if lines.is_empty() {
                continue;
            }
            out.push_str(&format!("--- {} (last lines) ---\n", f.display()));
            for l in &lines[lines.len().saturating_sub(25)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    fn reap_children(&self) {
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        for c in children.iter_mut() {
            let _ = c.try_wait();
        }
    }

    /// Stops everything of this home (see the type's docs). Idempotent; also run on drop.
    /// Returns the processes that ignored SIGTERM and had to be killed.
    pub fn cleanup(&self) -> Vec<ProcInfo> {
        // Only processes carrying this home's COFFER_HOME are signalled, never a bare pid from
        // daemon.json: a test may plant a foreign (even its own) pid there.
        for d in self.daemon_processes() {
            procs::signal(d.pid, Signal::SIGTERM);
        }
        {
            let children = self.children.lock().unwrap_or_else(|e| e.into_inner());
            for c in children.iter() {
                procs::signal(c.id() as i32, Signal::SIGTERM);
            }
        }
        let mut killed = Vec::new();
        let calm = wait::wait_until_blocking(STOP_GRACE, || {
            self.reap_children();
            self.processes().is_empty()
        });
        if !calm {
            killed = self.processes();
            for p in &killed {
                procs::signal(p.pid, Signal::SIGKILL);
            }
        }
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        for c in children.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        children.clear();
        drop(children);
        wait::wait_until_blocking(Duration::from_secs(5), || self.processes().is_empty());
        killed
    }
}

impl Drop for TestHome {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            eprintln!("{}", self.diagnostics());
        }
        let killed = self.cleanup();
        if !killed.is_empty() {
            eprintln!("coffer-tests: SIGKILLed processes that outlived SIGTERM: {}", list(&killed));
        }
        if std::env::var_os("COFFER_TEST_KEEP").is_some()
            && let Some(t) = self.temp.take()
        {
            eprintln!("coffer-tests: kept {}", t.keep().display());
        }
    }
}

fn list(ps: &[ProcInfo]) -> String {
    if ps.is_empty() {
        return "none".into();
    }
    ps.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// Asks the kernel to SIGKILL a directly started daemon when the test thread that started it
/// ends, so even a test process killed from outside (timeout, Ctrl-C) leaves no daemon: its
/// services then follow through their own death signal.
#[allow(unsafe_code)]
pub(crate) fn die_with_test_thread(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook runs in the forked child before exec and only calls prctl(2), which is
    // async-signal-safe and does not allocate.
    unsafe {
        cmd.pre_exec(|| {
            #[cfg(target_os = "linux")]
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            Ok(())
        });
    }
}
