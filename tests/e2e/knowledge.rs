//! Knowledge bases, memory and skills through the gateway's edge, end to end on the real daemon:
//! REST (`/v1/knowledge`, `/v1/memory`, `/v1/skills`) with its bad input answered by structured
//! errors, the built-in tools (`coffer__remember`, `recall`, `forget`, `list_skills`,
//! `load_skill`, `search_knowledge`) called by a real MCP client (the Python SDK) through the
//! shim, under policy and the invocation log, the `coffer kb|memory|skills` commands (reindex
//! progress, `--json`, exit codes), and a retrieval service that is not running (503 envelope,
//! a clear tool error, never a hang).
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use coffer_tests::mcp::set_tool_enabled;
use coffer_tests::peers::{PyClient, texts};
use coffer_tests::write_file as write;
use coffer_tests::{Api, SendExt, TestHome, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

/// How long indexing of a small folder may take.
const INDEXED: Duration = Duration::from_secs(30);

/// A small folder of notes, one in Chinese.
fn notes(dir: &Path) -> anyhow::Result<()> {
    write(
        &dir.join("tokenizer.md"),
        "---\ntitle: Tokenizer notes\ntags: [search]\n---\n# Tokenizer\n\nThe keyword index splits Chinese runs into overlapping bigrams.\n\n## Stemming\n\nEnglish words are stemmed.\n",
    )?;
    write(&dir.join("zh/数据库.md"), "# 数据库\n\n我们使用内存数据库来加速查询。\n")?;
    write(&dir.join("ops/errors.md"), "# Error codes\n\nERR-4711 means the disk is full.\n")?;
    Ok(())
}

/// Waits until `GET /v1/knowledge/{kb}` shows a finished pass with `documents` documents.
async fn indexed(api: &Api, kb: &str, documents: u64) -> anyhow::Result<Value> {
    wait_for(&format!("knowledge base {kb} indexed with {documents} documents"), INDEXED, || async {
        let v = api.get(&format!("/v1/knowledge/{kb}")).reply().await?.ok_json()?;
        Ok((v["progress"]["state"] == "idle" && v["documents"] == documents).then_some(v))
    })
    .await
}

fn paths(reply: &Value) -> Vec<String> {
    reply["results"]
        .as_array()
        .map(|r| r.iter().filter_map(|x| x["path"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

/// REST CRUD of knowledge bases, searches, and every kind of bad input answered with the
/// envelope naming the problem; the new routes sit behind the token and Host checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn knowledge_bases_over_rest_with_bad_input_refused_by_name() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    notes(&dir)?;
    let api = home.start_daemon().await?;

    let r =
        api.post_json("/v1/knowledge", &json!({"name": "notes", "path": dir.display().to_string()})).reply().await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    let added = r.json()?;
    assert_eq!((&added["name"], &added["kind"]), (&json!("notes"), &json!("folder")));
    assert_eq!(added["root"], dir.canonicalize()?.display().to_string());
    let info = indexed(&api, "notes", 3).await?;
    ensure!(info["chunks"].as_u64().unwrap_or(0) >= 3 && info["watching"] == true, "{info}");

    let list = api.get("/v1/knowledge").reply().await?.ok_json()?;
    let kinds: Vec<(&str, &str)> = list["items"]
        .as_array()
        .context("items")?
        .iter()
        .map(|k| (k["name"].as_str().unwrap_or(""), k["kind"].as_str().unwrap_or("")))
        .collect();
    ensure!(kinds.contains(&("notes", "folder")) && kinds.contains(&("memory", "memory")), "{list}");
    assert_eq!(list["next_cursor"], Value::Null);
    let engines: Vec<&str> =
        list["engines"].as_array().context("engines")?.iter().filter_map(|e| e["name"].as_str()).collect();
    ensure!(engines.contains(&"keyword") && engines.contains(&"grep") && engines.contains(&"vector"), "{list}");

    // Searches: English (stemmed), Chinese, exact text; each engine's report is there.
    let r = api
        .post_json("/v1/knowledge/search", &json!({"query": "overlapping bigram", "kb": ["notes"]}))
        .reply()
        .await?
        .ok_json()?;
    ensure!(paths(&r).first().map(String::as_str) == Some("tokenizer.md"), "{r}");
    let first = &r["results"][0];
    ensure!(
        first["line_start"].as_u64() > Some(0) && first["snippet"].as_str().is_some_and(|s| s.contains("**")),
        "{r}"
    );
    ensure!(
        r["engines"].as_array().is_some_and(|e| e.iter().any(|e| e["engine"] == "keyword" && e["state"] == "ok")),
        "{r}"
    );
    ensure!(r["fusion"].as_str().is_some_and(|f| !f.is_empty()), "{r}");
    let r = api.post_json("/v1/knowledge/search", &json!({"query": "数据库"})).reply().await?.ok_json()?;
    ensure!(paths(&r).contains(&"zh/数据库.md".to_owned()), "{r}");
    let r = api
        .post_json("/v1/knowledge/search", &json!({"query": "ERR-4711", "engines": ["grep"]}))
        .reply()
        .await?
        .ok_json()?;
    assert_eq!(paths(&r), ["ops/errors.md"], "{r}");
    // Punctuation and FTS5 syntax are text, never a syntax error.
    for q in ["\"", "*", "NEAR(", "AND OR NOT", "^", "-", "?!…"] {
        let r = api.post_json("/v1/knowledge/search", &json!({"query": q})).reply().await?;
        ensure!(r.status == 200, "{q:?}: {} {}", r.status, r.text);
    }

    // Bad input, each a structured error naming the problem.
    let post = |path: &'static str, body: Value| api.post_json(path, &body).reply();
    let e = post("/v1/knowledge", json!({"name": "Bad Name!", "path": dir.display().to_string()}))
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("name")), "{e}");
    let e = post("/v1/knowledge", json!({"name": "rel", "path": "relative/notes"}))
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("absolute")), "{e}");
    // `notes/../home/logs`: through `..` into COFFER_HOME.
    let escape = dir.join("..").join(home.root().strip_prefix(home.temp())?).join("logs").display().to_string();
    let e = post("/v1/knowledge", json!({"name": "esc", "path": escape}))
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("COFFER_HOME")), "{e}");
    let e = post("/v1/knowledge", json!({"name": "notes"})).await?.expect_envelope(409, "CONFLICT")?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("notes")), "{e}");
    post("/v1/knowledge", json!({"name": "x", "paht": "/tmp"})).await?.expect_envelope(400, "UNKNOWN_FIELD")?;
    let e = post("/v1/knowledge", json!({"name": 5})).await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["message"], "field \"name\" must be a string, not an integer");
    post("/v1/knowledge", json!({"name": "search"})).await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    api.get("/v1/knowledge/nosuch").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    api.request(Method::DELETE, "/v1/knowledge/nosuch").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    api.request(Method::DELETE, "/v1/knowledge/memory").reply().await?.expect_envelope(409, "CONFLICT")?;
    let e = post("/v1/knowledge/search", json!({"query": "  "})).await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("query")), "{e}");
    let e = post("/v1/knowledge/search", json!({"query": "x".repeat(100 * 1024)}))
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("8192")), "{e}");
    post("/v1/knowledge/search", json!({"query": "x", "kb": ["nosuch"]})).await?.expect_envelope(404, "NOT_FOUND")?;
    let e = post("/v1/knowledge/search", json!({"query": "x", "limit": "ten"}))
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["details"]["field"], "limit");
    let r = api
        .post("/v1/knowledge/search")
        .header("Content-Type", "application/json")
        .body("{\"query\": ")
        .reply()
        .await?;
    r.expect_envelope(400, "BAD_REQUEST")?;
    // Over the 2 MiB limit, on a connection of its own (the edge closes it unread).
    let headers = [("Content-Type", "application/json".to_owned()), ("Content-Length", (3 * 1024 * 1024).to_string())];
    api.raw("POST", "/v1/knowledge/search", &headers, b"{\"query\": \"")
        .await?
        .expect_envelope(413, "PAYLOAD_TOO_LARGE")?;
    post("/v1/knowledge/reindex", json!({"kb": "nosuch"})).await?.expect_envelope(404, "NOT_FOUND")?;

    // The routes are behind the same checks as every other.
    let r = api.anon(Method::GET, "/v1/knowledge").reply().await?;
    r.expect_envelope(401, "UNAUTHORIZED")?;
    let r = api.get("/v1/memory").header("Host", "evil.example:80").reply().await?;
    r.expect_envelope(403, "FORBIDDEN")?;

    // Reindex answers at once; removing forgets the documents and leaves every file.
    let r = post("/v1/knowledge/reindex", json!({"kb": "notes", "clean": true})).await?;
    ensure!(r.status == 202, "{} {}", r.status, r.text);
    assert_eq!(r.json()?["items"][0]["name"], "notes");
    indexed(&api, "notes", 3).await?;
    let r = api.request(Method::DELETE, "/v1/knowledge/notes").reply().await?.ok_json()?;
    assert_eq!(r["removed"], 3);
    ensure!(dir.join("tokenizer.md").is_file() && dir.join("zh/数据库.md").is_file(), "no file is deleted");
    api.get("/v1/knowledge/notes").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    home.terminate_daemon(Duration::from_secs(20)).await
}

