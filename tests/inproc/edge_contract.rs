//! The public edge's wire contracts, in process: authentication, the Origin and Host checks,
//! error formats (`/v1` envelope, `/mcp` JSON-RPC), and `X-Coffer-Trace` on every response.
//! (`tests/e2e/edge.rs` keeps what needs the daemon: the supervisor's pid and status, log
//! lines, the body limit before a supervisor call, HTTP/2 cleartext, a gateway restart.)
use std::collections::HashSet;

use anyhow::Context;
use coffer_tests::SendExt;
use coffer_tests::inproc::Edge;
use reqwest::Method;

#[tokio::test]
async fn missing_or_wrong_token_is_401() -> anyhow::Result<()> {
    let edge = Edge::start().await?;
    let api = edge.api();
    let r = api.anon(Method::GET, "/v1/status").reply().await?;
    r.expect_envelope(401, "UNAUTHORIZED")?;
    assert!(r.headers.contains_key("www-authenticate"), "401 names the scheme: {:?}", r.headers);

    let wrong = "0".repeat(64);
    let attempts = [
        api.anon(Method::GET, "/v1/status").header("X-Coffer-Token", &wrong),
        api.anon(Method::GET, "/v1/status").header("X-Coffer-Token", &api.token()[..63]),
        api.anon(Method::GET, "/v1/status").header("X-Coffer-Token", format!("{}0", api.token())),
        api.anon(Method::GET, "/v1/status").header("X-Coffer-Token", ""),
        api.anon(Method::GET, "/v1/status").header("Authorization", format!("Bearer {wrong}")),
        api.anon(Method::GET, "/v1/status").header("Authorization", format!("Basic {}", api.token())),
        api.anon(Method::GET, "/v1/status").header("Authorization", api.token()),
    ];
    for (i, rb) in attempts.into_iter().enumerate() {
        rb.reply().await?.expect_envelope(401, "UNAUTHORIZED").with_context(|| format!("attempt {i}"))?;
    }

    // /mcp answers in its own wire format: a JSON-RPC error object with id null.
    let r = api.anon(Method::POST, "/mcp").header("Content-Type", "application/json").body("{}").reply().await?;
    r.expect_jsonrpc_error(401)?;
    Ok(())
}

#[tokio::test]
async fn foreign_origin_is_403_and_own_origin_is_allowed() -> anyhow::Result<()> {
    let edge = Edge::start().await?;
    let api = edge.api();
    let port = api.port();
    let foreign = [
        "http://evil.com".to_owned(),
        "null".to_owned(),
        format!("https://127.0.0.1:{port}"),
        format!("http://127.0.0.1:{}", port + 1),
        format!("http://127.0.0.1:{port}.evil.com"),
        format!("http://evil.com:{port}"),
    ];
    for origin in &foreign {
        let r = api.get("/v1/status").header("Origin", origin).reply().await?;
        r.expect_envelope(403, "FORBIDDEN").with_context(|| format!("Origin {origin}"))?;
    }
    let r = api.post("/mcp").header("Origin", "http://evil.com").body("{}").reply().await?;
    r.expect_jsonrpc_error(403)?;

    // Allowed: answered by the handler (`/v1/settings` reads the store; `/v1/status` would ask
    // the supervisor, which does not run in process).
    for origin in [format!("http://127.0.0.1:{port}"), format!("http://localhost:{port}")] {
        let r = api.get("/v1/settings").header("Origin", &origin).reply().await?;
        r.trace_id()?;
        r.ok_json().with_context(|| format!("Origin {origin}"))?;
    }
    // Host may be any loopback name with our port.
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}"), "localhost".to_owned()] {
        api.get("/v1/settings")
            .header("Host", &host)
            .reply()
            .await?
            .ok_json()
            .with_context(|| format!("Host {host}"))?;
    }
    Ok(())
}

#[tokio::test]
async fn unknown_route_is_404_envelope() -> anyhow::Result<()> {
    let edge = Edge::start().await?;
    let api = edge.api();
    for (m, path) in
        [(Method::GET, "/v1/nope"), (Method::GET, "/nope"), (Method::DELETE, "/v1/health/extra"), (Method::POST, "/v1")]
    {
        let r = api.request(m.clone(), path).reply().await?;
        let err = r.expect_envelope(404, "NOT_FOUND").with_context(|| format!("{m} {path}"))?;
        assert!(err["message"].as_str().is_some_and(|s| s.contains(path)), "message names the path: {err}");
    }
    Ok(())
}

#[tokio::test]
async fn wrong_method_is_405_envelope() -> anyhow::Result<()> {
    let edge = Edge::start().await?;
    let api = edge.api();
    for (m, path) in [(Method::PUT, "/v1/status"), (Method::DELETE, "/v1/daemon/stop"), (Method::POST, "/v1/health")] {
        let r = api.request(m.clone(), path).reply().await?;
        r.expect_envelope(405, "METHOD_NOT_ALLOWED").with_context(|| format!("{m} {path}"))?;
        assert!(r.headers.contains_key("allow"), "{m} {path}: 405 names the allowed methods: {:?}", r.headers);
    }
    Ok(())
}

#[tokio::test]
async fn every_response_carries_a_fresh_trace_id() -> anyhow::Result<()> {
    let edge = Edge::start().await?;
    let api = edge.api();
    let requests = vec![
        api.anon(Method::GET, "/v1/health"),
        api.get("/v1/health"),
        api.get("/v1/status"),
        api.anon(Method::GET, "/v1/status"),
        api.get("/v1/missing"),
        api.get("/v1/status").header("Host", "evil.com"),
        api.get("/v1/status").header("Origin", "http://evil.com"),
        api.post("/v1/daemon/services/nope/restart"),
        api.request(Method::PUT, "/v1/status"),
        api.post("/mcp").body("{}"),
        api.anon(Method::POST, "/mcp").body("{}"),
    ];
    let mut seen = HashSet::new();
    for (i, rb) in requests.into_iter().enumerate() {
        let r = rb.reply().await?;
        let id = r.trace_id().with_context(|| format!("request {i} ({})", r.status))?;
        assert!(seen.insert(id.to_owned()), "trace id {id} reused");
    }
    Ok(())
}
