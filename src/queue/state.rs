//! The queue's state machine: single-threaded, no locks, no clock.
//!
//! [`WorkQueue`](super::WorkQueue) wraps one `QueueState` in a mutex and adds
//! blocking and wake-ups; everything about *which* key goes where lives here,
//! so it can be tested against a model without threads.
//!
//! Each known key has exactly one [`Slot`], which replaces client-go's
//! separate dirty set, processing set and waiting map: one hash lookup per
//! operation instead of two or three, and the invariants are checked by the
//! type instead of by convention:
//!
//! * a key is in the ready FIFO exactly when its slot is `Ready`;
//! * a key has a live delay-heap entry exactly when its slot holds a `Timer`;
//! * a `Processing` key is never in the FIFO (G2), and what happens to it at
//!   `done` (nothing, ready again, or wait for a due time) is in its slot (G3).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Instant;

use super::delay_heap::{DelayHeap, Timer};

type Hasher = foldhash::fast::RandomState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// In the ready FIFO. `owed` marks a key re-queued by `done` during a
    /// drain: the drain waits for it to be processed too.
    Ready { owed: bool },
    /// Waiting in the delay heap.
    Delayed(Timer),
    /// Handed out to a worker; `then` is what `done` does with it.
    Processing(Then),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Forget the key.
    Finish,
    /// It was added while processing (dirty): ready again.
    Requeue,
    /// It was added with a delay while processing: wait for the timer.
    Wait(Timer),
}

/// What an add did, so the caller knows whether to wake a getter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Added {
    /// The key joined the ready FIFO.
    Ready,
    /// The key got a (new, earlier) due time.
    Scheduled(Instant),
    /// Nothing observable changed: a duplicate, a later due time, a key
    /// marked to run again after `done`, or the queue is shutting down.
    Unchanged,
}

/// What `done` did with the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finished {
    /// The key left the queue.
    Removed,
    /// The key was dirty and joined the ready FIFO.
    Requeued,
    /// The key waits for its due time.
    Waiting(Instant),
    /// The key was not being processed: nothing happened.
    NotProcessing,
}

/// Where a key stands in the queue, for introspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// The queue does not know the key.
    Absent,
    /// Waiting in the ready FIFO.
    Ready,
    /// Waiting for its due time.
    Waiting { due: Instant },
    /// Handed out and not yet done. `again` tells what happens at `done`:
    /// `Some(None)` ready again, `Some(Some(due))` wait for `due`, `None`
    /// nothing.
    Processing { again: Option<Option<Instant>> },
}

pub(crate) struct QueueState<K> {
    slots: HashMap<K, Slot, Hasher>,
    ready: VecDeque<K>,
    delays: DelayHeap<K>,
    /// Number of slots holding a live timer (`Delayed` or `Processing(Wait)`).
    timers: usize,
    /// Number of `Delayed` slots (the public "waiting" count).
    delayed: usize,
    processing: usize,
    /// Number of `Ready { owed: true }` slots.
    owed: usize,
    shutting_down: bool,
    draining: bool,
}

/// Containers this large are shrunk once they fall to an eighth full, so a
/// burst of keys does not pin its memory forever.
const SHRINK_ABOVE: usize = 1024;

impl<K: Eq + Hash + Clone> QueueState<K> {
    pub(crate) fn new() -> Self {
        Self {
            slots: HashMap::with_hasher(Hasher::default()),
            ready: VecDeque::new(),
            delays: DelayHeap::new(),
            timers: 0,
            delayed: 0,
            processing: 0,
            owed: 0,
            shutting_down: false,
            draining: false,
        }
    }

    /// Marks `key` as needing processing now (G1, G2, G5's "add cancels the
    /// delay").
    pub(crate) fn add(&mut self, key: K) -> Added {
        if self.shutting_down {
            return Added::Unchanged;
        }
        // One hash lookup whatever the key's state.
        match self.slots.entry(key) {
            Entry::Vacant(vacant) => {
                self.ready.push_back(vacant.key().clone());
                vacant.insert(Slot::Ready { owed: false });
                Added::Ready
            }
            Entry::Occupied(mut occupied) => match *occupied.get() {
                Slot::Delayed(_) => {
                    occupied.insert(Slot::Ready { owed: false });
                    self.timers -= 1;
                    self.delayed -= 1;
                    self.ready.push_back(occupied.key().clone());
                    Added::Ready
                }
                Slot::Processing(then) => {
                    if let Then::Wait(_) = then {
                        self.timers -= 1;
                    }
                    occupied.insert(Slot::Processing(Then::Requeue));
                    Added::Unchanged
                }
                Slot::Ready { .. } => Added::Unchanged,
            },
        }
    }

