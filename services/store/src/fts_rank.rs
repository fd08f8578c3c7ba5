//! `coffer_bm25(kb_fts, hits, w_title, w_headings, w_body)`: FTS5's bm25 ranking (the
//! formula and constants of SQLite's built-in `bm25()`, k1 = 1.2, b = 0.75, column weights
//! applied to each phrase instance) with one difference: the number of rows holding each
//! phrase of the query (`hits`, a blob of little-endian `i64`, one per phrase in the order of
//! the MATCH expression) comes from the caller instead of being counted on every query.
//!
//! Why: the built-in `bm25()` starts each query by walking the whole doclist of every phrase
//! to count its rows (`xQueryPhrase`) — for a term held by 20,000 chunks that walk costs more
//! than scoring the few thousand rows that match. The store keeps those counts in
//! [`DocFreq`], valid until the next write to the index, so repeated words cost nothing, and
//! counts a new word from FTS5's term index (`fts5vocab`) rather than with a `MATCH`.
//! The scores are the same as `bm25()`'s (a test compares them).
//!
//! Each row's length (its token count, which bm25 normalizes by) is read once from FTS5
//! (`xColumnSize`, a lookup in `kb_fts_docsize` per row) and then kept in [`RowSizes`], shared
//! by every connection of one database: a row of `kb_fts` is only ever inserted or deleted,
//! never updated, and its rowid is a chunk id (`AUTOINCREMENT`, never reused), so a length read
//! once stays true for as long as the row exists, whatever snapshot reads it (the Index domain
//! inserts every row with its chunk's id as rowid; a table filled without explicit rowids would
//! reuse the largest after a delete, and must not use this function). Scoring the few
//! thousand rows an any-term query matches spent about a third of its time on those lookups.
//!
//! The table's row count and average row length are read once per query (kept as the query's
//! FTS5 auxiliary data): FTS5 reloads them from its `averages` record on every
//! `xRowCount`/`xColumnTotalSize` call, a blob read per scored row.
//!
//! Created on every connection of the store's pool ([`register`], from `db::configure`).
use std::collections::HashMap;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rusqlite::OptionalExtension as _;
use rusqlite::ffi;

/// The SQL name of the ranking function.
pub const NAME: &str = "coffer_bm25";
/// `kb_fts`'s body column (after title and headings): the chunk's own text, its own heading
/// line included; the title and the parent headings are repeated in every chunk of a document.
pub const BODY_COLUMN: c_int = 2;
/// The SQL name of its twin that also files each row's score for [`best_rows`] (same
/// arguments, same value).
pub const TOP_NAME: &str = "coffer_bm25_top";
/// bm25's term-frequency saturation and length normalization (SQLite's values).
const K1: f64 = 1.2;
const B: f64 = 0.75;
/// Most phrases one query may have (`MAX_TERMS` of the Index domain).
const MAX_PHRASES: usize = 64;

/// Creates [`NAME`] on `conn`, keeping row lengths in `sizes` (every connection of the store's
/// pool gets it in `db::configure`, after its busy timeout is set: finding the FTS5 API runs a
/// statement, which may wait for a lock; all connections of one database share one
/// [`RowSizes`]).
///
/// # Errors
/// When the FTS5 API cannot be found or the function cannot be created.
pub fn register(conn: &rusqlite::Connection, sizes: &Arc<RowSizes>) -> rusqlite::Result<()> {
    let fail = |what: &str| {
        rusqlite::Error::SqliteFailure(ffi::Error::new(ffi::SQLITE_ERROR), Some(format!("coffer_bm25: {what}")))
    };
    let api = fts5_api(conn)?;
    // SAFETY: `api` is the FTS5 API of `conn` (valid for as long as the connection), checked
    // non-null and of version 2 or later by `fts5_api`; `rank` has exactly the signature of an
    // FTS5 extension function and is a static function; the user data is a leaked
    // `Arc<RowSizes>` that `release_sizes` takes back exactly once.
    #[allow(unsafe_code)]
    unsafe {
        let Some(create) = (*api).xCreateFunction else { return Err(fail("FTS5 has no xCreateFunction")) };
        // The function's user data is one strong count of `sizes`, released by
        // `release_sizes` when the connection drops the function (also when creation fails).
        for (name, f) in [(c"coffer_bm25", rank as Fts5Function), (c"coffer_bm25_top", rank_into_top as Fts5Function)] {
            let data = Arc::into_raw(Arc::clone(sizes)).cast_mut().cast::<std::ffi::c_void>();
            let rc = create(api, name.as_ptr(), data, Some(f), Some(release_sizes));
            if rc != ffi::SQLITE_OK {
                return Err(rusqlite::Error::SqliteFailure(
                    ffi::Error::new(rc),
                    Some(format!("{}: xCreateFunction", name.to_string_lossy())),
                ));
            }
        }
    }
    Ok(())
}

/// The FTS5 API of `conn` (non-null, version 2 or later).
///
/// # Errors
/// When the FTS5 API cannot be found.
fn fts5_api(conn: &rusqlite::Connection) -> rusqlite::Result<*mut ffi::fts5_api> {
    let mut api: *mut ffi::fts5_api = std::ptr::null_mut();
    let mut stmt: *mut ffi::sqlite3_stmt = std::ptr::null_mut();
    // SAFETY: `conn.handle()` is the open connection, used only on this thread for the length of
    // this call; the statement is finalized before returning; the bound pointer is to `api`,
    // which outlives the step that writes it, with the type tag FTS5 checks ("fts5_api_ptr").
    #[allow(unsafe_code)]
    unsafe {
        let db = conn.handle();
        let rc = ffi::sqlite3_prepare_v2(db, c"SELECT fts5(?1)".as_ptr(), -1, &raw mut stmt, std::ptr::null_mut());
        if rc != ffi::SQLITE_OK {
            return Err(rusqlite::Error::SqliteFailure(
                ffi::Error::new(rc),
                Some("coffer_bm25: SELECT fts5(?1)".into()),
            ));
        }
        ffi::sqlite3_bind_pointer(stmt, 1, (&raw mut api).cast(), c"fts5_api_ptr".as_ptr(), None);
        let rc = ffi::sqlite3_step(stmt);
        ffi::sqlite3_finalize(stmt);
        if rc != ffi::SQLITE_ROW && rc != ffi::SQLITE_DONE {
            return Err(rusqlite::Error::SqliteFailure(
                ffi::Error::new(rc),
                Some("coffer_bm25: SELECT fts5(?1)".into()),
            ));
        }
        if api.is_null() || (*api).iVersion < 2 {
            return Err(rusqlite::Error::SqliteFailure(
                ffi::Error::new(ffi::SQLITE_ERROR),
                Some("coffer_bm25: this SQLite has no FTS5 API of version 2 or later".into()),
            ));
        }
    }
    Ok(api)
}

/// The tokens FTS5's tokenizer `spec` (an FTS5 `tokenize` option: a tokenizer's name, then its
/// arguments, separated by spaces, e.g. `porter unicode61 remove_diacritics 2`) makes of `text`
/// tokenized as a query, in order; `None` when `spec` is empty, quotes an argument, or names a
/// tokenizer this connection does not have.
///
/// # Errors
/// When the FTS5 API cannot be found, or the tokenizer fails.
pub fn tokens(conn: &rusqlite::Connection, spec: &str, text: &str) -> rusqlite::Result<Option<Vec<String>>> {
    let Some(tokenizer) = Tokenizer::new(conn, spec)? else { return Ok(None) };
    // `token_bytes` gives each token length first (u32, little-endian), then its bytes.
    let bytes = tokenizer.token_bytes(text)?;
    let mut out = Vec::new();
    let mut rest = bytes.as_slice();
    while let Some((len, tail)) = rest.split_first_chunk::<4>() {
        let (token, tail) = tail.split_at((u32::from_le_bytes(*len) as usize).min(tail.len()));
        out.push(String::from_utf8_lossy(token).into_owned());
        rest = tail;
    }
    Ok(Some(out))
}

