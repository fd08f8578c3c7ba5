//! Coffer's own tools, exposed as `coffer__<name>` (server [`BUILTIN_SERVER`]) in every
//! session's `tools/list` and subject to the same policy and invocation log as upstream tools.
//!
//! Each tool is a [`Provider`]; the gateway's [`Registry`] (built once, in
//! `Gateway::new`, by [`Registry::standard`]) is the one place that lists them. A provider's
//! call is async and gets only a [`Caller`] — what it may use of the calling session — so a
//! provider whose work happens in another service (over gRPC) holds its client itself and
//! needs nothing from the session's type.
//!
//! The registry checks a call's arguments against the tool's `inputSchema` before the
//! provider runs ([`check_arguments`]: required members, unknown ones, and the size limits
//! every string and list declares with `maxLength` / `maxItems`), so no oversized argument
//! reaches another service (whose gRPC messages are bounded). A refusal is a tool error
//! (`isError`, so a model can correct itself: MCP 2025-11-25 server/tools §Error Handling)
//! recorded as the caller's mistake ([`Outcome::Invalid`]), not as a failure of the tool. So is
//! every refusal a provider finds itself (a wrong type, an empty query, a knowledge base or
//! skill that does not exist): it answers [`Invalid`] instead of a result, and the registry
//! turns that into the same tool error and outcome. A tool error a provider answers as
//! `Ok` (its service failed) is recorded as `upstream_error`.
//!
//! A tool's `inputSchema` is derived from the type its arguments deserialize into
//! ([`input_schema`], a `schemars::JsonSchema` derive on the args struct: descriptions, bounds
//! and required members are attributes of its fields), so the schema clients see and the
//! parser that reads their arguments cannot drift apart; `schema_tests.rs` beside this file holds
//! every tool's schema to its args type and its documented examples to the parser.
pub mod ask_tool;
pub mod meta;
pub mod notes_tools;
pub mod retrieval_tools;
#[cfg(test)]
mod schema_tests;
pub mod search_tools;
pub mod tool_rank;

use std::collections::BTreeMap;
use std::sync::Arc;

use coffer_types::BUILTIN_SERVER;
use futures_util::future::BoxFuture;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::mcp::Outcome;
use crate::mcp::answer::{Answer, RpcError};
pub use crate::mcp::builtin::search_tools::SearchTools;
use crate::mcp::invocations::Usage;
use crate::mcp::jsonrpc::INVALID_PARAMS;

/// The `inputSchema` of a tool whose arguments deserialize into `T`: `T`'s JSON Schema (schemars,
/// draft 2020-12, as read for deserializing) in the shape MCP clients expect of a tool's input:
/// an object schema with `properties` (also when it has none), without the document's
/// `$schema`, `title` and `description` (the tool's own say that), without integer `format`
/// annotations (`uint32`) and without the `"default": null` of optional members.
pub fn input_schema<T: schemars::JsonSchema>() -> Value {
    let schema = schemars::generate::SchemaSettings::draft2020_12().into_generator().into_root_schema_for::<T>();
    let mut schema = schema.to_value();
    if let Some(root) = schema.as_object_mut() {
        for key in ["$schema", "title", "description"] {
            root.remove(key);
        }
        root.entry("properties").or_insert_with(|| json!({}));
        if let Some(properties) = root.get_mut("properties").and_then(Value::as_object_mut) {
            for property in properties.values_mut().filter_map(Value::as_object_mut) {
                property.remove("format");
                if property.get("default") == Some(&Value::Null) {
                    property.remove("default");
                }
            }
        }
    }
    schema
}

