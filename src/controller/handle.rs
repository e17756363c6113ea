//! [`ControllerHandle`]: enqueueing, observing and stopping a controller.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::batch::Batch;
use super::core::{ControllerKey, Core, When};
use super::dependencies::DependencyError;
use super::features::Features;
use super::gate::Gate;
use super::groups::GroupTable;
use super::inspect::{KeyInfo, KeyStatus};
use super::life::Phase;
use super::persist::{self, PendingFlush};
use super::status::Stats;
use super::stopping::{StopOptions, StopReport, Stopping};
use super::triggers::{self, TriggerOutcome};
use super::watch::{Watch, WatchError};
use super::worker;
use crate::clock::deadline_after;
use crate::context::StopSignal;
use crate::logs;
use crate::observe::status::RunState;
use crate::queue::KeyState;

/// A shared handle to a controller: cheap to clone, `Send + Sync`. Dropping
/// every handle does not stop the controller; call [`stop`](Self::stop) or
/// [`stop_with_drain`](Self::stop_with_drain).
pub struct ControllerHandle<K: ControllerKey> {
    pub(crate) core: Arc<Core<K>>,
    pub(crate) features: Arc<Features<K>>,
}

impl<K: ControllerKey> Clone for ControllerHandle<K> {
    fn clone(&self) -> Self {
        Self { core: Arc::clone(&self.core), features: Arc::clone(&self.features) }
    }
}

impl<K: ControllerKey> fmt::Debug for ControllerHandle<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerHandle").field("name", &self.core.name).finish_non_exhaustive()
    }
}

impl<K: ControllerKey> ControllerHandle<K> {
    /// The controller's name.
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// The number of worker threads.
    pub fn workers(&self) -> usize {
        match self.core.rt.get() {
            Some(rt) => rt.workers,
            None => self.core.configured_workers(),
        }
    }

    /// Asks for `key` to be reconciled. Ignored once a stop was requested.
    pub fn enqueue(&self, key: K) {
        self.core.route(key, When::Event, 0);
    }

    /// Asks for `key` to be reconciled `delay` from now (the earliest of
    /// several due times wins; a key already ready stays ready). Before
    /// start, the delay counts from the enqueue in real time, or from start
    /// on a fake clock.
    pub fn enqueue_after(&self, key: K, delay: Duration) {
        self.core.route(key, When::After(delay, Instant::now()), 0);
    }

    /// Asks for `key` to be reconciled at `at`, an instant on the
    /// controller's clock.
    pub fn enqueue_at(&self, key: K, at: Instant) {
        self.core.route(key, When::At(at), 0);
    }

    /// [`enqueue`](Self::enqueue) at `priority` (guarantees §8): ready keys are
    /// reconciled highest priority first (P1); a key already waiting with a
    /// lower priority is raised to it, a higher one stays (P2); retries keep
    /// the priority a key was handed out with (P3). Plain enqueues are 0.
    pub fn enqueue_with_priority(&self, key: K, priority: i32) {
        self.core.route(key, When::Event, priority);
    }

    /// [`enqueue_after`](Self::enqueue_after) at `priority`: the key keeps it
    /// while it waits.
    pub fn enqueue_after_with_priority(&self, key: K, delay: Duration, priority: i32) {
        self.core.route(key, When::After(delay, Instant::now()), priority);
    }

    /// [`enqueue_at`](Self::enqueue_at) at `priority`.
    pub fn enqueue_at_with_priority(&self, key: K, at: Instant, priority: i32) {
        self.core.route(key, When::At(at), priority);
    }

    /// [`Controller::watch_cache`](super::Controller::watch_cache) through
    /// a handle. Before start it is the same (the cache holds the
    /// controller until it syncs, E5); after start the cache is acquired
    /// (started if not running) and subscribed at once, and does not hold
    /// the controller: its list's keys are handed out as they come. Returns
    /// at once: the keys a synced cache already holds go through `map` on a
    /// catch-up thread of the cache. An error if the cache or the
    /// controller was stopped (nothing changed), or the OS refused the
    /// cache's thread or its catch-up thread.
    pub fn watch_cache<S: crate::source::Source>(
        &self,
        cache: &crate::cache::Cache<S>,
        watch: Watch<S, K>,
    ) -> Result<(), WatchError> {
        self.features.watches.watch(&self.core, cache, watch)
    }

