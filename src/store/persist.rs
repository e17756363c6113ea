//! The SQLite side of the store seam (`link`): restores at start, runs the
//! flusher and keeps the flush status.
//!
//! Invariants:
//! * Every key whose stored row may be stale is in the dirty set, in
//!   `aged` or in the batch being written (counted in `writing`): a flush
//!   takes the set *before* it samples, so a change after the sample marks
//!   the key again for the next flush; a failed write marks the keys it
//!   had not written again (nothing is dropped).
//! * Only the flusher thread writes (its final flush too), so an older
//!   sample never overwrites a newer one.
//! * A `flush()` ticket is answered only by a write that took every
//!   change (`take_every_change`) after the ticket was asked
//!   (`flush_requests`).
//! * The rows of the caches the controller watches (`cache_rows`, E9)
//!   are taken right *before* the controller's own marks, in every take
//!   (a tick, every change, a burst), and written in the transaction of
//!   the last chunk of the keys taken with them: every enqueue a kept
//!   row's change made is in that write or an earlier one.
//! * What waits for a write (`after_write`: a create's enqueues, E9) is
//!   taken *before* the changes of the write that releases it, so every
//!   row marked before it (its create's trace, and older rows of the same
//!   key, which must not overwrite the trace later) is in that write.
//! * `written` holds exactly the keys with a row in the file for this
//!   name, so a key enqueued and finished between two flushes (no row, no
//!   view) costs no SQL at all; its size is bounded by pending + parked.
//! * Edges (guarantees §14) follow the keys' rules: a key whose parents
//!   were set is in `edge_marks` or in the flush writing it; a flush takes
//!   the marks before it reads the parents, writes them in its first
//!   transaction, and marks them again if that transaction fails.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use super::cache_rows::{CacheBatch, CacheRows};
use super::cache_snapshot::CacheSnapshot;
use super::db::StoredParents;
use super::dirty::DirtySet;
use super::flush_requests::FlushRequests;
use super::key_rows::KeyRows;
use super::link::{AfterWrite, Flush, KeptChange, KeySource, KeyView, StoreLink};
use super::{SqliteStore, StoreClaim, StoreError, StoredKey, StoredState};
use crate::key_encoding::{StoreKey, decode_key, encode_key};
use crate::observe::reports::StoreStats;

/// A key's encoding and what to keep of it (`None`: delete its row).
type Row = (Vec<u8>, Option<StoredKey>);

/// What one flush writes: the controller's keys, and the rows of its
/// caches taken right before them.
type Taken<K> = (Vec<K>, CacheBatch);

/// How many times an idle flusher tries to compact (one tick apart) when a
/// reader is in the way, before it waits for the next write.
const COMPACT_TRIES: u32 = 20;

/// How many keys are sampled under one queue lock acquisition.
const SAMPLE_CHUNK: usize = 4096;

/// The most keys one transaction writes: a burst is committed in steps,
/// each durable as soon as it is written, and no transaction holds the
/// whole burst in SQLite's cache and WAL at once. (A key sampled at the
/// start of a long flush may have changed by its write: its change marked
/// it again, for the next flush.)
const WRITE_CHUNK: usize = 32 * 1024;

/// Keys taken at a tick are written at once, without waiting half an
/// interval for some of them to complete, when there are at least this
/// many: writing that many takes a good part of the second S1 leaves for
/// the write (about 0.15 s per 100,000 keys on the shared 2-core VM).
const NO_AGING_ABOVE: usize = 128 * 1024;