/// A real MCP client (the Python SDK) through the shim: remember (the fact is a file on disk,
/// its source the client's name), a duplicate reported, recall, forget, skills listed (a
/// malformed one named) and loaded, search errors as tool errors, a disabled
/// `coffer__remember` refused like any disabled tool, and every call in the invocation log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_skills_through_the_shim_with_a_real_mcp_client() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let skills = home.root().join("skills");
    write(
        &skills.join("release-notes/SKILL.md"),
        "---\nname: release-notes\ndescription: Write release notes from the git log.\n---\n# Release notes\n\nRead the log since the last tag.\n",
    )?;
    write(&skills.join("release-notes/template.md"), "## Changes\n")?;
    write(&skills.join("broken/SKILL.md"), "---\nname: [broken\n---\n")?;
    let api = home.start_daemon().await?;
    let mut client = PyClient::through_shim(&home, &[]).await?;
    let tools = client.tools().await?;
    for t in ["search_knowledge", "recall", "remember", "forget", "list_skills", "load_skill"] {
        ensure!(tools.contains(&format!("coffer__{t}")), "{tools:?}");
    }

    // remember → a file on disk; its source names the client (the SDK's default name, "mcp").
    let r = client
        .call("coffer__remember", json!({"text": "The staging database is db-stage-2", "tags": ["deploy"]}))
        .await?;
    let result = r.get("result").with_context(|| format!("{r}"))?;
    ensure!(result["isError"] != true, "{result}");
    let fact = &result["structuredContent"]["fact"];
    let id = fact["id"].as_str().context("fact id")?.to_owned();
    assert_eq!(texts(result), format!("Remembered as fact {id}."));
    let file = Path::new(fact["path"].as_str().context("path")?).to_path_buf();
    ensure!(file.starts_with(home.root().join("memory")), "{}", file.display());
    let on_disk = std::fs::read_to_string(&file)?;
    ensure!(on_disk.contains("The staging database is db-stage-2"), "{on_disk}");
    let stored = api.get(&format!("/v1/memory/{id}")).reply().await?.ok_json()?;
    assert_eq!(stored["source"], "mcp:mcp", "{stored}");
    assert_eq!(stored["tags"], json!(["deploy"]));
    let dup = client.call_text("coffer__remember", json!({"text": "The staging database is db-stage-2"})).await?;
    ensure!(dup.starts_with(&format!("Not saved again: fact {id} already says this")), "{dup}");

    let recalled = client.call_text("coffer__recall", json!({"query": "which staging database"})).await?;
    ensure!(recalled.contains(&format!("fact {id}")) && recalled.contains("db-stage-2"), "{recalled}");

    // Skills: the good one listed, the malformed one named; loaded in full.
    let listed = client.call_text("coffer__list_skills", json!({})).await?;
    ensure!(listed.contains("release-notes — Write release notes from the git log."), "{listed}");
    ensure!(listed.contains("not loadable: broken"), "{listed}");
    let loaded = client.call_text("coffer__load_skill", json!({"name": "release-notes"})).await?;
    ensure!(
        loaded.starts_with("# Skill: release-notes\n") && loaded.contains("Read the log since the last tag."),
        "{loaded}"
    );
    ensure!(loaded.contains("template.md"), "{loaded}");

    // Bad arguments and refusals are tool errors the model can read.
    for (tool, args, needle) in [
        ("coffer__load_skill", json!({"name": "../etc"}), ""),
        ("coffer__load_skill", json!({"name": "absent"}), "absent"),
        ("coffer__search_knowledge", json!({"query": " "}), "give a query, or tags to list the notes with them"),
        ("coffer__search_knowledge", json!({"query": "x".repeat(10_000)}), "8192"),
        ("coffer__remember", json!({"txt": "x"}), "unknown argument \"txt\""),
    ] {
        let r = client.call(tool, args).await?;
        let result = r.get("result").with_context(|| format!("{tool}: {r}"))?;
        ensure!(result["isError"] == true, "{tool}: {result}");
        ensure!(texts(result).contains(needle), "{tool}: {result}");
    }

    // forget → the file is gone; the id is unknown after.
    assert_eq!(client.call_text("coffer__forget", json!({"id": id})).await?, format!("Forgot fact {id}."));
    ensure!(!file.exists(), "{} is still there", file.display());
    api.get(&format!("/v1/memory/{id}")).reply().await?.expect_envelope(404, "NOT_FOUND")?;

    // Disabled like any tool: TOOL_DISABLED, and nothing is written.
    set_tool_enabled(&api, "coffer__remember", false).await?;
    let refused = client.call("coffer__remember", json!({"text": "should not be saved"})).await?;
    assert_eq!(refused["error"]["code"], -32000, "{refused}");
    assert_eq!(refused["error"]["message"], "Tool coffer__remember is disabled");
    let facts = api.get("/v1/memory").reply().await?.ok_json()?;
    ensure!(!facts.to_string().contains("should not be saved"), "{facts}");

    // The invocation log has every call, under the built-in server, arguments never stored.
    let rows = wait_for("coffer__remember calls in /v1/invocations", Duration::from_secs(10), || async {
        let v = api.get("/v1/invocations?target=coffer__remember").reply().await?.ok_json()?;
        let rows = v["items"].as_array().cloned().unwrap_or_default();
        Ok((rows.len() >= 4).then_some(rows))
    })
    .await?;
    let outcomes: Vec<&str> = rows.iter().filter_map(|r| r["outcome"].as_str()).collect();
    ensure!(outcomes.contains(&"ok") && outcomes.contains(&"disabled"), "{rows:?}");
    ensure!(rows.iter().all(|r| r["server"] == "coffer" && r["actor"] == "mcp"), "{rows:?}");
    ensure!(!serde_json::to_string(&rows)?.contains("db-stage-2"), "arguments are never stored");
    for t in ["coffer__recall", "coffer__forget", "coffer__list_skills", "coffer__load_skill"] {
        let v = api.get(&format!("/v1/invocations?target={t}")).reply().await?.ok_json()?;
        ensure!(v["items"].as_array().is_some_and(|i| !i.is_empty()), "{t}: {v}");
    }
    client.close().await?;
    home.terminate_daemon(Duration::from_secs(20)).await
}

