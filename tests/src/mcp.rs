//! A small MCP Streamable HTTP test client for `/mcp`, plus helpers to register upstreams.
//! Real MCP clients (Python SDK, Inspector, rmcp) prove interoperability elsewhere; this one
//! lets tests send exactly the bytes they mean, including malformed ones.
use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::http::{Api, Reply, SendExt};

/// The newest protocol revision Coffer speaks.
pub const LATEST: &str = "2025-11-25";

/// One downstream session on `/mcp`.
#[derive(Clone)]
pub struct McpSession {
    pub api: Api,
    pub id: String,
    pub version: String,
}

/// `POST /mcp` with the standard headers (and `Mcp-Session-Id` when given) and a raw body.
pub fn mcp_post(api: &Api, session: Option<&str>, body: impl Into<reqwest::Body>) -> reqwest::RequestBuilder {
    let mut r = api
        .post("/mcp")
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(body);
    if let Some(s) = session {
        r = r.header("Mcp-Session-Id", s);
    }
    r
}

/// Parses a POST answer that is either JSON or an SSE stream; returns every JSON-RPC message.
///
/// # Errors
/// When the body is neither.
pub fn messages(reply: &Reply) -> anyhow::Result<Vec<Value>> {
    let ct = reply.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
    if ct.starts_with("text/event-stream") {
        let mut events = Vec::new();
        coffer_types::sse::SseParser::new().push(reply.text.as_bytes(), &mut events);
        events
            .iter()
            .filter(|e| !e.data.is_empty())
            .map(|e| serde_json::from_slice(&e.data).context("SSE data is not JSON"))
            .collect()
    } else {
        Ok(vec![reply.json()?])
    }
}

impl McpSession {
    /// `initialize` with `version` and client `capabilities`, then `notifications/initialized`.
    ///
    /// # Errors
    /// When the server refuses or answers without a session id.
    pub async fn open(api: &Api, version: &str, capabilities: Value) -> anyhow::Result<Self> {
        let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": capabilities, "clientInfo": {"name": "coffer-tests", "version": "1"}}});
        let r = mcp_post(api, None, body.to_string()).reply().await?;
        if r.status != 200 {
            bail!("initialize answered {}: {}", r.status, r.text);
        }
        let id = r.headers.get("mcp-session-id").context("no Mcp-Session-Id")?.to_str()?.to_owned();
        let v = r.json()?;
        let version = v["result"]["protocolVersion"].as_str().context("no protocolVersion")?.to_owned();
        let s = Self { api: api.clone(), id, version };
        let n = s.post_raw(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string()).await?;
        if n.status != 202 {
            bail!("notifications/initialized answered {}", n.status);
        }
        Ok(s)
    }

    /// A session negotiated at [`LATEST`] with no client capabilities.
    pub async fn latest(api: &Api) -> anyhow::Result<Self> {
        Self::open(api, LATEST, json!({})).await
    }

    /// POSTs raw text on this session.
    pub async fn post_raw(&self, body: String) -> anyhow::Result<Reply> {
        mcp_post(&self.api, Some(&self.id), body).header("MCP-Protocol-Version", &self.version).reply().await
    }

    /// Sends request `method` with `params` (id 1) and returns the whole response object.
    pub async fn request(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        let r =
            self.post_raw(json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string()).await?;
        let msgs = messages(&r)?;
        msgs.into_iter().find(|m| m.get("id").is_some() && m.get("method").is_none()).context("no response message")
    }

    /// `request` that must succeed; returns `result`.
    pub async fn call(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        let v = self.request(method, params).await?;
        v.get("result").cloned().with_context(|| format!("{method} failed: {v}"))
    }

    /// `tools/call` of exposed `name` with `arguments`; the whole response object.
    pub async fn tool(&self, name: &str, arguments: Value) -> anyhow::Result<Value> {
        self.request("tools/call", json!({"name": name, "arguments": arguments})).await
    }

    /// Exposed tool names from `tools/list`.
    pub async fn tool_names(&self) -> anyhow::Result<Vec<String>> {
        let r = self.call("tools/list", json!({})).await?;
        Ok(r["tools"]
            .as_array()
            .context("tools")?
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect())
    }

    /// `DELETE /mcp`; the status.
    pub async fn delete(&self) -> anyhow::Result<u16> {
        Ok(self
            .api
            .request(reqwest::Method::DELETE, "/mcp")
            .header("Mcp-Session-Id", &self.id)
            .reply()
            .await?
            .status
            .as_u16())
    }
}

/// Registers a stdio upstream `name` running `command args…` (with `env`) through the REST API.
///
/// # Errors
/// When the daemon refuses it.
pub async fn register_stdio(
    api: &Api,
    name: &str,
    command: &std::path::Path,
    args: &[String],
    env: Value,
) -> anyhow::Result<Value> {
    let body = json!({"name": name, "command": command, "args": args, "env": env});
    let r = api.post_json("/v1/mcp/servers", &body).reply().await?;
    if !r.status.is_success() {
        bail!("registering {name} failed with {}: {}", r.status, r.text);
    }
    r.json()
}

