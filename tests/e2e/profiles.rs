//! Profiles end to end on a running daemon (real store, real SQLite, real HTTP on loopback, the
//! real `coffer` binary): the REST resource (`/v1/mcp/profiles…`: CRUD with ETag/If-Match, the
//! `default` that always exists and cannot be removed), its hostile-input answers (each naming
//! the field), concurrent creates of one name, and the `coffer profile …` commands with their
//! exit codes.
use anyhow::{Context, ensure};
use coffer_tests::{Api, Reply, SendExt, TestHome};
use reqwest::Method;
use serde_json::{Value, json};

async fn create(api: &Api, body: &Value) -> anyhow::Result<Reply> {
    api.post_json("/v1/mcp/profiles", body).header("X-Coffer-Actor", "cli").reply().await
}

async fn put(api: &Api, name: &str, body: &Value, if_match: Option<&str>) -> anyhow::Result<Reply> {
    let mut req = api.request(Method::PUT, &format!("/v1/mcp/profiles/{name}")).json(body);
    if let Some(v) = if_match {
        req = req.header("If-Match", v);
    }
    req.reply().await
}

async fn names(api: &Api) -> anyhow::Result<Vec<String>> {
    let list = api.get("/v1/mcp/profiles").reply().await?.ok_json()?;
    Ok(list["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiles_crud_with_versions_and_the_default_over_rest() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;

    // `default` exists before anything wrote it: everything, full mode, version 0.
    let list = api.get("/v1/mcp/profiles").reply().await?.ok_json()?;
    assert_eq!(
        list["items"],
        json!([{"name": "default", "servers": {}, "tools": {}, "builtins": {}, "mode": "full", "version": 0, "updated_at": ""}])
    );
    let r = api.get("/v1/mcp/profiles/default").reply().await?;
    ensure!(r.status == 200 && r.headers.get("etag").is_some_and(|v| v == "\"0\""), "{} {:?}", r.text, r.headers);

    let body = json!({
        "name": "work",
        "description": "Work tools",
        "servers": {"include": ["git", "time*"]},
        "tools": {"exclude": ["git__git_push"]},
        "mode": "lazy",
        "overrides": {"time__get_current_time": {"name": "now", "description_append": "Any clock.", "hide_params": ["timezone"], "annotations": {"read_only": true}}}
    });
    let r = create(&api, &body).await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    ensure!(r.headers.get("etag").is_some_and(|v| v == "\"1\""), "{:?}", r.headers);
    ensure!(r.headers.get("location").is_some_and(|v| v == "/v1/mcp/profiles/work"), "{:?}", r.headers);
    let p = r.json()?;
    assert_eq!(p["overrides"]["time__get_current_time"]["name"], "now");
    assert_eq!((p["mode"].as_str(), p["version"].as_u64()), (Some("lazy"), Some(1)));
    let got = api.get("/v1/mcp/profiles/work").reply().await?.ok_json()?;
    assert_eq!(got, p, "reads back what it wrote");
    create(&api, &body).await?.expect_envelope(409, "ALREADY_EXISTS")?;
    create(&api, &json!({"name": "default"})).await?.expect_envelope(409, "ALREADY_EXISTS")?;

    // PUT replaces the whole spec; If-Match guards it; a stale one is 409 with both versions.
    let r = put(&api, "work", &json!({"mode": "full"}), Some("\"1\"")).await?;
    let p = r.ok_json()?;
    assert_eq!((p["version"].as_u64(), p["mode"].as_str(), p.get("overrides")), (Some(2), Some("full"), None));
    let e = put(&api, "work", &json!({}), Some("\"1\"")).await?.expect_envelope(409, "CONFLICT")?;
    assert_eq!(
        (e["details"]["expected_version"].as_i64(), e["details"]["current_version"].as_i64()),
        (Some(1), Some(2))
    );
    put(&api, "work", &json!({}), None).await?.ok_json()?;
    put(&api, "absent", &json!({}), None).await?.expect_envelope(404, "NOT_FOUND")?;
    put(&api, "work", &json!({}), Some("W/\"3\"")).await?.expect_envelope(400, "INVALID_ARGUMENT")?;

    // `default` is written at version 0, then edited; it cannot be removed.
    let d = put(&api, "default", &json!({"builtins": {"exclude": ["coffer__ask"]}}), Some("\"0\"")).await?.ok_json()?;
    assert_eq!(d["version"], 1);
    let e = api.request(Method::DELETE, "/v1/mcp/profiles/default").reply().await?.expect_envelope(409, "CONFLICT")?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("\"default\" cannot be removed")), "{e}");

    // DELETE honours If-Match.
    let del = |v: Option<&'static str>| {
        let mut req = api.request(Method::DELETE, "/v1/mcp/profiles/work");
        if let Some(v) = v {
            req = req.header("If-Match", v);
        }
        req.reply()
    };
    del(Some("\"1\"")).await?.expect_envelope(409, "CONFLICT")?;
    ensure!(del(Some("\"3\"")).await?.status == 204);
    del(None).await?.expect_envelope(404, "NOT_FOUND")?;
    assert_eq!(names(&api).await?, ["default"]);

    // Every write is audited with its actor.
    let audit = api.get("/v1/audit?limit=50").reply().await?.ok_json()?;
    let actions: Vec<String> = audit["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter(|a| a["action"].as_str().is_some_and(|s| s.starts_with("profile.")))
        .map(|a| {
            format!(
                "{} {} {}",
                a["action"].as_str().unwrap_or(""),
                a["target"].as_str().unwrap_or(""),
                a["actor"].as_str().unwrap_or("")
            )
        })
        .collect();
    ensure!(actions.contains(&"profile.create work cli".to_owned()), "{actions:?}");
    ensure!(actions.iter().any(|a| a.starts_with("profile.delete work")), "{actions:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_profile_requests_get_envelopes_naming_the_field_and_write_nothing() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let cases: Vec<(Value, &str, &str, &str)> = vec![
        (json!({"name": "Bad"}), "INVALID_ARGUMENT", "name", "must be 1 to 32 lowercase"),
        (json!({"name": ""}), "INVALID_ARGUMENT", "name", "must be 1 to 32"),
        (json!({"name": "x".repeat(33)}), "INVALID_ARGUMENT", "name", "must be 1 to 32"),
        (
            json!({"name": "w", "servers": {"include": ["a[b"]}}),
            "INVALID_ARGUMENT",
            "servers.include[0]",
            "is not a glob",
        ),
        (json!({"name": "w", "tools": {"exclude": [""]}}), "INVALID_ARGUMENT", "tools.exclude[0]", "1 to 256 bytes"),
        (
            json!({"name": "w", "builtins": {"include": vec!["x"; 257]}}),
            "INVALID_ARGUMENT",
            "builtins.include",
            "at most 256",
        ),
        (json!({"name": "w", "description": "d".repeat(4097)}), "INVALID_ARGUMENT", "description", "at most 4096"),
        (json!({"name": "w", "mode": "sometimes"}), "INVALID_ARGUMENT", "", "\"mode\" must be one of full, lazy"),
        (
            json!({"name": "w", "overrides": {"plain": {}}}),
            "INVALID_ARGUMENT",
            "overrides[\"plain\"]",
            "not an exposed tool name",
        ),
        (
            json!({"name": "w", "overrides": {"git__log": {"name": "a b"}}}),
            "INVALID_ARGUMENT",
            "overrides[\"git__log\"].name",
            "^[a-zA-Z0-9_-]{1,64}$",
        ),
        (
            json!({"name": "w", "overrides": {"git__a": {"name": "x"}, "git__b": {"name": "x"}}}),
            "INVALID_ARGUMENT",
            "overrides[\"git__b\"].name",
            "unique",
        ),
        (
            json!({"name": "w", "overrides": {"git__a": {"hide_params": [""]}}}),
            "INVALID_ARGUMENT",
            "overrides[\"git__a\"].hide_params[0]",
            "not blank",
        ),
        (json!({"name": "w", "overrides": {"git__a": {"hide_params": "p"}}}), "INVALID_ARGUMENT", "", "hide_params"),
        // A parameter the listed tool requires: never hidden, so refused rather than ignored.
        (
            json!({"name": "w", "overrides": {"coffer__read_note": {"hide_params": ["start_byte", "path"]}}}),
            "INVALID_ARGUMENT",
            "overrides[\"coffer__read_note\"].hide_params[1]",
            "\"path\" is a required parameter of coffer__read_note: a client must set it",
        ),
        // A parameter the listed tool does not have (a typo): it would hide nothing.
        (
            json!({"name": "w", "overrides": {"coffer__search_knowledge": {"hide_params": ["kb", "querry"]}}}),
            "INVALID_ARGUMENT",
            "overrides[\"coffer__search_knowledge\"].hide_params[1]",
            "\"querry\" is not a parameter of coffer__search_knowledge (its parameters: ",
        ),
        (json!({"name": "w", "colour": "red"}), "UNKNOWN_FIELD", "", "colour"),
        (json!({"name": "w", "servers": {"include": [], "only": []}}), "UNKNOWN_FIELD", "", "only"),
        (json!({"name": "w", "overrides": {"git__a": {"rename": "x"}}}), "UNKNOWN_FIELD", "", "rename"),
        (json!({"servers": {}}), "INVALID_ARGUMENT", "", "name"),
    ];
    for (body, code, field, needle) in &cases {
        let e = create(&api, body).await?.expect_envelope(400, code).with_context(|| body.to_string())?;
        let m = e["message"].as_str().unwrap_or_default();
        ensure!(m.contains(needle), "{body}: message {m:?} lacks {needle:?}");
        if !field.is_empty() {
            ensure!(e["details"]["field"] == *field, "{body}: details {}", e["details"]);
        }
    }
    // The same checks on PUT (of default, which always exists).
    let e = put(&api, "default", &json!({"tools": {"include": ["{a"]}}), None)
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(e["details"]["field"] == "tools.include[0]", "{e}");
    put(&api, "default", &json!({"name": "default"}), None).await?.expect_envelope(400, "UNKNOWN_FIELD")?;
    // Malformed JSON, the wrong media type, an oversized body.
    let r = api.post("/v1/mcp/profiles").header("content-type", "application/json").body("{\"name\":").reply().await?;
    r.expect_envelope(400, "BAD_REQUEST")?;
    let r = api.post("/v1/mcp/profiles").header("content-type", "text/plain").body("{\"name\":\"w\"}").reply().await?;
    r.expect_envelope(415, "UNSUPPORTED_MEDIA_TYPE")?;
    create(&api, &json!({"name": "w", "description": "d".repeat(3 * 1024 * 1024)}))
        .await?
        .expect_envelope(413, "PAYLOAD_TOO_LARGE")?;
    let r = api
        .request(Method::PUT, "/v1/mcp/profiles/default")
        .header("content-type", "application/json")
        .body("[]")
        .reply()
        .await?;
    ensure!(r.status == 400, "{}", r.text);
    // A name in the path that is no profile.
    api.get("/v1/mcp/profiles/..%2Fetc").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    assert_eq!(names(&api).await?, ["default"], "nothing was written");
    let d = api.get("/v1/mcp/profiles/default").reply().await?.ok_json()?;
    assert_eq!(d["version"], 0, "default untouched");

    // Eight concurrent creates of one name: one wins, the others are 409.
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let api = api.clone();
            let body = json!({"name": "race", "description": format!("try {i}")});
            tokio::spawn(async move { create(&api, &body).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        let r = t.await??;
        if r.status != 201 {
            r.expect_envelope(409, "ALREADY_EXISTS")?;
        }
        statuses.push(r.status.as_u16());
    }
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
    assert_eq!(names(&api).await?, ["default", "race"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_lists_shows_edits_overrides_and_removes_profiles() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;

    let o = home
        .cli(&[
            "profile",
            "create",
            "work",
            "--server",
            "git",
            "--server",
            "time*",
            "--exclude-tool",
            "git__git_push",
            "--description",
            "Work tools",
        ])
        .await?;
    ensure!(o.code == Some(0) && o.stdout.contains("Created profile work"), "{o:?}");
    let o = home.cli(&["profile", "create", "work"]).await?;
    ensure!(o.code == Some(4), "a taken name is a conflict: {o:?}");
    let o = home.cli(&["profile", "create", "Bad_Name"]).await?;
    ensure!(o.code == Some(2), "{o:?}");
    let o = home.cli(&["profile", "create", "w", "--tool", "a[b"]).await?;
    ensure!(o.code == Some(2) && o.stderr.contains("not a glob"), "{o:?}");
    let o = home.cli(&["profile", "create", "w", "--mode", "sometimes"]).await?;
    ensure!(o.code == Some(2), "{o:?}");

    let o = home.cli(&["profile", "list"]).await?;
    ensure!(o.code == Some(0), "{o:?}");
    for needle in ["NAME", "default", "work", "git, time*", "all but git__git_push", "Work tools"] {
        ensure!(o.stdout.contains(needle), "list lacks {needle:?}:\n{}", o.stdout);
    }
    let o = home.cli(&["profile", "list", "--json"]).await?;
    let v: Value = serde_json::from_str(&o.stdout)?;
    assert_eq!(v, api.get("/v1/mcp/profiles").reply().await?.ok_json()?, "--json is the server's JSON");

    let o = home.cli(&["profile", "edit", "work", "--mode", "lazy", "--server", ""]).await?;
    ensure!(o.code == Some(0) && o.stdout.contains("version 2"), "{o:?}");
    let o = home
        .cli(&[
            "profile",
            "override",
            "work",
            "time__get_current_time",
            "--rename",
            "now",
            "--hide-param",
            "timezone",
            "--read-only",
            "true",
        ])
        .await?;
    ensure!(o.code == Some(0) && o.stdout.contains("shown as now"), "{o:?}");
    // No server offers the tool here: written, with a warning (a typo must not pass silently).
    ensure!(o.stderr.contains("warning: no enabled server lists a tool time__get_current_time"), "{o:?}");
    let o = home.cli(&["profile", "override", "work", "time__get_current_time", "--rename", "bad name"]).await?;
    ensure!(o.code == Some(2) && o.stderr.contains("must match"), "{o:?}");
    let o = home.cli(&["profile", "override", "work", "git__git_log"]).await?;
    ensure!(o.code == Some(2), "nothing to change: {o:?}");
    let o = home.cli(&["profile", "override", "work", "git__git_log", "--clear"]).await?;
    ensure!(o.code == Some(3), "no such override: {o:?}");

    let o = home.cli(&["profile", "show", "work"]).await?;
    ensure!(o.code == Some(0), "{o:?}");
    for needle in ["lazy", "time__get_current_time: shown as now; hides timezone; read-only true", "version"] {
        ensure!(o.stdout.contains(needle), "show lacks {needle:?}:\n{}", o.stdout);
    }
    let o = home.cli(&["profile", "show", "work", "--json"]).await?;
    let shown: Value = serde_json::from_str(&o.stdout)?;
    assert_eq!((shown["mode"].as_str(), shown["servers"].clone()), (Some("lazy"), json!({})));
    assert_eq!(shown["tools"]["exclude"], json!(["git__git_push"]));

    // --from-file takes what show --json printed (edited), and refuses what is no spec.
    let file = home.temp().join("work-profile.json");
    let mut edited = shown.clone();
    edited["builtins"] = json!({"exclude": ["coffer__ask"]});
    std::fs::write(&file, edited.to_string())?;
    let o = home.cli(&["profile", "edit", "work", "--from-file", file.to_str().context("path")?]).await?;
    ensure!(o.code == Some(0), "{o:?}");
    let after = api.get("/v1/mcp/profiles/work").reply().await?.ok_json()?;
    assert_eq!((after["builtins"].clone(), after["version"].as_u64()), (json!({"exclude": ["coffer__ask"]}), Some(4)));
    std::fs::write(&file, "{\"colour\": 1}")?;
    let o = home.cli(&["profile", "edit", "work", "--from-file", file.to_str().context("path")?]).await?;
    ensure!(o.code == Some(2) && o.stderr.contains("colour"), "{o:?}");
    let o = home.cli(&["profile", "edit", "work"]).await?;
    ensure!(o.code == Some(2), "nothing to change: {o:?}");
    let o = home.cli(&["profile", "show", "absent"]).await?;
    ensure!(o.code == Some(3), "{o:?}");

    let o = home.cli(&["profile", "remove", "default"]).await?;
    ensure!(o.code == Some(4) && o.stderr.contains("cannot be removed"), "{o:?}");
    let o = home.cli(&["profile", "remove", "work"]).await?;
    ensure!(o.code == Some(0) && o.stdout.contains("Removed profile work"), "{o:?}");
    let o = home.cli(&["profile", "remove", "work"]).await?;
    ensure!(o.code == Some(3), "{o:?}");
    assert_eq!(names(&api).await?, ["default"]);
    Ok(())
}
