//! Finds a key's entry in the queue's [`Slab`] by hash.
//!
//! An open-addressing table with linear probing. A bucket is 8 bytes: the
//! entry's slab index and 32 bits of the key's hash; so probing compares
//! hashes without reading the slab (it reads the slab once, to confirm a
//! match), growing rehashes from the stored bits without reading the slab
//! at all, and a key's home bucket is one computable address, which
//! [`prefetch`](KeyIndex::prefetch) can ask the CPU to load ahead of time.
//!
//! Why not a general hash table: `done` on a deep backlog misses the cache
//! on its lookup, inside the queue's lock. A table whose bucket for a key is
//! known lets the queue prefetch it while that key is handed out, so the
//! later `done` finds it cached; and one 8-byte bucket per key (one cache
//! line per lookup in the common case) keeps the randomly probed part of
//! the queue small. Deletion shifts the following buckets back (no
//! tombstones), so probe sequences never degrade.
//!
//! Invariant: every key of the table is found by probing from its home
//! bucket (`hash & mask`) forward without crossing an empty bucket.

use std::hash::{BuildHasher, Hash};

use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::Relaxed};

use super::slab::{Keyed, Slab, prefetch};
use crate::shrink::is_sparse;

pub(crate) struct KeyIndex<S> {
    /// A power of two long (or empty).
    buckets: Box<[Bucket]>,
    len: usize,
    hasher: S,
    /// Where `buckets` is, for threads that do not hold the queue's lock.
    hint: Arc<Prefetcher<S>>,
}

/// Lets a thread prefetch a key's home bucket before it takes the queue's
/// lock to add the key, so the lookup inside the lock finds it cached: the
/// table's address and mask, republished at every resize. A thread that
/// reads them just before a resize prefetches a stale address, which only
/// wastes the hint.
pub(crate) struct Prefetcher<S> {
    buckets: AtomicPtr<Bucket>,
    /// `usize::MAX` while the table is empty.
    mask: AtomicUsize,
    hasher: S,
}

impl<S: BuildHasher> Prefetcher<S> {
    #[inline]
    pub(crate) fn prefetch<K: Hash>(&self, key: &K) {
        let mask = self.mask.load(Relaxed);
        if mask != usize::MAX {
            let at = hash32(&self.hasher, key) as usize & mask;
            prefetch(self.buckets.load(Relaxed).wrapping_add(at));
        }
    }
}

/// 32 bits of `key`'s hash.
#[inline]
fn hash32<S: BuildHasher, K: Hash>(hasher: &S, key: &K) -> u32 {
    let hash = hasher.hash_one(key);
    (hash ^ (hash >> 32)) as u32
}

#[derive(Clone, Copy, Default)]
struct Bucket {
    /// The slab index plus one; 0 marks an empty bucket.
    slot: u32,
    hash: u32,
}

/// The smallest table.
const MIN_BUCKETS: usize = 8;

/// A key the index does not hold yet, and the bucket it goes to.
pub(crate) struct Vacant<'a> {
    bucket: &'a mut Bucket,
    len: &'a mut usize,
    hash: u32,
}

impl Vacant<'_> {
    /// Records the key at slab index `index`.
    #[inline]
    pub(crate) fn insert(self, index: u32) {
        *self.bucket = Bucket { slot: index + 1, hash: self.hash };
        *self.len += 1;
    }
}

impl<S: BuildHasher + Clone> KeyIndex<S> {
    pub(crate) fn new(hasher: S) -> Self {
        let hint =
            Prefetcher { buckets: AtomicPtr::default(), mask: AtomicUsize::new(usize::MAX), hasher: hasher.clone() };
        Self { buckets: Box::default(), len: 0, hasher, hint: Arc::new(hint) }
    }

    /// A handle to prefetch buckets without the lock (see [`Prefetcher`]).
    pub(crate) fn prefetcher(&self) -> Arc<Prefetcher<S>> {
        Arc::clone(&self.hint)
    }

    #[inline]
    fn hash<K: Hash>(&self, key: &K) -> u32 {
        hash32(&self.hasher, key)
    }

