//! The web console's edge on a running daemon, over real HTTP: the one-time login (cookie
//! attributes, single use, expiry, hostile codes, eight concurrent redemptions, `next=`), what
//! the cookie may do (REST and SSE, unsafe methods only with our `Origin`, never minting codes),
//! sessions surviving a gateway restart, ending with the daemon (`coffer daemon restart`) and
//! revoked by `coffer ui --logout-all`, the security headers on every `/ui` response, 404s and ETags,
//! `coffer ui` itself (printing, `--json`, opening `$BROWSER`), and the console's two REST
//! routes: an upstream's stderr log (tail and follow) and the live invocation feed.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::mcp::{McpSession, register_tiny};
use coffer_tests::{Api, Reply, SendExt, TestHome, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

/// The policy every `/ui` response carries, spelled out (the contract, not the constant).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
font-src 'self'; connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; \
frame-ancestors 'none'";

/// How long an SSE test waits for one event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(15);

async fn daemon() -> anyhow::Result<(TestHome, Api)> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    Ok((home, api))
}

/// A client that does not follow redirects and keeps no cookies: the tests send `Cookie` by hand.
fn browser() -> reqwest::Client {
    coffer_tests::console::client()
}

async fn mint(api: &Api, body: Value) -> anyhow::Result<Value> {
    api.post_json("/v1/ui/login-codes", &body).reply().await?.ok_json()
}

/// GET `url` without credentials.
async fn open(url: &str) -> anyhow::Result<Reply> {
    browser().get(url).reply().await
}

fn header<'a>(r: &'a Reply, name: &str) -> &'a str {
    r.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// The security headers of a `/ui` response.
fn expect_secure(r: &Reply, what: &str) -> anyhow::Result<()> {
    ensure!(header(r, "content-security-policy") == CSP, "{what}: CSP {:?}", header(r, "content-security-policy"));
    ensure!(header(r, "x-content-type-options") == "nosniff", "{what}: {:?}", r.headers);
    ensure!(header(r, "x-frame-options") == "DENY", "{what}: {:?}", r.headers);
    Ok(())
}

/// A web session as the console holds it: the `coffer_session=…` pair for a `Cookie` header
/// and the key the login put in the redirect's fragment.
struct Session {
    cookie: String,
    key: String,
}

/// Logs in through a fresh code.
async fn login(api: &Api) -> anyhow::Result<Session> {
    let code = mint(api, json!({})).await?;
    let r = open(code["url"].as_str().context("url")?).await?;
    ensure!(r.status == 303, "login: {} {}", r.status, r.text);
    session_of(&r)
}

/// The session a login's 303 hands over: its cookie, and the key in `Location`'s `#key=`.
fn session_of(r: &Reply) -> anyhow::Result<Session> {
    let location = header(r, "location");
    let key = location.split_once("#key=").with_context(|| format!("no key in {location:?}"))?.1.to_owned();
    ensure!(key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{location}");
    Ok(Session { cookie: cookie_of(r)?, key })
}

/// `Location` without the session key's fragment.
fn page_of(r: &Reply) -> &str {
    let l = header(r, "location");
    l.split_once('#').map_or(l, |(p, _)| p)
}

fn cookie_of(r: &Reply) -> anyhow::Result<String> {
    let set = header(r, "set-cookie");
    let pair = set.split(';').next().context("no Set-Cookie")?.trim().to_owned();
    ensure!(pair.starts_with("coffer_session="), "{set}");
    Ok(pair)
}

/// A request carrying only the cookie (no token, no key): refused.
fn with_cookie(api: &Api, method: Method, path: &str, cookie: &str) -> reqwest::RequestBuilder {
    browser().request(method, api.url(path)).header("Cookie", cookie)
}

/// A request signed in as the console is: the cookie and `X-Coffer-Session-Key`.
fn with_session(api: &Api, method: Method, path: &str, s: &Session) -> reqwest::RequestBuilder {
    with_cookie(api, method, path, &s.cookie).header("X-Coffer-Session-Key", &s.key)
}

/// An open SSE response, read event by event.
struct Events {
    resp: reqwest::Response,
    parser: coffer_types::sse::SseParser,
    ready: std::collections::VecDeque<coffer_types::sse::SseEvent>,
}

impl Events {
    async fn open(req: reqwest::RequestBuilder) -> anyhow::Result<Self> {
        let resp = req.send().await?;
        ensure!(resp.status() == 200, "stream answered {}", resp.status());
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        ensure!(ct.starts_with("text/event-stream"), "content type {ct}");
        Ok(Self { resp, parser: coffer_types::sse::SseParser::new(), ready: Default::default() })
    }

    /// The next event (kind, data as text).
    async fn next(&mut self) -> anyhow::Result<(String, String)> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok((e.kind().to_owned(), String::from_utf8(e.data)?));
            }
            let chunk = tokio::time::timeout(EVENT_TIMEOUT, self.resp.chunk()).await.context("no event in time")??;
            let bytes = chunk.context("the stream ended")?;
            let mut out = Vec::new();
            self.parser.push(&bytes, &mut out);
            self.ready.extend(out);
        }
    }

    /// Waits (bounded) for the server to end the stream; the events still sent before it are
    /// returned.
    async fn ended(&mut self) -> anyhow::Result<Vec<(String, String)>> {
        let mut seen = Vec::new();
        loop {
            let chunk = tokio::time::timeout(EVENT_TIMEOUT, self.resp.chunk())
                .await
                .with_context(|| format!("the stream is still open after {seen:?}"))?;
            let Some(bytes) = chunk? else { return Ok(seen) };
            let mut out = Vec::new();
            self.parser.push(&bytes, &mut out);
            seen.extend(out.into_iter().map(|e| (e.kind().to_owned(), String::from_utf8_lossy(&e.data).into_owned())));
        }
    }

    /// Events up to and including the first `kind` event whose data contains `needle`.
    async fn until(&mut self, kind: &str, needle: &str) -> anyhow::Result<Vec<(String, String)>> {
        let mut seen = Vec::new();
        loop {
            let e = self.next().await.with_context(|| format!("waiting for {kind} {needle:?} after {seen:?}"))?;
            let hit = e.0 == kind && e.1.contains(needle);
            seen.push(e);
            if hit {
                return Ok(seen);
            }
        }
    }
}

