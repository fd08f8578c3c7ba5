//! `coffer-retrieval` end to end: a real daemon, its `coffer.retrieval.v1.Retrieval` service
//! called over gRPC with the gateway's own token (read from its environment in `/proc`, as the
//! gateway's built-in tools and REST call it): knowledge bases of real folders (some notes in
//! Chinese) searched by each engine, external edits, deletes and renames followed by the
//! watcher, a clean reindex giving identical results, memory (remember, duplicates, 20
//! concurrent remembers, recall, forget), skills with a malformed one, bad input (binary,
//! invalid UTF-8 and oversized files, a symlink loop, paths that escape, hostile queries), a
//! KB folder deleted while watched, and kill -9 of coffer-retrieval during a full reindex.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use coffer_proto::retrieval::retrieval_client::RetrievalClient;
use coffer_proto::retrieval::{
    AddKnowledgeBaseRequest, EngineState, FactId, JobState, KnowledgeBaseInfo, KnowledgeBaseName, ListFactsRequest,
    ListSkillsRequest, RecallRequest, ReindexRequest, RememberRequest, SearchFilters, SearchReply, SearchRequest,
    SkillName, StatusRequest,
};
use coffer_runtime::grpc::AuthChannel;
use coffer_tests::embeddings::{FakeEmbeddings, Mode};
use coffer_tests::write_file as write;
use coffer_tests::{Api, SendExt, TestHome, procs, wait_for};
use nix::sys::signal::Signal;
use secrecy::SecretString;
use serde_json::json;

/// How long indexing of a small folder may take.
pub(crate) const INDEXED: Duration = Duration::from_secs(30);
/// The freshness promise: an external edit is searchable within this.
pub(crate) const FRESH: Duration = Duration::from_secs(2);

pub(crate) type Client = RetrievalClient<AuthChannel>;

/// A Retrieval client presenting the gateway's token, as the gateway would.
pub(crate) async fn client(api: &Api) -> anyhow::Result<Client> {
    let pid = api.service("gateway").await?["pid"].as_i64().context("gateway pid")? as i32;
    let env = procs::environ(pid);
    ensure!(!env.is_empty(), "cannot read the gateway's environment (pid {pid})");
    let token = SecretString::from(env.get("COFFER_INTERNAL_TOKEN").context("COFFER_INTERNAL_TOKEN")?.clone());
    let addr = env.get("COFFER_RETRIEVAL_ADDR").context("COFFER_RETRIEVAL_ADDR")?;
    Ok(RetrievalClient::new(coffer_runtime::grpc::channel(addr, &token)?))
}

/// Waits until KB `name` finished a pass numbered at least `job` with `documents` documents
/// (any count when `None`).
pub(crate) async fn indexed(
    c: &Client,
    name: &str,
    job: u64,
    documents: Option<u64>,
) -> anyhow::Result<KnowledgeBaseInfo> {
    wait_for(&format!("knowledge base {name} indexed (pass {job}, {documents:?} documents)"), INDEXED, || {
        let mut c = c.clone();
        async move {
            let info = c.get_knowledge_base(KnowledgeBaseName { name: name.into() }).await?.into_inner();
            let p = info.progress.clone().unwrap_or_default();
            let done =
                p.state == JobState::Idle as i32 && p.job >= job && documents.is_none_or(|d| info.documents == d);
            Ok(done.then_some(info))
        }
    })
    .await
}

pub(crate) fn search(query: &str, kb: &[&str], engines: &[&str]) -> SearchRequest {
    SearchRequest {
        query: query.into(),
        filters: Some(SearchFilters { kb: kb.iter().map(|s| (*s).to_owned()).collect(), ..Default::default() }),
        engines: engines.iter().map(|s| (*s).to_owned()).collect(),
        limit: 20,
        snippet_chars: 0,
        regex: false,
        cursor: String::new(),
    }
}

pub(crate) fn paths(r: &SearchReply) -> BTreeSet<String> {
    r.results.iter().map(|x| x.path.clone()).collect()
}

pub(crate) fn engine<'a>(r: &'a SearchReply, name: &str) -> &'a coffer_proto::retrieval::EngineReport {
    r.engines.iter().find(|e| e.engine == name).expect("every engine is reported")
}

/// Waits until `query` on `engines` finds exactly the documents `want` (within `within`).
pub(crate) async fn finds(
    c: &Client,
    within: Duration,
    query: &str,
    engines: &[&str],
    want: &[&str],
) -> anyhow::Result<SearchReply> {
    let want: BTreeSet<String> = want.iter().map(|s| (*s).to_owned()).collect();
    let started = Instant::now();
    let r = wait_for(&format!("{query:?} on {engines:?} to find {want:?}"), within, || {
        let (mut c, want) = (c.clone(), want.clone());
        async move {
            let r = c.search(search(query, &["notes"], engines)).await?.into_inner();
            Ok((paths(&r) == want).then_some(r))
        }
    })
    .await?;
    eprintln!("{query:?} on {engines:?}: {:?} after {} ms", want, started.elapsed().as_millis());
    Ok(r)
}

