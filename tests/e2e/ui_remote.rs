//! The console from another device (opt-in), over real HTTP on loopback: a second host name
//! (resolved to 127.0.0.1 by the client, as a tailnet name behind `tailscale serve` reaches the
//! edge) is refused with 403 naming `ui.allowed_hosts` until the owner allows it, then logs in
//! with the same session rules (one-time link, cookie and key, `Origin` checked exactly);
//! hostile `Host` and `Origin` values; `/mcp` and the token from beyond loopback refused until
//! `ui.remote_api` is 1 (also through a proxy that rewrites `Host` to loopback but says
//! `X-Forwarded-For`); an `https://` origin gets a `Secure` `__Host-` cookie; `ui.bind` (a second
//! listener, here on 127.0.0.2) answers only the allowed hosts; `coffer ui --qr` prints a QR code
//! whose decoded link logs in; `coffer doctor` says what is exposed and warns on risky
//! combinations; and a real Chromium opens the console by the second name.
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::{Api, Reply, SendExt, TestHome, doctor_check, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

/// The second host name (never resolved by DNS: the clients map it to 127.0.0.1).
const PHONE: &str = "phone.coffer.test";

/// How long a settings change may take to reach the edge (it follows the store's changes).
const FOLLOW: Duration = Duration::from_secs(20);

/// A client that resolves [`PHONE`] to loopback, follows no redirect and keeps no cookie.
fn phone_client() -> reqwest::Client {
    coffer_runtime::tls::ensure_provider();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .resolve(PHONE, SocketAddr::from(([127, 0, 0, 1], 0)))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client builds")
}

fn header<'a>(r: &'a Reply, name: &str) -> &'a str {
    r.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// A web session: the `Cookie` pair and the key the login's `Location` fragment carries.
struct Session {
    cookie: String,
    key: String,
}

/// Opens a login link with `client` (Host as given, or the URL's): 303, a cookie and a key.
async fn redeem(client: &reqwest::Client, url: &str, host: Option<&str>) -> anyhow::Result<(Session, String)> {
    let mut req = client.get(url);
    if let Some(h) = host {
        req = req.header("Host", h);
    }
    let r = req.reply().await?;
    ensure!(r.status == 303, "login at {url}: {} {}", r.status, r.text);
    let location = header(&r, "location");
    let key = location.split_once("#key=").with_context(|| format!("no key in {location:?}"))?.1.to_owned();
    ensure!(location.starts_with("/ui/chat#key="), "{location}");
    let set = header(&r, "set-cookie").to_owned();
    let cookie = set.split(';').next().unwrap_or("").trim().to_owned();
    Ok((Session { cookie, key }, set))
}

async fn set(home: &TestHome, key: &str, value: &str) -> anyhow::Result<()> {
    home.cli(&["settings", "set", key, value]).await?.ok()?;
    Ok(())
}

/// Waits until `GET url` (with `Host: host` when given) answers `status`: the edge follows a
/// settings change within [`FOLLOW`].
async fn until_status(
    client: &reqwest::Client,
    url: &str,
    host: Option<&str>,
    token: Option<&str>,
    status: u16,
) -> anyhow::Result<()> {
    wait_for(&format!("GET {url} (Host {host:?}) to answer {status}"), FOLLOW, || {
        let mut req = client.get(url);
        if let Some(h) = host {
            req = req.header("Host", h);
        }
        if let Some(t) = token {
            req = req.header("X-Coffer-Token", t);
        }
        async move { Ok((req.reply().await?.status.as_u16() == status).then_some(())) }
    })
    .await
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "remote-test", "version": "1"}}})
}

