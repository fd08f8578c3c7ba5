//! In-process tests of the gateway core.
