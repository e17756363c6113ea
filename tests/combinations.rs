//! Spec §17, C6: the combinations matrix. One test per pair of features
//! (store, leader election, sharding, watched caches, dependencies,
//! batches, supersede, debounce, groups, priorities, timeouts, FakeClock)
//! that no test of a single feature already covers, each checking a
//! guarantee of both sides at once. docs/guarantees.md ("Combinations
//! (C6)") is the table that links every pair to its test.
//! Leader election and sharding: tests/combinations_replicas.rs.

mod common;
#[path = "common/recorder.rs"]
mod recorder;

use common::{PATIENCE, TempDir, secs, wait_for};
use reconq::*;
use recorder::*;

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
