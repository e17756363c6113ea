//! The SQLite file: schema, validation at open, batched writes, restore.

use std::collections::HashMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use super::StoreError;
use super::cache_rows::CacheBatch;
use super::cache_snapshot::{KeptAt, SnapshotFile, SnapshotFileRow};
use super::key_rows::KeyRows;
use super::lock::StoreClaim;
use super::open_files::{self, OpenFile};

/// The schema this build writes. A file with a higher `user_version` was
/// written by a newer reconq and is refused rather than misread; a file
/// with a lower one is migrated at open.
pub const SCHEMA_VERSION: i64 = 3;

/// Step `i` takes a file from schema `i` to `i + 1` (a new file is at 0).
/// Each step only adds (`IF NOT EXISTS`), so a file written by the
/// previous release keeps every row. All steps run in one transaction
/// with the new `user_version`: a crash leaves the file as it was.
const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [SCHEMA_V1, V1_TO_V2, V2_TO_V3];

/// Schema 1: controllers' pending and parked keys (guarantees §9).
const SCHEMA_V1: &str = "
CREATE TABLE IF NOT EXISTS keys (
    controller TEXT NOT NULL,
    key BLOB NOT NULL,          -- the documented key encoding (crate::key_encoding)
    state INTEGER NOT NULL,     -- 0 waiting, 1 delayed, 2 parked
    due_unix_ms INTEGER,        -- delayed: wall-clock due time
    error TEXT,                 -- parked: the last error
    failures INTEGER NOT NULL,  -- the rate limiter's num_requeues
    priority INTEGER NOT NULL,
    PRIMARY KEY (controller, key)
) WITHOUT ROWID;
";

/// Schema 2 adds dependencies between keys (guarantees §14), one row per
/// edge, and what a cache with a store keeps (guarantees E9), per
/// controller that watches it: the keys that controller was told of, each
/// with its version (NULL: none, or one that cannot be kept), and the
/// cache's position. Both are written in the same transaction as that
/// controller's `keys` rows (`store::cache_rows`).
const V1_TO_V2: &str = "
CREATE TABLE IF NOT EXISTS edges (
    controller TEXT NOT NULL,
    child BLOB NOT NULL,        -- the documented key encoding, as keys.key
    parent BLOB NOT NULL,
    position INTEGER NOT NULL,  -- the parent's place in the order set
    PRIMARY KEY (controller, child, parent)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cache_keys (
    controller TEXT NOT NULL,
    cache TEXT NOT NULL,
    key BLOB NOT NULL,          -- the documented key encoding
    version BLOB,               -- the version in the key encoding; NULL: none kept
    PRIMARY KEY (controller, cache, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cache_positions (
    controller TEXT NOT NULL,
    cache TEXT NOT NULL,
    position BLOB,              -- in the key encoding; NULL: none kept
    PRIMARY KEY (controller, cache)
) WITHOUT ROWID;
";

/// Schema 3 adds what a cache with a store keeps of its own contents
/// (guarantees E9, `store::cache_snapshot`), one copy per cache: each key's
/// object and version, and the position with the source's state there, so
/// a restart loads them and resumes the source's stream instead of
/// relisting. Written by the flushers of the controllers that watch the
/// cache, before their own rows.
const V2_TO_V3: &str = "
CREATE TABLE IF NOT EXISTS cache_values (
    cache TEXT NOT NULL,
    key BLOB NOT NULL,          -- the documented key encoding
    version BLOB,               -- in the key encoding; NULL: none kept
    value BLOB NOT NULL,        -- the object's bytes (CacheBuilder::keep_objects)
    PRIMARY KEY (cache, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cache_snapshots (
    cache TEXT NOT NULL PRIMARY KEY,
    position BLOB NOT NULL,     -- in the key encoding
    state BLOB NOT NULL         -- the source's (Source::resume_state)
) WITHOUT ROWID;
";

/// How long a write waits for another connection's lock (another
/// process writing other names in the same file).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A flush that deleted at least this many rows returns the freed pages.
const VACUUM_AFTER_DELETES: usize = 1024;

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// Paths SQLite opens as a private temporary or in-memory database:
/// nothing durable, so refused.
const NOT_A_FILE: [&str; 2] = ["", ":memory:"];

/// What the store keeps of one pending or parked key.
///
/// Exhaustive, like [`StoredState`]: a row of the schema
/// ([`SCHEMA_VERSION`]), which changes only with a migration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredKey {
    /// The key in the documented encoding.
    pub key: Vec<u8>,
    /// Where the key was.
    pub state: StoredState,
    /// The rate limiter's failure count, so back-off continues.
    pub failures: u32,
    /// The priority it was enqueued with.
    pub priority: i32,
}

/// A key's parents as stored (guarantees §14), each in the documented key
/// encoding, in the order set. Empty parents: the key's edges are deleted.
pub(crate) type StoredParents = (Vec<u8>, Vec<Vec<u8>>);

/// Where a stored key was when it was written.
///
/// Exhaustive: the states the schema stores (see [`StoredKey`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredState {
    /// Ready, being reconciled, or dirty: ready again at restore.
    Waiting,
    /// Due at this wall-clock time (milliseconds since the Unix epoch).
    Delayed {
        /// The due time, in milliseconds since the Unix epoch.
        due_unix_ms: i64,
    },
    /// Failed permanently with this error.
    Parked {
        /// The parking error's message.
        error: String,
    },
}

/// An embedded SQLite store for controllers' pending work (guarantees §9).
/// Cheap to clone: clones share one connection. Any number of controllers
/// can use one file, each under its own name.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    /// What "the same file" means (E9: a cache and its controllers).
    canonical: PathBuf,
    conn: Mutex<Connection>,
    flush_interval: Duration,
    /// Listed as open while the connection is (see `open_files`).
    _open: OpenFile,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("flush_interval", &self.inner.flush_interval)
            .finish()
    }
}

/// Refuses a non-empty file that is not SQLite before SQLite touches it,
/// so a wrong path is left byte-for-byte untouched.
fn check_header(path: &Path) -> Result<(), StoreError> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err.into()),
    };
    let mut header = Vec::with_capacity(16);
    file.by_ref().take(16).read_to_end(&mut header)?;
    if header.is_empty() || header == SQLITE_MAGIC {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!("{} is not a SQLite database", path.display())))
    }
}

