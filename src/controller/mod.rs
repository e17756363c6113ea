//! The reconcile loop (guarantees §3, §4, §5): a fixed pool of OS worker threads
//! taking keys from a [`WorkQueue`] and calling a [`Reconciler`].
//!
//! * [`Controller`] (this file) is the builder; `start` spawns the threads.
//! * `worker` is the loop and the result table.
//! * `outcome` holds [`Action`], [`ReconcileError`] and [`Reconciler`].
//! * `handle` is [`ControllerHandle`]: enqueueing, stats, stopping.
//! * `stopping` is a stop under way ([`Stopping`]), waited for in slices.
//! * `inspect` keeps per-key memory and the parked set.
//! * `triggers` runs Consul-style triggers and watches.
//! * `watchdog` reports reconciles that run too long and cancels those past
//!   their timeout.
//! * `groups` turns the `group` option into the queue's group ids.
//! * `persist` is the controller's side of the store seam (`crate::store`).
//! * `life` is the controller's state, the threads a stop waits for, and
//!   the hooks features register to hear of a stop.
//! * `watch` is the seam to caches: `watch_cache`, the synced gate.
//!
//! ```
//! use reconq::{Action, Context, Controller, ReconcileError};
//! use std::time::Duration;
//!
//! let handle = Controller::new("doc", |key: &u32, _ctx: &Context| -> Result<Action, ReconcileError> {
//!     println!("reconciling {key}");
//!     Ok(Action::Done)
//! })
//! .workers(2)
//! .start();
//! handle.enqueue(1);
//! handle.enqueue(2);
//! assert!(handle.wait_idle(Duration::from_secs(10)));
//! assert_eq!(handle.stats().successes, 2);
//! assert!(handle.stop_with_drain(Duration::from_secs(10)));
//! ```

mod batch;
mod debounce;
mod dependencies;
mod gate;
mod groups;
mod handle;
mod inspect;
mod life;
mod metrics;
mod outcome;
mod persist;
mod run_signals;
mod status;
mod stopping;
mod triggers;
mod watch;
mod watchdog;
mod worker;

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use crate::clock::{Clock, SystemClock};
#[cfg(feature = "etcd")]
use crate::coordination::{LeaderElection, Sharding};
use crate::key_encoding::StoreKey;
use crate::observe::metrics::MetricFamilies;
use crate::observe::{self, Observed};
use crate::panics;
use crate::queue::{Place, Priority, WorkQueue};
use crate::rate_limit::{ExponentialBackoff, RateLimiter};
#[cfg(feature = "store")]
use crate::store::{Persister, SqliteStore};
use crate::store::{StoreError, StoreLink};
use crate::sync::Mutex;
use crate::thread::{ThreadWrapper, spawn_named};

pub use crate::context::{Context, StopSignal};
pub use batch::Batch;
pub use dependencies::CycleError;
pub(crate) use groups::GroupFn;
pub use handle::{ControllerHandle, Stats, StopReport};
pub use inspect::{KeyInfo, KeyStatus};
pub use outcome::{Action, BoxError, ReconcileError, Reconciler, RetryPolicy};
pub(crate) use run_signals::on_signal;
pub use stopping::{StopOptions, Stopping};
pub use triggers::TriggerOutcome;
pub use watch::{DEFAULT_LIST_PRIORITY, Watch, WatchError};

use groups::{GroupTable, Grouping};
use inspect::{KeyMemory, ParkedSet};
use life::{Event, ExitGuard, Lifecycle, Phase};
use watchdog::Watchdog;
use worker::WorkerSlot;

/// What a controller's keys must be: hashable for the queue, `Debug` for
/// log lines, shareable across the worker threads.
pub trait ControllerKey: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static {}
impl<K: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static> ControllerKey for K {}

/// How many permanently failed keys are remembered by default.
pub(crate) const DEFAULT_PARKED_CAPACITY: usize = 1024;