pub(crate) struct Persister<K> {
    store: SqliteStore,
    name: String,
    /// Released after the final flush.
    claim: Mutex<Option<StoreClaim>>,
    dirty: DirtySet<K>,
    /// Keys taken from `dirty` at the last tick, written at the next.
    aged: Mutex<Vec<K>>,
    /// Keys taken for the flush under way (counted as pending until
    /// written).
    writing: AtomicUsize,
    /// Keys whose parents were set since the last flush (rare: a plain
    /// list, the flusher drops the repeats).
    edge_marks: Mutex<Vec<K>>,
    /// Read at claim, handed out once by `restore`.
    loaded: Mutex<Vec<StoredKey>>,
    /// Read at claim, handed out once by `restore_edges`.
    loaded_edges: Mutex<Vec<StoredParents>>,
    written: Mutex<HashSet<K, foldhash::fast::RandomState>>,
    status: Mutex<(Option<SystemTime>, Option<String>)>,
    stopped: AtomicBool,
    /// Set by [`StoreLink::workers_done`]; the final flush waits for it.
    workers_done: AtomicBool,
    flushes: FlushRequests,
    /// What it keeps of the caches it watches (E9).
    caches: CacheRows,
    /// Run after the next write (`StoreLink::after_write`), in order.
    after_write: Mutex<Vec<AfterWrite>>,
    /// How many of those have not run yet: pushed, or taken by the
    /// flusher and not run (`StoreLink::holds_changes`).
    after_write_left: AtomicUsize,
}

