//! In-process tests: the edge's router and the real `coffer-store` library on a temporary home,
//! on the test's own runtime ([`coffer_tests::inproc::Edge`]). No binary is built or started:
//! these run in the `fast` nextest profile (`./scripts/test --profile fast`). A REST behaviour
//! that needs only the edge and the store belongs here; one that needs the supervisor, chat,
//! retrieval, an upstream process or a log file stays in `tests/e2e`.

mod edge_contract;
mod openapi;
mod profiles;
mod registry;
mod settings;
mod test_layers;
