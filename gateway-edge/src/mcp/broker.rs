//! The tool broker: "list and call capabilities under policy" for Coffer's own callers (chat's
//! internal agent and channels over gRPC, `grpc.rs`; REST's `/v1/tools*` in-process), without
//! being an MCP client connection.
//!
//! A broker session is an ordinary [`Session`] — its own lazily started upstream children, its
//! 60 s list cache, policy and the invocation log as for any client — keyed by the calling
//! service and a key the caller chooses (e.g. one per conversation), and recording its
//! invocations with the caller's `actor` ([`Session::actor`]). It ends when the caller closes it
//! ([`Broker::close`]), when it was idle for `gateway.broker_idle_timeout_s` with no request in
//! flight ([`Broker::reap_idle`], run by the gateway's reaper), or at shutdown
//! ([`Broker::close_all`]); its children are then terminated.
use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coffer_runtime::identity::Identity;
use coffer_types::BUILTIN_SERVER;
use serde_json::json;
use serde_json::value::RawValue;

use crate::mcp::answer::{Answer, RpcError};
use crate::mcp::catalog::{ListKind, Listed};
use crate::mcp::invocations::MCP_ACTOR;
use crate::mcp::jsonrpc::{INVALID_PARAMS, TOOL_DISABLED, UPSTREAM_TIMEOUT, UPSTREAM_UNAVAILABLE};
use crate::mcp::naming;
use crate::mcp::policy::{Noun, Refusal, truncate};
use crate::mcp::{SUPPORTED_VERSIONS, Session, Shared};

/// Longest actor, in bytes.
pub const MAX_ACTOR_LEN: usize = 64;
/// Longest broker-session key, in bytes.
pub const MAX_KEY_LEN: usize = 128;
/// Most broker sessions one calling service may have open at once (each may run a child per
/// registered server).
pub const MAX_SESSIONS_PER_CALLER: usize = 256;
/// Actors the gateway records for its own callers; a service calling the broker may not claim
/// them (its rows would pass for an MCP client's or a REST user's).
pub const RESERVED_ACTORS: &[&str] = &[MCP_ACTOR, "api", "cli", "ui", "daemon"];
/// The `clientInfo.name` a broker session's upstreams see in `initialize`.
pub const CLIENT_NAME: &str = "coffer-broker";

/// Why the broker refused a request before it reached a session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    /// The actor is not 1–[`MAX_ACTOR_LEN`] printable ASCII characters.
    #[error(
        "actor must be 1-{MAX_ACTOR_LEN} printable ASCII characters without spaces (agent, channel:<name>, …): {0}"
    )]
    InvalidActor(&'static str),
    /// The actor is one the gateway records for its own callers ([`RESERVED_ACTORS`]).
    #[error("actor {0:?} is reserved for the gateway's own callers; name who acts (agent, channel:<name>, …)")]
    ReservedActor(String),
    /// The key is not 1–[`MAX_KEY_LEN`] printable ASCII characters.
    #[error("session_key must be 1-{MAX_KEY_LEN} printable ASCII characters without spaces: {0}")]
    InvalidKey(&'static str),
    /// The key is open for another actor (a session's actor is fixed when it opens).
    #[error("broker session {key:?} is open for actor {open:?}, not {asked:?}; close it or use another key")]
    ActorMismatch { key: String, open: String, asked: String },
    /// The caller has [`MAX_SESSIONS_PER_CALLER`] sessions open.
    #[error("{caller} has {MAX_SESSIONS_PER_CALLER} broker sessions open; close one first")]
    TooManySessions { caller: Identity },
    /// `arguments_json` is not a JSON object.
    #[error("arguments_json must be a JSON object (or empty for none): {0}")]
    InvalidArguments(String),
}

/// What went wrong, in the words both REST and gRPC map from (`rest/tools.rs`, `grpc.rs`): the
/// one classification of the gateway's own errors for callers that are not JSON-RPC clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// -32000 `TOOL_DISABLED`: a policy refusal.
    Disabled,
    /// -32602 naming an unknown tool, prompt, server or URI.
    NotFound,
    /// Any other error the gateway answers (-32602 invalid params, …).
    Invalid,
    /// -32001: the upstream could not be started or died.
    Unavailable,
    /// -32002: the upstream did not answer in time.
    Timeout,
}

