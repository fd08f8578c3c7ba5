//! Both MCP eras downstream at once (issue 19): modern clients (2026-07-28: no handshake,
//! `_meta` on every request) and legacy clients (2025-03-26 … 2025-11-25) on one `/mcp` and
//! through `coffer-mcp-shim`, with the real Python SDK 2.x (`mcp.Client` in auto mode) and 1.x
//! clients in front of `server-everything`; and every bad modern input, one test each, as raw
//! HTTP (what a hostile or broken client sends).
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::mcp::{patient_lists, register_everything, set_tool_enabled};
use coffer_tests::peers::{PyClient, Sdk, texts};
use coffer_tests::{Api, Reply, SendExt, TestHome};
use serde_json::{Value, json};

const MODERN: &str = "2026-07-28";
const EVENT_TIMEOUT: Duration = Duration::from_secs(15);

fn has(names: &[String], name: &str) -> bool {
    names.iter().any(|n| n == name)
}

/// `params` with a modern client's `_meta` (identity `raw-client` 1.0, `capabilities`).
fn with_meta(mut params: Value, version: &str, capabilities: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientInfo": {"name": "raw-client", "version": "1.0"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    });
    params
}

/// A modern POST with the headers a conforming client sends (`MCP-Protocol-Version`,
/// `Mcp-Method`, `Mcp-Name` for calls), `overrides` replacing or (value `None`) removing them.
async fn modern_post(
    api: &Api,
    id: Value,
    method: &str,
    params: &Value,
    overrides: &[(&str, Option<&str>)],
) -> anyhow::Result<Reply> {
    let version = params["_meta"]["io.modelcontextprotocol/protocolVersion"].as_str().unwrap_or(MODERN).to_owned();
    let mut headers: Vec<(String, String)> =
        vec![("MCP-Protocol-Version".into(), version), ("Mcp-Method".into(), method.into())];
    let name = params.get("name").or_else(|| params.get("uri")).and_then(Value::as_str);
    if let Some(n) = name {
        headers.push(("Mcp-Name".into(), n.into()));
    }
    for (k, v) in overrides {
        headers.retain(|(h, _)| !h.eq_ignore_ascii_case(k));
        if let Some(v) = v {
            headers.push(((*k).into(), (*v).into()));
        }
    }
    let mut r = api
        .post("/mcp")
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream");
    for (k, v) in &headers {
        r = r.header(k.as_str(), v.as_str());
    }
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    r.body(body.to_string()).reply().await
}

/// The JSON-RPC message of a reply: the JSON body, or the last `data:` of an SSE body.
fn message(r: &Reply) -> anyhow::Result<Value> {
    if r.headers.get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|c| c.starts_with("text/event-stream")) {
        let last = r.text.lines().filter_map(|l| l.strip_prefix("data:")).next_back().context("no SSE data")?;
        return Ok(serde_json::from_str(last.trim())?);
    }
    serde_json::from_str(&r.text).with_context(|| format!("{} {}", r.status, r.text))
}

fn expect_error(r: &Reply, status: u16, code: i64) -> anyhow::Result<Value> {
    ensure!(r.status.as_u16() == status, "want HTTP {status}: {} {}", r.status, r.text);
    let m = message(r)?;
    ensure!(m["error"]["code"] == code, "want {code}: {m}");
    Ok(m["error"].clone())
}

