//! Spec §17, C6: the combinations matrix. One test per pair of features
//! (store, leader election, sharding, watched caches, dependencies,
//! batches, supersede, debounce, groups, priorities, timeouts, FakeClock)
//! that no test of a single feature already covers, each checking a
//! guarantee of both sides at once. docs/guarantees.md ("Combinations
//! (C6)") is the table that links every pair to its test.
//! Leader election and sharding run on a real etcd started by the test.

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the request counters serve idle_cpu_leader.rs
mod etcd;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::{PATIENCE, TempDir, ms, secs, wait_for};
use etcd::Etcd;
use parking_lot::{Condvar, Mutex};
use reconq::source::PollingSource;
use reconq::*;

/// One start or end of a reconcile, as the reconcile saw it.
#[derive(Clone, Debug)]
struct Run {
    start: bool,
    key: String,
    priority: i32,
    attempt: u32,
    token: Option<u64>,
    /// What the watched cache held for the key when the run began.
    cached: Option<u64>,
}

type Polled = PollingSource<String, u64>;

/// A reconcile that records its runs, blocks keys whose gate is closed
/// until the test opens it or the run is cancelled, and returns what the
/// test scripted for the key (then `Ok(Done)`).
#[derive(Clone, Default)]
struct Recorder {
    log: Arc<Mutex<Vec<Run>>>,
    /// key → open? Keys not listed do not block.
    gates: Arc<(Mutex<HashMap<String, bool>>, Condvar)>,
    results: Arc<Mutex<HashMap<String, VecDeque<Result<Action, ReconcileError>>>>>,
    cache: Arc<OnceLock<Cache<Polled>>>,
}

impl Recorder {
    fn close(&self, key: &str) {
        self.gates.0.lock().insert(key.into(), false);
    }

    fn open(&self, key: &str) {
        self.gates.0.lock().insert(key.into(), true);
        self.gates.1.notify_all();
    }

    fn then(&self, key: &str, result: Result<Action, ReconcileError>) {
        self.results.lock().entry(key.into()).or_default().push_back(result);
    }

    fn record(&self, start: bool, key: &str, ctx: &Context) {
        let cached = self.cache.get().and_then(|cache| cache.get(&key.to_string()).as_deref().copied());
        let (priority, attempt, token) = (ctx.priority(), ctx.attempt(), ctx.fencing_token());
        self.log.lock().push(Run { start, key: key.into(), priority, attempt, token, cached });
    }

    fn reconcile(&self, key: &String, ctx: &Context) -> Result<Action, ReconcileError> {
        self.record(true, key, ctx);
        {
            let (gates, changed) = &*self.gates;
            let mut gates = gates.lock();
            while gates.get(key) == Some(&false) && !ctx.is_cancelled() {
                changed.wait_for(&mut gates, ms(5));
            }
        }
        let result = self.results.lock().get_mut(key).and_then(VecDeque::pop_front).unwrap_or(Ok(Action::Done));
        self.record(false, key, ctx);
        result
    }

    fn controller(&self, name: &str, workers: usize) -> Controller<String> {
        let me = self.clone();
        Controller::new(name, move |key: &String, ctx: &Context| me.reconcile(key, ctx))
            .workers(workers)
            .rate_limiter(ExponentialBackoff::new(secs(1), secs(1)))
    }

    fn runs(&self) -> Vec<Run> {
        self.log.lock().clone()
    }

    fn starts(&self, key: &str) -> Vec<Run> {
        self.runs().into_iter().filter(|r| r.start && r.key == key).collect()
    }

    fn started(&self, key: &str) -> usize {
        self.starts(key).len()
    }

    fn running(&self, key: &str) -> bool {
        let runs = self.runs();
        let of = |start: bool| runs.iter().filter(|r| r.start == start && r.key == key).count();
        of(true) > of(false)
    }

    /// Index in the log of the `n`-th (from 0) start or end of `key`.
    fn at(&self, start: bool, key: &str, n: usize) -> usize {
        let runs = self.runs();
        runs.iter()
            .enumerate()
            .filter(|(_, r)| r.start == start && r.key == key)
            .nth(n)
            .unwrap_or_else(|| panic!("no {} #{n} of {key} in {runs:?}", if start { "start" } else { "end" }))
            .0
    }

    /// Keys in the order they started.
    fn order(&self) -> Vec<String> {
        self.runs().into_iter().filter(|r| r.start).map(|r| r.key).collect()
    }

    /// The most runs of keys starting with `prefix` at once.
    fn most_at_once(&self, prefix: &str) -> usize {
        let (mut now, mut most) = (0usize, 0usize);
        for run in self.runs().iter().filter(|r| r.key.starts_with(prefix)) {
            if run.start {
                now += 1;
                most = most.max(now);
            } else {
                now -= 1;
            }
        }
        most
    }

    /// Enqueues `key` at `priority` with its gate closed, and waits until it runs.
    fn run_blocked(&self, h: &ControllerHandle<String>, key: &str, priority: i32) {
        self.close(key);
        h.enqueue_with_priority(s(key), priority);
        wait_for(&format!("{key} running"), || self.running(key));
    }
}

fn s(k: &str) -> String {
    k.to_string()
}

fn idle(h: &ControllerHandle<String>) {
    assert!(h.wait_idle(PATIENCE), "the controller became idle: {:?}", h.stats());
}

fn waiting(h: &ControllerHandle<String>, key: &str) -> bool {
    matches!(h.inspect(&s(key)).state, KeyStatus::Waiting { .. })
}

/// Keys starting with 'g' form one group, every other key its own.
fn by_initial(key: &String) -> String {
    if key.starts_with('g') { s("g") } else { key.clone() }
}

fn open_store(dir: &TempDir) -> SqliteStore {
    SqliteStore::open_with_flush_interval(dir.db(), Duration::from_secs(3600)).unwrap()
}

fn stop(h: &ControllerHandle<String>) {
    h.stop();
    assert!(h.join_timeout(PATIENCE));
}

// ---- store × ... -------------------------------------------------------

