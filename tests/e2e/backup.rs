//! Backup and restore end to end: `coffer backup` while tool calls run, then `coffer restore`
//! into another, stopped home gives back the servers, settings, preferences, markdown and
//! credentials (still decryptable: an upstream gets the value); a restore while the daemon runs
//! is refused without starting anything; a corrupt or incomplete backup is refused naming the
//! problem, and the home is left exactly as it was.
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::{Api, SendExt, TestHome, wait_for};
use reqwest::Method;
use serde_json::{Value, json};

/// The credential the upstream's `env` references.
const CRED: &str = "tiny-secret";
/// Its value (a test value, not a secret).
const VALUE: &str = "e2e-backup-value-7c1d";

/// Registers the tiny upstream with a credential in its env, a setting, a tool preference and
/// some markdown: everything a restore must bring back.
async fn seed(home: &TestHome, api: &Api) -> anyhow::Result<()> {
    let r = api.request(Method::PUT, &format!("/v1/credentials/{CRED}")).json(&json!({"value": VALUE})).reply().await?;
    ensure!(r.status == 201, "credential: {} {}", r.status, r.text);
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let body = json!({"name": "tiny", "command": tiny, "env": {"TINY_ECHO_ENV": {"credential_ref": CRED}}});
    let r = api.post_json("/v1/mcp/servers", &body).reply().await?;
    ensure!(r.status == 201, "register: {} {}", r.status, r.text);
    let r = api
        .request(Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"e2e.note": "kept by the backup"}, "force": true}))
        .reply()
        .await?;
    r.ok_json()?;
    let r = api.request(Method::PATCH, "/v1/tools/tiny__add").json(&json!({"enabled": false})).reply().await?;
    r.ok_json()?;
    std::fs::create_dir_all(home.root().join("knowledge/notes"))?;
    std::fs::write(home.root().join("knowledge/notes/a.md"), "# A note\n")?;
    std::fs::write(home.root().join("memory/facts.md"), "- the sky is blue\n")?;
    Ok(())
}

/// The value `whoami` reports for `TINY_ECHO_ENV`.
async fn whoami_env(api: &Api) -> anyhow::Result<Value> {
    let r =
        api.post_json("/v1/tools/call", &json!({"name": "tiny__whoami", "arguments": {}})).reply().await?.ok_json()?;
    let text = r["content"][0]["text"].as_str().with_context(|| format!("no text in {r}"))?;
    Ok(serde_json::from_str::<Value>(text)?["env"].clone())
}

/// Every entry under `dir` (relative path → contents; directories map to an empty marker).
fn tree(dir: &Path) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let e = e?;
            let rel = e.path().strip_prefix(dir)?.display().to_string();
            if e.file_type()?.is_dir() {
                out.insert(format!("{rel}/"), Vec::new());
                stack.push(e.path());
            } else {
                out.insert(rel, std::fs::read(e.path())?);
            }
        }
    }
    Ok(out)
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()))?;
        } else {
            std::fs::copy(e.path(), to.join(e.file_name()))?;
        }
    }
    Ok(())
}

