//! The controller's one seam to coordination between replicas (guarantees
//! §10, §11): whether a key is this process's to keep, whether it may be
//! reconciled now and under which fencing token. Enqueues and the worker
//! loop ask the [`Gate`]; nothing else in the controller knows about etcd.

use std::any::Any;
use std::collections::BTreeSet;
use std::io;
use std::sync::{Arc, Weak};

use super::{ControllerKey, Core, When};
use crate::coordination::{LeaderElection, ShardHooks, Sharding, partition_of};
use crate::key_encoding::StoreKey;
use crate::sync::Mutex;
use crate::{LeaderStatus, ShardStatus};

/// What the gate says of a key being handed out.
pub(crate) enum Admission {
    /// Reconcile it under this fencing token.
    Run(u64),
    /// Not now (a standby): put it back and wait for [`Gate::wait`].
    Wait,
    /// Not ours: drop it (its owner reconciles it).
    Drop,
}

pub(crate) trait Gate<K>: Send + Sync {
    /// At enqueue: whether the key is ours to keep (`false`: dropped and
    /// counted in `not_owned`).
    fn accepts(&self, key: &K) -> bool;
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
}

/// What a started controller holds of its coordination.
pub(crate) struct Coordinated<K> {
    pub(crate) gate: Box<dyn Gate<K>>,
    /// Our membership (an election seat, a shard seat), given up once no
    /// worker is left (the `WorkersExited` hook `Core::subscribe_features` sets).
    membership: Mutex<Option<Box<dyn Any + Send>>>,
}

impl<K> Coordinated<K> {
    pub(crate) fn leave(&self) {
        let membership = self.membership.lock().take();
        drop(membership);
    }
}

/// Joins the coordination a controller was configured with, at its start.
/// Sharding takes the controller's `resync` (it runs it when partitions are
/// gained); whatever leaves it runs once at start instead.
pub(crate) type Join<K> = Box<dyn FnOnce(&Arc<Core<K>>, &mut Option<Resync<K>>) -> io::Result<Coordinated<K>> + Send>;

/// Lists every key the controller should have (`resync`): enqueued at
/// start, or with sharding those of partitions just gained.
pub(crate) type Resync<K> = Arc<dyn Fn() -> Vec<K> + Send + Sync>;

/// Leader election: the leader runs everything, a standby waits.
pub(crate) fn leader<K: ControllerKey>(election: LeaderElection) -> Join<K> {
    Box::new(move |core: &Arc<Core<K>>, _resync| {
        let weak = Arc::downgrade(core);
        let seat = election.join(move || {
            if let Some(core) = weak.upgrade() {
                core.cancel_running(|_| true);
            }
        });
        Ok(Coordinated { gate: Box::new(LeaderGate(election)), membership: Mutex::new(Some(Box::new(seat))) })
    })
}

struct LeaderGate(LeaderElection);

impl<K> Gate<K> for LeaderGate {
    fn accepts(&self, _: &K) -> bool {
        true
    }

    fn admit(&self, _: &K) -> Admission {
        self.0.token().map_or(Admission::Wait, Admission::Run)
    }

    fn finished(&self, _: &K, _: u64) {}

    fn wait(&self, give_up: &dyn Fn() -> bool) -> bool {
        self.0.wait_token(give_up).is_some()
    }

    fn wake(&self) {
        self.0.wake();
    }

    fn leader_status(&self) -> Option<LeaderStatus> {
        Some(self.0.status())
    }

    fn shard_status(&self) -> Option<ShardStatus> {
        None
    }
}

/// Sharding: keys of partitions we own run, the rest are dropped.
pub(crate) fn shards<K: ControllerKey + StoreKey>(sharding: Sharding) -> Join<K> {
    Box::new(move |core: &Arc<Core<K>>, resync: &mut Option<Resync<K>>| {
        let resync = resync.take();
        let hooks =
            Arc::new(ControllerShards { core: Arc::downgrade(core), resync, partitions: sharding.partition_count() });
        let seat = sharding.attach(hooks)?;
        Ok(Coordinated { gate: Box::new(ShardGate(sharding)), membership: Mutex::new(Some(Box::new(seat))) })
    })
}

struct ShardGate(Sharding);

impl ShardGate {
    fn partition<K: StoreKey>(&self, key: &K) -> u32 {
        partition_of(key, self.0.partition_count())
    }
}

impl<K: StoreKey> Gate<K> for ShardGate {
    fn accepts(&self, key: &K) -> bool {
        self.0.owns(self.partition(key))
    }

    fn admit(&self, key: &K) -> Admission {
        self.0.admit(self.partition(key)).map_or(Admission::Drop, Admission::Run)
    }

    fn finished(&self, key: &K, token: u64) {
        self.0.finished(self.partition(key), token);
    }

    fn wait(&self, give_up: &dyn Fn() -> bool) -> bool {
        !give_up()
    }

    fn wake(&self) {}

    fn leader_status(&self) -> Option<LeaderStatus> {
        None
    }

    fn shard_status(&self) -> Option<ShardStatus> {
        Some(self.0.status())
    }
}

/// What sharding calls into the controller.
struct ControllerShards<K: ControllerKey> {
    core: Weak<Core<K>>,
    resync: Option<Resync<K>>,
    partitions: u32,
}

impl<K: ControllerKey + StoreKey> ShardHooks for ControllerShards<K> {
    fn gained(&self, partitions: &BTreeSet<u32>) {
        let (Some(core), Some(resync)) = (self.core.upgrade(), &self.resync) else { return };
        for key in resync() {
            if partitions.contains(&partition_of(&key, self.partitions)) {
                core.route(key, When::Now, 0);
            }
        }
    }

    fn cancel(&self, partitions: &BTreeSet<u32>) {
        if let Some(core) = self.core.upgrade() {
            core.cancel_running(|key| partitions.contains(&partition_of(key, self.partitions)));
        }
    }
}
