//! LLM connections end to end on a running daemon: the REST resource (`/v1/llm/connections…`:
//! CRUD with ETag/If-Match, the one internal default, an `api_key` stored once as a credential
//! and never shown back), its hostile-input answers, and the `coffer llm …` commands with the
//! lines `coffer status` and `coffer doctor` add.
use anyhow::{Context, ensure};
use coffer_tests::{Api, Reply, SendExt, TestHome};
use reqwest::Method;
use serde_json::{Value, json};

/// A key no response, log line or file may hold in plaintext.
const KEY: &str = "sk-ant-e2e-4c1d9a7f3b2e8d6a0f5c1b9e7d3a2f8c";

async fn create(api: &Api, body: &Value) -> anyhow::Result<Reply> {
    api.post_json("/v1/llm/connections", body).header("X-Coffer-Actor", "cli").reply().await
}

async fn names_of_defaults(api: &Api) -> anyhow::Result<Vec<String>> {
    let list = api.get("/v1/llm/connections").reply().await?.ok_json()?;
    Ok(list["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter(|c| c["internal_default"] == true)
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect())
}

/// Every regular file under `dir` holding `needle`.
fn files_holding(dir: &std::path::Path, needle: &str) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let Ok(bytes) = std::fs::read(e.path()) else { continue };
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    found.push(e.path());
                }
            }
        }
    }
    Ok(found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_crud_default_and_key_over_rest() -> anyhow::Result<()> {
    let home = TestHome::builder().log_filter("debug").build()?;
    let api = home.start_daemon().await?;
    let mut bodies = Vec::new();

    // Create with a key: the key becomes credential llm-claude; the body never shows it.
    let r = create(
        &api,
        &json!({"name": "claude", "wire": "anthropic", "model": "claude-sonnet-4-5", "api_key": KEY, "internal_default": true}),
    )
    .await?;
    bodies.push(r.text.clone());
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    ensure!(r.headers.get("etag").is_some_and(|v| v == "\"1\""), "ETag: {:?}", r.headers);
    ensure!(r.headers.get("location").is_some_and(|v| v == "/v1/llm/connections/claude"), "{:?}", r.headers);
    let c = r.json()?;
    assert_eq!(
        (
            c["wire"].as_str(),
            c["credential_ref"].as_str(),
            c["credential_set"].as_bool(),
            c["internal_default"].as_bool()
        ),
        (Some("anthropic"), Some("llm-claude"), Some(true), Some(true)),
        "{c}"
    );
    assert_eq!(
        (c["base_url"].clone(), c["fast_model"].clone(), c["version"].as_i64()),
        (Value::Null, Value::Null, Some(1))
    );
    let creds = api.get("/v1/credentials").reply().await?.ok_json()?;
    ensure!(creds["items"].as_array().is_some_and(|i| i.iter().any(|c| c["name"] == "llm-claude")), "{creds}");

    // A second default takes the flag; a connection naming an unset credential says so.
    let r = create(
        &api,
        &json!({"name": "local", "wire": "ollama", "base_url": "http://127.0.0.1:11434", "model": "llama3.2"}),
    )
    .await?;
    ensure!(r.status == 201, "{}", r.text);
    assert_eq!(r.json()?["credential_set"], false);
    let r = create(
        &api,
        &json!({"name": "gpt", "wire": "openai-responses", "model": "gpt-5", "credential_ref": "openai-key", "internal_default": true}),
    )
    .await?;
    ensure!(r.status == 201, "{}", r.text);
    let gpt = r.json()?;
    assert_eq!((gpt["credential_ref"].as_str(), gpt["credential_set"].as_bool()), (Some("openai-key"), Some(false)));
    assert_eq!(names_of_defaults(&api).await?, ["gpt"]);

    // Default routes: set (idempotent), clear only when it is the default.
    let r = api.post("/v1/llm/connections/claude/default").reply().await?.ok_json()?;
    assert_eq!(r["internal_default"], true);
    api.post("/v1/llm/connections/claude/default").reply().await?.ok_json()?;
    assert_eq!(names_of_defaults(&api).await?, ["claude"]);
    let r = api.request(Method::DELETE, "/v1/llm/connections/gpt/default").reply().await?;
    ensure!(r.status == 204, "{}", r.text);
    assert_eq!(names_of_defaults(&api).await?, ["claude"], "clearing another one changes nothing");
    let r = api.request(Method::DELETE, "/v1/llm/connections/claude/default").reply().await?;
    ensure!(r.status == 204, "{}", r.text);
    assert!(names_of_defaults(&api).await?.is_empty());
    api.post("/v1/llm/connections/ghost/default").reply().await?.expect_envelope(404, "NOT_FOUND")?;

    // PATCH with If-Match: stale → 409, current → the new version; a key alone keeps the version.
    let cur = api.get("/v1/llm/connections/claude").reply().await?;
    let etag = cur.headers.get("etag").context("etag")?.to_str()?.to_owned();
    let r = api
        .request(Method::PATCH, "/v1/llm/connections/claude")
        .header("If-Match", "\"1\"")
        .json(&json!({"model": "claude-opus-4-1"}))
        .reply()
        .await?;
    let e = r.expect_envelope(409, "CONFLICT")?;
    assert_eq!(e["details"]["expected_version"], 1, "{e}");
    let r = api
        .request(Method::PATCH, "/v1/llm/connections/claude")
        .header("If-Match", &etag)
        .json(&json!({"model": "claude-opus-4-1", "fast_model": "claude-haiku-4-5", "base_url": "http://127.0.0.1:9"}))
        .reply()
        .await?;
    bodies.push(r.text.clone());
    let c = r.ok_json()?;
    let version = c["version"].as_i64().context("version")?;
    assert_eq!(
        (c["model"].as_str(), c["fast_model"].as_str(), c["base_url"].as_str()),
        (Some("claude-opus-4-1"), Some("claude-haiku-4-5"), Some("http://127.0.0.1:9"))
    );
    let r = api
        .request(Method::PATCH, "/v1/llm/connections/claude")
        .json(&json!({"api_key": format!("{KEY}-2")}))
        .reply()
        .await?;
    bodies.push(r.text.clone());
    assert_eq!(r.ok_json()?["version"].as_i64(), Some(version), "a key alone is not a record change");
    let r = api.request(Method::PATCH, "/v1/llm/connections/gpt").json(&json!({"api_key": KEY})).reply().await?;
    assert_eq!(r.ok_json()?["credential_set"], true, "the key went to the credential gpt names");
    let r = api
        .request(Method::PATCH, "/v1/llm/connections/claude")
        .json(&json!({"fast_model": null, "base_url": null}))
        .reply()
        .await?
        .ok_json()?;
    assert_eq!((r["fast_model"].clone(), r["base_url"].clone()), (Value::Null, Value::Null));
    api.request(Method::PATCH, "/v1/llm/connections/ghost")
        .json(&json!({"model": "m"}))
        .reply()
        .await?
        .expect_envelope(404, "NOT_FOUND")?;

    // The audit names the actor and the connection, never the key.
    let audit = api.get("/v1/audit?limit=100").reply().await?;
    bodies.push(audit.text.clone());
    let audit = audit.ok_json()?;
    let create_row = audit["items"]
        .as_array()
        .context("items")?
        .iter()
        .find(|e| e["action"] == "llm.create" && e["target"] == "claude")
        .with_context(|| format!("no llm.create row: {audit}"))?;
    assert_eq!(create_row["actor"], "cli");

    // DELETE honours If-Match and takes the generated credential with it (not a named one).
    let r = api.request(Method::DELETE, "/v1/llm/connections/claude").header("If-Match", "\"1\"").reply().await?;
    r.expect_envelope(409, "CONFLICT")?;
    let r = api.request(Method::DELETE, "/v1/llm/connections/claude").reply().await?;
    ensure!(r.status == 204, "{}", r.text);
    api.get("/v1/llm/connections/claude").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    api.request(Method::DELETE, "/v1/llm/connections/gpt").reply().await?;
    let creds = api.get("/v1/credentials").reply().await?.ok_json()?;
    let names: Vec<&str> =
        creds["items"].as_array().context("items")?.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["openai-key"], "llm-claude went with its connection; the named credential stays");

    for b in &bodies {
        ensure!(!b.contains(KEY), "a response holds the key: {b}");
    }
    ensure!(api.post("/v1/daemon/stop").reply().await?.status == 202);
    home.wait_no_processes(std::time::Duration::from_secs(15)).await?;
    let holders = files_holding(home.root(), KEY)?;
    ensure!(holders.is_empty(), "the key is in plaintext in {holders:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_connection_requests_get_envelopes_and_write_nothing() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let ok = json!({"name": "a", "wire": "anthropic", "model": "m", "credential_ref": "k"});
    let with = |k: &str, v: Value| {
        let mut b = ok.clone();
        b[k] = v;
        b
    };
    let cases: Vec<(Value, u16, &str, &str)> = vec![
        (with("wire", json!("gemini")), 400, "INVALID_ARGUMENT", "is not one of anthropic, openai-responses"),
        (with("wire", json!("openai")), 400, "INVALID_ARGUMENT", "is not one of"),
        (with("base_url", json!("not a url")), 400, "INVALID_ARGUMENT", "base_url"),
        (with("base_url", json!("localhost:11434")), 400, "INVALID_ARGUMENT", "http:// or https://"),
        (with("base_url", json!("https://u:p@h/")), 400, "INVALID_ARGUMENT", "user name or password"),
        (with("base_url", json!("https://h/v1?key=x")), 400, "INVALID_ARGUMENT", "query"),
        (with("base_url", json!(format!("https://h/{}", "a".repeat(2100)))), 400, "INVALID_ARGUMENT", "at most 2048"),
        (with("credential_ref", json!("")), 400, "INVALID_ARGUMENT", "credential_ref is required"),
        (with("credential_ref", json!("no spaces")), 400, "INVALID_ARGUMENT", "not a valid credential name"),
        (with("model", json!("")), 400, "INVALID_ARGUMENT", "model must be 1-256 bytes"),
        (with("model", json!("a\u{1}b")), 400, "INVALID_ARGUMENT", "control"),
        (with("name", json!("Bad")), 400, "INVALID_ARGUMENT", "name \"Bad\" is invalid"),
        (with("name", json!("test")), 400, "INVALID_ARGUMENT", "reserved"),
        (with("api_key", json!("")), 400, "INVALID_ARGUMENT", "api_key must be 1-65536 bytes"),
        (with("api_key", json!("sk-line\n")), 400, "INVALID_ARGUMENT", "control"),
        (with("extra", json!(1)), 400, "UNKNOWN_FIELD", "unknown field"),
        (
            with("internal_default", json!("yes")),
            400,
            "INVALID_ARGUMENT",
            "field \"internal_default\" must be a boolean",
        ),
        (
            json!({"name": "o", "wire": "ollama", "model": "m"}),
            400,
            "INVALID_ARGUMENT",
            "base_url is required for an ollama",
        ),
    ];
    for (body, status, code, needle) in &cases {
        let e = create(&api, body).await?.expect_envelope(*status, code).with_context(|| body.to_string())?;
        let m = e["message"].as_str().unwrap_or_default();
        ensure!(m.contains(needle), "{body}: message {m:?} lacks {needle:?}");
        ensure!(!m.contains("sk-line"), "the key was quoted: {m}");
    }
    let list = api.get("/v1/llm/connections").reply().await?.ok_json()?;
    assert_eq!(list["items"], json!([]), "nothing was written");
    let creds = api.get("/v1/credentials").reply().await?.ok_json()?;
    assert_eq!(creds["items"], json!([]), "no credential from a refused create");

    // Malformed JSON, the wrong media type, an oversized body, a duplicate.
    let r =
        api.post("/v1/llm/connections").header("content-type", "application/json").body("{\"name\":").reply().await?;
    r.expect_envelope(400, "BAD_REQUEST")?;
    let r = api.post("/v1/llm/connections").header("content-type", "text/plain").body(ok.to_string()).reply().await?;
    r.expect_envelope(415, "UNSUPPORTED_MEDIA_TYPE")?;
    let big = json!({"name": "a", "wire": "anthropic", "model": "m", "api_key": "k".repeat(3 * 1024 * 1024)});
    create(&api, &big).await?.expect_envelope(413, "PAYLOAD_TOO_LARGE")?;
    // Eight concurrent creates of one name, each with its own key: one wins, the others are
    // refused before their key is stored.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let api = api.clone();
            let body = json!({"name": "a", "wire": "anthropic", "model": "m", "api_key": format!("key-{i}")});
            tokio::spawn(async move { create(&api, &body).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await??.status.as_u16());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 409, 409, 409, 409, 409, 409, 409], "one create wins");
    let creds = api.get("/v1/credentials").reply().await?.ok_json()?;
    let names: Vec<&str> =
        creds["items"].as_array().context("items")?.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["llm-a"], "one credential, the winner's");
    create(&api, &ok).await?.expect_envelope(409, "ALREADY_EXISTS")?;

    // If-Match that is not a version tag; a rename; an unknown wire in a patch.
    for bad in ["W/\"1\"", "abc", "\"1\", \"2\""] {
        let r = api
            .request(Method::PATCH, "/v1/llm/connections/a")
            .header("If-Match", bad)
            .json(&json!({"model": "x"}))
            .reply()
            .await?;
        r.expect_envelope(400, "INVALID_ARGUMENT").with_context(|| bad.to_owned())?;
    }
    let r = api.request(Method::PATCH, "/v1/llm/connections/a").json(&json!({"name": "b"})).reply().await?;
    r.expect_envelope(400, "INVALID_ARGUMENT")?;
    let r = api.request(Method::PATCH, "/v1/llm/connections/a").json(&json!({"wire": "soap"})).reply().await?;
    r.expect_envelope(400, "INVALID_ARGUMENT")?;
    let r = api.request(Method::PATCH, "/v1/llm/connections/a").json(&json!({"credential_ref": null})).reply().await?;
    // (The cloud wire on its public API needs a credential.)
    let e = r.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("credential_ref is required")), "{e}");
    let after = api.get("/v1/llm/connections/a").reply().await?.ok_json()?;
    assert_eq!(
        (after["version"].as_i64(), after["model"].as_str()),
        (Some(1), Some("m")),
        "refused patches wrote nothing"
    );

    // Host and Origin: a foreign one is refused before anything runs.
    for host in ["evil.example", "evil.example:80", "127.0.0.1.nip.io"] {
        let r = api.get("/v1/llm/connections").header("Host", host).reply().await?;
        r.expect_envelope(403, "FORBIDDEN").with_context(|| host.to_owned())?;
    }
    let r = api
        .post_json(
            "/v1/llm/connections",
            &json!({"name": "b", "wire": "anthropic", "model": "m", "credential_ref": "k"}),
        )
        .header("Origin", "http://evil.example")
        .reply()
        .await?;
    r.expect_envelope(403, "FORBIDDEN")?;
    api.get("/v1/llm/connections/b").reply().await?.expect_envelope(404, "NOT_FOUND")?;

    // Drafts are checked before anything is sent to coffer-chat.
    let drafts: Vec<(&str, Value, &str)> = vec![
        // A draft never uses a stored credential (issue 32); a key it carries must be one.
        ("test", json!({"wire": "anthropic", "model": "m", "credential_ref": "k"}), "cannot use a stored credential"),
        ("models", json!({"wire": "anthropic", "credential_ref": "k"}), "cannot use a stored credential"),
        ("test", json!({"wire": "anthropic", "model": "m", "api_key": ""}), "api_key must be"),
        ("test", json!({"wire": "gemini", "model": "m"}), "is not one of"),
        ("test", json!({"wire": "anthropic"}), "model must be"),
        ("models", json!({"wire": "ollama"}), "base_url is required"),
        ("models", json!({"wire": "openai-chat", "base_url": "ftp://x"}), "http:// or https://"),
    ];
    for (what, body, needle) in &drafts {
        let r = api.post_json(&format!("/v1/llm/connections/{what}"), body).reply().await?;
        let e = r.expect_envelope(400, "INVALID_ARGUMENT").with_context(|| body.to_string())?;
        let m = e["message"].as_str().unwrap_or_default();
        ensure!(m.contains(needle) && !m.contains(KEY), "{body}: {m}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_adds_lists_edits_defaults_and_removes_connections() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let _api = home.start_daemon().await?;
    let run = |args: &'static [&'static str], env: Option<(&'static str, &'static str)>| {
        let mut cmd = home.cli_command(args).expect("coffer");
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        async move { cmd.output().await.context("running coffer") }
    };
    let text = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let err = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();

    // No default yet: status and doctor say coffer__ask needs one.
    let o = run(&["status"], None).await?;
    ensure!(o.status.success() && text(&o).contains("Internal LLM connection: none"), "{}", text(&o));
    let o = run(&["doctor", "--json"], None).await?;
    let doc: Value = serde_json::from_slice(&o.stdout)?;
    let llm = doc["checks"].as_array().context("checks")?.iter().find(|c| c["name"] == "llm").cloned();
    ensure!(llm.as_ref().is_some_and(|c| c["status"] == "warn"), "{doc}");

    let o = run(
        &[
            "llm",
            "add",
            "claude",
            "--wire",
            "anthropic",
            "--model",
            "claude-sonnet-4-5",
            "--api-key-env",
            "E2E_KEY",
            "--default",
        ],
        Some(("E2E_KEY", KEY)),
    )
    .await?;
    ensure!(o.status.success(), "add: {} {}", text(&o), err(&o));
    ensure!(text(&o).contains("credential llm-claude") && !text(&o).contains(KEY), "{}", text(&o));
    let o = run(&["llm", "add", "gpt", "--wire", "openai", "--model", "gpt-5", "--api-key-env", "E2E_UNSET_VAR"], None)
        .await?;
    ensure!(o.status.code() == Some(2) && err(&o).contains("E2E_UNSET_VAR"), "{}", err(&o));
    let o = run(&["llm", "add", "gpt", "--wire", "gemini", "--model", "m"], None).await?;
    ensure!(o.status.code() == Some(2), "unknown wire: {}", err(&o));
    let o = run(&["llm", "add", "local", "--wire", "ollama", "--model", "llama3.2"], None).await?;
    ensure!(o.status.code() == Some(2) && err(&o).contains("base_url is required"), "{} {}", o.status, err(&o));
    let o = run(
        &["llm", "add", "local", "--wire", "ollama", "--base-url", "http://127.0.0.1:11434", "--model", "llama3.2"],
        None,
    )
    .await?;
    ensure!(o.status.success(), "{}", err(&o));

    let o = run(&["llm", "list", "--json"], None).await?;
    let list: Value = serde_json::from_slice(&o.stdout)?;
    let names: Vec<&str> =
        list["items"].as_array().context("items")?.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["claude", "local"]);
    let o = run(&["llm", "list"], None).await?;
    ensure!(text(&o).contains("set (llm-claude)") && text(&o).contains("(provider's API)"), "{}", text(&o));

    let o = run(&["llm", "edit", "local", "--fast-model", "llama3.2:1b", "--default"], None).await?;
    ensure!(o.status.success(), "{}", err(&o));
    let o = run(&["llm", "default"], None).await?;
    ensure!(text(&o).starts_with("local is the internal default"), "{}", text(&o));
    let o = run(&["llm", "show", "local", "--json"], None).await?;
    let local: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!((local["fast_model"].as_str(), local["internal_default"].as_bool()), (Some("llama3.2:1b"), Some(true)));
    let o = run(&["status"], None).await?;
    ensure!(text(&o).contains("Internal LLM connection: local (ollama, llama3.2)"), "{}", text(&o));
    let o = run(&["doctor", "--json"], None).await?;
    let doc: Value = serde_json::from_slice(&o.stdout)?;
    let llm = doc["checks"].as_array().context("checks")?.iter().find(|c| c["name"] == "llm").cloned();
    ensure!(llm.as_ref().is_some_and(|c| c["status"] == "ok"), "{doc}");

    let o = run(&["llm", "default", "--clear"], None).await?;
    ensure!(o.status.success(), "{}", err(&o));
    let o = run(&["llm", "default", "--json"], None).await?;
    assert_eq!(serde_json::from_slice::<Value>(&o.stdout)?, json!({"internal_default": null}));
    let o = run(&["llm", "edit", "local"], None).await?;
    ensure!(o.status.code() == Some(2), "nothing to change: {}", err(&o));
    let o = run(&["llm", "show", "ghost"], None).await?;
    ensure!(o.status.code() == Some(3), "unknown: {:?} {}", o.status, err(&o));
    let o = run(&["llm", "remove", "claude"], None).await?;
    ensure!(o.status.success(), "{}", err(&o));
    let o = run(&["credentials", "list", "--json"], None).await?;
    let creds: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(creds["items"], json!([]), "llm-claude went with claude");
    Ok(())
}

