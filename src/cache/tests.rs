//! The cache against a system in memory whose streams the tests break,
//! end, stall and expire at will, and a model check (proptest): whatever
//! happens, the cache comes to hold what the system holds (E1), and the
//! last change each subscriber heard of a key is the key's final state
//! (E2). Convergence is waited for, never slept for.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::{Applied, Cache, CacheError};
use crate::source::{Changes, Event, Item, Listing, Source, SourceError, Stop};
use crate::sync::{Condvar, Mutex};

const PATIENCE: Duration = Duration::from_secs(20);

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// How the open streams end when the test cuts them.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cut {
    Raise,
    End,
    Expire,
    /// Stop answering, forever.
    Stall,
}

#[derive(Default)]
struct System {
    items: BTreeMap<u32, (u32, u64)>,
    revision: u64,
    /// (revision, key, value or deleted)
    history: Vec<(u64, u32, Option<u32>)>,
    /// Positions below this are gone.
    compacted: u64,
    /// Streams opened before the last cut end as `cut` says.
    cuts: u64,
    cut: Option<Cut>,
    failing_lists: usize,
    lists: usize,
    streams: usize,
}

/// The system in memory, shared by the test and its source.
#[derive(Clone, Default)]
struct Memory {
    shared: Arc<(Mutex<System>, Condvar)>,
}

impl Memory {
    fn change(&self, f: impl FnOnce(&mut System)) {
        let (system, cv) = &*self.shared;
        f(&mut system.lock());
        cv.notify_all();
    }

    fn put(&self, key: u32, value: u32) {
        self.change(|s| {
            s.revision += 1;
            s.items.insert(key, (value, s.revision));
            s.history.push((s.revision, key, Some(value)));
        });
    }

    fn delete(&self, key: u32) {
        self.change(|s| {
            if s.items.remove(&key).is_some() {
                s.revision += 1;
                s.history.push((s.revision, key, None));
            }
        });
    }

    fn cut(&self, how: Cut) {
        self.change(|s| {
            s.cuts += 1;
            s.cut = Some(how);
        });
    }

    /// Forgets the history so far: a resume finds its position gone.
    fn compact(&self) {
        self.change(|s| s.compacted = s.revision);
    }

    /// Waits until `n` streams were opened (so a cut reaches the last).
    fn wait_streams(&self, n: usize) {
        wait_for("a stream", || self.shared.0.lock().streams >= n);
    }

    fn revision(&self) -> u64 {
        self.shared.0.lock().revision
    }

    fn listing(&self) -> BTreeMap<u32, u32> {
        self.shared.0.lock().items.iter().map(|(k, (v, _))| (*k, *v)).collect()
    }

    fn source(&self) -> MemorySource {
        MemorySource { memory: self.clone() }
    }
}

struct MemorySource {
    memory: Memory,
}

impl Source for MemorySource {
    type Key = u32;
    type Object = u32;
    type Position = u64;
    type Version = u64;

    fn list(&mut self, _stop: &Stop) -> Result<Listing<u32, u32, u64, u64>, SourceError> {
        let mut s = self.memory.shared.0.lock();
        s.lists += 1;
        if s.failing_lists > 0 {
            s.failing_lists -= 1;
            return Err(SourceError::new("list refused"));
        }
        let items = s.items.iter().map(|(k, (v, version))| Item { key: *k, obj: *v, version: Some(*version) });
        Ok(Listing { items: items.collect(), position: Some(s.revision) })
    }

    fn changes(&mut self, from: Option<&u64>, stop: &Stop) -> Result<Changes<'_, Self>, SourceError> {
        let mut position = *from.expect("a source with positions");
        let cuts = {
            let mut s = self.memory.shared.0.lock();
            s.streams += 1;
            s.cuts
        };
        let memory = self.memory.clone();
        let hook = stop.on_set(move || memory.change(|_| ()));
        let stop = stop.clone();
        let memory = self.memory.clone();
        Ok(Box::new(std::iter::from_fn(move || {
            let _wakes_the_wait = &hook;
            let (system, cv) = &*memory.shared;
            let mut s = system.lock();
            loop {
                if stop.is_set() {
                    return None;
                }
                if s.cuts != cuts {
                    match s.cut {
                        Some(Cut::Raise) => return Some(Err(SourceError::new("raised"))),
                        Some(Cut::End) => return None,
                        Some(Cut::Expire) => return Some(Err(SourceError::expired("expired"))),
                        Some(Cut::Stall) | None => {}
                    }
                } else if position < s.compacted {
                    return Some(Err(SourceError::expired("compacted")));
                } else if let Some(&(revision, key, value)) = s.history.iter().find(|(r, _, _)| *r > position) {
                    position = revision;
                    let position = Some(revision);
                    return Some(Ok(match value {
                        Some(obj) => Event::Put { key, obj, position, version: Some(revision) },
                        None => Event::Delete { key, position },
                    }));
                }
                cv.wait(&mut s);
            }
        })))
    }
}

