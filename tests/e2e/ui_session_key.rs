//! Issue 32 part 1 on a running daemon, over real HTTP: the console's cookie alone is never the
//! owner (cookies are not port-scoped: every local port receives `coffer_session`). Every
//! method on every kind of route, event streams included, refuses the cookie without its
//! session key, with a 401 envelope naming the problem; the cookie with its key works; a
//! stream ticket works once, only with its own session's cookie, only on a `GET`, and never
//! reaches a log. (Ticket expiry is timed in `web_sessions`' unit tests: 30 s.)
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::console::{WebSession, client, login};
use coffer_tests::mcp::register_tiny;
use coffer_tests::{Api, SendExt, TestHome};
use reqwest::Method;
use serde_json::{Value, json};

/// The routes a hostile replay tries: reads, writes of every method, the console's own routes,
/// event streams and `/mcp`. `(method, path, body)`.
fn routes() -> Vec<(Method, &'static str, Option<Value>)> {
    vec![
        (Method::GET, "/v1/status", None),
        (Method::GET, "/v1/mcp/servers", None),
        (Method::GET, "/v1/ui/session", None),
        (Method::GET, "/v1/credentials", None),
        (
            Method::POST,
            "/v1/mcp/servers",
            Some(json!({"name": "evil", "command": "/bin/sh", "args": ["-c", "id > /tmp/coffer-evil"]})),
        ),
        (Method::POST, "/v1/mcp/refresh", None),
        (Method::POST, "/v1/ui/stream-tickets", None),
        (Method::PATCH, "/v1/mcp/servers/tiny", Some(json!({"timeout_ms": 1000}))),
        (Method::PATCH, "/v1/settings", Some(json!({"set": {"ui.login_code_ttl_s": "600"}}))),
        (Method::PUT, "/v1/credentials/evil", Some(json!({"value": "x"}))),
        (Method::DELETE, "/v1/mcp/servers/tiny", None),
        (Method::DELETE, "/v1/ui/sessions", None),
        (Method::GET, "/v1/invocations/events", None),
        (Method::GET, "/v1/conversations/events", None),
        (Method::GET, "/v1/events?list=l", None),
        (Method::POST, "/v1/events/0000", Some(json!({"add": [{"sub": "l", "list": true}]}))),
        (Method::GET, "/v1/logs/gateway?follow=true&n=1", None),
        (Method::GET, "/v1/mcp/servers/tiny/log?follow=true", None),
    ]
}

/// Sends `(method, path, body)` built by `rb`.
async fn send(rb: reqwest::RequestBuilder, body: &Option<Value>) -> anyhow::Result<coffer_tests::Reply> {
    match body {
        Some(b) => rb.json(b).reply().await,
        None => rb.reply().await,
    }
}

/// What the refused requests could have changed (read with the token): servers,
/// credentials, settings.
pub async fn state(api: &Api) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for path in ["/v1/mcp/servers", "/v1/credentials", "/v1/settings"] {
        out.push(api.get(path).reply().await?.ok_json()?);
    }
    Ok(out)
}

/// Nothing the refused requests asked for happened: the state is `before`, no server `evil`,
/// the hostile command never ran, and `session` still signs in.
async fn nothing_happened(api: &Api, session: &WebSession, before: &[Value]) -> anyhow::Result<()> {
    let after = state(api).await?;
    ensure!(after == before, "the state changed: {before:?} → {after:?}");
    ensure!(!after[0].to_string().contains("evil"), "{}", after[0]);
    ensure!(!std::path::Path::new("/tmp/coffer-evil").exists(), "the hostile command ran");
    session.request(api, Method::GET, "/v1/status").reply().await?.ok_json().context("the session was revoked")?;
    Ok(())
}

