//! The seam between a controller and its store: the controller marks the
//! keys it changes and answers "what is this key now?"; this side restores
//! at start, runs the flusher and keeps the flush status.
//!
//! Invariants:
//! * Every key whose stored row may be stale is in the dirty set, in
//!   `aged` or in the batch being written: a flush takes the set *before* it samples, so a
//!   change after the sample marks the key again for the next flush; a
//!   failed write marks its keys again (nothing is dropped).
//! * `written` holds exactly the keys with a row in the file for this
//!   name, so a key enqueued and finished between two flushes (no row, no
//!   view) costs no SQL at all; its size is bounded by pending + parked.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use super::dirty::DirtySet;
use super::{SqliteStore, StoreClaim, StoreError, StoreKey, StoredKey, StoredState, decode_key, encode_key};

/// What a store keeps of one key, in the controller's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyView {
    /// `Some`: waiting for this due time (queue clock); `None`: ready.
    pub(crate) due: Option<Instant>,
    /// Parked with this error (then `due` is ignored).
    pub(crate) parked: Option<String>,
    pub(crate) failures: u32,
    pub(crate) priority: i32,
}

/// The controller's side of the seam.
pub(crate) trait KeySource<K>: Send + Sync {
    /// The view of each key, `None` for a key with nothing to keep.
    fn views(&self, keys: &[K], out: &mut Vec<Option<KeyView>>);
    /// Now on the queue's clock (to turn due instants into wall time).
    fn now(&self) -> Instant;
    /// Blocks until no worker can change a key any more (after a stop).
    fn wait_workers_exited(&self);
    /// Whether a stop was requested.
    fn stopping(&self) -> bool;
}

/// What a controller holds of its store, whatever its key type.
pub(crate) trait StoreLink<K>: Send + Sync {
    /// `key` changed: write it at the next flush.
    fn mark(&self, key: &K);
    /// Hands every stored key to `restore`, due times on the queue clock
    /// at `now`.
    fn restore(&self, now: Instant, restore: &mut dyn FnMut(K, KeyView));
    /// The flusher thread's body: returns after the final flush at stop
    /// (after the workers exited), releasing the claim. A failed final
    /// flush stays in `stats().error`, its keys in `pending`.
    fn run_flusher(&self, source: &dyn KeySource<K>);
    /// Wakes the flusher for a stop.
    fn wake(&self);
    fn stats(&self) -> StoreStats;
}

/// The store's part of a controller's stats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Changes not yet written (a key changed twice since the last flush
    /// counts twice until it).
    pub pending: usize,
    /// When the last flush succeeded.
    pub last_flush_time: Option<SystemTime>,
    /// The last flush's error, until a flush succeeds.
    pub error: Option<String>,
}

/// How many keys are sampled under one queue lock acquisition.
const SAMPLE_CHUNK: usize = 4096;

pub(crate) struct Persister<K> {
    store: SqliteStore,
    name: String,
    /// Released after the final flush.
    claim: Mutex<Option<StoreClaim>>,
    dirty: DirtySet<K>,
    /// Keys taken from `dirty` at the last tick, written at the next.
    aged: Mutex<Vec<K>>,
    /// Read at claim, handed out once by `restore`.
    loaded: Mutex<Vec<StoredKey>>,
    written: Mutex<HashSet<K, foldhash::fast::RandomState>>,
    status: Mutex<(Option<SystemTime>, Option<String>)>,
    stopped: AtomicBool,
    /// One flush at a time, so an older sample never overwrites a newer.
    flushing: Mutex<()>,
}

