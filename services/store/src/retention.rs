//! Retention: prunes `mcp_invocations` and `audit_log` by age and by row count, archives
//! conversations with no message for `retention.conversations_archive_days` and deletes archived
//! ones `retention.conversations_delete_days` after archiving — once when the store starts, then
//! every [`INTERVAL`], and on demand (`PruneNow`, `POST /v1/maintenance/prune`).
//!
//! The policy is read from the settings table at every pass, so a `PATCH /v1/settings` applies
//! at the next pass without a restart. The settings, their defaults and bounds are the
//! `retention.*` rows of `coffer_types::settings` ([`SETTINGS`]): age in days and row count per
//! table, `0` disabling that limit. A stored value the table does not accept is ignored (the
//! default applies) with a warning in the store's log.
//!
//! Deletions go through the single writer in batches of at most [`BATCH`] rows, one short
//! transaction each; writes queued meanwhile (invocation batches, registry changes) run between
//! two batches, so even a large first prune never holds the writer for long (a deleted
//! conversation takes its messages with it, so those batches are [`CONVERSATION_BATCH`]
//! conversations). Pruning writes no change rows: logs and conversations are not part of the
//! change stream.
use std::collections::HashMap;
use std::time::Duration;

use coffer_types::settings::{self, Setting};
use rusqlite::params;
use tokio_util::sync::CancellationToken;

use crate::db::{Db, StoreError};

/// Time between two background passes.
pub const INTERVAL: Duration = Duration::from_secs(3600);
/// Most rows one delete transaction removes.
pub const BATCH: u64 = 2_000;
/// Most conversations one retention transaction archives or deletes (a deletion takes every
/// message of the conversation with it).
pub const CONVERSATION_BATCH: u64 = 100;

/// The retention settings (key, default, bounds), in the order they are documented.
pub const SETTINGS: &[Setting] = &[
    INVOCATIONS.days,
    INVOCATIONS.rows,
    AUDIT.days,
    AUDIT.rows,
    settings::RETENTION_CONVERSATIONS_ARCHIVE_DAYS,
    settings::RETENTION_CONVERSATIONS_DELETE_DAYS,
];

/// One pruned table and the settings that govern it.
struct Table {
    name: &'static str,
    days: Setting,
    rows: Setting,
}

const INVOCATIONS: Table = Table {
    name: "mcp_invocations",
    days: settings::RETENTION_INVOCATIONS_DAYS,
    rows: settings::RETENTION_INVOCATIONS_MAX_ROWS,
};

const AUDIT: Table =
    Table { name: "audit_log", days: settings::RETENTION_AUDIT_DAYS, rows: settings::RETENTION_AUDIT_MAX_ROWS };

/// The limits of one table; `0` means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub days: u64,
    pub max_rows: u64,
}

/// The conversations' limits (days); `0` means never.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConversationLimit {
    /// Archive an active conversation whose last message (or, without one, its creation) is
    /// older than this, unless it was restored or otherwise changed more recently.
    pub archive_days: u64,
    /// Delete an archived conversation archived longer ago than this.
    pub delete_days: u64,
}

/// The whole retention policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub invocations: Limit,
    pub audit: Limit,
    pub conversations: ConversationLimit,
}

impl Policy {
    /// The policy a settings map describes, plus one warning per unusable value (that value's
    /// default applies instead).
    pub fn from_settings(values: &HashMap<String, String>) -> (Self, Vec<String>) {
        let mut warnings = Vec::new();
        let mut get = |s: &Setting| {
            s.read(values.get(s.key).map(String::as_str)).unwrap_or_else(|e| {
                warnings.push(format!("setting {} is not usable ({e}); using {}", s.key, s.default));
                s.default
            })
        };
        let invocations = Limit { days: get(&INVOCATIONS.days), max_rows: get(&INVOCATIONS.rows) };
        let audit = Limit { days: get(&AUDIT.days), max_rows: get(&AUDIT.rows) };
        let conversations = ConversationLimit {
            archive_days: get(&settings::RETENTION_CONVERSATIONS_ARCHIVE_DAYS),
            delete_days: get(&settings::RETENTION_CONVERSATIONS_DELETE_DAYS),
        };
        let policy = Policy { invocations, audit, conversations };
        (policy, warnings)
    }
}

