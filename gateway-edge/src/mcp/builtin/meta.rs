//! The lazy tool mode (issue 36 §2): the meta tools and what a session lists.
//!
//! A profile in `lazy` mode ([`ToolMode::Lazy`]) offers a model three tools instead of every
//! schema, and the model pays for a tool's schema only when it wants that tool:
//!
//! - `coffer__search_tools {query, limit?}` ([`crate::mcp::builtin::search_tools`]): which tools
//!   fit what you want to do, one compact line each;
//! - `coffer__describe_tool {name}` ([`DescribeTool`]): one tool's full MCP `Tool` (its
//!   `inputSchema`, `annotations`, description), as the session would list it;
//! - `coffer__call_tool {name, arguments?}` ([`CallTool`]): calls a tool by its exposed name
//!   through the session's own `tools/call` ([`Caller::call_tool`]): the same resolution, policy
//!   (a disabled tool, or one the profile does not select, is refused the same way), routing,
//!   invocation record and answer, verbatim. The routed call is recorded once, as the tool it
//!   called (with the session's client and profile); the meta call itself is recorded only
//!   when it routed nothing (its own arguments were wrong). The meta call's request context
//!   goes with the routed call (`crate::mcp::session::route`'s `InCall`): its `_meta` (so the
//!   caller's `progressToken` and the upstream's progress on the caller's stream),
//!   cancellation by the caller's request id, and upstream requests relayed on its stream.
//!
//! Upstream tools stay callable by their exposed names in a lazy session (for clients that
//! learned them).
//!
//! **What a session lists** ([`listing`], the hook the session's `tools/list` calls on the
//! tools it would list, after policy and its profile's selection, with the session's profile:
//! `default` when it names none):
//! - `full` mode (and no profile): those tools as they are; `coffer__describe_tool` and
//!   `coffer__call_tool` are not among them (a model that has every schema needs neither; they
//!   are registered unlisted, [`crate::mcp::builtin::Registry::with_unlisted`], and stay
//!   callable);
//! - `lazy` mode: the three meta tools, and of Coffer's other tools only those the profile's
//!   `builtins.include` names explicitly (a glob counts: `coffer__*` lists them all). An empty
//!   `include` (every built-in selected) lists none of them: they are found by
//!   `coffer__search_tools` and called like any tool.
use coffer_api::profiles::{Profile, ToolMode};
use coffer_types::BUILTIN_SERVER;
use futures_util::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::mcp::answer::Answer;
use crate::mcp::builtin::search_tools::one_line;
use crate::mcp::builtin::tool_rank::{ToolDoc, ToolIndex};
use crate::mcp::builtin::{Caller, Invalid, Provider, Reply, input_schema};
use crate::mcp::jsonrpc::INVALID_PARAMS;
use crate::snapshot::{Kind, Snapshot};

/// The meta tools' original names (exposed as `coffer__<name>`).
pub const SEARCH: &str = "search_tools";
pub const DESCRIBE: &str = "describe_tool";
pub const CALL: &str = "call_tool";

/// Longest tool name `describe_tool` and `call_tool` take, in characters (exposed names are at
/// most 64; an override's too).
pub const MAX_NAME_CHARS: usize = 200;
/// Most names suggested when a name names no tool.
const SUGGESTIONS: usize = 3;

/// What a session's `tools/list` holds, from the tools it would list (`(definition with the
/// exposed name, server, original name)`, after policy and its profile's selection), the
/// policy snapshot (a meta tool disabled by preference is not listed) and its profile
/// (`None`: a session with no stored profile, e.g. an in-house caller's: full). See the
/// module docs.
pub fn listing(snap: &Snapshot, profile: Option<&Profile>, tools: Vec<(Value, String, String)>) -> Vec<Value> {
    let lazy = profile.is_some_and(|p| p.spec.mode == ToolMode::Lazy);
    if !lazy {
        return tools.into_iter().map(|(t, _, _)| t).collect();
    }
    let kept = explicit_builtins(profile.map(|p| p.spec.builtins.include.as_slice()).unwrap_or_default());
    let (search, others): (Vec<_>, Vec<_>) = tools
        .into_iter()
        .filter(|(_, server, original)| {
            server == BUILTIN_SERVER && (original == SEARCH || kept.is_match(format!("{BUILTIN_SERVER}__{original}")))
        })
        .partition(|(_, _, original)| original == SEARCH);
    let mut out: Vec<Value> = search.into_iter().map(|(t, _, _)| t).collect();
    for meta in [DescribeTool.definition(), CallTool.definition()] {
        let original = meta["name"].as_str().unwrap_or_default().to_owned();
        if snap.capability_enabled(BUILTIN_SERVER, Kind::Tool, &original) {
            let mut exposed = meta;
            exposed["name"] = json!(format!("{BUILTIN_SERVER}__{original}"));
            out.push(exposed);
        }
    }
    out.extend(others.into_iter().map(|(t, _, _)| t));
    out
}

