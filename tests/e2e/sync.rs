//! `coffer sync` end to end with real git and no network: two daemons on two temporary homes and
//! a bare repository on local disk (`file://`). A fact remembered on A is recalled on B; a server
//! registered on A appears on B with its credential flagged missing there; a note edited on both
//! keeps both versions; a server changed on both keeps the newer (the other in the audit log);
//! an unreachable remote loses nothing and the worker backs off; a malformed vault file pulled is
//! refused by name with nothing applied; 1,000 notes go across; a kill -9 of the engine mid-sync
//! leaves a repository the next sync completes; no credential value is in any object pushed; a
//! pulled removal of the default profile is refused and reported.
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::{Api, SendExt, TestHome, wait::wait_for};
use reqwest::Method;
use serde_json::{Value, json};

/// The credential the server references, and its value (a test value, scanned for).
const CRED: &str = "tiny-sync-token";
const VALUE: &str = "e2e-sync-credential-value-5f3a9c";

/// Runs `git args…` (the test's own, outside Coffer) and returns stdout.
fn git(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    // Test setup: a bare remote and a scratch clone, driven directly.
    #[allow(clippy::disallowed_methods)]
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=test", "-c", "user.email=test@example.invalid"])
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .context("running git")?;
    ensure!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A bare repository in `dir`, and its `file://` URL.
fn bare_remote(dir: &Path) -> anyhow::Result<(PathBuf, String)> {
    let path = dir.join("remote.git");
    std::fs::create_dir_all(&path)?;
    git(&path, &["init", "-q", "--bare", "-b", "main"])?;
    Ok((path.clone(), format!("file://{}", path.display())))
}

/// A started daemon on a new home naming itself `machine` in sync commits.
async fn machine(name: &str) -> anyhow::Result<(TestHome, Api)> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    set(&api, json!({"sync.machine_name": name})).await?;
    Ok((home, api))
}

async fn set(api: &Api, values: Value) -> anyhow::Result<()> {
    api.request(Method::PATCH, "/v1/settings").json(&json!({"set": values})).reply().await?.ok_json()?;
    Ok(())
}

/// `coffer --json sync ARGS…` on `home`: exit code and the JSON document.
async fn sync(home: &TestHome, args: &[&str]) -> anyhow::Result<(Option<i32>, Value, String)> {
    let mut all = vec!["--json", "sync"];
    all.extend_from_slice(args);
    let out = home.cli(&all).await?;
    let body = serde_json::from_str(&out.stdout).unwrap_or(Value::Null);
    Ok((out.code, body, out.stderr))
}

async fn remember(api: &Api, text: &str) -> anyhow::Result<String> {
    let reply = api.post_json("/v1/memory", &json!({"text": text})).reply().await?;
    ensure!(reply.status == 201, "remember: {} {}", reply.status, reply.text);
    let r: Value = serde_json::from_str(&reply.text)?;
    Ok(r["fact"]["id"].as_str().with_context(|| format!("{r}"))?.to_owned())
}

/// Every object of the bare repository, as text.
fn all_objects(remote: &Path) -> anyhow::Result<String> {
    git(remote, &["cat-file", "--batch-all-objects", "--batch"])
}

/// The remote's files at `main`.
fn remote_files(remote: &Path) -> anyhow::Result<Vec<String>> {
    Ok(git(remote, &["ls-tree", "-r", "--name-only", "main"])?.lines().map(str::to_owned).collect())
}

