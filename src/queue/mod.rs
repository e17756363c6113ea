//! The rate-limiting work queue (guarantees §1, §3).
//!
//! One mutex guards a [`QueueState`] (ready FIFO, per-key slots, delay heap);
//! getters block on a condvar. What makes it fast is avoiding what costs far
//! more than the queue operations themselves on a VM: waking a parked thread
//! (a futex round trip, 10–20 µs), giving the CPU up while the lock is held
//! for tens of nanoseconds (`sync::lock_hot` spins briefly instead), and
//! cache misses inside the lock (`state.rs` hands keys out by slab index,
//! and the key index's buckets are prefetched before they are needed).
//!
//! (A lock-free inbox for adds was tried and measured: it lets a producer
//! run far ahead, so the backlog lands in the key map, which then misses the
//! cache on every operation; taking the lock on every add keeps producer and
//! consumers in step and was faster at every worker count.)
//!
//! * **Waking is counted.** The queue knows how many getters are parked and
//!   not yet claimed by a notify, and how many were notified and are not yet
//!   running, so one ready key wakes at most one getter, and no more getters
//!   are woken at once than there are cores to run them (each woken getter
//!   that takes a key passes the wake on while keys remain).
//! * **A short spin before parking.** A getter that finds nothing spins
//!   briefly (one spinner at a time per two cores), lock released, watching
//!   a "keys ready" flag before it parks, so a steady producer keeps its
//!   consumers awake without syscalls; adds leave the spinner its key
//!   instead of waking a sleeper. The spin never yields its CPU
//!   (`sync::spin_until`): a yield on a busy machine kept that key waiting
//!   for other threads' time slices.
//! * **No timer thread.** At most one parked getter, the *timekeeper*, sleeps
//!   with a timeout: until the earliest due time. Everyone else sleeps
//!   untimed. When the timekeeper leaves with a key, it hands the duty on by
//!   waking one sleeper; a new earlier due time wakes one sleeper to take it.
//!   An idle queue therefore has no thread waking up at all (G8), and a
//!   delayed key is handed out within a wake-up latency of its due time.

mod again_counts;
mod delay_heap;
mod extensions;
mod holds;
mod key_index;
mod metrics;
mod ready;
mod slab;
mod slot;
mod state;
mod stop_views;

use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::clock::{Clock, SystemClock, deadline_after};
use crate::observe::metrics::MetricFamilies;
use crate::observe::{self, Observed};
use crate::rate_limit::{RateLimiter, default_rate_limiter};
use crate::sync::{AtomicUsize, Condvar, Mutex, MutexGuard, lock_hot, spin_until};
use key_index::Prefetcher;
use metrics::{Now, Recorder};
use ready::ReadySet;
pub(crate) use ready::{GroupId, Priority};
use slot::{Added, Finished, Hasher};
pub(crate) use slot::{Cancel, CancelHook, Place, View};
use state::QueueState;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

pub use slot::KeyState;

/// What [`WorkQueue::done_and_get_stamped`] does besides ending a key's
/// processing and taking the next key.
#[derive(Clone, Copy)]
pub(crate) enum AlsoDone<'a> {
    /// Nothing more: one lock round trip.
    Nothing,
    /// D2: the key's run of attempts ended; its direct dependents are added
    /// first, at priority 0 in group 0, under the same lock (a tree's keys
    /// then cost one lock round trip each, as without dependencies: W12).
    AddDependents,
    /// Called once the key is done, still under the lock: a controller's
    /// store learns that the key finished even when no key follows it for
    /// a long time, and before anyone can see it done (a `wait_idle`
    /// that returned, then a flush, must find the mark: called after the
    /// lock, the flush could take the marks first and leave the key's row
    /// as it was while it ran). Keep it short: a push, never a wait.
    ThenCall(&'a dyn Fn()),
}

/// The queue's sizes, read together under one lock.
///
/// Exhaustive: three counts that are the queue's whole state, compared
/// with a literal in tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueCounts {
    /// Keys ready to be handed out.
    pub ready: usize,
    /// Keys handed out and not yet done.
    pub processing: usize,
    /// Keys waiting for a due time.
    pub delayed: usize,
}

/// Why [`WorkQueue::get_timeout`] returned without a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GetError {
    /// Nothing became ready before the timeout.
    Timeout,
    /// The queue is shut down and nothing is ready.
    ShutDown,
}

impl fmt::Display for GetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GetError::Timeout => "timed out waiting for a key",
            GetError::ShutDown => "the queue is shut down",
        })
    }
}