/// Builds and starts a controller.
///
/// ```no_run
/// # use reconq::*;
/// # use std::time::Duration;
/// # fn reconcile(key: &String, ctx: &Context) -> Result<Action, ReconcileError> { Ok(Action::Done) }
/// let controller = Controller::new("pods", reconcile)
///     .workers(4)
///     .rate_limiter(ExponentialBackoff::new(Duration::from_millis(5), Duration::from_secs(60)));
/// let handle = controller.handle(); // give this to event sources
/// handle.enqueue("default/web".to_string());
/// controller.run(); // blocks until some handle calls stop()
/// ```
pub struct Controller<K: ControllerKey> {
    core: Arc<Core<K>>,
    reconciler: Arc<dyn Reconciler<K>>,
    limiter: Option<Arc<dyn RateLimiter<K>>>,
    clock: Arc<dyn Clock>,
    grouping: Option<Arc<dyn Grouping<K>>>,
    /// The store's file (canonical) and its claim.
    store: Option<(std::path::PathBuf, Box<ClaimFn<K>>)>,
    /// Leader election or sharding, joined at start.
    coordinate: Option<gate::Join<K>>,
    resync: Option<gate::Resync<K>>,
}

/// Claims the controller's name in its store at start (the key type's
/// encoding is known only where `store` is called).
type ClaimFn<K> = dyn FnOnce(&str) -> Result<Arc<dyn StoreLink<K>>, StoreError> + Send;

impl<K: ControllerKey + StoreKey> Controller<K> {
    /// Keeps this controller's pending, delayed and parked keys, failure
    /// counts and priorities in `store` under its name (guarantees §9):
    /// [`try_start`](Self::try_start) restores them before any worker runs
    /// and a flusher thread writes changes at least every flush interval
    /// and at stop.
    #[cfg(feature = "store")]
    pub fn store(mut self, store: SqliteStore) -> Self {
        let file = store.canonical_path().to_path_buf();
        self.store = Some((
            file,
            Box::new(move |name: &str| {
                Persister::<K>::claim(&store, name).map(|p| Arc::new(p) as Arc<dyn StoreLink<K>>)
            }),
        ));
        self
    }

    /// Reconciles only the keys of the partitions this replica owns in
    /// `sharding`'s group (guarantees §11): an enqueue of another key drops
    /// it (counted in [`Stats::not_owned`]); when partitions are gained,
    /// [`resync`](Self::resync)'s keys of those partitions are enqueued;
    /// before a partition is given up its keys stop being handed out and
    /// their reconciles return. Each reconcile's
    /// [`Context::fencing_token`] is its partition's token. One controller
    /// per `Sharding`; starting the controller joins the group and its
    /// stop leaves it.
    ///
    /// # Panics
    /// If the controller already has a leader election.
    #[cfg(feature = "etcd")]
    pub fn sharding(mut self, sharding: Sharding) -> Self {
        assert!(self.coordinate.is_none(), "controller {:?}: leader_election or sharding, not both", self.core.name);
        self.coordinate = Some(gate::shards(sharding));
        self
    }

    /// Lists every key that should be reconciled (every replica's, as a
    /// Kubernetes controller lists every object). Without sharding it is
    /// called once, by [`start`](Self::start), and its keys are enqueued
    /// (a panic in it propagates out of `start`, with nothing started).
    /// With sharding it is called instead whenever this replica gains
    /// partitions, on sharding's thread (keep it quick), and the keys of
    /// those partitions are enqueued.
    pub fn resync<I: IntoIterator<Item = K>>(mut self, resync: impl Fn() -> I + Send + Sync + 'static) -> Self {
        self.resync = Some(Arc::new(move || resync().into_iter().collect()));
        self
    }
}

/// How long a failed [`Controller::try_start`] waits for the workers it did
/// spawn to exit.
const FAILED_START_JOIN: Duration = Duration::from_secs(5);

/// The default limiter's first retry delay and its cap (see
/// [`Controller::rate_limiter`]).
const DEFAULT_RETRY_BASE: Duration = Duration::from_millis(5);
const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(1000);

impl<K: ControllerKey> Controller<K> {
    /// A controller named `name` (thread names are `reconq-<name>-<i>`) that
    /// calls `reconciler` with one worker and a per-key
    /// `ExponentialBackoff(5 ms, 1000 s)` (see [`rate_limiter`](Self::rate_limiter)).
    pub fn new(name: impl Into<String>, reconciler: impl Reconciler<K>) -> Self {
        Self {
            core: Core::new(name.into()),
            reconciler: Arc::new(reconciler),
            limiter: None,
            clock: Arc::new(SystemClock),
            grouping: None,
            store: None,
            coordinate: None,
            resync: None,
        }
    }

