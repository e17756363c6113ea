//! The holds: what keeps a ready key out of the ready set (dependencies,
//! D1-D5; batches, U3), as one optional extension of the state table.
//!
//! A queue without dependencies or batches has no [`Holds`]: `state.rs`
//! keeps an `Option<Holds>` and tests it once where a key becomes ready or
//! finishes, so the plain path pays that one predictable branch and
//! nothing else. (Inline, not boxed: the graph is boxed inside, so the
//! test reads one pointer, and a graph call chases one, as before the
//! holds had a type of their own.) Once a controller sets an edge or opens a batch, the
//! queue calls in here at those points, with the slot table borrowed as a
//! [`Table`]; this file is the queue's side of the graph's seam
//! ([`KeySlots`]), so the graph (`crate::graph`) knows nothing of the
//! slab, the index or the ready set, and the state table knows nothing of
//! the graph's calls.
//!
//! Invariants kept here: `held` counts the `Ready { held: true }` slots
//! (none of them is in the ready set); `ready_seq` only grows, and a
//! released key joins the ready set after every key whose `seq` is not
//! greater (G4 per priority, as if it had never been held).

use std::hash::Hash;

use super::key_index::KeyIndex;
use super::ready::{GroupId, Priority, ReadySet};
use super::slab::Slab;
use super::slot::{Added, Cancel, CancelHook, Entry, Hasher, Slot};
use crate::graph::{Child, Dependencies, KeySlots, NodeRef, Pending, Pendings};

/// Dependencies and batches, with what they hold.
pub(super) struct Holds<K> {
    /// The edges (`crate::graph`); none for a batch alone.
    deps: Box<Dependencies<K>>,
    /// What cancels a running descendant (D3).
    cancel: CancelHook<K>,
    /// Number of `Ready { held: true }` slots.
    held: usize,
    /// The last `seq` given to a key that became ready.
    ready_seq: u64,
    /// While a batch is open (U3, `Some`): the keys it holds, released when
    /// it closes unless their dependencies hold them.
    batch: Option<Vec<K>>,
}

/// The slot table the holds act on: the parts of the queue's state they
/// read and write, borrowed for one call.
pub(super) struct Table<'a, K> {
    pub(super) entries: &'a mut Slab<Entry<K>>,
    pub(super) index: &'a KeyIndex<Hasher>,
    pub(super) ready: &'a mut ReadySet<u32>,
    /// Keys being reconciled (the queue's count, unchanged by the holds).
    pub(super) processing: usize,
}

impl<K> Table<'_, K> {
    fn reborrow(&mut self) -> Table<'_, K> {
        Table { entries: &mut *self.entries, index: self.index, ready: &mut *self.ready, processing: self.processing }
    }

    fn key(&self, at: u32) -> &K {
        &self.entries.get(at).key
    }
}

impl<K: Eq + Hash + Clone> Holds<K> {
    /// Holds with the edges of `deps` (set while no key was pending) and
    /// what cancels a running descendant (D3).
    pub(super) fn new(deps: Box<Dependencies<K>>, cancel: CancelHook<K>) -> Self {
        Self { deps, cancel, held: 0, ready_seq: 0, batch: None }
    }

    /// Number of ready keys held.
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// The `Ready` slot at `at`, not held, just became ready (added, or
    /// due): into the ready set unless its dependencies or the batch hold
    /// it (D1, D3).
    pub(super) fn became_ready(&mut self, table: &mut Table<'_, K>, at: u32, prio: Priority, group: GroupId) -> Added {
        let key = table.key(at).clone();
        let hold = self.with_graph(table, |deps, slots| deps.became_pending(&key, at, slots));
        self.ready_unless_held(table, at, prio, group, hold)
    }

    /// `done` of a key that comes back ready (its slot already `Ready`,
    /// not held): the keys waiting for its cancelled run are told, then it
    /// joins the ready set unless held.
    pub(super) fn returned_ready(&mut self, table: &mut Table<'_, K>, at: u32, prio: Priority, group: GroupId) {
        let key = table.key(at).clone();
        let hold = self.with_graph(table, |deps, slots| {
            deps.returned(&key, at, slots);
            deps.must_hold(&key)
        });
        self.ready_unless_held(table, at, prio, group, hold);
    }