impl std::error::Error for GetError {}

/// A deduplicating, delaying, rate-limiting work queue, shared by cloning.
///
/// Guarantees (guarantees §1): a key waiting to be handed out is handed out once
/// however often it is added (G1); a key is never handed to two getters at
/// once, and one added while it is processed is handed out again after
/// [`done`](Self::done) (G2, G3); ready keys come out first-in first-out
/// (G4); delays only ever advance a key, and a plain add cancels its delay
/// (G5).
///
/// Priorities (guarantees §8): [`add_with_priority`](Self::add_with_priority)
/// and [`add_after_with_priority`](Self::add_after_with_priority) give a
/// key an `i32` priority (plain adds give 0). Ready keys come out highest
/// priority first, first-in first-out within one (P1); a key's priority
/// only rises while it is in the queue, whatever the add does to its timing
/// (P2), and a key added while processing comes back with the highest
/// priority it was given.
///
/// ```
/// use reconq::WorkQueue;
///
/// let q = WorkQueue::new();
/// q.add("a");
/// q.add("a");
/// assert_eq!(q.len(), 1);
/// let key = q.get().unwrap();
/// // ... reconcile `key` ...
/// q.done(&key);
/// q.shut_down();
/// assert_eq!(q.get(), None);
/// ```
pub struct WorkQueue<K> {
    shared: Arc<Shared<K>>,
}

struct Shared<K> {
    locked: Mutex<Locked<K>>,
    /// Getters spinning, lock released, before they park.
    spinners: AtomicUsize,
    /// Whether a getter could take a key now, published under the lock for
    /// spinners. Written only when it flips (see `publish_ready`).
    any_ready: crate::sync::AtomicBool,
    /// Getters wait here for a ready key (or a due time, or shutdown).
    ready: Condvar,
    /// `shut_down_with_drain` waits here for processing keys to finish.
    drained: Condvar,
    /// `wait_idle` waits here for the queue to empty out.
    idle: Condvar,
    limiter: Box<dyn RateLimiter<K>>,
    clock: Arc<dyn Clock>,
    /// Keeps a fake clock's wake-up callback alive (see `build`).
    _clock_subscription: Option<Arc<dyn Fn() + Send + Sync>>,
    /// Prefetches an added key's index bucket before the lock is taken.
    prefetcher: Arc<Prefetcher<Hasher>>,
    /// The metrics label; only named queues record metrics.
    name: Option<String>,
    /// Lists a named queue for metrics while it lives.
    _registration: Option<observe::Registration>,
    /// Whether the last add of a named queue needed a clock reading (see
    /// `add_now`). Padded: read by every add, written only when it flips.
    /// A hint only (std's atomic even under shuttle: no scheduling point).
    add_stamps: crossbeam_utils::CachePadded<AtomicBool>,
}

struct Locked<K> {
    q: QueueState<K>,
    /// Getters parked on `ready` that no notify has claimed yet.
    sleepers: usize,
    /// Getters notified and not yet running again. Each will take a ready
    /// key or, if there is none, park again.
    waking: usize,
    /// The due time the timekeeper sleeps until, if a getter has that duty.
    timekeeper: Option<Instant>,
    /// Bumped whenever the duty changes hands, so a getter can tell on waking
    /// whether it still holds it.
    timekeeper_term: u64,
    /// Threads blocked in `wait_idle` (so `done` notifies only when needed).
    idle_waiters: usize,
}

type Guard<'a, K> = MutexGuard<'a, Locked<K>>;

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self { shared: Arc::clone(&self.shared) }
    }
}

impl<K: Eq + Hash + Clone + Send + 'static> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::new()
    }
}

/// Builds a [`WorkQueue`] with a non-default limiter or clock.
#[must_use = "a builder does nothing until `.build()`"]
pub struct WorkQueueBuilder<K> {
    limiter: Option<Box<dyn RateLimiter<K>>>,
    clock: Arc<dyn Clock>,
    name: Option<String>,
    /// `Some(limit)`: serve groups round-robin (see `ready.rs`).
    groups: Option<Option<usize>>,
    /// Keep what a store must see ([`for_store`](Self::for_store)).
    for_store: bool,
}

