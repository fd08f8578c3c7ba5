//! The `coffer.store.v1.Store` gRPC service over [`crate::db::Db`]. Domain errors become
//! `tonic::Status` here, once.
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use coffer_proto::store::store_server::Store;
use coffer_proto::store::*;
use rusqlite::{OptionalExtension, Row, Transaction, params};
use secrecy::{ExposeSecret, SecretString};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::db::{Db, StoreError};
use crate::vault::{Vault, VaultError};

/// Longest page a list RPC returns.
const MAX_PAGE: u32 = 500;

impl From<StoreError> for Status {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Invalid(m) => Status::invalid_argument(m),
            StoreError::NotFound(m) => Status::not_found(format!("{m} not found")),
            StoreError::Exists(m) => Status::already_exists(format!("{m} already exists")),
            e @ StoreError::Conflict { .. } => Status::aborted(e.to_string()),
            other => {
                tracing::error!(error = %other, "Store failure.");
                Status::internal("store failure; see logs/store.log")
            }
        }
    }
}

impl From<VaultError> for Status {
    fn from(e: VaultError) -> Self {
        match e {
            VaultError::InvalidName(_) | VaultError::InvalidValue(_) => Status::invalid_argument(e.to_string()),
            VaultError::Random(_) => {
                tracing::error!(error = %e, "Credential encryption failed.");
                Status::internal("credential encryption failed; see logs/store.log")
            }
            // The key file needs the user's attention: say which file and why (never a value).
            _ => {
                tracing::warn!(error = %e, "Credential key problem.");
                Status::failed_precondition(e.to_string())
            }
        }
    }
}

impl From<crate::backup::BackupError> for Status {
    fn from(e: crate::backup::BackupError) -> Self {
        use crate::backup::BackupError as B;
        match e {
            B::Invalid(m) => Status::invalid_argument(m),
            B::Exists(m) => Status::already_exists(m),
            // The target is the caller's choice: say what is wrong with it.
            B::Target { .. } => Status::failed_precondition(format!("cannot write the backup: {e}")),
            B::Source { .. } => {
                tracing::error!(error = %e, "Backup failed reading the home.");
                Status::internal(format!("backup failed: {e}"))
            }
            B::Store(e) => e.into(),
        }
    }
}

/// Most names one `ResolveCredentials` call may ask for.
const MAX_RESOLVE: usize = 1024;

/// Validates an MCP server name: `^[a-z0-9][a-z0-9-]{0,23}$`, not the reserved `coffer`.
///
/// # Errors
/// [`StoreError::Invalid`] with a message naming the rule that failed.
pub fn validate_server_name(name: &str) -> Result<(), StoreError> {
    let ok_chars = name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_first = name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if name.is_empty() || name.len() > 24 || !ok_chars || !ok_first {
        return Err(StoreError::Invalid(format!(
            "invalid server name {:?}: use 1-24 characters a-z, 0-9 and '-', starting with a letter or digit",
            truncate(name, 40)
        )));
    }
    if name == "coffer" {
        return Err(StoreError::Invalid("server name \"coffer\" is reserved for Coffer's built-in tools".into()));
    }
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_owned() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

fn validate_server(s: &McpServer) -> Result<(), StoreError> {
    validate_server_name(&s.name)?;
    match s.transport.as_str() {
        "stdio" => {
            if s.command.is_empty() {
                return Err(StoreError::Invalid("a stdio server needs a command".into()));
            }
            if !s.command.starts_with('/') {
                return Err(StoreError::Invalid(format!(
                    "command {:?} must be an absolute path",
                    truncate(&s.command, 80)
                )));
            }
        }
        "http" => {
            if !(s.url.starts_with("http://") || s.url.starts_with("https://")) {
                return Err(StoreError::Invalid(format!(
                    "url {:?} must start with http:// or https://",
                    truncate(&s.url, 80)
                )));
            }
        }
        other => {
            return Err(StoreError::Invalid(format!("transport {:?} is not one of stdio, http", truncate(other, 20))));
        }
    }
    for k in s.env.keys() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(StoreError::Invalid(format!("invalid environment variable name {:?}", truncate(k, 40))));
        }
    }
    Ok(())
}

