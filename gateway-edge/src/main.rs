//! `coffer-gateway`: thin entry over the library.
fn main() -> std::process::ExitCode {
    coffer_runtime::service::service_main("gateway", coffer_gateway::run)
}
