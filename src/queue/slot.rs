//! The queue's vocabulary: what a key's slot holds, and what the
//! operations of the state table (`state.rs`) answer.
//!
//! A leaf: it names no other file of the queue but the ones it is built on
//! (`delay_heap.rs`'s timers, `ready.rs`'s priorities and groups,
//! `slab.rs`'s entries), so `state.rs` and the extensions beside it
//! (`holds.rs`, `stop_views.rs`) can all speak it without naming each other.

use std::sync::Arc;
use std::time::Instant;

use super::delay_heap::Timer;
use super::ready::{GroupId, Priority};
use super::slab::Keyed;

/// The hasher of the queue's key index and of the store's stop views.
pub(crate) type Hasher = foldhash::fast::RandomState;

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

/// A known key and where it stands.
pub(super) struct Entry<K> {
    pub(super) key: K,
    pub(super) slot: Slot,
}

impl<K> Keyed<K> for Entry<K> {
    fn key(&self) -> &K {
        &self.key
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    /// In the ready set. `owed` marks a key re-queued by `done` during a
    /// drain: the drain waits for it to be processed too. `added` is the
    /// metrics' add stamp.
    /// `held`: the holds (dependencies or a batch, `holds.rs`) keep it, so
    /// it is not in the ready set. `seq`: with holds, the order it became
    /// ready in, so a held key joins the ready set at its place when
    /// released (0 without holds: never read).
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
    pub(super) fn new_ready(added: u64, place: Place) -> Self {
        Slot::Ready { owed: false, held: false, added, seq: 0, prio: place.prio, group: place.group }
    }

    /// Where the key stands, for introspection.
    pub(super) fn state(&self) -> KeyState {
        match *self {
            Slot::Ready { .. } => KeyState::Ready,
            Slot::Delayed { timer, .. } => KeyState::Waiting { due: timer.due },
            Slot::Processing { then, .. } => KeyState::Processing {
                again: match then {
                    Then::Finish => None,
                    Then::Requeue { .. } => Some(None),
                    Then::Wait(timer) => Some(Some(timer.due)),
                },
            },
        }
    }

    /// What a store keeps of this key (see `QueueState::pending_view`): its
    /// due time if it waits for one, and the priority it runs at next. A
    /// key in flight with nothing queued after it counts as waiting (a
    /// crash must not lose it), at the priority it would come back with.
    pub(super) fn view(&self) -> View {
        match *self {
            Slot::Ready { prio, .. } => (None, prio),
            Slot::Delayed { timer, prio, .. } => (Some(timer.due), prio),
            Slot::Processing { then: Then::Wait(timer), again, .. } => (Some(timer.due), again),
            Slot::Processing { again, .. } => (None, again),
        }
    }
}

/// A key's due time (`None`: ready) and priority, as `pending_view` gives.
pub(crate) type View = (Option<Instant>, Priority);

/// Where an added key goes: its priority and group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Place {
    pub(crate) prio: Priority,
    pub(crate) group: GroupId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Then {
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
#[non_exhaustive]
pub enum KeyState {
    /// The queue does not know the key.
    Absent,
    /// Waiting in the ready set.
    Ready,
    /// Waiting for its due time.
    Waiting {
        /// When it becomes ready (on the queue's clock).
        due: Instant,
    },
    /// Handed out and not yet done. `again` tells what happens at `done`:
    /// `Some(None)` ready again, `Some(Some(due))` wait for `due`, `None`
    /// nothing.
    Processing {
        /// What `done` does with the key (see above).
        again: Option<Option<Instant>>,
    },
}
