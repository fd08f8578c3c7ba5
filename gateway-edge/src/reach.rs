//! Where a request came from, for the opt-in remote console (settings `ui.allowed_hosts`,
//! `ui.bind`, `ui.remote_api`; the values are parsed by `coffer_types::remote`).
//!
//! By default the edge answers loopback only: `Host` must be `127.0.0.1:PORT`, `localhost:PORT`
//! or `[::1]:PORT` ([`crate::middleware::host_origin`]). The owner may name extra origins in
//! `ui.allowed_hosts` (a tailnet name behind `tailscale serve`, a reverse proxy with TLS, a
//! tunnel's local port) and a second listener in `ui.bind`. A request is **remote**
//! ([`Reach::Remote`]) when any of these holds:
//! - it arrived on the `ui.bind` listener ([`BindListener`]);
//! - its `Host` is one of `ui.allowed_hosts` rather than the daemon's own loopback address;
//! - it carries `Forwarded`, `X-Forwarded-For` or `X-Forwarded-Host` (a proxy passed it on, even
//!   one that rewrote `Host` to loopback, as nginx does by default).
//!
//! A remote request may use the console (login link, session cookie and key, stream tickets:
//! the same rules as on loopback), but not `/mcp` nor the owner's or the agents' token, unless
//! `ui.remote_api` is 1: a stolen token should not work from the tailnet, and MCP clients run on
//! the machine itself. The refusal is 403 `FORBIDDEN` with `details.reason` `remote_api_off`
//! (on `/mcp`, a JSON-RPC error saying the same).
//!
//! On the `ui.bind` listener, loopback `Host` names are not accepted (a client there is not on
//! this machine, whatever it claims): only the hosts of `ui.allowed_hosts` are.
use std::sync::Arc;

use coffer_types::remote::{AllowedOrigin, parse_allowed_hosts};
use coffer_types::settings;

use crate::state::AppState;

/// Request extension: the request arrived on the `ui.bind` listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindListener;

/// Request extension set by [`crate::middleware::host_origin`] on every request it lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Loopback `Host` on the loopback listener (or the Unix socket), no forwarding headers.
    Local,
    /// From beyond loopback (see the module comment). `https`: the `Host` matched only
    /// `https://` entries of `ui.allowed_hosts`, so the browser is on a secure origin (the
    /// owner said TLS ends in front of the edge) and the session cookie is `Secure`.
    Remote { https: bool },
}

/// The remote-access settings in force (read from the policy snapshot on each request: a
/// change applies at once, no restart).
pub struct Config {
    /// `ui.allowed_hosts` (an unparsable stored value counts as empty: the daemon refuses such
    /// values, only one written by hand can be).
    pub hosts: Vec<AllowedOrigin>,
    /// `ui.remote_api` is 1.
    pub remote_api: bool,
}

/// The settings in force.
pub fn config(st: &Arc<AppState>) -> Config {
    let snap = st.gateway.shared.snapshot.current();
    let get = |s: &settings::Setting| snap.settings.get(s.key).map(String::as_str);
    let hosts = parse_allowed_hosts(&settings::UI_ALLOWED_HOSTS.text_or_default(get(&settings::UI_ALLOWED_HOSTS)))
        .unwrap_or_default();
    let remote_api = settings::UI_REMOTE_API.value_or_default(get(&settings::UI_REMOTE_API)) == 1;
    Config { hosts, remote_api }
}

/// True when `h` carries a header a proxy adds when it passes a request on.
pub fn forwarded(h: &axum::http::HeaderMap) -> bool {
    ["forwarded", "x-forwarded-for", "x-forwarded-host"].iter().any(|n| h.contains_key(*n))
}

/// The [`Reach::Remote`] of a request whose `Host` is `host`: secure when every entry that
/// matches it is `https://` (and at least one does).
pub fn remote_for(hosts: &[AllowedOrigin], host: &str) -> Reach {
    let mut matching = hosts.iter().filter(|o| o.matches_host(host)).peekable();
    let https = matching.peek().is_some() && matching.all(|o| o.https);
    Reach::Remote { https }
}
