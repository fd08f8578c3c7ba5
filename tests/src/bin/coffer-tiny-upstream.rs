//! A tiny MCP stdio server of our own for volume, fault and benchmark runs (the real peers in
//! `tests/peers/` prove correctness; this one is small, fast to start and scriptable).
//!
//! Tools: `echo {message}`, `add {a,b}`, `slow {ms}` (answers after `ms`, concurrently; with a
//! `progressToken`, sends `notifications/progress` with progress 0 as it starts),
//! `fail` (an `isError` result), `rpc_error` (a JSON-RPC error), `crash` (exits at once),
//! `big {bytes}` (a text block of that size), `stderr {lines}` (writes to stderr),
//! `twice` (answers one request twice), `changed` (emits `notifications/tools/list_changed`),
//! `sample` (asks the client for
//! `sampling/createMessage` and returns its answer), `whoami` (pid, env var `TINY_ECHO_ENV`),
//! `stderr_env` (writes `TINY_ECHO_ENV` to stderr: a leak for redaction tests to catch),
//! `flood {count, ms, bytes}` (writes notifications as fast as it can, cycling
//! `notifications/tools/list_changed`, `notifications/message` at level `info` with `bytes` of
//! data (default 1024), and `notifications/progress` for the call's `progressToken` when it has
//! one, until `count` (default 100,000) were written or `ms` (default 10,000) passed; then
//! answers `flooded N`: a server that floods a client that cannot keep up, bounded so a test
//! always ends).
//! `TINY_SERVER_NAME` replaces `tiny` as the `serverInfo.name` it reports (a hostile one in
//! terminal-escape tests). `TINY_EXTRA_TOOLS=N` adds `tool_0..N`; `TINY_REPEAT_TOOL=NAME` lists tool NAME twice. `TINY_LONG_DESCRIPTIONS=1` adds `read_multiple_files_with_metadata_and_sizes` and `search_files`, with descriptions as long as real servers write (paragraphs, a long path and URL without spaces) for layout tests. Every `tools/list` writes "tools/list received" to stderr. `--banner` prints a non-JSON line first.
//! `--start-delay-ms N` makes it take N ms before it answers anything (a slow start: an
//! interpreter loading, a server fetching its config); `--hang` never answers at all (a hung
//! server: with `--banner`, one that prints a non-JSON line and then nothing).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

type Out = Arc<Mutex<std::io::Stdout>>;

fn send(out: &Out, v: &Value) {
    let mut o = out.lock().expect("stdout");
    let _ = writeln!(o, "{v}");
    let _ = o.flush();
}

fn text(s: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": s.into()}]})
}

fn tools() -> Vec<Value> {
    let obj = |props: Value| json!({"type": "object", "properties": props});
    let mut t = vec![
        json!({"name": "echo", "description": "Echoes the message", "inputSchema": obj(json!({"message": {"type": "string"}}))}),
        json!({"name": "add", "description": "Adds two numbers", "inputSchema": obj(json!({"a": {"type": "number"}, "b": {"type": "number"}}))}),
        json!({"name": "slow", "description": "Answers after ms milliseconds", "inputSchema": obj(json!({"ms": {"type": "integer"}}))}),
        json!({"name": "fail", "description": "Returns an isError result", "inputSchema": obj(json!({}))}),
        json!({"name": "twice", "description": "Answers the same request twice", "inputSchema": obj(json!({}))}),
        json!({"name": "rpc_error", "description": "Answers with a JSON-RPC error", "inputSchema": obj(json!({}))}),
        json!({"name": "crash", "description": "Exits the process", "inputSchema": obj(json!({}))}),
        json!({"name": "big", "description": "Returns a text of the given size", "inputSchema": obj(json!({"bytes": {"type": "integer"}}))}),
        json!({"name": "stderr", "description": "Writes lines to stderr", "inputSchema": obj(json!({"lines": {"type": "integer"}}))}),
        json!({"name": "changed", "description": "Emits tools/list_changed", "inputSchema": obj(json!({}))}),
        json!({"name": "sample", "description": "Asks the client to sample", "inputSchema": obj(json!({}))}),
        json!({"name": "whoami", "description": "Pid and environment", "inputSchema": obj(json!({}))}),
        json!({"name": "stderr_env", "description": "Writes TINY_ECHO_ENV to stderr", "inputSchema": obj(json!({}))}),
        json!({"name": "flood", "description": "Floods notifications, then answers", "inputSchema": obj(json!({"count": {"type": "integer"}, "ms": {"type": "integer"}, "bytes": {"type": "integer"}}))}),
    ];
    // `TINY_REPEAT_TOOL=NAME` lists tool NAME a second time, with another schema (a server bug
    // the gateway must survive).
    if let Ok(name) = std::env::var("TINY_REPEAT_TOOL") {
        t.push(json!({"name": name, "description": "The same name again", "inputSchema": obj(json!({"other": {"type": "boolean"}}))}));
    }
    if std::env::var_os("TINY_LONG_DESCRIPTIONS").is_some() {
        t.push(json!({"name": "read_multiple_files_with_metadata_and_sizes", "description": LONG_DESCRIPTION, "inputSchema": obj(json!({}))}));
        t.push(json!({"name": "search_files", "description": "Recursively search for files and directories matching a pattern.\n\nSearches through all subdirectories from the starting path. The search is case-insensitive and matches partial names.", "inputSchema": obj(json!({}))}));
    }
    let extra: usize = std::env::var("TINY_EXTRA_TOOLS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    for i in 0..extra {
        t.push(json!({"name": format!("tool_{i}"), "description": format!("Extra tool {i}"), "inputSchema": obj(json!({}))}));
    }
    t
}

