//! `coffer doctor`: checks what commonly breaks a Coffer install and says how to fix each
//! problem. Never starts a daemon (a stopped one is reported with the command that starts it).
//!
//! Checks, each `ok`, `warn` or `fail` with a `fix:` line when not ok:
//! - permissions of `COFFER_HOME` (0700), `daemon.json`, `agent-access/agent.json` and
//!   `secret.key` (0600), owned by you;
//! - `coffer-mcp-shim` next to this `coffer` (MCP clients are pointed at it);
//! - the daemon answers, its version equals this CLI's, every service is healthy (`/v1/status`);
//! - every registered stdio upstream: its command exists and is executable, its working folder
//!   exists, arguments that look like files exist (relative ones against that folder); and the
//!   credentials any upstream references exist;
//! - an upstream `/v1/status` shows unhealthy (an error stands: its last start, a list or a
//!   call failed, and nothing succeeded since; a normal stop is no error): a warning, unless
//!   its configuration check above already failed for the same reason;
//! - the internal LLM connection `coffer__ask` runs on: a warning when none is set or its key is
//!   missing;
//! - every chat agent (Claude Code, Codex): its CLI's version and path, or a warning saying why
//!   it is unavailable (its CLI missing).
//! - what is exposed beyond loopback ([`check_remote`]): the extra hosts of `ui.allowed_hosts`,
//!   the `ui.bind` listener (and whether it answers), whether `/mcp` and the token answer there
//!   (`ui.remote_api`), with a warning for each risky combination.
//!
//! Exit 0 when no check fails (warnings allowed), 1 otherwise.
use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clap::Args;
use coffer_api::Page;
use coffer_api::channels::Channel;
use coffer_api::chat::Agent;
use coffer_api::credentials::Credential;
use coffer_api::daemon::{ServiceStatus, Status as DaemonStatus};
use coffer_api::knowledge::{JobState, KnowledgeBases};
use coffer_api::llm::LlmConnection;
use coffer_api::servers::{EnvValue, McpServer, Transport, UpstreamState, UpstreamStatus};
use coffer_api::settings::SettingsValues;
use coffer_api::sync::SyncStatus;
use coffer_runtime::daemon_file::lock_is_held;
use coffer_types::remote::{AllowedOrigin, binds_everywhere, parse_allowed_hosts, parse_bind};
use coffer_types::settings;
use serde_json::{Value, json};

use crate::context::Ctx;
use crate::error::CliError;
use crate::output;

const DOCTOR_EXAMPLES: &str = "\
Examples:
  coffer doctor
  coffer doctor --json | jq '.checks[] | select(.status != \"ok\")'

Never starts the daemon. Exits 0 when no check failed (warnings allowed), 1 otherwise.";

/// File extensions that make an argument a file the server needs (a script or an archive).
const SCRIPT_EXTENSIONS: &[&str] = &["js", "mjs", "cjs", "ts", "py", "rb", "pl", "php", "sh", "jar"];

#[derive(Debug, Args)]
#[command(after_help = DOCTOR_EXAMPLES)]
pub struct DoctorArgs {}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub message: String,
    /// What to do about it (set when not ok).
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: impl Into<String>, message: impl Into<String>) -> Self {
        Self { name: name.into(), status: Status::Ok, message: message.into(), fix: None }
    }
    fn warn(name: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name: name.into(), status: Status::Warn, message: message.into(), fix: Some(fix.into()) }
    }
    fn fail(name: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name: name.into(), status: Status::Fail, message: message.into(), fix: Some(fix.into()) }
    }

    fn to_json(&self) -> Value {
        json!({"name": self.name, "status": self.status.as_str(), "message": self.message, "fix": self.fix})
    }
}

/// Runs every check and prints the results.
///
/// # Errors
/// Exit 1 (after printing) when a check failed; stdout errors.
pub async fn run(ctx: &Ctx, _a: DoctorArgs) -> Result<(), CliError> {
    let home = ctx.home.root();
    let mut checks = vec![
        check_home(home),
        check_private_file(&ctx.home.daemon_json(), "daemon.json", "absent: no daemon is running"),
        check_private_file(&ctx.home.agent_json(), "agent.json", "absent: no daemon is running"),
        check_private_file(&ctx.home.secret_key(), "secret.key", "absent: created when the first credential is stored"),
        check_shim(),
        check_sandbox(coffer_runtime::sandbox::kernel_abi()),
    ];
    match ctx.detect_quietly().await {
        Some(api) => {
            let info = &api.daemon().info;
            checks.push(Check::ok("daemon", format!("running: pid {}, port {}", info.pid, info.port)));
            checks.push(check_version(&info.version, coffer_runtime::VERSION));
            checks.push(check_socket(info.socket.as_deref(), &ctx.home.gateway_socket()));
            let mut health = Vec::new();
            match api.get_as::<DaemonStatus>("/v1/status").await {
                Ok(status) => {
                    checks.extend(check_services(&status.services));
                    health = check_upstream_health(&status.upstreams);
                }
                Err(e) => checks.push(Check::fail(
                    "services",
                    format!("GET /v1/status failed: {e}"),
                    "coffer daemon restart; then coffer logs daemon",
                )),
            }
            let servers = api.get_as::<Page<McpServer>>("/v1/mcp/servers").await;
            let creds = api.get_as::<Page<Credential>>("/v1/credentials").await;
            match (servers, creds) {
                (Ok(s), Ok(c)) => {
                    let have: BTreeSet<String> = c.items.into_iter().map(|i| i.name).collect();
                    let workspace = home.join("workspace");
                    let items = s.items;
                    if items.is_empty() {
                        checks.push(Check::ok("upstreams", "none registered"));
                    }
                    let servers: Vec<Check> = items.iter().map(|srv| check_server(srv, &workspace, &have)).collect();
                    // A server whose configuration already failed its check is not warned about
                    // twice (its status names the same problem).
                    health.retain(|h| {
                        !servers.iter().any(|c| c.status != Status::Ok && h.name.starts_with(&format!("{} ", c.name)))
                    });
                    checks.extend(servers);
                }
                (Err(e), _) | (_, Err(e)) => checks.push(Check::fail(
                    "upstreams",
                    format!("cannot read the registry: {e}"),
                    "coffer daemon restart; then coffer logs store",
                )),
            }
            checks.extend(health);
            checks.push(match api.get_as::<Page<LlmConnection>>("/v1/llm/connections").await {
                Ok(c) => check_llm(&c.items),
                Err(e) => Check::fail("llm", format!("cannot read the LLM connections: {e}"), "coffer logs store"),
            });
            if let Ok(sync) = api.get_as::<SyncStatus>("/v1/sync/status").await {
                checks.extend(check_sync(&sync));
            }
            match api.get_as::<SettingsValues>("/v1/settings").await {
                Ok(SettingsValues { values }) => {
                    let get = |k: &str| values.get(k).map(String::as_str).unwrap_or("");
                    let remote = Remote::from_settings(
                        get(settings::UI_ALLOWED_HOSTS.key),
                        get(settings::UI_BIND.key),
                        get(settings::UI_REMOTE_API.key),
                    );
                    let answers = match remote.bind {
                        Some(addr) => Some(bind_answers(addr).await),
                        None => None,
                    };
                    checks.extend(check_remote(&remote, answers));
                }
                Err(e) => {
                    checks.push(Check::fail("exposure", format!("cannot read the settings: {e}"), "coffer logs store"))
                }
            }
            match api.get_as::<Page<Channel>>("/v1/channels").await {
                Ok(c) => checks.extend(check_channels(&c.items)),
                Err(e) => {
                    checks.push(Check::fail("channels", format!("cannot read the channels: {e}"), "coffer logs store"))
                }
            }
            match api.get_as::<KnowledgeBases>("/v1/knowledge").await {
                Ok(k) => checks.extend(check_knowledge(&k)),
                Err(e) => checks.push(Check::warn(
                    "knowledge",
                    format!("cannot list the knowledge bases: {e}"),
                    "coffer status; then coffer logs retrieval",
                )),
            }
            match api.get_as::<Page<Agent>>("/v1/agents").await {
                Ok(a) => checks.extend(check_agents(&a.items)),
                Err(e) => checks.push(Check::warn(
                    "agents",
                    format!("cannot list the chat agents: {e}"),
                    "coffer status; then coffer logs chat",
                )),
            }
        }
        None if lock_is_held(&ctx.home.daemon_lock()) => {
            checks.push(Check::fail(
                "daemon",
                "a daemon holds daemon.lock but does not answer on the port daemon.json names (starting, or stuck)",
                "wait a moment and run coffer doctor again; if it persists: coffer daemon restart, then coffer logs daemon",
            ));
        }
        None => {
            checks.push(Check::warn(
                "daemon",
                "not running (clients and commands start it when they need it)",
                "start it now: coffer daemon start",
            ));
            checks.push(Check::warn(
                "upstreams",
                "not checked: the daemon is not running",
                "coffer daemon start, then coffer doctor again",
            ));
        }
    }
    let failed = checks.iter().any(|c| c.status == Status::Fail);
    if ctx.json {
        output::print_json(&json!({"ok": !failed, "checks": checks.iter().map(Check::to_json).collect::<Vec<_>>()}))?;
    } else {
        output::print(&render(&checks))?;
    }
    if failed { Err(CliError::Quiet(crate::error::exit::ERROR)) } else { Ok(()) }
}