/// U3 + S2: keys a batch holds at a stop are pending keys: kept, and
/// reconciled after a restart (nothing ran while the batch was open); a
/// batch opened before the restart's start holds them again.
#[test]
fn pair_store_batches() {
    let dir = TempDir::new();
    let first = Recorder::default();
    let h = first.controller("store-batch", 1).store(open_store(&dir)).start();
    let batch = h.batch();
    h.enqueue(s("a"));
    h.enqueue(s("b"));
    assert_eq!(h.stats().held, 2);
    stop(&h);
    drop(batch);
    assert!(first.runs().is_empty(), "nothing ran while the batch was open");

    // A batch opened before start holds the restored keys too.
    let second = Recorder::default();
    let c = second.controller("store-batch", 1).store(open_store(&dir));
    let batch = c.handle().batch();
    let h = c.start();
    assert_eq!(h.stats().held, 2, "{:?}", h.stats());
    drop(batch);
    idle(&h);
    assert_eq!((second.started("a"), second.started("b")), (1, 1));
    stop(&h);
}

/// U1 + S2: a superseded run leaves the failure count alone, and so does
/// the store: after a restart the key's attempt counts only the failure
/// of the run the stop interrupted.
#[test]
fn pair_store_supersede() {
    let dir = TempDir::new();
    let first = Recorder::default();
    let h = first.controller("store-supersede", 1).supersede(true).store(open_store(&dir)).start();
    first.then("k", Err(ReconcileError::new("superseded run")));
    first.then("k", Err(ReconcileError::new("stopped")));
    first.run_blocked(&h, "k", 0);
    h.enqueue(s("k"));
    wait_for("the rerun after the cancelled one", || first.started("k") == 2 && first.running("k"));
    let stats = h.stats();
    assert_eq!((stats.superseded, stats.failures), (1, 0), "{stats:?}");
    stop(&h);

    let second = Recorder::default();
    let h = second.controller("store-supersede", 1).store(open_store(&dir)).start();
    idle(&h);
    assert_eq!(second.starts("k")[0].attempt, 1, "only the stopped run's failure counts");
    stop(&h);
}

/// U2 + S2: a debounced key is a delayed key: stored with the due time
/// its window gives (on the controller's clock), and due then after a
/// restart.
#[test]
fn pair_store_debounce() {
    let dir = TempDir::new();
    let first = Recorder::default();
    let clock = FakeClock::new();
    let h =
        first.controller("store-debounce", 1).clock(clock.clone()).debounce(secs(60)).store(open_store(&dir)).start();
    h.enqueue(s("k"));
    clock.advance(secs(30));
    assert!(waiting(&h, "k"));
    stop(&h);

    let second = Recorder::default();
    let clock = FakeClock::new();
    let h =
        second.controller("store-debounce", 1).clock(clock.clone()).debounce(secs(60)).store(open_store(&dir)).start();
    assert!(waiting(&h, "k"), "{:?}", h.inspect(&s("k")));
    clock.advance(secs(20));
    assert!(waiting(&h, "k") && second.runs().is_empty(), "30 s of its window were left");
    clock.advance(secs(15));
    wait_for("the key due at the end of its window", || second.started("k") == 1);
    stop(&h);
}

/// P5 + S2: restored keys are put back in their groups, so the limit
/// holds for them: a lower-priority key of another group goes ahead of a
/// restored key of a full group.
#[test]
fn pair_store_groups() {
    let dir = TempDir::new();
    let first = Recorder::default();
    let h = first.controller("store-groups", 1).store(open_store(&dir)).start();
    first.run_blocked(&h, "busy", 0);
    for k in ["g1", "g2"] {
        h.enqueue(s(k));
    }
    stop(&h);

    let second = Recorder::default();
    second.close("g1");
    second.close("g2");
    let c = second.controller("store-groups", 3).group(by_initial).max_in_flight_per_group(1).store(open_store(&dir));
    let h = c.start();
    wait_for("a restored g key running", || second.running("g1") || second.running("g2"));
    h.enqueue_with_priority(s("x"), -1);
    wait_for("x went ahead of the restored key of the full group", || second.started("x") == 1);
    assert_eq!(second.started("g1") + second.started("g2"), 1, "{:?}", second.runs());
    second.open("g1");
    second.open("g2");
    idle(&h);
    assert_eq!(second.most_at_once("g"), 1);
    stop(&h);
}

/// §7 timeouts + S2: a timed-out run counts as a failure, and the store
/// keeps that count and the retry's due time across a restart.
#[test]
fn pair_store_timeout() {
    let dir = TempDir::new();
    let first = Recorder::default();
    let clock = FakeClock::new();
    let hour = || ExponentialBackoff::new(secs(3600), secs(3600));
    let h = first
        .controller("store-timeout", 1)
        .clock(clock.clone())
        .timeout(secs(5))
        .rate_limiter(hour())
        .store(open_store(&dir))
        .start();
    first.run_blocked(&h, "k", 0);
    clock.advance(secs(5));
    wait_for("the timed-out run waits to retry", || waiting(&h, "k"));
    assert!(h.inspect(&s("k")).last_error.unwrap().contains("timed out"));
    stop(&h);

    let second = Recorder::default();
    let clock = FakeClock::new();
    let h =
        second.controller("store-timeout", 1).clock(clock.clone()).rate_limiter(hour()).store(open_store(&dir)).start();
    let info = h.inspect(&s("k"));
    assert!(matches!(info.state, KeyStatus::Waiting { .. }) && info.attempts == 1, "{info:?}");
    clock.advance(secs(3600));
    wait_for("the retry", || second.started("k") == 1);
    assert_eq!(second.starts("k")[0].attempt, 1);
    stop(&h);
}

/// FakeClock + S2: a delayed key is stored with what is left of its delay
/// on the controller's clock, and a restart on a fresh fake clock makes
/// it due after what was left.
#[test]
fn pair_store_fake_clock() {
    let dir = TempDir::new();
    let first = Recorder::default();
    let clock = FakeClock::new();
    let h = first.controller("store-clock", 1).clock(clock.clone()).store(open_store(&dir)).start();
    h.enqueue_after(s("k"), secs(3600));
    clock.advance(secs(600));
    stop(&h);

    let second = Recorder::default();
    let clock = FakeClock::new();
    let h = second.controller("store-clock", 1).clock(clock.clone()).store(open_store(&dir)).start();
    clock.advance(secs(2900));
    assert!(waiting(&h, "k") && second.runs().is_empty(), "3000 s were left");
    clock.advance(secs(200));
    wait_for("the key due", || second.started("k") == 1);
    stop(&h);
}

