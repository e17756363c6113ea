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
//!
//! A named queue also records metrics here (see `metrics.rs`): a ready key's
//! slot keeps its add stamp, a processing key's slot the index of its start
//! stamp. An unnamed queue stores zeros there and never reads the clock.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::Instant;

use super::delay_heap::{DelayHeap, Timer};
use super::metrics::{Now, QueueSnapshot, Recorder};

type Hasher = foldhash::fast::RandomState;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// In the ready FIFO. `owed` marks a key re-queued by `done` during a
    /// drain: the drain waits for it to be processed too. `added` is the
    /// metrics' add stamp.
    Ready { owed: bool, added: u64 },
    /// Waiting in the delay heap.
    Delayed(Timer),
    /// Handed out to a worker; `then` is what `done` does with it, `run`
    /// where the metrics keep its start stamp.
    Processing { then: Then, run: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Forget the key.
    Finish,
    /// It was added while processing (dirty): ready again, keeping the add
    /// stamp of that add.
    Requeue { added: u64 },
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
    /// Number of `Processing { then: Requeue }` slots (dirty keys being
    /// processed: part of the metrics' depth).
    requeue_after_done: usize,
    recorder: Recorder,
    shutting_down: bool,
    draining: bool,
}

/// Containers this large are shrunk once they fall to an eighth full, so a
/// burst of keys does not pin its memory forever.
const SHRINK_ABOVE: usize = 1024;

impl<K: Eq + Hash + Clone> QueueState<K> {
    pub(crate) fn new(recorder: Recorder) -> Self {
        Self {
            slots: HashMap::with_hasher(Hasher::default()),
            ready: VecDeque::new(),
            delays: DelayHeap::new(),
            timers: 0,
            delayed: 0,
            processing: 0,
            owed: 0,
            requeue_after_done: 0,
            recorder,
            shutting_down: false,
            draining: false,
        }
    }

    /// Marks `key` as needing processing now (G1, G2, G5's "add cancels the
    /// delay").
    pub(crate) fn add(&mut self, key: K, now: &mut Now) -> Added {
        if self.shutting_down {
            return Added::Unchanged;
        }
        // One hash lookup whatever the key's state.
        match self.slots.entry(key) {
            Entry::Vacant(vacant) => {
                let added = self.recorder.on_add(now);
                self.ready.push_back(vacant.key().clone());
                vacant.insert(Slot::Ready { owed: false, added });
                Added::Ready
            }
            Entry::Occupied(mut occupied) => match *occupied.get() {
                Slot::Delayed(_) => {
                    let added = self.recorder.on_add(now);
                    occupied.insert(Slot::Ready { owed: false, added });
                    self.timers -= 1;
                    self.delayed -= 1;
                    self.ready.push_back(occupied.key().clone());
                    Added::Ready
                }
                Slot::Processing { then: Then::Requeue { .. }, .. } | Slot::Ready { .. } => Added::Unchanged,
                Slot::Processing { then, run } => {
                    if let Then::Wait(_) = then {
                        self.timers -= 1;
                    }
                    let added = self.recorder.on_add(now);
                    self.requeue_after_done += 1;
                    occupied.insert(Slot::Processing { then: Then::Requeue { added }, run });
                    Added::Unchanged
                }
            },
        }
    }

    /// Counts an `add_after`-style call for the metrics' retries (client-go
    /// counts every one made before shutdown).
    pub(crate) fn count_retry(&mut self) {
        if !self.shutting_down {
            self.recorder.on_retry();
        }
    }

    /// Marks `key` as needing processing at `due` (G5): the earliest due time
    /// wins, and a key that is already ready (or will be, after `done`) is
    /// left as it is. A due time not after `now` is a plain [`add`](Self::add).
    pub(crate) fn add_at(&mut self, key: K, due: Instant, now: Instant, stamp: &mut Now) -> Added {
        if due <= now {
            return self.add(key, stamp);
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
            Some(Slot::Processing { then: Then::Finish, run }) => {
                let timer = self.delays.schedule(key.clone(), due);
                self.slots.insert(key, Slot::Processing { then: Then::Wait(timer), run });
                self.timers += 1;
            }
            Some(Slot::Processing { then: Then::Wait(old), run }) if earlier(&old) => {
                let timer = self.delays.schedule(key.clone(), due);
                self.slots.insert(key, Slot::Processing { then: Then::Wait(timer), run });
            }
            Some(_) => return Added::Unchanged,
        }
        self.compact_delays();
        Added::Scheduled(due)
    }