fn server_from_row(r: &Row<'_>) -> rusqlite::Result<McpServer> {
    let json = |i: usize| -> rusqlite::Result<String> { r.get(i) };
    Ok(McpServer {
        name: r.get(0)?,
        transport: r.get(1)?,
        command: r.get(2)?,
        args: serde_json::from_str(&json(3)?).unwrap_or_default(),
        env: serde_json::from_str(&json(4)?).unwrap_or_default(),
        cwd: r.get(5)?,
        url: r.get(6)?,
        headers: serde_json::from_str(&json(7)?).unwrap_or_default(),
        enabled: r.get::<_, i64>(8)? != 0,
        timeout_ms: r.get::<_, i64>(9)? as u64,
        version: r.get(10)?,
        created_at: r.get(11)?,
        updated_at: r.get(12)?,
    })
}

const SERVER_COLS: &str = "name, transport, command, args_json, env_json, cwd, url, headers_json, enabled, timeout_ms, version, created_at, updated_at";

/// Writes every column of `s` (insert, or replace the row with the same name), inside the
/// caller's transaction. The caller has set `version`, `created_at` and `updated_at`.
fn write_server_row(t: &rusqlite::Connection, s: &McpServer) -> Result<(), StoreError> {
    t.execute(
        &format!(
            "INSERT INTO mcp_servers ({SERVER_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
             ON CONFLICT (name) DO UPDATE SET transport = excluded.transport, command = excluded.command,
               args_json = excluded.args_json, env_json = excluded.env_json, cwd = excluded.cwd, url = excluded.url,
               headers_json = excluded.headers_json, enabled = excluded.enabled, timeout_ms = excluded.timeout_ms,
               version = excluded.version, created_at = excluded.created_at, updated_at = excluded.updated_at"
        ),
        params![
            s.name,
            s.transport,
            s.command,
            serde_json::to_string(&s.args).expect("json"),
            serde_json::to_string(&s.env).expect("json"),
            s.cwd,
            s.url,
            serde_json::to_string(&s.headers).expect("json"),
            s.enabled as i64,
            s.timeout_ms as i64,
            s.version,
            s.created_at,
            s.updated_at
        ],
    )?;
    Ok(())
}

fn get_server_tx(t: &rusqlite::Connection, name: &str) -> Result<Option<McpServer>, StoreError> {
    Ok(t.query_row(&format!("SELECT {SERVER_COLS} FROM mcp_servers WHERE name = ?1"), [name], server_from_row)
        .optional()?)
}

/// Appends an audit row inside the caller's transaction. `trace` is the request's trace id,
/// read in the async handler (the writer thread has no request context).
fn audit(t: &Transaction, trace: &str, actor: &str, action: &str, target: &str) -> Result<(), StoreError> {
    t.execute(
        "INSERT INTO audit_log (at, actor, action, target, outcome, trace_id, detail) VALUES (?1, ?2, ?3, ?4, 'ok', ?5, '{}')",
        params![coffer_runtime::now_rfc3339(), if actor.is_empty() { "api" } else { actor }, action, target, trace],
    )?;
    Ok(())
}

/// The gRPC service.
pub struct StoreService {
    db: Db,
    vault: Arc<Vault>,
}

impl StoreService {
    /// The service over `db`, encrypting credentials with `vault`.
    pub fn new(db: Db, vault: Vault) -> Self {
        Self { db, vault: Arc::new(vault) }
    }
}

fn credential_from_row(r: &Row<'_>) -> rusqlite::Result<CredentialInfo> {
    Ok(CredentialInfo { name: r.get(0)?, version: r.get(1)?, created_at: r.get(2)?, updated_at: r.get(3)? })
}

type ChangeStream = Pin<Box<dyn Stream<Item = Result<Change, Status>> + Send>>;