/// The human report: one line per check, a `fix:` line under each one that is not ok, and a
/// closing count.
pub fn render(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for c in checks {
        out.push_str(&format!("{:<4}  {:<width$}  {}\n", c.status.as_str(), c.name, c.message));
        if let Some(fix) = &c.fix {
            out.push_str(&format!("{:<4}  {:<width$}  fix: {fix}\n", "", ""));
        }
    }
    let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
    let (warns, fails) = (count(Status::Warn), count(Status::Fail));
    out.push_str(&format!(
        "\n{} ok, {warns} {}, {fails} failed\n",
        count(Status::Ok),
        if warns == 1 { "warning" } else { "warnings" }
    ));
    out
}

fn mode_of(m: &std::fs::Metadata) -> u32 {
    m.permissions().mode() & 0o7777
}

fn my_uid() -> u32 {
    nix::unistd::getuid().as_raw()
}

/// The vault sandbox: ok with the kernel's Landlock ABI, a warning (said once, here) where the
/// kernel has none — upstreams and agents then run unconfined and can read `COFFER_HOME`.
pub fn check_sandbox(abi: Option<u32>) -> Check {
    match abi {
        Some(v) => Check::ok("sandbox", format!("Landlock ABI {v}: upstreams and agents cannot read COFFER_HOME")),
        None => Check::warn(
            "sandbox",
            "this kernel has no Landlock: upstreams and agents run unsandboxed and can read COFFER_HOME \
             (secret.key, coffer.db, other servers' logs)",
            "use a kernel with Landlock (Linux 5.13+, `lsm=landlock` among the boot LSMs) to confine them",
        ),
    }
}

/// `COFFER_HOME` must be a folder of ours that nobody else can enter (0700).
pub fn check_home(home: &Path) -> Check {
    let shown = home.display();
    match std::fs::metadata(home) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Check::warn("home", format!("{shown} does not exist yet"), "coffer daemon start creates it (mode 0700)")
        }
        Err(e) => Check::fail(
            "home",
            format!("cannot inspect {shown}: {e}"),
            format!("check the path and its parents: ls -ld {shown}"),
        ),
        Ok(m) if !m.is_dir() => {
            Check::fail("home", format!("{shown} is not a folder"), "move it away, or set COFFER_HOME to a folder")
        }
        Ok(m) if m.uid() != my_uid() => Check::fail(
            "home",
            format!("{shown} belongs to uid {}, not to you (uid {})", m.uid(), my_uid()),
            format!("chown -R $(id -u) {shown}, or set COFFER_HOME to a folder of yours"),
        ),
        Ok(m) if mode_of(&m) & 0o077 != 0 || mode_of(&m) & 0o700 != 0o700 => Check::fail(
            "home",
            format!("{shown} has mode {:04o}; it holds tokens and credentials and must be 0700", mode_of(&m)),
            format!("chmod 700 {shown}"),
        ),
        Ok(_) => Check::ok("home", format!("{shown} (0700)")),
    }
}

/// A secret file (`daemon.json`, `agent.json`, `secret.key`) must be ours and 0600 when it exists.
pub fn check_private_file(path: &Path, name: &str, absent: &str) -> Check {
    let shown = path.display();
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Check::ok(name, absent),
        Err(e) => Check::fail(name, format!("cannot inspect {shown}: {e}"), format!("ls -l {shown}")),
        Ok(m) if m.uid() != my_uid() => Check::fail(
            name,
            format!("{shown} belongs to uid {}, not to you", m.uid()),
            format!("chown $(id -u) {shown}"),
        ),
        Ok(m) if mode_of(&m) & 0o077 != 0 => Check::fail(
            name,
            format!("{shown} has mode {:04o}: other users can read a secret", mode_of(&m)),
            format!("chmod 600 {shown}"),
        ),
        Ok(m) => Check::ok(name, format!("{shown} ({:04o})", mode_of(&m))),
    }
}

