//! Pieces of `coffer-bench`'s retrieval benchmark that need no daemon, kept in the library so
//! they have unit tests: the Cranfield collection ([`cranfield`]), ranking metrics
//! ([`metrics`]), the plain-BM25 baseline ([`bm25`]) and the generated speed corpus
//! ([`corpus`]).
pub mod bm25;
pub mod corpus;
pub mod cranfield;
pub mod metrics;