/// `POST /mcp` initialize at `base` with the token.
async fn mcp_initialize(client: &reqwest::Client, base: &str, token: &str) -> anyhow::Result<Reply> {
    client
        .post(format!("{base}/mcp"))
        .header("X-Coffer-Token", token)
        .header("Accept", "application/json, text/event-stream")
        .json(&initialize())
        .reply()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_host_name_is_refused_until_allowed_then_logs_in_with_the_same_session_rules() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let port = api.port();
    let phone = format!("http://{PHONE}:{port}");
    let c = phone_client();

    // Off by default: the page and a login link opened by the second name are refused, saying
    // what to set; no code can be minted for it.
    let r = c.get(format!("{phone}/ui/chat")).reply().await?;
    let e = r.expect_envelope(403, "FORBIDDEN")?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("ui.allowed_hosts")), "{e}");
    let minted = api.post_json("/v1/ui/login-codes", &json!({})).reply().await?.ok_json()?;
    let url = minted["url"].as_str().context("url")?.replace(&format!("http://127.0.0.1:{port}"), &phone);
    c.get(&url).reply().await?.expect_envelope(403, "FORBIDDEN")?;
    let r = api.post_json("/v1/ui/login-codes", &json!({"host": PHONE})).reply().await?;
    let e = r.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["details"]["field"] == "host" && e["details"]["valid"] == json!([]), "{e}");
    let out = home.cli(&["ui", "--host", PHONE]).await?;
    ensure!(!out.success() && out.stderr.contains("ui.allowed_hosts is empty"), "{out}");

    // Values that are not origins are refused with the reason, through REST and the CLI.
    for bad in ["phone.coffer.test", "https://*.coffer.test", "https://phone.coffer.test/ui", "ftp://phone.coffer.test"]
    {
        let r =
            api.request(Method::PATCH, "/v1/settings").json(&json!({"set": {"ui.allowed_hosts": bad}})).reply().await?;
        let e = r.expect_envelope(400, "INVALID_ARGUMENT").with_context(|| bad.to_owned())?;
        ensure!(e["details"]["problem"] == "bad_value" && e["details"]["key"] == "ui.allowed_hosts", "{bad}: {e}");
    }
    let out = home.cli(&["settings", "set", "ui.bind", "phone.coffer.test:8443"]).await?;
    ensure!(!out.success() && out.stderr.contains("IP address"), "{out}");

    // Allowed: the page answers by that name, and `coffer ui --host` mints a link there.
    set(&home, "ui.allowed_hosts", &phone).await?;
    until_status(&c, &format!("{phone}/ui/chat"), None, None, 200).await?;
    // The page's security headers, but COOP, which a browser ignores (with an error on every
    // page) at a plain-HTTP origin other than loopback.
    let r = c.get(format!("{phone}/ui/chat")).reply().await?;
    ensure!(header(&r, "content-security-policy").contains("default-src 'none'"), "{:?}", r.headers);
    ensure!(header(&r, "cross-origin-opener-policy").is_empty(), "{:?}", r.headers);
    let r = api.get("/ui/chat").reply().await?;
    ensure!(header(&r, "cross-origin-opener-policy") == "same-origin", "loopback keeps it: {:?}", r.headers);
    let link = home.cli(&["ui", "--host", PHONE, "--json"]).await?.ok()?.json()?;
    let url = link["url"].as_str().context("url")?;
    ensure!(url.starts_with(&format!("{phone}/ui/login?code=")), "{link}");
    let (s, set_cookie) = redeem(&c, url, None).await?;
    ensure!(s.cookie.starts_with("coffer_session="), "{set_cookie}");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        ensure!(set_cookie.contains(attr), "{attr}: {set_cookie}");
    }
    ensure!(!set_cookie.contains("Secure") && !set_cookie.contains("Domain"), "plain http: {set_cookie}");
    // Works once, by any name.
    let r = c.get(url).reply().await?;
    ensure!(r.status == 401, "a used link: {} {}", r.status, r.text);

    // The same session rules: cookie and key; a change needs Origin, exactly the allowed one.
    let with = |m: Method, path: &str| {
        c.request(m, format!("{phone}{path}")).header("Cookie", &s.cookie).header("X-Coffer-Session-Key", &s.key)
    };
    let me = with(Method::GET, "/v1/ui/session").reply().await?.ok_json()?;
    ensure!(me["via"] == "cookie", "{me}");
    with(Method::POST, "/v1/ui/stream-tickets").header("Origin", &phone).reply().await?.ok_json()?;
    let r = c.get(format!("{phone}/v1/status")).header("Cookie", &s.cookie).reply().await?;
    r.expect_envelope(401, "UNAUTHORIZED").context("the cookie alone")?;
    let r = with(Method::POST, "/v1/ui/stream-tickets").reply().await?;
    r.expect_envelope(403, "FORBIDDEN").context("no Origin")?;
    for bad in [
        "http://evil.test".to_owned(),
        format!("http://{PHONE}:{port}.evil.test"),
        format!("https://{PHONE}:{port}"),
        format!("http://{PHONE}:{}", port + 1),
        format!("http://{PHONE}"),
        format!("http://evil.{PHONE}:{port}"),
        "null".to_owned(),
    ] {
        let r = with(Method::POST, "/v1/ui/stream-tickets").header("Origin", &bad).reply().await?;
        r.expect_envelope(403, "FORBIDDEN").with_context(|| format!("Origin {bad}"))?;
    }
    // Hostile Host values, sent to the loopback port: only the exact allowed host and port pass.
    let lo = coffer_tests::console::client();
    for bad in [
        PHONE.to_owned(),
        format!("{PHONE}:{}", port + 1),
        format!("evil.{PHONE}:{port}"),
        format!("{PHONE}.evil.test:{port}"),
        format!("{PHONE}.:{port}"),
        format!("{PHONE}:{port}@evil.test"),
        "evil.test".to_owned(),
    ] {
        let r = lo.get(api.url("/ui/chat")).header("Host", &bad).reply().await?;
        r.expect_envelope(403, "FORBIDDEN").with_context(|| format!("Host {bad}"))?;
    }
    let r = lo.get(api.url("/ui/chat")).header("Host", format!("PHONE.Coffer.Test:{port}")).reply().await?;
    ensure!(r.status == 200, "host names are case-insensitive: {}", r.status);

    // The token and /mcp stay loopback-only: by the second name, and through a proxy that
    // rewrote Host to loopback but said so in X-Forwarded-For.
    let r = c.get(format!("{phone}/v1/status")).header("X-Coffer-Token", api.token()).reply().await?;
    let e = r.expect_envelope(403, "FORBIDDEN")?;
    ensure!(e["details"]["reason"] == "remote_api_off", "{e}");
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("ui.remote_api")), "{e}");
    let r = mcp_initialize(&c, &phone, api.token()).await?;
    let e = r.expect_jsonrpc_error_for(403, &json!(1))?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("ui.remote_api")), "{e}");
    let r = api.get("/v1/status").header("X-Forwarded-For", "100.64.0.9").reply().await?;
    r.expect_envelope(403, "FORBIDDEN").context("token through a proxy")?;
    let r = lo.post(api.url("/mcp")).header("Forwarded", "for=100.64.0.9").json(&initialize()).reply().await?;
    ensure!(r.status == 403, "/mcp through a proxy: {} {}", r.status, r.text);
    api.get("/v1/status").reply().await?.ok_json().context("loopback is unaffected")?;
    let r = mcp_initialize(&lo, api.base_url(), api.token()).await?;
    ensure!(r.status == 200, "loopback /mcp: {} {}", r.status, r.text);

    // Opted in: both answer by the second name too.
    set(&home, "ui.remote_api", "1").await?;
    until_status(&c, &format!("{phone}/v1/status"), None, Some(api.token()), 200).await?;
    let r = mcp_initialize(&c, &phone, api.token()).await?;
    ensure!(r.status == 200, "/mcp by the second name, allowed: {} {}", r.status, r.text);
    set(&home, "ui.remote_api", "0").await?;

    // An https:// origin (TLS ended by a proxy in front): a Secure __Host- cookie, and the
    // https Origin only.
    const SECURE: &str = "secure.coffer.test";
    set(&home, "ui.allowed_hosts", &format!("{phone}, https://{SECURE}")).await?;
    until_status(&lo, &api.url("/ui/chat"), Some(SECURE), None, 200).await?;
    let r = lo.get(api.url("/ui/chat")).header("Host", SECURE).reply().await?;
    ensure!(header(&r, "cross-origin-opener-policy") == "same-origin", "https keeps it: {:?}", r.headers);
    let link = home.cli(&["ui", "--host", &format!("https://{SECURE}"), "--json"]).await?.ok()?.json()?;
    let url = link["url"].as_str().context("url")?;
    ensure!(url.starts_with(&format!("https://{SECURE}/ui/login?code=")), "{link}");
    let path = &url[format!("https://{SECURE}").len()..];
    let (s, set_cookie) = redeem(&lo, &api.url(path), Some(SECURE)).await?;
    ensure!(s.cookie.starts_with("__Host-coffer_session="), "{set_cookie}");
    for attr in ["Secure", "HttpOnly", "SameSite=Strict", "Path=/"] {
        ensure!(set_cookie.contains(attr), "{attr}: {set_cookie}");
    }
    let ticket = |origin: &str| {
        lo.post(api.url("/v1/ui/stream-tickets"))
            .header("Host", SECURE)
            .header("Cookie", &s.cookie)
            .header("X-Coffer-Session-Key", &s.key)
            .header("Origin", origin)
    };
    ticket(&format!("https://{SECURE}")).reply().await?.ok_json()?;
    ticket(&format!("http://{SECURE}")).reply().await?.expect_envelope(403, "FORBIDDEN")?;
    Ok(())
}

