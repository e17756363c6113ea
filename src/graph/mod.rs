//! Dependencies between keys (guarantees §14, D1–D5): the edges, and the holds
//! they put on keys.
//!
//! The queue owns one [`Dependencies`] once a controller sets its first
//! edge, and tells it when a key becomes pending or stops being pending;
//! this module answers through the [`KeySlots`] seam (hold, release,
//! cancel), so it knows nothing of the queue's slab, ready set or locks.
//!
//! * **Nodes.** Every key with an edge (or a wait, below) has a node in a
//!   dense table; edges, counters and walks use node ids. A root's enqueue
//!   walks all its descendants (below), and a walk over ids in a table
//!   costs a fraction of one through maps hashed by key (W12: 100,000
//!   descendants). The queue names the slot a key has in its own table
//!   with each call, and the graph remembers which node that slot's key
//!   had (`by_slot`), so a key's calls after its first find its node
//!   without a hash lookup.
//! * **Busy.** A key is *busy* while it is pending (ready, held or being
//!   reconciled) or any of its parents is busy: by induction, while it or
//!   an ancestor is pending. `blocked` counts a node's busy parents, so D1
//!   ("no pending ancestor") is `blocked == 0`, read in O(1) at the time
//!   it matters, never by a walk up the graph.
//! * **Pending, mirrored.** A node keeps whether its key is pending: read
//!   from the queue when the node is made, then kept by
//!   [`became_pending`](Dependencies::became_pending),
//!   [`left_pending`](Dependencies::left_pending) and
//!   [`hand_over`](Dependencies::hand_over), which the queue calls at
//!   every such change. So the walks ask the queue nothing about keys that
//!   are not pending. (An immediate stop drops keys without telling; the
//!   queue hands nothing out after it.)
//! * **Costs (D5).** A key becoming pending while not busy marks its
//!   descendants (O(their number), as Rill's `markPending`), and looks for
//!   running ones to cancel (D3); one already busy costs O(1) (its pending
//!   ancestor did both), so D2's enqueues down a chain are linear in all. A
//!   key that stops being pending at the end of a run hands its busy state
//!   over to its children (D2), which become pending in its place:
//!   O(children), nothing below them changes. Only a key going to wait for
//!   a retry (not pending, not at the end of its run) frees its
//!   descendants in a walk.
//! * **Waits (D3).** A key that became pending while descendants were
//!   being reconciled waits for each of those to return (`waits`), and is
//!   held until then; `waiters` says whom a returning key releases.
//!
//! Memory: a node per key with an edge or a wait, one id per edge each way,
//! and one id per slot the queue had at most at once; a node whose key has
//! neither edge nor wait is dropped, and its id reused.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

type Hasher = foldhash::fast::RandomState;

/// A node's place in the table.
type Id = u32;

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
    /// A ready key must not be handed out (idempotent; nothing for a key
    /// being reconciled).
    fn hold(&mut self, key: &K);
    /// A held ready key may be handed out again (nothing for a key being
    /// reconciled).
    fn release(&mut self, key: &K);
    /// The running reconcile of `key` is cancelled (D3).
    fn cancel(&mut self, key: &K);
}

struct Node<K> {
    key: K,
    /// In the order set.
    parents: Vec<Id>,
    children: Vec<Id>,
    /// Busy parents.
    blocked: u32,
    /// Cancelled running descendants this key waits for (D3).
    waits: u32,
    /// Whether the key is pending (see the module's doc).
    pending: bool,
}

impl<K> Node<K> {
    fn busy(&self) -> bool {
        self.blocked > 0 || self.pending
    }

    fn must_hold(&self) -> bool {
        self.blocked > 0 || self.waits > 0
    }
}

pub(crate) struct Dependencies<K> {
    ids: HashMap<K, Id, Hasher>,
    /// `None`: a dropped node, its id in `free`.
    nodes: Vec<Option<Node<K>>>,
    free: Vec<Id>,
    /// For a cancelled running key, the keys waiting for it to return.
    waiters: HashMap<Id, Vec<Id>, Hasher>,
    /// For each of the queue's slots (`at` in the calls that name one),
    /// the node of the key it held when last told (`NO_NODE`: none). A
    /// hint checked against the node's key, since the queue reuses and
    /// compacts its slots: a hit saves a lookup in `ids`, a cache miss
    /// once that holds many keys (W12: one per key and run). Sized by the
    /// most slots the queue had at once.
    by_slot: Vec<Id>,
}

