//! The retrieval service (`coffer-retrieval`): knowledge, memory and skills search with fusion.
//! For now it serves only the standard gRPC health check; the retrieval issue fills it in.

/// Process entry for `coffer-retrieval`.
pub fn main_entry() -> std::process::ExitCode {
    use coffer_runtime::{identity::Identity, service};
    service::service_main(Identity::Retrieval, service::run_health_only)
}

pub mod terms;
pub mod walk;
