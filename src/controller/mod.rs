//! The reconcile loop (guarantees §3, §4, §5): a fixed pool of OS worker threads
//! taking keys from a [`WorkQueue`] and calling a [`Reconciler`].
//!
//! The folder is layered: each file names only files on its own floor or
//! below, and no two name each other (`tests/layering.rs`
//! checks it against this order). From the top:
//!
//! 1. `mod` (this file): [`Controller`], the builder, and `run_signals`
//!    (`run_until_signal`).
//! 2. `replicas`: leader election and sharding on etcd, joined at start.
//! 3. `start`: the start sequence with its one failure path, and
//!    [`StartError`].
//! 4. `handle`: [`ControllerHandle`], every public method, each thin.
//! 5. `stopping`: a stop under way ([`Stopping`]) and its [`StopReport`].
//! 6. `features`: what the features keep apart from the engine, and every
//!    stop hook they register.
//! 7. The features: `triggers` (Consul-style triggers and watches),
//!    `watch` (caches: `watch_cache`, the synced gate), `dependencies`,
//!    `batch`, `persist` (the store seam, `crate::store`), `status` (the
//!    status row, the stats and the metrics' samples).
//! 8. `worker` (the loop and the result table) and `hangs` (hang reports
//!    and timeouts).
//! 9. `core`: the engine, which names no feature: the shared state, the
//!    runtime, the worker slots, routing an enqueue, the after-reconcile
//!    step (`Core::finish`), the threads a stop waits for.
//! 10. Leaves: `life` (the state, the threads' counts, the stop's hooks),
//!     `gate` (the one seam to coordination), `finish` (the after-reconcile
//!     choice), `groups`, `debounce`, `handover` (the keys a partition
//!     given up takes to its next owner), `inspect` (per-key memory, the parked
//!     set), `metrics` (per-worker counts), `outcome` ([`Action`],
//!     [`ReconcileError`], [`Reconciler`]), `partitions` (a key's
//!     partition, `partition_by`), `watchdog` (its thread's timer).
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
mod core;
mod debounce;
mod dependencies;
mod features;
mod finish;
mod gate;
mod groups;
mod handle;
#[cfg(feature = "etcd")]
mod handover;
mod hangs;
mod inspect;
mod life;
mod metrics;
mod outcome;
mod partitions;
mod persist;
#[cfg(feature = "etcd")]
mod replicas;
pub(crate) mod run_signals;
mod start;
mod status;
mod stopping;
mod triggers;
mod watch;
mod watchdog;
mod worker;

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
#[cfg(feature = "etcd")]
use crate::coordination::{LeaderElection, Sharding};
use crate::key_encoding::StoreKey;
use crate::panics;
use crate::rate_limit::RateLimiter;
#[cfg(feature = "store")]
use crate::store::{Persister, SqliteStore, StoreLink};

pub use crate::context::{Context, StopSignal};
pub use batch::Batch;
pub use core::ControllerKey;
pub use dependencies::{CycleError, DependencyError};
pub(crate) use groups::GroupFn;
pub use handle::ControllerHandle;
pub use inspect::{KeyInfo, KeyStatus};
pub use outcome::{Action, BoxError, ReconcileError, Reconciler, RetryPolicy};
pub use partitions::CrossPartitionError;
#[cfg(feature = "etcd")]
pub(crate) use partitions::PartitionByFn;
pub use start::StartError;
pub use status::Stats;
pub use stopping::{StopOptions, StopReport, Stopping};
pub use triggers::TriggerOutcome;
pub use watch::{DEFAULT_LIST_PRIORITY, Watch, WatchError};

use self::core::{Core, Jitter};
use crate::thread::ThreadWrapper;
use features::Features;
use groups::GroupTable;
use start::Plan;

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
#[must_use = "a Controller does nothing until `.start()` or `.run()`"]
pub struct Controller<K: ControllerKey> {
    plan: Plan<K>,
}

