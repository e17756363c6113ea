//! A cache's changes turned into a controller's enqueues (E2, E6, E7): the
//! predicate, the map, the priority of a list or a live change, the
//! fallback to the changed key when a handler fails, the resync timer, and
//! for a cache with a store (E9) the restart's difference and the rows kept;
//! for a sharded controller, the tombstones and the keys a gain enqueues
//! (C1, see `regain`).
//!
//! Invariant (E9, a delete after a crash): no key a create maps to is
//! enqueued before the store has written the create's trace (`Kept::held`,
//! `StoreLink::after_write`), nor are the later changes of that cache key,
//! which stay behind it in order. Otherwise a reconcile could act on the
//! create, the process die before the key reached the file, and the key's
//! delete while down never be delivered: the restart would not know it.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::options::Watch;
use super::regain::{Fate, Regain, Regained, Tombstones};
use super::restart_set::RestartSet;
use super::watched::{Attached, WatchError};
use crate::cache::{Applied, Cache, Codec, RunCall, SyncedHook, Told, WeakCache};
use crate::clock::{Clock, SystemClock};
use crate::controller::core::{ControllerKey, Core, When, splitmix64};
use crate::logs;
use crate::source::{Source, Stop, in_scope};
use crate::store::{AfterWrite, Flush, KeptChange, KeyRows, StoreLink};
use crate::sync::Mutex;

/// The keys a resync or a gain maps at once: one hold of the GIL for a
/// Python `map`; a resync looks at its stop between two runs.
const MAP_RUN: usize = 256;

/// One watch's handlers, shared by its subscriber (on the cache's thread,
/// or its catch-up thread) and its resync thread.
struct Feed<S: Source, K> {
    /// Weak: the cache holds the subscriber, and must not keep the
    /// controller alive.
    controller: Weak<Core<K>>,
    /// Weak, and the name apart: the cache holds this feed (a cycle
    /// otherwise).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // only sharding gains partitions
    cache: WeakCache<S>,
    cache_name: String,
    watch: Watch<S, K>,
    /// A cache with a store: what the controller keeps of it.
    kept: Option<Kept<S, K>>,
    /// A sharded controller: the deletes of keys it did not own (C1).
    tombstones: Option<Tombstones<S::Key>>,
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
    restart: Mutex<Option<RestartSet>>,
    /// Cache keys (encoded) whose changes wait for a write, and how many:
    /// a create waits for its trace, a later change of that key waits
    /// behind it. Changed only on the delivering thread (adds) and the
    /// flusher (removes).
    held: Mutex<HashMap<Vec<u8>, usize>>,
}

/// What the restart's difference says of a listed key.
enum SinceLastRun {
    /// Kept with the same version: nothing to deliver.
    Unchanged,
    /// Kept (another version, or none): a change of a key the file knows.
    Changed,
    /// Not kept (or the difference is over): new to the file if the cache
    /// did not hold it.
    Unknown,
}

/// An enqueue a change makes: the key, when, at which priority.
type Route<K> = (K, When, i32);