/// The Python SDK 2.x `Client` in auto mode speaks 2026-07-28 to Coffer (its `server/discover`
/// probe is answered, no `initialize`), over Streamable HTTP and through the shim, while 1.x
/// clients of the legacy era use the same upstream server at the same time, each client with
/// upstream processes of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_both_eras_list_and_call_on_the_same_upstream_at_once() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    patient_lists(&api).await?;
    register_everything(&api, "everything").await?;

    let mut modern_http = PyClient::over_http(&home, &api, Sdk::V2, &["--mode", "auto"]).await?;
    assert_eq!(modern_http.protocol_version(), MODERN, "{}", modern_http.ready);
    assert_eq!(modern_http.ready["serverInfo"]["name"], "coffer", "{}", modern_http.ready);
    let mut modern_shim = PyClient::through_shim_with(&home, Sdk::V2, &[]).await?;
    assert_eq!(modern_shim.protocol_version(), MODERN, "{}", modern_shim.ready);
    let mut legacy_http = PyClient::over_http(&home, &api, Sdk::V1, &[]).await?;
    assert_eq!(legacy_http.protocol_version(), "2025-11-25");
    let mut legacy_shim = PyClient::through_shim(&home, &[]).await?;

    for (who, c) in [
        ("2.x http", &mut modern_http),
        ("2.x shim", &mut modern_shim),
        ("1.x http", &mut legacy_http),
        ("1.x shim", &mut legacy_shim),
    ] {
        let tools = c.tools().await.with_context(|| who.to_owned())?;
        ensure!(has(&tools, "everything__echo") && has(&tools, "coffer__search_tools"), "{who}: {tools:?}");
        let said = c.call_text("everything__echo", json!({"message": who})).await.with_context(|| who.to_owned())?;
        assert_eq!(said, format!("Echo: {who}"));
    }

    // The modern client's wire: a discover probe answered with a DiscoverResult, no initialize.
    let wire = modern_http.op(json!({"op": "wire"})).await?["wire"].clone();
    let wire = wire.as_array().context("wire log")?;
    assert_eq!(wire[0], json!({"sent": "server/discover"}), "{wire:?}");
    ensure!(wire[1]["status"] == 200 && wire[1].get("error").is_none(), "{wire:?}");
    ensure!(!wire.contains(&json!({"sent": "initialize"})), "no handshake: {wire:?}");

    // Four clients, four upstream processes of the one server.
    let status = api.status().await?;
    let everything = status["upstreams"]
        .as_array()
        .and_then(|u| u.iter().find(|s| s["name"] == "everything"))
        .with_context(|| format!("{status}"))?;
    assert_eq!(everything["running"], 4, "one upstream per client: {everything}");

    for c in [modern_http, modern_shim, legacy_http, legacy_shim] {
        c.close().await?;
    }
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}