fn sql_err(path: &Path, err: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode::*;
    match err.sqlite_error_code() {
        Some(NotADatabase | DatabaseCorrupt) => {
            StoreError::Invalid(format!("{} is not a valid SQLite database: {err}", path.display()))
        }
        Some(CannotOpen | ReadOnly | PermissionDenied | DiskFull | SystemIoFailure) => {
            StoreError::Io(io::Error::other(format!("{}: {err}", path.display())))
        }
        _ => StoreError::Io(io::Error::other(format!("{}: {err}", path.display()))),
    }
}

/// Returns every free page to the file system. The pragma frees one page
/// per step, so it is stepped to the end (`execute_batch` steps once: it
/// freed one page per call).
fn incremental_vacuum(conn: &Connection) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached("PRAGMA incremental_vacuum")?;
    let mut rows = stmt.query([])?;
    while rows.next()?.is_some() {}
    Ok(())
}

/// Replaces the stored parents of each key of `edges`.
fn write_edges(tx: &rusqlite::Transaction<'_>, name: &str, edges: &[StoredParents]) -> rusqlite::Result<()> {
    if edges.is_empty() {
        return Ok(());
    }
    let mut clear = tx.prepare_cached("DELETE FROM edges WHERE controller = ?1 AND child = ?2")?;
    let mut insert =
        tx.prepare_cached("INSERT INTO edges (controller, child, parent, position) VALUES (?1, ?2, ?3, ?4)")?;
    for (child, parents) in edges {
        clear.execute(params![name, child])?;
        for (position, parent) in parents.iter().enumerate() {
            insert.execute(params![name, child, parent, position as i64])?;
        }
    }
    Ok(())
}

/// One row of `keys`, or what is wrong with it.
fn read_row(row: &rusqlite::Row<'_>) -> Result<StoredKey, String> {
    let column = |err: rusqlite::Error| err.to_string();
    let state = match row.get::<_, i64>(1).map_err(column)? {
        0 => StoredState::Waiting,
        1 => StoredState::Delayed { due_unix_ms: row.get(2).map_err(column)? },
        2 => StoredState::Parked { error: row.get::<_, Option<String>>(3).map_err(column)?.unwrap_or_default() },
        other => return Err(format!("unknown state {other}")),
    };
    Ok(StoredKey {
        key: row.get(0).map_err(column)?,
        state,
        failures: row.get(4).map_err(column)?,
        priority: row.get(5).map_err(column)?,
    })
}

