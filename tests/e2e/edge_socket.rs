//! The edge's Unix-domain socket (`COFFER_HOME/gateway.sock`): the supervisor binds it (0600,
//! replacing a stale one), `daemon.json` names it, the gateway serves the same edge on it as on
//! the TCP port (token, Host and Origin checks included), the shim's `/mcp` stream uses it, and
//! a shim that cannot connect to it uses the TCP port instead.
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::{START_TIMEOUT, TestHome, bin, wait};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Sends one raw HTTP/1.1 request over the socket at `path` and returns its status code and body.
async fn http_over_socket(path: &Path, request: &str) -> anyhow::Result<(u16, String)> {
    let mut s =
        tokio::net::UnixStream::connect(path).await.with_context(|| format!("connecting {}", path.display()))?;
    s.write_all(request.as_bytes()).await?;
    let mut raw = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut raw)).await.context("answer in 10 s")??;
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no HTTP status line in {raw:?}"))?;
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}

fn get(path: &str, host: &str, headers: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{headers}Connection: close\r\n\r\n")
}

/// Connected sockets on `path`, from `/proc/net/unix` (an accepted connection carries the
/// listener's path; state 03 is connected).
fn connections_on(path: &Path) -> anyhow::Result<usize> {
    let table = std::fs::read_to_string("/proc/net/unix")?;
    let want = path.display().to_string();
    Ok(table
        .lines()
        .skip(1)
        .filter(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() >= 8 && cols[5] == "03" && cols[7] == want
        })
        .count())
}

/// A shim on piped stdio that has initialized and listed tools; returns it with its stdin and
/// the lines of its stdout.
async fn shim_session(
    home: &TestHome,
) -> anyhow::Result<(
    tokio::process::Child,
    tokio::process::ChildStdin,
    tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
)> {
    let mut cmd = tokio::process::Command::from(home.command(&bin("coffer-mcp-shim")?));
    cmd.env("COFFER_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(home.temp().join("shim.stderr"))?);
    let mut child = cmd.kill_on_drop(true).spawn().context("starting the shim")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    for message in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "e2e-socket", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    ] {
        stdin.write_all(format!("{message}\n").as_bytes()).await?;
    }
    for id in [1, 2] {
        let line = tokio::time::timeout(START_TIMEOUT, lines.next_line())
            .await
            .context("shim answer in time")??
            .context("the shim closed stdout")?;
        let answer: Value = serde_json::from_str(&line)?;
        ensure!(answer["id"] == id && answer["result"].is_object(), "answer {id}: {answer}");
        if id == 2 {
            ensure!(line.contains("coffer__search_tools"), "tools/list: {line}");
        }
    }
    Ok((child, stdin, lines))
}

/// Ends a shim session the way a client does (stdin EOF) and waits for the shim to exit.
async fn close(shim: &mut tokio::process::Child, stdin: tokio::process::ChildStdin) -> anyhow::Result<()> {
    drop(stdin);
    tokio::time::timeout(Duration::from_secs(15), shim.wait()).await.context("shim exits at EOF")??;
    Ok(())
}

/// A whole shim session: initialize, list tools (both answered), stdin EOF, exit.
async fn shim_round_trip(home: &TestHome) -> anyhow::Result<()> {
    let (mut shim, stdin, _lines) = shim_session(home).await?;
    close(&mut shim, stdin).await
}

