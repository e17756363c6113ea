//! Controllers watching caches (docs/sources.md, E2, E5–E7): every change
//! reconciled after the cache holds it, the synced gate, map and predicate
//! with their defaults and failures, priorities and resync, and a cache
//! shared by controllers. Sources live in memory (a system the test
//! changes, breaks and holds back); `watch_cache_etcd.rs` has etcd's.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{PATIENCE, wait_for};
use parking_lot::{Condvar, Mutex};
use reconq::source::{Changes, Event, Item, Listing, Stop};
use reconq::{Action, Cache, Context, Controller, ReconcileError, Source, SourceError, Watch};

/// A system in memory: items with revisions and their history, a list
/// that can be held back or made to fail, and a stream that can be cut.
#[derive(Default)]
struct System {
    items: BTreeMap<String, (u64, u64)>,
    revision: u64,
    history: Vec<(u64, String, Option<u64>)>,
    /// Lists wait while set.
    list_held: bool,
    /// Lists fail with this while set.
    list_error: Option<String>,
    /// Streams fail (a break) while set; the cache resumes afterwards.
    down: bool,
    /// Bumped to end the streams open now.
    cuts: u64,
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
        while s.list_held && !stop.is_set() {
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

type Seen = Arc<Mutex<Vec<(String, Option<u64>, i32)>>>;

/// A reconcile recording (key, what the cache holds for it, priority).
fn recording(
    cache: &Cache<MemorySource>,
) -> (Seen, impl Fn(&String, &Context) -> Result<Action, ReconcileError> + Send + Sync + 'static) {
    let seen: Seen = Arc::default();
    let (log, cache) = (Arc::clone(&seen), cache.clone());
    let reconcile = move |key: &String, ctx: &Context| {
        log.lock().push((key.clone(), cache.get(key).as_deref().copied(), ctx.priority()));
        Ok(Action::Done)
    };
    (seen, reconcile)
}

#[test]
fn every_change_is_reconciled_after_the_cache_holds_it() {
    let memory = Memory::default();
    memory.put("a", 1);
    let cache = Cache::builder("items", memory.source()).build().unwrap();
    let (seen, reconcile) = recording(&cache);
    let handle = Controller::from_fn("e2", reconcile).watch_cache(&cache, Watch::new()).start();
    assert!(handle.wait_synced(Some(PATIENCE)));
    wait_for("a reconciled", || seen.lock().iter().any(|(k, v, _)| k == "a" && *v == Some(1)));
    memory.put("b", 2);
    memory.put("a", 3);
    wait_for("b and a's change", || {
        let seen = seen.lock();
        seen.iter().any(|(k, v, _)| k == "b" && *v == Some(2)) && seen.iter().any(|(k, v, _)| k == "a" && *v == Some(3))
    });
    handle.stop();
}
