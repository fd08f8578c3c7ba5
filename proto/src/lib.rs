//! Generated types and tonic clients/servers for Coffer's internal gRPC contracts.
//!
//! Every internal contract lives in `proto/*.proto`; this is the only place code is generated.
#![allow(clippy::all, missing_docs)]

/// `coffer.control.v1`: the supervisor's control RPC (status, stop, restart a service).
pub mod control {
    tonic::include_proto!("coffer.control.v1");
}

/// `coffer.store.v1`: typed access to `coffer.db` through the store service.
pub mod store {
    tonic::include_proto!("coffer.store.v1");
}

/// Metadata key carrying the per-run internal token on every internal gRPC call.
pub const INTERNAL_TOKEN_HEADER: &str = "x-coffer-internal-token";
/// Metadata key carrying the trace id of the request that caused an internal call.
pub const TRACE_HEADER: &str = "x-coffer-trace";