/// The edge's Unix-domain socket, which the shim's `/mcp` stream uses: `named` is the one
/// `daemon.json` gives (`None`: the daemon bound none), `expected` where it binds it. Without it
/// everything works over the TCP port, only slower, so its absence is a warning.
pub fn check_socket(named: Option<&Path>, expected: &Path) -> Check {
    const NAME: &str = "edge socket";
    let Some(path) = named else {
        return Check::warn(
            NAME,
            format!(
                "the daemon serves no Unix socket at {} (something else has that name, or the path is longer \
                 than a socket address allows); the shim uses the slower TCP port",
                expected.display()
            ),
            format!(
                "move what is at {} away (or use a shorter COFFER_HOME), then coffer daemon restart; the reason is in coffer logs daemon",
                expected.display()
            ),
        );
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) && mode_of(&m) & 0o077 == 0 => {
            Check::ok(NAME, format!("{} ({:04o}; the shim's stream uses it)", path.display(), mode_of(&m)))
        }
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => Check::fail(
            NAME,
            format!("{} has mode {:04o}: other users may connect", path.display(), mode_of(&m)),
            format!("chmod 600 {}", path.display()),
        ),
        _ => Check::warn(
            NAME,
            format!("daemon.json names {} but no socket is there; the shim uses the slower TCP port", path.display()),
            "coffer daemon restart",
        ),
    }
}

/// `coffer-mcp-shim` must be next to this `coffer`: that is the path `coffer connect` gives
/// clients.
fn check_shim() -> Check {
    let exe = std::env::current_exe().ok();
    let Some(shim) = exe.as_deref().and_then(Path::parent).map(|d| d.join(crate::commands::connect::SHIM)) else {
        return Check::fail("shim", "cannot find this coffer executable", "run coffer by its path");
    };
    match std::fs::metadata(&shim) {
        Ok(m) if m.is_file() && mode_of(&m) & 0o111 != 0 => Check::ok("shim", shim.display().to_string()),
        Ok(_) => Check::fail(
            "shim",
            format!("{} is not an executable file", shim.display()),
            format!("chmod +x {}", shim.display()),
        ),
        Err(_) => Check::fail(
            "shim",
            format!("{} is missing; MCP clients are pointed at it", shim.display()),
            "install Coffer's binaries together: ./scripts/install",
        ),
    }
}

/// The daemon must run the same version as this CLI.
pub fn check_version(daemon: &str, cli: &str) -> Check {
    if daemon == cli {
        Check::ok("version", format!("daemon and CLI are both {cli}"))
    } else {
        Check::fail(
            "version",
            format!("the daemon runs {daemon} but this coffer is {cli}"),
            "coffer daemon restart (starts the daemon installed with this coffer)",
        )
    }
}

/// One check per service of a `/v1/status` body: healthy or not.
pub fn check_services(services: &[ServiceStatus]) -> Vec<Check> {
    services
        .iter()
        .map(|s| {
            let (name, state) = (s.name.as_str(), s.state.as_str());
            let label = format!("service {name}");
            if state == "healthy" {
                return Check::ok(label, format!("healthy, pid {}", s.pid));
            }
            if state == "stopped" && s.on_demand {
                return Check::ok(label, "stopped (runs on demand)".to_owned());
            }
            let err = s.last_error.as_deref().map(|e| format!(": {}", output::truncate(e, 200))).unwrap_or_default();
            let fix = if name == "gateway" {
                "coffer daemon restart; then coffer logs gateway".to_owned()
            } else {
                format!("coffer daemon restart {name}; then coffer logs {name}")
            };
            Check::fail(label, format!("{state}{err}"), fix)
        })
        .collect()
}

/// A warning per upstream that `/v1/status` shows unhealthy (its last start or list failed);
/// nothing for the others (their configuration is checked apart, per server).
pub fn check_upstream_health(upstreams: &[UpstreamStatus]) -> Vec<Check> {
    upstreams
        .iter()
        .filter(|u| u.state == UpstreamState::Unhealthy)
        .map(|u| {
            let name = &u.name;
            let err = u.last_error.as_deref().map(|e| format!(": {}", output::truncate(e, 200))).unwrap_or_default();
            let at = u.last_error_at.as_deref().map(|t| format!(" (at {t})")).unwrap_or_default();
            // An HTTP server whose OAuth grant is gone needs the user's sign-in, not a test.
            if let Some(a) = u.auth.as_ref().filter(|a| a.state == coffer_api::servers::AuthState::NeedsSignIn) {
                return Check::warn(
                    format!("upstream {name} (gateway)"),
                    format!("needs sign-in ({})", a.why.as_deref().unwrap_or("no usable OAuth grant")),
                    a.command.clone().unwrap_or_else(|| format!("coffer mcp auth {name}")),
                );
            }
            Check::warn(
                format!("upstream {name} (gateway)"),
                format!("unhealthy{err}{at}"),
                format!("coffer mcp test {name}; coffer logs gateway"),
            )
        })
        .collect()
}

/// True for an argument that names a file the server needs: `./x`, `../x`, or a script
/// (`index.js`, `/p/server.py`); not an option, a URL or an npm package (`@scope/pkg`).
pub fn looks_like_file_arg(a: &str) -> bool {
    if a.starts_with('-') || a.starts_with('@') || a.contains("://") || a.contains('=') {
        return false;
    }
    if a.starts_with("./") || a.starts_with("../") {
        return true;
    }
    Path::new(a).extension().and_then(|e| e.to_str()).is_some_and(|e| SCRIPT_EXTENSIONS.contains(&e))
}

/// The internal LLM connection `coffer__ask` runs on: ok when one is set with its key, warn
/// when none is (or its key is missing).
pub fn check_llm(items: &[LlmConnection]) -> Check {
    match crate::commands::llm::internal_default(items) {
        None => Check::warn(
            "llm",
            "no internal LLM connection: coffer__ask cannot answer",
            "coffer llm add NAME --wire anthropic|openai|openai-chat|ollama --model ID --default (or coffer llm default NAME)",
        ),
        Some(c) => {
            let name = &c.name;
            let what = format!("internal connection {name} ({}, {})", c.wire, c.model);
            match c.credential_ref.as_deref() {
                Some(r) if !c.credential_set => Check::warn(
                    "llm",
                    format!("{what}: its credential {r} has no value"),
                    format!("coffer llm edit {name} --api-key-stdin (or coffer credentials set {r})"),
                ),
                _ => Check::ok("llm", format!("{what}; coffer llm test {name} tries it")),
            }
        }
    }
}

/// `coffer sync`: nothing while it is not set up; a warning per credential the synced vault
/// references that has no value on this machine ("set this credential here"), one for conflict
/// siblings left to look at, one for a failed last sync.
pub fn check_sync(s: &SyncStatus) -> Vec<Check> {
    if !s.initialized {
        return Vec::new();
    }
    let mut out = Vec::new();
    for name in &s.missing_credentials {
        out.push(Check::warn(
            format!("sync credential {name}"),
            "referenced by a synced entry, with no value on this machine: set this credential here",
            format!("coffer credentials set {name}"),
        ));
    }
    let conflicts = s.conflicts.len();
    if conflicts > 0 {
        out.push(Check::warn(
            "sync conflicts",
            format!("{conflicts} file(s) kept in two versions by a sync conflict"),
            "coffer sync status (compare each .conflict-… file with its original, keep what you want)",
        ));
    }
    match &s.last_error {
        Some(e) => out.push(Check::warn("sync", format!("the last sync failed: {e}"), "coffer sync")),
        None => out.push(Check::ok("sync", format!("set up with {}", s.remote))),
    }
    out
}

