//! Controllers watching caches (docs/sources.md, E2, E5–E7): every change
//! reconciled after the cache holds it, the synced gate, map and predicate
//! with their defaults and failures, priorities and resync, and a cache
//! shared by controllers. Sources live in memory (a system the test
//! changes, breaks and holds back); `watch_cache_etcd.rs` has etcd's.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::ThreadId;
use std::time::Duration;

use common::{Gate, PATIENCE, ms, wait_for};
use parking_lot::{Condvar, Mutex};
use reconq::source::{Changes, Event, Item, Listing, Stop};
use reconq::{
    Action, Cache, CacheError, Context, Controller, ControllerHandle, ReconcileError, Source, SourceError, Watch,
    WatchError,
};

/// A system in memory: items with revisions and their history, a list
/// that can be held back or made to fail, and a stream that can be cut.
#[derive(Default)]
struct System {
    items: BTreeMap<String, (u64, u64)>,
    revision: u64,
    history: Vec<(u64, String, Option<u64>)>,
    /// Lists wait while set.
    list_held: bool,
    /// Held lists wait even once their stop is set (a source that does
    /// not heed it).
    list_deaf: bool,
    /// Lists begun.
    lists: u64,
    /// Lists fail with this while set.
    list_error: Option<String>,
    /// Streams fail (a break) while set; the cache resumes afterwards.
    down: bool,
    /// Bumped to end the streams open now.
    cuts: u64,
    /// The streams cut end as expired (the cache relists).
    expire: bool,
}

#[derive(Clone, Default)]
struct Memory(Arc<(Mutex<System>, Condvar)>);

impl Memory {
    fn change<T>(&self, f: impl FnOnce(&mut System) -> T) -> T {
        let (system, cv) = &*self.0;
        let out = f(&mut system.lock());
        cv.notify_all();
        out
    }

    fn put(&self, key: &str, value: u64) {
        self.change(|s| {
            s.revision += 1;
            s.items.insert(key.to_owned(), (value, s.revision));
            s.history.push((s.revision, key.to_owned(), Some(value)));
        });
    }

    fn delete(&self, key: &str) {
        self.change(|s| {
            if s.items.remove(key).is_some() {
                s.revision += 1;
                s.history.push((s.revision, key.to_owned(), None));
            }
        });
    }

    /// Ends the open streams as expired: the cache relists.
    fn expire(&self) {
        self.change(|s| {
            s.cuts += 1;
            s.expire = true;
        });
    }

    fn hold_lists(&self, held: bool) {
        self.change(|s| s.list_held = held);
    }

    fn source(&self) -> MemorySource {
        MemorySource(self.clone())
    }
}

struct MemorySource(Memory);

impl Source for MemorySource {
    type Key = String;
    type Object = u64;
    type Position = u64;
    type Version = u64;

    fn list(&mut self, stop: &Stop) -> Result<Listing<String, u64, u64, u64>, SourceError> {
        let (system, cv) = &*(self.0).0;
        let mut s = system.lock();
        s.lists += 1;
        while s.list_held && (s.list_deaf || !stop.is_set()) {
            cv.wait_for(&mut s, Duration::from_millis(20));
        }
        if let Some(error) = &s.list_error {
            return Err(SourceError::new(error.clone()));
        }
        let items = s.items.iter().map(|(k, (v, rev))| Item { key: k.clone(), obj: *v, version: Some(*rev) });
        Ok(Listing { items: items.collect(), position: Some(s.revision) })
    }

    fn changes(&mut self, from: Option<&u64>, stop: &Stop) -> Result<Changes<'_, Self>, SourceError> {
        let memory = self.0.clone();
        let stop = stop.clone();
        let mut at = *from.expect("a source with positions");
        let cuts = memory.0.0.lock().cuts;
        Ok(Box::new(std::iter::from_fn(move || {
            let (system, cv) = &*memory.0;
            let mut s = system.lock();
            loop {
                if stop.is_set() {
                    return None;
                }
                if s.cuts != cuts && s.expire {
                    return Some(Err(SourceError::expired("position gone")));
                }
                if s.down || s.cuts != cuts {
                    return Some(Err(SourceError::new("stream down")));
                }
                if let Some((rev, key, value)) = s.history.iter().find(|(rev, ..)| *rev > at).cloned() {
                    at = rev;
                    return Some(Ok(match value {
                        Some(obj) => Event::Put { key, obj, position: Some(rev), version: Some(rev) },
                        None => Event::Delete { key, position: Some(rev) },
                    }));
                }
                cv.wait_for(&mut s, Duration::from_millis(20));
            }
        })))
    }
}

