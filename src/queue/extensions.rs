//! [`WorkQueue`]'s doors to the state table's optional extensions:
//! dependencies and batches (the holds, `holds.rs`), `supersede`, and what
//! a controller's store must see (the stop views, `stop_views.rs`), and
//! what a sharded controller hands over with a partition it gives up.
//!
//! Each takes the queue's one lock and calls one narrow method of
//! `QueueState`; none is on the plain path (`add`, `get`, `done`), so a
//! queue without these features never runs any of this. (`done`'s D2
//! variant, `done_with_dependents_and_get_stamped`, stays beside the other
//! `done`s in `mod.rs`.)

use std::hash::Hash;
use std::time::Duration;

use super::metrics::Now;
use super::slot::View;
use super::state::QueueState;
use super::{CancelHook, Guard, Place, QueueCounts, WorkQueue};
use crate::clock::deadline_after;
use crate::graph::Dependencies;

impl<K: Eq + Hash + Clone + Send + 'static> WorkQueue<K> {
    /// [`counts`](Self::counts), and the ready keys their dependencies hold
    /// (a controller's `set_dependencies`; not in `ready`), at one instant.
    pub(crate) fn counts_and_held(&self) -> (QueueCounts, usize) {
        let g = self.shared.lock_synced();
        let counts = QueueCounts { ready: g.q.len(), processing: g.q.processing_len(), delayed: g.q.delayed_len() };
        (counts, g.q.held_len())
    }

    /// Replaces `key`'s parents (see `crate::graph`), turning dependencies
    /// on with `cancel` (D3) if they are not yet. `Err`: the keys of the
    /// cycle it would close (D4), nothing changed.
    pub(crate) fn set_dependencies(
        &self,
        key: &K,
        parents: Vec<K>,
        cancel: impl FnOnce() -> CancelHook<K>,
    ) -> Result<(), Vec<K>> {
        let mut g = self.shared.lock_synced();
        if !g.q.has_dependencies() {
            self.enable_dependencies(&mut g, Box::default(), cancel());
        }
        if g.q.set_dependencies(key, parents)? {
            self.shared.publish_ready(&g);
            self.shared.wake_ready(&mut g);
        }
        Ok(())
    }

    /// Opens a batch (U3; idempotent): keys that become ready are held until
    /// [`close_batch`](Self::close_batch). It rides on the dependencies'
    /// holds, turning them on (without edges) if they are not yet.
    pub(crate) fn open_batch(&self, cancel: impl FnOnce() -> CancelHook<K>) {
        let mut g = self.shared.lock_synced();
        if !g.q.has_dependencies() {
            self.enable_dependencies(&mut g, Box::default(), cancel());
        }
        g.q.open_batch();
    }

    /// Closes the batch: the keys it held become ready at once, as their
    /// dependencies allow (D1).
    pub(crate) fn close_batch(&self) {
        let mut g = self.shared.lock_synced();
        if g.q.close_batch() {
            self.shared.publish_ready(&g);
            self.shared.wake_ready(&mut g);
        }
    }

    /// Turns `supersede` on (U1), before any key is added.
    pub(crate) fn enable_supersede(&self, cancel: CancelHook<K>) {
        self.shared.lock().q.enable_supersede(cancel);
    }

    /// Turns dependencies on with edges set before start.
    pub(crate) fn install_dependencies(&self, deps: Box<Dependencies<K>>, cancel: CancelHook<K>) {
        let mut g = self.shared.lock();
        self.enable_dependencies(&mut g, deps, cancel);
    }

    fn enable_dependencies(&self, g: &mut Guard<'_, K>, deps: Box<Dependencies<K>>, cancel: CancelHook<K>) {
        g.q.enable_dependencies(deps, cancel);
    }

    /// `key`'s direct parents.
    pub(crate) fn dependencies(&self, key: &K) -> Vec<K> {
        self.shared.lock().q.dependencies(key)
    }

    /// `key`'s direct children.
    pub(crate) fn dependents(&self, key: &K) -> Vec<K> {
        self.shared.lock().q.dependents(key)
    }

    /// The pending ancestors holding `key`.
    pub(crate) fn waiting_for(&self, key: &K) -> Vec<K> {
        self.shared.lock_synced().q.waiting_for(key)
    }

    /// [`add_placed`](Self::add_placed) of each of `keys`, under one lock
    /// acquisition (D2: the dependents of a key that finished), remembered
    /// for the store if there is one ([`take_dependents_views`]).
    ///
    /// [`take_dependents_views`]: Self::take_dependents_views
    pub(crate) fn add_placed_dependents(&self, keys: Vec<(K, Place)>) {
        if keys.is_empty() {
            return;
        }
        let mut now = Now::new();
        let mut g = self.shared.lock();
        self.shared.sync(&mut g, &mut now);
        for (key, place) in keys {
            g.q.add_placed_dependent(key, place, &mut now);
        }
        self.shared.publish_ready(&g);
        self.shared.wake_ready(&mut g);
    }

    /// A reconcile's retry of `key` after `delay` (the controller's): an
    /// [`add_after`](Self::add_after), except that once shut down, a queue
    /// that keeps stop views keeps it there (see `stop_views.rs`).
    pub(crate) fn retry_after_placed(&self, key: K, delay: Duration, place: Place) {
        let now = self.shared.clock.now();
        self.add_at_instant(key, deadline_after(now, delay), now, place, QueueState::retry_at);
    }

    /// `QueueState::pending_view` of each of `keys`, under one lock
    /// acquisition (a store's flusher samples its changed keys in chunks).
    #[cfg_attr(not(feature = "store"), allow(dead_code))] // only a store asks
    pub(crate) fn pending_views(&self, keys: &[K], out: &mut Vec<Option<View>>) {
        let g = self.shared.lock_synced();
        out.extend(keys.iter().map(|key| g.q.pending_view(key)));
    }

    /// Every key pending, with its due time and the priority it runs at
    /// next (see `QueueState::pending_keys`), under one lock acquisition.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding hands keys over
    pub(crate) fn pending_keys(&self) -> Vec<(K, View)> {
        let mut out = Vec::new();
        self.shared.lock_synced().q.pending_keys(&mut out);
        out
    }

    /// Takes the dependents [`add_placed_dependents`](Self::add_placed_dependents) added
    /// since the last call, each with its `pending_view`, under one lock
    /// acquisition.
    ///
    /// Why one: a store must not write a finished key before the dependents
    /// it added (a crash in between would lose them for good: the parent
    /// never runs again to add them). A flusher that sampled a key as
    /// finished calls this afterwards: the key added its dependents before
    /// it finished, so they are here (or were taken by an earlier call),
    /// and each is sampled after it was added. A dependent sampled as
    /// finished added its own dependents before that, so they were taken in
    /// the same acquisition or an earlier one.
    #[cfg_attr(not(feature = "store"), allow(dead_code))] // only a store asks
    pub(crate) fn take_dependents_views(&self, out: &mut Vec<(K, Option<View>)>) {
        self.shared.lock_synced().q.take_dependents_views(out);
    }
}