/// One check per knowledge base (`GET /v1/knowledge`), and one for the vector engine when its
/// embeddings fail:
/// - fail: its last pass failed, or its folder is gone (the message says which, with why);
/// - warn: not watching its folder (changes are seen only by the periodic rescan), folders it
///   cannot watch, files it cannot read (`cannot read: …`), other files it could not index;
/// - ok: indexed, with its documents, chunks and embedded chunks.
///
/// The memory knowledge base is checked like the others.
pub fn check_knowledge(k: &KnowledgeBases) -> Vec<Check> {
    let mut out = Vec::new();
    for kb in &k.items {
        let name = format!("knowledge {}", kb.name);
        let status = format!("coffer kb status {}", kb.name);
        let progress = kb.progress.clone().unwrap_or_default();
        if progress.state == JobState::Failed {
            let gone = progress.message.contains(" is gone");
            let why = if progress.message.is_empty() { "no reason given".to_owned() } else { progress.message.clone() };
            let fix = if gone {
                "move the folder back (it is indexed again as soon as it is there), or coffer kb remove it".to_owned()
            } else {
                format!("{status}; then coffer logs retrieval")
            };
            out.push(Check::fail(&name, format!("{}: {why}", if gone { "gone" } else { "failed" }), fix));
            continue;
        }
        let unwatched: Vec<&str> =
            kb.errors.iter().filter(|e| e.error.starts_with("not watched")).map(|e| e.path.as_str()).collect();
        let unreadable: Vec<&str> =
            kb.errors.iter().filter(|e| e.error.starts_with("cannot read")).map(|e| e.path.as_str()).collect();
        let other = kb.errors.len() - unwatched.len() - unreadable.len();
        let list = |v: &[&str]| {
            let shown: Vec<&str> = v.iter().take(3).copied().collect();
            let more = v.len().saturating_sub(shown.len());
            if more > 0 { format!("{} and {more} more", shown.join(", ")) } else { shown.join(", ") }
        };
        let mut problems = Vec::new();
        if !kb.watching && kb.kind == "folder" {
            problems.push("not watching its folder: changes are seen only by the periodic rescan".to_owned());
        }
        if !unwatched.is_empty() {
            problems.push(format!("{} folder(s) it cannot watch ({})", unwatched.len(), list(&unwatched)));
        }
        if !unreadable.is_empty() {
            problems.push(format!("{} file(s) or folder(s) it cannot read ({})", unreadable.len(), list(&unreadable)));
        }
        if problems.is_empty() {
            let errors =
                if other > 0 { format!("; {other} file(s) not indexed (binary, too large…)") } else { String::new() };
            out.push(Check::ok(
                &name,
                format!("{} documents, {} chunks, {} embedded{errors}", kb.documents, kb.chunks, kb.embedded),
            ));
        } else {
            if other > 0 {
                problems.push(format!("{other} other file(s) not indexed"));
            }
            out.push(Check::warn(
                &name,
                problems.join("; "),
                format!("{status} (make the named folders and files readable by the daemon's user)"),
            ));
        }
    }
    if let Some(v) = k.engines.iter().find(|e| e.name == "vector") {
        // The built-in engine without its model: not downloaded and downloads off, or the
        // download failed.
        let no_model = v.detail.contains("built-in model") || v.detail.contains("cannot download");
        let failing = v.detail.split_once("failing: ").map(|(_, why)| why);
        if no_model {
            let why = failing.or_else(|| v.detail.strip_prefix("off: ")).unwrap_or(&v.detail);
            out.push(Check::warn(
                "knowledge embeddings",
                format!("the built-in embedding engine has no model: {why}"),
                "put the model's files (config.json, tokenizer.json, model.safetensors) in a folder and run \
                 coffer settings set retrieval.embeddings.model_dir /path/to/that/folder; or let it download: \
                 coffer settings unset retrieval.embeddings.hub_url (and unset HF_HUB_OFFLINE)",
            ));
        } else if let Some(why) = failing {
            out.push(Check::warn(
                "knowledge embeddings",
                format!("the vector engine cannot embed: {why}"),
                "coffer settings get retrieval.embeddings.url (is the endpoint up?); then coffer logs retrieval",
            ));
        }
    }
    out
}

/// One check per chat agent (`GET /v1/agents`): ok with its CLI's version and path when
/// available ("version unknown" when its `--version` did not answer), a warning naming the
/// reason when not (its CLI is missing: chatting with it fails; the rest of Coffer works).
pub fn check_agents(items: &[Agent]) -> Vec<Check> {
    items
        .iter()
        .map(|a| {
            let check = format!("agent {}", a.agent_key);
            let name = crate::output::printable(&a.display_name);
            if a.available {
                let version = a.version.as_deref().filter(|v| !v.is_empty()).map(crate::output::printable);
                let version = version.map_or_else(|| "version unknown".to_owned(), |v| v.into_owned());
                let at = a.command.as_deref().map(crate::output::printable).unwrap_or_default();
                return Check::ok(check, format!("{name} {version} at {at}"));
            }
            let why = a.reason.as_deref().map(crate::output::printable).unwrap_or_else(|| "no reason given".into());
            Check::warn(
                check,
                format!("{name} is unavailable: {why}"),
                format!(
                    "install its CLI, or point Coffer at it: coffer settings set chat.{}_path /path/to/it (needed only to chat with it)",
                    a.agent_key
                ),
            )
        })
        .collect()
}

/// The remote-access settings as `coffer doctor` reads them (each as stored; an unparsable
/// value is kept as its error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// `ui.allowed_hosts`, or why it does not parse.
    pub hosts: Result<Vec<AllowedOrigin>, String>,
    /// `ui.bind` (`None`: loopback only).
    pub bind: Option<std::net::SocketAddr>,
    /// Why `ui.bind` does not parse, if it does not.
    pub bind_error: Option<String>,
    /// `ui.remote_api` is 1.
    pub remote_api: bool,
}

impl Remote {
    /// From the stored values (`""`: unset).
    pub fn from_settings(hosts: &str, bind: &str, remote_api: &str) -> Self {
        let (bind, bind_error) = match parse_bind(bind) {
            Ok(b) => (b, None),
            Err(e) => (None, Some(e)),
        };
        Remote { hosts: parse_allowed_hosts(hosts), bind, bind_error, remote_api: remote_api.trim() == "1" }
    }
}