    /// A controller whose reconcile is a closure, with its argument and
    /// return types inferred: no annotations needed. Return
    /// `Ok(Action::..)`, `Err(ReconcileError::..)`, or use `?` on any error
    /// (a rate-limited retry). [`new`](Self::new) takes any [`Reconciler`]
    /// (a struct, or a closure with its own error type).
    ///
    /// ```
    /// use std::time::Duration;
    /// use reconq::{Action, Controller, ReconcileError};
    ///
    /// let handle = Controller::from_fn("sizes", |path, ctx| {
    ///     let size = std::fs::metadata(path)?.len(); // an io::Error is retried
    ///     if size == 0 && ctx.attempt() < 3 {
    ///         return Err(ReconcileError::new("empty file, not written yet?"));
    ///     }
    ///     Ok(Action::Done)
    /// })
    /// .start();
    /// handle.enqueue(std::path::PathBuf::from("Cargo.toml"));
    /// assert!(handle.wait_idle(Duration::from_secs(10)));
    /// assert_eq!(handle.stats().successes, 1);
    /// handle.stop();
    /// ```
    pub fn from_fn<F>(name: impl Into<String>, reconcile: F) -> Self
    where
        F: Fn(&K, &Context) -> Result<Action, ReconcileError> + Send + Sync + 'static,
    {
        Self::new(name, reconcile)
    }

    /// Number of worker threads (default 1).
    ///
    /// # Panics
    /// If `n` is 0.
    pub fn workers(self, n: usize) -> Self {
        assert!(n >= 1, "a controller needs at least one worker");
        self.core.config.lock().workers = n;
        self
    }