const NO_NODE: Id = Id::MAX;

/// A child of a key that [`hand_over`](Dependencies::hand_over) handed
/// over to, for the queue to enqueue.
pub(crate) enum Child<K> {
    /// Pending now, and not known to the queue or waiting for a due time
    /// there: the queue makes it ready (held if `hold`), then says where
    /// ([`placed`](Dependencies::placed)).
    Handed { key: K, hold: bool, node: NodeRef },
    /// Pending already: enqueued as any pending key.
    Pending(K),
}

/// A node, opaque outside the graph.
#[derive(Clone, Copy)]
pub(crate) struct NodeRef(Id);

impl<K> Default for Dependencies<K> {
    fn default() -> Self {
        Self {
            ids: HashMap::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            waiters: HashMap::default(),
            by_slot: Vec::new(),
        }
    }
}

impl<K: Eq + Hash + Clone> Dependencies<K> {
    fn node(&self, id: Id) -> &Node<K> {
        self.nodes[id as usize].as_ref().expect("a live node")
    }

    fn node_mut(&mut self, id: Id) -> &mut Node<K> {
        self.nodes[id as usize].as_mut().expect("a live node")
    }

    fn find(&self, key: &K) -> Option<&Node<K>> {
        self.ids.get(key).map(|&id| self.node(id))
    }

    /// `key`'s node, if it has one; `at` is its slot in the queue (see
    /// `by_slot`).
    #[inline]
    fn id_at(&mut self, key: &K, at: u32) -> Option<Id> {
        if let Some(&id) = self.by_slot.get(at as usize)
            && let Some(Some(node)) = self.nodes.get(id as usize)
            && node.key == *key
        {
            return Some(id);
        }
        let id = *self.ids.get(key)?;
        self.placed(NodeRef(id), at);
        Some(id)
    }

    /// The key of `node` is in the queue's slot `at`.
    pub(crate) fn placed(&mut self, node: NodeRef, at: u32) {
        let at = at as usize;
        if at >= self.by_slot.len() {
            self.by_slot.resize(at + 1, NO_NODE);
        }
        self.by_slot[at] = node.0;
    }

    fn keys_of(&self, ids: &[Id]) -> Vec<K> {
        ids.iter().map(|&id| self.node(id).key.clone()).collect()
    }

