//! The `LlmConnections` service (`proto/store_llm.proto`): the person's LLM connections
//! (`llm_connections`, migration 0006) — wire, base URL, credential reference, model, fast model
//! and the one internal default. A row never holds a secret: `credential_ref` names a row of
//! `credentials`, resolved only by coffer-chat. Every write is audited (actor, never a value) and
//! produces a change row (entity `llm_connection`, key = the name; also for a connection that
//! loses the default to another).
//!
//! At most one connection is the `internal_default`: setting it clears the previous one in the
//! same transaction, and a partial unique index refuses a second. The field rules live once in
//! `coffer_types::llm`: this module enforces them, the edge checks drafts with them and the CLI
//! spells the wires from them. Readers are the gateway and chat, the writer the gateway
//! ([`crate::authz`]).
use coffer_proto::store::llm_connections_server::LlmConnections;
use coffer_proto::store::*;
use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};
use tonic::{Request, Response, Status};

use coffer_types::llm::{check_base_url, check_model};

use super::{audit, required, trace, truncate};
use crate::db::{Db, StoreError};

/// Validates a connection name (`coffer_types::llm::check_name`: `^[a-z0-9][a-z0-9-]{0,31}$`).
///
/// # Errors
/// [`StoreError::Invalid`] naming the field and the rule.
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    coffer_types::llm::check_name(name).map_err(StoreError::Invalid)
}

/// Validates a whole record (the fields a caller sets; `version` and the times are the
/// store's).
///
/// # Errors
/// [`StoreError::Invalid`] naming the first field that breaks its rule.
pub fn validate(c: &LlmConnection) -> Result<(), StoreError> {
    validate_name(&c.name)?;
    let wire = required::<LlmWire>(c.wire, "wire")?;
    if !c.base_url.is_empty() {
        check_base_url(&c.base_url).map_err(StoreError::Invalid)?;
    }
    match wire {
        LlmWire::Ollama if c.base_url.is_empty() => {
            return Err(StoreError::Invalid(
                "base_url is required for an ollama connection (e.g. http://127.0.0.1:11434)".into(),
            ));
        }
        LlmWire::Anthropic | LlmWire::OpenaiResponses | LlmWire::OpenaiChat
            if c.base_url.is_empty() && c.credential_ref.is_empty() =>
        {
            return Err(StoreError::Invalid(format!(
                "credential_ref is required for an {} connection on the provider's public API (give an API key or \
                 a credential name)",
                wire.as_str()
            )));
        }
        _ => {}
    }
    if !c.credential_ref.is_empty() {
        crate::credential_crypto::validate_name(&c.credential_ref).map_err(|_| {
            StoreError::Invalid(format!(
                "credential_ref {:?} is not a valid credential name: use 1-{} characters A-Z, a-z, 0-9, '_', '.' and \
                 '-', starting with a letter or digit",
                truncate(&c.credential_ref, 80),
                crate::credential_crypto::MAX_NAME_LEN
            ))
        })?;
    }
    check_model("model", &c.model).map_err(StoreError::Invalid)?;
    if !c.fast_model.is_empty() {
        check_model("fast_model", &c.fast_model).map_err(StoreError::Invalid)?;
    }
    Ok(())
}

const COLS: &str =
    "name, wire, base_url, credential_ref, model, fast_model, internal_default, version, created_at, updated_at";

fn from_row(r: &Row<'_>) -> rusqlite::Result<LlmConnection> {
    // The column's CHECK admits only the words `LlmWire::parse` knows.
    let wire = LlmWire::parse(&r.get::<_, String>(1)?).unwrap_or_default();
    Ok(LlmConnection {
        name: r.get(0)?,
        wire: wire.into(),
        base_url: r.get(2)?,
        credential_ref: r.get(3)?,
        model: r.get(4)?,
        fast_model: r.get(5)?,
        internal_default: r.get::<_, i64>(6)? != 0,
        version: r.get(7)?,
        created_at: r.get(8)?,
        updated_at: r.get(9)?,
    })
}

pub(crate) fn get_tx(t: &Connection, name: &str) -> Result<Option<LlmConnection>, StoreError> {
    Ok(t.query_row(&format!("SELECT {COLS} FROM llm_connections WHERE name = ?1"), [name], from_row).optional()?)
}

