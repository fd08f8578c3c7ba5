//! coffer-chat's LLM side (`proto/llm.proto`, `coffer.llm.v1.Llm`, served next to Chat to the
//! gateway): probing LLM connections and the internal agent behind `coffer__ask`.
//!
//! File by file: [`service`] (the gRPC surface, validation, the status mapping, at most
//! [`service::MAX_RUNS`] runs at once) → [`agent`] (the loop: iterations, the context budget,
//! tool results back to the model) with [`broker`] (the gateway's `ToolBroker`, one session per
//! run, actor `agent`) and [`sources`] (numbered passages, the answer's citations).
//!
//! The internal agent is never a chat persona (not in `ListAgents`, no conversations): a run
//! answers one question and ends.
//! - **A run.** `Ask` takes the internal-default connection (none → `FAILED_PRECONDITION` whose
//!   message says `coffer llm add … --default`), resolves it once with the
//!   `llm.request_timeout_s`/`llm.stall_timeout_s` in force, and runs `agent::run`: one `ListTools`
//!   on its own broker session, then at most `llm.ask_max_iterations` model requests; every call
//!   the agent makes is admitted by policy and logged like any call
//!   (`GET /v1/invocations?actor=agent`).
//! - **Tools offered.** Only the read-only retrieval built-ins (`coffer__search_knowledge`,
//!   `coffer__recall`, `coffer__list_skills`, `coffer__load_skill`) that the session lists. A call
//!   of one of those names goes to the broker even when it is not listed, so a disabled one gets
//!   the broker's `TOOL_DISABLED` (recorded `disabled`); `coffer__ask` itself, and any other name,
//!   is refused here. Every refusal and failure is a tool result with `is_error` back to the model;
//!   the run goes on. With `kb` set, `search_knowledge`'s `kb` is forced to it.
//! - **Bounds.** `llm.ask_context_tokens` × 4 characters per request: each tool result is cut to
//!   its share (a quarter of the budget, split among the step's calls, at least 1,000 characters);
//!   the last allowed request that still asks for tools ends the run with `max_iterations`.
//!   `RunUsage` sums the tokens of every request; the gateway's `coffer__ask` hands it to the
//!   invocation record (`Provider::call_metered` → `mcp_invocations.usage_*` → `usage` in
//!   `GET /v1/invocations`, the USAGE column of `coffer invocations`, the console's Activity page).
//! - **Failures.** A provider's failure ends the run: `FAILED_PRECONDITION` (auth, not found,
//!   TLS), `UNAVAILABLE` (unreachable, 5xx, garbled or cut stream, rate limited — "retry after
//!   N s"), `DEADLINE_EXCEEDED` (timeout, stall), the message naming the connection, the provider
//!   and the cause.
//!
//! Tests: `llm::agent::tests::*` (a scripted model and scripted tools: multi-step citations,
//! refused/disabled/unknown tools, max_iterations, a 2 MB result cut, dropped steps,
//! context_budget, provider failures), `llm::sources::tests::*`; e2e `llm_agent::*` (through the
//! shim on a fake provider: every wire, the faults, two runs at once, the connection deleted
//! mid-run, the probes).
pub mod agent;
pub mod broker;
pub mod service;
pub mod sources;
