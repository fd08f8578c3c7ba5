//! The chat routes' edge on a running daemon: what the edge itself refuses before any call to
//! `coffer-chat` (foreign Host/Origin, no token, malformed or oversized bodies, unknown fields,
//! bad parameters and headers), that a 1 MiB message is not stopped by the body limit, and the
//! CLI's usage errors and exit codes for `coffer chat`.
use anyhow::Context;
use coffer_tests::{SendExt, TestHome};
use reqwest::Method;
use serde_json::{Value, json};

const ID: &str = "01JDQ8ZKXW5T3M2N4P6R7S8T9V";

#[tokio::test]
async fn chat_routes_refuse_hostile_requests_before_the_chat_service() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let conv = format!("/v1/conversations/{ID}");
    let messages = format!("{conv}/messages");
    let events = format!("{conv}/events");
    let routes: Vec<(Method, String)> = vec![
        (Method::GET, "/v1/agents".into()),
        (Method::GET, "/v1/conversations".into()),
        (Method::POST, "/v1/conversations".into()),
        (Method::GET, conv.clone()),
        (Method::PATCH, conv.clone()),
        (Method::DELETE, conv.clone()),
        (Method::GET, messages.clone()),
        (Method::POST, messages.clone()),
        (Method::PUT, format!("{conv}/pending")),
        (Method::POST, format!("{conv}/interrupt")),
        (Method::GET, events.clone()),
    ];
    // DNS rebinding and cross-site requests, and no token: refused on every chat route.
    for (m, path) in &routes {
        let what = || format!("{m} {path}");
        api.request(m.clone(), path)
            .header("Host", "evil.com")
            .reply()
            .await?
            .expect_envelope(403, "FORBIDDEN")
            .with_context(what)?;
        api.request(m.clone(), path)
            .header("Origin", "http://evil.com")
            .reply()
            .await?
            .expect_envelope(403, "FORBIDDEN")
            .with_context(what)?;
        api.anon(m.clone(), path).reply().await?.expect_envelope(401, "UNAUTHORIZED").with_context(what)?;
    }

    // Bodies: malformed JSON, not JSON at all, the wrong shape, unknown fields.
    let post = |path: &str, body: &'static str| {
        api.request(Method::POST, path).header("Content-Type", "application/json").body(body)
    };
    post(&messages, "{\"text\": ").reply().await?.expect_envelope(400, "BAD_REQUEST")?;
    post("/v1/conversations", "not json").reply().await?.expect_envelope(400, "BAD_REQUEST")?;
    api.request(Method::POST, &messages)
        .header("Content-Type", "text/plain")
        .body("hello")
        .reply()
        .await?
        .expect_envelope(415, "UNSUPPORTED_MEDIA_TYPE")?;
    let e = post(&messages, "[\"hello\"]").reply().await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    assert!(e["message"].as_str().unwrap_or("").contains("JSON object"), "{e}");
    let e = post(&messages, "{}").reply().await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["details"]["field"], "text", "{e}");
    let e = post(&messages, "{\"text\": 42}").reply().await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["message"], "field \"text\" must be a string, not an integer");
    let e = post(&messages, "{\"text\": \"hi\", \"source\": \"web\"}")
        .reply()
        .await?
        .expect_envelope(400, "UNKNOWN_FIELD")?;
    assert_eq!(e["details"]["field"], "source");
    let e = post("/v1/conversations", "{\"agent_key\": \"claude_code\", \"agent_config\": {\"session_id\": \"s\"}}")
        .reply()
        .await?
        .expect_envelope(400, "UNKNOWN_FIELD")?;
    assert_eq!(e["details"]["field"], "agent_config.session_id", "the agent's session is not the caller's to set: {e}");
    let e = api
        .request(Method::PUT, &format!("{conv}/pending"))
        .json(&json!({"items": [{"text": "a"}, {"id": "x"}]}))
        .reply()
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["details"]["field"], "items[1].text", "{e}");
    let e =
        api.request(Method::PATCH, &conv).json(&json!({})).reply().await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    assert!(e["message"].as_str().unwrap_or("").contains("nothing to change"), "{e}");
    let e = api
        .request(Method::PATCH, &conv)
        .header("If-Match", "W/\"3\"")
        .json(&json!({"title": "x"}))
        .reply()
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["details"]["header"], "If-Match", "{e}");

    // Over the body limit: 413 naming the limit (this route's is 56 MiB, for attached files as
    // base64; the others' 2 MiB).
    // The declared length alone is refused (a client writing the whole body may see the
    // connection close under it instead).
    let declared = (56 * 1024 * 1024 + 1).to_string();
    let headers = [("Content-Type", "application/json".to_owned()), ("Content-Length", declared)];
    let e = api.raw("POST", &messages, &headers, b"{\"text\": \"").await?.expect_envelope(413, "PAYLOAD_TOO_LARGE")?;
    assert_eq!(e["details"]["limit_bytes"], 56 * 1024 * 1024);
    let declared = (2 * 1024 * 1024 + 1).to_string();
    let headers = [("Content-Type", "application/json".to_owned()), ("Content-Length", declared)];
    let e =
        api.raw("PUT", &format!("{conv}/pending"), &headers, b"{").await?.expect_envelope(413, "PAYLOAD_TOO_LARGE")?;
    assert_eq!(e["details"]["limit_bytes"], 2 * 1024 * 1024, "other routes keep 2 MiB");
    // A 1 MiB message passes the edge: whatever answers now is the chat service, not the limit.
    let mib = json!({"text": "x".repeat(1024 * 1024)});
    let r = api.request(Method::POST, &messages).json(&mib).reply().await?;
    assert!(r.status != 413 && r.status != 400, "a 1 MiB message must reach the chat service: {} {}", r.status, r.text);

    // Parameters and resumption headers.
    for path in [
        "/v1/conversations?archived=yes",
        "/v1/conversations?limit=0",
        "/v1/conversations?limit=201",
        "/v1/conversations?sort=x",
    ] {
        let e =
            api.get(path).reply().await?.expect_envelope(400, "INVALID_ARGUMENT").with_context(|| path.to_owned())?;
        assert!(e["details"].get("parameter").is_some(), "{path}: {e}");
    }
    let e = api.get(&format!("{events}?after=-1")).reply().await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["details"]["parameter"], "after");
    let e =
        api.get(&events).header("Last-Event-ID", "seven").reply().await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["details"]["header"], "Last-Event-ID");
    let e = api.get(&format!("{messages}?after=a&cursor=b")).reply().await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["details"]["parameter"], "cursor");
    Ok(())
}

#[tokio::test]
async fn chat_cli_usage_errors_exit_2_with_an_envelope() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    for args in [
        &["chat", "new", "hello", "--json"][..],
        &["chat", "send", ID, "--json"],
        &["chat", "list", "--archived", "--all", "--json"],
        &["chat", "pending", ID, "--resume", "--clear", "--json"],
        &["chat", "rename", ID, "--json"],
    ] {
        let out = home.cli(args).await?;
        assert_eq!(out.code, Some(2), "{out}");
        let env: Value = out.json()?;
        assert_eq!(env["error"]["code"], "INVALID_ARGUMENT", "{out}");
    }
    // Nothing above needed a daemon, so none was started.
    assert!(home.daemon_processes().is_empty(), "a usage error started the daemon");
    Ok(())
}