/// server-everything's sampling and elicitation tools reach a modern client as MRTR input
/// requests (its SDK answers them with its callbacks and retries), over HTTP and through the shim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_and_elicitation_reach_modern_clients_as_input_requests() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    patient_lists(&api).await?;
    register_everything(&api, "everything").await?;
    let callbacks = ["--sampling", "four", "--elicitation", r#"{"name": "Ada Lovelace"}"#];
    let http_args: Vec<&str> = ["--mode", "auto"].iter().chain(callbacks.iter()).copied().collect();
    let http = PyClient::over_http(&home, &api, Sdk::V2, &http_args).await?;
    let shim = PyClient::through_shim_with(&home, Sdk::V2, &callbacks).await?;
    for (who, mut c) in [("http", http), ("shim", shim)] {
        assert_eq!(c.protocol_version(), MODERN, "{who}");
        let wanted = ["everything__trigger-sampling-request", "everything__trigger-elicitation-request"];
        c.tools_including(&wanted, Duration::from_secs(30)).await.with_context(|| who.to_owned())?;
        let sampled = c.call_text("everything__trigger-sampling-request", json!({"prompt": "What is 2+2?"})).await?;
        ensure!(sampled.contains(r#""text": "four""#) && sampled.contains("coffer-test-model"), "{who}: {sampled}");
        let asked = c.wait_event("the sampling callback", EVENT_TIMEOUT, |e| e["kind"] == "sampling").await?;
        ensure!(asked["texts"][0].as_str().is_some_and(|t| t.contains("What is 2+2?")), "{who}: {asked}");
        let elicited = c.call_text("everything__trigger-elicitation-request", json!({})).await?;
        ensure!(elicited.contains("Ada Lovelace"), "{who}: {elicited}");
        c.wait_event("the elicitation callback", EVENT_TIMEOUT, |e| e["kind"] == "elicitation").await?;
        c.close().await?;
    }
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}

/// `subscriptions/listen` (the SDK's `Client.listen`) receives a tools list change caused
/// through the API, tagged for its subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modern_subscription_gets_tools_list_changes() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_everything(&api, "everything").await?;
    let mut c = PyClient::over_http(&home, &api, Sdk::V2, &["--listen"]).await?;
    ensure!(has(&c.tools().await?, "everything__echo"));
    c.wait_event("the subscription to open", EVENT_TIMEOUT, |e| e["kind"] == "listening").await?;
    set_tool_enabled(&api, "everything__echo", false).await?;
    c.wait_event("a tools list change on the subscription", EVENT_TIMEOUT, |e| e["kind"] == "listen").await?;
    ensure!(!has(&c.tools().await?, "everything__echo"));
    c.close().await?;
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}

/// What a modern client sees of `/mcp` itself: `server/discover`, results with `resultType`
/// and cache hints, 404 for a method it does not have (ping, initialize-era methods), 405 for
/// GET and DELETE.
#[tokio::test]
async fn modern_http_discover_results_unknown_methods_and_get_delete() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let r = modern_post(&api, json!(1), "server/discover", &with_meta(json!({}), MODERN, json!({})), &[]).await?;
    let d = message(&r)?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    assert_eq!(d["result"]["supportedVersions"][0], MODERN, "{d}");
    ensure!(d["result"]["supportedVersions"].as_array().is_some_and(|v| v.contains(&json!("2025-11-25"))), "{d}");
    assert_eq!(d["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "coffer");
    assert_eq!(d["result"]["resultType"], "complete");

    let r = modern_post(&api, json!(2), "tools/list", &with_meta(json!({}), MODERN, json!({})), &[]).await?;
    let l = message(&r)?;
    assert_eq!(l["result"]["resultType"], "complete", "{l}");
    assert_eq!((l["result"]["ttlMs"].clone(), l["result"]["cacheScope"].clone()), (json!(60000), json!("private")));
    ensure!(r.headers.get("mcp-session-id").is_none(), "no session id for a modern client");

    let r = modern_post(&api, json!(3), "ping", &with_meta(json!({}), MODERN, json!({})), &[]).await?;
    expect_error(&r, 404, -32601)?;
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let r = api.request(method.clone(), "/mcp").header("MCP-Protocol-Version", MODERN).reply().await?;
        ensure!(r.status == 405, "{method}: {} {}", r.status, r.text);
        assert_eq!(r.headers.get("allow").and_then(|v| v.to_str().ok()), Some("POST"));
    }
    Ok(())
}

/// A modern client's `clientInfo` may be missing, `null`, not an object or lack its fields:
/// the upstream (server-everything, whose SDK refuses an `initialize` without a `clientInfo`
/// name and version) still starts, because it is shown Coffer's own `clientInfo`, and the call
/// is answered. Each case is its own client (`X-Coffer-Connection`), so each starts an upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modern_call_without_a_valid_client_info_still_starts_the_upstream() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    patient_lists(&api).await?;
    register_everything(&api, "everything").await?;
    let infos = [None, Some(json!(null)), Some(json!("a string")), Some(json!({})), Some(json!({"name": "only-name"}))];
    for (i, info) in infos.iter().enumerate() {
        let mut p = json!({"name": "everything__echo", "arguments": {"message": format!("case {i}")}, "_meta": {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
        }});
        if let Some(info) = info {
            p["_meta"]["io.modelcontextprotocol/clientInfo"] = info.clone();
        }
        let connection = format!("client-info-{i}");
        let r = modern_post(&api, json!(i), "tools/call", &p, &[("X-Coffer-Connection", Some(&connection))]).await?;
        let m = message(&r)?;
        ensure!(texts(&m["result"]) == format!("Echo: case {i}"), "clientInfo {info:?}: {m}");
    }
    Ok(())
}

/// `MCP-Protocol-Version` disagreeing with `_meta`: 400 -32020.
#[tokio::test]
async fn header_and_body_versions_that_disagree_are_refused() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let p = with_meta(json!({}), MODERN, json!({}));
    let r = modern_post(&api, json!(1), "tools/list", &p, &[("MCP-Protocol-Version", Some("2025-11-25"))]).await?;
    let e = expect_error(&r, 400, -32020)?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("does not match")), "{e}");
    let r = modern_post(&api, json!(2), "tools/list", &p, &[("MCP-Protocol-Version", None)]).await?;
    expect_error(&r, 400, -32020)?;
    Ok(())
}