/// True when a TCP connection to `addr` (its loopback twin for `0.0.0.0`/`[::]`) opens within
/// 2 s: the daemon listens on `ui.bind`.
async fn bind_answers(addr: std::net::SocketAddr) -> bool {
    let mut target = addr;
    if binds_everywhere(&addr) {
        target.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    matches!(
        tokio::time::timeout(std::time::Duration::from_secs(2), tokio::net::TcpStream::connect(target)).await,
        Ok(Ok(_))
    )
}

/// True for an address of a tailnet or WireGuard-style overlay that encrypts on its own:
/// Tailscale's CGNAT range `100.64.0.0/10` and its IPv6 prefix `fd7a:115c:a1e0::/48`.
fn is_tailnet_ip(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.octets()[0] == 100 && (v4.octets()[1] & 0xC0) == 64,
        std::net::IpAddr::V6(v6) => v6.segments()[..3] == [0xfd7a, 0x115c, 0xa1e0],
    }
}

/// What is exposed beyond loopback, and warnings for risky combinations:
/// - `exposure`: ok "loopback only" when nothing is set; else which origins the console answers
///   at, the `ui.bind` listener, and whether `/mcp` and the token answer beyond loopback;
/// - `ui.bind` on every interface (`0.0.0.0`, `[::]`): warn (every network the machine joins
///   reaches the login page; bind the tailnet or VPN address instead);
/// - `ui.bind` set with no `ui.allowed_hosts`: warn (that listener answers nothing);
/// - `ui.bind` set but not answering (`answers` false): warn (it is read at daemon start);
/// - a plain `http://` allowed host that is neither loopback (a tunnel) nor a tailnet address:
///   warn (the session's secrets cross the network unencrypted);
/// - `ui.remote_api` 1 with something exposed: warn (the owner's token and `/mcp` answer from
///   other devices); with `ui.bind` on every interface too: fail;
/// - a setting that does not parse (stored by hand): fail.
pub fn check_remote(r: &Remote, answers: Option<bool>) -> Vec<Check> {
    let mut out = Vec::new();
    let hosts = match &r.hosts {
        Ok(h) => h.clone(),
        Err(e) => {
            out.push(Check::fail(
                "exposure",
                format!("ui.allowed_hosts is not usable ({e}); the console answers on loopback only"),
                "coffer settings set ui.allowed_hosts https://NAME (or coffer settings unset ui.allowed_hosts)",
            ));
            Vec::new()
        }
    };
    if let Some(e) = &r.bind_error {
        out.push(Check::fail(
            "exposure",
            format!("ui.bind is not usable ({e}); nothing listens beyond loopback"),
            "coffer settings set ui.bind ADDRESS:PORT (or coffer settings unset ui.bind)",
        ));
    }
    let api = if r.remote_api { "answer there too (ui.remote_api = 1)" } else { "loopback only" };
    if hosts.is_empty() && r.bind.is_none() {
        out.push(Check::ok("exposure", "loopback only: console, /mcp and the token answer 127.0.0.1 only"));
        return out;
    }
    let origins: Vec<String> = hosts.iter().map(AllowedOrigin::origin).collect();
    let mut what = if origins.is_empty() {
        "console: no extra host".to_owned()
    } else {
        format!("console also at {}", origins.join(", "))
    };
    match r.bind {
        Some(b) => what.push_str(&format!("; listening beyond loopback on {b}")),
        None => what.push_str("; listening on loopback only (a proxy or tunnel on this machine forwards)"),
    }
    what.push_str(&format!("; /mcp and the token: {api}"));
    out.push(Check::ok("exposure", what));
    if let Some(b) = r.bind {
        if binds_everywhere(&b) {
            if r.remote_api {
                out.push(Check::fail(
                    "exposure: ui.bind",
                    format!("{b} listens on every interface and ui.remote_api = 1: anyone on any network this machine joins who has the token can use /mcp and the whole API"),
                    format!("coffer settings set ui.bind <tailnet address>:{} and coffer settings set ui.remote_api 0", b.port()),
                ));
            } else {
                out.push(Check::warn(
                    "exposure: ui.bind",
                    format!("{b} listens on every interface: any network this machine joins (café Wi-Fi, a LAN) reaches the console's login page"),
                    format!("bind the tailnet or VPN address only: coffer settings set ui.bind 100.x.y.z:{}; or unset it and use tailscale serve (docs/REMOTE.md)", b.port()),
                ));
            }
        }
        if hosts.is_empty() {
            out.push(Check::warn(
                "exposure: ui.bind",
                format!("{b} is set but ui.allowed_hosts is empty: that listener refuses every request"),
                format!("coffer settings set ui.allowed_hosts http://{b} (the origin the browser will open)"),
            ));
        }
        if answers == Some(false) {
            out.push(Check::warn(
                "exposure: ui.bind",
                format!("nothing answers on {b} (ui.bind is read when the daemon starts; or the address is not this machine's)"),
                "coffer daemon restart; then coffer logs gateway",
            ));
        }
    }
    for o in &hosts {
        let overlay =
            o.host.trim_matches(|c| c == '[' || c == ']').parse::<std::net::IpAddr>().is_ok_and(is_tailnet_ip)
                || o.host.ends_with(".ts.net");
        if !o.https && !o.is_loopback_name() && !overlay {
            out.push(Check::warn(
                format!("exposure: {}", o.origin()),
                "plain HTTP to another machine: the login link, the session cookie and its key cross the network unencrypted unless the network itself encrypts (a VPN)",
                "put TLS in front (tailscale serve, Caddy) and list the https:// origin instead",
            ));
        }
    }
    if r.remote_api && !r.bind.is_some_and(|b| binds_everywhere(&b)) {
        out.push(Check::warn(
            "exposure: ui.remote_api",
            "/mcp and the owner's token answer requests from other devices: anyone there who has the token (daemon.json) can act as you",
            "unless an MCP client on another machine needs it: coffer settings set ui.remote_api 0",
        ));
    }
    out
}