/// The modules of the QR code `coffer ui --qr` printed (Unicode half blocks, drawn for a dark
/// terminal: a block is a light module), decoded with `rqrr`.
fn decode_qr(text: &str) -> anyhow::Result<String> {
    let rows: Vec<Vec<char>> = text
        .lines()
        .filter(|l| !l.is_empty() && l.chars().all(|c| matches!(c, '█' | '▀' | '▄' | ' ')))
        .map(|l| l.chars().collect())
        .collect();
    ensure!(rows.len() > 10, "no QR code in {text:?}");
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    let scale = 4;
    let light = |x: usize, y: usize| -> bool {
        let c = rows[y / 2].get(x).copied().unwrap_or(' ');
        if y.is_multiple_of(2) { matches!(c, '█' | '▀') } else { matches!(c, '█' | '▄') }
    };
    let mut img = rqrr::PreparedImage::prepare_from_greyscale(width * scale, rows.len() * 2 * scale, |x, y| {
        if light(x / scale, y / scale) { 255 } else { 0 }
    });
    let grids = img.detect_grids();
    ensure!(grids.len() == 1, "{} QR codes found", grids.len());
    let (_, content) = grids[0].decode().map_err(|e| anyhow::anyhow!("decoding the QR code: {e:?}"))?;
    Ok(content)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_qr_codes_link_logs_in_from_the_allowed_host() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let phone = format!("http://{PHONE}:{}", api.port());
    let c = phone_client();

    // No host allowed yet: the link names 127.0.0.1, with a hint that a phone cannot open it.
    let out = home.cli(&["ui", "--qr"]).await?.ok()?;
    ensure!(out.stderr.contains("ui.allowed_hosts is empty"), "{out}");

    set(&home, "ui.allowed_hosts", &format!("{phone} https://other.coffer.test")).await?;
    until_status(&c, &format!("{phone}/ui/chat"), None, None, 200).await?;
    // `--qr` alone takes the first allowed host; no browser is opened (the link is the phone's).
    let out = home.cli(&["ui", "--qr"]).await?.ok()?;
    let printed = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("Open "))
        .and_then(|l| l.split(' ').next())
        .with_context(|| format!("no link printed: {out}"))?
        .to_owned();
    ensure!(printed.starts_with(&format!("{phone}/ui/login?code=")), "{out}");
    ensure!(!out.stderr.contains("Opening it"), "a browser was opened: {out}");
    let decoded = decode_qr(&out.stdout)?;
    ensure!(decoded == printed, "the QR code says {decoded:?}, the text {printed:?}");
    let (s, _) = redeem(&c, &decoded, None).await?;
    let me = c
        .get(format!("{phone}/v1/ui/session"))
        .header("Cookie", &s.cookie)
        .header("X-Coffer-Session-Key", &s.key)
        .reply()
        .await?
        .ok_json()?;
    ensure!(me["via"] == "cookie", "{me}");

    // `--json` carries the link and the same drawing.
    let v = home.cli(&["ui", "--qr", "--host", PHONE, "--json"]).await?.ok()?.json()?;
    let url = v["url"].as_str().context("url")?;
    ensure!(decode_qr(v["qr"].as_str().context("qr")?)? == url, "{v}");
    ensure!(v["expires_in_s"] == 60, "{v}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_bind_answers_only_allowed_hosts_and_doctor_says_what_is_exposed() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    home.start_daemon().await?;
    let report = home.cli(&["doctor", "--json"]).await?.ok()?.json()?;
    let e = doctor_check(&report, "exposure")?;
    ensure!(e["status"] == "ok" && e["message"].as_str().is_some_and(|m| m.starts_with("loopback only")), "{e}");

    // A second listener on another loopback address stands in for a tailnet address.
    let q = coffer_tests::ports::free_port();
    let bind = format!("127.0.0.2:{q}");
    let origin = format!("http://{bind}");
    set(&home, "ui.bind", &bind).await?;
    set(&home, "ui.allowed_hosts", &origin).await?;
    home.cli(&["daemon", "restart"]).await?.ok()?;
    let api = home.api()?;
    let c = coffer_tests::console::client();
    let r = c.get(format!("{origin}/ui/chat")).reply().await?;
    ensure!(r.status == 200, "{origin}: {} {}", r.status, r.text);
    // A client there is not on this machine, whatever Host it claims.
    let port = api.port();
    let r = c.get(format!("{origin}/ui/chat")).header("Host", format!("127.0.0.1:{port}")).reply().await?;
    let e = r.expect_envelope(403, "FORBIDDEN")?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("ui.bind")), "{e}");
    let r = c.get(format!("{origin}/v1/status")).header("X-Coffer-Token", api.token()).reply().await?;
    ensure!(r.expect_envelope(403, "FORBIDDEN")?["details"]["reason"] == "remote_api_off");
    let r = mcp_initialize(&c, &origin, api.token()).await?;
    ensure!(r.status == 403, "/mcp on ui.bind: {} {}", r.status, r.text);
    let link = home.cli(&["ui", "--host", "127.0.0.2", "--json"]).await?.ok()?.json()?;
    let url = link["url"].as_str().context("url")?;
    ensure!(url.starts_with(&format!("{origin}/ui/login?code=")), "{link}");
    redeem(&c, url, None).await?;
    // The loopback port is as before.
    api.get("/v1/status").reply().await?.ok_json()?;

    let report = home.cli(&["doctor", "--json"]).await?.ok()?.json()?;
    let e = doctor_check(&report, "exposure")?;
    let m = e["message"].as_str().unwrap_or("");
    ensure!(e["status"] == "ok", "{e}");
    for part in [
        format!("console also at {origin}"),
        format!("listening beyond loopback on {bind}"),
        "/mcp and the token: loopback only".to_owned(),
    ] {
        ensure!(m.contains(&part), "{part:?} in {m:?}");
    }
    ensure!(doctor_check(&report, "exposure: ui.bind").is_err(), "it answers: {report}");
    ensure!(
        doctor_check(&report, &format!("exposure: {origin}")).is_err(),
        "a loopback address is no network: {report}"
    );

    // Risky: every interface, with the token and /mcp open there (not restarted: nothing answers).
    set(&home, "ui.remote_api", "1").await?;
    let everywhere = format!("0.0.0.0:{}", coffer_tests::ports::free_port());
    set(&home, "ui.bind", &everywhere).await?;
    let out = home.cli(&["doctor"]).await?;
    ensure!(out.code == Some(1), "a failing check: {out}");
    ensure!(out.stdout.contains("listens on every interface and ui.remote_api = 1"), "{out}");
    ensure!(out.stdout.contains("nothing answers on"), "{out}");
    let report = home.cli(&["doctor", "--json"]).await?.json()?;
    let names: Vec<(String, String)> = report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["name"].as_str().is_some_and(|n| n.starts_with("exposure")))
        .map(|c| (c["name"].as_str().unwrap_or("").to_owned(), c["status"].as_str().unwrap_or("").to_owned()))
        .collect();
    let want = [("exposure", "ok"), ("exposure: ui.bind", "fail"), ("exposure: ui.bind", "warn")];
    ensure!(names.iter().map(|(a, b)| (a.as_str(), b.as_str())).eq(want), "{names:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_phone_by_its_tailnet_name_logs_in_in_a_real_browser() -> anyhow::Result<()> {
    use coffer_tests::browser::Browser;
    let home = TestHome::new()?;
    let api: Api = home.start_daemon().await?;
    let phone = format!("http://{PHONE}:{}", api.port());
    set(&home, "ui.allowed_hosts", &phone).await?;
    until_status(&phone_client(), &format!("{phone}/ui/chat"), None, None, 200).await?;

    let rule = format!("--host-resolver-rules=MAP {PHONE} 127.0.0.1");
    let b = Browser::start_with_args(&[&rule]).await?;
    b.set_viewport(390, 844).await?;
    b.set_origin(&phone)?;
    let link = home.cli(&["ui", "--qr", "--json"]).await?.ok()?.json()?;
    let url = link["url"].as_str().context("url")?;
    ensure!(url.starts_with(&phone), "{link}");
    b.goto(url).await?;
    b.wait_for_page("chat").await?;
    b.wait_settled().await?;
    let at = b.current_url().await?;
    ensure!(
        at.host_str() == Some(PHONE) && at.path() == "/ui/chat" && at.fragment().is_none_or(|f| !f.contains("key")),
        "{at}"
    );
    // Signed in by that name: the page's own API calls work (the conversation list loads), and
    // the cookie is that host's alone.
    let cookies = b.cookies().await?;
    ensure!(
        cookies.iter().any(|c| c["name"] == "coffer_session" && c["domain"] == PHONE && c["httpOnly"] == true),
        "{cookies:?}"
    );
    b.goto("/ui/settings").await?;
    b.wait_for_page("settings").await?;
    b.wait_settled().await?;
    b.screenshot("remote-phone-settings").await?;
    b.assert_clean().await;
    Ok(())
}