/// A modern POST without `Mcp-Method`: 400 -32020; one that disagrees with the body too.
#[tokio::test]
async fn a_missing_or_wrong_mcp_method_is_refused() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let p = with_meta(json!({}), MODERN, json!({}));
    let r = modern_post(&api, json!(1), "tools/list", &p, &[("Mcp-Method", None)]).await?;
    let e = expect_error(&r, 400, -32020)?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("Mcp-Method is required")), "{e}");
    let r = modern_post(&api, json!(2), "tools/list", &p, &[("Mcp-Method", Some("prompts/list"))]).await?;
    expect_error(&r, 400, -32020)?;
    Ok(())
}

/// `Mcp-Name` that disagrees with `params.name`: 400 -32020, and the call does not run.
#[tokio::test]
async fn an_mcp_name_that_disagrees_with_the_body_is_refused() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_everything(&api, "everything").await?;
    let p = with_meta(json!({"name": "everything__echo", "arguments": {"message": "x"}}), MODERN, json!({}));
    let r = modern_post(&api, json!(1), "tools/call", &p, &[("Mcp-Name", Some("coffer__search_tools"))]).await?;
    let e = expect_error(&r, 400, -32020)?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("coffer__search_tools")), "{e}");
    let r = modern_post(&api, json!(2), "tools/call", &p, &[("Mcp-Name", None)]).await?;
    expect_error(&r, 400, -32020)?;
    // Nothing ran: no invocation was recorded.
    let v = api.get("/v1/invocations?target=everything__echo").reply().await?.ok_json()?;
    assert_eq!(v["items"], json!([]), "{v}");
    Ok(())
}

/// `Mcp-Name` in the Base64 sentinel form is decoded before comparing: a correct one is served,
/// a malformed one and an unencoded literal sentinel are refused with -32020.
#[tokio::test]
async fn base64_sentinel_mcp_names_are_decoded_and_checked() -> anyhow::Result<()> {
    use base64::Engine as _;
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let p = with_meta(json!({"name": "coffer__search_tools", "arguments": {"query": "echo"}}), MODERN, json!({}));
    let encoded = format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode("coffer__search_tools"));
    let r = modern_post(&api, json!(1), "tools/call", &p, &[("Mcp-Name", Some(&encoded))]).await?;
    let ok = message(&r)?;
    ensure!(ok["result"]["resultType"] == "complete", "{ok}");
    let r = modern_post(&api, json!(2), "tools/call", &p, &[("Mcp-Name", Some("=?base64?%%%?="))]).await?;
    let e = expect_error(&r, 400, -32020)?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("Base64")), "{e}");
    let literal = with_meta(json!({"name": "=?base64?abc?=", "arguments": {}}), MODERN, json!({}));
    let r = modern_post(&api, json!(3), "tools/call", &literal, &[]).await?;
    expect_error(&r, 400, -32020)?;
    Ok(())
}

/// A version Coffer does not serve: 400 -32022 listing the versions it does, in the header or in
/// `_meta`; a legacy client's unsupported header gets the same.
#[tokio::test]
async fn an_unsupported_version_gets_the_supported_list() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let p = with_meta(json!({}), "2099-01-01", json!({}));
    let r = modern_post(&api, json!(1), "tools/list", &p, &[]).await?;
    let e = expect_error(&r, 400, -32022)?;
    assert_eq!(e["data"]["requested"], "2099-01-01", "{e}");
    ensure!(e["data"]["supported"].as_array().is_some_and(|v| v.contains(&json!(MODERN))), "{e}");
    let r = modern_post(&api, json!(2), "server/discover", &p, &[]).await?;
    expect_error(&r, 400, -32022)?;
    Ok(())
}

/// `subscriptions/listen` with no notification types: -32602 naming what to send.
#[tokio::test]
async fn a_subscription_with_no_types_is_refused() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    for params in [json!({}), json!({"notifications": {}}), json!({"notifications": {"toolsListChanged": false}})] {
        let p = with_meta(params.clone(), MODERN, json!({}));
        let r = modern_post(&api, json!(1), "subscriptions/listen", &p, &[]).await?;
        let e = expect_error(&r, 200, -32602)?;
        ensure!(e["message"].as_str().is_some_and(|m| m.contains("toolsListChanged")), "{params}: {e}");
    }
    Ok(())
}