// ---- watched caches × ... -----------------------------------------------

/// A system of `key → value` polled every 10 ms, its cache (also read by
/// `recorder`'s reconciles) and what to change it with.
#[derive(Clone, Default)]
struct System(Arc<Mutex<BTreeMap<String, u64>>>);

impl System {
    fn put(&self, key: &str, value: u64) {
        self.0.lock().insert(key.into(), value);
    }

    fn cache(&self, name: &str, recorder: &Recorder) -> Cache<Polled> {
        let items = Arc::clone(&self.0);
        let source = PollingSource::new(ms(10), move || Ok::<_, String>(items.lock().clone())).unwrap();
        let cache = Cache::builder(name, source).build().unwrap();
        assert!(recorder.cache.set(cache.clone()).is_ok());
        cache
    }
}

/// `Watch::with_map`: object `key` enqueues the keys its name lists,
/// split on '+' ("g1+g2" enqueues g1 and g2).
fn split_map() -> Watch<Polled, String> {
    Watch::with_map(|key: &String, _: Option<&u64>| key.split('+').map(s).collect::<Vec<_>>())
}

/// E2 + D1: a change whose mapped key has a running parent waits for the
/// parent, then reads the change from the cache.
#[test]
fn pair_cache_dependencies() {
    let (system, rec) = (System::default(), Recorder::default());
    let cache = system.cache("cache-deps", &rec);
    let c = rec.controller("cache-deps", 2).watch_cache(&cache, split_map());
    c.handle().set_dependencies(&s("child"), [s("parent")]).unwrap();
    let h = c.start();
    assert!(h.wait_synced(Some(PATIENCE)));
    rec.run_blocked(&h, "parent", 0);
    system.put("child", 7);
    wait_for("the mapped child held by its parent", || h.stats().held == 1);
    assert_eq!(rec.started("child"), 0);
    rec.open("parent");
    idle(&h);
    assert!(rec.at(false, "parent", 0) < rec.at(true, "child", 0));
    assert_eq!(rec.starts("child").last().unwrap().cached, Some(7));
    stop(&h);
}

/// E2 + U3: a change applied while a batch is open is held until it
/// closes, then reconciled reading it.
#[test]
fn pair_cache_batches() {
    let (system, rec) = (System::default(), Recorder::default());
    let cache = system.cache("cache-batch", &rec);
    let h = rec.controller("cache-batch", 1).watch_cache(&cache, split_map()).start();
    assert!(h.wait_synced(Some(PATIENCE)));
    let batch = h.batch();
    system.put("k", 3);
    wait_for("the change held by the batch", || h.stats().held == 1);
    assert!(rec.runs().is_empty());
    drop(batch);
    idle(&h);
    assert_eq!(rec.starts("k").iter().map(|r| r.cached).collect::<Vec<_>>(), vec![Some(3)]);
    stop(&h);
}

/// E2 + U1: a change to a key being reconciled cancels the run, and the
/// rerun reads the change.
#[test]
fn pair_cache_supersede() {
    let (system, rec) = (System::default(), Recorder::default());
    system.put("k", 1);
    let cache = system.cache("cache-supersede", &rec);
    rec.close("k");
    let h = rec.controller("cache-supersede", 1).supersede(true).watch_cache(&cache, split_map()).start();
    wait_for("k running on its listed value", || rec.running("k"));
    system.put("k", 2);
    wait_for("the run cancelled and rerun", || rec.started("k") == 2);
    rec.open("k");
    idle(&h);
    let seen: Vec<_> = rec.starts("k").iter().map(|r| r.cached).collect();
    assert_eq!(seen, vec![Some(1), Some(2)]);
    assert_eq!((h.stats().superseded, h.stats().failures), (1, 0));
    stop(&h);
}

/// E2 + U2: a change is debounced on the controller's clock, then
/// reconciled reading it.
#[test]
fn pair_cache_debounce() {
    let (system, rec) = (System::default(), Recorder::default());
    let cache = system.cache("cache-debounce", &rec);
    let clock = FakeClock::new();
    let h = rec
        .controller("cache-debounce", 1)
        .clock(clock.clone())
        .debounce(secs(1))
        .watch_cache(&cache, split_map())
        .start();
    assert!(h.wait_synced(Some(PATIENCE)));
    system.put("k", 5);
    wait_for("the change waits for its window", || waiting(&h, "k"));
    assert!(rec.runs().is_empty());
    clock.advance(secs(1));
    wait_for("reconciled a window later", || rec.started("k") == 1);
    assert_eq!(rec.starts("k")[0].cached, Some(5));
    stop(&h);
}

/// E2/E6 + P5: the keys a change maps to are put in their groups: a
/// full group's mapped key waits while another group's goes ahead.
#[test]
fn pair_cache_groups() {
    let (system, rec) = (System::default(), Recorder::default());
    let cache = system.cache("cache-groups", &rec);
    rec.close("g1");
    rec.close("g2");
    let c = rec.controller("cache-groups", 3).group(by_initial).max_in_flight_per_group(1);
    let h = c.watch_cache(&cache, split_map()).start();
    assert!(h.wait_synced(Some(PATIENCE)));
    system.put("g1+g2", 1);
    wait_for("one g key running", || rec.running("g1") || rec.running("g2"));
    h.enqueue_with_priority(s("x"), -1);
    wait_for("x went ahead of the full group's key", || rec.started("x") == 1);
    assert_eq!(rec.started("g1") + rec.started("g2"), 1);
    rec.open("g1");
    rec.open("g2");
    idle(&h);
    assert_eq!(rec.most_at_once("g"), 1);
    stop(&h);
}

