//! The map a cache keeps its entries in: the entries packed in chunks of
//! a fixed size, found through a hash table of their places (`u32`s).
//!
//! Why not a `HashMap`: a cache holds millions of keys, and a hash table
//! is between 44% and 88% full (it doubles past 7/8), so each key pays
//! for 1.1 to 2.3 slots of the key and its entry (48 bytes and a control
//! byte for a Python cache: up to 112 bytes a key, 103 at a million keys).
//! Here a key pays for its entry once (the chunks grow one at a time, so
//! at most one chunk is unused) and for 1.1 to 2.3 slots of 5 bytes: 54
//! to 60 bytes. docs/sources.md, "What a key costs".
//!
//! A removal moves the last entry into the hole (one more hash of a key),
//! so entries stay packed and a removal stays O(1); the order of the
//! entries is therefore no order at all, as a `HashMap`'s.

use std::hash::{BuildHasher, Hash};

use hashbrown::HashTable;

use super::contents::Hasher;

/// Entries a chunk holds (a power of two: a place splits with a shift
/// and a mask). 1,024 Python entries are 48 KiB: small enough that the
/// unused part of the last chunk is nothing beside a million keys, large
/// enough that the list of chunks stays in cache.
const CHUNK_BITS: u32 = 10;
const CHUNK: usize = 1 << CHUNK_BITS;

pub(super) struct DenseMap<K, V> {
    /// Invariant: `table` holds exactly the places `0..len`, each once,
    /// and the place `i` holds the entry at `chunks[i / CHUNK][i % CHUNK]`,
    /// found under the hash of its key.
    table: HashTable<u32>,
    /// Every chunk has a capacity of `CHUNK` and is full but the last one
    /// holding an entry; at most one empty chunk follows it (kept, so
    /// puts and deletes that alternate at a chunk's edge do not allocate
    /// and free it each time).
    chunks: Vec<Vec<(K, V)>>,
    len: usize,
    hasher: Hasher,
}

impl<K, V> Default for DenseMap<K, V> {
    fn default() -> Self {
        Self { table: HashTable::new(), chunks: Vec::new(), len: 0, hasher: Hasher::default() }
    }
}

/// The chunk and the place in it of the entry at `place`.
fn split(place: usize) -> (usize, usize) {
    (place >> CHUNK_BITS, place & (CHUNK - 1))
}

/// `place` as the table keeps it; a cache holds fewer than 2^32 keys.
fn narrow(place: usize) -> u32 {
    u32::try_from(place).expect("a cache holds fewer than 2^32 keys")
}

impl<K: Eq + Hash, V> DenseMap<K, V> {
    pub(super) fn with_capacity(capacity: usize) -> Self {
        let mut map = Self::default();
        map.reserve(capacity);
        map
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Room for `additional` more keys without growing the table (the
    /// chunks are allocated as they fill).
    pub(super) fn reserve(&mut self, additional: usize) {
        let Self { table, chunks, hasher, .. } = self;
        table.reserve(additional, |&place| hash_at(chunks, hasher, place));
        self.chunks.reserve((self.len + additional).div_ceil(CHUNK).saturating_sub(self.chunks.len()));
    }

    pub(super) fn get(&self, key: &K) -> Option<&V> {
        let place = self.place(key)?;
        Some(&self.entry(place).1)
    }

    pub(super) fn contains_key(&self, key: &K) -> bool {
        self.place(key).is_some()
    }

    /// Holds `value` under `key`; the value it held before, if any.
    pub(super) fn insert(&mut self, key: K, value: V) -> Option<V> {
        let hash = self.hasher.hash_one(&key);
        let Self { table, chunks, hasher, len } = self;
        if let Some(&place) = table.find(hash, |&place| entry_at(chunks, place).0 == key) {
            let (chunk, offset) = split(place as usize);
            return Some(std::mem::replace(&mut chunks[chunk][offset].1, value));
        }
        let place = narrow(*len);
        table.insert_unique(hash, place, |&place| hash_at(chunks, hasher, place));
        let (chunk, _) = split(*len);
        if chunk == chunks.len() {
            chunks.push(Vec::with_capacity(CHUNK));
        }
        chunks[chunk].push((key, value));
        *len += 1;
        None
    }

    /// Takes `key` out; its value if it was held. The last entry moves
    /// into its place.
    pub(super) fn remove(&mut self, key: &K) -> Option<V> {
        let hash = self.hasher.hash_one(key);
        let Self { table, chunks, .. } = self;
        let found = table.find_entry(hash, |&place| entry_at(chunks, place).0 == *key).ok()?;
        let (place, _) = found.remove();
        Some(self.take(place as usize))
    }

    /// The entry at `place` (no longer in the table), with the last
    /// entry moved into its place and the table told so.
    fn take(&mut self, place: usize) -> V {
        let last_place = self.len - 1;
        let (chunk, _) = split(last_place);
        let last = self.chunks[chunk].pop().expect("the last chunk holds the last entry");
        self.len = last_place;
        self.chunks.truncate(self.len.div_ceil(CHUNK) + 1);
        if place == last_place {
            return last.1;
        }
        let hash = self.hasher.hash_one(&last.0);
        let moved = self.table.find_mut(hash, |&p| p as usize == last_place).expect("the last entry is in the table");
        *moved = narrow(place);
        let (chunk, offset) = split(place);
        std::mem::replace(&mut self.chunks[chunk][offset], last).1
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(key, _)| key)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.chunks.iter().flatten().map(|(key, value)| (key, value))
    }

    fn place(&self, key: &K) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        self.table.find(hash, |&place| self.entry(place).0 == *key).copied()
    }

