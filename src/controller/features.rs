//! The features a controller was built with, in one place: the state each
//! keeps apart from the engine (`core` names none of them), and the hooks
//! each registers on the controller's life. The builder and the handles
//! hold the features beside the core; `start` installs them.
//!
//! * triggers: the live triggers, signalled at stop;
//! * watches: the caches watched, released at stop;
//! * dependencies set before start, and batches open (both handed to the
//!   queue at start); how keys map to partitions (sharding, C4's check);
//! * once started: the store (woken at stop, its last flush once stopped),
//!   the watchdog (shut down at stop) and the coordination (standby
//!   workers woken at stop, the seat left once the workers exited).

use std::sync::Arc;

use super::batch::OpenBatches;
use super::core::{ControllerKey, Core, Runtime};
use super::dependencies::BeforeStart;
use super::life::Event;
use super::partitions::Partitioner;
use super::triggers::{self, Triggers};
use super::watch::Watches;
use crate::sync::Mutex;

/// What a controller's features keep for its life.
pub(crate) struct Features<K> {
    /// The live triggers (see `triggers`); their threads hold it too.
    pub(crate) triggers: Arc<Mutex<Triggers<K>>>,
    /// The caches it watches (see `watch`).
    pub(crate) watches: Watches<K>,
    /// Dependencies set before start (see `dependencies`).
    pub(crate) deps_before_start: Mutex<BeforeStart<K>>,
    /// Batches open now (see `batch`); their guards hold it too.
    pub(crate) batches: Arc<OpenBatches>,
    /// How keys map to partitions, once `sharding` or `partition_by` was
    /// configured (see `partitions`): C4 checks each edge against it.
    pub(crate) partitioner: Mutex<Option<Partitioner<K>>>,
}

impl<K: ControllerKey> Features<K> {
    /// The features of the controller whose engine is `core`. Triggers and
    /// watches exist before start, so they hear of the stop from birth.
    pub(crate) fn new(core: &Core<K>) -> Arc<Self> {
        let features = Arc::new(Self {
            triggers: Arc::new(Mutex::new(Triggers::default())),
            watches: Watches::new(),
            deps_before_start: Mutex::new(BeforeStart::default()),
            batches: Arc::new(Mutex::new(0)),
            partitioner: Mutex::new(None),
        });
        // Held weakly: the hooks live in the core, which outlives them.
        let weak = Arc::downgrade(&features);
        core.life.on(Event::Stop, move || {
            if let Some(features) = weak.upgrade() {
                triggers::stop_all(&features.triggers);
                features.watches.release();
            }
        });
        features
    }

    /// How keys map to partitions now (a copy: the caller may call
    /// `partition_by` with no lock held).
    pub(crate) fn partitioner(&self) -> Option<Partitioner<K>> {
        self.partitioner.lock().clone()
    }
}

/// Subscribes the features a started controller has in `rt` to its stop:
/// the store, the watchdog and the coordination.
pub(crate) fn subscribe_started<K: ControllerKey>(core: &Arc<Core<K>>, rt: &Runtime<K>) {
    if let Some(link) = &rt.store {
        // Woken to stop ticking, then to write the last flush once no
        // worker can change a key.
        let link = Arc::clone(link);
        let done = Arc::clone(&link);
        core.life.on(Event::Stop, move || link.wake());
        core.life.on(Event::Stopped, move || done.workers_done());
    }
    if let Some(watchdog) = &rt.watchdog {
        let watchdog = Arc::clone(watchdog);
        core.life.on(Event::Stop, move || watchdog.shut_down());
    }
    if rt.coordination.is_some() {
        // Workers waiting for leadership look again, and exit; our seat
        // is given up once none of our reconciles can run, so
        // leadership or partitions pass on at once (L4).
        core.subscribe(Event::Stop, |core| {
            if let Some(gate) = core.gate() {
                gate.wake();
            }
        });
        core.subscribe(Event::WorkersExited, |core| {
            if let Some(coordination) = core.coordination() {
                // Outside every lock: leaving talks to etcd.
                coordination.leave();
            }
        });
    }
}
