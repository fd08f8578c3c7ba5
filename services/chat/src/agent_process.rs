//! Process plumbing shared by the agent adapters: resolving an agent CLI (settings path or
//! `PATH`), the environment it runs with, spawning it through the spawn helper with piped stdio,
//! reading its stdout as bounded lines on a channel, keeping the tail of its stderr, and ending
//! its process group.
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_runtime::home::CofferHome;
use coffer_runtime::spawn::{ManagedChild, SpawnSpec, spawn};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::ChildStdin;
use tokio::sync::mpsc;

use crate::adapter::{AgentEnv, Availability, FailureKind, StartError};

/// The longest stdout line an agent may print (a tool result with a large file is one line).
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// How many stderr lines are kept for a `cli_exited` message.
const STDERR_TAIL_LINES: usize = 20;
/// How many bytes of a line or stderr text go into an owner-facing message.
pub const QUOTE_BYTES: usize = 200;
/// How long an agent may take to exit after its stdin is closed at the end of a turn before its
/// process group is ended.
pub const EXIT_GRACE: Duration = Duration::from_secs(3);

/// Variables never passed to an agent besides `COFFER_*` (which the spawn helper strips too):
/// the marker Claude Code sets for its own children, which makes a nested `claude` refuse to
/// start when the daemon was itself started from inside a Claude Code session.
const DROPPED_VARS: &[&str] = &["CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT"];

/// What a provider was built with beyond [`AgentEnv`]: extra environment for every agent process
/// (applied last; tests point the CLIs at fake model APIs and a private `HOME` this way).
#[derive(Debug, Clone, Default)]
pub struct ExtraEnv(pub Vec<(OsString, OsString)>);

impl ExtraEnv {
    /// The value of `key` the agent will see: the extra environment first, then ours.
    pub fn var(&self, key: &str) -> Option<OsString> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.clone()).or_else(|| std::env::var_os(key))
    }

    /// The agent's whole environment: ours minus every `COFFER_*` and [`DROPPED_VARS`], then
    /// `own` (the adapter's), then the extra environment.
    pub fn build(&self, own: &[(&str, &OsStr)]) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
            .filter(|(k, _)| {
                let k = k.to_string_lossy();
                !k.starts_with("COFFER_") && !DROPPED_VARS.contains(&k.as_ref())
            })
            .collect();
        let mut set = |k: OsString, v: OsString| {
            env.retain(|(e, _)| *e != k);
            env.push((k, v));
        };
        for (k, v) in own {
            set((*k).into(), (*v).to_owned());
        }
        for (k, v) in &self.0 {
            set(k.clone(), v.clone());
        }
        env
    }
}

/// Where `command` (`claude`, `codex`) is: the settings path when set, else the first executable
/// file of that name on the agent's `PATH`.
///
/// # Errors
/// The reason for the owner, naming the setting and the npm package.
pub fn resolve(
    env: &AgentEnv,
    extra: &ExtraEnv,
    command: &str,
    package: &str,
    setting: &str,
) -> Result<PathBuf, String> {
    if let Some(path) = &env.command_override {
        return if is_executable(path) {
            Ok(path.clone())
        } else {
            Err(format!("{} ({setting}) is not an executable file", path.display()))
        };
    }
    let path = extra.var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(command))
        .find(|p| is_executable(p))
        .ok_or_else(|| format!("`{command}` was not found on PATH; install {package} or set {setting}"))
}

