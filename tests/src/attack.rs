//! A listener attacker for the limits tests (issue 32 part 3): a small `python3` program that
//! opens many connections to one TCP port or Unix socket and misuses them — holds them idle
//! (a flood), trickles a request head a line a second (slowloris), or sends a huge request head
//! — for a bounded time, counting how many the server closed. It runs as the test's own user or
//! as the hostile user ([`crate::hostile::as_other_user`]), and prints one `ready …` line once
//! its connections are open and one `done …` line at the end: when its time is up, when the
//! server has closed every connection, or when the test says it has seen enough
//! ([`Attack::stop`]; a flood is held only while the test checks the owner is served).
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};

/// What the attacker does with each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Connect and send nothing.
    Flood,
    /// Send an HTTP/1.1 request line, then one more header line a second, never ending the head.
    Slowloris,
    /// Trickle the HTTP/2 connection preface a byte a second (a gRPC listener's slowloris).
    SlowlorisH2,
    /// Send a request head of `KiB` KiB of one header, never ending it.
    BigHead { kib: usize },
}

/// Where the attacker connects.
#[derive(Debug, Clone)]
pub enum Target {
    /// `127.0.0.1:<port>`.
    Tcp(u16),
    /// A Unix socket path.
    Unix(std::path::PathBuf),
}

/// How an attack went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Connections opened.
    pub opened: usize,
    /// Connection attempts that failed (refused, timed out).
    pub failed: usize,
    /// Connections the server closed (or answered and closed) during the attack.
    pub closed: usize,
}

const SCRIPT: &str = r#"
import concurrent.futures, select, socket, sys, threading, time
mode, target, n, secs, kib = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
def connect():
    if target.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(target[5:])
    else:
        s = socket.create_connection(("127.0.0.1", int(target[4:])), timeout=2)
    s.setblocking(False)
    return s
head = b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n"
preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
socks, opened, failed, closed = [], 0, 0, 0
started = time.time()
deadline = started + secs
lock = threading.Lock()
def open_one(_):
    # Connects and starts the misuse; many at once: one at a time, a connect whose SYN the
    # server's full accept queue dropped would hold the whole flood for the kernel's 1 s retry.
    global opened, failed
    if time.time() > deadline:
        return
    try:
        s = connect()
        if mode == "slowloris":
            s.send(head)
        elif mode == "slowloris-h2":
            s.send(preface[:1])
        elif mode == "bighead":
            s.send(head + b"X-Pad: ")
        with lock:
            opened += 1
            socks.append([s, 0])
    except OSError:
        with lock:
            failed += 1
with concurrent.futures.ThreadPoolExecutor(16) as pool:
    list(pool.map(open_one, range(n)))
print("ready opened=%d failed=%d" % (opened, failed), flush=True)
print("attacker %s: %d open after %.1f s" % (mode, opened, time.time() - started), file=sys.stderr, flush=True)
pad = b"a" * 16384
tick = 0
# Held for `secs` more at most. A line on stdin (Attack::stop): end after the next sweep that
# finds no newly closed connection, so closes the server made before the stop are all counted.
deadline = time.time() + secs
stopping, closed_before = False, -1
while socks and (tick == 0 or time.time() < deadline):
    if not stopping and select.select([sys.stdin], [], [], 0)[0]:
        stopping = True
    if stopping:
        if closed == closed_before:
            break
        closed_before = closed
    tick += 1
    alive = []
    for entry in socks:
        s, sent = entry
        try:
            try:
                d = s.recv(4096)
                # Any answer (a 431, a 408) or an end of stream: the server is done with it.
                s.close()
                closed += 1
                continue
            except BlockingIOError:
                pass
            if mode == "slowloris":
                s.send(b"X-Slow-%d: x\r\n" % tick)
            elif mode == "slowloris-h2" and tick < len(preface):
                s.send(preface[tick:tick + 1])
            elif mode == "bighead":
                while sent < kib * 1024:
                    try:
                        sent += s.send(pad)
                    except BlockingIOError:
                        break
                entry[1] = sent
            alive.append(entry)
        except OSError:
            s.close()
            closed += 1
    socks = alive
    time.sleep(0.2 if mode in ("flood", "bighead") else 1.0)
print("done opened=%d failed=%d closed=%d" % (opened, failed, closed), flush=True)
"#;

/// A running attack. Dropping it kills the attacker.
pub struct Attack {
    child: tokio::process::Child,
    /// A line written here ends the attack early ([`Attack::stop`]).
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    ready: Report,
}

fn field(line: &str, name: &str) -> usize {
    line.split_whitespace().find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok()).unwrap_or(0)
}