/// One instance of an FTS5 tokenizer of a connection, created once to tokenize many texts
/// (creating one reads the FTS5 API with a statement).
pub struct Tokenizer<'c> {
    instance: *mut ffi::Fts5Tokenizer,
    tokenize: unsafe extern "C" fn(
        *mut ffi::Fts5Tokenizer,
        *mut std::ffi::c_void,
        c_int,
        *const std::os::raw::c_char,
        c_int,
        Option<TokenCallback>,
    ) -> c_int,
    delete: unsafe extern "C" fn(*mut ffi::Fts5Tokenizer),
    _conn: std::marker::PhantomData<&'c rusqlite::Connection>,
}

/// FTS5's per-token callback (`xToken`).
type TokenCallback =
    unsafe extern "C" fn(*mut std::ffi::c_void, c_int, *const std::os::raw::c_char, c_int, c_int, c_int) -> c_int;

impl<'c> Tokenizer<'c> {
    /// The tokenizer `spec` (see [`tokens`]) of `conn`; `None` when `spec` is empty, quotes an
    /// argument, or names a tokenizer `conn` does not have.
    ///
    /// # Errors
    /// When the FTS5 API cannot be found or the tokenizer cannot be created.
    pub fn new(conn: &'c rusqlite::Connection, spec: &str) -> rusqlite::Result<Option<Self>> {
        if spec.contains(['\'', '"', '`', '[', '\0']) {
            return Ok(None);
        }
        let mut words = spec.split_whitespace().map(|w| std::ffi::CString::new(w).expect("no NUL"));
        let Some(name) = words.next() else { return Ok(None) };
        let args: Vec<std::ffi::CString> = words.collect();
        let mut argv: Vec<*const std::os::raw::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        let api = fts5_api(conn)?;
        // SAFETY: `api` is `conn`'s FTS5 API (see `fts5_api`), valid for as long as `conn`,
        // which the returned value borrows; `name` and `argv`'s strings outlive the calls that
        // read them (xCreate copies what it keeps).
        #[allow(unsafe_code)]
        unsafe {
            let Some(find) = (*api).xFindTokenizer else { return Ok(None) };
            let mut user: *mut std::ffi::c_void = std::ptr::null_mut();
            let mut tk = ffi::fts5_tokenizer { xCreate: None, xDelete: None, xTokenize: None };
            if find(api, name.as_ptr(), &raw mut user, &raw mut tk) != ffi::SQLITE_OK {
                return Ok(None);
            }
            let (Some(create), Some(delete), Some(tokenize)) = (tk.xCreate, tk.xDelete, tk.xTokenize) else {
                return Ok(None);
            };
            let mut instance: *mut ffi::Fts5Tokenizer = std::ptr::null_mut();
            let rc = create(user, argv.as_mut_ptr(), argv.len() as c_int, &raw mut instance);
            if rc != ffi::SQLITE_OK || instance.is_null() {
                return Err(tokenizer_error(rc, "xCreate"));
            }
            Ok(Some(Self { instance, tokenize, delete, _conn: std::marker::PhantomData }))
        }
    }

    /// Calls `callback` with `ctx` for each token of `text` (tokenized as a query).
    fn run(&self, text: &str, ctx: *mut std::ffi::c_void, callback: TokenCallback) -> rusqlite::Result<()> {
        if text.len() > c_int::MAX as usize {
            return Err(tokenizer_error(ffi::SQLITE_TOOBIG, "text longer than 2 GiB"));
        }
        // SAFETY: `self.instance` is live until `drop`; `text` outlives the call; `ctx` is what
        // `callback` expects (each caller passes the matching pair).
        #[allow(unsafe_code)]
        let rc = unsafe {
            (self.tokenize)(
                self.instance,
                ctx,
                ffi::FTS5_TOKENIZE_QUERY,
                text.as_ptr().cast(),
                text.len() as c_int,
                Some(callback),
            )
        };
        if rc != ffi::SQLITE_OK {
            return Err(tokenizer_error(rc, "xTokenize"));
        }
        Ok(())
    }

    /// The tokens of `text` in order, each as its length (4 bytes, little-endian) then its bytes:
    /// two texts are indexed alike (same terms at the same positions) exactly when these are
    /// equal.
    ///
    /// # Errors
    /// When the tokenizer fails.
    pub fn token_bytes(&self, text: &str) -> rusqlite::Result<Vec<u8>> {
        let mut out: Vec<u8> = Vec::with_capacity(text.len() + text.len() / 2);
        self.run(text, (&raw mut out).cast(), push_token_bytes)?;
        Ok(out)
    }
}

impl Drop for Tokenizer<'_> {
    fn drop(&mut self) {
        // SAFETY: the instance was created by `new` and is deleted once, here.
        #[allow(unsafe_code)]
        unsafe {
            (self.delete)(self.instance);
        }
    }
}

fn tokenizer_error(rc: c_int, what: &str) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(ffi::Error::new(rc), Some(format!("fts5 tokenizer: {what}")))
}

/// [`Tokenizer::token_bytes`]' callback: appends one token (a colocated synonym is left out),
/// length first, to the `Vec<u8>` in `ctx`.
#[allow(unsafe_code)]
unsafe extern "C" fn push_token_bytes(
    ctx: *mut std::ffi::c_void,
    flags: c_int,
    token: *const std::os::raw::c_char,
    len: c_int,
    _start: c_int,
    _end: c_int,
) -> c_int {
    if flags & ffi::FTS5_TOKEN_COLOCATED != 0 {
        return ffi::SQLITE_OK;
    }
    // SAFETY: `ctx` is the `Vec<u8>` `token_bytes` passed; `token` points to `len` bytes that
    // FTS5 keeps valid during this call.
    unsafe {
        let out = &mut *ctx.cast::<Vec<u8>>();
        let len = u32::try_from(len).unwrap_or(0);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(std::slice::from_raw_parts(token.cast::<u8>(), len as usize));
    }
    ffi::SQLITE_OK
}

/// `kb_fts`'s tokenizer as its `CREATE` statement names it; `None` without `kb_fts` or when the
/// statement's `tokenize` option cannot be read.
///
/// # Errors
/// When the schema cannot be read.
pub fn table_tokenizer(c: &rusqlite::Connection) -> rusqlite::Result<Option<String>> {
    let sql: Option<String> = c
        .prepare_cached("SELECT sql FROM main.sqlite_master WHERE name = 'kb_fts'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    Ok(sql.as_deref().and_then(tokenizer_of))
}

/// Why a row could not be scored.
enum Fail {
    /// An SQLite error code from the extension API.
    Code(c_int),
    /// A misuse of the function (bad arguments), with its message.
    Usage(&'static std::ffi::CStr),
}

/// Drops the `Arc<RowSizes>` [`register`] gave the function as its user data.
#[allow(unsafe_code)]
unsafe extern "C" fn release_sizes(data: *mut std::ffi::c_void) {
    if !data.is_null() {
        // SAFETY: `data` is the pointer `Arc::into_raw` made in `register`; SQLite calls this
        // destructor once for it.
        drop(unsafe { Arc::from_raw(data.cast_const().cast::<RowSizes>()) });
    }
}

/// What one query's rows share: the table's row count and average row length (tokens), kept
/// as the query's FTS5 auxiliary data by [`score`].
#[derive(Clone, Copy)]
struct Totals {
    rows: i64,
    avgdl: f64,
}

/// Frees the [`Totals`] [`score`] gave FTS5 as a query's auxiliary data.
#[allow(unsafe_code)]
unsafe extern "C" fn release_totals(data: *mut std::ffi::c_void) {
    if !data.is_null() {
        // SAFETY: `data` is the pointer `Box::into_raw` made in `score`; FTS5 calls this once
        // for it, when the query ends (or when it could not keep it).
        drop(unsafe { Box::from_raw(data.cast::<Totals>()) });
    }
}

/// The signature of an FTS5 extension function.
type Fts5Function = unsafe extern "C" fn(
    *const ffi::Fts5ExtensionApi,
    *mut ffi::Fts5Context,
    *mut ffi::sqlite3_context,
    c_int,
    *mut *mut ffi::sqlite3_value,
);

/// One row offered to [`best_rows`]: its value of [`NAME`] (lower is better), rowid, and whether
/// it matched in [`BODY_COLUMN`]. Ordered by value, then rowid: the worse row is the greater.
#[derive(Clone, Copy)]
struct Ranked(f64, i64, bool);

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0).then(self.1.cmp(&other.1))
    }
}

