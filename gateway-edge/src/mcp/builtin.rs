//! Coffer's own tools, exposed as `coffer__<name>` (server [`BUILTIN_SERVER`]) in every
//! session's `tools/list` and subject to the same policy and invocation log as upstream tools.
//!
//! Each tool is a [`Provider`]; the gateway's [`Registry`] (built once, in
//! `Gateway::new`, by [`Registry::standard`]) is the one place that lists them. A provider's
//! call is async and gets only a [`Caller`] — what it may use of the calling session — so a
//! provider whose work happens in another service (over gRPC) holds its client itself and
//! needs nothing from the session's type.
use std::collections::BTreeMap;
use std::sync::Arc;

use coffer_types::BUILTIN_SERVER;
use futures_util::future::BoxFuture;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::answer::{Answer, RpcError};
use super::invocations::Usage;
use super::jsonrpc::INVALID_PARAMS;
pub use super::search_tools::SearchTools;

/// What a built-in tool may use of the session that calls it.
pub trait Caller: Send + Sync {
    /// The calling session's id (for logs and records).
    fn session_id(&self) -> &str;
    /// The tools the caller sees, enabled only, as its `tools/list` answers them:
    /// `(definition with the exposed name, server, original name)`.
    fn list_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String)>>;
    /// The `clientInfo.name` the session's client gave in `initialize` (empty when none).
    fn client_name(&self) -> &str {
        ""
    }
    /// Who acts through the session, as its invocation records name it: `mcp` for an MCP
    /// client, the caller's actor for a broker session (`cli`, `agent`, `channel:<name>`, …).
    fn actor(&self) -> &str {
        super::invocations::MCP_ACTOR
    }
}

/// One built-in tool.
pub trait Provider: Send + Sync {
    /// The original name (exposed as `coffer__<name>`), unique in the registry.
    fn name(&self) -> &'static str;
    /// The MCP `Tool` definition (MCP 2025-11-25 server/tools §Tool) with `name` = [`Provider::name`].
    fn definition(&self) -> Value;
    /// Calls the tool for `caller` with raw JSON `arguments` (`None` when absent). A tool-level
    /// failure is a result with `isError: true` ([`tool_error`]); an [`Answer::Error`] is a
    /// protocol error.
    fn call<'a>(&'a self, caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Answer>;
    /// [`Provider::call`] with what the call used of an LLM, for its invocation record
    /// (`coffer__ask`'s run); the others use none.
    fn call_metered<'a>(
        &'a self,
        caller: &'a dyn Caller,
        arguments: Option<&'a str>,
    ) -> BoxFuture<'a, (Answer, Option<Box<Usage>>)> {
        Box::pin(async move { (self.call(caller, arguments).await, None) })
    }
}

/// The built-in tools of one gateway, by name.
#[derive(Clone, Default)]
pub struct Registry {
    providers: BTreeMap<&'static str, Arc<dyn Provider>>,
}

impl Registry {
    /// The standard set: `search_tools` ([`super::search_tools`]), and with a `retrieval` client the knowledge, memory
    /// and skill tools ([`super::retrieval_tools`]: `search_knowledge`, `recall`, `remember`,
    /// `forget`, `list_skills`, `load_skill`).
    pub fn standard(retrieval: Option<crate::retrieval::Client>) -> Self {
        // search_tools is semantic when retrieval has an embeddings endpoint (its `Embed` RPC).
        let embedder = retrieval.clone().map(|c| Arc::new(c) as Arc<dyn super::search_tools::Embed>);
        let registry = Self::default().with(SearchTools::new(embedder));
        match retrieval {
            Some(client) => super::retrieval_tools::register(registry, client),
            None => registry,
        }
    }

    /// The registry with `provider` added.
    ///
    /// # Panics
    /// When a provider of that name is already registered (a programming error).
    #[must_use]
    pub fn with(mut self, provider: impl Provider + 'static) -> Self {
        let name = provider.name();
        let previous = self.providers.insert(name, Arc::new(provider));
        assert!(previous.is_none(), "two built-in tools named {name:?}");
        self
    }

    /// Every tool's definition (original names), in name order.
    pub fn definitions(&self) -> Vec<Value> {
        self.providers.values().map(|p| p.definition()).collect()
    }

