//! Knowledge bases that never silently stop (issue 38 §3), through the real daemon: a folder
//! the daemon cannot read does not stop the rest from being watched and is that KB's error; a
//! file it cannot read is that file's error (not a failed KB retried every 2 s) and is indexed
//! as soon as it can be read; `coffer doctor` names both; an idle KB is rescanned every
//! `retrieval.rescan_interval_s`; hidden folders skipped are counted and named; a KB's index
//! size is reported, and removing it gives the space back.
//!
//! Unreadable, for real: the tests run as root, which reads anything, so the home's processes
//! run without `CAP_DAC_OVERRIDE` and `CAP_DAC_READ_SEARCH`
//! ([`coffer_tests::TestHomeBuilder::honour_file_permissions`], `setpriv`), and `chmod 000`
//! binds them as it binds a user's daemon.
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use anyhow::ensure;
use coffer_proto::retrieval::{JobState, KnowledgeBaseName};
use coffer_tests::write_file as write;
use coffer_tests::{SendExt, TestHome, doctor_check, wait_for};
use serde_json::json;

use crate::retrieval_service::{Client, FRESH, INDEXED, client, finds, indexed};

fn chmod(p: &std::path::Path, mode: u32) -> anyhow::Result<()> {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Adds `dir` as the knowledge base `notes` over REST.
async fn add_notes(api: &coffer_tests::Api, dir: &std::path::Path) -> anyhow::Result<()> {
    let r = api
        .request(reqwest::Method::POST, "/v1/knowledge")
        .json(&json!({"name": "notes", "path": dir}))
        .reply()
        .await?;
    ensure!(r.status == 201 || r.status == 200, "{} {}", r.status, r.text);
    Ok(())
}

async fn info(c: &Client) -> anyhow::Result<coffer_proto::retrieval::KnowledgeBaseInfo> {
    Ok(c.clone().get_knowledge_base(KnowledgeBaseName { name: "notes".into() }).await?.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_folder_or_file_is_that_kb_s_error_and_the_rest_stays_watched() -> anyhow::Result<()> {
    let home = TestHome::builder().honour_file_permissions().build()?;
    let dir = home.temp().join("notes");
    write(&dir.join("a.md"), "# A\n\naardvark\n")?;
    write(&dir.join("sub/b.md"), "# B\n\nbadger\n")?;
    write(&dir.join("locked/c.md"), "# C\n\ncapybara\n")?;
    write(&dir.join("secret.md"), "# Secret\n\nsecretary bird\n")?;
    chmod(&dir.join("locked"), 0o000)?;
    chmod(&dir.join("secret.md"), 0o000)?;
    let api = home.start_daemon().await?;
    let c = client(&api).await?;
    add_notes(&api, &dir).await?;
    let first = indexed(&c, "notes", 1, None).await?;

    // The pass ends idle, not failed; both problems are the KB's errors, by path; the watcher
    // runs.
    let p = first.progress.clone().unwrap_or_default();
    assert_eq!(p.state, JobState::Idle as i32, "{first:?}");
    let error =
        |path: &str| first.errors.iter().filter(|e| e.path == path).map(|e| e.error.clone()).collect::<Vec<_>>();
    let secret = error("secret.md");
    assert!(secret.iter().any(|e| e.starts_with("cannot read: ") && e.contains("ermission denied")), "{first:?}");
    let locked = error("locked");
    assert!(locked.iter().any(|e| e.contains("not watched for changes")), "{first:?}");
    assert!(first.watching, "{first:?}");
    for (q, want) in [("aardvark", "a.md"), ("badger", "sub/b.md")] {
        finds(&c, FRESH, q, &["keyword"], &[want]).await?;
    }

    // Everything readable is still watched: new notes at the top and in a subfolder, and in a
    // folder created now, are found within the freshness promise.
    write(&dir.join("new.md"), "# New\n\nnewt\n")?;
    write(&dir.join("sub/deeper.md"), "# Deeper\n\ndingo\n")?;
    finds(&c, FRESH, "newt", &["keyword"], &["new.md"]).await?;
    finds(&c, FRESH, "dingo", &["keyword"], &["sub/deeper.md"]).await?;
    std::fs::create_dir_all(dir.join("later"))?;
    write(&dir.join("later/e.md"), "# E\n\nechidna\n")?;
    finds(&c, INDEXED, "echidna", &["keyword"], &["later/e.md"]).await?;
    write(&dir.join("later/f.md"), "# F\n\nferret\n")?;
    finds(&c, FRESH, "ferret", &["keyword"], &["later/f.md"]).await?;

    // The doctor names both problems (a warning: the rest of the KB works).
    let report = home.cli(&["doctor", "--json"]).await?.json()?;
    let check = doctor_check(&report, "knowledge notes")?;
    assert_eq!(check["status"], "warn", "{check}");
    let message = check["message"].as_str().unwrap_or_default();
    assert!(message.contains("cannot watch (locked)") && message.contains("secret.md"), "{message}");

    // The unreadable file is not retried in a loop: no pass ran since (the job number stands).
    let now = info(&c).await?;
    let job = now.progress.clone().unwrap_or_default().job;
    ensure!(!home.log_text("retrieval").contains("Reconcile pass failed"), "a pass failed");

    // Made readable, each is indexed without anyone asking: the file by its change event, the
    // folder by its parent's.
    chmod(&dir.join("secret.md"), 0o644)?;
    finds(&c, FRESH, "secretary", &["keyword"], &["secret.md"]).await?;
    chmod(&dir.join("locked"), 0o755)?;
    finds(&c, INDEXED, "capybara", &["keyword"], &["locked/c.md"]).await?;
    let after = wait_for("the errors to clear", INDEXED, || {
        let c = c.clone();
        async move {
            let i = info(&c).await?;
            Ok(i.errors.is_empty().then_some(i))
        }
    })
    .await?;
    assert!(after.progress.unwrap_or_default().job > job, "a pass ran for the folder");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kb_is_rescanned_periodically() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    write(&dir.join("a.md"), "# A\n\naardvark\n")?;
    let api = home.start_daemon().await?;
    let c = client(&api).await?;
    add_notes(&api, &dir).await?;
    let first = indexed(&c, "notes", 1, Some(1)).await?;
    let job = first.progress.unwrap_or_default().job;
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"retrieval.rescan_interval_s": "1"}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    // Nothing changes in the folder, yet passes keep coming.
    indexed(&c, "notes", job + 3, Some(1)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hidden_folders_are_counted_the_index_size_is_reported_and_a_removal_gives_the_space_back() -> anyhow::Result<()>
{
    const NOTES: usize = 400;
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    let mut corpus = 0u64;
    for i in 0..NOTES {
        let body: Vec<String> =
            (0..40).map(|j| format!("line {j} of note {i}: the quick fox{} jumps over dog{}", i % 17, j % 7)).collect();
        let text = format!("# Note {i}\n\n{}\n", body.join("\n"));
        corpus += text.len() as u64;
        write(&dir.join(format!("n{}/note{i}.md", i / 100)), text)?;
    }
    write(&dir.join(".github/workflows/ci.md"), "# CI\n")?;
    write(&dir.join(".obsidian/workspace.md"), "# W\n")?;
    write(&dir.join("n0/.trash/old.md"), "# Old\n")?;
    write(&dir.join(".git/HEAD.md"), "ref\n")?;
    let api = home.start_daemon().await?;
    let c = client(&api).await?;
    add_notes(&api, &dir).await?;
    indexed(&c, "notes", 1, Some(NOTES as u64)).await?;
    // The size is measured again at most every 2 s while the index changes.
    let kb = wait_for("the index size measured after the pass", Duration::from_secs(10), || async {
        let r = api.request(reqwest::Method::GET, "/v1/knowledge/notes").reply().await?;
        ensure!(r.status == 200, "{} {}", r.status, r.text);
        let kb: serde_json::Value = serde_json::from_str(&r.text)?;
        Ok((kb["index_bytes"].as_u64().unwrap_or(0) > corpus / 2).then_some(kb))
    })
    .await?;
    // `.git` is never counted (never notes); the others are, by relative path.
    assert_eq!(kb["hidden_skipped"], json!([".github", ".obsidian", "n0/.trash"]), "{kb}");
    assert_eq!(kb["hidden_skipped_count"], 3);
    assert_eq!(kb["corpus_bytes"].as_u64(), Some(corpus), "{kb}");
    let index = kb["index_bytes"].as_u64().unwrap_or(0);
    assert!(index > corpus / 2 && index < corpus * 20, "index {index} bytes for {corpus} bytes of notes");
    let shown = home.cli(&["kb", "show", "notes"]).await?.ok()?.stdout;
    assert!(shown.contains("hidden:    3 skipped (not searched): .github, .obsidian, n0/.trash"), "{shown}");
    assert!(shown.contains(" on disk for "), "{shown}");

    // Removed: the database file shrinks by about the index, and the WAL is truncated.
    let size = |name: &str| std::fs::metadata(home.root().join(name)).map(|m| m.len()).unwrap_or(0);
    let before = size("coffer.db") + size("coffer.db-wal");
    home.cli(&["kb", "remove", "notes"]).await?.ok()?;
    // The file shrinks during the reclaim; its log line follows when it is done.
    let after = wait_for("the space to come back", Duration::from_secs(10), || async {
        let after = size("coffer.db") + size("coffer.db-wal");
        let logged = home.log_text("store").contains("Reclaimed the space of a removed index");
        Ok((after + index / 2 < before && logged && size("coffer.db-wal") < 1024 * 1024).then_some(after))
    })
    .await?;
    assert!(
        size("coffer.db-wal") < 1024 * 1024,
        "WAL {} bytes (before {before}, after {after})",
        size("coffer.db-wal")
    );
    Ok(())
}