/// E2 + §7: a timed-out run is retried as a failure, and the retry reads
/// the change made while it ran.
#[test]
fn pair_cache_timeout() {
    let (system, rec) = (System::default(), Recorder::default());
    system.put("k", 1);
    let cache = system.cache("cache-timeout", &rec);
    let clock = FakeClock::new();
    rec.close("k");
    let h = rec
        .controller("cache-timeout", 1)
        .clock(clock.clone())
        .timeout(secs(5))
        .watch_cache(&cache, split_map())
        .start();
    wait_for("k running", || rec.running("k"));
    system.put("k", 2);
    wait_for("the change in the cache", || cache.get(&s("k")).as_deref() == Some(&2));
    clock.advance(secs(5));
    wait_for("the timed-out run returned", || !rec.running("k") || rec.started("k") > 1);
    rec.open("k");
    clock.advance(secs(1));
    wait_for("rerun reading the change", || rec.starts("k").iter().any(|r| r.cached == Some(2)));
    idle(&h);
    assert!(h.stats().failures >= 1 && h.stats().last_error.unwrap().contains("timed out"));
    stop(&h);
}

/// E2 + E7 on a FakeClock: cache events are not delays, so they are
/// reconciled without the clock moving, while an `enqueue_after` and the
/// watch's `resync` period are measured on the controller's clock.
#[test]
fn pair_cache_fake_clock() {
    let (system, rec) = (System::default(), Recorder::default());
    system.put("listed", 1);
    let cache = system.cache("cache-clock", &rec);
    let clock = FakeClock::new();
    let watch = split_map().resync(secs(60)).unwrap();
    let h = rec.controller("cache-clock", 1).clock(clock.clone()).watch_cache(&cache, watch).start();
    wait_for("the listed key", || rec.started("listed") == 1);
    h.enqueue_after(s("later"), secs(10));
    system.put("k", 4);
    wait_for("the change reconciled on a still clock", || rec.started("k") == 1);
    assert_eq!(rec.starts("k")[0].cached, Some(4));
    assert!(waiting(&h, "later"));
    clock.advance(secs(10));
    wait_for("the delayed key on the fake clock", || rec.started("later") == 1);
    clock.advance(secs(56)); // the resync period, 60 s ± 10%, has passed
    wait_for("the resync on the fake clock", || rec.started("listed") == 2 && rec.started("k") == 2);
    assert_eq!(rec.starts("k")[1].priority, DEFAULT_LIST_PRIORITY);
    stop(&h);
}

// ---- dependencies × ... -----------------------------------------------

/// U1 + D1/D2: a superseded parent still holds its child through its
/// cancelled run and its rerun; the child runs once, after the rerun.
#[test]
fn pair_dependencies_supersede() {
    let rec = Recorder::default();
    let c = rec.controller("deps-supersede", 2).supersede(true);
    c.handle().set_dependencies(&s("child"), [s("parent")]).unwrap();
    let h = c.start();
    rec.run_blocked(&h, "parent", 0);
    h.enqueue(s("child"));
    wait_for("child held", || h.stats().held == 1);
    h.enqueue(s("parent"));
    wait_for("the parent's rerun", || rec.started("parent") == 2 && rec.running("parent"));
    assert_eq!(rec.started("child"), 0, "held through the cancelled run: {:?}", rec.runs());
    assert_eq!(h.waiting_for(&s("child")), vec![s("parent")]);
    rec.open("parent");
    idle(&h);
    assert!(rec.at(false, "parent", 1) < rec.at(true, "child", 0));
    assert_eq!((rec.started("child"), h.stats().superseded), (1, 1));
    stop(&h);
}

/// §7 + D2: a timed-out parent's failure continues its run, so the child
/// does not follow it; the child follows the retry that succeeds.
#[test]
fn pair_dependencies_timeout() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let c = rec.controller("deps-timeout", 2).clock(clock.clone()).timeout(secs(5));
    c.handle().set_dependencies(&s("child"), [s("parent")]).unwrap();
    let h = c.start();
    rec.run_blocked(&h, "parent", 0);
    clock.advance(secs(5));
    wait_for("the timed-out parent waits to retry", || waiting(&h, "parent"));
    assert_eq!(rec.started("child"), 0, "no D2 after a timeout");
    rec.open("parent");
    clock.advance(secs(1));
    wait_for("the child follows the successful retry", || rec.started("child") == 1);
    assert!(rec.at(false, "parent", 1) < rec.at(true, "child", 0));
    assert_eq!(h.stats().failures, 1);
    stop(&h);
}

/// FakeClock + D1/D2: a parent delayed on the fake clock holds nothing;
/// when the clock makes it due it runs and its child follows.
#[test]
fn pair_dependencies_fake_clock() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let c = rec.controller("deps-clock", 1).clock(clock.clone());
    c.handle().set_dependencies(&s("child"), [s("parent")]).unwrap();
    let h = c.start();
    h.enqueue_after(s("parent"), secs(10));
    h.enqueue(s("child"));
    wait_for("the child ran: a delayed parent holds nothing", || rec.started("child") == 1);
    clock.advance(secs(10));
    wait_for("the parent, then the child again", || rec.started("child") == 2);
    assert!(rec.at(false, "parent", 0) < rec.at(true, "child", 1));
    stop(&h);
}

/// U3 + D3: a parent enqueued inside a batch is pending (held, not
/// handed out), so it cancels its running child at once; the parent runs
/// when the batch closes, after the child's run returned, and the child
/// runs again after it (D2).
#[test]
fn pair_dependencies_batches() {
    let rec = Recorder::default();
    let c = rec.controller("deps-batch", 2);
    c.handle().set_dependencies(&s("child"), [s("parent")]).unwrap();
    let h = c.start();
    rec.run_blocked(&h, "child", 0);
    let batch = h.batch();
    h.enqueue(s("parent"));
    wait_for("the child's run cancelled by its pending parent", || !rec.running("child"));
    assert_eq!(rec.started("parent"), 0, "held by the batch");
    rec.open("child");
    drop(batch);
    idle(&h);
    assert!(rec.at(false, "child", 0) < rec.at(true, "parent", 0));
    assert!(rec.at(false, "parent", 0) < rec.at(true, "child", 1));
    assert_eq!(h.stats().superseded, 1);
    stop(&h);
}

// ---- batches × ... ----------------------------------------------------

