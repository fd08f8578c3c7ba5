//! `coffer.db`: migrations, the single writer thread, read-only reader connections, and the
//! change stream.
//!
//! Every write runs on one dedicated thread that owns the only read-write connection, inside
//! one `BEGIN IMMEDIATE` transaction per job; the job's change rows are inserted in the same
//! transaction, and broadcast only after the commit. Reads use a small pool of read-only
//! connections on tokio's blocking pool and never wait on the writer (WAL).
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags, Transaction};
use rusqlite_migration::{M, Migrations};
use tokio::sync::{broadcast, oneshot};

/// The store's domain errors; mapped to `tonic::Status` once, in [`crate::rpc`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    Exists(String),
    #[error("version conflict on {what}: expected {expected}, current {current}")]
    Conflict { what: String, expected: i64, current: i64 },
    #[error("database error: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("migration failed: {0}")]
    Migration(#[from] rusqlite_migration::Error),
    #[error("backup before migration failed: {0}")]
    Backup(String),
    #[error("the writer thread is gone")]
    WriterGone,
}

/// A committed change, as streamed by `WatchChanges`.
#[derive(Debug, Clone)]
pub struct ChangeRec {
    pub seq: u64,
    pub entity: &'static str,
    pub key: String,
    pub op: &'static str,
}

/// The schema migrations, in order (append-only files in `migrations/`).
pub fn migrations() -> Migrations<'static> {
    Migrations::new(MIGRATION_SQL.iter().map(|sql| M::up(sql)).collect())
}

/// The SQL of each migration, in order.
const MIGRATION_SQL: &[&str] = &[include_str!("../../../migrations/0001_init.sql")];

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// Handle to the database; cheap to clone.
#[derive(Clone)]
pub struct Db {
    writer: std::sync::mpsc::SyncSender<Job>,
    readers: Arc<Mutex<Vec<Connection>>>,
    path: Arc<PathBuf>,
    head: Arc<AtomicU64>,
    changes: broadcast::Sender<ChangeRec>,
}

/// Collects the change rows a write job produces.
pub struct Changes(Vec<(&'static str, String, &'static str)>);

