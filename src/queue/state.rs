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

use std::hash::Hash;
use std::sync::Arc;
use std::time::Instant;

use super::delay_heap::{DelayHeap, Timer};
use super::key_index::{KeyIndex, Prefetcher};
use super::metrics::{Now, QueueSnapshot, Recorder};
use super::ready::{GroupId, Priority, ReadySet};
use super::slab::{Keyed, Slab};
use super::stop_views::{StopViews, View};
use crate::graph::{Child, Dependencies, KeySlots, Pending, Pendings};

/// Cancels the running reconcile of a key (D3, U1), called under the
/// queue's lock.
pub(crate) type CancelHook<K> = Arc<dyn Fn(&K, Cancel) + Send + Sync>;

/// Why the queue cancels a running reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cancel {
    /// An ancestor became pending (D3).
    ByAncestor,
    /// Its key became ready again (U1, `supersede`): a reconcile that
    /// enqueued its own key is spared.
    Superseded,
}

pub(crate) type Hasher = foldhash::fast::RandomState;

/// A known key and where it stands.
struct Entry<K> {
    key: K,
    slot: Slot,
}

impl<K> Keyed<K> for Entry<K> {
    fn key(&self) -> &K {
        &self.key
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// In the ready set. `owed` marks a key re-queued by `done` during a
    /// drain: the drain waits for it to be processed too. `added` is the
    /// metrics' add stamp.
    /// `held`: the dependencies hold it (`crate::graph`), so it is not in
    /// the ready set. `seq`: with dependencies, the order it became ready
    /// in, so a held key joins the ready set at its place when released
    /// (0 without dependencies: never read).
    Ready { owed: bool, held: bool, added: u64, seq: u64, prio: Priority, group: GroupId },
    /// Waiting in the delay heap.
    Delayed { timer: Timer, prio: Priority, group: GroupId },
    /// Handed out to a worker; `then` is what `done` does with it, `run`
    /// where the metrics keep its start stamp, `again` the priority it comes
    /// back with if `then` brings it back (while `then` is `Finish`, the
    /// priority it was handed out with, for a retry: see `retry_priority`).
    Processing { then: Then, run: u32, group: GroupId, again: Priority },
}

impl Slot {
    /// A key just added, ready at `place` (`added`: its add stamp).
    fn new_ready(added: u64, place: Place) -> Self {
        Slot::Ready { owed: false, held: false, added, seq: 0, prio: place.prio, group: place.group }
    }
}

/// Where an added key goes: its priority and group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Place {
    pub(crate) prio: Priority,
    pub(crate) group: GroupId,
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
    /// The key joined the ready set.
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
    /// The key was dirty and joined the ready set.
    Requeued,
    /// The key waits for its due time.
    Waiting(Instant),
    /// The key was not being processed: nothing happened.
    NotProcessing,
    /// The key left the queue, and keys its dependencies held joined the
    /// ready set.
    Released,
}