impl<K: ControllerKey + StoreKey> Controller<K> {
    /// Keeps this controller's pending, delayed and parked keys, failure
    /// counts and priorities in `store` under its name (guarantees §9):
    /// [`try_start`](Self::try_start) restores them before any worker runs
    /// and a flusher thread writes changes at least every flush interval
    /// and at stop.
    #[cfg(feature = "store")]
    pub fn store(mut self, store: SqliteStore) -> Self {
        let file = store.canonical_path().to_path_buf();
        self.plan.store = Some((
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
    /// the keys of those partitions that the watched caches map to (their
    /// deletes applied meanwhile included) and [`resync`](Self::resync)'s
    /// are enqueued, in one batch (guarantees §17, C1);
    /// before a partition is given up its keys stop being handed out and
    /// their reconciles return. Each reconcile's
    /// [`Context::fencing_token`] is its partition's token. One controller
    /// per `Sharding`; starting the controller joins the group and its
    /// stop leaves it.
    ///
    ///
    /// With sharding, [`ControllerHandle::set_dependencies`] refuses an
    /// edge between keys of different partitions (guarantees §17, C4);
    /// edges set before this call are checked by [`try_start`](Self::try_start)
    /// ([`StartError::CrossPartition`]).
    ///
    /// # Panics
    /// If the controller already has a leader election.
    #[cfg(feature = "etcd")]
    pub fn sharding(mut self, sharding: Sharding) -> Self {
        assert!(
            self.plan.coordinate.is_none(),
            "controller {:?}: leader_election or sharding, not both",
            self.plan.core.name
        );
        let partitions = sharding.partition_count();
        self.update_partitioner(|p| p.with_partitions(partitions));
        self.plan.coordinate = Some(replicas::shards(sharding));
        self
    }

    /// With [`sharding`](Self::sharding): a key belongs to the partition
    /// of the key `partition_by(key)` names (guarantees §17, C3), not of
    /// itself, so keys naming the same value share a partition, on every
    /// replica and in both languages (Python's `partition_by=` on
    /// `Sharding`): a pipeline of [`set_dependencies`](ControllerHandle::set_dependencies)
    /// whose keys name one value runs on one replica.
    /// [`partition_of_by`](crate::partition_of_by) computes the same
    /// partition outside a controller. A panic in `partition_by` is an
    /// ERROR naming the key (target `reconq::controller`; repeated ones at
    /// the 1st, 2nd, 4th, ... failure), and the key is then partitioned by
    /// itself. Keep it quick and pure: it is asked at each enqueue and
    /// hand-out of a key.
    ///
    /// # Panics
    /// [`start`](Self::start) panics if the controller has no sharding.
    #[cfg(feature = "etcd")]
    pub fn partition_by<P, F>(self, partition_by: F) -> Self
    where
        P: StoreKey,
        F: Fn(&K) -> P + Send + Sync + 'static,
    {
        self.partition_by_fallible(Arc::new(move |key: &K, partitions: u32| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::coordination::partition_of(&partition_by(key), partitions)
            }))
            .map_err(|panic| panics::message(&*panic))
        }))
    }

    /// [`partition_by`](Self::partition_by) with a function that reports
    /// its failures (the Python bindings' `Sharding(partition_by=)`).
    #[cfg(feature = "etcd")]
    pub(crate) fn partition_by_fallible(self, partition_by: Arc<PartitionByFn<K>>) -> Self {
        self.update_partitioner(|p| p.with_partition_by(partition_by));
        self
    }

    /// Changes how keys map to partitions (`sharding` and `partition_by`
    /// may come in either order).
    #[cfg(feature = "etcd")]
    fn update_partitioner(&self, change: impl FnOnce(partitions::Partitioner<K>) -> partitions::Partitioner<K>) {
        let mut partitioner = self.plan.features.partitioner.lock();
        let current = partitioner.take().unwrap_or_else(|| partitions::Partitioner::new(&self.plan.core.name));
        *partitioner = Some(change(current));
    }

    /// Lists every key that should be reconciled (every replica's, as a
    /// Kubernetes controller lists every object). Without sharding it is
    /// called once, by [`start`](Self::start), and its keys are enqueued
    /// (a panic in it propagates out of `start`, with nothing started).
    /// With sharding it is called instead whenever this replica gains
    /// partitions, on sharding's thread (keep it quick), and the keys of
    /// those partitions are enqueued.
    pub fn resync<I: IntoIterator<Item = K>>(mut self, resync: impl Fn() -> I + Send + Sync + 'static) -> Self {
        self.plan.resync = Some(Arc::new(move || resync().into_iter().collect()));
        self
    }
}

impl<K: ControllerKey> Controller<K> {
    /// A controller named `name` (thread names are `reconq-<name>-<i>`) that
    /// calls `reconciler` with one worker and a per-key
    /// `ExponentialBackoff(5 ms, 1000 s)` (see [`rate_limiter`](Self::rate_limiter)).
    pub fn new(name: impl Into<String>, reconciler: impl Reconciler<K>) -> Self {
        let core = Core::new(name.into());
        let plan = Plan {
            features: Features::new(&core),
            core,
            reconciler: Arc::new(reconciler),
            limiter: None,
            clock: Arc::new(SystemClock),
            grouping: None,
            store: None,
            coordinate: None,
            resync: None,
        };
        Self { plan }
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
        self.plan.core.config.lock().workers = n;
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
        self.plan.limiter = Some(Arc::new(limiter));
        self
    }

