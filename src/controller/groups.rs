//! The controller's `group` option (guarantees §8 P4, P5): turns a user's group
//! function into the small integer ids the queue's fair ready set works
//! with, and back for `in_flight_by_group`.
//!
//! The function is called when a key is enqueued, on the enqueuing thread
//! and with no engine lock held (a Python group function needs the GIL,
//! which a thread holding the queue lock must never wait for). The queue
//! keeps the group a key entered with until the key leaves it, so retries
//! never call it again.
//!
//! Group values are interned for the controller's life: use a bounded set
//! of groups (tenants, namespaces), not one per key. Id 0 is group None:
//! keys whose group function failed (panicked, or raised in Python).

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use crate::logs;
use crate::queue::GroupId;
use crate::sync::Mutex;

type Hasher = foldhash::fast::RandomState;

/// A group function that may fail: `Ok(None)` is group None on purpose,
/// `Err(message)` is a failure (logged once per key).
pub(crate) type GroupFn<K, G> = dyn Fn(&K) -> Result<Option<G>, String> + Send + Sync;

/// What the controller needs of a grouping, whatever its group type.
pub(crate) trait Grouping<K>: Send + Sync {
    /// The id of `key`'s group.
    fn group_of(&self, controller: &str, key: &K) -> GroupId;
    /// For typed read-back in [`in_flight_by_group`](super::ControllerHandle::in_flight_by_group).
    fn as_any(&self) -> &dyn Any;
}

pub(crate) struct GroupTable<K, G> {
    group_fn: Box<GroupFn<K, G>>,
    interned: Mutex<Interned<K, G>>,
}

struct Interned<K, G> {
    ids: HashMap<G, GroupId, Hasher>,
    /// Keys whose group function failed, so each is logged once.
    failed: HashSet<K, Hasher>,
}

impl<K, G> GroupTable<K, G> {
    pub(crate) fn new(group_fn: Box<GroupFn<K, G>>) -> Arc<Self> {
        Arc::new(Self {
            group_fn,
            interned: Mutex::new(Interned { ids: HashMap::default(), failed: HashSet::default() }),
        })
    }
}

impl<K, G> GroupTable<K, G>
where
    G: Eq + Hash + Clone,
{
    /// The group of each id in `counts` (None for id 0), with its count.
    pub(crate) fn name_ids(&self, counts: &[(GroupId, usize)]) -> Vec<(Option<G>, usize)> {
        let interned = self.interned.lock();
        let names: HashMap<GroupId, &G> = interned.ids.iter().map(|(g, id)| (*id, g)).collect();
        counts.iter().map(|(id, n)| (names.get(id).map(|g| (*g).clone()), *n)).collect()
    }
}

impl<K, G> Grouping<K> for GroupTable<K, G>
where
    K: Eq + Hash + Clone + fmt::Debug + Send + Sync + 'static,
    G: Eq + Hash + Clone + Send + Sync + 'static,
{
    fn group_of(&self, controller: &str, key: &K) -> GroupId {
        match (self.group_fn)(key) {
            Ok(Some(group)) => {
                let mut interned = self.interned.lock();
                let next = GroupId::try_from(interned.ids.len() + 1).expect("fewer than 2^32 groups");
                *interned.ids.entry(group).or_insert(next)
            }
            Ok(None) => 0,
            Err(error) => {
                let first = self.interned.lock().failed.insert(key.clone());
                if first {
                    logs::group_failed(controller, key, &error);
                }
                0
            }
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
