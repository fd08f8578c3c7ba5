//! A fake MCP Registry over real HTTP on loopback (axum), speaking the official registry's read
//! API (modelcontextprotocol/registry `docs/reference/api/openapi.yaml`, 2025-12-01):
//! `GET /v0.1/servers?search=&version=latest&limit=` → `{servers:[{server, _meta}], metadata}`
//! and `GET /v0.1/servers/{name}/versions/{version}` → one `{server, _meta}` (404 `{"error"}`
//! when unknown). It serves the `server.json` entries a test gives it; a search matches a
//! substring of the name, as the registry's does. `raw` entries answer a search with a body as
//! given (for malformed answers).
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

#[derive(Default)]
struct Shared {
    /// `server.json` bodies by registry name.
    entries: BTreeMap<String, Value>,
    /// Search text → a raw answer body.
    raw: BTreeMap<String, String>,
    /// Every query string seen.
    queries: Vec<String>,
}

/// A running fake registry; stops when dropped.
pub struct FakeRegistry {
    pub url: String,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn response(server: &Value) -> Value {
    json!({
        "server": server,
        "_meta": {"io.modelcontextprotocol.registry/official": {
            "status": "active", "publishedAt": "2026-01-01T00:00:00Z", "isLatest": true
        }}
    })
}

async fn list(
    State(s): State<Arc<Mutex<Shared>>>,
    Query(q): Query<BTreeMap<String, String>>,
    uri: axum::http::Uri,
) -> Response {
    let mut s = s.lock().unwrap();
    s.queries.push(uri.query().unwrap_or_default().to_owned());
    let search = q.get("search").cloned().unwrap_or_default();
    if let Some(body) = s.raw.get(&search) {
        return ([("content-type", "application/json")], body.clone()).into_response();
    }
    let servers: Vec<Value> =
        s.entries.iter().filter(|(name, _)| name.contains(&search)).map(|(_, v)| response(v)).collect();
    let count = servers.len();
    axum::Json(json!({"servers": servers, "metadata": {"count": count}})).into_response()
}

async fn version(State(s): State<Arc<Mutex<Shared>>>, Path((name, version)): Path<(String, String)>) -> Response {
    let s = s.lock().unwrap();
    match s.entries.get(&name) {
        Some(v) if version == "latest" || v["version"] == version.as_str() => axum::Json(response(v)).into_response(),
        _ => (StatusCode::NOT_FOUND, axum::Json(json!({"error": "Server not found"}))).into_response(),
    }
}

impl FakeRegistry {
    /// Starts one serving `entries` (`server.json` bodies).
    ///
    /// # Errors
    /// When it cannot bind.
    pub async fn start(entries: Vec<Value>) -> anyhow::Result<Self> {
        let mut shared = Shared::default();
        for e in entries {
            let name = e["name"].as_str().context("an entry without a name")?.to_owned();
            shared.entries.insert(name, e);
        }
        let shared = Arc::new(Mutex::new(shared));
        let app = Router::new()
            .route("/v0.1/servers", axum::routing::get(list))
            .route("/v0.1/servers/{name}/versions/{version}", axum::routing::get(version))
            .with_state(shared.clone());
        let (url, task) = crate::http::serve_on_loopback(app).await?;
        Ok(Self { url, shared, task })
    }

    /// A search for exactly `search` is answered with `body` as is.
    pub fn answer_raw(&self, search: &str, body: impl Into<String>) {
        self.shared.lock().unwrap().raw.insert(search.to_owned(), body.into());
    }

    /// The query strings of every search so far.
    pub fn queries(&self) -> Vec<String> {
        self.shared.lock().unwrap().queries.clone()
    }
}
