//! `coffer-gateway`: thin entry over the library.
//!
//! Allocator and runtime are chosen for the MCP request path (see docs/BENCHMARKS.md): mimalloc
//! instead of the system allocator (every call allocates and frees request and response
//! buffers), and one thread for every task, so a call's hops between the HTTP connection, the
//! session and the upstream's pipes never hand a task to another thread.
use coffer_runtime::service::{Flavor, service_main_on};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    service_main_on("gateway", Flavor::CurrentThread, coffer_gateway::run)
}