    #[inline]
    fn mask(&self) -> usize {
        self.buckets.len().wrapping_sub(1)
    }

    /// The bucket holding `key` (whose hash is `hash`) or the empty one
    /// that ends its probe sequence. The table must not be empty.
    #[inline]
    fn probe<K: Eq, T: Keyed<K>>(&self, key: &K, hash: u32, slab: &Slab<T>) -> usize {
        let mask = self.mask();
        let mut at = hash as usize & mask;
        loop {
            let b = self.buckets[at];
            if b.slot == 0 || (b.hash == hash && slab.get(b.slot - 1).key() == key) {
                return at;
            }
            at = (at + 1) & mask;
        }
    }

    /// The slab index of `key`'s entry.
    #[inline]
    pub(crate) fn find<K: Eq + Hash, T: Keyed<K>>(&self, key: &K, slab: &Slab<T>) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let slot = self.buckets[self.probe(key, self.hash(key), slab)].slot;
        slot.checked_sub(1)
    }

    /// The slab index of `key`'s entry, or where to record it.
    #[inline]
    pub(crate) fn entry<K: Eq + Hash, T: Keyed<K>>(&mut self, key: &K, slab: &Slab<T>) -> Result<u32, Vacant<'_>> {
        // At most three quarters full, counting the key about to come.
        if (self.len + 1) * 4 > self.buckets.len() * 3 {
            self.resize((self.buckets.len() * 2).max(MIN_BUCKETS));
        }
        let hash = self.hash(key);
        let at = self.probe(key, hash, slab);
        match self.buckets[at].slot {
            0 => Err(Vacant { bucket: &mut self.buckets[at], len: &mut self.len, hash }),
            slot => Ok(slot - 1),
        }
    }

    /// Forgets `key`, whose entry is at slab index `index`, shrinking a
    /// table that fell to an eighth full.
    pub(crate) fn remove<K: Hash>(&mut self, key: &K, index: u32) {
        let mask = self.mask();
        let mut hole = self.hash(key) as usize & mask;
        while self.buckets[hole].slot != index + 1 {
            debug_assert!(self.buckets[hole].slot != 0, "a removed key is in the index");
            hole = (hole + 1) & mask;
        }
        // Shift back every following bucket of the run that may move into
        // the hole (its home is not between the hole and itself), so no
        // probe sequence crosses the emptied bucket.
        let mut at = hole;
        loop {
            at = (at + 1) & mask;
            let b = self.buckets[at];
            if b.slot == 0 {
                break;
            }
            let home = b.hash as usize & mask;
            if at.wrapping_sub(home) & mask >= at.wrapping_sub(hole) & mask {
                self.buckets[hole] = b;
                hole = at;
            }
        }
        self.buckets[hole] = Bucket::default();
        self.len -= 1;
        if is_sparse(self.len, self.buckets.len()) {
            self.resize((self.len * 2).next_power_of_two().max(MIN_BUCKETS));
        }
    }

    /// Asks the CPU to start loading the home bucket of `key`: the first
    /// bucket a later [`remove`](Self::remove) or [`find`](Self::find) of it
    /// reads. Only a hint: it changes nothing, and a resize before the key is
    /// looked up just wastes it. (The hint this index publishes is current
    /// while the caller holds the index.)
    #[inline]
    pub(crate) fn prefetch<K: Hash>(&self, key: &K) {
        self.hint.prefetch(key);
    }

    /// Keeps the keys whose slab index `keep` says to keep.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u32) -> bool) {
        for bucket in self.buckets.iter_mut() {
            if bucket.slot != 0 && !keep(bucket.slot - 1) {
                *bucket = Bucket::default();
                self.len -= 1;
            }
        }
        // Emptied buckets may split probe runs: lay the table out again.
        self.resize((self.len * 2).next_power_of_two().max(MIN_BUCKETS));
    }

    /// Maps every slab index through `remap` (from `Slab::compact`).
    pub(crate) fn remap(&mut self, remap: &[u32]) {
        for bucket in self.buckets.iter_mut().filter(|b| b.slot != 0) {
            let index = remap[bucket.slot as usize - 1];
            debug_assert!(index != super::slab::FREED, "the index holds live entries only");
            bucket.slot = index + 1;
        }
    }

    /// Moves every key into a table of `buckets` buckets (a power of two
    /// larger than the number of keys).
    fn resize(&mut self, buckets: usize) {
        debug_assert!(buckets.is_power_of_two() && buckets > self.len);
        let old = std::mem::replace(&mut self.buckets, vec![Bucket::default(); buckets].into_boxed_slice());
        let mask = self.mask();
        for b in old.iter().filter(|b| b.slot != 0) {
            let mut at = b.hash as usize & mask;
            while self.buckets[at].slot != 0 {
                at = (at + 1) & mask;
            }
            self.buckets[at] = *b;
        }
        self.hint.buckets.store(self.buckets.as_mut_ptr(), Relaxed);
        self.hint.mask.store(mask, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct E(u64);
    impl Keyed<u64> for E {
        fn key(&self) -> &u64 {
            &self.0
        }
    }

    #[test]
    fn indices_are_reused_and_compaction_keeps_order() {
        let mut slab = Slab::new();
        let mut index = KeyIndex::new(foldhash::fast::RandomState::default());
        for k in 0..5000u64 {
            let Err(vacant) = index.entry(&k, &slab) else { panic!("new key") };
            vacant.insert(slab.insert(E(k)));
        }
        for k in 0..4900u64 {
            let i = index.find(&k, &slab).unwrap();
            index.remove(&k, i);
            assert_eq!(slab.remove(i).0, k);
        }
        assert!(slab.is_sparse());
        let remap = slab.compact();
        index.remap(&remap);
        assert_eq!(slab.len(), 100);
        for k in 4900..5000u64 {
            let i = index.find(&k, &slab).unwrap();
            assert_eq!(i as u64, k - 4900, "live entries keep their order");
            assert_eq!(index.entry(&k, &slab).ok(), Some(i));
        }
        assert_eq!(index.find(&1, &slab), None);
        let i = slab.insert(E(7));
        assert_eq!(i, 100, "a compacted slab has no free indices");
    }

    /// A hasher that sends every key to a few home buckets, so removals
    /// must shift long, wrapping runs.
    #[derive(Clone, Default)]
    struct Colliding;
    impl BuildHasher for Colliding {
        type Hasher = CollidingHasher;
        fn build_hasher(&self) -> CollidingHasher {
            CollidingHasher(0)
        }
    }
    struct CollidingHasher(u64);
    impl std::hash::Hasher for CollidingHasher {
        fn finish(&self) -> u64 {
            // Homes at the table's last buckets, so runs wrap around.
            let h = (self.0 % 3) as u32 | 0xffff_fff0;
            u64::from(h)
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 = self.0.wrapping_mul(31).wrapping_add(u64::from(*b));
            }
        }
    }

    /// Inserts and removes keys in a scrambled order against a model, with
    /// colliding hashes, checking every key after every step.
    #[test]
    fn matches_a_model_under_collisions_and_wrapping() {
        let mut slab = Slab::new();
        let mut index = KeyIndex::new(Colliding);
        let mut model = std::collections::HashMap::new();
        let mut state = 7u64;
        for step in 0..3000u32 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let key = (state >> 33) % 200;
            match index.entry(&key, &slab) {
                Ok(at) => {
                    assert_eq!(model.get(&key), Some(&at), "step {step}");
                    if state & 1 == 0 {
                        index.remove(&key, at);
                        slab.remove(at);
                        model.remove(&key);
                    }
                }
                Err(vacant) => {
                    assert!(!model.contains_key(&key), "step {step}: {key} lost");
                    let at = slab.insert(E(key));
                    vacant.insert(at);
                    model.insert(key, at);
                }
            }
            for k in 0..200u64 {
                assert_eq!(index.find(&k, &slab), model.get(&k).copied(), "step {step}, key {k}");
            }
        }
        index.retain(|at| slab.get(at).0 % 2 == 0);
        for k in 0..200u64 {
            let expected = model.get(&k).copied().filter(|_| k % 2 == 0);
            assert_eq!(index.find(&k, &slab), expected);
        }
    }
}
