//! What a turn changed (issue 34 §4), through a real daemon (`coffer-test-daemon scripted-chat`):
//! the scripted agent writes, removes and renames files in a git repository that already had
//! uncommitted work; the `files_changed` SSE event follows the turn's end, the assistant message
//! carries the same list (stored: it reads back after a restart of the page), `…/diff` answers
//! each file's diff, refuses a path outside the folder (400) and answers 404 for a file the turn
//! did not change; a turn that changes nothing publishes nothing.
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::chat::rest_send as send;
use coffer_tests::{Api, SendExt, TestHome, chat};
use serde_json::{Value, json};

const FRAME_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs git in `dir` (fixture setup).
#[allow(clippy::disallowed_methods)] // a test's fixture repository, run to completion at once
pub fn git(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new("git")
        .args(["-c", "user.email=t@example.com", "-c", "user.name=t", "-c", "init.defaultBranch=main"])
        .args(args)
        .current_dir(dir)
        .output()
        .context("git is not installed")?;
    ensure!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

/// A git repository with three committed files and the user's own uncommitted edit of one.
pub fn project(root: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(root.join("src"))?;
    std::fs::write(root.join("src/a.rs"), "fn a() {}\n")?;
    std::fs::write(root.join("gone.txt"), "bye\n")?;
    std::fs::write(root.join("old.txt"), "moving\n")?;
    std::fs::write(root.join("notes.md"), "# notes\n")?;
    git(root, &["init", "-q"])?;
    git(root, &["add", "."])?;
    git(root, &["commit", "-qm", "init"])?;
    std::fs::write(root.join("notes.md"), "# notes\nmine, not the agent's\n")?;
    Ok(())
}

/// The SSE frames of `…/events` (event name, data) from the stream's start.
struct Frames {
    resp: reqwest::Response,
    parser: coffer_types::sse::SseParser,
    ready: std::collections::VecDeque<(String, Value)>,
}

impl Frames {
    async fn open(api: &Api, id: &str) -> anyhow::Result<Self> {
        let resp = api.get(&format!("/v1/conversations/{id}/events")).send().await?;
        ensure!(resp.status() == 200, "events: {}", resp.status());
        Ok(Self { resp, parser: coffer_types::sse::SseParser::new(), ready: Default::default() })
    }

    async fn next(&mut self) -> anyhow::Result<(String, Value)> {
        loop {
            if let Some(f) = self.ready.pop_front() {
                return Ok(f);
            }
            let chunk = tokio::time::timeout(FRAME_TIMEOUT, self.resp.chunk()).await.context("no frame in time")??;
            let bytes = chunk.context("the stream ended")?;
            let mut out = Vec::new();
            self.parser.push(&bytes, &mut out);
            for e in out {
                self.ready.push_back((e.event.clone(), serde_json::from_slice(&e.data)?));
            }
        }
    }

    /// Frames up to and including the first of kind `kind`.
    async fn until(&mut self, kind: &str) -> anyhow::Result<Vec<(String, Value)>> {
        let mut out = Vec::new();
        loop {
            let f = self.next().await?;
            let hit = f.0 == kind;
            out.push(f);
            if hit {
                return Ok(out);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_s_changed_files_come_as_an_event_on_the_message_and_as_diffs() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = chat::start_daemon(&home).await?;
    let root = home.temp().join("project");
    project(&root)?;
    let r = api
        .post_json("/v1/conversations", &json!({"agent_key": "scripted", "agent_config": {"cwd": root}}))
        .reply()
        .await?;
    ensure!(r.status == 201, "create: {} {}", r.status, r.text);
    let c = r.json()?;
    let id = c["id"].as_str().context("id")?.to_owned();
    let cwd = c["agent_config"]["cwd"].as_str().context("cwd")?.to_owned();
    // No turn changed files yet: `chat diff` exits 3 (docs/CLI.md), saying so.
    let out = home.cli(&["chat", "diff", &id]).await?;
    ensure!(out.code == Some(3) && out.stderr.contains("changed files"), "chat diff with no changes: {out:?}");
    let mut frames = Frames::open(&api, &id).await?;

    send(&api, &id, "write:src/a.rs fn a() {}\\nfn b() {}\nwrite:src/new.rs pub fn new() {}\nrm:gone.txt\nmv:old.txt renamed.txt\nsay:done").await?;
    let turn = frames.until("files_changed").await?;
    let kinds: Vec<&str> = turn.iter().map(|(k, _)| k.as_str()).collect();
    let done = kinds.iter().position(|k| *k == "turn_done").context("turn_done")?;
    assert_eq!(done + 1, kinds.len() - 1, "files_changed follows turn_done: {kinds:?}");
    let (_, event) = turn.last().context("files_changed")?;
    let fc = &event["files_changed"];
    let message_id = turn[done].1["turn_done"]["message"]["id"].as_str().context("message id")?.to_owned();
    assert_eq!(fc["message_id"], json!(message_id));
    let listed: Vec<(String, String)> = fc["files"]
        .as_array()
        .context("files")?
        .iter()
        .map(|f| (f["path"].as_str().unwrap_or("").to_owned(), f["change"].as_str().unwrap_or("").to_owned()))
        .collect();
    let want = [("gone.txt", "deleted"), ("renamed.txt", "renamed"), ("src/a.rs", "modified"), ("src/new.rs", "added")];
    assert_eq!(listed, want.map(|(p, k)| (p.to_owned(), k.to_owned())), "{fc}");
    let a = &fc["files"][2];
    assert_eq!((&a["additions"], &a["deletions"]), (&json!(1), &json!(0)), "{a}");
    assert_eq!(fc["files"][1]["old_path"], "old.txt");
    assert_eq!(fc["truncated"], false);

    // The message carries it (stored: read back from the store).
    let msgs = api.get(&format!("/v1/conversations/{id}/messages")).reply().await?.ok_json()?;
    let m =
        msgs["items"].as_array().context("items")?.iter().find(|m| m["id"] == json!(message_id)).context("message")?;
    assert_eq!(m["files_changed"]["files"], fc["files"], "{m}");
    let user = &msgs["items"][0];
    assert_eq!(user["files_changed"], Value::Null);

    // One file's diff; hostile and unknown paths.
    let diff = |path: &str| {
        let q = url_escape(path);
        api.get(&format!("/v1/conversations/{id}/messages/{message_id}/diff?path={q}")).reply()
    };
    let d = diff("src/a.rs").await?.ok_json()?;
    let text = d["diff"].as_str().context("diff")?;
    assert!(text.contains("--- a/src/a.rs") && text.contains("+fn b() {}"), "{text}");
    let d = diff("gone.txt").await?.ok_json()?;
    assert!(d["diff"].as_str().unwrap_or("").contains("-bye"), "{d}");
    for bad in ["../../etc/passwd", "/etc/passwd", "src/../../x"] {
        diff(bad).await?.expect_envelope(400, "INVALID_ARGUMENT")?;
    }
    diff("notes.md").await?.expect_envelope(404, "NOT_FOUND")?;
    api.get(&format!("/v1/conversations/{id}/messages/{message_id}/diff"))
        .reply()
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    let other = "01JDQ8ZKXW5T3M2N4P6R7S8T9V";
    api.get(&format!("/v1/conversations/{id}/messages/{other}/diff?path=src/a.rs"))
        .reply()
        .await?
        .expect_envelope(404, "NOT_FOUND")?;

    // The CLI: the newest turn's files, one file's diff, and `send --watch` prints the files.
    let out = home.cli(&["chat", "diff", &id]).await?;
    ensure!(out.code == Some(0), "chat diff: {out:?}");
    ensure!(
        out.stdout.contains("± 4 files changed: +2 \u{2212}1") && out.stdout.contains("  R old.txt → renamed.txt"),
        "{}",
        out.stdout
    );
    // PATH is read from the shell's current directory, as a shell user types it: from the
    // folder, its subfolder `src`, or anywhere with the absolute path; `./`, doubled slashes.
    let diff_in = |dir: String, path: &str| {
        let args = ["chat", "diff", id.as_str(), path].map(str::to_owned);
        let home = &home;
        async move {
            let mut cmd = home.cli_command(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
            let out = cmd.current_dir(&dir).output().await?;
            let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            anyhow::Ok((out.status.code(), stdout.into_owned(), stderr.into_owned()))
        }
    };
    let absolute = format!("{cwd}/src/a.rs");
    let src = format!("{cwd}/src");
    for (dir, given) in [
        (&cwd, "src/a.rs"),
        (&cwd, "./src/a.rs"),
        (&cwd, "src//a.rs"),
        (&cwd, "src/x/../a.rs"),
        (&src, "a.rs"),
        (&src, "../src/a.rs"),
        (&home.temp().display().to_string(), absolute.as_str()),
    ] {
        let (code, stdout, stderr) = diff_in(dir.clone(), given).await?;
        ensure!(code == Some(0) && stdout.contains("+fn b() {}"), "chat diff {given} in {dir}: {stdout} {stderr}");
    }
    // From elsewhere a relative PATH is not the folder's: refused naming it and the directory.
    let elsewhere_dir = home.temp().display().to_string();
    let (code, _, stderr) = diff_in(elsewhere_dir.clone(), "src/a.rs").await?;
    ensure!(
        code == Some(2) && stderr.contains("\"src/a.rs\" is outside") && stderr.contains(&elsewhere_dir),
        "{stderr}"
    );
    // Escapes and paths elsewhere stay refused (exit 2, a usage error naming the path); so
    // does an empty PATH, in the CLI's words (not the REST route's `?path=`).
    let elsewhere = home.temp().join("elsewhere.rs").display().to_string();
    for outside in ["../x", "src/../../x", elsewhere.as_str()] {
        let (code, _, stderr) = diff_in(cwd.clone(), outside).await?;
        let out = coffer_tests::CliOutput { args: vec![], code, stdout: String::new(), stderr };
        ensure!(
            out.code == Some(2)
                && out.stderr.contains("outside the conversation's folder")
                && out.stderr.contains(outside),
            "a path outside the folder is refused: {out:?}"
        );
    }
    let out = home.cli(&["chat", "diff", &id, ""]).await?;
    ensure!(
        out.code == Some(2) && out.stderr.contains("PATH is empty") && !out.stderr.contains("?path="),
        "empty PATH: {out:?}"
    );
    let out = home.cli(&["chat", "send", &id, "--watch", "write:cli.txt from the cli"]).await?;
    ensure!(out.code == Some(0) && out.stdout.contains("  A cli.txt  +1 \u{2212}0"), "send --watch: {out:?}");
    frames.until("files_changed").await?;

    // A turn that changes nothing publishes nothing: the next turn's events come straight after.
    send(&api, &id, "say:nothing to change").await?;
    frames.until("turn_done").await?;
    send(&api, &id, "write:late.txt x").await?;
    let next = frames.until("files_changed").await?;
    let kinds: Vec<&str> = next.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "files_changed").count(), 1, "{kinds:?}");
    assert!(kinds.iter().filter(|k| **k == "turn_done").count() == 1, "one turn's events only: {kinds:?}");
    assert_eq!(next.last().context("last")?.1["files_changed"]["files"][0]["path"], "late.txt");
    Ok(())
}

/// `path` escaped for a query string (`/` kept).
fn url_escape(path: &str) -> String {
    path.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'/' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
