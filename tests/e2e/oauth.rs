//! OAuth sign-in to a real OAuth-protected MCP server (issue 37 §1's Done-when): the peer is
//! `tests/peers/oauth_server.py`, built from the Python mcp 1.x SDK's `mcp.server.auth`
//! modules (authorization server provider, token verifier checking the RFC 8707 resource), run
//! on loopback. `coffer mcp add --url` says the server needs sign-in; `coffer mcp auth
//! --no-browser` prints the authorization URL, and the test plays the browser by following its
//! redirect over real HTTP to the CLI's loopback listener. Then a tool call works, survives the
//! access token's expiry by refreshing, and after the refresh token is revoked the server
//! needs sign-in in the call's error, `status`, `doctor` and `mcp auth --status`. No token the
//! peer ever issued appears in a log, the database or any file of the home, or a sync push.
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::peers::{Sdk, peer_path, venv_bin};
use coffer_tests::{Api, Reply, SendExt, TestHome, ports};
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Starts `oauth_server.py` on a free port (a process of the home, so its cleanup ends it) and
/// waits for its "listening" line. Returns it and its base URL.
fn start_peer(home: &TestHome) -> anyhow::Result<(std::process::Child, String)> {
    start_peer_with(home, &[])
}

/// [`start_peer`] with more arguments (`--transport sse`, `--step-up SCOPE`).
pub(crate) fn start_peer_with(home: &TestHome, extra: &[&str]) -> anyhow::Result<(std::process::Child, String)> {
    use std::io::BufRead as _;
    let python = venv_bin(Sdk::V1, "python")?;
    let script = peer_path("oauth_server.py")?;
    let port = ports::free_port();
    let mut child = home
        .command(&python)
        .arg(script)
        .args(["--port", &port.to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting oauth_server.py")?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("listening on port") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).context("oauth_server.py did not say it is listening")?;
    Ok((child, format!("http://127.0.0.1:{port}")))
}

async fn call(api: &Api, tool: &str, arguments: Value) -> anyhow::Result<Reply> {
    api.post_json("/v1/tools/call", &json!({"name": tool, "arguments": arguments})).reply().await
}

fn text_of(r: &Value) -> String {
    r["content"][0]["text"].as_str().unwrap_or_default().to_owned()
}

pub(crate) async fn peer_post(base: &str, path: &str) -> anyhow::Result<Value> {
    Ok(reqwest::Client::new().post(format!("{base}{path}")).send().await?.error_for_status()?.json().await?)
}

async fn peer_get(base: &str, path: &str) -> anyhow::Result<Value> {
    Ok(reqwest::Client::new().get(format!("{base}{path}")).send().await?.error_for_status()?.json().await?)
}

/// Runs `coffer mcp auth NAME --no-browser`, plays the browser on the URL it prints, and
/// returns its output once it exits.
async fn sign_in(home: &TestHome, name: &str) -> anyhow::Result<(Option<i32>, String, String)> {
    sign_in_at(home, name).await.map(|(code, out, err, _)| (code, out, err))
}

/// [`sign_in`], also returning the authorization URL it opened.
async fn sign_in_at(home: &TestHome, name: &str) -> anyhow::Result<(Option<i32>, String, String, String)> {
    let mut child = home.cli_command(&["mcp", "auth", name, "--no-browser", "--timeout", "60"])?.spawn()?;
    let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
    let mut url = String::new();
    tokio::time::timeout(Duration::from_secs(30), stdout.read_line(&mut url))
        .await
        .context("no authorization URL printed")??;
    let url = url.trim().to_owned();
    ensure!(url.contains("/authorize?") && url.contains("code_challenge_method=S256"), "{url}");
    ensure!(url.contains("resource=http%3A%2F%2F127.0.0.1"), "no RFC 8707 resource: {url}");
    // The browser: follows the authorization server's redirect to Coffer's loopback listener.
    let page = reqwest::Client::builder().no_proxy().build()?.get(&url).send().await?;
    let status = page.status();
    let page = page.text().await?;
    ensure!(status == 200 && page.contains(&format!("signed in to {name}")), "{status} {page}");
    let mut rest = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut rest).await?;
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await??;
    Ok((out.status.code(), rest, String::from_utf8_lossy(&out.stderr).into_owned(), url))
}

/// Every regular file under `dir` holding any of `needles`.
fn files_containing(dir: &Path, needles: &[String]) -> anyhow::Result<(Vec<PathBuf>, usize)> {
    let mut found = Vec::new();
    let mut scanned = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let Ok(bytes) = std::fs::read(e.path()) else { continue };
                scanned += 1;
                if needles.iter().any(|n| bytes.windows(n.len()).any(|w| w == n.as_bytes())) {
                    found.push(e.path());
                }
            }
        }
    }
    Ok((found, scanned))
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    // Test setup: a bare remote for the sync push, driven directly.
    #[allow(clippy::disallowed_methods)]
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=test", "-c", "user.email=test@example.invalid"])
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .context("running git")?;
    ensure!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every token (access and refresh) the peer has issued so far.