/// Writes every column of `c` (insert, or replace the row with that name) inside the caller's
/// transaction; the caller has validated `c` and set its version and times.
pub(crate) fn write_row(t: &Connection, c: &LlmConnection) -> Result<(), StoreError> {
    t.execute(
        &format!(
            "INSERT INTO llm_connections ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
             ON CONFLICT (name) DO UPDATE SET wire = excluded.wire, base_url = excluded.base_url,
               credential_ref = excluded.credential_ref, model = excluded.model, fast_model = excluded.fast_model,
               internal_default = excluded.internal_default, version = excluded.version,
               created_at = excluded.created_at, updated_at = excluded.updated_at"
        ),
        params![
            c.name,
            c.wire().as_str(),
            c.base_url,
            c.credential_ref,
            c.model,
            c.fast_model,
            c.internal_default as i64,
            c.version,
            c.created_at,
            c.updated_at
        ],
    )?;
    Ok(())
}

/// Takes the internal-default flag off every connection but `keep` (bumping their versions),
/// pushing a change row for each and auditing the loss; inside the caller's transaction, before
/// `keep` gets the flag (the partial unique index admits one flagged row only).
fn clear_default(
    t: &Transaction,
    ch: &mut crate::db::Changes,
    trace: &str,
    actor: &str,
    keep: &str,
) -> Result<(), StoreError> {
    let now = coffer_runtime::now_rfc3339();
    let mut st = t.prepare_cached(
        "UPDATE llm_connections SET internal_default = 0, version = version + 1, updated_at = ?2
         WHERE internal_default = 1 AND name <> ?1 RETURNING name",
    )?;
    let names = st.query_map(params![keep, now], |r| r.get::<_, String>(0))?.collect::<Result<Vec<_>, _>>()?;
    for name in names {
        audit::record(t, trace, actor, "llm.default.unset", &name)?;
        ch.push(ChangeEntity::LlmConnection, name, ChangeOp::Update);
    }
    Ok(())
}

/// [`StoreError::Conflict`] unless `expected` is unset or `current`.
fn check_version(name: &str, expected: Option<i64>, current: i64) -> Result<(), StoreError> {
    match expected {
        Some(expected) if expected != current => {
            Err(StoreError::Conflict { what: format!("LLM connection {name:?}"), expected, current })
        }
        _ => Ok(()),
    }
}

fn not_found(name: &str) -> StoreError {
    StoreError::NotFound(format!("LLM connection {:?}", truncate(name, 40)))
}

/// The `LlmConnections` gRPC service.
pub struct LlmConnectionsService {
    db: Db,
}

