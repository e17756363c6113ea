//! The engine: what a controller's handles and threads share ([`Core`]),
//! what exists once it started ([`Runtime`]), the worker slots, the
//! routing of an enqueue to the queue, and the threads a stop waits for.
//! It names no feature: features reach it through its crate methods
//! (`route`, `spawn_aux`, `cancel_running`, `life`) and keep their state
//! in `features`; the leaves it holds (`life`, `gate`, `groups`,
//! `debounce`, `inspect`, `finish`, `metrics`) know nothing of it.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use super::debounce::Debounce;
use super::finish::{Finish, Path, Settled};
use super::gate::{Coordinated, Gate};
use super::groups::Grouping;
use super::inspect::{KeyMemory, ParkedSet};
use super::life::{Event, Lifecycle};
use super::metrics::WorkerMetrics;
use super::watchdog::Watchdog;
use crate::clock::Clock;
use crate::context::StopSignal;
use crate::observe::metrics::ticks;
use crate::observe::{self, Observed};
use crate::queue::{AlsoDone, Place, Priority, WorkQueue};
use crate::rate_limit::RateLimiter;
use crate::store::StoreLink;
use crate::sync::Mutex;
use crate::thread::{ThreadWrapper, spawn_named};

/// What a controller's keys must be: hashable for the queue, `Debug` for
/// log lines, shareable across the worker threads.
pub trait ControllerKey: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static {}
impl<K: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static> ControllerKey for K {}

/// How many permanently failed keys are remembered by default.
pub(crate) const DEFAULT_PARKED_CAPACITY: usize = 1024;

/// Lets the queue share the controller's clock.
#[derive(Debug)]
pub(crate) struct ClockRef(pub(crate) Arc<dyn Clock>);

impl Clock for ClockRef {
    fn now(&self) -> Instant {
        self.0.now()
    }
    fn is_real_time(&self) -> bool {
        self.0.is_real_time()
    }
    fn subscribe(&self, wake: crate::clock::Wake) {
        self.0.subscribe(wake)
    }
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) workers: usize,
    pub(crate) wrapper: Option<ThreadWrapper>,
    pub(crate) hanging_threshold: Option<Duration>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) max_in_flight_per_group: Option<usize>,
    pub(crate) jitter: Option<Jitter>,
    pub(crate) log_errors: bool,
    pub(crate) supersede: bool,
    pub(crate) debounce: Option<Duration>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Jitter {
    pub(crate) fraction: f64,
    pub(crate) seed: u64,
}

impl Jitter {
    pub(crate) fn apply<K: Hash>(&self, key: &K, attempt: u32, delay: Duration) -> Duration {
        let hash = foldhash::fast::FixedState::with_seed(self.seed).hash_one((key, attempt));
        let unit = (splitmix64(hash) >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        let factor = 1.0 - self.fraction + 2.0 * self.fraction * unit;
        Duration::try_from_secs_f64(delay.as_secs_f64() * factor).unwrap_or(delay)
    }
}

pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// When a key enqueued before start should run.
#[derive(Clone, Copy)]
pub(crate) enum When {
    Now,
    /// Now, or after the debounce if there is one (U2): an `enqueue`, a
    /// watch or cache event, a trigger.
    Event,
    /// A delay, and the real instant it was asked for.
    After(Duration, Instant),
    At(Instant),
}

/// What exists once the controller is started.
pub(crate) struct Runtime<K> {
    pub(crate) queue: WorkQueue<K>,
    pub(crate) limiter: Arc<dyn RateLimiter<K>>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) slots: Vec<WorkerSlot<K>>,
    pub(crate) jitter: Option<Jitter>,
    pub(crate) hanging_threshold: Option<Duration>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) watchdog: Option<Arc<Watchdog>>,
    pub(crate) workers: usize,
    /// Log failed reconciles that returned an error (panics always are).
    pub(crate) log_errors: bool,
    pub(crate) grouping: Option<Arc<dyn Grouping<K>>>,
    /// The store seam: told of every key change (`mark`).
    pub(crate) store: Option<Arc<dyn StoreLink<K>>>,
    /// Leader election or sharding: which keys run here, and when.
    pub(crate) coordination: Option<Coordinated<K>>,
    /// What a worker does once a reconcile returned (see `finish`).
    pub(crate) finish: Finish,
    /// `debounce` (U2): what delays its events.
    pub(crate) debounce: Option<Debounce<K>>,
}

