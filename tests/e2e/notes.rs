//! Notes as a person keeps them (issue 38 §4), through a real MCP client (the Python SDK through
//! the shim) on the real daemon: an Obsidian-style folder with `[[wikilinks]]`, aliases and
//! inline `#tags` is searched by an inline tag, a note is read with its resolved links and its
//! backlinks, a note written into a Coffer-owned KB is found by the next search, and the user's
//! own folder, paths that escape, secrets and oversized notes are refused as tool errors that
//! name the problem. Concurrent writes to one note leave one of them whole.
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_tests::peers::{PyClient, texts};
use coffer_tests::write_file as write;
use coffer_tests::{Api, SendExt, TestHome, wait_for};
use serde_json::{Value, json};

/// How long indexing a small folder may take on a loaded machine.
const INDEXED: Duration = Duration::from_secs(60);

/// Waits until knowledge base `kb` is idle with `documents` documents; its last answer.
pub(crate) async fn indexed(api: &Api, kb: &str, documents: u64) -> anyhow::Result<Value> {
    wait_for(&format!("knowledge base {kb} indexed with {documents} documents"), INDEXED, || async {
        let v = api.get(&format!("/v1/knowledge/{kb}")).reply().await?.ok_json()?;
        Ok((v["progress"]["state"] == "idle" && v["documents"] == documents).then_some(v))
    })
    .await
}

/// Adds a knowledge base (`POST /v1/knowledge` with `body`), which must answer 201.
pub(crate) async fn add_kb(api: &Api, body: Value) -> anyhow::Result<()> {
    let r = api.post_json("/v1/knowledge", &body).reply().await?;
    ensure!(r.status == 201, "{body}: {} {}", r.status, r.text);
    Ok(())
}

/// A vault: notes linking each other by name, by alias, by path and with headings; inline tags
/// in prose, and `#`s that are not tags (code, URL fragments, headings).
fn vault(dir: &Path) -> anyhow::Result<()> {
    write(
        &dir.join("Projects/Coffer.md"),
        "---\naliases: [The Vault App]\ntags: [project]\n---\n# Coffer\n\nA local vault for MCP. #rust/async is how it is built.\n\n```\n#not-a-tag\n```\nSee https://example.org/page#fragment too.\n",
    )?;
    write(
        &dir.join("Daily/2026-12-07.md"),
        "# Monday\n\nWorked on [[Coffer]] today, then [[The Vault App|the app]] again. #journal\n\nAlso [[Nowhere]] and [[Projects/Coffer#Coffer]].\n",
    )?;
    write(&dir.join("Ideas.md"), "# Ideas\n\nMaybe ![[Coffer]] could sync notes. `#codeword`\n")?;
    Ok(())
}