impl LlmConnectionsService {
    /// The service over `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

#[tonic::async_trait]
impl LlmConnections for LlmConnectionsService {
    async fn list_connections(
        &self,
        _: Request<ListConnectionsRequest>,
    ) -> Result<Response<ListConnectionsReply>, Status> {
        let head = self.db.head();
        let connections = self
            .db
            .read(|c| {
                let mut st = c.prepare_cached(&format!("SELECT {COLS} FROM llm_connections ORDER BY name"))?;
                let rows = st.query_map([], from_row)?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        Ok(Response::new(ListConnectionsReply { connections, seq: head }))
    }

    async fn get_connection(&self, req: Request<GetConnectionRequest>) -> Result<Response<LlmConnection>, Status> {
        let name = req.into_inner().name;
        let n2 = name.clone();
        let c = self.db.read(move |c| get_tx(c, &n2)).await?;
        c.map(Response::new).ok_or_else(|| not_found(&name).into())
    }

    async fn create_connection(
        &self,
        req: Request<CreateConnectionRequest>,
    ) -> Result<Response<WriteConnectionReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        let mut c = r.connection.ok_or_else(|| Status::invalid_argument("connection is required"))?;
        validate(&c)?;
        let (connection, seq) = self
            .db
            .write(move |t, ch| {
                if get_tx(t, &c.name)?.is_some() {
                    return Err(StoreError::Exists(format!("LLM connection {:?}", c.name)));
                }
                if c.internal_default {
                    clear_default(t, ch, &trace, &r.actor, &c.name)?;
                }
                let now = coffer_runtime::now_rfc3339();
                c.version = 1;
                c.created_at = now.clone();
                c.updated_at = now;
                write_row(t, &c)?;
                audit::record(t, &trace, &r.actor, "llm.create", &c.name)?;
                if c.internal_default {
                    audit::record(t, &trace, &r.actor, "llm.default.set", &c.name)?;
                }
                ch.push(ChangeEntity::LlmConnection, c.name.clone(), ChangeOp::Create);
                Ok(c)
            })
            .await?;
        Ok(Response::new(WriteConnectionReply { connection: Some(connection), seq }))
    }

    async fn update_connection(
        &self,
        req: Request<UpdateConnectionRequest>,
    ) -> Result<Response<WriteConnectionReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        let mut c = r.connection.ok_or_else(|| Status::invalid_argument("connection is required"))?;
        validate(&c)?;
        let (connection, seq) = self
            .db
            .write(move |t, ch| {
                let cur = get_tx(t, &c.name)?.ok_or_else(|| not_found(&c.name))?;
                check_version(&c.name, r.expected_version, cur.version)?;
                if c.internal_default && !cur.internal_default {
                    clear_default(t, ch, &trace, &r.actor, &c.name)?;
                }
                c.version = cur.version + 1;
                c.created_at = cur.created_at.clone();
                c.updated_at = coffer_runtime::now_rfc3339();
                write_row(t, &c)?;
                audit::record(t, &trace, &r.actor, "llm.update", &c.name)?;
                if c.internal_default != cur.internal_default {
                    let action = if c.internal_default { "llm.default.set" } else { "llm.default.unset" };
                    audit::record(t, &trace, &r.actor, action, &c.name)?;
                }
                ch.push(ChangeEntity::LlmConnection, c.name.clone(), ChangeOp::Update);
                Ok(c)
            })
            .await?;
        Ok(Response::new(WriteConnectionReply { connection: Some(connection), seq }))
    }