/// Subscribes the controller to `cache`, then acquires it (starting it if
/// it is not running); the returned guard undoes both. Subscribed first,
/// so a cache this starts delivers its first list, or the contents a
/// restart loads, to the controller as it applies them: a restart's
/// deletes while down then reach it from the resumed stream with the
/// object held (E9), and its restart difference is compared in bytes
/// (`Told`). Started first, the cache could apply them before the
/// controller came, which would hear of them as deletes of unknown
/// objects, after a catch-up of every key. Returns at once: the
/// keys a synced cache holds reach the controller on the cache's catch-up
/// thread, and then `caught_up` runs (a watch made at start opens the
/// synced gate with it, E5). `register` is given the feed before it hears
/// of any change (see `regain`'s invariant).
pub(super) fn attach<S: Source, K: ControllerKey>(
    core: &Arc<Core<K>>,
    cache: &Cache<S>,
    watch: Watch<S, K>,
    caught_up: Option<SyncedHook>,
    register: impl FnOnce(Arc<dyn Regain<K>>),
) -> Result<Attached, WatchError> {
    let resync_stop = Stop::new();
    let kept = match (cache.codec(), core.rt.get().and_then(|rt| rt.store.clone())) {
        (Some(codec), Some(link)) => {
            let name: Arc<str> = Arc::from(cache.name());
            let restart = Mutex::new(Some(RestartSet::new(link.take_kept(&name))));
            cache.add_flusher(Arc::downgrade(&(Arc::clone(&link) as Arc<dyn Flush>)));
            if let Some(snapshot) = cache.snapshot() {
                link.keep_snapshot(&snapshot);
            }
            Some(Kept { cache: cache.downgrade(), codec, name, link, restart, held: Mutex::new(HashMap::new()) })
        }
        _ => None,
    };
    let sharded = core.gate().is_some_and(|gate| gate.shard_status().is_some());
    let feed = Arc::new(Feed {
        controller: Arc::downgrade(core),
        cache: cache.downgrade(),
        cache_name: cache.name().to_owned(),
        watch,
        kept,
        tombstones: sharded.then(|| Tombstones::new(&core.name, cache.name())),
    });
    if sharded {
        register(Arc::clone(&feed) as Arc<dyn Regain<K>>);
    }
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
    let told = subscriber.kept.is_some().then(|| {
        let feed = Arc::clone(&subscriber);
        Box::new(move |rows: &KeyRows| match &feed.kept {
            Some(kept) => kept.told_of(rows),
            None => vec![false; rows.len()],
        }) as Told
    });
    // A watch whose handlers run in a scope takes its changes a run at a
    // time (not with a store: which changes reach the handlers is asked
    // of the kept rows change by change).
    let run = (subscriber.watch.scope.is_some() && subscriber.kept.is_none()).then(|| {
        let feed = Arc::clone(&subscriber);
        Box::new(move |changes: &[Applied<S::Key, S::Object>]| Feed::changed_in_a_run(&feed, changes)) as RunCall<_, _>
    });
    let subscription =
        cache.subscribe_then(move |change| Feed::changed(&subscriber, change), run, Some(ready), told)?;
    let used = cache.acquire()?;
    Ok(Attached { _subscription: subscription, _use: used, resync_stop })
}

impl<S: Source, K: ControllerKey> Feed<S, K> {
    /// A change the cache applied: enqueue what `map` says, if the
    /// predicate accepts it. With a store, a create's enqueues wait for
    /// its trace to be written, and a held key's changes wait behind it.
    fn changed(self: &Arc<Self>, change: &Applied<S::Key, S::Object>) {
        let Some(core) = self.controller.upgrade() else { return };
        if let (Some(tombstones), None) = (&self.tombstones, &change.new) {
            tombstones.deleting(&change.key);
        }
        let Some(kept) = &self.kept else { return self.deliver_now(&core, change) };
        let key = (kept.codec.key)(&change.key);
        let created = match kept.since_last_run(&key, change) {
            SinceLastRun::Unchanged => return,
            SinceLastRun::Changed => false,
            SinceLastRun::Unknown => change.old.is_none() && change.new.is_some(),
        };
        let Some(told) = kept.row(&change.key, change.new.is_some()) else { return };
        // Only this (delivering) thread adds to `held`: a key not held now
        // is not held until it returns.
        if !created && !kept.held.lock().contains_key(&key) {
            self.deliver_now(&core, change);
            return kept.mark(&core, key, told);
        }
        let routes = self.answers(&core, change);
        *kept.held.lock().entry(key.clone()).or_default() += 1;
        let trace = created.then(|| (&kept.name, key.clone()));
        let deleted = change.new.is_none().then(|| change.key.clone());
        kept.link.after_write(trace, self.release(routes, deleted, key, told));
    }