/// Brings a file at schema `from` up to [`SCHEMA_VERSION`], in one
/// transaction (nothing to do for a current file).
fn migrate(conn: &Connection, from: i64) -> rusqlite::Result<()> {
    if from >= SCHEMA_VERSION {
        return Ok(());
    }
    let steps = MIGRATIONS[from.max(0) as usize..].concat();
    conn.execute_batch(&format!("BEGIN IMMEDIATE; {steps} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"))
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path` with the default
    /// flush interval (1 s).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with_flush_interval(path, Duration::from_secs(1))
    }

    /// Opens the store; controllers using it write their changes at least
    /// every `flush_interval`.
    pub fn open_with_flush_interval(path: impl AsRef<Path>, flush_interval: Duration) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if NOT_A_FILE.iter().any(|special| path.as_os_str() == *special) {
            return Err(StoreError::Invalid(format!(
                "store path {path:?} is not a file: SQLite would open a private database that nothing keeps"
            )));
        }
        if flush_interval.is_zero() {
            return Err(StoreError::Invalid("flush_interval must be positive".into()));
        }
        check_header(&path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&path, flags).map_err(|e| sql_err(&path, e))?;
        // Read the version before any write: a newer file stays untouched.
        let version: i64 =
            conn.pragma_query_value(None, "user_version", |row| row.get(0)).map_err(|e| sql_err(&path, e))?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::Invalid(format!(
                "{} holds store schema {version}, newer than this reconq's {SCHEMA_VERSION}",
                path.display()
            )));
        }
        conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| sql_err(&path, e))?;
        // Freed pages go back to the file system (see `write` and
        // `compact`), so the file follows pending + parked keys down as well
        // as up. Takes effect only on a new file, before the first table
        // and before WAL mode (set after it, it was silently ignored).
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL").map_err(|e| sql_err(&path, e))?;
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(())).map_err(|e| sql_err(&path, e))?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(|e| sql_err(&path, e))?;
        // Bounds the WAL file left after a checkpoint.
        conn.pragma_update(None, "journal_size_limit", 4 * 1024 * 1024).map_err(|e| sql_err(&path, e))?;
        migrate(&conn, version).map_err(|e| sql_err(&path, e))?;
        let open = open_files::register(&path);
        let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        Ok(Self { inner: Arc::new(Inner { path, canonical, conn: Mutex::new(conn), flush_interval, _open: open }) })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Whether `other` opened the same file (E9: a cache's store must be
    /// its controllers').
    pub fn same_file(&self, other: &SqliteStore) -> bool {
        self.inner.canonical == other.inner.canonical
    }

    pub(crate) fn canonical_path(&self) -> &Path {
        &self.inner.canonical
    }

    /// How often changed keys are written, at least.
    pub fn flush_interval(&self) -> Duration {
        self.inner.flush_interval
    }

    /// Claims `name` for one live controller (S3).
    pub fn claim(&self, name: &str) -> Result<StoreClaim, StoreError> {
        StoreClaim::acquire(&self.inner.path, name)
    }

    /// Every key stored under `name`.
    pub fn load(&self, name: &str) -> Result<Vec<StoredKey>, StoreError> {
        let conn = self.inner.conn.lock();
        let mut stmt = conn
            .prepare_cached("SELECT key, state, due_unix_ms, error, failures, priority FROM keys WHERE controller = ?1")
            .map_err(|e| sql_err(&self.inner.path, e))?;
        let mut rows = stmt.query(params![name]).map_err(|e| sql_err(&self.inner.path, e))?;
        let mut keys = Vec::new();
        while let Some(row) = rows.next().map_err(|e| sql_err(&self.inner.path, e))? {
            keys.push(read_row(row).map_err(|detail| self.corrupt_row(name, row, &detail))?);
        }
        Ok(keys)
    }

    /// Every key's parents stored under `name`, in the order set.
    pub(crate) fn load_edges(&self, name: &str) -> Result<Vec<StoredParents>, StoreError> {
        let mut edges: Vec<StoredParents> = Vec::new();
        self.for_each_row(
            name,
            "SELECT child, parent FROM edges WHERE controller = ?1 ORDER BY child, position",
            "edge",
            |row| {
                let (child, parent) = (row.get::<_, Vec<u8>>(0)?, row.get::<_, Vec<u8>>(1)?);
                match edges.last_mut() {
                    Some((last, parents)) if *last == child => parents.push(parent),
                    _ => edges.push((child, vec![parent])),
                }
                Ok(())
            },
        )?;
        Ok(edges)
    }

    /// The rows kept for the caches `name` watches (E9), by cache, each
    /// cache's in key order (a restart's difference merges them with the
    /// cache's snapshot, which is in key order too).
    pub(crate) fn load_caches(&self, name: &str) -> Result<HashMap<String, KeyRows>, StoreError> {
        // The caches first, each sized to its rows and bytes: a million
        // rows grown by doubling would be moved twenty times. A row then
        // names its cache by place, not by a copy of the cache's name.
        let mut caches: Vec<(String, KeyRows)> = Vec::new();
        self.for_each_row(
            name,
            "SELECT cache, count(*), sum(length(key) + ifnull(length(version), 0)) FROM cache_keys \
             WHERE controller = ?1 GROUP BY cache",
            "cache row count",
            |row| {
                let size = |i| row.get::<_, i64>(i).map(|n| usize::try_from(n).unwrap_or_default());
                caches.push((row.get(0)?, KeyRows::with_capacity(size(1)?, size(2)?)));
                Ok(())
            },
        )?;
        let names: Vec<String> = caches.iter().map(|(cache, _)| cache.clone()).collect();
        self.for_each_row(
            name,
            "SELECT cache, key, version FROM cache_keys WHERE controller = ?1 ORDER BY cache, key",
            "cache row",
            |row| {
                let cache = row.get_ref(0)?.as_str()?;
                // Counted above: a controller not started yet writes no row.
                let place = names.iter().position(|name| name == cache).ok_or(rusqlite::Error::InvalidQuery)?;
                caches[place].1.push(row.get_ref(1)?.as_blob()?, row.get_ref(2)?.as_blob_or_null()?);
                Ok(())
            },
        )?;
        Ok(caches.into_iter().collect())
    }

    /// Runs `sql` (its one parameter: the controller `name`) and hands each
    /// row to `read`, borrowed from SQLite's buffers. A row `read` fails on
    /// is an error naming the file, the controller and `what` the row is.
    fn for_each_row(
        &self,
        name: &str,
        sql: &str,
        what: &str,
        mut read: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<()>,
    ) -> Result<(), StoreError> {
        let conn = self.inner.conn.lock();
        let path = &self.inner.path;
        let mut stmt = conn.prepare_cached(sql).map_err(|e| sql_err(path, e))?;
        let mut rows = stmt.query(params![name]).map_err(|e| sql_err(path, e))?;
        while let Some(row) = rows.next().map_err(|e| sql_err(path, e))? {
            read(row).map_err(|e| {
                StoreError::Invalid(format!(
                    "{}: a corrupt {what} of controller {name:?}: {e}; delete that row or restore a backup",
                    path.display()
                ))
            })?;
        }
        Ok(())
    }

    /// A row `load` cannot read: which file, controller and key, and why.
    fn corrupt_row(&self, name: &str, row: &rusqlite::Row<'_>, detail: &str) -> StoreError {
        let key = match row.get_ref(0) {
            Ok(rusqlite::types::ValueRef::Blob(bytes)) => format!("{bytes:02x?}"),
            Ok(other) => format!("{other:?}"),
            Err(err) => err.to_string(),
        };
        StoreError::Invalid(format!(
            "{}: a corrupt row of controller {name:?} (key {key}): {detail}; delete that row or restore a backup",
            self.inner.path.display()
        ))
    }

    /// Returns the pages deleted rows freed to the file system and moves
    /// the WAL into the main file, truncating it: an idle store is one
    /// file (a copy of it alone is a backup) of about its rows' size. Best
    /// effort: a reader in the way (another connection) leaves it for the
    /// next time, and nothing is lost either way.
    /// Returns whether it got through.
    pub(crate) fn compact(&self) -> bool {
        let conn = self.inner.conn.lock();
        // Never waits: a reader holding a snapshot (a shell in another
        // process) would otherwise hold the flusher for the busy timeout,
        // and the next changes' flush (S1) with it.
        if conn.busy_timeout(Duration::ZERO).is_err() {
            return false;
        }
        let auto_vacuum: i64 = conn.pragma_query_value(None, "auto_vacuum", |row| row.get(0)).unwrap_or(2);
        if auto_vacuum == 0 {
            // A file written before auto-vacuum took effect: converted once
            // (a VACUUM rewrites it), then freed pages are returned below.
            let _ = conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM");
        }
        let vacuumed = incremental_vacuum(&conn).is_ok();
        // (busy, WAL frames, frames checkpointed): busy 0 when it finished.
        let checkpointed = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get::<_, i64>(0));
        let _ = conn.busy_timeout(BUSY_TIMEOUT);
        vacuumed && checkpointed.is_ok_and(|busy| busy == 0)
    }

    /// Writes one batch for `name` in one transaction: each entry is a key
    /// and what to keep of it (`None`: delete it). All or nothing.
    pub fn write(&self, name: &str, batch: &[(Vec<u8>, Option<StoredKey>)]) -> Result<(), StoreError> {
        self.write_chunk(name, batch, &[], &CacheBatch::default())
    }

    /// [`write`](Self::write), and in the same transaction each of `edges`
    /// (a key's parents replacing the stored ones) and the rows of the
    /// caches `name` watches (E9: a kept version is never on disk without
    /// the pending keys its change enqueued).
    pub(crate) fn write_chunk(
        &self,
        name: &str,
        batch: &[(Vec<u8>, Option<StoredKey>)],
        edges: &[StoredParents],
        caches: &CacheBatch,
    ) -> Result<(), StoreError> {
        let mut conn = self.inner.conn.lock();
        let path = &self.inner.path;
        let tx = conn.transaction().map_err(|e| sql_err(path, e))?;
        {
            let mut upsert = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO keys (controller, key, state, due_unix_ms, error, failures, priority)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(|e| sql_err(path, e))?;
            let mut delete = tx
                .prepare_cached("DELETE FROM keys WHERE controller = ?1 AND key = ?2")
                .map_err(|e| sql_err(path, e))?;
            for (key, record) in batch {
                let result = match record {
                    None => delete.execute(params![name, key]),
                    Some(r) => {
                        let (state, due, error) = match &r.state {
                            StoredState::Waiting => (0, None, None),
                            StoredState::Delayed { due_unix_ms } => (1, Some(*due_unix_ms), None),
                            StoredState::Parked { error } => (2, None, Some(error.as_str())),
                        };
                        upsert.execute(params![name, key, state, due, error, r.failures, r.priority])
                    }
                };
                result.map_err(|e| sql_err(path, e))?;
            }
            write_edges(&tx, name, edges).map_err(|e| sql_err(path, e))?;
        }
        if !caches.is_empty() {
            caches.write(&tx, name).map_err(|e| sql_err(path, e))?;
        }
        tx.commit().map_err(|e| sql_err(path, e))?;
        let deleted = batch.iter().filter(|(_, record)| record.is_none()).count();
        if deleted >= VACUUM_AFTER_DELETES {
            // Best effort: a failure here loses nothing.
            let _ = incremental_vacuum(&conn);
        }
        Ok(())
    }
}

/// A cache's snapshot (E9), read back by its restart.
impl SnapshotFile for SqliteStore {
    fn snapshot_at(&self, cache: &str) -> Result<Option<KeptAt>, String> {
        let conn = self.inner.conn.lock();
        conn.query_row("SELECT position, state FROM cache_snapshots WHERE cache = ?1", params![cache], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .optional()
        .map_err(|e| sql_err(&self.inner.path, e).to_string())
    }

    /// On a read-only connection of its own: a million rows take about a
    /// second to read, which the flushers' connection (S1) cannot spare.
    fn snapshot_rows(
        &self,
        cache: &str,
        each: &mut dyn FnMut(SnapshotFileRow<'_>) -> Result<(), String>,
    ) -> Result<(), String> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let sql = |e| sql_err(&self.inner.path, e).to_string();
        let conn = Connection::open_with_flags(&self.inner.path, flags).map_err(sql)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql)?;
        let mut stmt =
            conn.prepare("SELECT key, version, value FROM cache_values WHERE cache = ?1 ORDER BY key").map_err(sql)?;
        let mut rows = stmt.query(params![cache]).map_err(sql)?;
        while let Some(row) = rows.next().map_err(sql)? {
            let blob = |i: usize| -> rusqlite::Result<Option<&[u8]>> {
                let value = row.get_ref(i)?;
                let wrong = |e| rusqlite::Error::FromSqlConversionFailure(i, value.data_type(), Box::new(e));
                value.as_blob_or_null().map_err(wrong)
            };
            let (key, version, value) = (blob(0).map_err(sql)?, blob(1).map_err(sql)?, blob(2).map_err(sql)?);
            let (Some(key), Some(value)) = (key, value) else {
                return Err(format!("a row of cache {cache:?} without a key or an object"));
            };
            each((key, version, value))?;
        }
        Ok(())
    }
}
