//! The chat service (`coffer-chat`): conversations, turns, agent adapters and the event bus.
//! The contracts are `proto/chat.proto` (served to the gateway), `proto/store_conversations.proto`
//! (what it persists through the store) and [`adapter`] (what every agent provider implements).

pub mod adapter;
pub mod agent_process;
pub mod agents_config;
pub mod claude_code;
pub mod codex;
pub mod kept;

/// Process entry for `coffer-chat`.
pub fn main_entry() -> std::process::ExitCode {
    use coffer_runtime::{identity::Identity, service};
    service::service_main(Identity::Chat, service::run_health_only)
}