    /// Changes in a row of a watch without a store whose handlers run in
    /// a scope (Python's: one hold of the GIL for the run, not one per
    /// call): first what the handlers answer for each, inside the scope,
    /// where no engine lock is taken (a thread holding one may wait for
    /// the GIL), then each change's enqueues in order, as
    /// [`changed`](Self::changed) makes them.
    fn changed_in_a_run(self: &Arc<Self>, changes: &[Applied<S::Key, S::Object>]) {
        let Some(core) = self.controller.upgrade() else { return };
        let answers: Vec<_> =
            in_scope(self.watch.scope.as_ref(), || changes.iter().map(|change| self.answers(&core, change)).collect());
        for (change, routes) in changes.iter().zip(answers) {
            if let (Some(tombstones), None) = (&self.tombstones, &change.new) {
                tombstones.deleting(&change.key);
            }
            self.route_answered(&core, change, routes);
        }
    }

    /// Delivers `change` straight into the queue; then a put, or a delete
    /// whose keys all went into it, leaves no tombstone.
    fn deliver_now(&self, core: &Core<K>, change: &Applied<S::Key, S::Object>) {
        if self.tombstones.is_none() {
            return self.deliver(core, change, route_to(core));
        }
        self.route_answered(core, change, self.answers(core, change));
    }

    /// What `change`'s handlers answer, kept to be routed later.
    fn answers(&self, core: &Core<K>, change: &Applied<S::Key, S::Object>) -> Vec<Route<K>> {
        let mut routes = Vec::new();
        self.deliver(core, change, |route| routes.push(route));
        routes
    }

    /// Enqueues `routes`, what `change`'s handlers answered; then a put,
    /// or a delete whose keys all went into the queue, leaves no tombstone.
    fn route_answered(&self, core: &Core<K>, change: &Applied<S::Key, S::Object>, routes: Vec<Route<K>>) {
        let mut all_ours = true;
        for (key, when, priority) in routes {
            all_ours &= core.route(key, when, priority);
        }
        if let Some(tombstones) = &self.tombstones
            && (change.new.is_some() || all_ours)
        {
            tombstones.settled(&change.key);
        }
    }

