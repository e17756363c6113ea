//! The queue's state machine: single-threaded, no locks, no clock.
//!
//! [`WorkQueue`](super::WorkQueue) wraps one `QueueState` in a mutex and adds
//! blocking and wake-ups; everything about *which* key goes where lives here,
//! so it can be tested against a model without threads.
//!
//! Each known key has exactly one [`Slot`], which replaces client-go's
//! separate dirty set, processing set and waiting map: one hash lookup per
//! operation instead of two or three, and the invariants are checked by the
//! type instead of by convention. Keys and their slots are stored in a slab
//! (`slab.rs`) and the ready set holds their indices, so handing a key out
//! needs no hash lookup at all:
//!
//! * a key is in the ready set (by its index) exactly when its slot is
//!   `Ready`, at the priority and in the group its slot holds (the set's
//!   order is `ready.rs`'s business);
//! * a key's index never changes while the queue knows it, except all at
//!   once when a sparse slab is compacted (every index held is then mapped
//!   to its new value);
//! * a key has a live delay-heap entry exactly when its slot holds a `Timer`;
//! * a `Processing` key is never in the FIFO (G2), and what happens to it at
//!   `done` (nothing, ready again, or wait for a due time) is in its slot (G3).
//!
//! A key's priority only rises while it is in the queue (P2): every add
//! raises it to the add's priority if that is higher, whatever the add does
//! to the key's timing. A key being processed remembers, in `again`, the
//! highest priority it was added with meanwhile, and comes back with it. Its
//! group is fixed when it enters the queue (absent → present) and kept
//! until it leaves.
//!
//! A named queue also records metrics here (see `metrics.rs`): a ready key's
//! slot keeps its add stamp, a processing key's slot the index of its start
//! stamp. An unnamed queue stores zeros there and never reads the clock.
//!
//! The vocabulary (slots, places, what an operation answers) is in
//! `slot.rs`. Two optional extensions sit beside the table, each behind an
//! `Option` and called through a few narrow methods: the holds
//! (dependencies and batches, `holds.rs`) and the store's stop views
//! (`stop_views.rs`). A queue with neither pays one predictable branch on
//! its hot path: [`push_pending`](QueueState::push_pending) tests
//! `holds` where a key becomes ready, and `done` tests it where a key
//! finishes or comes back.

use std::hash::Hash;
use std::sync::Arc;
use std::time::Instant;

use super::again_counts::AgainCounts;
use super::delay_heap::{DelayHeap, Timer};
use super::holds::{Holds, Table};
use super::key_index::{KeyIndex, Prefetcher};
use super::metrics::{Now, QueueSnapshot, Recorder};
use super::ready::{GroupId, Priority, ReadySet};
use super::slab::Slab;
use super::slot::{Added, Cancel, CancelHook, Entry, Finished, Hasher, KeyState, Place, Slot, Then, View};
use super::stop_views::StopViews;
use crate::graph::{Child, Dependencies};

pub(crate) struct QueueState<K> {
    /// Every known key with its slot.
    entries: Slab<Entry<K>>,
    /// Finds a key's entry.
    index: KeyIndex<Hasher>,
    /// Ready keys, by entry index.
    ready: ReadySet<u32>,
    delays: DelayHeap<K>,
    /// Number of slots holding a live timer (`Delayed` or `Processing(Wait)`).
    timers: usize,
    /// Number of `Delayed` slots (the public "waiting" count).
    delayed: usize,
    processing: usize,
    /// Number of `Ready { owed: true }` slots.
    owed: usize,
    /// The `Processing { then: Requeue }` slots (dirty keys being
    /// processed: part of the metrics' depth) by their `again` priority.
    requeue_after_done: AgainCounts,
    recorder: Recorder,
    shutting_down: bool,
    draining: bool,
    /// Keys a shutdown dropped (delayed, waiting to retry, or ready at an
    /// immediate stop), until [`take_dropped`](QueueState::take_dropped):
    /// a stop reports them instead of losing them silently.
    /// Each with what it was then (its due time, the priority it would
    /// have run at).
    dropped: Vec<(K, View)>,
    /// `supersede` (U1), with what cancels a reconcile: a key that becomes
    /// ready while it is processed cancels that reconcile, and comes back
    /// with the higher of the two priorities. A transition of the table
    /// (an add while processing), so it lives here, not in the holds.
    supersede: Option<CancelHook<K>>,
    /// Dependencies and batches, once a controller set an edge or opened a
    /// batch (`None`: one branch per add and `done`, nothing else).
    holds: Option<Holds<K>>,
    /// With a store: what shutdowns dropped or refused, and the dependents
    /// D2 added, until the store samples them.
    stop_views: Option<Box<StopViews<K>>>,
}