/// Every log record of this test binary, as "LEVEL message" (the engine
/// logs through `log` when no `tracing` subscriber is set).
fn log_lines() -> &'static Mutex<Vec<String>> {
    static LINES: OnceLock<&'static Mutex<Vec<String>>> = OnceLock::new();
    LINES.get_or_init(|| {
        struct Capture(&'static Mutex<Vec<String>>);
        impl log::Log for Capture {
            fn enabled(&self, _: &log::Metadata<'_>) -> bool {
                true
            }
            fn log(&self, record: &log::Record<'_>) {
                self.0.lock().push(format!("{} {}", record.level(), record.args()));
            }
            fn flush(&self) {}
        }
        let lines: &'static Mutex<Vec<String>> = Box::leak(Box::default());
        log::set_logger(Box::leak(Box::new(Capture(lines)))).unwrap();
        log::set_max_level(log::LevelFilter::Info);
        lines
    })
}

fn logged(all: &[&str]) -> bool {
    log_lines().lock().iter().any(|line| all.iter().all(|part| line.contains(part)))
}

/// What a controller's reconciles saw: (key, the cache's object for it
/// then, the reconcile's priority, whether the cache was synced).
type Seen = Arc<Mutex<Vec<(String, Option<u64>, i32, bool)>>>;

fn recording(
    cache: &Cache<MemorySource>,
) -> (Seen, impl Fn(&String, &Context) -> Result<Action, ReconcileError> + Send + Sync + 'static) {
    let seen: Seen = Arc::default();
    let (log, cache) = (Arc::clone(&seen), cache.clone());
    let reconcile = move |key: &String, ctx: &Context| {
        log.lock().push((key.clone(), cache.get(key).as_deref().copied(), ctx.priority(), cache.synced()));
        Ok(Action::Done)
    };
    (seen, reconcile)
}

fn saw(seen: &Seen, key: &str, value: Option<u64>) -> bool {
    seen.lock().iter().any(|(k, v, ..)| k == key && *v == value)
}

fn reconciles_of(seen: &Seen, key: &str) -> usize {
    seen.lock().iter().filter(|(k, ..)| k == key).count()
}

fn cache_of(memory: &Memory, name: &str) -> Cache<MemorySource> {
    Cache::builder(name, memory.source()).build().unwrap()
}

/// A cache of `memory` and a controller (not started, watching nothing
/// yet) recording its reconciles, both named `name`.
fn recorded(memory: &Memory, name: &str) -> (Cache<MemorySource>, Seen, Controller<String>) {
    let cache = cache_of(memory, name);
    let (seen, reconcile) = recording(&cache);
    (cache, seen, Controller::from_fn(name, reconcile))
}

/// `workqueue_adds_total` of controller `name`: a worker that the synced
/// gate makes put a key back adds it again.
fn queue_adds(name: &str) -> u64 {
    let prefix = format!("workqueue_adds_total{{name=\"{name}\",controller=\"{name}\"}} ");
    let text = reconq::metrics::render();
    text.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0, |n| n.parse().unwrap())
}

/// E2: every put, change and delete is reconciled after the cache holds it,
/// and the reconcile reads that state or a newer one; deletes made while
/// the stream was down arrive as deletes when it resumes.
/// Checked by mutation: subscribing before the cache applies the change
/// (a reconcile reading the old value) and dropping deletes in the feed
/// both fail it.
#[test]
fn every_change_is_reconciled_after_the_cache_holds_it() {
    let memory = Memory::default();
    memory.put("a", 1);
    memory.put("gone", 1);
    let (cache, seen, controller) = recorded(&memory, "e2");
    let handle = controller.watch_cache(&cache, Watch::new()).start();
    assert!(handle.wait_synced(Some(PATIENCE)));
    wait_for("the listed keys", || saw(&seen, "a", Some(1)) && saw(&seen, "gone", Some(1)));
    for value in 2..=20 {
        memory.put("a", value);
        memory.put("b", value);
    }
    wait_for("the last values", || saw(&seen, "a", Some(20)) && saw(&seen, "b", Some(20)));
    // Values only grow: a reconcile after a put never reads an older one.
    let seen_values: Vec<(String, Option<u64>)> = seen.lock().iter().map(|(k, v, ..)| (k.clone(), *v)).collect();
    let last_a = seen_values.iter().rposition(|(k, _)| k == "a").unwrap();
    assert_eq!(seen_values[last_a].1, Some(20), "the last reconcile of a read its last value");

    memory.change(|s| s.down = true);
    wait_for("the break noticed", || cache.stats().errors >= 1);
    memory.delete("gone");
    memory.change(|s| s.down = false);
    wait_for("the delete made while down", || saw(&seen, "gone", None));
    assert_eq!(cache.stats().relists, 0, "resumed, not relisted");
    handle.stop();
}

