//! The encrypted credential store end to end: a credential that an upstream's `env` references
//! reaches that child's environment (the tool result, the upstream's own output, is the one
//! place the value may show), while REST bodies, the audit log, `coffer.db` and its WAL, and
//! every log file (the upstream's stderr log, where it leaked the value on purpose, included)
//! never hold it.
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::{Api, Reply, SendExt, TestHome, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

/// The credential the upstream's `env` references.
const NAME: &str = "tiny-secret";
/// A credential deleted while a server still references it.
const TEMP: &str = "temp-cred";

/// 32 random hex characters (std's per-process random hash keys; no extra dependency).
fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    (0..2u64)
        .map(|i| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(i);
            h.write_u128(nanos);
            format!("{:016x}", h.finish())
        })
        .collect()
}

/// Every regular file under `dir` (recursively, symlinks not followed) that contains any of
/// `needles`, with the needle's index.
fn files_containing(dir: &Path, needles: &[&str]) -> anyhow::Result<(Vec<(PathBuf, usize)>, usize)> {
    let mut found = Vec::new();
    let mut scanned = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                // A file may vanish between listing and reading (temporary files).
                let Ok(bytes) = std::fs::read(e.path()) else { continue };
                scanned += 1;
                for (i, n) in needles.iter().enumerate() {
                    if bytes.windows(n.len()).any(|w| w == n.as_bytes()) {
                        found.push((e.path(), i));
                    }
                }
            }
        }
    }
    Ok((found, scanned))
}

/// Fails when `text` (what `what` returned) holds any of `values`.
fn no_value(what: &str, text: &str, values: &[&str]) -> anyhow::Result<()> {
    for (i, v) in values.iter().enumerate() {
        ensure!(!text.contains(v), "{what} holds credential value #{i}: {text}");
    }
    Ok(())
}

async fn put_credential(api: &Api, name: &str, body: &Value) -> anyhow::Result<Reply> {
    api.request(Method::PUT, &format!("/v1/credentials/{name}"))
        .header("X-Coffer-Actor", "cli")
        .json(body)
        .reply()
        .await
}

async fn call(api: &Api, tool: &str) -> anyhow::Result<Reply> {
    api.post_json("/v1/tools/call", &json!({"name": tool, "arguments": {}})).reply().await
}