/// MRTR by hand: a sampling tool answers with an `InputRequiredResult`; a retry with a forged
/// `requestState`, malformed `inputResponses` or for another tool gets -32602 and leaves the call
/// parked; a wrong key or no `inputResponses` is asked again under a new `requestState` (the old
/// one is then stale); the right retry gets the tool's real result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mrtr_retries_with_wrong_or_missing_input_responses() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    patient_lists(&api).await?;
    register_everything(&api, "everything").await?;
    let caps = json!({"sampling": {}});
    // A capability set the catalog has not seen is first answered from another client's list;
    // this client's own (with the sampling tool) follows.
    let meta = with_meta(json!({}), MODERN, caps.clone());
    coffer_tests::wait_for("the sampling tool in this client's list", Duration::from_secs(30), || async {
        let list = modern_post(&api, json!(0), "tools/list", &meta, &[]).await?;
        Ok(list.text.contains("everything__trigger-sampling-request").then_some(()))
    })
    .await?;
    let call = json!({"name": "everything__trigger-sampling-request", "arguments": {"prompt": "2+2?"}});
    let p = with_meta(call.clone(), MODERN, caps.clone());
    let first = message(&modern_post(&api, json!(1), "tools/call", &p, &[]).await?)?;
    assert_eq!(first["result"]["resultType"], "input_required", "{first}");
    let requests = first["result"]["inputRequests"].as_object().context("inputRequests")?.clone();
    assert_eq!(requests.len(), 1, "{first}");
    let (key, req) = requests.iter().next().context("one")?;
    assert_eq!(req["method"], "sampling/createMessage", "{req}");
    let state = first["result"]["requestState"].as_str().context("requestState")?.to_owned();

    let retry = |responses: Option<Value>, state: Option<&str>, name: &str| {
        let mut params = call.clone();
        params["name"] = json!(name);
        if let Some(r) = responses {
            params["inputResponses"] = r;
        }
        if let Some(s) = state {
            params["requestState"] = json!(s);
        }
        with_meta(params, MODERN, caps.clone())
    };
    let answer = json!({"role": "assistant", "model": "m", "content": {"type": "text", "text": "four"}});
    let name = "everything__trigger-sampling-request";
    for (what, params) in [
        ("a wrong requestState", retry(Some(json!({key: answer})), Some("coffer-mrtr-forged"), name)),
        ("not an object", retry(Some(json!([1])), Some(&state), name)),
        ("a non-object answer", retry(Some(json!({key: 4})), Some(&state), name)),
        ("another tool", retry(Some(json!({key: answer})), Some(&state), "everything__echo")),
    ] {
        let r = modern_post(&api, json!(what), "tools/call", &params, &[]).await?;
        let e = expect_error(&r, 200, -32602).with_context(|| what.to_owned())?;
        ensure!(e["message"].as_str().is_some_and(|m| m.starts_with("Invalid params")), "{what}: {e}");
    }
    // A wrong key is ignored and the missing answer asked for again, under a new requestState.
    let again = |r: &Reply| -> anyhow::Result<String> {
        let m = message(r)?;
        ensure!(m["result"]["resultType"] == "input_required", "{m}");
        ensure!(m["result"]["inputRequests"].get(key.as_str()).is_some(), "the same request again: {m}");
        Ok(m["result"]["requestState"].as_str().context("requestState")?.to_owned())
    };
    let state2 = again(
        &modern_post(&api, json!(2), "tools/call", &retry(Some(json!({"nope": answer})), Some(&state), name), &[])
            .await?,
    )?;
    ensure!(state2 != state, "each round has its own state");
    let r =
        modern_post(&api, json!(3), "tools/call", &retry(Some(json!({key: answer})), Some(&state), name), &[]).await?;
    expect_error(&r, 200, -32602).context("a used requestState is stale")?;
    // Missing inputResponses: asked again.
    let state3 = again(&modern_post(&api, json!(4), "tools/call", &retry(None, Some(&state2), name), &[]).await?)?;

    let done = message(
        &modern_post(&api, json!(5), "tools/call", &retry(Some(json!({key: answer})), Some(&state3), name), &[])
            .await?,
    )?;
    assert_eq!(done["result"]["resultType"], "complete", "{done}");
    ensure!(texts(&done["result"]).contains("four"), "the upstream got the sampled answer: {done}");
    // inputResponses without requestState answer nothing: the call runs afresh (and asks).
    let fresh = message(
        &modern_post(&api, json!(6), "tools/call", &retry(Some(json!({key: answer})), None, name), &[]).await?,
    )?;
    assert_eq!(fresh["result"]["resultType"], "input_required", "{fresh}");
    Ok(())
}

