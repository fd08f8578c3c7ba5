//! The `Profiles` service (`proto/store_profiles.proto`): named views of the vault for a kind of
//! client, one row of `profiles` each, the spec kept as the JSON text of a
//! [`coffer_api::profiles::ProfileSpec`]. Every write is audited (`profile.create`,
//! `profile.update`, `profile.delete`) and produces a change row (entity `profile`), so the
//! gateway's snapshot reloads.
//!
//! The store checks the name rule ([`coffer_api::profiles::check_profile_name`]), that the text
//! parses as a spec (unknown fields refused) and is at most [`MAX_SPEC_BYTES`], and versions; the
//! edge checks the rest (globs compile, override names, sizes). `default` never written reads as
//! `{}` at version 0 ([`virtual_default`]) and cannot be deleted.
use coffer_api::profiles::{DEFAULT_PROFILE, ProfileSpec, check_profile_name};
use coffer_proto::store::profiles_server::Profiles;
use coffer_proto::store::*;
use rusqlite::{Connection, OptionalExtension, Row, params};
use tonic::{Request, Response, Status};

use super::{audit, trace, truncate};
use crate::db::{Db, StoreError};

/// Longest `spec_json` the store keeps (bytes).
pub const MAX_SPEC_BYTES: usize = 1024 * 1024;

const COLS: &str = "name, spec_json, version, created_at, updated_at";

fn from_row(r: &Row<'_>) -> rusqlite::Result<StoredProfile> {
    Ok(StoredProfile {
        name: r.get(0)?,
        spec_json: r.get(1)?,
        version: r.get(2)?,
        created_at: r.get(3)?,
        updated_at: r.get(4)?,
    })
}

/// `default` as it reads before anything wrote it: every server, tool and built-in, full mode,
/// version 0, no times.
pub fn virtual_default() -> StoredProfile {
    StoredProfile { name: DEFAULT_PROFILE.into(), spec_json: "{}".into(), ..Default::default() }
}

/// The profile `name` on `c`, `default` read as [`virtual_default`] when never written.
fn get_tx(c: &Connection, name: &str) -> Result<Option<StoredProfile>, StoreError> {
    let row = c.query_row(&format!("SELECT {COLS} FROM profiles WHERE name = ?1"), [name], from_row).optional()?;
    Ok(row.or_else(|| (name == DEFAULT_PROFILE).then(virtual_default)))
}