/// What a subscriber heard last of each key.
type Heard = Arc<Mutex<BTreeMap<u32, Option<u32>>>>;

/// A cache of `memory` with a short back-off, and what its subscriber
/// heard last of each key.
fn cache(memory: &Memory) -> (Cache<MemorySource>, Heard, super::Subscription) {
    let cache = Cache::builder("memory", memory.source())
        .index("parity", |_, v: &u32| vec![(v % 2).to_string()])
        .first_backoff(Duration::from_millis(1))
        .build()
        .unwrap();
    let heard = Arc::new(Mutex::new(BTreeMap::new()));
    let log = Arc::clone(&heard);
    let subscription = cache
        .subscribe(move |a: &Applied<u32, u32>| {
            log.lock().insert(a.key, a.new.as_deref().copied());
        })
        .unwrap();
    (cache, heard, subscription)
}

fn contents(cache: &Cache<MemorySource>) -> BTreeMap<u32, u32> {
    cache.keys().into_iter().filter_map(|k| cache.get(&k).map(|v| (k, *v))).collect()
}

fn converged(cache: &Cache<MemorySource>, memory: &Memory) -> bool {
    contents(cache) == memory.listing()
}

/// The cache applied the system's last change and holds what it holds.
/// Converged alone can be a passing moment after an arbitrary sequence:
/// a key put back to a value it had earlier matches while the puts in
/// between are still on their way.
fn caught_up(cache: &Cache<MemorySource>, memory: &Memory) -> bool {
    cache.position() == Some(memory.revision()) && converged(cache, memory)
}

#[test]
fn a_stream_that_raises_is_resumed_from_its_position_and_counted() {
    let memory = Memory::default();
    memory.put(1, 1);
    let (cache, heard, _s) = cache(&memory);
    cache.start().unwrap();
    memory.wait_streams(1);
    memory.cut(Cut::Raise);
    memory.delete(1);
    memory.put(2, 2);
    wait_for("convergence", || converged(&cache, &memory));
    let stats = cache.stats();
    assert_eq!((stats.relists, stats.errors, stats.last_error.as_deref()), (0, 1, Some("raised")), "E3: resumed");
    assert_eq!(stats.position, Some(3));
    wait_for("the delete heard", || heard.lock().get(&1) == Some(&None));
    cache.stop();
}

#[test]
fn a_stream_that_ends_is_resumed_without_a_failure_or_a_relist() {
    let memory = Memory::default();
    let (cache, _heard, _s) = cache(&memory);
    cache.start().unwrap();
    assert!(cache.wait_synced(Some(PATIENCE)));
    memory.put(1, 1);
    wait_for("the put", || cache.contains(&1));
    memory.cut(Cut::End);
    memory.put(2, 2);
    wait_for("convergence", || converged(&cache, &memory));
    let stats = cache.stats();
    assert_eq!((stats.relists, stats.errors), (0, 0));
    assert!(memory.shared.0.lock().streams >= 2);
    cache.stop();
}

#[test]
fn an_expired_position_relists_and_keys_gone_meanwhile_are_deletes() {
    let memory = Memory::default();
    for k in 0..4 {
        memory.put(k, k);
    }
    let (cache, heard, _s) = cache(&memory);
    cache.start().unwrap();
    memory.wait_streams(1);
    memory.cut(Cut::Stall);
    memory.delete(0);
    memory.put(1, 10);
    memory.compact();
    memory.cut(Cut::Expire);
    wait_for("convergence", || converged(&cache, &memory));
    wait_for("the relist's changes heard", || {
        let heard = heard.lock();
        heard.get(&0) == Some(&None) && heard.get(&1) == Some(&Some(10))
    });
    let stats = cache.stats();
    assert_eq!((stats.relists, stats.errors), (1, 0), "a plain expiry is no failure");
    let mut even = cache.by_index("parity", "0").unwrap();
    even.sort();
    assert_eq!(even, [1, 2]);
    assert_eq!(cache.by_index("nope", "0").unwrap_err().index, "nope");
    cache.stop();
}