/// E5: no key is handed out before the cache watched at start synced; keys
/// enqueued before are kept, and reconciled once it has.
/// Checked by mutation: `SyncedGate::admit` always `Run` fails it (the key
/// is reconciled before the list is let through).
#[test]
fn the_synced_gate_holds_keys_until_the_first_list_and_keeps_them() {
    let memory = Memory::default();
    memory.put("listed", 1);
    memory.hold_lists(true);
    let (cache, seen, controller) = recorded(&memory, "e5-gate");
    let handle = controller.workers(2).watch_cache(&cache, Watch::new()).start();
    handle.enqueue("early".to_string());
    // The key was handed out and put back (a second add), or reconciled.
    wait_for("the early key handed out", || queue_adds("e5-gate") >= 2 || !seen.lock().is_empty());
    let early = seen.lock().clone();
    assert!(early.is_empty(), "reconciled before the cache synced: {early:?}");
    assert!(!handle.wait_synced(Some(ms(1))));
    memory.hold_lists(false);
    assert!(handle.wait_synced(Some(PATIENCE)));
    wait_for("both keys", || reconciles_of(&seen, "early") == 1 && reconciles_of(&seen, "listed") == 1);
    assert!(seen.lock().iter().all(|(.., synced)| *synced), "every reconcile after sync");
    handle.stop();
}

/// E5: a stop before sync reconciles nothing the gate holds, with or
/// without a drain. Checked by mutation: a gate whose `wait` returns true
/// on stop (so the worker takes the key again) fails it.
#[test]
fn a_stop_before_sync_reconciles_nothing() {
    for drain in [false, true] {
        let memory = Memory::default();
        memory.hold_lists(true);
        let name = format!("e5-stop-{drain}");
        let (cache, seen, controller) = recorded(&memory, name.as_str());
        let handle = controller.watch_cache(&cache, Watch::new()).start();
        handle.enqueue("early".to_string());
        wait_for("the early key handed out", || queue_adds(&name) >= 2 || !seen.lock().is_empty());
        if drain {
            let report = handle.stop_with_drain_report(PATIENCE);
            assert!(report.finished);
            assert_eq!(report.dropped, ["early".to_string()], "the held key is dropped, not reconciled");
        } else {
            handle.stop();
            assert!(handle.join_timeout(PATIENCE));
        }
        let at_stop = seen.lock().clone();
        assert!(at_stop.is_empty(), "reconciled at stop: {at_stop:?}");
        assert_eq!(handle.stats().reconciles, 0);
    }
}

/// A source that does not heed its stop holds neither a controller's stop
/// with a deadline nor `Cache::stop_timeout`: both return by their
/// deadline, the stop naming the cache it left behind, whose thread exits
/// once the source returns, having applied nothing.
#[test]
fn a_stop_returns_by_its_deadline_past_a_source_that_ignores_its_stop() {
    let memory = Memory::default();
    memory.put("a", 1);
    memory.change(|s| {
        s.list_held = true;
        s.list_deaf = true;
    });
    let (cache, seen, controller) = recorded(&memory, "deaf");
    let handle = controller.watch_cache(&cache, Watch::new()).start();
    wait_for("the list to begin", || memory.change(|s| s.lists) >= 1);

    let started = std::time::Instant::now();
    let report = handle.stop_with_drain_report(ms(300));
    assert!(started.elapsed() < PATIENCE, "the stop took {:?}", started.elapsed());
    assert!(report.finished);
    assert_eq!(report.unfinished_caches, ["deaf".to_string()]);
    assert!(!cache.stop_timeout(ms(50)), "still in the source");

    memory.hold_lists(false);
    assert!(cache.stop_timeout(PATIENCE), "the thread exits once the source returns");
    assert!(!cache.synced() && cache.is_empty() && seen.lock().is_empty(), "a stopped cache applies nothing");
}

