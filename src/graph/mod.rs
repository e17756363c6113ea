//! Dependencies between keys (guarantees §14, D1–D5): the edges, and the holds
//! they put on keys.
//!
//! The queue owns one [`Dependencies`] once a controller sets its first
//! edge, and tells it when a key becomes pending or stops being pending;
//! this module answers through the [`KeySlots`] seam (hold, release,
//! cancel), so it knows nothing of the queue's slab, ready set or locks.
//!
//! * **Busy.** A key is *busy* while it is pending (ready, held or being
//!   reconciled) or any of its parents is busy: by induction, while it or
//!   an ancestor is pending. `blocked[k]` counts `k`'s busy parents, so D1
//!   ("no pending ancestor") is `blocked[k] == 0`, read in O(1) at the time
//!   it matters, never by a walk up the graph.
//! * **Costs (D5).** A key becoming pending while not busy marks its
//!   descendants (O(their number), as Rill's `markPending`), and looks for
//!   running ones to cancel (D3); one already busy costs O(1) (its pending
//!   ancestor did both), so D2's enqueues down a chain are linear in all. A key that stops being pending at the end of a run has
//!   just enqueued its children (D2), which are pending themselves: the
//!   change stops at them, O(children). Only a key going to wait for a
//!   retry (not pending, not at the end of its run) frees its descendants
//!   in a walk.
//! * **Waits (D3).** A key that became pending while descendants were
//!   being reconciled waits for each of those to return (`waits`), and is
//!   held until then; `waiters` says whom a returning key releases.
//!
//! Memory: two adjacency lists (one entry per edge each way) and counters
//! only for keys that have a busy parent or wait.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

type Hasher = foldhash::fast::RandomState;

/// Where a key stands, as far as dependencies care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pending {
    /// Not pending: absent, or waiting for a due time.
    No,
    /// Waiting to be handed out (held or not).
    Ready,
    /// Being reconciled.
    Running,
}

/// Where keys stand (read under the queue's lock).
pub(crate) trait Pendings<K> {
    fn pending(&self, key: &K) -> Pending;
}

/// What the queue does for the graph. Every call is made under the
/// queue's lock.
pub(crate) trait KeySlots<K>: Pendings<K> {
    /// Whether any key is being reconciled: if none, no descendant can be
    /// running, and D3's walk down is skipped.
    fn any_running(&self) -> bool;
    /// A ready key must not be handed out (idempotent).
    fn hold(&mut self, key: &K);
    /// A held ready key may be handed out again.
    fn release(&mut self, key: &K);
    /// The running reconcile of `key` is cancelled (D3).
    fn cancel(&mut self, key: &K);
}

pub(crate) struct Dependencies<K> {
    parents: HashMap<K, Vec<K>, Hasher>,
    children: HashMap<K, Vec<K>, Hasher>,
    /// Busy parents per key (absent: none).
    blocked: HashMap<K, u32, Hasher>,
    /// Cancelled running descendants each key waits for (absent: none).
    waits: HashMap<K, u32, Hasher>,
    /// For a cancelled running key, the keys waiting for it to return.
    waiters: HashMap<K, Vec<K>, Hasher>,
}

impl<K: Eq + Hash + Clone> Default for Dependencies<K> {
    fn default() -> Self {
        Self {
            parents: HashMap::default(),
            children: HashMap::default(),
            blocked: HashMap::default(),
            waits: HashMap::default(),
            waiters: HashMap::default(),
        }
    }
}

impl<K: Eq + Hash + Clone> Dependencies<K> {
    /// `key`'s direct parents, in the order set.
    pub(crate) fn parents(&self, key: &K) -> Vec<K> {
        self.parents.get(key).cloned().unwrap_or_default()
    }

    /// `key`'s direct children.
    pub(crate) fn children(&self, key: &K) -> Vec<K> {
        self.children.get(key).cloned().unwrap_or_default()
    }

    /// Whether `key` must not be handed out now: a busy parent (D1) or a
    /// cancelled descendant still running (D3).
    pub(crate) fn must_hold(&self, key: &K) -> bool {
        self.blocked.contains_key(key) || self.waits.contains_key(key)
    }

    /// Whether `key` or one of its ancestors is pending.
    fn busy(&self, key: &K, slots: &impl KeySlots<K>) -> bool {
        self.blocked.contains_key(key) || slots.pending(key) != Pending::No
    }