    /// Calls built-in tool `name` (original name) for `caller` with raw JSON `arguments`.
    pub async fn call(&self, name: &str, caller: &dyn Caller, arguments: Option<&str>) -> Answer {
        self.call_metered(name, caller, arguments).await.0
    }

    /// [`Registry::call`], with the LLM usage the call reports ([`Provider::call_metered`]).
    pub async fn call_metered(
        &self,
        name: &str,
        caller: &dyn Caller,
        arguments: Option<&str>,
    ) -> (Answer, Option<Box<Usage>>) {
        match self.providers.get(name) {
            Some(p) => p.call_metered(caller, arguments).await,
            None => (
                Answer::Error(RpcError::new(INVALID_PARAMS, format!("Unknown tool \"{BUILTIN_SERVER}__{name}\""))),
                None,
            ),
        }
    }
}

/// A tool result reporting a tool-level error (`isError: true`) with text `msg`.
pub fn tool_error(msg: &str) -> Answer {
    Answer::Result(
        RawValue::from_string(json!({"content": [{"type": "text", "text": msg}], "isError": true}).to_string())
            .expect("json"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller with a fixed tool list.
    struct Tools(Vec<(Value, String, String)>);

    impl Caller for Tools {
        fn session_id(&self) -> &str {
            "test"
        }
        fn list_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String)>> {
            Box::pin(async move { self.0.clone() })
        }
    }

    fn tool(name: &str, server: &str, description: &str) -> (Value, String, String) {
        let original = name.split_once("__").map_or(name, |(_, o)| o).to_owned();
        (json!({"name": name, "description": description}), server.to_owned(), original)
    }

    fn result(answer: Answer) -> Value {
        match answer {
            Answer::Result(r) => serde_json::from_str(r.get()).unwrap(),
            _ => panic!("a result"),
        }
    }

    #[tokio::test]
    async fn search_ranks_names_over_descriptions_and_skips_built_ins() {
        let caller = Tools(vec![
            tool("coffer__search_tools", BUILTIN_SERVER, "Find tools to read"),
            tool("fs__list", "fs", "Reads a directory"),
            tool("fs__read_file", "fs", "Returns a file's text"),
            tool("git__status", "git", "Working tree status"),
        ]);
        let registry = Registry::standard(None);
        let out = result(registry.call("search_tools", &caller, Some(r#"{"query":"read"}"#)).await);
        let names: Vec<&str> = out["structuredContent"]["matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["fs__read_file", "fs__list"]);
        assert_eq!(out["content"][0]["text"], "fs__read_file — Returns a file's text\nfs__list — Reads a directory");
        let none = result(registry.call("search_tools", &caller, Some(r#"{"query":"zebra"}"#)).await);
        assert_eq!(none["content"][0]["text"], "No tools match \"zebra\".");
        let bad = result(registry.call("search_tools", &caller, None).await);
        assert_eq!(bad["isError"], true, "a missing query is a tool error, not a protocol error");
    }

    /// A provider that answers with the caller's session id.
    struct Whoami;

    impl Provider for Whoami {
        fn name(&self) -> &'static str {
            "whoami"
        }
        fn definition(&self) -> Value {
            json!({"name": "whoami", "inputSchema": {"type": "object"}})
        }
        fn call<'a>(&'a self, caller: &'a dyn Caller, _: Option<&'a str>) -> BoxFuture<'a, Answer> {
            Box::pin(async move { Answer::ok(json!({"session": caller.session_id()})) })
        }
    }

    #[tokio::test]
    async fn the_registry_lists_and_calls_its_providers_by_name() {
        let registry = Registry::standard(None).with(Whoami);
        let names: Vec<Value> = registry.definitions().into_iter().map(|d| d["name"].clone()).collect();
        assert_eq!(names, [json!("search_tools"), json!("whoami")]);
        assert_eq!(result(registry.call("whoami", &Tools(vec![]), None).await), json!({"session": "test"}));
        match registry.call("nope", &Tools(vec![]), None).await {
            Answer::Error(e) => {
                assert_eq!((e.code, e.message.as_str()), (INVALID_PARAMS, "Unknown tool \"coffer__nope\""))
            }
            _ => panic!("an unknown built-in is -32602"),
        }
    }

    #[test]
    #[should_panic(expected = "two built-in tools")]
    fn two_providers_may_not_share_a_name() {
        let _ = Registry::standard(None).with(SearchTools::new(None));
    }
}