/// E5: with a store, the keys a stop before sync held stay stored, and a
/// restart reconciles them. Checked by mutation: a gate that admits keys
/// before sync fails it (they are reconciled at the stop).
#[cfg(feature = "store")]
#[test]
fn keys_held_at_a_stop_before_sync_stay_stored() {
    let dir = std::env::temp_dir().join(format!("reconq-watch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store =
        || reconq::SqliteStore::open_with_flush_interval(dir.join("state.db"), Duration::from_secs(3600)).unwrap();
    let memory = Memory::default();
    memory.hold_lists(true);
    for drain in [false, true] {
        let name = format!("e5-stored-{drain}");
        let (cache, seen, controller) = recorded(&memory, name.as_str());
        let handle = controller.store(store()).watch_cache(&cache, Watch::new()).start();
        handle.enqueue("early".to_string());
        wait_for("the early key handed out", || queue_adds(&name) >= 2 || !seen.lock().is_empty());
        if drain {
            assert!(handle.stop_with_drain_report(PATIENCE).finished);
        } else {
            handle.stop();
            assert!(handle.join_timeout(PATIENCE));
        }
        assert!(seen.lock().is_empty());
    }
    memory.hold_lists(false);
    for drain in [false, true] {
        let name = format!("e5-stored-{drain}");
        let (cache, seen, controller) = recorded(&memory, name.as_str());
        let handle = controller.store(store()).watch_cache(&cache, Watch::new()).start();
        wait_for("the stored key reconciled", || reconciles_of(&seen, "early") == 1);
        handle.stop();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// E5: every `sync_timeout` without sync, an ERROR names the cache and its
/// last error. Checked by mutation: no report thread fails it.
#[test]
fn an_unsynced_cache_is_reported_with_its_last_error_every_sync_timeout() {
    log_lines();
    let memory = Memory::default();
    memory.change(|s| s.list_error = Some("table missing".into()));
    let cache = cache_of(&memory, "e5-failing");
    let handle = Controller::from_fn("e5-timeout", |_: &String, _: &Context| Ok(Action::Done))
        .sync_timeout(ms(50))
        .unwrap()
        .watch_cache(&cache, Watch::new())
        .start();
    wait_for("the source's failure", || cache.stats().errors >= 1);
    wait_for("the ERROR naming the cache and its error", || {
        logged(&["ERROR", "e5-timeout", "e5-failing", "table missing", "not synced"])
    });
    memory.change(|s| s.list_error = None);
    assert!(handle.wait_synced(Some(PATIENCE)));
    handle.stop();

    // A cache stopped before it synced: the ERROR says so.
    memory.hold_lists(true);
    let cache = cache_of(&memory, "e5-stopped");
    let handle = Controller::from_fn("e5-gone", |_: &String, _: &Context| Ok(Action::Done))
        .sync_timeout(ms(50))
        .unwrap()
        .watch_cache(&cache, Watch::new())
        .start();
    cache.stop();
    wait_for("the ERROR saying the cache stopped", || {
        logged(&["ERROR", "e5-gone", "e5-stopped", "the cache was stopped"])
    });
    assert!(!handle.wait_synced(Some(ms(0))));
    handle.stop();
}

/// E5: a cache watched after start does not hold the controller: its
/// keys (and others) are reconciled while it has not synced.
#[test]
fn a_cache_watched_after_start_does_not_hold_the_controller() {
    let memory = Memory::default();
    memory.hold_lists(true);
    let (cache, seen, controller) = recorded(&memory, "e5-late");
    let handle = controller.start();
    handle.watch_cache(&cache, Watch::new()).unwrap();
    handle.enqueue("other".to_string());
    wait_for("a key reconciled while the cache is unsynced", || saw(&seen, "other", None));
    assert!(!cache.synced());
    memory.put("listed", 7);
    memory.hold_lists(false);
    wait_for("the late cache's keys", || saw(&seen, "listed", Some(7)));
    handle.stop();
}

/// E6: the default predicate enqueues nothing for a relist that finds a
/// key unchanged or a put of an equal object; a custom map and predicate
/// decide what is enqueued.
/// Checked by mutation: a default predicate of `true` fails the first
/// part, ignoring the custom predicate the second.
#[test]
fn defaults_skip_unchanged_keys_and_map_and_predicate_decide() {
    let memory = Memory::default();
    memory.put("a", 1);
    memory.put("b", 1);
    let cache = cache_of(&memory, "e6-defaults");
    let (seen, reconcile) = recording(&cache);
    // One priority for lists and changes: handed out in enqueue order.
    let handle =
        Controller::from_fn("e6-defaults", reconcile).watch_cache(&cache, Watch::new().list_priority(0)).start();
    wait_for("the list", || saw(&seen, "a", Some(1)) && saw(&seen, "b", Some(1)));
    memory.put("b", 2);
    memory.expire();
    wait_for("the relist", || cache.stats().relists >= 1);
    memory.put("marker", 1);
    wait_for("the marker after the relist", || saw(&seen, "marker", Some(1)));
    assert_eq!(reconciles_of(&seen, "a"), 1, "an unchanged key was enqueued by the relist");
    assert_eq!(reconciles_of(&seen, "b"), 2, "the changed key once more");
    // A live put of an equal object (etcd: a put of the same value) is no
    // change either.
    memory.put("a", 1);
    memory.put("marker", 2);
    wait_for("the second marker", || saw(&seen, "marker", Some(2)));
    assert_eq!(reconciles_of(&seen, "a"), 1, "a put of an equal object was enqueued");
    handle.stop();

    let memory = Memory::default();
    let cache = cache_of(&memory, "e6-custom");
    let owners: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = Arc::clone(&owners);
    let watch = Watch::with_map(|key: &String, _: Option<&u64>| vec![format!("owner-of-{key}")])
        .predicate(|old: Option<&u64>, new: Option<&u64>| new.is_some_and(|n| old.is_none_or(|o| n > o)));
    let handle = Controller::from_fn("e6-custom", move |key: &String, _: &Context| {
        log.lock().push(key.clone());
        Ok(Action::Done)
    })
    .watch_cache(&cache, watch)
    .start();
    assert!(handle.wait_synced(Some(PATIENCE)));
    memory.put("x", 5);
    memory.put("x", 3); // smaller: not accepted
    memory.delete("x"); // not accepted
    memory.put("y", 1);
    wait_for("y's owner", || owners.lock().contains(&"owner-of-y".to_string()));
    assert!(handle.wait_idle(PATIENCE));
    let owners = owners.lock().clone();
    assert_eq!(owners.iter().filter(|k| *k == "owner-of-x").count(), 1, "{owners:?}");
    assert!(!owners.iter().any(|k| k == "x" || k == "y"), "mapped keys only: {owners:?}");
    handle.stop();
}

/// E6: a map or predicate that panics is logged as an ERROR and counted;
/// the change still applies to the cache and enqueues its own key.
/// Checked by mutation: dropping the fallback enqueue fails it.
#[test]
fn a_failing_map_or_predicate_is_counted_and_enqueues_the_changed_key() {
    log_lines();
    for failing in ["map", "predicate"] {
        let memory = Memory::default();
        let cache = cache_of(&memory, "e6-failing");
        let (seen, reconcile) = recording(&cache);
        let watch = if failing == "map" {
            Watch::with_map(|key: &String, _: Option<&u64>| {
                assert!(key != "bad", "map cannot map bad");
                vec![key.clone()]
            })
        } else {
            Watch::new().predicate(|_: Option<&u64>, new: Option<&u64>| {
                assert!(new != Some(&13), "predicate refuses 13");
                true
            })
        };
        let name = format!("e6-{failing}-fails");
        let handle = Controller::from_fn(name.as_str(), reconcile).watch_cache(&cache, watch).start();
        memory.put(if failing == "map" { "bad" } else { "unlucky" }, 13);
        let key = if failing == "map" { "bad" } else { "unlucky" };
        wait_for("the changed key reconciled", || saw(&seen, key, Some(13)));
        assert_eq!(handle.stats().handler_errors, 1);
        assert!(logged(&["ERROR", &name, "e6-failing", failing]), "no ERROR naming the {failing}");
        handle.stop();
    }
}

/// E7: keys from the list use `list_priority` (default -100), live changes
/// `priority`; a resync enqueues every cached key again at the list
/// priority. Checked by mutation: swapping the two priorities, or a resync
/// that never fires, fails it.
#[test]
fn lists_and_resyncs_use_the_list_priority_and_changes_theirs() {
    let memory = Memory::default();
    memory.put("listed", 1);
    let (cache, seen, controller) = recorded(&memory, "e7");
    let handle = controller.watch_cache(&cache, Watch::new().priority(5)).start();
    wait_for("the listed key", || saw(&seen, "listed", Some(1)));
    memory.put("live", 1);
    wait_for("the live key", || saw(&seen, "live", Some(1)));
    let priority_of = |key: &str| seen.lock().iter().find(|(k, ..)| k == key).map(|(_, _, p, _)| *p);
    assert_eq!(priority_of("listed"), Some(reconq::DEFAULT_LIST_PRIORITY));
    assert_eq!(priority_of("live"), Some(5));
    handle.stop();

    let cache = cache_of(&memory, "e7-resync");
    let (seen, reconcile) = recording(&cache);
    let watch = Watch::new().resync(ms(30)).unwrap().list_priority(-7);
    let handle = Controller::from_fn("e7-resync", reconcile).watch_cache(&cache, watch).start();
    wait_for("three resyncs of both keys", || reconciles_of(&seen, "listed") >= 4 && reconciles_of(&seen, "live") >= 4);
    assert!(seen.lock().iter().all(|(_, _, p, _)| *p == -7), "resyncs at the list priority");
    handle.stop();
}

/// Lifecycle: a cache two controllers watch runs until the last one stops,
/// and then stops (it was started by them); one started explicitly keeps
/// running. Checked by mutation: releasing at the first stop, or never
/// releasing, fails it.
#[test]
fn a_shared_cache_stops_with_the_last_controller_unless_started_explicitly() {
    for explicit in [false, true] {
        let memory = Memory::default();
        let cache = cache_of(&memory, "shared");
        if explicit {
            cache.start().unwrap();
        }
        let start = |name: &str| -> ControllerHandle<String> {
            Controller::from_fn(name, |_: &String, _: &Context| Ok(Action::Done))
                .watch_cache(&cache, Watch::new())
                .start()
        };
        let (first, second) = (start("shared-1"), start("shared-2"));
        assert!(first.wait_synced(Some(PATIENCE)));
        first.stop();
        memory.put("k", 1);
        wait_for("the cache applies changes after the first stop", || cache.get(&"k".to_string()).is_some());
        second.stop();
        if explicit {
            memory.put("k", 2);
            wait_for("an explicitly started cache keeps running", || {
                cache.get(&"k".to_string()).as_deref() == Some(&2)
            });
            cache.stop();
        }
        assert!(matches!(cache.acquire(), Err(CacheError::Stopped { .. })), "stopped with the last controller");
    }
}

/// Bad input: a zero `sync_timeout` or `resync` is refused naming the
/// argument; a stopped cache fails the start and starts no other cache; a
/// stopped controller watches nothing.
#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let reconcile = |_: &String, _: &Context| Ok(Action::Done);
    let error = Controller::from_fn("bad", reconcile).sync_timeout(Duration::ZERO).unwrap_err();
    assert!(error.to_string().contains("sync_timeout"), "{error}");
    let error = Watch::<MemorySource, String>::new().resync(Duration::ZERO).unwrap_err();
    assert!(error.to_string().contains("resync"), "{error}");

    let memory = Memory::default();
    let (stopped, fine) = (cache_of(&memory, "bad-stopped"), cache_of(&memory, "bad-fine"));
    stopped.stop();
    let started = Controller::from_fn("bad-start", reconcile)
        .watch_cache(&fine, Watch::new())
        .watch_cache(&stopped, Watch::new())
        .try_start();
    let error = started.expect_err("a stopped cache refused");
    assert!(error.to_string().contains("bad-stopped"), "{error}");
    assert!(!fine.synced() && !fine.wait_synced(Some(ms(0))), "the other cache was not started");
    fine.start().unwrap();
    assert!(fine.wait_synced(Some(PATIENCE)), "the other cache was left as it was");

    let handle = Controller::from_fn("bad-late", reconcile).start();
    assert!(matches!(handle.watch_cache(&stopped, Watch::new()), Err(WatchError::CacheStopped { .. })));
    handle.stop();
    assert!(matches!(handle.watch_cache(&fine, Watch::new()), Err(WatchError::ControllerStopped { .. })));
    fine.stop();
}

/// E7: a `PollingSource`'s first poll is its list (the list priority); the
/// later polls' differences are live changes. Checked by mutation: one
/// priority for both fails it.
#[test]
fn a_polling_sources_first_poll_uses_the_list_priority_and_later_polls_the_live_one() {
    let table: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    table.lock().insert("first".into(), 1);
    let rows = Arc::clone(&table);
    let source = reconq::PollingSource::new(ms(10), move || {
        Ok::<_, String>(rows.lock().clone().into_iter().collect::<Vec<_>>())
    })
    .unwrap();
    let cache = Cache::builder("polled", source).build().unwrap();
    let seen: Arc<Mutex<Vec<(String, i32)>>> = Arc::default();
    let log = Arc::clone(&seen);
    let handle = Controller::from_fn("polled", move |key: &String, ctx: &Context| {
        log.lock().push((key.clone(), ctx.priority()));
        Ok(Action::Done)
    })
    .watch_cache(&cache, Watch::new().priority(3))
    .start();
    assert!(handle.wait_synced(Some(PATIENCE)));
    table.lock().insert("later".into(), 1);
    wait_for("the later row", || seen.lock().iter().any(|(k, _)| k == "later"));
    let seen = seen.lock().clone();
    assert_eq!(seen, [("first".to_string(), reconq::DEFAULT_LIST_PRIORITY), ("later".to_string(), 3)]);
    handle.stop();
}

/// What a map was called with: (key, object) and, for a [`SlowMap`], the
/// thread.
type MapCalls<T = ()> = Arc<Mutex<Vec<(String, Option<u64>, T)>>>;

/// A map that records (key, object, thread) of each call and, on its
/// first call off `caller`'s thread, waits at `gate` (on `caller`'s it
/// never waits: the test would hang instead of failing).
struct SlowMap {
    calls: MapCalls<ThreadId>,
    /// Calls that returned.
    finished: Arc<AtomicUsize>,
    gate: Gate,
}

impl SlowMap {
    fn new() -> Self {
        Self { calls: Arc::default(), finished: Arc::default(), gate: Gate::new() }
    }

    fn watch(&self) -> Watch<MemorySource, String> {
        let caller = std::thread::current().id();
        let (calls, finished, gate) = (Arc::clone(&self.calls), Arc::clone(&self.finished), self.gate.clone());
        Watch::with_map(move |key: &String, obj: Option<&u64>| {
            let first = {
                let mut calls = calls.lock();
                calls.push((key.clone(), obj.copied(), std::thread::current().id()));
                calls.len() == 1
            };
            if first && std::thread::current().id() != caller {
                gate.pass();
            }
            finished.fetch_add(1, Ordering::SeqCst);
            vec![key.clone()]
        })
    }

    /// Waits for the first call, and says whether it ran on `caller`.
    fn first_on(&self, caller: ThreadId) -> bool {
        self.gate.wait_arrivals(1);
        self.calls.lock()[0].2 == caller
    }
}

/// E5, lifecycle: a controller started on a cache that has synced returns
/// from `start()` at once; the catch-up (every key held, through `map`)
/// runs on the cache's catch-up thread, and the gate holds every key until
/// it is delivered. Checked by reverting to the replay on the caller's
/// thread: the map runs on the test's thread, inside `start()`.
#[test]
fn start_on_a_synced_cache_returns_at_once_and_the_gate_waits_for_the_catch_up() {
    let memory = Memory::default();
    for key in ["a", "b", "c"] {
        memory.put(key, 1);
    }
    let cache = cache_of(&memory, "catch-up-start");
    cache.start().unwrap();
    assert!(cache.wait_synced(Some(PATIENCE)));
    let (seen, reconcile) = recording(&cache);
    let map = SlowMap::new();
    let handle = Controller::from_fn("catch-up-start", reconcile).watch_cache(&cache, map.watch()).start();
    let (gate, finished) = (map.gate.clone(), Arc::clone(&map.finished));
    handle.enqueue("early".to_string());
    assert_eq!(finished.load(Ordering::SeqCst), 0, "start() waited for a map");
    assert!(!map.first_on(std::thread::current().id()), "the map ran on the thread that called start()");
    wait_for("the early key handed out", || queue_adds("catch-up-start") >= 2 || !seen.lock().is_empty());
    assert!(seen.lock().is_empty(), "a key handed out before the catch-up was delivered");
    assert!(!handle.wait_synced(Some(ms(0))), "synced before the catch-up was delivered");
    gate.release();
    assert!(handle.wait_synced(Some(PATIENCE)));
    wait_for("every key", || ["a", "b", "c", "early"].iter().all(|key| reconciles_of(&seen, key) == 1));
    handle.stop();
    cache.stop();
}

/// E2, E6: `watch_cache()` on a running controller returns at once; while
/// the new watch's catch-up is slow, the cache's changes keep reaching its
/// other watcher, and they reach the new one after its catch-up, in order
/// (the last map of a key sees its last state). Checked by reverting to
/// the replay on the caller's thread (under the delivery lock).
#[test]
fn watch_cache_returns_at_once_and_a_slow_catch_up_holds_up_no_other_watcher() {
    let memory = Memory::default();
    memory.put("held", 1);
    let (cache, seen, controller) = recorded(&memory, "catch-up-first");
    let first = controller.watch_cache(&cache, Watch::new()).start();
    assert!(first.wait_synced(Some(PATIENCE)));
    let (seen_late, reconcile) = recording(&cache);
    let late = Controller::from_fn("catch-up-late", reconcile).start();
    let map = SlowMap::new();
    late.watch_cache(&cache, map.watch()).unwrap();
    assert_eq!(map.finished.load(Ordering::SeqCst), 0, "watch_cache() waited for a map");
    assert!(!map.first_on(std::thread::current().id()), "the map ran on the thread that called watch_cache()");
    memory.put("live", 1);
    memory.put("held", 2);
    wait_for("the live changes reconciled by the other watcher", || {
        saw(&seen, "live", Some(1)) && saw(&seen, "held", Some(2))
    });
    assert_eq!(map.finished.load(Ordering::SeqCst), 0, "the slow catch-up is still on its first key");
    map.gate.release();
    wait_for("the late watcher's keys", || saw(&seen_late, "live", Some(1)) && saw(&seen_late, "held", Some(2)));
    let calls = map.calls.lock().clone();
    let held: Vec<Option<u64>> = calls.iter().filter(|(key, ..)| key == "held").map(|(_, obj, _)| *obj).collect();
    assert_eq!(held, [Some(1), Some(1), Some(2)], "the catch-up, then the change (its old object, then its new)");
    late.stop();
    first.stop();
}

/// E6: an update maps its old object and its new one, and enqueues both
/// results (controller-runtime's mapped handlers): a child that changed
/// owners reaches its old owner too. Checked by mapping only the new
/// object: the old owner is never reconciled again.
#[test]
fn a_re_parented_object_reaches_its_old_owner_and_its_new_one() {
    let memory = Memory::default();
    memory.put("child", 1);
    let cache = cache_of(&memory, "re-parent");
    let owners: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = Arc::clone(&owners);
    let watch = Watch::with_map(|_: &String, owner: Option<&u64>| owner.map(|o| format!("owner-{o}")));
    let handle = Controller::from_fn("re-parent", move |key: &String, _: &Context| {
        log.lock().push(key.clone());
        Ok(Action::Done)
    })
    .watch_cache(&cache, watch.list_priority(0))
    .start();
    wait_for("the first owner", || owners.lock().contains(&"owner-1".to_string()));
    memory.put("child", 2);
    wait_for("the new owner", || owners.lock().contains(&"owner-2".to_string()));
    assert!(handle.wait_idle(PATIENCE));
    let count = |owner: &str| owners.lock().iter().filter(|k| *k == owner).count();
    assert_eq!((count("owner-1"), count("owner-2")), (2, 1), "{:?}", owners.lock());
    handle.stop();
}

/// E6: a delete of a key the cache never held reaches the map (with
/// `None`) and, by the default predicate, the controller (client-go's
/// informer calls `OnDelete` too). Checked by dropping such a delete in
/// the cache: the key is never reconciled.
#[test]
fn a_delete_of_a_key_never_held_reaches_map_and_the_controller() {
    let memory = Memory::default();
    let (cache, seen, controller) = recorded(&memory, "never-held");
    let mapped: MapCalls = Arc::default();
    let log = Arc::clone(&mapped);
    let watch = Watch::with_map(move |key: &String, obj: Option<&u64>| {
        log.lock().push((key.clone(), obj.copied(), ()));
        vec![key.clone()]
    });
    let handle = controller.watch_cache(&cache, watch).start();
    assert!(handle.wait_synced(Some(PATIENCE)));
    memory.change(|s| {
        s.revision += 1;
        s.history.push((s.revision, "ghost".to_owned(), None));
    });
    wait_for("the delete reconciled", || saw(&seen, "ghost", None));
    assert_eq!(*mapped.lock(), [("ghost".to_string(), None, ())]);
    assert!(!cache.contains(&"ghost".to_string()));
    handle.stop();
}