async fn tool_error(client: &mut PyClient, tool: &str, args: Value) -> anyhow::Result<String> {
    let r = client.call(tool, args.clone()).await?;
    let result = r.get("result").with_context(|| format!("{tool} {args}: {r}"))?;
    ensure!(result["isError"] == true, "{tool} {args} should be refused: {result}");
    Ok(texts(result))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wikilinks_backlinks_inline_tags_and_notes_through_a_real_mcp_client() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let outside = tempfile::tempdir()?;
    let folder = outside.path().join("Vault");
    vault(&folder)?;
    let secret_outside = outside.path().join("outside.md");
    std::fs::write(&secret_outside, "# Outside\n\nnot part of the vault\n")?;
    std::os::unix::fs::symlink(&secret_outside, folder.join("escape.md"))?;
    let api = home.start_daemon().await?;
    add_kb(&api, json!({"name": "vault", "path": folder.display().to_string()})).await?;
    add_kb(&api, json!({"name": "inbox"})).await?;
    indexed(&api, "vault", 3).await?;
    indexed(&api, "inbox", 0).await?;

    let mut client = PyClient::through_shim(&home, &[]).await?;
    let tools = client.tools().await?;
    for t in ["coffer__read_note", "coffer__write_note", "coffer__search_knowledge"] {
        ensure!(tools.iter().any(|x| x == t), "{t} not listed: {tools:?}");
    }

    // 1. An inline tag (nested) is a tag: the search's tag filter finds the note by it; a `#`
    // in a code block is not one.
    let found = client
        .call("coffer__search_knowledge", json!({"query": "vault", "kb": "vault", "tags": ["rust/async"]}))
        .await?;
    let result = &found["result"];
    let paths: Vec<&str> = result["structuredContent"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["path"].as_str())
        .collect();
    ensure!(paths == ["Projects/Coffer.md"], "{found}");
    let journal = client.call("coffer__search_knowledge", json!({"query": "Monday", "tags": "journal"})).await?;
    ensure!(texts(&journal["result"]).contains("Daily/2026-12-07.md"), "{journal}");
    let none = client.call("coffer__search_knowledge", json!({"query": "vault", "tags": ["not-a-tag"]})).await?;
    ensure!(none["result"]["structuredContent"]["results"] == json!([]), "a code block's #word is no tag: {none}");

    // 2. read_note: the note, its tags, and its backlinks (by name, alias, path and embed).
    let read = client.call("coffer__read_note", json!({"kb": "vault", "path": "Projects/Coffer.md"})).await?;
    let r = &read["result"];
    ensure!(r["isError"] != true, "{read}");
    let note = &r["structuredContent"];
    ensure!(note["title"] == "Coffer", "{note}");
    ensure!(note["tags"] == json!(["project", "rust/async"]), "{note}");
    ensure!(note["text"].as_str().is_some_and(|t| t.contains("A local vault for MCP.")), "{note}");
    let backlinks: Vec<(String, u64)> = note["backlinks"]
        .as_array()
        .context("backlinks")?
        .iter()
        .map(|b| (b["path"].as_str().unwrap_or_default().to_owned(), b["line"].as_u64().unwrap_or(0)))
        .collect();
    ensure!(
        backlinks
            == [
                ("Daily/2026-12-07.md".to_owned(), 3),
                ("Daily/2026-12-07.md".to_owned(), 3),
                ("Daily/2026-12-07.md".to_owned(), 5),
                ("Ideas.md".to_owned(), 3),
            ],
        "{backlinks:?}"
    );
    ensure!(texts(r).contains("backlinks: Daily/2026-12-07.md:3"), "{}", texts(r));
    // Outgoing links: resolved by name, alias and path; the unknown one stays unresolved.
    let daily = client.call("coffer__read_note", json!({"kb": "vault", "path": "Daily/2026-12-07.md"})).await?;
    let links = daily["result"]["structuredContent"]["links"].as_array().cloned().context("links")?;
    let resolved: Vec<(&str, &str)> =
        links.iter().map(|l| (l["target"].as_str().unwrap_or(""), l["resolved_path"].as_str().unwrap_or(""))).collect();
    ensure!(
        resolved
            == [
                ("Coffer", "Projects/Coffer.md"),
                ("The Vault App", "Projects/Coffer.md"),
                ("Nowhere", ""),
                ("Projects/Coffer", "Projects/Coffer.md"),
            ],
        "{resolved:?}"
    );
    // A line range.
    let part = client
        .call(
            "coffer__read_note",
            json!({"kb": "vault", "path": "Daily/2026-12-07.md", "start_line": 3, "end_line": 3}),
        )
        .await?;
    let part = &part["result"]["structuredContent"];
    ensure!(part["start_line"] == 3 && part["end_line"] == 3 && part["total_lines"] == 5, "{part}");
    ensure!(
        part["text"].as_str().is_some_and(|t| t.starts_with("Worked on [[Coffer]]") && !t.contains("Monday")),
        "{part}"
    );

    // 3. Paths that escape the KB are refused, naming the problem.
    let why = tool_error(&mut client, "coffer__read_note", json!({"kb": "vault", "path": "../outside.md"})).await?;
    ensure!(why.contains("'..'"), "{why}");
    let why = tool_error(&mut client, "coffer__read_note", json!({"kb": "vault", "path": "/etc/passwd"})).await?;
    ensure!(why.contains("absolute"), "{why}");
    let why = tool_error(&mut client, "coffer__read_note", json!({"kb": "vault", "path": "escape.md"})).await?;
    ensure!(why.contains("outside the knowledge base") && !why.contains("not part of the vault"), "{why}");
    let why = tool_error(&mut client, "coffer__read_note", json!({"kb": "vault", "path": "Absent.md"})).await?;
    ensure!(why.contains("Absent.md"), "{why}");
    // Only the KB's notes are read: not its hidden files, other kinds of file, or what its
    // .gitignore leaves out (a newcomer read `.env` and `.git/config` this way).
    write(&folder.join(".env"), "API_KEY=do-not-read-me\n")?;
    write(&folder.join(".git/config"), "[remote]\n\turl = https://do-not-read-me@example.org\n")?;
    write(&folder.join("secrets.txt"), "do-not-read-me\n")?;
    write(&folder.join(".gitignore"), "drafts/\n")?;
    write(&folder.join("drafts/old.md"), "# Old\n\ndo-not-read-me\n")?;
    for (path, needle) in
        [(".env", "hidden"), (".git/config", "hidden"), ("secrets.txt", "markdown"), ("drafts/old.md", ".gitignore")]
    {
        let why = tool_error(&mut client, "coffer__read_note", json!({"kb": "vault", "path": path})).await?;
        ensure!(why.contains(needle) && !why.contains("do-not-read-me"), "{path}: {why}");
    }

    // 4. write_note into the Coffer-owned KB: on disk at once, and the next search finds it,
    // with its inline tag and its link to a note of that KB.
    let wrote = client
        .call(
            "coffer__write_note",
            json!({"kb": "inbox", "path": "meetings/standup.md", "content": "# Standup\n\nShipped the zanzibar release. #meeting\n"}),
        )
        .await?;
    ensure!(wrote["result"]["isError"] != true, "{wrote}");
    ensure!(texts(&wrote["result"]).contains("Created inbox:meetings/standup.md"), "{wrote}");
    let on_disk = std::fs::read_to_string(home.root().join("knowledge/inbox/meetings/standup.md"))?;
    ensure!(on_disk.contains("zanzibar"), "{on_disk}");
    let found = client.call_text("coffer__search_knowledge", json!({"query": "zanzibar", "tags": ["meeting"]})).await?;
    ensure!(found.contains("inbox:meetings/standup.md"), "written and searchable at once: {found}");
    client
        .call_text(
            "coffer__write_note",
            json!({"kb": "inbox", "path": "todo.md", "content": "- follow up on [[standup]]", "mode": "append"}),
        )
        .await?;
    let standup = client.call("coffer__read_note", json!({"kb": "inbox", "path": "meetings/standup.md"})).await?;
    let b = &standup["result"]["structuredContent"]["backlinks"];
    ensure!(b.as_array().is_some_and(|b| b.len() == 1 && b[0]["path"] == "todo.md"), "{standup}");
    let why = tool_error(
        &mut client,
        "coffer__write_note",
        json!({"kb": "inbox", "path": "meetings/standup.md", "content": "again"}),
    )
    .await?;
    ensure!(why.contains("exists") && why.contains("replace"), "{why}");

    // 5. The user's own folder is read-only, and the refusal says how to mark it writable.
    let before = std::fs::read_to_string(folder.join("Ideas.md"))?;
    let why = tool_error(
        &mut client,
        "coffer__write_note",
        json!({"kb": "vault", "path": "Ideas.md", "content": "overwritten", "mode": "replace"}),
    )
    .await?;
    ensure!(why.contains("\"vault\"") && why.contains("--writable"), "{why}");
    ensure!(std::fs::read_to_string(folder.join("Ideas.md"))? == before, "the user's note changed");
    // Marked writable, the user's folder takes notes, and a note keeps the mode the user gave
    // it (a new one gets 0644, not the daemon's private 0600).
    {
        use std::os::unix::fs::PermissionsExt as _;
        let r =
            api.request(reqwest::Method::PATCH, "/v1/knowledge/vault").json(&json!({"writable": true})).reply().await?;
        ensure!(r.status == 200, "{} {}", r.status, r.text);
        let ideas = folder.join("Ideas.md");
        std::fs::set_permissions(&ideas, std::fs::Permissions::from_mode(0o664))?;
        for args in [
            json!({"kb": "vault", "path": "Ideas.md", "content": "\nAppended.\n", "mode": "append"}),
            json!({"kb": "vault", "path": "Fresh.md", "content": "# Fresh\n", "mode": "create"}),
        ] {
            let r = client.call("coffer__write_note", args.clone()).await?;
            ensure!(r["result"]["isError"] != true, "{args}: {r}");
        }
        let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
        ensure!(mode(&ideas)? == 0o664, "the appended note's mode: {:o}", mode(&ideas)?);
        ensure!(mode(&folder.join("Fresh.md"))? == 0o644, "a new note's mode: {:o}", mode(&folder.join("Fresh.md"))?);
        ensure!(std::fs::read_to_string(&ideas)?.ends_with("\nAppended.\n"));
    }
    // Coffer's own folder cannot be made read-only (a newcomer was told it was set, and it
    // stayed writable).
    let out = home.cli(&["kb", "set", "inbox", "--writable", "false"]).await?;
    ensure!(out.code != Some(0) && out.stderr.contains("always writable"), "{out:?}");

    // 6. Hostile writes: escaping or hidden paths, not markdown, a secret (kind named, value
    // never echoed), too large.
    for (args, needle) in [
        (json!({"kb": "inbox", "path": "../escape.md", "content": "x"}), "'..'"),
        (json!({"kb": "inbox", "path": "/tmp/x.md", "content": "x"}), "absolute"),
        (json!({"kb": "inbox", "path": ".obsidian/x.md", "content": "x"}), "hidden"),
        (json!({"kb": "inbox", "path": "notes.txt", "content": "x"}), "markdown"),
        (json!({"kb": "inbox", "path": "k.md", "content": "key: ghp_abcdefghijklmnopqrstuvwxyz0123456789"}), "secret"),
        (json!({"kb": "inbox", "path": "big.md", "content": "x".repeat(1024 * 1024 + 1)}), "content"),
        (json!({"kb": "nope", "path": "a.md", "content": "x"}), "nope"),
        (json!({"kb": "inbox", "path": format!("{}.md", "n".repeat(300)), "content": "x"}), "longer than 200 bytes"),
    ] {
        let why = tool_error(&mut client, "coffer__write_note", args.clone()).await?;
        ensure!(why.contains(needle), "{args}: {why}");
        ensure!(!why.contains("ghp_abcdefghijkl"), "the secret was echoed: {why}");
    }
    ensure!(!home.root().join("knowledge/inbox/k.md").exists(), "a refused note was written");
    ensure!(!outside.path().join("escape.md").exists(), "a write escaped");
    client.close().await?;

    // 7. Concurrent writes to one note from four sessions: every append lands whole and none
    // is lost; of the replaces, the last one wins whole (never a mix).
    let bodies: Vec<String> =
        (0..4).map(|i| format!("# Version {i}\n\n{}\n", format!("line {i} ").repeat(4000))).collect();
    let mut tasks = Vec::new();
    for body in bodies.clone() {
        let mut c = PyClient::through_shim(&home, &[]).await?;
        tasks.push(tokio::spawn(async move {
            let a = c
                .call(
                    "coffer__write_note",
                    json!({"kb": "inbox", "path": "race-a.md", "content": body, "mode": "append"}),
                )
                .await;
            let r = c
                .call(
                    "coffer__write_note",
                    json!({"kb": "inbox", "path": "race-r.md", "content": body, "mode": "append"}),
                )
                .await;
            let _ = c.close().await;
            (a, r)
        }));
    }
    for t in tasks {
        let (a, r) = t.await?;
        let (a, r) = (a?, r?);
        ensure!(a["result"]["isError"] != true && r["result"]["isError"] != true, "{a} {r}");
    }
    let appended = std::fs::read_to_string(home.root().join("knowledge/inbox/race-a.md"))?;
    for body in &bodies {
        ensure!(appended.matches(body.as_str()).count() == 1, "an append was lost or interleaved");
    }
    let mut tasks = Vec::new();
    for body in bodies.clone() {
        let mut c = PyClient::through_shim(&home, &[]).await?;
        tasks.push(tokio::spawn(async move {
            let r = c
                .call(
                    "coffer__write_note",
                    json!({"kb": "inbox", "path": "race-r.md", "content": body, "mode": "replace"}),
                )
                .await;
            let _ = c.close().await;
            r
        }));
    }
    for t in tasks {
        let r = t.await??;
        ensure!(r["result"]["isError"] != true, "{r}");
    }
    let replaced = std::fs::read_to_string(home.root().join("knowledge/inbox/race-r.md"))?;
    ensure!(bodies.contains(&replaced), "the note is not one whole version ({} bytes)", replaced.len());
    let left: Vec<String> = std::fs::read_dir(home.root().join("knowledge/inbox"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    ensure!(left.is_empty(), "temp files left: {left:?}");
    Ok(())
}

/// Issue 38 §4: two `kb add`s of one folder at the same moment both succeeded (the "one folder is
/// one knowledge base" check was not atomic). Now exactly one of several concurrent adds of a
/// folder, under different names, succeeds; every other one gets the refusal a later add gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_of_one_folder_make_one_knowledge_base() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let outside = tempfile::tempdir()?;
    let folder = outside.path().join("Vault");
    vault(&folder)?;
    let api = home.start_daemon().await?;
    const ADDS: usize = 6;
    let adds = (0..ADDS).map(|i| {
        let api = api.clone();
        let body = json!({"name": format!("vault{i}"), "path": folder.display().to_string()});
        async move { api.post_json("/v1/knowledge", &body).reply().await }
    });
    let replies = futures_util::future::join_all(adds).await;
    let mut created = Vec::new();
    let mut refused = Vec::new();
    for (i, r) in replies.into_iter().enumerate() {
        let r = r?;
        if r.status == 201 {
            created.push(i);
        } else {
            refused.push(r.expect_envelope(409, "CONFLICT")?["message"].as_str().unwrap_or_default().to_owned());
        }
    }
    ensure!(created.len() == 1, "{} of {ADDS} concurrent adds of one folder succeeded: {created:?}", created.len());
    let winner = format!("vault{}", created[0]);
    let root = folder.canonicalize()?.display().to_string();
    let sequential = format!(
        "knowledge base {winner:?} already indexes {root}; one folder is one knowledge base (remove {winner:?} first, or search it)"
    );
    for m in &refused {
        ensure!(m == &sequential, "a concurrent loser's refusal differs from the sequential one: {m}");
    }
    // The same refusal, afterwards; and the list holds the one KB.
    let later = api
        .post_json("/v1/knowledge", &json!({"name": "later", "path": folder.display().to_string()}))
        .reply()
        .await?
        .expect_envelope(409, "CONFLICT")?;
    ensure!(later["message"] == sequential.as_str(), "{later}");
    let list = api.get("/v1/knowledge").reply().await?.ok_json()?;
    let names: Vec<&str> = list["items"]
        .as_array()
        .context("items")?
        .iter()
        .filter_map(|k| k["name"].as_str())
        .filter(|n| n.starts_with("vault") || *n == "later")
        .collect();
    ensure!(names == [winner.as_str()], "{list}");
    Ok(())
}

/// Issue 38 §4: how a note links here, the same in `coffer__read_note`'s backlinks line and in
/// `coffer kb backlinks`: the alias the linking note used (`(as "the app")`), a link to a heading
/// (`#Coffer`) and an embed (`(embed)`), one line per distinct link (the same link twice on a
/// line is one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlinks_say_how_a_note_links_in_read_note_and_kb_backlinks() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let outside = tempfile::tempdir()?;
    let folder = outside.path().join("Vault");
    vault(&folder)?;
    write(&folder.join("Again.md"), "# Again\n\n[[Coffer]] and [[Coffer]] once more.\n")?;
    let api = home.start_daemon().await?;
    add_kb(&api, json!({"name": "vault", "path": folder.display().to_string()})).await?;
    indexed(&api, "vault", 4).await?;

    let mut client = PyClient::through_shim(&home, &[]).await?;
    let read = client.call("coffer__read_note", json!({"kb": "vault", "path": "Projects/Coffer.md"})).await?;
    ensure!(read["result"]["isError"] != true, "{read}");
    let text = texts(&read["result"]);
    let line = text.lines().find(|l| l.starts_with("backlinks: ")).with_context(|| text.clone())?;
    ensure!(line.contains("Daily/2026-12-07.md:3 (as \"the app\")"), "read_note: {line}");
    ensure!(line.contains("Daily/2026-12-07.md:5 #Coffer") && line.contains("Ideas.md:3 (embed)"), "read_note: {line}");
    ensure!(line.matches("Again.md:3").count() == 1, "read_note: {line}");
    let structured = &read["result"]["structuredContent"]["backlinks"];
    ensure!(structured.as_array().is_some_and(|b| b.iter().any(|b| b["alias"] == "the app")), "{structured}");
    client.close().await?;

    let out = home.cli(&["kb", "backlinks", "vault", "Projects/Coffer.md"]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    ensure!(
        out.stdout
            == "Again.md:3  Again\n\
                Daily/2026-12-07.md:3  Monday\n\
                Daily/2026-12-07.md:3  Monday  (as \"the app\")\n\
                Daily/2026-12-07.md:5  Monday  #Coffer\n\
                Ideas.md:3  Ideas  (embed)\n",
        "kb backlinks: {}",
        out.stdout
    );
    Ok(())
}

/// Issue 38 §4: a note whose one line is longer than 64 KiB could not be read past 64 KiB (a
/// line range cannot split a line). The answer now says where the line was cut, and
/// `start_byte` reads on in it; every answer stays bounded, and the parts make the note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_note_reads_on_in_a_line_longer_than_64_kib() -> anyhow::Result<()> {
    const KIB64: usize = 64 * 1024;
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    add_kb(&api, json!({"name": "inbox"})).await?;
    // 100 KiB on one line (multi-byte characters across the cuts), between two short lines.
    let long: String = (0..150 * 1024 / 3).map(|i| if i % 2 == 0 { "é-" } else { "x" }).collect();
    let note = format!("# Long\n{long}\nthe end\n");
    write(&home.root().join("knowledge/inbox/long.md"), &note)?;

    let mut client = PyClient::through_shim(&home, &[]).await?;
    let mut got = String::new();
    let mut cuts = 0;
    let mut args = json!({"kb": "inbox", "path": "long.md"});
    for part in 0.. {
        ensure!(part < 10, "reading on never ended: {} of {} bytes", got.len(), note.len());
        let r = client.call("coffer__read_note", args.clone()).await?;
        ensure!(r["result"]["isError"] != true, "{args}: {r}");
        let n = &r["result"]["structuredContent"];
        let text = n["text"].as_str().context("text")?;
        ensure!(text.len() <= KIB64, "part {part} is {} bytes", text.len());
        got.push_str(text);
        if n["truncated"] != true {
            break;
        }
        let line = n["end_line"].as_u64().context("end_line")?;
        let next = n["next"].as_str().unwrap_or_default();
        ensure!(texts(&r["result"]).contains(next), "the text says how to read on");
        let cut = n["cut_at_byte"].as_u64().unwrap_or(0);
        if cut == 0 {
            // Cut before the long line: read on at the next one.
            args = json!({"kb": "inbox", "path": "long.md", "start_line": line + 1});
            continue;
        }
        cuts += 1;
        ensure!(line == 2, "only the long line is cut inside: {n}");
        ensure!(next.contains(&format!("start_line=2 start_byte={cut}")), "{next}");
        args = json!({"kb": "inbox", "path": "long.md", "start_line": line, "start_byte": cut});
    }
    ensure!(cuts >= 1, "the 100 KiB line is read in 2 parts at least: {cuts} cuts");
    ensure!(got == note, "the parts are not the note: {} of {} bytes", got.len(), note.len());
    // An offset that is no place in the line is refused, naming why.
    let why = tool_error(
        &mut client,
        "coffer__read_note",
        json!({"kb": "inbox", "path": "long.md", "start_line": 1, "start_byte": 99}),
    )
    .await?;
    ensure!(why.contains("past the end of line 1"), "{why}");
    client.close().await?;
    Ok(())
}