/// The globs of a profile's `builtins.include` (empty: matches nothing). A glob that does not
/// compile (the store checks them) matches nothing.
fn explicit_builtins(include: &[String]) -> globset::GlobSet {
    let mut set = globset::GlobSetBuilder::new();
    for g in include {
        if let Ok(glob) = globset::GlobBuilder::new(g).literal_separator(false).build() {
            set.add(glob);
        }
    }
    set.build().unwrap_or_else(|_| globset::GlobSet::empty())
}

/// The arguments of `coffer__describe_tool`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DescribeArgs {
    #[schemars(
        length(min = 1, max = MAX_NAME_CHARS),
        description = "The tool's exposed name as coffer__search_tools gives it, e.g. \"time__get_current_time\"."
    )]
    name: String,
}

/// The arguments of `coffer__call_tool`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallArgs {
    #[schemars(
        length(min = 1, max = MAX_NAME_CHARS),
        description = "The tool's exposed name, e.g. \"time__get_current_time\"."
    )]
    name: String,
    #[serde(default)]
    #[schemars(
        with = "serde_json::Map<String, Value>",
        description = "The tool's arguments as its inputSchema describes them (see coffer__describe_tool), e.g. {\"timezone\": \"Asia/Tokyo\"}; omit when it takes none."
    )]
    arguments: Option<Value>,
}

/// `coffer__describe_tool`.
pub struct DescribeTool;

/// `coffer__call_tool`.
pub struct CallTool;

/// Parses `args` as `T`, or the caller's mistake in plain words.
fn parse<T: serde::de::DeserializeOwned>(tool: &str, args: Option<&str>) -> Result<T, Invalid> {
    serde_json::from_str(args.unwrap_or("{}")).map_err(|e| {
        let msg = e.to_string();
        Invalid(format!(
            "{BUILTIN_SERVER}__{tool}: invalid arguments: {}",
            msg.split(" at line ").next().unwrap_or(&msg)
        ))
    })
}

/// `name` clipped for an error message (a model may send anything).
fn shown(name: &str) -> String {
    let clipped: String = name.chars().take(80).collect();
    if clipped.len() < name.len() { format!("{clipped}…") } else { clipped }
}

/// "no tool is named X; did you mean A, B?" for a name that names none of `tools`.
fn unknown(tool: &str, name: &str, tools: &[(Value, String, String, bool)]) -> Invalid {
    let docs: Vec<ToolDoc> = tools.iter().map(|(t, s, o, _)| ToolDoc::from_definition(t, s, o)).collect();
    let close: Vec<&str> = ToolIndex::new(&docs)
        .rank(&name.replace("__", " "))
        .into_iter()
        .take(SUGGESTIONS)
        .filter_map(|(i, _)| tools[i].0.get("name").and_then(Value::as_str))
        .collect();
    let hint = if close.is_empty() { String::new() } else { format!(" Close names: {}.", close.join(", ")) };
    Invalid(format!(
        "{BUILTIN_SERVER}__{tool}: no tool is named {:?}.{hint} Find tools with {BUILTIN_SERVER}__{SEARCH}.",
        shown(name)
    ))
}

