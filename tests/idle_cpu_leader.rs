//! G8 with leader election and sharding (guarantees §10, §11): an idle
//! leader, an idle standby and an idle sharded replica, each with a
//! controller, ask etcd for nothing but keep-alives (every ttl/3; the
//! standby's watch stays open, the replica's is reopened after each of
//! its keep-alives, from the revision it has seen: no reads, no polling),
//! and use next to no CPU. A binary of its own: it measures the CPU time of
//! the whole process, and tests of one binary share a process.

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the pausing helpers serve other tests
mod etcd;

use std::time::{Duration, Instant};

use common::{process_cpu_time, wait_for};
use etcd::Etcd;
use reconq::{Action, Context, Controller, LeaderElection, ReconcileError, Sharding};

const TTL: Duration = Duration::from_secs(3);
const WINDOW: Duration = Duration::from_secs(4);
/// A few keep-alive calls over HTTP (in a debug build, as CI runs it); a
/// poll loop or a spinning worker would be far above it.
const BUDGET: Duration = Duration::from_millis(50);

#[test]
fn g8_an_idle_leader_standby_and_shard_only_keep_alive() {
    let etcd = Etcd::start();
    let election = |who: &str| LeaderElection::new(&etcd.endpoint, "idle").ttl(TTL).identity(who);
    let noop = |_: &u32, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) };
    let (ea, eb) = (election("a"), election("b"));
    let a = Controller::new("idle-a", noop).workers(2).leader_election(ea.clone()).start();
    wait_for("a to lead", || ea.is_leader());
    let b = Controller::new("idle-b", noop).workers(2).leader_election(eb.clone()).start();
    // The standby's workers wait for leadership with a key in hand.
    b.enqueue(1);
    wait_for("b to see a lead", || eb.leader().as_deref() == Some("a"));
    let sharding = Sharding::new(&etcd.endpoint, "idle").partitions(4).ttl(TTL);
    let s = Controller::new("idle-s", noop).workers(2).sharding(sharding).resync(|| 0..100u32).start();
    wait_for("the replica to own every partition", || s.owned_partitions().len() == 4);
    assert!(s.wait_idle(common::PATIENCE));
    std::thread::sleep(Duration::from_millis(300)); // b opens its watch

    let (asked_before, cpu_before, t0) = (etcd.requests(), process_cpu_time(), Instant::now());
    while t0.elapsed() < WINDOW {
        std::thread::sleep(WINDOW - t0.elapsed());
    }
    let (cpu, asked_after) = (process_cpu_time() - cpu_before, etcd.requests());
    let asked = |method: &str| asked_after.get(method).unwrap_or(&0) - asked_before.get(method).unwrap_or(&0);
    println!("idle leader + standby + shard, {WINDOW:?}: {cpu:?} CPU, {} keep-alives", asked("LeaseKeepAlive"));
    for method in ["Range", "Txn", "LeaseGrant", "Put", "DeleteRange"] {
        assert_eq!(asked(method), 0, "{method} calls while idle: {asked_after:?}");
    }
    let keep_alives = asked("LeaseKeepAlive");
    // The leader's and the replica's, every ttl/3.
    let most = 2 * (WINDOW.as_millis() / (TTL / 3).as_millis() + 1);
    assert!((2..=most as u64).contains(&keep_alives), "{keep_alives} keep-alives in {WINDOW:?}");
    assert!(asked("Watch") <= keep_alives / 2 + 1, "watches reopened more often than the replica's keep-alives");
    assert!(cpu < BUDGET, "{cpu:?} of CPU in {WINDOW:?} idle");
    assert!(ea.is_leader() && b.stats().reconciles == 0);
    a.stop();
    b.stop();
    s.stop();
}