/// The best rows a [`best_rows`] call keeps: at most `cap`, the worst on top.
struct Best {
    cap: usize,
    heap: std::collections::BinaryHeap<Ranked>,
    seen: u64,
}

thread_local! {
    /// The collection [`best_rows`] runs on this thread (SQLite calls [`TOP_NAME`] on the
    /// thread that steps the statement).
    static BEST: std::cell::RefCell<Option<Best>> = const { std::cell::RefCell::new(None) };
}

/// What [`best_rows`] returns: `f`'s value, the best rows as (rowid, value, matched in
/// [`BODY_COLUMN`]) best first, and how many rows were scored.
pub type BestRows<T> = (T, Vec<(i64, f64, bool)>, u64);

/// Runs `f`, which steps a statement calling [`TOP_NAME`] on this thread, and returns its value
/// with the `cap` best rows [`TOP_NAME`] scored, as (rowid, value, matched in [`BODY_COLUMN`]) best first (lowest value;
/// ties by rowid), and how many rows it scored. What `ORDER BY <bm25> LIMIT cap` gives, kept
/// in a bounded heap instead of SQLite's sorter (an index b-tree insert and compare per row,
/// an eighth of a keyword query's time), and with ties in a fixed order.
///
/// # Errors
/// `f`'s error; an error when a collection already runs on this thread.
pub fn best_rows<T>(cap: usize, f: impl FnOnce() -> rusqlite::Result<T>) -> rusqlite::Result<BestRows<T>> {
    /// Ends the collection however `f` ends.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            BEST.with(|b| b.borrow_mut().take());
        }
    }
    let started = BEST.with(|b| {
        let mut b = b.borrow_mut();
        if b.is_some() {
            return false;
        }
        let heap = std::collections::BinaryHeap::with_capacity(cap.min(1 << 16).saturating_add(1));
        *b = Some(Best { cap, heap, seen: 0 });
        true
    });
    if !started {
        return Err(rusqlite::Error::SqliteFailure(
            ffi::Error::new(ffi::SQLITE_MISUSE),
            Some(format!("{TOP_NAME}: a collection already runs on this thread")),
        ));
    }
    let _reset = Reset;
    let out = f()?;
    let best = BEST.with(|b| b.borrow_mut().take()).expect("the collection started above");
    let rows = best.heap.into_sorted_vec().into_iter().map(|Ranked(v, id, in_body)| (id, v, in_body)).collect();
    Ok((out, rows, best.seen))
}

/// [`TOP_NAME`]: [`rank`]'s value, also offered to the running [`best_rows`] collection.
#[allow(unsafe_code)]
unsafe extern "C" fn rank_into_top(
    api: *const ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
    ctx: *mut ffi::sqlite3_context,
    n_val: c_int,
    ap_val: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: as `rank`.
    unsafe {
        let Some((value, in_body)) = row_value(api, fts, ctx, n_val, ap_val) else { return };
        let Some(rowid) = (*api).xRowid else {
            return ffi::sqlite3_result_error(ctx, c"coffer_bm25_top: this FTS5 has no xRowid".as_ptr(), -1);
        };
        let row = Ranked(value, rowid(fts), in_body);
        let filed = BEST.with(|b| match b.borrow_mut().as_mut() {
            Some(best) => {
                best.seen += 1;
                if best.heap.len() < best.cap {
                    best.heap.push(row);
                } else if best.heap.peek().is_some_and(|worst| row < *worst) {
                    best.heap.pop();
                    best.heap.push(row);
                }
                true
            }
            None => false,
        });
        if !filed {
            return ffi::sqlite3_result_error(ctx, c"coffer_bm25_top: called outside fts_rank::best_rows".as_ptr(), -1);
        }
        ffi::sqlite3_result_double(ctx, value);
    }
}

/// The function SQLite calls per row.
#[allow(unsafe_code)]
unsafe extern "C" fn rank(
    api: *const ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
    ctx: *mut ffi::sqlite3_context,
    n_val: c_int,
    ap_val: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: as `row_value`.
    unsafe {
        if let Some((value, _)) = row_value(api, fts, ctx, n_val, ap_val) {
            ffi::sqlite3_result_double(ctx, value);
        }
    }
}

/// The current row's value of [`NAME`] (minus its bm25 score: lower is better) and whether a
/// phrase matched in [`BODY_COLUMN`], or `None` after setting the call's error result.
///
/// # Safety
/// The arguments are what SQLite passed to an FTS5 extension function for the current row: a
/// valid API table and context, and `n_val` argument values in `ap_val`, all valid for the
/// duration of the call.
#[allow(unsafe_code)]
unsafe fn row_value(
    api: *const ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
    ctx: *mut ffi::sqlite3_context,
    n_val: c_int,
    ap_val: *mut *mut ffi::sqlite3_value,
) -> Option<(f64, bool)> {
    // SAFETY: see the function's contract.
    unsafe {
        let args = std::slice::from_raw_parts(ap_val, usize::try_from(n_val).unwrap_or(0));
        match score(&*api, fts, args) {
            Ok((s, in_body)) => Some((-s, in_body)),
            Err(Fail::Code(rc)) => {
                ffi::sqlite3_result_error_code(ctx, rc);
                None
            }
            Err(Fail::Usage(msg)) => {
                ffi::sqlite3_result_error(ctx, msg.as_ptr(), -1);
                None
            }
        }
    }
}

/// The bm25 score of the current row (positive: higher is better).
///
/// # Safety
/// `api` and `fts` are what SQLite passed to [`rank`]; `args` its argument values.
#[allow(unsafe_code)]
unsafe fn score(
    api: &ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
    args: &[*mut ffi::sqlite3_value],
) -> Result<(f64, bool), Fail> {
    let check = |rc: c_int| if rc == ffi::SQLITE_OK { Ok(()) } else { Err(Fail::Code(rc)) };
    let missing = Fail::Usage(c"coffer_bm25: this FTS5 lacks a needed API function");
    let (
        Some(phrase_count),
        Some(row_count),
        Some(total_size),
        Some(column_size),
        Some(phrase_first),
        Some(phrase_next),
        Some(user_data),
        Some(rowid),
        Some(get_aux),
        Some(set_aux),
    ) = (
        api.xPhraseCount,
        api.xRowCount,
        api.xColumnTotalSize,
        api.xColumnSize,
        api.xPhraseFirst,
        api.xPhraseNext,
        api.xUserData,
        api.xRowid,
        api.xGetAuxdata,
        api.xSetAuxdata,
    )
    else {
        return Err(missing);
    };
    // SAFETY (whole block): each call is an FTS5 API function on the context SQLite gave us;
    // out-pointers are to locals; `args` holds valid values (see `rank`), and a blob pointer
    // is read only within the length SQLite reports for it.
    unsafe {
        let phrases = usize::try_from(phrase_count(fts)).unwrap_or(0);
        if phrases > MAX_PHRASES {
            return Err(Fail::Usage(c"coffer_bm25: more than 64 phrases"));
        }
        let Some(&hits_arg) = args.first() else {
            return Err(Fail::Usage(c"coffer_bm25: the second argument must be the phrases' row counts"));
        };
        let len = usize::try_from(ffi::sqlite3_value_bytes(hits_arg)).unwrap_or(0);
        if len != phrases * 8 {
            return Err(Fail::Usage(c"coffer_bm25: one row count (8-byte integer) per phrase is needed"));
        }
        let blob = ffi::sqlite3_value_blob(hits_arg).cast::<u8>();
        let hits = if len == 0 { &[][..] } else { std::slice::from_raw_parts(blob, len) };
        let weights = &args[1..];

        // The table's row count and average row length, read once per query: FTS5 reloads
        // them from its `averages` record on every xRowCount/xColumnTotalSize call (a blob
        // read per scored row, a fifth of a query's time). A query reads one snapshot, so
        // they cannot change before the query ends, which frees the auxiliary data.
        let totals = match get_aux(fts, 0).cast_const().cast::<Totals>().as_ref() {
            Some(t) => *t,
            None => {
                let (mut rows, mut tokens) = (0i64, 0i64);
                check(row_count(fts, &raw mut rows))?;
                check(total_size(fts, -1, &raw mut tokens))?;
                let t = Totals { rows, avgdl: if rows > 0 { tokens as f64 / rows as f64 } else { 1.0 } };
                // On failure FTS5 has already freed the box (and the next row reads again).
                let _ = set_aux(fts, Box::into_raw(Box::new(t)).cast(), Some(release_totals));
                t
            }
        };
        let Totals { rows, avgdl } = totals;

        // Column weights, read once per row (at most three columns).
        let mut w = [1f64; 8];
        for (slot, v) in w.iter_mut().zip(weights) {
            *slot = ffi::sqlite3_value_double(*v);
        }
        // Each phrase's weighted instance count, walked phrase by phrase (xPhraseFirst/Next:
        // no merged, sorted instance array as xInst builds).
        let mut freq = [0f64; MAX_PHRASES];
        let mut in_body = false;
        for (p, f) in freq.iter_mut().take(phrases).enumerate() {
            let mut it = ffi::Fts5PhraseIter { a: std::ptr::null(), b: std::ptr::null() };
            let (mut col, mut off): (c_int, c_int) = (0, 0);
            check(phrase_first(fts, p as c_int, &raw mut it, &raw mut col, &raw mut off))?;
            while col >= 0 {
                in_body |= col == BODY_COLUMN;
                *f += usize::try_from(col).ok().and_then(|c| w.get(c)).copied().unwrap_or(1.0);
                phrase_next(fts, &raw mut it, &raw mut col, &raw mut off);
            }
        }
        // The user data is the `RowSizes` of `register` (null only if created elsewhere).
        let sizes = user_data(fts).cast_const().cast::<RowSizes>().as_ref();
        let id = rowid(fts);
        let n_tok = match sizes.and_then(|s| s.get(id)) {
            Some(n) => n,
            None => {
                let mut n: c_int = 0;
                check(column_size(fts, -1, &raw mut n))?;
                let n = u32::try_from(n).unwrap_or(0);
                if let Some(s) = sizes {
                    s.put(id, n);
                }
                n
            }
        };
        let norm = K1 * (1.0 - B + B * f64::from(n_tok) / avgdl);
        let mut s = 0.0;
        for (p, f) in freq.iter().take(phrases).enumerate() {
            let n = i64::from_le_bytes(hits[p * 8..p * 8 + 8].try_into().expect("8 bytes"));
            s += idf(rows, n) * (f * (K1 + 1.0)) / (f + norm);
        }
        Ok((s, in_body))
    }
}

