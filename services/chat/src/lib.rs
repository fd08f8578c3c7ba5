//! The chat service (`coffer-chat`): conversations, turns, agent adapters and the event bus.
//! The contracts are `proto/chat.proto` (served to the gateway), `proto/store_conversations.proto`
//! (what it persists through the store) and [`adapter`] (what every agent provider implements).
//!
//! Who does what, file by file: [`service`] (the gRPC surface and its validation) →
//! [`engine`] (per-conversation turns, pending queue, interrupt, timeout) → [`bus`] (sequence
//! numbers, the recent-event log, fan-out to subscribers) and [`persist`] (the store's
//! Conversations and Audit services); [`providers`] is the agent registry, [`config`] the
//! `chat.*` and `llm.*` settings, [`authz`] who may call, [`watch`] the conversation list's live
//! feed; [`llm`] serves `coffer.llm.v1.Llm` (connection probes, the internal agent);
//! [`attachments`] checks and saves the files sent with a message.
use std::sync::Arc;

use anyhow::Context;
use coffer_proto::chat::chat_server::ChatServer;
use coffer_proto::llm::llm_server::LlmServer;
use coffer_proto::store::GetSettingsRequest;
use coffer_proto::store::changes_client::ChangesClient;
use coffer_proto::store::settings_client::SettingsClient;
use coffer_runtime::identity::Identity;
use coffer_runtime::service::ServiceCtx;

pub mod adapter;
pub mod agent_process;
pub mod agent_version;
pub mod agents_config;
pub mod attachments;
pub mod authz;
pub mod binding;
pub mod bus;
pub mod changes;
pub mod channels;
pub mod claude_code;
pub mod codex;
pub mod config;
pub mod connections;
pub mod engine;
pub mod error;
pub mod import;
pub mod kept;
pub mod llm;
pub mod persist;
pub mod projects;
pub mod providers;
pub mod service;
pub mod sessions;
pub mod watch;

/// Largest request the service decodes: above the edge's REST body limits (2 MiB; a message's
/// attachments up to [`attachments::MAX_TOTAL_BYTES`] plus its text), so an over-long text or
/// too many attached bytes get this service's message naming the limit, not tonic's.
pub const MAX_REQUEST_BYTES: usize = attachments::MAX_TOTAL_BYTES as usize + (4 << 20);

/// Process entry for `coffer-chat` (the agents Coffer ships).
pub fn main_entry() -> std::process::ExitCode {
    main_with(providers::builtin())
}

/// Process entry over another registry (the tests' `coffer-test-chat` adds a scripted agent).
pub fn main_with(registry: Vec<providers::Entry>) -> std::process::ExitCode {
    main_tuned(registry, engine::Tuning::default())
}

/// Process entry over another registry and engine tuning (`coffer-test-chat` installs a pause
/// hook: [`engine::Step`]).
pub fn main_tuned(registry: Vec<providers::Entry>, tuning: engine::Tuning) -> std::process::ExitCode {
    coffer_runtime::service::service_main(Identity::Chat, move |ctx| run_tuned(ctx, registry, tuning))
}

/// Serves `coffer.chat.v1.Chat` and `coffer.llm.v1.Llm` (and health) on the service's listener until `shutdown`, each
/// call authorized by [`authz::POLICY`]: follows the settings, runs the restart rules
/// ([`engine::Engine::recover`], retried until the store answers), then serves.
///
/// # Errors
/// When the store's address is missing or the server fails.
pub async fn run(ctx: ServiceCtx, registry: Vec<providers::Entry>) -> anyhow::Result<()> {
    run_tuned(ctx, registry, engine::Tuning::default()).await
}

/// [`run`] with an engine [`engine::Tuning`].
///
/// # Errors
/// As [`run`].
pub async fn run_tuned(ctx: ServiceCtx, registry: Vec<providers::Entry>, tuning: engine::Tuning) -> anyhow::Result<()> {
    let ServiceCtx { home, listener, internal, shutdown, .. } = ctx;
    let channel = internal.channel(Identity::Store).context("the store's address")?;
    // The settings in force before the first turn (the store is healthy before chat starts; if
    // it does not answer, the defaults hold until the follower's first read).
    let first = match SettingsClient::new(channel.clone()).get_settings(GetSettingsRequest {}).await {
        Ok(map) => config::Config::from_values(&map.into_inner().values),
        Err(_) => config::Config::default(),
    };
    let (config_tx, config_rx) = tokio::sync::watch::channel(Arc::new(first));
    tokio::spawn(config::follow(
        SettingsClient::new(channel.clone()),
        ChangesClient::new(channel.clone()),
        config_tx,
        shutdown.clone(),
    ));
    let connections = connections::Connections::new(channel.clone());
    let broker = coffer_proto::gateway::tool_broker_client::ToolBrokerClient::new(
        internal.channel(Identity::Gateway).context("the gateway's address")?,
    );
    let llm_service = llm::service::LlmService::new(connections.clone(), broker, config_rx.clone());
    let store_channel = channel.clone();
    let store = persist::Store::new(channel);
    let registry =
        Arc::new(providers::Registry::new(registry, home.root().to_path_buf()).with_connections(connections));
    let engine = engine::Engine::with_tuning(store, registry, config_rx, home.root().to_path_buf(), tuning);

    let mut backoff =
        coffer_runtime::Backoff::new(std::time::Duration::from_millis(100), std::time::Duration::from_secs(5));
    loop {
        match engine.recover().await {
            Ok(()) => break,
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_ms = delay.as_millis() as u64, "Cannot recover chat state yet.");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }

    // The channel adapters: the coordinator alone starts and stops them (the supervisor, when
    // its address is known, runs coffer-callback for SeaTalk).
    let control =
        internal.channel(Identity::Supervisor).ok().map(coffer_proto::control::control_client::ControlClient::new);
    let coordinator = channels::coordinator::Coordinator::new(engine.clone(), store_channel, control);
    let adapters = channels::coordinator::AdaptersService { shared: coordinator.shared() };
    let coordinating = tokio::spawn(coordinator.run(shutdown.clone()));

    let service = service::ChatService { engine };
    let routes = tonic::service::Routes::new(ChatServer::new(service).max_decoding_message_size(MAX_REQUEST_BYTES))
        .add_service(
            coffer_proto::channel::channel_adapters_server::ChannelAdaptersServer::new(adapters)
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .add_service(
            LlmServer::new(llm_service)
                .max_decoding_message_size(MAX_REQUEST_BYTES)
                .max_encoding_message_size(llm::broker::MAX_REPLY),
        );
    coffer_runtime::grpc::serve_with_health(listener, internal.auth_layer(authz::POLICY), routes, shutdown.clone())
        .await?;
    shutdown.cancel();
    // The adapters stop (their turns' output with them) before the process ends.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(15), coordinating).await;
    Ok(())
}

#[cfg(test)]
mod approval_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_redirect;