/// Where a key stands in the queue, for introspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// The queue does not know the key.
    Absent,
    /// Waiting in the ready set.
    Ready,
    /// Waiting for its due time.
    Waiting { due: Instant },
    /// Handed out and not yet done. `again` tells what happens at `done`:
    /// `Some(None)` ready again, `Some(Some(due))` wait for `due`, `None`
    /// nothing.
    Processing { again: Option<Option<Instant>> },
}

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
    /// Number of `Processing { then: Requeue }` slots (dirty keys being
    /// processed: part of the metrics' depth).
    requeue_after_done: usize,
    recorder: Recorder,
    shutting_down: bool,
    draining: bool,
    /// Keys a shutdown dropped (delayed, waiting to retry, or ready at an
    /// immediate stop), until [`take_dropped`](QueueState::take_dropped):
    /// a stop reports them instead of losing them silently.
    dropped: Vec<K>,
    /// With a store: what shutdowns dropped or refused, per key.
    stop_views: Option<StopViews<K>>,
    /// With a store: the dependents D2 added that its flusher has not
    /// sampled yet (see [`WorkQueue::take_dependents_views`]).
    ///
    /// [`WorkQueue::take_dependents_views`]: super::WorkQueue::take_dependents_views
    unsampled_dependents: Option<Vec<K>>,
    /// Dependencies between keys, once a controller set one (`None`: one
    /// branch per add and `done`, nothing else).
    deps: Option<Box<Dependencies<K>>>,
    /// What cancels a running descendant (D3).
    on_cancel: Option<CancelHook<K>>,
    /// `supersede` (U1): a key that becomes ready while it is processed
    /// cancels that reconcile through `on_cancel`, and comes back with the
    /// higher of the two priorities.
    supersede: bool,
    /// Number of `Ready { held: true }` slots.
    held: usize,
    /// The last `seq` given to a key that became ready (with dependencies).
    ready_seq: u64,
    /// While a batch is open (U3, `Some`): the keys it holds, released when
    /// it closes unless their dependencies hold them. Opening one turns
    /// dependencies on, so the plain hot path keeps its one branch.
    batch: Option<Vec<K>>,
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
            requeue_after_done: 0,
            recorder,
            shutting_down: false,
            draining: false,
            dropped: Vec::new(),
            stop_views: None,
            unsampled_dependents: None,
            deps: None,
            on_cancel: None,
            supersede: false,
            held: 0,
            ready_seq: 0,
            batch: None,
        }
    }

    /// Keeps what shutdowns drop or refuse, so `pending_view` still answers
    /// for those keys (a controller's store writes them at its last flush),
    /// and the dependents D2 adds until the store samples them.
    pub(crate) fn for_store(&mut self) {
        self.stop_views = Some(StopViews::new());
        self.unsampled_dependents = Some(Vec::new());
    }

    /// Adds `key` as a dependent of a finished key (D2), remembering it for
    /// the store if there is one.
    pub(crate) fn add_placed_dependent(&mut self, key: K, place: Place, now: &mut Now) {
        if let Some(unsampled) = &mut self.unsampled_dependents {
            unsampled.push(key.clone());
        }
        self.add(key, place, now);
    }

    /// The dependents D2 added since the last call, each with its
    /// [`pending_view`](Self::pending_view) now.
    pub(crate) fn take_dependents_views(&mut self, out: &mut Vec<(K, Option<View>)>) {
        let Some(unsampled) = &mut self.unsampled_dependents else { return };
        let keys = std::mem::take(unsampled);
        out.extend(keys.into_iter().map(|key| {
            let view = self.pending_view(&key);
            (key, view)
        }));
    }

    fn keep_stop_view(stop_views: &mut Option<StopViews<K>>, key: &K, view: View) {
        if let Some(views) = stop_views {
            views.keep(key.clone(), view);
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
                *slot = Slot::Processing { then, run, group, again: again.max(place.prio) };
                Added::Unchanged
            }
            Slot::Processing { then, run, group, again } => {
                // `again` is the priority it was handed out with while
                // `then` is `Finish`: a superseded run keeps the higher one.
                let again = if let Then::Wait(_) = then {
                    self.timers -= 1;
                    again.max(place.prio)
                } else if self.supersede {
                    again.max(place.prio)
                } else {
                    place.prio
                };
                let added = self.recorder.on_add(now);
                self.requeue_after_done += 1;
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
            Slot::Processing { then: Then::Wait(_) | Then::Requeue { .. }, again, .. } => *again = (*again).max(to),
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
                    self.requeue_after_done += 1;
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
                if self.deps.is_some() {
                    return self.finish_with_deps(at);
                }
                self.forget(at);
                self.compact_if_sparse();
                Finished::Removed
            }
            Then::Wait(timer) if timer.due > now() => {
                *slot = Slot::Delayed { timer, prio: again, group };
                self.delayed += 1;
                if self.deps.is_some() {
                    let key = self.entries.get(at).key.clone();
                    self.deps_left(&key, at);
                }
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
                *slot = Slot::Ready { owed, held: false, added, seq: 0, prio: again, group };
                if self.deps.is_some() {
                    return self.deps_done(at, again, group);
                }
                self.ready.push(at, again, group);
                Finished::Requeued
            }
        }
    }

    /// A key whose slot just became `Ready` (not held): into the ready set,
    /// unless its dependencies hold it (D1, D3). Without dependencies, one
    /// branch (the rest is out of line).
    #[inline(always)]
    fn push_pending(&mut self, at: u32, prio: Priority, group: GroupId) -> Added {
        if self.deps.is_some() {
            return self.push_pending_with_deps(at, prio, group);
        }
        self.ready.push(at, prio, group);
        Added::Ready
    }

    #[inline(never)]
    fn push_pending_with_deps(&mut self, at: u32, prio: Priority, group: GroupId) -> Added {
        let key = self.entries.get(at).key.clone();
        let hold = self.with_deps(|deps, slots| deps.became_pending(&key, at, slots));
        self.ready_unless_held(at, prio, group, hold)
    }

    /// The `Ready` slot at `at` joins the ready set at the next place in
    /// ready order, unless `hold` (its dependencies hold it) or an open
    /// batch holds it.
    fn ready_unless_held(&mut self, at: u32, prio: Priority, group: GroupId, hold: bool) -> Added {
        self.stamp_seq(at);
        if hold || self.batch_holds(at) {
            self.hold_new(at);
            return Added::Unchanged;
        }
        self.ready.push(at, prio, group);
        Added::Ready
    }

    /// `done`'s `Finish` with dependencies: the key leaves, and keys it held
    /// may become ready.
    #[inline(never)]
    fn finish_with_deps(&mut self, at: u32) -> Finished {
        let key = self.forget(at);
        let released = self.deps_left(&key, at);
        self.compact_if_sparse();
        if released { Finished::Released } else { Finished::Removed }
    }

    /// Gives the `Ready` slot at `at` the next place in ready order (D1: a
    /// released key keeps it).
    fn stamp_seq(&mut self, at: u32) {
        self.ready_seq += 1;
        if let Slot::Ready { seq, .. } = &mut self.entries.get_mut(at).slot {
            *seq = self.ready_seq;
        }
    }

    /// U1: the processing key at `at` became ready again; with
    /// `supersede`, its running reconcile is cancelled (`done` then brings
    /// it back, as for any key added while processing).
    #[inline]
    fn supersede_run(&self, at: u32) {
        if let (true, Some(cancel)) = (self.supersede, &self.on_cancel) {
            cancel(&self.entries.get(at).key, Cancel::Superseded);
        }
    }

    /// Turns `supersede` on (U1), with what cancels a running reconcile.
    pub(crate) fn enable_supersede(&mut self, cancel: CancelHook<K>) {
        self.supersede = true;
        self.on_cancel = Some(cancel);
    }

    /// Whether an open batch holds `key`, which just became ready (U3): it
    /// keeps it until it closes.
    fn batch_holds(&mut self, at: u32) -> bool {
        let Some(held) = &mut self.batch else { return false };
        held.push(self.entries.get(at).key.clone());
        true
    }

    /// Opens the batch (U3; idempotent): from now on every key that becomes
    /// ready is held until [`close_batch`](Self::close_batch). Dependencies
    /// must be on.
    pub(crate) fn open_batch(&mut self) {
        debug_assert!(self.deps.is_some(), "a batch holds keys through the dependencies' seam");
        self.batch.get_or_insert_with(Vec::new);
    }

    /// Closes the batch: every key it held that no dependency holds joins
    /// the ready set at its place (D1 then orders them). Returns whether
    /// any did.
    pub(crate) fn close_batch(&mut self) -> bool {
        let Some(held) = self.batch.take() else { return false };
        self.with_deps(|deps, slots| {
            for key in &held {
                if !deps.must_hold(key) {
                    slots.release(key);
                }
            }
            slots.released
        })
    }

    /// Marks the `Ready` slot at `at`, not in the ready set, held.
    fn hold_new(&mut self, at: u32) {
        if let Slot::Ready { held, .. } = &mut self.entries.get_mut(at).slot {
            *held = true;
            self.held += 1;
        }
    }

    /// `done` of a key that comes back ready (its slot already `Ready`,
    /// not held): the keys waiting for its cancelled run are told, then it
    /// joins the ready set unless held.
    fn deps_done(&mut self, at: u32, prio: Priority, group: GroupId) -> Finished {
        let key = self.entries.get(at).key.clone();
        let hold = self.with_deps(|deps, slots| {
            deps.returned(&key, at, slots);
            deps.must_hold(&key)
        });
        self.ready_unless_held(at, prio, group, hold);
        Finished::Requeued
    }

    /// `done` of a key that is no longer pending (its slot says so).
    /// Returns whether keys it held became ready.
    fn deps_left(&mut self, key: &K, at: u32) -> bool {
        self.with_deps(|deps, slots| {
            deps.returned(key, at, slots);
            deps.left_pending(key, at, slots);
            slots.released
        })
    }

    /// Runs `f` with the dependencies and the queue's side of their seam.
    fn with_deps<R>(&mut self, f: impl FnOnce(&mut Dependencies<K>, &mut Slots<'_, K>) -> R) -> R {
        let Self { deps, entries, index, ready, held, on_cancel, processing, batch, .. } = self;
        let deps = deps.as_deref_mut().expect("dependencies are set");
        let batch = batch.as_mut();
        let mut slots = Slots {
            entries,
            index,
            ready,
            held,
            processing: *processing,
            cancel: on_cancel.as_ref(),
            batch,
            released: false,
        };
        f(deps, &mut slots)
    }

    /// Turns dependencies on with the edges of `deps`, set while no key
    /// was pending (a controller's first edge, or those set before start).
    pub(crate) fn enable_dependencies(&mut self, deps: Box<Dependencies<K>>, cancel: CancelHook<K>) {
        debug_assert!(self.deps.is_none());
        self.deps = Some(deps);
        self.on_cancel = Some(cancel);
    }

    /// Whether dependencies are on.
    pub(crate) fn has_dependencies(&self) -> bool {
        self.deps.is_some()
    }

    /// Replaces `key`'s parents (D4: `Err` with the keys of the cycle it
    /// would close, nothing changed). Returns whether held keys were
    /// released.
    pub(crate) fn set_dependencies(&mut self, key: &K, parents: Vec<K>) -> Result<bool, Vec<K>> {
        self.with_deps(|deps, slots| deps.set_parents(key, parents, slots).map(|()| slots.released))
    }

    /// `key`'s direct parents.
    pub(crate) fn dependencies(&self, key: &K) -> Vec<K> {
        self.deps.as_ref().map(|d| d.parents(key)).unwrap_or_default()
    }

    /// `key`'s direct children.
    pub(crate) fn dependents(&self, key: &K) -> Vec<K> {
        self.deps.as_ref().map(|d| d.children(key)).unwrap_or_default()
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
                        let at = self.add_handed(key, hold, now);
                        if let Some(deps) = &mut self.deps {
                            deps.placed(node, at);
                        }
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

    /// `Dependencies::hand_over` of `key`, if its `done` will finish it
    /// (it leaves pending then).
    fn hand_over(&mut self, key: &K) -> Option<Vec<Child<K>>> {
        self.deps.as_ref()?;
        let at = self.index.find(key, &self.entries)?;
        if !matches!(self.entries.get(at).slot, Slot::Processing { then: Then::Finish, .. }) {
            return None;
        }
        Some(self.with_deps(|deps, slots| deps.hand_over(key, at, slots)))
    }

    /// Makes `key` ready, which the graph already counts as pending (`hold`:
    /// whether it must be held): it was not pending, so the queue does not
    /// know it or it waits for a due time. Returns its slot.
    fn add_handed(&mut self, key: K, hold: bool, now: &mut Now) -> u32 {
        let place = Place::default();
        let (at, prio, group) = match self.index.entry(&key, &self.entries) {
            Err(vacant) => {
                let slot = Slot::new_ready(self.recorder.on_add(now), place);
                let at = self.entries.insert(Entry { key, slot });
                vacant.insert(at);
                (at, place.prio, place.group)
            }
            Ok(at) => {
                let (prio, group) = self.ready_from_delayed(at, place, now);
                (at, prio, group)
            }
        };
        self.ready_unless_held(at, prio, group, hold);
        at
    }

    /// The pending ancestors holding `key` (D1).
    pub(crate) fn waiting_for(&self, key: &K) -> Vec<K> {
        let Some(deps) = &self.deps else { return Vec::new() };
        let slots = SlotsView { entries: &self.entries, index: &self.index };
        deps.pending_ancestors(key, &slots)
    }

    /// Number of ready keys their dependencies hold.
    pub(crate) fn held_len(&self) -> usize {
        self.held
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
                    Self::keep_stop_view(stop_views, &entry.key, (Some(timer.due), prio));
                    dropped.push(entries.remove(at).key);
                    false
                }
                Slot::Processing { then: Then::Wait(timer), run, group, again } => {
                    // In flight at an immediate stop: ready at restore.
                    Self::keep_stop_view(stop_views, &entry.key, (drain.then_some(timer.due), again));
                    entry.slot = Slot::Processing { then: Then::Finish, run, group, again };
                    dropped.push(entry.key.clone());
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
        self.recorder.on_discard(self.ready.len() + self.requeue_after_done);
        if let Some(views) = &mut self.stop_views {
            views.set_discarded();
        }
        for at in self.ready.drain() {
            if let Slot::Ready { prio, .. } = self.entries.get(at).slot {
                Self::keep_stop_view(&mut self.stop_views, &self.entries.get(at).key, (None, prio));
            }
            let key = self.forget(at);
            self.dropped.push(key);
        }
        self.compact_if_sparse();
        self.discard_held();
        for (_, entry) in self.entries.iter_mut() {
            if let Slot::Processing { then, again, .. } = &mut entry.slot {
                if matches!(then, Then::Requeue { .. }) {
                    Self::keep_stop_view(&mut self.stop_views, &entry.key, (None, *again));
                    self.dropped.push(entry.key.clone());
                }
                *then = Then::Finish;
            }
        }
        self.owed = 0;
        self.requeue_after_done = 0;
    }

    /// Drops every key its dependencies hold (an immediate stop).
    fn discard_held(&mut self) {
        if self.held == 0 {
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
            Self::keep_stop_view(&mut self.stop_views, &self.entries.get(at).key, (None, prio));
            let key = self.forget(at);
            self.dropped.push(key);
        }
        self.held = 0;
        if let Some(batch) = &mut self.batch {
            batch.clear();
        }
        self.compact_if_sparse();
    }

    /// The keys shutdowns dropped since the last call.
    pub(crate) fn take_dropped(&mut self) -> Vec<K> {
        std::mem::take(&mut self.dropped)
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
        match self.slot(key) {
            None => KeyState::Absent,
            Some(Slot::Ready { .. }) => KeyState::Ready,
            Some(Slot::Delayed { timer, .. }) => KeyState::Waiting { due: timer.due },
            Some(Slot::Processing { then, .. }) => KeyState::Processing {
                again: match then {
                    Then::Finish => None,
                    Then::Requeue { .. } => Some(None),
                    Then::Wait(timer) => Some(Some(timer.due)),
                },
            },
        }
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
    /// does not hold it, else its due time if it waits for one, and the
    /// priority it runs at next. A key in flight with nothing queued after
    /// it counts as waiting (a crash must not lose it), at the priority it
    /// would come back with.
    /// A key a shutdown dropped or refused (with `keep_stop_views`) answers
    /// with what it was then.
    #[cfg_attr(not(feature = "store"), allow(dead_code))] // only a store asks
    pub(crate) fn pending_view(&self, key: &K) -> Option<View> {
        let Some(slot) = self.slot(key) else {
            return self.stop_views.as_ref()?.get(key);
        };
        Some(match slot {
            Slot::Ready { prio, .. } => (None, *prio),
            Slot::Delayed { timer, prio, .. } => (Some(timer.due), *prio),
            Slot::Processing { then: Then::Wait(timer), again, .. } => (Some(timer.due), *again),
            Slot::Processing { again, .. } => (None, *again),
        })
    }

    /// Nothing ready, processing or waiting for a due time.
    pub(crate) fn is_idle(&self) -> bool {
        self.ready.is_empty() && self.processing == 0 && self.timers == 0 && self.held == 0
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
        self.recorder.snapshot(self.ready.len() + self.requeue_after_done)
    }

    fn compact_delays(&mut self) {
        let (index, entries) = (&self.index, &self.entries);
        self.delays.compact_if_sparse(self.timers, |key, timer| is_live(index, entries, key, timer));
    }
}

/// The queue's side of the dependencies' seam (`crate::graph`).
struct Slots<'a, K> {
    entries: &'a mut Slab<Entry<K>>,
    index: &'a KeyIndex<Hasher>,
    ready: &'a mut ReadySet<u32>,
    held: &'a mut usize,
    /// Keys being reconciled (the queue's count, unchanged by the graph).
    processing: usize,
    cancel: Option<&'a CancelHook<K>>,
    /// The open batch's held keys: what the dependencies release meanwhile
    /// stays held, for the batch to release when it closes.
    batch: Option<&'a mut Vec<K>>,
    /// A held key joined the ready set.
    released: bool,
}

/// The read-only side, for `waiting_for`.
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
        pending_of(self.entries, self.index, key)
    }
}