/// The token count of each row of `kb_fts` seen so far, by rowid: what bm25's length
/// normalization reads per row, without FTS5's `kb_fts_docsize` lookup (see the module docs
/// for why a kept length never goes stale). Memory: 4 bytes per rowid, in pages of
/// [`RowSizes::PAGE`] rowids allocated when one of theirs is first kept, up to
/// [`RowSizes::MAX_ROWID`] (64 MiB); larger rowids are not kept. Reads take no lock (a page
/// is published once, each length is an atomic): every scored row of every query reads one.
pub struct RowSizes {
    /// Length + 1 by rowid; 0 = not known.
    pages: Box<[std::sync::OnceLock<Box<[AtomicU32]>>]>,
}

impl Default for RowSizes {
    fn default() -> Self {
        let pages = (Self::MAX_ROWID as usize) / Self::PAGE + 1;
        Self { pages: (0..pages).map(|_| std::sync::OnceLock::new()).collect() }
    }
}

impl RowSizes {
    /// Largest rowid kept.
    pub const MAX_ROWID: i64 = 1 << 24;

    /// Rowids per page.
    pub const PAGE: usize = 1 << 16;

    /// The kept length of row `rowid`.
    pub fn get(&self, rowid: i64) -> Option<u32> {
        if rowid > Self::MAX_ROWID {
            return None;
        }
        let i = usize::try_from(rowid).ok()?;
        let v = self.pages.get(i / Self::PAGE)?.get()?[i % Self::PAGE].load(Ordering::Relaxed);
        v.checked_sub(1)
    }

    /// Keeps `tokens` as the length of row `rowid` (ignored beyond [`RowSizes::MAX_ROWID`]).
    pub fn put(&self, rowid: i64, tokens: u32) {
        let Ok(i) = usize::try_from(rowid) else { return };
        if rowid > Self::MAX_ROWID {
            return;
        }
        let Some(slot) = self.pages.get(i / Self::PAGE) else { return };
        let page = slot.get_or_init(|| (0..Self::PAGE).map(|_| AtomicU32::new(0)).collect());
        page[i % Self::PAGE].store(tokens.saturating_add(1), Ordering::Relaxed);
    }
}

/// Reads the length of every row of `kb_fts` not yet kept in `sizes` from FTS5's own
/// `kb_fts_docsize` table in one scan (each row's blob is one varint per column, SQLite's
/// variable-length integer format, as FTS5 writes it; the length is their sum, what
/// `xColumnSize(-1)` answers), so that the first queries after an index pass do not look each
/// row up one by one. Returns how many lengths were added (0 without `kb_fts`).
///
/// # Errors
/// An SQLite error of the scan.
pub fn fill_row_sizes(c: &rusqlite::Connection, sizes: &RowSizes) -> rusqlite::Result<usize> {
    let have: i64 = c
        .prepare_cached("SELECT count(*) FROM main.sqlite_master WHERE name = 'kb_fts_docsize'")?
        .query_row([], |r| r.get(0))?;
    if have == 0 {
        return Ok(0);
    }
    let mut added = 0;
    let mut st = c.prepare_cached("SELECT id, sz FROM main.kb_fts_docsize")?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let id: i64 = r.get(0)?;
        if id > RowSizes::MAX_ROWID || sizes.get(id).is_some() {
            continue;
        }
        let Some(tokens) = varint_sum(r.get_ref(1)?.as_blob().unwrap_or_default()) else { continue };
        sizes.put(id, tokens);
        added += 1;
    }
    Ok(added)
}

/// The sum of the SQLite varints that make up `blob` (big-endian groups of 7 bits, the high
/// bit set on every byte but the last; a ninth byte carries 8 bits), `None` when it is cut
/// short or the sum does not fit a `u32`.
fn varint_sum(blob: &[u8]) -> Option<u32> {
    let (mut sum, mut i) = (0u64, 0);
    while i < blob.len() {
        let mut v: u64 = 0;
        let mut n = 0;
        loop {
            let b = *blob.get(i)?;
            i += 1;
            n += 1;
            if n == 9 {
                v = (v << 8) | u64::from(b);
                break;
            }
            v = (v << 7) | u64::from(b & 0x7f);
            if b & 0x80 == 0 {
                break;
            }
        }
        sum = sum.checked_add(v)?;
    }
    u32::try_from(sum).ok()
}

/// bm25's inverse document frequency of a phrase held by `hits` of `rows` rows (floored at
/// 1e-6, as SQLite does, so that a very common phrase never lowers a score).
pub fn idf(rows: i64, hits: i64) -> f64 {
    let v = ((rows - hits) as f64 + 0.5) / (hits as f64 + 0.5);
    let v = v.ln();
    if v <= 0.0 { 1e-6 } else { v }
}

/// Row counts of phrases (`MATCH '"term"'`), valid until the index is next written.
///
/// [`DocFreq::invalidate`] runs after every write transaction of the Index domain; a count read
/// under an older generation is never served. Bounded: cleared when it holds
/// [`DocFreq::CAPACITY`] phrases.
///
/// A phrase of one token is counted from FTS5's own term index (an `fts5vocab` table of type
/// `row` over `kb_fts`: one loop in C over the term's doclist, about a third of the time of
/// `SELECT count(*) … MATCH`, which steps the VM once per row); the phrase's token comes from
/// FTS5's tokenizer itself ([`tokens`], with `kb_fts`'s tokenizer as its `CREATE` statement
/// names it), kept per phrase. Other phrases are counted with `MATCH`.
///
/// Beside those counted one by one, [`DocFreq::warm`] reads every common term's row count in
/// one pass over the term index once writes have stopped ([`crate::domain::index`] runs it a
/// moment after the last write): the words of a question are then known before it is asked.
#[derive(Default)]
pub struct DocFreq {
    generation: AtomicU64,
    counts: Mutex<HashMap<String, (u64, i64)>>,
    /// Row counts of every token held by at least [`DocFreq::WARM_MIN_ROWS`] rows, read by
    /// [`DocFreq::warm`] under a generation (served only while it is current).
    warm: RwLock<Option<(u64, HashMap<String, i64>)>>,
    /// The single token of each phrase seen (`None`: not exactly one token). Tokenizing does
    /// not depend on the data: never invalidated; cleared at [`DocFreq::CAPACITY`].
    tokens: Mutex<HashMap<String, Option<String>>>,
}