/// Registers the pinned `server-everything` (stdio) as `name`.
///
/// # Errors
/// When node or the peer is missing, or registration fails.
pub async fn register_everything(api: &Api, name: &str) -> anyhow::Result<Value> {
    let node =
        coffer_runtime::connect::which_on_path("node").context("node is not on PATH (needed by the MCP peers)")?;
    let entry = crate::peer("node_modules/@modelcontextprotocol/server-everything/dist/index.js")?;
    register_stdio(api, name, &node, &[entry.display().to_string(), "stdio".into()], json!({})).await
}

/// Registers our tiny upstream (`coffer-tiny-upstream`) as `name` with `env`.
///
/// # Errors
/// When the binary is missing or registration fails.
pub async fn register_tiny(api: &Api, name: &str, env: Value) -> anyhow::Result<Value> {
    register_stdio(api, name, &crate::bin("coffer-tiny-upstream")?, &[], env).await
}

/// Registers our tiny upstream as `name` with a per-call timeout of `timeout_ms`.
///
/// # Errors
/// When the binary is missing or registration fails.
pub async fn register_tiny_with_timeout(api: &Api, name: &str, timeout_ms: u64) -> anyhow::Result<Value> {
    let body = json!({"name": name, "command": crate::bin("coffer-tiny-upstream")?, "timeout_ms": timeout_ms});
    let r = api.post_json("/v1/mcp/servers", &body).reply().await?;
    if !r.status.is_success() {
        bail!("registering {name} failed with {}: {}", r.status, r.text);
    }
    r.json()
}

/// Enables or disables an exposed tool (`PATCH /v1/tools/{tool}`), which every session then
/// sees (`notifications/tools/list_changed`).
///
/// # Errors
/// When the daemon does not answer 200.
pub async fn set_tool_enabled(api: &Api, tool: &str, enabled: bool) -> anyhow::Result<()> {
    let r = api
        .request(reqwest::Method::PATCH, &format!("/v1/tools/{tool}"))
        .json(&json!({"enabled": enabled}))
        .reply()
        .await?;
    anyhow::ensure!(r.status == 200, "PATCH /v1/tools/{tool}: {} {}", r.status, r.text);
    Ok(())
}

/// Waits (at most 30 s) until the gateway's capability catalog has listed `server` or given up
/// on it: `/v1/status` shows its catalog state `ready` or `failed` and no `background` start (the
/// background start of it begun when it was registered has ended, and its process with it).
/// Returns its status entry.
///
/// # Errors
/// When it is still `unknown` or `listing` after 30 s.
pub async fn wait_listed(api: &Api, server: &str) -> anyhow::Result<Value> {
    wait_catalog(api, server, std::time::Duration::from_secs(30), |state| {
        (state["state"] == "ready" || (state["state"] == "failed" && state["retrying"] != true))
            && state["background"] != true
    })
    .await
}

/// Waits (at most `timeout`) until the capability catalog has listed `server`: its catalog
/// state in `/v1/status` is `ready`. Unlike [`wait_listed`] it waits through failures, which
/// the catalog retries in the background after a backoff (a server that missed its start
/// deadline on a loaded machine). Returns its status entry.
///
/// # Errors
/// When it is not `ready` after `timeout`.
pub async fn wait_catalog_ready(api: &Api, server: &str, timeout: std::time::Duration) -> anyhow::Result<Value> {
    wait_catalog(api, server, timeout, |state| state["state"] == "ready").await
}

/// Polls `/v1/status` until `server`'s `catalog` object satisfies `done`; its status entry.
async fn wait_catalog(
    api: &Api,
    server: &str,
    timeout: std::time::Duration,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let done = &done;
    crate::wait_for(&format!("the capability catalog to list {server}"), timeout, || async move {
        let status = api.status().await?;
        let entry = status["upstreams"].as_array().into_iter().flatten().find(|u| u["name"] == server).cloned();
        Ok(entry.filter(|e| done(&e["catalog"])))
    })
    .await
}

/// Makes every client's first list wait for every server (`gateway.first_list_timeout_ms` =
/// 30 s instead of 1 s), for tests whose client's first list must hold a slow server that the
/// catalog does not know for that client yet (e.g. a client whose capabilities no other
/// client had: lists are known per client capabilities).
///
/// # Errors
/// When the daemon refuses the setting.
pub async fn patient_lists(api: &Api) -> anyhow::Result<()> {
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"gateway.first_list_timeout_ms": "30000"}}))
        .reply()
        .await?;
    anyhow::ensure!(r.status == 200, "PATCH /v1/settings: {} {}", r.status, r.text);
    Ok(())
}
