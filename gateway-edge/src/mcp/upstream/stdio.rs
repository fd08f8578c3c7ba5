//! The stdio transport of an upstream (MCP 2025-11-25 basic/transports §stdio): the child
//! process spawned through `coffer_runtime::spawn` (sandboxed, in its own working directory),
//! newline-delimited JSON-RPC on its stdin/stdout (a writer and a reader task feeding the
//! [`Core`]), and its stderr drained continuously into `logs/upstreams/<server>.log`
//! (credential values redacted, rotated past [`STDERR_LOG_ROTATE`] bytes) with its last lines
//! kept to say why it failed.
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_proto::store::McpServer;
use coffer_runtime::home::CofferHome;
use coffer_runtime::ndjson::{FrameReader, Input};
use coffer_runtime::spawn::SpawnSpec;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::{Core, MAX_FRAME, Transport, trim_line};

/// A stderr log larger than this is rotated to `<server>.log.1` when an upstream starts.
const STDERR_LOG_ROTATE: u64 = 10 * 1024 * 1024;
/// Most stderr lines kept to explain a failure, and the longest kept of each (characters).
const STDERR_TAIL_LINES: usize = 5;
const STDERR_TAIL_CHARS: usize = 300;

/// The last lines an upstream wrote on stderr (redacted), and whether stderr reached its end.
pub(super) struct StderrTail {
    lines: Mutex<std::collections::VecDeque<String>>,
    done: tokio::sync::watch::Sender<bool>,
}

impl StderrTail {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self { lines: Mutex::default(), done: tokio::sync::watch::Sender::new(false) })
    }

    fn push(&self, line: &str) {
        let mut lines = self.lines.lock().expect("tail");
        if lines.len() == STDERR_TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line.chars().take(STDERR_TAIL_CHARS).collect());
    }

    /// The kept lines, after waiting at most `wait` for stderr to end.
    pub(super) async fn read(&self, wait: Duration) -> Vec<String> {
        let mut done = self.done.subscribe();
        let _ = tokio::time::timeout(wait, done.wait_for(|d| *d)).await;
        self.lines.lock().expect("tail").iter().filter(|l| !l.trim().is_empty()).cloned().collect()
    }
}

pub(super) fn start_stdio(
    server: &McpServer,
    home: &CofferHome,
    core: Arc<Core>,
    redactor: Arc<crate::credentials::Redactor>,
) -> Result<(Transport, i32), String> {
    // A bare command (as registered: synced registries keep it so) is resolved on this
    // machine's PATH now, so that a missing one is named rather than reported as ENOENT.
    let command = if server.command.contains('/') {
        std::path::PathBuf::from(&server.command)
    } else {
        coffer_runtime::connect::which_on_path(&server.command)
            .ok_or_else(|| format!("command {} is not on this machine's PATH", server.command))?
    };
    let mut spec = SpawnSpec::new(&command, "upstream", &server.name);
    spec.args = server.args.iter().map(Into::into).collect();
    spec.env = server.env.iter().map(|(k, v)| (k.into(), v.into())).collect();
    // Each server's default working directory is its own (`workspace/servers/<name>`), never a
    // folder another server or an agent runs in: a server could otherwise plant files there
    // (an `.npmrc`, a `CLAUDE.md`, a shadowing module) that the next process started there obeys.
    let cwd: std::path::PathBuf = if server.cwd.is_empty() {
        let own = home.root().join("workspace").join("servers").join(&server.name);
        std::fs::create_dir_all(&own).map_err(|e| format!("cannot create {}: {e}", own.display()))?;
        own
    } else {
        server.cwd.clone().into()
    };
    // The vault sandbox (docs/ARCHITECTURE.md, "The vault sandbox"): the server reaches its
    // working directory and everything outside COFFER_HOME, nothing else of it.
    if !server.no_sandbox {
        spec.sandbox = Some(coffer_runtime::sandbox::Sandbox::hiding(home.root()).allow(&cwd));
    }
    spec.cwd = Some(cwd);
    spec.stdin = Stdio::piped();
    spec.stdout = Stdio::piped();
    spec.stderr = Stdio::piped();
    spec.pid_dir = Some(home.pids());
    let mut child = coffer_runtime::spawn::spawn(spec).map_err(|e| e.to_string())?;
    let pid = child.pid();
    let stdin = child.inner().stdin.take();
    let stdout = child.inner().stdout.take().ok_or("no stdout")?;
    let tail = StderrTail::new();
    match child.inner().stderr.take() {
        Some(stderr) => {
            let log = home.upstream_logs().join(format!("{}.log", server.name));
            tokio::spawn(drain_stderr(stderr, log, redactor, tail.clone()));
        }
        None => {
            tail.done.send_replace(true);
        }
    }
    let (tx, rx) = mpsc::unbounded_channel();
    if let Some(stdin) = stdin {
        tokio::spawn(write_loop(stdin, rx, core.clone()));
    }
    tokio::spawn(read_loop(stdout, core));
    let transport =
        Transport::Stdio { stdin: Mutex::new(Some(tx)), child: tokio::sync::Mutex::new(Some(child)), stderr: tail };
    Ok((transport, pid))
}

