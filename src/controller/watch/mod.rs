//! The controller's one seam to caches (docs/sources.md, E2, E5–E7): a
//! controller watches a [`Cache`] through [`Watch`] options, and this module
//! alone knows of it. It keeps the watches ([`Watches`], in the core),
//! attaches them at start (the cache acquired, a subscriber that maps
//! changes to enqueues), holds hand-out until every cache watched at start
//! has synced (the synced gate, composed with coordination's in
//! `controller/gate.rs`, so the worker loop asks one gate), and releases
//! the caches at stop (a lifecycle hook). A controller that watches no
//! cache has no gate from here and no per-reconcile work.
//!
//! * `options`: [`Watch`], the public options.
//! * `feed`: a cache's changes (and resyncs) turned into enqueues.
//! * `synced`: the synced gate and its `sync_timeout` reports.
//! * `regain`: what a sharded controller's gain enqueues from a watch (C1).
//! * `restart_set`: a stored controller's restart difference for a cache
//!   (E9): the rows it kept, merged with what the cache loaded.
//! * `watched`: a cache and a watch as the rest of the folder sees them
//!   ([`WatchError`], the `Watched` cache, an `Attached` watch), below
//!   every other file of it.

mod feed;
mod options;
mod regain;
mod restart_set;
mod synced;
mod watched;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::core::{ControllerKey, Core};
use super::gate::{Coordinated, Gate};
use crate::cache::{Cache, SyncedHook};
use crate::error::InvalidArgument;
use crate::source::Source;
use crate::sync::Mutex;

pub use options::{DEFAULT_LIST_PRIORITY, Watch};
pub(crate) use regain::{Fate, Regain, Regained};
use synced::Heard;
pub(crate) use synced::SyncLatch;
use watched::Attached;
pub use watched::WatchError;
use watched::Watched;

/// How long a controller waits for a cache it watched at start before
/// each ERROR saying so (E5), by default.
pub(crate) const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(120);

/// A watch not attached yet (made before start), its source type erased.
trait Unattached<K>: Send {
    fn cache(&self) -> Arc<dyn Watched>;
    /// `caught_up`: run once every key the cache holds reached the
    /// controller, as `feed::attach`'s.
    fn attach(
        self: Box<Self>,
        core: &Arc<Core<K>>,
        caught_up: Option<SyncedHook>,
        watches: &Watches<K>,
    ) -> Result<Attached, WatchError>;
}

struct Pending<S: Source, K> {
    cache: Cache<S>,
    watch: Watch<S, K>,
    heard: Arc<Heard>,
}

impl<S: Source, K: ControllerKey> Unattached<K> for Pending<S, K> {
    fn cache(&self) -> Arc<dyn Watched> {
        Arc::new(self.cache.clone())
    }

    fn attach(
        self: Box<Self>,
        core: &Arc<Core<K>>,
        caught_up: Option<SyncedHook>,
        watches: &Watches<K>,
    ) -> Result<Attached, WatchError> {
        feed::attach(core, &self.cache, self.watch, Some(self.heard.hook(caught_up)), |feed| watches.register(feed))
    }
}

/// A controller's watches (one of its `features`).
pub(crate) struct Watches<K> {
    state: Mutex<State<K>>,
}

struct State<K> {
    sync_timeout: Duration,
    /// `start()` took `at_start`: later watches attach at once and do not
    /// hold the controller.
    started: bool,
    /// The controller stopped: the watches were released.
    released: bool,
    at_start: Vec<Box<dyn Unattached<K>>>,
    attached: Vec<Attached>,
    /// The feeds of a sharded controller, for its gains (C1).
    feeds: Vec<Arc<dyn Regain<K>>>,
    /// Every watch, for `wait_synced`.
    heard: Vec<Arc<Heard>>,
    /// The controller's store file (canonical), once started.
    store_file: Option<PathBuf>,
    /// The latch of the watches made before start, once started.
    latch: Option<Arc<SyncLatch>>,
}

/// What `start()` takes: the watches made before it and the gate's latch.
pub(crate) struct AtStart<K> {
    watches: Vec<Box<dyn Unattached<K>>>,
    latch: Option<Arc<SyncLatch>>,
}

