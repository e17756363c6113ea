//! Per-key memory (attempts, last error), the parked set of keys that failed
//! permanently, and the [`KeyInfo`] snapshot built from them.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime};

use parking_lot::Mutex;

use crate::shrink::is_sparse;

type Hasher = foldhash::fast::RandomState;

/// Where a key stands, as seen by [`ControllerHandle::inspect`](super::ControllerHandle::inspect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyStatus {
    /// The controller knows nothing about the key.
    Unknown,
    /// Waiting in the ready queue for a worker.
    Ready,
    /// Waiting for a due time (a retry, a delayed enqueue).
    Waiting {
        /// The due time (on the controller's clock).
        until: Instant,
    },
    /// Being reconciled since `since` (on the controller's clock).
    Running {
        /// When its worker took it (on the controller's clock).
        since: Instant,
    },
    /// Failed permanently and parked: not retried until
    /// [`requeue_parked`](super::ControllerHandle::requeue_parked) or an
    /// enqueue.
    Parked,
}

/// A snapshot of one key's state.
///
/// Exhaustive: a model of the controller (as in the tests) builds the
/// snapshot it expects by literal and compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    /// Where the key stands now.
    pub state: KeyStatus,
    /// Tries since the last success or forget (what the next reconcile's
    /// [`Context::attempt`](super::Context::attempt) will be, unless the key
    /// is running).
    pub attempts: u32,
    /// The last error since the last success (the parking error for a
    /// parked key).
    pub last_error: Option<String>,
    /// When the key runs next, if it is scheduled: now for a ready key (or a
    /// running key added again), its due time for a waiting key.
    pub next_run: Option<Instant>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Memory {
    pub(crate) attempts: u32,
    pub(crate) last_error: Option<String>,
}

/// Attempts and last errors of keys that have not succeeded since they last
/// failed. Entries go at success, `RequeueAfter` or parking, so the map only
/// holds keys that are still being retried.
pub(crate) struct KeyMemory<K> {
    map: Mutex<HashMap<K, Memory, Hasher>>,
    /// `map.len()`, read without the lock on the hot path. Exact for a key
    /// the caller is processing: only its worker changes its entry, and the
    /// queue's lock orders one worker's `done` before the next one's `get`.
    len: AtomicUsize,
}

impl<K: Eq + Hash + Clone> KeyMemory<K> {
    pub(crate) fn new() -> Self {
        Self { map: Mutex::new(HashMap::with_hasher(Hasher::default())), len: AtomicUsize::new(0) }
    }

    pub(crate) fn attempts(&self, key: &K) -> u32 {
        if self.len.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.map.lock().get(key).map_or(0, |m| m.attempts)
    }

    pub(crate) fn get(&self, key: &K) -> Memory {
        if self.len.load(Ordering::Acquire) == 0 {
            return Memory::default();
        }
        self.map.lock().get(key).cloned().unwrap_or_default()
    }

    /// One more try; `error` replaces the last error if given.
    pub(crate) fn bump(&self, key: &K, error: Option<String>) {
        let mut map = self.map.lock();
        let entry = map.entry(key.clone()).or_default();
        entry.attempts = entry.attempts.saturating_add(1);
        if error.is_some() {
            entry.last_error = error;
        }
        self.len.store(map.len(), Ordering::Release);
    }

    pub(crate) fn clear(&self, key: &K) {
        if self.len.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut map = self.map.lock();
        map.remove(key);
        if is_sparse(map.len(), map.capacity()) {
            let keep = map.len() * 2;
            map.shrink_to(keep);
        }
        self.len.store(map.len(), Ordering::Release);
    }
}

pub(crate) struct ParkedEntry {
    seq: u64,
    pub(crate) error: String,
    pub(crate) at: SystemTime,
}

struct ParkedInner<K> {
    entries: HashMap<K, ParkedEntry, Hasher>,
    order: BTreeMap<u64, K>,
    next_seq: u64,
    capacity: usize,
}

/// Keys that failed permanently, oldest first, at most `capacity` of them
/// (the oldest is dropped when a new one would exceed it).
pub(crate) struct ParkedSet<K> {
    inner: Mutex<ParkedInner<K>>,
    len: AtomicUsize,
}

impl<K: Eq + Hash + Clone> ParkedSet<K> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(ParkedInner {
                entries: HashMap::with_hasher(Hasher::default()),
                order: BTreeMap::new(),
                next_seq: 0,
                capacity,
            }),
            len: AtomicUsize::new(0),
        }
    }

    pub(crate) fn set_capacity(&self, capacity: usize) {
        let mut g = self.inner.lock();
        g.capacity = capacity;
        Self::evict(&mut g);
        self.len.store(g.entries.len(), Ordering::Release);
    }

    fn evict(g: &mut ParkedInner<K>) {
        while g.entries.len() > g.capacity {
            let Some((_, oldest)) = g.order.pop_first() else {
                break;
            };
            g.entries.remove(&oldest);
        }
    }

    pub(crate) fn park(&self, key: K, error: String) {
        let mut g = self.inner.lock();
        let seq = g.next_seq;
        g.next_seq += 1;
        if let Some(old) = g.entries.insert(key.clone(), ParkedEntry { seq, error, at: SystemTime::now() }) {
            g.order.remove(&old.seq);
        }
        g.order.insert(seq, key);
        Self::evict(&mut g);
        self.len.store(g.entries.len(), Ordering::Release);
    }

    /// Removes `key`; returns whether it was parked.
    pub(crate) fn unpark(&self, key: &K) -> bool {
        if self.len.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut g = self.inner.lock();
        let Some(entry) = g.entries.remove(key) else {
            return false;
        };
        g.order.remove(&entry.seq);
        self.len.store(g.entries.len(), Ordering::Release);
        true
    }

    pub(crate) fn error_of(&self, key: &K) -> Option<(String, SystemTime)> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.inner.lock().entries.get(key).map(|e| (e.error.clone(), e.at))
    }

    pub(crate) fn keys(&self) -> Vec<K> {
        self.inner.lock().order.values().cloned().collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }
}
