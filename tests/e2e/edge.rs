//! The public edge's wire contracts that need a running daemon: `/v1/health` naming the
//! supervisor's pid, `/v1/status` through the supervisor, the Host check logged with the trace id,
//! body limits before a supervisor call, a gateway restart, the trace id in the supervisor's log,
//! concurrent requests, and HTTP/2 cleartext with prior knowledge (h2c), where the Host check
//! reads the `:authority` pseudo-header. The rest of the contract (token, Origin, 404/405
//! envelopes, a fresh trace id on every response) is tested in process:
//! `tests/inproc/edge_contract.rs`.
use std::collections::HashSet;
use std::time::Duration;

use anyhow::Context;
use coffer_tests::{Api, Reply, SendExt, TestHome};
use reqwest::{Method, RequestBuilder, Version};
use serde_json::json;

async fn daemon() -> anyhow::Result<(TestHome, Api)> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    Ok((home, api))
}

#[tokio::test]
async fn health_needs_no_token() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    let r = api.anon(Method::GET, "/v1/health").reply().await?;
    r.trace_id()?;
    let body = r.ok_json()?;
    assert_eq!(body["pid"], home.daemon_info()?.pid);
    assert_eq!(body["version"], coffer_runtime::VERSION);
    // Only GET /v1/health is open: nothing else under /v1 or /mcp.
    for (m, path) in [
        (Method::GET, "/v1/status"),
        (Method::POST, "/v1/daemon/stop"),
        (Method::POST, "/v1/health"),
        (Method::GET, "/v1/health/x"),
    ] {
        let r = api.anon(m.clone(), path).reply().await?;
        r.expect_envelope(401, "UNAUTHORIZED").with_context(|| format!("{m} {path}"))?;
    }
    Ok(())
}

#[tokio::test]
async fn bearer_token_works() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let r = api.anon(Method::GET, "/v1/status").bearer_auth(api.token()).reply().await?;
    r.trace_id()?;
    let body = r.ok_json()?;
    assert_eq!(body["services"].as_array().map(Vec::len), Some(5), "{body}");
    Ok(())
}

#[tokio::test]
async fn foreign_host_is_403_and_logged_with_the_trace_id() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    let other_port = format!("127.0.0.1:{}", api.port() + 1);
    for host in ["evil.com", "evil.com:80", other_port.as_str(), "127.0.0.1.evil.com"] {
        // Even the open health route and a valid token do not help (DNS rebinding).
        for path in ["/v1/health", "/v1/status"] {
            let r = api.get(path).header("Host", host).reply().await?;
            r.expect_envelope(403, "FORBIDDEN").with_context(|| format!("Host {host} {path}"))?;
        }
    }
    let r = api.post("/mcp").header("Host", "evil.com").body("{}").reply().await?;
    r.expect_jsonrpc_error(403)?;
    // A second Host (here after the loopback one that `raw` sends) is refused, whatever it says.
    for second in ["evil.com", "127.0.0.1"] {
        let r = api.raw("GET", "/v1/status", &[("Host", second.to_owned())], b"").await?;
        r.expect_envelope(400, "BAD_REQUEST").with_context(|| format!("second Host {second}"))?;
    }

    // The refusal is logged inside the request's span, so the trace id finds it.
    let r = api.get("/v1/status").header("Host", "evil.com").reply().await?;
    let trace = r.trace_id()?.to_owned();
    let line = home
        .wait_for_log_line("gateway", &[&format!("trace_id={trace}"), "Host is not loopback"], Duration::from_secs(5))
        .await?;
    assert!(!line.contains(api.token()), "the token is never logged: {line}");
    Ok(())
}