    /// The limiter for errors and `Action::Requeue`. The default is a
    /// per-key `ExponentialBackoff(5 ms, 1000 s)`, controller-runtime's
    /// current default: client-go's [`default_rate_limiter`](crate::default_rate_limiter)
    /// adds an overall 10-per-second bucket, so 400 keys failing once
    /// waited up to 30 s for their first retry. The controller assumes it is
    /// the only one asking the limiter about its keys (it skips `forget` for
    /// keys it never retried).
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<K> + 'static) -> Self {
        self.limiter = Some(Arc::new(limiter));
        self
    }

    /// The clock delays and running times are measured on (default
    /// [`SystemClock`]); a [`FakeClock`](crate::FakeClock) makes retries
    /// deterministic in tests.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Runs the body of every thread this controller spawns (workers,
    /// triggers, watches, the watchdog) inside `wrapper`.
    pub fn thread_wrapper(self, wrapper: ThreadWrapper) -> Self {
        self.core.config.lock().wrapper = Some(wrapper);
        self
    }

    /// Reports reconciles running longer than `threshold` in
    /// [`ControllerHandle::hanging`] and [`Stats::hanging`], and logs each
    /// once (a WARN on target `reconq::controller`). Off by default.
    pub fn hanging_threshold(self, threshold: Duration) -> Self {
        self.core.config.lock().hanging_threshold = Some(threshold);
        self
    }

    /// Whether a failed reconcile that returned an error is logged (an
    /// ERROR, or a WARN for `retry_after`, on target `reconq::controller`).
    /// Panics are always logged. The Python bindings turn this off: they log
    /// exceptions themselves, with their tracebacks.
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn log_errors(self, on: bool) -> Self {
        self.core.config.lock().log_errors = on;
        self
    }

    /// Multiplies every retry delay (errors, panics, `retry_after`,
    /// `Action::Requeue`) by a factor in `[1 - fraction, 1 + fraction]`,
    /// drawn deterministically from `seed`, the key and its attempt number,
    /// so retries of many keys failing together spread out. `RequeueAfter`
    /// delays are kept exact. Off by default.
    ///
    /// # Panics
    /// If `fraction` is not within `0.0..=1.0`.
    pub fn jitter(self, fraction: f64, seed: u64) -> Self {
        assert!((0.0..=1.0).contains(&fraction), "jitter fraction must be within 0..=1, got {fraction}");
        self.core.config.lock().jitter = Some(Jitter { fraction, seed });
        self
    }

    /// Cancels a reconcile whose key becomes ready again while it runs
    /// (guarantees §15, U1; default off): an enqueue, a delay coming due, a
    /// watch, a trigger or D2 cancels it (its
    /// [`Context`](super::Context) says so), and the key runs again once it
    /// returned, with the higher of the two priorities. A reconcile that
    /// enqueues its own key is not cancelled. The cancelled run counts as
    /// `superseded` (as D3's): neither a success nor a failure. Off, a key
    /// enqueued while it runs runs once more after it (G2, G3).
    pub fn supersede(self, supersede: bool) -> Self {
        self.core.config.lock().supersede = supersede;
        self
    }

    /// Debounces events (guarantees §15, U2): an enqueue, a watch or cache
    /// event or a trigger makes its key due `window` after the latest such
    /// event (a trailing edge), but never more than 10 × `window` after the
    /// first of the burst; a burst ends when the key becomes ready. A key
    /// already ready stays ready; one waiting on another delay becomes due
    /// at the earlier of the two. `enqueue_after`, `enqueue_at`, retries,
    /// resyncs and D2 are not debounced. Measured on the controller's
    /// clock; a debounced key counts as waiting.
    ///
    /// # Panics
    /// If `window` is zero.
    pub fn debounce(self, window: Duration) -> Self {
        assert!(!window.is_zero(), "a debounce window must be positive");
        self.core.config.lock().debounce = Some(window);
        self
    }

    /// How many permanently failed keys the parked set keeps (default
    /// 1024); the oldest are dropped beyond it.
    pub fn parked_capacity(self, capacity: usize) -> Self {
        self.core.parked.set_capacity(capacity);
        self
    }

    /// Cancels a reconcile still running `timeout` after it began (its
    /// [`Context::is_cancelled`] turns true; nothing is killed). When it
    /// returns, whatever it returned, it counts as a failure
    /// (`TimeoutError: reconcile timed out after S s`) and is retried with
    /// the rate limiter; `controller_runtime_reconcile_timeouts_total`
    /// counts it. A reconcile that ignores its context runs to its end. The
    /// hang watchdog's one sleeping thread keeps the deadlines: no thread
    /// per reconcile. Off by default.
    ///
    /// # Panics
    /// If `timeout` is zero.
    pub fn timeout(self, timeout: Duration) -> Self {
        assert!(!timeout.is_zero(), "a reconcile timeout must be positive");
        self.core.config.lock().timeout = Some(timeout);
        self
    }

    /// Puts every key in the group `group(key)` gives (guarantees §8): among ready
    /// keys of one priority, keys are handed out round-robin across groups
    /// (P4), so a group with many keys cannot starve one with few. The
    /// function is called on the enqueuing thread when a key is enqueued;
    /// a key keeps the group it entered the queue with until it leaves (its
    /// retries keep it). A panic puts the key in group `None` (logged once
    /// per key). Group values are remembered for the controller's life, so
    /// use a bounded set (tenants, namespaces).
    pub fn group<G, F>(self, group: F) -> Self
    where
        F: Fn(&K) -> G + Send + Sync + 'static,
        G: Eq + Hash + Clone + Send + Sync + 'static,
    {
        self.group_fallible::<G>(Box::new(move |key: &K| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| group(key)))
                .map(Some)
                .map_err(|panic| panics::message(&*panic))
        }))
    }

    /// [`group`](Self::group) with a function that reports its failures
    /// (the Python bindings' `group=`): `Ok(None)` is group None.
    pub(crate) fn group_fallible<G>(mut self, group: Box<GroupFn<K, G>>) -> Self
    where
        G: Eq + Hash + Clone + Send + Sync + 'static,
    {
        self.grouping = Some(GroupTable::new(group));
        self
    }

    /// At most `n` keys of one [`group`](Self::group) are reconciled at once
    /// (P5). Keys of a full group wait in the queue without holding a
    /// worker, and keys of other groups go ahead. Needs `group`.
    ///
    /// # Panics
    /// If `n` is 0; [`start`](Self::start) panics if no `group` was set.
    pub fn max_in_flight_per_group(self, n: usize) -> Self {
        assert!(n >= 1, "max_in_flight_per_group must be at least 1");
        self.core.config.lock().max_in_flight_per_group = Some(n);
        self
    }

    /// Reconciles only while this process leads `election` (guarantees
    /// §10): a standby's queue, triggers and watches run as usual, its
    /// workers wait without CPU, and every reconcile's
    /// [`Context::fencing_token`] is the leadership's token. When
    /// leadership is lost, running reconciles are cancelled and no new one
    /// starts. Starting the controller starts the campaign; one election
    /// can serve several controllers.
    ///
    /// # Panics
    /// If the controller is already sharded.
    #[cfg(feature = "etcd")]
    pub fn leader_election(mut self, election: LeaderElection) -> Self {
        assert!(self.coordinate.is_none(), "controller {:?}: leader_election or sharding, not both", self.core.name);
        self.coordinate = Some(gate::leader(election));
        self
    }

    /// Reconciles what changes in `cache` (docs/sources.md, E2): each change
    /// the cache applies enqueues the keys `watch` maps it to, if its
    /// predicate accepts it, at its priority (E6, E7); a
    /// [`resync`](Watch::resync) enqueues every cached key periodically.
    /// Starting the controller starts the cache if it is not running, and
    /// its stop lets it go (a cache stops with the last controller that
    /// watches it, unless started with [`Cache::start`](crate::Cache::start)).
    ///
    /// A cache watched before start holds the controller (E5): no key is
    /// handed out before it has applied its first list (keys enqueued
    /// meanwhile are kept; a stop before then reconciles none of them);
    /// see [`sync_timeout`](Self::sync_timeout). Watching a stopped cache
    /// makes [`try_start`](Self::try_start) fail with a [`WatchError`]
    /// inside its `io::Error`, with nothing started.
    pub fn watch_cache<S: crate::source::Source>(self, cache: &crate::Cache<S>, watch: Watch<S, K>) -> Self {
        self.core.watches.keep_for_start(cache, watch);
        self
    }

    /// While a cache watched at start has not synced, an ERROR (target
    /// `reconq::controller`) every `timeout` names it and its last error
    /// (default 120 s). A zero timeout is refused.
    pub fn sync_timeout(self, timeout: Duration) -> Result<Self, crate::InvalidArgument> {
        self.core.watches.set_sync_timeout(timeout)?;
        Ok(self)
    }

    /// A handle usable before [`start`](Self::start) or [`run`](Self::run):
    /// keys enqueued through it are kept and processed once started.
    pub fn handle(&self) -> ControllerHandle<K> {
        ControllerHandle { core: Arc::clone(&self.core) }
    }

    /// Spawns the worker threads and returns at once. A controller starts
    /// once: `start` takes it by value, and one stopped through a handle
    /// before this cannot start.
    ///
    /// # Panics
    /// If the OS refuses to spawn a thread or the controller was stopped
    /// through a handle (see [`try_start`](Self::try_start) for an error
    /// instead), or `max_in_flight_per_group` was set without `group`.
    pub fn start(self) -> ControllerHandle<K> {
        let name = self.core.name.clone();
        self.try_start().unwrap_or_else(|e| panic!("controller {name:?}: {e}"))
    }

    /// [`start`](Self::start), with the OS refusing a thread (a thread or
    /// memory limit: each worker needs a stack) reported as an error. Then
    /// nothing is left running: the workers already spawned are stopped
    /// and joined (a reconcile one of them already began is cancelled and
    /// waited for up to 5 s, then detached), the controller is stopped
    /// (enqueues are ignored), and the error says how many threads could
    /// be made. A controller stopped through a handle before this is an
    /// error too ([`io::ErrorKind::Other`]): nothing is spawned and it
    /// stays stopped.
    ///
    /// # Panics
    /// If `max_in_flight_per_group` was set without `group`.
    ///
    /// With a [`store`](Self::store), the claim and the read of the stored
    /// keys come first: an error there (a [`StoreError`] inside the
    /// `io::Error`: `Locked` for a name held by another live controller)
    /// changes nothing.
    pub fn try_start(mut self) -> io::Result<ControllerHandle<K>> {
        let store_file = self.store.as_ref().map(|(file, _)| file.as_path());
        let watched = self.core.watches.take_at_start(&self.core.name, store_file).map_err(|e| match e {
            WatchError::StoreMismatch(message) => io::Error::from(StoreError::Invalid(message)),
            other => io::Error::other(other),
        })?;
        let store = match self.store.take() {
            Some((_, claim)) => Some(claim(&self.core.name)?),
            None => None,
        };
        let handle = self.handle();
        let config = self.core.config.lock().clone();
        assert!(
            config.max_in_flight_per_group.is_none() || self.grouping.is_some(),
            "controller {:?}: max_in_flight_per_group needs a group function",
            self.core.name
        );
        let limiter =
            self.limiter.unwrap_or_else(|| Arc::new(ExponentialBackoff::new(DEFAULT_RETRY_BASE, DEFAULT_RETRY_MAX)));
        // Named after the controller, so it records `workqueue_*` metrics.
        let mut queue = WorkQueue::builder()
            .name(self.core.name.clone())
            .rate_limiter(Arc::clone(&limiter))
            .clock(ClockRef(Arc::clone(&self.clock)));
        if self.grouping.is_some() {
            queue = queue.groups(config.max_in_flight_per_group);
        }
        if store.is_some() {
            // The store's last flush writes what the stop dropped (S2), and
            // no flush writes a finished key before its dependents (D2).
            queue = queue.for_store();
        }
        let queue = queue.build();
        if config.supersede {
            queue.enable_supersede(self.core.cancel_hook());
        }
        let watchdog = (config.hanging_threshold.is_some() || config.timeout.is_some())
            .then(|| Watchdog::new(config.hanging_threshold, config.timeout, &self.clock));
        let mut resync = self.resync.take();
        let coordination = match self.coordinate.take() {
            Some(join) => Some(join(&self.core, &mut resync)?),
            None => None,
        };
        let coordination = watched.gate(coordination);
        // Before anything is shared, so a panicking resync leaves nothing
        // half started (the claim and the membership drop as it unwinds).
        let listed = resync.map(|resync| resync()).unwrap_or_default();
        let rt = Runtime {
            queue,
            limiter,
            clock: self.clock,
            slots: (0..config.workers).map(|_| WorkerSlot::new()).collect(),
            jitter: config.jitter,
            hanging_threshold: config.hanging_threshold,
            timeout: config.timeout,
            watchdog,
            workers: config.workers,
            log_errors: config.log_errors,
            grouping: self.grouping,
            store,
            coordination,
            has_dependencies: std::sync::atomic::AtomicBool::new(false),
            debounce: config.debounce.map(debounce::Debounce::new),
        };
        let core = &self.core;
        let stored_edges = rt.store.as_ref().map(|link| link.restore_edges()).unwrap_or_default();
        let mut deps_before_start = core.deps_before_start.lock();
        let dropped_edges = core.install_dependencies(&mut deps_before_start, stored_edges, &rt);
        let open_batches = core.batches.lock();
        core.install_batch(&open_batches, &rt);
        if core.rt.set(rt).is_err() {
            panic!("controller {:?} started twice", core.name);
        }
        drop(open_batches);
        drop(deps_before_start);
        crate::logs::stored_edges_dropped(&core.name, &dropped_edges);
        let rt = core.rt.get().expect("just set");
        core.subscribe_features(rt);
        if core.life.workers_starting(config.workers).is_err() {
            rt.queue.shut_down_now();
            return Err(io::Error::other("was stopped through a handle before start: a controller runs once"));
        }
        if let Some(link) = &rt.store {
            persist::restore(core, rt, link);
        }
        // Keys enqueued before start. Enqueuers check `rt` under this lock,
        // so none is lost between here and the `set` above.
        let pending = std::mem::take(&mut *core.pending.lock());
        for (key, when, priority) in pending {
            core.apply(rt, key, when, priority);
        }
        for key in listed {
            core.apply(rt, key, When::Now, 0);
        }
        // Only now is the queue the whole story (see `wait_idle`).
        core.life.started();
        for index in 0..config.workers {
            let thread_core = Arc::clone(&self.core);
            let reconciler = Arc::clone(&self.reconciler);
            let name = format!("reconq-{}-{index}", core.name);
            let spawned = spawn_named(name, config.wrapper.as_ref(), move || {
                let guard = ExitGuard { core: thread_core, worker: true };
                worker::run_worker(&guard.core, &*reconciler, index);
            });
            match spawned {
                Ok(thread) => core.life.keep_worker(thread),
                Err(e) => {
                    // Account for the workers that will never run, then stop
                    // and join the ones that did (the last one out leaves
                    // the coordination).
                    core.life.workers_gone(config.workers - index);
                    handle.stop();
                    handle.join_timeout(FAILED_START_JOIN);
                    let message = format!("cannot spawn worker thread {} of {}: {e}", index + 1, config.workers);
                    return Err(io::Error::new(e.kind(), message));
                }
            }
        }
        if let Some(watchdog) = &rt.watchdog {
            let watchdog = Arc::clone(watchdog);
            let spawned =
                self.core.try_spawn_aux(format!("reconq-{}-watchdog", core.name), move |core| watchdog.run(core));
            if let Err(e) = spawned {
                handle.stop();
                handle.join_timeout(FAILED_START_JOIN);
                return Err(io::Error::new(e.kind(), format!("cannot spawn the watchdog thread: {e}")));
            }
        }
        if let Some(link) = &rt.store {
            let link = Arc::clone(link);
            let spawned =
                self.core.try_spawn_aux(format!("reconq-{}-store", core.name), move |core| link.run_flusher(&**core));
            if let Err(e) = spawned {
                handle.stop();
                handle.join_timeout(FAILED_START_JOIN);
                return Err(io::Error::new(e.kind(), format!("cannot spawn the store's flusher thread: {e}")));
            }
        }
        if let Err(e) = watched.attach(&self.core) {
            handle.stop();
            handle.join_timeout(FAILED_START_JOIN);
            return Err(io::Error::other(e));
        }
        Ok(handle)
    }

    /// [`start`](Self::start), then blocks until a handle stops the
    /// controller and its workers have exited (or a drain's deadline gave up
    /// on them). Panics as [`start`](Self::start) does. Signals are not
    /// handled: see [`run_until_signal`](Self::run_until_signal) for Ctrl-C
    /// and SIGTERM.
    pub fn run(self) {
        let handle = self.start();
        handle.wait_stopped(None);
        handle.join_timeout(Duration::ZERO);
    }
}