/// What one pass did: rows deleted, conversations archived and deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub invocations: u64,
    pub audit: u64,
    pub conversations_archived: u64,
    pub conversations_deleted: u64,
}

impl Pruned {
    /// Whether the pass changed anything.
    pub fn any(&self) -> bool {
        self.invocations + self.audit + self.conversations_archived + self.conversations_deleted > 0
    }
}

/// Serialises passes: the background worker and `PruneNow` never interleave their batches, so
/// each reports exactly what it deleted.
static PASS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs one pass with the policy currently in the settings table; `now_ms` (Unix ms) is the
/// reference for the age limits. Stops early, between batches, when `stop` is cancelled.
///
/// # Errors
/// [`StoreError`] when the database fails; rows deleted by earlier batches stay deleted.
pub async fn prune(db: &Db, now_ms: i64, stop: &CancellationToken) -> Result<Pruned, StoreError> {
    let _pass = PASS.lock().await;
    let values = db.read(|c| crate::domain::settings::values(c, "retention.")).await?;
    let (policy, warnings) = Policy::from_settings(&values);
    for w in warnings {
        tracing::warn!("{w}");
    }
    let invocations = prune_table(db, &INVOCATIONS, policy.invocations, now_ms, stop).await?;
    let audit = prune_table(db, &AUDIT, policy.audit, now_ms, stop).await?;
    // Deleting first: a conversation archived by this pass is never deleted by it.
    let c = policy.conversations;
    let conversations_deleted = match cutoff(c.delete_days, now_ms) {
        Some(cut) => {
            conversation_batches(db, stop, move |t| {
                crate::domain::conversations::delete_archived(t, cut, CONVERSATION_BATCH)
            })
            .await?
        }
        None => 0,
    };
    let conversations_archived = match cutoff(c.archive_days, now_ms) {
        Some(cut) => {
            conversation_batches(db, stop, move |t| {
                crate::domain::conversations::archive_idle(t, cut, now_ms, CONVERSATION_BATCH)
            })
            .await?
        }
        None => 0,
    };
    Ok(Pruned { invocations, audit, conversations_archived, conversations_deleted })
}

/// `now_ms` minus `days` (Unix ms), or `None` when `days` is 0 (never) or out of range.
fn cutoff(days: u64, now_ms: i64) -> Option<i64> {
    if days == 0 {
        return None;
    }
    days.checked_mul(86_400_000).and_then(|ms| i64::try_from(ms).ok()).and_then(|ms| now_ms.checked_sub(ms))
}

/// Runs `step` (one transaction handling at most [`CONVERSATION_BATCH`] conversations, returning
/// how many) until it handles fewer or `stop` is cancelled. Returns the total.
async fn conversation_batches<F>(db: &Db, stop: &CancellationToken, step: F) -> Result<u64, StoreError>
where
    F: Fn(&rusqlite::Connection) -> Result<u64, StoreError> + Clone + Send + 'static,
{
    let mut total = 0;
    while !stop.is_cancelled() {
        let step = step.clone();
        let (n, _) = db.write(move |t, _| step(t)).await?;
        total += n;
        if n < CONVERSATION_BATCH {
            break;
        }
    }
    Ok(total)
}

/// Applies one table's limits: first age, then count. Returns the rows deleted.
async fn prune_table(
    db: &Db,
    t: &Table,
    limit: Limit,
    now_ms: i64,
    stop: &CancellationToken,
) -> Result<u64, StoreError> {
    let name = t.name;
    let mut deleted = 0;
    // Rows store `at` as RFC 3339 UTC with milliseconds, so text order is time order and the
    // `at` index serves the comparison.
    let cutoff = limit
        .days
        .checked_mul(86_400_000)
        .and_then(|ms| i64::try_from(ms).ok())
        .and_then(|ms| now_ms.checked_sub(ms))
        .filter(|_| limit.days > 0)
        .map(coffer_runtime::rfc3339_from_unix_ms);
    if let Some(cutoff) = cutoff {
        let sql = format!("DELETE FROM {name} WHERE id IN (SELECT id FROM {name} WHERE at < ?1 LIMIT ?2)");
        deleted += batches(db, sql, cutoff, stop).await?;
    }
    if limit.max_rows > 0 {
        // The id of the newest row beyond the limit; rows inserted meanwhile have higher ids, so
        // the pass may leave slightly more than `max_rows`, never fewer.
        let max = i64::try_from(limit.max_rows).unwrap_or(i64::MAX);
        let sql = format!("SELECT id FROM {name} ORDER BY id DESC LIMIT 1 OFFSET ?1");
        let last: Option<i64> = db
            .read(move |c| {
                use rusqlite::OptionalExtension;
                Ok(c.query_row(&sql, [max], |r| r.get(0)).optional()?)
            })
            .await?;
        if let Some(last) = last {
            let sql =
                format!("DELETE FROM {name} WHERE id IN (SELECT id FROM {name} WHERE id <= ?1 ORDER BY id LIMIT ?2)");
            deleted += batches(db, sql, last, stop).await?;
        }
    }
    Ok(deleted)
}