    /// `done` of `key`, which had slot `at`, when it is no longer pending
    /// (left the queue, or waits for a due time). Returns whether keys it
    /// held joined the ready set.
    pub(super) fn left(&mut self, table: &mut Table<'_, K>, key: &K, at: u32) -> bool {
        self.with_graph(table, |deps, slots| {
            deps.returned(key, at, slots);
            deps.left_pending(key, at, slots);
            slots.released
        })
    }

    /// `Dependencies::hand_over` of `key` (slot `at`), whose `done` will
    /// finish it: its children, for the queue to add.
    pub(super) fn hand_over(&mut self, table: &mut Table<'_, K>, key: &K, at: u32) -> Vec<Child<K>> {
        self.with_graph(table, |deps, slots| deps.hand_over(key, at, slots))
    }

    /// A child handed over (`Child::Handed`, `node`) was made ready in slot
    /// `at`, at `prio` in `group`, to be held if `hold`.
    pub(super) fn handed_ready(
        &mut self,
        table: &mut Table<'_, K>,
        at: u32,
        (prio, group): (Priority, GroupId),
        hold: bool,
        node: NodeRef,
    ) {
        self.ready_unless_held(table, at, prio, group, hold);
        self.deps.placed(node, at);
    }

    /// Replaces `key`'s parents (D4: `Err` with the keys of the cycle it
    /// would close, nothing changed). Returns whether held keys were
    /// released.
    pub(super) fn set_parents(&mut self, table: &mut Table<'_, K>, key: &K, parents: Vec<K>) -> Result<bool, Vec<K>> {
        self.with_graph(table, |deps, slots| deps.set_parents(key, parents, slots).map(|()| slots.released))
    }

    /// `key`'s direct parents.
    pub(super) fn parents(&self, key: &K) -> Vec<K> {
        self.deps.parents(key)
    }

    /// `key`'s direct children.
    pub(super) fn children(&self, key: &K) -> Vec<K> {
        self.deps.children(key)
    }

    /// The pending ancestors holding `key` (D1).
    pub(super) fn pending_ancestors(&self, entries: &Slab<Entry<K>>, index: &KeyIndex<Hasher>, key: &K) -> Vec<K> {
        self.deps.pending_ancestors(key, &SlotsView { entries, index })
    }

    /// Opens the batch (U3; idempotent): from now on every key that becomes
    /// ready is held until [`close_batch`](Self::close_batch).
    pub(super) fn open_batch(&mut self) {
        self.batch.get_or_insert_with(Vec::new);
    }

    /// Closes the batch: every key it held that no dependency holds joins
    /// the ready set at its place (D1 then orders them). Returns whether
    /// any did.
    pub(super) fn close_batch(&mut self, table: &mut Table<'_, K>) -> bool {
        let Some(held) = self.batch.take() else { return false };
        self.with_graph(table, |deps, slots| {
            for key in &held {
                if !deps.must_hold(key) {
                    slots.release(key);
                }
            }
            slots.released
        })
    }

    /// An immediate stop dropped every held key (the state table forgot
    /// them): nothing is held any more.
    pub(super) fn dropped_held(&mut self) {
        self.held = 0;
        if let Some(batch) = &mut self.batch {
            batch.clear();
        }
    }

    /// The `Ready` slot at `at` joins the ready set at the next place in
    /// ready order, unless `hold` (its dependencies hold it) or an open
    /// batch holds it.
    fn ready_unless_held(
        &mut self,
        table: &mut Table<'_, K>,
        at: u32,
        prio: Priority,
        group: GroupId,
        hold: bool,
    ) -> Added {
        self.ready_seq += 1;
        let entry = table.entries.get_mut(at);
        let Slot::Ready { seq, held, .. } = &mut entry.slot else {
            unreachable!("a key that became ready has a Ready slot")
        };
        // The next place in ready order (D1: a released key keeps it).
        *seq = self.ready_seq;
        // An open batch keeps what no dependency holds, until it closes.
        let mut batch_holds = || match &mut self.batch {
            Some(batch) => {
                batch.push(entry.key.clone());
                true
            }
            None => false,
        };
        if hold || batch_holds() {
            *held = true;
            self.held += 1;
            return Added::Unchanged;
        }
        table.ready.push(at, prio, group);
        Added::Ready
    }

