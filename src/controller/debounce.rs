//! Debounce (guarantees §15, U2): an enqueue, a watch or cache event or a
//! trigger makes its key due `window` after the latest of them (a trailing
//! edge), but never more than [`CAP`] windows after the first of the burst.
//!
//! The queue keeps one due time per key and lets the earliest win; a burst
//! is the one exception, so this module remembers, per key, when its burst
//! began and the due time it set last. The burst goes on while the key's
//! timer is still that one ([`WorkQueue::move_due_placed`] checks, under the
//! queue's lock); anything else (the key became ready, another delay came
//! first) ends it, and the next event starts a new one through the queue's
//! plain `add_at` (earliest wins: a ready key stays ready).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use crate::clock::deadline_after;
use crate::queue::{Place, WorkQueue};
use crate::sync::Mutex;

/// A burst is due at most this many windows after its first event.
const CAP: u32 = 10;

/// Bursts kept at least, before stale ones are swept.
const SWEEP_FLOOR: usize = 64;

pub(crate) struct Debounce<K> {
    window: Duration,
    bursts: Mutex<Bursts<K>>,
}

struct Bursts<K> {
    open: HashMap<K, Burst, foldhash::fast::RandomState>,
    /// Sweep stale bursts once `open` grows past this (twice what the last
    /// sweep left): amortised O(1) per event, memory bounded by twice the
    /// live bursts.
    sweep_at: usize,
}

#[derive(Clone, Copy)]
struct Burst {
    first: Instant,
    due: Instant,
}

impl<K: Eq + Hash + Clone + Send + 'static> Debounce<K> {
    pub(crate) fn new(window: Duration) -> Self {
        let bursts = Bursts { open: HashMap::default(), sweep_at: SWEEP_FLOOR };
        Self { window, bursts: Mutex::new(bursts) }
    }

    /// Schedules `key` for an event at `now` (the controller's clock).
    pub(crate) fn enqueue(&self, queue: &WorkQueue<K>, key: K, now: Instant, place: Place) {
        let mut bursts = self.bursts.lock();
        let trailing = deadline_after(now, self.window);
        if let Some(burst) = bursts.open.get_mut(&key).filter(|burst| burst.due > now) {
            let cap = deadline_after(burst.first, self.window.saturating_mul(CAP));
            let due = trailing.min(cap);
            if queue.move_due_placed(key.clone(), burst.due, due, place) {
                burst.due = due;
                return;
            }
        }
        queue.add_at_placed(key.clone(), trailing, place);
        bursts.open.insert(key, Burst { first: now, due: trailing });
        bursts.sweep(now);
    }
}

impl<K> Bursts<K> {
    /// Drops the bursts whose due time passed (each ended: its key became
    /// ready, or another due time replaced it).
    fn sweep(&mut self, now: Instant) {
        if self.open.len() < self.sweep_at {
            return;
        }
        self.open.retain(|_, burst| burst.due > now);
        self.sweep_at = (self.open.len() * 2).max(SWEEP_FLOOR);
    }
}