#[tokio::test]
async fn ui_edge_login_sets_a_strict_cookie_once_and_refuses_every_other_code() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let code = mint(&api, json!({})).await?;
    let (c, url) = (code["code"].as_str().context("code")?, code["url"].as_str().context("url")?);
    ensure!(c.len() == 64 && c.bytes().all(|b| b.is_ascii_hexdigit()), "{code}");
    ensure!(url == format!("http://127.0.0.1:{}/ui/login?code={c}", api.port()), "{url}");
    ensure!(code["expires_in_s"] == 60, "{code}");

    // Hostile codes first: none of them consumes the live code.
    let junk = [
        "/ui/login".to_owned(),
        "/ui/login?code=".to_owned(),
        format!("/ui/login?code={}", "a".repeat(2048)),
        format!("/ui/login?code={}", "g".repeat(64)),
        format!("/ui/login?code={}", &c[..63]),
        format!("/ui/login?code={c}&code={c}"),
        format!("/ui/login?code={c}&next=/ui/chat&next=/ui/servers"),
        "/ui/login?code=%00%FF%2F..%2F%252e%0d%0aSet-Cookie:%20x=1".to_owned(),
        format!("/ui/login?code={}%00", &c[..62]),
        format!("/ui/login?code=%{}", &c[..63]),
        format!("/ui/login?%63ode={}", "0".repeat(64)),
    ];
    for path in &junk {
        let r = open(&api.url(path)).await?;
        ensure!(r.status == 401, "{path}: {} {}", r.status, r.text);
        ensure!(header(&r, "set-cookie").is_empty(), "{path}: a refusal sets no cookie");
        ensure!(header(&r, "content-type").starts_with("text/html"), "{path}");
        ensure!(r.text.contains("This login link is not valid") && r.text.contains("coffer ui"), "{}", r.text);
        expect_secure(&r, path)?;
    }
    // The real code: 303 to the chat page with the cookie.
    let r = open(url).await?;
    ensure!(r.status == 303, "{} {}", r.status, r.text);
    ensure!(page_of(&r) == "/ui/chat", "{:?}", r.headers);
    session_of(&r)?;
    expect_secure(&r, "login")?;
    let set = header(&r, "set-cookie");
    let attrs: Vec<&str> = set.split(';').map(str::trim).collect();
    let value = attrs[0].strip_prefix("coffer_session=").context("cookie name")?;
    ensure!(value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()), "{set}");
    for want in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=2592000"] {
        ensure!(attrs.contains(&want), "cookie lacks {want}: {set}");
    }
    // Once only.
    let again = open(url).await?;
    ensure!(again.status == 401, "a reused code: {}", again.status);
    expect_secure(&again, "reused code")?;
    Ok(())
}