    /// `key`'s node, made (with its key's state read from `slots`) if it
    /// has none.
    fn node_for(&mut self, key: &K, slots: &impl Pendings<K>) -> Id {
        if let Some(&id) = self.ids.get(key) {
            return id;
        }
        let node = Node {
            key: key.clone(),
            parents: Vec::new(),
            children: Vec::new(),
            blocked: 0,
            waits: 0,
            pending: slots.pending(key) != Pending::No,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                Id::try_from(self.nodes.len() - 1).expect("fewer than 2^32 keys with dependencies")
            }
        };
        self.ids.insert(key.clone(), id);
        id
    }

    /// Drops the node of a key that has no edge, no busy parent and no
    /// wait left, so memory follows the edges (D5).
    fn drop_if_unused(&mut self, id: Id) {
        let node = self.node(id);
        let unused = node.parents.is_empty()
            && node.children.is_empty()
            && node.blocked == 0
            && node.waits == 0
            && !self.waiters.contains_key(&id);
        if unused {
            let node = self.nodes[id as usize].take().expect("a live node");
            self.ids.remove(&node.key);
            self.free.push(id);
        }
    }

    /// `key`'s direct parents, in the order set.
    pub(crate) fn parents(&self, key: &K) -> Vec<K> {
        self.find(key).map(|node| self.keys_of(&node.parents)).unwrap_or_default()
    }

    /// `key`'s direct children.
    pub(crate) fn children(&self, key: &K) -> Vec<K> {
        self.find(key).map(|node| self.keys_of(&node.children)).unwrap_or_default()
    }

    /// Whether `key` must not be handed out now: a busy parent (D1) or a
    /// cancelled descendant still running (D3).
    pub(crate) fn must_hold(&self, key: &K) -> bool {
        self.find(key).is_some_and(Node::must_hold)
    }

    /// The pending ancestors of `key` (for `inspect`): a walk up, off the
    /// hot path.
    pub(crate) fn pending_ancestors(&self, key: &K, slots: &impl Pendings<K>) -> Vec<K> {
        let Some(&start) = self.ids.get(key) else { return Vec::new() };
        let mut seen: HashSet<Id, Hasher> = HashSet::default();
        let mut stack = self.node(start).parents.clone();
        let mut out = Vec::new();
        while let Some(id) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            let node = self.node(id);
            if slots.pending(&node.key) != Pending::No {
                out.push(node.key.clone());
            }
            stack.extend_from_slice(&node.parents);
        }
        out
    }

    /// Replaces `key`'s parents by `parents` (a repeated parent counts
    /// once, at its first place), holding or releasing `key` at once if
    /// that changes D1 for it. A set that would close a cycle changes
    /// nothing and returns the keys of that cycle (D4).
    ///
    /// D5: O(old parents + new parents), each compared through a hash set
    /// of ids, never a list against a list (1,000,000 parents in a second,
    /// where that took hours). Only the unlinking from an old parent that
    /// is dropped scans that parent's children.
    pub(crate) fn set_parents(&mut self, key: &K, parents: Vec<K>, slots: &mut impl KeySlots<K>) -> Result<(), Vec<K>> {
        if let Some(cycle) = self.cycle_through(key, &parents) {
            return Err(cycle);
        }
        if parents.is_empty() && !self.ids.contains_key(key) {
            return Ok(());
        }
        let id = self.node_for(key, slots);
        let mut is_new: HashSet<Id, Hasher> = HashSet::with_capacity_and_hasher(parents.len(), Hasher::default());
        let new: Vec<Id> =
            parents.iter().map(|parent| self.node_for(parent, slots)).filter(|&parent| is_new.insert(parent)).collect();
        let old = std::mem::take(&mut self.node_mut(id).parents);
        let was_old: HashSet<Id, Hasher> = old.iter().copied().collect();
        // New edges first: a key that keeps a busy parent is never
        // released in between.
        for &parent in new.iter().filter(|p| !was_old.contains(p)) {
            let parent = self.node_mut(parent);
            parent.children.push(id);
            if parent.busy() {
                self.busy_from(id, slots);
            }
        }
        for &parent in old.iter().filter(|p| !is_new.contains(p)) {
            let node = self.node_mut(parent);
            node.children.retain(|&c| c != id);
            if node.busy() {
                self.free_from(id, slots);
            }
            self.drop_if_unused(parent);
        }
        self.node_mut(id).parents = new;
        self.drop_if_unused(id);
        Ok(())
    }

    /// The keys of a cycle that parents `parents` of `key` would close:
    /// `key` itself, or the path from `key` down to a parent.
    fn cycle_through(&self, key: &K, parents: &[K]) -> Option<Vec<K>> {
        if parents.contains(key) {
            return Some(vec![key.clone()]);
        }
        let start = *self.ids.get(key)?;
        let targets: HashSet<Id, Hasher> = parents.iter().filter_map(|parent| self.ids.get(parent).copied()).collect();
        if targets.is_empty() {
            return None;
        }
        let mut came_from: HashMap<Id, Id, Hasher> = HashMap::default();
        let mut stack = vec![start];
        while let Some(id) = stack.pop() {
            for &child in &self.node(id).children {
                if came_from.contains_key(&child) {
                    continue;
                }
                came_from.insert(child, id);
                if targets.contains(&child) {
                    let mut path = vec![child];
                    let mut at = child;
                    while at != start {
                        at = came_from[&at];
                        path.push(at);
                    }
                    path.reverse();
                    return Some(self.keys_of(&path));
                }
                stack.push(child);
            }
        }
        None
    }

    /// `key` (in the queue's slot `at`) became pending. Marks its
    /// descendants busy (holding the ready ones) and cancels its running
    /// descendants, which it then waits for (D3). Returns whether `key`
    /// itself must be held.
    pub(crate) fn became_pending(&mut self, key: &K, at: u32, slots: &mut impl KeySlots<K>) -> bool {
        let Some(id) = self.id_at(key, at) else { return false };
        let node = self.node_mut(id);
        node.pending = true;
        // Already busy: a pending ancestor marked the descendants and
        // cancelled (and waits for) those running, and `key` runs after
        // that ancestor. So D2's enqueue of a child costs one lookup here
        // (the common case first), and a chain runs in linear time.
        if node.blocked > 0 {
            return true;
        }
        for nth in 0..self.node(id).children.len() {
            let child = self.node(id).children[nth];
            self.busy_from(child, slots);
        }
        if !self.node(id).children.is_empty() && slots.any_running() {
            self.cancel_running_below(id, slots);
        }
        self.node(id).waits > 0
    }

    /// D3: cancels every running descendant of `id`, which waits for each.
    fn cancel_running_below(&mut self, id: Id, slots: &mut impl KeySlots<K>) {
        let mut seen: HashSet<Id, Hasher> = HashSet::default();
        let mut stack = self.node(id).children.clone();
        while let Some(at) = stack.pop() {
            if !seen.insert(at) {
                continue;
            }
            let node = self.node(at);
            stack.extend_from_slice(&node.children);
            if node.pending && slots.pending(&node.key) == Pending::Running {
                slots.cancel(&node.key);
                self.waiters.entry(at).or_default().push(id);
                self.node_mut(id).waits += 1;
            }
        }
    }

    /// The reconcile of `key` (in slot `at`) returned, whatever comes next
    /// for it: the keys waiting for it wait for one fewer (D3).
    pub(crate) fn returned(&mut self, key: &K, at: u32, slots: &mut impl KeySlots<K>) {
        if self.waiters.is_empty() {
            return;
        }
        let Some(id) = self.id_at(key, at) else { return };
        let Some(waiters) = self.waiters.remove(&id) else { return };
        for waiter in waiters {
            let node = self.node_mut(waiter);
            node.waits -= 1;
            if node.waits == 0 && node.blocked == 0 && node.pending {
                slots.release(&node.key);
            }
            self.drop_if_unused(waiter);
        }
        self.drop_if_unused(id);
    }

    /// D2 at the end of `key`'s run when `key` leaves pending with it (its
    /// `done` finishes it, under the same lock): its children become
    /// pending in its place. A child that was not pending was busy through
    /// `key` and stays busy, pending now, so nothing below it changes: no
    /// walk, and no hold then release of it, as
    /// [`became_pending`](Self::became_pending) then
    /// [`left_pending`](Self::left_pending) would do. A child already
    /// pending loses `key` as a busy parent, as in `left_pending`. Returns
    /// every child for the queue to enqueue; `left_pending(key)` then has
    /// nothing left to do. `at`: `key`'s slot.
    pub(crate) fn hand_over(&mut self, key: &K, at: u32, slots: &mut impl KeySlots<K>) -> Vec<Child<K>> {
        let Some(id) = self.id_at(key, at) else { return Vec::new() };
        let node = self.node_mut(id);
        debug_assert!(node.pending, "a key handed out is pending");
        node.pending = false;
        // Not busy once it left: its children lose a busy parent.
        let frees = node.blocked == 0;
        let mut children = Vec::with_capacity(node.children.len());
        for nth in 0..self.node(id).children.len() {
            let node = NodeRef(self.node(id).children[nth]);
            let child = self.node_mut(node.0);
            if child.pending {
                children.push(Child::Pending(child.key.clone()));
                if frees {
                    self.free_from(node.0, slots);
                }
                continue;
            }
            debug_assert!(child.blocked > 0, "a child of a pending key is busy");
            child.pending = true;
            if frees {
                child.blocked -= 1;
            }
            children.push(Child::Handed { key: child.key.clone(), hold: child.must_hold(), node });
        }
        children
    }

    /// `key` is no longer pending (its slot already says so): if nothing
    /// above it is busy, its children lose a busy parent. Nothing if the
    /// graph knows already ([`hand_over`](Self::hand_over)). `at`: the
    /// slot `key` had.
    pub(crate) fn left_pending(&mut self, key: &K, at: u32, slots: &mut impl KeySlots<K>) {
        let Some(id) = self.id_at(key, at) else { return };
        let node = self.node_mut(id);
        if !node.pending {
            return;
        }
        node.pending = false;
        if node.blocked > 0 {
            return;
        }
        for nth in 0..self.node(id).children.len() {
            let child = self.node(id).children[nth];
            self.free_from(child, slots);
        }
    }

    /// `id` got one more busy parent; a key that became busy and is not
    /// pending passes it on to its children (iterative: chains are deep).
    fn busy_from(&mut self, id: Id, slots: &mut impl KeySlots<K>) {
        // `next` before `stack`: the common case, a pending key, allocates nothing.
        let (mut next, mut stack) = (Some(id), Vec::new());
        while let Some(at) = next.take().or_else(|| stack.pop()) {
            let node = self.node_mut(at);
            node.blocked += 1;
            if node.blocked > 1 {
                continue;
            }
            if node.pending {
                slots.hold(&node.key);
            } else {
                stack.extend_from_slice(&node.children);
            }
        }
    }

    /// `id` has one busy parent fewer; a key that stopped being busy
    /// passes it on as [`busy_from`](Self::busy_from) does.
    fn free_from(&mut self, id: Id, slots: &mut impl KeySlots<K>) {
        let (mut next, mut stack) = (Some(id), Vec::new());
        while let Some(at) = next.take().or_else(|| stack.pop()) {
            let node = self.node_mut(at);
            debug_assert!(node.blocked > 0, "a busy parent was counted");
            node.blocked -= 1;
            if node.blocked > 0 {
                continue;
            }
            if !node.pending {
                stack.extend_from_slice(&node.children);
            } else if node.waits == 0 {
                slots.release(&node.key);
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

    impl Dependencies<u32> {
        /// No key is blocked or waits.
        fn is_quiet(&self) -> bool {
            self.waiters.is_empty() && self.nodes.iter().flatten().all(|n| n.blocked == 0 && n.waits == 0)
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
            let hold = deps.became_pending(&key, key, self);
            if hold {
                self.held.insert(key);
            }
            hold
        }

        fn finish(&mut self, deps: &mut Dependencies<u32>, key: u32) {
            self.state.remove(&key);
            deps.returned(&key, key, self);
            deps.left_pending(&key, key, self);
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
        assert!(deps.is_quiet());
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
        assert!(deps.ids.is_empty() && deps.nodes.iter().all(Option::is_none), "no node is left");
    }

    #[test]
    fn d2_a_finished_key_hands_its_hold_over_to_its_children() {
        // 0 → {1, 2}; 2 also after 3; 1 already ready (held by 0).
        let mut deps = Dependencies::default();
        for (child, parents) in [(1, vec![0]), (2, vec![0, 3])] {
            deps.set_parents(&child, parents, &mut NothingPending).unwrap();
        }
        let mut m = Model::default();
        assert!(!m.ready(&mut deps, 0));
        m.state.insert(0, Pending::Running);
        assert!(m.ready(&mut deps, 1), "1 waits for 0");
        assert!(!m.ready(&mut deps, 3));
        m.state.remove(&0);
        let mut children = deps.hand_over(&0, 0, &mut m);
        children.sort_by_key(|child| match child {
            Child::Handed { key, .. } | Child::Pending(key) => *key,
        });
        match &children[..] {
            [Child::Pending(1), Child::Handed { key: 2, hold: true, .. }] => {}
            _ => panic!("1 was pending already; 2 is handed over, held by 3"),
        }
        assert!(!m.held.contains(&1), "1 lost its only busy parent");
        m.state.insert(2, Pending::Ready);
        m.held.insert(2);
        deps.left_pending(&0, 0, &mut m);
        assert!(m.held.contains(&2), "leaving after a hand-over frees nothing twice");
        m.finish(&mut deps, 3);
        assert!(!m.held.contains(&2), "released by its other parent");
        m.finish(&mut deps, 1);
        m.finish(&mut deps, 2);
        assert!(deps.is_quiet());
    }
}
