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

    // Hand-written Debug for the messages that carry credential values (their generated one is
    // skipped in build.rs): names only, never a value.
    impl std::fmt::Debug for SetCredentialRequest {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("SetCredentialRequest")
                .field("name", &self.name)
                .field("value", &"[REDACTED]")
                .field("actor", &self.actor)
                .finish()
        }
    }

    impl std::fmt::Debug for ResolveCredentialsReply {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let mut names: Vec<&String> = self.values.keys().collect();
            names.sort();
            f.debug_struct("ResolveCredentialsReply").field("names", &names).finish_non_exhaustive()
        }
    }
}

/// Metadata key carrying the per-run internal token on every internal gRPC call.
pub use coffer_types::header::INTERNAL_TOKEN as INTERNAL_TOKEN_HEADER;
/// Metadata key carrying the trace id of the request that caused an internal call.
pub use coffer_types::header::TRACE as TRACE_HEADER;