/// What a built-in tool may use of the session that calls it.
pub trait Caller: Send + Sync {
    /// The calling session's id (for logs and records).
    fn session_id(&self) -> &str;
    /// The tools the caller sees, enabled only, as its `tools/list` answers them:
    /// `(definition with the exposed name, server, original name)`.
    fn list_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String)>>;
    /// Every tool the caller would see if none were disabled, with whether it is enabled:
    /// `(definition with the exposed name, server, original name, enabled)`. By default
    /// [`Caller::list_tools`], all enabled.
    fn list_all_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String, bool)>> {
        Box::pin(async move { self.list_tools().await.into_iter().map(|(t, s, o)| (t, s, o, true)).collect() })
    }
    /// The `clientInfo.name` the session's client gave in `initialize` (empty when none).
    fn client_name(&self) -> &str {
        ""
    }
    /// Who acts through the session, as its invocation records name it: `mcp` for an MCP
    /// client, the caller's actor for a broker session (`cli`, `agent`, `channel:<name>`, …).
    fn actor(&self) -> &str {
        crate::mcp::invocations::MCP_ACTOR
    }
    /// Calls tool `name` (an exposed name) with `arguments` (raw JSON object text; `None`: no
    /// `arguments` member) exactly as the caller's own `tools/call` would: the same resolution,
    /// policy, routing, invocation record and answer (`coffer__call_tool`,
    /// [`crate::mcp::builtin::meta`]). By default refused: a caller that cannot route.
    fn call_tool<'a>(&'a self, name: &'a str, arguments: Option<&'a str>) -> BoxFuture<'a, Answer> {
        let _ = arguments;
        Box::pin(async move {
            Answer::Error(RpcError::new(INVALID_PARAMS, format!("this caller cannot call {name:?} by name")))
        })
    }
}

/// The caller's mistake in a call of a built-in tool (bad arguments, a name that names nothing):
/// the sentence the client gets as a tool error (`isError`), recorded as [`Outcome::Invalid`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid(pub String);

/// What a provider's call gives: its answer (a result, or a tool error of its own), or the
/// caller's mistake.
pub type Reply = Result<Answer, Invalid>;

/// One built-in tool.
pub trait Provider: Send + Sync {
    /// The original name (exposed as `coffer__<name>`), unique in the registry.
    fn name(&self) -> &'static str;
    /// The MCP `Tool` definition (MCP 2025-11-25 server/tools §Tool) with `name` = [`Provider::name`].
    fn definition(&self) -> Value;
    /// Calls the tool for `caller` with raw JSON `arguments` (`None` when absent). The caller's
    /// mistake is [`Invalid`]; a failure of the tool is a result with `isError: true`
    /// ([`tool_error`]); an [`Answer::Error`] is a protocol error.
    fn call<'a>(&'a self, caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply>;
    /// [`Provider::call`] with what the call used of an LLM, for its invocation record
    /// (`coffer__ask`'s run); the others use none.
    fn call_metered<'a>(
        &'a self,
        caller: &'a dyn Caller,
        arguments: Option<&'a str>,
    ) -> BoxFuture<'a, (Reply, Option<Box<Usage>>)> {
        Box::pin(async move { (self.call(caller, arguments).await, None) })
    }
}

/// The built-in tools of one gateway, by name, each with its `inputSchema` (read once).
#[derive(Clone, Default)]
pub struct Registry {
    providers: BTreeMap<&'static str, (Arc<dyn Provider>, Arc<Value>)>,
    /// Providers that are callable but not in [`Registry::definitions`] (the lazy mode's
    /// `describe_tool` and `call_tool`, listed by [`crate::mcp::builtin::meta::listing`] only).
    unlisted: Vec<&'static str>,
}

/// What a built-in call produced: the answer, what it used of an LLM, and how the invocation
/// log records it.
pub struct Called {
    pub answer: Answer,
    pub usage: Option<Box<Usage>>,
    pub outcome: Outcome,
}

