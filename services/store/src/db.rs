//! `coffer.db`: migrations, the single writer thread, read-only reader connections, and the
//! change stream.
//!
//! Every write runs on one dedicated thread that owns the only read-write connection, inside
//! one `BEGIN IMMEDIATE` transaction per job; the job's change rows are inserted in the same
//! transaction, and broadcast only after the commit. Reads use a small pool of read-only
//! connections on tokio's blocking pool and never wait on the writer (WAL).
//!
//! Migrations (`migrations/NNNN_*.sql`) are append-only, and this is enforced: the store
//! records the SHA-256 of every migration it applied (table `schema_migrations`) and refuses to
//! open a database one of whose applied migrations has since changed
//! ([`StoreError::MigrationChanged`], naming the file). `migrations/checksums.sha256` is the
//! committed list that a test compares with the files, so an edited migration fails CI before
//! it reaches anyone's database.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use coffer_proto::store::{ChangeEntity, ChangeOp};
use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction};
use rusqlite_migration::{M, Migrations};
use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, oneshot};

/// The store's domain errors; mapped to `tonic::Status` once, in [`crate::domain`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    Exists(String),
    /// The call needs state the store does not have yet (e.g. vectors before `ConfigureVectors`).
    #[error("{0}")]
    Precondition(String),
    /// The call was made against state that has since changed (e.g. vectors for another model).
    #[error("{0}")]
    Aborted(String),
    #[error("version conflict on {what}: expected {expected}, current {current}")]
    Conflict { what: String, expected: i64, current: i64 },
    #[error("database error: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("migration failed: {0}")]
    Migration(#[from] rusqlite_migration::Error),
    #[error("backup before migration failed: {0}")]
    Backup(String),
    /// An applied migration's file is not the one that was applied: migrations are append-only.
    #[error(
        "migrations/{file} was changed after it was applied to this database (applied sha256 {applied}, now {now}); \
         migrations are append-only: restore the file and put the change in a new migration"
    )]
    MigrationChanged { file: String, applied: String, now: String },
    #[error("the writer thread is gone")]
    WriterGone,
}

/// A committed change, as streamed by `WatchChanges`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeRec {
    /// Strictly increasing change number.
    pub seq: u64,
    pub entity: ChangeEntity,
    /// What changed, per entity (see `store_changes.proto`).
    pub key: String,
    pub op: ChangeOp,
}

/// One schema migration: its file name in `migrations/` and its SQL.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub file: &'static str,
    pub sql: &'static str,
}

impl Migration {
    /// SHA-256 of the file, lowercase hex.
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(self.sql.as_bytes()))
    }
}

/// `Migration { file, sql: include_str!("../../../migrations/<file>") }`.
macro_rules! migration {
    ($file:literal) => {
        Migration { file: $file, sql: include_str!(concat!("../../../migrations/", $file)) }
    };
}

/// The schema migrations, in order: append a file, never edit one (see the module docs).
pub const MIGRATIONS: &[Migration] = &[
    migration!("0001_init.sql"),
    migration!("0002_invocation_actor.sql"),
    migration!("0003_migration_checksums.sql"),
    migration!("0004_index.sql"),
    migration!("0005_conversations.sql"),
    migration!("0006_llm_connections.sql"),
    migration!("0007_invocation_usage.sql"),
    migration!("0008_channels.sql"),
    migration!("0009_invocation_client.sql"),
    migration!("0010_pairing_tries.sql"),
    migration!("0011_audit_auth.sql"),
    migration!("0012_server_sandbox.sql"),
    migration!("0013_message_files_changed.sql"),
    migration!("0014_conversation_allowed_tools.sql"),
    migration!("0015_message_agent.sql"),
    migration!("0016_invocation_conversation.sql"),
    migration!("0017_profiles.sql"),
    migration!("0018_invocation_profile.sql"),
    migration!("0019_server_sse.sql"),
    migration!("0020_note_links.sql"),
    migration!("0021_fts_external_content.sql"),
];

/// The migrations as `rusqlite_migration` runs them.
pub fn migrations() -> Migrations<'static> {
    migrations_of(MIGRATIONS)
}

