//! The controller's side of dependencies between keys (guarantees §14): the
//! handle's calls, where edges live before start, D2's enqueue of the
//! dependents, and D3's cancellation of running descendants (which U1's
//! `supersede` shares: §15). The graph and
//! its holds are `crate::graph`'s, kept in the queue once started. With a
//! store, every key whose parents are set is marked for the flusher, and
//! the stored edges come back at start (§14: edges are kept in the store).

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::core::{ControllerKey, Core, Runtime};
use super::partitions::{CrossPartitionError, Partitioner};
use crate::graph::{Dependencies, NothingPending};
use crate::queue::{Cancel, CancelHook};
use crate::sync::Mutex;

/// `set_dependencies` would close a cycle (D4): nothing was changed.
///
/// Exhaustive: the cycle is all it says, and `Err(CycleError { keys })` is
/// how the docs match it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CycleError<K> {
    /// Every key of the cycle, from the key whose parents were set down to
    /// the parent that would close it.
    pub keys: Vec<K>,
}

impl<K: fmt::Debug> fmt::Display for CycleError<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dependencies would close a cycle through {:?}", self.keys)
    }
}

impl<K: fmt::Debug> std::error::Error for CycleError<K> {}

/// Why `set_dependencies` refused the parents: nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DependencyError<K> {
    /// They would close a cycle (D4).
    Cycle(CycleError<K>),
    /// With sharding, a parent lies in another partition than the key
    /// (C4): no replica would see both, so the edge could never hold.
    CrossPartition(CrossPartitionError<K>),
}

impl<K: fmt::Debug> fmt::Display for DependencyError<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DependencyError::Cycle(e) => e.fmt(f),
            DependencyError::CrossPartition(e) => e.fmt(f),
        }
    }
}

impl<K: fmt::Debug + 'static> std::error::Error for DependencyError<K> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DependencyError::Cycle(e) => Some(e),
            DependencyError::CrossPartition(e) => Some(e),
        }
    }
}

impl<K> From<CycleError<K>> for DependencyError<K> {
    fn from(e: CycleError<K>) -> Self {
        DependencyError::Cycle(e)
    }
}

/// At start (C4): the first edge set before start that crosses
/// partitions (set before the controller was given its sharding, or
/// its `partition_by`). The edges are copied out first: `partition_by`
/// is not called under the lock.
pub(crate) fn first_edge_across<K: ControllerKey>(
    before: &Mutex<BeforeStart<K>>,
    partitions: &Partitioner<K>,
) -> Option<CrossPartitionError<K>> {
    let edges: Vec<(K, Vec<K>)> = {
        let before = before.lock();
        let deps = before.deps.as_deref()?;
        before.set.iter().map(|key| (key.clone(), deps.parents(key))).collect()
    };
    edges.iter().find_map(|(key, parents)| partitions.check_edges(key, parents).err())
}

/// Edges set before start (the queue takes them at start).
pub(crate) struct BeforeStart<K> {
    deps: Option<Box<Dependencies<K>>>,
    /// The keys whose parents were set: at start, their stored parents
    /// give way to these, which the store then writes.
    set: HashSet<K, foldhash::fast::RandomState>,
}

impl<K> Default for BeforeStart<K> {
    fn default() -> Self {
        Self { deps: None, set: HashSet::default() }
    }
}

impl<K: ControllerKey> Core<K> {
    /// Replaces `key`'s parents (D4: a cycle changes nothing; C4: with
    /// `partitions`, neither does an edge across partitions); before
    /// start, in `before`.
    pub(crate) fn set_dependencies(
        self: &Arc<Self>,
        before: &Mutex<BeforeStart<K>>,
        partitions: Option<&Partitioner<K>>,
        key: &K,
        parents: impl IntoIterator<Item = K>,
    ) -> Result<(), DependencyError<K>> {
        // Repeats collapse in the graph, by node id (D5: O(parents)).
        let parents: Vec<K> = parents.into_iter().collect();
        // Before any lock: `partition_by` is the user's code.
        if let Some(partitions) = partitions {
            partitions.check_edges(key, &parents).map_err(DependencyError::CrossPartition)?;
        }
        if let Some(rt) = self.rt.get() {
            return Ok(self.set_started(rt, key, parents)?);
        }
        let mut before = before.lock();
        if let Some(rt) = self.rt.get() {
            drop(before);
            return Ok(self.set_started(rt, key, parents)?);
        }
        let deps = before.deps.get_or_insert_with(Box::default);
        deps.set_parents(key, parents, &mut NothingPending).map_err(|keys| CycleError { keys })?;
        before.set.insert(key.clone());
        Ok(())
    }

