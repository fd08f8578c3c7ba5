//! The `Registry` service: the MCP server registry (`mcp_servers`) and the per-capability
//! enable/disable preferences (`capability_prefs`). Every write is audited and produces a
//! change row (entity `server` or `preference`).
use coffer_proto::store::registry_server::Registry;
use coffer_proto::store::*;
use coffer_types::BUILTIN_SERVER;
use rusqlite::{Connection, OptionalExtension, Row, params};
use tonic::{Request, Response, Status};

use super::{audit, required, trace, truncate};
use crate::db::{Db, StoreError};

/// Validates an MCP server name ([`coffer_types::check_server_name`]:
/// `^[a-z0-9][a-z0-9-]{0,23}$`, not the reserved `coffer`).
///
/// # Errors
/// [`StoreError::Invalid`] with a message naming the rule that failed.
pub fn validate_server_name(name: &str) -> Result<(), StoreError> {
    coffer_types::check_server_name(name).map_err(StoreError::Invalid)
}

/// At most this many `args` of a server (a command line, not a data file).
pub const MAX_ARGS: usize = 1024;
/// At most this many `env` entries of a server.
pub const MAX_ENV: usize = 1024;
/// At most this many `headers` of a server.
pub const MAX_HEADERS: usize = 256;

pub(crate) fn validate_server(s: &McpServer) -> Result<(), StoreError> {
    validate_server_name(&s.name)?;
    match required::<Transport>(s.transport, "transport")? {
        Transport::Stdio => {
            if s.command.is_empty() {
                return Err(StoreError::Invalid("a stdio server needs a command".into()));
            }
            // An absolute path, or a bare name each machine resolves on its PATH when the
            // server starts (a synced registry may reach a machine with another layout); a
            // relative path would depend on the daemon's working directory.
            if !s.command.starts_with('/') && s.command.contains('/') {
                return Err(StoreError::Invalid(format!(
                    "command {:?} must be an absolute path or a bare name",
                    truncate(&s.command, 80)
                )));
            }
        }
        Transport::Http | Transport::Sse => {
            if !(s.url.starts_with("http://") || s.url.starts_with("https://")) {
                return Err(StoreError::Invalid(format!(
                    "url {:?} must start with http:// or https://",
                    truncate(&s.url, 80)
                )));
            }
        }
        Transport::Unspecified => unreachable!("required() refuses it"),
    }
    for k in s.env.keys() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(StoreError::Invalid(format!("invalid environment variable name {:?}", truncate(k, 40))));
        }
    }
    // What could never start is refused here, not when the server starts: a NUL cannot be in
    // an argument, an environment value or a path (exec's strings end at it), a header name is
    // an HTTP token (RFC 9110 §5.1) and a header value has no control character but tab
    // (§5.5: no CR/LF, so nothing can be smuggled into the request). Values are never quoted.
    for (what, n, max) in
        [("args", s.args.len(), MAX_ARGS), ("env", s.env.len(), MAX_ENV), ("headers", s.headers.len(), MAX_HEADERS)]
    {
        if n > max {
            return Err(StoreError::Invalid(format!("{what} has {n} entries; at most {max}")));
        }
    }
    if s.command.contains('\0') || s.cwd.contains('\0') || s.url.contains('\0') {
        return Err(StoreError::Invalid("command, cwd and url must not contain a NUL character".into()));
    }
    if let Some(i) = s.args.iter().position(|a| a.contains('\0')) {
        return Err(StoreError::Invalid(format!("args[{i}] contains a NUL character")));
    }
    if let Some(k) = s.env.iter().find(|(_, v)| v.contains('\0')).map(|(k, _)| k) {
        return Err(StoreError::Invalid(format!("env {:?}: the value contains a NUL character", truncate(k, 40))));
    }
    for (k, v) in &s.headers {
        let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if k.is_empty() || !k.bytes().all(tchar) {
            return Err(StoreError::Invalid(format!(
                "invalid header name {:?}: letters, digits and !#$%&'*+-.^_`|~ only",
                truncate(k, 40)
            )));
        }
        if v.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(StoreError::Invalid(format!(
                "header {:?}: the value contains a control character (CR, LF, NUL, …)",
                truncate(k, 40)
            )));
        }
    }
    Ok(())
}