/// Whether [`DocFreq`] counts one-token phrases from the term index (`fts5vocab`).
///
/// (Session 11 switched it off after end-to-end retrieval tests failed intermittently: a
/// keyword search on a freshly indexed KB failed. The cause: the temporary `kb_fts_rows` table is
/// one reader connection's own, and it was created only when a phrase was first tokenized; a
/// phrase's token is kept for every connection, so the next connection of the pool to count
/// that phrase asked a table it did not have ("no such table: temp.kb_fts_rows") and the whole
/// keyword query failed. [`DocFreq::count`] now makes sure the table exists on the connection
/// it counts on; `a_phrase_tokenized_on_one_connection_is_counted_on_another` is the test.)
const COUNT_FROM_TERM_INDEX: bool = true;

impl DocFreq {
    /// Most phrases kept.
    pub const CAPACITY: usize = 50_000;

    /// Tokens held by fewer rows than this are not kept by [`DocFreq::warm`]: counting a rare
    /// token when it is asked for is quick (its doclist is short), and leaving them out bounds
    /// the memory to the common part of the vocabulary.
    pub const WARM_MIN_ROWS: i64 = 64;

    /// Most tokens [`DocFreq::warm`] keeps.
    pub const WARM_CAPACITY: usize = 200_000;

    /// Forgets every count (the index changed).
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Reads the row count of every token of `kb_fts` held by at least
    /// [`DocFreq::WARM_MIN_ROWS`] rows (at most [`DocFreq::WARM_CAPACITY`]) in one pass over
    /// FTS5's term index on `c`, and serves them until the index is next written. Returns how
    /// many were kept (0 when a write came meanwhile: they are dropped).
    ///
    /// # Errors
    /// An SQLite error of the pass.
    pub fn warm(&self, c: &rusqlite::Connection) -> rusqlite::Result<usize> {
        let generation = self.generation.load(Ordering::Acquire);
        if !vocab_table_on(c)? {
            return Ok(0);
        }
        let mut rows = HashMap::new();
        let mut st = c.prepare_cached("SELECT term, doc FROM temp.kb_fts_rows")?;
        let mut q = st.query([])?;
        while let Some(r) = q.next()? {
            let n: i64 = r.get(1)?;
            if n >= Self::WARM_MIN_ROWS
                && rows.len() < Self::WARM_CAPACITY
                && let Ok(term) = r.get::<_, String>(0)
            {
                rows.insert(term, n);
            }
        }
        if self.generation.load(Ordering::Acquire) != generation {
            return Ok(0);
        }
        let kept = rows.len();
        *self.warm.write().expect("doc freq warm") = Some((generation, rows));
        Ok(kept)
    }

    /// The row count of each single-phrase MATCH expression in `phrases`, counted on `c` when
    /// not known for the current generation; as the blob [`NAME`] takes.
    ///
    /// # Errors
    /// An SQLite error of a count.
    pub fn blob(&self, c: &rusqlite::Connection, phrases: &[String]) -> rusqlite::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(phrases.len() * 8);
        for p in phrases {
            out.extend_from_slice(&self.count(c, p)?.to_le_bytes());
        }
        Ok(out)
    }

    /// The row count of the single-phrase MATCH expression `phrase`.
    ///
    /// # Errors
    /// An SQLite error of the count.
    pub fn count(&self, c: &rusqlite::Connection, phrase: &str) -> rusqlite::Result<i64> {
        // Read before counting: a write that commits meanwhile bumps it, so the count is
        // filed under a generation that is already stale and never served.
        let generation = self.generation.load(Ordering::Acquire);
        if let Some(&(g, n)) = self.counts.lock().expect("doc freq").get(phrase)
            && g == generation
        {
            return Ok(n);
        }
        let token = if COUNT_FROM_TERM_INDEX { self.token(c, phrase)? } else { None };
        let warm = token.as_ref().and_then(|t| {
            let w = self.warm.read().expect("doc freq warm");
            w.as_ref().filter(|(g, _)| *g == generation).and_then(|(_, rows)| rows.get(t).copied())
        });
        let n = match (warm, token) {
            (Some(n), _) => n,
            // The token is known from any connection; the table is this connection's own.
            (None, Some(token)) if vocab_table_on(c)? => c
                .prepare_cached("SELECT doc FROM temp.kb_fts_rows WHERE term = ?1")?
                .query_row([token], |r| r.get(0))
                .optional()?
                .unwrap_or(0),
            _ => c
                .prepare_cached("SELECT count(*) FROM kb_fts WHERE kb_fts MATCH ?1")?
                .query_row([phrase], |r| r.get(0))?,
        };
        let mut m = self.counts.lock().expect("doc freq");
        if m.len() >= Self::CAPACITY {
            m.clear();
        }
        m.insert(phrase.to_owned(), (generation, n));
        Ok(n)
    }

    /// The one token FTS5 makes of `phrase` (a string, `"` doubled inside), or `None` when it
    /// makes none or several (or `phrase` is not one string).
    fn token(&self, c: &rusqlite::Connection, phrase: &str) -> rusqlite::Result<Option<String>> {
        if let Some(t) = self.tokens.lock().expect("doc freq tokens").get(phrase) {
            return Ok(t.clone());
        }
        let text = match phrase.strip_prefix('"').and_then(|p| p.strip_suffix('"')) {
            Some(inner) if !inner.replace("\"\"", "").contains('"') => inner.replace("\"\"", "\""),
            _ => return Ok(None),
        };
        let Some(spec) = vocab_table(c)? else { return Ok(None) };
        let token = match tokens(c, &spec, &text)? {
            Some(mut t) if t.len() == 1 => t.pop(),
            _ => None,
        };
        let mut m = self.tokens.lock().expect("doc freq tokens");
        if m.len() >= Self::CAPACITY {
            m.clear();
        }
        m.insert(phrase.to_owned(), token.clone());
        Ok(token)
    }
}

/// `kb_fts`'s tokenizer, read from its `CREATE` statement, to tokenize phrases with (`None`
/// when it cannot be read: the caller counts with `MATCH`); and, on `c`, the temporary table
/// [`DocFreq`] reads ([`vocab_table_on`]).
fn vocab_table(c: &rusqlite::Connection) -> rusqlite::Result<Option<String>> {
    let Some(spec) = table_tokenizer(c)? else { return Ok(None) };
    Ok(vocab_table_on(c)?.then_some(spec))
}

/// Makes sure `c` has the temporary table [`DocFreq`] reads, `kb_fts_rows` (`fts5vocab` of
/// type `row` over `main.kb_fts`: each token's row count). A temporary table lives in one
/// connection's own temp database (so a read-only connection can create it), and each
/// connection of the pool needs its own. False when `main.kb_fts` does not exist.
fn vocab_table_on(c: &rusqlite::Connection) -> rusqlite::Result<bool> {
    let have: i64 = c
        .prepare_cached("SELECT count(*) FROM temp.sqlite_master WHERE name = 'kb_fts_rows'")?
        .query_row([], |r| r.get(0))?;
    if have > 0 {
        return Ok(true);
    }
    let fts: i64 = c
        .prepare_cached("SELECT count(*) FROM main.sqlite_master WHERE name = 'kb_fts'")?
        .query_row([], |r| r.get(0))?;
    if fts == 0 {
        return Ok(false);
    }
    c.execute_batch("CREATE VIRTUAL TABLE IF NOT EXISTS temp.kb_fts_rows USING fts5vocab(main, kb_fts, row)")?;
    Ok(true)
}

