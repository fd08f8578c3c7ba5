//! The `Settings` service: the flat settings map (`settings`). Every write is audited
//! (`settings.update`) and produces one change row per key (entity `settings`).
use std::collections::HashMap;

use coffer_proto::store::settings_server::Settings;
use coffer_proto::store::*;
use rusqlite::{Connection, params};
use tonic::{Request, Response, Status};

use super::{audit, trace};
use crate::db::{Db, StoreError};

/// Every setting whose key starts with `prefix` (`""`: all), read on `c`.
///
/// # Errors
/// [`StoreError::Sql`] when the read fails.
pub fn values(c: &Connection, prefix: &str) -> Result<HashMap<String, String>, StoreError> {
    let mut st = c.prepare_cached("SELECT key, value FROM settings WHERE substr(key, 1, length(?1)) = ?1")?;
    let rows = st.query_map([prefix], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
    Ok(rows.collect::<Result<HashMap<_, _>, _>>()?)
}

/// The `Settings` gRPC service.
pub struct SettingsService {
    db: Db,
}

impl SettingsService {
    /// The service over `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

#[tonic::async_trait]
impl Settings for SettingsService {
    async fn get_settings(&self, _: Request<GetSettingsRequest>) -> Result<Response<SettingsMap>, Status> {
        let head = self.db.head();
        let values = self.db.read(|c| values(c, "")).await?;
        Ok(Response::new(SettingsMap { values, seq: head }))
    }

    async fn patch_settings(&self, req: Request<PatchSettingsRequest>) -> Result<Response<WriteReply>, Status> {
        let trace = trace();
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
                    ch.push(ChangeEntity::Setting, k.clone(), ChangeOp::Set);
                }
                for k in &r.remove {
                    t.execute("DELETE FROM settings WHERE key = ?1", [k])?;
                    ch.push(ChangeEntity::Setting, k.clone(), ChangeOp::Delete);
                }
                let keys: Vec<&String> = r.set.keys().chain(r.remove.iter()).collect();
                audit::record(t, &trace, &r.actor, "settings.update", &serde_json::to_string(&keys).expect("json"))?;
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn values_by_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        let svc = SettingsService::new(db.clone());
        let set = [("retention.audit_days", "7"), ("retention_x", "1"), ("gateway.a%", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        svc.patch_settings(Request::new(PatchSettingsRequest { set, remove: vec![], actor: String::new() }))
            .await
            .unwrap();
        let all = svc.get_settings(Request::new(GetSettingsRequest {})).await.unwrap().into_inner();
        assert_eq!((all.values.len(), all.seq), (3, 3));
        // The prefix is literal: `_` and `%` match only themselves.
        let retention = db.read(|c| values(c, "retention.")).await.unwrap();
        assert_eq!(retention, HashMap::from([("retention.audit_days".to_owned(), "7".to_owned())]));
        assert_eq!(db.read(|c| values(c, "gateway.a%")).await.unwrap().len(), 1);
    }
}