    /// What runs once the write a held change waits for is done: its
    /// enqueues, then its row (after them, as always), then the key is
    /// one change less held (last: a change delivered directly after
    /// that marks its row after this one, and the later row wins).
    /// `deleted`: the cache key of a delete, whose tombstone (if any) goes
    /// once its keys all went into the queue.
    fn release(
        self: &Arc<Self>,
        routes: Vec<Route<K>>,
        deleted: Option<S::Key>,
        key: Vec<u8>,
        told: KeptChange,
    ) -> AfterWrite {
        let feed = Arc::downgrade(self);
        Box::new(move || {
            let Some(feed) = feed.upgrade() else { return };
            let (Some(core), Some(kept)) = (feed.controller.upgrade(), &feed.kept) else { return };
            let mut all_ours = true;
            for (key, when, priority) in routes {
                all_ours &= core.route(key, when, priority);
            }
            if let (Some(tombstones), Some(deleted)) = (&feed.tombstones, deleted.filter(|_| all_ours)) {
                tombstones.settled(&deleted);
            }
            kept.mark(&core, key.clone(), told);
            let mut held = kept.held.lock();
            if let Some(count) = held.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    held.remove(&key);
                }
            }
        })
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
                if let Some(tombstones) = &self.tombstones {
                    tombstones.deleting(&change.key);
                }
                self.deliver_now(&core, &change);
            }
            kept.mark(&core, key, KeptChange::Delete);
        }
    }

    /// Enqueues what the change maps to, if the predicate accepts it,
    /// through `route`: for a put that replaced an object, what the old one
    /// maps to and what the new one does (controller-runtime's mapped
    /// handlers: a child that changed owners reaches both).
    fn deliver(&self, core: &Core<K>, change: &Applied<S::Key, S::Object>, mut route: impl FnMut(Route<K>)) {
        let priority = if change.listed { self.watch.list_priority } else { self.watch.priority };
        let (old, new) = (change.old.as_deref(), change.new.as_deref());
        let accepted = match &self.watch.predicate {
            // Every delete; a put only if the object changed.
            None => new.is_none() || old != new,
            Some(predicate) => match predicate(old, new) {
                Ok(accepted) => accepted,
                Err(error) => {
                    return route(self.failed(core, "predicate", &change.key, &error, When::Event, priority));
                }
            },
        };
        if !accepted {
            return;
        }
        match (old, new) {
            (Some(old), Some(new)) => {
                self.enqueue(core, &change.key, &[Some(old), Some(new)], When::Event, priority, route)
            }
            (old, new) => self.enqueue(core, &change.key, &[new.or(old)], When::Event, priority, route),
        }
    }

    /// Enqueues through `route` the keys `map` gives for `key` holding each
    /// of `objects` in turn (`None`: deleted), each key once. `when`:
    /// `Event` for a change (debounced, U2), `Now` for a resync.
    fn enqueue(
        &self,
        core: &Core<K>,
        key: &S::Key,
        objects: &[Option<&S::Object>],
        when: When,
        priority: i32,
        mut route: impl FnMut(Route<K>),
    ) {
        // Only an update maps twice: one object needs no set.
        let mut routed = HashSet::new();
        for &obj in objects {
            match (self.watch.map)(key, obj) {
                Ok(keys) => {
                    for key in keys {
                        if objects.len() == 1 || routed.insert(key.clone()) {
                            route((key, when, priority));
                        }
                    }
                }
                Err(error) => route(self.failed(core, "map", key, &error, when, priority)),
            }
        }
    }

    /// A handler failed: logged, counted, and the changed key itself
    /// enqueued (missing a change is worse than one reconcile too many):
    /// the enqueue to make.
    fn failed(&self, core: &Core<K>, handler: &str, key: &S::Key, error: &str, when: When, priority: i32) -> Route<K> {
        logs::watch_handler_failed(&core.name, &self.cache_name, handler, key, error);
        core.counters.handler_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ((self.watch.fallback)(key), when, priority)
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
        let clock: Arc<dyn Clock> =
            core.rt.get().map_or_else(|| Arc::new(SystemClock) as _, |rt| Arc::clone(&rt.clock));
        if let Err(e) = core.try_spawn_aux(name, move |_| feed.resync_until(&cache, every, &*clock, &stop)) {
            logs::watch_resync_unavailable(&core.name, &self.cache_name, &e.to_string());
        }
    }

    /// Every `every` (±10%) on the controller's `clock` until `stop`:
    /// every cached key through `map`, at the list priority (E7).
    fn resync_until(&self, cache: &Cache<S>, every: Duration, clock: &dyn Clock, stop: &Stop) {
        let mut seed = RandomState::new().hash_one(&self.cache_name);
        loop {
            seed = splitmix64(seed);
            let unit = (seed >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
            if stop.wait_until(clock, clock.now() + every.mul_f64(0.9 + 0.2 * unit)) {
                return;
            }
            let Some(core) = self.controller.upgrade() else { return };
            for run in cache.keys().chunks(MAP_RUN) {
                if stop.is_set() {
                    return;
                }
                let answers = self.map_run(&core, run, &objects_of(cache, run), self.watch.list_priority);
                answers.into_iter().flatten().for_each(route_to(&core));
            }
        }
    }

    /// What `map` answers for each of `keys` holding `objects` (`None`:
    /// deleted), asked inside the watch's scope (one hold of the GIL for
    /// a Python `map`): the enqueues to make, key by key. No engine lock
    /// is taken inside, so the cache was read before.
    fn map_run(
        &self,
        core: &Core<K>,
        keys: &[S::Key],
        objects: &[Option<Arc<S::Object>>],
        priority: i32,
    ) -> Vec<Vec<Route<K>>> {
        in_scope(self.watch.scope.as_ref(), || {
            let answer = |(key, obj): (&S::Key, &Option<Arc<S::Object>>)| {
                let mut routes = Vec::new();
                self.enqueue(core, key, &[obj.as_deref()], When::Now, priority, |route| routes.push(route));
                routes
            };
            keys.iter().zip(objects).map(answer).collect()
        })
    }
}