/// U3 + U1: an enqueue of a running key inside a batch cancels the run
/// (the key became ready), but the rerun waits for the batch to close.
#[test]
fn pair_batches_supersede() {
    let rec = Recorder::default();
    let h = rec.controller("batch-supersede", 2).supersede(true).start();
    rec.run_blocked(&h, "k", 0);
    let batch = h.batch();
    h.enqueue(s("k"));
    wait_for("the run cancelled", || !rec.running("k"));
    assert_eq!((rec.started("k"), h.stats().held), (1, 1), "the rerun is held by the batch");
    rec.open("k");
    drop(batch);
    idle(&h);
    assert_eq!((rec.started("k"), h.stats().superseded), (2, 1));
    stop(&h);
}

/// U3 + U2: a debounced key coming due inside a batch is held until the
/// batch closes.
#[test]
fn pair_batches_debounce() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = rec.controller("batch-debounce", 1).clock(clock.clone()).debounce(secs(1)).start();
    let batch = h.batch();
    h.enqueue(s("k"));
    assert!(waiting(&h, "k"));
    clock.advance(secs(1));
    wait_for("due and held", || h.stats().held == 1);
    assert!(rec.runs().is_empty());
    drop(batch);
    wait_for("ran once the batch closed", || rec.started("k") == 1);
    stop(&h);
}

/// U3 + P5: keys a batch releases at once still respect the group limit.
#[test]
fn pair_batches_groups() {
    let rec = Recorder::default();
    rec.close("g1");
    rec.close("g2");
    let h = rec.controller("batch-groups", 3).group(by_initial).max_in_flight_per_group(1).start();
    let batch = h.batch();
    for k in ["g1", "g2"] {
        h.enqueue(s(k));
    }
    h.enqueue_with_priority(s("x"), -1);
    drop(batch);
    wait_for("x went ahead of the full group's key", || rec.started("x") == 1);
    assert_eq!(rec.started("g1") + rec.started("g2"), 1);
    rec.open("g1");
    rec.open("g2");
    idle(&h);
    assert_eq!(rec.most_at_once("g"), 1);
    stop(&h);
}

/// U3 + P1: keys a batch releases go out highest priority first.
#[test]
fn pair_batches_priorities() {
    let rec = Recorder::default();
    let h = rec.controller("batch-priorities", 1).start();
    let batch = h.batch();
    for (k, p) in [("low", -1), ("mid", 0), ("high", 5)] {
        h.enqueue_with_priority(s(k), p);
    }
    drop(batch);
    idle(&h);
    assert_eq!(rec.order(), vec![s("high"), s("mid"), s("low")]);
    assert_eq!(rec.starts("high")[0].priority, 5);
    stop(&h);
}

/// U3 + §7: the retry of a run that timed out is held by a batch open
/// when it comes due, and runs once the batch closes.
#[test]
fn pair_batches_timeout() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = rec.controller("batch-timeout", 1).clock(clock.clone()).timeout(secs(5)).start();
    rec.run_blocked(&h, "k", 0);
    let batch = h.batch();
    clock.advance(secs(5));
    wait_for("the timed-out run waits to retry", || waiting(&h, "k"));
    rec.open("k");
    clock.advance(secs(1));
    wait_for("the retry held", || h.stats().held == 1);
    assert_eq!(rec.started("k"), 1);
    drop(batch);
    wait_for("the retry ran", || rec.started("k") == 2);
    assert_eq!(rec.starts("k")[1].attempt, 1);
    stop(&h);
}

/// U3 + FakeClock: a delay the fake clock makes due inside a batch is
/// held until the batch closes.
#[test]
fn pair_batches_fake_clock() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = rec.controller("batch-clock", 1).clock(clock.clone()).start();
    let batch = h.batch();
    h.enqueue_after(s("k"), secs(10));
    clock.advance(secs(10));
    wait_for("due and held", || h.stats().held == 1);
    assert!(rec.runs().is_empty());
    drop(batch);
    wait_for("ran", || rec.started("k") == 1);
    stop(&h);
}

// ---- supersede × ... --------------------------------------------------

/// U1 + U2: an enqueue of a running key is debounced, and the run is
/// cancelled only when the window makes the key due (a delay coming due).
#[test]
fn pair_supersede_debounce() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = rec.controller("supersede-debounce", 1).clock(clock.clone()).debounce(secs(1)).supersede(true).start();
    rec.close("k");
    h.enqueue(s("k"));
    clock.advance(secs(1));
    wait_for("k running", || rec.running("k"));
    h.enqueue(s("k"));
    assert!(rec.running("k") && h.stats().superseded == 0, "not cancelled inside the window");
    clock.advance(secs(1));
    wait_for("cancelled when due", || rec.started("k") == 2);
    rec.open("k");
    idle(&h);
    assert_eq!(h.stats().superseded, 1);
    stop(&h);
}

/// U1 + P5: a superseded key's rerun takes its group's slot like any
/// other run: the group never has two keys in flight.
#[test]
fn pair_supersede_groups() {
    let rec = Recorder::default();
    let h = rec.controller("supersede-groups", 3).supersede(true).group(by_initial).max_in_flight_per_group(1).start();
    rec.run_blocked(&h, "g1", 0);
    rec.close("g2");
    h.enqueue(s("g2"));
    h.enqueue_with_priority(s("x"), -1);
    wait_for("x went ahead of the full group's key", || rec.started("x") == 1);
    h.enqueue(s("g1"));
    wait_for("g1 cancelled and a g key running again", || {
        rec.started("g1") + rec.started("g2") == 2 && (rec.running("g1") || rec.running("g2"))
    });
    rec.open("g1");
    rec.open("g2");
    idle(&h);
    assert_eq!((rec.started("g1"), rec.started("g2"), h.stats().superseded), (2, 1, 1));
    assert_eq!(rec.most_at_once("g"), 1, "{:?}", rec.runs());
    stop(&h);
}

/// U1 + §7: a superseded run is neither a failure nor a timeout even if
/// its deadline passes before it returns; the rerun has its own deadline.
#[test]
fn pair_supersede_timeout() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = rec.controller("supersede-timeout", 1).clock(clock.clone()).timeout(secs(5)).supersede(true).start();
    rec.run_blocked(&h, "k", 0);
    clock.advance(secs(4));
    h.enqueue(s("k"));
    wait_for("the rerun", || rec.started("k") == 2 && rec.running("k"));
    let stats = h.stats();
    assert_eq!((stats.superseded, stats.failures), (1, 0), "{stats:?}");
    clock.advance(secs(4));
    assert!(rec.running("k"), "the rerun's deadline is 5 s after it began");
    clock.advance(secs(1));
    wait_for("the rerun timed out", || h.stats().failures == 1);
    assert!(h.stats().last_error.unwrap().contains("timed out"));
    assert_eq!(rec.starts("k")[1].attempt, 0, "the superseded run left attempt alone");
    stop(&h);
}

