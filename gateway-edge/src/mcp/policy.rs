//! Policy: resolving an exposed name or resource URI to its target `(server, original)` and
//! admitting it, from the in-memory [`Snapshot`] alone (never a store round trip), or refusing
//! it with a typed [`Refusal`]. A disabled server or capability is refused before any upstream
//! is contacted, also in a session that has not listed yet: an exposed name that was not
//! rewritten is `<server>__<original>`, which the policy names; only a rewritten name needs the
//! session's list (and so its upstream) to be learnt.
use coffer_types::BUILTIN_SERVER;
use serde_json::json;

use crate::mcp::answer::RpcError;
use crate::mcp::catalog::{Catalog, ListKind, split_uri};
use crate::mcp::jsonrpc::{INVALID_PARAMS, TOOL_DISABLED};
use crate::mcp::naming;
use crate::mcp::session::pool::Pool;
use crate::snapshot::{Kind, Snapshot};

/// What a refused request named, as errors word it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Noun {
    Tool,
    Prompt,
    Resource,
}

impl Noun {
    /// The noun for a name of `kind` (tools, else prompts: only they have exposed names).
    pub fn of(kind: ListKind) -> Self {
        if kind == ListKind::Tools { Noun::Tool } else { Noun::Prompt }
    }
    /// `tool`, `prompt` or `resource` (also `data.kind` of `TOOL_DISABLED`).
    pub fn as_str(self) -> &'static str {
        match self {
            Noun::Tool => "tool",
            Noun::Prompt => "prompt",
            Noun::Resource => "resource",
        }
    }

    /// Capitalized, to begin a message (`Tool`).
    pub fn title(self) -> &'static str {
        match self {
            Noun::Tool => "Tool",
            Noun::Prompt => "Prompt",
            Noun::Resource => "Resource",
        }
    }
}

impl std::fmt::Display for Noun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a `TOOL_DISABLED` refusal is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The capability has an `enabled = false` preference.
    Capability,
    /// Its whole server is disabled.
    Server,
}

/// Why a request's target is refused. Every variant is -32602 (unknown) except
/// [`Refusal::Disabled`], -32000 `TOOL_DISABLED`; [`RpcError::from`] is the one conversion.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("Unknown {noun} \"{start}…\" ({bytes} bytes): exposed names have at most {max} characters", max = naming::ABSOLUTE_MAX_LEN)]
    NameTooLong { noun: Noun, start: String, bytes: usize },
    #[error("Unknown {noun} {exposed:?}: exposed names look like <server>__<name>")]
    NotExposed { noun: Noun, exposed: String },
    #[error("Unknown server {server:?} in {noun} {exposed:?}")]
    UnknownServer { noun: Noun, server: String, exposed: String },
    #[error("Unknown server {server:?} in {noun} {exposed:?}: it was removed")]
    RemovedServer { noun: Noun, server: String, exposed: String },
    #[error("Unknown {noun} {exposed:?}")]
    UnknownName { noun: Noun, exposed: String },
    #[error("Unknown resource {uri:?}: resource URIs look like coffer://<server>/<uri>")]
    NotExposedUri { uri: String },
    #[error("Unknown server {server:?} in resource URI")]
    UnknownUriServer { server: String },
    #[error("{} {exposed} is disabled", .noun.title())]
    Disabled { noun: Noun, exposed: String, server: String, scope: Scope },
}

impl From<Refusal> for RpcError {
    fn from(r: Refusal) -> Self {
        let message = r.to_string();
        match r {
            Refusal::Disabled { noun, exposed, server, scope } => {
                let scope = match scope {
                    Scope::Server => "server",
                    Scope::Capability => noun.as_str(),
                };
                RpcError::new(TOOL_DISABLED, message).with_data(
                    json!({"code": "TOOL_DISABLED", "server": server, "tool": exposed, "kind": noun.as_str(), "scope": scope}),
                )
            }
            _ => RpcError::new(INVALID_PARAMS, message),
        }
    }
}

/// The policy decisions over one snapshot.
pub struct Policy<'a>(pub &'a Snapshot);