    /// The pending ancestors of `key` (for `inspect`): a walk up, off the
    /// hot path.
    pub(crate) fn pending_ancestors(&self, key: &K, slots: &impl Pendings<K>) -> Vec<K> {
        let mut seen: HashSet<&K, Hasher> = HashSet::default();
        let mut stack: Vec<&K> = self.parents.get(key).map(|p| p.iter().collect()).unwrap_or_default();
        let mut out = Vec::new();
        while let Some(k) = stack.pop() {
            if !seen.insert(k) {
                continue;
            }
            if slots.pending(k) != Pending::No {
                out.push(k.clone());
            }
            if let Some(parents) = self.parents.get(k) {
                stack.extend(parents.iter());
            }
        }
        out
    }

    /// Replaces `key`'s parents by `parents` (deduplicated by the caller),
    /// holding or releasing `key` at once if that changes D1 for it. A set
    /// that would close a cycle changes nothing and returns the keys of
    /// that cycle (D4).
    pub(crate) fn set_parents(&mut self, key: &K, parents: Vec<K>, slots: &mut impl KeySlots<K>) -> Result<(), Vec<K>> {
        if let Some(cycle) = self.cycle_through(key, &parents) {
            return Err(cycle);
        }
        let old = self.parents.remove(key).unwrap_or_default();
        // New edges first: a key that keeps a busy parent is never
        // released in between.
        for parent in parents.iter().filter(|p| !old.contains(p)) {
            self.children.entry(parent.clone()).or_default().push(key.clone());
            if self.busy(parent, slots) {
                self.mark_busy(key, slots);
            }
        }
        for parent in old.iter().filter(|p| !parents.contains(p)) {
            let Some(children) = self.children.get_mut(parent) else { continue };
            children.retain(|c| c != key);
            if children.is_empty() {
                self.children.remove(parent);
            }
            if self.busy(parent, slots) {
                self.mark_free(key, slots);
            }
        }
        if !parents.is_empty() {
            self.parents.insert(key.clone(), parents);
        }
        Ok(())
    }

    /// The keys of a cycle that parents `parents` of `key` would close:
    /// `key` itself, or the path from `key` down to a parent.
    fn cycle_through(&self, key: &K, parents: &[K]) -> Option<Vec<K>> {
        if parents.contains(key) {
            return Some(vec![key.clone()]);
        }
        let mut came_from: HashMap<&K, &K, Hasher> = HashMap::default();
        let mut stack = vec![key];
        while let Some(k) = stack.pop() {
            for child in self.children.get(k).into_iter().flatten() {
                if came_from.contains_key(child) {
                    continue;
                }
                came_from.insert(child, k);
                if parents.contains(child) {
                    let mut path = vec![child.clone()];
                    let mut at = child;
                    while at != key {
                        at = came_from[at];
                        path.push(at.clone());
                    }
                    path.reverse();
                    return Some(path);
                }
                stack.push(child);
            }
        }
        None
    }

    /// `key` became pending. Marks its descendants busy (holding the ready
    /// ones) and cancels its running descendants, which it then waits for
    /// (D3). Returns whether `key` itself must be held.
    pub(crate) fn became_pending(&mut self, key: &K, slots: &mut impl KeySlots<K>) -> bool {
        // Already busy: a pending ancestor marked the descendants and
        // cancelled (and waits for) those running, and `key` runs after
        // that ancestor. So D2's enqueue of a child costs one lookup here
        // (the common case first), and a chain runs in linear time.
        if self.blocked.contains_key(key) {
            return true;
        }
        if !self.children.contains_key(key) {
            return self.must_hold(key);
        }
        if let Some(children) = self.children.get(key) {
            for child in children {
                Self::busy_from(&mut self.blocked, &self.children, child, slots);
            }
        }
        if !slots.any_running() {
            return self.must_hold(key);
        }
        let mut seen: HashSet<K, Hasher> = HashSet::default();
        let mut stack = self.children(key);
        while let Some(k) = stack.pop() {
            if !seen.insert(k.clone()) {
                continue;
            }
            if slots.pending(&k) == Pending::Running {
                slots.cancel(&k);
                self.waiters.entry(k.clone()).or_default().push(key.clone());
                *self.waits.entry(key.clone()).or_insert(0) += 1;
            }
            if let Some(children) = self.children.get(&k) {
                stack.extend(children.iter().cloned());
            }
        }
        self.must_hold(key)
    }