    fn entry(&self, place: u32) -> &(K, V) {
        entry_at(&self.chunks, place)
    }
}

impl<K, V> IntoIterator for DenseMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::iter::Flatten<std::vec::IntoIter<Vec<(K, V)>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.chunks.into_iter().flatten()
    }
}

fn entry_at<K, V>(chunks: &[Vec<(K, V)>], place: u32) -> &(K, V) {
    let (chunk, offset) = split(place as usize);
    &chunks[chunk][offset]
}

fn hash_at<K: Hash, V>(chunks: &[Vec<(K, V)>], hasher: &Hasher, place: u32) -> u64 {
    hasher.hash_one(&entry_at(chunks, place).0)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Puts and removes across several chunks, checked against a
    /// `HashMap` after each step, in a pattern that removes the last
    /// entry, the first, and ones in between.
    #[test]
    fn holds_what_a_hash_map_holds_through_puts_and_removes() {
        let mut map = DenseMap::default();
        let mut expected = HashMap::new();
        let keys = 3 * CHUNK as u64 + 17;
        let check = |map: &DenseMap<u64, u64>, expected: &HashMap<u64, u64>| {
            assert_eq!(map.len(), expected.len());
            let mut held: Vec<(u64, u64)> = map.iter().map(|(k, v)| (*k, *v)).collect();
            held.sort_unstable();
            let mut want: Vec<(u64, u64)> = expected.iter().map(|(k, v)| (*k, *v)).collect();
            want.sort_unstable();
            assert_eq!(held, want);
            assert!(map.chunks.len() <= map.len().div_ceil(CHUNK) + 1, "at most one spare chunk");
        };
        for key in 0..keys {
            assert_eq!(map.insert(key, key * 10), None);
            expected.insert(key, key * 10);
        }
        check(&map, &expected);
        assert_eq!(map.insert(5, 7), Some(50), "a put of a held key replaces its value");
        expected.insert(5, 7);
        for key in (0..keys).rev().step_by(3).chain([0, keys / 2]) {
            assert_eq!(map.remove(&key), expected.remove(&key), "removing {key}");
            assert!(!map.contains_key(&key));
        }
        assert_eq!(map.remove(&keys), None, "a key never held");
        check(&map, &expected);
        for key in 0..keys {
            assert_eq!(map.get(&key), expected.get(&key), "{key}");
        }
        for key in 0..keys {
            assert_eq!(map.remove(&key), expected.remove(&key));
        }
        check(&map, &expected);
        assert!(map.is_empty());
        assert!(map.chunks.len() <= 1);
        map.insert(1, 1);
        assert_eq!(map.into_iter().collect::<Vec<_>>(), [(1, 1)]);
    }

    /// Puts and deletes alternating at a chunk's edge keep the spare
    /// chunk rather than allocating a new one each time.
    #[test]
    fn a_chunk_edge_keeps_its_spare() {
        let mut map = DenseMap::default();
        for key in 0..CHUNK {
            map.insert(key, ());
        }
        for _ in 0..3 {
            map.insert(CHUNK, ());
            let spare = map.chunks[1].as_ptr();
            map.remove(&CHUNK);
            assert_eq!(map.chunks.len(), 2);
            map.insert(CHUNK, ());
            assert_eq!(map.chunks[1].as_ptr(), spare);
            map.remove(&CHUNK);
        }
    }
}