impl Attack {
    /// Starts `n` connections to `target` doing `mode` (as the hostile user when `other_user`),
    /// 16 connecting at once, and returns once they are open (`ready`: as many as opened within
    /// `secs` seconds, awaited 60 s at most). The attack then goes on for `secs` seconds more at
    /// most: less when the server closed every connection or the test calls [`Attack::stop`].
    ///
    /// # Errors
    /// When python3 cannot start or the attacker does not get ready.
    pub async fn start(mode: Mode, target: &Target, n: usize, secs: u64, other_user: bool) -> anyhow::Result<Self> {
        let (mode_arg, kib) = match mode {
            Mode::Flood => ("flood", 0),
            Mode::Slowloris => ("slowloris", 0),
            Mode::SlowlorisH2 => ("slowloris-h2", 0),
            Mode::BigHead { kib } => ("bighead", kib),
        };
        let target_arg = match target {
            Target::Tcp(port) => format!("tcp:{port}"),
            Target::Unix(path) => format!("unix:{}", path.display()),
        };
        // A test's attacker, killed on drop; it must run as another uid, which the spawn
        // helper does not offer.
        #[allow(clippy::disallowed_methods)]
        let mut cmd = std::process::Command::new("python3");
        cmd.args(["-c", SCRIPT, mode_arg, &target_arg, &n.to_string(), &secs.to_string(), &kib.to_string()]);
        if other_user {
            crate::hostile::as_other_user(&mut cmd);
        }
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).kill_on_drop(true);
        let mut child = cmd.spawn().context("starting the python3 attacker")?;
        let stdin = child.stdin.take().context("attacker stdin")?;
        let mut lines = BufReader::new(child.stdout.take().context("attacker stdout")?).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .context("the attacker was not ready within 60 s")??
            .context("the attacker exited before it was ready")?;
        if !line.starts_with("ready") {
            bail!("unexpected attacker output: {line}");
        }
        let ready = Report { opened: field(&line, "opened"), failed: field(&line, "failed"), closed: 0 };
        Ok(Self { child, stdin, lines, ready })
    }

    /// What the attacker had open when it got ready.
    pub fn ready(&self) -> Report {
        self.ready
    }

    /// Ends the attack now (before its `secs`), once a sweep of its connections finds none
    /// newly closed (every close the server made so far is counted), and returns its report.
    ///
    /// # Errors
    /// As [`Attack::finish`].
    pub async fn stop(mut self) -> anyhow::Result<Report> {
        use tokio::io::AsyncWriteExt;
        // An attacker already done (every connection closed) has stopped reading: ignore EPIPE.
        let _ = self.stdin.write_all(b"stop\n").await;
        let _ = self.stdin.flush().await;
        self.finish().await
    }

    /// Waits for the attack to end (its `secs` after `ready`, or sooner when the server closed
    /// every connection; 120 s at most) and returns its report.
    ///
    /// # Errors
    /// When it does not end in time or reports nothing.
    pub async fn finish(mut self) -> anyhow::Result<Report> {
        let line = tokio::time::timeout(Duration::from_secs(120), self.lines.next_line())
            .await
            .context("the attacker did not finish")??
            .context("the attacker exited without a report")?;
        let _ = self.child.wait().await;
        Ok(Report { opened: field(&line, "opened"), failed: field(&line, "failed"), closed: field(&line, "closed") })
    }
}

/// The pid of this home's `coffer-gateway`.
///
/// # Errors
/// When it is not running.
pub fn gateway_pid(home: &crate::TestHome) -> anyhow::Result<i32> {
    home.processes().iter().find(|p| p.name == "coffer-gateway").map(|p| p.pid).context("no coffer-gateway running")
}

/// The internal gRPC port of a service, read from the gateway's environment (`COFFER_STORE_ADDR`
/// for `"STORE"`): what another local user finds in `/proc/net/tcp` anyway.
///
/// # Errors
/// When the gateway or the variable is missing.
pub fn internal_port(home: &crate::TestHome, service: &str) -> anyhow::Result<u16> {
    let pid = gateway_pid(home)?;
    let env = std::fs::read(format!("/proc/{pid}/environ"))?;
    let var = format!("COFFER_{service}_ADDR=");
    env.split(|b| *b == 0)
        .find_map(|kv| std::str::from_utf8(kv).ok()?.strip_prefix(&var)?.rsplit(':').next()?.parse().ok())
        .with_context(|| format!("{var} not in the gateway's environment"))
}

/// Resident memory of `pid` in KiB (`VmRSS`).
pub fn rss_kib(pid: i32) -> u64 {
    crate::procs::status_kib(pid, "VmRSS:")
}

/// The owner, holding the token, is answered: `GET /v1/status` over TCP and, when `socket` is
/// given, over the edge's Unix socket, each within 10 s.
///
/// # Errors
/// When either is not answered 200 in time.
pub async fn owner_is_served(api: &crate::Api, socket: Option<&std::path::Path>) -> anyhow::Result<()> {
    use crate::SendExt;
    let r = tokio::time::timeout(Duration::from_secs(10), api.get("/v1/status").reply())
        .await
        .context("the owner's request over TCP was not answered within 10 s")??;
    anyhow::ensure!(r.status == 200, "the owner's request over TCP: {}", r.status);
    if let Some(path) = socket {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let answer = tokio::time::timeout(Duration::from_secs(10), async {
            let mut s = tokio::net::UnixStream::connect(path).await?;
            let req = format!(
                "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nX-Coffer-Token: {}\r\nConnection: close\r\n\r\n",
                api.port(),
                api.token()
            );
            s.write_all(req.as_bytes()).await?;
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).await?;
            anyhow::Ok(String::from_utf8_lossy(&raw).into_owned())
        })
        .await
        .context("the owner's request over the socket was not answered within 10 s")??;
        anyhow::ensure!(answer.starts_with("HTTP/1.1 200"), "the owner's request over the socket: {answer:.200}");
    }
    Ok(())
}

/// Total bytes of the files under `dir` (recursively); 0 when it is missing.
pub fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}