/// The body limits (`/v1` 2 MiB, `/mcp` 16 MiB) apply before any handler runs: a request that
/// declares a larger body is refused on its headers alone, in the route's wire format. (The
/// requests are written by hand and send no body: a client that writes a large body which the
/// server refuses early may see a broken pipe instead of the response.)
#[tokio::test]
async fn body_over_the_limit_is_413_before_the_handler() -> anyhow::Result<()> {
    const REST_LIMIT: usize = 2 * 1024 * 1024;
    const MCP_LIMIT: usize = 16 * 1024 * 1024;
    let (_home, api) = daemon().await?;
    let before = api.service("store").await?;
    let len = |n: usize| [("Content-Type", "application/json".to_owned()), ("Content-Length", n.to_string())];

    // A POST route that exists and ignores its body: the oversized request must not restart the store.
    let r = api.raw("POST", "/v1/daemon/services/store/restart", &len(REST_LIMIT + 1), b"").await?;
    let err = r.expect_envelope(413, "PAYLOAD_TOO_LARGE")?;
    assert_eq!(err["details"]["limit_bytes"], REST_LIMIT, "{err}");
    assert_eq!(err["message"], "request body is larger than the limit (2 MiB)", "{err}");
    let after = api.service("store").await?;
    assert_eq!((&after["pid"], &after["restarts"]), (&before["pid"], &before["restarts"]), "the handler did not run");

    // Exactly at the limit the handler runs (and answers 404 for an unknown service).
    let r = api.raw("POST", "/v1/daemon/services/nope/restart", &len(REST_LIMIT), b"").await?;
    r.expect_envelope(404, "NOT_FOUND")?;

    // /mcp: 16 MiB, and the error is a JSON-RPC object.
    let r = api.raw("POST", "/mcp", &len(MCP_LIMIT + 1), b"{").await?;
    let err = r.expect_jsonrpc_error(413)?;
    assert_eq!(err["code"], -32600, "invalid request: {err}");
    assert_eq!(err["message"], "request body is larger than the limit (16 MiB)", "{err}");
    Ok(())
}

/// The gateway can restart itself over REST: 202 at once, then it comes back on the same port.
#[tokio::test]
async fn gateway_restarts_itself_on_request() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let before = api.service("gateway").await?;
    let r = api.post("/v1/daemon/services/gateway/restart").reply().await?;
    assert_eq!(r.status, 202, "{}", r.text);
    let fresh = coffer_tests::Api::new(api.port(), api.token());
    let after = coffer_tests::wait_for("the gateway to come back", Duration::from_secs(15), || async {
        let s = fresh.service("gateway").await?;
        Ok((s["state"] == "healthy" && s["pid"] != before["pid"]).then_some(s))
    })
    .await?;
    assert!(after["restarts"].as_u64() >= Some(1), "{after}");
    Ok(())
}

/// The trace id crosses the process boundary: `POST /v1/daemon/stop` makes the edge call the
/// supervisor's control RPC, which logs inside a span carrying the same id.
#[tokio::test]
async fn trace_id_reaches_the_supervisor_log() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    let r = api.post("/v1/daemon/stop").reply().await?;
    assert_eq!(r.status, 202, "{}", r.text);
    let trace = r.trace_id()?.to_owned();
    home.wait_for_log_line("daemon", &[&format!("trace_id={trace}"), "Stop requested"], Duration::from_secs(5)).await?;
    home.wait_no_processes(Duration::from_secs(15)).await?;
    assert!(!home.daemon_json_path().exists(), "daemon.json removed after stop");
    Ok(())
}

#[tokio::test]
async fn fifty_concurrent_status_requests_succeed() -> anyhow::Result<()> {
    let (_home, api) = daemon().await?;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let api = api.clone();
        set.spawn(async move { api.get("/v1/status").reply().await });
    }
    let mut ids = HashSet::new();
    while let Some(r) = set.join_next().await {
        let r = r??;
        let body = r.ok_json()?;
        assert_eq!(body["services"].as_array().map(Vec::len), Some(5));
        ids.insert(r.trace_id()?.to_owned());
    }
    assert_eq!(ids.len(), 50, "distinct trace ids");
    Ok(())
}

/// A foreign name that resolves to loopback, as a DNS-rebinding page's would.
const REBIND_HOST: &str = "rebind.example";

/// A client that speaks HTTP/2 cleartext with prior knowledge (no upgrade), with
/// [`REBIND_HOST`] resolving to the daemon's loopback port.
fn h2_client(port: u16) -> anyhow::Result<reqwest::Client> {
    coffer_runtime::tls::ensure_provider();
    Ok(reqwest::Client::builder()
        .http2_prior_knowledge()
        .no_proxy()
        .resolve(REBIND_HOST, format!("127.0.0.1:{port}").parse()?)
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .build()?)
}

