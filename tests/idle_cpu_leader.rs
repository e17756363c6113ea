//! G8 with leader election (guarantees §10): an idle leader and an idle
//! standby, each with a controller, ask etcd for nothing but the leader's
//! keep-alives (every ttl/3; the standby's watch stays open, no polling),
//! and use next to no CPU. A binary of its own: it measures the CPU time of
//! the whole process, and tests of one binary share a process.

mod common;
#[path = "common/etcd.rs"]
#[allow(dead_code)] // the pausing helpers serve other tests
mod etcd;

use std::time::{Duration, Instant};

use common::wait_for;
use etcd::Etcd;
use reconq::{Action, Context, Controller, LeaderElection, ReconcileError};

const TTL: Duration = Duration::from_secs(3);
const WINDOW: Duration = Duration::from_secs(4);
/// A few keep-alive calls over HTTP; a poll loop or a spinning worker
/// would be far above it.
const BUDGET: Duration = Duration::from_millis(30);

fn process_cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[test]
fn g8_an_idle_leader_and_standby_only_keep_alive() {
    let etcd = Etcd::start();
    let election = |who: &str| LeaderElection::new(&[&etcd.endpoint], "idle").unwrap().ttl(TTL).unwrap().identity(who);
    let noop = |_: &u32, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) };
    let (ea, eb) = (election("a"), election("b"));
    let a = Controller::new("idle-a", noop).workers(2).leader_election(ea.clone()).start();
    wait_for("a to lead", || ea.is_leader());
    let b = Controller::new("idle-b", noop).workers(2).leader_election(eb.clone()).start();
    // The standby's workers wait for leadership with a key in hand.
    b.enqueue(1);
    wait_for("b to see a lead", || eb.leader().as_deref() == Some("a"));
    std::thread::sleep(Duration::from_millis(300)); // b opens its watch

    let (asked_before, cpu_before, t0) = (etcd.requests(), process_cpu_time(), Instant::now());
    while t0.elapsed() < WINDOW {
        std::thread::sleep(WINDOW - t0.elapsed());
    }
    let (cpu, asked_after) = (process_cpu_time() - cpu_before, etcd.requests());
    let asked = |method: &str| asked_after.get(method).unwrap_or(&0) - asked_before.get(method).unwrap_or(&0);
    println!("idle leader + standby, {WINDOW:?}: {cpu:?} CPU, {} keep-alives", asked("LeaseKeepAlive"));
    for method in ["Range", "Txn", "LeaseGrant", "Watch", "Put", "DeleteRange"] {
        assert_eq!(asked(method), 0, "{method} calls while idle: {asked_after:?}");
    }
    let keep_alives = asked("LeaseKeepAlive");
    let most = WINDOW.as_millis() / (TTL / 3).as_millis() + 1;
    assert!((1..=most as u64).contains(&keep_alives), "{keep_alives} keep-alives in {WINDOW:?}");
    assert!(cpu < BUDGET, "{cpu:?} of CPU in {WINDOW:?} idle");
    assert!(ea.is_leader() && b.stats().reconciles == 0);
    a.stop();
    b.stop();
}