/// U1 + FakeClock: a delay the fake clock makes due cancels the running
/// key.
#[test]
fn pair_supersede_fake_clock() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = rec.controller("supersede-clock", 2).clock(clock.clone()).supersede(true).start();
    rec.run_blocked(&h, "k", 0);
    h.enqueue_after(s("k"), secs(10));
    clock.advance(secs(9));
    assert_eq!(h.stats().superseded, 0);
    clock.advance(secs(1));
    wait_for("cancelled when due, and rerun", || rec.started("k") == 2);
    rec.open("k");
    idle(&h);
    assert_eq!(h.stats().superseded, 1);
    stop(&h);
}

// ---- debounce × ... ---------------------------------------------------

/// U2 + P5: debounced keys coming due together still respect the limit.
#[test]
fn pair_debounce_groups() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    rec.close("g1");
    rec.close("g2");
    let h = rec
        .controller("debounce-groups", 3)
        .clock(clock.clone())
        .debounce(secs(1))
        .group(by_initial)
        .max_in_flight_per_group(1)
        .start();
    h.enqueue(s("g1"));
    h.enqueue(s("g2"));
    h.enqueue_with_priority(s("x"), -1);
    clock.advance(secs(1));
    wait_for("x went ahead of the full group's key", || rec.started("x") == 1);
    assert_eq!(rec.started("g1") + rec.started("g2"), 1);
    rec.open("g1");
    rec.open("g2");
    idle(&h);
    assert_eq!(rec.most_at_once("g"), 1);
    stop(&h);
}

/// U2 + P1/P2: debounced keys keep their priorities when their window
/// ends.
#[test]
fn pair_debounce_priorities() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = rec.controller("debounce-priorities", 1).clock(clock.clone()).debounce(secs(1)).start();
    h.enqueue_with_priority(s("low"), -1);
    h.enqueue_with_priority(s("high"), 5);
    clock.advance(secs(1));
    idle(&h);
    assert_eq!(rec.order(), vec![s("high"), s("low")]);
    assert_eq!(rec.starts("high")[0].priority, 5);
    stop(&h);
}

/// U2 + §7: the retry of a timed-out run is not debounced: it comes after
/// the rate limiter's delay, not a window.
#[test]
fn pair_debounce_timeout() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = rec.controller("debounce-timeout", 1).clock(clock.clone()).debounce(secs(60)).timeout(secs(5)).start();
    rec.close("k");
    h.enqueue(s("k"));
    clock.advance(secs(60));
    wait_for("k running after its window", || rec.running("k"));
    clock.advance(secs(5));
    wait_for("the timed-out run waits to retry", || waiting(&h, "k"));
    rec.open("k");
    clock.advance(secs(1));
    wait_for("retried after the limiter's 1 s", || rec.started("k") == 2);
    stop(&h);
}

// ---- groups, priorities, timeouts × ... ---------------------------------

/// P5 + §7: a run that times out frees its group's slot when it returns.
#[test]
fn pair_groups_timeout() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = rec
        .controller("groups-timeout", 2)
        .clock(clock.clone())
        .timeout(secs(5))
        .group(by_initial)
        .max_in_flight_per_group(1)
        .start();
    rec.run_blocked(&h, "g1", 0);
    h.enqueue(s("g2"));
    h.enqueue_with_priority(s("x"), -1);
    wait_for("x went ahead of the full group's key", || rec.started("x") == 1);
    assert_eq!(rec.started("g2"), 0);
    clock.advance(secs(5));
    wait_for("g2 took the slot the timed-out g1 freed", || rec.started("g2") == 1);
    assert!(rec.at(false, "g1", 0) < rec.at(true, "g2", 0));
    assert_eq!(h.stats().failures, 1);
    stop(&h);
}

/// P5 + FakeClock: a retry the fake clock makes due waits for room in its
/// full group.
#[test]
fn pair_groups_fake_clock() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = rec.controller("groups-clock", 2).clock(clock.clone()).group(by_initial).max_in_flight_per_group(1).start();
    rec.then("g1", Err(ReconcileError::new("once")));
    h.enqueue(s("g1"));
    wait_for("g1 waits to retry", || waiting(&h, "g1"));
    rec.run_blocked(&h, "g2", 0);
    clock.advance(secs(1));
    h.enqueue_with_priority(s("x"), -1);
    wait_for("x went ahead of the due retry of the full group", || rec.started("x") == 1);
    assert_eq!(rec.started("g1"), 1);
    rec.open("g2");
    wait_for("the retry once g2 returned", || rec.started("g1") == 2);
    assert_eq!(rec.most_at_once("g"), 1);
    stop(&h);
}

/// P3 + §7: the retry of a timed-out run keeps the priority it was handed
/// out with.
#[test]
fn pair_priorities_timeout() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = rec.controller("priorities-timeout", 1).clock(clock.clone()).timeout(secs(5)).start();
    rec.run_blocked(&h, "k", 7);
    clock.advance(secs(5));
    wait_for("the timed-out run waits to retry", || waiting(&h, "k"));
    rec.open("k");
    h.enqueue_after(s("plain"), secs(1));
    clock.advance(secs(1));
    idle(&h);
    assert_eq!(rec.starts("k")[1].priority, 7);
    assert_eq!(rec.order(), vec![s("k"), s("k"), s("plain")], "the retry at 7 before a key at 0 due with it");
    stop(&h);
}

/// P1/P2 + FakeClock: keys the fake clock makes due together go out
/// highest priority first, each with the priority it was delayed with.
#[test]
fn pair_priorities_fake_clock() {
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = rec.controller("priorities-clock", 1).clock(clock.clone()).start();
    for (k, p) in [("low", -1), ("mid", 0), ("high", 5)] {
        h.enqueue_after_with_priority(s(k), secs(10), p);
    }
    clock.advance(secs(9));
    assert!(rec.runs().is_empty());
    clock.advance(secs(1));
    idle(&h);
    assert_eq!(rec.order(), vec![s("high"), s("mid"), s("low")]);
    assert_eq!(rec.starts("high")[0].priority, 5);
    stop(&h);
}

