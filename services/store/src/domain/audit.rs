//! The `Audit` service: the audit log (`audit_log`: who changed what; never a secret), and
//! [`record`], which the other domains' writes call inside their own transaction.
use coffer_proto::store::audit_server::Audit;
use coffer_proto::store::*;
use rusqlite::{Transaction, params};
use tonic::{Request, Response, Status};

use super::{MAX_PAGE, page, required};
use crate::db::{Db, StoreError};

/// The actor recorded when a request names none.
const DEFAULT_ACTOR: &str = "api";

thread_local! {
    /// How the request whose write job runs on this (writer) thread was authenticated.
    static REQUEST_AUTH: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Sets how the request behind the current write job was authenticated, for the audit rows it
/// writes ([`record_outcome`]); cleared again when dropped. Set by [`crate::db::Db::write`] on
/// the writer thread from `coffer_runtime::grpc::current_auth`.
pub struct RequestAuth(());

impl RequestAuth {
    /// Sets `auth` (empty: unknown) until the guard is dropped.
    pub fn set(auth: String) -> Self {
        REQUEST_AUTH.with(|a| *a.borrow_mut() = auth);
        Self(())
    }
}

impl Drop for RequestAuth {
    fn drop(&mut self) {
        REQUEST_AUTH.with(|a| a.borrow_mut().clear());
    }
}

/// How the request behind the current write job was authenticated (empty: unknown).
fn request_auth() -> String {
    REQUEST_AUTH.with(|a| a.borrow().clone())
}

/// Appends an `ok` audit row inside the caller's transaction, with an empty detail. `trace` is
/// the request's trace id; an empty `actor` is recorded as `api`.
///
/// # Errors
/// [`StoreError::Sql`] when the insert fails (the caller's transaction then rolls back).
pub fn record(t: &Transaction, trace: &str, actor: &str, action: &str, target: &str) -> Result<(), StoreError> {
    record_with(t, trace, actor, action, target, "{}")
}

/// [`record`] with a `detail` (a JSON object, never a secret).
///
/// # Errors
/// As [`record`].
pub fn record_with(
    t: &Transaction,
    trace: &str,
    actor: &str,
    action: &str,
    target: &str,
    detail: &str,
) -> Result<(), StoreError> {
    record_outcome(t, trace, actor, action, target, AuditOutcome::Ok, detail)
}

/// [`record_with`] with an `outcome` (an `error` row records a refused attempt, e.g. a wrong
/// pairing code; never the attempt's content). The row's `auth` is how the request was
/// authenticated, found server-side ([`RequestAuth`]); `actor` is only the label the caller
/// gave (`X-Coffer-Actor`), which cannot replace it.
///
/// # Errors
/// As [`record`].
pub fn record_outcome(
    t: &Transaction,
    trace: &str,
    actor: &str,
    action: &str,
    target: &str,
    outcome: AuditOutcome,
    detail: &str,
) -> Result<(), StoreError> {
    t.execute(
        "INSERT INTO audit_log (at, actor, action, target, outcome, trace_id, detail, auth)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            coffer_runtime::now_rfc3339(),
            if actor.is_empty() { DEFAULT_ACTOR } else { actor },
            action,
            target,
            outcome.as_str(),
            trace,
            detail,
            request_auth()
        ],
    )?;
    Ok(())
}

/// The `Audit` gRPC service.
pub struct AuditService {
    db: Db,
}

impl AuditService {
    /// The service over `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

#[tonic::async_trait]
impl Audit for AuditService {
    async fn append_audit(&self, req: Request<AppendAuditRequest>) -> Result<Response<WriteReply>, Status> {
        let entries = req.into_inner().entries;
        let outcomes =
            entries.iter().map(|e| required::<AuditOutcome>(e.outcome, "outcome")).collect::<Result<Vec<_>, _>>()?;
        let ((), seq) = self
            .db
            .write(move |t, _| {
                let mut st = t.prepare_cached(
                    "INSERT INTO audit_log (at, actor, action, target, outcome, trace_id, detail, auth)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )?;
                // The caller's `auth` is not taken: how the request was authenticated is found
                // here, never claimed.
                let auth = request_auth();
                for (e, outcome) in entries.into_iter().zip(outcomes) {
                    let at = if e.at.is_empty() { coffer_runtime::now_rfc3339() } else { e.at };
                    let detail = if e.detail.is_empty() { "{}".to_owned() } else { e.detail };
                    st.execute(params![at, e.actor, e.action, e.target, outcome.as_str(), e.trace_id, detail, auth])?;
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
                    "SELECT id, at, actor, action, target, outcome, trace_id, detail, auth FROM audit_log
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
                        outcome: AuditOutcome::parse(&r.get::<_, String>(5)?).unwrap_or_default().into(),
                        trace_id: r.get(6)?,
                        detail: r.get(7)?,
                        auth: r.get(8)?,
                    })
                })?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        let (items, next) = page(items, limit, |i| i.id);
        Ok(Response::new(ListAuditReply { items, next_before_id: next }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row records how the request behind the write was authenticated (what the edge set and
    /// the internal layer scoped), never what an appended entry claims; outside any request the
    /// write is the store's own.
    #[tokio::test]
    async fn rows_record_the_requests_authentication_never_a_claim() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        let svc = AuditService::new(db.clone());
        coffer_runtime::grpc::with_auth("session:0123456789ab".into(), async {
            db.write(|t, _| record(t, "tr", "cli", "credential.set", "x")).await.unwrap();
            let claimed = AuditEntry {
                actor: "ui".into(),
                action: "mcp.import".into(),
                target: "t".into(),
                outcome: AuditOutcome::Ok.into(),
                auth: "token".into(),
                ..Default::default()
            };
            svc.append_audit(Request::new(AppendAuditRequest { entries: vec![claimed] })).await.unwrap();
        })
        .await;
        db.write(|t, _| record(t, "", "api", "maintenance.prune", "db")).await.unwrap();
        let req = ListAuditRequest { limit: 10, ..Default::default() };
        let items = svc.list_audit(Request::new(req)).await.unwrap().into_inner().items;
        let seen: Vec<(&str, &str)> = items.iter().map(|e| (e.actor.as_str(), e.auth.as_str())).collect();
        assert_eq!(seen, [("api", "internal:store"), ("ui", "session:0123456789ab"), ("cli", "session:0123456789ab")]);
    }
}