pub(crate) fn migrations_of(list: &'static [Migration]) -> Migrations<'static> {
    Migrations::new(list.iter().map(|m| M::up(m.sql)).collect())
}

/// Refuses `conn` when a migration it recorded as applied (at most the first `applied`) differs
/// from the one in `list`.
fn verify_applied(conn: &Connection, list: &[Migration], applied: usize) -> Result<(), StoreError> {
    if !has_checksums(conn)? {
        return Ok(());
    }
    let mut st = conn.prepare("SELECT sha256 FROM schema_migrations WHERE version = ?1")?;
    for (i, m) in list.iter().enumerate().take(applied) {
        let Some(sha) = st.query_row([i as i64 + 1], |r| r.get::<_, String>(0)).optional()? else { continue };
        let now = m.sha256();
        if sha != now {
            return Err(StoreError::MigrationChanged { file: m.file.to_owned(), applied: sha, now });
        }
    }
    Ok(())
}

/// Whether the database has the checksum table (migration 0003 created it).
fn has_checksums(conn: &Connection) -> Result<bool, StoreError> {
    Ok(conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'schema_migrations')",
        [],
        |r| r.get(0),
    )?)
}

/// Records the checksum of every applied migration not recorded yet (those applied just now,
/// and, once, those applied before the store recorded checksums).
fn record_applied(conn: &Connection, list: &[Migration]) -> Result<(), StoreError> {
    if !has_checksums(conn)? {
        return Ok(());
    }
    let now = coffer_runtime::now_rfc3339();
    let mut st = conn.prepare(
        "INSERT INTO schema_migrations (version, file, sha256, applied_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (version) DO NOTHING",
    )?;
    for (i, m) in list.iter().enumerate() {
        st.execute((i as i64 + 1, m.file, m.sha256(), &now))?;
    }
    Ok(())
}

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// Handle to the database; cheap to clone.
#[derive(Clone)]
pub struct Db {
    writer: std::sync::mpsc::SyncSender<Job>,
    readers: Arc<Mutex<Vec<Connection>>>,
    /// The keyword ranking's row lengths, shared by the writer and every reader.
    row_sizes: Arc<crate::fts_rank::RowSizes>,
    path: Arc<PathBuf>,
    head: Arc<AtomicU64>,
    changes: broadcast::Sender<ChangeRec>,
}

/// Collects the change rows a write job produces.
pub struct Changes(Vec<(ChangeEntity, String, ChangeOp)>);

impl Changes {
    /// Adds a change row for `key` of `entity`, written in the job's transaction.
    pub fn push(&mut self, entity: ChangeEntity, key: impl Into<String>, op: ChangeOp) {
        self.0.push((entity, key.into(), op));
    }
}