/// Adds the folder `dir` as the knowledge base `notes`.
async fn add_notes(c: &mut Client, dir: &Path) -> anyhow::Result<()> {
    c.add_knowledge_base(AddKnowledgeBaseRequest {
        name: "notes".into(),
        path: dir.display().to_string(),
        ..Default::default()
    })
    .await?;
    Ok(())
}

fn notes(dir: &Path) -> anyhow::Result<()> {
    write(
        &dir.join("tokenizer.md"),
        "---\ntitle: Tokenizer notes\ntags: [search, cjk]\n---\n# Tokenizer\n\nThe keyword index splits Chinese runs into overlapping bigrams.\n\n## Stemming\n\nEnglish words are stemmed: running finds run.\n",
    )?;
    write(&dir.join("zh/数据库.md"), "# 数据库\n\n我们使用内存数据库来加速查询。\n\n## 备份\n\n每天晚上备份一次。\n")?;
    write(&dir.join("ops/errors.md"), "# Error codes\n\nERR-4711 means the disk is full.\n\nSee the runbook.\n")?;
    write(&dir.join("binary.md"), b"PK\x03\x04\x00\x00binary\x00")?;
    write(&dir.join("latin1.md"), b"caf\xe9 au lait\n")?;
    write(&dir.join("not-markdown.txt"), "ERR-4711 in a text file that no glob includes\n")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn knowledge_base_is_searched_by_each_engine_and_follows_edits() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    notes(&dir)?;
    let api = home.start_daemon().await?;
    let mut c = client(&api).await?;
    let added = c
        .add_knowledge_base(AddKnowledgeBaseRequest {
            name: "notes".into(),
            path: dir.display().to_string(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!((added.kind.as_str(), added.root.as_str()), ("folder", dir.canonicalize()?.to_str().unwrap()));
    let info = indexed(&c, "notes", 1, Some(5)).await?;
    assert!(info.watching, "{info:?}");
    assert!(info.chunks >= 5, "{info:?}");
    let errors: Vec<(&str, &str)> = info.errors.iter().map(|e| (e.path.as_str(), e.error.as_str())).collect();
    assert!(errors.contains(&("binary.md", "binary")), "{errors:?}");
    assert!(errors.iter().any(|(p, e)| *p == "latin1.md" && e.starts_with("not UTF-8")), "{errors:?}");

    // Each engine on its own.
    let r = finds(&c, FRESH, "overlapping bigrams", &["keyword"], &["tokenizer.md"]).await?;
    let hit = &r.results[0];
    assert_eq!((hit.kb.as_str(), hit.title.as_str()), ("notes", "Tokenizer notes"));
    assert_eq!(hit.heading_path, ["Tokenizer"]);
    assert!(hit.snippet.contains("**"), "highlighted: {}", hit.snippet);
    assert_eq!(hit.tags, ["cjk", "search"], "sorted by the store");
    assert!(hit.absolute_path.ends_with("notes/tokenizer.md"), "{}", hit.absolute_path);
    assert_eq!(engine(&r, "grep").state, EngineState::Disabled as i32, "not asked");
    assert_eq!(engine(&r, "vector").state, EngineState::Disabled as i32);
    finds(&c, FRESH, "stemmed running", &["keyword"], &["tokenizer.md"]).await?;
    // A two-character Chinese word, by the keyword index and by grep.
    finds(&c, FRESH, "数据", &["keyword"], &["zh/数据库.md"]).await?;
    finds(&c, FRESH, "备份", &["grep"], &["zh/数据库.md"]).await?;
    // A one-character word (`晚`, inside 每天晚上): the keyword index holds character pairs, so a
    // search that names no engine runs grep for it, and finds it.
    let r = finds(&c, FRESH, "晚", &[], &["zh/数据库.md"]).await?;
    assert_eq!(engine(&r, "grep").state, EngineState::Ok as i32, "{r:?}");
    let r = finds(&c, FRESH, "ERR-4711", &["grep"], &["ops/errors.md"]).await?;
    assert_eq!((r.results[0].line_start, r.results[0].ranks[0].engine.as_str()), (1, "grep"));
    // Fused: both engines rank it; the reply says how.
    let r = c.search(search("ERR-4711 disk full", &[], &[])).await?.into_inner();
    assert_eq!(paths(&r), BTreeSet::from(["ops/errors.md".to_owned()]), "{r:?}");
    assert_eq!(r.fusion, "scores per document, weights grep 1 keyword 3 vector 2");
    assert_eq!(r.results[0].ranks.len(), 2, "grep and keyword: {:?}", r.results[0].ranks);
    assert_eq!(engine(&r, "keyword").state, EngineState::Ok as i32);
    assert!(engine(&r, "keyword").hits >= 1);

    // An external edit is searchable within 2 s; a delete and a rename disappear as fast.
    let edited = dir.join("ops/errors.md");
    let mut text = std::fs::read_to_string(&edited)?;
    text.push_str("\nZEBRA-CROSSING is the new code.\n");
    std::fs::write(&edited, text)?;
    finds(&c, FRESH, "zebra crossing", &["keyword"], &["ops/errors.md"]).await?;
    std::fs::rename(dir.join("tokenizer.md"), dir.join("renamed.md"))?;
    finds(&c, FRESH, "overlapping bigrams", &["keyword"], &["renamed.md"]).await?;
    // Lines inserted above an unchanged section: its chunk is kept, with its new line range.
    let moved = dir.join("renamed.md");
    let text = std::fs::read_to_string(&moved)?.replace("bigrams.\n", "bigrams.\n\nA new paragraph\nof two lines.\n");
    std::fs::write(&moved, &text)?;
    let line = text.lines().position(|l| l.starts_with("English words are stemmed")).context("line")? as u32 + 1;
    finds(&c, FRESH, "new paragraph", &["keyword"], &["renamed.md"]).await?;
    for engines in [&["keyword"][..], &["grep"][..]] {
        let r = c.search(search("English words stemmed", &[], engines)).await?.into_inner();
        let hit = r.results.first().with_context(|| format!("{engines:?}: {r:?}"))?;
        assert!((hit.line_start..=hit.line_end).contains(&line), "{engines:?}: line {line} not in {hit:?}");
    }
    std::fs::remove_file(&edited)?;
    finds(&c, FRESH, "zebra crossing", &["keyword"], &[]).await?;
    finds(&c, FRESH, "ERR-4711", &["grep", "keyword"], &[]).await?;
    std::fs::create_dir_all(dir.join("moved"))?;
    std::fs::rename(dir.join("zh"), dir.join("moved/zh"))?;
    finds(&c, FRESH, "数据", &["keyword"], &["moved/zh/数据库.md"]).await?;
    // A .gitignore written after its notes were indexed: they leave the index (and the grep
    // engine's walk), and come back when the line goes.
    write(&dir.join("private/diary.md"), "# Diary\n\nthe kiwibird secret\n")?;
    finds(&c, FRESH, "kiwibird", &["keyword", "grep"], &["private/diary.md"]).await?;
    write(&dir.join(".gitignore"), "private/\n")?;
    finds(&c, FRESH, "kiwibird", &["keyword", "grep"], &[]).await?;
    write(&dir.join(".gitignore"), "# nothing ignored\n")?;
    finds(&c, FRESH, "kiwibird", &["keyword", "grep"], &["private/diary.md"]).await?;
    std::fs::remove_dir_all(dir.join("private"))?;
    std::fs::remove_file(dir.join(".gitignore"))?;
    finds(&c, FRESH, "kiwibird", &["keyword", "grep"], &[]).await?;

    // Deleting the index and rebuilding gives identical answers.
    let queries = ["overlapping bigrams", "数据库 备份", "stemmed", "runbook"];
    let mut before = Vec::new();
    for q in queries {
        before.push(c.search(search(q, &[], &["keyword", "grep"])).await?.into_inner().results);
    }
    let job = indexed(&c, "notes", 1, None).await?.progress.unwrap_or_default().job;
    let counts = c.get_knowledge_base(KnowledgeBaseName { name: "notes".into() }).await?.into_inner();
    c.reindex(ReindexRequest { kb: "notes".into(), clean: true }).await?;
    let after_info = indexed(&c, "notes", job + 1, Some(counts.documents)).await?;
    assert_eq!((after_info.documents, after_info.chunks), (counts.documents, counts.chunks));
    for (q, b) in queries.iter().zip(&before) {
        let a = c.search(search(q, &[], &["keyword", "grep"])).await?.into_inner().results;
        let key = |rs: &[coffer_proto::retrieval::SearchResult]| {
            rs.iter()
                .map(|r| (r.path.clone(), r.line_start, r.line_end, r.snippet.clone(), r.score.to_bits()))
                .collect::<Vec<_>>()
        };
        assert_eq!(key(&a), key(b), "{q:?} differs after a clean reindex");
    }

    // Status lists every KB (memory too) and every engine.
    let st = c.status(StatusRequest {}).await?.into_inner();
    let names: Vec<&str> = st.knowledge_bases.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["memory", "notes"]);
    let engines: Vec<(&str, bool)> = st.engines.iter().map(|e| (e.name.as_str(), e.enabled)).collect();
    assert_eq!(engines, [("grep", true), ("keyword", true), ("vector", false)]);
    assert!(st.engines[2].detail.contains("downloads are off"), "no model, no downloads in tests: {:?}", st.engines[2]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_files_links_paths_and_queries_get_clear_answers() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    write(&dir.join("ok.md"), "# Fine\n\nquokka lives here\n")?;
    write(&dir.join("badfm.md"), "---\ntags: [unclosed\n---\n# Odd\n\nnumbat lives here\n")?;
    write(&home.temp().join("outside/secret.md"), "# Outside\n\nplatypus must never be indexed\n")?;
    std::fs::create_dir_all(dir.join("loop"))?;
    std::os::unix::fs::symlink(&dir, dir.join("loop/back"))?;
    std::os::unix::fs::symlink(home.temp().join("outside/secret.md"), dir.join("escape.md"))?;
    std::os::unix::fs::symlink(home.temp().join("outside"), dir.join("escape-dir"))?;
    let api = home.start_daemon().await?;
    let mut c = client(&api).await?;
    add_notes(&mut c, &dir).await?;
    indexed(&c, "notes", 1, None).await?;
    finds(&c, FRESH, "quokka", &["keyword"], &["ok.md"]).await?;
    // A malformed front matter is reported, and the note is still searchable.
    finds(&c, FRESH, "numbat", &["keyword"], &["badfm.md"]).await?;
    let info = c.get_knowledge_base(KnowledgeBaseName { name: "notes".into() }).await?.into_inner();
    let e = info.errors.iter().find(|e| e.path == "badfm.md").with_context(|| format!("{info:?}"))?;
    assert!(e.error.starts_with("front matter ignored"), "{e:?}");
    let r = c.search(search("unclosed", &[], &["keyword"])).await?.into_inner();
    assert!(r.results.is_empty(), "front matter is not prose: {r:?}");
    let r = c.search(search("platypus", &[], &[])).await?.into_inner();
    assert!(r.results.is_empty(), "a link out of the folder is not part of it: {r:?}");

    // A 50 MB markdown file is refused by its size (never read), naming the 16 MiB limit.
    let huge = std::fs::File::create(dir.join("huge.md"))?;
    huge.set_len(50 * 1024 * 1024)?;
    drop(huge);
    c.reindex(ReindexRequest { kb: "notes".into(), clean: false }).await?;
    let error = wait_for("huge.md refused by size", INDEXED, || {
        let mut c = c.clone();
        async move {
            let info = c.get_knowledge_base(KnowledgeBaseName { name: "notes".into() }).await?.into_inner();
            Ok(info.errors.iter().find(|e| e.path == "huge.md").map(|e| e.error.clone()))
        }
    })
    .await?;
    assert_eq!(error, "larger than the 16 MiB limit (retrieval.max_file_bytes)");
    std::fs::remove_file(dir.join("huge.md"))?;

    // An oversized file once the limit is lowered; the message names the limit.
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"retrieval.max_file_bytes": "2048"}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    let big = format!("# Big\n\n{}\n", "walrus ".repeat(600));
    // The setting reaches retrieval through the change stream; rewrite until the file is refused.
    let errors = wait_for("big.md refused by size", Duration::from_secs(10), || {
        let (mut c, big, dir) = (c.clone(), big.clone(), dir.clone());
        async move {
            write(&dir.join("big.md"), &big)?;
            c.reindex(ReindexRequest { kb: "notes".into(), clean: false }).await?;
            let info = c.get_knowledge_base(KnowledgeBaseName { name: "notes".into() }).await?.into_inner();
            Ok(info.errors.iter().find(|e| e.path == "big.md").map(|e| e.error.clone()))
        }
    })
    .await?;
    assert_eq!(errors, "larger than the 2048-byte limit (retrieval.max_file_bytes)");

    // Paths that escape or point into COFFER_HOME are refused, naming the path.
    for (path, want) in [
        (home.root().join("logs").display().to_string(), "inside COFFER_HOME"),
        ("relative/notes".to_owned(), "must be absolute"),
        (home.temp().join("absent").display().to_string(), "does not exist"),
        (format!("{}/../home/logs", dir.display()), "inside COFFER_HOME"),
    ] {
        let e = c
            .add_knowledge_base(AddKnowledgeBaseRequest {
                name: "bad".into(),
                path: path.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{path}: {e:?}");
        assert!(e.message().contains(want), "{path}: {}", e.message());
    }
    for (name, code) in [
        ("../x", tonic::Code::InvalidArgument),
        ("memory", tonic::Code::InvalidArgument),
        ("notes", tonic::Code::AlreadyExists),
    ] {
        let e = c
            .add_knowledge_base(AddKnowledgeBaseRequest { name: name.into(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), code, "{name}: {e:?}");
    }
    let e = c.remove_knowledge_base(KnowledgeBaseName { name: "memory".into() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);

    // Queries: empty and over-long are refused by name; punctuation and FTS5 syntax are not.
    let e = c.search(search("   ", &[], &[])).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "query is empty"));
    let e = c.search(search(&"x".repeat(100 * 1024), &[], &[])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("at most 8192"), "{}", e.message());
    // (Both engines named: a search that names none runs grep only for literal-looking text.)
    for q in ["\"", "*", "NEAR(", "AND OR NOT", "^", "-", "quokka\" OR \"x"] {
        let r = c.search(search(q, &[], &["grep", "keyword"])).await.with_context(|| format!("{q:?}"))?.into_inner();
        assert_eq!(engine(&r, "keyword").state, EngineState::Ok as i32, "{q:?}: {r:?}");
        assert_eq!(engine(&r, "grep").state, EngineState::Ok as i32, "{q:?}: {r:?}");
    }
    let r = c.search(search("quokka\" OR \"x", &[], &["keyword"])).await?.into_inner();
    assert_eq!(paths(&r), BTreeSet::from(["ok.md".to_owned()]), "user quotes are words, not syntax");
    let e = c.search(search("x", &["nope"], &[])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    Ok(())
}

/// A file within a raised `retrieval.max_file_bytes` whose index entry is over the store's limit
/// for one document (64 MiB): that file's error, naming both limits, and the rest of the folder
/// is indexed (it used to fail the whole pass, and every pass after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_too_large_for_the_store_is_its_own_error_not_the_pass() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    write(&dir.join("small.md"), "# Small\n\nthe ocelot sleeps\n")?;
    // ~36 MiB of prose: its chunks' text and index text are over 64 MiB.
    let line = "wombats burrow under the eucalyptus while numbats forage for termites nearby\n";
    let body = line.repeat((36 << 20) / line.len());
    write(&dir.join("huge.md"), format!("# Huge\n\n{body}"))?;
    drop(body);
    let api = home.start_daemon().await?;
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"retrieval.max_file_bytes": (48u64 << 20).to_string()}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    let mut c = client(&api).await?;
    add_notes(&mut c, &dir).await?;
    // The setting reaches retrieval through the change stream: reindex until huge.md is judged
    // by the store's limit rather than by the 16 MiB default.
    let error = wait_for("huge.md refused by the store's limit", Duration::from_secs(240), || {
        let mut c = c.clone();
        async move {
            let info = c.get_knowledge_base(KnowledgeBaseName { name: "notes".into() }).await?.into_inner();
            let e = info.errors.iter().find(|e| e.path == "huge.md").map(|e| e.error.clone());
            let idle = info.progress.as_ref().is_some_and(|p| p.state == JobState::Idle as i32);
            if e.as_deref().is_some_and(|e| e.starts_with("larger than")) && idle {
                c.reindex(ReindexRequest { kb: "notes".into(), clean: false }).await?;
            }
            Ok(e.filter(|e| !e.starts_with("larger than")))
        }
    })
    .await?;
    ensure!(
        error.starts_with("its index entry would be") && error.contains("over the store's 64 MiB limit"),
        "{error}"
    );
    ensure!(error.contains("retrieval.max_file_bytes (48.0 MiB)"), "{error}");
    finds(&c, INDEXED, "ocelot", &["keyword"], &["small.md"]).await?;
    let info = c.get_knowledge_base(KnowledgeBaseName { name: "notes".into() }).await?.into_inner();
    let failed = info.progress.as_ref().is_some_and(|p| p.state == JobState::Failed as i32);
    ensure!(!failed, "the pass went on: {:?}", info.progress);
    home.cli(&["daemon", "stop"]).await?.ok()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_remembers_once_recalls_and_forgets() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let mut c = client(&api).await?;
    let remember = |text: &str| RememberRequest {
        text: text.into(),
        tags: vec!["ops".into()],
        source: "mcp:test".into(),
        allow_secret: false,
    };
    let r = c.remember(remember("The staging database password rotates every Monday.")).await?.into_inner();
    ensure!(r.created, "{r:?}");
    let fact = r.fact.context("fact")?;
    let file = PathBuf::from(&fact.path);
    assert_eq!(file, home.root().join("memory").join(format!("{}.md", fact.id)).canonicalize()?);
    let text = std::fs::read_to_string(&file)?;
    assert!(text.starts_with(&format!("---\nid: {}\ncreated: ", fact.id)), "{text}");
    assert!(text.contains("tags: [\"ops\"]\nsource: \"mcp:test\"\n---\nThe staging database"), "{text}");

    // Recall finds it at once; the same fact again, or nearly, is the existing one.
    let recall = |q: &str| RecallRequest { query: q.into(), ..Default::default() };
    let found = c.recall(recall("staging password")).await?.into_inner();
    assert_eq!(found.results.first().map(|r| r.fact_id.as_str()), Some(fact.id.as_str()), "{found:?}");
    let again = c.remember(remember("the staging database password rotates every monday.")).await?.into_inner();
    assert!(!again.created && again.similarity == 1.0, "{again:?}");
    assert_eq!(again.fact.map(|f| f.id), Some(fact.id.clone()));
    let near = c.remember(remember("The staging database password rotates every Monday!!")).await?.into_inner();
    assert!(!near.created && near.similarity >= 0.9, "{near:?}");

    // 20 concurrent remembers of different facts: 20 files, no temp file left.
    let animals = [
        "aardvark", "bison", "camel", "dingo", "eland", "ferret", "gibbon", "hyena", "ibex", "jackal", "koala",
        "lemur", "marmot", "narwhal", "ocelot", "panda", "quail", "raccoon", "serval", "tapir",
    ];
    let mut set = tokio::task::JoinSet::new();
    for (i, a) in animals.iter().enumerate() {
        let mut c = c.clone();
        let text = format!("Fact {i}: the {a} in enclosure {} eats at {} o'clock.", i * 7, i % 12 + 1);
        set.spawn(async move {
            c.remember(RememberRequest { text, tags: vec![], source: String::new(), allow_secret: false }).await
        });
    }
    let mut ids = BTreeSet::new();
    while let Some(r) = set.join_next().await {
        let r = r??.into_inner();
        ensure!(r.created, "{r:?}");
        ids.insert(r.fact.context("fact")?.id);
    }
    assert_eq!(ids.len(), 20);
    let files: Vec<String> = std::fs::read_dir(home.root().join("memory"))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    assert_eq!(files.iter().filter(|f| f.ends_with(".md")).count(), 21, "{files:?}");
    assert!(files.iter().all(|f| !f.starts_with('.')), "no temp file left: {files:?}");
    let listed = c.list_facts(ListFactsRequest { limit: 5, ..Default::default() }).await?.into_inner();
    assert_eq!(listed.facts.len(), 5);
    assert!(!listed.next_cursor.is_empty());
    let found = c.recall(recall("narwhal enclosure")).await?.into_inner();
    assert!(found.results.first().is_some_and(|r| r.snippet.to_lowercase().contains("narwhal")), "{found:?}");

    // Forget removes the file and the index entries; ids are validated.
    let removed = c.forget(FactId { id: fact.id.clone() }).await?.into_inner();
    assert_eq!(removed.removed, 1);
    assert!(!file.exists());
    let found = c.recall(recall("staging password")).await?.into_inner();
    assert!(found.results.iter().all(|r| r.fact_id != fact.id), "{found:?}");
    assert_eq!(c.get_fact(FactId { id: fact.id.clone() }).await.unwrap_err().code(), tonic::Code::NotFound);
    assert_eq!(c.forget(FactId { id: fact.id.clone() }).await.unwrap_err().code(), tonic::Code::NotFound);
    for bad in ["../../etc/passwd", "a/b", "..", ""] {
        let e = c.forget(FactId { id: bad.into() }).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
    }
    let e = c.remember(remember("   ")).await.unwrap_err();
    assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "text is empty"));
    let e = c.remember(remember(&"y".repeat(16 * 1024 + 1))).await.unwrap_err();
    assert!(e.message().contains("at most 16384"), "{}", e.message());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_are_listed_with_a_malformed_one_reported() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let skills = home.root().join("skills");
    write(
        &skills.join("pdf/SKILL.md"),
        "---\nname: pdf\ndescription: Fill and read PDF forms.\nlicense: MIT\n---\n# PDF\n\nUse scripts/fill.py.\n",
    )?;
    write(&skills.join("pdf/scripts/fill.py"), "print('fill')\n")?;
    write(&skills.join("broken/SKILL.md"), "---\nname: [broken\n---\n")?;
    write(&skills.join("nodesc/SKILL.md"), "---\nname: nodesc\n---\nbody\n")?;
    let api = home.start_daemon().await?;
    let mut c = client(&api).await?;
    let list = c.list_skills(ListSkillsRequest {}).await?.into_inner();
    assert_eq!(list.skills.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["pdf"]);
    assert_eq!(list.skills[0].description, "Fill and read PDF forms.");
    let invalid: Vec<&str> = list.invalid.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(invalid, ["broken", "nodesc"], "{list:?}");
    assert!(list.invalid[1].error.contains("description"), "{list:?}");
    let s = c.load_skill(SkillName { name: "pdf".into() }).await?.into_inner();
    assert_eq!(s.body, "# PDF\n\nUse scripts/fill.py.\n");
    assert_eq!(s.files, ["scripts/fill.py"]);
    assert_eq!(s.metadata.get("license").map(String::as_str), Some("MIT"));
    for (name, code) in [
        ("../pdf", tonic::Code::InvalidArgument),
        ("a/b", tonic::Code::InvalidArgument),
        ("absent", tonic::Code::NotFound),
    ] {
        assert_eq!(c.load_skill(SkillName { name: name.into() }).await.unwrap_err().code(), code, "{name}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_deleted_while_watched_fails_and_comes_back() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    write(&dir.join("a.md"), "# A\n\nwombat burrows\n")?;
    let api = home.start_daemon().await?;
    let mut c = client(&api).await?;
    add_notes(&mut c, &dir).await?;
    indexed(&c, "notes", 1, Some(1)).await?;
    std::fs::remove_dir_all(&dir)?;
    let info = wait_for("the KB to show failed", Duration::from_secs(10), || {
        let mut c = c.clone();
        async move {
            let info = c.get_knowledge_base(KnowledgeBaseName { name: "notes".into() }).await?.into_inner();
            Ok((info.progress.as_ref().is_some_and(|p| p.state == JobState::Failed as i32)).then_some(info))
        }
    })
    .await?;
    assert!(info.progress.unwrap().message.contains("is gone"));
    assert!(!info.watching);
    let r = c.search(search("wombat", &[], &["keyword"])).await?.into_inner();
    assert!(r.results.is_empty(), "{r:?}");
    assert_eq!(api.service("retrieval").await?["state"], "healthy");
    write(&dir.join("b.md"), "# B\n\nwombat returns\n")?;
    c.reindex(ReindexRequest { kb: "notes".into(), clean: false }).await?;
    let info = indexed(&c, "notes", 2, Some(1)).await?;
    assert!(info.watching);
    finds(&c, FRESH, "wombat", &["keyword"], &["b.md"]).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_a_full_reindex_converges_to_a_clean_index() -> anyhow::Result<()> {
    const NOTES: usize = 400;
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    for i in 0..NOTES {
        let body = (0..40)
            .map(|j| format!("line {j} of note {i} about topic{} and 主题{}", i % 17, j % 5))
            .collect::<Vec<_>>()
            .join("\n");
        write(
            &dir.join(format!("n{:03}/note{i}.md", i / 50)),
            format!("# Note {i}\n\nuniq{i}marker\n\n## Part\n\n{body}\n"),
        )?;
    }
    let api = home.start_daemon().await?;
    let mut c = client(&api).await?;
    add_notes(&mut c, &dir).await?;
    let clean = indexed(&c, "notes", 1, Some(NOTES as u64)).await?;
    let job = clean.progress.clone().unwrap_or_default().job;

    c.reindex(ReindexRequest { kb: "notes".into(), clean: true }).await?;
    // While it runs (well before its end), a search says its results may be incomplete.
    let warnings = wait_for("the clean pass to be indexing", Duration::from_secs(20), || {
        let mut c = c.clone();
        async move {
            let p = c
                .get_knowledge_base(KnowledgeBaseName { name: "notes".into() })
                .await?
                .into_inner()
                .progress
                .unwrap_or_default();
            if !(p.job > job && p.state == JobState::Indexing as i32 && p.done > 0 && p.done < p.total * 3 / 4) {
                return Ok(None);
            }
            Ok(Some(c.search(search("uniq0marker", &[], &["keyword"])).await?.into_inner().warnings))
        }
    })
    .await?;
    ensure!(
        warnings.iter().any(|w| w.contains("knowledge base notes is being rebuilt") && w.contains("incomplete")),
        "{warnings:?}"
    );
    let pid = api.service("retrieval").await?["pid"].as_i64().context("pid")? as i32;
    procs::signal(pid, Signal::SIGKILL);
    wait_for("retrieval restarted", Duration::from_secs(20), || async {
        let s = api.service("retrieval").await?;
        Ok((s["state"] == "healthy" && s["pid"] != pid).then_some(()))
    })
    .await?;
    // The restarted service's start-up pass finishes the job.
    let c = client(&api).await?;
    let after = indexed(&c, "notes", 1, Some(NOTES as u64)).await?;
    assert_eq!((after.documents, after.chunks), (clean.documents, clean.chunks), "no duplicate or orphan chunks");
    for i in [0, 199, NOTES - 1] {
        let r = c.clone().search(search(&format!("uniq{i}marker"), &[], &["keyword"])).await?.into_inner();
        assert_eq!(r.results.len(), 1, "note {i} once: {r:?}");
        assert!(r.warnings.is_empty(), "no rebuild runs any more: {:?}", r.warnings);
    }
    Ok(())
}

/// A tiny OpenAI-compatible `/v1/embeddings` on loopback for this file (the shared fake in
/// `coffer_tests::embeddings` supersedes it once it lands): deterministic bag-of-words vectors
/// of [`FAKE_DIM`] dimensions; its mode switches to an endpoint that is down or answers the
/// wrong dimension or garbage.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vector_engine_embeds_and_a_bad_endpoint_leaves_the_others_working() -> anyhow::Result<()> {
    const KEY: &str = "sk-fake-embeddings-7f3a";
    let fake = FakeEmbeddings::start(32, Some(KEY)).await?;
    let url = fake.url.clone();
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    write(&dir.join("zebra.md"), "# Savanna\n\nzebra stripes on the savanna grass\n")?;
    write(&dir.join("compiler.md"), "# Compilers\n\nloop unrolling and register allocation\n")?;
    let api = home.start_daemon().await?;
    let mut c = client(&api).await?;
    add_notes(&mut c, &dir).await?;
    indexed(&c, "notes", 1, Some(2)).await?;
    // The key lives in the credential store; retrieval resolves it and sends it as a bearer.
    let r = api
        .request(reqwest::Method::PUT, "/v1/credentials/embeddings-key")
        .header("X-Coffer-Actor", "cli")
        .json(&json!({"value": KEY}))
        .reply()
        .await?;
    ensure!(r.status == 200 || r.status == 201, "{} {}", r.status, r.text);
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"retrieval.embeddings.url": url, "retrieval.embeddings.credential": "embeddings-key", "retrieval.embeddings.model": "fake-bow", "retrieval.embeddings.dimensions": "32"}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    wait_for("every chunk embedded", Duration::from_secs(20), || {
        let mut c = c.clone();
        async move {
            let st = c.status(StatusRequest {}).await?.into_inner();
            let kb = st.knowledge_bases.iter().find(|k| k.name == "notes").context("notes")?;
            let vector = st.engines.iter().find(|e| e.name == "vector").context("vector")?;
            Ok((vector.enabled && kb.chunks > 0 && kb.embedded == kb.chunks).then_some(()))
        }
    })
    .await?;
    let st = c.status(StatusRequest {}).await?.into_inner();
    assert!(st.engines[2].detail.starts_with("fake-bow (32) at http://127.0.0.1:"), "{:?}", st.engines[2]);
    let r = c.search(search("zebra savanna", &[], &["vector"])).await?.into_inner();
    assert_eq!(engine(&r, "vector").state, EngineState::Ok as i32, "{r:?}");
    assert_eq!(r.results.first().map(|x| x.path.as_str()), Some("zebra.md"), "{r:?}");

    // Another model: every vector is dropped and made again with it (never mixed).
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"retrieval.embeddings.model": "fake-bow-2"}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    wait_for("every chunk embedded with the new model", Duration::from_secs(20), || {
        let mut c = c.clone();
        async move {
            let st = c.status(StatusRequest {}).await?.into_inner();
            let kb = st.knowledge_bases.iter().find(|k| k.name == "notes").context("notes")?;
            let vector = st.engines.iter().find(|e| e.name == "vector").context("vector")?;
            Ok((vector.detail.starts_with("fake-bow-2 (32)") && kb.embedded == kb.chunks).then_some(()))
        }
    })
    .await?;
    // The status can show the new model with every chunk still counted as embedded just before
    // the old vectors are dropped: wait until the vector engine answers again, then check what.
    let r = wait_for("the vector engine to answer with the new model", Duration::from_secs(20), || {
        let mut c = c.clone();
        async move {
            let r = c.search(search("zebra savanna", &[], &["vector"])).await?.into_inner();
            Ok((!r.results.is_empty()).then_some(r))
        }
    })
    .await?;
    assert_eq!(r.results.first().map(|x| x.path.as_str()), Some("zebra.md"), "{r:?}");

    // Failing, misbehaving or slow: keyword and grep still answer; the vector engine is named
    // as failed (or timed out) in its report and in the warnings.
    let timeout = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"retrieval.engine_timeout_ms": "1000"}}))
        .reply()
        .await?;
    ensure!(timeout.status == 200, "{} {}", timeout.status, timeout.text);
    for (mode, state, words) in [
        (Mode::Http500, EngineState::Failed, "answered HTTP 500"),
        (Mode::WrongDimension(16), EngineState::Failed, "dimension 16, expected 32"),
        (Mode::Garbage, EngineState::Failed, "malformed"),
        (Mode::NaN, EngineState::Failed, "non-finite value in vector 0"),
        (Mode::Overflow, EngineState::Failed, "non-finite"),
        (Mode::WrongCount, EngineState::Failed, "2 vectors for 1 inputs"),
        (Mode::Slow(5_000), EngineState::Timeout, "1000 ms"),
    ] {
        fake.set_mode(mode);
        let r = c.search(search("zebra", &[], &[])).await?.into_inner();
        assert_eq!(paths(&r), BTreeSet::from(["zebra.md".to_owned()]), "{mode:?}: {r:?}");
        let v = engine(&r, "vector");
        assert_eq!(v.state, state as i32, "{mode:?}: {r:?}");
        assert!(v.message.contains(words), "{mode:?}: {}", v.message);
        let named = if state == EngineState::Timeout { "vector engine timed out" } else { "vector engine failed" };
        assert!(r.warnings.iter().any(|w| w.starts_with(named)), "{mode:?}: {:?}", r.warnings);
        assert_eq!(engine(&r, "keyword").state, EngineState::Ok as i32);
    }
    // Down (nothing listens at the endpoint's address): the same, once the setting is read.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"retrieval.embeddings.url": format!("http://127.0.0.1:{closed}/v1")}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    let r = wait_for("the vector engine to find the endpoint down", Duration::from_secs(20), || {
        let mut c = c.clone();
        async move {
            let r = c.search(search("zebra", &[], &[])).await?.into_inner();
            Ok(engine(&r, "vector").message.contains("unreachable").then_some(r))
        }
    })
    .await?;
    assert_eq!(paths(&r), BTreeSet::from(["zebra.md".to_owned()]), "{r:?}");
    assert_eq!(engine(&r, "vector").state, EngineState::Failed as i32, "{r:?}");
    assert_eq!(engine(&r, "keyword").state, EngineState::Ok as i32);
    for service in ["retrieval", "store", "gateway"] {
        assert!(!home.log_text(service).contains(KEY), "the key is in {service}'s log");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_rewritten_while_it_is_indexed_ends_with_its_last_version() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    for i in 0..50 {
        write(&dir.join(format!("filler{i}.md")), format!("# Filler {i}\n\nfiller text {i}\n"))?;
    }
    write(&dir.join("hot.md"), "# Hot\n\nversion0token\n")?;
    let api = home.start_daemon().await?;
    let mut c = client(&api).await?;
    add_notes(&mut c, &dir).await?;
    // Rewrites race with passes (asked for between them) and with the watcher.
    for v in 1..=30 {
        write(&dir.join("hot.md"), format!("# Hot\n\nversion{v}token\n"))?;
        if v % 5 == 0 {
            c.reindex(ReindexRequest { kb: "notes".into(), clean: v == 15 }).await?;
        }
    }
    finds(&c, FRESH + INDEXED, "version30token", &["keyword"], &["hot.md"]).await?;
    indexed(&c, "notes", 1, Some(51)).await?;
    for v in [0, 1, 15, 29] {
        let r = c.search(search(&format!("version{v}token"), &[], &["keyword"])).await?.into_inner();
        assert!(r.results.is_empty(), "an older version is still indexed: {r:?}");
    }
    let r = c.search(search("version30token", &[], &["keyword"])).await?.into_inner();
    assert_eq!(r.results.len(), 1, "one chunk, no duplicate: {r:?}");
    Ok(())
}