impl<K: Eq + Hash + Clone> QueueState<K> {
    /// A queue state handing keys out from `ready` (plain or fair).
    pub(crate) fn new(recorder: Recorder, ready: ReadySet<u32>) -> Self {
        Self {
            entries: Slab::new(),
            index: KeyIndex::new(Hasher::default()),
            ready,
            delays: DelayHeap::new(),
            timers: 0,
            delayed: 0,
            processing: 0,
            owed: 0,
            requeue_after_done: AgainCounts::default(),
            recorder,
            shutting_down: false,
            draining: false,
            dropped: Vec::new(),
            supersede: None,
            holds: None,
            stop_views: None,
        }
    }

    /// Marks `key` as needing processing now (G1, G2, G5's "add cancels the
    /// delay").
    pub(crate) fn add(&mut self, key: K, place: Place, now: &mut Now) -> Added {
        if self.shutting_down {
            return Added::Unchanged;
        }
        // One hash lookup whatever the key's state.
        let at = match self.index.entry(&key, &self.entries) {
            Ok(at) => at,
            Err(vacant) => {
                let slot = Slot::new_ready(self.recorder.on_add(now), place);
                let at = self.entries.insert(Entry { key, slot });
                vacant.insert(at);
                return self.push_pending(at, place.prio, place.group);
            }
        };
        let slot = &mut self.entries.get_mut(at).slot;
        match *slot {
            Slot::Delayed { .. } => {
                let (prio, group) = self.ready_from_delayed(at, place, now);
                self.push_pending(at, prio, group)
            }
            Slot::Ready { owed, held, added, seq, prio, group } if place.prio > prio => {
                *slot = Slot::Ready { owed, held, added, seq, prio: place.prio, group };
                if !held {
                    self.ready.raise(at, prio, place.prio, group);
                }
                Added::Unchanged
            }
            Slot::Ready { .. } => Added::Unchanged,
            Slot::Processing { then: then @ Then::Requeue { .. }, run, group, again } => {
                self.requeue_after_done.moved(again, again.max(place.prio));
                *slot = Slot::Processing { then, run, group, again: again.max(place.prio) };
                Added::Unchanged
            }
            Slot::Processing { then, run, group, again } => {
                // `again` is the priority it was handed out with while
                // `then` is `Finish`: a superseded run keeps the higher one.
                let again = if let Then::Wait(_) = then {
                    self.timers -= 1;
                    again.max(place.prio)
                } else if self.supersede.is_some() {
                    again.max(place.prio)
                } else {
                    place.prio
                };
                let added = self.recorder.on_add(now);
                self.requeue_after_done.add(again);
                *slot = Slot::Processing { then: Then::Requeue { added }, run, group, again };
                self.supersede_run(at);
                Added::Unchanged
            }
        }
    }

    /// The `Delayed` slot at `at` becomes `Ready` (not in the ready set
    /// yet) with the higher of its priority and `place`'s; its due time is
    /// dropped. Returns its priority and group.
    fn ready_from_delayed(&mut self, at: u32, place: Place, now: &mut Now) -> (Priority, GroupId) {
        let added = self.recorder.on_add(now);
        let slot = &mut self.entries.get_mut(at).slot;
        let Slot::Delayed { prio, group, .. } = *slot else { unreachable!("a key waiting for a due time") };
        let prio = prio.max(place.prio);
        *slot = Slot::Ready { owed: false, held: false, added, seq: 0, prio, group };
        self.timers -= 1;
        self.delayed -= 1;
        (prio, group)
    }

