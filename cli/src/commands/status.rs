//! `coffer status`: the daemon, its services and upstreams from `GET /v1/status`, and the
//! channels. Starts the daemon if needed; `--json` prints the REST body with a `channels` array
//! added (`GET /v1/channels`' items).
use clap::Args;
use coffer_api::daemon::{SandboxStatus, ServiceStatus, Status};
use coffer_api::servers::{SandboxState, StartOutcome, UpstreamState, UpstreamStatus};
use coffer_api::sync::SyncStatus;
use serde_json::Value;

use crate::api::ApiClient;
use crate::context::Ctx;
use crate::error::CliError;
use crate::output::{self, cell, format_duration, render_table, text_cell, yes_no};

/// Longest `LAST ERROR` shown in the table; `--json` has the full text.
const LAST_ERROR_WIDTH: usize = 80;

#[derive(Debug, Args)]
pub struct StatusArgs {}

/// Connects (starting the daemon if needed) and prints its status.
///
/// # Errors
/// Exit 5 when the daemon cannot be reached or started; API errors otherwise.
pub async fn run(ctx: &Ctx, _args: StatusArgs) -> Result<(), CliError> {
    let api = ctx.connect().await?;
    show(ctx, &api).await
}

/// Fetches `/v1/status` from `api` and prints it (shared with `coffer daemon status`).
///
/// # Errors
/// API and stdout errors.
pub async fn show(ctx: &Ctx, api: &ApiClient) -> Result<(), CliError> {
    let resp = api.get_raw("/v1/status").await?;
    if ctx.json {
        // The REST body plus `channels` (each as `GET /v1/channels` lists it, adapter state
        // included), as the human output has their lines; a store that does not answer them
        // leaves the key out.
        let mut body = resp.json()?;
        if let Ok(c) = api.get("/v1/channels").await
            && let Some(obj) = body.as_object_mut()
        {
            obj.insert("channels".into(), c["items"].clone());
        }
        return output::print_json(&body);
    }
    let status: Status = resp.parse()?;
    output::print(&render_status(&status))?;
    if let Some(line) = status.sync.as_ref().and_then(sync_line) {
        output::println(&format!("\n{line}"))?;
    }
    // One line on the internal LLM connection; a store that does not answer leaves it out (the
    // services table already says so).
    if let Ok(c) = api.get_as::<coffer_api::Page<coffer_api::llm::LlmConnection>>("/v1/llm/connections").await {
        output::println(&format!("\n{}", crate::commands::llm::status_line(&c.items)))?;
    }
    // The channels, one line each (none: nothing printed).
    if let Ok(c) = api.get_as::<coffer_api::Page<coffer_api::channels::Channel>>("/v1/channels").await
        && !c.items.is_empty()
    {
        output::print(&format!("\n{}", crate::commands::channel::status_lines(&c.items)))?;
    }
    Ok(())
}

/// The sync line of `coffer status` (`None` while sync is not set up): the remote, the last
/// sync, the worker, and every credential to set here.
pub fn sync_line(s: &SyncStatus) -> Option<String> {
    if !s.initialized {
        return None;
    }
    let last = s.last_sync_ms.map(coffer_runtime::rfc3339_from_unix_ms).unwrap_or_else(|| "never".into());
    let mut line = format!("Sync: {} — last {last}, worker {}", s.remote, s.worker.word());
    if let Some(e) = &s.last_error {
        line.push_str(&format!("\n  last sync failed: {e}"));
    }
    for name in &s.missing_credentials {
        line.push_str(&format!("\n  credential {name}: set this credential here (coffer credentials set {name})"));
    }
    let n = s.conflicts.len();
    if n > 0 {
        line.push_str(&format!("\n  {n} conflict file(s) to look at: coffer sync status"));
    }
    Some(line)
}

/// Human status: a header line, the services table, then the upstreams table if any.
pub fn render_status(status: &Status) -> String {
    let d = &status.daemon;
    let uptime = output::seconds_since(&d.started_at).map(format_duration).unwrap_or_else(|| "-".into());
    let mut out = format!(
        "Coffer daemon: pid {}, port {}, version {}, up {}\n\n",
        d.pid,
        d.port,
        text_cell(&d.version, 40),
        uptime
    );
    out.push_str(&sandbox_line(&status.sandbox));
    out.push_str("\n\n");
    out.push_str(&render_services(&status.services));
    if !status.upstreams.is_empty() {
        out.push_str("\nUpstreams:\n");
        out.push_str(&render_upstreams(&status.upstreams));
    }
    if !status.sessions.is_empty() {
        out.push_str("\nMCP sessions:\n");
        out.push_str(&render_sessions(&status.sessions));
    }
    out
}