/// A login link that was used already, opened again by a browser that is signed in (a reloaded
/// login tab), goes to its page instead of the refusal; without a live cookie it is refused.
#[tokio::test]
async fn ui_edge_a_used_link_with_a_live_session_goes_to_its_page() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let code = mint(&api, json!({"page": "servers"})).await?;
    let url = code["url"].as_str().context("url")?.to_owned();
    let first = open(&url).await?;
    ensure!(first.status == 303 && page_of(&first) == "/ui/servers", "{:?}", first.headers);
    let cookie = cookie_of(&first)?;

    let again = browser().get(&url).header("Cookie", &cookie).reply().await?;
    ensure!(again.status == 303, "{} {}", again.status, again.text);
    ensure!(header(&again, "location") == "/ui/servers", "{:?}", again.headers);
    ensure!(header(&again, "set-cookie").is_empty(), "no new session: {:?}", again.headers);
    expect_secure(&again, "the redirect")?;
    // Without `next`, and with a code that never existed: the landing page.
    let bogus = format!("{}/ui/login?code={}", api.base_url(), "a".repeat(64));
    let r = browser().get(&bogus).header("Cookie", &cookie).reply().await?;
    ensure!(r.status == 303 && header(&r, "location") == "/ui/chat", "{} {:?}", r.status, r.headers);
    // A hostile `next` is still never a target.
    let r = browser().get(format!("{bogus}&next=https://evil.com/")).header("Cookie", &cookie).reply().await?;
    ensure!(r.status == 303 && header(&r, "location") == "/ui/chat", "{} {:?}", r.status, r.headers);

    // No cookie, a wrong one, a revoked one: the refusal page.
    let bad = format!("coffer_session={}", "0".repeat(64));
    for c in [None, Some(bad.as_str())] {
        let rb = browser().get(&url);
        let r = match c {
            Some(c) => rb.header("Cookie", c),
            None => rb,
        }
        .reply()
        .await?;
        ensure!(r.status == 401 && r.text.contains("This login link is not valid"), "{:?}: {} {}", c, r.status, r.text);
    }
    api.request(Method::DELETE, "/v1/ui/sessions").reply().await?.ok_json()?;
    let r = browser().get(&url).header("Cookie", &cookie).reply().await?;
    ensure!(r.status == 401, "a revoked session: {} {}", r.status, r.text);
    Ok(())
}

#[tokio::test]
async fn ui_edge_login_lands_only_on_known_pages() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    // `next=` takes `/ui/<known page>` only; anything else lands on the chat page.
    for (next, want) in [
        ("/ui/servers", "/ui/servers"),
        ("%2Fui%2Fknowledge", "/ui/knowledge"),
        ("//evil.com", "/ui/chat"),
        ("https://evil.com/ui/chat", "/ui/chat"),
        ("/ui/nope", "/ui/chat"),
        ("/ui/chat/../../v1/status", "/ui/chat"),
        ("/v1/status", "/ui/chat"),
        ("%0d%0aLocation:%20http://evil.com", "/ui/chat"),
        ("", "/ui/chat"),
    ] {
        let code = mint(&api, json!({})).await?;
        let r = open(&format!("{}&next={next}", code["url"].as_str().context("url")?)).await?;
        ensure!(r.status == 303 && page_of(&r) == want, "next={next}: {} {:?}", r.status, r.headers);
    }
    // Minting for a page puts it in the link.
    let code = mint(&api, json!({"page": "activity"})).await?;
    ensure!(code["url"].as_str().is_some_and(|u| u.ends_with("&next=/ui/activity")), "{code}");
    let r = open(code["url"].as_str().context("url")?).await?;
    ensure!(page_of(&r) == "/ui/activity", "{:?}", r.headers);
    // A page that does not exist, an unknown field, malformed JSON.
    let e = api.post_json("/v1/ui/login-codes", &json!({"page": "nope"})).reply().await?;
    let error = e.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(error["details"]["valid"].as_array().is_some_and(|v| v.len() == 6), "{error}");
    api.post_json("/v1/ui/login-codes", &json!({"pgae": "chat"}))
        .reply()
        .await?
        .expect_envelope(400, "UNKNOWN_FIELD")?;
    api.post("/v1/ui/login-codes").body("{").reply().await?.expect_envelope(400, "BAD_REQUEST")?;
    // No body at all is fine.
    let r = api.post("/v1/ui/login-codes").reply().await?.ok_json()?;
    ensure!(r["url"].as_str().is_some_and(|u| !u.contains("next=")), "{r}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ui_edge_one_code_redeemed_by_eight_at_once_signs_in_exactly_one() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let code = mint(&api, json!({})).await?;
    let url = code["url"].as_str().context("url")?.to_owned();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(8));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (url, barrier) = (url.clone(), barrier.clone());
        set.spawn(async move {
            let client = browser();
            barrier.wait().await;
            client.get(&url).reply().await
        });
    }
    let mut statuses = Vec::new();
    let mut cookies = Vec::new();
    while let Some(r) = set.join_next().await {
        let r = r??;
        statuses.push(r.status.as_u16());
        if r.status == 303 {
            cookies.push(session_of(&r)?);
        }
    }
    statuses.sort_unstable();
    ensure!(statuses == [303, 401, 401, 401, 401, 401, 401, 401], "{statuses:?}");
    let r = with_session(&api, Method::GET, "/v1/ui/session", &cookies[0]).reply().await?.ok_json()?;
    ensure!(r == json!({"via": "cookie"}), "{r}");
    Ok(())
}