impl Provider for DescribeTool {
    fn name(&self) -> &'static str {
        DESCRIBE
    }

    fn definition(&self) -> Value {
        json!({
            "name": DESCRIBE,
            "title": "Describe a tool",
            "description": "Get one tool's full definition: its parameters (inputSchema), annotations and whole \
        description. Use it after coffer__search_tools found the tool and before calling it with \
        coffer__call_tool, so you pass the right arguments.",
            "inputSchema": input_schema::<DescribeArgs>(),
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        })
    }

    fn call<'a>(&'a self, caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let a: DescribeArgs = parse(DESCRIBE, arguments)?;
            let tools = caller.list_all_tools().await;
            let Some((tool, server, _, enabled)) =
                tools.iter().find(|(t, _, _, _)| t.get("name").and_then(Value::as_str) == Some(&a.name))
            else {
                return Err(unknown(DESCRIBE, &a.name, &tools));
            };
            let state = if *enabled { "" } else { " It is disabled: a call is refused." };
            let summary = one_line(tool.get("description").and_then(Value::as_str).unwrap_or_default());
            let text = format!(
                "{} (server {server}): {summary}{state}\nCall it with {BUILTIN_SERVER}__{CALL} {{\"name\": {:?}, \"arguments\": {{…}}}}.\n{}",
                a.name, a.name, tool
            );
            Ok(Answer::ok(json!({
                "content": [{"type": "text", "text": text}],
                "structuredContent": {"tool": tool, "server": server, "enabled": enabled},
            })))
        })
    }
}

impl Provider for CallTool {
    fn name(&self) -> &'static str {
        CALL
    }

    fn definition(&self) -> Value {
        json!({
            "name": CALL,
            "title": "Call a tool",
            "description": "Call any tool available through Coffer by its exposed name with its arguments, and get \
        its answer. Use it for tools found with coffer__search_tools (check their parameters with \
        coffer__describe_tool first). A disabled tool is refused.",
            "inputSchema": input_schema::<CallArgs>(),
            "annotations": {"openWorldHint": true}
        })
    }

    fn call<'a>(&'a self, caller: &'a dyn Caller, arguments: Option<&'a str>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let a: CallArgs = parse(CALL, arguments)?;
            if a.name == format!("{BUILTIN_SERVER}__{CALL}") {
                return Err(Invalid(format!(
                    "{BUILTIN_SERVER}__{CALL}: call the tool you want directly, not {BUILTIN_SERVER}__{CALL} itself"
                )));
            }
            let args = match a.arguments {
                None | Some(Value::Null) => None,
                Some(v @ Value::Object(_)) => Some(v.to_string()),
                // Models often send the object as JSON text.
                Some(Value::String(s)) if serde_json::from_str::<Value>(&s).is_ok_and(|v| v.is_object()) => Some(s),
                Some(_) => {
                    return Err(Invalid(format!(
                        "{BUILTIN_SERVER}__{CALL}: invalid arguments: \"arguments\" must be an object of the tool's \
                         parameters, e.g. {{\"timezone\": \"Asia/Tokyo\"}}"
                    )));
                }
            };
            match caller.call_tool(&a.name, args.as_deref()).await {
                // A name that names nothing is the model's mistake, answered as
                // `coffer__describe_tool` answers it (a tool error with close names), not as the
                // routed call's protocol error: a model reads tool errors, and retries on them.
                Answer::Error(e) if e.code == INVALID_PARAMS && e.message.starts_with("Unknown tool") => {
                    Err(unknown(CALL, &a.name, &caller.list_all_tools().await))
                }
                answer => Ok(answer),
            }
        })
    }
}

/// The `params` of a `tools/call` of `name` with `arguments` (raw JSON object text; `None`:
/// no `arguments` member), for [`Caller::call_tool`].
///
/// # Panics
/// Never for an `arguments` that is valid JSON (the meta tool passes only objects).
pub fn call_params(name: &str, arguments: Option<&str>) -> Box<RawValue> {
    call_params_with_meta(name, arguments, None)
}