    /// The reconcile of `key` returned, whatever comes next for it: the
    /// keys waiting for it wait for one fewer (D3).
    pub(crate) fn returned(&mut self, key: &K, slots: &mut impl KeySlots<K>) {
        let Some(waiters) = self.waiters.remove(key) else { return };
        for waiter in waiters {
            let std::collections::hash_map::Entry::Occupied(mut n) = self.waits.entry(waiter.clone()) else {
                continue;
            };
            *n.get_mut() -= 1;
            if *n.get() == 0 {
                n.remove();
                if !self.blocked.contains_key(&waiter) && slots.pending(&waiter) == Pending::Ready {
                    slots.release(&waiter);
                }
            }
        }
    }

    /// `key` is no longer pending (its slot already says so): if nothing
    /// above it is busy, its children lose a busy parent.
    pub(crate) fn left_pending(&mut self, key: &K, slots: &mut impl KeySlots<K>) {
        if self.blocked.contains_key(key) {
            return;
        }
        let Some(children) = self.children.get(key) else { return };
        for child in children {
            Self::free_from(&mut self.blocked, &self.children, &self.waits, child, slots);
        }
    }

    /// `key` got one more busy parent; a key that became busy and is not
    /// pending passes it on to its children (iterative: chains are deep).
    fn mark_busy(&mut self, key: &K, slots: &mut impl KeySlots<K>) {
        Self::busy_from(&mut self.blocked, &self.children, key, slots);
    }

    /// [`mark_busy`](Self::mark_busy) on the fields it touches, so a caller
    /// can walk a key's children in place (no copy of the list per finished
    /// run: W12).
    fn busy_from(
        blocked: &mut HashMap<K, u32, Hasher>,
        children: &HashMap<K, Vec<K>, Hasher>,
        key: &K,
        slots: &mut impl KeySlots<K>,
    ) {
        // `next` before `stack`: the common case, a pending key, allocates nothing.
        let (mut next, mut stack) = (Some(key.clone()), Vec::new());
        while let Some(k) = next.take().or_else(|| stack.pop()) {
            let n = blocked.entry(k.clone()).or_insert(0);
            *n += 1;
            if *n > 1 {
                continue;
            }
            match slots.pending(&k) {
                Pending::No => stack.extend(children.get(&k).into_iter().flatten().cloned()),
                Pending::Ready => slots.hold(&k),
                Pending::Running => {}
            }
        }
    }

    /// `key` has one busy parent fewer; a key that stopped being busy
    /// passes it on as [`mark_busy`](Self::mark_busy) does.
    fn mark_free(&mut self, key: &K, slots: &mut impl KeySlots<K>) {
        Self::free_from(&mut self.blocked, &self.children, &self.waits, key, slots);
    }

    /// [`mark_free`](Self::mark_free) on the fields it touches (see
    /// [`busy_from`](Self::busy_from)).
    fn free_from(
        blocked: &mut HashMap<K, u32, Hasher>,
        children: &HashMap<K, Vec<K>, Hasher>,
        waits: &HashMap<K, u32, Hasher>,
        key: &K,
        slots: &mut impl KeySlots<K>,
    ) {
        let (mut next, mut stack) = (Some(key.clone()), Vec::new());
        while let Some(k) = next.take().or_else(|| stack.pop()) {
            let std::collections::hash_map::Entry::Occupied(mut n) = blocked.entry(k.clone()) else {
                debug_assert!(false, "a busy parent was counted");
                continue;
            };
            *n.get_mut() -= 1;
            if *n.get() > 0 {
                continue;
            }
            n.remove();
            match slots.pending(&k) {
                Pending::No => stack.extend(children.get(&k).into_iter().flatten().cloned()),
                Pending::Ready if !waits.contains_key(&k) => slots.release(&k),
                Pending::Ready | Pending::Running => {}
            }
        }
    }
}

/// The slots of a controller not started yet: nothing is pending, so
/// setting edges holds, releases and cancels nothing.
pub(crate) struct NothingPending;

impl<K> Pendings<K> for NothingPending {
    fn pending(&self, _: &K) -> Pending {
        Pending::No
    }
}