/// A modern client through the shim after the daemon restarted: there is no session to lose or
/// replay, so its next call just works on the daemon the shim starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modern_client_calls_after_a_daemon_restart() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    register_everything(&api, "everything").await?;
    let first = home.daemon_info()?.pid;
    let mut c = PyClient::through_shim_with(&home, Sdk::V2, &[]).await?;
    assert_eq!(c.protocol_version(), MODERN);
    assert_eq!(c.call_text("everything__echo", json!({"message": "before"})).await?, "Echo: before");
    home.cli(&["daemon", "stop"]).await?.ok()?;
    // The first call may race the shim's discovery of the loss and get -32001 ("may be
    // retried") at once; the one after it works either way.
    let mut refused = 0;
    let after = loop {
        let r = c.call("everything__echo", json!({"message": "after"})).await?;
        if r["error"]["code"] == -32001 && refused == 0 {
            refused += 1;
            continue;
        }
        break r;
    };
    assert_eq!(texts(&after["result"]), "Echo: after", "{after}");
    home.wait_ready(Duration::from_secs(10)).await?;
    ensure!(home.daemon_info()?.pid != first, "a new daemon runs");

    // Straight over HTTP too: the new daemon serves a modern request with no history.
    let api = home.api()?;
    let r = modern_post(&api, json!(1), "tools/list", &with_meta(json!({}), MODERN, json!({})), &[]).await?;
    ensure!(r.status == 200 && message(&r)?["result"]["tools"].is_array(), "{} {}", r.status, r.text);
    c.close().await?;
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}

/// Runs `@modelcontextprotocol/conformance` 0.2.0-alpha (the release line that tests
/// 2026-07-28; pinned as `conformance-next`) in server mode against `/mcp` (through the token
/// proxy) for one protocol `era`, with that era's expected-failures baseline.
async fn conformance(era: &str, baseline: &str) -> anyhow::Result<()> {
    use coffer_tests::peers::{TokenProxy, node22, peer_path, run_to_end};
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    // Every list holds the upstream however long node takes to start it: scenarios compare
    // lists (e.g. deterministic order), and a first list without the upstream's tools differs.
    patient_lists(&api).await?;
    register_everything(&api, "everything").await?;
    let proxy = TokenProxy::start(&home, &api).await?;
    let suite = peer_path("node_modules/conformance-next/dist/index.js")?;
    let baseline = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(baseline);
    let results = home.temp().join("conformance");
    std::fs::create_dir_all(&results)?;
    let args = vec![
        suite.display().to_string(),
        "server".into(),
        "--url".into(),
        proxy.mcp_url(),
        // The scenarios the revision requires, as frozen at its release; for the legacy era,
        // those of the 2025-11-25 revision.
        if era == MODERN { "--requirements".into() } else { "--spec-version".into() },
        era.into(),
        "--expected-failures".into(),
        baseline.display().to_string(),
        "-o".into(),
        results.display().to_string(),
    ];
    let out = run_to_end(&home, &node22()?, &args, &[], &results, Duration::from_secs(300)).await?;
    // Shown only on failure: its "Total: N passed, N failed" line reads like a test runner's
    // summary to CI log parsers.
    ensure!(out.code == Some(0), "conformance suite ({era}) failed:\n{out}");
    ensure!(out.stdout.contains("Baseline check passed"), "conformance suite ({era}) output:\n{out}");
    proxy.stop().await;
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}

/// The conformance suite's 2026-07-28 scenarios pass outside their baseline (scenarios that
/// call the reference server's fixed capability names).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_2026_07_28_passes_outside_its_baseline() -> anyhow::Result<()> {
    conformance(MODERN, "conformance-baseline-2026-07-28.yml").await
}

/// The same release's 2025-11-25 scenarios (the legacy era) pass outside their baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_2025_11_25_passes_outside_its_baseline() -> anyhow::Result<()> {
    conformance("2025-11-25", "conformance-baseline-2025-11-25.yml").await
}