    /// Blocks until every cache this controller watches has synced and
    /// every key it held then has reached the controller (its first list,
    /// or its catch-up; `None`: no time limit); returns whether they have
    /// (`true` at once if it
    /// watches none; `false` at once for a cache stopped unsynced).
    pub fn wait_synced(&self, timeout: Option<Duration>) -> bool {
        self.features.watches.wait_synced(timeout)
    }

    /// Makes `key` run after `parents` (guarantees §14): replaces its earlier
    /// parents (an empty list clears them), enqueues nothing, applies at
    /// once to keys already waiting, and may be called before start. A key
    /// is never handed out while an ancestor is ready or being reconciled
    /// (D1); when a key's run of attempts ends its dependents are enqueued
    /// (D2); a key becoming ready cancels its running descendants and runs
    /// after they returned (D3). Parents that would close a cycle return
    /// [`DependencyError::Cycle`] and change nothing (D4). With
    /// [`sharding`](super::Controller::sharding), a parent in another
    /// partition than `key` (after [`partition_by`](super::Controller::partition_by))
    /// returns [`DependencyError::CrossPartition`] and changes nothing (C4).
    pub fn set_dependencies(&self, key: &K, parents: impl IntoIterator<Item = K>) -> Result<(), DependencyError<K>> {
        let partitioner = self.features.partitioner();
        self.core.set_dependencies(&self.features.deps_before_start, partitioner.as_ref(), key, parents)
    }

    /// Opens a batch (guarantees §15, U3): while any batch is open (from any
    /// thread, nested or overlapping), no key that becomes ready is handed
    /// out; keys ready before the first one opened keep running. When the
    /// last one closes (its guard dropped), they are scheduled together,
    /// ancestors first (D1). May be opened before start.
    pub fn batch(&self) -> Batch<K> {
        self.core.open_batch(&self.features.batches)
    }

    /// `key`'s direct parents (empty if none).
    pub fn dependencies(&self, key: &K) -> Vec<K> {
        self.core.dependencies(&self.features.deps_before_start, key)
    }

    /// `key`'s direct dependents (empty if none).
    pub fn dependents(&self, key: &K) -> Vec<K> {
        self.core.dependents(&self.features.deps_before_start, key)
    }

    /// The pending ancestors holding `key` (empty when nothing holds it).
    pub fn waiting_for(&self, key: &K) -> Vec<K> {
        self.core.rt.get().map(|rt| rt.queue.waiting_for(key)).unwrap_or_default()
    }

    /// Cancels the reconcile of `key` if one is running (its
    /// [`Context::is_cancelled`](super::Context::is_cancelled) turns true);
    /// returns whether one was.
    pub fn cancel(&self, key: &K) -> bool {
        let Some(rt) = self.core.rt.get() else {
            return false;
        };
        for slot in &rt.slots {
            let running = slot.running.lock();
            if running.as_ref().is_some_and(|r| &r.key == key) {
                slot.signal.set();
                return true;
            }
        }
        false
    }