/// [`resolve`] as an [`Availability`].
pub fn availability(env: &AgentEnv, extra: &ExtraEnv, command: &str, package: &str, setting: &str) -> Availability {
    match resolve(env, extra, command, package, setting) {
        Ok(command) => Availability::Available { command, version: None },
        Err(reason) => Availability::Unavailable { reason },
    }
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What the stdout reader reports.
#[derive(Debug)]
pub enum Line {
    /// One line, without its newline (invalid UTF-8 replaced).
    Text(String),
    /// A line longer than [`MAX_LINE_BYTES`]; its first bytes.
    TooLong(String),
    /// Stdout closed (or could not be read).
    Eof,
}

/// A running agent CLI: its process (group), stdin, stdout lines and stderr tail.
pub struct AgentProcess {
    /// Which agent, for messages (`Claude Code`, `Codex`).
    pub agent: &'static str,
    child: ManagedChild,
    stdin: Option<ChildStdin>,
    /// Lines of stdout, in order, then one [`Line::Eof`].
    pub lines: mpsc::Receiver<Line>,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl AgentProcess {
    /// Spawns `program args…` in `cwd` with exactly `env` (see [`ExtraEnv::build`]), its stdio
    /// piped, a pid record under `COFFER_HOME/upstream-pids` (kind `agent`), confined by
    /// `sandbox` when given ([`AgentEnv::sandbox`]).
    ///
    /// # Errors
    /// [`StartError`] `cli_missing` when it cannot be executed.
    pub fn spawn(
        agent: &'static str,
        home: &AgentEnv,
        program: &Path,
        args: Vec<OsString>,
        env: Vec<(OsString, OsString)>,
        cwd: &Path,
        sandbox: Option<coffer_runtime::sandbox::Sandbox>,
    ) -> Result<Self, StartError> {
        let mut spec = SpawnSpec::new(program, "agent", agent);
        spec.sandbox = sandbox;
        spec.args = args;
        spec.env = env;
        spec.env_clear = true;
        spec.cwd = Some(cwd.to_path_buf());
        spec.stdin = Stdio::piped();
        spec.stdout = Stdio::piped();
        spec.stderr = Stdio::piped();
        let pids = CofferHome::at(home.coffer_home.clone()).pids();
        spec.pid_dir = std::fs::create_dir_all(&pids).is_ok().then_some(pids);
        let mut child = spawn(spec).map_err(|e| StartError {
            kind: FailureKind::CliMissing,
            message: format!("{agent} could not be started: {e}"),
        })?;
        let inner = child.inner();
        let stdin = inner.stdin.take();
        let stdout = inner.stdout.take();
        let stderr_pipe = inner.stderr.take();
        let (tx, lines) = mpsc::channel(256);
        if let Some(stdout) = stdout {
            tokio::spawn(read_lines(BufReader::new(stdout), tx));
        } else {
            let _ = tx.try_send(Line::Eof);
        }
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(pipe) = stderr_pipe {
            tokio::spawn(keep_tail(BufReader::new(pipe), stderr.clone()));
        }
        Ok(Self { agent, child, stdin, lines, stderr })
    }

    /// Whether the process is still running and printed nothing since its last turn (lines
    /// printed between turns are dropped): a kept process is reused only then.
    pub fn idle_and_alive(&mut self) -> bool {
        loop {
            match self.lines.try_recv() {
                Ok(Line::Text(_)) => {}
                Ok(Line::Eof | Line::TooLong(_)) | Err(mpsc::error::TryRecvError::Disconnected) => return false,
                Err(mpsc::error::TryRecvError::Empty) => break,
            }
        }
        matches!(self.child.inner().try_wait(), Ok(None)) && self.stdin.is_some()
    }

    /// The process (and group) id.
    pub fn pid(&self) -> i32 {
        self.child.pid()
    }

    /// Writes one line (a JSON message) to the agent's stdin.
    ///
    /// # Errors
    /// When stdin is closed (the agent exited).
    pub async fn send(&mut self, line: &str) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        stdin.write_all(&buf).await?;
        stdin.flush().await
    }

    /// Closes stdin (the agent's signal to finish).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The last non-empty stderr line, cut to [`QUOTE_BYTES`] (empty when there was none).
    pub fn last_stderr_line(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter().rev().find(|l| !l.trim().is_empty()).map(|l| quote(l.trim())).unwrap_or_default()
    }

    /// Closes stdin, waits up to `grace` for the agent to exit on its own, then ends its process
    /// group (SIGTERM, then SIGKILL after another `grace`). Everything of the group is gone when
    /// this returns. Returns the exit status when known.
    pub async fn finish(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.close_stdin();
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => self.child.terminate(grace).await,
        }
    }

    /// Ends the process group now (SIGTERM, SIGKILL after `grace`).
    pub async fn kill(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.close_stdin();
        self.child.terminate(grace).await
    }

    /// Waits for the exit after stdout closed (bounded by `grace`, then the group is ended), and
    /// describes it with the last stderr line: the `cli_exited` message.
    pub async fn exited_message(&mut self, grace: Duration) -> String {
        let status = self.finish(grace).await;
        let status = status.map_or_else(|| "an unknown status".to_owned(), describe_status);
        let last = self.last_stderr_line();
        if last.is_empty() {
            format!("{} exited ({status}) before the turn ended", self.agent)
        } else {
            format!("{} exited ({status}) before the turn ended: {last}", self.agent)
        }
    }
}

fn describe_status(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "an unknown status".to_owned(),
    }
}

/// `text` cut to [`QUOTE_BYTES`] at a character boundary, with `…` when cut.
pub fn quote(text: &str) -> String {
    if text.len() <= QUOTE_BYTES {
        return text.to_owned();
    }
    let mut end = QUOTE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Reads `r` as lines of at most [`MAX_LINE_BYTES`] onto `tx`; ends with [`Line::Eof`] (also
/// after a too-long line, whose rest is not read: the adapter fails the turn on it).
async fn read_lines<R: AsyncBufRead + Unpin>(mut r: R, tx: mpsc::Sender<Line>) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let line = match read_bounded_line(&mut r, &mut buf, MAX_LINE_BYTES).await {
            Ok(true) => Line::Text(String::from_utf8_lossy(&buf).into_owned()),
            Ok(false) => break,
            Err(_) if buf.len() > MAX_LINE_BYTES => {
                let _ = tx.send(Line::TooLong(quote(&String::from_utf8_lossy(&buf[..QUOTE_BYTES * 2])))).await;
                break;
            }
            Err(_) => break,
        };
        if tx.send(line).await.is_err() {
            return;
        }
    }
    let _ = tx.send(Line::Eof).await;
}