const SERVER_COLS: &str = "name, transport, command, args_json, env_json, cwd, url, headers_json, enabled, timeout_ms, version, created_at, updated_at, no_sandbox";

fn server_from_row(r: &Row<'_>) -> rusqlite::Result<McpServer> {
    let json = |i: usize| -> rusqlite::Result<String> { r.get(i) };
    // The column's CHECK admits only the words `Transport::parse` knows.
    let transport = Transport::parse(&r.get::<_, String>(1)?).unwrap_or_default();
    Ok(McpServer {
        name: r.get(0)?,
        transport: transport.into(),
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
        no_sandbox: r.get::<_, i64>(13)? != 0,
    })
}

/// Writes every column of `s` (insert, or replace the row with the same name), inside the
/// caller's transaction. The caller has validated `s` and set `version`, `created_at` and
/// `updated_at`.
fn write_server_row(t: &Connection, s: &McpServer) -> Result<(), StoreError> {
    t.execute(
        &format!(
            "INSERT INTO mcp_servers ({SERVER_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
             ON CONFLICT (name) DO UPDATE SET transport = excluded.transport, command = excluded.command,
               args_json = excluded.args_json, env_json = excluded.env_json, cwd = excluded.cwd, url = excluded.url,
               headers_json = excluded.headers_json, enabled = excluded.enabled, timeout_ms = excluded.timeout_ms,
               version = excluded.version, created_at = excluded.created_at, updated_at = excluded.updated_at,
               no_sandbox = excluded.no_sandbox"
        ),
        params![
            s.name,
            s.transport().as_str(),
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
            s.updated_at,
            s.no_sandbox as i64
        ],
    )?;
    Ok(())
}

fn get_server_tx(t: &Connection, name: &str) -> Result<Option<McpServer>, StoreError> {
    Ok(t.query_row(&format!("SELECT {SERVER_COLS} FROM mcp_servers WHERE name = ?1"), [name], server_from_row)
        .optional()?)
}

/// [`StoreError::Conflict`] unless `expected` is unset or `current`.
fn check_version(name: &str, expected: Option<i64>, current: i64) -> Result<(), StoreError> {
    match expected {
        Some(expected) if expected != current => {
            Err(StoreError::Conflict { what: format!("server {name:?}"), expected, current })
        }
        _ => Ok(()),
    }
}

/// The `Registry` gRPC service.
pub struct RegistryService {
    db: Db,
}

