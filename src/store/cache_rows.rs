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
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rusqlite::{Transaction, params};

use super::cache_snapshot::{CacheSnapshot, SnapshotBatch};
use super::key_rows::KeyRows;
use super::link::KeptChange;

#[derive(Debug, Clone)]
pub(crate) struct CacheRow {
    cache: Arc<str>,
    key: Vec<u8>,
    change: KeptChange,
}

/// The cache rows one write carries.
#[derive(Default)]
pub(crate) struct CacheBatch {
    /// The caches' own snapshots (`cache_snapshot`), taken after the rows.
    snapshots: Vec<(Arc<CacheSnapshot>, SnapshotBatch)>,
    rows: Vec<CacheRow>,
    /// The last position told, per cache.
    positions: HashMap<Arc<str>, Option<Vec<u8>>>,
}

impl CacheBatch {
    pub(crate) fn is_empty(&self) -> bool {
        self.snapshots.is_empty() && self.rows.is_empty() && self.positions.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.snapshots.len() + self.rows.len() + self.positions.len()
    }

    /// Adds `later` after these rows (a later change of a key wins).
    pub(crate) fn append(&mut self, later: CacheBatch) {
        self.snapshots.extend(later.snapshots);
        self.rows.extend(later.rows);
        self.positions.extend(later.positions);
    }

    /// The write that carried this batch committed: its snapshots are in
    /// the file, and the next ones may be taken.
    pub(crate) fn committed(self) {
        for (snapshot, _) in self.snapshots {
            snapshot.written();
        }
    }

    /// Writes the snapshots, then the rows for controller `name`, in `tx`:
    /// of a key changed several times, the last change.
    pub(crate) fn write(&self, tx: &Transaction<'_>, name: &str) -> rusqlite::Result<()> {
        for (snapshot, batch) in &self.snapshots {
            write_snapshot(tx, snapshot.cache(), batch)?;
        }
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

/// Writes `batch`, the changes to `cache`'s snapshot, in `tx`.
fn write_snapshot(tx: &Transaction<'_>, cache: &str, batch: &SnapshotBatch) -> rusqlite::Result<()> {
    if batch.reset || batch.forget {
        tx.execute("DELETE FROM cache_values WHERE cache = ?1", params![cache])?;
        tx.execute("DELETE FROM cache_snapshots WHERE cache = ?1", params![cache])?;
    }
    let mut upsert =
        tx.prepare_cached("INSERT OR REPLACE INTO cache_values (cache, key, version, value) VALUES (?1, ?2, ?3, ?4)")?;
    let mut delete = tx.prepare_cached("DELETE FROM cache_values WHERE cache = ?1 AND key = ?2")?;
    // In key order: the rows go into the table's b-tree page after page.
    let mut rows: Vec<_> = batch.rows.iter().collect();
    rows.sort_unstable_by(|a, b| a.0.cmp(b.0));
    for (key, row) in rows {
        match row {
            Some((version, value)) => upsert.execute(params![cache, key, version, value])?,
            None => delete.execute(params![cache, key])?,
        };
    }
    if let Some((position, state)) = &batch.at {
        tx.prepare_cached("INSERT OR REPLACE INTO cache_snapshots (cache, position, state) VALUES (?1, ?2, ?3)")?
            .execute(params![cache, position, state])?;
    }
    Ok(())
}

/// A controller's cache rows: read at its claim, handed to each watch at
/// attach; marked by the watches, taken by the flusher.
#[derive(Default)]
pub(crate) struct CacheRows {
    /// The snapshots of the caches it watches that keep one: each write
    /// takes their marks after its rows.
    snapshots: Mutex<Vec<Weak<CacheSnapshot>>>,
    /// Until each watch takes its cache's.
    loaded: Mutex<HashMap<String, KeyRows>>,
    /// Marked since the last take.
    dirty: Mutex<CacheBatch>,
    /// Taken at the last tick, written at the next (with the controller's
    /// aged keys, taken right after them).
    aged: Mutex<CacheBatch>,
}

impl CacheRows {
    pub(crate) fn new(loaded: HashMap<String, KeyRows>) -> Self {
        Self { loaded: Mutex::new(loaded), ..Self::default() }
    }

    /// A watched cache keeps `snapshot`: every write of this controller
    /// carries its marks, taken after the rows. Once, however many
    /// watches of that cache the controller has (a take waits for the
    /// batch in flight: its own would never land).
    pub(crate) fn keep_snapshot(&self, snapshot: &Arc<CacheSnapshot>) {
        let mut snapshots = self.snapshots.lock();
        snapshots.retain(|s| s.strong_count() > 0);
        if !snapshots.iter().any(|s| std::ptr::eq(s.as_ptr(), Arc::as_ptr(snapshot))) {
            snapshots.push(Arc::downgrade(snapshot));
        }
    }

    /// The snapshots' marks, taken after the rows (see `cache_snapshot`),
    /// in the caches' name order.
    fn take_snapshots(&self) -> CacheBatch {
        let mut snapshots = self.snapshots.lock().iter().filter_map(Weak::upgrade).collect::<Vec<_>>();
        snapshots.sort_unstable_by(|a, b| a.cache().cmp(b.cache()));
        let snapshots = snapshots.into_iter().filter_map(|s| s.take().map(|batch| (s, batch))).collect();
        CacheBatch { snapshots, ..CacheBatch::default() }
    }

    /// The rows kept for `cache` at the last run (none if none), in key
    /// order, once.
    pub(crate) fn take_kept(&self, cache: &str) -> KeyRows {
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

    /// A tick: the snapshots and the aged rows to write now; the marks
    /// become the aged.
    pub(crate) fn take_tick(&self) -> CacheBatch {
        let marked = std::mem::take(&mut *self.dirty.lock());
        let mut taken = std::mem::replace(&mut *self.aged.lock(), marked);
        taken.append(self.take_snapshots());
        taken
    }

    /// The snapshots and every row not written yet.
    pub(crate) fn take_all(&self) -> CacheBatch {
        let marked = std::mem::take(&mut *self.dirty.lock());
        let mut taken = std::mem::take(&mut *self.aged.lock());
        taken.append(marked);
        taken.append(self.take_snapshots());
        taken
    }

    /// The snapshots and the aged rows only (a burst written at once).
    pub(crate) fn take_aged(&self) -> CacheBatch {
        let mut taken = std::mem::take(&mut *self.aged.lock());
        taken.append(self.take_snapshots());
        taken
    }

    /// A write of `failed` failed: marked again, before the later marks
    /// (so a later change of a key still wins).
    pub(crate) fn unwritten(&self, mut failed: CacheBatch) {
        for (snapshot, batch) in std::mem::take(&mut failed.snapshots) {
            snapshot.unwritten(batch);
        }
        let mut dirty = self.dirty.lock();
        let later = std::mem::take(&mut *dirty);
        failed.append(later);
        *dirty = failed;
    }
}
