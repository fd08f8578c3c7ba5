//! `coffer-gateway`: thin entry over the library.
//!
//! The allocator is chosen for the MCP request path (see docs/BENCHMARKS.md): mimalloc instead
//! of the system allocator (every call allocates and frees request and response buffers). The
//! runtime (one thread for every task) is the gateway's row in the supervisor's service table.
use coffer_runtime::identity::Identity;
use coffer_runtime::service::service_main;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    service_main(Identity::Gateway, coffer_gateway::run)
}
