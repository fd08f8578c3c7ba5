//! Channels end to end on a running daemon: the REST resource (`/v1/channels…`: CRUD with
//! ETag/If-Match, enable/disable, pairing codes and unpairing; secrets stored once as
//! credentials and never shown back), its hostile-input answers (each one writes nothing), and the
//! `coffer channel …` commands with the lines `coffer status` and `coffer doctor` add.
//!
//! The channels point their API base at a closed loopback port, so an adapter coffer-chat may run
//! for them never reaches a network.
use anyhow::{Context, ensure};
use coffer_tests::{Api, Reply, SendExt, TestHome};
use reqwest::Method;
use serde_json::{Value, json};

/// Secrets no response, log line or file may hold in plaintext.
const TOKEN: &str = "7712345678:AAE-e2e-tg-5f1c9b3a7d2e8f4a6c0b";
const APP_SECRET: &str = "st-app-secret-e2e-9a8b7c6d5e4f";
const SIGNING: &str = "st-signing-e2e-1f2e3d4c5b6a";
/// Where the channels' adapters would go: nothing listens there.
const NOWHERE: &str = "http://127.0.0.1:9";

async fn create(api: &Api, body: &Value) -> anyhow::Result<Reply> {
    api.post_json("/v1/channels", body).header("X-Coffer-Actor", "cli").reply().await
}

fn telegram(name: &str) -> Value {
    json!({"name": name, "kind": "telegram", "bot_token": TOKEN, "api_base_url": NOWHERE})
}