impl<K: Eq + Hash + Clone + Send + 'static> WorkQueueBuilder<K> {
    /// The limiter behind [`WorkQueue::add_rate_limited`]; the default is
    /// [`default_rate_limiter`].
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<K> + 'static) -> Self {
        self.limiter = Some(Box::new(limiter));
        self
    }

    /// The clock delays are measured on; the default is [`SystemClock`].
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Names the queue, which turns its metrics on (`workqueue_*{name=...}`,
    /// see [`crate::metrics`]). As in client-go, an unnamed queue records no
    /// metrics and reads no clock for them. Queues with the same name add up
    /// into one series.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Hands ready keys of one priority out round-robin across the groups
    /// the adds give them (P4), at most `limit` keys of one group in flight
    /// (P5). The controller's `group` option; plain adds put keys in group 0.
    pub(crate) fn groups(mut self, limit: Option<usize>) -> Self {
        self.groups = Some(limit);
        self
    }

    /// Keeps what a controller's store must see: what a shutdown drops or
    /// refuses (see `stop_views.rs`) and the dependents D2 adds (see
    /// [`WorkQueue::take_dependents_views`]).
    pub(crate) fn for_store(mut self) -> Self {
        self.for_store = true;
        self
    }

    /// The queue, empty and running.
    pub fn build(self) -> WorkQueue<K> {
        let recorder = if self.name.is_some() { Recorder::on() } else { Recorder::off() };
        let ready = match self.groups {
            Some(limit) => ReadySet::fair(limit),
            None => ReadySet::new(),
        };
        let shared = Arc::new_cyclic(|weak: &Weak<Shared<K>>| {
            // A fake clock's time jumps: promote what became due before
            // `advance` returns (so a test sees it ready at once), then wake
            // every getter to re-check due times. The callback holds the
            // queue weakly and the queue holds the callback, so it lives
            // exactly as long as the queue.
            let clock_subscription = (!self.clock.is_real_time()).then(|| {
                let weak = weak.clone();
                let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
                    if let Some(shared) = weak.upgrade() {
                        let mut g = shared.lock();
                        shared.sync(&mut g, &mut Now::new());
                        shared.wake_all(&mut g);
                    }
                });
                self.clock.subscribe(Arc::downgrade(&wake));
                wake
            });
            let mut q = QueueState::new(recorder, ready);
            if self.for_store {
                q.for_store();
            }
            Shared {
                prefetcher: q.prefetcher(),
                locked: Mutex::new(Locked {
                    q,
                    sleepers: 0,
                    waking: 0,
                    timekeeper: None,
                    timekeeper_term: 0,
                    idle_waiters: 0,
                }),
                spinners: AtomicUsize::new(0),
                any_ready: crate::sync::AtomicBool::new(false),
                ready: Condvar::new(),
                drained: Condvar::new(),
                idle: Condvar::new(),
                limiter: self.limiter.unwrap_or_else(|| Box::new(default_rate_limiter())),
                clock: self.clock,
                _clock_subscription: clock_subscription,
                _registration: self.name.is_some().then(|| observe::register(weak.clone())),
                add_stamps: crossbeam_utils::CachePadded::new(AtomicBool::new(true)),
                name: self.name,
            }
        });
        WorkQueue { shared }
    }
}

