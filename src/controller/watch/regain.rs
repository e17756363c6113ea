//! What a watch gives back when a sharded controller gains partitions
//! (guarantees §17, C1): every key its cache maps to, and the keys of the
//! deletes it applied while their mapped keys were another replica's (its
//! tombstones), so the new owner reconciles changes that reached it while
//! it did not own them.
//!
//! Invariant (no change lost to a gain racing with it): sharding marks a
//! partition ours before it tells the controller of the gain, and a cache
//! applies a change to its contents before it delivers the change. So a
//! change whose mapped key was refused at enqueue (not ours yet) was in the
//! cache, and a delete's tombstone kept, before the partition became ours,
//! hence before the gain reads them; a change delivered after the
//! partition became ours is enqueued live. A feed is listed here before it
//! subscribes to its cache, so no feed hears a change the gain cannot see.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::logs;
use crate::sync::Mutex;

/// How many tombstones one watch keeps at most: a delete past it is not
/// kept (logged, counted), and only `resync` brings its key to a replica
/// that gains it later. One per cache key, removed when an owner enqueued
/// it or the key was created again, so it fills only with deletes made
/// while another replica owned their keys and no gain came since.
pub(crate) const MAX_TOMBSTONES: usize = 100_000;

/// Where a key stands after a gain.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding gains partitions
pub(crate) enum Fate {
    /// In a partition just gained: enqueue it.
    Gained,
    /// In a partition owned before the gain: enqueued when it changed.
    Owned,
    /// Another replica's.
    Elsewhere,
}

/// An enqueue a gain makes: the key and its priority (the watch's
/// `list_priority`).
#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding gains partitions
pub(crate) type Regained<K> = (K, i32);

/// A watch, as a gain sees it.
pub(crate) trait Regain<K>: Send + Sync {
    /// Adds to `out` every key the cache's contents and tombstones map to
    /// whose `fate` is [`Fate::Gained`]; drops the tombstones whose keys
    /// are all ours now. Calls the user's `map` and, through `fate`,
    /// `partition_by`: no engine lock may be held.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding gains partitions
    fn regain(&self, fate: &dyn Fn(&K) -> Fate, out: &mut Vec<Regained<K>>);
}

/// The cache keys whose delete a watch applied while some key it mapped to
/// was not ours (at most [`MAX_TOMBSTONES`]).
pub(crate) struct Tombstones<Key> {
    controller: String,
    cache: String,
    keys: Mutex<HashSet<Key>>,
    /// Deletes not kept because the set was full.
    overflow: AtomicU64,
}

impl<Key: Clone + Eq + Hash + std::fmt::Debug> Tombstones<Key> {
    pub(crate) fn new(controller: &str, cache: &str) -> Self {
        Self {
            controller: controller.to_owned(),
            cache: cache.to_owned(),
            keys: Mutex::new(HashSet::new()),
            overflow: AtomicU64::new(0),
        }
    }

    /// A delete of `key` is about to be delivered: kept before its enqueues
    /// are asked (see the invariant above), unless the set is full.
    pub(crate) fn deleting(&self, key: &Key) {
        let mut keys = self.keys.lock();
        if keys.len() < MAX_TOMBSTONES || keys.contains(key) {
            keys.insert(key.clone());
            return;
        }
        drop(keys);
        let overflow = self.overflow.fetch_add(1, Ordering::Relaxed) + 1;
        if overflow.is_power_of_two() {
            logs::tombstones_full(&self.controller, &self.cache, key, MAX_TOMBSTONES, overflow);
        }
    }

    /// A change of `key` was enqueued (after its enqueues, never before):
    /// a put (the key exists again), or a delete whose mapped keys all went
    /// into our queue. Either way the tombstone has done its work.
    pub(crate) fn settled(&self, key: &Key) {
        self.keys.lock().remove(key);
    }

    /// A copy of the keys kept (the caller maps them with no lock held).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding gains partitions
    pub(crate) fn keys(&self) -> Vec<Key> {
        self.keys.lock().iter().cloned().collect()
    }

    /// Deletes not kept because the set was full, so far.
    #[cfg(test)]
    pub(crate) fn overflow(&self) -> u64 {
        self.overflow.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_set_counts_what_it_could_not_keep() {
        let tombstones = Tombstones::new("c", "cache");
        for key in 0..MAX_TOMBSTONES {
            tombstones.deleting(&key);
        }
        // A key kept already is kept again at no cost.
        tombstones.deleting(&0);
        assert_eq!(tombstones.overflow(), 0);
        tombstones.deleting(&MAX_TOMBSTONES);
        assert_eq!(tombstones.overflow(), 1);
        tombstones.settled(&0);
        tombstones.deleting(&MAX_TOMBSTONES);
        assert_eq!(tombstones.overflow(), 1);
        assert_eq!(tombstones.keys().len(), MAX_TOMBSTONES);
    }
}