/// The MCP sessions table of `GET /v1/status`: SESSION CLIENT PROFILE PROTOCOL IDLE.
pub fn render_sessions(sessions: &[coffer_api::daemon::McpSessionStatus]) -> String {
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            let client = format!("{} {}", s.client_name.trim(), s.client_version.trim());
            vec![
                text_cell(&s.id, 8),
                if client.trim().is_empty() { "-".into() } else { text_cell(client.trim(), 40) },
                text_cell(&s.profile, 32),
                text_cell(&s.protocol_version, 12),
                format_duration(s.idle_s),
            ]
        })
        .collect();
    render_table(&["SESSION", "CLIENT", "PROFILE", "PROTOCOL", "IDLE"], &rows)
}

/// `Sandbox: …` from `GET /v1/status` `sandbox`: the kernel's support, and each agent whose
/// sandbox is off (upstreams say theirs in the SANDBOX column).
fn sandbox_line(s: &SandboxStatus) -> String {
    let mut line = format!("Sandbox: {}", text_cell(&s.summary, 200));
    let off: Vec<&str> = [("claude_code", s.agents.claude_code), ("codex", s.agents.codex)]
        .into_iter()
        .filter(|(_, v)| *v == SandboxState::Off)
        .map(|(k, _)| k)
        .collect();
    if !off.is_empty() {
        line.push_str(&format!("; OFF for agent(s) {} (chat.*_sandbox = 0)", off.join(", ")));
    }
    line
}

/// A sandbox state's word.
fn sandbox_word(s: SandboxState) -> &'static str {
    match s {
        SandboxState::On => "on",
        SandboxState::Off => "off",
        SandboxState::Unavailable => "unavailable",
    }
}

/// An upstream state's word.
fn state_word(s: UpstreamState) -> &'static str {
    match s {
        UpstreamState::Ok => "ok",
        UpstreamState::Idle => "idle",
        UpstreamState::Unhealthy => "unhealthy",
        UpstreamState::Disabled => "disabled",
    }
}

/// The upstreams table of `GET /v1/status`: NAME STATE ENABLED TRANSPORT RUNNING (sessions it
/// runs in) LAST START (outcome and age) LAST ERROR (the standing one), then a note per server
/// whose list named something twice.
pub fn render_upstreams(ups: &[UpstreamStatus]) -> String {
    let rows: Vec<Vec<String>> = ups
        .iter()
        .map(|u| {
            let outcome = u.last_start.map(|o| match o {
                StartOutcome::Ok => "ok",
                StartOutcome::Failed => "failed",
            });
            let last_start = match (outcome, u.last_start_at.as_deref().and_then(output::seconds_since)) {
                (Some(outcome), Some(age)) => format!("{outcome} {} ago", format_duration(age)),
                (Some(outcome), None) => outcome.to_owned(),
                (None, _) => "-".into(),
            };
            vec![
                text_cell(&u.name, 40),
                state_word(u.state).to_owned(),
                yes_no(u.enabled).to_owned(),
                u.transport.word().to_owned(),
                u.running.to_string(),
                u.sandbox.map_or("-", sandbox_word).to_owned(),
                last_start,
                u.last_error.as_deref().map_or_else(|| "-".into(), |e| text_cell(e, LAST_ERROR_WIDTH)),
            ]
        })
        .collect();
    let mut out = render_table(
        &["NAME", "STATE", "ENABLED", "TRANSPORT", "RUNNING", "SANDBOX", "LAST START", "LAST ERROR"],
        &rows,
    );
    for u in ups {
        if let Some(a) = u.auth.as_ref().filter(|a| a.state == coffer_api::servers::AuthState::NeedsSignIn) {
            out.push_str(&format!(
                "note: {} needs sign-in: run `{}`\n",
                text_cell(&u.name, 40),
                a.command.clone().unwrap_or_else(|| format!("coffer mcp auth {}", u.name))
            ));
        }
        if !u.duplicates.is_empty() {
            out.push_str(&format!(
                "note: {} listed {} more than once; only the first of each is offered\n",
                text_cell(&u.name, 40),
                u.duplicates.join(", ")
            ));
        }
    }
    out
}