/// Sends `rb` and reads the response, requiring that it came over HTTP/2.
async fn h2_reply(rb: RequestBuilder) -> anyhow::Result<Reply> {
    let resp = rb.send().await.context("sending the HTTP/2 request")?;
    anyhow::ensure!(resp.version() == Version::HTTP_2, "answered over {:?}, not HTTP/2", resp.version());
    Reply::read(resp).await
}

/// Stops the daemon while the test's runtime still runs: the client's idle HTTP/2 connection
/// must answer the gateway's graceful GOAWAY/PING, which it cannot do while `TestHome`'s
/// blocking `Drop` holds the runtime (the gateway would then wait out its grace period).
async fn stop(home: &TestHome) -> anyhow::Result<()> {
    home.terminate_daemon(Duration::from_secs(15)).await
}

fn initialize_body() -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "e2e-edge-h2", "version": "1"},
    }})
}

/// h2c with prior knowledge works: there is no Host header, and the loopback `:authority`
/// passes the Host check, for `/v1` and `/mcp` alike.
#[tokio::test]
async fn edge_h2c_prior_knowledge_with_loopback_authority_is_served() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    let h2 = h2_client(api.port())?;
    let base = format!("http://127.0.0.1:{}", api.port());

    let r = h2_reply(h2.get(format!("{base}/v1/status")).header("X-Coffer-Token", api.token())).await?;
    r.trace_id()?;
    let body = r.ok_json()?;
    assert_eq!(body["services"].as_array().map(Vec::len), Some(5), "{body}");

    // Still authenticated over HTTP/2.
    h2_reply(h2.get(format!("{base}/v1/status"))).await?.expect_envelope(401, "UNAUTHORIZED")?;

    let r = h2_reply(
        h2.post(format!("{base}/mcp"))
            .header("X-Coffer-Token", api.token())
            .header("Accept", "application/json, text/event-stream")
            .json(&initialize_body()),
    )
    .await?;
    assert_eq!(r.status, 200, "initialize over HTTP/2: {}", r.text);
    assert!(r.text.contains("protocolVersion"), "initialize answered with a result: {}", r.text);
    stop(&home).await
}

/// DNS rebinding over HTTP/2: a foreign name in `:authority` (no Host header) is refused with the
/// `/v1` envelope even with a valid token, and the refusal logs the authority it checked.
#[tokio::test]
async fn edge_h2c_foreign_authority_is_403() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    let h2 = h2_client(api.port())?;
    let foreign = format!("http://{REBIND_HOST}:{}", api.port());

    for path in ["/v1/health", "/v1/status"] {
        let r = h2_reply(h2.get(format!("{foreign}{path}")).header("X-Coffer-Token", api.token())).await?;
        r.expect_envelope(403, "FORBIDDEN").with_context(|| format!("{REBIND_HOST} {path}"))?;
    }

    let r = h2_reply(h2.get(format!("{foreign}/v1/status")).header("X-Coffer-Token", api.token())).await?;
    let trace = r.trace_id()?.to_owned();
    let line = home
        .wait_for_log_line(
            "gateway",
            &[&format!("trace_id={trace}"), "Host is not loopback", REBIND_HOST],
            Duration::from_secs(5),
        )
        .await?;
    assert!(!line.contains(api.token()), "the token is never logged: {line}");
    stop(&home).await
}

/// `/mcp` over HTTP/2 with a foreign `:authority`: `initialize` is refused in `/mcp`'s own wire
/// format, a JSON-RPC error object with id null.
#[tokio::test]
async fn edge_h2c_mcp_initialize_with_foreign_authority_is_a_jsonrpc_403() -> anyhow::Result<()> {
    let (home, api) = daemon().await?;
    let h2 = h2_client(api.port())?;
    let r = h2_reply(
        h2.post(format!("http://{REBIND_HOST}:{}/mcp", api.port()))
            .header("X-Coffer-Token", api.token())
            .header("Accept", "application/json, text/event-stream")
            .json(&initialize_body()),
    )
    .await?;
    // The refusal carries the request's id, which was readable (JSON-RPC 2.0 §5).
    r.expect_jsonrpc_error_for(403, &json!(1))?;
    stop(&home).await
}