impl Failure {
    /// The class of a gateway error. Unknown targets are the -32602 errors whose message starts
    /// with "Unknown" ([`Refusal`]'s wording, and `forward`'s "Unknown server").
    pub fn of(e: &RpcError) -> Self {
        match e.code {
            TOOL_DISABLED => Failure::Disabled,
            UPSTREAM_UNAVAILABLE => Failure::Unavailable,
            UPSTREAM_TIMEOUT => Failure::Timeout,
            INVALID_PARAMS if e.message.starts_with("Unknown") => Failure::NotFound,
            _ => Failure::Invalid,
        }
    }

    /// The REST envelope's code for it (`TOOL_DISABLED`, `NOT_FOUND`, …).
    pub fn code(self) -> &'static str {
        match self {
            Failure::Disabled => "TOOL_DISABLED",
            Failure::NotFound => "NOT_FOUND",
            Failure::Invalid => "INVALID_ARGUMENT",
            Failure::Unavailable => "UPSTREAM_UNAVAILABLE",
            Failure::Timeout => "UPSTREAM_TIMEOUT",
        }
    }
}

/// Checks the shape of an actor: 1–[`MAX_ACTOR_LEN`] bytes, each printable ASCII (`!`..=`~`).
///
/// # Errors
/// [`BrokerError::InvalidActor`] saying what is wrong (never echoing the value).
pub fn check_actor(actor: &str) -> Result<(), BrokerError> {
    printable(actor, MAX_ACTOR_LEN).map_err(BrokerError::InvalidActor)
}

/// [`check_actor`], and not one of [`RESERVED_ACTORS`]: what a service calling over gRPC may
/// claim.
///
/// # Errors
/// [`BrokerError::InvalidActor`] or [`BrokerError::ReservedActor`].
pub fn check_service_actor(actor: &str) -> Result<(), BrokerError> {
    check_actor(actor)?;
    if RESERVED_ACTORS.contains(&actor) {
        return Err(BrokerError::ReservedActor(actor.to_owned()));
    }
    Ok(())
}

/// Checks the shape of a session key: 1–[`MAX_KEY_LEN`] bytes, each printable ASCII.
///
/// # Errors
/// [`BrokerError::InvalidKey`].
pub fn check_key(key: &str) -> Result<(), BrokerError> {
    printable(key, MAX_KEY_LEN).map_err(BrokerError::InvalidKey)
}

fn printable(s: &str, max: usize) -> Result<(), &'static str> {
    if s.is_empty() {
        Err("it is empty")
    } else if s.len() > max {
        Err("it is too long")
    } else if !s.bytes().all(|b| b.is_ascii_graphic()) {
        Err("it has a space, a control or a non-ASCII character")
    } else {
        Ok(())
    }
}

/// Parses tool or prompt arguments given as JSON text: empty is none, else a JSON object.
///
/// # Errors
/// [`BrokerError::InvalidArguments`] for text that is not JSON, or JSON that is not an object.
pub fn parse_arguments(text: &str) -> Result<Option<Box<RawValue>>, BrokerError> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    let raw: Box<RawValue> =
        serde_json::from_str(text).map_err(|e| BrokerError::InvalidArguments(format!("not JSON ({e})")))?;
    // Valid JSON text whose first character is `{` is an object.
    if !raw.get().starts_with('{') {
        return Err(BrokerError::InvalidArguments("not an object".into()));
    }
    Ok(Some(raw))
}

/// One open broker session and how many requests are in it now.
struct Entry {
    session: Arc<Session>,
    in_flight: AtomicUsize,
}

/// A broker session lent to one request: the session is not reaped for idleness while a lease
/// is held, and dropping the lease restarts its idle time.
pub struct Lease {
    entry: Arc<Entry>,
}