/// `whoami`'s report of `TINY_ECHO_ENV` and of `COFFER_*` variables in its environment.
async fn whoami(api: &Api, server: &str) -> anyhow::Result<(Value, Value)> {
    let r = call(api, &format!("{server}__whoami")).await?.ok_json()?;
    let text = r["content"][0]["text"].as_str().with_context(|| format!("no text in {r}"))?;
    let who: Value = serde_json::from_str(text)?;
    Ok((who["env"].clone(), who["coffer_vars"].clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_reaches_only_its_upstream_and_never_disk_or_logs() -> anyhow::Result<()> {
    // Debug logging everywhere, so the scan also covers what only debug lines would say.
    let home = TestHome::builder().log_filter("debug").build()?;
    let api = home.start_daemon().await?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let (secret, first, temp) = (random_hex(), random_hex(), random_hex());
    let values = [secret.as_str(), first.as_str(), temp.as_str()];
    let mut bodies: Vec<(String, String)> = Vec::new();
    let mut seen = |what: &str, r: &Reply| bodies.push((what.to_owned(), r.text.clone()));

    // Create (201, version 1), then replace (200, version 2); the value is never echoed.
    let r = put_credential(&api, NAME, &json!({"value": first})).await?;
    seen("PUT create", &r);
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let body = r.json()?;
    let mut keys: Vec<&String> = body.as_object().context("object")?.keys().collect();
    keys.sort();
    assert_eq!(keys, ["name", "updated_at", "version"], "{body}");
    assert_eq!((body["name"].as_str(), body["version"].as_i64()), (Some(NAME), Some(1)));
    let r = put_credential(&api, NAME, &json!({"value": secret})).await?;
    seen("PUT replace", &r);
    assert_eq!(r.ok_json()?["version"], 2);

    // Bad requests get envelopes that never quote what was sent.
    let r = put_credential(&api, NAME, &json!({"value": secret, "extra": 1})).await?;
    seen("PUT unknown field", &r);
    r.expect_envelope(400, "UNKNOWN_FIELD")?;
    let r = put_credential(&api, NAME, &json!({"value": 987_654_321_123u64})).await?;
    r.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(!r.text.contains("987654321123"), "the body was quoted: {}", r.text);
    put_credential(&api, NAME, &json!({"value": ""})).await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    let big = "x".repeat(65_537);
    put_credential(&api, NAME, &json!({"value": big})).await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    put_credential(&api, "bad%20name", &json!({"value": "v"})).await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    api.request(Method::DELETE, "/v1/credentials/nope").reply().await?.expect_envelope(404, "NOT_FOUND")?;

    // Registration refuses a reference to a credential that does not exist, naming it.
    let server = |name: &str, cred: &str| json!({"name": name, "command": tiny, "env": {"TINY_ECHO_ENV": {"credential_ref": cred}, "PLAIN": "literal"}});
    let r = api.post_json("/v1/mcp/servers", &server("tiny", "missing-one")).reply().await?;
    let err = r.expect_envelope(400, "INVALID_ARGUMENT")?;
    ensure!(err["message"].as_str().is_some_and(|m| m.contains("\"missing-one\"")), "{err}");
    assert_eq!(err["details"]["credential"], "missing-one");
    let r = api.post_json("/v1/mcp/servers", &server("tiny", NAME)).reply().await?;
    seen("POST server", &r);
    ensure!(r.status == 201, "register: {} {}", r.status, r.text);
    assert_eq!(r.json()?["env"], json!({"PLAIN": "literal", "TINY_ECHO_ENV": {"credential_ref": NAME}}));

    // The child got the value (and no COFFER_* variable).
    let (env, coffer_vars) = whoami(&api, "tiny").await?;
    assert_eq!(env, json!(secret), "the upstream did not get the credential's value");
    assert_eq!(coffer_vars, 0);

    // It writes the value to stderr; its log holds only [REDACTED].
    let r = call(&api, "tiny__stderr_env").await?;
    seen("stderr_env", &r);
    r.ok_json()?;
    let upstream_log = home.logs_dir().join("upstreams").join("tiny.log");
    wait_for("tiny's stderr in logs/upstreams/tiny.log", Duration::from_secs(10), || async {
        let text = std::fs::read_to_string(&upstream_log).unwrap_or_default();
        Ok((text.contains("TINY_ECHO_ENV=[REDACTED]") && text.contains("[[REDACTED]] and again [REDACTED][REDACTED]"))
            .then_some(()))
    })
    .await?;

    // A start that cannot resolve its credential fails with -32001 (UPSTREAM_UNAVAILABLE)
    // naming the credential, never a value.
    let r = put_credential(&api, TEMP, &json!({"value": temp})).await?;
    seen("PUT temp", &r);
    ensure!(r.status == 201, "{}", r.text);
    let r = api.post_json("/v1/mcp/servers", &server("tiny2", TEMP)).reply().await?;
    ensure!(r.status == 201, "{}", r.text);
    assert_eq!(whoami(&api, "tiny2").await?.0, json!(temp));
    let r = api.request(Method::DELETE, &format!("/v1/credentials/{TEMP}")).reply().await?;
    assert_eq!(r.status, 204, "{}", r.text);
    // The running child keeps what it was started with; its restart needs the credential.
    let r = call(&api, "tiny2__crash").await?;
    seen("crash", &r);
    r.expect_envelope(502, "UPSTREAM_UNAVAILABLE")?;
    let r = call(&api, "tiny2__whoami").await?;
    seen("restart without credential", &r);
    let err = r.expect_envelope(502, "UPSTREAM_UNAVAILABLE")?;
    let msg = err["message"].as_str().unwrap_or_default();
    ensure!(msg.contains("tiny2") && msg.contains(&format!("credential \"{TEMP}\" not found")), "{err}");
    let r = api.get("/v1/mcp/servers/tiny2/capabilities").reply().await?;
    seen("capabilities", &r);
    let err = r.expect_envelope(502, "UPSTREAM_UNAVAILABLE")?;
    ensure!(err["message"].as_str().is_some_and(|m| m.contains(TEMP)), "{err}");

    // PATCH checks the references it sets.
    let patch = |cred: &str| json!({"env": {"TINY_ECHO_ENV": {"credential_ref": cred}}});
    let r = api.request(Method::PATCH, "/v1/mcp/servers/tiny2").json(&patch(TEMP)).reply().await?;
    r.expect_envelope(400, "INVALID_ARGUMENT")?;
    let r = api.request(Method::PATCH, "/v1/mcp/servers/tiny2").json(&patch(NAME)).reply().await?;
    seen("PATCH", &r);
    assert_eq!(r.ok_json()?["env"], json!({"TINY_ECHO_ENV": {"credential_ref": NAME}}));

    // Listings and the audit log name credentials, never values.
    let r = api.get("/v1/credentials").reply().await?;
    seen("GET credentials", &r);
    let list = r.ok_json()?;
    assert_eq!(list["next_cursor"], Value::Null);
    let items = list["items"].as_array().context("items")?;
    assert_eq!(items.len(), 1, "{list}");
    let mut keys: Vec<&String> = items[0].as_object().context("item")?.keys().collect();
    keys.sort();
    assert_eq!(keys, ["created_at", "name", "updated_at", "version"]);
    assert_eq!((items[0]["name"].as_str(), items[0]["version"].as_i64()), (Some(NAME), Some(2)));
    let r = api.get(&format!("/v1/credentials/{NAME}")).reply().await?;
    seen("GET credential", &r);
    assert_eq!(r.ok_json()?["version"], 2);
    let r = api.get("/v1/mcp/servers").reply().await?;
    seen("GET servers", &r);
    let servers = r.ok_json()?;
    let tiny_env =
        &servers["items"].as_array().context("items")?.iter().find(|s| s["name"] == "tiny").context("tiny")?["env"];
    assert_eq!(tiny_env["TINY_ECHO_ENV"], json!({"credential_ref": NAME}));
    let r = api.get("/v1/audit?limit=500").reply().await?;
    seen("GET audit", &r);
    let audit = r.ok_json()?;
    let rows: Vec<(String, String, String)> = audit["items"]
        .as_array()
        .context("items")?
        .iter()
        .rev()
        .filter(|a| a["action"].as_str().is_some_and(|x| x.starts_with("credential.")))
        .map(|a| {
            (
                a["actor"].as_str().unwrap_or("").into(),
                a["action"].as_str().unwrap_or("").into(),
                a["target"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    let row = |actor: &str, action: &str, target: &str| (actor.to_owned(), action.to_owned(), target.to_owned());
    assert_eq!(
        rows,
        [
            row("cli", "credential.set", NAME),
            row("cli", "credential.set", NAME),
            row("cli", "credential.set", TEMP),
            row("api", "credential.remove", TEMP),
        ]
    );
    for path in ["/v1/status", "/v1/invocations?limit=500", "/v1/logs/gateway?n=2000", "/v1/logs/store?n=2000"] {
        let r = api.get(path).reply().await?;
        seen(path, &r);
    }
    for (what, text) in &bodies {
        no_value(what, text, &values)?;
    }

    // On disk while running (the WAL holds recent pages until a checkpoint) ...
    let wal = home.root().join("coffer.db-wal");
    ensure!(wal.is_file(), "no WAL at {}", wal.display());
    let (found, _) = files_containing(home.root(), &values)?;
    ensure!(found.is_empty(), "files hold credential values while the daemon runs: {found:?}");
    // ... and after a stop, over the whole temporary directory: home, logs (upstream logs too),
    // database, WAL and the daemon's captured output.
    home.terminate_daemon(Duration::from_secs(30)).await?;
    let (found, scanned) = files_containing(home.temp(), &values)?;
    ensure!(found.is_empty(), "files hold credential values after the stop: {found:?}");
    ensure!(home.root().join("coffer.db").is_file() && scanned >= 5, "scanned only {scanned} files");
    let text = std::fs::read_to_string(&upstream_log)?;
    ensure!(text.contains("[REDACTED]"), "the upstream log lost its redacted lines: {text}");
    Ok(())
}

/// `whoami`'s pid and `TINY_ECHO_ENV`.
async fn pid_and_env(api: &Api, server: &str) -> anyhow::Result<(u64, Value)> {
    let r = call(api, &format!("{server}__whoami")).await?.ok_json()?;
    let text = r["content"][0]["text"].as_str().with_context(|| format!("no text in {r}"))?;
    let who: Value = serde_json::from_str(text)?;
    Ok((who["pid"].as_u64().with_context(|| format!("no pid in {who}"))?, who["env"].clone()))
}

/// A credential changed while an upstream that references it runs: the session's next call
/// reaches an upstream started with the new value (the old one is stopped); an upstream that
/// references no credential, or another one, keeps running.
#[tokio::test]
async fn a_changed_credential_restarts_the_upstreams_that_reference_it() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    for (name, value) in [("rotated", "first-value"), ("steady", "steady-value")] {
        let r = put_credential(&api, name, &json!({"value": value})).await?;
        ensure!(r.status == 201, "create {name}: {} {}", r.status, r.text);
    }
    for (server, env) in [
        ("uses", json!({"TINY_ECHO_ENV": {"credential_ref": "rotated"}})),
        ("other", json!({"TINY_ECHO_ENV": {"credential_ref": "steady"}})),
        ("plain", json!({"TINY_ECHO_ENV": "literal"})),
    ] {
        let r = api.post_json("/v1/mcp/servers", &json!({"name": server, "command": tiny, "env": env})).reply().await?;
        ensure!(r.status == 201, "register {server}: {} {}", r.status, r.text);
    }
    let (uses_pid, env) = pid_and_env(&api, "uses").await?;
    assert_eq!(env, json!("first-value"));
    let (other_pid, _) = pid_and_env(&api, "other").await?;
    let (plain_pid, _) = pid_and_env(&api, "plain").await?;

    // The write returns once the gateway's snapshot holds it (read-your-writes).
    put_credential(&api, "rotated", &json!({"value": "second-value"})).await?.ok_json()?;
    let (pid, env) = pid_and_env(&api, "uses").await?;
    assert_eq!(env, json!("second-value"), "the next call still reached the upstream with the old value");
    ensure!(pid != uses_pid, "the upstream was not started again (pid {pid})");
    assert_eq!(pid_and_env(&api, "other").await?.0, other_pid, "an upstream with another credential restarted");
    assert_eq!(pid_and_env(&api, "plain").await?.0, plain_pid, "an upstream without credentials restarted");
    // The old process is gone, not left running beside the new one.
    wait_for("the upstream started with the old value to exit", Duration::from_secs(10), || async {
        Ok((!coffer_tests::procs::alive(uses_pid as i32)).then_some(()))
    })
    .await?;
    // A call right after, with nothing changed, stays on the new upstream.
    assert_eq!(pid_and_env(&api, "uses").await?.0, pid);
    Ok(())
}

/// A server whose credential was removed fails to start, and its session waits a backoff
/// before trying again; setting the credential again ends that wait: the session's next call
/// starts the upstream with the value at once.
#[tokio::test]
async fn a_credential_set_again_is_used_at_once_despite_the_failed_start_backoff() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let r = put_credential(&api, "comes-back", &json!({"value": "v1"})).await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let body = json!({"name": "needs", "command": tiny, "env": {"TINY_ECHO_ENV": {"credential_ref": "comes-back"}}});
    let r = api.post_json("/v1/mcp/servers", &body).reply().await?;
    ensure!(r.status == 201, "register: {} {}", r.status, r.text);
    assert_eq!(pid_and_env(&api, "needs").await?.1, json!("v1"));

    let r = api.request(Method::DELETE, "/v1/credentials/comes-back").reply().await?;
    ensure!(r.status == 204, "remove: {} {}", r.status, r.text);
    let r = call(&api, "needs__whoami").await?;
    ensure!(r.text.contains("comes-back") && r.text.contains("not found"), "a call without the credential: {r:?}");
    // Within the backoff (1 s after one failed start) the failure is repeated without a start.
    let r = call(&api, "needs__whoami").await?;
    ensure!(r.text.contains("not found"), "a call within the backoff: {r:?}");

    let r = put_credential(&api, "comes-back", &json!({"value": "v2"})).await?;
    ensure!(r.status == 201, "set again: {} {}", r.status, r.text);
    let (_, env) = pid_and_env(&api, "needs").await?;
    assert_eq!(env, json!("v2"), "the call right after the credential was set again");
    Ok(())
}
