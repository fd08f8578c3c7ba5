//! What a user sees of the knowledge-base surface when the input is odd, through the real
//! daemon, the real `coffer` CLI and a real MCP session on `/mcp`: oversized names, paths and
//! cursors are refused by field and limit (REST 400 with `details.field`, CLI exit 2, an MCP tool
//! error) and the daemon keeps serving; errors quote a caller's value clipped (ending in `…`)
//! with the CLI's escapes (`\u001b`).
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_proto::retrieval::{KnowledgeBaseName, ReadNoteRequest};
use coffer_tests::mcp::McpSession;
use coffer_tests::peers::texts;
use coffer_tests::write_file as write;
use coffer_tests::{Api, SendExt, TestHome, wait_for};
use serde_json::{Value, json};

/// How long indexing a small folder may take on a loaded machine.
const INDEXED: Duration = Duration::from_secs(60);

/// Adds `dir` as knowledge base `name` and waits until its `documents` are indexed.
async fn add_indexed(api: &Api, name: &str, dir: &Path, documents: u64) -> anyhow::Result<()> {
    let r = api.post_json("/v1/knowledge", &json!({"name": name, "path": dir.display().to_string()})).reply().await?;
    ensure!(r.status == 201, "{}: {}", r.status, r.text);
    wait_for(&format!("knowledge base {name} indexed with {documents} documents"), INDEXED, || async {
        let v = api.get(&format!("/v1/knowledge/{name}")).reply().await?.ok_json()?;
        Ok((v["progress"]["state"] == "idle" && v["documents"] == documents).then_some(()))
    })
    .await
}

/// A 400 `INVALID_ARGUMENT` naming `field` and `limit` in its details and message, short.
async fn refused(api: &Api, path: &str, body: Value, field: &str, limit: u64) -> anyhow::Result<()> {
    let r = api.post_json(path, &body).reply().await?;
    let err = r.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(err["details"] == json!({"field": field, "limit": limit}), "{path} {field}: {err}");
    let msg = err["message"].as_str().unwrap_or_default();
    ensure!(msg.starts_with(&format!("{field} is ")) && msg.ends_with(&format!("at most {limit}")), "{msg}");
    ensure!(r.text.len() < 300, "the value is not echoed: {} bytes", r.text.len());
    Ok(())
}

/// The text of a tool call that must be a tool error.
async fn tool_error(s: &McpSession, tool: &str, args: Value) -> anyhow::Result<String> {
    let r = s.tool(tool, args).await?;
    let result = r.get("result").with_context(|| format!("{tool}: {r}"))?;
    ensure!(result["isError"] == true, "{tool} should be refused: {result}");
    Ok(texts(result))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_names_paths_and_cursors_are_refused_by_field_and_the_daemon_keeps_serving() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    write(&dir.join("a.md"), "# A\n\naardvark burrows\n")?;
    let api = home.start_daemon().await?;
    add_indexed(&api, "notes", &dir, 1).await?;
    let big = "x".repeat(100_000);
    let h = home.root().display().to_string();

    // REST: each field by name and limit, before any service is asked.
    refused(&api, "/v1/knowledge/reindex", json!({"kb": big}), "kb", 64).await?;
    refused(&api, "/v1/knowledge/search", json!({"query": "a", "kb": [big]}), "kb", 64).await?;
    refused(&api, "/v1/knowledge/search", json!({"query": "a", "path_prefix": big}), "path_prefix", 1024).await?;
    refused(&api, "/v1/knowledge/search", json!({"tags": ["t"], "cursor": "x".repeat(2049)}), "cursor", 2048).await?;
    refused(&api, "/v1/knowledge/search", json!({"query": big}), "query", 8192).await?;
    let r = api.get(&format!("/v1/knowledge/{}", "k".repeat(65))).reply().await?;
    ensure!(r.expect_envelope(400, "INVALID_ARGUMENT")?["details"]["field"] == "kb", "{}", r.text);

    // The service itself (what every surface goes through): a 100 KB name is refused with a
    // short message, not an HTTP/2 error; a caller's value is quoted clipped, with `…`, and
    // escaped as the CLI escapes (`\u001b`).
    let mut c = crate::retrieval_service::client(&api).await?;
    let e = c.get_knowledge_base(KnowledgeBaseName { name: big.clone() }).await.err().context("a 100 KB name")?;
    ensure!(e.code() == tonic::Code::InvalidArgument && e.message().contains("at most 64"), "{e:?}");
    ensure!(e.message().len() < 300, "{} bytes", e.message().len());
    let e = c.get_knowledge_base(KnowledgeBaseName { name: "no\u{1b}pe".into() }).await.err().context("unknown")?;
    ensure!(e.code() == tonic::Code::NotFound && e.message() == "no knowledge base \"no\\u001bpe\"", "{e:?}");
    let long_path = format!("{}.md", "p".repeat(1100));
    let e = c
        .read_note(ReadNoteRequest { kb: "notes".into(), path: long_path, ..ReadNoteRequest::default() })
        .await
        .err()
        .context("a long path")?;
    ensure!(e.code() == tonic::Code::InvalidArgument && e.message().contains("…\" is longer than 1024"), "{e:?}");

    // CLI: the usual exit code for bad input (2), the flag and its limit, nothing echoed.
    for (args, says) in [
        (vec!["kb", "reindex", big.as_str()], "knowledge base name is 100000 bytes; at most 64"),
        (vec!["kb", "show", big.as_str()], "knowledge base name is 100000 bytes; at most 64"),
        (vec!["kb", "search", "--kb", big.as_str(), "aardvark"], "--kb is 100000 bytes; at most 64"),
        (vec!["kb", "search", "--path", big.as_str(), "aardvark"], "--path is 100000 bytes; at most 1024"),
    ] {
        let mut full = vec!["--home", h.as_str()];
        full.extend(args);
        let out = home.cli(&full).await?;
        ensure!(out.code == Some(2) && out.stderr.contains(says) && out.stderr.len() < 300, "{says}: {out:?}");
    }

    // MCP: tool errors naming the field and the limit (the tool's schema is checked first).
    let s = McpSession::latest(&api).await?;
    let t = tool_error(&s, "coffer__read_note", json!({"kb": big, "path": "a.md"})).await?;
    ensure!(t.contains("\"kb\" is 100000 characters long, over its limit of") && t.len() < 300, "{t}");
    let t = tool_error(&s, "coffer__search_knowledge", json!({"query": "aardvark", "path_prefix": big})).await?;
    ensure!(t.contains("\"path_prefix\" is 100000 characters long, over its limit of 1024") && t.len() < 300, "{t}");
    let t = tool_error(&s, "coffer__search_knowledge", json!({"query": "aardvark", "kb": "k".repeat(100)})).await?;
    ensure!(t.contains("must be 1-64 characters") && t.len() < 400, "{t}");

    // And the daemon still answers.
    let v = api.post_json("/v1/knowledge/search", &json!({"query": "aardvark"})).reply().await?.ok_json()?;
    ensure!(v["results"][0]["path"] == "a.md", "{v}");
    let out = home.cli(&["--home", &h, "kb", "search", "aardvark"]).await?;
    ensure!(out.code == Some(0) && out.stdout.starts_with("notes:a.md:"), "{out:?}");
    Ok(())
}