/// The MCP Inspector CLI (a legacy-era client: it sends `initialize`) lists and calls
/// `everything__echo` straight on `/mcp` with the token as a header, next to the modern path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspector_cli_lists_and_calls_on_mcp_directly() -> anyhow::Result<()> {
    use coffer_tests::peers::{node22, peer_path, run_to_end};
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    patient_lists(&api).await?;
    register_everything(&api, "everything").await?;
    let launcher = peer_path("node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js")?;
    let inspector_home = home.temp().join("inspector-home");
    std::fs::create_dir_all(&inspector_home)?;
    let env = [("HOME", inspector_home.as_path())];
    let inspect = |method_args: &[&str]| {
        let mut args = vec![
            launcher.display().to_string(),
            "--cli".into(),
            api.url("/mcp"),
            "--transport".into(),
            "http".into(),
            "--header".into(),
            format!("X-Coffer-Token: {}", api.token()),
        ];
        args.extend(method_args.iter().map(|s| (*s).to_owned()));
        args
    };
    let out = run_to_end(
        &home,
        &node22()?,
        &inspect(&["--method", "tools/list"]),
        &env,
        home.temp(),
        Duration::from_secs(60),
    )
    .await?;
    ensure!(out.code == Some(0), "inspector tools/list: {out}");
    let listed: Value = serde_json::from_str(&out.stdout).with_context(|| format!("{out}"))?;
    let names: Vec<&str> =
        listed["tools"].as_array().context("tools")?.iter().filter_map(|t| t["name"].as_str()).collect();
    ensure!(names.contains(&"everything__echo"), "{names:?}");
    let call = inspect(&["--method", "tools/call", "--tool-name", "everything__echo", "--tool-arg", "message=hi"]);
    let out = run_to_end(&home, &node22()?, &call, &env, home.temp(), Duration::from_secs(60)).await?;
    ensure!(out.code == Some(0), "inspector tools/call: {out}");
    let result: Value = serde_json::from_str(&out.stdout).with_context(|| format!("{out}"))?;
    assert_eq!(result["content"], json!([{"type": "text", "text": "Echo: hi"}]), "{result}");
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}

/// Closing a modern request's SSE stream cancels it: the upstream call ends at once and is
/// logged as cancelled, long before the tool would have finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_modern_request_stream_cancels_the_call() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    patient_lists(&api).await?;
    register_everything(&api, "everything").await?;
    let p = with_meta(
        json!({"name": "everything__trigger-long-running-operation", "arguments": {"duration": 60, "steps": 2}}),
        MODERN,
        json!({}),
    );
    // The client's upstream runs first (same scope: same token and identity), so the long call
    // is in flight upstream when the stream closes.
    let echo = with_meta(json!({"name": "everything__echo", "arguments": {"message": "warm"}}), MODERN, json!({}));
    let warm = message(&modern_post(&api, json!(0), "tools/call", &echo, &[]).await?)?;
    ensure!(texts(&warm["result"]) == "Echo: warm", "{warm}");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": p});
    let started = std::time::Instant::now();
    let sent = api
        .post("/mcp")
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", MODERN)
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "everything__trigger-long-running-operation")
        .timeout(Duration::from_secs(3))
        .body(body.to_string())
        .send()
        .await;
    // Either the headers came and the body read times out, or the send itself does.
    if let Ok(resp) = sent {
        ensure!(resp.status() == 200, "{}", resp.status());
        let _ = resp.text().await;
    }
    let rows = coffer_tests::wait_for("the call logged as cancelled", Duration::from_secs(20), || async {
        let v =
            api.get("/v1/invocations?target=everything__trigger-long-running-operation").reply().await?.ok_json()?;
        let rows = v["items"].as_array().cloned().unwrap_or_default();
        Ok((!rows.is_empty()).then_some(rows))
    })
    .await?;
    assert_eq!(rows[0]["outcome"], "cancelled", "{rows:?}");
    ensure!(started.elapsed() < Duration::from_secs(30), "cancelled, not run to its 60 s end: {:?}", started.elapsed());
    home.terminate_daemon(Duration::from_secs(20)).await.context("processes left behind")
}