#[tokio::test]
async fn ui_edge_an_expired_code_is_refused() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let r =
        api.request(Method::PATCH, "/v1/settings").json(&json!({"set": {"ui.login_code_ttl_s": "4"}})).reply().await?;
    let e = r.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["details"]["key"] == "ui.login_code_ttl_s", "{e}");
    let r =
        api.request(Method::PATCH, "/v1/settings").json(&json!({"set": {"ui.login_code_ttl_s": "5"}})).reply().await?;
    r.ok_json()?;
    let code = mint(&api, json!({})).await?;
    ensure!(code["expires_in_s"] == 5, "{code}");
    let minted = std::time::Instant::now();
    // A live code next to it works until then; this one waits for its expiry (the expiry is
    // what is tested: a wait for time to pass, not for readiness).
    tokio::time::sleep(Duration::from_millis(5_300).saturating_sub(minted.elapsed())).await;
    let r = open(code["url"].as_str().context("url")?).await?;
    ensure!(r.status == 401, "an expired code: {} {}", r.status, r.text);
    ensure!(r.text.contains("expire 5 seconds after"), "{}", r.text);
    // A fresh one still works.
    login(&api).await?;
    Ok(())
}

#[tokio::test]
async fn ui_edge_the_cookie_authenticates_reads_and_streams_and_writes_only_with_our_origin() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let cookie = login(&api).await?;
    let ours = format!("http://127.0.0.1:{}", api.port());

    let r = with_session(&api, Method::GET, "/v1/status", &cookie).reply().await?;
    ensure!(r.ok_json()?["services"].as_array().is_some_and(|s| s.len() == 5), "{}", r.text);
    let mut s = Events::open(with_session(&api, Method::GET, "/v1/logs/gateway?follow=true&n=1", &cookie)).await?;
    s.next().await?;
    drop(s);
    // A wrong or half cookie is no session.
    for bad in
        ["coffer_session=".to_owned(), format!("coffer_session={}", "0".repeat(64)), cookie.cookie.replace('=', "=x")]
    {
        with_cookie(&api, Method::GET, "/v1/status", &bad).reply().await?.expect_envelope(401, "UNAUTHORIZED")?;
    }

    // Unsafe methods: without Origin, with a foreign one, then with ours.
    let refresh = |origin: Option<&str>| {
        let rb = with_session(&api, Method::POST, "/v1/mcp/refresh", &cookie);
        match origin {
            Some(o) => rb.header("Origin", o),
            None => rb,
        }
    };
    refresh(None).reply().await?.expect_envelope(403, "FORBIDDEN")?;
    for foreign in ["http://evil.com", "null", &format!("http://127.0.0.1:{}", api.port() + 1)] {
        refresh(Some(foreign)).reply().await?.expect_envelope(403, "FORBIDDEN").context(foreign.to_owned())?;
    }
    let r = refresh(Some(&ours)).reply().await?;
    ensure!(r.status.is_success(), "our Origin: {} {}", r.status, r.text);

    // A web session cannot mint login codes, with or without Origin.
    let r = with_session(&api, Method::POST, "/v1/ui/login-codes", &cookie).header("Origin", &ours).reply().await?;
    r.expect_envelope(403, "FORBIDDEN")?;
    with_session(&api, Method::POST, "/v1/ui/login-codes", &cookie).reply().await?.expect_envelope(403, "FORBIDDEN")?;
    let who = with_session(&api, Method::GET, "/v1/ui/session", &cookie).reply().await?.ok_json()?;
    ensure!(who == json!({"via": "cookie"}), "{who}");
    ensure!(api.get("/v1/ui/session").reply().await?.ok_json()? == json!({"via": "token"}));
    with_cookie(&api, Method::GET, "/v1/ui/session", "x=y").reply().await?.expect_envelope(401, "UNAUTHORIZED")?;
    Ok(())
}

