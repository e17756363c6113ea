//! A cache's changes turned into a controller's enqueues (E2, E6, E7): the
//! predicate, the map, the priority of a list or a live change, the
//! fallback to the changed key when a handler fails, the resync timer, and
//! for a cache with a store (E9) the restart's difference and the rows kept.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Attached, Watch, WatchError};
use crate::cache::{Applied, Cache, Codec, SyncedHook, WeakCache};
use crate::controller::{ControllerKey, Core, When, splitmix64};
use crate::logs;
use crate::source::{Source, Stop};
use crate::store::{Flush, KeptChange, KeptSet, StoreLink};
use crate::sync::Mutex;

/// One watch's handlers, shared by its subscriber (on the cache's thread,
/// or its catch-up thread) and its resync thread.
struct Feed<S: Source, K> {
    /// Weak: the cache holds the subscriber, and must not keep the
    /// controller alive.
    controller: Weak<Core<K>>,
    /// Only the name: the cache holds this feed (a cycle otherwise).
    cache_name: String,
    watch: Watch<S, K>,
    /// A cache with a store: what the controller keeps of it.
    kept: Option<Kept<S, K>>,
}

/// A stored cache as one watching controller keeps it (E9).
struct Kept<S: Source, K> {
    /// Weak, as `controller`: the cache holds this feed.
    cache: WeakCache<S>,
    codec: Codec<S>,
    name: Arc<str>,
    link: Arc<dyn StoreLink<K>>,
    /// The key set kept at the last run, until the cache's first list (or
    /// its replay) has reached this feed: the restart's difference.
    restart: Mutex<Option<KeptSet>>,
}

/// Acquires `cache` (starting it if it is not running) and subscribes the
/// controller to it; the returned guard undoes both. Returns at once: the
/// keys a synced cache holds reach the controller on the cache's catch-up
/// thread, and then `caught_up` runs (a watch made at start opens the
/// synced gate with it, E5).
pub(super) fn attach<S: Source, K: ControllerKey>(
    core: &Arc<Core<K>>,
    cache: &Cache<S>,
    watch: Watch<S, K>,
    caught_up: Option<SyncedHook>,
) -> Result<Attached, WatchError> {
    let used = cache.acquire()?;
    let resync_stop = Stop::new();
    let kept = match (cache.codec(), core.rt.get().and_then(|rt| rt.store.clone())) {
        (Some(codec), Some(link)) => {
            let name: Arc<str> = Arc::from(cache.name());
            let restart = Mutex::new(Some(link.take_kept(&name)));
            cache.add_flusher(Arc::downgrade(&(Arc::clone(&link) as Arc<dyn Flush>)));
            Some(Kept { cache: cache.downgrade(), codec, name, link, restart })
        }
        _ => None,
    };
    let feed = Arc::new(Feed { controller: Arc::downgrade(core), cache_name: cache.name().to_owned(), watch, kept });
    if let Some(every) = feed.watch.resync {
        // The hook's clone of the cache goes when it runs, or when the
        // cache stops unsynced.
        let (feed, cache, stop) = (Arc::clone(&feed), cache.clone(), resync_stop.clone());
        cache.clone().on_synced(move || feed.start_resync(cache, every, stop));
    }
    let subscriber = Arc::clone(&feed);
    // Once every key the cache holds has reached the feed, before any later
    // change does: the restart's deletes, then the caller's hook.
    let ready: SyncedHook = Box::new(move || {
        feed.restart_deletes();
        if let Some(hook) = caught_up {
            hook();
        }
    });
    let subscription = cache.subscribe_then(move |change| subscriber.changed(change), Some(ready))?;
    Ok(Attached { _subscription: subscription, _use: used, resync_stop })
}

impl<S: Source, K: ControllerKey> Feed<S, K> {
    /// A change the cache applied: enqueue what `map` says, if the
    /// predicate accepts it.
    fn changed(&self, change: &Applied<S::Key, S::Object>) {
        let Some(core) = self.controller.upgrade() else { return };
        let Some(kept) = &self.kept else { return self.deliver(&core, change) };
        if kept.unchanged_since_last_run(change) {
            return;
        }
        self.deliver(&core, change);
        kept.told(&core, &change.key, change.new.is_some());
    }

    /// The keys kept at the last run that the first list did not have:
    /// deleted while the program was down. Each reaches `predicate` and
    /// `map` as a delete of a key whose last state is unknown (`None`:
    /// the store keeps versions, not objects).
    fn restart_deletes(&self) {
        let Some(kept) = &self.kept else { return };
        let Some(gone) = kept.restart.lock().take() else { return };
        let Some(core) = self.controller.upgrade() else { return };
        for key in gone.into_keys() {
            // A key of another shape (another program wrote it) is dropped
            // with its row.
            if let Some(decoded) = (kept.codec.decode)(&key) {
                let change = Applied { key: decoded, old: None, new: None, listed: true };
                self.deliver(&core, &change);
            }
            kept.mark(&core, key, KeptChange::Delete);
        }
    }