#[tonic::async_trait]
impl Store for StoreService {
    async fn list_servers(&self, _: Request<ListServersRequest>) -> Result<Response<ListServersReply>, Status> {
        let head = self.db.head();
        let servers = self
            .db
            .read(|c| {
                let mut st = c.prepare_cached(&format!("SELECT {SERVER_COLS} FROM mcp_servers ORDER BY name"))?;
                let rows = st.query_map([], server_from_row)?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        Ok(Response::new(ListServersReply { servers, seq: head }))
    }

    async fn get_server(&self, req: Request<GetServerRequest>) -> Result<Response<McpServer>, Status> {
        let name = req.into_inner().name;
        let n2 = name.clone();
        let s = self.db.read(move |c| get_server_tx(c, &n2)).await?;
        s.map(Response::new).ok_or_else(|| StoreError::NotFound(format!("server {name:?}")).into())
    }

    async fn create_server(&self, req: Request<CreateServerRequest>) -> Result<Response<WriteServerReply>, Status> {
        let trace = coffer_runtime::grpc::current_trace().unwrap_or_default();
        let r = req.into_inner();
        let mut s = r.server.ok_or_else(|| Status::invalid_argument("server is required"))?;
        validate_server(&s)?;
        let (server, seq) = self
            .db
            .write(move |t, ch| {
                if get_server_tx(t, &s.name)?.is_some() {
                    return Err(StoreError::Exists(format!("server {:?}", s.name)));
                }
                let now = coffer_runtime::now_rfc3339();
                s.version = 1;
                s.created_at = now.clone();
                s.updated_at = now;
                write_server_row(t, &s)?;
                audit(t, &trace, &r.actor, "server.create", &s.name)?;
                ch.push("server", s.name.clone(), "create");
                Ok(s)
            })
            .await?;
        Ok(Response::new(WriteServerReply { server: Some(server), seq }))
    }

    async fn update_server(&self, req: Request<UpdateServerRequest>) -> Result<Response<WriteServerReply>, Status> {
        let trace = coffer_runtime::grpc::current_trace().unwrap_or_default();
        let r = req.into_inner();
        let mut s = r.server.ok_or_else(|| Status::invalid_argument("server is required"))?;
        validate_server(&s)?;
        let (server, seq) = self
            .db
            .write(move |t, ch| {
                let cur =
                    get_server_tx(t, &s.name)?.ok_or_else(|| StoreError::NotFound(format!("server {:?}", s.name)))?;
                if r.check_version && cur.version != r.expected_version {
                    return Err(StoreError::Conflict {
                        what: format!("server {:?}", s.name),
                        expected: r.expected_version,
                        current: cur.version,
                    });
                }
                s.version = cur.version + 1;
                s.created_at = cur.created_at;
                s.updated_at = coffer_runtime::now_rfc3339();
                write_server_row(t, &s)?;
                let action = if cur.enabled != s.enabled {
                    if s.enabled { "server.enable" } else { "server.disable" }
                } else {
                    "server.update"
                };
                audit(t, &trace, &r.actor, action, &s.name)?;
                ch.push("server", s.name.clone(), "update");
                Ok(s)
            })
            .await?;
        Ok(Response::new(WriteServerReply { server: Some(server), seq }))
    }

    async fn delete_server(&self, req: Request<DeleteServerRequest>) -> Result<Response<WriteReply>, Status> {
        let trace = coffer_runtime::grpc::current_trace().unwrap_or_default();
        let r = req.into_inner();
        let ((), seq) = self
            .db
            .write(move |t, ch| {
                let cur =
                    get_server_tx(t, &r.name)?.ok_or_else(|| StoreError::NotFound(format!("server {:?}", r.name)))?;
                if r.check_version && cur.version != r.expected_version {
                    return Err(StoreError::Conflict {
                        what: format!("server {:?}", r.name),
                        expected: r.expected_version,
                        current: cur.version,
                    });
                }
                t.execute("DELETE FROM mcp_servers WHERE name = ?1", [&r.name])?;
                t.execute("DELETE FROM capability_prefs WHERE server = ?1", [&r.name])?;
                audit(t, &trace, &r.actor, "server.remove", &r.name)?;
                ch.push("server", r.name.clone(), "delete");
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }

    async fn list_preferences(
        &self,
        req: Request<ListPreferencesRequest>,
    ) -> Result<Response<ListPreferencesReply>, Status> {
        let server = req.into_inner().server;
        let head = self.db.head();
        let preferences = self
            .db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT server, kind, name, enabled, updated_at FROM capability_prefs WHERE (?1 = '' OR server = ?1) ORDER BY server, kind, name",
                )?;
                let rows = st.query_map([&server], |r| {
                    Ok(Preference {
                        server: r.get(0)?,
                        kind: r.get(1)?,
                        name: r.get(2)?,
                        enabled: r.get::<_, i64>(3)? != 0,
                        updated_at: r.get(4)?,
                    })
                })?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        Ok(Response::new(ListPreferencesReply { preferences, seq: head }))
    }

    async fn set_preference(&self, req: Request<SetPreferenceRequest>) -> Result<Response<WriteReply>, Status> {
        let trace = coffer_runtime::grpc::current_trace().unwrap_or_default();
        let r = req.into_inner();
        let p = r.preference.ok_or_else(|| Status::invalid_argument("preference is required"))?;
        validate_server_name(&p.server).or_else(|e| if p.server == "coffer" { Ok(()) } else { Err(e) })?;
        if !matches!(p.kind.as_str(), "tool" | "prompt" | "resource") {
            return Err(Status::invalid_argument(format!(
                "kind {:?} is not one of tool, prompt, resource",
                truncate(&p.kind, 20)
            )));
        }
        if p.name.is_empty() || p.name.len() > 1024 {
            return Err(Status::invalid_argument("capability name must be 1-1024 bytes"));
        }
        let ((), seq) = self
            .db
            .write(move |t, ch| {
                t.execute(
                    "INSERT INTO capability_prefs (server, kind, name, enabled, updated_at) VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (server, kind, name) DO UPDATE SET enabled = excluded.enabled, updated_at = excluded.updated_at",
                    params![p.server, p.kind, p.name, p.enabled as i64, coffer_runtime::now_rfc3339()],
                )?;
                let target = format!("{}/{}/{}", p.server, p.kind, p.name);
                audit(t, &trace, &r.actor, if p.enabled { "capability.enable" } else { "capability.disable" }, &target)?;
                ch.push("preference", target, "set");
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }

    async fn append_invocations(&self, req: Request<AppendInvocationsRequest>) -> Result<Response<WriteReply>, Status> {
        let items = req.into_inner().invocations;
        if items.len() > 10_000 {
            return Err(Status::invalid_argument("at most 10000 invocations per batch"));
        }
        let ((), seq) = self
            .db
            .write(move |t, _| {
                let mut st = t.prepare_cached(
                    "INSERT INTO mcp_invocations (at, target, method, server, session_id, duration_ms, outcome, trace_id)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )?;
                for i in items {
                    st.execute(params![i.at, i.target, i.method, i.server, i.session_id, i.duration_ms as i64, i.outcome, i.trace_id])?;
                }
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }

    async fn list_invocations(
        &self,
        req: Request<ListInvocationsRequest>,
    ) -> Result<Response<ListInvocationsReply>, Status> {
        let q = req.into_inner();
        let limit = q.limit.clamp(1, MAX_PAGE);
        let items = self
            .db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id, at, target, method, server, session_id, duration_ms, outcome, trace_id FROM mcp_invocations
                     WHERE (?1 = '' OR server = ?1) AND (?2 = '' OR target = ?2) AND (?3 = '' OR outcome = ?3)
                       AND (?4 = '' OR at >= ?4) AND (?5 = '' OR at < ?5) AND (?6 = 0 OR id < ?6)
                     ORDER BY id DESC LIMIT ?7",
                )?;
                let rows = st.query_map(params![q.server, q.target, q.outcome, q.since, q.until, q.before_id, limit + 1], |r| {
                    Ok(Invocation {
                        id: r.get(0)?,
                        at: r.get(1)?,
                        target: r.get(2)?,
                        method: r.get(3)?,
                        server: r.get(4)?,
                        session_id: r.get(5)?,
                        duration_ms: r.get::<_, i64>(6)? as u64,
                        outcome: r.get(7)?,
                        trace_id: r.get(8)?,
                    })
                })?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        let (items, next) = page(items, limit, |i| i.id);
        Ok(Response::new(ListInvocationsReply { items, next_before_id: next }))
    }

    async fn append_audit(&self, req: Request<AppendAuditRequest>) -> Result<Response<WriteReply>, Status> {
        let entries = req.into_inner().entries;
        let ((), seq) = self
            .db
            .write(move |t, _| {
                let mut st = t.prepare_cached(
                    "INSERT INTO audit_log (at, actor, action, target, outcome, trace_id, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?;
                for e in entries {
                    let at = if e.at.is_empty() { coffer_runtime::now_rfc3339() } else { e.at };
                    let detail = if e.detail.is_empty() { "{}".to_owned() } else { e.detail };
                    st.execute(params![at, e.actor, e.action, e.target, e.outcome, e.trace_id, detail])?;
                }
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }

    async fn list_audit(&self, req: Request<ListAuditRequest>) -> Result<Response<ListAuditReply>, Status> {
        let q = req.into_inner();
        let limit = q.limit.clamp(1, MAX_PAGE);
        let items = self
            .db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id, at, actor, action, target, outcome, trace_id, detail FROM audit_log
                     WHERE (?1 = '' OR actor = ?1) AND (?2 = '' OR action = ?2) AND (?3 = 0 OR id < ?3)
                     ORDER BY id DESC LIMIT ?4",
                )?;
                let rows = st.query_map(params![q.actor, q.action, q.before_id, limit + 1], |r| {
                    Ok(AuditEntry {
                        id: r.get(0)?,
                        at: r.get(1)?,
                        actor: r.get(2)?,
                        action: r.get(3)?,
                        target: r.get(4)?,
                        outcome: r.get(5)?,
                        trace_id: r.get(6)?,
                        detail: r.get(7)?,
                    })
                })?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        let (items, next) = page(items, limit, |i| i.id);
        Ok(Response::new(ListAuditReply { items, next_before_id: next }))
    }

    async fn get_settings(&self, _: Request<GetSettingsRequest>) -> Result<Response<Settings>, Status> {
        let head = self.db.head();
        let values = self
            .db
            .read(|c| {
                let mut st = c.prepare_cached("SELECT key, value FROM settings")?;
                let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
                Ok(rows.collect::<Result<HashMap<_, _>, _>>()?)
            })
            .await?;
        Ok(Response::new(Settings { values, seq: head }))
    }

    async fn patch_settings(&self, req: Request<PatchSettingsRequest>) -> Result<Response<WriteReply>, Status> {
        let trace = coffer_runtime::grpc::current_trace().unwrap_or_default();
        let r = req.into_inner();
        for k in r.set.keys().chain(r.remove.iter()) {
            if k.is_empty() || k.len() > 128 {
                return Err(Status::invalid_argument("setting keys must be 1-128 bytes"));
            }
        }
        let ((), seq) = self
            .db
            .write(move |t, ch| {
                let now = coffer_runtime::now_rfc3339();
                for (k, v) in &r.set {
                    t.execute(
                        "INSERT INTO settings (key, value, updated_at) VALUES (?1, ?2, ?3)
                         ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                        params![k, v, now],
                    )?;
                    ch.push("settings", k.clone(), "set");
                }
                for k in &r.remove {
                    t.execute("DELETE FROM settings WHERE key = ?1", [k])?;
                    ch.push("settings", k.clone(), "delete");
                }
                let keys: Vec<&String> = r.set.keys().chain(r.remove.iter()).collect();
                audit(t, &trace, &r.actor, "settings.update", &serde_json::to_string(&keys).expect("json"))?;
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }

    async fn set_credential(
        &self,
        req: Request<SetCredentialRequest>,
    ) -> Result<Response<WriteCredentialReply>, Status> {
        let trace = coffer_runtime::grpc::current_trace().unwrap_or_default();
        let mut r = req.into_inner();
        let value = SecretString::from(std::mem::take(&mut r.value));
        crate::vault::validate_name(&r.name)?;
        crate::vault::validate_value(&value)?;
        // A missing key may be created only while no ciphertext exists under an earlier one;
        // otherwise a lost key file would be silently replaced and those rows lost.
        let stored = self
            .db
            .read(|c| Ok(c.query_row("SELECT EXISTS (SELECT 1 FROM credentials)", [], |r| r.get::<_, bool>(0))?))
            .await?;
        let vault = self.vault.clone();
        let name = r.name.clone();
        let sealed = tokio::task::spawn_blocking(move || vault.seal(&name, &value, !stored))
            .await
            .map_err(|_| Status::internal("credential encryption task failed"))??;
        let (credential, seq) = self
            .db
            .write(move |t, ch| {
                let now = coffer_runtime::now_rfc3339();
                let cur = t
                    .query_row("SELECT name, version, created_at, updated_at FROM credentials WHERE name = ?1", [&r.name], credential_from_row)
                    .optional()?;
                let (info, op) = match cur {
                    Some(cur) => {
                        let info = CredentialInfo { version: cur.version + 1, updated_at: now, ..cur };
                        t.execute(
                            "UPDATE credentials SET nonce = ?2, ciphertext = ?3, version = ?4, updated_at = ?5 WHERE name = ?1",
                            params![info.name, sealed.nonce, sealed.ciphertext, info.version, info.updated_at],
                        )?;
                        (info, "update")
                    }
                    None => {
                        let info = CredentialInfo { name: r.name.clone(), version: 1, created_at: now.clone(), updated_at: now };
                        t.execute(
                            "INSERT INTO credentials (name, nonce, ciphertext, version, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                            params![info.name, sealed.nonce, sealed.ciphertext, info.version, info.created_at, info.updated_at],
                        )?;
                        (info, "create")
                    }
                };
                audit(t, &trace, &r.actor, "credential.set", &info.name)?;
                ch.push("credential", info.name.clone(), op);
                Ok(info)
            })
            .await?;
        Ok(Response::new(WriteCredentialReply { credential: Some(credential), seq }))
    }

    async fn list_credentials(
        &self,
        _: Request<ListCredentialsRequest>,
    ) -> Result<Response<ListCredentialsReply>, Status> {
        let items = self
            .db
            .read(|c| {
                let mut st =
                    c.prepare_cached("SELECT name, version, created_at, updated_at FROM credentials ORDER BY name")?;
                let rows = st.query_map([], credential_from_row)?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        Ok(Response::new(ListCredentialsReply { items }))
    }

    async fn delete_credential(&self, req: Request<DeleteCredentialRequest>) -> Result<Response<WriteReply>, Status> {
        let trace = coffer_runtime::grpc::current_trace().unwrap_or_default();
        let r = req.into_inner();
        let ((), seq) = self
            .db
            .write(move |t, ch| {
                if t.execute("DELETE FROM credentials WHERE name = ?1", [&r.name])? == 0 {
                    return Err(StoreError::NotFound(format!("credential {:?}", truncate(&r.name, 80))));
                }
                audit(t, &trace, &r.actor, "credential.remove", &r.name)?;
                ch.push("credential", r.name.clone(), "delete");
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }

    async fn resolve_credentials(
        &self,
        req: Request<ResolveCredentialsRequest>,
    ) -> Result<Response<ResolveCredentialsReply>, Status> {
        let mut names = req.into_inner().names;
        if names.len() > MAX_RESOLVE {
            return Err(Status::invalid_argument(format!("at most {MAX_RESOLVE} credentials per call")));
        }
        // First occurrence order, so "the first missing one" is the caller's first.
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        let rows = self
            .db
            .read(move |c| {
                let mut st = c.prepare_cached("SELECT nonce, ciphertext FROM credentials WHERE name = ?1")?;
                let mut rows = Vec::with_capacity(names.len());
                for n in names {
                    let row =
                        st.query_row([&n], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?))).optional()?;
                    match row {
                        Some((nonce, ct)) => rows.push((n, nonce, ct)),
                        None => return Err(StoreError::NotFound(format!("credential {:?}", truncate(&n, 80)))),
                    }
                }
                Ok(rows)
            })
            .await?;
        let vault = self.vault.clone();
        let opened = tokio::task::spawn_blocking(move || {
            rows.into_iter()
                .map(|(n, nonce, ct)| vault.open(&n, &nonce, &ct).map(|v| (n, v)))
                .collect::<Result<Vec<(String, SecretString)>, VaultError>>()
        })
        .await
        .map_err(|_| Status::internal("credential decryption task failed"))??;
        // The reply is the one place values leave the store: the gateway asked for them to start
        // an upstream with them.
        let values = opened.into_iter().map(|(n, v)| (n, v.expose_secret().to_owned())).collect();
        Ok(Response::new(ResolveCredentialsReply { values }))
    }

    async fn prune_now(&self, req: Request<PruneNowRequest>) -> Result<Response<PruneNowReply>, Status> {
        let trace = coffer_runtime::grpc::current_trace().unwrap_or_default();
        let actor = req.into_inner().actor;
        let p = crate::retention::prune_now(&self.db, &actor, &trace).await?;
        tracing::info!(invocations = p.invocations, audit = p.audit, "Pruned on request.");
        Ok(Response::new(PruneNowReply { invocations: p.invocations, audit: p.audit }))
    }

    async fn backup(&self, req: Request<BackupRequest>) -> Result<Response<BackupReply>, Status> {
        let trace = coffer_runtime::grpc::current_trace().unwrap_or_default();
        let r = req.into_inner();
        let started = std::time::Instant::now();
        let out = crate::backup::backup(&self.db, &r.path).await?;
        let dir = out.dir.display().to_string();
        tracing::info!(
            dir = %dir,
            secret_key = out.secret_key_included,
            skipped = out.skipped.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "Backup written."
        );
        let target = dir.clone();
        self.db.write(move |t, _| audit(t, &trace, &r.actor, "backup.create", &target)).await?;
        Ok(Response::new(BackupReply {
            path: dir,
            manifest_json: out.manifest_json,
            secret_key_included: out.secret_key_included,
            skipped: out.skipped,
        }))
    }

    async fn head(&self, _: Request<HeadRequest>) -> Result<Response<HeadReply>, Status> {
        Ok(Response::new(HeadReply { seq: self.db.head() }))
    }

    type WatchChangesStream = ChangeStream;

    async fn watch_changes(&self, req: Request<WatchChangesRequest>) -> Result<Response<ChangeStream>, Status> {
        let mut last = req.into_inner().from_seq;
        // Subscribe before reading the backlog so nothing falls between the two.
        let mut live = self.db.subscribe();
        let db = self.db.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Change, Status>>(256);
        tokio::spawn(async move {
            loop {
                match db.changes_since(last, 1000).await {
                    Ok(batch) if batch.is_empty() => break,
                    Ok(batch) => {
                        for c in batch {
                            last = c.seq;
                            if tx.send(Ok(to_proto(&c))).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                }
            }
            loop {
                match live.recv().await {
                    Ok(c) if c.seq <= last => {}
                    Ok(c) => {
                        last = c.seq;
                        if tx.send(Ok(to_proto(&c))).await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        let _ = tx
                            .send(Err(Status::data_loss(format!(
                                "watcher lagged by {n} changes; reload and watch again"
                            ))))
                            .await;
                        return;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}

fn to_proto(c: &crate::db::ChangeRec) -> Change {
    Change { seq: c.seq, entity: c.entity.into(), key: c.key.clone(), op: c.op.into() }
}

/// Trims a `limit + 1` result to `limit` and returns the cursor for the next page (0 = none).
fn page<T>(mut items: Vec<T>, limit: u32, id: impl Fn(&T) -> i64) -> (Vec<T>, i64) {
    if items.len() > limit as usize {
        items.truncate(limit as usize);
        let next = items.last().map(&id).unwrap_or(0);
        (items, next)
    } else {
        (items, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service() -> (tempfile::TempDir, StoreService) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        let svc = StoreService::new(db, Vault::new(dir.path().join("secret.key")));
        (dir, svc)
    }

    async fn set(svc: &StoreService, name: &str, value: &str) -> Result<WriteCredentialReply, Status> {
        let req = SetCredentialRequest { name: name.into(), value: value.into(), actor: "cli".into() };
        svc.set_credential(Request::new(req)).await.map(Response::into_inner)
    }

    async fn resolve(svc: &StoreService, names: &[&str]) -> Result<HashMap<String, String>, Status> {
        let req = ResolveCredentialsRequest { names: names.iter().map(|n| (*n).to_owned()).collect() };
        svc.resolve_credentials(Request::new(req)).await.map(|r| r.into_inner().values)
    }

    #[tokio::test]
    async fn credentials_lifecycle_never_exposes_values() {
        let (dir, svc) = service();
        let secret = "s3cr3t-0123456789abcdef";
        let r = set(&svc, "github", secret).await.unwrap();
        let c = r.credential.unwrap();
        assert_eq!((c.name.as_str(), c.version), ("github", 1));
        assert!(r.seq > 0);
        let r2 = set(&svc, "github", "second-value").await.unwrap();
        let c2 = r2.credential.unwrap();
        assert_eq!(c2.version, 2);
        assert_eq!(c2.created_at, c.created_at);
        assert!(r2.seq > r.seq);
        set(&svc, "npm.token", secret).await.unwrap();

        let list = svc.list_credentials(Request::new(ListCredentialsRequest {})).await.unwrap().into_inner().items;
        assert_eq!(list.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), ["github", "npm.token"]);

        let values = resolve(&svc, &["npm.token", "github", "npm.token"]).await.unwrap();
        assert_eq!(values.len(), 2);
        assert_eq!(values["github"], "second-value");
        assert_eq!(values["npm.token"], secret);
        let dbg = format!("{:?}", ResolveCredentialsReply { values });
        assert!(!dbg.contains(secret) && dbg.contains("github"), "{dbg}");
        let dbg =
            format!("{:?}", SetCredentialRequest { name: "n".into(), value: secret.into(), actor: String::new() });
        assert!(!dbg.contains(secret), "{dbg}");

        let e = resolve(&svc, &["github", "nope", "also-missing"]).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        assert!(e.message().contains("\"nope\""), "{}", e.message());

        for (name, value) in [("bad name", "x"), ("_x", "x"), ("ok", ""), ("ok", "a\0b")] {
            let e = set(&svc, name, value).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{name:?}");
        }

        let del = |name: &str| {
            let req = DeleteCredentialRequest { name: name.into(), actor: String::new() };
            svc.delete_credential(Request::new(req))
        };
        del("npm.token").await.unwrap();
        assert_eq!(del("npm.token").await.unwrap_err().code(), tonic::Code::NotFound);

        let audit = svc
            .list_audit(Request::new(ListAuditRequest { limit: 100, ..Default::default() }))
            .await
            .unwrap()
            .into_inner()
            .items;
        let actions: Vec<(&str, &str, &str)> =
            audit.iter().rev().map(|a| (a.actor.as_str(), a.action.as_str(), a.target.as_str())).collect();
        assert_eq!(
            actions,
            [
                ("cli", "credential.set", "github"),
                ("cli", "credential.set", "github"),
                ("cli", "credential.set", "npm.token"),
                ("api", "credential.remove", "npm.token"),
            ]
        );
        let changes = svc.db.changes_since(0, 100).await.unwrap();
        let ops: Vec<(&str, &str, &str)> = changes.iter().map(|c| (c.entity, c.key.as_str(), c.op)).collect();
        assert_eq!(
            ops,
            [
                ("credential", "github", "create"),
                ("credential", "github", "update"),
                ("credential", "npm.token", "create"),
                ("credential", "npm.token", "delete"),
            ]
        );

        // Neither the database nor its WAL holds a value in the clear.
        for f in ["coffer.db", "coffer.db-wal"] {
            let bytes = std::fs::read(dir.path().join(f)).unwrap_or_default();
            for v in [secret, "second-value"] {
                assert!(!bytes.windows(v.len()).any(|w| w == v.as_bytes()), "{f} holds a value");
            }
        }
    }

    #[tokio::test]
    async fn a_lost_key_is_reported_not_replaced() {
        let (dir, svc) = service();
        set(&svc, "github", "value-1").await.unwrap();
        // A restarted store whose key file was deleted.
        std::fs::remove_file(dir.path().join("secret.key")).unwrap();
        let svc = StoreService::new(svc.db.clone(), Vault::new(dir.path().join("secret.key")));
        let e = resolve(&svc, &["github"]).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("secret.key") && e.message().contains("missing"), "{}", e.message());
        let e = set(&svc, "other", "x").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(!dir.path().join("secret.key").exists());
    }

    #[test]
    fn server_names() {
        for ok in ["a", "everything", "my-server-2", "0abc", "abcdefghijklmnopqrstuvwx"] {
            validate_server_name(ok).unwrap();
        }
        for bad in ["", "A", "a_b", "a__b", "-a", "coffer", "abcdefghijklmnopqrstuvwxy", "a b", "é"] {
            assert!(validate_server_name(bad).is_err(), "{bad}");
        }
    }
}
