//! Spec §8 P4 (round-robin across groups within a priority) and P5 (at most
//! `max_in_flight_per_group` keys of one group at once, the rest waiting
//! without a worker), `in_flight_by_group`, and a failing group function.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use common::*;
use parking_lot::Mutex;
use reconq::*;

// `&String`, not `&str`: `.group` takes it as a function of `&K`.
#[allow(clippy::ptr_arg)]
fn group_of(key: &String) -> String {
    key.split('/').next().unwrap_or_default().to_string()
}

/// Enqueues 100 keys of group "a", then one of "b", before start; one worker.
/// Returns the position at which "b/0" was reconciled.
fn position_of_b(grouped: bool) -> usize {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let mut c = Controller::new("fair", move |key: &String, _: &Context| -> Result<Action, ReconcileError> {
        log.lock().push(key.clone());
        Ok(Action::Done)
    });
    if grouped {
        c = c.group(group_of);
    }
    let h = c.handle();
    for i in 0..100 {
        h.enqueue(format!("a/{i}"));
    }
    h.enqueue("b/0".to_string());
    let h = c.start();
    assert!(h.wait_idle(PATIENCE));
    assert!(h.stop_with_drain(PATIENCE));
    let seen = seen.lock();
    assert_eq!(seen.len(), 101);
    seen.iter().position(|k| k == "b/0").unwrap()
}

#[test]
fn p4_a_big_group_cannot_starve_a_small_one() {
    assert!(position_of_b(true) <= 1, "at most one hand-out of the other group first");
    assert_eq!(position_of_b(false), 100, "without groups: FIFO");
}

#[test]
fn p4_groups_take_turns_within_a_priority_and_priorities_still_come_first() {
    let q_order = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&q_order);
    let c = Controller::new("turns", move |key: &String, _: &Context| -> Result<Action, ReconcileError> {
        log.lock().push(key.clone());
        Ok(Action::Done)
    })
    .group(group_of);
    let h = c.handle();
    for k in ["a/1", "a/2", "a/3", "b/1", "b/2", "c/1"] {
        h.enqueue(k.to_string());
    }
    h.enqueue_with_priority("a/hi".to_string(), 1);
    let h = c.start();
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(*q_order.lock(), ["a/hi", "a/1", "b/1", "c/1", "a/2", "b/2", "a/3"]);
    assert!(h.stop_with_drain(PATIENCE));
}

/// A controller with `workers` workers and a per-group limit whose reconcile
/// of any key starting with "a/" blocks until released, tracking how many
/// "a" keys run at once.
struct Limited {
    handle: ControllerHandle<String>,
    gate: Gate,
    max_a: Arc<AtomicUsize>,
    done: Arc<Mutex<Vec<String>>>,
}

impl Limited {
    /// Enqueues keys `a/0` to `a/{n-1}` and waits until `running` of them run.
    fn enqueue_a_keys(&self, n: usize, running: usize) {
        for i in 0..n {
            self.handle.enqueue(format!("a/{i}"));
        }
        wait_for(&format!("{running} a keys to run"), || self.handle.stats().processing == running);
    }

    /// Lets `n` "a" reconciles through and waits until the controller is idle.
    fn release_and_wait_idle(&self, n: usize) {
        for _ in 0..n {
            self.gate.release();
        }
        assert!(self.handle.wait_idle(PATIENCE));
    }
}

fn limited(workers: usize, limit: usize) -> Limited {
    let gate = Gate::new();
    let a_key = gate.clone();
    let running_a = Arc::new(AtomicUsize::new(0));
    let max_a = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(Mutex::new(Vec::new()));
    let (r, m, d) = (Arc::clone(&running_a), Arc::clone(&max_a), Arc::clone(&done));
    let handle = Controller::new("limited", move |key: &String, _: &Context| -> Result<Action, ReconcileError> {
        if key.starts_with("a/") {
            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            a_key.pass();
            r.fetch_sub(1, Ordering::SeqCst);
        }
        d.lock().push(key.clone());
        Ok(Action::Done)
    })
    .workers(workers)
    .group(group_of)
    .max_in_flight_per_group(limit)
    .start();
    Limited { handle, gate, max_a, done }
}