impl<K: ControllerKey> Watches<K> {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                sync_timeout: DEFAULT_SYNC_TIMEOUT,
                started: false,
                released: false,
                at_start: Vec::new(),
                attached: Vec::new(),
                feeds: Vec::new(),
                heard: Vec::new(),
                store_file: None,
                latch: None,
            }),
        }
    }

    pub(crate) fn set_sync_timeout(&self, timeout: Duration) -> Result<(), InvalidArgument> {
        if timeout.is_zero() {
            return Err(InvalidArgument::new("sync_timeout must be positive, got 0 s"));
        }
        self.state.lock().sync_timeout = timeout;
        Ok(())
    }

    /// Watches `cache`: before start, kept for start (and the cache holds
    /// the controller until it syncs); after, attached now.
    pub(crate) fn watch<S: Source>(
        &self,
        core: &Arc<Core<K>>,
        cache: &Cache<S>,
        watch: Watch<S, K>,
    ) -> Result<(), WatchError> {
        if cache.is_stopped() {
            return Err(WatchError::CacheStopped { cache: cache.name().to_owned() });
        }
        {
            let mut state = self.state.lock();
            if state.released || core.life.is_stopping() {
                return Err(WatchError::ControllerStopped { controller: core.name.clone() });
            }
            if !state.started {
                Self::keep_pending(&mut state, cache, watch);
                return Ok(());
            }
            check_store(&core.name, cache, state.store_file.as_deref())?;
        }
        // Outside the lock: attaching may start the cache. It holds nothing
        // back (a later watch does not hold the controller, E5).
        let heard = Heard::new(Arc::new(cache.clone()));
        let attached = feed::attach(core, cache, watch, Some(heard.hook(None)), |feed| self.register(feed))?;
        self.state.lock().heard.push(heard);
        self.keep(attached);
        Ok(())
    }

    /// Keeps a watch made on the builder for start (which refuses a
    /// stopped cache).
    pub(crate) fn keep_for_start<S: Source>(&self, cache: &Cache<S>, watch: Watch<S, K>) {
        Self::keep_pending(&mut self.state.lock(), cache, watch);
    }

    fn keep_pending<S: Source>(state: &mut State<K>, cache: &Cache<S>, watch: Watch<S, K>) {
        let heard = Heard::new(Arc::new(cache.clone()));
        state.heard.push(Arc::clone(&heard));
        state.at_start.push(Box::new(Pending { cache: cache.clone(), watch, heard }));
    }

    /// Lists a sharded controller's feed for its gains, until stop.
    fn register(&self, feed: Arc<dyn Regain<K>>) {
        let mut state = self.state.lock();
        if !state.released {
            state.feeds.push(feed);
        }
    }

    /// C1: the keys every watched cache maps to (its contents and its
    /// tombstones) that `fate` says were just gained, each at its watch's
    /// `list_priority`. Calls user code (`map`, `partition_by`): with no
    /// engine lock held, and none held here while it runs.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding gains partitions
    pub(crate) fn regain(&self, fate: &dyn Fn(&K) -> Fate) -> Vec<Regained<K>> {
        let feeds = self.state.lock().feeds.clone();
        let mut gained = Vec::new();
        for feed in feeds {
            feed.regain(fate, &mut gained);
        }
        gained
    }

    /// Keeps `attached` until stop (dropped at once if it came meanwhile).
    fn keep(&self, attached: Attached) {
        let mut state = self.state.lock();
        if state.released {
            drop(state);
            drop(attached);
        } else {
            state.attached.push(attached);
        }
    }

    /// Takes the watches made before start (no later watch holds the
    /// controller) and their latch; an error if one of their caches was
    /// stopped, or has a store other than the controller's `store_file`
    /// (then nothing has changed: no cache was acquired).
    pub(crate) fn take_at_start(&self, controller: &str, store_file: Option<&Path>) -> Result<AtStart<K>, WatchError> {
        let mut state = self.state.lock();
        let watches = std::mem::take(&mut state.at_start);
        let caches: Vec<Arc<dyn Watched>> = watches.iter().map(|w| w.cache()).collect();
        let refused = match caches.iter().find(|c| c.is_stopped()) {
            Some(stopped) => Err(WatchError::CacheStopped { cache: stopped.name().to_owned() }),
            None => caches.iter().try_for_each(|cache| check_store(controller, &**cache, store_file)),
        };
        if let Err(e) = refused {
            state.at_start = watches;
            return Err(e);
        }
        state.started = true;
        state.store_file = store_file.map(Path::to_path_buf);
        let latch = (!caches.is_empty()).then(|| SyncLatch::new(caches, state.sync_timeout));
        state.latch.clone_from(&latch);
        Ok(AtStart { watches, latch })
    }

    /// Runs `hook` once every cache watched at start has synced and its
    /// keys reached the controller (when the synced gate opens): at once
    /// if there are none or they have. Asked after `take_at_start`.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding waits for it
    pub(crate) fn when_synced(&self, hook: SyncedHook) {
        let latch = self.state.lock().latch.clone();
        match latch {
            Some(latch) => latch.then(hook),
            None => hook(),
        }
    }

    /// Gives up the watches at the controller's stop (its `Stop` hook).
    /// A cache no one else runs is told to stop, not waited for: the stop
    /// waits for its thread within its deadline
    /// ([`caches_still_running`](Self::caches_still_running)), after the
    /// workers, so a source that ignores its stop holds neither the stop
    /// nor the leadership given up when the workers exit.
    pub(crate) fn release(&self) {
        let attached = {
            let mut state = self.state.lock();
            state.released = true;
            state.feeds.clear();
            std::mem::take(&mut state.attached)
        };
        drop(attached);
    }

    /// Waits until `deadline` for the threads of the watched caches that
    /// were stopped (at this controller's stop, those no one else ran);
    /// the names of those still running then. Caches still running for
    /// others are not waited for.
    pub(crate) fn caches_still_running(&self, deadline: Instant) -> Vec<String> {
        let heard = self.state.lock().heard.clone();
        heard
            .iter()
            .map(|watch| watch.cache())
            .filter(|c| c.is_stopped() && !c.wait_exited(deadline))
            .map(|c| c.name().to_owned())
            .collect()
    }

    /// Waits until every cache watched is synced and every key it held
    /// then has reached the controller; `true` at once if none.
    pub(crate) fn wait_synced(&self, timeout: Option<Duration>) -> bool {
        let heard = self.state.lock().heard.clone();
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        heard.iter().all(|watch| watch.wait(deadline))
    }
}