/// The `tokenize` option of an FTS5 `CREATE VIRTUAL TABLE` statement (FTS5's default,
/// `unicode61`, when it has none); `None` when the option is there but not a quoted string.
fn tokenizer_of(sql: &str) -> Option<String> {
    let lower = sql.to_ascii_lowercase();
    let Some(at) = lower.find("tokenize") else { return Some("unicode61".to_owned()) };
    let rest = sql[at + "tokenize".len()..].trim_start().strip_prefix('=')?.trim_start();
    let quote = rest.chars().next().filter(|q| *q == '\'' || *q == '"')?;
    let mut out = String::new();
    let mut chars = rest[1..].chars().peekable();
    while let Some(ch) = chars.next() {
        if ch == quote {
            if chars.peek() == Some(&quote) {
                chars.next();
            } else {
                return Some(out);
            }
        }
        out.push(ch);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection to the test database at `path` with `coffer_bm25` registered: several of
    /// them stand for the store's pool.
    // A test database of this module's own.
    #[allow(clippy::disallowed_methods)]
    fn shared(path: &std::path::Path) -> rusqlite::Connection {
        let c = rusqlite::Connection::open(path).unwrap();
        register(&c, &Arc::default()).unwrap();
        c
    }

    /// The counts read ahead in one pass are the ones counted one by one, rare tokens are left
    /// to be counted when asked, and a write drops them all (a pass started before it keeps
    /// nothing).
    #[test]
    fn warm_counts_equal_counted_ones_and_a_write_drops_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let w = shared(&path);
        w.execute_batch("PRAGMA journal_mode = WAL; CREATE VIRTUAL TABLE kb_fts USING fts5 (title, headings, body, tokenize = 'porter unicode61 remove_diacritics 2');").unwrap();
        let rows = DocFreq::WARM_MIN_ROWS as usize + 6;
        for i in 0..rows {
            let rare = if i < 3 { " zebra" } else { "" };
            w.execute(
                "INSERT INTO kb_fts (title, headings, body) VALUES ('', '', ?1)",
                [format!("咖啡 running {i}{rare}")],
            )
            .unwrap();
        }
        let r = shared(&path);
        let df = DocFreq::default();
        let kept = df.warm(&r).unwrap();
        assert!(kept >= 2, "咖啡 and run are common: {kept}");
        let warm = df.warm.read().unwrap().clone().unwrap().1;
        assert_eq!(warm.get("run"), Some(&(rows as i64)), "stemmed as FTS5 stems");
        assert_eq!(warm.get("zebra"), None, "rare tokens are counted when asked");
        for (phrase, n) in [("\"咖啡\"", rows as i64), ("\"running\"", rows as i64), ("\"zebra\"", 3)] {
            assert_eq!(df.count(&r, phrase).unwrap(), n, "{phrase}");
        }
        df.invalidate();
        assert!(df.warm.read().unwrap().as_ref().is_some_and(|(g, _)| *g != df.generation.load(Ordering::Acquire)));
        w.execute("DELETE FROM kb_fts WHERE rowid <= 5", []).unwrap();
        assert_eq!(df.count(&r, "\"咖啡\"").unwrap(), rows as i64 - 5, "stale warm counts are not served");
    }

    fn db() -> rusqlite::Connection {
        db_with(false)
    }

    /// 300 random rows over a small vocabulary (CJK bigrams among it) in `kb_fts`; with
    /// `external`, `kb_fts` is an external-content table over `src` (as the store's is over its
    /// view), and every third row is deleted again (FTS row first, through FTS5's own `delete`
    /// with the old values) and replaced, so that the statistics have seen deletes.
    fn db_with(external: bool) -> rusqlite::Connection {
        // A test database of this module's own, in memory.
        #[allow(clippy::disallowed_methods)]
        let c = rusqlite::Connection::open_in_memory().unwrap();
        register(&c, &Arc::default()).unwrap();
        if external {
            c.execute_batch(
                "CREATE TABLE src (id INTEGER PRIMARY KEY, title TEXT, headings TEXT, body TEXT);
                 CREATE VIRTUAL TABLE kb_fts USING fts5 (title, headings, body, content = 'src', content_rowid = 'id',
                   tokenize = 'porter unicode61 remove_diacritics 2');",
            )
            .unwrap();
        } else {
            c.execute_batch(
                "CREATE VIRTUAL TABLE kb_fts USING fts5 (title, headings, body, tokenize = 'porter unicode61 remove_diacritics 2');",
            )
            .unwrap();
        }
        let words = [
            "apple", "banana", "cherry", "durian", "elder", "fig", "grape", "apples", "running", "ran", "机器", "器学",
        ];
        let mut rng = 7u64;
        let mut next = |n: usize| {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (rng >> 33) as usize % n
        };
        for i in 1..=300i64 {
            let body_len = 5 + next(40);
            let mut col = |len: usize| (0..len).map(|_| words[next(words.len())]).collect::<Vec<_>>().join(" ");
            let (t, h, b) = (col(2), col(3), col(body_len));
            if external {
                c.execute(
                    "INSERT INTO src (id, title, headings, body) VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![i, t, h, b],
                )
                .unwrap();
            }
            c.execute(
                "INSERT INTO kb_fts (rowid, title, headings, body) VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![i, t, h, b],
            )
            .unwrap();
        }
        if external {
            for i in (3..=300i64).step_by(3) {
                let (t, h, b): (String, String, String) = c
                    .query_row("SELECT title, headings, body FROM src WHERE id = ?1", [i], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                    })
                    .unwrap();
                c.execute(
                    "INSERT INTO kb_fts (kb_fts, rowid, title, headings, body) VALUES ('delete', ?1, ?2, ?3, ?4)",
                    rusqlite::params![i, t, h, b],
                )
                .unwrap();
                c.execute("DELETE FROM src WHERE id = ?1", [i]).unwrap();
                let b = format!("{b} apple 器学");
                c.execute(
                    "INSERT INTO src (id, title, headings, body) VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![i + 1000, t, h, b],
                )
                .unwrap();
                c.execute(
                    "INSERT INTO kb_fts (rowid, title, headings, body) VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![i + 1000, t, h, b],
                )
                .unwrap();
            }
            c.execute("INSERT INTO kb_fts (kb_fts, rank) VALUES ('integrity-check', 1)", []).unwrap();
        }
        c
    }

    /// On a table with its own content and on an external-content one whose rows were deleted
    /// and replaced.
    #[test]
    fn scores_equal_the_builtin_bm25() {
        for external in [false, true] {
            scores_equal_the_builtin_bm25_on(&db_with(external));
        }
    }

    fn scores_equal_the_builtin_bm25_on(c: &rusqlite::Connection) {
        let df = DocFreq::default();
        for phrases in [
            vec!["\"apple\""],
            vec!["\"banana\"", "\"cherry\""],
            vec!["\"run\"", "\"fig\"", "\"grape\""],
            vec!["\"elder fig\""],
            vec!["\"机器\"", "\"器学\""],
        ] {
            let phrases: Vec<String> = phrases.into_iter().map(String::from).collect();
            let blob = df.blob(c, &phrases).unwrap();
            for op in [" AND ", " OR "] {
                let expr = phrases.join(op);
                let mut st = c
                    .prepare(
                        "SELECT bm25(kb_fts, 2.0, 1.5, 1.0), coffer_bm25(kb_fts, ?2, 2.0, 1.5, 1.0) FROM kb_fts WHERE kb_fts MATCH ?1",
                    )
                    .unwrap();
                let rows: Vec<(f64, f64)> = st
                    .query_map(rusqlite::params![expr, blob], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect();
                assert!(!rows.is_empty(), "{expr} matched nothing");
                for (builtin, ours) in rows {
                    assert!((builtin - ours).abs() < 1e-9, "{expr}: bm25 {builtin} vs coffer_bm25 {ours}");
                }
            }
        }
    }

    /// `best_rows` keeps what `ORDER BY coffer_bm25 LIMIT cap` keeps (ties by rowid), counts
    /// every scored row, refuses to nest, and `coffer_bm25_top` outside it is an error, not a
    /// silently lost row.
    #[test]
    fn best_rows_are_the_ordered_query_cut_at_the_cap() {
        let c = db();
        let df = DocFreq::default();
        let phrases = vec!["\"apple\"".to_owned(), "\"banana\"".to_owned(), "\"run\"".to_owned()];
        let blob = df.blob(&c, &phrases).unwrap();
        for op in [" AND ", " OR "] {
            let expr = phrases.join(op);
            let ordered: Vec<(i64, f64)> = c
                .prepare(
                    "SELECT rowid, coffer_bm25(kb_fts, ?2, 2.0, 1.5, 1.0) AS s FROM kb_fts WHERE kb_fts MATCH ?1 ORDER BY s, rowid",
                )
                .unwrap()
                .query_map(rusqlite::params![expr, blob], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert!(ordered.len() > 20, "{expr}: {} rows", ordered.len());
            let mut st = c
                .prepare(
                    "SELECT count(*) FROM kb_fts WHERE kb_fts MATCH ?1 AND coffer_bm25_top(kb_fts, ?2, 2.0, 1.5, 1.0) IS NOT NULL",
                )
                .unwrap();
            for cap in [0, 1, 7, ordered.len() - 1, ordered.len(), usize::MAX] {
                let (count, best, seen) =
                    best_rows(cap, || st.query_row(rusqlite::params![expr, blob], |r| r.get::<_, i64>(0))).unwrap();
                assert_eq!(count as usize, ordered.len(), "{expr}: every match counted");
                assert_eq!(seen as usize, ordered.len(), "{expr}: every match scored");
                let kept: Vec<(i64, f64)> = best.iter().map(|&(id, v, _)| (id, v)).collect();
                assert_eq!(kept, ordered[..cap.min(ordered.len())], "{expr}, cap {cap}");
            }
        }
        // Nested: refused, and the outer collection goes on.
        let (_, outer, _) = best_rows(5, || {
            let inner = best_rows(5, || Ok(()));
            assert!(inner.unwrap_err().to_string().contains("already runs"));
            c.query_row(
                "SELECT count(*) FROM kb_fts WHERE kb_fts MATCH '\"apple\"' AND coffer_bm25_top(kb_fts, ?1, 2.0, 1.5, 1.0) IS NOT NULL",
                [df.blob(&c, &["\"apple\"".to_owned()]).unwrap()],
                |r| r.get::<_, i64>(0),
            )
        })
        .unwrap();
        assert_eq!(outer.len(), 5);
        // Outside a collection (also after one failed): an error naming the function.
        let err = c
            .query_row(
                "SELECT count(*) FROM kb_fts WHERE kb_fts MATCH '\"apple\"' AND coffer_bm25_top(kb_fts, ?1, 2.0, 1.5, 1.0) IS NOT NULL",
                [df.blob(&c, &["\"apple\"".to_owned()]).unwrap()],
                |r| r.get::<_, i64>(0),
            )
            .unwrap_err();
        assert!(err.to_string().contains("outside fts_rank::best_rows"), "{err}");
        let failed = best_rows(3, || -> rusqlite::Result<()> { Err(rusqlite::Error::InvalidQuery) });
        assert!(failed.is_err());
        assert!(best_rows(3, || Ok(())).is_ok(), "a failed collection does not block the next");
    }

    /// Scores read from kept lengths equal the built-in's, before and after rows are deleted
    /// and others inserted (new rowids, other lengths), and the lengths are kept per rowid.
    #[test]
    fn kept_row_lengths_stay_true_across_deletes_and_inserts() {
        // Its own connection, so the test can look into its `RowSizes`.
        #[allow(clippy::disallowed_methods)]
        let c = rusqlite::Connection::open_in_memory().unwrap();
        let sizes = Arc::new(RowSizes::default());
        register(&c, &sizes).unwrap();
        c.execute_batch("CREATE VIRTUAL TABLE kb_fts USING fts5 (title, headings, body);").unwrap();
        // Rowids as the store gives them: chunk ids, never reused.
        for i in 0..50i64 {
            let body = vec!["apple"; 1 + i as usize % 7].join(" ") + " banana";
            c.execute(
                "INSERT INTO kb_fts (rowid, title, headings, body) VALUES (?1, 't', 'h', ?2)",
                rusqlite::params![i + 1, body],
            )
            .unwrap();
        }
        let check = |c: &rusqlite::Connection| {
            let df = DocFreq::default();
            let phrases = vec!["\"apple\"".to_owned(), "\"banana\"".to_owned()];
            let blob = df.blob(c, &phrases).unwrap();
            let mut st = c
                .prepare(
                    "SELECT rowid, bm25(kb_fts, 2.0, 1.5, 1.0), coffer_bm25(kb_fts, ?2, 2.0, 1.5, 1.0) FROM kb_fts WHERE kb_fts MATCH ?1",
                )
                .unwrap();
            let rows: Vec<(i64, f64, f64)> = st
                .query_map(rusqlite::params![phrases.join(" OR "), blob], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert!(rows.len() >= 40, "{} rows", rows.len());
            for (id, builtin, ours) in rows {
                assert!((builtin - ours).abs() < 1e-9, "row {id}: bm25 {builtin} vs coffer_bm25 {ours}");
            }
        };
        // The lengths read in one scan of kb_fts_docsize are the ones FTS5 answers per row.
        let filled = RowSizes::default();
        assert_eq!(fill_row_sizes(&c, &filled).unwrap(), 50);
        check(&c); // lengths read from FTS5 and kept
        assert!(sizes.get(1).is_some() && sizes.get(50).is_some(), "lengths are kept");
        for id in 1..=50 {
            assert_eq!(filled.get(id), sizes.get(id), "row {id}");
        }
        assert_eq!(fill_row_sizes(&c, &filled).unwrap(), 0, "known lengths are not read again");
        assert_eq!(varint_sum(&[0x81, 0x00, 0x05]), Some(128 + 5));
        assert_eq!(varint_sum(&[0x81]), None, "cut short");
        check(&c); // lengths from the cache
        c.execute("DELETE FROM kb_fts WHERE rowid % 2 = 0", []).unwrap();
        for i in 0..30i64 {
            let body = vec!["banana"; 2 + i as usize % 11].join(" ") + " apple";
            c.execute(
                "INSERT INTO kb_fts (rowid, title, headings, body) VALUES (?1, 't', 'h h', ?2)",
                rusqlite::params![i + 51, body],
            )
            .unwrap();
        }
        check(&c); // the average length changed, new rows have new rowids
        check(&c);
        assert_eq!(sizes.get(-1), None);
        sizes.put(RowSizes::MAX_ROWID + 1, 3);
        assert_eq!(sizes.get(RowSizes::MAX_ROWID + 1), None, "rowids beyond the bound are not kept");
        // Both sides of a page boundary, and the last rowid kept.
        let page = RowSizes::PAGE as i64;
        for (id, n) in [(page - 1, 4), (page, 0), (RowSizes::MAX_ROWID, 9)] {
            assert_eq!(sizes.get(id), None, "{id} not kept yet");
            sizes.put(id, n);
            assert_eq!(sizes.get(id), Some(n), "{id}");
        }
    }

    #[test]
    fn wrong_counts_are_an_error_not_a_crash() {
        let c = db();
        for blob in [vec![], vec![0u8; 7], vec![0u8; 16]] {
            let e = c
                .query_row(
                    "SELECT coffer_bm25(kb_fts, ?1) FROM kb_fts WHERE kb_fts MATCH '\"apple\"' LIMIT 1",
                    [blob],
                    |r| r.get::<_, f64>(0),
                )
                .unwrap_err();
            assert!(e.to_string().contains("one row count"), "{e}");
        }
        let e = c.query_row("SELECT coffer_bm25(kb_fts) FROM kb_fts WHERE kb_fts MATCH 'apple' LIMIT 1", [], |r| {
            r.get::<_, f64>(0)
        });
        assert!(e.unwrap_err().to_string().contains("second argument"));
    }

    #[test]
    fn counts_are_forgotten_after_a_write() {
        let c = db();
        let df = DocFreq::default();
        let before = df.count(&c, "\"zebra\"").unwrap();
        assert_eq!(before, 0);
        c.execute("INSERT INTO kb_fts (title, headings, body) VALUES ('zebra', '', '')", []).unwrap();
        assert_eq!(df.count(&c, "\"zebra\"").unwrap(), 0, "served from the cache until invalidated");
        df.invalidate();
        assert_eq!(df.count(&c, "\"zebra\"").unwrap(), 1);
    }

    /// Counts read from the term index (`fts5vocab`, the phrase tokenized by FTS5) equal
    /// `MATCH` counts: stemmed, upper-case, accented and CJK words, a phrase of two tokens (counted
    /// with `MATCH`), a word in no row; before and after rows are deleted and others inserted.
    #[test]
    fn vocabulary_counts_equal_match_counts() {
        let c = db();
        c.execute_batch(
            "INSERT INTO kb_fts (title, headings, body) VALUES ('Café', 'cafe', 'running runs 数据 据库');
             INSERT INTO kb_fts (title, headings, body) VALUES ('', '', 'CAFÉ 数据 x\"y');",
        )
        .unwrap();
        let phrases = [
            "\"apple\"",
            "\"apples\"",
            "\"Running\"",
            "\"ran\"",
            "\"café\"",
            "\"CAFE\"",
            "\"数据\"",
            "\"据库\"",
            "\"elder fig\"",
            "\"x\"\"y\"",
            "\"zebra\"",
        ];
        let check = |c: &rusqlite::Connection| {
            let df = DocFreq::default();
            for p in phrases {
                let want: i64 =
                    c.query_row("SELECT count(*) FROM kb_fts WHERE kb_fts MATCH ?1", [p], |r| r.get(0)).unwrap();
                assert_eq!(df.count(c, p).unwrap(), want, "{p}");
                assert_eq!(df.count(c, p).unwrap(), want, "{p} (kept)");
            }
        };
        check(&c);
        assert_eq!(DocFreq::default().token(&c, "\"running\"").unwrap().as_deref(), Some("run"), "stemmed by FTS5");
        let spec = "porter unicode61 remove_diacritics 2";
        assert_eq!(
            tokens(&c, spec, "Running CAFÉ 数据").unwrap(),
            Some(vec!["run".into(), "cafe".into(), "数据".into()])
        );
        assert_eq!(tokens(&c, "no_such_tokenizer", "x").unwrap(), None);
        assert_eq!(tokens(&c, "unicode61 'x'", "x").unwrap(), None, "quoted arguments are not parsed");
        assert_eq!(DocFreq::default().token(&c, "\"elder fig\"").unwrap(), None, "two tokens");
        c.execute("DELETE FROM kb_fts WHERE rowid % 3 = 0", []).unwrap();
        c.execute("INSERT INTO kb_fts (title, headings, body) VALUES ('zebra apple', '', 'café ran')", []).unwrap();
        check(&c);
    }

    /// A reader connection's counts from the term index follow another connection's writes
    /// (the whole table deleted and written again, as a clean reindex does).
    #[test]
    fn vocabulary_counts_follow_another_connections_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        // Two connections to one test database of this module's own.
        let open = || shared(&path);
        let w = open();
        w.execute_batch("PRAGMA journal_mode = WAL; CREATE VIRTUAL TABLE kb_fts USING fts5 (title, headings, body, tokenize = 'porter unicode61 remove_diacritics 2');").unwrap();
        let fill = |w: &rusqlite::Connection, n: usize| {
            for i in 0..n {
                w.execute(
                    "INSERT INTO kb_fts (title, headings, body) VALUES ('', '', ?1)",
                    [format!("咖啡 apple {i}")],
                )
                .unwrap();
            }
        };
        fill(&w, 30);
        let r = open();
        let df = DocFreq::default();
        assert_eq!(df.count(&r, "\"咖啡\"").unwrap(), 30);
        w.execute("DELETE FROM kb_fts", []).unwrap();
        fill(&w, 7);
        df.invalidate();
        assert_eq!(df.count(&r, "\"咖啡\"").unwrap(), 7);
        assert_eq!(df.count(&r, "\"apple\"").unwrap(), 7);
    }

    /// The cause of intermittent keyword failures seen before: a phrase's token is kept for
    /// every connection, the `fts5vocab` table is one connection's own. A phrase first
    /// counted on one connection of the pool must be counted on another that never tokenized
    /// anything (it once failed there with "no such table: temp.kb_fts_rows"), and equal the
    /// `MATCH` count there, before and after a write on a third connection.
    #[test]
    fn a_phrase_tokenized_on_one_connection_is_counted_on_another() {
        const { assert!(COUNT_FROM_TERM_INDEX, "the term index is what this tests") };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        // Three connections to one test database of this module's own.
        let open = || shared(&path);
        let w = open();
        w.execute_batch("PRAGMA journal_mode = WAL; CREATE VIRTUAL TABLE kb_fts USING fts5 (title, headings, body, tokenize = 'porter unicode61 remove_diacritics 2');").unwrap();
        for i in 0..12 {
            w.execute("INSERT INTO kb_fts (title, headings, body) VALUES ('', '', ?1)", [format!("咖啡 running {i}")])
                .unwrap();
        }
        let (r1, r2) = (open(), open());
        let df = DocFreq::default();
        let matched = |c: &rusqlite::Connection, p: &str| -> i64 {
            c.query_row("SELECT count(*) FROM kb_fts WHERE kb_fts MATCH ?1", [p], |r| r.get(0)).unwrap()
        };
        for p in ["\"咖啡\"", "\"runs\""] {
            assert_eq!(df.count(&r1, p).unwrap(), 12, "{p} on the first connection");
        }
        assert!(df.tokens.lock().unwrap().values().all(Option::is_some), "counted from the term index");
        df.invalidate();
        for p in ["\"咖啡\"", "\"runs\""] {
            assert_eq!(df.count(&r2, p).unwrap(), matched(&r2, p), "{p} on a connection that never tokenized it");
        }
        w.execute("INSERT INTO kb_fts (title, headings, body) VALUES ('咖啡', '', 'ran')", []).unwrap();
        df.invalidate();
        for c in [&r1, &r2] {
            assert_eq!(df.count(c, "\"咖啡\"").unwrap(), 13);
            df.invalidate();
        }
    }

    #[test]
    fn the_tokenizer_is_read_from_the_create_statement() {
        let t = |sql: &str| tokenizer_of(sql);
        assert_eq!(t("CREATE VIRTUAL TABLE kb_fts USING fts5 (a, b)").as_deref(), Some("unicode61"));
        assert_eq!(
            t("CREATE VIRTUAL TABLE kb_fts USING fts5 (\n a,\n tokenize = 'porter unicode61 remove_diacritics 2'\n)")
                .as_deref(),
            Some("porter unicode61 remove_diacritics 2")
        );
        assert_eq!(t("create virtual table x using fts5(a, TOKENIZE=\"trigram\")").as_deref(), Some("trigram"));
        assert_eq!(
            t("CREATE VIRTUAL TABLE x USING fts5(a, tokenize = 'unicode61 tokenchars ''-''')").as_deref(),
            Some("unicode61 tokenchars '-'")
        );
        assert_eq!(t("CREATE VIRTUAL TABLE x USING fts5(a, tokenize = porter)"), None);
        assert_eq!(t("CREATE VIRTUAL TABLE x USING fts5(a, tokenize = 'porter"), None);
    }

    #[test]
    fn idf_matches_sqlite_and_is_floored() {
        assert!((idf(100, 10) - ((90.5f64) / 10.5).ln()).abs() < 1e-12);
        assert_eq!(idf(100, 80), 1e-6);
    }

    /// Two texts FTS5 indexes alike give equal token bytes: what the store's view relies on to
    /// keep only the raw text of a chunk.
    #[test]
    fn token_bytes_tell_texts_indexed_alike() {
        #[allow(clippy::disallowed_methods)]
        let c = rusqlite::Connection::open_in_memory().unwrap();
        let tk = Tokenizer::new(&c, "porter unicode61 remove_diacritics 2").unwrap().unwrap();
        let same = |a: &str, b: &str| tk.token_bytes(a).unwrap() == tk.token_bytes(b).unwrap();
        assert!(same("Running, the *Café*!", "running the cafe"));
        assert!(same("[\"A\",\"B c\"]", "A B c"));
        assert!(!same("机器学习", "机器 器学 学习"), "a CJK run is one token, its bigrams three");
        assert!(!same("a b", "b a"), "order counts");
        assert!(!same("[\"x\\ny\"]", "x\ny"), "a JSON escape is a token of its own");
        assert!(!same("ab", "a b"));
        assert_eq!(tokens(&c, "porter unicode61 remove_diacritics 2", "Ran RUNNING").unwrap().unwrap(), ["ran", "run"]);
        assert!(Tokenizer::new(&c, "nosuch").unwrap().is_none());
    }
}