impl RegistryService {
    /// The service over `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

#[tonic::async_trait]
impl Registry for RegistryService {
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
        let trace = trace();
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
                audit::record(t, &trace, &r.actor, "server.create", &s.name)?;
                ch.push(ChangeEntity::Server, s.name.clone(), ChangeOp::Create);
                Ok(s)
            })
            .await?;
        Ok(Response::new(WriteServerReply { server: Some(server), seq }))
    }

    async fn update_server(&self, req: Request<UpdateServerRequest>) -> Result<Response<WriteServerReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        let mut s = r.server.ok_or_else(|| Status::invalid_argument("server is required"))?;
        validate_server(&s)?;
        let (server, seq) = self
            .db
            .write(move |t, ch| {
                let cur =
                    get_server_tx(t, &s.name)?.ok_or_else(|| StoreError::NotFound(format!("server {:?}", s.name)))?;
                check_version(&s.name, r.expected_version, cur.version)?;
                s.version = cur.version + 1;
                s.created_at = cur.created_at;
                s.updated_at = coffer_runtime::now_rfc3339();
                write_server_row(t, &s)?;
                let action = if cur.enabled != s.enabled {
                    if s.enabled { "server.enable" } else { "server.disable" }
                } else {
                    "server.update"
                };
                audit::record(t, &trace, &r.actor, action, &s.name)?;
                ch.push(ChangeEntity::Server, s.name.clone(), ChangeOp::Update);
                Ok(s)
            })
            .await?;
        Ok(Response::new(WriteServerReply { server: Some(server), seq }))
    }

    async fn delete_server(&self, req: Request<DeleteServerRequest>) -> Result<Response<WriteReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        let ((), seq) = self
            .db
            .write(move |t, ch| {
                let cur =
                    get_server_tx(t, &r.name)?.ok_or_else(|| StoreError::NotFound(format!("server {:?}", r.name)))?;
                check_version(&r.name, r.expected_version, cur.version)?;
                t.execute("DELETE FROM mcp_servers WHERE name = ?1", [&r.name])?;
                t.execute("DELETE FROM capability_prefs WHERE server = ?1", [&r.name])?;
                audit::record(t, &trace, &r.actor, "server.remove", &r.name)?;
                ch.push(ChangeEntity::Server, r.name.clone(), ChangeOp::Delete);
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
                    // The column's CHECK admits only the words `CapabilityKind::parse` knows.
                    let kind = CapabilityKind::parse(&r.get::<_, String>(1)?).unwrap_or_default();
                    Ok(Preference {
                        server: r.get(0)?,
                        kind: kind.into(),
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
        let trace = trace();
        let r = req.into_inner();
        let p = r.preference.ok_or_else(|| Status::invalid_argument("preference is required"))?;
        validate_server_name(&p.server).or_else(|e| if p.server == BUILTIN_SERVER { Ok(()) } else { Err(e) })?;
        let kind = required::<CapabilityKind>(p.kind, "kind")?.as_str();
        if p.name.is_empty() || p.name.len() > 1024 {
            return Err(Status::invalid_argument("capability name must be 1-1024 bytes"));
        }
        let ((), seq) = self
            .db
            .write(move |t, ch| {
                t.execute(
                    "INSERT INTO capability_prefs (server, kind, name, enabled, updated_at) VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (server, kind, name) DO UPDATE SET enabled = excluded.enabled, updated_at = excluded.updated_at",
                    params![p.server, kind, p.name, p.enabled as i64, coffer_runtime::now_rfc3339()],
                )?;
                let target = format!("{}/{kind}/{}", p.server, p.name);
                let action = if p.enabled { "capability.enable" } else { "capability.disable" };
                audit::record(t, &trace, &r.actor, action, &target)?;
                ch.push(ChangeEntity::Preference, target, ChangeOp::Set);
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service() -> (tempfile::TempDir, RegistryService) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        (dir, RegistryService::new(db))
    }

    fn stdio(name: &str) -> McpServer {
        McpServer {
            name: name.into(),
            transport: Transport::Stdio.into(),
            command: "/bin/true".into(),
            ..Default::default()
        }
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

    #[test]
    fn what_could_never_start_is_refused_at_registration() {
        let http = |headers: &[(&str, &str)]| McpServer {
            name: "h".into(),
            transport: Transport::Http.into(),
            url: "https://x.test/mcp".into(),
            headers: headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            ..Default::default()
        };
        validate_server(&http(&[("Authorization", "Bearer t\tx"), ("X-A", "é")])).unwrap();
        for (headers, says) in [
            (&[("X-A", "a\r\nX-Injected: 1")][..], "control character"),
            (&[("X-A", "a\0")], "control character"),
            (&[("Bad Name", "v")], "invalid header name"),
            (&[("", "v")], "invalid header name"),
            (&[("X:A", "v")], "invalid header name"),
        ] {
            let e = validate_server(&http(headers)).unwrap_err().to_string();
            assert!(e.contains(says), "{headers:?}: {e}");
            assert!(!e.contains("Injected"), "the value is not quoted: {e}");
        }
        let env = McpServer { env: [("A".to_owned(), "x\0y".to_owned())].into(), ..stdio("a") };
        assert!(validate_server(&env).unwrap_err().to_string().contains("env \"A\""));
        let args = McpServer { args: vec!["ok".into(), "a\0b".into()], ..stdio("a") };
        assert!(validate_server(&args).unwrap_err().to_string().contains("args[1]"));
        let cwd = McpServer { cwd: "/tmp/\0".into(), ..stdio("a") };
        assert!(validate_server(&cwd).is_err());
        // Sizes: at the cap is fine, one more is refused naming the list.
        validate_server(&McpServer { args: vec!["a".into(); MAX_ARGS], ..stdio("a") }).unwrap();
        let e = validate_server(&McpServer { args: vec!["a".into(); MAX_ARGS + 1], ..stdio("a") }).unwrap_err();
        assert_eq!(e.to_string(), format!("args has {} entries; at most {MAX_ARGS}", MAX_ARGS + 1));
        let env = (0..=MAX_ENV).map(|i| (format!("K{i}"), "v".to_owned())).collect();
        assert!(validate_server(&McpServer { env, ..stdio("a") }).unwrap_err().to_string().starts_with("env has"));
        let headers = (0..=MAX_HEADERS).map(|i| (format!("X-{i}"), "v".to_owned())).collect();
        assert!(validate_server(&http(&[])).is_ok());
        let many = McpServer { headers, ..http(&[]) };
        assert!(validate_server(&many).unwrap_err().to_string().starts_with("headers has"));
    }

    #[tokio::test]
    async fn versions_are_checked_only_when_expected() {
        let (_dir, svc) = service();
        let create = CreateServerRequest { server: Some(stdio("a")), actor: "cli".into() };
        let s = svc.create_server(Request::new(create)).await.unwrap().into_inner().server.unwrap();
        assert_eq!((s.version, s.transport()), (1, Transport::Stdio));
        let update = |expected_version| UpdateServerRequest {
            server: Some(McpServer { enabled: true, ..stdio("a") }),
            expected_version,
            actor: String::new(),
        };
        let e = svc.update_server(Request::new(update(Some(7)))).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted);
        let s = svc.update_server(Request::new(update(Some(1)))).await.unwrap().into_inner().server.unwrap();
        assert_eq!(s.version, 2);
        let s = svc.update_server(Request::new(update(None))).await.unwrap().into_inner().server.unwrap();
        assert_eq!(s.version, 3);
        let delete =
            |expected_version| DeleteServerRequest { name: "a".into(), expected_version, actor: String::new() };
        assert_eq!(svc.delete_server(Request::new(delete(Some(2)))).await.unwrap_err().code(), tonic::Code::Aborted);
        svc.delete_server(Request::new(delete(Some(3)))).await.unwrap();
        assert_eq!(svc.delete_server(Request::new(delete(None))).await.unwrap_err().code(), tonic::Code::NotFound);
    }

    #[tokio::test]
    async fn unset_enums_are_refused() {
        let (_dir, svc) = service();
        let create = CreateServerRequest {
            server: Some(McpServer { transport: Transport::Unspecified.into(), ..stdio("a") }),
            actor: String::new(),
        };
        let e = svc.create_server(Request::new(create)).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "transport is required"));
        let create =
            CreateServerRequest { server: Some(McpServer { transport: 9, ..stdio("a") }), actor: String::new() };
        assert_eq!(svc.create_server(Request::new(create)).await.unwrap_err().code(), tonic::Code::InvalidArgument);
        let set = |kind: i32| SetPreferenceRequest {
            preference: Some(Preference { server: "coffer".into(), kind, name: "x".into(), ..Default::default() }),
            actor: String::new(),
        };
        let e = svc.set_preference(Request::new(set(0))).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "kind is required"));
        svc.set_preference(Request::new(set(CapabilityKind::Prompt.into()))).await.unwrap();
        let prefs = svc
            .list_preferences(Request::new(ListPreferencesRequest::default()))
            .await
            .unwrap()
            .into_inner()
            .preferences;
        assert_eq!(prefs.iter().map(|p| (p.kind(), p.enabled)).collect::<Vec<_>>(), [(CapabilityKind::Prompt, false)]);
    }
}