#[test]
fn p5_a_full_group_waits_without_a_worker_and_others_go_ahead() {
    let t = limited(2, 1);
    t.enqueue_a_keys(5, 1);
    for i in 0..20 {
        t.handle.enqueue(format!("b/{i}"));
    }
    // One worker is held by a/0; the other must run every b key although
    // four a keys were ready before them.
    wait_for("every b key done", || t.done.lock().len() == 20);
    assert!(t.done.lock().iter().all(|k| k.starts_with("b/")));
    let s = t.handle.stats();
    assert_eq!((s.processing, s.depth), (1, 4), "a/1..a/4 wait, without a worker");
    assert_eq!(t.handle.in_flight_by_group::<String>(), vec![(Some("a".to_string()), 1)]);
    t.release_and_wait_idle(5);
    assert_eq!(t.max_a.load(Ordering::SeqCst), 1, "never two a keys at once");
    assert_eq!(t.done.lock().len(), 25);
    assert!(t.handle.in_flight_by_group::<String>().is_empty());
    assert!(t.handle.stop_with_drain(PATIENCE));
}

#[test]
fn p5_the_limit_is_per_group_and_counts_exactly_n() {
    let t = limited(4, 2);
    t.enqueue_a_keys(6, 2);
    assert_eq!(t.handle.in_flight_by_group::<String>(), vec![(Some("a".to_string()), 2)]);
    assert!(t.handle.in_flight_by_group::<u32>().is_empty(), "another group type reads nothing");
    t.release_and_wait_idle(6);
    assert_eq!(t.max_a.load(Ordering::SeqCst), 2);
    assert!(t.handle.stop_with_drain(PATIENCE));
}

#[test]
fn p5_a_retry_of_a_full_groups_key_waits_for_room() {
    // a/0 fails once (retried at once) while a/1 holds the group's only
    // slot: the retry must wait until a/1 is done.
    let clock = FakeClock::new();
    let running = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let calls = Arc::new(AtomicUsize::new(0));
    let (r, m, n) = (Arc::clone(&running), Arc::clone(&max), Arc::clone(&calls));
    let h = Controller::new("retry", move |key: &String, ctx: &Context| -> Result<Action, ReconcileError> {
        let now = r.fetch_add(1, Ordering::SeqCst) + 1;
        m.fetch_max(now, Ordering::SeqCst);
        n.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(ms(2));
        r.fetch_sub(1, Ordering::SeqCst);
        if key == "a/0" && ctx.attempt() < 3 {
            return Err(ReconcileError::retry_after(ms(0), "again"));
        }
        Ok(Action::Done)
    })
    .clock(clock)
    .workers(3)
    .group(group_of)
    .max_in_flight_per_group(1)
    .start();
    for k in ["a/0", "a/1", "a/2"] {
        h.enqueue(k.to_string());
    }
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    assert_eq!(max.load(Ordering::SeqCst), 1);
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn a_panicking_group_function_puts_the_key_in_group_none() {
    let (release, gate) = mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let h = Controller::new("nogroup", move |_: &String, _: &Context| -> Result<Action, ReconcileError> {
        gate.lock().recv_timeout(PATIENCE).unwrap();
        Ok(Action::Done)
    })
    .workers(2)
    .group(|key: &String| -> String {
        assert!(!key.starts_with("bad"), "no group for {key}");
        group_of(key)
    })
    .max_in_flight_per_group(1)
    .start();
    h.enqueue("bad/1".to_string());
    h.enqueue("bad/2".to_string());
    h.enqueue("a/1".to_string());
    wait_for("two running", || h.stats().processing == 2);
    let mut groups = h.in_flight_by_group::<String>();
    groups.sort();
    assert_eq!(groups, vec![(None, 1), (Some("a".to_string()), 1)], "bad/1 and bad/2 share group None");
    assert_eq!(h.stats().depth, 1);
    for _ in 0..3 {
        release.send(()).unwrap();
    }
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(h.stats().successes, 3);
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
#[should_panic(expected = "max_in_flight_per_group must be at least 1")]
fn a_zero_group_limit_is_refused() {
    let _ = Controller::new("zero", |_: &u32, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
        .group(|k: &u32| *k)
        .max_in_flight_per_group(0);
}

#[test]
#[should_panic(expected = "max_in_flight_per_group needs a group function")]
fn a_group_limit_without_groups_is_refused_at_start() {
    let _ = Controller::new("nogroupfn", |_: &u32, _: &Context| -> Result<Action, ReconcileError> { Ok(Action::Done) })
        .max_in_flight_per_group(1)
        .start();
}