async fn issued_tokens(base: &str) -> anyhow::Result<Vec<String>> {
    Ok(peer_get(base, "/test/tokens").await?["issued"]
        .as_array()
        .context("issued")?
        .iter()
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect())
}

/// Server `server` (signed in) answers a tool call with the token (the peer checked it was
/// issued for its own resource); then the access token expires, and the next call gets a 401,
/// refreshes and goes through.
async fn calls_then_survives_an_expiry(api: &Api, base: &str, server: &str) -> anyhow::Result<()> {
    let r = call(api, &format!("{server}__whoami"), json!({})).await?.ok_json()?;
    ensure!(text_of(&r).starts_with("client ") && text_of(&r).contains("mcp:tools"), "{r}");
    peer_post(base, "/test/expire").await?;
    let r = call(api, &format!("{server}__echo"), json!({"message": "after expiry"})).await?.ok_json()?;
    assert_eq!(text_of(&r), "Echo: after expiry", "{r}");
    let stats = peer_get(base, "/test/stats").await?;
    ensure!(stats["refreshes"].as_u64() >= Some(1), "no refresh: {stats}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_call_refresh_and_needs_sign_in_without_leaking_a_token() -> anyhow::Result<()> {
    // Debug logging everywhere, so the scan covers what only debug lines would say.
    let home = TestHome::builder().log_filter("debug").build()?;
    let api = home.start_daemon().await?;
    let (mut peer, base) = start_peer(&home)?;
    let url = format!("{base}/mcp");

    // Registering it says it needs sign-in, and how.
    let out = home.cli(&["mcp", "add", "secure", "--url", &url]).await?;
    ensure!(out.stdout.contains("coffer mcp auth secure"), "{}\n{}", out.stdout, out.stderr);
    // Before sign-in, its standing error names the command.
    let st = api.get("/v1/status").reply().await?.ok_json()?;
    ensure!(st.to_string().contains("coffer mcp auth secure"), "{st}");

    // The browser sign-in.
    let (code, stdout, stderr) = sign_in(&home, "secure").await?;
    ensure!(code == Some(0) && stdout.contains("Signed in to secure"), "{code:?} {stdout} {stderr}");
    let stats = peer_get(&base, "/test/stats").await?;
    assert_eq!((stats["registered"].as_u64(), stats["tokens_issued"].as_u64()), (Some(1), Some(1)), "{stats}");

    calls_then_survives_an_expiry(&api, &base, "secure").await?;
    let st = api.get("/v1/status").reply().await?.ok_json()?;
    let up = st["upstreams"].as_array().context("upstreams")?.iter().find(|u| u["name"] == "secure").cloned();
    let up = up.context("secure in status")?;
    assert_eq!(up["auth"]["state"], "signed_in", "{up}");
    assert_eq!(up["auth"]["refreshable"], true, "{up}");

    // Revoked: the refresh is refused, the server needs sign-in, everywhere.
    peer_post(&base, "/test/revoke").await?;
    peer_post(&base, "/test/expire").await?;
    let r = call(&api, "secure__echo", json!({"message": "after revoke"})).await?;
    ensure!(r.status.as_u16() >= 400, "{} {}", r.status, r.text);
    ensure!(r.text.contains("needs sign-in") && r.text.contains("coffer mcp auth secure"), "{}", r.text);
    let st = api.get("/v1/status").reply().await?.ok_json()?;
    let up = st["upstreams"].as_array().context("upstreams")?.iter().find(|u| u["name"] == "secure").cloned();
    let up = up.context("secure in status")?;
    assert_eq!(up["auth"]["state"], "needs_sign_in", "{up}");
    assert_eq!(up["state"], "unhealthy", "{up}");
    ensure!(up["last_error"].as_str().is_some_and(|e| e.contains("coffer mcp auth secure")), "{up}");
    let out = home.cli(&["status"]).await?;
    ensure!(out.stdout.contains("coffer mcp auth secure"), "status: {}\n{}", out.stdout, out.stderr);
    let out = home.cli(&["--json", "doctor"]).await?;
    ensure!(out.stdout.contains("coffer mcp auth secure"), "doctor: {}\n{}", out.stdout, out.stderr);
    let out = home.cli(&["mcp", "auth", "secure", "--status"]).await?;
    ensure!(out.stdout.contains("needs sign-in"), "{}\n{}", out.stdout, out.stderr);

    // Signing in again works, and the call goes through.
    let (code, stdout, stderr) = sign_in(&home, "secure").await?;
    ensure!(code == Some(0), "{code:?} {stdout} {stderr}");
    let r = call(&api, "secure__echo", json!({"message": "again"})).await?.ok_json()?;
    assert_eq!(text_of(&r), "Echo: again", "{r}");

    // A sync push carries no token.
    api.request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"sync.machine_name": "alpha"}}))
        .reply()
        .await?
        .ok_json()?;
    let remote = home.temp().join("remote.git");
    std::fs::create_dir_all(&remote)?;
    git(&remote, &["init", "-q", "--bare", "-b", "main"])?;
    let out = home.cli(&["--json", "sync", "init", &format!("file://{}", remote.display())]).await?;
    ensure!(out.code == Some(0), "sync init: {}\n{}", out.stdout, out.stderr);
    let objects = git(&remote, &["cat-file", "--batch-all-objects", "--batch"])?;
    ensure!(objects.contains("secure"), "the server was not pushed: {objects}");

    let issued = issued_tokens(&base).await?;
    ensure!(issued.len() >= 6, "{issued:?}");
    for t in &issued {
        ensure!(!objects.contains(t.as_str()), "a token was pushed");
    }
    for path in ["/v1/status", "/v1/logs/gateway?n=5000", "/v1/mcp/servers/secure/auth", "/v1/credentials"] {
        let r = api.get(path).reply().await?;
        ensure!(!issued.iter().any(|t| r.text.contains(t.as_str())), "{path} shows a token");
    }
    // The grant is a credential: named, its value sealed.
    let creds = api.get("/v1/credentials").reply().await?.ok_json()?;
    ensure!(creds.to_string().contains("oauth.secure"), "{creds}");
    // Logs (debug), the database and its WAL, every file of the home: no token, while running
    // and after the stop.
    let (found, _) = files_containing(home.root(), &issued)?;
    ensure!(found.is_empty(), "files hold tokens while the daemon runs: {found:?}");
    // The peer is a process of the home too: end it first, then stop the daemon.
    peer.kill()?;
    peer.wait()?;
    home.terminate_daemon(Duration::from_secs(30)).await?;
    let (found, scanned) = files_containing(home.root(), &issued)?;
    ensure!(found.is_empty(), "files hold tokens after the stop: {found:?}");
    ensure!(home.root().join("coffer.db").is_file() && scanned >= 5, "scanned only {scanned} files");
    Ok(())
}

