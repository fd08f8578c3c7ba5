//! The `Credentials` service: credential values sealed by [`crate::credential_crypto::CredentialCrypto`]
//! (XChaCha20-Poly1305 under `secret.key`, the name as associated data) in `credentials`. No
//! reply, error, log line or audit row carries a value, except `ResolveCredentials`' reply,
//! which hands values to the gateway when it starts an upstream. Writes are audited and produce
//! change rows (entity `credential`).
use std::sync::Arc;

use coffer_proto::store::credentials_server::Credentials;
use coffer_proto::store::*;
use coffer_types::secrets::REF_PREFIX;
use rusqlite::{OptionalExtension, Row, params};
use secrecy::{ExposeSecret, SecretString};
use tonic::{Request, Response, Status};

use super::{audit, trace, truncate};
use crate::credential_crypto::{CredentialCrypto, CryptoError};
use crate::db::{Db, StoreError};

/// Most names one `ResolveCredentials` call may ask for.
const MAX_RESOLVE: usize = 1024;

impl From<CryptoError> for Status {
    fn from(e: CryptoError) -> Self {
        match e {
            CryptoError::InvalidName(_) | CryptoError::InvalidValue(_) => Status::invalid_argument(e.to_string()),
            CryptoError::Random(_) => {
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

fn credential_from_row(r: &Row<'_>) -> rusqlite::Result<CredentialInfo> {
    Ok(CredentialInfo { name: r.get(0)?, version: r.get(1)?, created_at: r.get(2)?, updated_at: r.get(3)? })
}

/// Whether a channel (any of its `*_ref` columns), an LLM connection (`credential_ref`) or an
/// MCP server's `env` or `headers` (a [`REF_PREFIX`] value) references credential `name`.
///
/// # Errors
/// A database error.
pub(crate) fn credential_in_use(c: &rusqlite::Connection, name: &str) -> Result<bool, StoreError> {
    let reference = format!("{REF_PREFIX}{name}");
    Ok(c.query_row(
        "SELECT EXISTS (SELECT 1 FROM channels WHERE ?1 <> ''
                          AND ?1 IN (bot_token_ref, app_id_ref, app_secret_ref, signing_secret_ref))
             OR EXISTS (SELECT 1 FROM llm_connections WHERE credential_ref = ?1)
             OR EXISTS (SELECT 1 FROM mcp_servers s, json_each(s.env_json) e WHERE e.value = ?2)
             OR EXISTS (SELECT 1 FROM mcp_servers s, json_each(s.headers_json) h WHERE h.value = ?2)",
        params![name, reference],
        |r| r.get::<_, bool>(0),
    )?)
}

/// The `Credentials` gRPC service.
pub struct CredentialsService {
    db: Db,
    vault: Arc<CredentialCrypto>,
}

impl CredentialsService {
    /// The service over `db`, sealing and opening values with `vault`.
    pub fn new(db: Db, vault: CredentialCrypto) -> Self {
        Self { db, vault: Arc::new(vault) }
    }
}

#[tonic::async_trait]
impl Credentials for CredentialsService {
    async fn set_credential(
        &self,
        req: Request<SetCredentialRequest>,
    ) -> Result<Response<WriteCredentialReply>, Status> {
        let trace = trace();
        let mut r = req.into_inner();
        let value = SecretString::from(std::mem::take(&mut r.value));
        crate::credential_crypto::validate_name(&r.name)?;
        crate::credential_crypto::validate_value(&value)?;
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
                    Some(_) if r.create_only => return Err(StoreError::Exists(format!("credential {:?}", r.name))),
                    Some(cur) => {
                        let info = CredentialInfo { version: cur.version + 1, updated_at: now, ..cur };
                        t.execute(
                            "UPDATE credentials SET nonce = ?2, ciphertext = ?3, version = ?4, updated_at = ?5 WHERE name = ?1",
                            params![info.name, sealed.nonce, sealed.ciphertext, info.version, info.updated_at],
                        )?;
                        (info, ChangeOp::Update)
                    }
                    None => {
                        let info = CredentialInfo { name: r.name.clone(), version: 1, created_at: now.clone(), updated_at: now };
                        t.execute(
                            "INSERT INTO credentials (name, nonce, ciphertext, version, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                            params![info.name, sealed.nonce, sealed.ciphertext, info.version, info.created_at, info.updated_at],
                        )?;
                        (info, ChangeOp::Create)
                    }
                };
                audit::record(t, &trace, &r.actor, "credential.set", &info.name)?;
                ch.push(ChangeEntity::Credential, info.name.clone(), op);
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
        let trace = trace();
        let r = req.into_inner();
        let ((), seq) = self
            .db
            .write(move |t, ch| {
                if t.execute("DELETE FROM credentials WHERE name = ?1", [&r.name])? == 0 {
                    return Err(StoreError::NotFound(format!("credential {:?}", truncate(&r.name, 80))));
                }
                audit::record(t, &trace, &r.actor, "credential.remove", &r.name)?;
                ch.push(ChangeEntity::Credential, r.name.clone(), ChangeOp::Delete);
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }

    async fn delete_credential_if_unused(
        &self,
        req: Request<DeleteCredentialRequest>,
    ) -> Result<Response<DeleteIfUnusedReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        let (deleted, seq) = self
            .db
            .write(move |t, ch| {
                if credential_in_use(t, &r.name)? {
                    return Ok(false);
                }
                if t.execute("DELETE FROM credentials WHERE name = ?1", [&r.name])? == 0 {
                    return Ok(false);
                }
                audit::record(t, &trace, &r.actor, "credential.remove", &r.name)?;
                ch.push(ChangeEntity::Credential, r.name.clone(), ChangeOp::Delete);
                Ok(true)
            })
            .await?;
        Ok(Response::new(DeleteIfUnusedReply { deleted, seq: if deleted { seq } else { 0 } }))
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
                .collect::<Result<Vec<(String, SecretString)>, CryptoError>>()
        })
        .await
        .map_err(|_| Status::internal("credential decryption task failed"))??;
        // The reply is the one place values leave the store: the gateway asked for them to start
        // an upstream with them.
        let values = opened.into_iter().map(|(n, v)| (n, v.expose_secret().to_owned())).collect();
        Ok(Response::new(ResolveCredentialsReply { values }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use coffer_proto::store::audit_server::Audit;

    fn service() -> (tempfile::TempDir, CredentialsService) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        let svc = CredentialsService::new(db, CredentialCrypto::new(dir.path().join("secret.key")));
        (dir, svc)
    }

    async fn set(svc: &CredentialsService, name: &str, value: &str) -> Result<WriteCredentialReply, Status> {
        let req =
            SetCredentialRequest { name: name.into(), value: value.into(), actor: "cli".into(), create_only: false };
        svc.set_credential(Request::new(req)).await.map(Response::into_inner)
    }

    async fn resolve(svc: &CredentialsService, names: &[&str]) -> Result<HashMap<String, String>, Status> {
        let req = ResolveCredentialsRequest { names: names.iter().map(|n| (*n).to_owned()).collect() };
        svc.resolve_credentials(Request::new(req)).await.map(|r| r.into_inner().values)
    }

    #[tokio::test]
    async fn a_referenced_credential_is_kept_and_an_unused_one_deleted() {
        let (_dir, svc) = service();
        for name in ["bot", "llm-key", "env-key", "hdr-key", "free"] {
            set(&svc, name, "v").await.unwrap();
        }
        svc.db
            .write(|t, _| {
                t.execute("INSERT INTO channels (name, kind, bot_token_ref, created_at, updated_at) VALUES ('home', 'telegram', 'bot', 'x', 'x')", [])?;
                t.execute(
                    "INSERT INTO llm_connections (name, wire, credential_ref, model, created_at, updated_at)
                     VALUES ('work', 'anthropic', 'llm-key', 'm', 'x', 'x')",
                    [],
                )?;
                t.execute(
                    "INSERT INTO mcp_servers (name, transport, env_json, headers_json, created_at, updated_at)
                     VALUES ('gh', 'stdio', ?1, ?2, 'x', 'x')",
                    params![
                        format!(r#"{{"TOKEN":"{REF_PREFIX}env-key","PLAIN":"free"}}"#),
                        format!(r#"{{"Authorization":"{REF_PREFIX}hdr-key"}}"#)
                    ],
                )?;
                Ok(())
            })
            .await
            .unwrap();
        let drop = |name: &str| {
            let req = DeleteCredentialRequest { name: name.into(), actor: "api".into() };
            svc.delete_credential_if_unused(Request::new(req))
        };
        for used in ["bot", "llm-key", "env-key", "hdr-key"] {
            let r = drop(used).await.unwrap().into_inner();
            assert_eq!((r.deleted, r.seq), (false, 0), "{used} is referenced");
        }
        let r = drop("free").await.unwrap().into_inner();
        assert!(r.deleted && r.seq > 0, "a literal value equal to the name is not a reference");
        assert!(!drop("free").await.unwrap().into_inner().deleted, "absent: nothing to do");
        assert!(!drop("").await.unwrap().into_inner().deleted);
        let left = svc.list_credentials(Request::new(ListCredentialsRequest {})).await.unwrap().into_inner().items;
        assert_eq!(left.len(), 4);
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
        let dbg = format!(
            "{:?}",
            SetCredentialRequest { name: "n".into(), value: secret.into(), actor: String::new(), create_only: false }
        );
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

        let audit = super::super::audit::AuditService::new(svc.db.clone())
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
        let changes = super::super::changes::since(&svc.db, 0, 100).await.unwrap();
        let ops: Vec<(&str, &str, &str)> =
            changes.iter().map(|c| (c.entity.as_str(), c.key.as_str(), c.op.as_str())).collect();
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
        let svc = CredentialsService::new(svc.db.clone(), CredentialCrypto::new(dir.path().join("secret.key")));
        let e = resolve(&svc, &["github"]).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("secret.key") && e.message().contains("missing"), "{}", e.message());
        let e = set(&svc, "other", "x").await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(!dir.path().join("secret.key").exists());
    }
}