/// One line into `buf` (without `\n`): `Ok(true)` a line (the last may lack its newline),
/// `Ok(false)` end of input, `Err` a read error or a line over `max` bytes (`buf` then holds
/// more than `max` bytes).
async fn read_bounded_line<R: AsyncBufRead + Unpin>(r: &mut R, buf: &mut Vec<u8>, max: usize) -> std::io::Result<bool> {
    loop {
        let available = r.fill_buf().await?;
        if available.is_empty() {
            return Ok(!buf.is_empty());
        }
        if let Some(i) = available.iter().position(|&b| b == b'\n') {
            buf.extend_from_slice(&available[..i]);
            r.consume(i + 1);
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            return if buf.len() > max { Err(std::io::ErrorKind::InvalidData.into()) } else { Ok(true) };
        }
        let n = available.len();
        buf.extend_from_slice(available);
        r.consume(n);
        if buf.len() > max {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
    }
}

/// Keeps the last [`STDERR_TAIL_LINES`] lines of `r` (each cut to a few KiB).
async fn keep_tail<R: AsyncBufRead + Unpin>(mut r: R, tail: Arc<Mutex<VecDeque<String>>>) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match read_bounded_line(&mut r, &mut buf, 64 * 1024).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(_) if buf.len() > 64 * 1024 => buf.truncate(4096),
            Err(_) => return,
        }
        let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
        if t.len() == STDERR_TAIL_LINES {
            t.pop_front();
        }
        let mut line = String::from_utf8_lossy(&buf).into_owned();
        let mut end = line.len().min(4096);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
        t.push_back(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded_and_the_last_may_lack_a_newline() {
        let (tx, mut rx) = mpsc::channel(8);
        read_lines(&b"one\r\ntwo\nthree"[..], tx).await;
        let mut got = Vec::new();
        while let Some(l) = rx.recv().await {
            got.push(format!("{l:?}"));
        }
        assert_eq!(got, [r#"Text("one")"#, r#"Text("two")"#, r#"Text("three")"#, "Eof"]);

        let big = vec![b'x'; MAX_LINE_BYTES + 10];
        let (tx, mut rx) = mpsc::channel(8);
        read_lines(&big[..], tx).await;
        assert!(matches!(rx.recv().await, Some(Line::TooLong(p)) if p.starts_with("xxx") && p.ends_with('…')));
        assert!(matches!(rx.recv().await, Some(Line::Eof)));
    }

    #[test]
    fn quotes_are_cut_at_a_char_boundary() {
        let s = "é".repeat(QUOTE_BYTES);
        let q = quote(&s);
        assert!(q.len() <= QUOTE_BYTES + '…'.len_utf8() && q.ends_with('…'), "{q}");
        assert_eq!(quote("short"), "short");
    }

    #[test]
    fn the_agent_env_has_no_coffer_variable_and_extras_win() {
        let extra = ExtraEnv(vec![("HOME".into(), "/tmp/x".into()), ("CLAUDECODE".into(), "1".into())]);
        let env = extra.build(&[("IS_SANDBOX", OsStr::new("1")), ("HOME", OsStr::new("/nope"))]);
        assert!(env.iter().all(|(k, _)| !k.to_string_lossy().starts_with("COFFER_")));
        let homes: Vec<_> = env.iter().filter(|(k, _)| k == "HOME").collect();
        assert_eq!(homes.len(), 1);
        assert_eq!(homes[0].1, "/tmp/x");
        // An explicit extra is the test's (or embedder's) choice, even for a dropped name.
        assert!(env.iter().any(|(k, _)| k == "CLAUDECODE"));
        assert_eq!(extra.var("HOME"), Some("/tmp/x".into()));
    }

    #[test]
    fn resolve_names_the_setting_and_the_package() {
        let dir = tempfile::tempdir().unwrap();
        let env = AgentEnv {
            binding: None,
            coffer_home: dir.path().into(),
            agents_dir: dir.path().join("agents"),
            shim: dir.path().join("shim"),
            command_override: Some(dir.path().join("missing")),
            sandbox: false,
        };
        let e = resolve(&env, &ExtraEnv::default(), "claude", "@anthropic-ai/claude-code", "chat.claude_code_path");
        assert!(e.unwrap_err().contains("chat.claude_code_path"));
        let env = AgentEnv { command_override: None, ..env };
        let extra = ExtraEnv(vec![("PATH".into(), dir.path().into())]);
        let e = resolve(&env, &extra, "claude", "@anthropic-ai/claude-code", "chat.claude_code_path").unwrap_err();
        assert!(e.contains("not found on PATH") && e.contains("@anthropic-ai/claude-code"), "{e}");
        let exe = dir.path().join("claude");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(resolve(&env, &extra, "claude", "x", "y").unwrap(), exe);
    }
}