#[tokio::test]
async fn ui_edge_sessions_survive_gateway_restarts_end_with_the_daemon_and_logout_all_revokes_them()
-> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    let (first, second) = (login(&api).await?, login(&api).await?);
    let file = home.root().join("web-sessions.json");
    let text = std::fs::read_to_string(&file)?;
    for c in [&first, &second] {
        let id = c.cookie.split_once('=').context("pair")?.1;
        ensure!(!text.contains(id), "a session id is on disk: {text}");
        ensure!(!text.contains(&c.key), "a session key is on disk: {text}");
    }
    let v: Value = serde_json::from_str(&text)?;
    ensure!(v["sessions"].as_array().is_some_and(|s| s.len() == 2), "{text}");
    use std::os::unix::fs::PermissionsExt as _;
    ensure!(std::fs::metadata(&file)?.permissions().mode() & 0o777 == 0o600);

    // The gateway alone restarts (the supervisor keeps the port): still signed in.
    let before = api.service("gateway").await?;
    let r = api.post("/v1/daemon/services/gateway/restart").reply().await?;
    ensure!(r.status == 202, "{}", r.text);
    wait_for("the gateway to come back", Duration::from_secs(20), || async {
        let s = api.service("gateway").await?;
        Ok((s["state"] == "healthy" && s["pid"] != before["pid"]).then_some(()))
    })
    .await?;
    with_session(&api, Method::GET, "/v1/status", &second)
        .reply()
        .await?
        .ok_json()
        .context("after a gateway restart")?;
    with_session(&api, Method::GET, "/v1/status", &first).reply().await?.ok_json()?;

    // `coffer ui --logout-all` ends both, also for the next gateway.
    let out = home.cli(&["ui", "--logout-all"]).await?.ok()?;
    ensure!(out.stdout.contains("Signed out 2 web sessions"), "{out}");
    for c in [&first, &second] {
        let e = with_session(&api, Method::GET, "/v1/status", c).reply().await?.expect_envelope(401, "UNAUTHORIZED")?;
        // An ended session says so and where a new one comes from (not "send X-Coffer-Token").
        ensure!(
            e["details"]["reason"] == "session_unknown"
                && e["message"].as_str().is_some_and(|m| m.contains("coffer ui")),
            "{e}"
        );
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file)?)?;
    ensure!(v["sessions"] == json!([]), "{v}");
    let out = home.cli(&["ui", "--logout-all", "--json"]).await?.ok()?;
    ensure!(out.json()? == json!({"revoked": 0}), "{out}");

    // A damaged file costs the sessions, never the gateway.
    let third = login(&api).await?;
    std::fs::write(&file, "{ not json")?;
    let before = api.service("gateway").await?;
    api.post("/v1/daemon/services/gateway/restart").reply().await?;
    wait_for("the gateway to come back", Duration::from_secs(20), || async {
        let s = api.service("gateway").await?;
        Ok((s["state"] == "healthy" && s["pid"] != before["pid"]).then_some(()))
    })
    .await?;
    with_session(&api, Method::GET, "/v1/status", &third).reply().await?.expect_envelope(401, "UNAUTHORIZED")?;
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file)?).context("the damaged file is replaced")?;
    ensure!(v["sessions"] == json!([]), "{v}");
    home.wait_for_log_line("gateway", &["Web sessions file unusable"], Duration::from_secs(5)).await?;

    // A session lasts one run of the daemon: while it is down another program may hold the
    // port and read the page's storage, so after `coffer daemon restart` (or stop and start) the
    // cookie and key of before open nothing, and a new login link works.
    let fourth = login(&api).await?;
    with_session(&api, Method::GET, "/v1/status", &fourth).reply().await?.ok_json()?;
    home.cli(&["daemon", "restart"]).await?.ok()?;
    let api = home.api()?;
    let r = with_session(&api, Method::GET, "/v1/status", &fourth).reply().await?;
    r.expect_envelope(401, "UNAUTHORIZED").context("after a daemon restart")?;
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file)?)?;
    ensure!(v["sessions"] == json!([]), "the file holds no session of the previous run: {v}");
    home.cli(&["daemon", "stop"]).await?.ok()?;
    home.wait_no_processes(Duration::from_secs(15)).await?;
    let api = home.start_daemon().await?;
    let r = with_session(&api, Method::GET, "/v1/status", &fourth).reply().await?;
    r.expect_envelope(401, "UNAUTHORIZED").context("after a daemon stop and start")?;
    let fifth = login(&api).await?;
    with_session(&api, Method::GET, "/v1/status", &fifth).reply().await?.ok_json()?;
    Ok(())
}

/// `coffer ui --logout-all` ends the streams already open with a revoked cookie (each SSE
/// endpoint the console follows), and only those: a stream opened with the token goes on.
#[tokio::test]
async fn ui_edge_a_revoke_ends_the_streams_open_with_the_cookie() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let cookie = login(&api).await?;
    let mut by_token = Events::open(api.get("/v1/invocations/events")).await?;
    let mut streams = Vec::new();
    for path in ["/v1/invocations/events", "/v1/conversations/events", "/v1/logs/gateway?follow=true&n=1"] {
        streams.push((path, Events::open(with_session(&api, Method::GET, path, &cookie)).await.context(path)?));
    }
    // They are live before the revoke.
    let mcp = McpSession::latest(&api).await?;
    mcp.tool("tiny__echo", json!({"message": "before"})).await?;
    streams[0].1.until("invocation", "tiny__echo").await?;
    by_token.until("invocation", "tiny__echo").await?;

    let out = home.cli(&["ui", "--logout-all"]).await?.ok()?;
    ensure!(out.stdout.contains("Signed out 1 web session"), "{out}");
    for (path, s) in &mut streams {
        s.ended().await.with_context(|| format!("{path} after the revoke"))?;
        // Reconnecting with the same cookie is refused.
        let again = with_session(&api, Method::GET, path, &cookie).reply().await?;
        again.expect_envelope(401, "UNAUTHORIZED").with_context(|| path.to_owned())?;
    }
    // The token's stream is untouched and still delivers.
    mcp.tool("tiny__echo", json!({"message": "after"})).await?;
    let (kind, data) = by_token.next().await?;
    ensure!(kind == "invocation" && data.contains("tiny__echo"), "{kind} {data}");
    // A new session after the revoke streams as before.
    let fresh = login(&api).await?;
    let mut s = Events::open(with_session(&api, Method::GET, "/v1/invocations/events", &fresh)).await?;
    mcp.tool("tiny__echo", json!({"message": "fresh"})).await?;
    s.until("invocation", "tiny__echo").await?;
    Ok(())
}