/// What `cache` holds of each of `keys` now.
fn objects_of<S: Source>(cache: &Cache<S>, keys: &[S::Key]) -> Vec<Option<Arc<S::Object>>> {
    keys.iter().map(|key| cache.get(key)).collect()
}

impl<S: Source, K: ControllerKey> Kept<S, K> {
    /// During the restart's difference: whether `change` of `key`
    /// (encoded; a listed key) is one the controller was told of at the
    /// last run, with the same version (a key without a version kept
    /// always counts as changed).
    fn since_last_run(&self, key: &[u8], change: &Applied<S::Key, S::Object>) -> SinceLastRun {
        let mut restart = self.restart.lock();
        let Some(kept) = restart.as_mut() else { return SinceLastRun::Unknown };
        let Some(before) = kept.remove(key) else { return SinceLastRun::Unknown };
        drop(restart);
        let unchanged = change.new.is_some()
            && before.is_some()
            && self.cache.upgrade().is_some_and(|cache| cache.kept_version(&change.key) == before);
        if unchanged { SinceLastRun::Unchanged } else { SinceLastRun::Changed }
    }

    /// During the restart's difference, for the rows the cache loaded
    /// from its store (encoded, in key order): which were told at the last
    /// run at exactly the version loaded. Those are unchanged, as
    /// `since_last_run` would find them, and out of the difference now.
    fn told_of(&self, rows: &KeyRows) -> Vec<bool> {
        match self.restart.lock().as_mut() {
            Some(kept) => kept.told_of(rows),
            None => vec![false; rows.len()],
        }
    }

    /// The row that keeps the change to `key` (`present`: a put) the
    /// cache just applied; `None` once the cache is gone.
    fn row(&self, key: &S::Key, present: bool) -> Option<KeptChange> {
        match (present, self.cache.upgrade()) {
            (false, _) => Some(KeptChange::Delete),
            (true, Some(cache)) => Some(KeptChange::Put(cache.kept_version(key))),
            (true, None) => None,
        }
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

impl<S: Source, K: ControllerKey> Regain<K> for Feed<S, K> {
    fn regain(&self, fate: &dyn Fn(&K) -> Fate, out: &mut Vec<Regained<K>>) {
        let (Some(core), Some(cache)) = (self.controller.upgrade(), self.cache.upgrade()) else { return };
        let priority = self.watch.list_priority;
        // Each run's fates after its answers: `fate` asks sharding's lock.
        for run in cache.keys().chunks(MAP_RUN) {
            for (key, _, priority) in self.map_run(&core, run, &objects_of(&cache, run), priority).into_iter().flatten()
            {
                if fate(&key) == Fate::Gained {
                    out.push((key, priority));
                }
            }
        }
        let Some(tombstones) = &self.tombstones else { return };
        for run in tombstones.keys().chunks(MAP_RUN) {
            let answers = self.map_run(&core, run, &vec![None; run.len()], priority);
            for (deleted, routes) in run.iter().zip(answers) {
                let mut all_ours = true;
                for (key, _, priority) in routes {
                    match fate(&key) {
                        Fate::Gained => out.push((key, priority)),
                        Fate::Owned => {}
                        Fate::Elsewhere => all_ours = false,
                    }
                }
                // Enqueued by us, the owner of every key it maps to.
                if all_ours {
                    tombstones.settled(deleted);
                }
            }
        }
    }
}

/// The plain `route`: straight into the controller's queue.
fn route_to<K: ControllerKey>(core: &Core<K>) -> impl FnMut(Route<K>) + '_ {
    |(key, when, priority)| {
        core.route(key, when, priority);
    }
}