impl Policy<'_> {
    /// The refusal for disabled `exposed` of `server`, scoped to the server when the server
    /// itself is off.
    fn disabled(&self, noun: Noun, exposed: &str, server: &str) -> Refusal {
        let server_off = server != BUILTIN_SERVER && !self.0.servers.get(server).is_some_and(|s| s.enabled);
        Refusal::Disabled {
            noun,
            exposed: exposed.to_owned(),
            server: server.to_owned(),
            scope: if server_off { Scope::Server } else { Scope::Capability },
        }
    }

    /// Checks an exposed name the session has not learnt yet, before any upstream contact:
    /// returns its server (the part before the first `__`) when that server may be asked for
    /// its names.
    ///
    /// # Errors
    /// [`Refusal::NotExposed`], [`Refusal::UnknownServer`], or [`Refusal::Disabled`] for a
    /// disabled server, or for a disabled capability whose name was not rewritten.
    pub fn admit_unlearnt<'e>(&self, kind: ListKind, exposed: &'e str) -> Result<&'e str, Refusal> {
        let noun = Noun::of(kind);
        let Some((server, original)) = naming::split(exposed) else {
            return Err(Refusal::NotExposed { noun, exposed: exposed.to_owned() });
        };
        if server != BUILTIN_SERVER {
            match self.0.servers.get(server) {
                None => {
                    return Err(Refusal::UnknownServer {
                        noun,
                        server: server.to_owned(),
                        exposed: exposed.to_owned(),
                    });
                }
                Some(s) if !s.enabled => return Err(self.disabled(noun, exposed, server)),
                Some(_) => {}
            }
        }
        if !self.0.capability_enabled(server, kind.kind(), original) {
            return Err(self.disabled(noun, exposed, server));
        }
        Ok(server)
    }

    /// Admits `exposed`, resolved to `(server, original)`: its server is still registered (or
    /// is the built-in one) and the capability is enabled.
    ///
    /// # Errors
    /// [`Refusal::RemovedServer`] or [`Refusal::Disabled`].
    pub fn admit(&self, kind: ListKind, exposed: &str, server: &str, original: &str) -> Result<(), Refusal> {
        let noun = Noun::of(kind);
        if server != BUILTIN_SERVER && !self.0.servers.contains_key(server) {
            return Err(Refusal::RemovedServer { noun, server: server.to_owned(), exposed: exposed.to_owned() });
        }
        if !self.0.capability_enabled(server, kind.kind(), original) {
            return Err(self.disabled(noun, exposed, server));
        }
        Ok(())
    }

    /// Admits resource `original` of `server`, requested as `uri`.
    ///
    /// # Errors
    /// [`Refusal::UnknownUriServer`] or [`Refusal::Disabled`].
    pub fn admit_resource(&self, uri: &str, server: &str, original: &str) -> Result<(), Refusal> {
        match self.0.servers.get(server) {
            None => Err(Refusal::UnknownUriServer { server: truncate(server, 100) }),
            Some(s) if !s.enabled => Err(self.disabled(Noun::Resource, uri, server)),
            Some(_) if !self.0.capability_enabled(server, Kind::Resource, original) => {
                Err(self.disabled(Noun::Resource, uri, server))
            }
            Some(_) => Ok(()),
        }
    }
}

/// Resolves an exposed tool or prompt name to `(server, original)` and checks policy — all
/// before any upstream is contacted, unless the name is unknown to the session's `catalog` and
/// its server is enabled (then that server's list is fetched once, through `pool`, to learn it).
///
/// # Errors
/// A [`Refusal`] (-32602 for an unknown name or server; -32000 `TOOL_DISABLED`); -32001 when
/// the server had to be listed and could not be.
pub async fn resolve(
    snap: &Snapshot,
    catalog: &Catalog,
    pool: &Pool,
    kind: ListKind,
    exposed: &str,
) -> Result<(String, String), RpcError> {
    let noun = Noun::of(kind);
    if exposed.chars().count() > naming::ABSOLUTE_MAX_LEN {
        // No exposed name is that long; the error quotes only its start.
        return Err(Refusal::NameTooLong { noun, start: truncate(exposed, 40), bytes: exposed.len() }.into());
    }
    let policy = Policy(snap);
    let found = match catalog.lookup(kind, exposed) {
        Some(f) => f,
        None => {
            let server = policy.admit_unlearnt(kind, exposed)?;
            // Learn only this server's names: exposed names never collide across servers
            // (the `<server>__` prefix is kept whole), so an unrelated slow or hung upstream
            // never delays this call.
            Box::pin(catalog.learn_names(pool, kind, server)).await?;
            catalog.lookup(kind, exposed).ok_or_else(|| Refusal::UnknownName { noun, exposed: exposed.to_owned() })?
        }
    };
    policy.admit(kind, exposed, &found.0, &found.1)?;
    Ok(found)
}

