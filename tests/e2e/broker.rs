//! The tool broker end to end: a real daemon's `ToolBroker` called over gRPC with the chat
//! service's own token (read from its environment in `/proc`): lists, calls of a registered
//! upstream, a policy refusal, the invocation rows with the actor, explicit close and idle
//! reaping with no upstream child left, a caller the table refuses, malformed input; and REST's
//! `/v1/tools*` on the same path.
use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_proto::gateway::tool_broker_client::ToolBrokerClient;
use coffer_proto::gateway::{
    BrokerError, CallReply, CallToolRequest, CloseSessionRequest, GetPromptRequest, ListRequest, ReadResourceRequest,
    call_reply,
};
use coffer_runtime::grpc::AuthChannel;
use coffer_tests::mcp::{register_tiny, set_tool_enabled};
use coffer_tests::{Api, SendExt, TestHome, procs, wait_for};
use prost::Message;
use secrecy::SecretString;
use serde_json::{Value, json};

/// The environment the supervisor gave service `name` (read from `/proc`).
async fn service_env(api: &Api, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let pid = api.service(name).await?["pid"].as_i64().context("pid")? as i32;
    let env = procs::environ(pid);
    ensure!(!env.is_empty(), "cannot read the environment of {name} (pid {pid})");
    Ok(env)
}

/// A broker client presenting service `name`'s own token, as that service would.
async fn client_as(api: &Api, name: &str) -> anyhow::Result<ToolBrokerClient<AuthChannel>> {
    let env = service_env(api, name).await?;
    let token = SecretString::from(env.get("COFFER_INTERNAL_TOKEN").context("COFFER_INTERNAL_TOKEN")?.clone());
    let addr = env.get("COFFER_GATEWAY_GRPC_ADDR").context("COFFER_GATEWAY_GRPC_ADDR")?;
    Ok(ToolBrokerClient::new(coffer_runtime::grpc::channel(addr, &token)?)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(64 << 20))
}

fn list(actor: &str, key: &str) -> ListRequest {
    ListRequest { actor: actor.into(), session_key: key.into() }
}

fn call(actor: &str, key: &str, name: &str, arguments: Value) -> CallToolRequest {
    CallToolRequest {
        actor: actor.into(),
        session_key: key.into(),
        name: name.into(),
        arguments_json: arguments.to_string(),
    }
}

fn result(reply: &CallReply) -> anyhow::Result<Value> {
    match &reply.answer {
        Some(call_reply::Answer::ResultJson(r)) => Ok(serde_json::from_str(r)?),
        other => anyhow::bail!("not a result: {other:?}"),
    }
}

fn tiny_pids(home: &TestHome) -> Vec<i32> {
    home.processes().into_iter().filter(|p| p.name == "coffer-tiny-upstream").map(|p| p.pid).collect()
}

async fn wait_tiny_count(home: &TestHome, what: &str, n: usize) -> anyhow::Result<()> {
    wait_for(what, Duration::from_secs(20), || async { Ok((tiny_pids(home).len() == n).then_some(())) }).await
}

async fn set_broker_idle_s(api: &Api, seconds: u64) -> anyhow::Result<()> {
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"gateway.broker_idle_timeout_s": seconds.to_string()}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    Ok(())
}