/// The CLI: `kb add` with a relative path, `kb reindex` (progress lines off a terminal, a
/// summary; `--json` the final body; `--no-wait`), `kb status`, `kb search`, `memory` and
/// `skills` commands, with the CLI's exit codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kb_memory_and_skills_commands() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("work/notes");
    notes(&dir)?;
    for i in 0..30 {
        write(
            &dir.join(format!("many/note-{i:02}.md")),
            format!("# Note {i}\n\nA note about topic {i} and quokkas.\n"),
        )?;
    }
    write(
        &home.root().join("skills/pdf/SKILL.md"),
        "---\nname: pdf\ndescription: Fill PDF forms.\n---\nUse fill.py.\n",
    )?;
    let api = home.start_daemon().await?;

    // A relative --path is taken from the current folder.
    let mut add = home.cli_command(&["kb", "add", "notes", "--path", "notes"])?;
    add.current_dir(home.temp().join("work"));
    let out = add.output().await?;
    ensure!(out.status.success(), "kb add: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(stdout.contains(&format!("Added knowledge base notes ({})", dir.canonicalize()?.display())), "{stdout}");
    indexed(&api, "notes", 33).await?;
    let dup = home.cli(&["kb", "add", "notes", "--path", &dir.display().to_string()]).await?;
    assert_eq!(dup.code, Some(4), "{dup:?}");

    // reindex: plain progress lines on stderr (not a terminal), then the summary.
    let out = home.cli(&["kb", "reindex", "notes", "--clean"]).await?.ok()?;
    ensure!(out.stderr.contains("reindex: "), "{out:?}");
    ensure!(!out.stderr.contains('\u{1b}'), "no bar off a terminal: {out:?}");
    let first = out.stdout.lines().nth(1).unwrap_or_default().to_owned();
    ensure!(
        out.stdout.starts_with("NAME   DOCUMENTS  CHUNKS  ERRORS  STATE\n") && first.starts_with("notes  33 "),
        "{out:?}"
    );
    let json = home.cli(&["kb", "reindex", "notes", "--json"]).await?.ok()?.json()?;
    assert_eq!(
        (&json["name"], &json["progress"]["state"], &json["documents"]),
        (&json!("notes"), &json!("idle"), &json!(33))
    );
    let json = home.cli(&["kb", "reindex", "--no-wait", "--json"]).await?.ok()?.json()?;
    ensure!(json["items"].as_array().is_some_and(|i| i.iter().any(|k| k["name"] == "notes")), "{json}");
    indexed(&api, "notes", 33).await?;

    // status, list, show.
    let out = home.cli(&["kb", "status"]).await?.ok()?;
    ensure!(
        out.stdout.starts_with("NAME ") && out.stdout.contains("\nnotes ") && out.stdout.contains("\nmemory "),
        "{out:?}"
    );
    ensure!(out.stdout.contains("ENGINE") && out.stdout.contains("keyword"), "{out:?}");
    let json = home.cli(&["kb", "status", "--json"]).await?.ok()?.json()?;
    ensure!(json["engines"].is_array() && json["items"].is_array(), "{json}");
    let out = home.cli(&["kb", "show", "notes"]).await?.ok()?;
    ensure!(out.stdout.contains("documents: 33"), "{out:?}");
    assert_eq!(home.cli(&["kb", "show", "nosuch"]).await?.code, Some(3));
    let json = home.cli(&["kb", "list", "--json"]).await?.ok()?.json()?;
    ensure!(
        json["items"].as_array().is_some_and(|i| i.iter().any(|k| k["name"] == "notes" && k["documents"] == 33)),
        "{json}"
    );

    // search: compact results and the engines' report; plain text off a terminal.
    let out = home.cli(&["kb", "search", "overlapping", "bigrams"]).await?.ok()?;
    ensure!(out.stdout.starts_with("notes:tokenizer.md:"), "{out:?}");
    ensure!(
        out.stdout.contains("engines: ") && !out.stdout.contains("**") && !out.stdout.contains('\u{1b}'),
        "{out:?}"
    );
    let json = home.cli(&["kb", "search", "quokkas", "--limit", "5", "--json"]).await?.ok()?.json()?;
    assert_eq!(json["results"].as_array().map(Vec::len), Some(5), "{json}");
    let bad = home.cli(&["kb", "search", " "]).await?;
    assert_eq!(bad.code, Some(2), "an empty query is a usage error: {bad:?}");

    // memory and skills.
    let out =
        home.cli(&["memory", "remember", "Prefers", "pytest", "--tag", "testing", "--json"]).await?.ok()?.json()?;
    let id = out["fact"]["id"].as_str().context("id")?.to_owned();
    assert_eq!((&out["created"], &out["fact"]["source"]), (&json!(true), &json!("cli")));
    let out = home.cli(&["memory", "list"]).await?.ok()?;
    ensure!(out.stdout.contains(&id) && out.stdout.contains("Prefers pytest"), "{out:?}");
    let out = home.cli(&["memory", "recall", "pytest"]).await?.ok()?;
    ensure!(out.stdout.contains(&format!("fact {id}")), "{out:?}");
    home.cli(&["memory", "forget", &id]).await?.ok()?;
    assert_eq!(home.cli(&["memory", "show", &id]).await?.code, Some(3));
    let out = home.cli(&["skills", "list"]).await?.ok()?;
    ensure!(out.stdout.contains("pdf") && out.stdout.contains("Fill PDF forms."), "{out:?}");
    let out = home.cli(&["skills", "show", "pdf"]).await?.ok()?;
    ensure!(out.stdout.ends_with("\nUse fill.py.\n"), "{out:?}");
    assert_eq!(home.cli(&["skills", "show", "absent"]).await?.code, Some(3));
    // Names a URL cannot carry as one path segment: usage errors naming the argument, not the
    // daemon's answer for the path they would resolve to.
    for (args, what) in [
        (&["memory", "show", ".."][..], "fact id"),
        (&["memory", "forget", "."], "fact id"),
        (&["skills", "show", ".."], "skill name"),
        (&["kb", "show", ".."], "knowledge base"),
        (&["kb", "remove", ""], "knowledge base"),
    ] {
        let out = home.cli(args).await?;
        ensure!(
            out.code == Some(2) && out.stderr.contains(what) && !out.stderr.contains("no route"),
            "{args:?}: {out:?}"
        );
    }

    let out = home.cli(&["kb", "remove", "notes"]).await?.ok()?;
    ensure!(out.stdout.contains("33 documents forgotten; no file was deleted"), "{out:?}");
    ensure!(dir.join("tokenizer.md").is_file());
    home.terminate_daemon(Duration::from_secs(20)).await
}