    fn set_started(self: &Arc<Self>, rt: &Runtime<K>, key: &K, parents: Vec<K>) -> Result<(), CycleError<K>> {
        rt.queue.set_dependencies(key, parents, || self.cancel_hook()).map_err(|keys| CycleError { keys })?;
        rt.finish.dependencies_set();
        if let Some(link) = &rt.store {
            link.mark_edges(key);
        }
        Ok(())
    }

    /// At start, before the runtime is visible: hands the edges set so far,
    /// and the `stored` ones of the other keys, to the queue. The caller
    /// keeps `before` locked until the runtime is set, so no edge lands in
    /// between. Returns the keys whose stored parents were dropped because
    /// they would close a cycle with parents set before start (those win),
    /// for the caller to log once its locks are released.
    pub(crate) fn install_dependencies(
        self: &Arc<Self>,
        before: &mut BeforeStart<K>,
        stored: Vec<(K, Vec<K>)>,
        rt: &Runtime<K>,
    ) -> Vec<K> {
        let mut deps = before.deps.take();
        let set = std::mem::take(&mut before.set);
        let mut dropped = Vec::new();
        // Set again before start: those win.
        for (key, parents) in stored.into_iter().filter(|(key, _)| !set.contains(key)) {
            let deps = deps.get_or_insert_with(Box::default);
            if deps.set_parents(&key, parents, &mut NothingPending).is_err() {
                dropped.push(key);
            }
        }
        if let Some(link) = &rt.store {
            for key in set.iter().chain(&dropped) {
                link.mark_edges(key);
            }
        }
        if let Some(deps) = deps {
            rt.queue.install_dependencies(deps, self.cancel_hook());
            rt.finish.dependencies_set();
        }
        dropped
    }

    /// What the queue calls (under its lock) to cancel a running reconcile
    /// (a descendant's, D3; or its key's own, U1): the worker running it
    /// counts that run as superseded.
    pub(super) fn cancel_hook(self: &Arc<Self>) -> CancelHook<K> {
        let core = Arc::downgrade(self);
        Arc::new(move |key: &K, why: Cancel| {
            if let Some(core) = core.upgrade() {
                core.supersede_running(key, why);
            }
        })
    }

    fn supersede_running(&self, key: &K, why: Cancel) {
        let Some(rt) = self.rt.get() else { return };
        for slot in &rt.slots {
            let mut running = slot.running.lock();
            if let Some(run) = running.as_mut().filter(|run| &run.key == key) {
                if why == Cancel::Superseded && super::worker::on_slot(slot) {
                    // A reconcile that enqueued its own key (U1): it runs
                    // again after it returns, uncancelled.
                    return;
                }
                run.superseded = true;
                slot.signal.set();
                return;
            }
        }
    }

    /// `key`'s direct parents (before start: those set in this process, in
    /// `before`; a store's come back at start).
    pub(crate) fn dependencies(&self, before: &Mutex<BeforeStart<K>>, key: &K) -> Vec<K> {
        self.read_graph(before, key, |q, key| q.dependencies(key), |d, key| d.parents(key))
    }

    /// `key`'s direct children.
    pub(crate) fn dependents(&self, before: &Mutex<BeforeStart<K>>, key: &K) -> Vec<K> {
        self.read_graph(before, key, |q, key| q.dependents(key), |d, key| d.children(key))
    }

    fn read_graph(
        &self,
        before: &Mutex<BeforeStart<K>>,
        key: &K,
        started: impl Fn(&crate::queue::WorkQueue<K>, &K) -> Vec<K>,
        not_started: impl Fn(&Dependencies<K>, &K) -> Vec<K>,
    ) -> Vec<K> {
        if let Some(rt) = self.rt.get() {
            return started(&rt.queue, key);
        }
        let set_before = before.lock();
        match (self.rt.get(), set_before.deps.as_deref()) {
            (Some(rt), _) => started(&rt.queue, key),
            (None, Some(deps)) => not_started(deps, key),
            (None, None) => Vec::new(),
        }
    }

    /// Counts a reconcile cancelled by D3.
    pub(crate) fn count_superseded(&self) {
        self.counters.superseded.fetch_add(1, Ordering::Relaxed);
    }
}