impl<K: ControllerKey> Runtime<K> {
    /// Re-adds a key being reconciled after `delay`, at the priority it was
    /// handed out with (P3; its group stays the one it has in the queue).
    pub(crate) fn retry_after(&self, key: &K, delay: Duration, priority: Priority) {
        self.queue.retry_after_placed(key.clone(), delay, Place { prio: priority, group: 0 });
    }

    pub(crate) fn retry_rate_limited(&self, key: &K, attempt: u32, priority: Priority) {
        let delay = self.limiter.when(key);
        let delay = match &self.jitter {
            None => delay,
            Some(jitter) => jitter.apply(key, attempt, delay),
        };
        self.retry_after(key, delay, priority);
    }

    pub(crate) fn jittered(&self, key: &K, attempt: u32, delay: Duration) -> Duration {
        match &self.jitter {
            None => delay,
            Some(jitter) => jitter.apply(key, attempt, delay),
        }
    }
}

/// Counts shared by the workers, for events off the hot path. (Reconciles
/// by result and the time of the latest success are counted per worker:
/// see `metrics::WorkerMetrics`.)
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) panics: AtomicU64,
    /// Reconciles cancelled at their timeout.
    pub(crate) timeouts: AtomicU64,
    /// Keys dropped because another replica owns them (sharding).
    pub(crate) not_owned: AtomicU64,
    pub(crate) last_error: Mutex<Option<(String, SystemTime)>>,
    /// Failures since the last success, of any key (as Cilium counts). A
    /// success writes it only when it is not already 0.
    pub(crate) consecutive_failures: AtomicU64,
    /// Reconciles cancelled because an ancestor became pending (D3) or
    /// their key became ready again (U1).
    pub(crate) superseded: AtomicU64,
    /// Failed maps and predicates of watched caches (E6).
    pub(crate) handler_errors: AtomicU64,
}

/// Everything a controller's handles and threads share.
pub(crate) struct Core<K> {
    /// Lists the controller in metrics and status; unlisted when dropped.
    /// Set once the core is built: a registry prune meanwhile would drop
    /// the entry of a core whose `Weak` cannot be upgraded yet.
    _registration: OnceLock<observe::Registration>,
    pub(crate) name: String,
    pub(crate) config: Mutex<Config>,
    pub(crate) rt: OnceLock<Runtime<K>>,
    pub(crate) pending: Mutex<Vec<(K, When, Priority)>>,
    pub(crate) counters: Counters,
    pub(crate) memory: KeyMemory<K>,
    pub(crate) parked: ParkedSet<K>,
    /// State, threads and stop hooks (see `life`).
    pub(crate) life: Lifecycle,
}

impl<K: ControllerKey> Core<K> {
    /// A core registered for metrics and status for as long as it lives.
    pub(crate) fn new(name: String) -> Arc<Self> {
        let core = Arc::new(Self {
            _registration: OnceLock::new(),
            name,
            config: Mutex::new(Config {
                workers: 1,
                wrapper: None,
                hanging_threshold: None,
                timeout: None,
                max_in_flight_per_group: None,
                jitter: None,
                log_errors: true,
                supersede: false,
                debounce: None,
            }),
            rt: OnceLock::new(),
            pending: Mutex::new(Vec::new()),
            counters: Counters::default(),
            memory: KeyMemory::new(),
            parked: ParkedSet::new(DEFAULT_PARKED_CAPACITY),
            life: Lifecycle::new(),
        });
        let observed: Weak<dyn Observed> = Arc::downgrade(&core) as Weak<Self>;
        let _ = core._registration.set(observe::register(observed));
        core
    }

