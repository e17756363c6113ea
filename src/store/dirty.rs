//! The keys changed since the last flush.
//!
//! Engine threads mark a key after every change that a store keeps (an
//! enqueue, the end of a reconcile); the flusher takes the whole set. The
//! set is sharded so workers marking different keys rarely meet on a lock,
//! and marking a key already marked clones nothing.
//!
//! The flusher sleeps in `park` while the set is empty: the mark that makes
//! it non-empty unparks it (an unpark before the park is not lost: the
//! token sticks), so an idle controller's flusher never wakes (G8).

use std::collections::HashSet;
use std::hash::{BuildHasher, Hash};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::Thread;

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

type Hasher = foldhash::fast::FixedState;

const SHARDS: usize = 16;

pub(crate) struct DirtySet<K> {
    shards: Box<[CachePadded<Mutex<HashSet<K, Hasher>>>]>,
    hasher: Hasher,
    /// Keys in all shards (the stats' `store_pending`). Raised before the
    /// flusher is woken, lowered by the flusher when it takes a shard.
    len: AtomicUsize,
    /// The flusher, once it runs.
    flusher: OnceLock<Thread>,
}

impl<K: Eq + Hash + Clone> DirtySet<K> {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| CachePadded::new(Mutex::new(HashSet::default()))).collect(),
            hasher: Hasher::default(),
            len: AtomicUsize::new(0),
            flusher: OnceLock::new(),
        }
    }

    /// Registers the thread to wake when the set stops being empty.
    pub(crate) fn set_flusher(&self, thread: Thread) {
        let _ = self.flusher.set(thread);
    }

    pub(crate) fn mark(&self, key: &K) {
        let shard = &self.shards[self.hasher.hash_one(key) as usize % SHARDS];
        let mut set = shard.lock();
        if set.contains(key) {
            return;
        }
        set.insert(key.clone());
        drop(set);
        if self.len.fetch_add(1, Ordering::AcqRel) == 0 {
            self.wake();
        }
    }

    /// Wakes the flusher (a mark, or a stop).
    pub(crate) fn wake(&self) {
        if let Some(thread) = self.flusher.get() {
            thread.unpark();
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Takes every marked key.
    pub(crate) fn take(&self) -> Vec<K> {
        let mut keys = Vec::with_capacity(self.len());
        for shard in self.shards.iter() {
            let taken = std::mem::take(&mut *shard.lock());
            self.len.fetch_sub(taken.len(), Ordering::AcqRel);
            keys.extend(taken);
        }
        keys
    }
}