impl<K: ControllerKey> fmt::Debug for Controller<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller").field("name", &self.core.name).finish_non_exhaustive()
    }
}

/// Lets the queue share the controller's clock.
#[derive(Debug)]
struct ClockRef(Arc<dyn Clock>);

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
struct Config {
    workers: usize,
    wrapper: Option<ThreadWrapper>,
    hanging_threshold: Option<Duration>,
    timeout: Option<Duration>,
    max_in_flight_per_group: Option<usize>,
    jitter: Option<Jitter>,
    log_errors: bool,
    supersede: bool,
    debounce: Option<Duration>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Jitter {
    fraction: f64,
    seed: u64,
}

impl Jitter {
    fn apply<K: Hash>(&self, key: &K, attempt: u32, delay: Duration) -> Duration {
        let hash = foldhash::fast::FixedState::with_seed(self.seed).hash_one((key, attempt));
        let unit = (splitmix64(hash) >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        let factor = 1.0 - self.fraction + 2.0 * self.fraction * unit;
        Duration::try_from_secs_f64(delay.as_secs_f64() * factor).unwrap_or(delay)
    }
}

fn splitmix64(mut z: u64) -> u64 {
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
    pub(crate) coordination: Option<gate::Coordinated<K>>,
    /// Whether any dependency was set (read without a lock by every
    /// finishing worker, written once: kept away from the queue's written
    /// lines; see `dependencies`).
    pub(crate) has_dependencies: std::sync::atomic::AtomicBool,
    /// `debounce` (U2): what delays its events.
    debounce: Option<debounce::Debounce<K>>,
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
}

/// Everything a controller's handles and threads share.
pub(crate) struct Core<K> {
    /// Lists the controller in metrics and status; unlisted when dropped.
    /// Set once the core is built: a registry prune meanwhile would drop
    /// the entry of a core whose `Weak` cannot be upgraded yet.
    _registration: OnceLock<observe::Registration>,
    pub(crate) name: String,
    config: Mutex<Config>,
    pub(crate) rt: OnceLock<Runtime<K>>,
    pub(crate) pending: Mutex<Vec<(K, When, Priority)>>,
    pub(crate) counters: Counters,
    pub(crate) memory: KeyMemory<K>,
    pub(crate) parked: ParkedSet<K>,
    /// State, threads and stop hooks (see `life`).
    pub(crate) life: Lifecycle,
    pub(crate) triggers: Mutex<triggers::Triggers<K>>,
    /// The caches it watches (see `watch`).
    pub(crate) watches: watch::Watches<K>,
    /// Dependencies set before start (see `dependencies`).
    pub(crate) deps_before_start: Mutex<dependencies::BeforeStart<K>>,
    /// Batches open now (see `batch`).
    pub(crate) batches: batch::OpenBatches,
}

impl<K: ControllerKey> Observed for Core<K> {
    fn collect_status(&self, out: &mut Vec<observe::status::StatusEntry>) {
        out.push(self.status_entry());
    }