async fn invocations(api: &Api, query: &str) -> anyhow::Result<Vec<Value>> {
    let v = api.get(&format!("/v1/invocations?{query}")).reply().await?.ok_json()?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

#[tokio::test]
async fn chat_lists_and_calls_through_the_broker_under_policy_with_its_actor_logged() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    set_broker_idle_s(&api, 3600).await?;
    register_tiny(&api, "tiny", json!({})).await?;
    // The capability catalog lists a new server once in the background; wait for that start to
    // end, so the children counted below are the broker session's own.
    coffer_tests::mcp::wait_listed(&api, "tiny").await?;
    let mut chat = client_as(&api, "chat").await?;
    ensure!(tiny_pids(&home).is_empty(), "nothing started yet");

    // Lists: answered from the capability catalog; the session's own upstream starts lazily,
    // on the first call.
    let tools = chat.list_tools(list("agent", "conv-1")).await?.into_inner();
    let names: Vec<&str> = tools.items.iter().map(|t| t.name.as_str()).collect();
    ensure!(names.contains(&"tiny__echo") && names.contains(&"coffer__search_tools"), "{names:?}");
    let echo = tools.items.iter().find(|t| t.name == "tiny__echo").context("tiny__echo")?;
    assert_eq!((echo.server.as_str(), echo.original_name.as_str()), ("tiny", "echo"));
    let definition: Value = serde_json::from_str(&echo.definition_json)?;
    assert_eq!(definition["description"], "Echoes the message");
    ensure!(tiny_pids(&home).is_empty(), "a list starts no upstream");

    // A call: the upstream's result, verbatim, from the session's own upstream.
    let reply = chat.call_tool(call("agent", "conv-1", "tiny__echo", json!({"message": "via broker"}))).await?;
    let reply = reply.into_inner();
    assert_eq!(result(&reply)?, json!({"content": [{"type": "text", "text": "via broker"}]}));
    assert_eq!(tiny_pids(&home).len(), 1, "one child for the broker session");
    assert_eq!(reply.session_id, tools.session_id, "one session per key");

    // Prompts and resources through the same session.
    let prompts = chat.list_prompts(list("agent", "conv-1")).await?.into_inner();
    ensure!(prompts.items.iter().any(|p| p.name == "tiny__greet"), "{:?}", prompts.items);
    let prompt = chat
        .get_prompt(GetPromptRequest {
            actor: "agent".into(),
            session_key: "conv-1".into(),
            name: "tiny__greet".into(),
            arguments_json: json!({"who": "x"}).to_string(),
        })
        .await?
        .into_inner();
    assert_eq!(result(&prompt)?["messages"][0]["content"]["text"], "hello");
    let resources = chat.list_resources(list("agent", "conv-1")).await?.into_inner();
    let doc = resources.items.iter().find(|r| r.original_name == "tiny://doc/1").context("the resource")?;
    assert_eq!(doc.name, "coffer://tiny/tiny://doc/1");
    let read = chat
        .read_resource(ReadResourceRequest {
            actor: "agent".into(),
            session_key: "conv-1".into(),
            uri: doc.name.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(result(&read)?["contents"][0]["text"], "doc one");
    assert_eq!(tiny_pids(&home).len(), 1, "still the session's one child");

    // A policy refusal: a disabled tool is FAILED_PRECONDITION with the MCP code.
    set_tool_enabled(&api, "tiny__add", false).await?;
    let e = chat.call_tool(call("agent", "conv-1", "tiny__add", json!({"a": 1, "b": 2}))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert_eq!(e.message(), "TOOL_DISABLED (MCP -32000): Tool tiny__add is disabled");
    let details = BrokerError::decode(e.details())?;
    assert_eq!((details.mcp_code, details.code.as_str()), (-32000, "TOOL_DISABLED"));
    assert_eq!(serde_json::from_str::<Value>(&details.data_json)?["server"], "tiny");
    let e = chat.call_tool(call("agent", "conv-1", "tiny__nope", json!({}))).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::NotFound, "NOT_FOUND (MCP -32602): Unknown tool \"tiny__nope\""));

    // A channel's own session records its own actor.
    let other = chat.call_tool(call("channel:telegram", "chat-42", "tiny__echo", json!({"message": "x"}))).await?;
    let other = other.into_inner();
    assert_ne!(other.session_id, reply.session_id);
    // Two sessions that called a tool by now, each with its own child: conv-1 and chat-42. (REST's
    // `api` session, which toggled tiny__add, found it in the capability catalog and started
    // none: only a call starts a session's upstream.)
    assert_eq!(tiny_pids(&home).len(), 2, "each broker session has its own child");

    // REST's tool call takes the same path, recorded as `api` (`cli` from the CLI).
    let r = api.post_json("/v1/tools/call", &json!({"name": "tiny__echo", "arguments": {"message": "rest"}}));
    assert_eq!(r.reply().await?.ok_json()?["content"][0]["text"], "rest");
    let out = home.cli(&["tools", "call", "tiny__echo", "--args", r#"{"message":"cli"}"#]).await?;
    ensure!(out.success(), "{out}");

    // The invocation log: each row names its actor and broker session, never the arguments.
    let rows = wait_for("the broker's invocations to be written", Duration::from_secs(10), || async {
        let rows = invocations(&api, "actor=agent").await?;
        Ok((rows.len() >= 5).then_some(rows))
    })
    .await?;
    ensure!(rows.iter().all(|r| r["actor"] == "agent" && r["session_id"] == reply.session_id.as_str()), "{rows:?}");
    let by_target: BTreeMap<&str, &str> =
        rows.iter().map(|r| (r["target"].as_str().unwrap_or(""), r["outcome"].as_str().unwrap_or(""))).collect();
    assert_eq!(by_target.get("tiny__echo"), Some(&"ok"), "{rows:?}");
    assert_eq!(by_target.get("tiny__add"), Some(&"disabled"), "{rows:?}");
    assert_eq!(by_target.get("tiny__nope"), Some(&"invalid"), "{rows:?}");
    assert_eq!(by_target.get("tiny__greet"), Some(&"ok"), "{rows:?}");
    assert_eq!(by_target.get("coffer://tiny/tiny://doc/1"), Some(&"ok"), "{rows:?}");
    ensure!(!serde_json::to_string(&rows)?.contains("via broker"), "arguments never stored");
    let channel = wait_for("the channel's row", Duration::from_secs(10), || async {
        let rows = invocations(&api, "actor=channel:telegram").await?;
        Ok((!rows.is_empty()).then_some(rows))
    })
    .await?;
    assert_eq!(channel[0]["session_id"], other.session_id.as_str());
    for actor in ["api", "cli"] {
        wait_for(&format!("the {actor} row"), Duration::from_secs(10), || async {
            let rows = invocations(&api, &format!("actor={actor}&target=tiny__echo")).await?;
            Ok((!rows.is_empty()).then_some(()))
        })
        .await?;
    }
    ensure!(invocations(&api, "actor=mcp").await?.is_empty(), "no MCP client called anything");

    // Closed by the caller: its child ends; closing again is no error.
    let closed = chat.close_session(CloseSessionRequest { session_key: "conv-1".into() }).await?.into_inner();
    ensure!(closed.closed);
    ensure!(!chat.close_session(CloseSessionRequest { session_key: "conv-1".into() }).await?.into_inner().closed);
    // Left: the channel's session, REST's (`api`) and the CLI's.
    wait_tiny_count(&home, "the closed session's child to exit", 3).await?;

    // Idle: with a short timeout every broker session ends, and with it every child.
    set_broker_idle_s(&api, 1).await?;
    wait_tiny_count(&home, "idle broker sessions to be reaped", 0).await?;
    wait_for("no upstream pid record left", Duration::from_secs(10), || async {
        Ok(home.pid_records().iter().all(|r| r.kind != "upstream").then_some(()))
    })
    .await?;
    // A reaped key opens a fresh session on its next request.
    let again = chat.call_tool(call("channel:telegram", "chat-42", "tiny__echo", json!({"message": "y"}))).await?;
    ensure!(again.into_inner().session_id != other.session_id, "a new session");
    wait_tiny_count(&home, "the new session to be reaped too", 0).await?;
    Ok(())
}

#[tokio::test]
async fn other_callers_and_malformed_requests_are_refused_and_the_broker_keeps_serving() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_tiny(&api, "tiny", json!({})).await?;
    // The catalog's own background start of it ends first: only what the requests start counts.
    coffer_tests::mcp::wait_listed(&api, "tiny").await?;
    let mut chat = client_as(&api, "chat").await?;

    // Retrieval's token is valid, but the broker is not for it; neither is a stranger's.
    let mut retrieval = client_as(&api, "retrieval").await?;
    let e = retrieval.list_tools(list("agent", "k")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(e.message(), "retrieval may not call /coffer.gateway.v1.ToolBroker/ListTools");
    let e = retrieval.call_tool(call("agent", "k", "tiny__echo", json!({}))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let addr = service_env(&api, "chat").await?["COFFER_GATEWAY_GRPC_ADDR"].clone();
    let stranger = coffer_runtime::token::random_token();
    let e = ToolBrokerClient::new(coffer_runtime::grpc::channel(&addr, &stranger)?)
        .list_tools(list("agent", "k"))
        .await
        .unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::Unauthenticated, "missing or wrong internal token"));

    // Malformed input: clear INVALID_ARGUMENTs, and nothing started for them.
    let with_args = |actor: &str, key: &str, arguments: &str| CallToolRequest {
        actor: actor.into(),
        session_key: key.into(),
        name: "tiny__echo".into(),
        arguments_json: arguments.into(),
    };
    for (request, needle) in [
        (with_args("", "k", "{}"), "actor must be 1-64 printable ASCII characters"),
        (with_args("two words", "k", "{}"), "actor must be"),
        (with_args(&"a".repeat(65), "k", "{}"), "actor must be"),
        (with_args("mcp", "k", "{}"), "reserved"),
        (with_args("agent", "", "{}"), "session_key must be 1-128 printable ASCII characters"),
        (with_args("agent", "k", "{not json"), "arguments_json must be a JSON object"),
        (with_args("agent", "k", "[1]"), "arguments_json must be a JSON object"),
    ] {
        let e = chat.call_tool(request.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{request:?}: {e:?}");
        ensure!(e.message().contains(needle), "{request:?}: {}", e.message());
    }
    let e = chat.close_session(CloseSessionRequest { session_key: "\u{7}".into() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // Larger than the 16 MiB request limit: refused by the transport.
    let huge = json!({"message": "x".repeat(17 << 20)}).to_string();
    let e = chat.call_tool(with_args("agent", "k", &huge)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{}", e.message());
    ensure!(tiny_pids(&home).is_empty(), "no upstream started for refused requests");

    // The same key for another actor is refused while it is open.
    chat.call_tool(call("agent", "k", "tiny__echo", json!({"message": "ok"}))).await?;
    let e = chat.list_tools(list("channel:x", "k")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");

    // Still serving, and still healthy.
    let reply = chat.call_tool(call("agent", "k", "tiny__echo", json!({"message": "still"}))).await?.into_inner();
    assert_eq!(result(&reply)?["content"][0]["text"], "still");
    assert_eq!(api.service("gateway").await?["state"], "healthy");
    chat.close_session(CloseSessionRequest { session_key: "k".into() }).await?;
    wait_tiny_count(&home, "the closed session's child to exit", 0).await?;
    Ok(())
}

/// `PATCH /v1/tools/{name}` resolves the name through the server its prefix names: it starts
/// that one upstream, not every registered one, and still toggles a disabled tool back on.
#[tokio::test]
async fn toggling_a_tool_starts_only_its_own_server() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    for name in ["tiny", "other", "third"] {
        register_tiny(&api, name, json!({})).await?;
    }
    for name in ["tiny", "other", "third"] {
        coffer_tests::mcp::wait_listed(&api, name).await?;
    }
    ensure!(tiny_pids(&home).is_empty(), "the catalog's background starts have ended");
    set_tool_enabled(&api, "tiny__add", false).await?;
    ensure!(
        tiny_pids(&home).len() <= 1,
        "at most tiny's upstream was started (the catalog knows its tools): {:?}",
        tiny_pids(&home)
    );
    set_tool_enabled(&api, "tiny__add", true).await?;
    let r =
        api.request(reqwest::Method::PATCH, "/v1/tools/other__nope").json(&json!({"enabled": false})).reply().await?;
    assert_eq!(r.status, 404, "{}", r.text);
    assert_eq!(r.json()?["error"]["message"], "Unknown tool \"other__nope\"");
    ensure!(tiny_pids(&home).len() <= 2, "at most other's for its own name, never third's: {:?}", tiny_pids(&home));
    Ok(())
}