impl Registry {
    /// The standard set: `search_tools` ([`crate::mcp::builtin::search_tools`]), the lazy mode's
    /// `describe_tool` and `call_tool` ([`crate::mcp::builtin::meta`]), and with a `retrieval` client the knowledge, memory
    /// and skill tools ([`crate::mcp::builtin::retrieval_tools`]: `search_knowledge`, `recall`, `remember`,
    /// `forget`, `list_skills`, `load_skill`) and note tools ([`crate::mcp::builtin::notes_tools`]:
    /// `read_note`, `write_note`).
    pub fn standard(retrieval: Option<crate::clients::retrieval::Client>) -> Self {
        // search_tools is semantic when retrieval has an embeddings endpoint (its `Embed` RPC).
        let embedder = retrieval.clone().map(|c| Arc::new(c) as Arc<dyn crate::mcp::builtin::search_tools::Embed>);
        let registry = Self::default()
            .with(SearchTools::new(embedder))
            .with_unlisted(crate::mcp::builtin::meta::DescribeTool)
            .with_unlisted(crate::mcp::builtin::meta::CallTool);
        match retrieval {
            Some(client) => {
                let registry = crate::mcp::builtin::retrieval_tools::register(registry, client.clone());
                crate::mcp::builtin::notes_tools::register(registry, client)
            }
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
        let schema = provider.definition().get("inputSchema").cloned().unwrap_or_else(|| json!({}));
        let previous = self.providers.insert(name, (Arc::new(provider), Arc::new(schema)));
        assert!(previous.is_none(), "two built-in tools named {name:?}");
        self
    }

    /// [`Registry::with`] for a tool that is callable but not listed ([`Registry::definitions`]
    /// leaves it out; [`Registry::all_definitions`] has it, so its name resolves).
    #[must_use]
    pub fn with_unlisted(mut self, provider: impl Provider + 'static) -> Self {
        self.unlisted.push(provider.name());
        self.with(provider)
    }

    /// Every listed tool's definition (original names), in name order.
    pub fn definitions(&self) -> Vec<Value> {
        self.providers.iter().filter(|(n, _)| !self.unlisted.contains(n)).map(|(_, (p, _))| p.definition()).collect()
    }

    /// Every tool's definition, the unlisted ones too (what a name may resolve to).
    pub fn all_definitions(&self) -> Vec<Value> {
        self.providers.values().map(|(p, _)| p.definition()).collect()
    }

    /// Calls built-in tool `name` (original name) for `caller` with raw JSON `arguments`.
    pub async fn call(&self, name: &str, caller: &dyn Caller, arguments: Option<&str>) -> Answer {
        self.call_metered(name, caller, arguments).await.answer
    }

    /// [`Registry::call`], with the LLM usage the call reports ([`Provider::call_metered`]) and
    /// its outcome: [`Outcome::Invalid`] for arguments [`check_arguments`] refuses (the
    /// provider does not run) and for what the provider refuses as [`Invalid`], else the
    /// answer's own.
    pub async fn call_metered(&self, name: &str, caller: &dyn Caller, arguments: Option<&str>) -> Called {
        let Some((provider, schema)) = self.providers.get(name) else {
            let answer =
                Answer::Error(RpcError::new(INVALID_PARAMS, format!("Unknown tool \"{BUILTIN_SERVER}__{name}\"")));
            return Called { outcome: answer.outcome(), answer, usage: None };
        };
        if let Err(problem) = check_arguments(schema, arguments) {
            // The same prefix as a provider's own argument errors (`retrieval_tools::args`).
            let answer = tool_error(&format!("{BUILTIN_SERVER}__{name}: invalid arguments: {problem}"));
            return Called { answer, usage: None, outcome: Outcome::Invalid };
        }
        match provider.call_metered(caller, arguments).await {
            (Ok(answer), usage) => Called { outcome: answer.outcome(), answer, usage },
            (Err(Invalid(problem)), usage) => Called { answer: tool_error(&problem), usage, outcome: Outcome::Invalid },
        }
    }
}

/// Checks `arguments` (raw JSON, absent = `{}`) against a tool's `inputSchema`: no member the schema does not name when it says
/// `additionalProperties: false`; no number over its `maximum`; no string longer than its `maxLength` (characters, as JSON
/// Schema counts them) and no array with more than `maxItems` items or an item longer than the
/// items' `maxLength` (a single string where an array is declared, which the tools accept, is
/// checked as one item); then every `required` member is there. Types beyond that are left to
/// the provider.
///
/// # Errors
/// A sentence naming the argument and the rule, e.g. `argument "query" is 10000000 characters
/// long, over its limit of 8192`.
pub fn check_arguments(schema: &Value, arguments: Option<&str>) -> Result<(), String> {
    let args: Value = match arguments {
        Some(a) => serde_json::from_str(a).map_err(|e| format!("arguments are not valid JSON ({e})"))?,
        None => json!({}),
    };
    let Some(args) = args.as_object() else {
        return Err("arguments must be an object".into());
    };
    let empty = serde_json::Map::new();
    let properties = schema.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    for (name, value) in args {
        let Some(rule) = properties.get(name) else {
            if schema.get("additionalProperties") == Some(&Value::Bool(false)) {
                let mut known: Vec<&str> = properties.keys().map(String::as_str).collect();
                known.sort_unstable();
                let takes = if known.is_empty() { "none".to_owned() } else { known.join(", ") };
                return Err(format!("unknown argument \"{name}\" (it takes: {takes})"));
            }
            continue;
        };
        check_size(name, rule, value)?;
        if let (Some(items), Some(list)) = (rule.get("items"), value.as_array()) {
            for (i, item) in list.iter().enumerate() {
                check_size(&format!("{name}[{i}]"), items, item)?;
            }
        } else if let (Some(items), Value::String(_)) = (rule.get("items"), value) {
            check_size(name, items, value)?;
        }
    }
    // After the unknown members: `{"txt": …}` is a misspelt `text`, which is the more useful
    // thing to say.
    for required in schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        if !args.contains_key(required) {
            return Err(format!("missing argument \"{required}\""));
        }
    }
    Ok(())
}