    fn collect_metrics(&self, out: &mut MetricFamilies) {
        metrics::collect(self, out);
    }

    /// Workers leave only when a stop asks them to (a reconcile's panic is
    /// caught): one gone before that died in the engine itself.
    fn check_live(&self, out: &mut Vec<String>) {
        let Some(rt) = self.rt.get() else { return };
        let live_workers = self.life.read(|life| (life.phase == Phase::Running).then_some(life.live_workers));
        if let Some(live) = live_workers.filter(|&live| live < rt.workers) {
            out.push(format!(
                "controller {:?}: {} of {} worker threads exited",
                self.name,
                rt.workers - live,
                rt.workers
            ));
        }
    }
}

impl<K: ControllerKey> Core<K> {
    /// A core registered for metrics and status for as long as it lives.
    fn new(name: String) -> Arc<Self> {
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
            triggers: Mutex::new(triggers::Triggers::default()),
            watches: watch::Watches::new(),
            deps_before_start: Mutex::new(dependencies::BeforeStart::default()),
            batches: Mutex::new(0),
        });
        let observed: Weak<dyn Observed> = Arc::downgrade(&core) as Weak<Self>;
        let _ = core._registration.set(observe::register(observed));
        // Triggers exist before start, so they subscribe at birth.
        core.subscribe(Event::Stop, triggers::stop_all);
        core
    }

