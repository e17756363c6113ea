//! The queue's per-key entries, stored by index (see `state.rs`).
//!
//! Keys live in a [`Slab`]: a vector of entries addressed by `u32` index,
//! with a free list. The ready FIFO holds these indices, so handing a key
//! out reads its entry by index, walking the vector in the order keys were
//! added instead of probing a hash table at random (on a deep backlog, the
//! probe was a cache miss per `get`). `key_index.rs` finds a key's entry
//! by hash.
//!
//! A slab only grows while keys arrive; once it is mostly free,
//! [`Slab::compact`] moves the live entries to the front and returns the
//! old-to-new index map, which the owner applies to every index it holds.

use std::collections::VecDeque;

use crate::shrink::is_sparse;

/// An index no live entry has: what [`Slab::compact`] maps a free index to.
pub(crate) const FREED: u32 = u32::MAX;

pub(crate) struct Slab<T> {
    entries: Vec<Option<T>>,
    /// Free indices below `entries.len()`, reused first-freed first: keys
    /// leave about in the order they came, so new keys get indices in about
    /// the order of the old ones, and the ready FIFO keeps walking the slab
    /// forward (the CPU's prefetcher follows that; last-freed-first reuse
    /// scattered it).
    free: VecDeque<u32>,
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Self { entries: Vec::new(), free: VecDeque::new() }
    }

    /// Stores `value`; returns its index.
    #[inline]
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        match self.free.pop_front() {
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
        self.free.push_back(index);
        value
    }

    #[inline]
    pub(crate) fn get(&self, index: u32) -> &T {
        self.entries[index as usize].as_ref().expect("a held index is live")
    }

    /// The entry at `index` if it is live (any `index`: even [`FREED`]).
    #[inline]
    pub(crate) fn get_live(&self, index: u32) -> Option<&T> {
        self.entries.get(index as usize)?.as_ref()
    }

    /// Asks the CPU to start loading the entry at `index` (any index).
    #[inline]
    pub(crate) fn prefetch(&self, index: u32) {
        if let Some(entry) = self.entries.get(index as usize) {
            prefetch(entry);
        }
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, index: u32) -> &mut T {
        self.entries[index as usize].as_mut().expect("a held index is live")
    }

    /// Live entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// Every live entry.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding hands keys over
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().flatten()
    }

    /// Every live entry with its index.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut T)> {
        self.entries.iter_mut().enumerate().filter_map(|(i, e)| Some((i as u32, e.as_mut()?)))
    }

    /// Whether the slab is long and mostly free (`crate::shrink`), so a
    /// burst of keys does not pin its memory forever.
    #[inline]
    pub(crate) fn is_sparse(&self) -> bool {
        is_sparse(self.len(), self.entries.len())
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
        self.free = VecDeque::new();
        remap
    }
}

/// Asks the CPU to start loading the cache line at `address`: a hint with
/// no effect the program can see. Any address will do (a stale one just
/// wastes the hint): a prefetch never faults and reads nothing.
#[inline(always)]
pub(crate) fn prefetch<T>(address: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` only hints the cache; it never dereferences
    // `address` in a way the program can observe, nor faults on it.
    unsafe {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(address.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// An entry that knows its key.
pub(crate) trait Keyed<K> {
    fn key(&self) -> &K;
}
