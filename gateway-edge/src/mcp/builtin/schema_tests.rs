//! Every built-in tool's advertised `inputSchema` is the one derived from its args type, and
//! every example its descriptions give (`e.g. …`) is accepted by both that type and the
//! registry's argument check.
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::ask_tool::AskArgs;
use super::notes_tools::{ReadNoteArgs, WriteNoteArgs};
use super::retrieval_tools::{ForgetArgs, LoadArgs, NoArgs, RecallArgs, RememberArgs, SearchArgs};
use super::search_tools::SearchToolsArgs;
use super::{Registry, check_arguments, input_schema};

/// The standard registry with `coffer__ask`, over clients of nothing (never called here).
fn registry() -> Registry {
    let token = secrecy::SecretString::from("00".to_owned());
    let retrieval = crate::clients::retrieval::client("127.0.0.1:9", &token).expect("client");
    let llm = crate::clients::llm::client("127.0.0.1:9", &token).expect("client");
    super::ask_tool::register(Registry::standard(Some(retrieval)), llm)
}

/// One tool's contract: its args type's schema, and a check that `example` reads as that type.
struct Tool {
    name: &'static str,
    schema: Value,
    reads: fn(&Value) -> Result<(), String>,
    /// The examples its documentation gives, as whole argument objects.
    examples: Vec<Value>,
}

fn reads<T: DeserializeOwned>(example: &Value) -> Result<(), String> {
    T::deserialize(example).map(drop).map_err(|e| e.to_string())
}

fn tool<T: JsonSchema + DeserializeOwned>(name: &'static str, examples: Vec<Value>) -> Tool {
    Tool { name, schema: input_schema::<T>(), reads: reads::<T>, examples }
}

fn tools() -> Vec<Tool> {
    vec![
        tool::<SearchToolsArgs>(
            "search_tools",
            vec![json!({"query": "read a file"}), json!({"query": "read a file", "limit": 5})],
        ),
        tool::<SearchArgs>(
            "search_knowledge",
            vec![
                json!({"query": "how do we rotate the API keys"}),
                json!({"query": "how do we rotate the API keys", "kb": ["notes"], "path_prefix": "projects/", "tags": ["ops"], "limit": 20, "snippet_chars": 1000}),
                json!({"query": "keys", "kb": "notes", "tags": "ops"}),
            ],
        ),
        tool::<RecallArgs>(
            "recall",
            vec![
                json!({"query": "preferred test framework"}),
                json!({"query": "deploys", "tags": ["deploy"], "limit": 3}),
            ],
        ),
        tool::<RememberArgs>(
            "remember",
            vec![
                json!({"text": "The user's staging database is db-stage-2"}),
                json!({"text": "The user's staging database is db-stage-2", "tags": ["deploy", "staging"], "allow_secret": false}),
            ],
        ),
        tool::<ForgetArgs>("forget", vec![json!({"id": "01JDQ8ZKXW5T3M2N4P6R7S8T9V"})]),
        tool::<NoArgs>("list_skills", vec![json!({})]),
        tool::<LoadArgs>("load_skill", vec![json!({"name": "release-notes"})]),
        tool::<ReadNoteArgs>(
            "read_note",
            vec![
                json!({"kb": "notes", "path": "projects/coffer.md"}),
                json!({"kb": "notes", "path": "projects/coffer.md", "start_line": 2001, "end_line": 4000}),
            ],
        ),
        tool::<WriteNoteArgs>(
            "write_note",
            vec![
                json!({"kb": "inbox", "path": "meetings/2026-12-07.md", "content": "# Standup\n\nShipped [[Release 4]]. #meeting"}),
                json!({"kb": "inbox", "path": "meetings/2026-12-07.md", "content": "more", "mode": "append"}),
                json!({"kb": "inbox", "path": "a.md", "content": "", "mode": "replace"}),
            ],
        ),
        tool::<AskArgs>(
            "ask",
            vec![
                json!({"question": "what do my notes say about rotating the API keys?"}),
                json!({"question": "what did we decide about Y?", "kb": "notes"}),
            ],
        ),
    ]
}

// The clients connect lazily, but on a runtime.
#[tokio::test]
async fn each_tool_advertises_the_schema_of_its_args_type() {
    let definitions = registry().definitions();
    let tools = tools();
    let mut names: Vec<&str> = definitions.iter().filter_map(|d| d["name"].as_str()).collect();
    names.sort_unstable();
    let mut covered: Vec<&str> = tools.iter().map(|t| t.name).collect();
    covered.sort_unstable();
    assert_eq!(names, covered, "every built-in tool has its args type here");
    for t in &tools {
        let d = definitions.iter().find(|d| d["name"] == t.name).expect("listed");
        assert_eq!(d["inputSchema"], t.schema, "{}", t.name);
        assert_eq!(t.schema["type"], "object", "{}", t.name);
        assert!(t.schema["properties"].is_object(), "{}", t.name);
        assert!(!t.schema.to_string().contains("\"$ref\""), "{}: self-contained", t.name);
        for (property, rule) in t.schema["properties"].as_object().into_iter().flatten() {
            assert!(rule["description"].as_str().is_some_and(|s| !s.is_empty()), "{}.{property} is described", t.name);
            assert!(rule["type"].is_string(), "{}.{property} has one type (no null)", t.name);
        }
    }
}

#[test]
fn each_tool_s_documented_examples_are_accepted() {
    for t in tools() {
        for example in &t.examples {
            (t.reads)(example).unwrap_or_else(|e| panic!("{}: {example} does not read: {e}", t.name));
            check_arguments(&t.schema, Some(&example.to_string()))
                .unwrap_or_else(|e| panic!("{}: {example} is refused: {e}", t.name));
        }
    }
}

#[test]
fn the_derived_schemas_keep_their_bounds_and_defaults() {
    let search = input_schema::<SearchArgs>();
    // The query may be left out when tags are given (a tag listing).
    assert_eq!(search["required"], Value::Null);
    assert_eq!(search["properties"]["cursor"]["type"], "string");
    assert_eq!(search["additionalProperties"], false);
    assert_eq!(search["properties"]["kb"]["type"], "array", "one string is accepted, a list advertised");
    assert_eq!(search["properties"]["kb"]["maxItems"], super::retrieval_tools::MAX_FILTER_ITEMS);
    assert_eq!(search["properties"]["kb"]["items"]["maxLength"], super::retrieval_tools::MAX_NAME_CHARS);
    assert_eq!(
        search["properties"]["limit"],
        json!({"type": "integer", "minimum": 1, "maximum": 20, "description": "Most passages (default 8, at most 20)."})
    );
    let remember = input_schema::<RememberArgs>();
    assert_eq!(remember["properties"]["allow_secret"]["default"], false);
    assert_eq!(input_schema::<NoArgs>(), json!({"type": "object", "properties": {}, "additionalProperties": false}));
    let write = input_schema::<WriteNoteArgs>();
    assert_eq!(write["required"], json!(["kb", "path", "content"]));
    assert_eq!(write["properties"]["mode"]["enum"], json!(["create", "replace", "append"]));
    assert_eq!(input_schema::<ReadNoteArgs>()["required"], json!(["kb", "path"]));
    let search_tools = input_schema::<SearchToolsArgs>();
    assert_eq!(search_tools.get("additionalProperties"), None, "search_tools ignores members it does not name");
}
