//! The keys changed since the last flush.
//!
//! Engine threads mark a key after every change that a store keeps (an
//! enqueue, the end of a reconcile); the flusher takes every mark. A mark
//! is a push onto the marking thread's own stripe: no hashing and no
//! shared cache line on the workers' path (W6: the earlier sharded set
//! insert per enqueue and per `done` was the store's whole cost in W1).
//! The flusher, which has the time, removes the duplicates when it sorts
//! a flush by key.
//!
//! Invariant: a mark that returned before `take` began is in what `take`
//! returns (each stripe is drained under its lock), so "take, then sample"
//! sees every change made before the take.
//!
//! The flusher sleeps in `park` while every stripe is empty: the push that
//! makes a stripe non-empty unparks it (an unpark before the park is not
//! lost: the token sticks), so an idle controller's flusher never wakes
//! (G8). A stripe that grows by [`WAKE_EVERY`] marks unparks it again, so a
//! burst is seen while it is still being marked, not at the next tick
//! (S1: the flusher writes a large burst at once, see `persist.rs`).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::Thread;

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

const STRIPES: usize = 16;

/// A stripe this many marks longer wakes the flusher again: one unpark per
/// 8,192 marks on a burst, none on a quiet controller.
const WAKE_EVERY: usize = 8192;

/// Hands out stripes round-robin to the threads as they first mark, so up
/// to `STRIPES` marking threads never share one.
static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static STRIPE: usize = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) % STRIPES;
}

pub(crate) struct DirtySet<K> {
    stripes: Box<[CachePadded<Mutex<Vec<K>>>]>,
    /// The flusher, once it runs.
    flusher: OnceLock<Thread>,
}

impl<K: Clone> DirtySet<K> {
    pub(crate) fn new() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| CachePadded::new(Mutex::new(Vec::new()))).collect(),
            flusher: OnceLock::new(),
        }
    }

    /// Registers the thread to wake when the set stops being empty.
    pub(crate) fn set_flusher(&self, thread: Thread) {
        let _ = self.flusher.set(thread);
    }

    pub(crate) fn mark(&self, key: &K) {
        let mut stripe = self.stripes[STRIPE.with(|s| *s)].lock();
        let wake = stripe.len().is_multiple_of(WAKE_EVERY);
        stripe.push(key.clone());
        drop(stripe);
        if wake {
            self.wake();
        }
    }

    /// Wakes the flusher (a mark, or a stop).
    pub(crate) fn wake(&self) {
        if let Some(thread) = self.flusher.get() {
            thread.unpark();
        }
    }

    /// Marks not taken yet (the stats' `store_pending`; a key marked twice
    /// counts twice until the flusher takes it).
    pub(crate) fn len(&self) -> usize {
        self.stripes.iter().map(|stripe| stripe.lock().len()).sum()
    }

    /// Takes every mark: a key marked twice comes twice (the flusher
    /// sorts its keys by their encoding and drops the repeats then).
    pub(crate) fn take(&self) -> Vec<K> {
        let mut keys = Vec::new();
        for stripe in self.stripes.iter() {
            keys.append(&mut stripe.lock());
        }
        keys
    }
}
