//! Knowledge-base folders and memory through the real daemon: `kb remove` during a reindex
//! stops the pass (nothing of the removed KB comes back), one folder is one KB, a KB folder that
//! vanishes is not searched and comes back on its own with its chunks and vectors kept, a weak
//! vector hit alone is no result, half-configured embeddings say what is missing, a KB folder
//! that holds `COFFER_HOME` never indexes Coffer's own files, memory takes hand-written notes,
//! broken front matter and secrets in its stride, and a backup restored into a fresh home gives
//! the same search results once its start-up reindex is done.
use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_proto::retrieval::{
    AddKnowledgeBaseRequest, EngineState, FactId, JobState, KnowledgeBaseName, ListFactsRequest, RecallRequest,
    ReindexRequest, RememberRequest, StatusRequest,
};
use coffer_tests::embeddings::{FakeEmbeddings, embed};
use coffer_tests::write_file as write;
use coffer_tests::{SendExt, TestHome, wait_for};
use serde_json::json;

use crate::retrieval_service::{Client, FRESH, INDEXED, client, engine, finds, indexed, paths, search};

/// `coffer_retrieval::search::MIN_VECTOR_SIMILARITY` (this crate does not link the service).
const VECTOR_FLOOR: f64 = 0.25;

/// Adds folder KB `name` at `path`.
async fn add(c: &Client, name: &str, path: &std::path::Path) -> Result<(), tonic::Status> {
    let req = AddKnowledgeBaseRequest { name: name.into(), path: path.display().to_string(), ..Default::default() };
    c.clone().add_knowledge_base(req).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kb_remove_during_a_reindex_stops_the_pass_and_one_folder_is_one_kb() -> anyhow::Result<()> {
    const NOTES: usize = 300;
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    for i in 0..NOTES {
        let body = (0..30).map(|j| format!("line {j} of note {i} about topic{}", i % 13)).collect::<Vec<_>>();
        write(
            &dir.join(format!("n{}/note{i}.md", i / 50)),
            format!("# Note {i}\n\nuniq{i}marker\n\n{}\n", body.join("\n")),
        )?;
    }
    let empty = home.temp().join("empty");
    std::fs::create_dir_all(&empty)?;
    let api = home.start_daemon().await?;
    let c = client(&api).await?;
    add(&c, "notes", &dir).await?;
    let first = indexed(&c, "notes", 1, Some(NOTES as u64)).await?;

    // The same folder again, under another name (or through a path with `..`): refused,
    // naming the KB that has it.
    for path in [dir.clone(), dir.join("n0").join("..")] {
        let e = add(&c, "again", &path).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
        assert!(e.message().contains("\"notes\" already indexes"), "{}", e.message());
    }

    // A clean reindex, removed while it runs, then a KB of the same name on an empty folder:
    // no document of the old pass may land in it.
    let job = first.progress.clone().unwrap_or_default().job;
    c.clone().reindex(ReindexRequest { kb: "notes".into(), clean: true }).await?;
    wait_for("the clean pass to be indexing", Duration::from_secs(20), || {
        let mut c = c.clone();
        async move {
            let p = c
                .get_knowledge_base(KnowledgeBaseName { name: "notes".into() })
                .await?
                .into_inner()
                .progress
                .unwrap_or_default();
            Ok((p.job > job && p.state == JobState::Indexing as i32 && p.done > 0 && p.done < p.total).then_some(()))
        }
    })
    .await?;
    c.clone().remove_knowledge_base(KnowledgeBaseName { name: "notes".into() }).await?;
    add(&c, "notes", &empty).await?;
    let info = indexed(&c, "notes", 1, None).await?;
    assert_eq!((info.documents, info.chunks), (0, 0), "the removed KB's pass wrote into its successor: {info:?}");
    // Still nothing once everything has settled: a second pass of the empty folder, and the
    // old notes are not found anywhere.
    c.clone().reindex(ReindexRequest { kb: "notes".into(), clean: false }).await?;
    let info = indexed(&c, "notes", 2, Some(0)).await?;
    assert_eq!(info.chunks, 0, "{info:?}");
    let r = c.clone().search(search("uniq7marker", &[], &["keyword"])).await?.into_inner();
    assert!(r.results.is_empty(), "{r:?}");
    // The old folder is free again: it can be added under a new name.
    add(&c, "again", &dir).await?;
    indexed(&c, "again", 1, Some(NOTES as u64)).await?;
    assert_eq!(api.service("retrieval").await?["state"], "healthy");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_folder_comes_back_by_itself_with_its_vectors_and_weak_vector_hits_are_dropped() -> anyhow::Result<()>
{
    const DIM: usize = 256;
    let fake = FakeEmbeddings::start(DIM, None).await?;
    let home = TestHome::new()?;
    let dir = home.temp().join("notes");
    write(&dir.join("wombat.md"), "# Wombats\n\nwombat burrows under the eucalyptus\n")?;
    write(&dir.join("compiler.md"), "# Compilers\n\nloop unrolling and register allocation\n")?;
    let api = home.start_daemon().await?;
    let c = client(&api).await?;
    add(&c, "notes", &dir).await?;
    indexed(&c, "notes", 1, Some(2)).await?;

    // Half a configuration (a URL, no model): the vector engine stays off and says why.
    let patch = |set: serde_json::Value| {
        let api = api.clone();
        async move {
            let r = api.request(reqwest::Method::PATCH, "/v1/settings").json(&json!({"set": set})).reply().await?;
            ensure!(r.status == 200, "{} {}", r.status, r.text);
            anyhow::Ok(())
        }
    };
    patch(json!({"retrieval.embeddings.url": fake.url.clone()})).await?;
    let vector = wait_for("the vector engine to report the missing model", Duration::from_secs(20), || {
        let mut c = c.clone();
        async move {
            let st = c.status(StatusRequest {}).await?.into_inner();
            let v = st.engines.into_iter().find(|e| e.name == "vector").context("vector")?;
            Ok(v.detail.contains("retrieval.embeddings.model is not set").then_some(v))
        }
    })
    .await?;
    assert!(!vector.enabled && vector.detail.contains("set both"), "{vector:?}");
    let r = c.clone().search(search("wombat", &["notes"], &["vector", "keyword"])).await?.into_inner();
    let v = engine(&r, "vector");
    assert_eq!(v.state, EngineState::Disabled as i32, "{r:?}");
    assert!(v.message.contains("retrieval.embeddings.model is not set"), "{r:?}");
    assert_eq!(fake.requests(), 0, "half a configuration embedded something");

    // The whole configuration: every chunk embedded.
    patch(json!({"retrieval.embeddings.model": "fake-bow", "retrieval.embeddings.dimensions": DIM.to_string()}))
        .await?;
    let embedded = wait_for("every chunk embedded", Duration::from_secs(20), || {
        let mut c = c.clone();
        async move {
            let st = c.status(StatusRequest {}).await?.into_inner();
            let kb = st.knowledge_bases.into_iter().find(|k| k.name == "notes").context("notes")?;
            Ok((kb.chunks > 0 && kb.embedded == kb.chunks).then_some(kb.embedded))
        }
    })
    .await?;

    // A query far from every chunk (its fake embedding's cosine with each embedded text is
    // below the floor) gets no vector-only result; a near one does.
    let far = "quartz xylophone";
    let cos = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum::<f64>();
    let q = embed(far, DIM);
    let best = fake.texts().iter().map(|t| cos(&q, &embed(t, DIM))).fold(f64::MIN, f64::max);
    ensure!(best < VECTOR_FLOOR, "pick a farther query: {best}");
    let r = c.clone().search(search(far, &["notes"], &["vector"])).await?.into_inner();
    assert_eq!(engine(&r, "vector").state, EngineState::Ok as i32, "{r:?}");
    assert!(r.results.is_empty(), "nearest is not near: {r:?}");
    let r = c.clone().search(search("wombat burrows", &["notes"], &["vector"])).await?.into_inner();
    assert_eq!(r.results.first().map(|x| x.path.as_str()), Some("wombat.md"), "{r:?}");

    // The folder moves away: failed with why, kept, not searched.
    let embeds_before = fake.texts().len();
    let aside = home.temp().join("notes-aside");
    std::fs::rename(&dir, &aside)?;
    let info = wait_for("the KB to show failed", Duration::from_secs(10), || {
        let mut c = c.clone();
        async move {
            let info = c.get_knowledge_base(KnowledgeBaseName { name: "notes".into() }).await?.into_inner();
            Ok(info.progress.as_ref().is_some_and(|p| p.state == JobState::Failed as i32).then_some(info))
        }
    })
    .await?;
    let message = info.progress.clone().unwrap_or_default().message;
    assert!(
        message.contains("is gone") && message.contains("indexed again as soon as the folder is back"),
        "{message}"
    );
    assert_eq!(info.documents, 2, "the index is kept while the folder is away");
    let r = c.clone().search(search("wombat", &["notes"], &["keyword"])).await?.into_inner();
    assert!(r.results.is_empty(), "{r:?}");
    assert!(
        r.warnings.iter().any(|w| w.contains("knowledge base notes not searched") && w.contains("is gone")),
        "{r:?}"
    );

    // It comes back unchanged: indexed again without a reindex, nothing embedded again.
    std::fs::rename(&aside, &dir)?;
    let started = std::time::Instant::now();
    finds(&c, Duration::from_secs(10), "wombat", &["keyword"], &["wombat.md"]).await?;
    eprintln!("found again {} ms after the folder came back", started.elapsed().as_millis());
    let info = indexed(&c, "notes", 1, Some(2)).await?;
    assert!(info.watching, "{info:?}");
    assert_eq!(info.embedded, embedded, "{info:?}");
    assert_eq!(fake.texts().len(), embeds_before, "vectors of unchanged chunks were made again");

    // Deleted and re-created with other notes: back on its own too, with the new content.
    std::fs::remove_dir_all(&dir)?;
    wait_for("the KB to show failed again", Duration::from_secs(10), || {
        let mut c = c.clone();
        async move {
            let info = c.get_knowledge_base(KnowledgeBaseName { name: "notes".into() }).await?.into_inner();
            Ok(info.progress.as_ref().is_some_and(|p| p.state == JobState::Failed as i32).then_some(()))
        }
    })
    .await?;
    write(&dir.join("platypus.md"), "# Platypus\n\nplatypus lays eggs\n")?;
    finds(&c, Duration::from_secs(10), "platypus", &["keyword"], &["platypus.md"]).await?;
    finds(&c, FRESH, "wombat", &["keyword"], &[]).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kb_folder_holding_coffer_home_never_indexes_coffers_own_files() -> anyhow::Result<()> {
    // The user adds the folder their COFFER_HOME lives in (as with a whole home directory).
    let home = TestHome::builder().home_at("vault/coffer-home").build()?;
    let vault = home.temp().join("vault");
    write(&vault.join("notes/garden.md"), "# Garden\n\ntomatoes need staking\n")?;
    write(&home.root().join("skills/pdf/SKILL.md"), "---\nname: pdf\ndescription: PDFs.\n---\ntomatoes in a skill\n")?;
    let api = home.start_daemon().await?;
    let mut c = client(&api).await?;
    let fact = c
        .remember(RememberRequest {
            text: "tomatoes ripen in August".into(),
            tags: vec![],
            source: String::new(),
            allow_secret: false,
        })
        .await?
        .into_inner();
    ensure!(fact.created, "{fact:?}");
    add(&c, "vault", &vault).await?;
    let info = indexed(&c, "vault", 1, Some(1)).await?;
    assert!(info.errors.is_empty(), "{info:?}");
    let r = c.search(search("tomatoes", &["vault"], &["keyword", "grep"])).await?.into_inner();
    assert_eq!(paths(&r), BTreeSet::from(["notes/garden.md".to_owned()]), "{r:?}");
    // A note written now is found; a new fact (a file under COFFER_HOME) is not in the vault.
    write(&vault.join("notes/beans.md"), "# Beans\n\ntomatoes and beans\n")?;
    c.remember(RememberRequest {
        text: "tomatoes dislike frost".into(),
        tags: vec![],
        source: String::new(),
        allow_secret: false,
    })
    .await?;
    let want = BTreeSet::from(["notes/beans.md".to_owned(), "notes/garden.md".to_owned()]);
    wait_for("the new note found, Coffer's files not", FRESH * 3, || {
        let (mut c, want) = (c.clone(), want.clone());
        async move {
            let r = c.search(search("tomatoes", &["vault"], &["keyword", "grep"])).await?.into_inner();
            let got = paths(&r);
            ensure!(got.iter().all(|p| !p.starts_with("coffer-home")), "Coffer's own files indexed: {got:?}");
            Ok((got == want).then_some(()))
        }
    })
    .await?;
    assert_eq!(indexed(&c, "vault", 1, None).await?.documents, 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_takes_hand_written_notes_broken_front_matter_and_secrets_in_its_stride() -> anyhow::Result<()> {
    let home = TestHome::new()?;
    let api = home.start_daemon().await?;
    let mut c = client(&api).await?;
    let memory = home.root().join("memory");
    let remember = |text: &str| RememberRequest {
        text: text.into(),
        tags: vec!["ops".into()],
        source: "cli".into(),
        allow_secret: false,
    };

    // A secret is refused, saying why without repeating it; nothing is written.
    for secret in [
        "the deploy token is ghp_16C7e42F292c6912E7710c838347Ae178B4a",
        "router password: Tr0ub4dor&3x",
        "Authorization: Bearer abc123def456ghi789jkl",
    ] {
        let e = c.remember(remember(secret)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{secret}: {e:?}");
        assert!(e.message().contains("looks like it holds a secret") && e.message().contains("credential"), "{e:?}");
        assert!(
            !e.message().contains("ghp_16C7")
                && !e.message().contains("Tr0ub4dor")
                && !e.message().contains("abc123def")
        );
    }
    let files = || std::fs::read_dir(&memory).map(|d| d.count()).unwrap_or(0);
    assert_eq!(files(), 0, "a refused fact left a file");

    // A fact whose front matter the user broke: shown with a warning, never a 500.
    let fact = c.remember(remember("the staging host is db-stage-2")).await?.into_inner().fact.context("fact")?;
    assert_eq!(fact.id, fact.id.to_uppercase());
    std::fs::write(&fact.path, format!("---\nid: {}\ntags: [ops\n---\nthe staging host is db-stage-3\n", fact.id))?;
    let got = c.get_fact(FactId { id: fact.id.clone() }).await?.into_inner();
    assert_eq!(got.text, "the staging host is db-stage-3");
    assert!(got.warning.contains("invalid YAML front matter"), "{got:?}");
    let rest = api.get(&format!("/v1/memory/{}", fact.id)).reply().await?;
    assert_eq!(rest.status, 200, "{}", rest.text);
    assert!(rest.ok_json()?["warning"].as_str().is_some_and(|w| w.contains("front matter")), "{}", rest.text);
    let shown = home.cli(&["memory", "show", &fact.id.to_lowercase()]).await?.ok()?;
    assert!(shown.stdout.contains("db-stage-3") && shown.stderr.contains("warning: invalid YAML"), "{shown}");

    // A note the user drops into memory/: listed, recalled, shown and forgotten by its name.
    write(&memory.join("parking.md"), "# Parking\n\nthe car is on level 3, bay 42\n")?;
    let found = wait_for("the note recalled", FRESH * 3, || {
        let mut c = c.clone();
        async move {
            let r = c.recall(RecallRequest { query: "car level bay".into(), ..Default::default() }).await?.into_inner();
            Ok(r.results.into_iter().find(|x| x.fact_id == "parking"))
        }
    })
    .await?;
    assert_eq!(found.path, "parking.md");
    let listed = c.list_facts(ListFactsRequest::default()).await?.into_inner();
    assert!(listed.facts.iter().any(|f| f.id == "parking"), "{listed:?}");
    let out = home.cli(&["memory", "list"]).await?.ok()?;
    assert!(out.stdout.contains("parking"), "{out}");
    let note = c.get_fact(FactId { id: "parking".into() }).await?.into_inner();
    assert!(note.text.contains("bay 42") && note.warning.is_empty(), "{note:?}");
    let out = home.cli(&["memory", "forget", "parking"]).await?.ok()?;
    assert!(out.stdout.contains("Forgot fact parking"), "{out}");
    assert!(!memory.join("parking.md").exists());
    let r = c.recall(RecallRequest { query: "car level bay".into(), ..Default::default() }).await?.into_inner();
    assert!(r.results.iter().all(|x| x.fact_id != "parking"), "{r:?}");
    for bad in ["../parking", ".hidden", "a/b"] {
        assert_eq!(c.forget(FactId { id: bad.into() }).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    }

    // `memory list --tag` with no match says so.
    let out = home.cli(&["memory", "list", "--tag", "nothing-has-this"]).await?.ok()?;
    assert!(out.stdout.contains("No facts tagged \"nothing-has-this\""), "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_searches_like_the_original_after_its_reindex() -> anyhow::Result<()> {
    let a = TestHome::new()?;
    let outside = a.temp().join("vault");
    write(&outside.join("日记/周末.md"), "# 周末计划\n\n周六去图书馆借一本关于机器学习的书。\n")?;
    write(&outside.join("recipes/bread.md"), "# Sourdough\n\nFeed the starter twelve hours before baking.\n")?;
    let api = a.start_daemon().await?;
    let mut c = client(&api).await?;
    // A KB in COFFER_HOME/knowledge/, one outside, and a fact.
    c.add_knowledge_base(AddKnowledgeBaseRequest { name: "inbox".into(), ..Default::default() }).await?;
    write(&a.root().join("knowledge/inbox/todo.md"), "# Todo\n\nbake the sourdough on Saturday\n")?;
    add(&c, "vault", &outside).await?;
    c.remember(RememberRequest {
        text: "sourdough starter lives in the fridge".into(),
        tags: vec![],
        source: "cli".into(),
        allow_secret: false,
    })
    .await?;
    indexed(&c, "vault", 1, Some(2)).await?;
    wait_for("the inbox note indexed", INDEXED, || {
        let mut c = c.clone();
        async move {
            let i = c.get_knowledge_base(KnowledgeBaseName { name: "inbox".into() }).await?.into_inner();
            Ok((i.documents == 1).then_some(()))
        }
    })
    .await?;
    let queries =
        [("sourdough", vec!["inbox", "vault"]), ("图书馆", vec!["vault"]), ("starter fridge", vec!["memory"])];
    let mut before = Vec::new();
    for (q, kbs) in &queries {
        let r = c.search(search(q, kbs, &["keyword", "grep"])).await?.into_inner();
        let got: Vec<(String, String)> = r.results.iter().map(|x| (x.kb.clone(), x.path.clone())).collect();
        ensure!(!got.is_empty(), "{q}: {r:?}");
        before.push(got);
    }
    let backup = a.temp().join("backup");
    a.cli(&["backup", &backup.display().to_string()]).await?.ok()?;
    a.terminate_daemon(Duration::from_secs(20)).await?;

    // A fresh home: restore, start; the start-up pass reindexes, and the answers are the same.
    let b = TestHome::new()?;
    b.cli(&["restore", "--force", &backup.display().to_string()]).await?.ok()?;
    let api = b.start_daemon().await?;
    let c = client(&api).await?;
    indexed(&c, "vault", 1, Some(2)).await?;
    let inbox = indexed(&c, "inbox", 1, Some(1)).await?;
    assert!(
        std::path::Path::new(&inbox.root).starts_with(b.root().canonicalize()?),
        "the knowledge/ KB follows the home it was restored into: {inbox:?}"
    );
    for ((q, kbs), want) in queries.iter().zip(&before) {
        let r = c.clone().search(search(q, kbs, &["keyword", "grep"])).await?.into_inner();
        let got: Vec<(String, String)> = r.results.iter().map(|x| (x.kb.clone(), x.path.clone())).collect();
        assert_eq!(&got, want, "{q}: {r:?}");
        for x in r.results.iter().filter(|x| x.kb != "vault") {
            assert!(x.absolute_path.starts_with(&b.root().canonicalize()?.display().to_string()), "{x:?}");
        }
    }
    Ok(())
}