    /// Moves every key whose due time has come into the ready FIFO (or marks
    /// it dirty if it is being processed). Returns how many became ready.
    /// Each counts as an add for the metrics, stamped now, as client-go's
    /// delaying queue adds a key when its time comes.
    pub(crate) fn promote_due(&mut self, now: Instant, stamp: &mut Now) -> usize {
        let mut promoted = 0;
        while let Some((key, timer)) = self.delays.pop_due(now) {
            let Some(slot) = self.slots.get_mut(&key) else { continue };
            match *slot {
                Slot::Delayed(live) if live == timer => {
                    *slot = Slot::Ready { owed: false, added: self.recorder.on_add(stamp) };
                    self.timers -= 1;
                    self.delayed -= 1;
                    self.ready.push_back(key);
                    promoted += 1;
                }
                Slot::Processing { then: Then::Wait(live), run } if live == timer => {
                    *slot = Slot::Processing { then: Then::Requeue { added: self.recorder.on_add(stamp) }, run };
                    self.requeue_after_done += 1;
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
    pub(crate) fn take(&mut self, now: &mut Now) -> Option<K> {
        let key = self.ready.pop_front()?;
        let slot = self.slots.get_mut(&key).expect("every ready key has a slot");
        let Slot::Ready { owed, added } = *slot else { unreachable!("a key in the ready FIFO has a Ready slot") };
        if owed {
            self.owed -= 1;
        }
        let run = self.recorder.on_get(added, now);
        *slot = Slot::Processing { then: Then::Finish, run };
        self.processing += 1;
        shrink_if_sparse(&mut self.ready);
        Some(key)
    }

    /// Ends the processing of `key`. `now` is asked only when the key waits
    /// for a due time, to tell whether that time has already come.
    pub(crate) fn done(&mut self, key: &K, now: impl FnOnce() -> Instant, stamp: &mut Now) -> Finished {
        // Remove first: the common case (nothing more to do) then costs one
        // hash lookup; the rarer cases put the key back.
        let Some((key, slot)) = self.slots.remove_entry(key) else {
            return Finished::NotProcessing;
        };
        let Slot::Processing { then, run } = slot else {
            self.slots.insert(key, slot);
            return Finished::NotProcessing;
        };
        self.processing -= 1;
        self.recorder.on_done(run, stamp);
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
            Then::Wait(_) | Then::Requeue { .. } => {
                let added = match then {
                    Then::Requeue { added } => {
                        self.requeue_after_done -= 1;
                        added
                    }
                    // Due while processing (not promoted yet): an add now.
                    _ => {
                        self.timers -= 1;
                        self.recorder.on_add(stamp)
                    }
                };
                let owed = self.draining;
                self.owed += usize::from(owed);
                self.ready.push_back(key.clone());
                self.slots.insert(key, Slot::Ready { owed, added });
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
            Slot::Processing { then: then @ Then::Wait(_), .. } => {
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
        self.recorder.on_discard(self.ready.len() + self.requeue_after_done);
        for key in self.ready.drain(..) {
            self.slots.remove(&key);
        }
        for slot in self.slots.values_mut() {
            if let Slot::Processing { then, .. } = slot {
                *then = Then::Finish;
            }
        }
        self.owed = 0;
        self.requeue_after_done = 0;
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
            Some(Slot::Processing { then, .. }) => KeyState::Processing {
                again: match then {
                    Then::Finish => None,
                    Then::Requeue { .. } => Some(None),
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

    /// The metrics of a named queue (`None` for an unnamed one).
    pub(crate) fn metrics_snapshot(&self) -> Option<QueueSnapshot> {
        self.recorder.snapshot(self.ready.len() + self.requeue_after_done)
    }

    fn compact_delays(&mut self) {
        let slots = &self.slots;
        self.delays.compact_if_sparse(self.timers, |key, timer| is_live(slots, key, timer));
    }
}

fn is_live<K: Eq + Hash>(slots: &HashMap<K, Slot, Hasher>, key: &K, timer: Timer) -> bool {
    matches!(slots.get(key), Some(Slot::Delayed(t) | Slot::Processing { then: Then::Wait(t), .. }) if *t == timer)
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

    /// A fresh clock reading per call (each test call is its own operation).
    fn n() -> &'static mut Now {
        Box::leak(Box::new(Now::new()))
    }

    #[test]
    fn dirty_key_returns_only_after_done() {
        let mut q = QueueState::new(Recorder::off());
        assert_eq!(q.add("a", n()), Added::Ready);
        assert_eq!(q.take(n()), Some("a"));
        assert_eq!(q.add("a", n()), Added::Unchanged);
        assert_eq!(q.take(n()), None, "a is processing: not handed out twice");
        let t0 = Instant::now();
        assert_eq!(q.done(&"a", || t0, n()), Finished::Requeued);
        assert_eq!(q.take(n()), Some("a"));
        assert_eq!(q.done(&"a", || t0, n()), Finished::Removed);
        assert_eq!(q.done(&"a", || t0, n()), Finished::NotProcessing);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn delayed_while_processing_waits_after_done() {
        let mut q = QueueState::new(Recorder::off());
        let t0 = Instant::now();
        q.add("a", n());
        q.take(n());
        assert_eq!(q.add_at("a", t0 + ms(10), t0, n()), Added::Scheduled(t0 + ms(10)));
        assert_eq!(q.done(&"a", || t0, n()), Finished::Waiting(t0 + ms(10)));
        assert_eq!(q.delayed_len(), 1);
        assert_eq!(q.promote_due(t0 + ms(10), n()), 1);
        assert_eq!(q.take(n()), Some("a"));
    }

    #[test]
    fn stale_heap_entries_are_compacted() {
        let mut q = QueueState::new(Recorder::off());
        let t0 = Instant::now();
        for i in 0..10_000u64 {
            // Each earlier due time leaves the previous entry stale.
            q.add_at("a", t0 + Duration::from_secs(1_000_000 - i), t0, n());
        }
        assert!(q.delays.len() <= 2 * q.timers + COMPACT_SLACK + 1);
        assert_eq!(q.next_due(), Some(t0 + Duration::from_secs(1_000_000 - 9_999)));
    }

    #[test]
    fn metrics_count_adds_like_client_go() {
        let mut q = QueueState::new(Recorder::on());
        let t0 = Instant::now();
        let snap = |q: &QueueState<&str>| {
            let s = q.metrics_snapshot().expect("named");
            (s.adds, s.depth, s.queue_duration.count(), s.work_duration.count(), s.retries)
        };
        q.add("a", n());
        q.add("a", n()); // deduplicated
        assert_eq!(snap(&q), (1, 1, 0, 0, 0));
        assert_eq!(q.take(n()), Some("a"));
        assert_eq!(snap(&q), (1, 0, 1, 0, 0));
        q.add("a", n()); // dirty while processing: an add, and depth
        q.add("a", n()); // deduplicated
        assert_eq!(snap(&q), (2, 1, 1, 0, 0));
        assert!(q.metrics_snapshot().unwrap().longest_seconds >= 0.0);
        assert_eq!(q.done(&"a", || t0, n()), Finished::Requeued);
        assert_eq!(snap(&q), (2, 1, 1, 1, 0), "requeued by done: still the same add");
        assert_eq!(q.take(n()), Some("a"));
        q.count_retry();
        q.add_at("a", t0 + ms(10), t0, n()); // waits after done: not an add yet
        assert_eq!(q.done(&"a", || t0, n()), Finished::Waiting(t0 + ms(10)));
        assert_eq!(snap(&q), (2, 0, 2, 2, 1));
        assert_eq!(q.promote_due(t0 + ms(10), n()), 1);
        assert_eq!(snap(&q), (3, 1, 2, 2, 1), "promotion is an add");
        q.add_at("b", t0 + ms(20), t0, n());
        q.add("b", n()); // a plain add of a delayed key makes it ready: an add
        assert_eq!(snap(&q), (4, 2, 2, 2, 1));
        q.shut_down(false);
        q.count_retry();
        assert_eq!(snap(&q).4, 1, "no retries counted after shutdown");
    }

    #[test]
    fn unfinished_work_follows_processing_keys() {
        let mut q = QueueState::new(Recorder::on());
        let t0 = Instant::now();
        for key in ["a", "b", "c"] {
            q.add(key, n());
        }
        q.take(n());
        q.take(n());
        std::thread::sleep(ms(5));
        let s = q.metrics_snapshot().unwrap();
        assert!(s.longest_seconds >= 0.004 && s.unfinished_seconds >= 2.0 * 0.004, "{}", s.unfinished_seconds);
        assert!(s.unfinished_seconds >= s.longest_seconds);
        q.done(&"a", || t0, n());
        q.done(&"b", || t0, n());
        let s = q.metrics_snapshot().unwrap();
        assert_eq!((s.longest_seconds, s.unfinished_seconds, s.work_duration.count()), (0.0, 0.0, 2));
        q.take(n());
        assert_eq!(q.recorder.starts_len(), 2, "freed start slots are reused");
    }

    #[test]
    fn discarded_keys_stay_counted_as_adds() {
        let mut q = QueueState::new(Recorder::on());
        let t0 = Instant::now();
        for key in ["a", "b", "c"] {
            q.add(key, n());
        }
        q.take(n());
        q.add("a", n()); // dirty while processing
        let adds = |q: &QueueState<&str>| q.metrics_snapshot().unwrap().adds;
        assert_eq!(adds(&q), 4);
        q.shut_down(false);
        q.discard_ready();
        assert_eq!(q.metrics_snapshot().unwrap().depth, 0);
        assert_eq!(adds(&q), 4, "dropped keys were still added");
        assert_eq!(q.done(&"a", || t0, n()), Finished::Removed);
        assert_eq!(adds(&q), 4);
    }

    #[test]
    fn unnamed_queue_records_nothing() {
        let mut q = QueueState::new(Recorder::off());
        q.add("a", n());
        assert!(q.metrics_snapshot().is_none());
    }
}
