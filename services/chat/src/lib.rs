//! The chat service (`coffer-chat`): conversations, turns, agent adapters and the event bus.
//! For now it serves only the standard gRPC health check; the chat issue fills it in.

/// Process entry for `coffer-chat`.
pub fn main_entry() -> std::process::ExitCode {
    coffer_runtime::service::service_main("chat", |_home, shutdown| coffer_runtime::service::run_health_only(shutdown))
}