impl<K: StoreKey + Eq + Hash + Clone + Send + Sync + 'static> Persister<K> {
    /// Claims `name` in `store` and reads its keys: every error (locked,
    /// unreadable) comes here, before the controller changes anything.
    pub(crate) fn claim(store: &SqliteStore, name: &str) -> Result<Self, StoreError> {
        let claim = store.claim(name)?;
        let loaded = store.load(name)?;
        Ok(Self {
            store: store.clone(),
            name: name.to_string(),
            claim: Mutex::new(Some(claim)),
            dirty: DirtySet::new(),
            aged: Mutex::new(Vec::new()),
            loaded: Mutex::new(loaded),
            written: Mutex::new(HashSet::default()),
            status: Mutex::new((None, None)),
            stopped: AtomicBool::new(false),
            flushing: Mutex::new(()),
        })
    }

    /// Writes the changed keys in one transaction; on failure they stay
    /// marked for the next flush.
    fn flush(&self, source: &dyn KeySource<K>, keys: Vec<K>, last: bool) {
        let _one_at_a_time = self.flushing.lock();
        if keys.is_empty() {
            return;
        }
        let mut views = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(SAMPLE_CHUNK) {
            source.views(chunk, &mut views);
        }
        let (now, wall) = (source.now(), wall_ms(SystemTime::now()));
        let mut written = self.written.lock();
        let batch: Vec<(Vec<u8>, Option<StoredKey>)> = keys
            .iter()
            .zip(&views)
            .filter(|(key, view)| view.is_some() || written.contains(*key))
            .map(|(key, view)| {
                let stored = view.as_ref().map(|view| to_stored(key, view, now, wall));
                (encode_key(key), stored)
            })
            .collect();
        match self.store.write(&self.name, &batch) {
            Ok(()) => {
                for (key, view) in keys.iter().zip(&views) {
                    if view.is_some() {
                        written.insert(key.clone());
                    } else {
                        written.remove(key);
                    }
                }
                drop(written);
                *self.status.lock() = (Some(SystemTime::now()), None);
            }
            Err(err) => {
                drop(written);
                for key in &keys {
                    self.dirty.mark(key);
                }
                let message = err.to_string();
                if last {
                    tracing::error!(target: "reconq::store", controller = %self.name, error = %message,
                        "store flush at stop failed; {} changed keys not written: the file keeps what the last \
                         successful flush wrote", keys.len());
                } else {
                    tracing::warn!(target: "reconq::store", controller = %self.name, error = %message,
                        "store flush failed; {} keys kept for the next flush", keys.len());
                }
                self.status.lock().1 = Some(message);
            }
        }
    }
}

fn wall_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn to_stored<K: StoreKey>(key: &K, view: &KeyView, now: Instant, wall: i64) -> StoredKey {
    let state = match (&view.parked, view.due) {
        (Some(error), _) => StoredState::Parked { error: error.clone() },
        (None, None) => StoredState::Waiting,
        (None, Some(due)) => {
            StoredState::Delayed { due_unix_ms: wall + due.saturating_duration_since(now).as_millis() as i64 }
        }
    };
    StoredKey { key: encode_key(key), state, failures: view.failures, priority: view.priority }
}

impl<K: StoreKey + Eq + Hash + Clone + Send + Sync + 'static> StoreLink<K> for Persister<K> {
    fn mark(&self, key: &K) {
        self.dirty.mark(key);
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
    /// its change, and a key that completes within half an interval of
    /// its last change is never written (most keys of a busy queue).
    fn run_flusher(&self, source: &dyn KeySource<K>) {
        self.dirty.set_flusher(std::thread::current());
        let tick = self.store.flush_interval() / 2;
        let stopping = || self.stopped.load(Ordering::Acquire) || source.stopping();
        loop {
            // Asleep until something changes (G8) or a stop.
            while self.dirty.len() == 0 && self.aged.lock().is_empty() && !stopping() {
                std::thread::park();
            }
            let next = Instant::now() + tick;
            while !stopping() {
                let now = Instant::now();
                if now >= next {
                    break;
                }
                std::thread::park_timeout(next - now);
            }
            if stopping() {
                break;
            }
            let aged = std::mem::replace(&mut *self.aged.lock(), self.dirty.take());
            self.flush(source, aged, false);
        }
        // The queue answers for what the stop dropped (its stop views), so
        // one flush after the workers is the whole story.
        source.wait_workers_exited();
        let mut keys = std::mem::take(&mut *self.aged.lock());
        keys.extend(self.dirty.take());
        self.flush(source, keys, true);
        self.claim.lock().take();
    }

    fn wake(&self) {
        self.stopped.store(true, Ordering::Release);
        self.dirty.wake();
    }

    fn stats(&self) -> StoreStats {
        let (last_flush_time, error) = self.status.lock().clone();
        StoreStats { pending: self.dirty.len() + self.aged.lock().len(), last_flush_time, error }
    }
}
