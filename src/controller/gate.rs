//! The controller's one seam to coordination between replicas (guarantees
//! §10, §11): whether a key is this process's to keep, whether it may be
//! reconciled now and under which fencing token. Enqueues and the worker
//! loop ask the [`Gate`]; nothing else in the controller knows about etcd.
//! The synced gate of watched caches (`controller/watch`, E5) stands in
//! front of coordination's, so the worker loop still asks one gate.

use std::any::Any;

use crate::queue::{Place, Priority, View};
use crate::sync::Mutex;
use crate::{observe::reports::LeaderStatus, observe::reports::ShardStatus};

/// What the gate says of a key being handed out.
pub(crate) enum Admission {
    /// Reconcile it, under this fencing token if coordination gives one.
    Run(Option<u64>),
    /// Not now (a standby): put it back and wait for [`Gate::wait`].
    Wait,
    /// Not ours: drop it (its owner reconciles it).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding says so
    Drop,
}

pub(crate) trait Gate<K>: Send + Sync {
    /// At enqueue, at `priority`: whether the key is ours to keep
    /// (`false`: dropped and counted in `not_owned`).
    fn accepts(&self, key: &K, priority: Priority) -> bool;
    /// At hand-out, once the reconcile is marked running (so a loss right
    /// after this answer still finds and cancels it).
    fn admit(&self, key: &K) -> Admission;
    /// The reconcile [`admit`](Self::admit)ted under `token` returned.
    fn finished(&self, key: &K, token: u64);
    /// Blocks until keys may run again or `give_up()`; `false` if it gave up.
    fn wait(&self, give_up: &dyn Fn() -> bool) -> bool;
    /// Wakes the threads in [`wait`](Self::wait) (the controller stopping).
    fn wake(&self);
    fn leader_status(&self) -> Option<LeaderStatus>;
    fn shard_status(&self) -> Option<ShardStatus>;
    /// A stop dropped `keys` from the queue (before they are taken from
    /// it): sharding keeps them for the hand-over of the partitions it
    /// gives up as the controller leaves (C2).
    fn dropped_at_stop(&self, _keys: &[(K, View)]) {}
    /// At start, a key the store kept pending: given back to go into the
    /// queue now, or kept by the gate (sharding keeps those of partitions
    /// not ours yet, C2).
    fn hold_stored(&self, stored: StoredKey<K>) -> Option<StoredKey<K>> {
        Some(stored)
    }
}

/// What a started controller holds of its coordination.
pub(crate) struct Coordinated<K> {
    pub(crate) gate: Box<dyn Gate<K>>,
    /// Our membership (an election seat, a shard seat), given up once no
    /// worker is left (the `WorkersExited` hook `Core::subscribe_features` sets).
    membership: Mutex<Option<Box<dyn Any + Send>>>,
}

impl<K> Coordinated<K> {
    /// `gate`, and the `membership` (an election seat, a shard seat) given
    /// up once no worker is left.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only replicas join
    pub(crate) fn new(gate: Box<dyn Gate<K>>, membership: Box<dyn Any + Send>) -> Self {
        Self { gate, membership: Mutex::new(Some(membership)) }
    }

    /// `coordination`'s membership (if any) behind the gate `wrap` puts in
    /// front of its gate.
    pub(crate) fn wrapped(
        coordination: Option<Self>,
        wrap: impl FnOnce(Option<Box<dyn Gate<K>>>) -> Box<dyn Gate<K>>,
    ) -> Self {
        match coordination {
            Some(Coordinated { gate, membership }) => Coordinated { gate: wrap(Some(gate)), membership },
            None => Coordinated { gate: wrap(None), membership: Mutex::new(None) },
        }
    }

    pub(crate) fn leave(&self) {
        let membership = self.membership.lock().take();
        drop(membership);
    }
}

/// A key the store kept pending, on its way back into the queue (the
/// store's seam, `persist`, puts it there): the gate may keep it aside
/// first ([`Gate::hold_stored`]).
pub(crate) struct StoredKey<K> {
    pub(crate) key: K,
    pub(crate) place: Place,
    /// When it was due (`None`: ready).
    pub(crate) due: Option<std::time::Instant>,
}
