//! What a cache with a store keeps of its own contents (guarantees E9), so
//! a restart can load them and resume the source's stream from the kept
//! position instead of relisting: each key's object (as bytes) and
//! version, the position, and the source's state at that position
//! (`Source::resume_state`).
//!
//! One copy per cache, unlike `cache_rows` (one per watching controller).
//! The cache's thread marks each change here right after applying it and
//! *before* delivering it, and a flusher takes the marks *before* its
//! controller's cache rows: so every controller row on disk has its change
//! in the snapshot in the same write or an earlier one. A snapshot ahead
//! of a controller's rows is harmless (that controller's restart
//! difference delivers what it had not recorded); behind, it would deliver
//! a change twice.
//!
//! Any flusher of the cache's controllers may write the marks, one batch
//! at a time ([`CacheSnapshot::take`] hands out nothing while a batch is
//! in flight), so batches reach the file in the order they were taken.
//! A flusher that finds a batch in flight writes its rows without one: in
//! that rare window its rows may get ahead of the file's snapshot, which
//! costs a change delivered twice after a crash, never one missed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// A key's kept state: its version (`None`: none kept) and its object's
/// bytes; `None`: deleted.
pub(crate) type SnapshotRow = Option<(Option<Vec<u8>>, Vec<u8>)>;

/// The changes to a cache's snapshot since the last write.
#[derive(Debug, Default)]
pub(crate) struct SnapshotBatch {
    /// Forget every row kept before these (a list replaced the contents).
    pub(crate) reset: bool,
    /// Forget the snapshot altogether (an object could not be kept): the
    /// next restart relists.
    pub(crate) forget: bool,
    /// Each key's last change (encoded key).
    pub(crate) rows: HashMap<Vec<u8>, SnapshotRow>,
    /// The position of the last change and the source's state there,
    /// both encoded.
    pub(crate) at: Option<(Vec<u8>, Vec<u8>)>,
}

impl SnapshotBatch {
    fn is_empty(&self) -> bool {
        !self.reset && !self.forget && self.rows.is_empty() && self.at.is_none()
    }

    /// Adds `later` after these changes (a later change of a key wins).
    fn append(&mut self, later: SnapshotBatch) {
        if later.reset || later.forget {
            *self = later;
            return;
        }
        self.rows.extend(later.rows);
        if later.at.is_some() {
            self.at = later.at;
        }
    }
}

/// A cache's snapshot marks, shared by the cache (which marks) and the
/// flushers of the controllers that watch it (which take and write).
pub(crate) struct CacheSnapshot {
    cache: Arc<str>,
    dirty: Mutex<SnapshotBatch>,
    /// A taken batch is not written yet: the next take waits for it.
    in_flight: AtomicBool,
}

impl CacheSnapshot {
    pub(crate) fn new(cache: &str) -> Self {
        Self { cache: Arc::from(cache), dirty: Mutex::default(), in_flight: AtomicBool::new(false) }
    }

    pub(crate) fn cache(&self) -> &Arc<str> {
        &self.cache
    }

    /// A change applied: `row` (a key, encoded, and its state), then the
    /// stream at `at` (position and source state, encoded), in one step so
    /// a write never holds one without the other.
    pub(crate) fn mark(&self, row: Option<(Vec<u8>, SnapshotRow)>, at: Option<(Vec<u8>, Vec<u8>)>) {
        let mut dirty = self.dirty.lock();
        if let Some((key, row)) = row {
            dirty.rows.insert(key, row);
        }
        if at.is_some() {
            dirty.at = at;
        }
    }

    /// A list replaced the contents with `rows`, at `at`.
    pub(crate) fn replace(&self, rows: HashMap<Vec<u8>, SnapshotRow>, at: Option<(Vec<u8>, Vec<u8>)>) {
        *self.dirty.lock() = SnapshotBatch { reset: true, rows, at, ..SnapshotBatch::default() };
    }

    /// The snapshot cannot be kept: the file forgets it.
    pub(crate) fn forget(&self) {
        *self.dirty.lock() = SnapshotBatch { forget: true, ..SnapshotBatch::default() };
    }

    /// The marks to write, unless there are none or another batch is
    /// still being written. Pair with [`written`](Self::written) or
    /// [`unwritten`](Self::unwritten).
    pub(crate) fn take(&self) -> Option<SnapshotBatch> {
        let mut dirty = self.dirty.lock();
        if dirty.is_empty() || self.in_flight.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(std::mem::take(&mut *dirty))
    }

    /// The batch taken last is in the file.
    pub(crate) fn written(&self) {
        self.in_flight.store(false, Ordering::Release);
    }

    /// The batch taken last failed to reach the file: marked again, before
    /// the later marks.
    pub(crate) fn unwritten(&self, mut failed: SnapshotBatch) {
        let mut dirty = self.dirty.lock();
        failed.append(std::mem::take(&mut *dirty));
        *dirty = failed;
        self.in_flight.store(false, Ordering::Release);
    }
}

/// Where a restart reads a cache's snapshot back (the store file), in two
/// steps: the position first, so the source can start its catch-up
/// (`Source::restore`) while the rows load.
pub(crate) trait SnapshotFile: Send + Sync {
    /// The kept position and the source's state there, both encoded;
    /// `None`: no snapshot kept for `cache`.
    fn snapshot_at(&self, cache: &str) -> Result<Option<(Vec<u8>, Vec<u8>)>, String>;
    /// Every key kept for `cache` (encoded), its version (encoded; `None`:
    /// none kept) and its object's bytes.
    fn snapshot_rows(&self, cache: &str) -> Result<Vec<SnapshotFileRow>, String>;
}

/// A key's row as [`SnapshotFile::snapshot_rows`] reads it.
pub(crate) type SnapshotFileRow = (Vec<u8>, Option<Vec<u8>>, Vec<u8>);
