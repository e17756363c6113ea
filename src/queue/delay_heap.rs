//! The min-heap of due times behind `add_after`.
//!
//! Entries are never removed from the middle of the heap. Instead each waiting
//! key records the [`Timer`] (due time + sequence number) of its one live
//! entry; an entry whose timer no longer matches its key's record is stale and
//! is skipped when it reaches the top. That makes "earliest due time wins" and
//! "a plain add cancels the delay" O(log n) and O(1) without scanning. Stale
//! entries are compacted away once they outnumber live ones, so repeated
//! re-scheduling cannot grow the heap without bound.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Instant;

/// One scheduled due time. The sequence number makes every timer unique and
/// gives keys with equal due times first-in first-out order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timer {
    pub(crate) due: Instant,
    seq: u64,
}

impl Timer {
    fn order(&self) -> (Instant, u64) {
        (self.due, self.seq)
    }
}

struct Entry<K> {
    timer: Timer,
    key: K,
}

// `BinaryHeap` is a max-heap: order entries in reverse so the earliest timer
// is on top. Keys take no part in the order, so `K` needs no `Ord`.
impl<K> Ord for Entry<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        other.timer.order().cmp(&self.timer.order())
    }
}

impl<K> PartialOrd for Entry<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> PartialEq for Entry<K> {
    fn eq(&self, other: &Self) -> bool {
        self.timer == other.timer
    }
}

impl<K> Eq for Entry<K> {}

/// Stale entries tolerated before a compaction is worth its O(n) pass.
pub(crate) const COMPACT_SLACK: usize = 64;

pub(crate) struct DelayHeap<K> {
    heap: BinaryHeap<Entry<K>>,
    next_seq: u64,
}

impl<K> DelayHeap<K> {
    pub(crate) fn new() -> Self {
        Self { heap: BinaryHeap::new(), next_seq: 0 }
    }

    /// Schedules `key` at `due` and returns the timer the key must record for
    /// the entry to count as live.
    pub(crate) fn schedule(&mut self, key: K, due: Instant) -> Timer {
        let timer = Timer { due, seq: self.next_seq };
        self.next_seq += 1;
        self.heap.push(Entry { timer, key });
        timer
    }

    /// The earliest live timer, dropping stale entries found on top.
    pub(crate) fn peek_live(&mut self, is_live: impl Fn(&K, Timer) -> bool) -> Option<Timer> {
        while let Some(top) = self.heap.peek() {
            if is_live(&top.key, top.timer) {
                return Some(top.timer);
            }
            self.heap.pop();
        }
        None
    }

    /// Pops the earliest entry if it is due at `now` (live or not: the caller
    /// checks and ignores stale ones).
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(K, Timer)> {
        if self.heap.peek()?.timer.due > now {
            return None;
        }
        self.heap.pop().map(|e| (e.key, e.timer))
    }

    /// Drops stale entries when they outnumber the `live` ones.
    pub(crate) fn compact_if_sparse(&mut self, live: usize, is_live: impl Fn(&K, Timer) -> bool) {
        if self.heap.len() > 2 * live + COMPACT_SLACK {
            self.heap.retain(|e| is_live(&e.key, e.timer));
            if self.heap.capacity() > 4 * self.heap.len() + COMPACT_SLACK {
                self.heap.shrink_to_fit();
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.heap = BinaryHeap::new();
    }
}