impl<K: Eq + Hash + Clone + Send + 'static> WorkQueue<K> {
    /// A queue with [`default_rate_limiter`] on the system clock.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A queue whose [`add_rate_limited`](Self::add_rate_limited) asks
    /// `limiter`.
    pub fn with_rate_limiter(limiter: impl RateLimiter<K> + 'static) -> Self {
        Self::builder().rate_limiter(limiter).build()
    }

    /// A builder for a queue with a rate limiter, a clock or a name (for
    /// metrics), in any combination.
    pub fn builder() -> WorkQueueBuilder<K> {
        WorkQueueBuilder { limiter: None, clock: Arc::new(SystemClock), name: None, groups: None, for_store: false }
    }

    /// Marks `key` as needing processing now. Ignored once shut down.
    pub fn add(&self, key: K) {
        self.add_now(key, false, Place::default());
    }

    /// [`add`](Self::add) with priority `priority` (P1, P2): a key already
    /// waiting with a lower priority is raised to it; a higher one stays.
    pub fn add_with_priority(&self, key: K, priority: i32) {
        self.add_now(key, false, Place { prio: priority, group: 0 });
    }

    /// [`add_after`](Self::add_after) with priority `priority`: the key
    /// keeps it while it waits (P2).
    pub fn add_after_with_priority(&self, key: K, delay: Duration, priority: i32) {
        self.add_after_placed(key, delay, Place { prio: priority, group: 0 });
    }

    /// [`add_at`](Self::add_at) with priority `priority`.
    pub fn add_at_with_priority(&self, key: K, due: Instant, priority: i32) {
        self.add_at_instant(key, due, self.shared.clock.now(), Place { prio: priority, group: 0 }, QueueState::add_at);
    }

    /// An add with a priority and a group (the group is kept only if the
    /// key is not in the queue yet).
    pub(crate) fn add_placed(&self, key: K, place: Place) {
        self.add_now(key, false, place);
    }

    pub(crate) fn add_after_placed(&self, key: K, delay: Duration, place: Place) {
        if delay.is_zero() {
            return self.add_now(key, true, place);
        }
        let now = self.shared.clock.now();
        self.add_at_instant(key, deadline_after(now, delay), now, place, QueueState::add_at);
    }

    pub(crate) fn add_at_placed(&self, key: K, due: Instant, place: Place) {
        self.add_at_instant(key, due, self.shared.clock.now(), place, QueueState::add_at);
    }

    /// `add`; `retry` counts it for the metrics' retries (a zero-delay
    /// `add_after`).
    fn add_now(&self, key: K, retry: bool, place: Place) {
        // A named queue reads the clock before locking if the previous add
        // needed a reading (it inserted its key), so a stream of new keys
        // does not read it inside the serialised section, while a stream
        // of duplicates (a hot key) does not read it at all.
        let predicted = self.shared.name.is_some() && self.shared.add_stamps.load(Relaxed);
        let mut now = if predicted { Now::read() } else { Now::new() };
        // A new key's bucket is a cache miss on a deep backlog: let it load
        // while we wait for the lock, not while we hold it.
        self.shared.prefetcher.prefetch(&key);
        let mut g = self.shared.lock();
        self.shared.sync(&mut g, &mut now);
        if retry {
            g.q.count_retry();
        }
        g.q.add(key, place, &mut now);
        self.shared.publish_ready(&g);
        self.shared.wake_ready(&mut g);
        if self.shared.name.is_some() && now.used() != predicted {
            self.shared.add_stamps.store(now.used(), Relaxed);
        }
    }

    /// Marks `key` as needing processing `delay` from now (G5). A zero delay
    /// is [`add`](Self::add).
    pub fn add_after(&self, key: K, delay: Duration) {
        self.add_after_placed(key, delay, Place::default());
    }

    /// Marks `key` as needing processing at `due` on the queue's clock.
    pub fn add_at(&self, key: K, due: Instant) {
        self.add_at_instant(key, due, self.shared.clock.now(), Place::default(), QueueState::add_at);
    }

    fn add_at_instant(&self, key: K, due: Instant, now: Instant, place: Place, add: AddAt<K>) {
        let mut g = self.shared.lock();
        let mut stamp = Now::new();
        self.shared.sync(&mut g, &mut stamp);
        g.q.count_retry();
        if let Added::Scheduled(due) = add(&mut g.q, key, due, now, &mut stamp, place) {
            self.shared.on_scheduled(&mut g, due);
        }
        self.shared.publish_ready(&g);
        self.shared.wake_ready(&mut g);
    }

    /// Moves `key`'s due time from `from` to `to` if its timer is still the
    /// one due at `from` (U2's trailing edge; see `QueueState::move_due`);
    /// `false` if it is not (nothing changed).
    pub(crate) fn move_due_placed(&self, key: K, from: Instant, to: Instant, place: Place) -> bool {
        let now = self.shared.clock.now();
        let mut g = self.shared.lock();
        let mut stamp = Now::new();
        self.shared.sync(&mut g, &mut stamp);
        let Some(added) = g.q.move_due(key, from, to, now, &mut stamp, place) else { return false };
        if let Added::Scheduled(due) = added {
            self.shared.on_scheduled(&mut g, due);
        }
        self.shared.publish_ready(&g);
        self.shared.wake_ready(&mut g);
        true
    }

    /// Re-adds `key` after the wait its rate limiter gives (G6). A key
    /// being processed comes back with the priority it was handed out with
    /// (P3), as the controller's retries do.
    pub fn add_rate_limited(&self, key: K) {
        let delay = self.shared.limiter.when(&key);
        let prio = self.shared.lock().q.retry_priority(&key);
        self.add_after_placed(key, delay, Place { prio, group: 0 });
    }

    /// Clears the rate limiter's memory of `key`. Does not mark it done.
    pub fn forget(&self, key: &K) {
        self.shared.limiter.forget(key);
    }

    /// How many times `key` was rate-limited since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.shared.limiter.num_requeues(key)
    }

    /// Blocks until a key is ready and hands it out; `None` once the queue is
    /// shut down and nothing is ready (G7). Pair every key with
    /// [`done`](Self::done).
    pub fn get(&self) -> Option<K> {
        self.get_with_priority().map(|(key, _)| key)
    }

    /// [`get`](Self::get), also returning the priority the key was handed
    /// out with (to re-add it with on a retry, P3).
    pub fn get_with_priority(&self) -> Option<(K, i32)> {
        let mut now = self.shared.stamp();
        let mut g = self.shared.lock();
        self.shared.next(&mut g, None, &mut now).ok()
    }

    /// Like [`get`](Self::get), waiting at most `timeout` (on the queue's
    /// clock).
    pub fn get_timeout(&self, timeout: Duration) -> Result<K, GetError> {
        let deadline = deadline_after(self.shared.clock.now(), timeout);
        let mut now = self.shared.stamp();
        let mut g = self.shared.lock();
        self.shared.next(&mut g, Some(deadline), &mut now).map(|(key, _)| key)
    }

    /// Hands out a key if one is ready now, without blocking.
    pub fn try_get(&self) -> Option<K> {
        let mut now = self.shared.stamp();
        let mut g = self.shared.lock();
        self.shared.take(&mut g, &mut now).map(|(key, _)| key)
    }

    /// Marks the processing of `key` finished. If `key` was added meanwhile,
    /// it becomes ready again. A key not being processed is left alone.
    pub fn done(&self, key: &K) {
        let mut now = self.shared.stamp();
        let mut g = self.shared.lock();
        self.shared.finish(&mut g, key, &mut now);
        self.shared.wake_ready(&mut g);
    }

    /// [`done`](Self::done) for `key`, then [`get`](Self::get), under one
    /// lock acquisition: the worker loop's fast path. (A named queue reads
    /// the clock once for both.)
    pub fn done_and_get(&self, key: &K) -> Option<K> {
        let mut now = self.shared.stamp();
        let mut g = self.shared.lock();
        self.shared.finish(&mut g, key, &mut now);
        self.shared.next(&mut g, None, &mut now).ok().map(|(key, _)| key)
    }

    /// [`done_and_get`](Self::done_and_get) with the caller's clock reading
    /// `stamp` (raw ticks, see `observe::metrics::ticks`), and what `also`
    /// says: a controller's worker chooses it once per finished reconcile
    /// (the after-reconcile choice its start made, `controller::finish`).
    /// Also returns the reading the hand-out of the next key was stamped
    /// with, so a worker that times its reconciles reads the clock once per
    /// key in all. The next key comes with its priority. Inlined by force:
    /// each caller passes one `also`, so its other branches fold away (a
    /// call passing the enum cost the worker loop about 10 instructions a
    /// key, W1).
    #[inline(always)]
    pub(crate) fn done_and_get_stamped(&self, key: &K, stamp: u64, also: AlsoDone<'_>) -> (Option<(K, Priority)>, u64) {
        let mut now = Now::at(stamp);
        let mut g = self.shared.lock();
        if let AlsoDone::AddDependents = also {
            g.q.add_dependents(key, &mut now);
        }
        self.shared.finish(&mut g, key, &mut now);
        if let AlsoDone::ThenCall(after_done) = also {
            after_done();
        }
        let next = self.shared.next(&mut g, None, &mut now).ok();
        drop(g);
        (next, now.reading())
    }

    /// Number of ready keys (not counting processing or delayed ones).
    pub fn len(&self) -> usize {
        self.shared.lock_synced().q.len()
    }

    /// Whether no key is ready (processing and delayed keys do not
    /// count, as in [`len`](Self::len)).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of keys handed out and not yet done.
    pub fn processing_len(&self) -> usize {
        self.shared.lock_synced().q.processing_len()
    }

    /// Number of keys waiting for a due time.
    pub fn delayed_len(&self) -> usize {
        self.shared.lock_synced().q.delayed_len()
    }

    /// Ready keys per priority, highest first (priorities with none left
    /// out).
    pub fn len_by_priority(&self) -> Vec<(i32, usize)> {
        self.shared.lock_synced().q.by_priority()
    }

    /// Keys being processed per group id (empty for a queue without groups).
    pub(crate) fn in_flight_by_group(&self) -> Vec<(GroupId, usize)> {
        self.shared.lock().q.in_flight_by_group()
    }

    /// The ready, processing and delayed counts at one instant.
    pub fn counts(&self) -> QueueCounts {
        let g = self.shared.lock_synced();
        QueueCounts { ready: g.q.len(), processing: g.q.processing_len(), delayed: g.q.delayed_len() }
    }

    /// Where `key` stands: absent, ready, waiting for a due time, or
    /// processing.
    pub fn key_state(&self, key: &K) -> KeyState {
        self.shared.lock_synced().q.key_state(key)
    }

    /// Blocks until nothing is ready, processing or delayed, for at most
    /// `timeout` of real time. Returns whether the queue became idle.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = deadline_after(Instant::now(), timeout);
        let mut g = self.shared.lock();
        loop {
            self.shared.sync(&mut g, &mut Now::new());
            self.shared.wake_ready(&mut g);
            if g.q.is_idle() {
                return true;
            }
            // With a real clock, wake at the next due time too: promoting
            // it is what lets a getter take it.
            let wake_at = match g.q.next_due() {
                Some(due) if self.shared.clock.is_real_time() => deadline.min(due),
                _ => deadline,
            };
            if Instant::now() >= deadline {
                return false;
            }
            g.idle_waiters += 1;
            self.shared.idle.wait_until(&mut g, wake_at);
            g.idle_waiters -= 1;
        }
    }

    /// Stops accepting keys and drops delayed ones; getters still receive the
    /// keys already ready, then `None` (G7). Ends a pending drain.
    pub fn shut_down(&self) {
        let mut g = self.shared.lock_synced();
        self.shared.close(&mut g, Shutdown::Stop);
    }

    /// Shuts down and drops the ready keys too, so getters return `None` at
    /// once; keys being processed are finished by `done` without being
    /// handed out again. The controller's immediate `stop` uses this.
    pub fn shut_down_now(&self) {
        let mut g = self.shared.lock_synced();
        self.shared.close(&mut g, Shutdown::Discard);
    }

    /// [`shut_down`](Self::shut_down), then blocks until every key handed out
    /// is done, including keys that were added again while processing (they
    /// are handed out once more first).
    pub fn shut_down_with_drain(&self) {
        self.drain_until(None);
    }

    /// [`shut_down_with_drain`](Self::shut_down_with_drain) waiting at most
    /// `timeout` of real time; returns whether the drain finished.
    pub fn shut_down_with_drain_timeout(&self, timeout: Duration) -> bool {
        self.drain_until(Some(deadline_after(Instant::now(), timeout)))
    }

    fn drain_until(&self, deadline: Option<Instant>) -> bool {
        let mut g = self.shared.lock_synced();
        if !g.q.is_shutting_down() {
            self.shared.close(&mut g, Shutdown::Drain);
        }
        while g.q.is_draining() && !g.q.drained() {
            match deadline {
                Some(deadline) => {
                    if self.shared.drained.wait_until(&mut g, deadline).timed_out() {
                        return g.q.drained();
                    }
                }
                None => self.shared.drained.wait(&mut g),
            }
        }
        g.q.drained()
    }

    /// The keys shutdowns dropped since the last call: delayed keys and
    /// keys waiting to retry (any shutdown), and ready keys (an immediate
    /// one, or a drain cut short). A stopping controller reports them.
    pub(crate) fn take_dropped(&self) -> Vec<K> {
        self.shared.lock().q.take_dropped()
    }

    /// The keys shutdowns dropped that [`take_dropped`](Self::take_dropped)
    /// has not taken yet, with what each was then.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding hands keys over
    pub(crate) fn dropped_keys(&self) -> Vec<(K, View)> {
        self.shared.lock().q.dropped().to_vec()
    }

    /// Whether a shutdown was asked for: adds are ignored from then on.
    pub fn is_shutting_down(&self) -> bool {
        self.shared.lock().q.is_shutting_down()
    }

    /// The clock this queue measures delays on.
    pub fn clock(&self) -> &dyn Clock {
        &*self.shared.clock
    }
}

