//! What a controller's store must see that the queue no longer shows: what
//! a shutdown took from the queue, per key (guarantees §9, S2), and the
//! dependents D2 added that the store has not sampled yet.
//!
//! A stop drops delayed keys (and, at once, ready keys), and refuses the
//! retries that reconciles finishing during the stop schedule. The store
//! writes its last flush after the workers exited, so it must still learn
//! what each of those keys was: this keeps it, and `pending_view` answers
//! from here for a key the queue no longer holds.
//!
//! Kept only for a queue built `for_store` (a controller with a store), as
//! the state table's optional `Option<Box<StopViews>>`: a queue without a
//! store pays a branch at a shutdown, a retry refused by one and a D2 add,
//! none on its hot path. It lives as long as the queue, and holds at most
//! the keys the stop dropped or refused, and the dependents not sampled
//! yet.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

use super::ready::Priority;
use super::slot::{Hasher, View};

pub(crate) struct StopViews<K> {
    views: HashMap<K, View, Hasher>,
    /// The ready keys were dropped too (an immediate stop, or a drain cut
    /// short): a reconcile finishing now was cut short by the stop, so its
    /// key counts as in flight (ready at restore), not as its retry.
    discarded: bool,
    /// The dependents D2 added that the store's flusher has not sampled
    /// yet (see [`WorkQueue::take_dependents_views`]).
    ///
    /// [`WorkQueue::take_dependents_views`]: super::WorkQueue::take_dependents_views
    unsampled_dependents: Vec<K>,
}

impl<K: Eq + Hash> StopViews<K> {
    pub(crate) fn new() -> Self {
        Self { views: HashMap::default(), discarded: false, unsampled_dependents: Vec::new() }
    }

    /// Keeps `key` as `view`; a key kept twice keeps the earlier due time
    /// (ready is earliest) and the higher priority, as the queue would.
    pub(crate) fn keep(&mut self, key: K, (due, prio): View) {
        let kept = self.views.entry(key).or_insert((due, prio));
        kept.0 = match (kept.0, due) {
            (Some(a), Some(b)) => Some(a.min(b)),
            _ => None,
        };
        kept.1 = kept.1.max(prio);
    }

    /// A retry refused by the shut-down queue: due at `due`, or ready if
    /// the stop cut reconciles short.
    pub(crate) fn keep_retry(&mut self, key: K, due: Instant, prio: Priority) {
        let due = (!self.discarded).then_some(due);
        self.keep(key, (due, prio));
    }

    pub(crate) fn set_discarded(&mut self) {
        self.discarded = true;
    }

    #[cfg_attr(not(feature = "store"), allow(dead_code))] // only a store asks
    pub(crate) fn get(&self, key: &K) -> Option<View> {
        self.views.get(key).copied()
    }

    /// A dependent D2 added, for the store to sample.
    pub(crate) fn add_dependent(&mut self, key: K) {
        self.unsampled_dependents.push(key);
    }

    /// The dependents D2 added since the last call.
    #[cfg_attr(not(feature = "store"), allow(dead_code))] // only a store asks
    pub(crate) fn take_dependents(&mut self) -> Vec<K> {
        std::mem::take(&mut self.unsampled_dependents)
    }
}