/// A description as long as a real file server's (`TINY_LONG_DESCRIPTIONS`).
const LONG_DESCRIPTION: &str = "Read the complete contents of multiple files simultaneously. This is more efficient than \
reading files one by one when you need to analyze or compare multiple files. Each file's content is returned with its \
path as a reference. Failed reads for individual files won't stop the entire operation.\n\nOnly works within allowed \
directories: /home/someone/projects/a_very_long_directory_name_without_any_spaces_at_all/src/components and \
https://example.com/docs/reference/filesystem/read_multiple_files_with_metadata_and_sizes?with=query&and=more";

fn main() {
    let out: Out = Arc::new(Mutex::new(std::io::stdout()));
    if std::env::args().any(|a| a == "--banner") {
        let mut o = out.lock().expect("stdout");
        let _ = writeln!(o, "tiny-upstream starting (this line is not JSON-RPC)");
    }
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--hang") {
        // Reads (so the writer never blocks) and never answers, until stdin closes.
        for _ in std::io::stdin().lock().lines() {}
        return;
    }
    let delay = args.iter().position(|a| a == "--start-delay-ms").and_then(|i| args.get(i + 1)?.parse::<u64>().ok());
    if let Some(ms) = delay {
        // Simulates a slow start on purpose (what this server is for), not a wait for readiness.
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    // Requests we sent to the client (sampling), by our id → the tool call id waiting on it.
    let waiting: Arc<Mutex<HashMap<u64, Value>>> = Arc::default();
    let mut next_id = 1u64;
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let Ok(msg) = serde_json::from_str::<Value>(&line) else { continue };
        let id = msg.get("id").cloned();
        let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
        let Some(method) = method else {
            // A response to our sampling request.
            if let Some(our) = id.as_ref().and_then(Value::as_u64)
                && let Some(call_id) = waiting.lock().expect("waiting").remove(&our)
            {
                let result = msg.get("result").cloned().unwrap_or_else(|| json!({"error": msg.get("error")}));
                send(&out, &json!({"jsonrpc": "2.0", "id": call_id, "result": text(format!("sampled: {result}"))}));
            }
            continue;
        };
        let Some(id) = id else {
            if method == "notifications/cancelled" {
                eprintln!("cancelled {}", msg["params"]["requestId"]);
            }
            continue;
        };
        let params = msg.get("params").cloned().unwrap_or(json!({}));
        let reply = |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result});
        match method.as_str() {
            "initialize" => send(
                &out,
                &reply(json!({
                    "protocolVersion": params.get("protocolVersion").cloned().unwrap_or(json!("2025-06-18")),
                    "capabilities": {"tools": {"listChanged": true}, "prompts": {}, "resources": {"subscribe": true}, "logging": {}},
                    "serverInfo": {"name": std::env::var("TINY_SERVER_NAME").unwrap_or_else(|_| "tiny".into()), "version": "1"}
                })),
            ),
            "ping" | "logging/setLevel" | "resources/subscribe" | "resources/unsubscribe" => {
                send(&out, &reply(json!({})))
            }
            "tools/list" => {
                eprintln!("tools/list received"); // counted by tests (upstream log)
                send(&out, &reply(json!({"tools": tools()})))
            }
            "prompts/list" => {
                send(&out, &reply(json!({"prompts": [{"name": "greet", "arguments": [{"name": "who"}]}]})))
            }
            "prompts/get" => send(
                &out,
                &reply(json!({"messages": [{"role": "user", "content": {"type": "text", "text": "hello"}}]})),
            ),
            "resources/list" => send(&out, &reply(json!({"resources": [{"uri": "tiny://doc/1", "name": "doc1"}]}))),
            "resources/read" => {
                let uri = params.get("uri").and_then(Value::as_str).unwrap_or_default();
                if uri == "tiny://doc/1" {
                    send(&out, &reply(json!({"contents": [{"uri": uri, "text": "doc one"}]})));
                } else {
                    send(
                        &out,
                        &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32002, "message": format!("Resource not found: {uri}")}}),
                    );
                }
            }
            "tools/call" => {
                let name = params.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
                let args = params.get("arguments").cloned().unwrap_or(json!({}));
                match name.as_str() {
                    "echo" => send(&out, &reply(text(args.get("message").and_then(Value::as_str).unwrap_or_default()))),
                    "add" => {
                        let s = args["a"].as_f64().unwrap_or(0.0) + args["b"].as_f64().unwrap_or(0.0);
                        send(&out, &reply(text(s.to_string())));
                    }
                    // `"wedge": true`: sleeps on the reading thread, so nothing is read or
                    // answered meanwhile (a wedged server).
                    "slow" if args["wedge"] == true => {
                        let ms = args["ms"].as_u64().unwrap_or(100);
                        eprintln!("wedged for {ms} ms");
                        std::thread::sleep(std::time::Duration::from_millis(ms));
                        send(&out, &reply(text(format!("slept {ms} ms"))));
                    }
                    "slow" => {
                        let ms = args["ms"].as_u64().unwrap_or(100);
                        eprintln!("slow {ms} started");
                        // With a progress token: one progress notification as it starts (the
                        // call is then known to be in flight).
                        if let Some(t) = params["_meta"].get("progressToken") {
                            send(
                                &out,
                                &json!({"jsonrpc": "2.0", "method": "notifications/progress",
                                "params": {"progressToken": t, "progress": 0, "message": "started"}}),
                            );
                        }
                        let out = out.clone();
                        std::thread::spawn(move || {
                            std::thread::sleep(std::time::Duration::from_millis(ms));
                            send(&out, &json!({"jsonrpc": "2.0", "id": id, "result": text(format!("slept {ms} ms"))}));
                        });
                    }
                    "twice" => {
                        send(&out, &reply(text("first")));
                        send(&out, &reply(text("second")));
                    }
                    "fail" => {
                        send(&out, &reply(json!({"content": [{"type": "text", "text": "it failed"}], "isError": true})))
                    }
                    "rpc_error" => send(
                        &out,
                        &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32603, "message": "tiny internal error", "data": {"why": "asked to"}}}),
                    ),
                    "crash" => std::process::exit(3),
                    "big" => send(&out, &reply(text("x".repeat(args["bytes"].as_u64().unwrap_or(1024) as usize)))),
                    "stderr" => {
                        let n = args["lines"].as_u64().unwrap_or(1000);
                        let mut e = std::io::stderr().lock();
                        for i in 0..n {
                            let _ = writeln!(e, "stderr line {i} {}", "y".repeat(100));
                        }
                        send(&out, &reply(text(format!("wrote {n} lines"))));
                    }
                    "stderr_env" => {
                        let v = std::env::var("TINY_ECHO_ENV").unwrap_or_default();
                        let mut e = std::io::stderr().lock();
                        let _ = writeln!(e, "TINY_ECHO_ENV={v}");
                        let _ = writeln!(e, "leaking it mid-line: [{v}] and again {v}{v}");
                        let _ = e.flush();
                        send(&out, &reply(text("wrote TINY_ECHO_ENV to stderr")));
                    }
                    "flood" => {
                        let count = args["count"].as_u64().unwrap_or(100_000);
                        let limit = std::time::Duration::from_millis(args["ms"].as_u64().unwrap_or(10_000));
                        let data = "z".repeat(args["bytes"].as_u64().unwrap_or(1024) as usize);
                        let token = params["_meta"].get("progressToken").cloned();
                        let out = out.clone();
                        // Its own thread: the server keeps answering other requests meanwhile.
                        std::thread::spawn(move || {
                            let started = std::time::Instant::now();
                            let mut sent = 0u64;
                            while sent < count && started.elapsed() < limit {
                                let msg = match (sent % 3, &token) {
                                    (0, _) => json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
                                    (1, _) | (_, None) => json!({"jsonrpc": "2.0", "method": "notifications/message",
                                        "params": {"level": "info", "logger": "tiny", "data": data}}),
                                    (_, Some(t)) => json!({"jsonrpc": "2.0", "method": "notifications/progress",
                                        "params": {"progressToken": t, "progress": sent, "message": data}}),
                                };
                                send(&out, &msg);
                                sent += 1;
                            }
                            eprintln!("flooded {sent}");
                            send(&out, &json!({"jsonrpc": "2.0", "id": id, "result": text(format!("flooded {sent}"))}));
                        });
                    }
                    "changed" => {
                        send(&out, &json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}));
                        send(&out, &reply(text("changed")));
                    }
                    "sample" => {
                        let our = next_id;
                        next_id += 1;
                        waiting.lock().expect("waiting").insert(our, id.clone());
                        send(
                            &out,
                            &json!({"jsonrpc": "2.0", "id": our, "method": "sampling/createMessage",
                                "params": {"messages": [{"role": "user", "content": {"type": "text", "text": "say hi"}}], "maxTokens": 10}}),
                        );
                    }
                    "whoami" => send(
                        &out,
                        &reply(text(
                            json!({"pid": std::process::id(), "env": std::env::var("TINY_ECHO_ENV").ok(),
                            "coffer_vars": std::env::vars().filter(|(k, _)| k.starts_with("COFFER_")).count()})
                            .to_string(),
                        )),
                    ),
                    n if n.starts_with("tool_") => send(&out, &reply(text(n.to_owned()))),
                    other => send(
                        &out,
                        &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32602, "message": format!("Unknown tool: {other}")}}),
                    ),
                }
            }
            other => send(
                &out,
                &json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": format!("Method not found: {other}")}}),
            ),
        }
    }
}
