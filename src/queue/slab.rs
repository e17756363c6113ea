//! The queue's per-key entries, stored by index (see `state.rs`).
//!
//! Keys live in a [`Slab`]: a vector of entries addressed by `u32` index,
//! with a free list. The ready FIFO holds these indices, so handing a key
//! out reads its entry by index, walking the vector in the order keys were
//! added instead of probing a hash table at random (on a deep backlog, the
//! probe was a cache miss per `get`). [`KeyIndex`] finds a key's entry by
//! hash; it holds only the index and 32 bits of the hash per key (8 bytes),
//! so the part of the queue that is probed at random is small.
//!
//! A slab only grows while keys arrive; once it is mostly free,
//! [`Slab::compact`] moves the live entries to the front and returns the
//! old-to-new index map, which the owner applies to every index it holds.

use std::hash::{BuildHasher, Hash};

use hashbrown::HashTable;

/// Slabs (and index tables) this long are compacted once they fall to an
/// eighth full, so a burst of keys does not pin its memory forever. Unit
/// tests compact early, so the queue's own tests compact often.
const COMPACT_ABOVE: usize = if cfg!(test) { 16 } else { 1024 };

/// An index no live entry has: what [`Slab::compact`] maps a free index to.
pub(crate) const FREED: u32 = u32::MAX;

pub(crate) struct Slab<T> {
    entries: Vec<Option<T>>,
    /// Free indices below `entries.len()`, reused last-freed first.
    free: Vec<u32>,
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Self { entries: Vec::new(), free: Vec::new() }
    }

    /// Stores `value`; returns its index.
    #[inline]
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        match self.free.pop() {
            Some(index) => {
                self.entries[index as usize] = Some(value);
                index
            }
            None => {
                let index = u32::try_from(self.entries.len()).expect("fewer than 2^32 - 1 keys in one queue");
                assert!(index != FREED, "fewer than 2^32 - 1 keys in one queue");
                self.entries.push(Some(value));
                index
            }
        }
    }

    /// Takes the entry at `index` out.
    ///
    /// # Panics
    /// If `index` is free: every index the queue holds is live.
    #[inline]
    pub(crate) fn remove(&mut self, index: u32) -> T {
        let value = self.entries[index as usize].take().expect("a held index is live");
        self.free.push(index);
        value
    }

    #[inline]
    pub(crate) fn get(&self, index: u32) -> &T {
        self.entries[index as usize].as_ref().expect("a held index is live")
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, index: u32) -> &mut T {
        self.entries[index as usize].as_mut().expect("a held index is live")
    }

    /// Live entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// Every live entry with its index.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.entries.iter_mut().enumerate().filter_map(|(i, e)| Some((i as u32, e.as_mut()?)))
    }

    /// Whether the slab is long and mostly free.
    #[inline]
    pub(crate) fn is_sparse(&self) -> bool {
        self.entries.len() > COMPACT_ABOVE && self.len() * 8 < self.entries.len()
    }

    /// Moves the live entries to the front (keeping their order) and frees
    /// the memory behind them. Returns, for each old index, its new one
    /// ([`FREED`] for a free index): every index held elsewhere must be
    /// mapped through it.
    pub(crate) fn compact(&mut self) -> Vec<u32> {
        let mut remap = vec![FREED; self.entries.len()];
        let mut next = 0;
        for (old, entry) in self.entries.iter().enumerate() {
            if entry.is_some() {
                remap[old] = next;
                next += 1;
            }
        }
        self.entries.retain(Option::is_some);
        self.entries.shrink_to(self.entries.len() * 2);
        self.free = Vec::new();
        remap
    }
}

/// An entry that knows its key.
pub(crate) trait Keyed<K> {
    fn key(&self) -> &K;
}

/// Finds a key's index in a [`Slab`] by hash.
///
/// Each bucket keeps the index and 32 bits of the key's hash, so probing
/// compares hashes without reading the slab, and growing the table rehashes
/// without reading it either (from the stored bits: see [`wide`]).
pub(crate) struct KeyIndex<S> {
    table: HashTable<Bucket>,
    hasher: S,
}

#[derive(Clone, Copy)]
struct Bucket {
    index: u32,
    hash: u32,
}

/// The 64-bit hash the table works with, rebuilt from the 32 stored bits:
/// the table takes a bucket from the low bits and a tag from the top seven,
/// so both come from the key's hash.
#[inline]
fn wide(hash: u32) -> u64 {
    (u64::from(hash) << 32) | u64::from(hash)
}

/// A key the index does not hold yet, and where it goes.
pub(crate) struct Vacant<'a> {
    entry: hashbrown::hash_table::VacantEntry<'a, Bucket>,
    hash: u32,
}

impl Vacant<'_> {
    /// Records the key at slab index `index`.
    #[inline]
    pub(crate) fn insert(self, index: u32) {
        self.entry.insert(Bucket { index, hash: self.hash });
    }
}

impl<S: BuildHasher> KeyIndex<S> {
    pub(crate) fn new(hasher: S) -> Self {
        Self { table: HashTable::new(), hasher }
    }

    #[inline]
    fn hash<K: Hash>(&self, key: &K) -> u32 {
        let hash = self.hasher.hash_one(key);
        (hash ^ (hash >> 32)) as u32
    }

    /// The index of `key`'s entry in `slab`.
    #[inline]
    pub(crate) fn find<K: Eq + Hash, T: Keyed<K>>(&self, key: &K, slab: &Slab<T>) -> Option<u32> {
        let hash = self.hash(key);
        self.table.find(wide(hash), |b| b.hash == hash && slab.get(b.index).key() == key).map(|b| b.index)
    }

    /// The index of `key`'s entry, or where to record it.
    #[inline]
    pub(crate) fn entry<K: Eq + Hash, T: Keyed<K>>(&mut self, key: &K, slab: &Slab<T>) -> Result<u32, Vacant<'_>> {
        let hash = self.hash(key);
        let eq = |b: &Bucket| b.hash == hash && slab.get(b.index).key() == key;
        match self.table.entry(wide(hash), eq, |b| wide(b.hash)) {
            hashbrown::hash_table::Entry::Occupied(o) => Ok(o.get().index),
            hashbrown::hash_table::Entry::Vacant(entry) => Err(Vacant { entry, hash }),
        }
    }

    /// Forgets `key` (whose entry is at `index`), shrinking a table that
    /// fell to an eighth full.
    #[inline]
    pub(crate) fn remove<K: Hash>(&mut self, key: &K, index: u32) {
        let hash = self.hash(key);
        if let Ok(entry) = self.table.find_entry(wide(hash), |b| b.index == index) {
            entry.remove();
        }
        if self.table.capacity() > COMPACT_ABOVE && self.table.len() * 8 < self.table.capacity() {
            self.table.shrink_to(self.table.len() * 2, |b| wide(b.hash));
        }
    }

    /// Keeps the keys whose index `keep` says to keep.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u32) -> bool) {
        self.table.retain(|b| keep(b.index));
    }

    /// Maps every index through `remap` (from [`Slab::compact`]).
    pub(crate) fn remap(&mut self, remap: &[u32]) {
        for bucket in self.table.iter_mut() {
            bucket.index = remap[bucket.index as usize];
            debug_assert!(bucket.index != FREED, "the index holds live entries only");
        }
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
}