    /// Marks `key` as needing processing at `due` (G5): the earliest due time
    /// wins, and a key that is already ready (or will be, after `done`) is
    /// left as it is. A due time not after `now` is a plain [`add`](Self::add).
    pub(crate) fn add_at(&mut self, key: K, due: Instant, now: Instant) -> Added {
        if due <= now {
            return self.add(key);
        }
        if self.shutting_down {
            return Added::Unchanged;
        }
        let earlier = |timer: &Timer| due < timer.due;
        match self.slots.get(&key).copied() {
            None => {
                let timer = self.delays.schedule(key.clone(), due);
                self.slots.insert(key, Slot::Delayed(timer));
                self.timers += 1;
                self.delayed += 1;
            }
            Some(Slot::Delayed(old)) if earlier(&old) => {
                let timer = self.delays.schedule(key.clone(), due);
                self.slots.insert(key, Slot::Delayed(timer));
            }
            Some(Slot::Processing(Then::Finish)) => {
                let timer = self.delays.schedule(key.clone(), due);
                self.slots.insert(key, Slot::Processing(Then::Wait(timer)));
                self.timers += 1;
            }
            Some(Slot::Processing(Then::Wait(old))) if earlier(&old) => {
                let timer = self.delays.schedule(key.clone(), due);
                self.slots.insert(key, Slot::Processing(Then::Wait(timer)));
            }
            Some(_) => return Added::Unchanged,
        }
        self.compact_delays();
        Added::Scheduled(due)
    }

    /// Moves every key whose due time has come into the ready FIFO (or marks
    /// it dirty if it is being processed). Returns how many became ready.
    pub(crate) fn promote_due(&mut self, now: Instant) -> usize {
        let mut promoted = 0;
        while let Some((key, timer)) = self.delays.pop_due(now) {
            let Some(slot) = self.slots.get_mut(&key) else { continue };
            match *slot {
                Slot::Delayed(live) if live == timer => {
                    *slot = Slot::Ready { owed: false };
                    self.timers -= 1;
                    self.delayed -= 1;
                    self.ready.push_back(key);
                    promoted += 1;
                }
                Slot::Processing(Then::Wait(live)) if live == timer => {
                    *slot = Slot::Processing(Then::Requeue);
                    self.timers -= 1;
                }
                _ => {} // stale entry
            }
        }
        promoted
    }

    /// The earliest live due time, if any key waits for one.
    pub(crate) fn next_due(&mut self) -> Option<Instant> {
        if self.timers == 0 {
            if !self.delays.is_empty() {
                self.delays.clear();
            }
            return None;
        }
        let slots = &self.slots;
        self.delays.peek_live(|key, timer| is_live(slots, key, timer)).map(|t| t.due)
    }

    /// Hands out the oldest ready key (G4) and marks it processing (G2).
    pub(crate) fn take(&mut self) -> Option<K> {
        let key = self.ready.pop_front()?;
        let slot = self.slots.get_mut(&key).expect("every ready key has a slot");
        if let Slot::Ready { owed: true } = slot {
            self.owed -= 1;
        }
        *slot = Slot::Processing(Then::Finish);
        self.processing += 1;
        shrink_if_sparse(&mut self.ready);
        Some(key)
    }

    /// Ends the processing of `key`. `now` is asked only when the key waits
    /// for a due time, to tell whether that time has already come.
    pub(crate) fn done(&mut self, key: &K, now: impl FnOnce() -> Instant) -> Finished {
        // Remove first: the common case (nothing more to do) then costs one
        // hash lookup; the rarer cases put the key back.
        let Some((key, slot)) = self.slots.remove_entry(key) else {
            return Finished::NotProcessing;
        };
        let Slot::Processing(then) = slot else {
            self.slots.insert(key, slot);
            return Finished::NotProcessing;
        };
        self.processing -= 1;
        match then {
            Then::Finish => {
                if self.slots.capacity() > SHRINK_ABOVE && self.slots.len() * 8 < self.slots.capacity() {
                    self.slots.shrink_to(self.slots.len() * 2);
                }
                Finished::Removed
            }
            Then::Wait(timer) if timer.due > now() => {
                self.slots.insert(key, Slot::Delayed(timer));
                self.delayed += 1;
                Finished::Waiting(timer.due)
            }
            Then::Wait(_) | Then::Requeue => {
                if let Then::Wait(_) = then {
                    self.timers -= 1;
                }
                let owed = self.draining;
                self.owed += usize::from(owed);
                self.ready.push_back(key.clone());
                self.slots.insert(key, Slot::Ready { owed });
                Finished::Requeued
            }
        }
    }

