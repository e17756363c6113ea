//! The synced gate (E5, controller-runtime's `WaitForCacheSync`): a
//! controller hands out no key before every cache it watched at start has
//! applied its first list. Keys enqueued meanwhile wait in the queue; a
//! worker handed one puts it back and waits here without CPU, and a stop
//! wakes it to exit (so a stop before sync reconciles nothing the gate
//! holds). Once open, the gate costs one atomic load per hand-out and
//! passes on to coordination's gate, if any.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Watched;
use crate::controller::gate::{Admission, Gate};
use crate::controller::{ControllerKey, Core};
use crate::logs;
use crate::sync::{AtomicBool, Condvar, Mutex};
use crate::{LeaderStatus, ShardStatus};

/// Counts the caches watched at start that have not synced.
pub(crate) struct SyncLatch {
    /// Caches not synced yet (each cache's `on_synced` hook counts down).
    unsynced: Mutex<usize>,
    changed: Condvar,
    /// `unsynced` reached 0: read without the lock at each hand-out.
    open: AtomicBool,
    caches: Vec<Arc<dyn Watched>>,
    sync_timeout: Duration,
}

impl SyncLatch {
    pub(super) fn new(caches: Vec<Arc<dyn Watched>>, sync_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            unsynced: Mutex::new(caches.len()),
            changed: Condvar::new(),
            open: AtomicBool::new(false),
            caches,
            sync_timeout,
        })
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// One cache synced (its first list reached the controller).
    pub(super) fn one_synced(&self) {
        let mut unsynced = self.unsynced.lock();
        *unsynced -= 1;
        if *unsynced == 0 {
            self.open.store(true, Ordering::Release);
            self.changed.notify_all();
        }
    }

    /// Blocks until open or `give_up()` (checked when woken); whether open.
    fn wait(&self, give_up: &dyn Fn() -> bool) -> bool {
        let mut unsynced = self.unsynced.lock();
        while *unsynced > 0 && !give_up() {
            self.changed.wait(&mut unsynced);
        }
        *unsynced == 0
    }

    /// Wakes the waiters to look at `give_up` again (a stop).
    fn wake(&self) {
        let _unsynced = self.unsynced.lock();
        self.changed.notify_all();
    }

    /// The controller's `sync` thread: every `sync_timeout` until the
    /// latch opens or the controller stops, an ERROR for each cache not
    /// synced, with its last error (controller-runtime's cache-sync
    /// timeouts hide the cause: controller-runtime#1219).
    pub(super) fn report_until_synced<K: ControllerKey>(&self, core: &Core<K>) {
        let started = Instant::now();
        let mut unsynced = self.unsynced.lock();
        let mut next = started + self.sync_timeout;
        while *unsynced > 0 && !core.life.is_stopping() {
            if !self.changed.wait_until(&mut unsynced, next).timed_out() {
                continue;
            }
            drop(unsynced);
            for cache in self.caches.iter().filter(|c| !c.synced()) {
                let error = cache.last_error();
                logs::watch_not_synced(&core.name, cache.name(), started.elapsed(), error.as_deref());
            }
            next += self.sync_timeout;
            unsynced = self.unsynced.lock();
        }
    }
}

/// The synced gate in front of coordination's gate (if any).
pub(super) struct SyncedGate<K> {
    latch: Arc<SyncLatch>,
    inner: Option<Box<dyn Gate<K>>>,
}

impl<K> SyncedGate<K> {
    pub(super) fn new(latch: Arc<SyncLatch>, inner: Option<Box<dyn Gate<K>>>) -> Self {
        Self { latch, inner }
    }
}

impl<K> Gate<K> for SyncedGate<K> {
    fn accepts(&self, key: &K) -> bool {
        self.inner.as_ref().is_none_or(|gate| gate.accepts(key))
    }

    fn admit(&self, key: &K) -> Admission {
        if !self.latch.is_open() {
            return Admission::Wait;
        }
        self.inner.as_ref().map_or(Admission::Run(None), |gate| gate.admit(key))
    }

    fn finished(&self, key: &K, token: u64) {
        if let Some(gate) = &self.inner {
            gate.finished(key, token);
        }
    }

    fn wait(&self, give_up: &dyn Fn() -> bool) -> bool {
        self.latch.wait(give_up) && self.inner.as_ref().is_none_or(|gate| gate.wait(give_up))
    }

    fn wake(&self) {
        self.latch.wake();
        if let Some(gate) = &self.inner {
            gate.wake();
        }
    }

    fn leader_status(&self) -> Option<LeaderStatus> {
        self.inner.as_ref().and_then(|gate| gate.leader_status())
    }

    fn shard_status(&self) -> Option<ShardStatus> {
        self.inner.as_ref().and_then(|gate| gate.shard_status())
    }
}