/// A cache with a store needs its controller's store to be the same file
/// (E9: its rows are written in the controller's transactions).
fn check_store(controller: &str, cache: &dyn Watched, store_file: Option<&Path>) -> Result<(), WatchError> {
    let Some(file) = cache.stored_file() else { return Ok(()) };
    let problem = match store_file {
        Some(own) if own == file => return Ok(()),
        Some(own) => format!("its store is {}", own.display()),
        None => "it has no store".to_owned(),
    };
    Err(WatchError::StoreMismatch(format!(
        "controller {controller:?} cannot watch cache {:?}, whose store is {}: {problem}; a cache with a store \
         is kept with the pending keys of its controllers, which must use the same file",
        cache.name(),
        file.display()
    )))
}

impl<K: ControllerKey> AtStart<K> {
    /// Puts the synced gate in front of coordination's, if anything was
    /// watched (else leaves it as it is: no gate, no cost).
    pub(crate) fn gate(&self, coordination: Option<Coordinated<K>>) -> Option<Coordinated<K>> {
        match &self.latch {
            None => coordination,
            Some(latch) => Some(Coordinated::wrapped(coordination, |inner: Option<Box<dyn Gate<K>>>| {
                Box::new(synced::SyncedGate::new(Arc::clone(latch), inner))
            })),
        }
    }

    /// Attaches the watches of a started controller (kept in `watches`
    /// until its stop releases them), opens the gate as their caches sync,
    /// and reports the caches that do not within `sync_timeout`.
    pub(crate) fn attach(self, core: &Arc<Core<K>>, watches: &Watches<K>) -> Result<(), WatchError> {
        if let Some(latch) = &self.latch {
            let latch = Arc::clone(latch);
            core.try_spawn_aux(format!("reconq-{}-sync", core.name), move |core| latch.report_until_synced(core))
                .map_err(WatchError::Thread)?;
        }
        for watch in self.watches {
            // The gate opens once the cache synced and every key it holds
            // has reached the controller.
            let caught_up = self.latch.as_ref().map(|latch| {
                let latch = Arc::clone(latch);
                Box::new(move || latch.one_synced()) as SyncedHook
            });
            let attached = watch.attach(core, caught_up, watches)?;
            watches.keep(attached);
        }
        Ok(())
    }
}