/// The services table: NAME PID STATE UPTIME RESTARTS LAST ERROR.
pub fn render_services(services: &[ServiceStatus]) -> String {
    let rows: Vec<Vec<String>> = services
        .iter()
        .map(|s| {
            let pid = if s.pid == 0 { "-".into() } else { s.pid.to_string() };
            let uptime = if s.state == "healthy" { format_duration(s.uptime_s) } else { "-".into() };
            vec![
                text_cell(&s.name, 40),
                pid,
                text_cell(&s.state, 20),
                uptime,
                s.restarts.to_string(),
                s.last_error.as_deref().map_or_else(|| "-".into(), |e| text_cell(e, LAST_ERROR_WIDTH)),
            ]
        })
        .collect();
    render_table(&["NAME", "PID", "STATE", "UPTIME", "RESTARTS", "LAST ERROR"], &rows)
}

/// A table of objects whose fields are not fixed yet (upstreams): one column per key seen in any
/// item — `name`, `state`, `pid`, `uptime_s`, `restarts` first, then the rest alphabetically,
/// `last_error` last; `*_s` durations formatted, booleans (`enabled`) as yes/no like every other
/// table.
pub fn render_generic(items: &[Value]) -> String {
    const FIRST: [&str; 5] = ["name", "state", "pid", "uptime_s", "restarts"];
    const LAST: &str = "last_error";
    let mut seen = std::collections::BTreeSet::new();
    for item in items {
        if let Some(obj) = item.as_object() {
            seen.extend(obj.keys().map(String::as_str));
        }
    }
    let mut keys: Vec<&str> = FIRST.iter().copied().filter(|k| seen.contains(k)).collect();
    keys.extend(seen.iter().copied().filter(|k| !FIRST.contains(k) && *k != LAST));
    if seen.contains(LAST) {
        keys.push(LAST);
    }
    let headers: Vec<String> = keys.iter().map(|k| k.trim_end_matches("_s").replace('_', " ").to_uppercase()).collect();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|i| {
            keys.iter()
                .map(|k| match i.get(*k) {
                    Some(Value::Number(n)) if k.ends_with("_s") => {
                        n.as_u64().map(format_duration).unwrap_or_else(|| n.to_string())
                    }
                    Some(Value::Bool(b)) => yes_no(*b).to_owned(),
                    v => cell(v, LAST_ERROR_WIDTH),
                })
                .collect()
        })
        .collect();
    let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    render_table(&header_refs, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sessions_show_their_client_and_profile() {
        let sessions: Vec<coffer_api::daemon::McpSessionStatus> = serde_json::from_value(json!([
            {"id":"a1b2c3d4","client_name":"claude-code","client_version":"2.1.0","profile":"work","protocol_version":"2025-11-25","idle_s":4},
            {"id":"e5f6a7b8","client_name":"","client_version":"","profile":"default","protocol_version":"2025-06-18","idle_s":75},
        ]))
        .unwrap();
        let t = render_sessions(&sessions);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["SESSION", "CLIENT", "PROFILE", "PROTOCOL", "IDLE"]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["a1b2c3d4", "claude-code", "2.1.0", "work", "2025-11-25", &format_duration(4)]
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["e5f6a7b8", "-", "default", "2025-06-18", &format_duration(75)]
        );
    }

    #[test]
    fn services_table() {
        let services: Vec<ServiceStatus> = serde_json::from_value(json!([
            {"name":"store","pid":1240,"state":"healthy","uptime_s":192,"restarts":0,"last_error":null,"on_demand":false},
            {"name":"retrieval","pid":0,"state":"failed","uptime_s":0,"restarts":5,"last_error":"exited with\nstatus 1","on_demand":false},
            {"name":"chat","pid":1250,"state":"restarting","uptime_s":9,"restarts":1,"last_error":"","on_demand":false},
        ]))
        .unwrap();
        assert_eq!(
            render_services(&services),
            "NAME       PID   STATE       UPTIME  RESTARTS  LAST ERROR\n\
             store      1240  healthy     3m12s   0         -\n\
             retrieval  -     failed      -       5         exited with status 1\n\
             chat       1250  restarting  -       1         -\n"
        );
    }

    #[test]
    fn status_without_upstreams_has_no_upstream_table() {
        let s: Status = serde_json::from_value(json!({
            "daemon": {"pid": 7, "port": 8000, "version": "0.1.0", "started_at": "not a time"},
            "services": [], "upstreams": [],
            "sandbox": {"landlock_abi": null, "summary": "no Landlock", "agents": {"claude_code": "unavailable", "codex": "off"}},
            "sync": null,
        }))
        .unwrap();
        let out = render_status(&s);
        assert!(out.starts_with("Coffer daemon: pid 7, port 8000, version 0.1.0, up -\n"), "{out}");
        assert!(!out.contains("Upstreams"));
        assert!(out.contains("Sandbox: no Landlock; OFF for agent(s) codex (chat.*_sandbox = 0)\n"), "{out}");
    }

    #[test]
    fn upstreams_render_whatever_fields_they_have() {
        let ups = vec![
            json!({"state":"running","name":"github","uptime_s":75,"session":"ab12"}),
            json!({"name":"fs","state":"stopped","last_error":"boom"}),
        ];
        assert_eq!(
            render_generic(&ups),
            "NAME    STATE    UPTIME  SESSION  LAST ERROR\n\
             github  running  1m15s   ab12     -\n\
             fs      stopped  -       -        boom\n"
        );
    }

    #[test]
    fn upstreams_show_their_last_start_standing_error_and_duplicates() {
        let ups: Vec<UpstreamStatus> = serde_json::from_value(json!([
            {"name": "everything", "enabled": true, "transport": "stdio", "state": "ok", "running": 2, "sandbox": "on",
             "last_start": "ok", "last_start_at": "not a time", "last_error": null, "last_error_at": null, "duplicates": [],
             "catalog": {"state": "ready"}},
            {"name": "keyed", "enabled": true, "transport": "stdio", "state": "unhealthy", "running": 0, "sandbox": "on",
             "last_start": "failed", "last_start_at": null,
             "last_error": "upstream keyed could not be started: exited with status 3 during initialize; its last stderr lines: fatal: missing API key FOO_KEY",
             "last_error_at": null, "duplicates": ["tools/same"], "catalog": {"state": "failed", "error": "x"}},
            {"name": "remote", "enabled": false, "transport": "http", "state": "disabled", "running": 0, "sandbox": null,
             "last_start": null, "last_start_at": null, "last_error": null, "last_error_at": null, "duplicates": [],
             "catalog": {"state": "unknown"}},
        ]))
        .unwrap();
        let t = render_upstreams(&ups);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["NAME", "STATE", "ENABLED", "TRANSPORT", "RUNNING", "SANDBOX", "LAST", "START", "LAST", "ERROR"]
        );
        assert!(lines[1].starts_with("everything  ok         yes      stdio      2        on       ok "), "{t}");
        assert!(lines[2].contains("failed") && lines[2].contains("exited with status 3"), "{t}");
        assert!(lines[3].starts_with("remote      disabled   no       http       0        -        -"), "{t}");
        assert_eq!(lines[4], "note: keyed listed tools/same more than once; only the first of each is offered");
    }

    #[test]
    fn upstream_enabled_is_yes_or_no() {
        // The shape `GET /v1/status` gives upstreams.
        let ups = vec![
            json!({"name": "everything", "enabled": true, "transport": "stdio", "state": "ok", "running": 1,
                   "last_error": null, "last_error_at": null}),
            json!({"name": "remote", "enabled": false, "transport": "http", "state": "disabled", "running": 0,
                   "last_error": null, "last_error_at": null}),
        ];
        let t = render_generic(&ups);
        assert_eq!(
            t,
            "NAME        STATE     ENABLED  LAST ERROR AT  RUNNING  TRANSPORT  LAST ERROR\n\
             everything  ok        yes      -              1        stdio      -\n\
             remote      disabled  no       -              0        http       -\n"
        );
        assert!(!t.contains("true") && !t.contains("false"), "{t}");
    }
}