    /// The clock delays and running times are measured on (default
    /// [`SystemClock`]); a [`FakeClock`](crate::FakeClock) makes retries
    /// deterministic in tests.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.plan.clock = Arc::new(clock);
        self
    }

    /// Runs the body of every thread this controller spawns (workers,
    /// triggers, watches, the watchdog) inside `wrapper`.
    pub fn thread_wrapper(self, wrapper: ThreadWrapper) -> Self {
        self.plan.core.config.lock().wrapper = Some(wrapper);
        self
    }

    /// Reports reconciles running longer than `threshold` in
    /// [`ControllerHandle::hanging`] and [`Stats::hanging`], and logs each
    /// once (a WARN on target `reconq::controller`). Off by default.
    pub fn hanging_threshold(self, threshold: Duration) -> Self {
        self.plan.core.config.lock().hanging_threshold = Some(threshold);
        self
    }

    /// Whether a failed reconcile that returned an error is logged (an
    /// ERROR, or a WARN for `retry_after`, on target `reconq::controller`).
    /// Panics are always logged. The Python bindings turn this off: they log
    /// exceptions themselves, with their tracebacks.
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn log_errors(self, on: bool) -> Self {
        self.plan.core.config.lock().log_errors = on;
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
        self.plan.core.config.lock().jitter = Some(Jitter { fraction, seed });
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
        self.plan.core.config.lock().supersede = supersede;
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
        self.plan.core.config.lock().debounce = Some(window);
        self
    }

    /// How many permanently failed keys the parked set keeps (default
    /// 1024); the oldest are dropped beyond it.
    pub fn parked_capacity(self, capacity: usize) -> Self {
        self.plan.core.parked.set_capacity(capacity);
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
        self.plan.core.config.lock().timeout = Some(timeout);
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
        self.plan.grouping = Some(GroupTable::new(group));
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
        self.plan.core.config.lock().max_in_flight_per_group = Some(n);
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
        assert!(
            self.plan.coordinate.is_none(),
            "controller {:?}: leader_election or sharding, not both",
            self.plan.core.name
        );
        self.plan.coordinate = Some(replicas::leader(election));
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
    /// makes [`try_start`](Self::try_start) fail with
    /// [`StartError::Watch`], with nothing started.
    pub fn watch_cache<S: crate::source::Source>(self, cache: &crate::cache::Cache<S>, watch: Watch<S, K>) -> Self {
        self.plan.features.watches.keep_for_start(cache, watch);
        self
    }

    /// While a cache watched at start has not synced, an ERROR (target
    /// `reconq::controller`) every `timeout` names it and its last error
    /// (default 120 s). A zero timeout is refused.
    pub fn sync_timeout(self, timeout: Duration) -> Result<Self, crate::error::InvalidArgument> {
        self.plan.features.watches.set_sync_timeout(timeout)?;
        Ok(self)
    }

    /// A handle usable before [`start`](Self::start) or [`run`](Self::run):
    /// keys enqueued through it are kept and processed once started.
    pub fn handle(&self) -> ControllerHandle<K> {
        ControllerHandle { core: Arc::clone(&self.plan.core), features: Arc::clone(&self.plan.features) }
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
        let name = self.plan.core.name.clone();
        self.try_start().unwrap_or_else(|e| panic!("controller {name:?}: {e}"))
    }

    /// [`start`](Self::start), with the OS refusing a thread (a thread or
    /// memory limit: each worker needs a stack) reported as an error. Then
    /// nothing is left running: the workers already spawned are stopped
    /// and joined (a reconcile one of them already began is cancelled and
    /// waited for up to 5 s, then detached), the controller is stopped
    /// (enqueues are ignored), and the error says how many threads could
    /// be made ([`StartError::Thread`]). A controller stopped through a
    /// handle before this is an error too
    /// ([`StartError::StoppedBeforeStart`]): nothing is spawned and it
    /// stays stopped.
    ///
    /// # Panics
    /// If `max_in_flight_per_group` was set without `group`.
    ///
    /// With a [`store`](Self::store), the claim and the read of the stored
    /// keys come first: an error there ([`StartError::Store`]: `Locked`
    /// for a name held by another live controller) changes nothing.
    pub fn try_start(self) -> Result<ControllerHandle<K>, StartError> {
        start::start(self.plan)
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
        f.debug_struct("Controller").field("name", &self.plan.core.name).finish_non_exhaustive()
    }
}