/// The daemon binds `gateway.sock` (a socket, 0600) and names it in `daemon.json`; on it, the
/// edge checks the token, Host and Origin exactly as on the TCP port; the daemon removes it when
/// it stops.
#[tokio::test]
async fn the_edge_socket_is_private_named_in_daemon_json_and_checked_like_the_port() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    home.start_daemon().await?;
    let info = home.daemon_info()?;
    let socket = info.socket.clone().context("daemon.json names no socket")?;
    ensure!(socket == home.root().join("gateway.sock"), "socket {}", socket.display());
    let meta = std::fs::symlink_metadata(&socket)?;
    ensure!(meta.file_type().is_socket(), "{} is not a socket", socket.display());
    ensure!(meta.permissions().mode() & 0o777 == 0o600, "mode {:o}", meta.permissions().mode() & 0o777);

    let host = format!("127.0.0.1:{}", info.port);
    let token = format!("X-Coffer-Token: {}\r\n", info.token.expose_secret());
    let (status, body) = http_over_socket(&socket, &get("/v1/health", &host, "")).await?;
    ensure!(status == 200 && body.contains("\"ok\""), "health over the socket: {status} {body}");
    let (status, body) = http_over_socket(&socket, &get("/v1/mcp/servers", &host, "")).await?;
    ensure!(status == 401, "no token over the socket: {status} {body}");
    let (status, body) = http_over_socket(&socket, &get("/v1/mcp/servers", "evil.example", &token)).await?;
    ensure!(status == 403 && body.contains("Host"), "foreign Host over the socket: {status} {body}");
    let origin = format!("{token}Origin: http://evil.example\r\n");
    let (status, body) = http_over_socket(&socket, &get("/v1/mcp/servers", &host, &origin)).await?;
    ensure!(status == 403 && body.contains("Origin"), "foreign Origin over the socket: {status} {body}");
    let (status, body) = http_over_socket(&socket, &get("/v1/mcp/servers", &host, &token)).await?;
    ensure!(status == 200, "with the token over the socket: {status} {body}");
    let doctor: Value = serde_json::from_str(&home.cli(&["doctor", "--json"]).await?.stdout)?;
    let check = doctor["checks"].as_array().and_then(|c| c.iter().find(|c| c["name"] == "edge socket")).cloned();
    ensure!(check.as_ref().is_some_and(|c| c["status"] == "ok"), "doctor's edge socket check: {doctor}");

    home.terminate_daemon(Duration::from_secs(30)).await?;
    ensure!(!socket.exists(), "the socket outlived the daemon");
    Ok(())
}

/// The shim's `/mcp` stream is a connection on the socket (and ends with the shim); with the
/// socket gone from the home, a new shim reaches the same daemon over its TCP port.
#[tokio::test]
async fn the_shim_streams_over_the_socket_and_falls_back_to_the_port() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    home.start_daemon().await?;
    let socket = home.daemon_info()?.socket.context("daemon.json names no socket")?;
    let before = connections_on(&socket)?;
    let (mut shim, stdin, _lines) = shim_session(&home).await?;
    ensure!(
        connections_on(&socket)? == before + 1,
        "the shim's session holds no connection on {} ({before} before)",
        socket.display()
    );
    close(&mut shim, stdin).await?;
    wait::wait_for("the stream's connection to close with the shim", Duration::from_secs(10), || async {
        Ok((connections_on(&socket)? == before).then_some(()))
    })
    .await?;

    // Unlinked, the daemon's socket cannot be connected to: the shim uses the port.
    std::fs::remove_file(&socket)?;
    shim_round_trip(&home).await
}

/// A socket left behind by a daemon that was killed is replaced; something that is not a socket
/// at that name is left alone, and the daemon serves on its TCP port only.
#[tokio::test]
async fn a_stale_socket_is_replaced_and_a_foreign_file_is_left_alone() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let path = home.root().join("gateway.sock");
    std::fs::create_dir_all(home.root())?;
    drop(std::os::unix::net::UnixListener::bind(&path)?); // the file stays, nobody listens
    home.start_daemon().await?;
    let info = home.daemon_info()?;
    ensure!(info.socket.as_deref() == Some(path.as_path()), "socket {:?}", info.socket);
    let (status, _) = http_over_socket(&path, &get("/v1/health", &format!("127.0.0.1:{}", info.port), "")).await?;
    ensure!(status == 200, "health over the replaced socket: {status}");
    home.terminate_daemon(Duration::from_secs(30)).await?;

    std::fs::write(&path, "not a socket")?;
    home.start_daemon().await?;
    ensure!(home.daemon_info()?.socket.is_none(), "daemon.json names a socket it could not bind");
    ensure!(std::fs::read_to_string(&path)? == "not a socket", "the foreign file was touched");
    // `coffer doctor` says so (a warning: everything works over the port, only slower).
    let doctor: Value = serde_json::from_str(&home.cli(&["doctor", "--json"]).await?.stdout)?;
    let check = doctor["checks"].as_array().and_then(|c| c.iter().find(|c| c["name"] == "edge socket")).cloned();
    ensure!(check.as_ref().is_some_and(|c| c["status"] == "warn"), "doctor's edge socket check: {doctor}");
    shim_round_trip(&home).await
}

