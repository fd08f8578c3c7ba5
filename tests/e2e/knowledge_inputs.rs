//! What a user sees of the knowledge-base surface when the input is odd, through the real
//! daemon, the real `coffer` CLI and a real MCP session on `/mcp`: oversized names, paths and
//! cursors are refused by field and limit (REST 400 with `details.field`, CLI exit 2, an MCP tool
//! error) and the daemon keeps serving; errors quote a caller's value clipped (ending in `…`)
//! with the CLI's escapes (`\u001b`).
use std::path::Path;

use anyhow::{Context, ensure};
use coffer_proto::retrieval::{KnowledgeBaseName, ReadNoteRequest};
use coffer_tests::mcp::McpSession;
use coffer_tests::peers::texts;
use coffer_tests::write_file as write;
use coffer_tests::{Api, SendExt, TestHome};
use serde_json::{Value, json};

/// Adds `dir` as knowledge base `name` and waits until its `documents` are indexed.
async fn add_indexed(api: &Api, name: &str, dir: &Path, documents: u64) -> anyhow::Result<()> {
    crate::notes::add_kb(api, json!({"name": name, "path": dir.display().to_string()})).await?;
    crate::notes::indexed(api, name, documents).await.map(drop)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_listing_s_more_line_works_pasted_and_a_cursor_says_what_it_needs() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("vault");
    for n in ["a", "b", "c"] {
        write(&dir.join(format!("{n}.md")), format!("# {n}\n\nnote {n} #project\n"))?;
    }
    let api = home.start_daemon().await?;
    add_indexed(&api, "vault", &dir, 3).await?;
    let h = home.root().display().to_string();

    // The More: line keeps --home: pasted into a shell without COFFER_HOME, it is the next page.
    let first = home.cli(&["--home", &h, "kb", "search", "--tag", "project", "--limit", "2"]).await?;
    ensure!(first.code == Some(0) && first.stdout.contains("vault:b.md"), "{first:?}");
    let more = first.stdout.lines().find_map(|l| l.strip_prefix("More: ")).context("a More: line")?;
    ensure!(
        more.starts_with("coffer --home ") && more.contains(" kb search --tag project --limit 2 --cursor "),
        "{more}"
    );
    let mut sh = home.command(Path::new("sh"));
    let path = format!("{}:{}", coffer_tests::bins::bin_dir()?.display(), std::env::var("PATH").unwrap_or_default());
    sh.env_remove("COFFER_HOME").env("PATH", path).arg("-c").arg(more);
    let out = tokio::process::Command::from(sh).output().await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && stdout.starts_with("vault:c.md:") && !stdout.contains("vault:a.md"),
        "{more}: {out:?}"
    );

    // A cursor alone or with a query: a usage error saying what to pass, not clap's "missing QUERY".
    let out = home.cli(&["kb", "search", "--cursor", "vault:b.md"]).await?;
    ensure!(out.code == Some(2) && out.stderr.contains("pass it with the same --tag"), "{out:?}");
    let out = home.cli(&["kb", "search", "--cursor", "vault:b.md", "note"]).await?;
    ensure!(out.code == Some(2) && out.stderr.contains("a search with a QUERY has no next page"), "{out:?}");

    // A cursor is checked in the user's terms: not one a listing gave, or into a knowledge base
    // the listing does not cover (removed since): a 400 saying "invalid cursor", start again.
    for (cursor, says) in [
        ("garbage", "invalid cursor: \"garbage\" is not a next_cursor a tag listing gave"),
        ("gone:a.md", "invalid cursor: it continues in knowledge base \"gone\", which this listing does not cover"),
    ] {
        let r = api.post_json("/v1/knowledge/search", &json!({"tags": ["project"], "cursor": cursor})).reply().await?;
        let err = r.expect_envelope(400, "INVALID_ARGUMENT")?;
        let msg = err["message"].as_str().unwrap_or_default();
        ensure!(msg.starts_with(says) && !msg.contains("after_"), "{cursor}: {msg}");
    }
    let out = home.cli(&["kb", "search", "--tag", "project", "--cursor", "gone:a.md"]).await?;
    ensure!(out.code == Some(2) && out.stderr.contains("invalid cursor: it continues in knowledge base"), "{out:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_filter_is_relative_to_the_kb_and_a_path_outside_every_kb_says_so() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("vault");
    write(&dir.join("a.md"), "# A\n\nbeta blocker\n")?;
    write(&dir.join("sub/b.md"), "# B\n\nbeta carotene\n")?;
    let api = home.start_daemon().await?;
    add_indexed(&api, "vault", &dir, 2).await?;

    // An absolute path outside every knowledge base: refused, naming the problem.
    let out = home.cli(&["kb", "search", "--path", "/etc", "beta"]).await?;
    ensure!(
        out.code == Some(2) && out.stderr.contains("\"/etc\" is absolute and inside no knowledge base searched"),
        "{out:?}"
    );
    // An absolute path inside one: that knowledge base, the rest as the filter.
    let inside = format!("{}/sub/", dir.canonicalize()?.display());
    let out = home.cli(&["kb", "search", "--path", &inside, "beta"]).await?;
    ensure!(
        out.code == Some(0) && out.stdout.starts_with("vault:sub/b.md:") && !out.stdout.contains("a.md"),
        "{out:?}"
    );
    // A relative path written as a shell user would (`./sub`, doubled slashes) is the same filter.
    for written in ["./sub", "./sub/", "sub//"] {
        let out = home.cli(&["kb", "search", "--path", written, "beta"]).await?;
        ensure!(
            out.code == Some(0) && out.stdout.starts_with("vault:sub/b.md:") && !out.stdout.contains("a.md"),
            "{written}: {out:?}"
        );
    }
    // A relative path no knowledge base has: the results are empty, and a warning says why.
    let out = home.cli(&["kb", "search", "--path", "nowhere/", "beta"]).await?;
    ensure!(
        out.code == Some(0)
            && out.stdout.starts_with("No results")
            && out.stderr.contains(
                "warning: no file or folder of the knowledge bases searched starts with path_prefix \"nowhere/\""
            ),
        "{out:?}"
    );
    // The grep engine honours the filter too (it reads only the files under it).
    let v = api
        .post_json("/v1/knowledge/search", &json!({"query": "beta", "path_prefix": "sub/", "engines": ["grep"]}))
        .reply()
        .await?
        .ok_json()?;
    let paths: Vec<&str> = v["results"].as_array().into_iter().flatten().filter_map(|r| r["path"].as_str()).collect();
    ensure!(paths == ["sub/b.md"], "{v}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shim_prints_its_help_and_a_tag_listing_reads_cleanly() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    // `coffer-mcp-shim --help`: usage on stdout, exit 0, nothing started (no daemon appears).
    let mut cmd = home.command(&coffer_tests::bin("coffer-mcp-shim")?);
    cmd.arg("--help");
    let out = tokio::process::Command::from(cmd).output().await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success() && stdout.contains("Usage: coffer-mcp-shim [--profile NAME]"), "{out:?}");
    ensure!(!home.daemon_json_path().exists(), "--help started a daemon");

    let dir = home.temp().join("vault");
    write(&dir.join("a.md"), "# A\n\nnote #project\n")?;
    let api = home.start_daemon().await?;
    add_indexed(&api, "vault", &dir, 1).await?;
    // The CLI's tag listing has no `engines: -` line.
    let out = home.cli(&["kb", "search", "--tag", "#project"]).await?;
    ensure!(out.code == Some(0) && out.stdout.starts_with("vault:a.md:") && !out.stdout.contains("engines"), "{out:?}");
    // MCP: one `#` whichever way the tag was given; "1 line", not "1 lines".
    let s = McpSession::latest(&api).await?;
    for tag in ["project", "#project"] {
        let r = s.tool("coffer__search_knowledge", json!({"tags": [tag]})).await?;
        ensure!(texts(&r["result"]).starts_with("1 note tagged #project:\n"), "{tag}: {r}");
    }
    let inbox = json!({"name": "inbox"});
    let r = api.post_json("/v1/knowledge", &inbox).reply().await?;
    ensure!(r.status == 201, "{}", r.text);
    let r = s.tool("coffer__write_note", json!({"kb": "inbox", "path": "one.md", "content": "just one line"})).await?;
    ensure!(texts(&r["result"]).starts_with("Created inbox:one.md (1 line, "), "{r}");
    // Over the schema's maximum: refused, not lowered.
    let r = s.tool("coffer__search_knowledge", json!({"query": "note", "limit": 21})).await?;
    ensure!(r["result"]["isError"] == true && texts(&r["result"]).contains("over its maximum of 20"), "{r}");
    let r = s.tool("coffer__read_note", json!({"kb": "vault", "path": "a.md", "start_byte": 20_000_000})).await?;
    ensure!(r["result"]["isError"] == true && texts(&r["result"]).contains("\"start_byte\""), "{r}");
    Ok(())
}