/// A stand-in browser for `$BROWSER`: follows the authorization URL's redirect (curl) to the
/// loopback listener, as a browser on this machine would, and records the page it got.
fn curl_browser(home: &TestHome) -> anyhow::Result<(PathBuf, PathBuf)> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = home.temp().join("browser");
    std::fs::create_dir_all(&dir)?;
    let page = dir.join("page.html");
    let script = dir.join("browser");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nexec curl -sSL --noproxy '*' --max-time 30 -o '{}' \"$1\"\n", page.display()),
    )?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok((script, page))
}

/// Issue 37, a legacy HTTP+SSE server (MCP 2024-11-05) behind OAuth: the same Python SDK peer
/// serving `GET /sse` and `POST /messages/` behind its bearer check. `coffer mcp add --url …/sse
/// --auth` says it needs sign-in and starts the browser sign-in at once (`$BROWSER` is a
/// stand-in that follows the redirect); the stream's GET and every POST then carry the token
/// (the peer checks it was issued for `…/sse`), an expired token is refreshed, a revoked grant
/// is "needs sign-in" naming the command; no token in any file of the home.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_sse_server_behind_oauth_signs_in_calls_and_refreshes() -> anyhow::Result<()> {
    let mut home = TestHome::builder().log_filter("debug").build()?;
    let (browser, page) = curl_browser(&home)?;
    home.set_env("BROWSER", browser.display().to_string());
    let api = home.start_daemon().await?;
    let (mut peer, base) = start_peer_with(&home, &["--transport", "sse"])?;
    let url = format!("{base}/sse");

    let out = home.cli(&["mcp", "add", "oldsecure", "--url", &url, "--auth"]).await?;
    ensure!(out.code == Some(0), "{:?}\n{}\n{}", out.code, out.stdout, out.stderr);
    ensure!(out.stdout.contains("needs sign-in") && out.stdout.contains("coffer mcp auth oldsecure"), "{}", out.stdout);
    ensure!(out.stdout.contains("Signed in to oldsecure"), "{}\n{}", out.stdout, out.stderr);
    ensure!(!out.stdout.contains("Enable it with"), "an enabled server was told to be enabled: {}", out.stdout);
    let shown = std::fs::read_to_string(&page)?;
    ensure!(shown.contains("signed in to oldsecure"), "{shown}");
    let auth = api.get("/v1/mcp/servers/oldsecure/auth").reply().await?.ok_json()?;
    ensure!(auth.to_string().contains("signed_in"), "{auth}");

    // On the legacy transport the expired token's 401 answers the POST.
    calls_then_survives_an_expiry(&api, &base, "oldsecure").await?;

    // Revoked: needs sign-in, with the command.
    peer_post(&base, "/test/revoke").await?;
    peer_post(&base, "/test/expire").await?;
    let r = call(&api, "oldsecure__echo", json!({"message": "after revoke"})).await?;
    ensure!(r.status.as_u16() >= 400, "{} {}", r.status, r.text);
    ensure!(r.text.contains("needs sign-in") && r.text.contains("coffer mcp auth oldsecure"), "{}", r.text);
    let auth = api.get("/v1/mcp/servers/oldsecure/auth").reply().await?.ok_json()?;
    ensure!(auth.to_string().contains("needs_sign_in"), "{auth}");

    let issued = issued_tokens(&base).await?;
    ensure!(issued.len() >= 4, "{issued:?}");
    peer.kill()?;
    peer.wait()?;
    home.terminate_daemon(Duration::from_secs(30)).await?;
    let (found, scanned) = files_containing(home.root(), &issued)?;
    ensure!(found.is_empty(), "files hold tokens: {found:?}");
    ensure!(scanned >= 5, "scanned only {scanned} files");
    Ok(())
}