/// While `coffer-retrieval` is not running (here: `coffer-test-daemon`, where it is on demand
/// and stopped), REST answers 503 with a clear envelope, the built-in tools answer a clear tool
/// error within seconds (not a hang), and the CLI exits 1 saying so. The edge notices the silent
/// service by its keep-alive ping, every 250 ms here (`COFFER_RETRIEVAL_PING_MS`; 1 s by
/// default, ~3 s per call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrieval_not_running_is_a_503_and_a_clear_tool_error() -> anyhow::Result<()> {
    let home = TestHome::builder().env("COFFER_RETRIEVAL_PING_MS", "250").build()?;
    let api = home.start_daemon_binary("coffer-test-daemon").await?;
    let retrieval = api.service("retrieval").await?;
    assert_eq!(retrieval["state"], "stopped", "{retrieval}");

    let started = Instant::now();
    for (method, path, body) in [
        (Method::GET, "/v1/knowledge", None),
        (Method::POST, "/v1/knowledge/search", Some(json!({"query": "x"}))),
        (Method::POST, "/v1/memory", Some(json!({"text": "x"}))),
        (Method::GET, "/v1/skills", None),
    ] {
        let mut req = api.request(method, path);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let e = req.reply().await?.expect_envelope(503, "SERVICE_UNAVAILABLE")?;
        ensure!(
            e["message"].as_str().is_some_and(|m| m.starts_with("the retrieval service is not running (")),
            "{path}: {e}"
        );
    }
    ensure!(started.elapsed() < Duration::from_secs(30), "4 requests took {:?}", started.elapsed());

    let mut client = PyClient::through_shim(&home, &[]).await?;
    let started = Instant::now();
    let r = client.call("coffer__recall", json!({"query": "anything"})).await?;
    let result = r.get("result").with_context(|| format!("{r}"))?;
    ensure!(result["isError"] == true, "{result}");
    ensure!(texts(result).starts_with("the retrieval service is not running ("), "{result}");
    ensure!(started.elapsed() < Duration::from_secs(10), "the tool error took {:?}", started.elapsed());
    // The rest of the gateway is unaffected.
    ensure!(client.tools().await?.contains(&"coffer__search_tools".to_owned()));
    client.close().await?;

    let out = home.cli(&["kb", "list"]).await?;
    assert_eq!(out.code, Some(1), "{out:?}");
    ensure!(out.stderr.contains("the retrieval service is not running"), "{out:?}");
    home.terminate_daemon(Duration::from_secs(20)).await
}
