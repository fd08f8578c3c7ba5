//! The chat service (`coffer-chat`): conversations, turns, agent adapters and the event bus.
//! For now it serves only the standard gRPC health check; the chat issue fills it in.

/// Process entry for `coffer-chat`.
pub fn main_entry() -> std::process::ExitCode {
    use coffer_runtime::{identity::Identity, service};
    service::service_main(Identity::Chat, service::run_health_only)
}
