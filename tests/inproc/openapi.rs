//! `GET /v1/openapi.json` against the edge's router (in process): for every documented path the router
//! allows exactly the documented methods (its `405` answer to `OPTIONS` lists them in `Allow`),
//! every documented operation needs the token but `GET /v1/health`, and a path the document
//! does not know is 404. (The unit tests in `gateway-edge/src/rest/openapi.rs` check the other
//! direction: every route in the source is documented.)
use std::collections::BTreeSet;

use anyhow::{Context, ensure};
use coffer_tests::SendExt;
use coffer_tests::inproc::Edge;
use reqwest::Method;
use serde_json::Value;

/// A concrete path for a templated one.
fn fill(template: &str) -> String {
    template
        .split('/')
        .map(|seg| match seg {
            "{kind}" => "tool",
            "{service}" => "store",
            s if s.starts_with('{') => "x",
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_is_served_with_exactly_its_methods() -> anyhow::Result<()> {
    let edge = Edge::start().await?;
    let api = edge.api();
    api.anon(Method::GET, "/v1/openapi.json").reply().await?.expect_envelope(401, "UNAUTHORIZED")?;
    let doc = api.get("/v1/openapi.json").reply().await?.ok_json()?;
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], api.health().await?["version"]);
    let paths = doc["paths"].as_object().context("paths")?;
    ensure!(paths.len() > 20, "only {} paths", paths.len());

    let mut problems = Vec::new();
    for (template, ops) in paths {
        let path = fill(template);
        let documented: BTreeSet<String> =
            ops.as_object().context("path item")?.keys().map(|m| m.to_ascii_uppercase()).collect();
        // Allowed methods, as the router reports them.
        let r = api.request(Method::OPTIONS, &path).reply().await?;
        let allow: BTreeSet<String> = r
            .headers
            .get("allow")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .split(',')
            .map(|m| m.trim().to_owned())
            .filter(|m| !m.is_empty() && m != "HEAD")
            .collect();
        if r.status != 405 || allow != documented {
            problems.push(format!("{template}: documented {documented:?}, served {allow:?} (OPTIONS → {})", r.status));
        }
        // Every operation needs the token, but GET /v1/health.
        for method in &documented {
            let m = Method::from_bytes(method.as_bytes())?;
            let r = api.anon(m, &path).reply().await?;
            let open = ops[method.to_ascii_lowercase()]["security"] == Value::Array(Vec::new());
            let expected = if open { 200 } else { 401 };
            if r.status != expected {
                problems.push(format!("{method} {template} without a token: {} (expected {expected})", r.status));
            }
            ensure!(open == (template == "/v1/health" && method == "GET"), "{method} {template} is documented as open");
        }
    }
    ensure!(problems.is_empty(), "router and /v1/openapi.json disagree:\n{}", problems.join("\n"));
    api.request(Method::OPTIONS, "/v1/not-documented").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    Ok(())
}