    async fn delete_connection(&self, req: Request<DeleteConnectionRequest>) -> Result<Response<WriteReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        let ((), seq) = self
            .db
            .write(move |t, ch| {
                let cur = get_tx(t, &r.name)?.ok_or_else(|| not_found(&r.name))?;
                check_version(&r.name, r.expected_version, cur.version)?;
                t.execute("DELETE FROM llm_connections WHERE name = ?1", [&r.name])?;
                audit::record(t, &trace, &r.actor, "llm.remove", &r.name)?;
                ch.push(ChangeEntity::LlmConnection, r.name.clone(), ChangeOp::Delete);
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }

    async fn set_internal_default(
        &self,
        req: Request<SetInternalDefaultRequest>,
    ) -> Result<Response<WriteReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        if !r.name.is_empty() {
            validate_name(&r.name)?;
        }
        let ((), seq) = self
            .db
            .write(move |t, ch| {
                if r.name.is_empty() {
                    return clear_default(t, ch, &trace, &r.actor, "");
                }
                let cur = get_tx(t, &r.name)?.ok_or_else(|| not_found(&r.name))?;
                if cur.internal_default {
                    return Ok(());
                }
                clear_default(t, ch, &trace, &r.actor, &r.name)?;
                t.execute(
                    "UPDATE llm_connections SET internal_default = 1, version = version + 1, updated_at = ?2 WHERE name = ?1",
                    params![r.name, coffer_runtime::now_rfc3339()],
                )?;
                audit::record(t, &trace, &r.actor, "llm.default.set", &r.name)?;
                ch.push(ChangeEntity::LlmConnection, r.name.clone(), ChangeOp::Update);
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn service() -> (tempfile::TempDir, Arc<LlmConnectionsService>) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        (dir, Arc::new(LlmConnectionsService::new(db)))
    }

    fn anthropic(name: &str) -> LlmConnection {
        LlmConnection {
            name: name.into(),
            wire: LlmWire::Anthropic.into(),
            credential_ref: format!("llm-{name}"),
            model: "claude-sonnet-4-5".into(),
            ..Default::default()
        }
    }

    fn create(c: LlmConnection) -> Request<CreateConnectionRequest> {
        Request::new(CreateConnectionRequest { connection: Some(c), actor: "cli".into() })
    }

    async fn list(svc: &LlmConnectionsService) -> Vec<LlmConnection> {
        svc.list_connections(Request::new(ListConnectionsRequest {})).await.unwrap().into_inner().connections
    }

    async fn defaults(svc: &LlmConnectionsService) -> Vec<String> {
        list(svc).await.into_iter().filter(|c| c.internal_default).map(|c| c.name).collect()
    }

    fn message(r: Result<(), StoreError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn wire_words_match_the_proto() {
        let proto: Vec<&str> = LlmWire::ALL.iter().map(|w| w.as_str()).collect();
        assert_eq!(proto, coffer_types::llm::WIRES);
    }

    #[test]
    fn records() {
        validate(&anthropic("a")).unwrap();
        let ollama = LlmConnection {
            name: "local".into(),
            wire: LlmWire::Ollama.into(),
            base_url: "http://127.0.0.1:11434".into(),
            model: "llama3.2".into(),
            ..Default::default()
        };
        validate(&ollama).unwrap();
        // A custom OpenAI-compatible endpoint may need no credential.
        validate(&LlmConnection {
            wire: LlmWire::OpenaiChat.into(),
            base_url: "http://127.0.0.1:8080".into(),
            credential_ref: String::new(),
            ..anthropic("vllm")
        })
        .unwrap();
        let cases: Vec<(LlmConnection, &str)> = vec![
            (LlmConnection { wire: 0, ..anthropic("a") }, "wire is required"),
            (LlmConnection { wire: 99, ..anthropic("a") }, "wire is required"),
            (LlmConnection { base_url: String::new(), ..ollama.clone() }, "base_url is required for an ollama"),
            (LlmConnection { credential_ref: String::new(), ..anthropic("a") }, "credential_ref is required"),
            (
                LlmConnection {
                    wire: LlmWire::OpenaiResponses.into(),
                    credential_ref: String::new(),
                    ..anthropic("a")
                },
                "credential_ref is required for an openai-responses",
            ),
            (LlmConnection { credential_ref: "bad name".into(), ..anthropic("a") }, "not a valid credential name"),
            (LlmConnection { credential_ref: "x".repeat(65), ..anthropic("a") }, "not a valid credential name"),
            (LlmConnection { model: String::new(), ..anthropic("a") }, "model must be 1-256 bytes, not 0"),
            (LlmConnection { model: "m".repeat(257), ..anthropic("a") }, "model must be 1-256 bytes, not 257"),
            (LlmConnection { model: "a\u{7}b".into(), ..anthropic("a") }, "model must not contain control"),
            (LlmConnection { fast_model: "a\nb".into(), ..anthropic("a") }, "fast_model must not contain control"),
            (LlmConnection { fast_model: "f".repeat(300), ..anthropic("a") }, "fast_model must be 1-256"),
            (LlmConnection { base_url: "nope".into(), ..anthropic("a") }, "base_url \"nope\" is not an absolute URL"),
            (LlmConnection { name: "Bad".into(), ..anthropic("a") }, "name \"Bad\" is invalid"),
            (
                LlmConnection { base_url: "https://k:secret@proxy/".into(), ..anthropic("a") },
                "must not carry a user name or password",
            ),
        ];
        for (c, want) in cases {
            let m = message(validate(&c));
            assert!(m.contains(want), "want {want:?}, got {m:?}");
        }
    }

    #[tokio::test]
    async fn bad_records_write_nothing() {
        let (_dir, svc) = service();
        let e = svc.create_connection(create(LlmConnection { model: String::new(), ..anthropic("a") })).await;
        assert_eq!(e.unwrap_err().code(), tonic::Code::InvalidArgument);
        let e = svc
            .create_connection(Request::new(CreateConnectionRequest { connection: None, actor: String::new() }))
            .await
            .unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "connection is required"));
        assert!(list(&svc).await.is_empty());
        assert_eq!(svc.db.head(), 0, "no change row for a refused write");
        let e = svc.get_connection(Request::new(GetConnectionRequest { name: "a".into() })).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::NotFound, "LLM connection \"a\" not found"));
    }