/// Registers the sqlite-vec extension (`vec0` tables, `vec_distance_cosine`, …) for every
/// connection this process opens from now on; idempotent. [`Db::open`] calls it before it opens
/// anything, so the writer and every reader have it (the Index domain's `kb_vectors` table is a
/// `vec0`, and so is any read or `VACUUM INTO` that touches it).
pub fn register_sqlite_vec() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sqlite3_vec_init` is the extension's entry point with the signature SQLite
        // expects of an auto-extension (`int (*)(sqlite3*, char**, const sqlite3_api_routines*)`);
        // the crate declares it without arguments, hence the transmute of the function pointer,
        // which is what sqlite-vec documents for rusqlite. `sqlite3_auto_extension` is
        // thread-safe and only records the pointer (a static function, valid for the process).
        #[allow(unsafe_code)]
        let rc = unsafe {
            rusqlite::ffi::sqlite3_auto_extension(Some(std::mem::transmute::<
                *const (),
                unsafe extern "C" fn(
                    *mut rusqlite::ffi::sqlite3,
                    *mut *mut std::os::raw::c_char,
                    *const rusqlite::ffi::sqlite3_api_routines,
                ) -> std::os::raw::c_int,
            >(sqlite_vec::sqlite3_vec_init as *const ())))
        };
        if rc != rusqlite::ffi::SQLITE_OK {
            tracing::error!(rc, "Registering sqlite-vec failed: the vector index is unavailable.");
        }
    });
}

fn configure(conn: &Connection, sizes: &Arc<crate::fts_rank::RowSizes>) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    crate::fts_rank::register(conn, sizes)
}

impl Db {
    /// Opens (creating if needed) the database at `path`: WAL, the applied migrations checked
    /// against their recorded checksums, a copy of the file taken before any pending migration
    /// runs (`<db>.bak-v<from>-<unix ms>`), then the migrations. Returns only once the schema is
    /// current.
    ///
    /// # Errors
    /// [`StoreError::MigrationChanged`] naming the file when an applied migration was edited;
    /// [`StoreError`] when the file cannot be opened, backed up or migrated.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, MIGRATIONS)
    }

    /// [`Db::open`] with another migration list (tests).
    fn open_with(path: &Path, list: &'static [Migration]) -> Result<Self, StoreError> {
        register_sqlite_vec();
        let existed = path.exists();
        // coffer-store owns coffer.db: its one writer connection.
        #[allow(clippy::disallowed_methods)]
        let mut conn = Connection::open(path)?;
        let row_sizes = Arc::new(crate::fts_rank::RowSizes::default());
        configure(&conn, &row_sizes)?;
        // Freed pages go back to the file system on request (`Db::reclaim`, after a knowledge
        // base's index is removed). A new file takes the mode at once; an existing one in
        // another mode is rebuilt once by VACUUM (the only way to switch), logged.
        if existed {
            let mode: i64 = conn.pragma_query_value(None, "auto_vacuum", |r| r.get(0))?;
            if mode != 2 {
                let started = std::time::Instant::now();
                conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
                conn.execute_batch("VACUUM")?;
                tracing::info!(
                    took_ms = started.elapsed().as_millis() as u64,
                    "Switched the database to incremental vacuum (once)."
                );
            }
        } else {
            conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
        }
        conn.pragma_update(None, "journal_mode", "WAL")?;
        // NORMAL in WAL mode keeps every committed transaction across a process kill (the WAL is
        // in the OS page cache); only power loss may drop the last few.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let migrations = migrations_of(list);
        let current: usize = conn.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))? as usize;
        let target = list.len();
        // Before anything changes: an edited migration means this schema is not what the code
        // expects, and running the later ones could damage it.
        verify_applied(&conn, list, current)?;
        if existed && current < target {
            let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
            let backup = path.with_extension(format!("db.bak-v{current}-{ms}"));
            conn.execute("VACUUM INTO ?1", [backup.display().to_string()])
                .map_err(|e| StoreError::Backup(format!("{}: {e}", backup.display())))?;
            tracing::info!(from = current, to = target, backup = %backup.display(), "Backed up the database before migrating.");
        }
        migrations.to_latest(&mut conn)?;
        record_applied(&conn, list)?;
        // Derived data whose format changed without a migration (a `vec0` table's DDL depends
        // on the configured dimension, which a SQL file cannot know).
        // The keyword index's text as 0021 copied it, reduced to what the raw text does not give
        // (the tokenizer is Rust-side knowledge too), once, by the open that applied 0021.
        if list.iter().position(|m| m.file == "0021_fts_external_content.sql").is_some_and(|at| current <= at) {
            let compacted = crate::domain::index::compact_index_text(&mut conn)?;
            if compacted > 0 {
                tracing::info!(rows = compacted, "Kept the keyword index's text once (migration 0021).");
            }
        }
        let converted = crate::domain::index::upgrade_vectors_to_int8(&mut conn)?;
        if converted > 0 {
            tracing::info!(vectors = converted, "Stored the knowledge bases' vectors as 8-bit integers (once).");
        }
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
            row_sizes,
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

    /// Gives space freed by deletions back to the file system, through the writer thread:
    /// `PRAGMA incremental_vacuum` (every free page; the database is in `auto_vacuum =
    /// INCREMENTAL` mode, see [`Db::open`]) then a `wal_checkpoint(TRUNCATE)` (the WAL grew with
    /// the deletions). Best effort: a reader holding an old snapshot leaves part of the WAL for
    /// the next checkpoint. Returns the database file's size after it, bytes.
    ///
    /// # Errors
    /// When SQLite fails or the writer is gone.
    pub async fn reclaim(&self) -> Result<u64, StoreError> {
        let (tx, rx) = oneshot::channel();
        let path = self.path.clone();
        let job: Job = Box::new(move |conn: &mut Connection| {
            let r = (|| {
                // incremental_vacuum returns a row per step; every row must be stepped through.
                let mut st = conn.prepare("PRAGMA incremental_vacuum")?;
                let mut rows = st.query([])?;
                while rows.next()?.is_some() {}
                drop(rows);
                drop(st);
                conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
                Ok::<_, rusqlite::Error>(())
            })()
            .map_err(StoreError::from)
            .map(|()| std::fs::metadata(path.as_path()).map(|m| m.len()).unwrap_or(0));
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
    ///
    /// How the request being served was authenticated (`coffer_runtime::grpc::current_auth`,
    /// read here: the writer thread has no request context; `internal:store` outside any
    /// request) is what audit rows written by `f` record
    /// ([`crate::domain::audit::record_outcome`]).
    pub async fn write<T, F>(&self, f: F) -> Result<(T, u64), StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Transaction, &mut Changes) -> Result<T, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let head = self.head.clone();
        let bus = self.changes.clone();
        // Outside any request (a retention pass, start-up work) the write is the store's own.
        let auth = coffer_runtime::grpc::current_auth().unwrap_or_else(|| "internal:store".to_owned());
        let job: Job = Box::new(move |conn: &mut Connection| {
            let _auth = crate::domain::audit::RequestAuth::set(auth);
            let res = (|| {
                let t = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let mut changes = Changes(Vec::new());
                let value = f(&t, &mut changes)?;
                let now = coffer_runtime::now_rfc3339();
                let mut recs = Vec::with_capacity(changes.0.len());
                for (entity, key, op) in changes.0 {
                    t.execute(
                        "INSERT INTO changes (entity, key, op, at) VALUES (?1, ?2, ?3, ?4)",
                        (entity.as_str(), &key, op.as_str(), &now),
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
        let pool = self.reader_pool();
        tokio::task::spawn_blocking(move || pool.run(f)).await.map_err(|_| StoreError::WriterGone)?
    }

    /// Runs `f` on a read-only connection from the pool on the calling thread, for a short
    /// query that a caller waits on (the Index domain's searches): on a multi-threaded runtime
    /// the worker thread runs it itself ([`tokio::task::block_in_place`], which hands the
    /// worker's other tasks to another thread meanwhile) instead of passing it to a thread of
    /// the blocking pool and being woken with its answer. Each of those two hand-overs is a
    /// thread wake-up, and on a busy machine a wake-up of this process (a background one, at
    /// `COFFER_BACKGROUND_NICE`) can wait a scheduler slice for a CPU. On a current-thread
    /// runtime it is [`Db::read`].
    pub async fn read_now<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        if tokio::runtime::Handle::current().runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return self.read(f).await;
        }
        let pool = self.reader_pool();
        tokio::task::block_in_place(move || pool.run(f))
    }

    /// The row lengths every connection's `coffer_bm25` shares ([`crate::fts_rank::RowSizes`]).
    pub fn row_sizes(&self) -> Arc<crate::fts_rank::RowSizes> {
        self.row_sizes.clone()
    }

    fn reader_pool(&self) -> ReaderPool {
        ReaderPool { readers: self.readers.clone(), path: self.path.clone(), sizes: self.row_sizes.clone() }
    }
}

/// The read-only connections of a [`Db`], and what opening another one needs.
/// How much of coffer.db each reader maps into memory (`PRAGMA mmap_size`).
const READER_MMAP_BYTES: u64 = 1 << 30;

struct ReaderPool {
    readers: Arc<Mutex<Vec<Connection>>>,
    path: Arc<PathBuf>,
    sizes: Arc<crate::fts_rank::RowSizes>,
}

impl ReaderPool {
    /// Runs `f` on a pooled connection (a new one when none is free; at most 4 are kept).
    fn run<T>(self, f: impl FnOnce(&Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let conn = match self.readers.lock().expect("reader pool").pop() {
            Some(c) => c,
            None => {
                // coffer-store owns coffer.db: a read-only reader of its pool.
                #[allow(clippy::disallowed_methods)]
                let c = Connection::open_with_flags(
                    self.path.as_path(),
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                configure(&c, &self.sizes)?;
                // Pages read straight from a shared mapping of the file instead of copied into
                // each connection's own 2 MB cache by a `pread` per page: a keyword query walks
                // long FTS5 doclists, and those reads were a tenth of its time. Address space
                // only; SQLite falls back to reads beyond it, and for pages still in the WAL.
                c.query_row(&format!("PRAGMA mmap_size = {READER_MMAP_BYTES}"), [], |_| Ok(()))?;
                c
            }
        };
        let out = f(&conn);
        let mut pool = self.readers.lock().expect("reader pool");
        if pool.len() < 4 {
            pool.push(conn);
        }
        out
    }
}

#[cfg(test)]
// coffer-store owns coffer.db: its tests make old or hand-edited files directly.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_valid() {
        migrations().validate().unwrap();
    }

    /// `read_now` answers what `read` answers, on the calling worker thread of a multi-threaded
    /// runtime (none of the blocking pool's), on a current-thread runtime (through the blocking
    /// pool there), while the runtime's other tasks keep running, and sees committed writes.
    #[test]
    fn read_now_runs_on_the_calling_worker_and_answers_as_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coffer.db");
        let count = |c: &Connection| Ok(c.query_row("SELECT count(*) FROM settings", [], |r| r.get::<_, i64>(0))?);
        let multi = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        multi.block_on(async {
            let db = Db::open(&path).unwrap();
            db.write(|t, _| {
                Ok(t.execute("INSERT INTO settings (key, value, updated_at) VALUES ('a', '1', 'now')", [])?)
            })
            .await
            .unwrap();
            let caller = std::thread::current().id();
            let (n, on) = db.read_now(move |c| Ok((count(c)?, std::thread::current().id()))).await.unwrap();
            assert_eq!((n, on), (db.read(count).await.unwrap(), caller), "answered on the calling thread");
            // Other tasks are not held up by a read in progress.
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let other = tokio::spawn(async move { tx.send(()).unwrap() });
            db.read_now(move |_| {
                rx.recv_timeout(std::time::Duration::from_secs(20)).map_err(|e| StoreError::Invalid(e.to_string()))
            })
            .await
            .unwrap();
            other.await.unwrap();
        });
        let single = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        single.block_on(async {
            let db = Db::open(&path).unwrap();
            assert_eq!(db.read_now(count).await.unwrap(), db.read(count).await.unwrap());
        });
    }

    #[tokio::test]
    async fn writes_bump_head_and_broadcast() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("coffer.db")).unwrap();
        let mut sub = db.subscribe();
        let ((), seq) = db
            .write(|t, ch| {
                t.execute("INSERT INTO settings (key, value, updated_at) VALUES ('a', 'b', 'now')", [])?;
                ch.push(ChangeEntity::Setting, "a", ChangeOp::Set);
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(seq, 1);
        assert_eq!(db.head(), 1);
        assert_eq!(sub.recv().await.unwrap().seq, 1);
        let back = crate::domain::changes::since(&db, 0, 10).await.unwrap();
        assert_eq!(back, [ChangeRec { seq: 1, entity: ChangeEntity::Setting, key: "a".into(), op: ChangeOp::Set }]);
        // A failing job rolls back and leaves head unchanged.
        let err = db
            .write(|t, ch| {
                t.execute("INSERT INTO settings (key, value, updated_at) VALUES ('c', 'd', 'now')", [])?;
                ch.push(ChangeEntity::Setting, "c", ChangeOp::Set);
                Err::<(), _>(StoreError::Invalid("nope".into()))
            })
            .await;
        assert!(err.is_err());
        assert_eq!(db.head(), 1);
        let n: i64 = db.read(|c| Ok(c.query_row("SELECT COUNT(*) FROM settings", [], |r| r.get(0))?)).await.unwrap();
        assert_eq!(n, 1);
    }

    #[test]
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

    /// The committed list of checksums, `sha256sum` format: `<hex>  <file>` per line.
    fn committed_checksums() -> Vec<(String, String)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
        let text = std::fs::read_to_string(dir.join("checksums.sha256")).unwrap();
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let (sha, file) = l.split_once("  ").unwrap_or_else(|| panic!("bad line {l:?}"));
                (file.to_owned(), sha.to_owned())
            })
            .collect()
    }

    /// Editing a migration that may have been applied anywhere fails here: its checksum no
    /// longer matches the committed one (`migrations/checksums.sha256`). A new migration is a
    /// new file, a new line there and a new entry in [`MIGRATIONS`].
    #[test]
    fn migration_files_match_the_committed_checksums() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
        let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sql"))
            .map(|n| {
                let sha = hex::encode(Sha256::digest(std::fs::read(dir.join(&n)).unwrap()));
                (n, sha)
            })
            .collect();
        files.sort();
        let committed = committed_checksums();
        assert_eq!(
            files, committed,
            "migrations/*.sql differ from migrations/checksums.sha256: migrations are append-only (add a new file \
             and its line; never edit one)"
        );
        let embedded: Vec<(String, String)> = MIGRATIONS.iter().map(|m| (m.file.to_owned(), m.sha256())).collect();
        assert_eq!(embedded, committed, "db::MIGRATIONS must list every migration file, in order");
        for (i, (file, _)) in committed.iter().enumerate() {
            assert!(file.starts_with(&format!("{:04}_", i + 1)), "{file} is not number {}", i + 1);
        }
    }

    #[test]
    fn an_edited_applied_migration_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("coffer.db");
        drop(Db::open(&p).unwrap());
        let recorded: Vec<(i64, String, String)> = {
            let c = Connection::open(&p).unwrap();
            let mut st = c.prepare("SELECT version, file, sha256 FROM schema_migrations ORDER BY version").unwrap();
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect()
        };
        let expected: Vec<(i64, String, String)> =
            MIGRATIONS.iter().enumerate().map(|(i, m)| (i as i64 + 1, m.file.to_owned(), m.sha256())).collect();
        assert_eq!(recorded, expected);
        // Reopening with the same files is fine.
        drop(Db::open(&p).unwrap());

        let mut edited = MIGRATIONS.to_vec();
        edited[1].sql = "ALTER TABLE mcp_invocations ADD COLUMN actor TEXT NOT NULL DEFAULT 'someone';";
        let edited: &'static [Migration] = Box::leak(edited.into_boxed_slice());
        let e = Db::open_with(&p, edited).err().expect("an edited migration is refused");
        assert!(matches!(&e, StoreError::MigrationChanged { file, .. } if file == "0002_invocation_actor.sql"), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("migrations/0002_invocation_actor.sql") && msg.contains("append-only"), "{msg}");
    }

    #[test]
    fn a_database_migrated_before_checksums_gets_them_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("coffer.db");
        {
            // A database of the first release: migration 0001 only, an invocation row in it.
            let mut c = Connection::open(&p).unwrap();
            migrations_of(&MIGRATIONS[..1]).to_latest(&mut c).unwrap();
            c.execute(
                "INSERT INTO mcp_invocations (at, target, method, server, session_id, duration_ms, outcome)
                 VALUES ('2026-01-01T00:00:00.000Z', 's__t', 'tools/call', 's', 'x', 1, 'ok')",
                [],
            )
            .unwrap();
        }
        drop(Db::open(&p).unwrap());
        let c = Connection::open(&p).unwrap();
        let n: i64 = c.query_row("SELECT COUNT(*) FROM schema_migrations", [], |r| r.get(0)).unwrap();
        assert_eq!(n as usize, MIGRATIONS.len());
        // Rows logged before invocations had an actor were all MCP sessions'.
        let actor: String = c.query_row("SELECT actor FROM mcp_invocations", [], |r| r.get(0)).unwrap();
        assert_eq!(actor, "mcp");
    }
}