/// A start that fails (a corrupt database: the store never becomes healthy) leaves no socket
/// behind.
#[tokio::test]
async fn a_failed_start_leaves_no_socket() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    std::fs::create_dir_all(home.root())?;
    std::fs::write(home.root().join("coffer.db"), vec![0x5a_u8; 8192])?;
    let out = home.cli(&["daemon", "start"]).await?;
    ensure!(!out.success(), "the daemon started on a corrupt database: {}{}", out.stdout, out.stderr);
    home.wait_no_processes(Duration::from_secs(30)).await?;
    let path = home.root().join("gateway.sock");
    ensure!(!path.exists(), "{} outlived the failed start", path.display());
    Ok(())
}

/// Upstream servers the gateway starts hold none of its listeners (the edge's port, its
/// internal gRPC port, the edge's socket): only their stdio. A child left running after the
/// daemon stopped would otherwise keep the port and the socket.
#[tokio::test]
async fn upstreams_inherit_none_of_the_gateway_s_listeners() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    coffer_tests::mcp::register_tiny(&api, "tiny", json!({})).await?;
    // The catalog's background start of it is over: the only tiny process is the session's.
    coffer_tests::mcp::wait_listed(&api, "tiny").await?;
    let session = coffer_tests::mcp::McpSession::latest(&api).await?;
    ensure!(session.tool_names().await?.iter().any(|n| n == "tiny__echo"), "the tiny upstream listed no tools");
    // Lists come from the capability catalog; a call starts the session's own upstream.
    ensure!(session.tool("tiny__echo", json!({"message": "x"})).await?.get("result").is_some(), "the call failed");
    let pid = home
        .processes()
        .into_iter()
        .find(|p| p.name == "coffer-tiny-upstream")
        .context("the tiny upstream's process")?
        .pid;
    let mut fds: Vec<(i32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let fd = e.file_name().to_str()?.parse().ok()?;
            Some((fd, std::fs::read_link(e.path()).ok()?.display().to_string()))
        })
        .collect();
    fds.sort();
    let numbers: Vec<i32> = fds.iter().map(|(fd, _)| *fd).collect();
    ensure!(numbers == [0, 1, 2], "the upstream holds more than its stdio: {fds:?}");
    Ok(())
}