    #[tokio::test]
    async fn round_trip_versions_changes_and_audit() {
        let (_dir, svc) = service();
        let mut changes = svc.db.subscribe();
        let full = LlmConnection {
            base_url: "https://proxy.example/anthropic".into(),
            fast_model: "claude-haiku-4-5".into(),
            ..anthropic("a")
        };
        let w = svc.create_connection(create(full.clone())).await.unwrap().into_inner();
        let c = w.connection.unwrap();
        assert_eq!((c.version, c.wire(), c.fast_model.as_str()), (1, LlmWire::Anthropic, "claude-haiku-4-5"));
        assert!(!c.created_at.is_empty() && c.created_at == c.updated_at);
        let got = svc.get_connection(Request::new(GetConnectionRequest { name: "a".into() })).await.unwrap();
        assert_eq!(got.into_inner(), c);
        let rec = changes.recv().await.unwrap();
        assert_eq!(
            (rec.entity, rec.key.as_str(), rec.op, rec.seq),
            (ChangeEntity::LlmConnection, "a", ChangeOp::Create, w.seq)
        );

        let update = |expected_version, model: &str| {
            Request::new(UpdateConnectionRequest {
                connection: Some(LlmConnection { model: model.into(), ..full.clone() }),
                expected_version,
                actor: "ui".into(),
            })
        };
        let e = svc.update_connection(update(Some(7), "m2")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted);
        assert!(e.message().contains("expected 7, current 1"), "{}", e.message());
        let c2 = svc.update_connection(update(Some(1), "m2")).await.unwrap().into_inner().connection.unwrap();
        assert_eq!((c2.version, c2.model.as_str(), c2.created_at.as_str()), (2, "m2", c.created_at.as_str()));
        let c3 = svc.update_connection(update(None, "m3")).await.unwrap().into_inner().connection.unwrap();
        assert_eq!(c3.version, 3);
        let e = svc
            .update_connection(Request::new(UpdateConnectionRequest {
                connection: Some(anthropic("ghost")),
                expected_version: None,
                actor: String::new(),
            }))
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);

        let delete = |expected_version| {
            Request::new(DeleteConnectionRequest { name: "a".into(), expected_version, actor: "cli".into() })
        };
        assert_eq!(svc.delete_connection(delete(Some(2))).await.unwrap_err().code(), tonic::Code::Aborted);
        svc.delete_connection(delete(Some(3))).await.unwrap();
        assert_eq!(svc.delete_connection(delete(None)).await.unwrap_err().code(), tonic::Code::NotFound);