// ---- leader election and sharding × ... ---------------------------------

const TTL: Duration = Duration::from_secs(2);
const PARTITIONS: u32 = 4;

#[derive(Clone, Copy, Debug)]
enum Replicas {
    Leader,
    Sharded,
}

impl Replicas {
    /// `controller` leading its election, or owning every partition, as
    /// the only replica on `etcd`.
    fn join(self, etcd: &Etcd, controller: Controller<String>, name: &str) -> Controller<String> {
        match self {
            Self::Leader => controller.leader_election(LeaderElection::new(&etcd.endpoint, name).ttl(TTL)),
            Self::Sharded => controller.sharding(Sharding::new(&etcd.endpoint, name).partitions(PARTITIONS).ttl(TTL)),
        }
    }

    fn start(self, etcd: &Etcd, controller: Controller<String>, name: &str) -> ControllerHandle<String> {
        let h = self.join(etcd, controller, name).start();
        self.wait_in_charge(&h);
        h
    }

    fn wait_in_charge(self, h: &ControllerHandle<String>) {
        wait_for(&format!("{self:?}: in charge"), || match self {
            Self::Leader => h.stats().leader.is_some_and(|l| l.is_leader()),
            Self::Sharded => h.owned_partitions().len() == PARTITIONS as usize,
        });
    }
}

/// Every run carried a fencing token (L2 / H4).
fn fenced(rec: &Recorder) {
    assert!(rec.runs().iter().all(|r| r.token.is_some()), "{:?}", rec.runs());
}

/// S2 with replicas: a key pending at a stop comes back after a restart
/// and runs under the new leadership's (partition's) token.
fn store_with(replicas: Replicas, name: &str) {
    let (etcd, dir) = (Etcd::start(), TempDir::new());
    let first = Recorder::default();
    let h = replicas.start(&etcd, first.controller(name, 1).store(open_store(&dir)), name);
    first.then("k", Err(ReconcileError::new("stopped")));
    first.run_blocked(&h, "k", 0);
    h.enqueue_after(s("later"), secs(3600));
    stop(&h);
    let token = first.starts("k")[0].token.unwrap();

    let second = Recorder::default();
    let h = replicas.start(&etcd, second.controller(name, 1).store(open_store(&dir)), name);
    wait_for("the stored key under the new token", || second.started("k") == 1);
    let run = &second.starts("k")[0];
    assert!(run.token.unwrap() > token && run.attempt == 1, "{run:?} after token {token}");
    assert!(waiting(&h, "later"));
    stop(&h);
}

#[test]
fn pair_store_leader_election() {
    store_with(Replicas::Leader, "store-leader");
}

#[test]
fn pair_store_sharding() {
    store_with(Replicas::Sharded, "store-shards");
}

/// D1/D2 with replicas: a child waits for its running parent and follows
/// it, every run fenced.
fn dependencies_with(replicas: Replicas, name: &str) {
    let etcd = Etcd::start();
    let rec = Recorder::default();
    let c = replicas.join(&etcd, rec.controller(name, 2), name);
    c.handle().set_dependencies(&s("child"), [s("parent")]).unwrap();
    let h = c.start();
    replicas.wait_in_charge(&h);
    rec.run_blocked(&h, "parent", 0);
    h.enqueue(s("child"));
    wait_for("child held", || h.stats().held == 1);
    rec.open("parent");
    idle(&h);
    assert!(rec.at(false, "parent", 0) < rec.at(true, "child", 0));
    assert_eq!(rec.started("child"), 1);
    fenced(&rec);
    stop(&h);
}

#[test]
fn pair_leader_election_dependencies() {
    dependencies_with(Replicas::Leader, "deps-leader");
}

/// U3 with replicas: a batch holds what becomes ready until it closes.
fn batches_with(replicas: Replicas, name: &str) {
    let etcd = Etcd::start();
    let rec = Recorder::default();
    let h = replicas.start(&etcd, rec.controller(name, 2), name);
    let batch = h.batch();
    h.enqueue(s("a"));
    h.enqueue(s("b"));
    assert_eq!(h.stats().held, 2);
    drop(batch);
    idle(&h);
    assert_eq!((rec.started("a"), rec.started("b")), (1, 1));
    fenced(&rec);
    stop(&h);
}

#[test]
fn pair_leader_election_batches() {
    batches_with(Replicas::Leader, "batch-leader");
}

#[test]
fn pair_sharding_batches() {
    batches_with(Replicas::Sharded, "batch-shards");
}

/// U1 with replicas: a running key enqueued again is cancelled and rerun
/// under the same token.
fn supersede_with(replicas: Replicas, name: &str) {
    let etcd = Etcd::start();
    let rec = Recorder::default();
    let h = replicas.start(&etcd, rec.controller(name, 1).supersede(true), name);
    rec.run_blocked(&h, "k", 0);
    h.enqueue(s("k"));
    wait_for("cancelled and rerun", || rec.started("k") == 2);
    rec.open("k");
    idle(&h);
    assert_eq!((h.stats().superseded, h.stats().failures), (1, 0));
    let tokens: Vec<_> = rec.starts("k").iter().map(|r| r.token).collect();
    assert!(tokens[0].is_some() && tokens[0] == tokens[1], "{tokens:?}");
    stop(&h);
}

#[test]
fn pair_leader_election_supersede() {
    supersede_with(Replicas::Leader, "supersede-leader");
}

#[test]
fn pair_sharding_supersede() {
    supersede_with(Replicas::Sharded, "supersede-shards");
}

/// U2 with replicas: a burst of enqueues is one fenced reconcile a window
/// after the last.
fn debounce_with(replicas: Replicas, name: &str) {
    let etcd = Etcd::start();
    let rec = Recorder::default();
    let h = replicas.start(&etcd, rec.controller(name, 1).debounce(secs(2)), name);
    for _ in 0..5 {
        h.enqueue(s("k"));
    }
    assert!(waiting(&h, "k"));
    idle(&h);
    assert_eq!(rec.started("k"), 1, "one reconcile for the burst");
    fenced(&rec);
    stop(&h);
}

