//! Coffer's own `coffer__*` tools, served in every session's `tools/list` and subject to the
//! same policy and invocation log as upstream tools.
use serde_json::{Value, json};

use super::jsonrpc::INVALID_PARAMS;
use super::session::{Answer, ListKind, RpcError, Session};

/// Tool definitions with their original (unprefixed) names.
pub fn definitions() -> Vec<Value> {
    vec![json!({
        "name": "search_tools",
        "title": "Search tools",
        "description": "Find tools available through Coffer by words in their name or description. \
    Returns the best matches with their exposed names, so you can call them directly.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Words to look for, e.g. \"read file\"."},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50, "description": "Most results (default 10)."}
            },
            "required": ["query"]
        },
        "annotations": {"readOnlyHint": true, "openWorldHint": false}
    })]
}

/// Calls built-in tool `name` with raw JSON `args`.
pub async fn call(session: &std::sync::Arc<Session>, name: &str, args: Option<&str>) -> Answer {
    match name {
        "search_tools" => search_tools(session, args).await,
        other => Answer::Error(RpcError::new(INVALID_PARAMS, format!("Unknown tool \"coffer__{other}\""))),
    }
}

async fn search_tools(session: &std::sync::Arc<Session>, args: Option<&str>) -> Answer {
    let args: Value = args.and_then(|a| serde_json::from_str(a).ok()).unwrap_or_else(|| json!({}));
    let Some(query) = args.get("query").and_then(Value::as_str) else {
        return tool_error("search_tools needs a string argument \"query\"");
    };
    let limit = args.get("limit").and_then(Value::as_u64).unwrap_or(10).clamp(1, 50) as usize;
    let words: Vec<String> =
        query.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect();
    if words.is_empty() {
        return tool_error("query has no words to search for");
    }
    let tools = session.list(ListKind::Tools).await;
    let mut scored: Vec<(u32, &Value, &str)> = tools
        .iter()
        .filter(|(_, server, _)| server != "coffer")
        .filter_map(|(tool, server, _)| {
            let name = tool.get("name").and_then(Value::as_str).unwrap_or_default().to_lowercase();
            let title = tool.get("title").and_then(Value::as_str).unwrap_or_default().to_lowercase();
            let desc = tool.get("description").and_then(Value::as_str).unwrap_or_default().to_lowercase();
            let score: u32 = words
                .iter()
                .map(|w| {
                    3 * u32::from(name.contains(w.as_str()))
                        + 2 * u32::from(title.contains(w.as_str()))
                        + u32::from(desc.contains(w.as_str()))
                })
                .sum();
            (score > 0).then_some((score, tool, server.as_str()))
        })
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1["name"].as_str().cmp(&b.1["name"].as_str())));
    scored.truncate(limit);
    let matches: Vec<Value> = scored
        .iter()
        .map(|(score, t, server)| json!({"name": t["name"], "server": server, "description": t.get("description").cloned().unwrap_or(Value::Null), "score": score}))
        .collect();
    let text = if matches.is_empty() {
        format!("No tools match {query:?}.")
    } else {
        matches
            .iter()
            .map(|m| {
                format!(
                    "{} — {}",
                    m["name"].as_str().unwrap_or_default(),
                    m["description"].as_str().unwrap_or("").lines().next().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    Answer::Result(
        serde_json::value::RawValue::from_string(
            json!({"content": [{"type": "text", "text": text}], "structuredContent": {"matches": matches}}).to_string(),
        )
        .expect("json"),
    )
}

fn tool_error(msg: &str) -> Answer {
    Answer::Result(
        serde_json::value::RawValue::from_string(
            json!({"content": [{"type": "text", "text": msg}], "isError": true}).to_string(),
        )
        .expect("json"),
    )
}