    /// Runs `f` with the dependencies and the queue's side of their seam.
    fn with_graph<R>(
        &mut self,
        table: &mut Table<'_, K>,
        f: impl FnOnce(&mut Dependencies<K>, &mut Slots<'_, K>) -> R,
    ) -> R {
        let Self { deps, cancel, held, batch, .. } = self;
        let mut slots = Slots { table: table.reborrow(), held, cancel, batch: batch.as_mut(), released: false };
        f(deps, &mut slots)
    }
}

/// The queue's side of the dependencies' seam (`crate::graph`).
struct Slots<'a, K> {
    table: Table<'a, K>,
    held: &'a mut usize,
    cancel: &'a CancelHook<K>,
    /// The open batch's held keys: what the dependencies release meanwhile
    /// stays held, for the batch to release when it closes.
    batch: Option<&'a mut Vec<K>>,
    /// A held key joined the ready set.
    released: bool,
}

/// The read-only side, for `pending_ancestors`.
struct SlotsView<'a, K> {
    entries: &'a Slab<Entry<K>>,
    index: &'a KeyIndex<Hasher>,
}

fn pending_of<K: Eq + Hash>(entries: &Slab<Entry<K>>, index: &KeyIndex<Hasher>, key: &K) -> Pending {
    match index.find(key, entries).map(|at| &entries.get(at).slot) {
        Some(Slot::Ready { .. }) => Pending::Ready,
        Some(Slot::Processing { .. }) => Pending::Running,
        Some(Slot::Delayed { .. }) | None => Pending::No,
    }
}

impl<K: Eq + Hash> Pendings<K> for SlotsView<'_, K> {
    fn pending(&self, key: &K) -> Pending {
        pending_of(self.entries, self.index, key)
    }
}

impl<K: Eq + Hash> Pendings<K> for Slots<'_, K> {
    fn pending(&self, key: &K) -> Pending {
        pending_of(self.table.entries, self.table.index, key)
    }
}

impl<K: Eq + Hash + Clone> KeySlots<K> for Slots<'_, K> {
    fn any_running(&self) -> bool {
        self.table.processing > 0
    }

    fn hold(&mut self, key: &K) {
        let Table { entries, index, ready, .. } = &mut self.table;
        let Some(at) = index.find(key, entries) else { return };
        if let Slot::Ready { held: held @ false, prio, group, .. } = &mut entries.get_mut(at).slot {
            *held = true;
            *self.held += 1;
            ready.remove(at, *prio, *group);
        }
    }

    fn release(&mut self, key: &K) {
        if let Some(batch) = &mut self.batch {
            batch.push(key.clone());
            return;
        }
        let Table { entries, index, ready, .. } = &mut self.table;
        let Some(at) = index.find(key, entries) else { return };
        let Slot::Ready { held: held @ true, prio, group, seq, .. } = &mut entries.get_mut(at).slot else {
            return;
        };
        *held = false;
        *self.held -= 1;
        self.released = true;
        let (prio, group, seq) = (*prio, *group, *seq);
        // At its place by the time it became ready (G4 per priority): after
        // every entry that became ready before it. Stale entries answer
        // with their key's slot; misplacing past one changes no live order.
        let entries = &**entries;
        let earlier = |e: &u32| {
            entries.get_live(*e).is_some_and(|entry| matches!(entry.slot, Slot::Ready { seq: s, .. } if s <= seq))
        };
        ready.insert_by(at, prio, group, earlier);
    }

    fn cancel(&mut self, key: &K) {
        (self.cancel)(key, Cancel::ByAncestor);
    }
}