/// Runs `sql` (a delete taking the bound `arg` and a batch size) one transaction at a time until
/// a batch deletes fewer than [`BATCH`] rows or `stop` is cancelled. Returns the rows deleted.
async fn batches<A>(db: &Db, sql: String, arg: A, stop: &CancellationToken) -> Result<u64, StoreError>
where
    A: rusqlite::ToSql + Clone + Send + 'static,
{
    let mut total = 0;
    while !stop.is_cancelled() {
        let (sql, arg) = (sql.clone(), arg.clone());
        let (n, _) = db.write(move |t, _| Ok(t.execute(&sql, params![arg, BATCH as i64])? as u64)).await?;
        total += n;
        if n < BATCH {
            break;
        }
    }
    Ok(total)
}

/// [`prune`] at the current time, then an audit row `maintenance.prune` by `actor` with the
/// counts as its detail (for `PruneNow`: a person asked for it; the hourly pass records none).
///
/// # Errors
/// As [`prune`].
pub async fn prune_now(db: &Db, actor: &str, trace: &str) -> Result<Pruned, StoreError> {
    let pruned = prune(db, now_ms(), &CancellationToken::new()).await?;
    let (actor, trace) = (actor.to_owned(), trace.to_owned());
    let detail = serde_json::json!({
        "invocations": pruned.invocations,
        "audit": pruned.audit,
        "conversations_archived": pruned.conversations_archived,
        "conversations_deleted": pruned.conversations_deleted,
    })
    .to_string();
    db.write(move |t, _| {
        crate::domain::audit::record_with(t, &trace, &actor, "maintenance.prune", "retention", &detail)
    })
    .await?;
    Ok(pruned)
}