async fn register_tiny(api: &Api) -> anyhow::Result<()> {
    let r = api.request(Method::PUT, &format!("/v1/credentials/{CRED}")).json(&json!({"value": VALUE})).reply().await?;
    ensure!(r.status == 201, "credential: {} {}", r.status, r.text);
    let tiny = coffer_tests::bin("coffer-tiny-upstream")?.display().to_string();
    let body = json!({"name": "tiny", "command": tiny, "env": {"TINY_TOKEN": {"credential_ref": CRED}}});
    let r = api.post_json("/v1/mcp/servers", &body).reply().await?;
    ensure!(r.status == 201, "register: {} {}", r.status, r.text);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fact_and_a_server_follow_to_the_second_machine_and_no_secret_is_pushed() -> anyhow::Result<()> {
    let (a, api_a) = machine("alpha").await?;
    let (b, api_b) = machine("beta").await?;
    let (remote, url) = bare_remote(a.temp())?;

    // Before init: 409 naming the command.
    let (code, _, stderr) = sync(&a, &[]).await?;
    ensure!(code == Some(4) && stderr.contains("coffer sync init"), "{code:?} {stderr}");

    let id = remember(&api_a, "The deploy key rotates on the first Monday of the month.").await?;
    register_tiny(&api_a).await?;
    set(&api_a, json!({"gateway.call_timeout_ms": "45000"})).await?;
    std::fs::create_dir_all(a.root().join("knowledge/notes"))?;
    std::fs::write(a.root().join("knowledge/notes/runbook.md"), "# Runbook\n\nRestart the flux capacitor.\n")?;
    std::fs::create_dir_all(a.root().join("skills/hello"))?;
    std::fs::write(a.root().join("skills/hello/SKILL.md"), "---\nname: hello\ndescription: Say hello.\n---\nHi.\n")?;

    let (code, report, stderr) = sync(&a, &["init", &url]).await?;
    ensure!(code == Some(0), "A init: {code:?} {report} {stderr}");
    ensure!(report["pushed"]["files"]["added"].as_u64() >= Some(3), "{report}");
    ensure!(report["pushed"]["vault"]["added"].as_u64() >= Some(2), "{report}");

    // B adopts the remote: exit 4, the credential named as missing here.
    let (code, report, stderr) = sync(&b, &["init", &url]).await?;
    ensure!(code == Some(4), "B init: {code:?} {report} {stderr}");
    assert_eq!(report["missing_credentials"], json!([CRED]), "{report}");
    ensure!(report["pulled"]["files"]["added"].as_u64() >= Some(3), "{report}");

    // Recall on B.
    let found =
        api_b.post_json("/v1/memory/recall", &json!({"query": "deploy key rotates"})).reply().await?.ok_json()?;
    ensure!(found.to_string().contains(&id), "{found}");
    // The server, its reference, the setting; the KB defined and searchable.
    let tiny = api_b.get("/v1/mcp/servers/tiny").reply().await?.ok_json()?;
    ensure!(tiny.to_string().contains(CRED), "{tiny}");
    let settings = api_b.get("/v1/settings").reply().await?.ok_json()?;
    ensure!(settings.to_string().contains("45000"), "{settings}");
    wait_for("B's notes KB indexed", Duration::from_secs(30), || async {
        let r = api_b
            .post_json("/v1/knowledge/search", &json!({"query": "flux capacitor", "kb": ["notes"]}))
            .reply()
            .await?;
        Ok((r.status == 200 && r.text.contains("runbook.md")).then_some(()))
    })
    .await?;
    let skills = api_b.get("/v1/skills").reply().await?.ok_json()?;
    ensure!(skills.to_string().contains("hello"), "{skills}");

    // Status on B names the missing credential and exits 4; A is clean.
    let (code, status, _) = sync(&b, &["status"]).await?;
    ensure!(code == Some(4) && status["missing_credentials"] == json!([CRED]), "{code:?} {status}");
    assert_eq!(status["initialized"], true);
    ensure!(status["last_sync_ms"].as_i64().is_some(), "{status}");
    let (code, status, _) = sync(&a, &["status"]).await?;
    ensure!(code == Some(0) && status["ahead"] == 0 && status["behind"] == 0, "{code:?} {status}");

    // Setting it on B clears it.
    let r =
        api_b.request(Method::PUT, &format!("/v1/credentials/{CRED}")).json(&json!({"value": "b-own"})).reply().await?;
    ensure!(r.status == 201, "{}", r.text);
    let (code, report, _) = sync(&b, &[]).await?;
    ensure!(code == Some(0), "{code:?} {report}");

    // Nothing secret in any object; only the synced folders at all.
    let objects = all_objects(&remote)?;
    ensure!(!objects.contains(VALUE) && !objects.contains("b-own"), "a credential value was pushed");
    let files = remote_files(&remote)?;
    for f in &files {
        ensure!(
            ["knowledge/", "memory/", "skills/", "vault/"].iter().any(|p| f.starts_with(p)),
            "{f} should not be in the repository"
        );
        ensure!(!f.contains("secret.key") && !f.ends_with(".db") && !f.ends_with("daemon.json"), "{f}");
    }
    ensure!(files.iter().any(|f| f == "vault/servers/tiny.json"), "{files:?}");
    let secret_key = std::fs::read(a.root().join("secret.key"))?;
    ensure!(!objects.as_bytes().windows(secret_key.len()).any(|w| w == secret_key.as_slice()), "secret.key pushed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_on_both_machines_keep_both_notes_and_the_newer_server() -> anyhow::Result<()> {
    let (a, api_a) = machine("alpha").await?;
    let (b, api_b) = machine("beta").await?;
    let (_remote, url) = bare_remote(a.temp())?;
    register_tiny(&api_a).await?;
    std::fs::create_dir_all(a.root().join("knowledge/notes"))?;
    let note = "knowledge/notes/plan.md";
    std::fs::write(a.root().join(note), "# Plan\n\nship on friday\n")?;
    ensure!(sync(&a, &["init", &url]).await?.0 == Some(0));
    ensure!(sync(&b, &["init", &url]).await?.0 == Some(4)); // the credential is missing on B
    let r = api_b.request(Method::PUT, &format!("/v1/credentials/{CRED}")).json(&json!({"value": "b"})).reply().await?;
    ensure!(r.status == 201);

    // Both edit the same line and the same server; B's server edit is the newer.
    std::fs::write(a.root().join(note), "# Plan\n\nship on monday (alpha)\n")?;
    std::fs::write(b.root().join(note), "# Plan\n\nship on tuesday (beta)\n")?;
    api_a.request(Method::PATCH, "/v1/mcp/servers/tiny").json(&json!({"timeout_ms": 1111})).reply().await?.ok_json()?;
    api_b.request(Method::PATCH, "/v1/mcp/servers/tiny").json(&json!({"timeout_ms": 2222})).reply().await?.ok_json()?;

    let (code, report, _) = sync(&a, &[]).await?;
    ensure!(code == Some(0), "{code:?} {report}");
    let (code, report, stderr) = sync(&b, &[]).await?;
    ensure!(code == Some(4), "B: {code:?} {report} {stderr}");
    let conflicts = report["conflicts"].as_array().context("conflicts")?;
    let both = conflicts.iter().find(|c| c["kind"] == "both_kept").with_context(|| format!("{report}"))?;
    assert_eq!(both["path"], note);
    let sibling = both["sibling"].as_str().context("sibling")?.to_owned();
    ensure!(sibling.starts_with("knowledge/notes/plan.conflict-alpha-") && sibling.ends_with(".md"), "{sibling}");
    assert_eq!(std::fs::read_to_string(b.root().join(note))?, "# Plan\n\nship on tuesday (beta)\n");
    assert_eq!(std::fs::read_to_string(b.root().join(&sibling))?, "# Plan\n\nship on monday (alpha)\n");
    let newer = conflicts.iter().find(|c| c["kind"] == "newer_kept").with_context(|| format!("{report}"))?;
    assert_eq!(newer["path"], "vault/servers/tiny.json");
    let tiny = api_b.get("/v1/mcp/servers/tiny").reply().await?.ok_json()?;
    assert_eq!(tiny["timeout_ms"], 2222, "{tiny}");
    let audit = api_b.get("/v1/audit?limit=50").reply().await?.ok_json()?;
    let entry = audit["items"]
        .as_array()
        .and_then(|items| items.iter().find(|e| e["action"] == "sync.conflict"))
        .with_context(|| format!("no sync.conflict in {audit}"))?;
    ensure!(entry.to_string().contains("1111"), "the discarded version is recorded: {entry}");

    // A gets both notes and B's server; status on B lists the conflict sibling.
    let (code, report, _) = sync(&a, &[]).await?;
    ensure!(code == Some(4) || code == Some(0), "{code:?} {report}");
    assert_eq!(std::fs::read_to_string(a.root().join(&sibling))?, "# Plan\n\nship on monday (alpha)\n");
    assert_eq!(std::fs::read_to_string(a.root().join(note))?, "# Plan\n\nship on tuesday (beta)\n");
    let tiny = api_a.get("/v1/mcp/servers/tiny").reply().await?.ok_json()?;
    assert_eq!(tiny["timeout_ms"], 2222, "{tiny}");
    let (_, status, _) = sync(&b, &["status"]).await?;
    ensure!(status["conflicts"].to_string().contains(&sibling), "{status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_remote_loses_nothing_and_a_malformed_vault_file_is_refused() -> anyhow::Result<()> {
    let (a, api_a) = machine("alpha").await?;
    let (remote, url) = bare_remote(a.temp())?;
    for bad in
        [json!({"remote": "-uevil"}), json!({"remote": "ext::sh -c id"}), json!({"remote": ""}), json!({"url": "x"})]
    {
        let r = api_a.post_json("/v1/sync/init", &bad).reply().await?;
        ensure!(
            r.status == 400 && (r.text.contains("remote") || r.text.contains("url")),
            "{bad}: {} {}",
            r.status,
            r.text
        );
    }
    ensure!(!a.root().join("sync.git").exists(), "a refused init creates nothing");
    ensure!(sync(&a, &["init", &url]).await?.0 == Some(0));
    // Moving to a remote that does not answer fails and keeps the one that works.
    let nowhere = format!("file://{}", a.temp().join("no-such-remote.git").display());
    let (code, _, stderr) = sync(&a, &["init", &nowhere]).await?;
    ensure!(
        code == Some(1) && stderr.contains("cannot reach the sync remote") && stderr.contains("previous remote"),
        "{code:?} {stderr}"
    );
    let (_, status, _) = sync(&a, &["status"]).await?;
    ensure!(status["remote"].as_str().is_some_and(|r| r.contains("remote.git")), "{status}");

    // The remote goes away: a clear error, the fact committed locally, then pushed once back.
    let away = a.temp().join("away.git");
    std::fs::rename(&remote, &away)?;
    let id = remember(&api_a, "The office wifi is called lighthouse.").await?;
    let (code, _, stderr) = sync(&a, &[]).await?;
    ensure!(code == Some(1) && stderr.contains("cannot reach the sync remote"), "{code:?} {stderr}");
    let (_, status, _) = sync(&a, &["status"]).await?;
    ensure!(status["last_error"].as_str().is_some_and(|e| e.contains("cannot reach")), "{status}");

    // The worker, on, backs off while the remote is away.
    set(&api_a, json!({"sync.auto": "1", "sync.debounce_s": "1", "sync.pull_interval_s": "5"})).await?;
    wait_for("the worker backing off", Duration::from_secs(60), || async {
        let s = api_a.get("/v1/sync/status").reply().await?.ok_json()?;
        Ok((s["worker"] == "backing_off" && s["failures"].as_u64() >= Some(1)).then_some(s))
    })
    .await?;
    set(&api_a, json!({"sync.auto": "0"})).await?;
    std::fs::rename(&away, &remote)?;
    let (code, report, stderr) = sync(&a, &[]).await?;
    ensure!(code == Some(0), "{code:?} {report} {stderr}");
    ensure!(remote_files(&remote)?.iter().any(|f| f.contains(&id)), "the fact reached the remote");

    // Someone pushes a malformed vault file: named, nothing applied, the merge undone.
    let scratch = a.temp().join("scratch");
    git(a.temp(), &["clone", "-q", &url, scratch.to_str().context("utf-8")?])?;
    std::fs::create_dir_all(scratch.join("vault/servers"))?;
    std::fs::write(scratch.join("vault/servers/broken.json"), "{\"name\": \"broken\", \"transport\": ")?;
    std::fs::create_dir_all(scratch.join("memory"))?;
    std::fs::write(scratch.join("memory/01JZZZZZZZZZZZZZZZZZZZZZZZ.md"), "a fact from elsewhere\n")?;
    git(&scratch, &["add", "-A"])?;
    git(&scratch, &["commit", "-q", "-m", "bad"])?;
    git(&scratch, &["push", "-q", "origin", "HEAD:main"])?;
    let head_before = git(&a.root().join("sync.git"), &["rev-parse", "HEAD"])?;
    let (code, _, stderr) = sync(&a, &[]).await?;
    ensure!(code == Some(2) && stderr.contains("vault/servers/broken.json"), "{code:?} {stderr}");
    assert_eq!(git(&a.root().join("sync.git"), &["rev-parse", "HEAD"])?, head_before, "the merge was undone");
    ensure!(!a.root().join("memory/01JZZZZZZZZZZZZZZZZZZZZZZZ.md").exists(), "nothing applied half-way");
    api_a.get("/v1/mcp/servers/broken").reply().await?.expect_envelope(404, "NOT_FOUND")?;
    // The daemon keeps serving.
    api_a.get("/v1/status").reply().await?.ok_json()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_notes_cross_and_a_kill_mid_sync_loses_nothing() -> anyhow::Result<()> {
    let (a, api_a) = machine("alpha").await?;
    let (b, api_b) = machine("beta").await?;
    let (remote, url) = bare_remote(a.temp())?;
    let bulk = a.root().join("knowledge/bulk");
    std::fs::create_dir_all(&bulk)?;
    for i in 0..1000 {
        std::fs::write(bulk.join(format!("note-{i:04}.md")), format!("# Note {i}\n\nbody of note number {i}\n"))?;
    }
    let (code, report, stderr) = sync(&a, &["init", &url]).await?;
    ensure!(code == Some(0), "{code:?} {stderr}");
    assert_eq!(report["pushed"]["files"]["added"], 1000, "{report}");
    let (code, report, stderr) = sync(&b, &["init", &url]).await?;
    ensure!(code == Some(0), "{code:?} {stderr}");
    assert_eq!(report["pulled"]["files"]["added"], 1000, "{report}");
    wait_for("B indexed the thousand notes", Duration::from_secs(120), || async {
        let kb = api_b.get("/v1/knowledge/bulk").reply().await?;
        Ok((kb.status == 200 && kb.ok_json()?["documents"] == 1000).then_some(()))
    })
    .await?;

    // kill -9 of the engine (coffer-retrieval) while a sync runs git.
    for i in 1000..1300 {
        std::fs::write(bulk.join(format!("note-{i:04}.md")), format!("# Note {i}\n\nlate note {i}\n"))?;
    }
    let mut cli = a.cli_command(&["sync"])?;
    let mut child = cli.spawn()?;
    let retrieval = wait_for("a git child of coffer-retrieval", Duration::from_secs(60), || async {
        let procs = a.processes();
        let r = procs.iter().find(|p| p.name == "coffer-retrieval").map(|p| p.pid);
        let git_running = procs.iter().any(|p| p.name == "git");
        Ok(r.filter(|_| git_running))
    })
    .await?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(retrieval), nix::sys::signal::Signal::SIGKILL)?;
    let _ = child.wait().await?;
    // A lock such a kill leaves behind.
    std::fs::write(a.root().join("sync.git/index.lock"), b"")?;
    let (code, report, stderr) = wait_for("a sync after the restart", Duration::from_secs(60), || async {
        let r = sync(&a, &[]).await?;
        Ok((r.0 == Some(0)).then_some(r))
    })
    .await
    .map_err(|e| e.context("sync never succeeded again"))?;
    ensure!(code == Some(0), "{code:?} {report} {stderr}");
    let files = remote_files(&remote)?;
    assert_eq!(files.iter().filter(|f| f.starts_with("knowledge/bulk/")).count(), 1300);
    git(&remote, &["fsck", "--no-progress"])?;
    let _ = api_a;
    Ok(())
}

/// `sync init` to an empty bare repository whose `HEAD` is `master` pushes `master` (no `main`
/// beside it), so a clone checks it out without a "remote HEAD refers to nonexistent ref"
/// warning; the machine's default name is the host name with a random suffix, and
/// `--machine-name` sets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_follows_the_remote_s_default_branch_and_names_the_machine_distinctly() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let _api = home.start_daemon().await?;
    let path = home.temp().join("master.git");
    std::fs::create_dir_all(&path)?;
    git(&path, &["init", "-q", "--bare", "-b", "master"])?;
    let url = format!("file://{}", path.display());
    let (code, _, out) = sync(&home, &["init", &url]).await?;
    ensure!(code == Some(0), "{out}");
    let heads = git(&path, &["for-each-ref", "--format=%(refname)", "refs/heads"])?;
    assert_eq!(heads.trim(), "refs/heads/master", "only the remote's default branch");
    #[allow(clippy::disallowed_methods)]
    let clone = std::process::Command::new("git")
        .args(["clone", "-q", &url, "clone"])
        .current_dir(home.temp())
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()?;
    let stderr = String::from_utf8_lossy(&clone.stderr);
    ensure!(clone.status.success() && !stderr.contains("warning"), "{stderr}");
    git(&home.temp().join("clone"), &["rev-parse", "--verify", "HEAD"]).context("the clone checked out a commit")?;

    let (_, status, _) = sync(&home, &["status"]).await?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
    let machine = status["machine"].as_str().unwrap_or_default().to_owned();
    let (prefix, suffix) = machine.rsplit_once('-').with_context(|| format!("{status}"))?;
    ensure!(suffix.len() == 4 && suffix.chars().all(|c| c.is_ascii_hexdigit()), "{machine}");
    ensure!(
        host.trim().to_lowercase().replace(|c: char| !c.is_ascii_alphanumeric(), "-").starts_with(prefix),
        "{machine} for host {host}"
    );

    // A second machine sets its name.
    let other = TestHome::new()?;
    let _api2 = other.start_daemon().await?;
    let (code, _, out) = sync(&other, &["init", &url, "--machine-name", "Laptop 2"]).await?;
    ensure!(code == Some(0), "{out}");
    let (_, status, _) = sync(&other, &["status"]).await?;
    assert_eq!(status["machine"], "laptop-2");
    let log = git(&path, &["log", "--format=%an", "master"])?;
    ensure!(log.lines().any(|a| a == "laptop-2") && log.lines().any(|a| a == machine), "{log}");
    Ok(())
}

/// A pull whose merge removes `vault/profiles/default.json` (a hand edit of the repository:
/// Coffer itself never removes `default`) is refused, not applied: the local default profile
/// keeps its overrides (applying the removal would have reset it to "everything" silently), the
/// sync reports a `local_kept` conflict (exit 4) and audits it, the file goes back to the
/// remote, and the other machine's default is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pulled_removal_of_the_default_profile_is_refused_and_reported() -> anyhow::Result<()> {
    let (a, api_a) = machine("alpha").await?;
    let (b, api_b) = machine("beta").await?;
    let (remote, url) = bare_remote(a.temp())?;
    let spec = json!({"description": "lean", "overrides": {"tiny__echo": {"name": "say"}}});
    let r = api_a.request(Method::PUT, "/v1/mcp/profiles/default").json(&spec).reply().await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    let (code, report, stderr) = sync(&a, &["init", &url]).await?;
    ensure!(code == Some(0), "A init: {code:?} {report} {stderr}");
    let (code, report, stderr) = sync(&b, &["init", &url]).await?;
    ensure!(code == Some(0) || code == Some(4), "B init: {code:?} {report} {stderr}");
    let default_of = |api: &Api| {
        let api = api.clone();
        async move { api.get("/v1/mcp/profiles/default").reply().await?.ok_json() }
    };
    ensure!(default_of(&api_b).await?["overrides"]["tiny__echo"]["name"] == "say", "B has A's default");

    // Someone removes the file from the repository by hand.
    let scratch = a.temp().join("scratch");
    git(a.temp(), &["clone", "-q", &url, scratch.to_str().context("utf-8")?])?;
    git(&scratch, &["rm", "-q", "vault/profiles/default.json"])?;
    git(&scratch, &["commit", "-q", "-m", "remove the default profile"])?;
    git(&scratch, &["push", "-q", "origin", "HEAD:main"])?;
    ensure!(!remote_files(&remote)?.contains(&"vault/profiles/default.json".to_owned()), "removed on the remote");

    // A pulls it: refused, reported, audited; A's default as it was; the file back on the remote.
    let (code, report, stderr) = sync(&a, &[]).await?;
    ensure!(code == Some(4), "a conflict needs the user's eye: {code:?} {report} {stderr}");
    let conflicts = report["conflicts"].as_array().with_context(|| format!("{report}"))?;
    let c = conflicts.iter().find(|c| c["kind"] == "local_kept").with_context(|| format!("{report}"))?;
    assert_eq!((c["kind"].as_str(), c["path"].as_str()), (Some("local_kept"), Some("vault/profiles/default.json")));
    let detail = c["detail"].as_str().unwrap_or_default();
    ensure!(detail.contains("default profile cannot be removed") && detail.contains("test"), "{detail}");
    let p = default_of(&api_a).await?;
    ensure!(p["overrides"]["tiny__echo"]["name"] == "say" && p["description"] == "lean", "A's default kept: {p}");
    ensure!(remote_files(&remote)?.contains(&"vault/profiles/default.json".to_owned()), "pushed back");
    let audit = api_a.get("/v1/audit?limit=50").reply().await?.ok_json()?;
    let items = audit["items"].as_array().context("items")?;
    ensure!(
        items.iter().any(|e| e["action"] == "sync.conflict" && e.to_string().contains("vault/profiles/default.json")),
        "audited: {audit}"
    );

    // B's next sync changes nothing of its default.
    let before = default_of(&api_b).await?;
    let (code, report, stderr) = sync(&b, &[]).await?;
    ensure!(code == Some(0) || code == Some(4), "B: {code:?} {report} {stderr}");
    ensure!(!report.to_string().contains("local_kept"), "B refused nothing: {report}");
    assert_eq!(default_of(&api_b).await?, before, "B's default untouched");
    Ok(())
}
