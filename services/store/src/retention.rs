//! Retention: prunes `mcp_invocations` and `audit_log` by age and by row count — once when the
//! store starts, then every [`INTERVAL`], and on demand (`PruneNow`, `POST /v1/maintenance/prune`).
//!
//! The policy is read from the settings table at every pass, so a `PATCH /v1/settings` applies
//! at the next pass without a restart. The settings, their defaults and bounds are the
//! `retention.*` rows of `coffer_types::settings` ([`SETTINGS`]): age in days and row count per
//! table, `0` disabling that limit. A stored value the table does not accept is ignored (the
//! default applies) with a warning in the store's log.
//!
//! Deletions go through the single writer in batches of at most [`BATCH`] rows, one short
//! transaction each; writes queued meanwhile (invocation batches, registry changes) run between
//! two batches, so even a large first prune never holds the writer for long. Pruning writes no
//! change rows: logs are not part of the change stream.
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

/// The retention settings (key, default, bounds), in the order they are documented.
pub const SETTINGS: &[Setting] = &[INVOCATIONS.days, INVOCATIONS.rows, AUDIT.days, AUDIT.rows];

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

/// The whole retention policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub invocations: Limit,
    pub audit: Limit,
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
        let mut limit = |t: &Table| Limit { days: get(&t.days), max_rows: get(&t.rows) };
        let policy = Policy { invocations: limit(&INVOCATIONS), audit: limit(&AUDIT) };
        (policy, warnings)
    }
}

/// Rows one pass deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub invocations: u64,
    pub audit: u64,
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
    Ok(Pruned {
        invocations: prune_table(db, &INVOCATIONS, policy.invocations, now_ms, stop).await?,
        audit: prune_table(db, &AUDIT, policy.audit, now_ms, stop).await?,
    })
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
    let detail = serde_json::json!({"invocations": pruned.invocations, "audit": pruned.audit}).to_string();
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
                Ok(p) if p.invocations + p.audit > 0 => tracing::info!(
                    invocations = p.invocations,
                    audit = p.audit,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "Retention pruned old log rows."
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
        assert_eq!(SETTINGS.len(), 4);
    }

    #[tokio::test]
    async fn prunes_by_age_with_the_defaults() {
        let (_dir, db) = open();
        // Row i is i days old: 0..=400.
        fill(&db, 401, |i| i).await;
        let p = prune(&db, NOW, &CancellationToken::new()).await.unwrap();
        // Invocations keep ages 0..=30 (strictly older than 30 days goes), audit 0..=365.
        assert_eq!(p, Pruned { invocations: 370, audit: 35 });
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
        assert_eq!(p, Pruned { invocations: n as u64 - 100, audit: n as u64 - 7 });
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
        assert_eq!(prune(&db, NOW, &CancellationToken::new()).await.unwrap(), Pruned { invocations: 0, audit: 39 });
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
        assert_eq!(detail, r#"{"invocations":3,"audit":0}"#);
    }
}