/// Issue 37, step-up (MCP 2025-11-25 basic/authorization §Scope Challenge Handling): a call the
/// server refuses with `403` and `WWW-Authenticate: Bearer error="insufficient_scope",
/// scope="mcp:tools mcp:admin"` puts the server in needs-sign-in naming the wider scopes and the
/// command; the next `coffer mcp auth` asks for them (the authorization URL's `scope`), and the
/// call then goes through with a token carrying both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_challenge_needs_a_sign_in_that_asks_for_the_wider_scopes() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let (mut peer, base) = start_peer_with(&home, &["--step-up", "mcp:admin"])?;
    let out = home.cli(&["mcp", "add", "stepper", "--url", &format!("{base}/mcp"), "--no-auth"]).await?;
    ensure!(out.stdout.contains("coffer mcp auth stepper"), "{}\n{}", out.stdout, out.stderr);
    let (code, stdout, stderr, url) = sign_in_at(&home, "stepper").await?;
    ensure!(code == Some(0), "{code:?} {stdout} {stderr}");
    ensure!(url.contains("scope=mcp%3Atools&") || url.ends_with("scope=mcp%3Atools"), "first sign-in scope: {url}");
    let r = call(&api, "stepper__whoami", json!({})).await?.ok_json()?;
    ensure!(text_of(&r).ends_with("with scopes mcp:tools"), "{r}");

    // The scope challenge.
    let r = call(&api, "stepper__admin", json!({})).await?;
    ensure!(r.status.as_u16() >= 400, "{} {}", r.status, r.text);
    ensure!(r.text.contains("needs sign-in") && r.text.contains("coffer mcp auth stepper"), "{}", r.text);
    ensure!(r.text.contains("mcp:tools mcp:admin"), "the error does not name the scopes: {}", r.text);
    let auth = api.get("/v1/mcp/servers/stepper/auth").reply().await?.ok_json()?;
    assert_eq!(auth["state"], "needs_sign_in", "{auth}");
    let out = home.cli(&["mcp", "auth", "stepper", "--status"]).await?;
    ensure!(out.stdout.contains("needs sign-in") && out.stdout.contains("mcp:admin"), "{}", out.stdout);

    // The next sign-in asks for both scopes; the call goes through.
    let (code, stdout, stderr, url) = sign_in_at(&home, "stepper").await?;
    ensure!(code == Some(0), "{code:?} {stdout} {stderr}");
    ensure!(url.contains("scope=mcp%3Atools+mcp%3Aadmin") || url.contains("scope=mcp%3Atools%20mcp%3Aadmin"), "{url}");
    let r = call(&api, "stepper__admin", json!({})).await?.ok_json()?;
    assert_eq!(text_of(&r), "admin with scopes mcp:tools mcp:admin", "{r}");
    let auth = api.get("/v1/mcp/servers/stepper/auth").reply().await?.ok_json()?;
    assert_eq!(auth["state"], "signed_in", "{auth}");
    peer.kill()?;
    peer.wait()?;
    Ok(())
}