    /// Runs `hook` with this core when `event` happens (holding it weakly
    /// until then: the hooks live in the core).
    pub(crate) fn subscribe(self: &Arc<Self>, event: Event, hook: fn(&Core<K>)) {
        let core = Arc::downgrade(self);
        self.life.on(event, move || {
            if let Some(core) = core.upgrade() {
                hook(&core);
            }
        });
    }

    pub(crate) fn configured_workers(&self) -> usize {
        self.config.lock().workers
    }

    pub(crate) fn wrapper(&self) -> Option<ThreadWrapper> {
        self.config.lock().wrapper.clone()
    }

    /// Routes an enqueue to the queue, or keeps it until start. Ignored
    /// once a stop is requested (one atomic load): between the request and
    /// the queue's shutdown (a stop's hooks run in between) an enqueue
    /// would still land, and a drain would reconcile it. Whether the key
    /// went into the queue (`false`: kept until start, ignored, or not
    /// ours: a watch keeps a delete's tombstone then, C1).
    #[inline]
    pub(crate) fn route(&self, key: K, when: When, priority: Priority) -> bool {
        if self.life.is_stopping() {
            return false;
        }
        if let Some(rt) = self.rt.get() {
            return self.apply(rt, key, when, priority);
        }
        let mut pending = self.pending.lock();
        if let Some(rt) = self.rt.get() {
            drop(pending);
            return self.apply(rt, key, when, priority);
        }
        // Again under the lock: a stop clears `pending` under it.
        if !self.life.is_stopping() {
            pending.push((key, when, priority));
        }
        false
    }

    /// Adds an enqueued key to the queue, in its group (asked here, with no
    /// engine lock held: see `groups`); `false` if it is not ours.
    pub(crate) fn apply(&self, rt: &Runtime<K>, key: K, when: When, priority: Priority) -> bool {
        let Some(place) = self.place(rt, &key, priority) else { return false };
        let marked = rt.store.as_ref().map(|store| (store, key.clone()));
        match when {
            When::Now => rt.queue.add_placed(key, place),
            When::Event => match &rt.debounce {
                None => rt.queue.add_placed(key, place),
                Some(debounce) => debounce.enqueue(&rt.queue, key, rt.clock.now(), place),
            },
            When::After(delay, asked) => {
                let delay = if rt.clock.is_real_time() { delay.saturating_sub(asked.elapsed()) } else { delay };
                rt.queue.add_after_placed(key, delay, place)
            }
            When::At(at) => rt.queue.add_at_placed(key, at, place),
        }
        if let Some((store, key)) = marked {
            store.mark(&key);
        }
        true
    }

