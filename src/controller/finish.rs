//! What a worker does once a reconcile returned and was settled: end the
//! key's processing, enqueue its dependents if its run of attempts ended
//! (D2), tell the store, take the next key.
//!
//! Which of those a controller needs is a closed set, chosen once at start
//! from the features it was built with ([`Finish`]) and raised once, when
//! the first dependency is set: each finished reconcile then pays one load
//! and one match (`Core::finish`), and the queue one operation
//! ([`WorkQueue::done_and_get_stamped`](crate::queue::WorkQueue::done_and_get_stamped))
//! told what else to do.

use std::sync::atomic::{AtomicU8, Ordering};

/// How a handed-out key's turn ended, as the worker settled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// A retry is scheduled: the key's run of attempts goes on.
    Retried,
    /// The run of attempts ended (a success, a resync, a permanent
    /// failure): its direct dependents follow (D2).
    Ended,
    /// Cancelled by D3 or U1: neither a success nor a failure; an
    /// ancestor's run, or the enqueue that superseded it, brings it back.
    Superseded,
    /// Not ours (sharding): dropped without a reconcile.
    NotOurs,
}

/// The after-reconcile paths (see the module's notes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Path {
    /// `done`, and the next key, under one lock.
    Plain = 0,
    /// A store: the key is marked once done, outside the lock.
    Stored = 1,
    /// Dependencies, no store, and keys that need no place asked (no
    /// groups, no coordination): D2's children are added in `done`'s lock.
    DependentsInLock = 2,
    /// Dependencies, no store, groups or coordination: D2's children are
    /// placed with no lock held, then added under one lock before `done`.
    DependentsPlaced = 3,
    /// Dependencies and a store: as `DependentsPlaced`, each child marked,
    /// and the key marked once done.
    DependentsStored = 4,
}

impl Path {
    fn from_u8(path: u8) -> Self {
        match path {
            0 => Path::Plain,
            1 => Path::Stored,
            2 => Path::DependentsInLock,
            3 => Path::DependentsPlaced,
            _ => Path::DependentsStored,
        }
    }
}

/// The after-reconcile choice of a started controller.
pub(crate) struct Finish {
    /// The path taken now (a [`Path`]): read without a lock by every
    /// finishing worker, written at most twice (start, first dependency).
    path: AtomicU8,
    /// The path once a dependency exists.
    with_dependents: Path,
}

impl Finish {
    /// The choice for a controller with a `store` or not, whose keys need
    /// their place asked at enqueue (`placed`: groups or coordination) or
    /// not.
    pub(crate) fn new(store: bool, placed: bool) -> Self {
        let (path, with_dependents) = match (store, placed) {
            (true, _) => (Path::Stored, Path::DependentsStored),
            (false, true) => (Path::Plain, Path::DependentsPlaced),
            (false, false) => (Path::Plain, Path::DependentsInLock),
        };
        Self { path: AtomicU8::new(path as u8), with_dependents }
    }

    /// A dependency was set: from now on a run that ends enqueues its
    /// key's dependents.
    pub(crate) fn dependencies_set(&self) {
        self.path.store(self.with_dependents as u8, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn path(&self) -> Path {
        Path::from_u8(self.path.load(Ordering::Relaxed))
    }
}