    /// Prefetches the index bucket an [`add`](Self::add) of a key will
    /// look at, for threads about to take the lock (see `key_index.rs`).
    pub(crate) fn prefetcher(&self) -> Arc<Prefetcher<Hasher>> {
        self.index.prefetcher()
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
    pub(crate) fn add_at(&mut self, key: K, due: Instant, now: Instant, stamp: &mut Now, place: Place) -> Added {
        if due <= now {
            return self.add(key, place, stamp);
        }
        if self.shutting_down {
            return Added::Unchanged;
        }
        let earlier = |timer: &Timer| due < timer.due;
        let at = match self.index.entry(&key, &self.entries) {
            Ok(at) => at,
            Err(vacant) => {
                let timer = self.delays.schedule(key.clone(), due);
                let slot = Slot::Delayed { timer, prio: place.prio, group: place.group };
                vacant.insert(self.entries.insert(Entry { key, slot }));
                self.timers += 1;
                self.delayed += 1;
                self.compact_delays();
                return Added::Scheduled(due);
            }
        };
        let slot = &mut self.entries.get_mut(at).slot;
        match *slot {
            Slot::Delayed { timer: old, prio, group } if earlier(&old) => {
                let timer = self.delays.schedule(key, due);
                *slot = Slot::Delayed { timer, prio: prio.max(place.prio), group };
            }
            Slot::Processing { then: Then::Finish, run, group, .. } => {
                let timer = self.delays.schedule(key, due);
                *slot = Slot::Processing { then: Then::Wait(timer), run, group, again: place.prio };
                self.timers += 1;
            }
            Slot::Processing { then: Then::Wait(old), run, group, again } if earlier(&old) => {
                let timer = self.delays.schedule(key, due);
                *slot = Slot::Processing { then: Then::Wait(timer), run, group, again: again.max(place.prio) };
            }
            _ => {
                // The timing stays; the priority may still rise (P2).
                self.raise(at, place.prio);
                return Added::Unchanged;
            }
        }
        self.compact_delays();
        Added::Scheduled(due)
    }

    /// Moves `key`'s due time from `from` to `to`, later or earlier (U2, a
    /// debounce's trailing edge), if its live timer is still the one due at
    /// `from`; `None` (nothing changed) otherwise. A `to` not after `now`
    /// makes it ready.
    pub(crate) fn move_due(
        &mut self,
        key: K,
        from: Instant,
        to: Instant,
        now: Instant,
        stamp: &mut Now,
        place: Place,
    ) -> Option<Added> {
        let at = self.index.find(&key, &self.entries)?;
        let slot = &mut self.entries.get_mut(at).slot;
        match *slot {
            Slot::Delayed { timer, .. } | Slot::Processing { then: Then::Wait(timer), .. } if timer.due == from => {}
            _ => return None,
        }
        if to <= now {
            return Some(self.add(key, place, stamp));
        }
        let timer = self.delays.schedule(key, to);
        match slot {
            Slot::Delayed { timer: live, prio, .. } => {
                *live = timer;
                *prio = (*prio).max(place.prio);
            }
            Slot::Processing { then: Then::Wait(live), again, .. } => {
                *live = timer;
                *again = (*again).max(place.prio);
            }
            _ => unreachable!("matched above"),
        }
        self.compact_delays();
        Some(Added::Scheduled(to))
    }

    /// Raises the priority the key at `at` has, or comes back with, to `to`
    /// if that is higher (P2). A key being processed that will not come
    /// back keeps nothing.
    fn raise(&mut self, at: u32, to: Priority) {
        let slot = &mut self.entries.get_mut(at).slot;
        match slot {
            Slot::Ready { prio, group, held, .. } if to > *prio => {
                if !*held {
                    self.ready.raise(at, *prio, to, *group);
                }
                *prio = to;
            }
            Slot::Delayed { prio, .. } => *prio = (*prio).max(to),
            Slot::Processing { then: Then::Wait(_), again, .. } => *again = (*again).max(to),
            Slot::Processing { then: Then::Requeue { .. }, again, .. } => {
                self.requeue_after_done.moved(*again, (*again).max(to));
                *again = (*again).max(to);
            }
            Slot::Ready { .. } | Slot::Processing { then: Then::Finish, .. } => {}
        }
    }

    /// Moves every key whose due time has come into the ready set (or marks
    /// it dirty if it is being processed). Returns how many became ready.
    /// Each counts as an add for the metrics, stamped now, as client-go's
    /// delaying queue adds a key when its time comes.
    pub(crate) fn promote_due(&mut self, now: Instant, stamp: &mut Now) -> usize {
        let mut promoted = 0;
        while let Some((key, timer)) = self.delays.pop_due(now) {
            let Some(at) = self.index.find(&key, &self.entries) else { continue };
            let slot = &mut self.entries.get_mut(at).slot;
            match *slot {
                Slot::Delayed { timer: live, prio, group } if live == timer => {
                    let added = self.recorder.on_add(stamp);
                    *slot = Slot::Ready { owed: false, held: false, added, seq: 0, prio, group };
                    self.timers -= 1;
                    self.delayed -= 1;
                    if self.push_pending(at, prio, group) == Added::Ready {
                        promoted += 1;
                    }
                }
                Slot::Processing { then: Then::Wait(live), run, group, again } if live == timer => {
                    let then = Then::Requeue { added: self.recorder.on_add(stamp) };
                    *slot = Slot::Processing { then, run, group, again };
                    self.requeue_after_done.add(again);
                    self.timers -= 1;
                    self.supersede_run(at);
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
        let (index, entries) = (&self.index, &self.entries);
        self.delays.peek_live(|key, timer| is_live(index, entries, key, timer)).map(|t| t.due)
    }

    /// Hands out the next ready key (G4, P1, P4, P5: see `ready.rs`) with
    /// its priority, and marks it processing (G2).
    pub(crate) fn take(&mut self, now: &mut Now) -> Option<(K, Priority)> {
        let (at, prio, group) = self.ready.pop()?;
        // On a deep backlog the entries ahead are not cached: start loading
        // them a step ahead, as a pipeline. The entry after next, so the
        // next `take` finds it; and the next key's home bucket in the index
        // (its entry was loaded by the previous `take`), so its `done` finds
        // that (see `key_index.rs`).
        if let Some(after_next) = self.ready.peek(1) {
            self.entries.prefetch(after_next);
        }
        if let Some(next) = self.ready.peek(0).and_then(|next| self.entries.get_live(next)) {
            self.index.prefetch(&next.key);
        }
        let entry = self.entries.get_mut(at);
        let Slot::Ready { owed, added, .. } = entry.slot else {
            unreachable!("a key in the ready set has a Ready slot")
        };
        if owed {
            self.owed -= 1;
        }
        let run = self.recorder.on_get(added, now);
        entry.slot = Slot::Processing { then: Then::Finish, run, group, again: prio };
        self.processing += 1;
        Some((entry.key.clone(), prio))
    }

    /// Ends the processing of `key`. `now` is asked only when the key waits
    /// for a due time, to tell whether that time has already come.
    pub(crate) fn done(&mut self, key: &K, now: impl FnOnce() -> Instant, stamp: &mut Now) -> Finished {
        let Some(at) = self.index.find(key, &self.entries) else {
            return Finished::NotProcessing;
        };
        let slot = &mut self.entries.get_mut(at).slot;
        let Slot::Processing { then, run, group, again } = *slot else {
            return Finished::NotProcessing;
        };
        self.processing -= 1;
        self.recorder.on_done(run, stamp);
        // Before any re-queue below, so a full group's own key is not held.
        self.ready.finished(group);
        match then {
            Then::Finish => {
                if self.holds.is_some() {
                    return self.finish_held(at);
                }
                self.forget(at);
                self.compact_if_sparse();
                Finished::Removed
            }
            Then::Wait(timer) if timer.due > now() => {
                *slot = Slot::Delayed { timer, prio: again, group };
                self.delayed += 1;
                if self.holds.is_some() {
                    self.wait_held(at);
                }
                Finished::Waiting(timer.due)
            }
            Then::Wait(_) | Then::Requeue { .. } => {
                let added = match then {
                    Then::Requeue { added } => {
                        self.requeue_after_done.remove(again);
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
                *slot = Slot::Ready { owed, held: false, added, seq: 0, prio: again, group };
                if self.holds.is_some() {
                    return self.requeue_held(at, again, group);
                }
                self.ready.push(at, again, group);
                Finished::Requeued
            }
        }
    }

    /// A key whose slot just became `Ready` (not held): into the ready set,
    /// unless the holds keep it (D1, D3, U3). Without holds, one branch
    /// (the rest is out of line): the plain path's one test.
    #[inline(always)]
    fn push_pending(&mut self, at: u32, prio: Priority, group: GroupId) -> Added {
        if self.holds.is_some() {
            return self.push_pending_held(at, prio, group);
        }
        self.ready.push(at, prio, group);
        Added::Ready
    }

    /// Removes the key at `at` from the queue and returns it. (Indices
    /// stay valid: the caller compacts when it holds none.)
    fn forget(&mut self, at: u32) -> K {
        let entry = self.entries.remove(at);
        self.index.remove(&entry.key, at);
        entry.key
    }

    /// Compacts a mostly free slab, mapping the indices the index and the
    /// ready set hold.
    fn compact_if_sparse(&mut self) {
        if self.entries.is_sparse() {
            let remap = self.entries.compact();
            self.index.remap(&remap);
            self.ready.remap(&remap);
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
        let (entries, dropped, stop_views) = (&mut self.entries, &mut self.dropped, &mut self.stop_views);
        self.index.retain(|at| {
            let entry = entries.get_mut(at);
            match entry.slot {
                Slot::Delayed { timer, prio, .. } => {
                    Self::note_dropped(stop_views, dropped, entries.remove(at).key, (Some(timer.due), prio));
                    false
                }
                Slot::Processing { then: Then::Wait(timer), run, group, again } => {
                    // In flight at an immediate stop: ready at restore.
                    entry.slot = Slot::Processing { then: Then::Finish, run, group, again };
                    Self::note_dropped(stop_views, dropped, entry.key.clone(), (drain.then_some(timer.due), again));
                    true
                }
                _ => true,
            }
        });
        self.compact_if_sparse();
        self.delays.clear();
        self.timers = 0;
        self.delayed = 0;
    }

    /// Drops every ready key as well (an immediate stop). Keys being processed
    /// are untouched; `done` will finish them without re-queueing.
    pub(crate) fn discard_ready(&mut self) {
        self.recorder.on_discard(self.ready.len() + self.requeue_after_done.total());
        if let Some(views) = &mut self.stop_views {
            views.set_discarded();
        }
        for at in self.ready.drain() {
            let prio = match self.entries.get(at).slot {
                Slot::Ready { prio, .. } => prio,
                _ => 0,
            };
            let key = self.forget(at);
            Self::note_dropped(&mut self.stop_views, &mut self.dropped, key, (None, prio));
        }
        self.compact_if_sparse();
        self.discard_held();
        for (_, entry) in self.entries.iter_mut() {
            if let Slot::Processing { then, again, .. } = &mut entry.slot {
                if matches!(then, Then::Requeue { .. }) {
                    Self::note_dropped(&mut self.stop_views, &mut self.dropped, entry.key.clone(), (None, *again));
                }
                *then = Then::Finish;
            }
        }
        self.owed = 0;
        self.requeue_after_done.clear();
    }

    /// Drops every key the holds keep (an immediate stop).
    fn discard_held(&mut self) {
        if self.held_len() == 0 {
            return;
        }
        let held: Vec<(u32, Priority)> = self
            .entries
            .iter_mut()
            .filter_map(|(at, entry)| match entry.slot {
                Slot::Ready { held: true, prio, .. } => Some((at, prio)),
                _ => None,
            })
            .collect();
        for (at, prio) in held {
            let key = self.forget(at);
            Self::note_dropped(&mut self.stop_views, &mut self.dropped, key, (None, prio));
        }
        if let Some(holds) = &mut self.holds {
            holds.dropped_held();
        }
        self.compact_if_sparse();
    }

    /// The keys shutdowns dropped and no one took yet, with what each was
    /// then.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding hands keys over
    pub(crate) fn dropped(&self) -> &[(K, View)] {
        &self.dropped
    }

    /// The keys shutdowns dropped since the last call.
    pub(crate) fn take_dropped(&mut self) -> Vec<K> {
        std::mem::take(&mut self.dropped).into_iter().map(|(key, _)| key).collect()
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

    /// The slot of `key`, if the queue knows it.
    fn slot(&self, key: &K) -> Option<&Slot> {
        Some(&self.entries.get(self.index.find(key, &self.entries)?).slot)
    }

    pub(crate) fn key_state(&self, key: &K) -> KeyState {
        self.slot(key).map_or(KeyState::Absent, Slot::state)
    }

    /// The priority a retry of `key` re-adds it with (P3): the one it was
    /// handed out with if it is being processed and nothing was added for
    /// it meanwhile, else 0 (an add meanwhile already set the priority it
    /// comes back with, and a retry only raises that). The slot keeps the
    /// handed-out priority only until such an add, so that `Slot` stays
    /// 40 bytes: a retry after a lower add comes back at the add's
    /// priority.
    pub(crate) fn retry_priority(&self, key: &K) -> Priority {
        match self.slot(key) {
            Some(Slot::Processing { then: Then::Finish, again, .. }) => *again,
            _ => 0,
        }
    }

    /// What a store keeps of `key` (see `crate::store`): `None` if the queue
    /// does not hold it, else its slot's [`view`](Slot::view). A key a
    /// shutdown dropped or refused (with stop views) answers with what it
    /// was then.
    #[cfg_attr(not(feature = "store"), allow(dead_code))] // only a store asks
    pub(crate) fn pending_view(&self, key: &K) -> Option<View> {
        match self.slot(key) {
            Some(slot) => Some(slot.view()),
            None => self.stop_views.as_ref()?.get(key),
        }
    }

    /// Every key the queue holds pending (ready, held, waiting for a due
    /// time, or in flight with a run queued after it), with its
    /// [`view`](Slot::view) (its due time, the priority it runs at next),
    /// and after a stop the keys it dropped, as they were: what a
    /// partition given up hands over (C2), at a rebalance or at a stop.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding hands keys over
    pub(crate) fn pending_keys(&self, out: &mut Vec<(K, View)>)
    where
        K: Clone,
    {
        let pending = self.entries.iter().filter(|e| !matches!(e.slot, Slot::Processing { then: Then::Finish, .. }));
        out.extend(pending.map(|e| (e.key.clone(), e.slot.view())));
        out.extend(self.dropped().iter().cloned());
    }

    /// Nothing ready, processing or waiting for a due time.
    pub(crate) fn is_idle(&self) -> bool {
        self.ready.is_empty() && self.processing == 0 && self.timers == 0 && self.held_len() == 0
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

    /// Number of ready keys a getter could take now (not those of a full
    /// group).
    pub(crate) fn available(&self) -> usize {
        self.ready.available()
    }

    /// Whether keys are served by group (a fair ready set).
    pub(crate) fn has_groups(&self) -> bool {
        self.ready.has_groups()
    }

    /// Ready keys per priority, highest first.
    pub(crate) fn by_priority(&self) -> Vec<(Priority, usize)> {
        self.ready.by_priority()
    }

    /// Keys being processed per group (empty without groups).
    pub(crate) fn in_flight_by_group(&self) -> Vec<(GroupId, usize)> {
        self.ready.in_flight_by_group()
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
        self.recorder.snapshot(|| self.depth_by_priority())
    }

    /// The metrics' depth (ready keys and keys marked to be ready again at
    /// `done`) per priority, highest first, no priority with 0 keys.
    fn depth_by_priority(&self) -> Vec<(Priority, usize)> {
        let mut depth = self.ready.by_priority();
        for &(prio, keys) in self.requeue_after_done.by_priority() {
            match depth.iter_mut().find(|(p, _)| *p == prio) {
                Some((_, n)) => *n += keys,
                None => depth.push((prio, keys)),
            }
        }
        depth.sort_unstable_by_key(|&(prio, _)| std::cmp::Reverse(prio));
        depth
    }

    fn compact_delays(&mut self) {
        let (index, entries) = (&self.index, &self.entries);
        self.delays.compact_if_sparse(self.timers, |key, timer| is_live(index, entries, key, timer));
    }
}

/// The doors to the optional extensions: the holds (dependencies and
/// batches, `holds.rs`), `supersede`, and the store's stop views
/// (`stop_views.rs`). Each reaches the table only through these methods.
impl<K: Eq + Hash + Clone> QueueState<K> {
    /// The holds, if on, and the slot table they act on (the graph's seam).
    fn holds_and_table(&mut self) -> Option<(&mut Holds<K>, Table<'_, K>)> {
        let Self { holds, entries, index, ready, processing, .. } = self;
        let holds = holds.as_mut()?;
        Some((holds, Table { entries, index, ready, processing: *processing }))
    }

    /// [`push_pending`](Self::push_pending)'s out-of-line half, with holds.
    #[inline(never)]
    fn push_pending_held(&mut self, at: u32, prio: Priority, group: GroupId) -> Added {
        let (holds, mut table) = self.holds_and_table().expect("holds are on");
        holds.became_ready(&mut table, at, prio, group)
    }

    /// `done`'s `Finish` with holds: the key leaves, and keys it held may
    /// become ready.
    #[inline(never)]
    fn finish_held(&mut self, at: u32) -> Finished {
        let key = self.forget(at);
        let (holds, mut table) = self.holds_and_table().expect("holds are on");
        let released = holds.left(&mut table, &key, at);
        self.compact_if_sparse();
        if released { Finished::Released } else { Finished::Removed }
    }

    /// `done`'s `Wait` with holds: the key waits for its due time, so it is
    /// no longer pending, and keys it held may become ready.
    #[inline(never)]
    fn wait_held(&mut self, at: u32) {
        let (holds, mut table) = self.holds_and_table().expect("holds are on");
        let key = table.entries.get(at).key.clone();
        holds.left(&mut table, &key, at);
    }

    /// `done`'s re-queue with holds (the slot already `Ready`): the holds
    /// place it.
    #[inline(never)]
    fn requeue_held(&mut self, at: u32, prio: Priority, group: GroupId) -> Finished {
        let (holds, mut table) = self.holds_and_table().expect("holds are on");
        holds.returned_ready(&mut table, at, prio, group);
        Finished::Requeued
    }

    /// U1: the processing key at `at` became ready again; with
    /// `supersede`, its running reconcile is cancelled (`done` then brings
    /// it back, as for any key added while processing).
    #[inline]
    fn supersede_run(&self, at: u32) {
        if let Some(cancel) = &self.supersede {
            cancel(&self.entries.get(at).key, Cancel::Superseded);
        }
    }

    /// Turns `supersede` on (U1), with what cancels a running reconcile.
    pub(crate) fn enable_supersede(&mut self, cancel: CancelHook<K>) {
        self.supersede = Some(cancel);
    }

    /// Turns dependencies on with the edges of `deps`, set while no key
    /// was pending (a controller's first edge, or those set before start).
    pub(crate) fn enable_dependencies(&mut self, deps: Box<Dependencies<K>>, cancel: CancelHook<K>) {
        debug_assert!(self.holds.is_none());
        self.holds = Some(Holds::new(deps, cancel));
    }

    /// Whether dependencies are on.
    pub(crate) fn has_dependencies(&self) -> bool {
        self.holds.is_some()
    }

    /// Replaces `key`'s parents (D4: `Err` with the keys of the cycle it
    /// would close, nothing changed). Returns whether held keys were
    /// released.
    pub(crate) fn set_dependencies(&mut self, key: &K, parents: Vec<K>) -> Result<bool, Vec<K>> {
        let (holds, mut table) = self.holds_and_table().expect("dependencies are set");
        holds.set_parents(&mut table, key, parents)
    }

    /// `key`'s direct parents.
    pub(crate) fn dependencies(&self, key: &K) -> Vec<K> {
        self.holds.as_ref().map(|h| h.parents(key)).unwrap_or_default()
    }

    /// `key`'s direct children.
    pub(crate) fn dependents(&self, key: &K) -> Vec<K> {
        self.holds.as_ref().map(|h| h.children(key)).unwrap_or_default()
    }

    /// Opens the batch (U3; idempotent): from now on every key that becomes
    /// ready is held until [`close_batch`](Self::close_batch). Dependencies
    /// must be on: a batch holds keys through the holds.
    pub(crate) fn open_batch(&mut self) {
        self.holds.as_mut().expect("a batch holds keys through the dependencies' seam").open_batch();
    }

    /// Closes the batch: every key it held that no dependency holds joins
    /// the ready set at its place (D1 then orders them). Returns whether
    /// any did.
    pub(crate) fn close_batch(&mut self) -> bool {
        let Some((holds, mut table)) = self.holds_and_table() else { return false };
        holds.close_batch(&mut table)
    }

    /// D2 for a processing `key`, just before its `done`: adds each of its
    /// direct children at the default place. When that `done` finishes
    /// `key`, its hold passes to the children at once (`hand_over`);
    /// otherwise they are added as any enqueue, and held while `key` is
    /// pending.
    pub(crate) fn add_dependents(&mut self, key: &K, now: &mut Now) {
        if self.shutting_down {
            return;
        }
        if let Some(children) = self.hand_over(key) {
            for child in children {
                match child {
                    Child::Handed { key, hold, node } => {
                        let (at, place) = self.ready_handed(key, now);
                        let (holds, mut table) = self.holds_and_table().expect("holds are on");
                        holds.handed_ready(&mut table, at, place, hold, node);
                    }
                    Child::Pending(key) => {
                        self.add(key, Place::default(), now);
                    }
                }
            }
            return;
        }
        for child in self.dependents(key) {
            self.add(child, Place::default(), now);
        }
    }

    /// The holds' `hand_over` of `key`, if its `done` will finish it (it
    /// leaves pending then).
    fn hand_over(&mut self, key: &K) -> Option<Vec<Child<K>>> {
        self.holds.as_ref()?;
        let at = self.index.find(key, &self.entries)?;
        if !matches!(self.entries.get(at).slot, Slot::Processing { then: Then::Finish, .. }) {
            return None;
        }
        let (holds, mut table) = self.holds_and_table()?;
        Some(holds.hand_over(&mut table, key, at))
    }

    /// Makes `key` ready, not in the ready set yet, which the graph
    /// already counts as pending: it was not pending, so the queue does not
    /// know it or it waits for a due time. Returns its slot, priority and
    /// group, for the holds to place it.
    fn ready_handed(&mut self, key: K, now: &mut Now) -> (u32, (Priority, GroupId)) {
        let place = Place::default();
        match self.index.entry(&key, &self.entries) {
            Err(vacant) => {
                let slot = Slot::new_ready(self.recorder.on_add(now), place);
                let at = self.entries.insert(Entry { key, slot });
                vacant.insert(at);
                (at, (place.prio, place.group))
            }
            Ok(at) => (at, self.ready_from_delayed(at, place, now)),
        }
    }

    /// The pending ancestors holding `key` (D1).
    pub(crate) fn waiting_for(&self, key: &K) -> Vec<K> {
        let Some(holds) = &self.holds else { return Vec::new() };
        holds.pending_ancestors(&self.entries, &self.index, key)
    }

    /// Number of ready keys the holds keep.
    pub(crate) fn held_len(&self) -> usize {
        self.holds.as_ref().map_or(0, |h| h.held())
    }

    /// Keeps what shutdowns drop or refuse, so `pending_view` still answers
    /// for those keys (a controller's store writes them at its last flush),
    /// and the dependents D2 adds until the store samples them.
    pub(crate) fn for_store(&mut self) {
        self.stop_views = Some(Box::new(StopViews::new()));
    }

    /// Adds `key` as a dependent of a finished key (D2), remembering it for
    /// the store if there is one.
    pub(crate) fn add_placed_dependent(&mut self, key: K, place: Place, now: &mut Now) {
        if let Some(views) = &mut self.stop_views {
            views.add_dependent(key.clone());
        }
        self.add(key, place, now);
    }

    /// The dependents D2 added since the last call, each with its
    /// [`pending_view`](Self::pending_view) now.
    pub(crate) fn take_dependents_views(&mut self, out: &mut Vec<(K, Option<View>)>) {
        let Some(views) = &mut self.stop_views else { return };
        let keys = views.take_dependents();
        out.extend(keys.into_iter().map(|key| {
            let view = self.pending_view(&key);
            (key, view)
        }));
    }

    /// A reconcile's retry of `key` at `due`: [`add_at`](Self::add_at), or,
    /// once shut down, kept in the stop views (a stop must not lose a retry
    /// from the store, S2).
    pub(crate) fn retry_at(&mut self, key: K, due: Instant, now: Instant, stamp: &mut Now, place: Place) -> Added {
        if self.shutting_down {
            if let Some(views) = &mut self.stop_views {
                views.keep_retry(key, due, place.prio);
            }
            return Added::Unchanged;
        }
        self.add_at(key, due, now, stamp, place)
    }

    /// A shutdown dropped `key`, which was `view`: kept for the stop's
    /// report (and its hand-over), and with a store in its stop views.
    fn note_dropped(stop_views: &mut Option<Box<StopViews<K>>>, dropped: &mut Vec<(K, View)>, key: K, view: View) {
        if let Some(views) = stop_views {
            views.keep(key.clone(), view);
        }
        dropped.push((key, view));
    }
}

/// Whether `timer` is `key`'s live due time (a heap entry can be stale).
fn is_live<K: Eq + Hash>(index: &KeyIndex<Hasher>, entries: &Slab<Entry<K>>, key: &K, timer: Timer) -> bool {
    let slot = index.find(key, entries).map(|at| &entries.get(at).slot);
    matches!(slot, Some(Slot::Delayed { timer: t, .. } | Slot::Processing { then: Then::Wait(t), .. }) if *t == timer)
}

#[cfg(test)]
mod tests;
