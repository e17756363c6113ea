//! The start sequence, in order: what can fail before anything is shared
//! (the watches' caches, the store's claim, the coordination's join, the
//! resync's list), then the runtime made visible with the features
//! installed and subscribed to the stop, the keys kept from before start,
//! and the threads. A failure once the runtime is visible takes one path:
//! the controller is stopped and the threads it spawned are joined
//! (bounded), so nothing of it is left running.

use std::error::Error;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use super::core::{ClockRef, ControllerKey, Core, ExitGuard, Runtime, When, WorkerSlot};
use super::debounce::Debounce;
use super::dependencies;
use super::features::{self, Features};
use super::finish::Finish;
use super::gate::Coordinated;
use super::groups::Grouping;
use super::handle::ControllerHandle;
use super::outcome::Reconciler;
use super::partitions::Partitioner;
use super::watch::{AtStart, WatchError};
use super::watchdog::Watchdog;
use super::{hangs, persist, worker};
use crate::clock::Clock;
use crate::queue::WorkQueue;
use crate::rate_limit::{ExponentialBackoff, RateLimiter};
use crate::store::{StoreError, StoreLink};
use crate::thread::spawn_named;

/// How long a failed start waits for the threads it did spawn to exit.
const FAILED_START_JOIN: Duration = Duration::from_secs(5);

/// The default limiter's first retry delay and its cap (see
/// [`Controller::rate_limiter`](super::Controller::rate_limiter)).
const DEFAULT_RETRY_BASE: Duration = Duration::from_millis(5);
const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(1000);

/// Why [`Controller::try_start`](super::Controller::try_start) failed. Nothing of the controller is left
/// running: an error before any thread was spawned changed nothing, a
/// later one stopped the controller and joined what it had spawned.
///
/// An `io::Error` can be made of it (`?` in a function returning
/// `io::Result`); [`kind`](Self::kind) and [`get_ref`](Self::get_ref) answer
/// as that `io::Error`'s do.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The store: its name is held by another live controller (`Locked`),
    /// a stored row cannot be read, or a watched cache's store is not the
    /// controller's (`Invalid`), or I/O. Nothing changed.
    Store(StoreError),
    /// A watched cache was stopped (it never runs again), or the OS
    /// refused a thread for a watch.
    Watch(WatchError),
    /// Joining the leader election or the sharding failed (one controller
    /// per `Sharding`: `InvalidInput`).
    Coordination(io::Error),
    /// The controller was stopped through a handle before start: a
    /// controller runs once.
    StoppedBeforeStart,
    /// With sharding, an edge set before start (before the controller was
    /// given its sharding or `partition_by`) joins keys of different
    /// partitions (guarantees §17, C4); the message names both keys and
    /// their partitions. Nothing changed.
    CrossPartition(String),
    /// The OS refused a thread (a thread or memory limit: each worker
    /// needs a stack); `thread` names it.
    Thread {
        /// The thread's name, as the OS would have shown it.
        thread: String,
        /// What the OS said.
        error: io::Error,
    },
}

impl StartError {
    /// The kind of the `io::Error` this becomes.
    pub fn kind(&self) -> io::ErrorKind {
        match self {
            StartError::Store(e) => e.kind(),
            StartError::Coordination(e) | StartError::Thread { error: e, .. } => e.kind(),
            StartError::Watch(_) | StartError::StoppedBeforeStart => io::ErrorKind::Other,
            StartError::CrossPartition(_) => io::ErrorKind::InvalidInput,
        }
    }

    /// The error inside: the [`StoreError`], the [`WatchError`], or the
    /// coordination's or thread's error (as `io::Error::get_ref`).
    pub fn get_ref(&self) -> Option<&(dyn Error + Send + Sync + 'static)> {
        match self {
            StartError::Store(e) => Some(e),
            StartError::Watch(e) => Some(e),
            StartError::Coordination(e) => e.get_ref(),
            StartError::Thread { error, .. } => Some(error),
            StartError::StoppedBeforeStart | StartError::CrossPartition(_) => None,
        }
    }
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Store(e) => e.fmt(f),
            StartError::Watch(e) => e.fmt(f),
            StartError::Coordination(e) => e.fmt(f),
            StartError::StoppedBeforeStart => {
                f.write_str("was stopped through a handle before start: a controller runs once")
            }
            StartError::Thread { thread, error } => write!(f, "cannot spawn {thread}: {error}"),
            StartError::CrossPartition(edge) => write!(f, "set_dependencies before start: {edge}"),
        }
    }
}

impl Error for StartError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            StartError::Store(e) => Some(e),
            StartError::Watch(e) => Some(e),
            StartError::Coordination(e) | StartError::Thread { error: e, .. } => Some(e),
            StartError::StoppedBeforeStart | StartError::CrossPartition(_) => None,
        }
    }
}

/// A store error stays inside (`get_ref()` + `downcast_ref`), as before
/// the typed error.
impl From<StartError> for io::Error {
    fn from(e: StartError) -> Self {
        match e {
            StartError::Store(e) => io::Error::from(e),
            StartError::Coordination(e) => e,
            other => io::Error::new(other.kind(), other),
        }
    }
}