/// Starts the background worker: a pass right away, then one every [`INTERVAL`], until
/// `shutdown`. A failed pass is logged and retried at the next interval.
pub fn spawn(db: Db, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let started = std::time::Instant::now();
            match prune(&db, now_ms(), &shutdown).await {
                Ok(p) if p.any() => tracing::info!(
                    invocations = p.invocations,
                    audit = p.audit,
                    conversations_archived = p.conversations_archived,
                    conversations_deleted = p.conversations_deleted,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "Retention pruned old log rows and idle conversations."
                ),
                Ok(_) => tracing::debug!("Retention pass: nothing to prune."),
                Err(e) => tracing::warn!(error = %e, "Retention pass failed; retrying at the next interval."),
            }
        }
    })
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_MS: i64 = 86_400_000;
    /// 2026-01-31T00:00:00Z, the reference "now" of these tests.
    const NOW: i64 = 1_769_817_600_000;

    fn open() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        (dir, db)
    }

    /// Inserts `n` invocation and `n` audit rows, the i-th `ages_days(i)` days before [`NOW`].
    async fn fill(db: &Db, n: i64, age_days: impl Fn(i64) -> i64 + Send + 'static) {
        db.write(move |t, _| {
            for i in 0..n {
                let at = coffer_runtime::rfc3339_from_unix_ms(NOW - age_days(i) * DAY_MS);
                t.execute(
                    "INSERT INTO mcp_invocations (at, target, method, server, session_id, duration_ms, outcome)
                     VALUES (?1, 's__t', 'tools/call', 's', 'x', 1, 'ok')",
                    [&at],
                )?;
                t.execute(
                    "INSERT INTO audit_log (at, actor, action, target, outcome) VALUES (?1, 'cli', 'a', 't', 'ok')",
                    [&at],
                )?;
            }
            Ok(())
        })
        .await
        .unwrap();
    }

    async fn set(db: &Db, pairs: &[(&str, &str)]) {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        db.write(move |t, _| {
            for (k, v) in &pairs {
                t.execute("INSERT OR REPLACE INTO settings (key, value, updated_at) VALUES (?1, ?2, 'now')", [k, v])?;
            }
            Ok(())
        })
        .await
        .unwrap();
    }

    /// Remaining (count, oldest id) of a table.
    async fn left(db: &Db, table: &'static str) -> (i64, i64) {
        db.read(move |c| {
            Ok(c.query_row(&format!("SELECT COUNT(*), COALESCE(MIN(id), 0) FROM {table}"), [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?)
        })
        .await
        .unwrap()
    }

    #[test]
    fn policy_defaults_values_and_bad_values() {
        let (p, w) = Policy::from_settings(&HashMap::new());
        assert!(w.is_empty());
        assert_eq!(p.invocations, Limit { days: 30, max_rows: 100_000 });
        assert_eq!(p.audit, Limit { days: 365, max_rows: 100_000 });
        let values: HashMap<String, String> = [
            ("retention.invocations_days", " 7 "),
            ("retention.invocations_max_rows", "0"),
            ("retention.audit_days", "-1"),
            ("retention.audit_max_rows", "lots"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
        let (p, w) = Policy::from_settings(&values);
        assert_eq!(p.invocations, Limit { days: 7, max_rows: 0 });
        assert_eq!(p.audit, Limit { days: 365, max_rows: 100_000 });
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("retention.audit_days") && w[1].contains("\"lots\""), "{w:?}");
        assert_eq!(p.conversations, ConversationLimit { archive_days: 7, delete_days: 30 });
        assert_eq!(SETTINGS.len(), 6);
        let values: HashMap<String, String> =
            [("retention.conversations_archive_days", "0"), ("retention.conversations_delete_days", "forever")]
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect();
        let (p, w) = Policy::from_settings(&values);
        assert_eq!(p.conversations, ConversationLimit { archive_days: 0, delete_days: 30 });
        assert!(w.len() == 1 && w[0].contains("retention.conversations_delete_days"), "{w:?}");
    }

    #[tokio::test]
    async fn prunes_by_age_with_the_defaults() {
        let (_dir, db) = open();
        // Row i is i days old: 0..=400.
        fill(&db, 401, |i| i).await;
        let p = prune(&db, NOW, &CancellationToken::new()).await.unwrap();
        // Invocations keep ages 0..=30 (strictly older than 30 days goes), audit 0..=365.
        assert_eq!(p, Pruned { invocations: 370, audit: 35, ..Default::default() });
        assert_eq!(left(&db, "mcp_invocations").await.0, 31);
        assert_eq!(left(&db, "audit_log").await.0, 366);
        // A second pass finds nothing.
        assert_eq!(prune(&db, NOW, &CancellationToken::new()).await.unwrap(), Pruned::default());
    }

    #[tokio::test]
    async fn prunes_by_count_in_batches_keeping_the_newest() {
        let (_dir, db) = open();
        let n = (BATCH * 2 + 500) as i64;
        fill(&db, n, |_| 0).await;
        set(&db, &[("retention.invocations_max_rows", "100"), ("retention.audit_max_rows", "7")]).await;
        let p = prune(&db, NOW, &CancellationToken::new()).await.unwrap();
        assert_eq!(p, Pruned { invocations: n as u64 - 100, audit: n as u64 - 7, ..Default::default() });
        // The newest rows are the ones kept.
        assert_eq!(left(&db, "mcp_invocations").await, (100, n - 99));
        assert_eq!(left(&db, "audit_log").await, (7, n - 6));
    }

    #[tokio::test]
    async fn zero_disables_a_limit_and_settings_apply_per_pass() {
        let (_dir, db) = open();
        fill(&db, 50, |i| i * 100).await;
        set(
            &db,
            &[
                ("retention.invocations_days", "0"),
                ("retention.invocations_max_rows", "0"),
                ("retention.audit_days", "0"),
                ("retention.audit_max_rows", "0"),
            ],
        )
        .await;
        assert_eq!(prune(&db, NOW, &CancellationToken::new()).await.unwrap(), Pruned::default());
        set(&db, &[("retention.audit_days", "1000")]).await;
        // Ages 0, 100, …, 1000 stay: 11 rows.
        assert_eq!(
            prune(&db, NOW, &CancellationToken::new()).await.unwrap(),
            Pruned { invocations: 0, audit: 39, ..Default::default() }
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_interleave_with_a_large_prune_and_stop_ends_it() {
        let (_dir, db) = open();
        let total = (BATCH * 50) as i64;
        fill(&db, total, |_| 1000).await;
        let pruning = {
            let db = db.clone();
            tokio::spawn(async move { prune(&db, NOW, &CancellationToken::new()).await })
        };
        // Once the first batch has committed, a write queued behind it runs before the prune is
        // over: it sees rows still waiting to be deleted.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while left(&db, "mcp_invocations").await.0 == total {
            assert!(std::time::Instant::now() < deadline, "the prune never started");
            tokio::task::yield_now().await;
        }
        let (remaining, _) = db
            .write(|t, _| Ok(t.query_row("SELECT COUNT(*) FROM mcp_invocations", [], |r| r.get::<_, i64>(0))?))
            .await
            .unwrap();
        assert!(remaining > 0 && remaining < total, "the write waited for the whole prune ({remaining} left)");
        let p = pruning.await.unwrap().unwrap();
        assert_eq!(p.invocations, total as u64);

        fill(&db, (BATCH * 3) as i64, |_| 1000).await;
        let stop = CancellationToken::new();
        stop.cancel();
        assert_eq!(prune(&db, NOW, &stop).await.unwrap(), Pruned::default());
    }

    #[tokio::test]
    async fn prune_now_records_an_audit_row_with_the_counts() {
        let (_dir, db) = open();
        // Only the count limit: `prune_now` measures age from the real clock.
        set(
            &db,
            &[
                ("retention.invocations_max_rows", "2"),
                ("retention.invocations_days", "0"),
                ("retention.audit_days", "0"),
            ],
        )
        .await;
        fill(&db, 5, |_| 0).await;
        let p = prune_now(&db, "cli", "trace-1").await.unwrap();
        assert_eq!(p.invocations, 3);
        let (actor, detail): (String, String) = db
            .read(|c| {
                Ok(c.query_row(
                    "SELECT actor, detail FROM audit_log WHERE action = 'maintenance.prune' AND trace_id = 'trace-1'",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?)
            })
            .await
            .unwrap();
        assert_eq!(actor, "cli");
        assert_eq!(detail, r#"{"invocations":3,"audit":0,"conversations_archived":0,"conversations_deleted":0}"#);
    }
}

#[cfg(test)]
mod conversation_tests {
    //! Conversation retention through the real Conversations service: timestamps in the past come
    //! from the service's clock and from messages' `created_ms`; the pass gets its own `now_ms`.
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};

    use coffer_proto::store::conversations_server::Conversations;
    use coffer_proto::store::*;
    use tonic::Request;

    use super::*;
    use crate::domain::conversations::ConversationsService;

    const DAY_MS: i64 = 86_400_000;
    /// 2026-01-31T00:00:00Z, the passes' "now".
    const NOW: i64 = 1_769_817_600_000;

    fn id(n: u128) -> String {
        ulid::Ulid((1_700_000_000_000u128 << 80) | n).to_string()
    }

    /// A store whose Conversations service reads `clock`.
    fn open() -> (tempfile::TempDir, Db, ConversationsService, Arc<AtomicI64>) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        let clock = Arc::new(AtomicI64::new(NOW));
        let c = clock.clone();
        let svc = ConversationsService::with_clock(db.clone(), Arc::new(move || c.load(Ordering::Relaxed)));
        (dir, db, svc, clock)
    }

    /// Creates conversation `n` at `created` and, when `last` is set, a message created then.
    async fn conversation(svc: &ConversationsService, clock: &AtomicI64, n: u128, created: i64, last: Option<i64>) {
        clock.store(created, Ordering::Relaxed);
        let c = ConversationRecord {
            id: id(n),
            agent_key: "codex".into(),
            agent_config_json: "{}".into(),
            ..Default::default()
        };
        svc.create_conversation(Request::new(CreateConversationRequest { conversation: Some(c) })).await.unwrap();
        if let Some(at) = last {
            clock.store(at, Ordering::Relaxed);
            let m = MessageRecord {
                id: id(n + 1_000_000),
                conversation_id: id(n),
                role: MessageRole::User.into(),
                status: MessageStatus::Complete.into(),
                blocks: vec![ContentBlockRecord { block: Some(content_block_record::Block::Text("hi".into())) }],
                created_ms: at,
                ..Default::default()
            };
            svc.append_message(Request::new(m)).await.unwrap();
        }
    }

    async fn state(svc: &ConversationsService, n: u128) -> Option<ConversationRecord> {
        svc.get_conversation(Request::new(ConversationRef { id: id(n) })).await.ok().map(|r| r.into_inner())
    }

    async fn rows(db: &Db) -> [i64; 3] {
        db.read(|c| {
            let n = |t: &str| c.query_row(&format!("SELECT COUNT(*) FROM {t}"), [], |r| r.get::<_, i64>(0));
            Ok([n("conversations")?, n("messages")?, n("conversation_titles")?])
        })
        .await
        .unwrap()
    }

    async fn set(db: &Db, key: &'static str, value: &'static str) {
        db.write(move |t, _| {
            t.execute("INSERT OR REPLACE INTO settings (key, value, updated_at) VALUES (?1, ?2, 'now')", [key, value])?;
            Ok(())
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn idle_conversations_are_archived_after_7_days_and_deleted_30_days_later() {
        let (_dir, db, svc, clock) = open();
        // 1: last message 8 days ago. 2: last message 6 days ago. 3: created 10 days ago, never
        // a message. 4: created 10 days ago, a message an hour ago. 5: archived by hand 31 days
        // ago. 6: archived by hand 29 days ago.
        conversation(&svc, &clock, 1, NOW - 20 * DAY_MS, Some(NOW - 8 * DAY_MS)).await;
        conversation(&svc, &clock, 2, NOW - 20 * DAY_MS, Some(NOW - 6 * DAY_MS)).await;
        conversation(&svc, &clock, 3, NOW - 10 * DAY_MS, None).await;
        conversation(&svc, &clock, 4, NOW - 10 * DAY_MS, Some(NOW - 3_600_000)).await;
        for (n, ago) in [(5, 31), (6, 29)] {
            conversation(&svc, &clock, n, NOW - 40 * DAY_MS, Some(NOW - 40 * DAY_MS)).await;
            clock.store(NOW - ago * DAY_MS, Ordering::Relaxed);
            let archive = UpdateConversationRequest { id: id(n), archived: Some(true), ..Default::default() };
            svc.update_conversation(Request::new(archive)).await.unwrap();
        }
        assert_eq!(rows(&db).await, [6, 5, 6]);

        let p = prune(&db, NOW, &CancellationToken::new()).await.unwrap();
        assert_eq!((p.conversations_archived, p.conversations_deleted), (2, 1), "{p:?}");
        let archived = |c: Option<ConversationRecord>| c.map(|c| c.archived_ms);
        assert_eq!(archived(state(&svc, 1).await), Some(NOW));
        assert_eq!(archived(state(&svc, 2).await), Some(0));
        assert_eq!(archived(state(&svc, 3).await), Some(NOW));
        assert_eq!(archived(state(&svc, 4).await), Some(0));
        assert_eq!(archived(state(&svc, 5).await), None, "archived 31 days ago: deleted");
        assert_eq!(archived(state(&svc, 6).await), Some(NOW - 29 * DAY_MS));
        let one = state(&svc, 1).await.unwrap();
        assert_eq!(one.version, 2, "archiving is an update: a stale writer gets ABORTED");
        // Conversation 5's message went with it, and its title row.
        assert_eq!(rows(&db).await, [5, 4, 5]);
        // A second pass at the same time finds nothing.
        let p = prune(&db, NOW, &CancellationToken::new()).await.unwrap();
        assert_eq!((p.conversations_archived, p.conversations_deleted), (0, 0));
        // 30 days on, what was archived now is deleted, and conversation 6 (archived 59 days
        // ago); 2 and 4 have been idle long enough to be archived meanwhile.
        let p = prune(&db, NOW + 31 * DAY_MS, &CancellationToken::new()).await.unwrap();
        assert_eq!((p.conversations_archived, p.conversations_deleted), (2, 3), "{p:?}");
        assert!(state(&svc, 1).await.is_none() && state(&svc, 3).await.is_none() && state(&svc, 6).await.is_none());
        assert_eq!(rows(&db).await, [2, 2, 2]);
    }

    #[tokio::test]
    async fn zero_keeps_conversations_forever_and_a_restored_one_is_left_alone_for_the_period() {
        let (_dir, db, svc, clock) = open();
        conversation(&svc, &clock, 1, NOW - 400 * DAY_MS, Some(NOW - 400 * DAY_MS)).await;
        conversation(&svc, &clock, 2, NOW - 400 * DAY_MS, None).await;
        clock.store(NOW - 300 * DAY_MS, Ordering::Relaxed);
        svc.update_conversation(Request::new(UpdateConversationRequest {
            id: id(2),
            archived: Some(true),
            ..Default::default()
        }))
        .await
        .unwrap();
        set(&db, "retention.conversations_archive_days", "0").await;
        set(&db, "retention.conversations_delete_days", "0").await;
        let p = prune(&db, NOW, &CancellationToken::new()).await.unwrap();
        assert_eq!(p, Pruned::default());
        assert_eq!(rows(&db).await, [2, 1, 2]);

        // Archiving on again: 1 is archived. Restored, it is not archived again until it has
        // been left alone for 7 more days; a message then keeps it active 7 days from that one.
        set(&db, "retention.conversations_archive_days", "7").await;
        let p = prune(&db, NOW, &CancellationToken::new()).await.unwrap();
        assert_eq!((p.conversations_archived, p.conversations_deleted), (1, 0));
        clock.store(NOW, Ordering::Relaxed);
        let restore = UpdateConversationRequest { id: id(1), archived: Some(false), ..Default::default() };
        svc.update_conversation(Request::new(restore)).await.unwrap();
        assert_eq!(state(&svc, 1).await.unwrap().archived_ms, 0);
        let p = prune(&db, NOW + DAY_MS, &CancellationToken::new()).await.unwrap();
        assert_eq!(p.conversations_archived, 0, "restored a day ago");
        clock.store(NOW + 5 * DAY_MS, Ordering::Relaxed);
        let m = MessageRecord {
            id: id(50),
            conversation_id: id(1),
            role: MessageRole::User.into(),
            status: MessageStatus::Complete.into(),
            blocks: vec![ContentBlockRecord { block: Some(content_block_record::Block::Text("back".into())) }],
            ..Default::default()
        };
        svc.append_message(Request::new(m)).await.unwrap();
        let p = prune(&db, NOW + 8 * DAY_MS, &CancellationToken::new()).await.unwrap();
        assert_eq!(p.conversations_archived, 0, "a message 3 days ago");
        assert_eq!(state(&svc, 1).await.unwrap().archived_ms, 0);
        let p = prune(&db, NOW + 13 * DAY_MS, &CancellationToken::new()).await.unwrap();
        assert_eq!(p.conversations_archived, 1, "8 days after its last message");
        assert_eq!(state(&svc, 1).await.unwrap().archived_ms, NOW + 13 * DAY_MS);
    }

    #[tokio::test]
    async fn many_conversations_go_in_batches() {
        let (_dir, db, svc, clock) = open();
        let n = CONVERSATION_BATCH as u128 * 2 + 30;
        for i in 1..=n {
            conversation(&svc, &clock, i, NOW - 100 * DAY_MS, Some(NOW - 100 * DAY_MS)).await;
        }
        let p = prune(&db, NOW, &CancellationToken::new()).await.unwrap();
        assert_eq!(p.conversations_archived, n as u64);
        let p = prune(&db, NOW + 31 * DAY_MS, &CancellationToken::new()).await.unwrap();
        assert_eq!(p.conversations_deleted, n as u64);
        assert_eq!(rows(&db).await, [0, 0, 0]);
        // A cancelled pass stops before its first batch.
        conversation(&svc, &clock, 1, NOW - 100 * DAY_MS, None).await;
        let stop = CancellationToken::new();
        stop.cancel();
        assert_eq!(prune(&db, NOW, &stop).await.unwrap(), Pruned::default());
    }
}