#[tokio::test]
async fn ui_session_key_the_cookie_alone_is_refused_on_every_method_and_route() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let a = login(&api).await?;
    let b = login(&api).await?;
    let before = state(&api).await?;

    for (method, path, body) in routes() {
        let what = format!("{method} {path}");
        // The cookie (with our Origin) and no key.
        let r = send(a.cookie_only(&api, method.clone(), path), &body).await?;
        let e = r.expect_envelope(401, "UNAUTHORIZED").with_context(|| format!("cookie only: {what}"))?;
        ensure!(e["details"]["reason"] == "session_key_missing", "{what}: {e}");
        let m = e["message"].as_str().unwrap_or_default();
        ensure!(m.contains("session key is missing") && m.contains("coffer ui"), "{what}: {m}");
        ensure!(!r.text.contains(&a.key) && !r.text.contains(&a.cookie[15..]), "{what} echoes a secret");
        // A wrong key, another session's key, the cookie's own value as the key.
        for key in ["0".repeat(64), b.key.clone(), a.cookie[15..].to_owned(), String::new()] {
            let r = send(a.cookie_only(&api, method.clone(), path).header("X-Coffer-Session-Key", &key), &body).await?;
            let e = r.expect_envelope(401, "UNAUTHORIZED").with_context(|| format!("wrong key: {what}"))?;
            ensure!(e["details"]["reason"] == "session_key_wrong", "{what}: {e}");
        }
        // The key without the cookie.
        let rb = client().request(method.clone(), api.url(path)).header("X-Coffer-Session-Key", &a.key);
        send(rb, &body).await?.expect_envelope(401, "UNAUTHORIZED").with_context(|| format!("key only: {what}"))?;
    }
    // `/mcp` refuses the cookie alone in its own wire format.
    let init = json!({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "x", "version": "1"}}});
    let r = a
        .cookie_only(&api, Method::POST, "/mcp")
        .header("Accept", "application/json, text/event-stream")
        .json(&init)
        .reply()
        .await?;
    r.expect_jsonrpc_error_for(401, &json!(7))?;
    // A ticket is for a GET only: on a POST it is no key.
    let t = a.ticket(&api).await?;
    let r = a.cookie_only(&api, Method::POST, &format!("/v1/mcp/refresh?ticket={t}")).reply().await?;
    ensure!(r.expect_envelope(401, "UNAUTHORIZED")?["details"]["reason"] == "session_key_missing", "{}", r.text);
    nothing_happened(&api, &a, &before).await?;

    // With its key, the same session works: reads, streams and writes (with our Origin).
    let r = a.request(&api, Method::GET, "/v1/status").reply().await?.ok_json()?;
    ensure!(r["services"].as_array().is_some_and(|s| s.len() == 5), "{r}");
    let who = a.request(&api, Method::GET, "/v1/ui/session").reply().await?.ok_json()?;
    ensure!(who == json!({"via": "cookie"}), "{who}");
    let r = a.request(&api, Method::POST, "/v1/mcp/refresh").reply().await?;
    ensure!(r.status.is_success(), "{} {}", r.status, r.text);
    let resp = a.request(&api, Method::GET, "/v1/logs/gateway?follow=true&n=1").send().await?;
    ensure!(resp.status() == 200, "a stream with the key: {}", resp.status());
    drop(resp);
    // The token is unchanged, and gets no stream ticket (it needs none).
    api.get("/v1/status").reply().await?.ok_json()?;
    api.post("/v1/ui/stream-tickets").reply().await?.expect_envelope(403, "FORBIDDEN")?;
    Ok(())
}

/// An open event stream: its status and content type checked.
async fn stream(rb: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
    let resp = rb.send().await?;
    ensure!(resp.status() == 200, "stream answered {}", resp.status());
    let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    ensure!(ct.starts_with("text/event-stream"), "content type {ct}");
    Ok(resp)
}