/// Every profile by name on `c`, `default` included (see [`virtual_default`]).
///
/// # Errors
/// [`StoreError::Sql`] when the read fails.
pub fn list_tx(c: &Connection) -> Result<Vec<StoredProfile>, StoreError> {
    let mut st = c.prepare_cached(&format!("SELECT {COLS} FROM profiles ORDER BY name"))?;
    let mut out = st.query_map([], from_row)?.collect::<Result<Vec<_>, _>>()?;
    if !out.iter().any(|p| p.name == DEFAULT_PROFILE) {
        out.push(virtual_default());
        out.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Ok(out)
}

/// Checks a name and a spec's text (parses as a [`ProfileSpec`], at most [`MAX_SPEC_BYTES`]).
///
/// # Errors
/// [`StoreError::Invalid`] naming the rule that failed.
pub fn validate(name: &str, spec_json: &str) -> Result<(), StoreError> {
    check_profile_name(name).map_err(StoreError::Invalid)?;
    if spec_json.len() > MAX_SPEC_BYTES {
        return Err(StoreError::Invalid(format!("spec_json is {} bytes; at most {MAX_SPEC_BYTES}", spec_json.len())));
    }
    let bad = |e: String| StoreError::Invalid(format!("spec_json is not a profile spec: {}", truncate(&e, 200)));
    // An object only: serde would read a struct from a JSON array too.
    match serde_json::from_str::<serde_json::Value>(spec_json).map_err(|e| bad(e.to_string()))? {
        v @ serde_json::Value::Object(_) => serde_json::from_value::<ProfileSpec>(v).map_err(|e| bad(e.to_string()))?,
        _ => return Err(bad("not a JSON object".into())),
    };
    Ok(())
}

/// Writes (insert or replace) `p` inside the caller's transaction; the caller validated it and
/// set its version and times.
pub(crate) fn write_row(t: &Connection, p: &StoredProfile) -> Result<(), StoreError> {
    t.execute(
        &format!(
            "INSERT INTO profiles ({COLS}) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (name) DO UPDATE SET spec_json = excluded.spec_json, version = excluded.version,
               created_at = excluded.created_at, updated_at = excluded.updated_at"
        ),
        params![p.name, p.spec_json, p.version, p.created_at, p.updated_at],
    )?;
    Ok(())
}

/// [`StoreError::Conflict`] unless `expected` is unset or `current`.
fn check_version(name: &str, expected: Option<i64>, current: i64) -> Result<(), StoreError> {
    match expected {
        Some(expected) if expected != current => {
            Err(StoreError::Conflict { what: format!("profile {name:?}"), expected, current })
        }
        _ => Ok(()),
    }
}

/// The `Profiles` gRPC service.
pub struct ProfilesService {
    db: Db,
}

impl ProfilesService {
    /// The service over `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

#[tonic::async_trait]
impl Profiles for ProfilesService {
    async fn list_profiles(&self, _: Request<ListProfilesRequest>) -> Result<Response<ListProfilesReply>, Status> {
        let head = self.db.head();
        let profiles = self.db.read(list_tx).await?;
        Ok(Response::new(ListProfilesReply { profiles, seq: head }))
    }

    async fn get_profile(&self, req: Request<GetProfileRequest>) -> Result<Response<StoredProfile>, Status> {
        let name = req.into_inner().name;
        let n2 = name.clone();
        let p = self.db.read(move |c| get_tx(c, &n2)).await?;
        p.map(Response::new).ok_or_else(|| StoreError::NotFound(format!("profile {:?}", truncate(&name, 40))).into())
    }

    async fn put_profile(&self, req: Request<PutProfileRequest>) -> Result<Response<WriteProfileReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        validate(&r.name, &r.spec_json)?;
        let (profile, seq) = self
            .db
            .write(move |t, ch| {
                let stored = t
                    .query_row(&format!("SELECT {COLS} FROM profiles WHERE name = ?1"), [&r.name], from_row)
                    .optional()?;
                let now = coffer_runtime::now_rfc3339();
                let (next, op, action) = match stored.clone() {
                    // `default` always exists (as never written when it was not): PUT writes it.
                    _ if r.create_only && (stored.is_some() || r.name == DEFAULT_PROFILE) => {
                        return Err(StoreError::Exists(format!("profile {:?}", r.name)));
                    }
                    Some(cur) => {
                        check_version(&r.name, r.expected_version, cur.version)?;
                        let next =
                            StoredProfile { spec_json: r.spec_json, version: cur.version + 1, updated_at: now, ..cur };
                        (next, ChangeOp::Update, "profile.update")
                    }
                    None if !r.create_only && r.name != DEFAULT_PROFILE => {
                        return Err(StoreError::NotFound(format!("profile {:?}", r.name)));
                    }
                    None => {
                        // A never-written `default` is at version 0.
                        check_version(&r.name, r.expected_version.filter(|_| !r.create_only), 0)?;
                        let next = StoredProfile {
                            name: r.name,
                            spec_json: r.spec_json,
                            version: 1,
                            created_at: now.clone(),
                            updated_at: now,
                        };
                        (next, ChangeOp::Create, "profile.create")
                    }
                };
                write_row(t, &next)?;
                audit::record(t, &trace, &r.actor, action, &next.name)?;
                ch.push(ChangeEntity::Profile, next.name.clone(), op);
                Ok(next)
            })
            .await?;
        Ok(Response::new(WriteProfileReply { profile: Some(profile), seq }))
    }

    async fn delete_profile(&self, req: Request<DeleteProfileRequest>) -> Result<Response<WriteReply>, Status> {
        let trace = trace();
        let r = req.into_inner();
        if r.name == DEFAULT_PROFILE {
            return Err(StoreError::Precondition(format!(
                "profile {DEFAULT_PROFILE:?} cannot be removed (it is what a session naming no profile gets); edit it instead"
            ))
            .into());
        }
        let ((), seq) = self
            .db
            .write(move |t, ch| {
                let cur: Option<i64> = t
                    .query_row("SELECT version FROM profiles WHERE name = ?1", [&r.name], |row| row.get(0))
                    .optional()?;
                let Some(cur) = cur else {
                    return Err(StoreError::NotFound(format!("profile {:?}", truncate(&r.name, 40))));
                };
                check_version(&r.name, r.expected_version, cur)?;
                t.execute("DELETE FROM profiles WHERE name = ?1", [&r.name])?;
                audit::record(t, &trace, &r.actor, "profile.delete", &r.name)?;
                ch.push(ChangeEntity::Profile, r.name.clone(), ChangeOp::Delete);
                Ok(())
            })
            .await?;
        Ok(Response::new(WriteReply { seq }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service() -> (tempfile::TempDir, ProfilesService) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        (dir, ProfilesService::new(db))
    }

    fn put(name: &str, spec: &str, expected_version: Option<i64>, create_only: bool) -> Request<PutProfileRequest> {
        Request::new(PutProfileRequest {
            name: name.into(),
            spec_json: spec.into(),
            expected_version,
            create_only,
            actor: "cli".into(),
        })
    }

    fn del(name: &str, expected_version: Option<i64>) -> Request<DeleteProfileRequest> {
        Request::new(DeleteProfileRequest { name: name.into(), expected_version, actor: "cli".into() })
    }

    async fn names(svc: &ProfilesService) -> Vec<(String, i64)> {
        let l = svc.list_profiles(Request::new(ListProfilesRequest {})).await.unwrap().into_inner().profiles;
        l.into_iter().map(|p| (p.name, p.version)).collect()
    }

    #[tokio::test]
    async fn default_reads_as_everything_until_written_and_cannot_be_removed() {
        let (_dir, svc) = service();
        assert_eq!(names(&svc).await, [("default".to_owned(), 0)]);
        let d = svc.get_profile(Request::new(GetProfileRequest { name: "default".into() })).await.unwrap().into_inner();
        assert_eq!((d.spec_json.as_str(), d.version, d.updated_at.as_str()), ("{}", 0, ""));
        let e = svc.put_profile(put("default", "{}", None, true)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "default always exists");
        // Written at the version it was read at (0), it is created at 1.
        let e = svc.put_profile(put("default", r#"{"mode":"lazy"}"#, Some(3), false)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted);
        let w = svc.put_profile(put("default", r#"{"mode":"lazy"}"#, Some(0), false)).await.unwrap().into_inner();
        let p = w.profile.unwrap();
        assert_eq!((p.version, p.spec_json.as_str()), (1, r#"{"mode":"lazy"}"#));
        assert!(!p.created_at.is_empty());
        let e = svc.delete_profile(del("default", None)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.message().contains("\"default\" cannot be removed"), "{}", e.message());
        assert_eq!(names(&svc).await, [("default".to_owned(), 1)]);
    }

    #[tokio::test]
    async fn create_replace_delete_with_versions_changes_and_audit() {
        let (_dir, svc) = service();
        let w = svc.put_profile(put("work", r#"{"servers":{"include":["git"]}}"#, None, true)).await.unwrap();
        assert_eq!(w.get_ref().profile.as_ref().unwrap().version, 1);
        let e = svc.put_profile(put("work", "{}", None, true)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::AlreadyExists);
        assert_eq!(e.message(), "profile \"work\" already exists");
        let e = svc.put_profile(put("absent", "{}", None, false)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        let e = svc.put_profile(put("work", "{}", Some(7), false)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted);
        let p = svc.put_profile(put("work", "{}", Some(1), false)).await.unwrap().into_inner().profile.unwrap();
        assert_eq!(p.version, 2);
        let p = svc.put_profile(put("work", "{}", None, false)).await.unwrap().into_inner().profile.unwrap();
        assert_eq!(p.version, 3);
        assert_eq!(svc.delete_profile(del("work", Some(2))).await.unwrap_err().code(), tonic::Code::Aborted);
        let seq = svc.delete_profile(del("work", Some(3))).await.unwrap().into_inner().seq;
        assert_eq!(svc.delete_profile(del("work", None)).await.unwrap_err().code(), tonic::Code::NotFound);
        let e = svc.get_profile(Request::new(GetProfileRequest { name: "work".into() })).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound);
        let (changes, actions) = svc
            .db
            .read(|c| {
                let mut st = c.prepare("SELECT entity, key, op FROM changes ORDER BY seq")?;
                let ch = st
                    .query_map([], |r| {
                        Ok(format!("{} {} {}", r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                let mut st = c.prepare("SELECT action, target FROM audit_log ORDER BY id")?;
                let au = st
                    .query_map([], |r| Ok(format!("{} {}", r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((ch, au))
            })
            .await
            .unwrap();
        assert_eq!(
            changes,
            ["profile work create", "profile work update", "profile work update", "profile work delete"]
        );
        assert_eq!(
            actions,
            ["profile.create work", "profile.update work", "profile.update work", "profile.delete work"]
        );
        assert_eq!(seq, 4);
    }

    #[tokio::test]
    async fn bad_names_and_specs_are_refused_naming_the_problem() {
        let (_dir, svc) = service();
        for (name, spec, says) in [
            ("Work", "{}", "profile name \"Work\" must be"),
            ("", "{}", "profile name \"\" must be"),
            ("a_b", "{}", "must be 1 to 32"),
            ("w", "[]", "spec_json is not a profile spec"),
            ("w", "{\"mode\":\"sometimes\"}", "sometimes"),
            ("w", "{\"colour\":1}", "unknown field `colour`"),
            ("w", "{", "spec_json is not a profile spec"),
        ] {
            let e = svc.put_profile(put(name, spec, None, true)).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{name} {spec}");
            assert!(e.message().contains(says), "{name} {spec}: {}", e.message());
        }
        let big = format!("{{\"description\":\"{}\"}}", "x".repeat(MAX_SPEC_BYTES));
        let e = svc.put_profile(put("w", &big, None, true)).await.unwrap_err();
        assert!(e.message().starts_with("spec_json is"), "{}", e.message());
        assert_eq!(names(&svc).await, [("default".to_owned(), 0)]);
    }

    #[tokio::test]
    async fn concurrent_creates_of_one_name_one_wins() {
        let (_dir, svc) = service();
        let svc = std::sync::Arc::new(svc);
        let tries = (0..8).map(|i| {
            let svc = svc.clone();
            tokio::spawn(async move {
                svc.put_profile(put("race", &format!("{{\"description\":\"{i}\"}}"), None, true)).await.map(|_| ())
            })
        });
        let results: Vec<_> = futures_join(tries).await;
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
        assert!(results.iter().filter_map(|r| r.as_ref().err()).all(|e| e.code() == tonic::Code::AlreadyExists));
    }

    async fn futures_join<T: Send + 'static>(hs: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
        let mut out = Vec::new();
        for h in hs.collect::<Vec<_>>() {
            out.push(h.await.unwrap());
        }
        out
    }
}
