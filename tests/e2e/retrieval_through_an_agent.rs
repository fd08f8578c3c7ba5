//! Retrieval through a real agent, as one new user's afternoon on the real daemon: they point Coffer at
//! a folder of their notes (some in Chinese) with the CLI, a real coding agent (headless Claude
//! Code through Coffer's shim, on a fake model API) searches them and remembers a fact — the
//! fact is a markdown file on disk —, they edit a note in their editor and the edit is found
//! seconds later, they delete the index and `coffer kb reindex --clean` gives identical answers,
//! and the agent's MCP session (the Python SDK through the shim) lists and loads a skill.
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use coffer_tests::anthropic::{CALL_ID, FakeAnthropic};
use coffer_tests::peers::{ClaudeCode, PyClient, texts};
use coffer_tests::write_file as write;
use coffer_tests::{TestHome, wait_for};
use serde_json::{Value, json};

/// How long indexing a small folder may take on a loaded machine.
const INDEXED: Duration = Duration::from_secs(60);
/// The bound for an external edit to become searchable.
const FRESH: Duration = Duration::from_secs(2);

/// Saves `text` the way editors do: a temporary file beside it, renamed over the original.
fn save_like_an_editor(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("md~");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The user's notes: an ordinary folder outside `COFFER_HOME`, with a `.gitignore`.
fn notes(dir: &Path) -> anyhow::Result<()> {
    write(
        &dir.join("projects/gateway.md"),
        "---\ntitle: Gateway design\ntags: [coffer, design]\n---\n# Gateway\n\nEvery upstream is started lazily, per session.\n\n## Naming\n\nTools are exposed as server__tool.\n",
    )?;
    write(
        &dir.join("日记/周末.md"),
        "# 周末计划\n\n周六去图书馆借一本关于机器学习的书。\n\n## 购物\n\n买咖啡豆和牛奶。\n",
    )?;
    write(&dir.join("recipes/bread.md"), "# Sourdough\n\nFeed the starter twelve hours before baking.\n")?;
    write(&dir.join("drafts/secret-plan.md"), "# Hidden\n\nThis draft is git-ignored.\n")?;
    write(&dir.join(".gitignore"), "drafts/\n")?;
    Ok(())
}

async fn cli_json(home: &TestHome, args: &[&str]) -> anyhow::Result<Value> {
    let out = home.cli(args).await?;
    ensure!(out.code == Some(0), "coffer {args:?}: {out:?}");
    serde_json::from_str(&out.stdout).with_context(|| format!("coffer {args:?} printed {}", out.stdout))
}

/// `coffer kb search … --json`'s results, reduced to what a user compares: where, and what.
async fn answers(home: &TestHome, query: &str) -> anyhow::Result<Vec<Value>> {
    let v = cli_json(home, &["kb", "search", query, "--kb", "notes", "--json"]).await?;
    let results = v["results"].as_array().with_context(|| format!("{v}"))?;
    Ok(results
        .iter()
        .map(|r| {
            json!([r["path"], r["heading_path"], r["line_start"], r["line_end"], r["snippet"], r["score"], r["ranks"]])
        })
        .collect())
}

/// One headless Claude Code run whose model calls `tool` (a Coffer built-in) with `input`;
/// returns the tool result the model was given. The first run adds Coffer to Claude Code's
/// user configuration (`claude mcp add`), as `coffer connect claude-code` would.
async fn claude_calls(home: &TestHome, tool: &str, input: Value) -> anyhow::Result<String> {
    static ADDED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let exposed = format!("mcp__coffer__coffer__{tool}");
    let model = FakeAnthropic::start_calling(&exposed, input).await?;
    let claude = ClaudeCode::new(home, &model.url)?;
    if !ADDED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        claude.add_coffer(home).await?;
    }
    let args =
        ["-p", "Use my Coffer vault.", "--allowedTools", &exposed, "--output-format", "stream-json", "--verbose"];
    let out = claude.run(home, &args, Duration::from_secs(120)).await?;
    ensure!(out.code == Some(0), "{out}\n{}", home.diagnostics());
    let turns = model.turns();
    let result = turns.iter().flat_map(|t| t.tool_results()).find(|(id, _)| id == CALL_ID);
    Ok(result.with_context(|| format!("the model never got the result of {exposed}: {out}"))?.1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_user_s_notes_memory_and_skills_through_a_real_agent() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let outside = tempfile::tempdir()?;
    let folder = outside.path().join("My Notes");
    notes(&folder)?;
    write(
        &home.root().join("skills/weekly-review/SKILL.md"),
        "---\nname: weekly-review\ndescription: Review the week's notes and list open tasks.\n---\n# Weekly review\n\n1. Search the notes of the last seven days.\n2. List every open task.\n",
    )?;
    home.start_daemon().await?;

    // 1. Point Coffer at the folder; it is indexed in the background.
    let folder_arg = folder.to_str().context("utf-8 path")?;
    let added = home.cli(&["kb", "add", "notes", "--path", folder_arg]).await?;
    ensure!(added.code == Some(0), "{added:?}");
    let status = wait_for("the notes indexed", INDEXED, || async {
        let v = cli_json(&home, &["kb", "status", "notes", "--json"]).await?;
        Ok((v["progress"]["state"] == "idle" && v["documents"] == 3).then_some(v))
    })
    .await?;
    ensure!(status["chunks"].as_u64().unwrap_or(0) >= 5, "{status}");

    // 2. The agent searches them — a two-character Chinese word inside a longer run.
    let found = claude_calls(&home, "search_knowledge", json!({"query": "咖啡"})).await?;
    ensure!(found.contains("日记/周末.md") && found.contains("购物"), "{found}");
    ensure!(!found.contains("secret-plan"), "a git-ignored note was searched: {found}");
    let found = claude_calls(&home, "search_knowledge", json!({"query": "how are upstreams started?"})).await?;
    ensure!(found.contains("projects/gateway.md"), "{found}");

    // 3. … and remembers a fact: a markdown file under COFFER_HOME/memory, readable as is.
    let fact = "The user's sourdough starter is called Clint.";
    let said = claude_calls(&home, "remember", json!({"text": fact, "tags": ["kitchen"]})).await?;
    let memory = home.root().join("memory");
    let files: Vec<_> = std::fs::read_dir(&memory)?.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    ensure!(files.len() == 1, "{files:?} ({said})");
    let on_disk = std::fs::read_to_string(&files[0])?;
    ensure!(on_disk.starts_with("---\n") && on_disk.contains(fact) && on_disk.contains("kitchen"), "{on_disk}");
    let id = files[0].file_stem().and_then(|s| s.to_str()).context("fact id")?.to_owned();
    ensure!(said.contains(&id), "the agent was told the fact's id: {said}");
    ensure!(
        on_disk.contains("source: mcp:claude-code") || on_disk.contains("source: \"mcp:claude-code\""),
        "{on_disk}"
    );

    // 4. The user edits a note in their editor; the edit is searchable within seconds.
    let before = answers(&home, "rye flour").await?;
    ensure!(before.is_empty(), "{before:?}");
    let edited = Instant::now();
    save_like_an_editor(
        &folder.join("recipes/bread.md"),
        "# Sourdough\n\nFeed the starter twelve hours before baking.\n\n## Variation\n\nUse one third rye flour.\n",
    )?;
    let hit = wait_for("the edit searchable", Duration::from_secs(30), || async {
        let a = answers(&home, "rye flour").await?;
        Ok((!a.is_empty()).then_some(a))
    })
    .await?;
    let took = edited.elapsed();
    ensure!(took <= FRESH, "the edit took {took:?} to be found (bound {FRESH:?})");
    ensure!(hit[0][0] == "recipes/bread.md" && hit[0][1] == json!(["Sourdough", "Variation"]), "{hit:?}");

    // 5. Delete the index and rebuild it from the files: the same answers, byte for byte.
    let queries = ["咖啡", "机器学习", "how are upstreams started?", "starter baking", "server__tool", "rye"];
    let mut first = Vec::new();
    for q in queries {
        first.push(answers(&home, q).await?);
    }
    ensure!(first.iter().all(|a| !a.is_empty()), "{first:?}");
    let rebuilt = cli_json(&home, &["kb", "reindex", "notes", "--clean", "--json"]).await?;
    let kb = rebuilt["items"].as_array().and_then(|a| a.first()).cloned().unwrap_or(rebuilt.clone());
    ensure!(kb["documents"] == 3, "{rebuilt}");
    for (q, want) in queries.iter().zip(&first) {
        assert_eq!(&answers(&home, q).await?, want, "{q} after a clean reindex");
    }

    // A note the user then hides with .gitignore is gone from every engine after a reindex.
    write(&folder.join(".gitignore"), "drafts/\nrecipes/\n")?;
    let out = home.cli(&["kb", "reindex", "notes"]).await?;
    ensure!(out.code == Some(0), "{out:?}");
    let hidden = answers(&home, "rye flour").await?;
    ensure!(hidden.is_empty(), "a git-ignored note is still searchable: {hidden:?}");

    // 6. The agent's session lists and loads the skill; recall finds the fact.
    let mut client = PyClient::through_shim(&home, &[]).await?;
    let listed = client.call_text("coffer__list_skills", json!({})).await?;
    ensure!(listed.contains("weekly-review") && listed.contains("list open tasks"), "{listed}");
    let loaded = client.call("coffer__load_skill", json!({"name": "weekly-review"})).await?;
    let result = &loaded["result"];
    ensure!(texts(result).contains("2. List every open task."), "{loaded}");
    ensure!(!texts(result).contains("description:"), "front matter is not the body: {loaded}");
    let recalled = client.call_text("coffer__recall", json!({"query": "what is the starter called"})).await?;
    ensure!(recalled.contains("Clint") && recalled.contains(&id), "{recalled}");
    client.close().await?;

    // Coffer never wrote to the user's folder.
    let mut names: Vec<String> = walk(&folder);
    names.sort();
    assert_eq!(
        names,
        [".gitignore", "drafts/secret-plan.md", "projects/gateway.md", "recipes/bread.md", "日记/周末.md"]
    );
    Ok(())
}

fn walk(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(rel) = p.strip_prefix(root) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out
}
