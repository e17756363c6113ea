//! What a cache with a store keeps of its own contents (guarantees E9), so
//! a restart can load them and resume the source's stream from the kept
//! position instead of relisting: each key's object (as bytes) and
//! version, the position, and the source's state at that position
//! (`Source::resume_state`).
//!
//! One copy per cache, unlike `cache_rows` (one per watching controller).
//! The cache's thread marks each change here right after applying it and
//! *before* delivering it (the feed marks a controller's row after that),
//! and a flusher takes the marks *after* its controller's cache rows and
//! writes them in the same transaction: so every controller row on disk
//! has its change in the snapshot in the same write or an earlier one. A
//! snapshot ahead of a controller's rows is harmless (that controller's
//! restart difference delivers what it had not recorded); behind, it
//! would hand that controller an older object than it was told of, and
//! the change again from the stream.
//!
//! Any flusher of the cache's controllers may write the marks, one batch
//! at a time: [`CacheSnapshot::take`] waits while another flusher's batch
//! is in flight (taken, not yet committed or put back), so batches reach
//! the file in the order they were taken. A flusher takes the snapshots
//! of its caches in name order, so two flushers sharing two caches never
//! wait for each other in a circle; it takes them before its transaction
//! begins, so no flusher waits for one while holding SQLite's write lock.

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::Arc;

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
    pub(crate) at: Option<KeptAt>,
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
    dirty: Mutex<Marks>,
    /// Signalled when a batch in flight is written or put back.
    landed: Condvar,
}

/// The marks not taken yet, and whether a taken batch is in flight.
#[derive(Default)]
struct Marks {
    batch: SnapshotBatch,
    /// Taken by a flusher, not committed or put back yet: the next take
    /// waits for it.
    in_flight: bool,
}

impl std::ops::Deref for Marks {
    type Target = SnapshotBatch;
    fn deref(&self) -> &SnapshotBatch {
        &self.batch
    }
}

impl std::ops::DerefMut for Marks {
    fn deref_mut(&mut self) -> &mut SnapshotBatch {
        &mut self.batch
    }
}

impl CacheSnapshot {
    pub(crate) fn new(cache: &str) -> Self {
        Self { cache: Arc::from(cache), dirty: Mutex::default(), landed: Condvar::new() }
    }

    pub(crate) fn cache(&self) -> &Arc<str> {
        &self.cache
    }

    /// A change applied: `row` (a key, encoded, and its state), then the
    /// stream at `at` (position and source state, encoded), in one step so
    /// a write never holds one without the other.
    pub(crate) fn mark(&self, row: Option<(Vec<u8>, SnapshotRow)>, at: Option<KeptAt>) {
        let mut dirty = self.dirty.lock();
        if let Some((key, row)) = row {
            dirty.rows.insert(key, row);
        }
        if at.is_some() {
            dirty.at = at;
        }
    }

    /// A list replaced the contents with `rows`, at `at`.
    pub(crate) fn replace(&self, rows: HashMap<Vec<u8>, SnapshotRow>, at: Option<KeptAt>) {
        self.dirty.lock().batch = SnapshotBatch { reset: true, rows, at, ..SnapshotBatch::default() };
    }

    /// The snapshot cannot be kept: the file forgets it.
    pub(crate) fn forget(&self) {
        self.dirty.lock().batch = SnapshotBatch { forget: true, ..SnapshotBatch::default() };
    }

    /// The marks to write (`None`: there are none), once no other batch
    /// is in flight (waits for it). Call it before the transaction
    /// begins, and pair a batch with [`written`](Self::written) or
    /// [`unwritten`](Self::unwritten).
    pub(crate) fn take(&self) -> Option<SnapshotBatch> {
        let mut dirty = self.dirty.lock();
        while dirty.in_flight {
            self.landed.wait(&mut dirty);
        }
        if dirty.is_empty() {
            return None;
        }
        dirty.in_flight = true;
        Some(std::mem::take(&mut dirty.batch))
    }