/// `maxLength` of a string, `maxItems` of an array and `maximum` of a number (the other checks
/// of [`check_arguments`]).
fn check_size(name: &str, rule: &Value, value: &Value) -> Result<(), String> {
    let limit = |key: &str| rule.get(key).and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
    match value {
        Value::String(s) => {
            if let Some(max) = limit("maxLength") {
                // Counting stops at the limit: a 10 MB string costs no more than a short one.
                if s.len() > max && s.chars().nth(max).is_some() {
                    let n = s.chars().count();
                    return Err(format!("argument \"{name}\" is {n} characters long, over its limit of {max}"));
                }
            }
        }
        Value::Array(a) => {
            if let Some(max) = limit("maxItems")
                && a.len() > max
            {
                return Err(format!("argument \"{name}\" has {} items, over its limit of {max}", a.len()));
            }
        }
        Value::Number(n) => {
            if let (Some(max), Some(v)) = (rule.get("maximum").and_then(Value::as_f64), n.as_f64())
                && v > max
            {
                return Err(format!("argument \"{name}\" is {n}, over its maximum of {max}"));
            }
        }
        _ => {}
    }
    Ok(())
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
        assert_eq!(none["content"][0]["text"], "No tools match \"zebra\". Try other words for what you want to do.");
        let bad = result(registry.call("search_tools", &caller, None).await);
        assert_eq!(bad["isError"], true, "a missing query is a tool error, not a protocol error");
    }

    /// Arguments over a declared limit, missing or unknown are refused before the provider
    /// runs, with a tool error naming the argument and the limit, recorded as the caller's.
    #[tokio::test]
    async fn arguments_are_checked_against_the_schema_before_the_call() {
        let registry = Registry::standard(None);
        let caller = Tools(vec![]);
        let big = format!(r#"{{"query":"{}"}}"#, "q".repeat(10_000_000));
        let called = registry.call_metered("search_tools", &caller, Some(&big)).await;
        assert_eq!(called.outcome, Outcome::Invalid);
        let text = result(called.answer)["content"][0]["text"].as_str().unwrap().to_owned();
        assert_eq!(
            text,
            format!(
                "coffer__search_tools: invalid arguments: argument \"query\" is 10000000 characters long, over its limit of {}",
                crate::mcp::builtin::search_tools::MAX_QUERY_CHARS
            )
        );
        let missing = registry.call_metered("search_tools", &caller, Some("{}")).await;
        assert_eq!(missing.outcome, Outcome::Invalid);
        assert_eq!(
            result(missing.answer)["content"][0]["text"],
            "coffer__search_tools: invalid arguments: missing argument \"query\""
        );
        let ok = registry.call_metered("search_tools", &caller, Some(r#"{"query":"read"}"#)).await;
        assert_eq!(ok.outcome, Outcome::Ok);

        let schema = json!({"type": "object", "properties": {
            "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 3}},
            "kb": {"type": "array", "items": {"type": "string", "maxLength": 3}},
        }, "additionalProperties": false});
        assert_eq!(check_arguments(&schema, Some(r#"{"tags":["a","b"],"kb":"abc"}"#)), Ok(()));
        let e = |a: &str| check_arguments(&schema, Some(a)).unwrap_err();
        assert_eq!(e(r#"{"tags":["a","b","c"]}"#), "argument \"tags\" has 3 items, over its limit of 2");
        assert_eq!(e(r#"{"tags":["abcd"]}"#), "argument \"tags[0]\" is 4 characters long, over its limit of 3");
        assert_eq!(e(r#"{"kb":"éééé"}"#), "argument \"kb\" is 4 characters long, over its limit of 3");
        assert_eq!(e(r#"{"nope":1}"#), "unknown argument \"nope\" (it takes: kb, tags)");
        assert_eq!(check_arguments(&schema, Some(r#"{"kb":"ééé"}"#)), Ok(()), "characters, not bytes");
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
        fn call<'a>(&'a self, caller: &'a dyn Caller, _: Option<&'a str>) -> BoxFuture<'a, Reply> {
            Box::pin(async move { Ok(Answer::ok(json!({"session": caller.session_id()}))) })
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