impl Deref for Lease {
    type Target = Arc<Session>;
    fn deref(&self) -> &Arc<Session> {
        &self.entry.session
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.entry.session.touch();
        self.entry.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Every broker session of one gateway, by (calling service, key).
pub struct Broker {
    shared: Arc<Shared>,
    sessions: Mutex<HashMap<(Identity, String), Arc<Entry>>>,
}

impl Broker {
    /// A broker whose sessions share `shared` (snapshot, recorder, credentials, built-ins).
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared, sessions: Mutex::default() }
    }

    /// The session of `caller` under `key`, opened for `actor` if it is not open yet, lent for
    /// one request (see [`Lease`]).
    ///
    /// # Errors
    /// [`BrokerError::InvalidActor`], [`BrokerError::InvalidKey`], [`BrokerError::ActorMismatch`]
    /// when the key is open for another actor, [`BrokerError::TooManySessions`].
    pub fn lease(&self, caller: Identity, key: &str, actor: &str) -> Result<Lease, BrokerError> {
        check_actor(actor)?;
        check_key(key)?;
        let mut sessions = self.sessions.lock().expect("broker sessions");
        let entry = match sessions.get(&(caller, key.to_owned())) {
            Some(e) if e.session.actor != actor => {
                return Err(BrokerError::ActorMismatch {
                    key: key.to_owned(),
                    open: e.session.actor.to_string(),
                    asked: actor.to_owned(),
                });
            }
            Some(e) => e.clone(),
            None => {
                if sessions.keys().filter(|(c, _)| *c == caller).count() >= MAX_SESSIONS_PER_CALLER {
                    return Err(BrokerError::TooManySessions { caller });
                }
                let entry = Arc::new(Entry { session: self.open(caller, key, actor), in_flight: AtomicUsize::new(0) });
                sessions.insert((caller, key.to_owned()), entry.clone());
                entry
            }
        };
        // Counted under the map's lock, so the reaper never takes a session a request holds.
        entry.in_flight.fetch_add(1, Ordering::AcqRel);
        entry.session.touch();
        Ok(Lease { entry })
    }

    fn open(&self, caller: Identity, key: &str, actor: &str) -> Arc<Session> {
        let version = SUPPORTED_VERSIONS[0];
        let params = json!({
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": CLIENT_NAME, "version": coffer_runtime::VERSION},
        });
        let id = format!("broker-{}", uuid::Uuid::new_v4().simple());
        let actor: Cow<'static, str> = Cow::Owned(actor.to_owned());
        let s = Session::with_actor(id, version.to_owned(), &params, self.shared.clone(), actor);
        tracing::info!(session = %s.id, %caller, key = %key, actor = %s.actor, "Broker session started.");
        s
    }

    /// Ends `caller`'s session under `key` now (its upstream children are terminated); false
    /// when none was open.
    pub async fn close(&self, caller: Identity, key: &str) -> bool {
        let entry = self.sessions.lock().expect("broker sessions").remove(&(caller, key.to_owned()));
        match entry {
            Some(e) => {
                e.session.close().await;
                tracing::info!(session = %e.session.id, %caller, key = %key, reason = "closed", "Broker session ended.");
                true
            }
            None => false,
        }
    }

    /// Ends every session idle for longer than `limit` with no request in flight; returns how
    /// many ended.
    pub async fn reap_idle(&self, limit: Duration) -> usize {
        let idle: Vec<Arc<Entry>> = {
            let mut sessions = self.sessions.lock().expect("broker sessions");
            let keys: Vec<(Identity, String)> = sessions
                .iter()
                .filter(|(_, e)| e.in_flight.load(Ordering::Acquire) == 0 && e.session.idle_for() > limit)
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| sessions.remove(k)).collect()
        };
        for e in &idle {
            e.session.close().await;
            tracing::info!(session = %e.session.id, reason = "idle timeout", "Broker session ended.");
        }
        idle.len()
    }

    /// Ends every session (shutdown).
    pub async fn close_all(&self) {
        let all: Vec<Arc<Entry>> = self.sessions.lock().expect("broker sessions").drain().map(|(_, e)| e).collect();
        futures_util::future::join_all(all.iter().map(|e| e.session.close())).await;
    }

    /// Drops every session's cached lists (`POST /v1/mcp/refresh`).
    pub fn invalidate_all(&self) {
        for e in self.sessions.lock().expect("broker sessions").values() {
            e.session.invalidate(None);
        }
    }

    /// Number of open broker sessions.
    pub fn count(&self) -> usize {
        self.sessions.lock().expect("broker sessions").len()
    }

    /// The ids of the open broker sessions of `caller`.
    pub fn session_ids(&self, caller: Identity) -> Vec<String> {
        let sessions = self.sessions.lock().expect("broker sessions");
        sessions.iter().filter(|((c, _), _)| *c == caller).map(|(_, e)| e.session.id.clone()).collect()
    }
}