/// [`call_params`] with the `_meta` of the meta tool's own `tools/call` (raw JSON; `None`: no
/// `_meta` member), so that the routed call carries the caller's progress token (MCP
/// 2025-11-25, basic/utilities/progress).
///
/// # Panics
/// Never for an `arguments` and `meta` that are valid JSON (both come from parsed params).
pub fn call_params_with_meta(name: &str, arguments: Option<&str>, meta: Option<&str>) -> Box<RawValue> {
    let mut text = format!("{{\"name\":{}", serde_json::to_string(name).expect("json"));
    if let Some(a) = arguments {
        text.push_str(",\"arguments\":");
        text.push_str(a);
    }
    if let Some(m) = meta {
        text.push_str(",\"_meta\":");
        text.push_str(m);
    }
    text.push('}');
    RawValue::from_string(text).expect("json")
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A caller with a fixed list that records what `call_tool` was asked.
    struct Fixed {
        tools: Vec<(Value, String, String, bool)>,
        calls: Mutex<Vec<(String, Option<String>)>>,
    }

    impl Caller for Fixed {
        fn session_id(&self) -> &str {
            "test"
        }
        fn list_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String)>> {
            Box::pin(async move {
                self.tools.iter().filter(|t| t.3).map(|t| (t.0.clone(), t.1.clone(), t.2.clone())).collect()
            })
        }
        fn list_all_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String, bool)>> {
            Box::pin(async move { self.tools.clone() })
        }
        fn call_tool<'a>(&'a self, name: &'a str, arguments: Option<&'a str>) -> BoxFuture<'a, Answer> {
            self.calls.lock().unwrap().push((name.to_owned(), arguments.map(str::to_owned)));
            // As a session's own tools/call answers a name it does not know.
            let known = self.tools.iter().any(|t| t.0["name"] == name);
            Box::pin(async move {
                if known {
                    Answer::ok(json!({"content": [{"type": "text", "text": "called"}]}))
                } else {
                    Answer::Error(crate::mcp::answer::RpcError::new(INVALID_PARAMS, format!("Unknown tool {name:?}")))
                }
            })
        }
    }

    fn fixed() -> Fixed {
        let t = |name: &str, server: &str, on: bool| {
            let original = name.split_once("__").unwrap().1.to_owned();
            (
                json!({"name": name, "description": format!("The {original} tool.\nMore."), "inputSchema": {"type": "object", "properties": {"timezone": {"type": "string"}}}}),
                server.to_owned(),
                original,
                on,
            )
        };
        Fixed {
            tools: vec![
                t("time__get_current_time", "time", true),
                t("time__convert_time", "time", false),
                t("git__git_log", "git", true),
            ],
            calls: Mutex::default(),
        }
    }

    fn out(reply: Reply) -> Result<Value, String> {
        match reply {
            Ok(Answer::Result(r)) => Ok(serde_json::from_str(r.get()).unwrap()),
            Err(Invalid(why)) => Err(why),
            _ => panic!("a result"),
        }
    }

    fn profile(mode: ToolMode, include: &[&str]) -> Profile {
        let mut spec = coffer_api::profiles::ProfileSpec { mode, ..Default::default() };
        spec.builtins.include = include.iter().map(|s| (*s).to_owned()).collect();
        Profile { name: "p".into(), spec, version: 1, updated_at: String::new() }
    }

    fn listed() -> Vec<(Value, String, String)> {
        let mut l: Vec<(Value, String, String)> = ["recall", "remember", "search_tools"]
            .iter()
            .map(|o| (json!({"name": format!("coffer__{o}")}), BUILTIN_SERVER.to_owned(), (*o).to_owned()))
            .collect();
        l.push((json!({"name": "time__get_current_time"}), "time".into(), "get_current_time".into()));
        l
    }

    fn names(v: &[Value]) -> Vec<&str> {
        v.iter().map(|t| t["name"].as_str().unwrap()).collect()
    }

    #[test]
    fn full_mode_lists_what_it_is_given_and_lazy_lists_the_meta_tools() {
        let snap = Snapshot::default();
        let full = listing(&snap, None, listed());
        assert_eq!(
            names(&full),
            ["coffer__recall", "coffer__remember", "coffer__search_tools", "time__get_current_time"]
        );
        assert_eq!(names(&listing(&snap, Some(&profile(ToolMode::Full, &[])), listed())), names(&full));
        let lazy = listing(&snap, Some(&profile(ToolMode::Lazy, &[])), listed());
        assert_eq!(names(&lazy), ["coffer__search_tools", "coffer__describe_tool", "coffer__call_tool"]);
        assert_eq!(lazy[1]["inputSchema"]["required"], json!(["name"]));
        let kept = listing(&snap, Some(&profile(ToolMode::Lazy, &["coffer__rec*", "time__*"])), listed());
        assert_eq!(
            names(&kept),
            ["coffer__search_tools", "coffer__describe_tool", "coffer__call_tool", "coffer__recall"],
            "a built-in the profile names is kept; an upstream tool never is"
        );
        // A meta tool switched off by preference is not listed.
        let mut off = Snapshot::default();
        off.prefs.insert((BUILTIN_SERVER.to_owned(), Kind::Tool, CALL.to_owned()), false);
        let lazy = listing(&off, Some(&profile(ToolMode::Lazy, &[])), listed());
        assert_eq!(names(&lazy), ["coffer__search_tools", "coffer__describe_tool"]);
        // Without a stored profile (an in-house caller's session): full.
        assert_eq!(listing(&Snapshot::default(), None, listed()).len(), 4);
    }

    #[tokio::test]
    async fn describe_gives_the_whole_tool_and_names_close_ones_for_a_wrong_name() {
        let c = fixed();
        let v = out(DescribeTool.call(&c, Some(r#"{"name":"time__get_current_time"}"#)).await).unwrap();
        assert_eq!(v["structuredContent"]["tool"], c.tools[0].0);
        assert_eq!(v["structuredContent"]["server"], "time");
        let text = v["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with("time__get_current_time (server time): The get_current_time tool.\n"), "{text}");
        assert!(text.contains("\"inputSchema\""), "{text}");
        let off = out(DescribeTool.call(&c, Some(r#"{"name":"time__convert_time"}"#)).await).unwrap();
        assert_eq!(off["structuredContent"]["enabled"], false);
        assert!(off["content"][0]["text"].as_str().unwrap().contains("disabled"));

        let e = out(DescribeTool.call(&c, Some(r#"{"name":"time__current_time"}"#)).await).unwrap_err();
        assert!(
            e.starts_with(
                "coffer__describe_tool: no tool is named \"time__current_time\". Close names: time__get_current_time"
            ),
            "{e}"
        );
        let long = json!({"name": "x".repeat(150)}).to_string();
        let e = out(DescribeTool.call(&c, Some(&long)).await).unwrap_err();
        assert!(e.len() < 300 && e.contains('…'), "a long name is clipped: {e}");
        let e = out(DescribeTool.call(&c, Some(r#"{"nam":"x"}"#)).await).unwrap_err();
        assert!(e.contains("unknown field `nam`"), "{e}");
    }

    #[tokio::test]
    async fn call_goes_through_the_caller_s_own_tools_call() {
        let c = fixed();
        let v = out(CallTool
            .call(&c, Some(r#"{"name":"time__get_current_time","arguments":{"timezone":"Asia/Tokyo"}}"#))
            .await)
        .unwrap();
        assert_eq!(v["content"][0]["text"], "called");
        out(CallTool.call(&c, Some(r#"{"name":"git__git_log"}"#)).await).unwrap();
        out(CallTool.call(&c, Some(r#"{"name":"git__git_log","arguments":"{\"max_count\":2}"}"#)).await).unwrap();
        assert_eq!(
            *c.calls.lock().unwrap(),
            [
                ("time__get_current_time".to_owned(), Some(r#"{"timezone":"Asia/Tokyo"}"#.to_owned())),
                ("git__git_log".to_owned(), None),
                ("git__git_log".to_owned(), Some(r#"{"max_count":2}"#.to_owned())),
            ]
        );
        for (args, says) in [
            (r#"{"name":"git__git_log","arguments":[1]}"#, "\"arguments\" must be an object"),
            (r#"{"name":"git__git_log","arguments":"not json"}"#, "\"arguments\" must be an object"),
            (r#"{"name":"coffer__call_tool","arguments":{}}"#, "call the tool you want directly"),
            (r#"{"arguments":{}}"#, "missing field `name`"),
        ] {
            let e = out(CallTool.call(&c, Some(args)).await).unwrap_err();
            assert!(e.starts_with("coffer__call_tool: ") && e.contains(says), "{args}: {e}");
        }
        assert_eq!(c.calls.lock().unwrap().len(), 3, "refused calls reach nothing");

        // A name that names nothing: a tool error with close names, as describe_tool gives.
        let e = out(CallTool.call(&c, Some(r#"{"name":"time__current_time"}"#)).await).unwrap_err();
        assert!(
            e.starts_with(
                "coffer__call_tool: no tool is named \"time__current_time\". Close names: time__get_current_time"
            ) && e.ends_with("Find tools with coffer__search_tools."),
            "{e}"
        );
    }

    /// Issue 36 §2's measure (`bench/lazy-tools.sh` prints it; docs/BENCHMARKS.md quotes it):
    /// the first `tools/list` result of a session with 10 servers, full against lazy. The 10
    /// servers are the four test peers' real lists (`tool_rank/peer_tools.json`) registered
    /// under ten names (everything, fs and git three times, time once); Coffer's built-ins are
    /// the standard set with the knowledge tools and `coffer__ask`. Tokens are bytes / 4.
    #[allow(clippy::print_stdout, reason = "prints the table docs/BENCHMARKS.md quotes")]
    #[tokio::test]
    async fn ten_servers_listed_lazily_cost_under_5_percent_of_the_full_list() {
        let peers: Value = serde_json::from_str(include_str!("tool_rank/peer_tools.json")).unwrap();
        let token = secrecy::SecretString::from("00".to_owned());
        let retrieval = crate::clients::retrieval::client("127.0.0.1:9", &token).unwrap();
        let llm = crate::clients::llm::client("127.0.0.1:9", &token).unwrap();
        let registry =
            crate::mcp::builtin::ask_tool::register(crate::mcp::builtin::Registry::standard(Some(retrieval)), llm);
        let mut tools: Vec<(Value, String, String)> = registry
            .definitions()
            .into_iter()
            .map(|mut d| {
                let original = d["name"].as_str().unwrap().to_owned();
                d["name"] = json!(format!("{BUILTIN_SERVER}__{original}"));
                (d, BUILTIN_SERVER.to_owned(), original)
            })
            .collect();
        let builtins = tools.len();
        let names = [
            ("everything", "everything"),
            ("everything2", "everything"),
            ("everything3", "everything"),
            ("fs", "fs"),
            ("fs2", "fs"),
            ("fs3", "fs"),
            ("git", "git"),
            ("git2", "git"),
            ("git3", "git"),
            ("time", "time"),
        ];
        for (name, peer) in names {
            let s = peers["servers"].as_array().unwrap().iter().find(|s| s["server"] == peer).unwrap();
            for t in s["tools"].as_array().unwrap() {
                let original = t["name"].as_str().unwrap().to_owned();
                let mut exposed = t.clone();
                exposed["name"] = json!(format!("{name}__{original}"));
                tools.push((exposed, name.to_owned(), original));
            }
        }
        let upstream = tools.len() - builtins;
        let snap = Snapshot::default();
        let size = |list: Vec<Value>| (list.len(), json!({"tools": list}).to_string().len());
        let (full_n, full) = size(listing(&snap, None, tools.clone()));
        let (lazy_n, lazy) = size(listing(&snap, Some(&profile(ToolMode::Lazy, &[])), tools));
        let pct = 100.0 * lazy as f64 / full as f64;
        println!("| mode | tools listed | bytes | tokens (bytes / 4) |\n| --- | --- | --- | --- |");
        println!(
            "| full ({upstream} upstream tools of 10 servers + {builtins} built-ins) | {full_n} | {full} | {} |",
            full / 4
        );
        println!("| lazy | {lazy_n} | {lazy} | {} |", lazy / 4);
        println!("lazy / full = {pct:.1} %");
        assert_eq!(full_n, upstream + builtins);
        assert_eq!(lazy_n, 3);
        assert!(pct < 5.0, "lazy is {pct:.1} % of full");
    }

    #[test]
    fn call_params_carry_the_arguments_verbatim() {
        assert_eq!(call_params("a__b", Some(r#"{"x": 1}"#)).get(), r#"{"name":"a__b","arguments":{"x": 1}}"#);
        assert_eq!(call_params("a\"b", None).get(), r#"{"name":"a\"b"}"#);
        // The caller's `_meta` (its progress token) goes with the routed call, verbatim.
        assert_eq!(
            call_params_with_meta("a__b", None, Some(r#"{"progressToken": 7}"#)).get(),
            r#"{"name":"a__b","_meta":{"progressToken": 7}}"#
        );
        let p = call_params_with_meta("a__b", Some("{}"), Some(r#"{"progressToken":"t"}"#));
        let v: Value = serde_json::from_str(p.get()).unwrap();
        assert_eq!(v, json!({"name": "a__b", "arguments": {}, "_meta": {"progressToken": "t"}}));
    }
}