    /// Enqueues what the change maps to, if the predicate accepts it: for
    /// a put that replaced an object, what the old one maps to and what
    /// the new one does (controller-runtime's mapped handlers: a child
    /// that changed owners reaches both).
    fn deliver(&self, core: &Core<K>, change: &Applied<S::Key, S::Object>) {
        let priority = if change.listed { self.watch.list_priority } else { self.watch.priority };
        let (old, new) = (change.old.as_deref(), change.new.as_deref());
        let accepted = match &self.watch.predicate {
            // Every delete; a put only if the object changed.
            None => new.is_none() || old != new,
            Some(predicate) => match predicate(old, new) {
                Ok(accepted) => accepted,
                Err(error) => return self.failed(core, "predicate", &change.key, &error, When::Event, priority),
            },
        };
        if !accepted {
            return;
        }
        match (old, new) {
            (Some(old), Some(new)) => self.enqueue_both(core, &change.key, [old, new], priority),
            (old, new) => self.enqueue(core, &change.key, new.or(old), When::Event, priority),
        }
    }

    /// Enqueues the keys `map` gives for `key` (holding `obj`).
    /// `when`: `Event` for a change (debounced, U2), `Now` for a resync.
    fn enqueue(&self, core: &Core<K>, key: &S::Key, obj: Option<&S::Object>, when: When, priority: i32) {
        for key in self.mapped(core, key, obj, when, priority) {
            core.route(key, when, priority);
        }
    }

    /// Enqueues, once each, the keys `map` gives for `key`'s old object
    /// and for its new one, mapped in turn.
    fn enqueue_both(&self, core: &Core<K>, key: &S::Key, [old, new]: [&S::Object; 2], priority: i32) {
        let mut keys = self.mapped(core, key, Some(old), When::Event, priority);
        let from_old: HashSet<&K> = keys.iter().collect();
        let from_new = self.mapped(core, key, Some(new), When::Event, priority);
        let only_new: Vec<K> = from_new.into_iter().filter(|k| !from_old.contains(k)).collect();
        keys.extend(only_new);
        for key in keys {
            core.route(key, When::Event, priority);
        }
    }

    /// The keys `map` gives for `key` holding `obj`; none when it failed
    /// (then the changed key itself was enqueued).
    fn mapped(&self, core: &Core<K>, key: &S::Key, obj: Option<&S::Object>, when: When, priority: i32) -> Vec<K> {
        (self.watch.map)(key, obj).unwrap_or_else(|error| {
            self.failed(core, "map", key, &error, when, priority);
            Vec::new()
        })
    }

    /// A handler failed: logged, counted, and the changed key itself
    /// enqueued (missing a change is worse than one reconcile too many).
    fn failed(&self, core: &Core<K>, handler: &str, key: &S::Key, error: &str, when: When, priority: i32) {
        logs::watch_handler_failed(&core.name, &self.cache_name, handler, key, error);
        core.watches.count_handler_error();
        core.route((self.watch.fallback)(key), when, priority);
    }

    /// Starts the resync thread (the cache just synced), unless the watch
    /// has ended.
    fn start_resync(self: Arc<Self>, cache: Cache<S>, every: Duration, stop: Stop) {
        let Some(core) = self.controller.upgrade() else { return };
        if stop.is_set() {
            return;
        }
        let name = format!("reconq-{}-resync", core.name);
        let feed = Arc::clone(&self);
        if let Err(e) = core.try_spawn_aux(name, move |_| feed.resync_until(&cache, every, &stop)) {
            logs::watch_resync_unavailable(&core.name, &self.cache_name, &e.to_string());
        }
    }

    /// Every `every` (±10%) until `stop`: every cached key through `map`,
    /// at the list priority (E7).
    fn resync_until(&self, cache: &Cache<S>, every: Duration, stop: &Stop) {
        let mut seed = RandomState::new().hash_one(&self.cache_name);
        loop {
            seed = splitmix64(seed);
            let unit = (seed >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
            if stop.wait_timeout(every.mul_f64(0.9 + 0.2 * unit)) {
                return;
            }
            let Some(core) = self.controller.upgrade() else { return };
            for key in cache.keys() {
                let obj = cache.get(&key);
                self.enqueue(&core, &key, obj.as_deref(), When::Now, self.watch.list_priority);
            }
        }
    }
}

impl<S: Source, K: ControllerKey> Kept<S, K> {
    /// During the restart's difference: whether `change` (a listed key)
    /// is one the controller was told of at the last run, with the same
    /// version (a key without a version kept always counts as changed).
    fn unchanged_since_last_run(&self, change: &Applied<S::Key, S::Object>) -> bool {
        let mut restart = self.restart.lock();
        let Some(kept) = restart.as_mut() else { return false };
        let Some(before) = kept.remove(&(self.codec.key)(&change.key)) else { return false };
        drop(restart);
        let Some(cache) = self.cache.upgrade() else { return false };
        change.new.is_some() && before.is_some() && cache.kept_version(&change.key) == before
    }

    /// The controller was told of the change to `key` (`present`: a put):
    /// kept at its next flush.
    fn told(&self, core: &Core<K>, key: &S::Key, present: bool) {
        let change = match (present, self.cache.upgrade()) {
            (false, _) => KeptChange::Delete,
            (true, Some(cache)) => KeptChange::Put(cache.kept_version(key)),
            (true, None) => return,
        };
        self.mark(core, (self.codec.key)(key), change);
    }

    /// Marks a row, after the enqueues of its change, unless the
    /// controller is stopping: an enqueue then may have been dropped, and
    /// a kept row must never claim a change no controller recorded.
    fn mark(&self, core: &Core<K>, key: Vec<u8>, change: KeptChange) {
        if core.life.is_stopping() {
            return;
        }
        let position = self.cache.upgrade().and_then(|cache| cache.kept_position());
        self.link.mark_cache(&self.name, key, change, position);
    }
}
