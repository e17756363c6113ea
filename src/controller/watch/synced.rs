//! The synced gate (E5, controller-runtime's `WaitForCacheSync`): a
//! controller hands out no key before every cache it watched at start has
//! applied its first list. Keys enqueued meanwhile wait in the queue; a
//! worker handed one puts it back and waits here without CPU, and a stop
//! wakes it to exit (so a stop before sync reconciles nothing the gate
//! holds). Once open, the gate costs one atomic load per hand-out and
//! passes on to coordination's gate, if any.
//!
//! [`Heard`] is the same readiness for one watch, made or not at start:
//! what `wait_synced` waits for.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::watched::Watched;
use crate::cache::SyncedHook;
use crate::controller::core::{ControllerKey, Core};
use crate::controller::gate::{Admission, Gate, StoredKey};
use crate::logs;
use crate::queue::{Priority, View};
use crate::sync::{AtomicBool, Condvar, Mutex};
use crate::{observe::reports::LeaderStatus, observe::reports::ShardStatus};

/// Counts the caches watched at start that have not synced.
pub(crate) struct SyncLatch {
    /// Caches not synced yet, or whose keys have not all reached the
    /// controller (each watch's caught-up hook counts down).
    unsynced: Mutex<usize>,
    changed: Condvar,
    /// `unsynced` reached 0: read without the lock at each hand-out.
    open: AtomicBool,
    /// What runs once the latch opens (see [`then`](Self::then)).
    then: Mutex<Vec<SyncedHook>>,
    caches: Vec<Arc<dyn Watched>>,
    sync_timeout: Duration,
}

impl SyncLatch {
    pub(super) fn new(caches: Vec<Arc<dyn Watched>>, sync_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            unsynced: Mutex::new(caches.len()),
            changed: Condvar::new(),
            open: AtomicBool::new(false),
            then: Mutex::new(Vec::new()),
            caches,
            sync_timeout,
        })
    }

    fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// One cache synced and every key it holds reached the controller
    /// (its first list, or its catch-up if it had synced before).
    pub(super) fn one_synced(&self) {
        let mut unsynced = self.unsynced.lock();
        *unsynced -= 1;
        if *unsynced > 0 {
            return;
        }
        // Opened under `then`'s lock: a hook is either taken here or
        // finds the latch open and runs at once, never neither.
        let then = {
            let mut then = self.then.lock();
            self.open.store(true, Ordering::Release);
            std::mem::take(&mut *then)
        };
        self.changed.notify_all();
        drop(unsynced);
        then.into_iter().for_each(|hook| hook());
    }

    /// Runs `hook` once the latch opens: at once if it is open, else on
    /// the thread of the watch that opens it (with no lock held).
    pub(super) fn then(&self, hook: SyncedHook) {
        let mut then = self.then.lock();
        if self.is_open() {
            drop(then);
            hook();
        } else {
            then.push(hook);
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
                let error = if cache.is_stopped() { Some("the cache was stopped".into()) } else { cache.last_error() };
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
    fn accepts(&self, key: &K, priority: Priority) -> bool {
        self.inner.as_ref().is_none_or(|gate| gate.accepts(key, priority))
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

    fn dropped_at_stop(&self, keys: &[(K, View)]) {
        if let Some(gate) = &self.inner {
            gate.dropped_at_stop(keys);
        }
    }

    fn hold_stored(&self, stored: StoredKey<K>) -> Option<StoredKey<K>> {
        match &self.inner {
            Some(gate) => gate.hold_stored(stored),
            None => Some(stored),
        }
    }
}

/// One watch as `wait_synced` sees it: its cache synced, and every key
/// the cache held then reached the controller (its first list, or its
/// catch-up).
pub(super) struct Heard {
    cache: Arc<dyn Watched>,
    state: Mutex<Hearing>,
    changed: Condvar,
}

#[derive(Clone, Copy, PartialEq)]
enum Hearing {
    Waiting,
    Heard,
    /// The hook was dropped unrun: the cache stopped first, or the watch
    /// ended.
    Never,
}

impl Heard {
    pub(super) fn new(cache: Arc<dyn Watched>) -> Arc<Self> {
        Arc::new(Self { cache, state: Mutex::new(Hearing::Waiting), changed: Condvar::new() })
    }

    /// The cache watched.
    pub(super) fn cache(&self) -> &Arc<dyn Watched> {
        &self.cache
    }

    /// The hook the watch gives its cache (`Cache::subscribe_then`): marks
    /// this heard, then runs `then`; dropped unrun, marks it never heard.
    pub(super) fn hook(self: &Arc<Self>, then: Option<SyncedHook>) -> SyncedHook {
        let mut until_run = Marks { heard: Arc::clone(self), unrun: Hearing::Never };
        Box::new(move || {
            until_run.unrun = Hearing::Heard;
            drop(until_run);
            if let Some(then) = then {
                then();
            }
        })
    }

    fn mark(&self, hearing: Hearing) {
        *self.state.lock() = hearing;
        self.changed.notify_all();
    }

    /// Waits until heard (`true`), never to be, or `deadline`.
    pub(super) fn wait(&self, deadline: Option<Instant>) -> bool {
        if !self.cache.wait_synced(deadline.map(|d| d.saturating_duration_since(Instant::now()))) {
            return false;
        }
        let mut state = self.state.lock();
        while *state == Hearing::Waiting {
            match deadline {
                Some(deadline) => {
                    if self.changed.wait_until(&mut state, deadline).timed_out() {
                        break;
                    }
                }
                None => self.changed.wait(&mut state),
            }
        }
        *state == Hearing::Heard
    }
}

/// Marks a [`Heard`] as its hook ends: run, or dropped unrun.
struct Marks {
    heard: Arc<Heard>,
    unrun: Hearing,
}

impl Drop for Marks {
    fn drop(&mut self) {
        self.heard.mark(self.unrun);
    }
}