impl<K: Eq + Hash + Clone> KeySlots<K> for Slots<'_, K> {
    fn any_running(&self) -> bool {
        self.processing > 0
    }

    fn hold(&mut self, key: &K) {
        let Some(at) = self.index.find(key, self.entries) else { return };
        if let Slot::Ready { held: held @ false, prio, group, .. } = &mut self.entries.get_mut(at).slot {
            *held = true;
            *self.held += 1;
            self.ready.remove(at, *prio, *group);
        }
    }

    fn release(&mut self, key: &K) {
        if let Some(batch) = &mut self.batch {
            batch.push(key.clone());
            return;
        }
        let Some(at) = self.index.find(key, self.entries) else { return };
        let Slot::Ready { held: held @ true, prio, group, seq, .. } = &mut self.entries.get_mut(at).slot else {
            return;
        };
        *held = false;
        *self.held -= 1;
        self.released = true;
        let (prio, group, seq) = (*prio, *group, *seq);
        // At its place by the time it became ready (G4 per priority): after
        // every entry that became ready before it. Stale entries answer
        // with their key's slot; misplacing past one changes no live order.
        let entries = &*self.entries;
        let earlier = |e: &u32| {
            entries.get_live(*e).is_some_and(|entry| matches!(entry.slot, Slot::Ready { seq: s, .. } if s <= seq))
        };
        self.ready.insert_by(at, prio, group, earlier);
    }

    fn cancel(&mut self, key: &K) {
        if let Some(cancel) = self.cancel {
            cancel(key, Cancel::ByAncestor);
        }
    }
}