/// Issue 38 §4: tags as a person writes them and lists them. A tag filter given as in a note
/// (`--tag '#project'`) matches like `project`; a tag with no query lists the notes with that tag
/// (CLI, REST, MCP), a page at a time; `kb list` says which knowledge bases tools may write to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_filter_with_a_hash_and_list_notes_without_a_query() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let outside = tempfile::tempdir()?;
    let folder = outside.path().join("Vault");
    vault(&folder)?;
    for i in 1..=5 {
        write(&folder.join(format!("Journal/day{i}.md")), format!("# Day {i}\n\nWrote things down. #journal\n"))?;
    }
    let api = home.start_daemon().await?;
    add_kb(&api, json!({"name": "vault", "path": folder.display().to_string()})).await?;
    add_kb(&api, json!({"name": "inbox"})).await?;
    indexed(&api, "vault", 8).await?;

    // 5. `#project` is the tag `project`, in a search.
    let out = home.cli(&["kb", "search", "vault", "--tag", "#project"]).await?;
    ensure!(out.code == Some(0) && out.stdout.contains("vault:Projects/Coffer.md:"), "{out:?}");

    // 6. No query: the notes with the tag, by KB then path, a page at a time.
    let out = home.cli(&["kb", "search", "--tag", "#project"]).await?;
    if out.code != Some(0) {
        let g = home.cli(&["logs", "gateway", "-n", "30"]).await?;
        let r = home.cli(&["logs", "retrieval", "-n", "30"]).await?;
        anyhow::bail!("{out:?}\n{}\n{}", g.stdout, r.stdout);
    }
    ensure!(out.stdout.starts_with("vault:Projects/Coffer.md:"), "{}", out.stdout);
    ensure!(!out.stdout.contains("More:"), "{}", out.stdout);
    let mut listed = Vec::new();
    let mut args: Vec<String> = ["kb", "search", "--tag", "journal", "--limit", "2"].map(String::from).to_vec();
    for page in 0.. {
        ensure!(page < 5, "the pages never ended: {listed:?}");
        let out = home.cli(&args.iter().map(String::as_str).collect::<Vec<_>>()).await?;
        ensure!(out.code == Some(0), "{out:?}");
        let paths: Vec<String> = out
            .stdout
            .lines()
            .filter(|l| l.starts_with("vault:"))
            .map(|l| l.split(':').nth(1).unwrap_or("").to_owned())
            .collect();
        ensure!(!paths.is_empty() && paths.len() <= 2, "a page of at most 2: {}", out.stdout);
        listed.extend(paths);
        let Some(more) = out.stdout.lines().find_map(|l| l.strip_prefix("More: coffer ")) else { break };
        let cursor = more.rsplit_once("--cursor ").context("cursor")?.1.trim_matches('\'').to_owned();
        args = ["kb", "search", "--tag", "journal", "--limit", "2", "--cursor"].map(String::from).to_vec();
        args.push(cursor);
    }
    let want: Vec<String> = std::iter::once("Daily/2026-12-07.md".to_owned())
        .chain((1..=5).map(|i| format!("Journal/day{i}.md")))
        .collect();
    ensure!(listed == want, "{listed:?}");
    // REST: the same listing, `next_cursor` for the next page.
    let first =
        api.post_json("/v1/knowledge/search", &json!({"tags": ["journal"], "limit": 4})).reply().await?.ok_json()?;
    let cursor = first["next_cursor"].as_str().context("next_cursor")?.to_owned();
    let rest = api
        .post_json("/v1/knowledge/search", &json!({"tags": ["#journal"], "limit": 4, "cursor": cursor}))
        .reply()
        .await?
        .ok_json()?;
    let paths = |v: &Value| -> Vec<String> {
        v["results"].as_array().into_iter().flatten().filter_map(|r| r["path"].as_str().map(str::to_owned)).collect()
    };
    ensure!([paths(&first), paths(&rest)].concat() == want && rest.get("next_cursor").is_none(), "{first} {rest}");
    // Neither a query nor a tag is still refused, by name.
    api.post_json("/v1/knowledge/search", &json!({"query": " "}))
        .reply()
        .await?
        .expect_envelope(400, "INVALID_ARGUMENT")?;
    // MCP: tags alone.
    let mut client = PyClient::through_shim(&home, &[]).await?;
    let r = client.call("coffer__search_knowledge", json!({"tags": "#project"})).await?;
    ensure!(r["result"]["isError"] != true, "{r}");
    ensure!(texts(&r["result"]).starts_with("1 note tagged #project:\n\nvault:Projects/Coffer.md:"), "{r}");
    client.close().await?;

    // 7. WRITABLE in `kb list`, `writable` in its JSON.
    let out = home.cli(&["kb", "list"]).await?;
    ensure!(out.code == Some(0) && out.stdout.lines().next().is_some_and(|h| h.contains("WRITABLE")), "{out:?}");
    let cell = |name: &str| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .map(|l| l.split_whitespace().nth(2).unwrap_or("").to_owned())
    };
    ensure!(cell("inbox").as_deref() == Some("yes") && cell("vault").as_deref() == Some("no"), "{}", out.stdout);
    let out = home.cli(&["kb", "list", "--json"]).await?;
    let v: Value = serde_json::from_str(&out.stdout).with_context(|| out.stdout.clone())?;
    let writable = |name: &str| {
        v["items"].as_array().into_iter().flatten().find(|k| k["name"] == name).map(|k| k["writable"].clone())
    };
    ensure!(writable("inbox") == Some(json!(true)) && writable("vault") == Some(json!(false)), "{v}");
    Ok(())
}