        let audit: Vec<(String, String, String)> = svc
            .db
            .read(|c| {
                let mut st = c.prepare("SELECT actor, action, target FROM audit_log ORDER BY id")?;
                let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await
            .unwrap();
        let want = [("cli", "llm.create"), ("ui", "llm.update"), ("ui", "llm.update"), ("cli", "llm.remove")];
        assert_eq!(
            audit.iter().map(|(a, b, t)| (a.as_str(), b.as_str(), t.as_str())).collect::<Vec<_>>(),
            want.iter().map(|(a, b)| (*a, *b, "a")).collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn one_internal_default() {
        let (_dir, svc) = service();
        svc.create_connection(create(LlmConnection { internal_default: true, ..anthropic("a") })).await.unwrap();
        assert_eq!(defaults(&svc).await, ["a"]);
        // Creating another default takes the flag from the first in the same transaction.
        let w =
            svc.create_connection(create(LlmConnection { internal_default: true, ..anthropic("b") })).await.unwrap();
        assert_eq!(defaults(&svc).await, ["b"]);
        let a = list(&svc).await.into_iter().find(|c| c.name == "a").unwrap();
        assert_eq!(a.version, 2, "losing the flag is a write to that record");
        let _ = w;
        svc.create_connection(create(anthropic("c"))).await.unwrap();
        // Updating c to be the default clears b.
        let up = UpdateConnectionRequest {
            connection: Some(LlmConnection { internal_default: true, ..anthropic("c") }),
            expected_version: Some(1),
            actor: String::new(),
        };
        svc.update_connection(Request::new(up)).await.unwrap();
        assert_eq!(defaults(&svc).await, ["c"]);
        let set = |name: &str| Request::new(SetInternalDefaultRequest { name: name.into(), actor: "cli".into() });
        svc.set_internal_default(set("a")).await.unwrap();
        assert_eq!(defaults(&svc).await, ["a"]);
        // Already the default: nothing written.
        let head = svc.db.head();
        svc.set_internal_default(set("a")).await.unwrap();
        assert_eq!(svc.db.head(), head);
        let e = svc.set_internal_default(set("ghost")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        let e = svc.set_internal_default(set("Bad Name")).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(defaults(&svc).await, ["a"], "a refused call changes nothing");
        svc.set_internal_default(set("")).await.unwrap();
        assert!(defaults(&svc).await.is_empty());
        // Deleting the default leaves none.
        svc.set_internal_default(set("b")).await.unwrap();
        let del = DeleteConnectionRequest { name: "b".into(), expected_version: None, actor: String::new() };
        svc.delete_connection(Request::new(del)).await.unwrap();
        assert!(defaults(&svc).await.is_empty());
    }

    #[tokio::test]
    async fn the_index_refuses_a_second_default_even_past_the_service() {
        let (_dir, svc) = service();
        svc.create_connection(create(LlmConnection { internal_default: true, ..anthropic("a") })).await.unwrap();
        svc.create_connection(create(anthropic("b"))).await.unwrap();
        let r = svc
            .db
            .write(|t, _| Ok(t.execute("UPDATE llm_connections SET internal_default = 1 WHERE name = 'b'", [])?))
            .await;
        assert!(r.is_err(), "the partial unique index holds");
        assert_eq!(defaults(&svc).await, ["a"]);
    }

    #[tokio::test]
    async fn concurrent_creates_of_one_name_one_wins() {
        let (_dir, svc) = service();
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let svc = svc.clone();
                tokio::spawn(async move {
                    let c = LlmConnection { model: format!("m{i}"), ..anthropic("same") };
                    svc.create_connection(create(c)).await.map(|r| r.into_inner().connection.unwrap().model)
                })
            })
            .collect();
        let mut won = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(model) => won.push(model),
                Err(e) => assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}"),
            }
        }
        assert_eq!(won.len(), 1);
        let all = list(&svc).await;
        assert_eq!(all.len(), 1);
        assert_eq!((all[0].model.as_str(), all[0].version), (won[0].as_str(), 1));
    }

    #[tokio::test]
    async fn concurrent_set_defaults_leave_exactly_one() {
        let (_dir, svc) = service();
        for n in ["a", "b", "c", "d"] {
            svc.create_connection(create(anthropic(n))).await.unwrap();
        }
        for _round in 0..5 {
            let tasks: Vec<_> = ["a", "b", "c", "d"]
                .into_iter()
                .map(|n| {
                    let svc = svc.clone();
                    tokio::spawn(async move {
                        svc.set_internal_default(Request::new(SetInternalDefaultRequest {
                            name: n.into(),
                            actor: String::new(),
                        }))
                        .await
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap().unwrap();
            }
            assert_eq!(defaults(&svc).await.len(), 1);
        }
    }

    #[tokio::test]
    async fn a_stale_concurrent_update_loses() {
        let (_dir, svc) = service();
        svc.create_connection(create(anthropic("a"))).await.unwrap();
        let tasks: Vec<_> = (0..6)
            .map(|i| {
                let svc = svc.clone();
                tokio::spawn(async move {
                    svc.update_connection(Request::new(UpdateConnectionRequest {
                        connection: Some(LlmConnection { model: format!("m{i}"), ..anthropic("a") }),
                        expected_version: Some(1),
                        actor: String::new(),
                    }))
                    .await
                })
            })
            .collect();
        let mut ok = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => ok += 1,
                Err(e) => assert_eq!(e.code(), tonic::Code::Aborted),
            }
        }
        assert_eq!(ok, 1);
        assert_eq!(list(&svc).await[0].version, 2);
    }
}