/// The enabled capabilities of `kind` that `session` sees, as `tools/list` (and the other lists)
/// answer an MCP client.
pub async fn list_enabled(session: &Session, kind: ListKind) -> Vec<Listed> {
    session.list_all(kind).await.into_iter().filter(|l| l.enabled).collect()
}

/// Calls tool (or gets prompt, by `kind`) `name` with `arguments` (a JSON object, or none)
/// through `session`: resolved, checked and recorded as for an MCP client's `tools/call`.
pub async fn call(session: &Arc<Session>, kind: ListKind, name: &str, arguments: Option<&RawValue>) -> Answer {
    let name = serde_json::to_string(name).expect("a string is JSON");
    let params = match arguments {
        Some(a) => format!("{{\"name\":{name},\"arguments\":{}}}", a.get()),
        None => format!("{{\"name\":{name}}}"),
    };
    let params = RawValue::from_string(params).expect("built from JSON parts");
    session.route_call(kind, Some(&params)).await
}

/// Reads resource `uri` (exposed, `coffer://<server>/<uri>`) through `session`, recorded as an
/// MCP client's `resources/read`.
pub async fn read_resource(session: &Arc<Session>, uri: &str) -> Answer {
    let params = RawValue::from_string(json!({"uri": uri}).to_string()).expect("json");
    session.handle_request("resources/read", Some(&params)).await
}

/// Where an exposed tool name points, found without the policy check (a disabled tool must be
/// re-enableable) — for toggling a tool by its exposed name (`PATCH /v1/tools/{name}`).
#[derive(Debug)]
pub enum Located {
    /// Its server and original name.
    Tool { server: String, original: String },
    /// Its server is disabled: its names are not listed, so cannot be told.
    ServerDisabled { server: String },
    /// No such tool (or its server could not list its names; the error says which).
    Unknown(RpcError),
}

/// Finds the tool behind exposed name `exposed` in `session`: through its name map, else by
/// listing the one server the name's `<server>__` prefix names (starting only that upstream,
/// never every upstream).
pub async fn locate_tool(session: &Session, exposed: &str) -> Located {
    let unknown = |r: Refusal| Located::Unknown(r.into());
    let noun = Noun::Tool;
    if exposed.chars().count() > naming::ABSOLUTE_MAX_LEN {
        return unknown(Refusal::NameTooLong { noun, start: truncate(exposed, 40), bytes: exposed.len() });
    }
    let Some((server, _)) = naming::split(exposed) else {
        return unknown(Refusal::NotExposed { noun, exposed: exposed.to_owned() });
    };
    if server != BUILTIN_SERVER {
        match session.shared.snapshot.current().servers.get(server) {
            None => {
                return unknown(Refusal::UnknownServer {
                    noun,
                    server: server.to_owned(),
                    exposed: exposed.to_owned(),
                });
            }
            Some(s) if !s.enabled => return Located::ServerDisabled { server: server.to_owned() },
            Some(_) => {}
        }
    }
    let found = match session.catalog.lookup(ListKind::Tools, exposed) {
        Some(found) => Some(found),
        None => {
            if let Err(e) = session.catalog.learn_names(&session.pool, ListKind::Tools, server).await {
                return Located::Unknown(e);
            }
            session.catalog.lookup(ListKind::Tools, exposed)
        }
    };
    match found {
        Some((server, original)) => Located::Tool { server, original },
        None => unknown(Refusal::UnknownName { noun, exposed: exposed.to_owned() }),
    }
}