impl Changes {
    pub fn push(&mut self, entity: &'static str, key: impl Into<String>, op: &'static str) {
        self.0.push((entity, key.into(), op));
    }
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

impl Db {
    /// Opens (creating if needed) the database at `path`: WAL, a copy of the file taken before
    /// any pending migration runs (`<db>.bak-v<from>-<unix ms>`), then the migrations. Returns
    /// only once the schema is current.
    ///
    /// # Errors
    /// [`StoreError`] when the file cannot be opened, backed up or migrated.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let existed = path.exists();
        // coffer-store owns coffer.db: its one writer connection.
        #[allow(clippy::disallowed_methods)]
        let mut conn = Connection::open(path)?;
        configure(&conn)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // NORMAL in WAL mode keeps every committed transaction across a process kill (the WAL is
        // in the OS page cache); only power loss may drop the last few.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let migrations = migrations();
        let current: usize = conn.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))? as usize;
        let target = MIGRATION_SQL.len();
        if existed && current < target {
            let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
            let backup = path.with_extension(format!("db.bak-v{current}-{ms}"));
            conn.execute("VACUUM INTO ?1", [backup.display().to_string()])
                .map_err(|e| StoreError::Backup(format!("{}: {e}", backup.display())))?;
            tracing::info!(from = current, to = target, backup = %backup.display(), "Backed up the database before migrating.");
        }
        migrations.to_latest(&mut conn)?;
        let head: i64 = conn.query_row("SELECT COALESCE(MAX(seq), 0) FROM changes", [], |r| r.get(0))?;

        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(1024);
        std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || {
                let mut conn = conn;
                while let Ok(job) = rx.recv() {
                    job(&mut conn);
                }
            })
            .map_err(|e| StoreError::Invalid(format!("cannot start writer thread: {e}")))?;
        let (changes, _) = broadcast::channel(4096);
        Ok(Self {
            writer: tx,
            readers: Arc::new(Mutex::new(Vec::new())),
            path: Arc::new(path.to_path_buf()),
            head: Arc::new(AtomicU64::new(head as u64)),
            changes,
        })
    }

    /// Checkpoints the WAL into the main database file and truncates it (at shutdown), through
    /// the writer thread.
    ///
    /// # Errors
    /// When SQLite refuses the checkpoint or the writer is gone.
    pub async fn checkpoint(&self) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn: &mut Connection| {
            let r = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).map_err(StoreError::from);
            let _ = tx.send(r);
        });
        self.submit(job).await?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Queues `job` for the writer thread. The queue is bounded; a full queue applies
    /// back-pressure on a blocking thread, never on the async workers.
    async fn submit(&self, job: Job) -> Result<(), StoreError> {
        let writer = self.writer.clone();
        tokio::task::spawn_blocking(move || writer.send(job))
            .await
            .map_err(|_| StoreError::WriterGone)?
            .map_err(|_| StoreError::WriterGone)
    }

    /// Highest committed change number.
    pub fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// The database file (`COFFER_HOME/coffer.db`).
    pub fn path(&self) -> &Path {
        self.path.as_path()
    }

    /// Subscribes to changes committed from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ChangeRec> {
        self.changes.subscribe()
    }

    /// Runs `f` in one immediate transaction on the writer thread. Change rows `f` pushes are
    /// written in the same transaction and broadcast after commit. Returns `f`'s value and the
    /// highest change number written (or the current head when none).
    pub async fn write<T, F>(&self, f: F) -> Result<(T, u64), StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction, &mut Changes) -> Result<T, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let head = self.head.clone();
        let bus = self.changes.clone();
        let job: Job = Box::new(move |conn: &mut Connection| {
            let res = (|| {
                let t = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let mut changes = Changes(Vec::new());
                let value = f(&t, &mut changes)?;
                let now = coffer_runtime::now_rfc3339();
                let mut recs = Vec::with_capacity(changes.0.len());
                for (entity, key, op) in changes.0 {
                    t.execute(
                        "INSERT INTO changes (entity, key, op, at) VALUES (?1, ?2, ?3, ?4)",
                        (entity, &key, op, &now),
                    )?;
                    recs.push(ChangeRec { seq: t.last_insert_rowid() as u64, entity, key, op });
                }
                t.commit()?;
                Ok::<_, StoreError>((value, recs))
            })();
            let out = res.map(|(value, recs)| {
                let seq = match recs.last() {
                    Some(last) => {
                        head.store(last.seq, Ordering::Release);
                        last.seq
                    }
                    None => head.load(Ordering::Acquire),
                };
                for r in recs {
                    let _ = bus.send(r);
                }
                (value, seq)
            });
            let _ = tx.send(out);
        });
        self.submit(job).await?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }

    /// Runs `f` on a read-only connection from the pool, on the blocking pool.
    pub async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let readers = self.readers.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let conn = match readers.lock().expect("reader pool").pop() {
                Some(c) => c,
                None => {
                    // coffer-store owns coffer.db: a read-only reader of its pool.
                    #[allow(clippy::disallowed_methods)]
                    let c = Connection::open_with_flags(
                        path.as_path(),
                        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                    )?;
                    configure(&c)?;
                    c
                }
            };
            let out = f(&conn);
            let mut pool = readers.lock().expect("reader pool");
            if pool.len() < 4 {
                pool.push(conn);
            }
            out
        })
        .await
        .map_err(|_| StoreError::WriterGone)?
    }

    /// Change rows with `seq > from`, oldest first, at most `limit`.
    pub async fn changes_since(&self, from: u64, limit: u32) -> Result<Vec<ChangeRec>, StoreError> {
        self.read(move |c| {
            let mut st =
                c.prepare_cached("SELECT seq, entity, key, op FROM changes WHERE seq > ?1 ORDER BY seq LIMIT ?2")?;
            let rows = st.query_map((from as i64, limit), |r| {
                Ok(ChangeRec {
                    seq: r.get::<_, i64>(0)? as u64,
                    entity: intern_entity(&r.get::<_, String>(1)?),
                    key: r.get(2)?,
                    op: intern_op(&r.get::<_, String>(3)?),
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}

fn intern_entity(s: &str) -> &'static str {
    match s {
        "server" => "server",
        "preference" => "preference",
        "settings" => "settings",
        "credential" => "credential",
        _ => "other",
    }
}

fn intern_op(s: &str) -> &'static str {
    match s {
        "create" => "create",
        "update" => "update",
        "delete" => "delete",
        "set" => "set",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_valid() {
        migrations().validate().unwrap();
    }

    #[tokio::test]
    async fn writes_bump_head_and_broadcast() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        let mut sub = db.subscribe();
        let ((), seq) = db
            .write(|t, ch| {
                t.execute("INSERT INTO settings (key, value, updated_at) VALUES ('a', 'b', 'now')", [])?;
                ch.push("settings", "a", "set");
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(seq, 1);
        assert_eq!(db.head(), 1);
        assert_eq!(sub.recv().await.unwrap().seq, 1);
        let back = db.changes_since(0, 10).await.unwrap();
        assert_eq!(back.len(), 1);
        // A failing job rolls back and leaves head unchanged.
        let err = db
            .write(|t, ch| {
                t.execute("INSERT INTO settings (key, value, updated_at) VALUES ('c', 'd', 'now')", [])?;
                ch.push("settings", "c", "set");
                Err::<(), _>(StoreError::Invalid("nope".into()))
            })
            .await;
        assert!(err.is_err());
        assert_eq!(db.head(), 1);
        let n: i64 = db.read(|c| Ok(c.query_row("SELECT COUNT(*) FROM settings", [], |r| r.get(0))?)).await.unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    // coffer-store owns coffer.db: the test makes an old file by hand.
    #[allow(clippy::disallowed_methods)]
    fn backup_taken_before_migrating_an_old_db() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("coffer.db");
        Connection::open(&p).unwrap().execute_batch("CREATE TABLE x(a); INSERT INTO x VALUES (1);").unwrap();
        let _db = Db::open(&p).unwrap();
        let backups: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".bak-v0-"))
            .collect();
        assert_eq!(backups.len(), 1);
    }
}
