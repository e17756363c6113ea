//! The gates of leader election and sharding on etcd (the `etcd`
//! feature): joined at start, asked through `gate`'s [`Gate`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Weak};

use super::core::{ControllerKey, Core, When};
use super::gate::{Admission, Coordinated, Gate};
use super::partitions::Partitioner;
use super::start::{Join, Resync};
use crate::coordination::{LeaderElection, ShardHooks, Sharding};
use crate::key_encoding::StoreKey;
use crate::sync::Mutex;
use crate::{observe::reports::LeaderStatus, observe::reports::ShardStatus};

/// Leader election: the leader runs everything, a standby waits.
pub(crate) fn leader<K: ControllerKey>(election: LeaderElection) -> Join<K> {
    Box::new(move |core: &Arc<Core<K>>, _resync, _partitioner| {
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
    Box::new(move |core: &Arc<Core<K>>, resync: &mut Option<Resync<K>>, partitioner: Option<Partitioner<K>>| {
        let resync = resync.take();
        let partitioner = partitioner.unwrap_or_else(|| Partitioner::new(&core.name));
        let partitioner = partitioner.with_partitions(sharding.partition_count());
        // Kept only with a `partition_by`: see `Admitted`.
        let admitted = partitioner.has_partition_by().then(|| Arc::new(Admitted::default()));
        let hooks = Arc::new(ControllerShards {
            core: Arc::downgrade(core),
            resync,
            partitioner: partitioner.clone(),
            admitted: admitted.clone(),
        });
        let seat = sharding.attach(hooks)?;
        Ok(Coordinated::new(Box::new(ShardGate { sharding, partitioner, admitted }), Box::new(seat)))
    })
}

/// The partition each key handed out with a `partition_by` was admitted
/// under, until its reconcile returned. `partition_by` is the user's code:
/// it may not name the same key twice (a Python function that raises now
/// and then), and it must not be called under an engine lock. So the
/// partition a reconcile was counted in is the one it is finished in (H4
/// counts each partition's reconciles in flight), and a partition leaving
/// cancels the reconciles admitted under it without calling it again.
struct Admitted<K>(Mutex<HashMap<K, u32>>);

impl<K> Default for Admitted<K> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

struct ShardGate<K> {
    sharding: Sharding,
    partitioner: Partitioner<K>,
    admitted: Option<Arc<Admitted<K>>>,
}

impl<K: ControllerKey> Gate<K> for ShardGate<K> {
    fn accepts(&self, key: &K) -> bool {
        self.sharding.owns(self.partitioner.of(key))
    }

    fn admit(&self, key: &K) -> Admission {
        let partition = self.partitioner.of(key);
        // Noted before it counts: a partition leaving right after finds it.
        if let Some(admitted) = &self.admitted {
            admitted.0.lock().insert(key.clone(), partition);
        }
        match self.sharding.admit(partition) {
            Some(token) => Admission::Run(Some(token)),
            None => {
                if let Some(admitted) = &self.admitted {
                    admitted.0.lock().remove(key);
                }
                Admission::Drop
            }
        }
    }

    fn finished(&self, key: &K, token: u64) {
        let partition = match &self.admitted {
            Some(admitted) => admitted.0.lock().remove(key),
            None => Some(self.partitioner.of(key)),
        };
        if let Some(partition) = partition {
            self.sharding.finished(partition, token);
        }
    }

    fn wait(&self, give_up: &dyn Fn() -> bool) -> bool {
        !give_up()
    }

    fn wake(&self) {}

    fn leader_status(&self) -> Option<LeaderStatus> {
        None
    }

    fn shard_status(&self) -> Option<ShardStatus> {
        Some(self.sharding.status())
    }
}

/// What sharding calls into the controller.
struct ControllerShards<K: ControllerKey> {
    core: Weak<Core<K>>,
    resync: Option<Resync<K>>,
    partitioner: Partitioner<K>,
    admitted: Option<Arc<Admitted<K>>>,
}

impl<K: ControllerKey + StoreKey> ShardHooks for ControllerShards<K> {
    fn gained(&self, partitions: &BTreeSet<u32>) {
        let (Some(core), Some(resync)) = (self.core.upgrade(), &self.resync) else { return };
        for key in resync() {
            if partitions.contains(&self.partitioner.of(&key)) {
                core.route(key, When::Now, 0);
            }
        }
    }

    fn cancel(&self, partitions: &BTreeSet<u32>) {
        let Some(core) = self.core.upgrade() else { return };
        match &self.admitted {
            Some(admitted) => {
                let leaving: HashSet<K> = admitted
                    .0
                    .lock()
                    .iter()
                    .filter(|(_, partition)| partitions.contains(partition))
                    .map(|(key, _)| key.clone())
                    .collect();
                core.cancel_running(|key| leaving.contains(key));
            }
            None => core.cancel_running(|key| partitions.contains(&self.partitioner.of(key))),
        }
    }
}