/// While a stopping daemon ends its sessions (here an upstream that ignores SIGTERM makes that
/// take seconds), its edge answers on the socket exactly as on the port: both stop accepting
/// at the same moment. (When the socket stopped first, a shim reconnecting in that window
/// waited on an upgrade nobody read and failed its client's call.)
#[tokio::test]
async fn a_stopping_daemon_answers_on_the_socket_as_long_as_on_the_port() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let info = home.daemon_info()?;
    let socket = info.socket.clone().context("daemon.json names no socket")?;
    let tiny = bin("coffer-tiny-upstream")?.display().to_string();
    // The tiny upstream exits at stdin EOF; its shell then sleeps on, ignoring SIGTERM (as does
    // the sleep), until the gateway's SIGKILL after its grace.
    let script = format!("trap '' TERM; '{tiny}'; sleep 30");
    let sh = std::path::PathBuf::from("/bin/sh");
    coffer_tests::mcp::register_stdio(&api, "slowstop", &sh, &["-c".into(), script], json!({})).await?;
    // The catalog's background start of it (a shell of its own) is over.
    coffer_tests::mcp::wait_listed(&api, "slowstop").await?;
    let session = coffer_tests::mcp::McpSession::latest(&api).await?;
    let r = session.tool("slowstop__echo", json!({"text": "hi"})).await?;
    ensure!(r.get("result").is_some(), "{r}");

    // The upstream's process (its pid record) is the shell; the tiny upstream is its child.
    // The catalog's own start may still be ending (its shell outlives its tiny upstream until
    // the SIGKILL): the session's shell is the one whose tiny upstream runs.
    let tiny_under = |shell: i32| {
        let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap_or_default();
        children.split_whitespace().any(|c| {
            std::fs::read_to_string(format!("/proc/{c}/comm")).is_ok_and(|comm| comm.starts_with("coffer-tiny"))
        })
    };
    let records = home.pid_records();
    let shell = records
        .iter()
        .find(|r| r.kind == "upstream" && tiny_under(r.pid))
        .with_context(|| format!("no upstream shell runs the tiny upstream: {records:?}"))?
        .pid;
    let tiny_runs = || tiny_under(shell);
    let mut stop = home.cli_command(&["daemon", "stop"])?;
    let stop = tokio::spawn(async move { stop.output().await });
    // The sessions are ending once the tiny upstream saw stdin EOF and exited.
    wait::wait_for("the upstream to get stdin EOF", Duration::from_secs(10), || async {
        Ok((!tiny_runs()).then_some(()))
    })
    .await?;
    let host = format!("127.0.0.1:{}", info.port);
    let (status, body) = http_over_socket(&socket, &get("/v1/health", &host, "")).await?;
    ensure!(status == 200, "health over the socket while the sessions end: {status} {body}");
    let tcp = reqwest::Client::new()
        .get(format!("http://{host}/v1/health"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .context("health over the port while the sessions end")?;
    ensure!(tcp.status() == 200, "health over the port: {}", tcp.status());
    let out = stop.await??;
    ensure!(out.status.success(), "daemon stop: {}", String::from_utf8_lossy(&out.stderr));
    home.wait_no_processes(Duration::from_secs(15)).await?;
    Ok(())
}

/// A connection that never finishes its request (here half a request line and headers, on the
/// socket and on the port) holds a stop for the drain grace only (2 s), not until the
/// supervisor's SIGKILL (5 s).
#[tokio::test]
async fn a_half_sent_request_holds_a_stop_for_the_drain_grace_only() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    home.start_daemon().await?;
    let info = home.daemon_info()?;
    let mut unix = tokio::net::UnixStream::connect(info.socket.as_deref().context("socket")?).await?;
    unix.write_all(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ").await?;
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", info.port)).await?;
    tcp.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"json").await?;
    let started = std::time::Instant::now();
    let out = home.cli(&["daemon", "stop"]).await?;
    ensure!(out.success(), "daemon stop: {}{}", out.stdout, out.stderr);
    let took = started.elapsed();
    ensure!(took < Duration::from_millis(4500), "the stop took {took:?}");
    let log = home.log_text("gateway");
    ensure!(log.contains("Connections still open after the drain grace"), "gateway log: {log}");
    ensure!(!home.log_text("daemon").contains("killing"), "the supervisor had to kill a service");
    drop((unix, tcp));
    Ok(())
}

/// The listener's timeouts never cut a live stream: a shim's upgraded `/mcp` stream left idle
/// past the request-head timeout (`limits::HEAD_TIMEOUT_MS` here, 10 s by default) is still
/// connected, and answers on it.
#[tokio::test]
async fn an_idle_upgraded_stream_outlives_the_head_timeout() -> anyhow::Result<()> {
    let head_timeout = Duration::from_millis(crate::limits::HEAD_TIMEOUT_MS);
    let home = TestHome::builder().env("COFFER_HEAD_TIMEOUT_MS", head_timeout.as_millis().to_string()).build()?;
    home.start_daemon().await?;
    let socket = home.daemon_info()?.socket.context("socket")?;
    let (mut shim, mut stdin, mut lines) = shim_session(&home).await?;
    let before = connections_on(&socket)?;
    ensure!(before >= 1, "the shim's stream is connected");
    // Absence of a cut can only be observed over time: twice the head timeout, and at least
    // two more of the reaper's 1 s sweeps.
    tokio::time::sleep(head_timeout * 2 + Duration::from_secs(1)).await;
    ensure!(connections_on(&socket)? >= before, "the idle stream was closed");
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"});
    stdin.write_all(format!("{list}\n").as_bytes()).await?;
    let line = tokio::time::timeout(START_TIMEOUT, lines.next_line()).await??.context("stdout closed")?;
    ensure!(line.contains("\"id\":3") && line.contains("coffer__search_tools"), "{line}");
    close(&mut shim, stdin).await
}
