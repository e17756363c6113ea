//! The gates of leader election and sharding on etcd (the `etcd`
//! feature): joined at start, asked through `gate`'s [`Gate`].

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};

use super::core::{ControllerKey, Core, When};
use super::gate::{Admission, Coordinated, Gate};
use super::start::{Join, Resync};
use crate::coordination::{LeaderElection, ShardHooks, Sharding, partition_of};
use crate::key_encoding::StoreKey;
use crate::{observe::reports::LeaderStatus, observe::reports::ShardStatus};

/// Leader election: the leader runs everything, a standby waits.
pub(crate) fn leader<K: ControllerKey>(election: LeaderElection) -> Join<K> {
    Box::new(move |core: &Arc<Core<K>>, _resync| {
        let weak = Arc::downgrade(core);
        let seat = election.join(move || {
            if let Some(core) = weak.upgrade() {
                core.cancel_running(|_| true);
            }
        });
        Ok(Coordinated::new(Box::new(LeaderGate(election)), Box::new(seat)))
    })
}

struct LeaderGate(LeaderElection);

impl<K> Gate<K> for LeaderGate {
    fn accepts(&self, _: &K) -> bool {
        true
    }

    fn admit(&self, _: &K) -> Admission {
        self.0.token().map_or(Admission::Wait, |token| Admission::Run(Some(token)))
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
        Ok(Coordinated::new(Box::new(ShardGate(sharding)), Box::new(seat)))
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
        self.0.admit(self.partition(key)).map_or(Admission::Drop, |token| Admission::Run(Some(token)))
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