/// The credential Coffer names for a connection's key (`llm-<name>`) is never taken from someone
/// else: adding a connection with a key when a credential of that name already exists (here an
/// MCP server's secret) is refused and leaves that secret as it was; and the key Coffer kept goes
/// once the connection is edited to name another credential, then removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_s_key_never_replaces_another_credential_and_leaves_none_behind() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let names = |api: &Api| {
        let api = api.clone();
        async move {
            let creds = api.get("/v1/credentials").reply().await?.ok_json()?;
            let v: Vec<(String, i64)> = creds["items"]
                .as_array()
                .context("items")?
                .iter()
                .map(|c| (c["name"].as_str().unwrap_or_default().to_owned(), c["version"].as_i64().unwrap_or(0)))
                .collect();
            anyhow::Ok(v)
        }
    };
    let r = api
        .request(Method::PUT, "/v1/credentials/llm-foo")
        .json(&json!({"value": "ghp-the-server-token"}))
        .reply()
        .await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    let r = create(
        &api,
        &json!({"name": "foo", "wire": "ollama", "base_url": "http://127.0.0.1:9", "model": "m", "api_key": KEY}),
    )
    .await?;
    let e = r.expect_envelope(409, "CONFLICT")?;
    ensure!(e.to_string().contains("llm-foo") && e.to_string().contains("credential_ref"), "{e}");
    api.get("/v1/llm/connections/foo").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    assert_eq!(names(&api).await?, [("llm-foo".to_owned(), 1)], "the existing secret is untouched");

    // Edited away from the key Coffer kept, then removed: nothing of it is left.
    let r = create(
        &api,
        &json!({"name": "orph", "wire": "ollama", "base_url": "http://127.0.0.1:9", "model": "m", "api_key": KEY}),
    )
    .await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    assert!(names(&api).await?.iter().any(|(n, _)| n == "llm-orph"));
    let r =
        api.request(Method::PATCH, "/v1/llm/connections/orph").json(&json!({"credential_ref": null})).reply().await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    assert!(!names(&api).await?.iter().any(|(n, _)| n == "llm-orph"), "the kept key went with the edit");
    let r = api.request(Method::DELETE, "/v1/llm/connections/orph").reply().await?;
    ensure!(r.status == 204, "{}", r.text);
    assert_eq!(names(&api).await?, [("llm-foo".to_owned(), 1)]);
    Ok(())
}