/// Streams that end at once, every time, after a bookmark at the
/// position they started from if `bookmark` (a "nothing yet").
struct Ending {
    memory: Memory,
    bookmark: bool,
    streams: Arc<AtomicUsize>,
}

impl Source for Ending {
    type Key = u32;
    type Object = u32;
    type Position = u64;
    type Version = u64;
    fn list(&mut self, stop: &Stop) -> Result<Listing<u32, u32, u64, u64>, SourceError> {
        self.memory.source().list(stop)
    }
    fn changes(&mut self, from: Option<&u64>, _: &Stop) -> Result<Changes<'_, Self>, SourceError> {
        self.streams.fetch_add(1, Ordering::SeqCst);
        let bookmark = self.bookmark.then(|| Ok(Event::Bookmark { position: *from.unwrap() }));
        Ok(Box::new(bookmark.into_iter()))
    }
}

/// E4: a plain end of the stream waits only when it repeats with no change
/// and no new position applied in between.
fn ending_streams_back_off(bookmark: bool) {
    let streams = Arc::new(AtomicUsize::new(0));
    let source = Ending { memory: Memory::default(), bookmark, streams: Arc::clone(&streams) };
    let cache = Cache::builder("ending", source).first_backoff(Duration::from_millis(20)).build().unwrap();
    cache.start().unwrap();
    wait_for("three failures", || cache.stats().errors >= 3);
    cache.stop();
    let (errors, streams) = (cache.stats().errors, streams.load(Ordering::SeqCst) as u64);
    assert!(streams <= errors + 2, "{streams} streams for {errors} back-offs: no spinning");
    let last_error = cache.stats().last_error;
    assert_eq!(last_error.as_deref(), Some("the change stream ended again with no change and no new position"));
}

#[test]
fn a_stream_that_ends_again_and_again_with_nothing_applied_backs_off() {
    ending_streams_back_off(false);
}

#[test]
fn a_stream_that_ends_again_and_again_after_a_bookmark_where_it_started_backs_off() {
    ending_streams_back_off(true);
}

#[test]
fn a_failing_first_list_is_retried_and_the_cache_is_not_synced_before() {
    let memory = Memory::default();
    memory.put(1, 1);
    memory.change(|s| s.failing_lists = 2);
    let (cache, _heard, _s) = cache(&memory);
    assert!(!cache.wait_synced(Some(Duration::ZERO)));
    cache.start().unwrap();
    assert!(cache.wait_synced(Some(PATIENCE)));
    let stats = cache.stats();
    assert_eq!((stats.errors, stats.relists, stats.keys), (2, 0, 1), "retries of the first list are no relists");
    assert_eq!(stats.last_error.as_deref(), Some("list refused"));
    cache.stop();
}

#[test]
fn a_stalled_stream_does_not_hold_stop_and_nothing_is_heard_after_it() {
    let memory = Memory::default();
    let (cache, heard, _s) = cache(&memory);
    cache.start().unwrap();
    memory.wait_streams(1);
    memory.cut(Cut::Stall);
    cache.stop();
    memory.put(1, 1);
    assert!(heard.lock().is_empty());
    assert_eq!(cache.stats().keys, 0);
    cache.stop(); // idempotent
}

#[test]
fn start_use_and_stop() {
    let memory = Memory::default();
    let (cache, _heard, _s) = cache(&memory);
    let first = cache.acquire().unwrap();
    let second = cache.acquire().unwrap();
    assert!(cache.wait_synced(Some(PATIENCE)));
    drop(first);
    memory.put(1, 1);
    wait_for("a user left: still running", || cache.contains(&1));
    drop(second);
    assert!(matches!(cache.start(), Err(CacheError::Stopped { .. })), "the last user stopped it, for good");
    assert!(cache.acquire().is_err());

    let (kept, _heard, _s) = self::cache(&memory);
    kept.start().unwrap();
    drop(kept.acquire().unwrap());
    memory.put(2, 2);
    wait_for("started: runs on after its users go", || kept.contains(&2));
    kept.stop();
    let e = kept.start().unwrap_err();
    assert_eq!(e.to_string(), "cache \"memory\" is stopped and cannot start again");
}