fn mode(p: &Path) -> anyhow::Result<u32> {
    Ok(std::fs::metadata(p)?.permissions().mode() & 0o777)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_during_calls_restores_into_a_stopped_home() -> anyhow::Result<()> {
    let a = TestHome::new()?;
    let api = a.start_daemon().await?;
    seed(&a, &api).await?;
    assert_eq!(whoami_env(&api).await?, json!(VALUE));

    // Calls keep running while the backup is taken.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut callers = tokio::task::JoinSet::new();
    for i in 0..3 {
        let (api, stop, ok, failed) = (api.clone(), stop.clone(), ok.clone(), failed.clone());
        callers.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let body = json!({"name": "tiny__echo", "arguments": {"message": format!("caller {i}")}});
                match api.post_json("/v1/tools/call", &body).reply().await {
                    Ok(r) if r.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        });
    }
    let started = ok.clone();
    wait_for("calls to be under way", Duration::from_secs(20), move || {
        let n = started.load(Ordering::Relaxed);
        async move { Ok((n >= 5).then_some(())) }
    })
    .await?;
    let before = ok.load(Ordering::Relaxed);
    let dir = a.temp().join("backups/first");
    let dir_s = dir.display().to_string();
    let out = a.cli(&["backup", &dir_s]).await?.ok()?;
    let during = ok.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    while callers.join_next().await.is_some() {}
    assert_eq!(failed.load(Ordering::Relaxed), 0, "calls failed while the backup ran");
    ensure!(during > 0, "no call completed while the backup ran");

    ensure!(out.stdout.contains(&format!("Backup written to {dir_s}")), "{out}");
    ensure!(out.stderr.contains("WARNING") && out.stderr.contains("secret.key"), "no secret.key warning: {out}");
    assert_eq!(mode(&dir)?, 0o700);
    let manifest: Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json"))?)?;
    let paths: Vec<&str> =
        manifest["files"].as_array().context("files")?.iter().filter_map(|f| f["path"].as_str()).collect();
    assert_eq!(paths, ["coffer.db", "knowledge/notes/a.md", "memory/facts.md", "secret.key"]);
    for p in paths.iter().chain(&["manifest.json"]) {
        assert_eq!(mode(&dir.join(p))?, 0o600, "{p}");
    }
    assert_eq!(manifest["format_version"], 1);

    // A second backup into the same directory is refused (409 → exit 4), naming the reason.
    let again = a.cli(&["backup", &dir_s]).await?;
    assert_eq!(again.code, Some(4), "{again}");
    ensure!(again.stderr.contains("not empty"), "{again}");

    // Another home, with data of its own, stopped.
    let b = TestHome::new()?;
    let api_b = b.start_daemon().await?;
    let other = json!({"name": "other", "url": "http://127.0.0.1:9/mcp", "enabled": false});
    ensure!(api_b.post_json("/v1/mcp/servers", &other).reply().await?.status == 201);
    b.terminate_daemon(Duration::from_secs(20)).await?;

    let refused = b.cli(&["restore", &dir_s]).await?;
    assert_eq!(refused.code, Some(1), "{refused}");
    ensure!(refused.stderr.contains("--force"), "{refused}");
    let done = b.cli(&["restore", "--force", &dir_s]).await?.ok()?;
    ensure!(done.stdout.contains("To undo: coffer restore --force"), "{done}");
    ensure!(b.daemon_processes().is_empty(), "restore started a daemon");
    let aside: Vec<PathBuf> = std::fs::read_dir(b.root())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("restore-backup-")))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    ensure!(aside[0].join("manifest.json").is_file(), "the previous state is not restorable");

    // Everything is back, and the credential still decrypts: the upstream gets its value.
    let api_b = b.start_daemon().await?;
    let servers = api_b.get("/v1/mcp/servers").reply().await?.ok_json()?;
    let names: Vec<&str> =
        servers["items"].as_array().context("items")?.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["tiny"]);
    assert_eq!(servers["items"][0]["env"], json!({"TINY_ECHO_ENV": {"credential_ref": CRED}}));
    let settings = api_b.get("/v1/settings").reply().await?.ok_json()?;
    assert_eq!(settings["values"]["e2e.note"], "kept by the backup");
    let creds = api_b.get("/v1/credentials").reply().await?.ok_json()?;
    assert_eq!(creds["items"][0]["name"], CRED);
    let prefs = api_b.get("/v1/mcp/servers/tiny/preferences").reply().await?.ok_json()?;
    assert_eq!(
        prefs["items"],
        json!([{"server": "tiny", "kind": "tool", "name": "add", "enabled": false, "updated_at": prefs["items"][0]["updated_at"]}])
    );
    assert_eq!(whoami_env(&api_b).await?, json!(VALUE));
    assert_eq!(std::fs::read_to_string(b.root().join("knowledge/notes/a.md"))?, "# A note\n");
    assert_eq!(std::fs::read_to_string(b.root().join("memory/facts.md"))?, "- the sky is blue\n");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_while_the_daemon_runs_is_refused() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let pid = home.daemon_info()?.pid;
    let dir = home.temp().join("bk");
    let r = api.post_json("/v1/backup", &json!({"path": dir})).reply().await?;
    ensure!(r.status == 201, "backup: {} {}", r.status, r.text);
    let body = r.json()?;
    assert_eq!(body["path"], dir.display().to_string());
    assert_eq!(body["secret_key_included"], false, "no credential yet, so no key: {body}");
    assert_eq!(body["manifest"]["files"][0]["path"], "coffer.db");
    api.post_json("/v1/backup", &json!({"path": "relative/dir"}))
        .reply()
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    api.post_json("/v1/backup", &json!({"path": dir})).reply().await?.expect_envelope(409, "ALREADY_EXISTS")?;

    let out = home.cli(&["restore", "--force", &dir.display().to_string()]).await?;
    assert_eq!(out.code, Some(1), "{out}");
    ensure!(out.stderr.contains("is running") && out.stderr.contains("coffer daemon stop"), "{out}");
    assert_eq!(home.daemon_info()?.pid, pid);
    assert_eq!(home.daemon_processes().len(), 1);
    api.health().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_backups_are_refused_and_the_home_is_untouched() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    seed(&home, &api).await?;
    let good = home.temp().join("good");
    let r = api.post_json("/v1/backup", &json!({"path": good})).reply().await?;
    ensure!(r.status == 201, "backup: {} {}", r.status, r.text);
    // The home moves on after the backup, then stops.
    std::fs::write(home.root().join("memory/later.md"), "written after the backup\n")?;
    home.terminate_daemon(Duration::from_secs(20)).await?;
    let before = tree(home.root())?;

    let db_len = std::fs::metadata(good.join("coffer.db"))?.len();
    type Mutation = fn(&Path) -> std::io::Result<()>;
    let cases: [(&str, Mutation, String); 5] = [
        (
            "flipped",
            |d| {
                let p = d.join("coffer.db");
                let mut b = std::fs::read(&p)?;
                let mid = b.len() / 2;
                b[mid] ^= 0xff;
                std::fs::write(&p, b)
            },
            "coffer.db does not match its SHA-256".into(),
        ),
        (
            "truncated-db",
            |d| std::fs::OpenOptions::new().write(true).open(d.join("coffer.db"))?.set_len(1000),
            format!("coffer.db is 1000 bytes, the manifest says {db_len}"),
        ),
        (
            "truncated-note",
            |d| std::fs::write(d.join("knowledge/notes/a.md"), "# A"),
            "knowledge/notes/a.md is 3 bytes, the manifest says 9".into(),
        ),
        ("no-manifest", |d| std::fs::remove_file(d.join("manifest.json")), "manifest.json is missing".into()),
        ("no-key", |d| std::fs::remove_file(d.join("secret.key")), "secret.key is missing".into()),
    ];
    for (name, mutate, needle) in cases {
        let dir = home.temp().join(name);
        copy_dir(&good, &dir)?;
        mutate(&dir)?;
        let out = home.cli(&["restore", "--force", &dir.display().to_string()]).await?;
        assert_eq!(out.code, Some(1), "{name}: {out}");
        ensure!(out.stderr.contains(&needle), "{name}: expected {needle:?} in {out}");
        ensure!(out.stderr.contains(&dir.display().to_string()), "{name}: the backup is not named: {out}");
        ensure!(tree(home.root())? == before, "{name}: the home changed");
        ensure!(home.daemon_processes().is_empty(), "{name}: a daemon was started");
    }

    // The intact backup restores, and the home then lacks what was written after it.
    home.cli(&["restore", "--force", &good.display().to_string()]).await?.ok()?;
    ensure!(!home.root().join("memory/later.md").exists());
    Ok(())
}