impl<K> KeySlots<K> for NothingPending {
    fn any_running(&self) -> bool {
        false
    }
    fn hold(&mut self, _: &K) {
        unreachable!("nothing is pending")
    }
    fn release(&mut self, _: &K) {
        unreachable!("nothing is pending")
    }
    fn cancel(&mut self, _: &K) {
        unreachable!("nothing is pending")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Slots of a model queue: each key's state, and how many times the
    /// graph looked at one (its work).
    #[derive(Default)]
    struct Model {
        state: HashMap<u32, Pending>,
        held: HashSet<u32>,
        cancelled: Vec<u32>,
        looks: Cell<usize>,
    }

    impl Pendings<u32> for Model {
        fn pending(&self, key: &u32) -> Pending {
            self.looks.set(self.looks.get() + 1);
            self.state.get(key).copied().unwrap_or(Pending::No)
        }
    }

    impl KeySlots<u32> for Model {
        fn any_running(&self) -> bool {
            self.state.values().any(|p| *p == Pending::Running)
        }
        fn hold(&mut self, key: &u32) {
            self.held.insert(*key);
        }
        fn release(&mut self, key: &u32) {
            self.held.remove(key);
        }
        fn cancel(&mut self, key: &u32) {
            self.cancelled.push(*key);
        }
    }

    /// A chain 0 → 1 → ... → n-1.
    fn chain(n: u32) -> Dependencies<u32> {
        let mut deps = Dependencies::default();
        for k in 1..n {
            deps.set_parents(&k, vec![k - 1], &mut NothingPending).unwrap();
        }
        deps
    }

    impl Model {
        fn ready(&mut self, deps: &mut Dependencies<u32>, key: u32) -> bool {
            self.state.insert(key, Pending::Ready);
            let hold = deps.became_pending(&key, self);
            if hold {
                self.held.insert(key);
            }
            hold
        }

        fn finish(&mut self, deps: &mut Dependencies<u32>, key: u32) {
            self.state.remove(&key);
            deps.returned(&key, self);
            deps.left_pending(&key, self);
        }
    }

    #[test]
    fn d5_a_chain_runs_in_linear_time() {
        const N: u32 = 10_000;
        let mut deps = chain(N);
        let mut m = Model::default();
        assert!(!m.ready(&mut deps, 0));
        m.state.insert(0, Pending::Running);
        for k in 0..N {
            // D2: the child is enqueued before its parent is done.
            if k + 1 < N {
                assert!(m.ready(&mut deps, k + 1), "{} is held by {k}", k + 1);
            }
            m.finish(&mut deps, k);
            if k + 1 < N {
                assert!(!m.held.contains(&(k + 1)), "{} released by {k}'s finish", k + 1);
                m.state.insert(k + 1, Pending::Running);
            }
        }
        assert!(m.looks.get() < 10 * N as usize, "{} looks for a chain of {N}", m.looks.get());
        assert!(deps.blocked.is_empty() && deps.waits.is_empty() && deps.waiters.is_empty());
    }

    #[test]
    fn d3_a_root_becoming_ready_cancels_running_descendants_and_waits_for_them() {
        let mut deps = chain(4);
        let mut m = Model::default();
        assert!(!m.ready(&mut deps, 2));
        m.state.insert(2, Pending::Running);
        assert!(m.ready(&mut deps, 3), "3's parent runs");
        assert!(m.ready(&mut deps, 0), "0 waits for 2, cancelled");
        assert_eq!(m.cancelled, vec![2]);
        assert!(m.held.contains(&3), "3 has a pending ancestor");
        let mut holding = deps.pending_ancestors(&3, &m);
        holding.sort_unstable();
        assert_eq!(holding, vec![0, 2], "1 is not pending itself");
        m.finish(&mut deps, 2);
        assert!(!m.held.contains(&0), "released once the cancelled run returned");
        assert!(m.held.contains(&3));
    }

    #[test]
    fn d4_a_cycle_is_named_and_nothing_changes() {
        let mut deps = chain(3);
        assert_eq!(deps.set_parents(&0, vec![9, 2], &mut NothingPending), Err(vec![0, 1, 2]));
        assert!(deps.parents(&0).is_empty() && deps.children(&9).is_empty());
        assert_eq!(deps.set_parents(&1, vec![1], &mut NothingPending), Err(vec![1]));
        assert_eq!(deps.parents(&1), vec![0]);
    }

    #[test]
    fn edges_come_and_go_with_their_holds() {
        let mut deps = Dependencies::default();
        let mut m = Model::default();
        m.state.insert(7, Pending::Running);
        m.state.insert(8, Pending::Ready);
        deps.set_parents(&8, vec![7], &mut m).unwrap();
        assert!(m.held.contains(&8), "a new edge from a pending parent holds");
        deps.set_parents(&8, vec![], &mut m).unwrap();
        assert!(!m.held.contains(&8), "clearing it releases");
        assert!(deps.parents.is_empty() && deps.children.is_empty() && deps.blocked.is_empty());
    }
}