#[test]
fn a_late_subscriber_hears_every_key_held_then_every_change() {
    let memory = Memory::default();
    memory.put(1, 1);
    let (cache, _heard, _s) = cache(&memory);
    cache.start().unwrap();
    assert!(cache.wait_synced(Some(PATIENCE)));
    let heard = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&heard);
    let subscription = cache.subscribe(move |a: &Applied<u32, u32>| log.lock().push((a.key, a.listed))).unwrap();
    memory.put(2, 2);
    wait_for("the live put heard", || heard.lock().len() == 2);
    assert_eq!(*heard.lock(), [(1, true), (2, false)]);
    drop(subscription);
    memory.put(3, 3);
    wait_for("the put applied", || cache.contains(&3));
    assert_eq!(heard.lock().len(), 2, "unsubscribed");
    cache.stop();
}

/// Opened once by the test; waited for by a subscriber.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock() = true;
        self.opened.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock();
        while !*open {
            self.opened.wait(&mut open);
        }
    }
}

/// What a late subscriber heard: (key, old, new, listed).
type HeardInOrder = Vec<(u32, Option<u32>, Option<u32>, bool)>;

/// A late subscriber's catch-up (every key held) runs on a thread of the
/// cache: `subscribe` returns before it is heard, the cache's thread goes
/// on feeding the other subscribers while it is slow, and the changes
/// applied meanwhile follow it, in order, none missed. Checked by
/// reverting to the replay on the caller's thread (under the delivery
/// lock): the subscriber runs on the test's thread, and fails.
#[test]
fn a_late_subscribers_catch_up_holds_up_neither_the_caller_nor_the_cache_and_misses_nothing() {
    let memory = Memory::default();
    for key in 1..=3 {
        memory.put(key, key);
    }
    let (cache, heard, _s) = cache(&memory);
    cache.start().unwrap();
    assert!(cache.wait_synced(Some(PATIENCE)));
    let caller = std::thread::current().id();
    let gate = Arc::new(Gate::default());
    let late: Arc<Mutex<HeardInOrder>> = Arc::default();
    let on_caller: Arc<Mutex<bool>> = Arc::default();
    let (log, held, wrong_thread) = (Arc::clone(&late), Arc::clone(&gate), Arc::clone(&on_caller));
    let subscription = cache
        .subscribe(move |a: &Applied<u32, u32>| {
            let first = {
                let mut log = log.lock();
                log.push((a.key, a.old.as_deref().copied(), a.new.as_deref().copied(), a.listed));
                log.len() == 1
            };
            if std::thread::current().id() == caller {
                *wrong_thread.lock() = true; // never wait here: the test would hang
            } else if first {
                held.wait();
            }
        })
        .unwrap();
    wait_for("the catch-up begun", || !late.lock().is_empty());
    assert!(!*on_caller.lock(), "the catch-up ran on the subscribing thread");
    // Held up on its first key: the cache still feeds its other subscriber.
    memory.put(2, 20);
    memory.delete(3);
    memory.put(4, 4);
    wait_for("the live changes heard by the other subscriber", || {
        let heard = heard.lock();
        heard.get(&2) == Some(&Some(20)) && heard.get(&3) == Some(&None) && heard.get(&4) == Some(&Some(4))
    });
    assert_eq!(late.lock().len(), 1, "the slow subscriber is still on its first key");
    gate.open();
    wait_for("the catch-up and what followed it", || late.lock().len() == 6);
    let heard_late = late.lock().clone();
    let mut replay: Vec<u32> = heard_late[..3].iter().map(|&(key, ..)| key).collect();
    replay.sort_unstable();
    assert_eq!(replay, [1, 2, 3]);
    for &(key, old, new, listed) in &heard_late[..3] {
        assert_eq!((old, new, listed), (None, Some(key), true), "the catch-up: the values held when it subscribed");
    }
    assert_eq!(
        heard_late[3..],
        [(2, Some(2), Some(20), false), (3, Some(3), None, false), (4, None, Some(4), false)],
        "the changes applied meanwhile, in order"
    );
    memory.put(5, 5);
    wait_for("the next change, live", || late.lock().last() == Some(&(5, None, Some(5), false)));
    drop(subscription);
    cache.stop();
}

#[test]
fn bad_input_is_refused_naming_the_argument() {
    let memory = Memory::default();
    let e = Cache::builder("", memory.source()).build().unwrap_err();
    assert!(e.to_string().contains("name"), "{e}");
    let twice = Cache::builder("c", memory.source()).index("i", |_, _| vec![]).index("i", |_, _| vec![]).build();
    assert!(twice.unwrap_err().to_string().contains("indexes"));
}