#[tokio::test]
async fn ui_session_key_stream_tickets_work_once_for_their_session_and_are_never_logged() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    let a = login(&api).await?;
    let b = login(&api).await?;
    let mut secrets = vec![a.key.clone(), b.key.clone(), a.cookie[15..].to_owned(), b.cookie[15..].to_owned()];

    // The cookie and a ticket open a stream, as EventSource does (no key, no Origin).
    let t = a.ticket(&api).await?;
    secrets.push(t.clone());
    let by_ticket = |path: &str, s: &WebSession| client().get(api.url(path)).header("Cookie", &s.cookie);
    let mut open = stream(by_ticket(&format!("/v1/invocations/events?ticket={t}"), &a)).await?;
    // Once only.
    let r = by_ticket(&format!("/v1/invocations/events?ticket={t}"), &a).reply().await?;
    ensure!(r.expect_envelope(401, "UNAUTHORIZED")?["details"]["reason"] == "session_key_wrong", "{}", r.text);
    // Bound to its session: another session's cookie cannot use it, and that try burns it.
    let t2 = a.ticket(&api).await?;
    secrets.push(t2.clone());
    by_ticket(&format!("/v1/conversations/events?ticket={t2}"), &b)
        .reply()
        .await?
        .expect_envelope(401, "UNAUTHORIZED")?;
    by_ticket(&format!("/v1/conversations/events?ticket={t2}"), &a)
        .reply()
        .await?
        .expect_envelope(401, "UNAUTHORIZED")?;
    // No cookie: nothing.
    let t3 = a.ticket(&api).await?;
    secrets.push(t3.clone());
    client()
        .get(api.url(&format!("/v1/conversations/events?ticket={t3}")))
        .reply()
        .await?
        .expect_envelope(401, "UNAUTHORIZED")?;
    // The ticket is taken out of the query before the route reads it: a route that refuses
    // unknown parameters still streams.
    let t4 = a.ticket(&api).await?;
    secrets.push(t4.clone());
    let log = stream(by_ticket(&format!("/v1/mcp/servers/tiny/log?follow=true&ticket={t4}&n=5"), &a)).await?;
    drop(log);

    // A revocation ends the stream opened by ticket.
    api.request(Method::DELETE, "/v1/ui/sessions").reply().await?.ok_json()?;
    let ended = tokio::time::timeout(Duration::from_secs(15), async {
        while open.chunk().await?.is_some() {}
        anyhow::Ok(())
    })
    .await;
    ensure!(matches!(ended, Ok(Ok(()))), "the ticket's stream is still open after the revoke: {ended:?}");

    // No secret reached any log: not the tickets (in a query), keys or cookies.
    api.get("/v1/status").reply().await?.ok_json()?;
    let mut stack = vec![home.logs_dir()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir)?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let text = String::from_utf8_lossy(&std::fs::read(&p)?).into_owned();
            for s in &secrets {
                ensure!(!text.contains(s.as_str()), "{} holds a secret {}", p.display(), &s[..8]);
            }
        }
    }
    Ok(())
}

/// A multiplexed event stream (`GET /v1/events`) is its opener's: another session, or the
/// token, changing its subscriptions gets 404 as for a stream that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_session_key_a_multiplexed_stream_is_changed_by_its_opener_only() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let a = login(&api).await?;
    let b = login(&api).await?;
    let t = a.ticket(&api).await?;
    let mut resp = a.cookie_only(&api, Method::GET, &format!("/v1/events?list=l&ticket={t}")).send().await?;
    ensure!(resp.status() == 200, "open: {}", resp.status());
    let mut parser = coffer_types::sse::SseParser::new();
    let mut frames = Vec::new();
    while frames.is_empty() {
        let chunk = tokio::time::timeout(Duration::from_secs(20), resp.chunk()).await??.context("ended")?;
        parser.push(&chunk, &mut frames);
    }
    ensure!(frames[0].event == "hello", "{:?}", frames[0].event);
    let hello: Value = serde_json::from_slice(&frames[0].data)?;
    let id = hello["stream"].as_str().context("stream")?.to_owned();
    let change = json!({"add": [{"sub": "m", "list": true}]});
    let path = format!("/v1/events/{id}");
    b.request(&api, Method::POST, &path).json(&change).reply().await?.expect_envelope(404, "NOT_FOUND")?;
    api.post_json(&path, &change).reply().await?.expect_envelope(404, "NOT_FOUND")?;
    let r = a.request(&api, Method::POST, &path).json(&change).reply().await?.ok_json()?;
    ensure!(r["subscriptions"] == json!(["l", "m"]), "{r}");
    Ok(())
}