/// `QueueState::add_at` or `retry_at`.
type AddAt<K> = fn(&mut QueueState<K>, K, Instant, Instant, &mut Now, Place) -> Added;

/// How a shutdown treats the keys still ready.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shutdown {
    /// Hand them out (G7).
    Stop,
    /// Hand them out, and let `shut_down_with_drain` wait for processing.
    Drain,
    /// Drop them.
    Discard,
}

fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// Getters allowed to spin at once: one per two cores, so spinning never
/// starves the threads doing real work.
fn max_spinners() -> usize {
    (cores() / 2).max(1)
}

/// Rounds of the spin before parking (127 pauses, about 5 µs): the pauses
/// of `crossbeam_utils::Backoff::snooze` before it yields, the spin this
/// replaced. `lock_hot`'s 12 rounds here ran W1 at four and eight workers
/// slower in alternated runs.
const PARK_SPIN_ROUNDS: u32 = 7;

/// Getters woken and not yet running, at most: more cannot run at once.
fn max_waking() -> usize {
    cores()
}

impl<K: Eq + Hash + Clone + Send + 'static> Shared<K> {
    /// For a named queue, a clock reading taken before locking, so the
    /// (serialised) locked section does not wait for the clock: `get` and
    /// `done` always record one. (Adds predict whether they will: see
    /// `add_now`.)
    #[inline]
    fn stamp(&self) -> Now {
        if self.name.is_some() { Now::read() } else { Now::new() }
    }

    /// Takes the queue's lock (see `sync::lock_hot`: it is held briefly,
    /// by one thread per core at a time).
    #[inline]
    fn lock(&self) -> Guard<'_, K> {
        lock_hot(&self.locked)
    }

    /// Publishes whether a key is ready, for spinners. Written only when it
    /// changes: a line every operation wrote bounced between the producer's
    /// and the workers' cores on each one, though spinners only ask
    /// whether it is zero.
    #[inline]
    fn publish_ready(&self, g: &Guard<'_, K>) {
        let any = g.q.available() > 0;
        if self.any_ready.load(Relaxed) != any {
            self.any_ready.store(any, Relaxed);
        }
    }

    /// Promotes keys whose due time has come (the caller wakes getters for
    /// them).
    fn sync(&self, g: &mut Guard<'_, K>, now: &mut Now) {
        if g.q.has_timers() {
            g.q.promote_due(self.clock.now(), now);
            self.publish_ready(g);
        }
    }

    /// Locks, syncs and wakes getters for the keys that became ready.
    fn lock_synced(&self) -> Guard<'_, K> {
        let mut g = self.lock();
        self.sync(&mut g, &mut Now::new());
        self.wake_ready(&mut g);
        g
    }

    /// Hands out a ready key, if any, and keeps the waking chain going.
    /// Inlined by force: with two callers (`next`, `done_and_get_stamped`)
    /// the compiler kept it out of line, and the call cost `next`, the
    /// hot path of every `get`, about 26 instructions a key (W1).
    #[inline(always)]
    fn take(&self, g: &mut Guard<'_, K>, now: &mut Now) -> Option<(K, Priority)> {
        self.sync(g, now);
        let key = g.q.take(now);
        self.publish_ready(g);
        // Keys remain beyond this one: keep the waking chain going.
        self.wake_ready(g);
        if key.is_some() && g.timekeeper.is_none() && g.q.has_timers() {
            // Due times remain and nobody is timing them: pass the duty on.
            self.wake_one(g);
        }
        key
    }

    /// `now` may hold a reading from earlier in this lock hold; once the
    /// lock was released (spinning, parking) a fresh one is taken.
    fn next(&self, g: &mut Guard<'_, K>, deadline: Option<Instant>, now: &mut Now) -> Result<(K, Priority), GetError> {
        let mut spun = false;
        loop {
            if let Some(key) = self.take(g, now) {
                return Ok(key);
            }
            if g.q.is_shutting_down() {
                return Err(GetError::ShutDown);
            }
            if deadline.is_some_and(|d| self.clock.now() >= d) {
                return Err(GetError::Timeout);
            }
            if !spun {
                // Whatever the spin saw, re-check everything under the lock:
                // a key or a shutdown may have come while it was released.
                spun = true;
                self.spin(g, now);
                continue;
            }
            self.park(g, deadline);
            *now = Now::new();
        }
    }

    /// Spins briefly with the lock released, until a key looks ready or the
    /// spin budget runs out. The caller re-checks under the lock either way.
    /// A spin that released the lock renews `now` before taking it again.
    fn spin(&self, g: &mut Guard<'_, K>, now: &mut Now) {
        if self.spinners.fetch_add(1, Relaxed) < max_spinners() {
            MutexGuard::unlocked(g, || {
                // Pauses only, no `sched_yield` (see `spin_until`): adds
                // leave a spinner its key, so a spinner that gave its CPU
                // away made the key wait for every busy thread's slice.
                spin_until(PARK_SPIN_ROUNDS, || self.any_ready.load(Relaxed));
                *now = self.stamp();
            });
        }
        self.spinners.fetch_sub(1, Relaxed);
    }

    /// Parks a getter until woken, until `deadline`, or (as the timekeeper)
    /// until the earliest due time.
    fn park(&self, g: &mut Guard<'_, K>, deadline: Option<Instant>) {
        let mut wake_at = deadline;
        let mut term = None;
        if let Some(due) = g.q.next_due()
            && g.timekeeper.is_none_or(|kept| due < kept)
        {
            g.timekeeper = Some(due);
            g.timekeeper_term += 1;
            term = Some(g.timekeeper_term);
            wake_at = Some(wake_at.map_or(due, |d| d.min(due)));
        }
        g.sleepers += 1;
        let timed_out = match wake_at {
            Some(at) if self.clock.is_real_time() => self.ready.wait_until(g, at).timed_out(),
            _ => {
                self.ready.wait(g);
                false
            }
        };
        if timed_out {
            // No notify claimed this sleeper; it un-counts itself.
            g.sleepers -= 1;
        } else {
            g.waking -= 1;
        }
        if term == Some(g.timekeeper_term) {
            g.timekeeper = None;
        }
    }

    /// Ends processing of `key`. Waking getters for a re-queued key is left
    /// to the caller: `done_and_get` takes a key right after, and waking a
    /// sleeper for the key it is about to take itself would be wasted.
    fn finish(&self, g: &mut Guard<'_, K>, key: &K, now: &mut Now) {
        self.sync(g, now);
        match g.q.done(key, || self.clock.now(), now) {
            Finished::Requeued | Finished::Released => self.publish_ready(g),
            Finished::Waiting(due) => {
                self.on_scheduled(g, due);
                // Keys its dependencies held may have become ready.
                self.publish_ready(g);
            }
            // A full group may have got room: its keys became takeable.
            Finished::Removed if g.q.has_groups() => self.publish_ready(g),
            Finished::Removed | Finished::NotProcessing => {}
        }
        if g.q.is_draining() && g.q.drained() {
            self.drained.notify_all();
        }
        self.notify_if_idle(g);
    }

    fn close(&self, g: &mut Guard<'_, K>, how: Shutdown) {
        g.q.shut_down(how == Shutdown::Drain);
        if how == Shutdown::Discard {
            g.q.discard_ready();
            self.publish_ready(g);
        }
        self.wake_all(g);
        self.drained.notify_all();
        self.notify_if_idle(g);
    }

    fn notify_if_idle(&self, g: &mut Guard<'_, K>) {
        if g.idle_waiters > 0 && g.q.is_idle() {
            self.idle.notify_all();
        }
    }

    /// A key got due time `due`: if it is earlier than what the timekeeper
    /// sleeps until, wake a sleeper to take the duty with the new time.
    fn on_scheduled(&self, g: &mut Guard<'_, K>, due: Instant) {
        if g.timekeeper.is_none_or(|kept| due < kept) {
            g.timekeeper = None;
            self.wake_one(g);
        }
    }

    /// Wakes sleepers for the ready keys nobody is about to take. Spinning
    /// and waking getters each take a key themselves, so only keys beyond
    /// them need a sleeper, and no more getters are woken at once than there
    /// are cores to run them: each woken getter that takes a key calls this
    /// again, so the chain reaches every key. Busy workers are not counted:
    /// a key never waits for a busy worker while another sleeps.
    fn wake_ready(&self, g: &mut Guard<'_, K>) {
        let claimed = self.spinners.load(Relaxed) + g.waking;
        let unclaimed = g.q.available().saturating_sub(claimed);
        let room = max_waking().saturating_sub(g.waking);
        for _ in 0..unclaimed.min(room).min(g.sleepers) {
            self.wake_one(g);
        }
    }

    fn wake_one(&self, g: &mut Guard<'_, K>) {
        if g.sleepers > 0 && self.ready.notify_one() {
            g.sleepers -= 1;
            g.waking += 1;
        }
    }

    fn wake_all(&self, g: &mut Guard<'_, K>) {
        let woken = self.ready.notify_all();
        g.sleepers -= woken;
        g.waking += woken;
    }
}

impl<K: Eq + Hash + Clone + Send + 'static> Observed for Shared<K> {
    fn collect_metrics(&self, out: &mut MetricFamilies) {
        let Some(name) = &self.name else { return };
        let snapshot = self.lock_synced().q.metrics_snapshot();
        if let Some(snapshot) = snapshot {
            snapshot.collect(name, out);
        }
    }
}

impl<K> fmt::Debug for WorkQueue<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkQueue").finish_non_exhaustive()
    }
}
