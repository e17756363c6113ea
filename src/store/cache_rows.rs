//! What a controller's store keeps of the caches it watches (guarantees
//! E9): for each cache with a store, the keys the controller was told of,
//! each with the version it was told, and the cache's position.
//!
//! The rows are the controller's own (a cache watched by two controllers
//! has two copies), so each copy is written by that controller's flusher
//! in the same transaction as its pending keys, and tells exactly what
//! that controller was told: a controller that starts watching later, or
//! is new in the file, gets its own difference at its restart.
//!
//! Invariant (a restart never believes a change was handled that no
//! controller recorded): a row is marked only *after* the enqueues its
//! change caused (the watch's feed), and the flusher takes these marks
//! *before* it takes the controller's own marks, in every take (`persist`).
//! So every row a write carries has its enqueues' marks in the same write
//! or an earlier one, and a kept version is never on disk before the
//! pending keys its change made.
//!
//! A create's trace (`mark_created`) is the exception that keeps the rule
//! whole: a row *without* a version, marked *before* the create's enqueues
//! and written before they are made (`StoreLink::after_write`). A restart
//! counts a key kept without a version as changed if listed and as deleted
//! if not, so the trace never hides a change; it only makes sure that a
//! key whose create was reconciled is known to the restart, which then
//! delivers its delete (E9).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use parking_lot::Mutex;
use rusqlite::{Transaction, params};

use super::link::{KeptChange, KeptSet};

#[derive(Debug, Clone)]
pub(crate) struct CacheRow {
    cache: Arc<str>,
    key: Vec<u8>,
    change: KeptChange,
}

/// The cache rows one write carries.
#[derive(Debug, Default)]
pub(crate) struct CacheBatch {
    rows: Vec<CacheRow>,
    /// The last position told, per cache.
    positions: HashMap<Arc<str>, Option<Vec<u8>>>,
}

impl CacheBatch {
    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.positions.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.rows.len() + self.positions.len()
    }

    /// Adds `later` after these rows (a later change of a key wins).
    pub(crate) fn append(&mut self, later: CacheBatch) {
        self.rows.extend(later.rows);
        self.positions.extend(later.positions);
    }

    /// Writes the rows for controller `name` in `tx`: of a key changed
    /// several times, the last change.
    pub(crate) fn write(&self, tx: &Transaction<'_>, name: &str) -> rusqlite::Result<()> {
        let mut upsert = tx.prepare_cached(
            "INSERT OR REPLACE INTO cache_keys (controller, cache, key, version) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut delete =
            tx.prepare_cached("DELETE FROM cache_keys WHERE controller = ?1 AND cache = ?2 AND key = ?3")?;
        let mut seen = HashSet::with_capacity(self.rows.len());
        for row in self.rows.iter().rev() {
            if !seen.insert((&row.cache, &row.key)) {
                continue;
            }
            match &row.change {
                KeptChange::Put(version) => upsert.execute(params![name, &*row.cache, row.key, version])?,
                KeptChange::Delete => delete.execute(params![name, &*row.cache, row.key])?,
            };
        }
        let mut position = tx.prepare_cached(
            "INSERT OR REPLACE INTO cache_positions (controller, cache, position) VALUES (?1, ?2, ?3)",
        )?;
        for (cache, at) in &self.positions {
            position.execute(params![name, &**cache, at])?;
        }
        Ok(())
    }
}

/// A controller's cache rows: read at its claim, handed to each watch at
/// attach; marked by the watches, taken by the flusher.
#[derive(Default)]
pub(crate) struct CacheRows {
    /// Until each watch takes its cache's.
    loaded: Mutex<HashMap<String, KeptSet>>,
    /// Marked since the last take.
    dirty: Mutex<CacheBatch>,
    /// Taken at the last tick, written at the next (with the controller's
    /// aged keys, taken right after them).
    aged: Mutex<CacheBatch>,
}

impl CacheRows {
    pub(crate) fn new(loaded: HashMap<String, KeptSet>) -> Self {
        Self { loaded: Mutex::new(loaded), ..Self::default() }
    }

    /// The key set kept for `cache` at the last run (empty if none), once.
    pub(crate) fn take_kept(&self, cache: &str) -> KeptSet {
        self.loaded.lock().remove(cache).unwrap_or_default()
    }

    /// The controller was told of `change` to `key` (encoded) of `cache`,
    /// at `position`. Call it after the enqueues the change caused.
    /// Returns whether the marks were empty before (wake the flusher).
    pub(crate) fn mark(&self, cache: &Arc<str>, key: Vec<u8>, change: KeptChange, position: Option<Vec<u8>>) -> bool {
        let mut dirty = self.dirty.lock();
        let was_empty = dirty.is_empty();
        dirty.rows.push(CacheRow { cache: Arc::clone(cache), key, change });
        dirty.positions.insert(Arc::clone(cache), position);
        was_empty
    }

    /// The trace of a create of `key` (encoded) of `cache`: a row without
    /// a version, and no position (the position stays where the changes
    /// handed out so far put it). Returns whether the marks were empty
    /// before.
    pub(crate) fn mark_created(&self, cache: &Arc<str>, key: Vec<u8>) -> bool {
        let mut dirty = self.dirty.lock();
        let was_empty = dirty.is_empty();
        dirty.rows.push(CacheRow { cache: Arc::clone(cache), key, change: KeptChange::Put(None) });
        was_empty
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.dirty.lock().is_empty() && self.aged.lock().is_empty()
    }

    pub(crate) fn pending(&self) -> usize {
        self.dirty.lock().len() + self.aged.lock().len()
    }

    /// A tick: the aged rows to write now; the marks become the aged.
    pub(crate) fn take_tick(&self) -> CacheBatch {
        let marked = std::mem::take(&mut *self.dirty.lock());
        std::mem::replace(&mut *self.aged.lock(), marked)
    }

    /// Every row not written yet.
    pub(crate) fn take_all(&self) -> CacheBatch {
        let marked = std::mem::take(&mut *self.dirty.lock());
        let mut rows = std::mem::take(&mut *self.aged.lock());
        rows.append(marked);
        rows
    }

    /// The aged rows only (a burst written at once).
    pub(crate) fn take_aged(&self) -> CacheBatch {
        std::mem::take(&mut *self.aged.lock())
    }

    /// A write of `failed` failed: marked again, before the later marks
    /// (so a later change of a key still wins).
    pub(crate) fn unwritten(&self, mut failed: CacheBatch) {
        let mut dirty = self.dirty.lock();
        let later = std::mem::take(&mut *dirty);
        failed.append(later);
        *dirty = failed;
    }
}
