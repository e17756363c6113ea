//! The controller's side of the store seam (`crate::store::StoreLink`):
//! what a key is now, putting restored keys back, and `flush()`.

use std::io;
use std::sync::Arc;
use std::time::Instant;

pub(crate) use crate::store::PendingFlush;

use super::core::{ControllerKey, Core, Runtime};
use crate::queue::{Place, Priority};
use crate::store::{Flush, KeySource, KeyView, StoreLink};

impl<K: ControllerKey> Core<K> {
    /// What the store keeps of `key`, given what the queue holds of it.
    fn view(&self, rt: &Runtime<K>, key: &K, queued: Option<(Option<Instant>, Priority)>) -> Option<KeyView> {
        // Asked only of keys that are kept: most keys at a flush are gone.
        let failures = || rt.limiter.num_requeues(key);
        if let Some((error, _)) = self.parked.error_of(key) {
            return Some(KeyView { due: None, parked: Some(error), failures: failures(), priority: 0 });
        }
        // After a stop, the queue still answers for the keys it dropped or
        // whose retry it refused (its stop views).
        queued.map(|(due, priority)| KeyView { due, parked: None, failures: failures(), priority })
    }
}

impl<K: ControllerKey> KeySource<K> for Core<K> {
    fn views(&self, keys: &[K], out: &mut Vec<Option<KeyView>>) {
        let Some(rt) = self.rt.get() else { return out.extend(keys.iter().map(|_| None)) };
        let mut queued = Vec::with_capacity(keys.len());
        rt.queue.pending_views(keys, &mut queued);
        out.extend(keys.iter().zip(queued).map(|(key, queued)| self.view(rt, key, queued)));
    }

    fn dependents_views(&self, out: &mut Vec<(K, Option<KeyView>)>) {
        let Some(rt) = self.rt.get() else { return };
        let mut queued = Vec::new();
        rt.queue.take_dependents_views(&mut queued);
        out.extend(queued.into_iter().map(|(key, queued)| {
            let view = self.view(rt, &key, queued);
            (key, view)
        }));
    }

    fn now(&self) -> Instant {
        self.rt.get().map_or_else(Instant::now, |rt| rt.clock.now())
    }

    /// Asked by the flusher, which runs once started: the queue holds the
    /// edges.
    fn parents(&self, key: &K) -> Vec<K> {
        self.rt.get().map(|rt| rt.queue.dependencies(key)).unwrap_or_default()
    }
}

/// Puts the stored keys back before any worker runs: waiting keys ready,
/// delayed keys at their due time, parked keys parked, failure counts
/// replayed into the limiter and the per-key memory (so back-off and
/// `Context::attempt` continue). A sharded controller's gate keeps aside
/// the keys of partitions not ours yet (C2: see `replicas`).
pub(super) fn restore<K: ControllerKey>(core: &Core<K>, rt: &Runtime<K>, link: &Arc<dyn StoreLink<K>>) {
    link.restore(rt.clock.now(), &mut |key, view| {
        for _ in 0..view.failures {
            rt.limiter.when(&key);
            core.memory.bump(&key, None);
        }
        if let Some(error) = view.parked {
            core.parked.park(key, error);
            return;
        }
        let group = rt.grouping.as_ref().map_or(0, |grouping| grouping.group_of(&core.name, &key));
        let stored = StoredKey { key, place: Place { prio: view.priority, group }, due: view.due };
        let aside = match &rt.coordination {
            Some(coordination) => coordination.gate.hold_stored(stored),
            None => Some(stored),
        };
        if let Some(stored) = aside {
            stored.queue(rt);
        }
    });
}

/// A key the store kept pending, on its way back into the queue.
pub(crate) struct StoredKey<K> {
    pub(crate) key: K,
    pub(crate) place: Place,
    /// When it was due (`None`: ready).
    pub(crate) due: Option<Instant>,
}

impl<K: ControllerKey> StoredKey<K> {
    /// Into the queue as it was stored (never asking the gate: its
    /// partition is ours, or coordination is not sharding).
    pub(crate) fn queue(self, rt: &Runtime<K>) {
        match self.due {
            None => rt.queue.add_placed(self.key, self.place),
            Some(due) => rt.queue.add_at_placed(self.key, due, self.place),
        }
    }
}

/// Asks `core`'s store (if any) for a write of every change so far; an
/// error if the controller was never started.
pub(super) fn ask_flush<K: ControllerKey>(core: &Core<K>) -> io::Result<PendingFlush> {
    let Some(rt) = core.rt.get() else {
        return Err(io::Error::other(format!(
            "controller {:?} was not started: flush() writes what a started controller holds",
            core.name
        )));
    };
    let flushers = rt.store.iter().map(|link| Arc::clone(link) as Arc<dyn Flush>);
    Ok(PendingFlush::ask(flushers))
}
