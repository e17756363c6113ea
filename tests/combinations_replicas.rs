//! Spec §17, C6: the pairs of leader election and sharding with the other
//! features (docs/guarantees.md, "Combinations (C6)"), on a real etcd the
//! test starts, one replica in charge. Apart from the other pairs
//! (tests/combinations.rs) because these spawn etcd processes.

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the request counters serve idle_cpu_leader.rs
mod etcd;
#[path = "common/recorder.rs"]
mod recorder;

use std::time::Duration;

use common::{PATIENCE, TempDir, secs, wait_for};
use etcd::Etcd;
use reconq::*;
use recorder::*;

// ---- leader election and sharding × ... ---------------------------------

/// Long enough that a loaded machine renews every lease in time: these
/// tests never wait for one to expire, and a partition that left and came
/// back would drop what its replica held (C2 without a cache or `resync`).
const TTL: Duration = Duration::from_secs(5);
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
    assert_eq!(rec.started("k"), 1, "one reconcile for the burst: {:?}", h.stats());
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