#[test]
fn a_cache_has_a_status_entry_and_metrics() {
    let memory = Memory::default();
    memory.put(1, 1);
    memory.change(|s| s.failing_lists = 1);
    let cache =
        Cache::builder("status-cache", memory.source()).first_backoff(Duration::from_millis(1)).build().unwrap();
    cache.start().unwrap();
    assert!(cache.wait_synced(Some(PATIENCE)));
    let entries = crate::observe::status::snapshot();
    let entry = entries.iter().find(|e| e.name == "status-cache").expect("an entry");
    let details = entry.cache().expect("a cache entry");
    assert_eq!((details.synced, details.keys, details.position.as_deref()), (true, 1, Some("1")));
    assert_eq!((entry.state(), entry.failures, entry.last_error.as_deref()), ("running", 1, Some("list refused")));
    let text = crate::metrics::render();
    assert!(text.contains("reconq_cache_keys{cache=\"status-cache\"} 1\n"), "{text}");
    assert!(text.contains("reconq_cache_synced{cache=\"status-cache\"} 1\n"));
    assert!(text.contains("reconq_cache_errors_total{cache=\"status-cache\"} 1\n"));
    let table = crate::observe::status::format_table(&entries);
    assert!(table.lines().any(|l| l.starts_with("status-cache") && l.contains("cache")), "{table}");
    cache.stop();
    assert_eq!(
        crate::observe::status::snapshot().iter().find(|e| e.name == "status-cache").unwrap().state(),
        "stopped"
    );
}

#[derive(Debug, Clone)]
enum Op {
    Put(u32, u32),
    Delete(u32),
    Cut(Cut),
    Compact,
    FailLists(usize),
    /// Let the cache catch up before the next op.
    Settle,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..8u32, 0..4u32).prop_map(|(k, v)| Op::Put(k, v)),
        3 => (0..8u32).prop_map(Op::Delete),
        1 => prop_oneof![Just(Cut::Raise), Just(Cut::End), Just(Cut::Expire), Just(Cut::Stall)].prop_map(Op::Cut),
        1 => Just(Op::Compact),
        1 => (1..3usize).prop_map(Op::FailLists),
        1 => Just(Op::Settle),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// E1 and E2 against a model: after any sequence of changes, breaks,
    /// ends, stalls, expiries and failing lists, the cache holds what the
    /// system holds, the subscriber last heard each changed key's final
    /// state, and the cache relisted only if a position expired (E3).
    #[test]
    fn the_cache_converges_to_the_system_and_every_change_is_heard(
        initial in proptest::collection::btree_map(0..8u32, 0..4u32, 0..5),
        ops in proptest::collection::vec(op(), 1..30),
    ) {
        let memory = Memory::default();
        for (k, v) in &initial {
            memory.put(*k, *v);
        }
        let (cache, heard, _s) = cache(&memory);
        cache.start().unwrap();
        let mut changed: BTreeSet<u32> = initial.keys().copied().collect();
        let mut expiries = false;
        for op in &ops {
            match *op {
                Op::Put(k, v) => {
                    memory.put(k, v);
                    changed.insert(k);
                }
                Op::Delete(k) => {
                    memory.delete(k);
                    changed.insert(k);
                }
                Op::Cut(how) => {
                    expiries |= how == Cut::Expire;
                    memory.cut(how);
                    if how == Cut::Stall {
                        // A stalled stream is the source's to notice;
                        // this one gets broken later.
                        memory.cut(Cut::Raise);
                    }
                }
                Op::Compact => {
                    expiries = true;
                    memory.compact();
                    memory.cut(Cut::Raise);
                }
                Op::FailLists(n) => memory.change(|s| s.failing_lists = n),
                Op::Settle => wait_for("the cache to catch up", || caught_up(&cache, &memory)),
            }
        }
        wait_for("the cache to apply the last change", || caught_up(&cache, &memory));
        let listing = memory.listing();
        // A key the cache never held (put and deleted while it looked
        // away) was never heard of: it was no change to the cache.
        wait_for("every change heard", || {
            let heard = heard.lock();
            changed.iter().all(|k| heard.get(k).copied().flatten() == listing.get(k).copied())
        });
        let stats = cache.stats();
        prop_assert!(expiries || stats.relists == 0, "relisted without an expiry: {stats:?}");
        for (k, v) in &listing {
            prop_assert!(cache.by_index("parity", &(v % 2).to_string()).unwrap().contains(k));
        }
        cache.stop();
    }
}