    /// Subscribes the features a started controller has to its stop: the
    /// store, the watchdog and the coordination.
    fn subscribe_features(self: &Arc<Self>, rt: &Runtime<K>) {
        if let Some(link) = &rt.store {
            // Woken to stop ticking, then to write the last flush once no
            // worker can change a key.
            let link = Arc::clone(link);
            let done = Arc::clone(&link);
            self.life.on(Event::Stop, move || link.wake());
            self.life.on(Event::Stopped, move || done.workers_done());
        }
        if let Some(watchdog) = &rt.watchdog {
            let watchdog = Arc::clone(watchdog);
            self.life.on(Event::Stop, move || watchdog.shut_down());
        }
        if rt.coordination.is_some() {
            // Workers waiting for leadership look again, and exit; our seat
            // is given up once none of our reconciles can run, so
            // leadership or partitions pass on at once (L4).
            self.subscribe(Event::Stop, |core| {
                if let Some(gate) = core.gate() {
                    gate.wake();
                }
            });
            self.subscribe(Event::WorkersExited, |core| {
                if let Some(coordination) = core.coordination() {
                    // Outside every lock: leaving talks to etcd.
                    coordination.leave();
                }
            });
        }
    }

    /// Runs `hook` with this core when `event` happens (holding it weakly
    /// until then: the hooks live in the core).
    fn subscribe(self: &Arc<Self>, event: Event, hook: fn(&Core<K>)) {
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

    /// Routes an enqueue to the queue, or keeps it until start.
    #[inline]
    pub(crate) fn route(&self, key: K, when: When, priority: Priority) {
        if let Some(rt) = self.rt.get() {
            return self.apply(rt, key, when, priority);
        }
        let mut pending = self.pending.lock();
        if let Some(rt) = self.rt.get() {
            drop(pending);
            return self.apply(rt, key, when, priority);
        }
        if !self.life.is_stopping() {
            pending.push((key, when, priority));
        }
    }

    /// Adds an enqueued key to the queue, in its group (asked here, with no
    /// engine lock held: see `groups`).
    fn apply(&self, rt: &Runtime<K>, key: K, when: When, priority: Priority) {
        let Some(place) = self.place(rt, &key, priority) else { return };
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
    }

    /// Where an enqueued `key` goes in the queue: its priority and group
    /// (asked with no engine lock held: see `groups`); `None` (counted) if
    /// coordination says it runs elsewhere.
    fn place(&self, rt: &Runtime<K>, key: &K, priority: Priority) -> Option<Place> {
        if let Some(coordination) = &rt.coordination
            && !coordination.gate.accepts(key)
        {
            self.counters.not_owned.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let group = rt.grouping.as_ref().map_or(0, |grouping| grouping.group_of(&self.name, key));
        Some(Place { prio: priority, group })
    }

    /// Leader election or sharding, once started with one.
    fn coordination(&self) -> Option<&gate::Coordinated<K>> {
        self.rt.get().and_then(|rt| rt.coordination.as_ref())
    }

    /// The coordination gate, once started with one.
    fn gate(&self) -> Option<&dyn gate::Gate<K>> {
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