async fn names(api: &Api) -> anyhow::Result<Vec<String>> {
    let list = api.get("/v1/channels").reply().await?.ok_json()?;
    Ok(list["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect())
}

async fn credentials(api: &Api) -> anyhow::Result<Vec<String>> {
    let creds = api.get("/v1/credentials").reply().await?.ok_json()?;
    Ok(creds["items"]
        .as_array()
        .context("items")?
        .iter()
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
async fn channels_crud_pairing_and_secrets_over_rest() -> anyhow::Result<()> {
    let home = TestHome::builder().log_filter("debug").build()?;
    let api = home.start_daemon().await?;
    let mut bodies = Vec::new();

    // Create with a bot token: it becomes credential channel-home-bot-token; the body says only
    // that it is set.
    let r = create(&api, &json!({"name": "home", "kind": "telegram", "bot_token": TOKEN, "api_base_url": NOWHERE, "default_agent": "codex", "agent_config": {"cwd": "/tmp", "model": "gpt-5"}})).await?;
    bodies.push(r.text.clone());
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    ensure!(r.headers.get("etag").is_some_and(|v| v == "\"1\""), "ETag: {:?}", r.headers);
    ensure!(r.headers.get("location").is_some_and(|v| v == "/v1/channels/home"), "{:?}", r.headers);
    let c = r.json()?;
    assert_eq!(
        (c["kind"].as_str(), c["enabled"].as_bool(), c["bot_token_ref"].as_str(), c["paired"].as_bool()),
        (Some("telegram"), Some(true), Some("channel-home-bot-token"), Some(false)),
        "{c}"
    );
    assert_eq!(c["credentials_set"], json!({"bot_token": true}));
    assert_eq!(c["agent_config"], json!({"cwd": "/tmp", "model": "gpt-5"}));
    assert_eq!((c["default_agent"].as_str(), c["owner"].clone()), (Some("codex"), Value::Null));
    ensure!(c.get("adapter").is_some(), "the adapter field is always there: {c}");
    assert_eq!(credentials(&api).await?, ["channel-home-bot-token"]);
    // coffer-chat's coordinator starts its adapter; the channel shows the adapter's live state
    // (the Bot API base is a closed port: it cannot be running).
    let live = coffer_tests::wait_for("home's adapter state", std::time::Duration::from_secs(30), || async {
        let c = api.get("/v1/channels/home").reply().await?.ok_json()?;
        Ok(c["adapter"]["state"].as_str().filter(|s| *s != "running").map(|_| c["adapter"].clone()))
    })
    .await?;
    ensure!(!live.to_string().contains(TOKEN), "the adapter state leaks the token: {live}");

    // SeaTalk: three secrets, one of them a credential the person named.
    let r = api.request(Method::PUT, "/v1/credentials/my-app-id").json(&json!({"value": "app-123"})).reply().await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    let r = create(
        &api,
        &json!({"name": "work", "kind": "seatalk", "app_id_ref": "my-app-id", "app_secret": APP_SECRET, "signing_secret": SIGNING, "enabled": false}),
    )
    .await?;
    bodies.push(r.text.clone());
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    let w = r.json()?;
    assert_eq!(w["credentials_set"], json!({"app_id": true, "app_secret": true, "signing_secret": true}), "{w}");
    assert_eq!(
        (w["app_id_ref"].as_str(), w["signing_secret_ref"].as_str(), w["enabled"].as_bool()),
        (Some("my-app-id"), Some("channel-work-signing-secret"), Some(false))
    );
    ensure!(w.get("bot_token_ref").is_none(), "no telegram field on a seatalk channel: {w}");
    assert_eq!(names(&api).await?, ["home", "work"]);

    // PATCH with If-Match: stale → 409, current → the new version; a secret alone keeps it.
    let cur = api.get("/v1/channels/home").reply().await?;
    let etag = cur.headers.get("etag").context("etag")?.to_str()?.to_owned();
    assert_eq!(etag, "\"1\"");
    let r = api
        .request(Method::PATCH, "/v1/channels/home")
        .header("If-Match", "\"7\"")
        .json(&json!({"default_agent": "claude_code"}))
        .reply()
        .await?;
    let e = r.expect_envelope(409, "CONFLICT")?;
    assert_eq!(e["details"]["current_version"], 1, "{e}");
    let r = api
        .request(Method::PATCH, "/v1/channels/home")
        .header("If-Match", &etag)
        .json(&json!({"default_agent": null, "agent_config": {"model": "opus"}}))
        .reply()
        .await?;
    bodies.push(r.text.clone());
    let c = r.ok_json()?;
    assert_eq!(
        (c["version"].as_i64(), c["default_agent"].clone(), c["agent_config"].clone()),
        (Some(2), Value::Null, json!({"model": "opus"}))
    );
    let r = api
        .request(Method::PATCH, "/v1/channels/home")
        .json(&json!({"bot_token": format!("{TOKEN}-2")}))
        .reply()
        .await?;
    bodies.push(r.text.clone());
    assert_eq!(r.ok_json()?["version"], 2, "a new token alone is not a configuration write");
    let e = api
        .request(Method::PATCH, "/v1/channels/home")
        .json(&json!({"kind": "seatalk"}))
        .reply()
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["details"]["field"], "kind");

    // Enable/disable: idempotent, each a configuration write only when it changes something.
    let c = api.post("/v1/channels/home/disable").reply().await?.ok_json()?;
    assert_eq!((c["enabled"].as_bool(), c["version"].as_i64()), (Some(false), Some(3)));
    let c = api.post("/v1/channels/home/disable").reply().await?.ok_json()?;
    assert_eq!(c["version"], 3);
    let c = api.post("/v1/channels/home/enable").reply().await?.ok_json()?;
    assert_eq!((c["enabled"].as_bool(), c["version"].as_i64()), (Some(true), Some(4)));
    api.post("/v1/channels/ghost/enable").reply().await?.expect_envelope(404, "NOT_FOUND")?;

    // Pairing: a code, its expiry and what to send; the channel says a code is waiting.
    let p = api.post("/v1/channels/home/pair").reply().await?.ok_json()?;
    let code = p["code"].as_str().context("code")?.to_owned();
    ensure!(code.len() == 8 && code.bytes().all(|b| b"0123456789ABCDEFGHJKMNPQRSTVWXYZ".contains(&b)), "{p}");
    ensure!(
        p["instruction"].as_str().is_some_and(|t| t.contains(&format!("/pair {code}")) && t.contains("10 minutes")),
        "{p}"
    );
    assert_eq!(p["ttl_s"], 600);
    let c = api.get("/v1/channels/home").reply().await?.ok_json()?;
    assert_eq!(
        (c["pairing"]["pending"].as_bool(), c["pairing"]["expires_at"].as_str()),
        (Some(true), p["expires_at"].as_str())
    );
    ensure!(!c.to_string().contains(&code), "the code is shown once: {c}");
    let p2 = api.post_json("/v1/channels/home/pair", &json!({"ttl_s": 120})).reply().await?.ok_json()?;
    ensure!(p2["instruction"].as_str().is_some_and(|t| t.contains("2 minutes")), "{p2}");
    let e = api
        .post_json("/v1/channels/home/pair", &json!({"ttl_s": 30}))
        .reply()
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    assert_eq!(e["details"]["field"], "ttl_s", "{e}");
    api.post_json("/v1/channels/home/pair", &json!({"ttl": 30}))
        .reply()
        .await?
        .expect_envelope(400, "UNKNOWN_FIELD")?;
    let p = api.post("/v1/channels/work/pair").reply().await?.ok_json()?;
    ensure!(
        p["warning"].as_str().is_some_and(|w| w.contains("disabled")),
        "a disabled channel cannot receive the code: {p}"
    );
    api.post("/v1/channels/ghost/pair").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    let r = api.request(Method::DELETE, "/v1/channels/home/pair").reply().await?;
    ensure!(r.status == 204, "{}", r.text);
    let c = api.get("/v1/channels/home").reply().await?.ok_json()?;
    assert_eq!((c["pairing"]["pending"].as_bool(), c["paired"].as_bool()), (Some(false), Some(false)));

    // The audit log names the actor and the actions, never a secret or a code.
    let audit = api.get("/v1/audit?limit=100").reply().await?;
    ensure!(!audit.text.contains(TOKEN) && !audit.text.contains(&code), "the audit log leaks: {}", audit.text);
    let actions: Vec<String> = audit.ok_json()?["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|e| e["action"].as_str().map(str::to_owned))
        .collect();
    for want in ["channel.create", "channel.update", "channel.pair.start", "channel.unpair"] {
        ensure!(actions.iter().any(|a| a == want), "{want} not audited: {actions:?}");
    }

    // Remove: the channel and the credentials made for it go; the one the person named stays.
    let r = api.request(Method::DELETE, "/v1/channels/work").header("If-Match", "\"9\"").reply().await?;
    r.expect_envelope(409, "CONFLICT")?;
    let r = api.request(Method::DELETE, "/v1/channels/work").reply().await?;
    ensure!(r.status == 204, "{}", r.text);
    api.request(Method::DELETE, "/v1/channels/work").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    assert_eq!(credentials(&api).await?, ["channel-home-bot-token", "my-app-id"]);
    let r = api.request(Method::DELETE, "/v1/channels/home").reply().await?;
    ensure!(r.status == 204, "{}", r.text);
    assert_eq!(credentials(&api).await?, ["my-app-id"]);
    assert!(names(&api).await?.is_empty());

    // No secret in any response, log file or the database (credentials are encrypted).
    for b in &bodies {
        ensure!(
            !b.contains(TOKEN) && !b.contains(APP_SECRET) && !b.contains(SIGNING),
            "a response holds a secret: {b}"
        );
    }
    for secret in [TOKEN, APP_SECRET, SIGNING] {
        let holders = files_holding(home.root(), secret)?;
        ensure!(holders.is_empty(), "{secret:?} is in plaintext in {holders:?}");
    }
    let db = std::fs::read(home.root().join("coffer.db"))?;
    ensure!(!db.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()), "the token is in coffer.db");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_channel_requests_get_envelopes_and_write_nothing() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let bad = |body: Value, code: &'static str, field: &'static str| {
        let api = api.clone();
        async move {
            let r = create(&api, &body).await?;
            ensure!(!r.text.contains(TOKEN), "the answer quotes the secret: {}", r.text);
            let e = r.expect_envelope(400, code)?;
            ensure!(e["details"]["field"] == field, "{body}: want field {field}, got {e}");
            anyhow::Ok(e)
        }
    };

    // An agent nobody registered: said when the channel is written, naming the known ones.
    let mut typo = telegram("typo");
    typo["default_agent"] = json!("gpt");
    let e = bad(typo, "INVALID_ARGUMENT", "default_agent").await?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("claude_code")), "{e}");

    // Malformed JSON, a form body.
    let r = api
        .request(Method::POST, "/v1/channels")
        .header("content-type", "application/json")
        .body("{\"name\": \"a\",")
        .reply()
        .await?;
    r.expect_envelope(400, "BAD_REQUEST")?;
    let r = api
        .request(Method::POST, "/v1/channels")
        .header("content-type", "application/x-www-form-urlencoded")
        .body("name=a&kind=telegram")
        .reply()
        .await?;
    r.expect_envelope(415, "UNSUPPORTED_MEDIA_TYPE")?;
    // Unknown kind and fields; a secret missing for the kind, or of the other kind.
    let e = bad(json!({"name": "a", "kind": "slack", "bot_token": TOKEN}), "INVALID_ARGUMENT", "kind").await?;
    ensure!(e["message"].as_str().is_some_and(|m| m.contains("telegram, seatalk")), "{e}");
    bad(json!({"name": "a", "kind": "telegram", "bot_token": TOKEN, "webhook": "x"}), "UNKNOWN_FIELD", "webhook")
        .await?;
    bad(json!({"name": "a", "kind": "telegram"}), "INVALID_ARGUMENT", "bot_token_ref").await?;
    bad(
        json!({"name": "a", "kind": "seatalk", "app_id": "1", "app_secret": "2"}),
        "INVALID_ARGUMENT",
        "signing_secret_ref",
    )
    .await?;
    bad(json!({"name": "a", "kind": "telegram", "bot_token": TOKEN, "app_id": "1"}), "INVALID_ARGUMENT", "app_id")
        .await?;
    bad(json!({"name": "a", "kind": "telegram", "bot_token": format!("{TOKEN}\n")}), "INVALID_ARGUMENT", "bot_token")
        .await?;
    // Oversized fields.
    bad(json!({"name": "x".repeat(33), "kind": "telegram", "bot_token": TOKEN}), "INVALID_ARGUMENT", "name").await?;
    bad(json!({"name": "a", "kind": "telegram", "bot_token": "t".repeat(70_000)}), "INVALID_ARGUMENT", "bot_token")
        .await?;
    bad(
        json!({"name": "a", "kind": "telegram", "bot_token": TOKEN, "api_base_url": format!("http://h/{}", "p".repeat(3000))}),
        "INVALID_ARGUMENT",
        "api_base_url",
    )
    .await?;
    bad(json!({"name": "a", "kind": "telegram", "bot_token": TOKEN, "agent_config": {"cwd": format!("/{}", "d".repeat(9000))}}), "INVALID_ARGUMENT", "agent_config").await?;
    // Over the 2 MiB body limit: the declared length alone is refused (a client writing the
    // whole body may see the connection close under it instead).
    let declared = [("Content-Type", "application/json".to_owned()), ("Content-Length", (3 * 1024 * 1024).to_string())];
    api.raw("POST", "/v1/channels", &declared, b"{\"name\": \"a\", \"bot_token\": \"")
        .await?
        .expect_envelope(413, "PAYLOAD_TOO_LARGE")?;
    // Hostile names and values.
    for name in ["../x", "a/b", "A", "-a", "a b", "\u{202e}a"] {
        bad(json!({"name": name, "kind": "telegram", "bot_token": TOKEN}), "INVALID_ARGUMENT", "name").await?;
    }
    bad(
        json!({"name": "a", "kind": "telegram", "bot_token_ref": "../../etc/passwd"}),
        "INVALID_ARGUMENT",
        "bot_token_ref",
    )
    .await?;
    bad(
        json!({"name": "a", "kind": "telegram", "bot_token": TOKEN, "api_base_url": "file:///etc/passwd"}),
        "INVALID_ARGUMENT",
        "api_base_url",
    )
    .await?;
    bad(
        json!({"name": "a", "kind": "telegram", "bot_token": TOKEN, "agent_config": {"cwd": "relative"}}),
        "INVALID_ARGUMENT",
        "agent_config",
    )
    .await?;
    bad(
        json!({"name": "a", "kind": "telegram", "bot_token": TOKEN, "agent_config": {"env": {"X": "1"}}}),
        "INVALID_ARGUMENT",
        "agent_config",
    )
    .await?;
    bad(
        json!({"name": "a", "kind": "telegram", "bot_token": TOKEN, "default_agent": "rm -rf"}),
        "INVALID_ARGUMENT",
        "default_agent",
    )
    .await?;
    for path in ["/v1/channels/..%2Fx", "/v1/channels/%00", "/v1/channels/ghost"] {
        let r = api.get(path).reply().await?;
        ensure!(r.status == 404 || r.status == 400, "{path}: {} {}", r.status, r.text);
        ensure!(r.json()?["error"]["code"].is_string(), "{path}: not an envelope: {}", r.text);
    }
    // A secret in a query string is refused, whatever the route, and the value is not echoed.
    for (method, path) in [
        (Method::POST, "/v1/channels?bot_token=leak"),
        (Method::GET, "/v1/channels?app_secret=leak"),
        (Method::PATCH, "/v1/channels/a?signing_secret=leak"),
    ] {
        let r = api.request(method, path).json(&telegram("q")).reply().await?;
        ensure!(!r.text.contains("leak"), "{path}: echoed: {}", r.text);
        r.expect_envelope(400, "INVALID_ARGUMENT")?;
    }
    // A generated credential name that is taken: refused, the existing value kept.
    let r = api
        .request(Method::PUT, "/v1/credentials/channel-x-bot-token")
        .json(&json!({"value": "someone-elses"}))
        .reply()
        .await?;
    ensure!(r.status == 201, "{} {}", r.status, r.text);
    let e = create(&api, &telegram("x")).await?.expect_envelope(409, "CONFLICT")?;
    ensure!(e["details"]["credential"] == "channel-x-bot-token", "{e}");
    let cred = api.get("/v1/credentials/channel-x-bot-token").reply().await?.ok_json()?;
    assert_eq!(cred["version"], 1, "the existing secret is untouched: {cred}");
    assert!(names(&api).await?.is_empty(), "no refused request wrote a channel");
    assert_eq!(credentials(&api).await?, ["channel-x-bot-token"], "no refused request wrote a credential");

    // Concurrent creates of one name: exactly one 201, the others 409; one credential.
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let api = api.clone();
            tokio::spawn(async move { create(&api, &telegram("race")).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        let r = t.await??;
        if r.status != 201 {
            // A loser that looked after the winner stored its token is told the generated
            // credential is taken; either way a 409 and nothing written.
            let code = r.json()?["error"]["code"].as_str().unwrap_or_default().to_owned();
            ensure!(r.status == 409 && (code == "ALREADY_EXISTS" || code == "CONFLICT"), "{} {}", r.status, r.text);
        }
        statuses.push(r.status);
    }
    ensure!(statuses.iter().filter(|s| **s == 201).count() == 1, "{statuses:?}");
    assert_eq!(names(&api).await?, ["race"]);
    assert_eq!(credentials(&api).await?, ["channel-race-bot-token", "channel-x-bot-token"]);
    // Stale If-Match on enable-less writes: PATCH and DELETE.
    api.request(Method::PATCH, "/v1/channels/race")
        .header("If-Match", "\"2\"")
        .json(&json!({"enabled": false}))
        .reply()
        .await?
        .expect_envelope(409, "CONFLICT")?;
    api.request(Method::PATCH, "/v1/channels/race")
        .header("If-Match", "W/\"1\"")
        .json(&json!({"enabled": false}))
        .reply()
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    let c = api.get("/v1/channels/race").reply().await?.ok_json()?;
    assert_eq!((c["enabled"].as_bool(), c["version"].as_i64()), (Some(true), Some(1)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_adds_lists_pairs_and_removes_channels() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let _api = home.start_daemon().await?;
    let run = |args: Vec<&str>, env: Option<(&'static str, &'static str)>| {
        let mut cmd = home.cli_command(&args).expect("coffer");
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        async move { cmd.output().await.context("running coffer") }
    };
    let text = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let err = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();

    let o = run(vec!["channel", "list"], None).await?;
    ensure!(o.status.success() && text(&o).contains("No channels yet"), "{}", text(&o));
    // Secrets never on the command line; a missing one or an unset variable is a usage error.
    let o = run(vec!["channel", "add", "home", "--kind", "telegram", "--bot-token", TOKEN], None).await?;
    ensure!(o.status.code() == Some(2), "a secret argument: {:?} {}", o.status, err(&o));
    let o = run(vec!["channel", "add", "home", "--kind", "telegram"], None).await?;
    ensure!(o.status.code() == Some(2) && err(&o).contains("--bot-token-env"), "{}", err(&o));
    let o = run(vec!["channel", "add", "home", "--kind", "telegram", "--bot-token-env", "E2E_UNSET_TOKEN_VAR"], None)
        .await?;
    ensure!(o.status.code() == Some(2) && err(&o).contains("E2E_UNSET_TOKEN_VAR"), "{}", err(&o));
    let o = run(vec!["channel", "add", "../x", "--kind", "telegram", "--bot-token-env", "T"], None).await?;
    ensure!(o.status.code() == Some(2), "{}", err(&o));

    let o = run(
        vec![
            "channel",
            "add",
            "home",
            "--kind",
            "telegram",
            "--bot-token-env",
            "E2E_TOKEN",
            "--api-base-url",
            NOWHERE,
            "--cwd",
            "/tmp",
            "--agent",
            "codex",
        ],
        Some(("E2E_TOKEN", TOKEN)),
    )
    .await?;
    ensure!(o.status.success(), "add: {} {}", text(&o), err(&o));
    ensure!(text(&o).contains("Added telegram channel home") && !text(&o).contains(TOKEN), "{}", text(&o));
    ensure!(!err(&o).contains("warning"), "its credential is stored: {}", err(&o));
    let o = run(
        vec!["channel", "add", "home", "--kind", "telegram", "--bot-token-env", "E2E_TOKEN"],
        Some(("E2E_TOKEN", TOKEN)),
    )
    .await?;
    ensure!(o.status.code() == Some(4), "a duplicate: {:?} {}", o.status, err(&o));

    let o = run(vec!["channel", "list", "--json"], None).await?;
    let list: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(list["items"][0]["agent_config"], json!({"cwd": "/tmp"}));
    let o = run(vec!["channel", "list"], None).await?;
    ensure!(text(&o).contains("home") && text(&o).contains("not paired"), "{}", text(&o));
    let o = run(vec!["channel", "show", "home"], None).await?;
    ensure!(text(&o).contains("set (channel-home-bot-token)") && text(&o).contains("Not paired"), "{}", text(&o));
    let o = run(vec!["status"], None).await?;
    ensure!(text(&o).contains("Channel home (telegram): enabled, not paired"), "{}", text(&o));
    let o = run(vec!["doctor", "--json"], None).await?;
    let doc: Value = serde_json::from_slice(&o.stdout)?;
    let check = doc["checks"].as_array().context("checks")?.iter().find(|c| c["name"] == "channel home").cloned();
    ensure!(
        check
            .as_ref()
            .is_some_and(|c| c["status"] == "warn" && c["message"].as_str().is_some_and(|m| m.contains("not paired"))),
        "{doc}"
    );

    let o = run(vec!["channel", "pair", "home", "--ttl", "5m"], None).await?;
    ensure!(o.status.success(), "{}", err(&o));
    let out = text(&o);
    let code = out.lines().find_map(|l| l.strip_prefix("Pairing code: ")).context("no code line")?.trim().to_owned();
    ensure!(code.len() == 8 && out.contains(&format!("/pair {code}")) && out.contains("5 minutes"), "{out}");
    let o = run(vec!["channel", "pair", "home", "--ttl", "2h"], None).await?;
    ensure!(o.status.code() == Some(2), "{}", err(&o));
    let o = run(vec!["channel", "pair", "home", "--json"], None).await?;
    let p: Value = serde_json::from_slice(&o.stdout)?;
    ensure!(p["code"].as_str().is_some_and(|c| c.len() == 8) && p["code"] != code.as_str(), "{p}");

    let o = run(vec!["channel", "disable", "home"], None).await?;
    ensure!(o.status.success() && text(&o).contains("Disabled channel home"), "{}", err(&o));
    let o = run(vec!["doctor", "--json"], None).await?;
    let doc: Value = serde_json::from_slice(&o.stdout)?;
    let check = doc["checks"].as_array().context("checks")?.iter().find(|c| c["name"] == "channel home").cloned();
    ensure!(check.as_ref().is_some_and(|c| c["status"] == "ok"), "a disabled channel is fine: {doc}");
    let o = run(vec!["channel", "enable", "home"], None).await?;
    ensure!(o.status.success() && text(&o).contains("not paired yet"), "{}", text(&o));
    let o = run(vec!["channel", "edit", "home"], None).await?;
    ensure!(o.status.code() == Some(2), "nothing to change: {}", err(&o));
    let o = run(vec!["channel", "edit", "home", "--model", "opus", "--cwd", ""], None).await?;
    ensure!(o.status.success(), "{}", err(&o));
    let o = run(vec!["channel", "show", "home", "--json"], None).await?;
    let c: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(c["agent_config"], json!({"model": "opus"}));
    let o = run(vec!["channel", "unpair", "home"], None).await?;
    ensure!(o.status.success(), "{}", err(&o));
    let o = run(vec!["channel", "show", "ghost"], None).await?;
    ensure!(o.status.code() == Some(3), "unknown: {:?} {}", o.status, err(&o));
    let o = run(vec!["channel", "remove", "home"], None).await?;
    ensure!(o.status.success(), "{}", err(&o));
    let o = run(vec!["credentials", "list", "--json"], None).await?;
    let creds: Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(creds["items"], json!([]), "channel-home-bot-token went with home");

    // A credential named but not stored: the channel is added, with a warning naming it and
    // how to store it (it cannot start before).
    let o = run(vec!["channel", "add", "office", "--kind", "telegram", "--bot-token-credential", "office-bot"], None)
        .await?;
    ensure!(o.status.success() && text(&o).contains("Added telegram channel office"), "{}", err(&o));
    ensure!(
        err(&o).contains("warning: credential office-bot (the bot token) is not stored")
            && err(&o).contains("coffer credentials set office-bot"),
        "{}",
        err(&o)
    );
    Ok(())
}