#[tokio::test]
async fn ui_edge_every_ui_response_carries_the_security_headers() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let client = browser();
    let get = |path: &str| client.get(api.url(path)).reply();
    for path in ["/ui", "/ui/", "/ui/chat", "/ui/servers", "/ui/tools", "/ui/activity", "/ui/knowledge", "/ui/settings"]
    {
        let r = get(path).await?;
        ensure!(r.status == 200 && header(&r, "content-type").starts_with("text/html"), "{path}: {}", r.status);
        ensure!(r.text.contains("<script type=\"module\"") || r.text.contains("js/app.js"), "{path}: {}", r.text);
        expect_secure(&r, path)?;
    }
    // Assets: content types, ETag and 304.
    for (path, ct) in [
        ("/ui/assets/app.css", "text/css"),
        ("/ui/assets/js/app.js", "text/javascript"),
        ("/ui/assets/js/api.js", "text/javascript"),
        ("/ui/assets/favicon.svg", "image/svg+xml"),
    ] {
        let r = get(path).await?;
        ensure!(r.status == 200 && header(&r, "content-type").starts_with(ct), "{path}: {} {:?}", r.status, r.headers);
        expect_secure(&r, path)?;
        let etag = header(&r, "etag").to_owned();
        ensure!(etag.starts_with('"') && etag.ends_with('"'), "{path}: etag {etag:?}");
        let r = client.get(api.url(path)).header("If-None-Match", &etag).reply().await?;
        ensure!(r.status == 304 && r.text.is_empty(), "{path}: {}", r.status);
        expect_secure(&r, &format!("{path} (304)"))?;
        let r = client.get(api.url(path)).header("If-None-Match", format!("\"x\", W/{etag}")).reply().await?;
        ensure!(r.status == 304, "{path}: a list naming it: {}", r.status);
        let r = client.get(api.url(path)).header("If-None-Match", "\"0000\"").reply().await?;
        ensure!(r.status == 200, "{path}: another tag: {}", r.status);
    }
    // Unknown pages and assets: the 404 envelope, with the headers too.
    for path in ["/ui/nope", "/ui/assets/nope.js", "/ui/assets/../index.html", "/ui/chat/extra", "/ui/assets/js"] {
        let r = get(path).await?;
        r.expect_envelope(404, "NOT_FOUND").with_context(|| path.to_owned())?;
        expect_secure(&r, path)?;
    }
    // Other methods, and the edge's own refusals, on /ui paths.
    // A POST is no static GET: it needs credentials first (401), and with them is not allowed.
    let r = client.post(api.url("/ui/chat")).reply().await?;
    r.expect_envelope(401, "UNAUTHORIZED")?;
    expect_secure(&r, "POST /ui/chat")?;
    let r = api.post("/ui/chat").reply().await?;
    r.expect_envelope(405, "METHOD_NOT_ALLOWED")?;
    expect_secure(&r, "POST /ui/chat with the token")?;
    let r = client.get(api.url("/ui/chat")).header("Host", "evil.com").reply().await?;
    r.expect_envelope(403, "FORBIDDEN")?;
    expect_secure(&r, "foreign Host")?;
    // The REST routes do not need them (they are not documents), but the login routes do.
    let r = get("/ui/login?code=x").await?;
    expect_secure(&r, "refusal")?;
    Ok(())
}

