//! End-to-end tests: Coffer's real binaries on a temporary `COFFER_HOME` (one test binary, one
//! module per area). Run with `cargo build --workspace --bins && cargo test -p coffer-tests`.

mod backup;
mod broker;
mod claude_code;
mod cli;
mod cli_connect;
mod cli_credentials;
mod cli_doctor;
mod cli_findings;
mod cli_import;
mod cli_polish;
mod credentials;
mod daemon;
mod docs;
mod edge;
mod edge_socket;
mod environment;
mod gateway;
mod http_upstream;
mod internal_auth;
mod knowledge;
mod mcp_stream;
mod openapi;
mod peers;
mod recovery;
mod rest;
mod retention;
mod retrieval_fixes;
mod retrieval_newcomer;
mod retrieval_service;
mod shim_recovery;
mod shim_stdio;
mod store;
mod upstream_health;