    /// Where an enqueued `key` goes in the queue: its priority and group
    /// (asked with no engine lock held: see `groups`); `None` (counted) if
    /// coordination says it runs elsewhere.
    pub(crate) fn place(&self, rt: &Runtime<K>, key: &K, priority: Priority) -> Option<Place> {
        if let Some(coordination) = &rt.coordination
            && !coordination.gate.accepts(key, priority)
        {
            self.counters.not_owned.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let group = rt.grouping.as_ref().map_or(0, |grouping| grouping.group_of(&self.name, key));
        Some(Place { prio: priority, group })
    }

    /// The keys a stop dropped from the queue, taken (to report them),
    /// told to the coordination gate first: a partition given up as the
    /// controller leaves hands them over (C2). Told before they are taken,
    /// so that hand-over finds each in the queue or in the gate, whichever
    /// comes first.
    pub(crate) fn take_dropped(&self, rt: &Runtime<K>) -> Vec<K> {
        if let Some(coordination) = &rt.coordination {
            coordination.gate.dropped_at_stop(&rt.queue.dropped_keys());
        }
        rt.queue.take_dropped()
    }

    /// Leader election or sharding, once started with one.
    pub(crate) fn coordination(&self) -> Option<&Coordinated<K>> {
        self.rt.get().and_then(|rt| rt.coordination.as_ref())
    }

    /// The coordination gate, once started with one.
    pub(crate) fn gate(&self) -> Option<&dyn Gate<K>> {
        self.coordination().map(|c| &*c.gate)
    }

    /// Cancels the reconciles of keys matching `which` running now
    /// (leadership or partitions were lost); later ones are not affected.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only coordination asks
    pub(crate) fn cancel_running(&self, which: impl Fn(&K) -> bool) {
        if let Some(rt) = self.rt.get() {
            for slot in &rt.slots {
                let running = slot.running.lock();
                if running.as_ref().is_some_and(|run| which(&run.key)) {
                    slot.signal.set();
                }
            }
        }
    }

    /// Cancels every in-flight reconcile and every later one.
    pub(crate) fn cancel_everything(&self) {
        self.life.cancel_all.store(true, Ordering::SeqCst);
        if let Some(rt) = self.rt.get() {
            for slot in &rt.slots {
                let _running = slot.running.lock();
                slot.signal.set();
            }
        }
    }

    /// Marks the stop requested (running the stop's hooks); returns
    /// whether this call did it.
    pub(crate) fn request_stop(&self) -> bool {
        let first = self.life.request_stop();
        if first {
            self.pending.lock().clear();
        }
        first
    }
}

/// One worker's in-flight reconcile, readable by other threads (cancel,
/// hang reports, inspect, stop reports).
pub(crate) struct WorkerSlot<K> {
    pub(crate) running: Mutex<Option<Running<K>>>,
    /// Backs the `Context` of this worker's reconciles; reset at each start.
    pub(crate) signal: StopSignal,
    /// This worker's metrics (written by it alone).
    pub(crate) metrics: crossbeam_utils::CachePadded<WorkerMetrics>,
}

pub(crate) struct Running<K> {
    pub(crate) key: K,
    pub(crate) started: Started,
    /// The hang warning for this reconcile was logged.
    pub(crate) hang_logged: bool,
    /// The watchdog cancelled it at its timeout: it counts as a failure
    /// whatever it returns.
    pub(crate) timed_out: bool,
    /// An ancestor became pending (D3), or with `supersede` its key became
    /// ready again (U1), and cancelled it: it counts as superseded
    /// whatever it returns.
    pub(crate) superseded: bool,
}

/// When a reconcile started, on the controller's clock.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Started {
    /// On a clock that runs in real time: the worker's tick stamp of the
    /// hand-out, turned into the clock's time only when someone asks (hang
    /// reports, timeouts, `inspect`), so a reconcile costs no clock read.
    Tick(u64),
    /// On a clock that jumps (`FakeClock`): its reading at the start.
    At(Instant),
}

impl Started {
    /// The start, given the controller clock's reading `now`.
    pub(crate) fn at(self, now: Instant) -> Instant {
        match self {
            Started::At(at) => at,
            Started::Tick(tick) => now.checked_sub(ticks::elapsed_since(tick)).unwrap_or(now),
        }
    }
}

impl<K> WorkerSlot<K> {
    pub(crate) fn new() -> Self {
        Self {
            running: Mutex::new(None),
            signal: StopSignal::new(),
            metrics: crossbeam_utils::CachePadded::new(WorkerMetrics::new()),
        }
    }
}

/// Worker and auxiliary threads report their exit through this guard (also
/// on unwinding), so stops can wait for them with a deadline. It holds the
/// core, so the core outlives every thread of its controller.
pub(crate) struct ExitGuard<K: ControllerKey> {
    pub(crate) core: Arc<Core<K>>,
    pub(crate) worker: bool,
}