    /// Stops accepting adds and drops every pending due time (G7). With
    /// `drain`, [`drained`](Self::drained) tells when the drain is over.
    pub(crate) fn shut_down(&mut self, drain: bool) {
        self.shutting_down = true;
        self.draining = drain;
        if self.timers == 0 {
            return;
        }
        self.slots.retain(|_, slot| match slot {
            Slot::Delayed(_) => false,
            Slot::Processing(then @ Then::Wait(_)) => {
                *then = Then::Finish;
                true
            }
            _ => true,
        });
        self.delays.clear();
        self.timers = 0;
        self.delayed = 0;
    }

    /// Drops every ready key as well (an immediate stop). Keys being processed
    /// are untouched; `done` will finish them without re-queueing.
    pub(crate) fn discard_ready(&mut self) {
        for key in self.ready.drain(..) {
            self.slots.remove(&key);
        }
        for slot in self.slots.values_mut() {
            if let Slot::Processing(then) = slot {
                *then = Then::Finish;
            }
        }
        self.owed = 0;
        self.ready.shrink_to_fit();
    }

    /// Whether a drain has nothing left to wait for: no key is being
    /// processed, and no key re-queued during the drain is still pending.
    pub(crate) fn drained(&self) -> bool {
        self.processing == 0 && self.owed == 0
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining
    }

    pub(crate) fn key_state(&self, key: &K) -> KeyState {
        match self.slots.get(key) {
            None => KeyState::Absent,
            Some(Slot::Ready { .. }) => KeyState::Ready,
            Some(Slot::Delayed(timer)) => KeyState::Waiting { due: timer.due },
            Some(Slot::Processing(then)) => KeyState::Processing {
                again: match then {
                    Then::Finish => None,
                    Then::Requeue => Some(None),
                    Then::Wait(timer) => Some(Some(timer.due)),
                },
            },
        }
    }

    /// Nothing ready, processing or waiting for a due time.
    pub(crate) fn is_idle(&self) -> bool {
        self.ready.is_empty() && self.processing == 0 && self.timers == 0
    }

    /// Whether any key waits for a due time (a cheap check before asking the
    /// clock).
    pub(crate) fn has_timers(&self) -> bool {
        self.timers > 0
    }

    /// Number of ready keys.
    pub(crate) fn len(&self) -> usize {
        self.ready.len()
    }

    pub(crate) fn processing_len(&self) -> usize {
        self.processing
    }

    /// Number of keys waiting for a due time (not counting keys being
    /// processed that will wait after `done`).
    pub(crate) fn delayed_len(&self) -> usize {
        self.delayed
    }

    fn compact_delays(&mut self) {
        let slots = &self.slots;
        self.delays.compact_if_sparse(self.timers, |key, timer| is_live(slots, key, timer));
    }
}

fn is_live<K: Eq + Hash>(slots: &HashMap<K, Slot, Hasher>, key: &K, timer: Timer) -> bool {
    matches!(slots.get(key), Some(Slot::Delayed(t) | Slot::Processing(Then::Wait(t))) if *t == timer)
}

fn shrink_if_sparse<T>(deque: &mut VecDeque<T>) {
    if deque.capacity() > SHRINK_ABOVE && deque.len() * 8 < deque.capacity() {
        deque.shrink_to(deque.len() * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::delay_heap::COMPACT_SLACK;
    use std::time::Duration;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn dirty_key_returns_only_after_done() {
        let mut q = QueueState::new();
        assert_eq!(q.add("a"), Added::Ready);
        assert_eq!(q.take(), Some("a"));
        assert_eq!(q.add("a"), Added::Unchanged);
        assert_eq!(q.take(), None, "a is processing: not handed out twice");
        let t0 = Instant::now();
        assert_eq!(q.done(&"a", || t0), Finished::Requeued);
        assert_eq!(q.take(), Some("a"));
        assert_eq!(q.done(&"a", || t0), Finished::Removed);
        assert_eq!(q.done(&"a", || t0), Finished::NotProcessing);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn delayed_while_processing_waits_after_done() {
        let mut q = QueueState::new();
        let t0 = Instant::now();
        q.add("a");
        q.take();
        assert_eq!(q.add_at("a", t0 + ms(10), t0), Added::Scheduled(t0 + ms(10)));
        assert_eq!(q.done(&"a", || t0), Finished::Waiting(t0 + ms(10)));
        assert_eq!(q.delayed_len(), 1);
        assert_eq!(q.promote_due(t0 + ms(10)), 1);
        assert_eq!(q.take(), Some("a"));
    }

    #[test]
    fn stale_heap_entries_are_compacted() {
        let mut q = QueueState::new();
        let t0 = Instant::now();
        for i in 0..10_000u64 {
            // Each earlier due time leaves the previous entry stale.
            q.add_at("a", t0 + Duration::from_secs(1_000_000 - i), t0);
        }
        assert!(q.delays.len() <= 2 * q.timers + COMPACT_SLACK + 1);
        assert_eq!(q.next_due(), Some(t0 + Duration::from_secs(1_000_000 - 9_999)));
    }
}