impl From<WatchError> for StartError {
    fn from(e: WatchError) -> Self {
        match e {
            // The cache's store is not the controller's: the store's error.
            WatchError::StoreMismatch(message) => StartError::Store(StoreError::Invalid(message)),
            other => StartError::Watch(other),
        }
    }
}

/// What the builder gathered for the start.
pub(crate) struct Plan<K> {
    pub(crate) core: Arc<Core<K>>,
    pub(crate) features: Arc<Features<K>>,
    pub(crate) reconciler: Arc<dyn Reconciler<K>>,
    pub(crate) limiter: Option<Arc<dyn RateLimiter<K>>>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) grouping: Option<Arc<dyn Grouping<K>>>,
    /// The store's file (canonical) and its claim.
    pub(crate) store: Option<(std::path::PathBuf, Box<ClaimFn<K>>)>,
    /// Leader election or sharding, joined at start.
    pub(crate) coordinate: Option<Join<K>>,
    pub(crate) resync: Option<Resync<K>>,
}

/// Claims the controller's name in its store at start (the key type's
/// encoding is known only where `store` is called).
pub(crate) type ClaimFn<K> = dyn FnOnce(&str) -> Result<Arc<dyn StoreLink<K>>, StoreError> + Send;

/// Joins the coordination a controller was configured with, at its start.
/// Sharding takes the controller's `resync` (it runs it when partitions are
/// gained; whatever leaves it runs once at start instead), the features (a
/// gain enqueues from the watched caches, in a batch) and how keys map to
/// partitions.
pub(crate) type Join<K> = Box<
    dyn FnOnce(
            &Arc<Core<K>>,
            &Arc<Features<K>>,
            &mut Option<Resync<K>>,
            Option<Partitioner<K>>,
        ) -> io::Result<Coordinated<K>>
        + Send,
>;

/// Lists every key the controller should have (`resync`): enqueued at
/// start, or with sharding those of partitions just gained.
pub(crate) type Resync<K> = Arc<dyn Fn() -> Vec<K> + Send + Sync>;

/// Starts what `plan` describes (see
/// [`Controller::try_start`](super::Controller::try_start)).
pub(super) fn start<K: ControllerKey>(mut plan: Plan<K>) -> Result<ControllerHandle<K>, StartError> {
    let (core, features) = (Arc::clone(&plan.core), Arc::clone(&plan.features));
    let partitioner = features.partitioner();
    if let Some(partitioner) = &partitioner {
        assert!(
            partitioner.is_sharded() || !partitioner.has_partition_by(),
            "controller {:?}: partition_by needs sharding",
            core.name
        );
        // C4, for edges set before sharding was configured (later ones
        // were checked as they were set); before anything is taken.
        if let Some(edge) = dependencies::first_edge_across(&features.deps_before_start, partitioner) {
            return Err(StartError::CrossPartition(edge.to_string()));
        }
    }
    let store_file = plan.store.as_ref().map(|(file, _)| file.as_path());
    let watched = features.watches.take_at_start(&core.name, store_file)?;
    let store = match plan.store.take() {
        Some((_, claim)) => Some(claim(&core.name).map_err(StartError::Store)?),
        None => None,
    };
    let config = core.config.lock().clone();
    assert!(
        config.max_in_flight_per_group.is_none() || plan.grouping.is_some(),
        "controller {:?}: max_in_flight_per_group needs a group function",
        core.name
    );
    let limiter =
        plan.limiter.take().unwrap_or_else(|| Arc::new(ExponentialBackoff::new(DEFAULT_RETRY_BASE, DEFAULT_RETRY_MAX)));
    // Named after the controller, so it records `workqueue_*` metrics.
    let mut queue = WorkQueue::builder()
        .name(core.name.clone())
        .rate_limiter(Arc::clone(&limiter))
        .clock(ClockRef(Arc::clone(&plan.clock)));
    if plan.grouping.is_some() {
        queue = queue.groups(config.max_in_flight_per_group);
    }
    if store.is_some() {
        // The store's last flush writes what the stop dropped (S2), and
        // no flush writes a finished key before its dependents (D2).
        queue = queue.for_store();
    }
    let queue = queue.build();
    if config.supersede {
        queue.enable_supersede(core.cancel_hook());
    }
    let watchdog = (config.hanging_threshold.is_some() || config.timeout.is_some())
        .then(|| Watchdog::new(config.hanging_threshold, config.timeout, &plan.clock));
    let mut resync = plan.resync.take();
    let coordination = match plan.coordinate.take() {
        Some(join) => Some(join(&core, &features, &mut resync, partitioner).map_err(StartError::Coordination)?),
        None => None,
    };
    let coordination = watched.gate(coordination);
    // Before anything is shared, so a panicking resync leaves nothing
    // half started (the claim and the membership drop as it unwinds).
    let listed = resync.map(|resync| resync()).unwrap_or_default();
    // Keys whose place is asked at enqueue: D2 asks it for children too.
    let placed = plan.grouping.is_some() || coordination.is_some();
    let rt = Runtime {
        finish: Finish::new(store.is_some(), placed),
        queue,
        limiter,
        clock: Arc::clone(&plan.clock),
        slots: (0..config.workers).map(|_| WorkerSlot::new()).collect(),
        jitter: config.jitter,
        hanging_threshold: config.hanging_threshold,
        timeout: config.timeout,
        watchdog,
        workers: config.workers,
        log_errors: config.log_errors,
        grouping: plan.grouping.take(),
        store,
        coordination,
        debounce: config.debounce.map(Debounce::new),
    };
    let rt = install(&core, &plan.features, rt);
    let handle = ControllerHandle { core: Arc::clone(&core), features };
    let started = run(&core, rt, &plan, listed, watched);
    if let Err(e) = started {
        // The one failure path: stop, and wait (bounded) for the threads
        // this start spawned. A stop that came first left none: the
        // threads made before start (triggers, watches) are its to wait for.
        handle.stop();
        if !matches!(e, StartError::StoppedBeforeStart) {
            handle.join_timeout(FAILED_START_JOIN);
        }
        return Err(e);
    }
    Ok(handle)
}

