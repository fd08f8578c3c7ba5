//! After `coffer mcp add` and `coffer mcp import`: waits until the gateway's capability catalog
//! has listed the new servers (`GET /v1/mcp/servers/{name}/catalog?wait_ms=…`), so that an MCP
//! client started right after registering is offered their tools on its first list, and says
//! what each one offers (or why it could not be started).
use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::api::{ApiClient, path_segment};

/// How long the commands wait for all the servers together, unless `--no-wait`.
pub const WAIT: Duration = Duration::from_secs(60);

/// One server's catalog state after the wait: the `GET …/catalog` body.
pub struct Listed {
    pub server: String,
    pub state: Value,
}

/// Waits (all of them within `limit` together) until the catalog has listed each of `servers`
/// or failed to, with a spinner on stderr when it is a terminal. A server whose state cannot be
/// read (an older daemon, or the request failed) gets `{"state": "unknown", "error": …}`: the
/// registration itself stands either way.
pub async fn wait(api: &ApiClient, servers: &[String], limit: Duration) -> Vec<Listed> {
    let started = Instant::now();
    let spinner = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    });
    let mut out = Vec::with_capacity(servers.len());
    for (i, server) in servers.iter().enumerate() {
        if let Some(bar) = &spinner {
            let of = if servers.len() > 1 { format!(" ({}/{})", i + 1, servers.len()) } else { String::new() };
            bar.set_message(format!("Starting {server} and listing its capabilities{of}…"));
        }
        let left = limit.saturating_sub(started.elapsed()).as_millis().max(1);
        let path = format!("/v1/mcp/servers/{}/catalog?wait_ms={left}", path_segment(server));
        let request = api.request(reqwest::Method::GET, &path).timeout(limit + Duration::from_secs(10));
        let state = match api.send(request).await.and_then(|r| r.json()) {
            Ok(v) => v,
            Err(e) => serde_json::json!({"server": server, "state": "unknown", "error": e.to_string()}),
        };
        out.push(Listed { server: server.clone(), state });
    }
    if let Some(bar) = spinner {
        bar.finish_and_clear();
    }
    out
}

/// Reports `l` after a registration or an edit: what it offers is appended to `out` (stdout);
/// a warning or note (it failed, it is still starting) goes to stderr at once.
pub fn report(out: &mut String, l: &Listed) {
    let line = describe(l, WAIT);
    if line.starts_with("warning:") || line.starts_with("note:") {
        crate::eprintln_printable!("{line}");
    } else {
        out.push_str(&line);
        out.push('\n');
    }
}

/// One line about `l` for the terminal: what it offers, that it failed (and how to see why), or
/// that it is still starting after `limit`.
pub fn describe(l: &Listed, limit: Duration) -> String {
    let s = &l.state;
    let name = &l.server;
    match s["state"].as_str() {
        Some("ready") => {
            let mut parts = Vec::new();
            for (key, one, many) in [
                ("tools", "tool", "tools"),
                ("prompts", "prompt", "prompts"),
                ("resources", "resource", "resources"),
                ("resource_templates", "resource template", "resource templates"),
            ] {
                if let Some(n) = s[key].as_u64() {
                    parts.push(format!("{n} {}", if n == 1 { one } else { many }));
                }
            }
            format!("{name} offers {}: MCP clients see them now.", parts.join(", "))
        }
        Some("failed") => format!(
            "warning: {name} is registered but could not be started and listed: {}. See `coffer mcp test {name}` and `coffer mcp logs {name}`.",
            crate::output::printable(s["error"].as_str().unwrap_or("no reason given"))
        ),
        Some("listing") => format!(
            "note: {name} is still starting after {} s; MCP clients are told when its capabilities arrive.",
            limit.as_secs()
        ),
        _ => match s["error"].as_str() {
            Some(e) => format!("note: could not check {name}'s capabilities: {}", crate::output::printable(e)),
            None => format!("note: {name} is not listed (it is disabled)."),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(state: Value) -> String {
        describe(&Listed { server: "everything".into(), state }, WAIT)
    }

    #[test]
    fn each_state_reads_as_a_sentence() {
        let ready = json!({"state": "ready", "tools": 13, "prompts": 1, "resources": 0, "resource_templates": 2});
        assert_eq!(
            line(ready),
            "everything offers 13 tools, 1 prompt, 0 resources, 2 resource templates: MCP clients see them now."
        );
        let failed = line(json!({"state": "failed", "error": "exited with status 1\u{1b}]52;c;x\u{7}"}));
        assert!(failed.starts_with("warning: everything is registered but could not be started"), "{failed}");
        assert!(failed.contains("coffer mcp logs everything") && !failed.contains('\u{1b}'), "{failed}");
        assert!(line(json!({"state": "listing"})).contains("still starting after 60 s"));
        assert!(line(json!({"state": "unknown"})).contains("disabled"));
        assert!(line(json!({"state": "unknown", "error": "HTTP 404"})).contains("could not check"));
    }
}