    /// The batch taken last is in the file.
    pub(crate) fn written(&self) {
        self.dirty.lock().in_flight = false;
        self.landed.notify_all();
    }

    /// The batch taken last failed to reach the file: marked again, before
    /// the later marks.
    pub(crate) fn unwritten(&self, mut failed: SnapshotBatch) {
        let mut dirty = self.dirty.lock();
        failed.append(std::mem::take(&mut dirty.batch));
        dirty.batch = failed;
        dirty.in_flight = false;
        drop(dirty);
        self.landed.notify_all();
    }
}

/// Where a restart reads a cache's snapshot back (the store file), in two
/// steps: the position first, so the source can start its catch-up
/// (`Source::restore`) while the rows load.
pub(crate) trait SnapshotFile: Send + Sync {
    /// The kept position and the source's state there, both encoded;
    /// `None`: no snapshot kept for `cache`.
    fn snapshot_at(&self, cache: &str) -> Result<Option<KeptAt>, String>;
    /// Hands `each` every key kept for `cache` (encoded), in key order
    /// (the bytes'), its version (encoded; `None`: none kept) and its
    /// object's bytes, borrowed from the file's reader: a million rows are
    /// a million keys to decode, not three million buffers to copy first.
    /// An error of `each` ends the read and is returned.
    fn snapshot_rows(
        &self,
        cache: &str,
        each: &mut dyn FnMut(SnapshotFileRow<'_>) -> Result<(), String>,
    ) -> Result<(), String>;
}

/// A position and the source's resume state there, both encoded.
pub(crate) type KeptAt = (Vec<u8>, Vec<u8>);

/// A key's row as [`SnapshotFile::snapshot_rows`] reads it: key, version
/// and object, encoded.
pub(crate) type SnapshotFileRow<'a> = (&'a [u8], Option<&'a [u8]>, &'a [u8]);

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn put(value: &[u8]) -> SnapshotRow {
        Some((None, value.to_vec()))
    }

    #[test]
    fn a_failed_write_puts_its_batch_back_before_the_later_marks() {
        let snapshot = CacheSnapshot::new("c");
        snapshot.mark(Some((b"a".to_vec(), put(b"1"))), Some((b"p1".to_vec(), b"s".to_vec())));
        snapshot.mark(Some((b"b".to_vec(), put(b"1"))), None);
        let failed = snapshot.take().unwrap();
        snapshot.mark(Some((b"a".to_vec(), put(b"2"))), Some((b"p2".to_vec(), b"s".to_vec())));
        snapshot.unwritten(failed);
        let again = snapshot.take().unwrap();
        assert_eq!(again.rows[&b"a".to_vec()], put(b"2"), "the later change of a key wins");
        assert_eq!(again.rows[&b"b".to_vec()], put(b"1"), "nothing of the failed batch is lost");
        assert_eq!(again.at, Some((b"p2".to_vec(), b"s".to_vec())));
        snapshot.written();
        assert!(snapshot.take().is_none(), "nothing left");
    }

    #[test]
    fn a_take_waits_for_the_batch_in_flight() {
        let snapshot = Arc::new(CacheSnapshot::new("c"));
        snapshot.mark(Some((b"a".to_vec(), put(b"1"))), None);
        let first = snapshot.take().unwrap();
        snapshot.mark(Some((b"a".to_vec(), put(b"2"))), None);
        let (tx, rx) = std::sync::mpsc::channel();
        let other = Arc::clone(&snapshot);
        let waiter = std::thread::spawn(move || tx.send(other.take()).unwrap());
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "no second batch while one is in flight");
        snapshot.unwritten(first);
        let second = rx.recv_timeout(Duration::from_secs(30)).unwrap().unwrap();
        assert_eq!(second.rows[&b"a".to_vec()], put(b"2"), "taken after the first landed, with it");
        waiter.join().unwrap();
    }
}