impl<K: ControllerKey> Drop for ExitGuard<K> {
    fn drop(&mut self) {
        if self.worker {
            self.core.life.workers_gone(1);
        } else {
            self.core.life.aux_gone();
        }
    }
}

impl<K: ControllerKey> Core<K> {
    /// Spawns an auxiliary thread (trigger, watch, watchdog) that stop waits
    /// for.
    pub(crate) fn spawn_aux(self: &Arc<Self>, name: String, body: impl FnOnce(&Arc<Core<K>>) + Send + 'static) {
        if let Err(e) = self.try_spawn_aux(name, body) {
            panic!("controller {:?}: cannot spawn a thread: {e}", self.name);
        }
    }

    /// Spawns a trigger, watch, watchdog or flusher thread, counted in
    /// `live_aux` until it exits.
    pub(crate) fn try_spawn_aux(
        self: &Arc<Self>,
        name: String,
        body: impl FnOnce(&Arc<Core<K>>) + Send + 'static,
    ) -> io::Result<()> {
        let wrapper = self.wrapper();
        let core = Arc::clone(self);
        self.life.spawn_aux(move || {
            spawn_named(name, wrapper.as_ref(), move || {
                let guard = ExitGuard { core, worker: false };
                body(&guard.core);
            })
        })
    }
}

impl<K: ControllerKey> Core<K> {
    /// Ends `key`'s turn as `settled` says and takes the next key (at tick
    /// `stamp`, which stamps the next hand-out). The store learns that
    /// `key` changed (whether it was reconciled or dropped as not ours)
    /// before the worker waits for a next key, so the last key of a batch
    /// does not stay unwritten until one comes. D2's children are enqueued
    /// while `key` is still being reconciled, so none can start before it
    /// is done.
    #[inline]
    pub(crate) fn finish(
        &self,
        rt: &Runtime<K>,
        key: &K,
        settled: Settled,
        stamp: u64,
    ) -> (Option<(K, Priority)>, u64) {
        let ended = settled == Settled::Ended;
        let path = rt.finish.path();
        match path {
            Path::Plain => rt.queue.done_and_get_stamped(key, stamp, AlsoDone::Nothing),
            Path::DependentsInLock => {
                let also = if ended { AlsoDone::AddDependents } else { AlsoDone::Nothing };
                rt.queue.done_and_get_stamped(key, stamp, also)
            }
            Path::DependentsPlaced => {
                if ended {
                    self.enqueue_dependents(rt, key);
                }
                rt.queue.done_and_get_stamped(key, stamp, AlsoDone::Nothing)
            }
            Path::Stored | Path::DependentsStored => {
                if ended && path == Path::DependentsStored {
                    self.enqueue_dependents(rt, key);
                }
                let mark = || {
                    if let Some(store) = &rt.store {
                        store.mark(key);
                    }
                };
                rt.queue.done_and_get_stamped(key, stamp, AlsoDone::ThenCall(&mark))
            }
        }
    }

    /// D2 for a controller whose keys need their place asked (groups,
    /// coordination) or the store told (`Core::finish`): the run of `key`
    /// ended, and its direct dependents are enqueued while it is still
    /// being reconciled, so none can start before it is done. Every child
    /// is added under one queue lock (a tree's keys each hand out their
    /// fan-out: W12), after its place was asked with no lock held.
    #[inline(never)]
    fn enqueue_dependents(&self, rt: &Runtime<K>, key: &K) {
        let children: Vec<(K, Place)> = rt
            .queue
            .dependents(key)
            .into_iter()
            .filter_map(|child| self.place(rt, &child, 0).map(|place| (child, place)))
            .collect();
        let marked: Option<Vec<K>> =
            rt.store.as_ref().map(|_| children.iter().map(|(child, _)| child.clone()).collect());
        rt.queue.add_placed_dependents(children);
        if let (Some(store), Some(marked)) = (&rt.store, marked) {
            for child in &marked {
                store.mark(child);
            }
        }
    }
}