#[tokio::test]
async fn ui_edge_coffer_ui_prints_a_working_link_and_opens_browser() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    // `coffer ui` starts the daemon itself.
    let out = home.cli(&["ui", "--no-open", "--json"]).await?.ok()?;
    let v = out.json()?;
    let obj = v.as_object().context("an object")?;
    ensure!(obj.len() == 2 && v["expires_in_s"] == 60, "{v}");
    let r = open(v["url"].as_str().context("url")?).await?;
    ensure!(r.status == 303 && page_of(&r) == "/ui/chat", "{} {:?}", r.status, r.headers);
    ensure!(!out.stderr.contains("Opening"), "--no-open opens nothing: {out}");

    let out = home.cli(&["ui", "--no-open", "--page", "knowledge"]).await?.ok()?;
    let line = out.stdout.trim();
    ensure!(line.starts_with("Open http://127.0.0.1:") && line.ends_with(" (valid 60 s, once)"), "{out}");
    let url = line.strip_prefix("Open ").and_then(|l| l.strip_suffix(" (valid 60 s, once)")).context("url")?;
    let r = open(url).await?;
    ensure!(page_of(&r) == "/ui/knowledge", "{:?}", r.headers);
    let out = home.cli(&["ui", "--page", "nope"]).await?;
    ensure!(out.code == Some(2), "{out}");

    // With $BROWSER a browser is opened, and the command does not wait for it. The opener gets
    // no link on its command line (every user reads /proc/PID/cmdline): a file:// page in
    // COFFER_HOME, 0600, that redirects to the link, which is printed to the terminal only.
    let script = home.temp().join("browser.sh");
    let seen = home.temp().join("opened.txt");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nf=\"${{1#file://}}\"\nstat -c %a \"$f\" > {s}.mode\ncat \"$f\" > {s}.page\n\
             printf '%s\\n' \"$0\" \"$@\" > {s}.tmp && mv {s}.tmp {s}\n",
            s = seen.display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    let mut cmd = home.cli_command(&["ui", "--page", "servers"])?;
    cmd.env("BROWSER", &script).env_remove("DISPLAY").env_remove("WAYLAND_DISPLAY");
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await??;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let argv = wait_for("the browser to be started", Duration::from_secs(10), || async {
        Ok(std::fs::read_to_string(&seen).ok())
    })
    .await?;
    let printed = String::from_utf8_lossy(&out.stdout);
    let link = printed.split_whitespace().find(|w| w.starts_with("http://")).context("no link printed")?;
    ensure!(link.ends_with("&next=/ui/servers"), "{printed}");
    let code = link.split_once("code=").context("code")?.1.split('&').next().context("code")?;
    let args: Vec<&str> = argv.lines().skip(1).collect();
    ensure!(args.len() == 1, "{argv}");
    let page = args[0].strip_prefix("file://").with_context(|| format!("not a file URL: {argv}"))?;
    ensure!(std::path::Path::new(page).starts_with(home.root()), "{page} is not in COFFER_HOME");
    ensure!(!argv.contains(code) && !argv.contains("login?"), "the link is on the command line: {argv}");
    ensure!(std::fs::read_to_string(seen.with_extension("txt.mode"))?.trim() == "600", "the page is not 0600");
    let html = std::fs::read_to_string(seen.with_extension("txt.page"))?;
    let escaped = link.replace('&', "&amp;");
    ensure!(html.contains(&format!("http-equiv=\"refresh\" content=\"0;url={escaped}\"")), "{html}");
    ensure!(std::path::Path::new(page).exists(), "the page is gone before the link is used");
    let r = open(link).await?;
    ensure!(page_of(&r) == "/ui/servers", "{:?}", r.headers);
    // Redeeming the link removes the page.
    wait_for("the redirect page to be removed", Duration::from_secs(10), || async {
        Ok((!std::path::Path::new(page).exists()).then_some(()))
    })
    .await?;

    // No browser to be had: a hint, and still success.
    let mut cmd = home.cli_command(&["ui"])?;
    cmd.env("BROWSER", "/nonexistent/browser").env_remove("DISPLAY").env_remove("WAYLAND_DISPLAY");
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success() && stderr.contains("hint:"), "{stderr}");
    // No redirect page is left when no browser was started.
    let left: Vec<_> = std::fs::read_dir(home.root())?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ui-login-"))
        .map(|e| e.file_name())
        .collect();
    ensure!(left.is_empty(), "{left:?}");

    // An opener that fails at once: said so, the link still printed and valid; no long wait.
    let mut cmd = home.cli_command(&["ui"])?;
    cmd.env("BROWSER", "/bin/false").env_remove("DISPLAY").env_remove("WAYLAND_DISPLAY");
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "{stderr}");
    ensure!(
        stderr.contains("could not open the browser")
            && stderr.contains("still valid")
            && !stderr.contains("Opening it"),
        "{stderr}"
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let link = printed.split_whitespace().find(|w| w.starts_with("http://")).context("no link printed")?;
    let r = open(link).await?;
    ensure!(r.status == 303, "the printed link works: {} {}", r.status, r.text);
    // A browser still running after the opener's window counts as opened (it ends by itself
    // soon after: nothing is left behind).
    let slow = home.temp().join("slow-browser.sh");
    std::fs::write(&slow, "#!/bin/sh\nexec sleep 3\n")?;
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755))?;
    let mut cmd = home.cli_command(&["ui"])?;
    cmd.env("BROWSER", &slow).env_remove("DISPLAY").env_remove("WAYLAND_DISPLAY");
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success() && stderr.contains("Opening it with slow-browser.sh"), "{stderr}");
    Ok(())
}

