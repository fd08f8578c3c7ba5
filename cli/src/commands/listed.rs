//! After `coffer mcp add` and `coffer mcp import`: waits until the gateway's capability catalog
//! has listed the new servers (`GET /v1/mcp/servers/{name}/catalog?wait_ms=…`), so that an MCP
//! client started right after registering is offered their tools on its first list, and says
//! what each one offers (or why it could not be started).
use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use coffer_api::servers::{CatalogPhase, CatalogState};
use serde_json::Value;

use crate::api::{ApiClient, path_segment};

/// How long the commands wait for all the servers together, unless `--no-wait`.
pub const WAIT: Duration = Duration::from_secs(60);

/// One server's catalog state after the wait.
pub struct Listed {
    pub server: String,
    /// What `--json` shows: the `GET …/catalog` body as it came, or `{"server", "state":
    /// "unknown", "error"}` when it could not be read.
    pub state: Value,
    /// The body as its type; `Err(why)` when it could not be read.
    pub catalog: Result<CatalogState, String>,
}

impl Listed {
    /// The catalog failed to start or list the server.
    pub fn failed(&self) -> bool {
        self.catalog.as_ref().is_ok_and(|c| c.status.state == CatalogPhase::Failed)
    }
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
        let read = api.send(request).await.and_then(|r| Ok((r.json()?, r.parse::<CatalogState>()?)));
        let (state, catalog) = match read {
            Ok((v, c)) => (v, Ok(c)),
            Err(e) => {
                (serde_json::json!({"server": server, "state": "unknown", "error": e.to_string()}), Err(e.to_string()))
            }
        };
        out.push(Listed { server: server.clone(), state, catalog });
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
    let name = &l.server;
    let c = match &l.catalog {
        Ok(c) => c,
        Err(e) => return format!("note: could not check {name}'s capabilities: {}", crate::output::printable(e)),
    };
    match c.status.state {
        CatalogPhase::Ready => {
            let mut parts = Vec::new();
            for (count, one, many) in [
                (c.tools, "tool", "tools"),
                (c.prompts, "prompt", "prompts"),
                (c.resources, "resource", "resources"),
                (c.resource_templates, "resource template", "resource templates"),
            ] {
                if let Some(n) = count {
                    parts.push(format!("{n} {}", if n == 1 { one } else { many }));
                }
            }
            format!("{name} offers {}: MCP clients see them now.", parts.join(", "))
        }
        CatalogPhase::Failed => format!(
            "warning: {name} is registered but could not be started and listed: {}. See `coffer mcp test {name}` and `coffer mcp logs {name}`.",
            crate::output::printable(c.status.error.as_deref().unwrap_or("no reason given"))
        ),
        CatalogPhase::Listing => format!(
            "note: {name} is still starting after {} s; MCP clients are told when its capabilities arrive.",
            limit.as_secs()
        ),
        CatalogPhase::Unknown => match &c.status.error {
            Some(e) => format!("note: could not check {name}'s capabilities: {}", crate::output::printable(e)),
            None => format!("note: {name} is not listed (it is disabled)."),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `describe` of a catalog body: `fields` over one with nothing listed.
    fn line(fields: Value) -> String {
        let mut state = json!({"server": "everything", "tools": null, "prompts": null, "resources": null,
            "resource_templates": null});
        for (k, v) in fields.as_object().unwrap() {
            state[k] = v.clone();
        }
        let catalog = Ok(serde_json::from_value(state.clone()).unwrap());
        describe(&Listed { server: "everything".into(), state, catalog }, WAIT)
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
        let unread = Listed { server: "everything".into(), state: json!({}), catalog: Err("HTTP 404".into()) };
        assert!(describe(&unread, WAIT).contains("could not check"));
    }
}