/// Makes `rt` the controller's runtime, with the features kept from before
/// start in it (edges, open batches), and subscribes the features it has
/// to the stop.
fn install<'a, K: ControllerKey>(core: &'a Arc<Core<K>>, features: &Features<K>, rt: Runtime<K>) -> &'a Runtime<K> {
    let stored_edges = rt.store.as_ref().map(|link| link.restore_edges()).unwrap_or_default();
    // Both kept locked until the runtime is set: no edge and no batch
    // lands in between.
    let mut deps_before_start = features.deps_before_start.lock();
    let dropped_edges = core.install_dependencies(&mut deps_before_start, stored_edges, &rt);
    let open_batches = features.batches.lock();
    core.install_batch(&open_batches, &rt);
    if core.rt.set(rt).is_err() {
        panic!("controller {:?} started twice", core.name);
    }
    drop(open_batches);
    drop(deps_before_start);
    crate::logs::stored_edges_dropped(&core.name, &dropped_edges);
    let rt = core.rt.get().expect("just set");
    features::subscribe_started(core, rt);
    rt
}

/// Puts the keys kept from before start in the queue, then spawns the
/// threads: workers, watchdog, flusher, and the watches' attachments.
fn run<K: ControllerKey>(
    core: &Arc<Core<K>>,
    rt: &Runtime<K>,
    plan: &Plan<K>,
    listed: Vec<K>,
    watched: AtStart<K>,
) -> Result<(), StartError> {
    let workers = rt.workers;
    core.life.workers_starting(workers).map_err(|()| StartError::StoppedBeforeStart)?;
    if let Some(link) = &rt.store {
        persist::restore(core, rt, link);
    }
    // Keys enqueued before start. Enqueuers check `rt` under this lock,
    // so none is lost between here and the `set` in `install`.
    let pending = std::mem::take(&mut *core.pending.lock());
    for (key, when, priority) in pending {
        core.apply(rt, key, when, priority);
    }
    for key in listed {
        core.apply(rt, key, When::Now, 0);
    }
    // Only now is the queue the whole story (see `wait_idle`).
    core.life.started();
    let wrapper = core.wrapper();
    for index in 0..workers {
        let thread_core = Arc::clone(core);
        let reconciler = Arc::clone(&plan.reconciler);
        let name = format!("reconq-{}-{index}", core.name);
        let spawned = spawn_named(name, wrapper.as_ref(), move || {
            let guard = ExitGuard { core: thread_core, worker: true };
            worker::run_worker(&guard.core, &*reconciler, index);
        });
        match spawned {
            Ok(thread) => core.life.keep_worker(thread),
            Err(error) => {
                // The workers that will never run are not waited for; the
                // last one out of those that did leaves the coordination.
                core.life.workers_gone(workers - index);
                return Err(StartError::Thread { thread: format!("worker thread {} of {workers}", index + 1), error });
            }
        }
    }
    if let Some(watchdog) = &rt.watchdog {
        let watchdog = Arc::clone(watchdog);
        let spawned = core.try_spawn_aux(format!("reconq-{}-watchdog", core.name), move |core| {
            let rt = core.rt.get().expect("the watchdog starts after the runtime");
            watchdog.run(|threshold, timeout| hangs::watch(core, rt, threshold, timeout));
        });
        spawned.map_err(|error| StartError::Thread { thread: "the watchdog thread".to_owned(), error })?;
    }
    if let Some(link) = &rt.store {
        let link = Arc::clone(link);
        core.try_spawn_aux(format!("reconq-{}-store", core.name), move |core| link.run_flusher(&**core))
            .map_err(|error| StartError::Thread { thread: "the store's flusher thread".to_owned(), error })?;
    }
    watched.attach(core, &plan.features.watches)?;
    Ok(())
}