impl<K: StoreKey + Eq + Hash + Clone + Send + Sync + 'static> Persister<K> {
    /// Claims `name` in `store` and reads its keys: every error (locked,
    /// unreadable) comes here, before the controller changes anything.
    pub(crate) fn claim(store: &SqliteStore, name: &str) -> Result<Self, StoreError> {
        let claim = store.claim(name)?;
        let loaded = store.load(name)?;
        let loaded_edges = store.load_edges(name)?;
        let caches = CacheRows::new(store.load_caches(name)?);
        Ok(Self {
            store: store.clone(),
            name: name.to_string(),
            claim: Mutex::new(Some(claim)),
            dirty: DirtySet::new(),
            aged: Mutex::new(Vec::new()),
            writing: AtomicUsize::new(0),
            edge_marks: Mutex::new(Vec::new()),
            loaded: Mutex::new(loaded),
            loaded_edges: Mutex::new(loaded_edges),
            written: Mutex::new(HashSet::default()),
            status: Mutex::new((None, None)),
            stopped: AtomicBool::new(false),
            workers_done: AtomicBool::new(false),
            flushes: FlushRequests::default(),
            caches,
            after_write: Mutex::new(Vec::new()),
            after_write_left: AtomicUsize::new(0),
        })
    }

    /// Writes the changed keys, in key order, in transactions of at most
    /// [`WRITE_CHUNK`] keys; on a failure the keys not written yet stay
    /// marked for the next flush.
    fn flush(&self, source: &dyn KeySource<K>, (keys, caches): Taken<K>, last: bool) -> Result<(), StoreError> {
        let (edge_keys, edges) = self.edges_to_write(source);
        if keys.is_empty() && caches.is_empty() && edges.is_empty() {
            return Ok(());
        }
        let (batch, keys) = self.rows_to_write(source, keys);
        self.writing.store(keys.len(), Ordering::Release);
        let chunks = batch.len().div_ceil(WRITE_CHUNK).max(1);
        let mut caches = caches;
        for at in 0..chunks {
            let range = at * WRITE_CHUNK..batch.len().min((at + 1) * WRITE_CHUNK);
            let (batch_chunk, keys_chunk) = (&batch[range.clone()], &keys[range]);
            // The edges ride with the first chunk, the cache rows with the
            // last (see the invariants).
            let edges = if at == 0 { &edges[..] } else { &[] };
            let mut riding = if at + 1 == chunks { std::mem::take(&mut caches) } else { CacheBatch::default() };
            if batch_chunk.is_empty() && edges.is_empty() && riding.is_empty() {
                continue;
            }
            if let Err(err) = self.store.write_chunk(&self.name, batch_chunk, edges, &riding) {
                let unwritten = &keys[at * WRITE_CHUNK..];
                for key in unwritten {
                    self.dirty.mark(key);
                }
                if at == 0 {
                    self.edge_marks.lock().extend(edge_keys);
                }
                // This write's rows, or (an earlier chunk failed) all of them.
                riding.append(caches);
                self.caches.unwritten(riding);
                self.writing.store(0, Ordering::Release);
                self.failed(&err, unwritten.len(), last);
                return Err(err);
            }
            riding.committed();
            let mut written = self.written.lock();
            for ((_, row), key) in batch_chunk.iter().zip(keys_chunk) {
                if row.is_some() {
                    written.insert(key.clone());
                } else {
                    written.remove(key);
                }
            }
            drop(written);
            self.writing.fetch_sub(keys_chunk.len(), Ordering::AcqRel);
        }
        *self.status.lock() = (Some(SystemTime::now()), None);
        Ok(())
    }

    /// Answers the `flush()` tickets asked so far and runs what waits for
    /// a write, if any, after a write of every change not written yet.
    /// Returns whether it had keys to write.
    fn answer_flushes(&self, source: &dyn KeySource<K>) -> bool {
        let upto = self.flushes.unanswered();
        let waiting = std::mem::take(&mut *self.after_write.lock());
        if upto.is_none() && waiting.is_empty() {
            return false;
        }
        let (mut wrote, mut outcome) = self.write_every_change(source);
        if !waiting.is_empty() {
            for then in waiting {
                then();
                // After it ran: its enqueues are in the queue by now.
                self.after_write_left.fetch_sub(1, Ordering::AcqRel);
            }
            // A ticket also covers the enqueues (and rows) those just made.
            if upto.is_some() {
                let (again, second) = self.write_every_change(source);
                wrote |= again;
                // Its take had the keys the first write failed to write.
                outcome = second;
            }
        }
        if let Some(upto) = upto {
            self.flushes.answer(upto, outcome, false);
        }
        wrote
    }

    /// Writes every change not written yet; returns whether there was
    /// any, and the outcome.
    fn write_every_change(&self, source: &dyn KeySource<K>) -> (bool, Result<(), StoreError>) {
        let keys = self.take_every_change();
        let any = !keys.0.is_empty() || !keys.1.is_empty();
        (any, self.flush(source, keys, false))
    }

    /// Every change not written yet: the aged keys and every mark.
    fn take_every_change(&self) -> Taken<K> {
        let caches = self.caches.take_all();
        let keys = self.take_for_flush(|aged| {
            let mut keys = std::mem::take(aged);
            keys.extend(self.dirty.take());
            keys
        });
        (keys, caches)
    }

    /// Samples `keys`, then the dependents D2 enqueued since the last
    /// flush, and keeps the ones that need SQL (a view to keep, or a row to
    /// delete: most keys of a busy queue have neither), each once, by its
    /// last sample. Returns the rows and their keys.
    ///
    /// Order: the dependents first, so that they are written in the first
    /// transaction, no later than a finished parent's row (see
    /// `KeySource::dependents_views`); then the rest in key order: rows
    /// then go into the table's b-tree page after page; in the dirty set's
    /// (hash) order every row touched a random page, far more than SQLite's
    /// cache holds (a 1,000,000-key burst took 11 s to write instead of
    /// about one).
    fn rows_to_write(&self, source: &dyn KeySource<K>, keys: Vec<K>) -> (Vec<Row>, Vec<K>) {
        let mut views = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(SAMPLE_CHUNK) {
            source.views(chunk, &mut views);
        }
        let mut dependents = Vec::new();
        source.dependents_views(&mut dependents);
        let (now, wall) = (source.now(), wall_ms(SystemTime::now()));
        let written = self.written.lock();
        let to_rows = |sampled: &mut dyn Iterator<Item = (K, Option<KeyView>)>| -> Vec<(Row, K)> {
            let mut rows: Vec<(Row, K)> = sampled
                .filter(|(key, view)| view.is_some() || written.contains(key))
                .map(|(key, view)| {
                    let encoded = encode_key(&key);
                    let stored = view.map(|view| to_stored(&encoded, &view, now, wall));
                    ((encoded, stored), key)
                })
                .collect();
            rows.sort_unstable_by(|a, b| a.0.0.cmp(&b.0.0));
            // A key marked several times is written once.
            rows.dedup_by(|a, b| a.0.0 == b.0.0);
            rows
        };
        // A dependent was sampled again since: that later sample stands.
        let resampled: HashSet<&K> = dependents.iter().map(|(key, _)| key).collect();
        let rest = to_rows(&mut keys.into_iter().zip(views).filter(|(key, _)| !resampled.contains(key)));
        drop(resampled);
        let mut rows = to_rows(&mut dependents.into_iter());
        drop(written);
        rows.extend(rest);
        rows.into_iter().unzip()
    }

    /// Takes the keys whose parents were set and reads their parents now
    /// (after the take: a set after it marks the key again), each key
    /// once. Returns the keys and their rows.
    fn edges_to_write(&self, source: &dyn KeySource<K>) -> (Vec<K>, Vec<StoredParents>) {
        let mut keys = std::mem::take(&mut *self.edge_marks.lock());
        if keys.is_empty() {
            return (keys, Vec::new());
        }
        let mut rows: Vec<(StoredParents, K)> = keys
            .drain(..)
            .map(|key| ((encode_key(&key), source.parents(&key).iter().map(encode_key).collect()), key))
            .collect();
        rows.sort_unstable_by(|a, b| a.0.0.cmp(&b.0.0));
        rows.dedup_by(|a, b| a.0.0 == b.0.0);
        let (rows, keys) = rows.into_iter().unzip();
        (keys, rows)
    }

    fn failed(&self, err: &StoreError, unwritten: usize, last: bool) {
        let message = err.to_string();
        if last {
            tracing::error!(target: "reconq::store", controller = %self.name, error = %message,
                "store flush at stop failed; {unwritten} changed keys not written: the file keeps what the last \
                 successful flush wrote");
        } else {
            tracing::warn!(target: "reconq::store", controller = %self.name, error = %message,
                "store flush failed; {unwritten} keys kept for the next flush");
        }
        self.status.lock().1 = Some(message);
    }

    /// Takes the keys to write (`take` them from `aged` and the dirty
    /// set), counting them as being written until they are.
    fn take_for_flush(&self, take: impl FnOnce(&mut Vec<K>) -> Vec<K>) -> Vec<K> {
        let mut aged = self.aged.lock();
        let keys = take(&mut aged);
        self.writing.store(keys.len(), Ordering::Release);
        keys
    }
}

