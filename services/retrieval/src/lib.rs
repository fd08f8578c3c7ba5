//! The retrieval service (`coffer-retrieval`): knowledge bases (folders of markdown), memory
//! (one fact per file) and skills, searched by three engines (grep over the files, keyword over
//! the store's FTS5 index, vector over its sqlite-vec index) and fused. Markdown files are the
//! truth; the indexes in `coffer.db` are derived, written through the store's Index service.
//!
//! Who does what, file by file: [`service`] (the gRPC surface and its validation) →
//! [`sources`] (KB definitions), [`indexer`] + [`watch`] (files → index), [`search`] +
//! [`fusion`] (engines → results), [`memory`], [`skills`], [`embedding_worker`] (the background vector
//! worker), [`config`] (the `retrieval.*` settings); the engine libraries below them.
use std::sync::Arc;

use anyhow::Context;
use coffer_proto::retrieval::retrieval_server::RetrievalServer;
use coffer_proto::store::changes_client::ChangesClient;
use coffer_proto::store::credentials_client::CredentialsClient;
use coffer_proto::store::index_client::IndexClient;
use coffer_proto::store::settings_client::SettingsClient;
use coffer_proto::store::vault_state_client::VaultStateClient;
use coffer_proto::sync::sync_server::SyncServer;
use coffer_runtime::identity::Identity;
use coffer_runtime::service::ServiceCtx;

pub mod authz;
pub mod config;
pub mod embedding_worker;
pub mod error;
pub mod fusion;
pub mod indexer;
pub mod memory;
pub mod notes;
pub mod search;
pub mod service;
pub mod skills;
pub mod sources;
pub mod sync;
pub mod watch;

/// Largest request the service decodes: above the edge's 2 MiB REST body limit, so an
/// over-long field gets this service's message naming the field and its limit, not tonic's.
pub const MAX_REQUEST_BYTES: usize = 4 << 20;

/// Largest message exchanged with the store (a whole document's chunks in one upsert).
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// Process entry for `coffer-retrieval`.
pub fn main_entry() -> std::process::ExitCode {
    coffer_runtime::service::service_main(Identity::Retrieval, run)
}

/// Serves `coffer.retrieval.v1.Retrieval` (and health) on the service's listener until
/// `shutdown`, each call authorized by [`authz::POLICY`]. Beside it: the settings follower, the
/// start-up load of KB definitions (retried until the store answers) followed by a reconcile
/// pass of every KB, and the embedding worker.
///
/// # Errors
/// When the store's address is missing or the server fails.
pub async fn run(ctx: ServiceCtx) -> anyhow::Result<()> {
    let ServiceCtx { home, listener, internal, shutdown, .. } = ctx;
    let channel = internal.channel(Identity::Store).context("the store's address")?;
    let index = IndexClient::new(channel.clone())
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let (config_tx, config_rx) = tokio::sync::watch::channel(Arc::new(config::Config::default()));
    tokio::spawn(config::follow(
        SettingsClient::new(channel.clone()),
        ChangesClient::new(channel.clone()),
        config_tx,
        shutdown.clone(),
    ));

    let sources = Arc::new(sources::Sources::new(home.clone(), index.clone()));
    let indexer = indexer::Indexer::new(sources.clone(), config_rx.clone(), shutdown.clone());
    let embeddings = embedding_worker::Embeddings::new(indexer.embed_wake.clone());
    let memory = Arc::new(memory::Memory::new(sources.clone(), indexer.clone()));
    let searcher = Arc::new(search::Searcher::new(sources.clone(), embeddings.clone(), config_rx.clone()));

    // Start-up: KB definitions from the store (it may still be starting), then a pass each.
    {
        let (sources, indexer, shutdown) = (sources.clone(), indexer.clone(), shutdown.clone());
        tokio::spawn(async move {
            let mut backoff =
                coffer_runtime::Backoff::new(std::time::Duration::from_millis(100), std::time::Duration::from_secs(5));
            let mut failing = coffer_runtime::logging::FailureLog::new(std::time::Duration::from_secs(600));
            loop {
                match sources.load().await {
                    Ok(()) => break,
                    Err(e) => {
                        let state = failing.failed(&e.to_string());
                        let delay = backoff.next_delay();
                        if state != coffer_runtime::logging::Failing::Quiet {
                            tracing::warn!(error = %e, failures = failing.failures(), retry_ms = delay.as_millis() as u64, "Cannot load knowledge bases yet.");
                        }
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = tokio::time::sleep(delay) => {}
                        }
                    }
                }
            }
            let swept = memory::sweep_temp_files(&sources.memory_root());
            if swept > 0 {
                tracing::info!(swept, "Removed temp files an interrupted remember left.");
            }
            for kb in sources.all() {
                indexer.start_kb(&kb.name);
            }
            tracing::info!(kbs = sources.all().len(), "Knowledge bases loaded; reconcile passes started.");
        });
    }
    let engine = sync::Engine::new(
        home.root().to_path_buf(),
        VaultStateClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES),
        sources.clone(),
        indexer.clone(),
        config_rx.clone(),
    );
    let (head_tx, head_rx) = tokio::sync::watch::channel(0u64);
    tokio::spawn(sync::follow_head(ChangesClient::new(channel.clone()), head_tx, shutdown.clone()));
    tokio::spawn(engine.clone().worker(head_rx, shutdown.clone()));
    tokio::spawn(embeddings.clone().run(
        config_rx,
        index,
        CredentialsClient::new(channel),
        home.root().join("models"),
        shutdown.clone(),
    ));

    let notes = Arc::new(notes::Notes::new(sources.clone(), indexer.clone()));
    let service = service::RetrievalService { sources, indexer, memory, searcher, embeddings, notes };
    let routes =
        tonic::service::Routes::new(RetrievalServer::new(service).max_decoding_message_size(MAX_REQUEST_BYTES))
            .add_service(SyncServer::new(sync::service::SyncService { engine }));
    coffer_runtime::grpc::serve_with_health(listener, internal.auth_layer(authz::POLICY), routes, shutdown.clone())
        .await?;
    shutdown.cancel();
    Ok(())
}

pub mod embeddings_client;
pub mod grep;
pub mod markdown;
pub mod snippet;
pub mod terms;
pub mod walk;