/// Whether `timer` is `key`'s live due time (a heap entry can be stale).
fn is_live<K: Eq + Hash>(index: &KeyIndex<Hasher>, entries: &Slab<Entry<K>>, key: &K, timer: Timer) -> bool {
    let slot = index.find(key, entries).map(|at| &entries.get(at).slot);
    matches!(slot, Some(Slot::Delayed { timer: t, .. } | Slot::Processing { then: Then::Wait(t), .. }) if *t == timer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::delay_heap::COMPACT_SLACK;
    use std::time::Duration;

    const P0: Place = Place { prio: 0, group: 0 };

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A fresh clock reading per call (each test call is its own operation).
    fn n() -> &'static mut Now {
        Box::leak(Box::new(Now::new()))
    }

    #[test]
    fn a_slot_stays_40_bytes() {
        // Entries are read on every hand-out and finish: dependencies'
        // fields must not grow them (see `retry_priority`).
        assert!(std::mem::size_of::<Slot>() <= 40, "{}", std::mem::size_of::<Slot>());
    }

    #[test]
    fn dirty_key_returns_only_after_done() {
        let mut q = QueueState::new(Recorder::off(), ReadySet::new());
        assert_eq!(q.add("a", P0, n()), Added::Ready);
        assert_eq!(q.take(n()).map(|t| t.0), Some("a"));
        assert_eq!(q.add("a", P0, n()), Added::Unchanged);
        assert_eq!(q.take(n()).map(|t| t.0), None, "a is processing: not handed out twice");
        let t0 = Instant::now();
        assert_eq!(q.done(&"a", || t0, n()), Finished::Requeued);
        assert_eq!(q.take(n()).map(|t| t.0), Some("a"));
        assert_eq!(q.done(&"a", || t0, n()), Finished::Removed);
        assert_eq!(q.done(&"a", || t0, n()), Finished::NotProcessing);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn delayed_while_processing_waits_after_done() {
        let mut q = QueueState::new(Recorder::off(), ReadySet::new());
        let t0 = Instant::now();
        q.add("a", P0, n());
        q.take(n()).map(|t| t.0);
        assert_eq!(q.add_at("a", t0 + ms(10), t0, n(), P0), Added::Scheduled(t0 + ms(10)));
        assert_eq!(q.done(&"a", || t0, n()), Finished::Waiting(t0 + ms(10)));
        assert_eq!(q.delayed_len(), 1);
        assert_eq!(q.promote_due(t0 + ms(10), n()), 1);
        assert_eq!(q.take(n()).map(|t| t.0), Some("a"));
    }

    #[test]
    fn stale_heap_entries_are_compacted() {
        let mut q = QueueState::new(Recorder::off(), ReadySet::new());
        let t0 = Instant::now();
        for i in 0..10_000u64 {
            // Each earlier due time leaves the previous entry stale.
            q.add_at("a", t0 + Duration::from_secs(1_000_000 - i), t0, n(), P0);
        }
        assert!(q.delays.len() <= 2 * q.timers + COMPACT_SLACK + 1);
        assert_eq!(q.next_due(), Some(t0 + Duration::from_secs(1_000_000 - 9_999)));
    }

    #[test]
    fn metrics_count_adds_like_client_go() {
        let mut q = QueueState::new(Recorder::on(), ReadySet::new());
        let t0 = Instant::now();
        let snap = |q: &QueueState<&str>| {
            let s = q.metrics_snapshot().expect("named");
            (s.adds, s.depth, s.queue_duration.count(), s.work_duration.count(), s.retries)
        };
        q.add("a", P0, n());
        q.add("a", P0, n()); // deduplicated
        assert_eq!(snap(&q), (1, 1, 0, 0, 0));
        assert_eq!(q.take(n()).map(|t| t.0), Some("a"));
        assert_eq!(snap(&q), (1, 0, 1, 0, 0));
        q.add("a", P0, n()); // dirty while processing: an add, and depth
        q.add("a", P0, n()); // deduplicated
        assert_eq!(snap(&q), (2, 1, 1, 0, 0));
        assert!(q.metrics_snapshot().unwrap().longest_seconds >= 0.0);
        assert_eq!(q.done(&"a", || t0, n()), Finished::Requeued);
        assert_eq!(snap(&q), (2, 1, 1, 1, 0), "requeued by done: still the same add");
        assert_eq!(q.take(n()).map(|t| t.0), Some("a"));
        q.count_retry();
        q.add_at("a", t0 + ms(10), t0, n(), P0); // waits after done: not an add yet
        assert_eq!(q.done(&"a", || t0, n()), Finished::Waiting(t0 + ms(10)));
        assert_eq!(snap(&q), (2, 0, 2, 2, 1));
        assert_eq!(q.promote_due(t0 + ms(10), n()), 1);
        assert_eq!(snap(&q), (3, 1, 2, 2, 1), "promotion is an add");
        q.add_at("b", t0 + ms(20), t0, n(), P0);
        q.add("b", P0, n()); // a plain add of a delayed key makes it ready: an add
        assert_eq!(snap(&q), (4, 2, 2, 2, 1));
        q.shut_down(false);
        q.count_retry();
        assert_eq!(snap(&q).4, 1, "no retries counted after shutdown");
    }

    #[test]
    fn unfinished_work_follows_processing_keys() {
        let mut q = QueueState::new(Recorder::on(), ReadySet::new());
        let t0 = Instant::now();
        for key in ["a", "b", "c"] {
            q.add(key, P0, n());
        }
        q.take(n()).map(|t| t.0);
        q.take(n()).map(|t| t.0);
        std::thread::sleep(ms(5));
        let s = q.metrics_snapshot().unwrap();
        assert!(s.longest_seconds >= 0.004 && s.unfinished_seconds >= 2.0 * 0.004, "{}", s.unfinished_seconds);
        assert!(s.unfinished_seconds >= s.longest_seconds);
        q.done(&"a", || t0, n());
        q.done(&"b", || t0, n());
        let s = q.metrics_snapshot().unwrap();
        assert_eq!((s.longest_seconds, s.unfinished_seconds, s.work_duration.count()), (0.0, 0.0, 2));
        q.take(n()).map(|t| t.0);
        assert_eq!(q.recorder.starts_len(), 2, "freed start slots are reused");
    }

    #[test]
    fn discarded_keys_stay_counted_as_adds() {
        let mut q = QueueState::new(Recorder::on(), ReadySet::new());
        let t0 = Instant::now();
        for key in ["a", "b", "c"] {
            q.add(key, P0, n());
        }
        q.take(n()).map(|t| t.0);
        q.add("a", P0, n()); // dirty while processing
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
    fn compaction_keeps_order_priorities_stale_entries_and_timers() {
        let mut q = QueueState::new(Recorder::on(), ReadySet::new());
        let t0 = Instant::now();
        let prio = |p| Place { prio: p, group: 0 };
        // 200 keys; every tenth raised (leaving a stale entry behind), two
        // waiting for a due time, and one processing and dirty.
        for k in 0..200u32 {
            q.add(k, P0, n());
        }
        for k in (0..200u32).step_by(10) {
            q.add(k, prio(1), n());
        }
        q.add_at(1000, t0 + ms(50), t0, n(), P0);
        q.add_at(1001, t0 + ms(60), t0, n(), P0);
        let mut taken = Vec::new();
        // Take the raised keys, then most of the rest: done frees entries
        // until the slab is sparse and compacts (more than once).
        for _ in 0..190 {
            let (k, _) = q.take(n()).unwrap();
            taken.push(k);
            if k != 11 {
                assert_eq!(q.done(&k, || t0, n()), Finished::Removed);
            }
        }
        assert!(q.entries.len() < 20, "{} entries", q.entries.len());
        q.add(11, prio(2), n()); // dirty while processing
        q.add(199, prio(3), n()); // raises a ready key after compaction
        let raised: Vec<u32> = (0..200).step_by(10).collect();
        assert_eq!(taken[..20], raised[..], "raised keys first, in FIFO order");
        assert_eq!(q.done(&11, || t0, n()), Finished::Requeued);
        let rest: Vec<u32> = std::iter::from_fn(|| q.take(n()).map(|t| t.0)).collect();
        let mut expected = vec![199, 11];
        expected.extend((0..200u32).filter(|k| k % 10 != 0 && !taken.contains(k) && *k != 199));
        assert_eq!(rest, expected);
        assert_eq!(q.key_state(&1000), KeyState::Waiting { due: t0 + ms(50) });
        assert_eq!(q.next_due(), Some(t0 + ms(50)));
        assert_eq!(q.promote_due(t0 + ms(60), n()), 2);
        assert_eq!(std::iter::from_fn(|| q.take(n()).map(|t| t.0)).collect::<Vec<_>>(), vec![1000, 1001]);
    }

    #[test]
    fn an_immediate_stop_drops_every_ready_key_once() {
        let mut q = QueueState::new(Recorder::off(), ReadySet::new());
        for k in 0..300u32 {
            q.add(k, P0, n());
        }
        let (processing, _) = q.take(n()).unwrap();
        q.shut_down(false);
        q.discard_ready();
        let mut dropped = q.take_dropped();
        dropped.sort_unstable();
        assert_eq!(dropped, (1..300).collect::<Vec<u32>>());
        assert_eq!(q.key_state(&processing), KeyState::Processing { again: None });
        assert_eq!(q.done(&processing, Instant::now, n()), Finished::Removed);
        assert!(q.is_idle() && q.entries.len() == 0);
    }

    #[test]
    fn unnamed_queue_records_nothing() {
        let mut q = QueueState::new(Recorder::off(), ReadySet::new());
        q.add("a", P0, n());
        assert!(q.metrics_snapshot().is_none());
    }
}