/// Writes queued frames to the child's stdin, coalescing everything already queued into one
/// write (fewer syscalls and wake-ups for the upstream when many calls are in flight). Ends,
/// closing stdin, when every sender is gone; a write error closes the connection.
async fn write_loop(mut stdin: tokio::process::ChildStdin, mut rx: mpsc::UnboundedReceiver<Vec<u8>>, core: Arc<Core>) {
    let mut batch = Vec::with_capacity(16 * 1024);
    while let Some(first) = rx.recv().await {
        batch.clear();
        batch.extend_from_slice(&first);
        while batch.len() < 1024 * 1024 {
            match rx.try_recv() {
                Ok(next) => batch.extend_from_slice(&next),
                Err(_) => break,
            }
        }
        if let Err(e) = stdin.write_all(&batch).await {
            core.close(&format!("stdin: {e}"));
            return;
        }
        if batch.capacity() > 4 * 1024 * 1024 {
            batch = Vec::with_capacity(16 * 1024);
        }
    }
}

async fn read_loop(stdout: tokio::process::ChildStdout, core: Arc<Core>) {
    let mut reader = FrameReader::new(stdout, MAX_FRAME);
    let reason = loop {
        match reader.next().await {
            Ok(None) => break "exited (stdout closed)".to_owned(),
            Ok(Some(Input::Line(line))) => core.dispatch(&line),
            Ok(Some(Input::Oversized { .. })) => {
                tracing::warn!(server = %core.server, limit = MAX_FRAME, "Upstream frame over the limit; discarded.");
            }
            Err(e) => break format!("stdout: {e}"),
        }
    };
    core.close(&reason);
}

/// How a child's exit is said: `exited with status 3`, `was killed by signal 9`.
pub(super) fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        (None, None) => format!("exited ({status})"),
    }
}

/// Copies an upstream's stderr to its log file, line by line, never blocking the upstream (a
/// write failure or invalid UTF-8 never stops the draining), and keeps its last lines in
/// `tail` (marked done at the end). Every credential value the upstream was started with is
/// replaced by `[REDACTED]` first.
async fn drain_stderr(
    stderr: tokio::process::ChildStderr,
    path: std::path::PathBuf,
    redactor: Arc<crate::credentials::Redactor>,
    tail: Arc<StderrTail>,
) {
    if std::fs::metadata(&path).is_ok_and(|m| m.len() > STDERR_LOG_ROTATE) {
        let _ = std::fs::rename(&path, path.with_extension("log.1"));
    }
    let mut file = match tokio::fs::OpenOptions::new().create(true).append(true).open(&path).await {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "Cannot open upstream log; discarding its stderr.");
            None
        }
    };
    // A stderr line over the frame limit is logged by its start.
    let mut reader = FrameReader::new(stderr, MAX_FRAME);
    while let Ok(Some(input)) = reader.next().await {
        let buf = match input {
            Input::Line(line) => line,
            Input::Oversized { prefix, .. } => prefix,
        };
        let line = redactor.redact(trim_line(&buf));
        let line = String::from_utf8_lossy(&line);
        tail.push(&line);
        if let Some(f) = file.as_mut() {
            let stamped = format!("{} {line}\n", coffer_runtime::now_rfc3339());
            if f.write_all(stamped.as_bytes()).await.is_err() {
                file = None;
            }
        }
    }
    tail.done.send_replace(true);
}