/// Resolves a resource URI — `coffer://<server>/<uri>`, or an unprefixed URI an upstream
/// returned in a tool result this session (known to `catalog`) — and checks policy.
///
/// # Errors
/// [`Refusal::NotExposedUri`], [`Refusal::UnknownUriServer`], [`Refusal::Disabled`].
pub fn resolve_uri(snap: &Snapshot, catalog: &Catalog, uri: &str) -> Result<(String, String), Refusal> {
    let (server, original) = match split_uri(uri) {
        Some((server, original)) => (server.to_owned(), original.to_owned()),
        None => match catalog.uri_server(uri) {
            Some(server) => (server, uri.to_owned()),
            None => return Err(Refusal::NotExposedUri { uri: truncate(uri, 200) }),
        },
    };
    Policy(snap).admit_resource(uri, &server, &original)?;
    Ok((server, original))
}

/// The first `n` characters of `s`.
pub(super) fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use coffer_proto::store::McpServer;

    use super::*;

    fn snap() -> Snapshot {
        let server = |name: &str, enabled: bool| McpServer { name: name.into(), enabled, ..Default::default() };
        Snapshot {
            servers: [("on".to_owned(), server("on", true)), ("off".to_owned(), server("off", false))].into(),
            prefs: [
                (("on".to_owned(), Kind::Tool, "hidden".to_owned()), false),
                (("on".to_owned(), Kind::Resource, "file:///secret".to_owned()), false),
                ((BUILTIN_SERVER.to_owned(), Kind::Tool, "search_tools".to_owned()), false),
            ]
            .into(),
            loaded: true,
            ..Default::default()
        }
    }

    #[test]
    fn names_not_yet_learnt_are_admitted_or_refused_by_the_snapshot_alone() {
        let snap = snap();
        let p = Policy(&snap);
        assert_eq!(p.admit_unlearnt(ListKind::Tools, "on__echo"), Ok("on"));
        assert_eq!(p.admit_unlearnt(ListKind::Prompts, "on__hidden"), Ok("on"), "a tool preference is no prompt's");
        assert!(matches!(p.admit_unlearnt(ListKind::Tools, "echo"), Err(Refusal::NotExposed { .. })));
        assert!(matches!(p.admit_unlearnt(ListKind::Tools, "ghost__echo"), Err(Refusal::UnknownServer { .. })));
        let off = p.admit_unlearnt(ListKind::Tools, "off__echo").unwrap_err();
        assert!(matches!(off, Refusal::Disabled { scope: Scope::Server, .. }), "{off:?}");
        let hidden = p.admit_unlearnt(ListKind::Tools, "on__hidden").unwrap_err();
        assert!(matches!(hidden, Refusal::Disabled { scope: Scope::Capability, .. }), "{hidden:?}");
        let builtin = p.admit_unlearnt(ListKind::Tools, "coffer__search_tools").unwrap_err();
        assert!(
            matches!(builtin, Refusal::Disabled { scope: Scope::Capability, .. }),
            "the built-in server is never off"
        );
        assert_eq!(p.admit_unlearnt(ListKind::Tools, "coffer__other"), Ok(BUILTIN_SERVER));
    }

    #[test]
    fn resolved_targets_are_admitted_against_the_current_registry() {
        let snap = snap();
        let p = Policy(&snap);
        assert_eq!(p.admit(ListKind::Tools, "on__x_1", "on", "x.1"), Ok(()));
        let gone = p.admit(ListKind::Tools, "gone__x", "gone", "x").unwrap_err();
        assert_eq!(gone.to_string(), "Unknown server \"gone\" in tool \"gone__x\": it was removed");
        assert!(matches!(p.admit(ListKind::Tools, "on__h", "on", "hidden"), Err(Refusal::Disabled { .. })));
        assert_eq!(p.admit_resource("coffer://on/file:///a", "on", "file:///a"), Ok(()));
        let secret = p.admit_resource("coffer://on/file:///secret", "on", "file:///secret").unwrap_err();
        assert_eq!(secret.to_string(), "Resource coffer://on/file:///secret is disabled");
        assert!(matches!(p.admit_resource("x", "nobody", "x"), Err(Refusal::UnknownUriServer { .. })));
    }

    #[test]
    fn refusals_become_json_rpc_errors_once() {
        let snap = snap();
        let e = RpcError::from(Policy(&snap).admit_unlearnt(ListKind::Prompts, "off__p").unwrap_err());
        assert_eq!((e.code, e.message.as_str()), (TOOL_DISABLED, "Prompt off__p is disabled"));
        assert_eq!(
            e.data.unwrap(),
            json!({"code": "TOOL_DISABLED", "server": "off", "tool": "off__p", "kind": "prompt", "scope": "server"})
        );
        let e = RpcError::from(Refusal::NotExposedUri { uri: "file:///x".into() });
        assert_eq!((e.code, e.data), (INVALID_PARAMS, None));
        assert_eq!(e.message, "Unknown resource \"file:///x\": resource URIs look like coffer://<server>/<uri>");
    }
}
