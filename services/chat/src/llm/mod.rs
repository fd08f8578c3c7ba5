//! coffer-chat's LLM side (`proto/llm.proto`, `coffer.llm.v1.Llm`, served next to Chat to the
//! gateway): probing LLM connections and the internal agent behind `coffer__ask`.
//!
//! File by file: [`service`] (the gRPC surface, validation, the status mapping, at most
//! [`service::MAX_RUNS`] runs at once) → [`agent`] (the loop: iterations, the context budget,
//! tool results back to the model) with [`broker`] (the gateway's `ToolBroker`, one session per
//! run, actor `agent`) and [`sources`] (numbered passages, the answer's citations).
pub mod agent;
pub mod broker;
pub mod service;
pub mod sources;