#[tokio::test]
async fn ui_edge_a_server_s_stderr_log_is_tailed_and_followed() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    api.get("/v1/mcp/servers/nope/log").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    api.get("/v1/mcp/servers/nope/log?follow=true").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    api.get("/v1/mcp/servers/..%2F..%2Fgateway/log").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    // The built-in server writes none.
    let r = api.get("/v1/mcp/servers/coffer/log").reply().await?.ok_json()?;
    ensure!(r == json!({"server": "coffer", "file": null, "lines": []}), "{r}");

    register_tiny(&api, "tiny", json!({"TINY_ECHO_ENV": "first-marker"})).await?;
    for bad in ["n=0", "n=x", "follow=yes", "lines=3", "n=1&n=2"] {
        let r = api.get(&format!("/v1/mcp/servers/tiny/log?{bad}")).reply().await?;
        r.expect_envelope(400, "INVALID_ARGUMENT").with_context(|| bad.to_owned())?;
    }
    let mut follow = Events::open(api.get("/v1/mcp/servers/tiny/log?follow=true")).await?;
    let mcp = McpSession::latest(&api).await?;
    let r = mcp.tool("tiny__stderr_env", json!({})).await?;
    ensure!(r.get("result").is_some(), "{r}");
    let seen = follow.until("line", "TINY_ECHO_ENV=first-marker").await?;
    ensure!(seen.iter().any(|(k, d)| k == "file" && d.ends_with("logs/upstreams/tiny.log")), "{seen:?}");

    let tail = api.get("/v1/mcp/servers/tiny/log?n=200").reply().await?.ok_json()?;
    ensure!(tail["server"] == "tiny", "{tail}");
    ensure!(tail["file"].as_str().is_some_and(|f| f.ends_with("logs/upstreams/tiny.log")), "{tail}");
    let lines = tail["lines"].as_array().context("lines")?;
    // Each line as the drain wrote it: its time, then what the server wrote.
    ensure!(lines.iter().any(|l| l.as_str().is_some_and(|l| l.ends_with(" TINY_ECHO_ENV=first-marker"))), "{tail}");
    let one = api.get("/v1/mcp/servers/tiny/log?n=1").reply().await?.ok_json()?;
    ensure!(one["lines"].as_array().map(Vec::len) == Some(1) && one["lines"][0] == *lines.last().unwrap(), "{one}");

    // New lines keep coming on the open stream.
    mcp.tool("tiny__stderr_env", json!({})).await?;
    let more = follow.until("line", "TINY_ECHO_ENV=first-marker").await?;
    ensure!(!more.is_empty());
    // An unregistered server's leftover log is not served.
    api.request(Method::DELETE, "/v1/mcp/servers/tiny").reply().await?;
    api.get("/v1/mcp/servers/tiny/log").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    Ok(())
}

#[tokio::test]
async fn ui_edge_invocations_arrive_live_as_the_list_shows_them() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    for bad in ["outcome=great", "server=a&server=b", "limit=3"] {
        let r = api.get(&format!("/v1/invocations/events?{bad}")).reply().await?;
        r.expect_envelope(400, "INVALID_ARGUMENT").with_context(|| bad.to_owned())?;
    }
    register_tiny(&api, "tiny", json!({})).await?;
    let mut all = Events::open(api.get("/v1/invocations/events")).await?;
    let mut disabled = Events::open(api.get("/v1/invocations/events?outcome=disabled&server=tiny")).await?;
    let cookie = login(&api).await?;
    let mut by_cookie = Events::open(with_session(&api, Method::GET, "/v1/invocations/events", &cookie)).await?;

    let mcp = McpSession::latest(&api).await?;
    let r = mcp.tool("tiny__echo", json!({"message": "hi"})).await?;
    ensure!(r.get("result").is_some(), "{r}");
    let (kind, data) = all.next().await?;
    ensure!(kind == "invocation", "{kind} {data}");
    let item: Value = serde_json::from_str(&data)?;
    ensure!(item["target"] == "tiny__echo" && item["outcome"] == "ok" && item["server"] == "tiny", "{item}");
    ensure!(item["id"].as_i64().is_some_and(|id| id > 0), "{item}");
    let (_, cookie_data) = by_cookie.next().await?;
    ensure!(serde_json::from_str::<Value>(&cookie_data)? == item, "{cookie_data}");
    // The event is the list's item, exactly.
    let list = api.get("/v1/invocations?limit=10").reply().await?.ok_json()?;
    let listed = list["items"].as_array().context("items")?.iter().find(|i| i["id"] == item["id"]).cloned();
    ensure!(listed.as_ref() == Some(&item), "{list} vs {item}");

    // A disabled tool's refusal reaches the filtered stream; the ok call did not.
    coffer_tests::mcp::set_tool_enabled(&api, "tiny__echo", false).await?;
    mcp.tool("tiny__echo", json!({"message": "no"})).await?;
    let (kind, data) = disabled.next().await?;
    let refused: Value = serde_json::from_str(&data)?;
    ensure!(kind == "invocation" && refused["outcome"] == "disabled" && refused["target"] == "tiny__echo", "{data}");
    let (_, next) = all.next().await?;
    ensure!(serde_json::from_str::<Value>(&next)?["id"] == refused["id"], "{next}");
    Ok(())
}