/// One check per channel (none: no check): a disabled channel is ok; an enabled one fails when
/// a credential it names has no value or coffer-chat reports its adapter `failed` (the cause
/// once: "adapter failed: <why>"), warns while the adapter retries after a failure (`backoff`,
/// with the next try) or while it is not paired (every chat is refused).
pub fn check_channels(items: &[Channel]) -> Vec<Check> {
    items
        .iter()
        .map(|c| {
            let name = &c.name;
            let check = format!("channel {name}");
            let kind = &c.kind;
            if !c.enabled {
                return Check::ok(check, format!("{kind} channel, disabled"));
            }
            let missing = crate::commands::channel::missing_credentials(c);
            if !missing.is_empty() {
                let flags: Vec<String> = missing.iter().map(|m| format!("--{}-env VAR", m.replace('_', "-"))).collect();
                return Check::fail(
                    check,
                    format!(
                        "enabled, but its {} credential has no value (its adapter cannot start)",
                        missing.join(", ")
                    ),
                    format!("coffer channel edit {name} {}", flags.join(" ")),
                );
            }
            let adapter = c.adapter.as_ref();
            let why =
                adapter.and_then(|a| a.last_error.as_deref()).filter(|e| !e.is_empty()).map(crate::output::printable);
            let retry = adapter.map(crate::commands::channel::retry_phrase).unwrap_or_default();
            match adapter.map(|a| a.state.as_str()) {
                Some("failed") => {
                    return Check::fail(
                        check,
                        format!("adapter failed: {}{retry}", why.unwrap_or_else(|| "no cause given".into())),
                        format!("fix the cause, then see coffer channel show {name} (details: coffer logs chat)"),
                    );
                }
                Some("backoff") => {
                    let unpaired = if c.paired { "" } else { "; also not paired: every chat is refused" };
                    return Check::warn(
                        check,
                        format!(
                            "adapter retrying after a failure: {}{retry}{unpaired}",
                            why.unwrap_or_else(|| "no cause given".into())
                        ),
                        format!("coffer logs chat; coffer channel show {name}"),
                    );
                }
                _ => {}
            }
            if !c.paired {
                return Check::warn(
                    check,
                    "enabled but not paired: every chat is refused",
                    format!("coffer channel pair {name}, then send /pair CODE to the bot"),
                );
            }
            Check::ok(check, format!("{kind} channel, paired, adapter {}", crate::commands::channel::adapter_state(c)))
        })
        .collect()
}