    /// Blocks until nothing is ready, being reconciled or waiting for a due
    /// time, for at most `timeout` of real time; returns whether that
    /// happened. A controller not started yet is idle only if nothing was
    /// enqueued. Keys waiting for a retry or an `Action::RequeueAfter`
    /// resync count as busy (a test can then wait for a whole retry chain),
    /// so a controller that resyncs never becomes idle.
    ///
    /// Called from a reconcile of this controller it returns `false` at
    /// once: the controller cannot become idle while that reconcile waits
    /// (see [`on_own_worker`](Self::on_own_worker)).
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        if self.on_own_worker() {
            return false;
        }
        let deadline = deadline_after(Instant::now(), timeout);
        if self.core.rt.get().is_none() {
            // Idle at once with nothing pending; else once started (or
            // stopped), then as the queue says.
            // Pending is read before the runtime: a start sets the runtime
            // before it takes the pending keys, so empty-then-unset means
            // nothing was enqueued (not that a start just took it).
            let mut nothing_pending = false;
            let waited = self.core.life.wait_until(Some(deadline), |life| {
                nothing_pending = life.phase == Phase::NotStarted
                    && self.core.pending.lock().is_empty()
                    && self.core.rt.get().is_none();
                nothing_pending || life.phase != Phase::NotStarted
            });
            if nothing_pending {
                return true;
            }
            if !waited {
                return false;
            }
        }
        let Some(rt) = self.core.rt.get() else { return true };
        loop {
            if !rt.queue.wait_idle(deadline.saturating_duration_since(Instant::now())) {
                return false;
            }
            // A watched cache's changes held until the store writes their
            // trace (E9) are not in the queue yet, but they are work: wait
            // for the write that releases them into it, then look again.
            let Some(link) = rt.store.as_ref().filter(|link| link.holds_changes()) else { return true };
            let released = persist::ask_flush(&self.core)
                .map(|pending| pending.wait(Some(deadline.saturating_duration_since(Instant::now()))).is_some());
            if !matches!(released, Ok(true)) && link.holds_changes() {
                return false;
            }
        }
    }

    /// Whether the calling thread is one of this controller's workers (so
    /// inside one of its reconciles): waiting there for the controller to
    /// become idle or stopped would wait for the caller itself.
    pub fn on_own_worker(&self) -> bool {
        worker::on_worker_of(&self.core)
    }

    /// Counters, queue sizes, hangs and the last error.
    pub fn stats(&self) -> Stats {
        self.core.stats_and_hanging().0
    }

    /// With [`sharding`](super::Controller::sharding): the partitions this
    /// replica owns now (empty before start, or while cut off from etcd).
    pub fn owned_partitions(&self) -> std::collections::BTreeSet<u32> {
        self.core.gate().and_then(Gate::shard_status).map(|s| s.owned).unwrap_or_default()
    }

    /// Keys being reconciled per group (guarantees §8), for a controller built
    /// with [`group`](super::Controller::group) returning `G`; `None` is
    /// the group of keys whose group function panicked. Empty without
    /// groups, before start, or if `G` is not the controller's group type.
    pub fn in_flight_by_group<G>(&self) -> Vec<(Option<G>, usize)>
    where
        G: Eq + std::hash::Hash + Clone + 'static,
    {
        let Some(rt) = self.core.rt.get() else { return Vec::new() };
        let Some(table) = rt.grouping.as_ref().and_then(|g| g.as_any().downcast_ref::<GroupTable<K, G>>()) else {
            return Vec::new();
        };
        table.name_ids(&rt.queue.in_flight_by_group())
    }

    /// Reconciles running longer than the hanging threshold, longest first,
    /// with how long they have run (on the controller's clock). Empty when
    /// no threshold is configured.
    pub fn hanging(&self) -> Vec<(K, Duration)> {
        self.core.hanging()
    }

    /// Where `key` stands: its state, attempts, last error and next run.
    pub fn inspect(&self, key: &K) -> KeyInfo {
        let memory = self.core.memory.get(key);
        let mut info = KeyInfo {
            state: KeyStatus::Unknown,
            attempts: memory.attempts,
            last_error: memory.last_error,
            next_run: None,
        };
        let Some(rt) = self.core.rt.get() else {
            if self.core.pending.lock().iter().any(|(k, _, _)| k == key) {
                info.state = KeyStatus::Ready;
            }
            return info;
        };
        let now = rt.clock.now();
        let since = rt.slots.iter().find_map(|slot| {
            let running = slot.running.lock();
            running.as_ref().filter(|r| &r.key == key).map(|r| r.started.at(now))
        });
        match rt.queue.key_state(key) {
            KeyState::Absent => {
                if let Some((error, _)) = self.core.parked.error_of(key) {
                    info.state = KeyStatus::Parked;
                    info.last_error = Some(error);
                }
            }
            KeyState::Ready => {
                info.state = KeyStatus::Ready;
                info.next_run = Some(now);
            }
            KeyState::Waiting { due } => {
                info.state = KeyStatus::Waiting { until: due };
                info.next_run = Some(due);
            }
            KeyState::Processing { again } => {
                info.state = KeyStatus::Running { since: since.unwrap_or(now) };
                info.next_run = match again {
                    Some(Some(due)) => Some(due),
                    Some(None) => Some(now),
                    None => None,
                };
            }
        }
        info
    }

    /// Keys that failed permanently, oldest first (at most the parked
    /// capacity).
    pub fn parked(&self) -> Vec<K> {
        self.core.parked.keys()
    }

    /// Takes `key` out of the parked set and enqueues it (attempt 0); returns
    /// whether it was parked.
    pub fn requeue_parked(&self, key: &K) -> bool {
        if !self.core.parked.unpark(key) {
            return false;
        }
        self.enqueue(key.clone());
        true
    }

    /// Stops at once: no new keys are taken, ready and delayed keys are
    /// dropped, in-flight reconciles are cancelled and their workers exit
    /// when they return, triggers are signalled, and the caches it watched
    /// that nothing else keeps running are told to stop. Returns without
    /// waiting (see [`join_timeout`](Self::join_timeout), and
    /// [`Cache::stop`](crate::Cache::stop) to wait for a cache's thread).
    /// Stopping twice is fine.
    pub fn stop(&self) {
        self.core.request_stop();
        self.core.cancel_everything();
        if let Some(rt) = self.core.rt.get() {
            rt.queue.shut_down_now();
            logs::stop_dropped(&self.core.name, &self.core.take_dropped(rt));
        }
    }

    /// Two-phase stop; returns whether every worker finished in time. See
    /// [`stop_with_drain_report`](Self::stop_with_drain_report).
    pub fn stop_with_drain(&self, timeout: Duration) -> bool {
        self.stop_with_drain_report(timeout).finished
    }

    /// Two-phase stop. First the drain: enqueues are ignored from now on,
    /// delayed keys are dropped, keys already ready are still reconciled
    /// (and keys added again while running are reconciled once more), and
    /// in-flight reconciles are *not* cancelled. If that has not finished
    /// when `timeout` (real time) runs out, every remaining reconcile is
    /// cancelled, the ready keys left are dropped, and the workers still
    /// running are detached: they exit when their reconcile returns.
    /// Returns by the deadline either way.
    ///
    /// Trigger and watch threads are signalled and waited for until the
    /// same deadline; a watch blocked in an iterator that never yields cannot
    /// be interrupted and is detached (use
    /// [`watch_channel`](Self::watch_channel) for channels: it is
    /// interruptible). So are the threads of the caches this stop stopped
    /// (watched by no other running controller, not started by hand): one
    /// still in a source that ignores its [`Stop`](crate::source::Stop) is
    /// left behind and named in [`StopReport::unfinished_caches`].
    pub fn stop_with_drain_report(&self, timeout: Duration) -> StopReport<K> {
        let options = StopOptions { drain: true, timeout: Some(timeout), aux_grace: None };
        let mut stopping = self.stop_with(options);
        loop {
            if let Some(report) = stopping.wait(Duration::MAX) {
                return report;
            }
        }
    }

    /// How many trigger, watch and watchdog threads are running.
    pub fn background_threads(&self) -> usize {
        self.core.life.read(|life| life.live_aux)
    }

    /// Where the controller is in its life: not started, running, standby
    /// (running, not leading its election), stopping or stopped. The status
    /// (`crate::status`) and Python's `stats()` say the same.
    pub fn state(&self) -> RunState {
        self.core.run_state()
    }

    /// Whether `start` got as far as making the runtime (a start that
    /// failed later counts: it stopped what it made).
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn has_started(&self) -> bool {
        self.core.rt.get().is_some()
    }

    /// Whether the controller is stopped: a stop was requested and every
    /// worker has exited (or was detached at a drain's deadline).
    pub fn is_stopped(&self) -> bool {
        self.core.life.phase() == Phase::Stopped
    }

    /// Blocks until [`is_stopped`](Self::is_stopped), for at most `timeout`
    /// of real time (`None`: no limit); returns whether it is stopped.
    /// Called from a reconcile of this controller it returns `false` at
    /// once: the controller cannot stop while that reconcile waits.
    pub fn wait_stopped(&self, timeout: Option<Duration>) -> bool {
        if self.on_own_worker() {
            return false;
        }
        let deadline = timeout.map(|t| deadline_after(Instant::now(), t));
        self.core.life.wait_until(deadline, |life| life.phase == Phase::Stopped)
    }

    /// Waits at most `timeout` (real time) for a stopped controller's
    /// threads (workers, triggers, watches, watchdog) to exit, and joins
    /// them; returns whether all had. False while the controller runs, so a
    /// caller can wait for a stop in slices (checking for Ctrl-C between).
    pub fn join_timeout(&self, timeout: Duration) -> bool {
        self.core.life.join(deadline_after(Instant::now(), timeout))
    }

    /// Starts a stop as `options` say and returns it under way; its
    /// [`wait`](Stopping::wait) finishes it. Requests the stop before it
    /// returns: [`state`](Self::state) is stopping or stopped from then on.
    pub fn stop_with(&self, options: StopOptions) -> Stopping<K> {
        if !options.drain {
            self.stop();
        }
        Stopping::begin(Arc::clone(&self.core), Arc::clone(&self.features), options)
    }

    /// Blocks until every change made before the call (keys enqueued, with
    /// or without a delay, and reconciles that returned: done, retried,
    /// parked) is on disk in the controller's [`store`](crate::Controller::store),
    /// without waiting for the next flush interval. Callers flushing at
    /// the same time share one write.
    ///
    /// This is the point to advance a position kept outside from: enqueue
    /// the keys a change feed gave, `flush()`, then record the feed's
    /// position; after a crash, every key enqueued before the recorded
    /// position comes back (section 9's restore).
    ///
    /// # Errors
    /// * The write failed: the [`StoreError`](crate::StoreError) inside the `io::Error`
    ///   (`get_ref()` + `downcast_ref`); the keys stay pending (in
    ///   `stats().store`) and the next flush writes them again.
    /// * The controller was never started ([`io::ErrorKind::Other`]): keys
    ///   enqueued before [`start`](crate::Controller::start) reach the
    ///   store only once `start` has claimed it.
    ///
    /// Without a store it returns `Ok` at once: there is nothing to write
    /// (and nothing survives a crash). After a stop, it waits for the
    /// stop's last flush and returns its outcome; while a stop waits for
    /// its reconciles, it writes what changed so far, as before the stop.
    pub fn flush(&self) -> io::Result<()> {
        let pending = self.ask_flush()?;
        pending.wait(None).expect("waited without a deadline").map_err(io::Error::from)
    }

    /// Asks for the write [`flush`](Self::flush) waits for.
    pub(crate) fn ask_flush(&self) -> io::Result<PendingFlush> {
        persist::ask_flush(&self.core)
    }

    /// Runs `trigger(&stop)` on its own thread and enqueues `key` when it
    /// returns, unless it panicked, returned "don't" (see
    /// [`TriggerOutcome`]), or `stop` was set meanwhile. `stop` is set by
    /// [`remove_trigger`](Self::remove_trigger), by a later trigger for the
    /// same key (which replaces this one), and by stopping the controller;
    /// a long-running trigger should wait on it
    /// (`stop.wait_timeout(..)`) rather than sleep. Ignored once stopped.
    pub fn add_trigger<F, R>(&self, key: K, trigger: F)
    where
        F: FnOnce(&StopSignal) -> R + Send + 'static,
        R: TriggerOutcome,
    {
        triggers::add(&self.core, &self.features.triggers, key, trigger);
    }

    /// Signals the trigger for `key` (it will not enqueue); returns whether
    /// there was one.
    pub fn remove_trigger(&self, key: &K) -> bool {
        triggers::remove(&self.features.triggers, key)
    }

    /// Consumes `events` on its own thread and enqueues every key
    /// `transform(event)` returns (any `IntoIterator`: a `Vec`, an
    /// `Option`, `std::iter::once(k)`...). The thread ends when the iterator
    /// does, or at the first event after the controller stops; an iterator
    /// that blocks forever keeps it alive (it is detached at a drain's
    /// deadline). For a `crossbeam_channel::Receiver`, prefer
    /// [`watch_channel`](Self::watch_channel), which a stop interrupts.
    /// A panic in `transform` is logged and the event skipped.
    pub fn watch<I, E, F, R>(&self, events: I, transform: F)
    where
        I: IntoIterator<Item = E>,
        I::IntoIter: Send + 'static,
        F: FnMut(E) -> R + Send + 'static,
        R: IntoIterator<Item = K>,
    {
        triggers::watch(&self.core, events, transform);
    }

    /// Like [`watch`](Self::watch) for a channel, but interruptible: the
    /// thread ends when every sender is dropped or the controller stops,
    /// whichever comes first.
    pub fn watch_channel<E, F, R>(&self, events: crossbeam_channel::Receiver<E>, transform: F)
    where
        E: Send + 'static,
        F: FnMut(E) -> R + Send + 'static,
        R: IntoIterator<Item = K>,
    {
        triggers::watch_channel(&self.core, events, transform);
    }
}