#[test]
fn pair_leader_election_debounce() {
    debounce_with(Replicas::Leader, "debounce-leader");
}

#[test]
fn pair_sharding_debounce() {
    debounce_with(Replicas::Sharded, "debounce-shards");
}

/// P5 with replicas: a full group's key waits while another goes ahead.
fn groups_with(replicas: Replicas, name: &str) {
    let etcd = Etcd::start();
    let rec = Recorder::default();
    let h = replicas.start(&etcd, rec.controller(name, 3).group(by_initial).max_in_flight_per_group(1), name);
    rec.run_blocked(&h, "g1", 0);
    h.enqueue(s("g2"));
    h.enqueue_with_priority(s("x"), -1);
    wait_for("x went ahead of the full group's key", || rec.started("x") == 1);
    assert_eq!(rec.started("g2"), 0);
    rec.open("g1");
    idle(&h);
    assert_eq!(rec.most_at_once("g"), 1);
    fenced(&rec);
    stop(&h);
}

#[test]
fn pair_leader_election_groups() {
    groups_with(Replicas::Leader, "groups-leader");
}

#[test]
fn pair_sharding_groups() {
    groups_with(Replicas::Sharded, "groups-shards");
}

/// P1 with replicas: ready keys go out highest priority first.
fn priorities_with(replicas: Replicas, name: &str) {
    let etcd = Etcd::start();
    let rec = Recorder::default();
    let h = replicas.start(&etcd, rec.controller(name, 1), name);
    rec.run_blocked(&h, "busy", 0);
    for (k, p) in [("low", -1), ("mid", 0), ("high", 5)] {
        h.enqueue_with_priority(s(k), p);
    }
    rec.open("busy");
    idle(&h);
    assert_eq!(rec.order(), vec![s("busy"), s("high"), s("mid"), s("low")]);
    fenced(&rec);
    stop(&h);
}

#[test]
fn pair_leader_election_priorities() {
    priorities_with(Replicas::Leader, "priorities-leader");
}

#[test]
fn pair_sharding_priorities() {
    priorities_with(Replicas::Sharded, "priorities-shards");
}

/// §7 with replicas: a run past its timeout is cancelled while the
/// replica stays in charge, and retried as a failure under its token.
fn timeout_with(replicas: Replicas, name: &str) {
    let etcd = Etcd::start();
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = replicas.start(&etcd, rec.controller(name, 1).clock(clock.clone()).timeout(secs(5)), name);
    rec.run_blocked(&h, "k", 0);
    clock.advance(secs(5));
    wait_for("timed out", || waiting(&h, "k"));
    rec.open("k");
    clock.advance(secs(1));
    wait_for("retried", || rec.started("k") == 2);
    idle(&h);
    assert_eq!(rec.starts("k")[1].attempt, 1);
    assert!(h.inspect(&s("k")).last_error.is_none() && h.stats().last_error.unwrap().contains("timed out"));
    fenced(&rec);
    stop(&h);
}

#[test]
fn pair_leader_election_timeout() {
    timeout_with(Replicas::Leader, "timeout-leader");
}

#[test]
fn pair_sharding_timeout() {
    timeout_with(Replicas::Sharded, "timeout-shards");
}

/// FakeClock with replicas: the controller's delays follow the fake
/// clock, while leases stay on real time: an hour of fake time neither
/// ends the leadership (ownership) nor runs anything before it is due.
fn fake_clock_with(replicas: Replicas, name: &str) {
    let etcd = Etcd::start();
    let rec = Recorder::default();
    let clock = FakeClock::new();
    let h = replicas.start(&etcd, rec.controller(name, 1).clock(clock.clone()), name);
    h.enqueue_after(s("k"), secs(3600));
    clock.advance(secs(3599));
    assert!(waiting(&h, "k") && rec.runs().is_empty());
    clock.advance(secs(1));
    wait_for("due on the fake clock", || rec.started("k") == 1);
    replicas.wait_in_charge(&h);
    fenced(&rec);
    stop(&h);
}

#[test]
fn pair_leader_election_fake_clock() {
    fake_clock_with(Replicas::Leader, "clock-leader");
}

#[test]
fn pair_sharding_fake_clock() {
    fake_clock_with(Replicas::Sharded, "clock-shards");
}

/// Leader election and sharding on one controller are refused at
/// construction, naming both, in either order.
#[test]
fn pair_leader_election_sharding() {
    let endpoint = etcd::unreachable_endpoint();
    for leader_first in [true, false] {
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let c = Recorder::default().controller("both", 1);
            let (le, sh) = (LeaderElection::new(&endpoint, "both"), Sharding::new(&endpoint, "both"));
            if leader_first { c.leader_election(le).sharding(sh) } else { c.sharding(sh).leader_election(le) }
        }));
        let panic = refused.expect_err("refused");
        let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("leader_election or sharding, not both"), "{message}");
    }
}

/// C5: a standby keeps its cache synced; on taking over it reconciles
/// every key the cache holds, reading what the cache holds, fenced.
#[test]
fn pair_leader_election_cache() {
    let etcd = Etcd::start();
    let (system, rec) = (System::default(), Recorder::default());
    system.put("a", 1);
    let cache = system.cache("cache-leader", &rec);
    let other = LeaderElection::new(&etcd.endpoint, "cache-leader").ttl(TTL).identity("other");
    other.start();
    wait_for("the other process leads", || other.is_leader());
    let c = rec.controller("cache-leader", 1).watch_cache(&cache, split_map());
    let h = Replicas::Leader.join(&etcd, c, "cache-leader").start();
    assert!(h.wait_synced(Some(PATIENCE)), "a standby syncs its caches");
    system.put("b", 2);
    wait_for("the standby's cache holds the change", || cache.get(&s("b")).is_some());
    assert!(rec.runs().is_empty(), "a standby reconciles nothing");
    other.stop();
    Replicas::Leader.wait_in_charge(&h);
    idle(&h);
    assert_eq!(rec.starts("a")[0].cached, Some(1));
    assert_eq!(rec.starts("b")[0].cached, Some(2));
    fenced(&rec);
    stop(&h);
}