/// Checks one registered server (a `GET /v1/mcp/servers` item): for stdio, its command, working
/// folder and file arguments (relative ones against its folder, `workspace` by default); for
/// both transports, that the credentials it references exist. A disabled server's problems are
/// warnings: nothing runs it.
pub fn check_server(s: &McpServer, workspace: &Path, credentials: &BTreeSet<String>) -> Check {
    let name = &s.name;
    let label = format!("upstream {name}");
    let enabled = s.enabled;
    let problem = |message: String, fix: String| {
        if enabled {
            Check::fail(label.clone(), message, fix)
        } else {
            Check::warn(label.clone(), format!("{message} (the server is disabled)"), fix)
        }
    };
    let re_add = format!("give it the right command: coffer mcp edit {name} --command /path/to/it");
    let mut missing: Vec<&str> = s
        .env
        .values()
        .chain(s.headers.values())
        .filter_map(|v| match v {
            EnvValue::Ref(r) => Some(r.credential_ref.as_str()),
            EnvValue::Literal(_) => None,
        })
        .filter(|c| !credentials.contains(*c))
        .collect();
    missing.dedup();
    if let Some(c) = missing.first() {
        return problem(
            format!("references credential {c}, which does not exist"),
            format!("coffer credentials set {c}"),
        );
    }
    if s.transport != Transport::Stdio {
        let url = s.url.as_deref().unwrap_or("-");
        let state = if enabled { "" } else { ", disabled" };
        let word = s.transport.word();
        return Check::ok(label, format!("{word} {url}{state} (not contacted; coffer mcp test {name} tries it)"));
    }
    let command = s.command.as_deref().unwrap_or_default();
    // A bare name is registered as given and resolved on each machine's PATH when the server
    // starts (a synced registry may come from a machine with another layout).
    let found;
    let command = if !command.is_empty() && !command.contains('/') {
        match coffer_runtime::connect::which_on_path(command) {
            Some(p) => {
                found = p.display().to_string();
                found.as_str()
            }
            None => {
                return problem(
                    format!(
                        "command {command} is not on this machine's PATH (the server was registered with it as a bare name, perhaps on another machine)"
                    ),
                    format!("install it here, or {re_add}"),
                );
            }
        }
    } else {
        command
    };
    match std::fs::metadata(command) {
        Err(_) if command.is_empty() => return problem("has no command".into(), re_add),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return problem(format!("command {command} does not exist"), format!("install it, or {re_add}"));
        }
        Err(e) => return problem(format!("cannot inspect command {command}: {e}"), format!("ls -l {command}")),
        Ok(m) if !m.is_file() => return problem(format!("command {command} is not a file"), re_add),
        Ok(m) if mode_of(&m) & 0o111 == 0 => {
            return problem(format!("command {command} is not executable"), format!("chmod +x {command}"));
        }
        Ok(_) => {}
    }
    let cwd: PathBuf = match s.cwd.as_deref().filter(|c| !c.is_empty()) {
        Some(c) if !Path::new(c).is_dir() => {
            return problem(format!("working folder {c} does not exist"), format!("mkdir -p {c}, or {re_add}"));
        }
        Some(c) => PathBuf::from(c),
        None => workspace.to_path_buf(),
    };
    for a in s.args.iter().filter(|a| looks_like_file_arg(a)) {
        let p = cwd.join(a);
        if !p.exists() {
            return problem(
                format!("argument {a} does not exist (looked for {})", p.display()),
                format!("give the file's absolute path: {re_add}"),
            );
        }
    }
    let state = if enabled { "" } else { ", disabled" };
    Check::ok(label, format!("{command} exists and is executable{state}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn the_edge_socket_is_checked_for_presence_kind_and_privacy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.sock");
        let none = check_socket(None, &path);
        assert_eq!(none.status, Status::Warn);
        assert!(none.message.contains("serves no Unix socket") && none.fix.unwrap().contains("coffer daemon restart"));
        assert_eq!(check_socket(Some(&path), &path).status, Status::Warn, "named but missing");
        std::fs::write(&path, "x").unwrap();
        assert_eq!(check_socket(Some(&path), &path).status, Status::Warn, "named but not a socket");
        std::fs::remove_file(&path).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        chmod(&path, 0o600);
        let ok = check_socket(Some(&path), &path);
        assert_eq!(ok.status, Status::Ok, "{ok:?}");
        chmod(&path, 0o666);
        let open = check_socket(Some(&path), &path);
        assert_eq!(open.status, Status::Fail, "{open:?}");
        assert_eq!(open.fix.as_deref(), Some(format!("chmod 600 {}", path.display()).as_str()));
    }

    #[test]
    fn an_unhealthy_upstream_in_status_is_a_warning() {
        let upstream = |fields: Value| -> UpstreamStatus {
            let mut full = json!({"name": "u", "enabled": true, "transport": "stdio", "state": "ok", "running": 0,
                "last_start": null, "last_start_at": null, "last_error": null, "last_error_at": null,
                "duplicates": [], "sandbox": null, "catalog": {"state": "unknown"}});
            for (k, v) in fields.as_object().unwrap() {
                full[k] = v.clone();
            }
            serde_json::from_value(full).unwrap()
        };
        let status = [
            upstream(json!({"name": "ok1", "state": "ok", "last_error": null})),
            upstream(
                json!({"name": "remote", "state": "unhealthy", "last_error": "connection refused", "last_error_at": "2026-11-30T10:00:00.000Z"}),
            ),
            upstream(json!({"name": "off", "state": "disabled", "last_error": null})),
        ];
        let c = check_upstream_health(&status);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].name.as_str(), c[0].status), ("upstream remote (gateway)", Status::Warn));
        assert!(c[0].message.contains("connection refused") && c[0].message.contains("2026-11-30"), "{}", c[0].message);
        assert!(check_upstream_health(&[]).is_empty());
    }

    #[test]
    fn permissions() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        assert_eq!(check_home(&home).status, Status::Warn);
        std::fs::create_dir(&home).unwrap();
        chmod(&home, 0o755);
        let c = check_home(&home);
        assert_eq!(c.status, Status::Fail);
        assert!(c.message.contains("0755") && c.fix.as_deref() == Some(&*format!("chmod 700 {}", home.display())));
        chmod(&home, 0o700);
        assert_eq!(check_home(&home).status, Status::Ok);

        let f = home.join("secret.key");
        assert_eq!(check_private_file(&f, "secret.key", "absent").status, Status::Ok);
        std::fs::write(&f, "k").unwrap();
        chmod(&f, 0o644);
        let c = check_private_file(&f, "secret.key", "absent");
        assert_eq!(c.status, Status::Fail);
        assert_eq!(c.fix.unwrap(), format!("chmod 600 {}", f.display()));
        chmod(&f, 0o600);
        assert_eq!(check_private_file(&f, "secret.key", "absent").status, Status::Ok);
    }

    #[test]
    fn versions_and_services() {
        assert_eq!(check_version("0.1.0", "0.1.0").status, Status::Ok);
        let c = check_version("0.0.9", "0.1.0");
        assert_eq!(c.status, Status::Fail);
        assert!(c.fix.unwrap().contains("coffer daemon restart"));
        let service = |name: &str, pid: u32, state: &str, last_error: Option<&str>, on_demand: bool| ServiceStatus {
            name: name.into(),
            pid,
            state: state.into(),
            uptime_s: 0,
            restarts: 0,
            last_error: last_error.map(str::to_owned),
            on_demand,
        };
        let status = [
            service("store", 10, "healthy", None, false),
            service("chat", 0, "failed", Some("exit status 1"), false),
            service("callback", 0, "stopped", None, true),
            service("retrieval", 0, "stopped", None, false),
        ];
        let c = check_services(&status);
        assert_eq!(c[0].status, Status::Ok);
        assert_eq!((c[1].status, c[1].message.as_str()), (Status::Fail, "failed: exit status 1"));
        assert_eq!(c[1].fix.as_deref(), Some("coffer daemon restart chat; then coffer logs chat"));
        assert_eq!((c[2].status, c[2].message.as_str()), (Status::Ok, "stopped (runs on demand)"));
        assert_eq!(c[3].status, Status::Fail, "an always-on service stopped is a failure");
    }

    #[test]
    fn file_arguments() {
        for yes in ["./x", "../a/b", "index.js", "/p/server.py", "dist/main.mjs"] {
            assert!(looks_like_file_arg(yes), "{yes}");
        }
        for no in ["-y", "--port=3", "@scope/pkg", "stdio", "https://x/a.js", "/Users/me/Desktop", "mcp-server-fetch"] {
            assert!(!looks_like_file_arg(no), "{no}");
        }
    }

    #[test]
    fn servers() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        let exe = ws.join("srv");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        chmod(&exe, 0o755);
        std::fs::write(ws.join("index.js"), "").unwrap();
        let creds: BTreeSet<String> = ["tok".to_owned()].into();
        let srv = |v: Value| {
            let mut base = json!({"name": "s", "transport": "stdio", "command": exe.to_str().unwrap(), "args": [],
                "env": {}, "headers": {}, "cwd": null, "enabled": true, "url": null, "timeout_ms": null,
                "sandbox": true, "version": 1, "created_at": "x", "updated_at": "x"});
            for (k, x) in v.as_object().unwrap() {
                base[k] = x.clone();
            }
            check_server(&serde_json::from_value(base).unwrap(), ws, &creds)
        };
        assert_eq!(
            srv(json!({"args": ["./index.js", "-y"], "env": {"T": {"credential_ref": "tok"}}})).status,
            Status::Ok
        );
        let c = srv(json!({"command": "/nonexistent/srv"}));
        assert_eq!(c.status, Status::Fail);
        assert_eq!(c.name, "upstream s");
        assert!(c.message.contains("/nonexistent/srv does not exist"), "{c:?}");
        let c = srv(json!({"command": "/nonexistent/srv", "enabled": false}));
        assert_eq!(c.status, Status::Warn);
        assert!(srv(json!({"args": ["./missing.js"]})).message.contains("argument ./missing.js does not exist"));
        assert!(srv(json!({"cwd": "/nonexistent-dir"})).message.contains("working folder"));
        let c = srv(json!({"env": {"T": {"credential_ref": "gone"}}}));
        assert_eq!(c.fix.as_deref(), Some("coffer credentials set gone"));
        chmod(&exe, 0o644);
        assert!(srv(json!({})).message.contains("not executable"));
        let http: McpServer = serde_json::from_value(json!({"name": "h", "transport": "http", "command": null,
            "args": [], "url": "http://x/mcp", "env": {}, "headers": {}, "cwd": null, "enabled": true,
            "timeout_ms": null, "sandbox": null, "version": 1, "created_at": "x", "updated_at": "x"}))
        .unwrap();
        assert_eq!(check_server(&http, ws, &creds).status, Status::Ok);
    }

    #[test]
    fn knowledge_health() {
        let kbs = |items: Value, vector: &str| -> KnowledgeBases {
            serde_json::from_value(json!({"items": items, "next_cursor": null,
                "engines": [{"name": "vector", "enabled": true, "detail": vector}]}))
            .unwrap()
        };
        let kb = |name: &str, state: &str, message: &str, watching: bool, errors: Value| {
            json!({"name": name, "kind": "folder", "root": "/n", "include": [], "exclude": [], "created_ms": 1,
                "documents": 3, "chunks": 5, "embedded": 5, "last_sync_ms": 1, "pending": 0, "pending_embeddings": 0,
                "errors": errors, "watching": watching,
                "progress": {"state": state, "done": 0, "total": 0, "bytes_done": 0, "bytes_total": 0,
                    "started_ms": null, "message": message, "job": 1}})
        };
        let checks = check_knowledge(&kbs(
            json!([
                kb("fine", "idle", "", true, json!([{"path": "x.png.md", "error": "binary"}])),
                kb("gone", "failed", "the folder /n is gone (deleted, moved or unmounted); …", false, json!([])),
                kb("broken", "failed", "the pass stopped: store unavailable", true, json!([])),
                kb("blind", "idle", "", false, json!([])),
                kb(
                    "locked",
                    "idle",
                    "",
                    true,
                    json!([
                        {"path": "private", "error": "not watched for changes (Permission denied); the periodic rescan still looks at it"},
                        {"path": "private", "error": "cannot read: Permission denied (os error 13)"},
                        {"path": "a.md", "error": "cannot read: Permission denied (os error 13)"},
                    ])
                ),
            ]),
            "m (384) at http://127.0.0.1:9/v1; failing: connection refused",
        ));
        let got: Vec<(&str, &str)> = checks.iter().map(|c| (c.name.as_str(), c.status.as_str())).collect();
        assert_eq!(
            got,
            [
                ("knowledge fine", "ok"),
                ("knowledge gone", "fail"),
                ("knowledge broken", "fail"),
                ("knowledge blind", "warn"),
                ("knowledge locked", "warn"),
                ("knowledge embeddings", "warn"),
            ]
        );
        assert!(checks[0].message.contains("1 file(s) not indexed"), "{}", checks[0].message);
        assert!(checks[1].message.starts_with("gone: "), "{}", checks[1].message);
        assert!(checks[1].fix.as_deref().unwrap().contains("move the folder back"));
        assert!(checks[2].message.contains("store unavailable"), "{}", checks[2].message);
        assert!(checks[3].message.contains("not watching"), "{}", checks[3].message);
        assert!(checks[4].message.contains("1 folder(s) it cannot watch (private)"), "{}", checks[4].message);
        assert!(
            checks[4].message.contains("2 file(s) or folder(s) it cannot read (private, a.md)"),
            "{}",
            checks[4].message
        );
        assert_eq!(checks[5].message, "the vector engine cannot embed: connection refused");
        assert!(check_knowledge(&kbs(json!([]), "off: retrieval.embeddings.url is not set")).is_empty());
        // The built-in engine's model is missing (downloads off, or the download failed): a fix.
        for detail in [
            "off: the built-in model all-MiniLM-L6-v2 is not in COFFER_HOME/models/ and downloads are off (retrieval.embeddings.hub_url is empty or HF_HUB_OFFLINE is set): put its files …",
            "failing: cannot download all-MiniLM-L6-v2 from https://huggingface.co: connection refused. Connect this machine, or …",
        ] {
            let c = check_knowledge(&kbs(json!([]), detail));
            assert_eq!(c.len(), 1, "{detail}");
            assert_eq!((c[0].name.as_str(), c[0].status.as_str()), ("knowledge embeddings", "warn"));
            assert!(c[0].message.starts_with("the built-in embedding engine has no model: "), "{}", c[0].message);
            let fix = c[0].fix.as_deref().unwrap();
            assert!(fix.contains("coffer settings set retrieval.embeddings.model_dir"), "{fix}");
        }
    }

    #[test]
    fn channels() {
        let ch = |v: Value| {
            let c = check_channels(&[crate::commands::channel::test_channel(v)]);
            (c[0].status.as_str(), c[0].message.clone())
        };
        let base = json!({"name": "home", "kind": "telegram", "enabled": true, "paired": true,
            "credentials_set": {"bot_token": true}, "adapter": {"state": "running"}, "owner": {"id": "1"}});
        assert_eq!(ch(base.clone()).0, "ok");
        let mut v = base.clone();
        v["paired"] = json!(false);
        let (s, m) = ch(v);
        assert_eq!((s, m.as_str()), ("warn", "enabled but not paired: every chat is refused"));
        let mut v = base.clone();
        v["credentials_set"] = json!({"bot_token": false});
        let (s, m) = ch(v);
        assert_eq!(s, "fail");
        assert!(m.contains("bot_token credential has no value"), "{m}");
        let mut v = base.clone();
        v["adapter"] = json!({"state": "failed", "last_error": "401 from getMe"});
        assert_eq!(ch(v), ("fail", "adapter failed: 401 from getMe".to_owned()));
        let mut v = base.clone();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        let at = now + 30_000;
        v["adapter"] = json!({"state": "backoff", "last_error": "Telegram is unavailable: 502", "retry_at_ms": at});
        let (s, m) = ch(v);
        assert_eq!(s, "warn");
        assert!(m.starts_with("adapter retrying after a failure: Telegram is unavailable: 502 (next try in "), "{m}");
        assert!(!m.contains("failed: failed"), "{m}");
        let mut v = base;
        v["enabled"] = json!(false);
        v["paired"] = json!(false);
        assert_eq!(ch(v).0, "ok", "a disabled channel is not a problem");
        assert!(check_channels(&[]).is_empty());
    }

    #[test]
    fn exposure() {
        let names = |c: &[Check]| c.iter().map(|c| format!("{} {}", c.status.as_str(), c.name)).collect::<Vec<_>>();
        let none = check_remote(&Remote::from_settings("", "", ""), None);
        assert_eq!(names(&none), ["ok exposure"]);
        assert!(none[0].message.contains("loopback only"), "{none:?}");
        let ts = check_remote(&Remote::from_settings("https://box.tail1.ts.net", "", "0"), None);
        assert_eq!(names(&ts), ["ok exposure"]);
        assert!(ts[0].message.contains("console also at https://box.tail1.ts.net"), "{ts:?}");
        assert!(ts[0].message.contains("/mcp and the token: loopback only"), "{ts:?}");
        let open = check_remote(&Remote::from_settings("", "0.0.0.0:8443", "1"), Some(false));
        assert_eq!(
            names(&open),
            ["ok exposure", "fail exposure: ui.bind", "warn exposure: ui.bind", "warn exposure: ui.bind"],
            "{open:?}"
        );
        let lan = check_remote(&Remote::from_settings("http://192.168.1.5:8443", "192.168.1.5:8443", ""), Some(true));
        assert_eq!(names(&lan), ["ok exposure", "warn exposure: http://192.168.1.5:8443"], "{lan:?}");
        let tailnet = check_remote(&Remote::from_settings("http://100.64.1.2:8443", "100.64.1.2:8443", ""), Some(true));
        assert_eq!(names(&tailnet), ["ok exposure"], "{tailnet:?}");
        let api = check_remote(&Remote::from_settings("https://box.tail1.ts.net", "", "1"), None);
        assert_eq!(names(&api), ["ok exposure", "warn exposure: ui.remote_api"], "{api:?}");
        let bad = check_remote(&Remote::from_settings("box", "nowhere", ""), None);
        assert_eq!(names(&bad), ["fail exposure", "fail exposure", "ok exposure"], "{bad:?}");
    }

    #[test]
    fn report() {
        let checks =
            [Check::ok("home", "/h (0700)"), Check::fail("upstream fs", "command /x does not exist", "install it")];
        assert_eq!(
            render(&checks),
            "ok    home         /h (0700)\n\
             fail  upstream fs  command /x does not exist\n\
             \x20                  fix: install it\n\
             \n1 ok, 0 warnings, 1 failed\n"
        );
    }
}