fn wall_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn to_stored(key: &[u8], view: &KeyView, now: Instant, wall: i64) -> StoredKey {
    let state = match (&view.parked, view.due) {
        (Some(error), _) => StoredState::Parked { error: error.clone() },
        (None, None) => StoredState::Waiting,
        (None, Some(due)) => {
            StoredState::Delayed { due_unix_ms: wall + due.saturating_duration_since(now).as_millis() as i64 }
        }
    };
    StoredKey { key: key.to_vec(), state, failures: view.failures, priority: view.priority }
}

impl<K: StoreKey + Eq + Hash + Clone + Send + Sync + 'static> StoreLink<K> for Persister<K> {
    fn mark(&self, key: &K) {
        self.dirty.mark(key);
    }

    fn mark_edges(&self, key: &K) {
        self.edge_marks.lock().push(key.clone());
        self.dirty.wake();
    }

    fn restore_edges(&self) -> Vec<(K, Vec<K>)> {
        let loaded = std::mem::take(&mut *self.loaded_edges.lock());
        let mut edges = Vec::with_capacity(loaded.len());
        for (child, parents) in loaded {
            let decoded: Option<Vec<K>> = parents.iter().map(|parent| decode_key::<K>(parent)).collect();
            match (decode_key::<K>(&child), decoded) {
                (Some(child), Some(parents)) => edges.push((child, parents)),
                // Left in the file untouched, as a key row of another shape.
                _ => tracing::warn!(target: "reconq::store", controller = %self.name,
                    "stored edges of a key of another shape skipped"),
            }
        }
        edges
    }

    fn restore(&self, now: Instant, restore: &mut dyn FnMut(K, KeyView)) {
        let wall = wall_ms(SystemTime::now());
        let loaded = std::mem::take(&mut *self.loaded.lock());
        let mut written = self.written.lock();
        for stored in loaded {
            let Some(key) = decode_key::<K>(&stored.key) else {
                // Left in the file untouched: another key type wrote it.
                tracing::warn!(target: "reconq::store", controller = %self.name,
                    "store row with a key of another shape skipped");
                continue;
            };
            let (due, parked) = match stored.state {
                StoredState::Waiting => (None, None),
                StoredState::Delayed { due_unix_ms } => {
                    (Some(now + Duration::from_millis(due_unix_ms.saturating_sub(wall).max(0) as u64)), None)
                }
                StoredState::Parked { error } => (None, Some(error)),
            };
            written.insert(key.clone());
            restore(key, KeyView { due, parked, failures: stored.failures, priority: stored.priority });
        }
    }

    /// Flushes in half-interval ticks, each writing the keys marked before
    /// the previous tick: a key is written at most `flush_interval` after
    /// its change, plus the time to write it (S1 allows one second), and a
    /// key that completes within half an interval of its last change is
    /// never written (most keys of a busy queue). The ticks keep their
    /// schedule while a long flush runs: the next one starts as soon as
    /// it is due, so a burst is written while it is still being marked;
    /// and a burst's keys are neither aged nor kept for the tick
    /// (`NO_AGING_ABOVE`). A `flush()` does not wait for a tick: it wakes
    /// the flusher, which writes every change at once.
    fn run_flusher(&self, source: &dyn KeySource<K>) {
        self.dirty.set_flusher(std::thread::current());
        let tick = self.store.flush_interval() / 2;
        let stopping = || self.stopped.load(Ordering::Acquire);
        // A flush() or a create waiting for its trace: a write at once.
        let asked = || self.flushes.unanswered().is_some() || !self.after_write.lock().is_empty();
        let mut next_tick: Option<Instant> = None;
        // Compactions left to try since the last write (0: compacted).
        let mut compact_tries = 0;
        loop {
            if self.answer_flushes(source) {
                compact_tries = COMPACT_TRIES;
            }
            // Asleep until something changes (G8), a flush() or a stop;
            // compacted first if it wrote since it last slept (item 13 of
            // issue 22: a burst left 33 MiB of WAL and free pages behind).
            // A reader in the way gets a few more ticks, then the next
            // write.
            while self.dirty.len() == 0
                && self.aged.lock().is_empty()
                && self.edge_marks.lock().is_empty()
                && self.caches.is_idle()
                && !stopping()
                && !asked()
            {
                next_tick = None;
                if compact_tries == 0 {
                    std::thread::park();
                } else if self.store.compact() {
                    compact_tries = 0;
                } else {
                    compact_tries -= 1;
                    std::thread::park_timeout(tick);
                }
            }
            let next = *next_tick.get_or_insert_with(|| Instant::now() + tick);
            // A burst does not wait for the tick: its write starts while it
            // is still being marked (the dirty set wakes the flusher every
            // few thousand marks), which S1 needs for bursts of a million.
            let burst = || self.dirty.len() >= NO_AGING_ABOVE;
            let mut early = false;
            while !stopping() && !asked() {
                let now = Instant::now();
                if now >= next {
                    break;
                }
                if burst() {
                    early = true;
                    break;
                }
                std::thread::park_timeout(next - now);
            }
            if stopping() {
                break;
            }
            if asked() {
                continue;
            }
            // A burst written early keeps the schedule: a key marked after
            // it is still written within `flush_interval`.
            if !early {
                next_tick = Some((next + tick).max(Instant::now()));
            }
            compact_tries = COMPACT_TRIES;
            // A failed tick is in the status; no caller waits for a tick.
            let caches = self.caches.take_tick();
            let aged = self.take_for_flush(|aged| std::mem::replace(aged, self.dirty.take()));
            let _ = self.flush(source, (aged, caches), false);
            if self.aged.lock().len() >= NO_AGING_ABOVE {
                let caches = self.caches.take_aged();
                let burst = self.take_for_flush(std::mem::take);
                let _ = self.flush(source, (burst, caches), false);
            }
        }
        // The queue answers for what the stop dropped (its stop views), so
        // one flush after the workers is the whole story. A flush() asked
        // meanwhile is answered at once: a hung reconcile does not hold it.
        loop {
            self.answer_flushes(source);
            if self.workers_done.load(Ordering::Acquire) {
                break;
            }
            if !asked() {
                std::thread::park();
            }
        }
        let upto = self.flushes.unanswered().unwrap_or(0);
        let keys = self.take_every_change();
        let outcome = self.flush(source, keys, true);
        self.flushes.answer(upto, outcome, true);
        // The controller stopped: an enqueue now would be dropped anyway,
        // and a restart delivers those creates again (their traces, just
        // written, count as changed; a trace not written: not kept).
        let dropped = std::mem::take(&mut *self.after_write.lock()).len();
        self.after_write_left.fetch_sub(dropped, Ordering::AcqRel);
        // Best effort: the next start compacts too, once it has written.
        self.store.compact();
        self.claim.lock().take();
    }

    fn wake(&self) {
        self.stopped.store(true, Ordering::Release);
        self.dirty.wake();
    }

    fn workers_done(&self) {
        self.workers_done.store(true, Ordering::Release);
        self.dirty.wake();
    }

    fn stats(&self) -> StoreStats {
        let (last_flush_time, error) = self.status.lock().clone();
        let pending = self.dirty.len()
            + self.aged.lock().len()
            + self.edge_marks.lock().len()
            + self.writing.load(Ordering::Acquire)
            + self.caches.pending();
        StoreStats { pending, last_flush_time, error }
    }

    fn holds_changes(&self) -> bool {
        self.after_write_left.load(Ordering::Acquire) > 0
    }

    fn take_kept(&self, cache: &str) -> KeyRows {
        self.caches.take_kept(cache)
    }

    fn keep_snapshot(&self, snapshot: &Arc<CacheSnapshot>) {
        self.caches.keep_snapshot(snapshot);
    }

    fn mark_cache(&self, cache: &Arc<str>, key: Vec<u8>, change: KeptChange, position: Option<Vec<u8>>) {
        if self.caches.mark(cache, key, change, position) {
            self.dirty.wake();
        }
    }

    fn after_write(&self, created: Option<(&Arc<str>, Vec<u8>)>, then: AfterWrite) {
        if let Some((cache, key)) = created {
            self.caches.mark_created(cache, key);
        }
        let mut waiting = self.after_write.lock();
        let was_empty = waiting.is_empty();
        self.after_write_left.fetch_add(1, Ordering::AcqRel);
        waiting.push(then);
        drop(waiting);
        // One wake per batch, not a syscall per create of a list: the
        // flusher takes them all at once.
        if was_empty {
            self.dirty.wake();
        }
    }
}

impl<K: StoreKey + Eq + Hash + Clone + Send + Sync + 'static> Flush for Persister<K> {
    fn ask_flush(&self) -> u64 {
        let ticket = self.flushes.ask();
        self.dirty.wake();
        ticket
    }

    fn flushed(&self, ticket: u64, timeout: Option<Duration>) -> Option<Result<(), StoreError>> {
        self.flushes.wait(ticket, timeout)
    }
}
