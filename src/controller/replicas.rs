//! The gates of leader election and sharding on etcd (the `etcd`
//! feature): joined at start, asked through `gate`'s [`Gate`]. A sharded
//! controller's gains enqueue the keys of the partitions gained (C1, C2):
//! from every watched cache, from `resync`, and the stored keys kept aside
//! at start, in one batch.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::core::{ControllerKey, Core, When};
use super::features::Features;
use super::gate::{Admission, Coordinated, Gate, StoredKey};
use super::handover::{self, Handed, Refused};
use super::partitions::Partitioner;
use super::start::{Join, Resync};
use super::watch::{DEFAULT_LIST_PRIORITY, Fate};
use crate::coordination::{LeaderElection, ShardAdmission, ShardHooks, Sharding};
use crate::key_encoding::StoreKey;
use crate::queue::{Priority, View};
use crate::sync::Mutex;
use crate::{observe::reports::LeaderStatus, observe::reports::ShardStatus};

/// Leader election: the leader runs everything, a standby waits.
pub(crate) fn leader<K: ControllerKey>(election: LeaderElection) -> Join<K> {
    Box::new(move |core: &Arc<Core<K>>, _features, _resync, _partitioner| {
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
    fn accepts(&self, _: &K, _: Priority) -> bool {
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
    Box::new(
        move |core: &Arc<Core<K>>,
              features: &Arc<Features<K>>,
              resync: &mut Option<Resync<K>>,
              partitioner: Option<Partitioner<K>>| {
            let resync = resync.take();
            let partitioner = partitioner.unwrap_or_else(|| Partitioner::new(&core.name));
            let partitioner = partitioner.with_partitions(sharding.partition_count());
            // Kept only with a `partition_by`: see `Admitted`.
            let admitted = partitioner.has_partition_by().then(|| Arc::new(Admitted::default()));
            let aside = Arc::new(StoredAside::default());
            let refused = Arc::new(Refused::default());
            let hooks = Arc::new(ControllerShards {
                core: Arc::downgrade(core),
                features: Arc::downgrade(features),
                sharding: sharding.clone(),
                resync,
                partitioner: partitioner.clone(),
                admitted: admitted.clone(),
                aside: Arc::clone(&aside),
                refused: Arc::clone(&refused),
            });
            // C1 across a join (see `join_once_synced`).
            sharding.join_once_synced();
            let joining = sharding.clone();
            features.watches.when_synced(Box::new(move || joining.caches_synced()));
            let seat = sharding.attach(hooks)?;
            let gate = ShardGate { sharding, partitioner, admitted, aside, refused };
            Ok(Coordinated::new(Box::new(gate), Box::new(seat)))
        },
    )
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

/// The keys the store kept pending (section 9) whose partitions were not
/// ours at start, by partition, until the partition has an owner (C2): a
/// gain puts them in the queue, another replica's claim drops them (their
/// rows go at the next flush; C1 brings a cache's keys to that owner).
/// Before a restarted replica's first claim, its stored keys are all here,
/// not handed out and dropped as another replica's.
///
/// Invariant: a key is put here, or into the queue, under the lock, after
/// asking `owns` under it; a gain takes its partitions' keys under it,
/// after they became ours. So no key is put here once its gain took the
/// rest.
struct StoredAside<K>(Mutex<HashMap<u32, Vec<StoredKey<K>>>>);

impl<K> Default for StoredAside<K> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<K> StoredAside<K> {
    /// Takes the keys kept for `partitions`.
    fn take(&self, partitions: &BTreeSet<u32>) -> Vec<StoredKey<K>> {
        let mut aside = self.0.lock();
        if aside.is_empty() {
            return Vec::new();
        }
        partitions.iter().filter_map(|p| aside.remove(p)).flatten().collect()
    }
}

struct ShardGate<K> {
    sharding: Sharding,
    partitioner: Partitioner<K>,
    admitted: Option<Arc<Admitted<K>>>,
    aside: Arc<StoredAside<K>>,
    refused: Arc<Refused<K>>,
}

impl<K: ControllerKey> Gate<K> for ShardGate<K> {
    fn accepts(&self, key: &K, priority: Priority) -> bool {
        let partition = self.partitioner.of(key);
        if self.sharding.owns(partition) {
            return true;
        }
        // C2: goes with the partition's hand-over. (One refused after the
        // hand-over was taken, before the partition's key is deleted, is
        // not in it: the next owner's caches, synced before it joined,
        // bring what changed that late.)
        if self.sharding.giving_up(partition) {
            self.refused.keep(partition, key.clone(), (None, priority));
        }
        false
    }

    fn admit(&self, key: &K) -> Admission {
        let partition = self.partitioner.of(key);
        // Noted before it counts: a partition leaving right after finds it.
        if let Some(admitted) = &self.admitted {
            admitted.0.lock().insert(key.clone(), partition);
        }
        let refused = match self.sharding.admit(partition) {
            ShardAdmission::Run(token) => return Admission::Run(Some(token)),
            ShardAdmission::Later => Admission::Wait,
            ShardAdmission::NotOurs => {
                // C2: a key of a partition being given up goes with it.
                if self.sharding.giving_up(partition) {
                    self.refused.keep(partition, key.clone(), (None, 0));
                }
                Admission::Drop
            }
        };
        if let Some(admitted) = &self.admitted {
            admitted.0.lock().remove(key);
        }
        refused
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
        self.sharding.wait_live(give_up)
    }

    fn wake(&self) {
        self.sharding.wake();
    }

    fn leader_status(&self) -> Option<LeaderStatus> {
        None
    }

    fn shard_status(&self) -> Option<ShardStatus> {
        Some(self.sharding.status())
    }

    fn dropped_at_stop(&self, keys: &[(K, View)]) {
        for (key, view) in keys {
            self.refused.keep(self.partitioner.of(key), key.clone(), *view);
        }
    }

    fn hold_stored(&self, stored: StoredKey<K>) -> Option<StoredKey<K>> {
        // Asked before the lock: `partition_by` is the user's code.
        let partition = self.partitioner.of(&stored.key);
        let mut aside = self.aside.0.lock();
        if self.sharding.owns(partition) {
            return Some(stored);
        }
        aside.entry(partition).or_default().push(stored);
        None
    }
}

/// What sharding calls into the controller.
struct ControllerShards<K: ControllerKey> {
    core: Weak<Core<K>>,
    /// The watches whose caches a gain enqueues from.
    features: Weak<Features<K>>,
    /// Which partitions are ours (its seat drops these hooks: no cycle
    /// outlives the controller's membership).
    sharding: Sharding,
    resync: Option<Resync<K>>,
    partitioner: Partitioner<K>,
    admitted: Option<Arc<Admitted<K>>>,
    aside: Arc<StoredAside<K>>,
    refused: Arc<Refused<K>>,
}

impl<K: ControllerKey> ControllerShards<K> {
    /// Where `key` stands now that `gained` became ours.
    fn fate(&self, key: &K, gained: &BTreeSet<u32>) -> Fate {
        let partition = self.partitioner.of(key);
        if gained.contains(&partition) {
            Fate::Gained
        } else if self.sharding.owns(partition) {
            Fate::Owned
        } else {
            Fate::Elsewhere
        }
    }
}

impl<K: ControllerKey + StoreKey> ShardHooks for ControllerShards<K> {
    /// C1, C2: every key of the gained partitions that a watched cache
    /// maps to (at its watch's `list_priority`), that `resync` lists (at
    /// the list priority, −100), that the last owners handed over (at the
    /// priorities they had there) and that the store kept aside, enqueued
    /// in one batch (U3), so D1 orders them. Runs on sharding's thread
    /// with no engine lock held: it calls `map`, `resync` and
    /// `partition_by`.
    fn gained(&self, partitions: &BTreeSet<u32>) {
        let Some(core) = self.core.upgrade() else { return };
        let features = self.features.upgrade();
        let mut keys =
            features.as_ref().map(|f| f.watches.regain(&|key| self.fate(key, partitions))).unwrap_or_default();
        if let Some(resync) = &self.resync {
            let listed = resync().into_iter().filter(|key| partitions.contains(&self.partitioner.of(key)));
            keys.extend(listed.map(|key| (key, DEFAULT_LIST_PRIORITY)));
        }
        let stored = self.aside.take(partitions);
        if keys.is_empty() && stored.is_empty() {
            return;
        }
        let batch = features.as_ref().map(|f| core.open_batch(&f.batches));
        if let Some(rt) = core.rt.get() {
            // Stored keys exist only once started (the store restores them).
            stored.into_iter().for_each(|key| key.queue(rt));
        }
        for (key, priority) in keys {
            core.route(key, When::Now, priority);
        }
        drop(batch);
    }

    /// C2: the keys the last owners of partitions gained handed over, at
    /// the priorities they had, each after what remained of its delay, in
    /// one batch.
    fn handed_over(&self, handed_over: &[Vec<u8>]) {
        let Some(core) = self.core.upgrade() else { return };
        let handed: Vec<Handed<K>> = handed_over.iter().flat_map(|bytes| handover::decode(&core.name, bytes)).collect();
        let batch = self.features.upgrade().map(|f| core.open_batch(&f.batches));
        let now = Instant::now();
        for (key, priority, delay) in handed {
            core.route(key, if delay.is_zero() { When::Now } else { When::After(delay, now) }, priority);
        }
        drop(batch);
    }

    /// C2: every key pending for these partitions (in the queue, or
    /// refused while they were being given up), encoded by partition.
    /// Their reconciles have returned and none is handed out any more, so
    /// the queue's keys of them stay there until dropped.
    fn hand_over(&self, partitions: &BTreeSet<u32>) -> BTreeMap<u32, Vec<u8>> {
        let Some(core) = self.core.upgrade() else { return BTreeMap::new() };
        let Some(rt) = core.rt.get() else { return BTreeMap::new() };
        let now = rt.clock.now();
        // Asked with no lock held: `partition_by` is the user's code.
        let queued = rt.queue.pending_keys().into_iter().filter_map(|(key, view)| {
            let partition = self.partitioner.of(&key);
            partitions.contains(&partition).then(|| (partition, handover::handed(key, view, now)))
        });
        let mut keys = self.refused.to_hand_over(partitions, now);
        keys.extend(queued);
        handover::encode(&core.name, keys)
    }

    /// C2: stored keys kept aside for these partitions are another
    /// replica's: marked, so the next flush removes their rows; the keys
    /// refused while we gave them up were handed over, or are the owner's.
    fn owned_elsewhere(&self, partitions: &BTreeSet<u32>) {
        self.refused.forget(partitions);
        let dropped = self.aside.take(partitions);
        let Some(core) = self.core.upgrade() else { return };
        if let Some(store) = core.rt.get().and_then(|rt| rt.store.as_ref()) {
            dropped.iter().for_each(|stored| store.mark(&stored.key));
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
