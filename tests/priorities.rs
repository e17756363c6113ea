//! Spec §8 P1–P3 on the queue and the controller: highest priority first,
//! FIFO within one, raise never lower, delayed keys and retries keep their
//! priority; `by_priority` in the stats; the priority in the `Context`.

mod common;

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use parking_lot::Mutex;
use reconq::*;

fn drain(q: &WorkQueue<&'static str>) -> Vec<&'static str> {
    std::iter::from_fn(|| q.try_get()).collect()
}

#[test]
fn p1_highest_priority_first_fifo_within_one() {
    let q = WorkQueue::new();
    q.add("a");
    q.add_with_priority("b", 2);
    q.add_with_priority("c", -1);
    q.add_with_priority("d", 2);
    q.add("e");
    q.add_with_priority("f", i32::MAX);
    q.add_with_priority("g", i32::MIN);
    assert_eq!(q.len(), 7);
    assert_eq!(q.len_by_priority(), vec![(i32::MAX, 1), (2, 2), (0, 2), (-1, 1), (i32::MIN, 1)]);
    assert_eq!(drain(&q), ["f", "b", "d", "a", "e", "c", "g"]);
}

#[test]
fn p2_an_add_raises_a_ready_key_and_never_lowers_it() {
    let q = WorkQueue::new();
    q.add("a");
    q.add("b");
    q.add_with_priority("c", 1);
    q.add_with_priority("b", 5); // raised: ahead of everything
    q.add_with_priority("c", -3); // lower: changes nothing
    q.add_after_with_priority("a", secs(100), 3); // raises, does not delay a ready key
    assert_eq!(q.len(), 3, "raises do not add keys");
    assert_eq!(q.len_by_priority(), vec![(5, 1), (3, 1), (1, 1)]);
    assert_eq!(drain(&q), ["b", "a", "c"]);
    for k in ["a", "b", "c"] {
        q.done(&k);
    }
    assert!(q.is_empty() && q.processing_len() == 0);
}

#[test]
fn p2_a_delayed_key_keeps_its_priority_when_it_becomes_ready() {
    let (q, clock) = fake_queue();
    q.add_after_with_priority("late", secs(1), 7);
    q.add_after_with_priority("raised", secs(1), 0);
    q.add_at_with_priority("raised", clock.now() + secs(5), 4); // later due time: only the priority rises
    q.add("early");
    clock.advance(secs(1));
    assert_eq!(q.len_by_priority(), vec![(7, 1), (4, 1), (0, 1)]);
    assert_eq!(drain(&q), ["late", "raised", "early"]);
}

#[test]
fn p2_a_plain_add_of_a_delayed_key_keeps_the_higher_priority() {
    let (q, _clock) = fake_queue();
    q.add("x");
    q.add_after_with_priority("hi", secs(10), 3);
    q.add("hi"); // ready now, still at 3
    assert_eq!(drain(&q), ["hi", "x"]);
}

#[test]
fn p2_a_dirty_key_comes_back_with_the_highest_priority_it_was_given() {
    let q = WorkQueue::new();
    q.add("k");
    assert_eq!(q.get_with_priority(), Some(("k", 0)));
    q.add_with_priority("k", 2);
    q.add_with_priority("k", 9);
    q.add_with_priority("k", 1);
    q.add_with_priority("other", 5);
    q.done(&"k");
    assert_eq!(q.get_with_priority(), Some(("k", 9)));
    assert_eq!(q.get_with_priority(), Some(("other", 5)));
}

#[test]
fn p2_a_key_waiting_after_done_keeps_its_priority() {
    let (q, clock) = fake_queue();
    q.add_with_priority("k", 6);
    assert_eq!(q.get_with_priority(), Some(("k", 6)));
    q.add_after_with_priority("k", secs(1), 6); // a retry at the priority it had
    q.done(&"k");
    q.add("low");
    clock.advance(secs(1));
    assert_eq!(q.get_with_priority(), Some(("k", 6)));
}

#[test]
fn p3_a_bare_queue_retry_keeps_the_priority_it_was_handed_out_with() {
    let (q, clock) = fake_queue_with(ExponentialBackoff::new(secs(1), secs(1)));
    q.add_with_priority("hi", 5);
    assert_eq!(q.get_with_priority(), Some(("hi", 5)));
    q.add_rate_limited("hi"); // before done, as a worker retrying a failure does
    q.done(&"hi");
    q.add_with_priority("lo", 1);
    clock.advance(secs(1));
    assert_eq!(q.get_with_priority(), Some(("hi", 5)), "the retry comes back at 5, ahead of 1");
    assert_eq!(q.get_with_priority(), Some(("lo", 1)));
}

#[test]
fn p3_a_bare_queue_retry_without_delay_keeps_the_priority_too() {
    let q = WorkQueue::with_rate_limiter(ExponentialBackoff::new(Duration::ZERO, Duration::ZERO));
    q.add_with_priority("hi", 5);
    assert_eq!(q.get_with_priority(), Some(("hi", 5)));
    q.add_rate_limited("hi");
    q.add_with_priority("lo", 1);
    q.done(&"hi");
    assert_eq!(q.get_with_priority(), Some(("hi", 5)));
}

#[test]
fn a_raise_does_not_let_a_key_jump_its_old_queue_later() {
    // "a" is raised out of level 0 (leaving a stale entry), handed out,
    // and added at 0 again: it must queue behind "b", not at its old place.
    let q = WorkQueue::new();
    q.add("a");
    q.add("b");
    q.add_with_priority("a", 1);
    assert_eq!(q.try_get(), Some("a"));
    q.done(&"a");
    q.add("a");
    assert_eq!(drain(&q), ["b", "a"]);
}

/// The (key, priority) of each reconcile, in order.
type Seen = Arc<Mutex<Vec<(String, i32)>>>;

/// A controller on a fake clock whose reconcile records (key, priority),
/// fails keys listed in `fail_once` once with `retry_after(1 s)`, and
/// blocks on key "gate" until the returned sender fires.
fn recording_controller(
    fail_once: &'static [&'static str],
    clock: &FakeClock,
) -> (Controller<String>, Seen, mpsc::Sender<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (release, gate) = mpsc::channel::<()>();
    let gate = Mutex::new(gate);
    let log = Arc::clone(&seen);
    let c = Controller::new("prio", move |key: &String, ctx: &Context| -> Result<Action, ReconcileError> {
        log.lock().push((key.clone(), ctx.priority()));
        if key == "gate" {
            gate.lock().recv_timeout(PATIENCE).expect("the test releases the gate");
        }
        if fail_once.contains(&key.as_str()) && ctx.attempt() == 0 {
            return Err(ReconcileError::retry_after(secs(1), "once"));
        }
        Ok(Action::Done)
    })
    .clock(clock.clone());
    (c, seen, release)
}

#[test]
fn p1_the_controller_reconciles_higher_priorities_first() {
    let clock = FakeClock::new();
    let (c, seen, _release) = recording_controller(&[], &clock);
    let h = c.handle();
    h.enqueue("low".to_string());
    h.enqueue_with_priority("high".to_string(), 10);
    h.enqueue_after_with_priority("mid".to_string(), secs(0), 5);
    h.enqueue_with_priority("neg".to_string(), -5);
    assert_eq!(h.stats().by_priority, vec![(10, 1), (5, 1), (0, 1), (-5, 1)], "pending keys count before start");
    let h = c.start();
    assert!(h.wait_idle(PATIENCE));
    let seen = seen.lock().clone();
    let expect: Vec<(String, i32)> =
        [("high", 10), ("mid", 5), ("low", 0), ("neg", -5)].iter().map(|(k, p)| (k.to_string(), *p)).collect();
    assert_eq!(seen, expect, "order and Context::priority");
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn p3_a_retry_keeps_the_priority_it_was_handed_out_with() {
    let clock = FakeClock::new();
    let (c, seen, release) = recording_controller(&["hi"], &clock);
    let h = c.start();
    h.enqueue_with_priority("hi".to_string(), 5);
    wait_for("hi waits for its retry", || matches!(h.inspect(&"hi".to_string()).state, KeyStatus::Waiting { .. }));
    h.enqueue("gate".to_string());
    wait_for("the gate runs", || seen.lock().len() == 2);
    h.enqueue("a".to_string());
    h.enqueue("b".to_string());
    clock.advance(secs(1)); // hi is due: ready after a and b, but at priority 5
    assert_eq!(h.stats().by_priority, vec![(5, 1), (0, 2)]);
    release.send(()).unwrap();
    assert!(h.wait_idle(PATIENCE));
    let order: Vec<(String, i32)> = seen.lock().clone();
    let expect: Vec<(String, i32)> =
        [("hi", 5), ("gate", 0), ("hi", 5), ("a", 0), ("b", 0)].iter().map(|(k, p)| (k.to_string(), *p)).collect();
    assert_eq!(order, expect);
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn p3_a_requeue_keeps_the_priority_and_a_raise_meanwhile_wins() {
    let clock = FakeClock::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let (entered_tx, entered) = mpsc::channel::<()>();
    let (release, gate) = mpsc::channel::<()>();
    let (entered_tx, gate) = (Mutex::new(entered_tx), Mutex::new(gate));
    let h = Controller::new("requeue", move |key: &String, ctx: &Context| -> Result<Action, ReconcileError> {
        log.lock().push((key.clone(), ctx.priority()));
        if log.lock().len() == 1 {
            entered_tx.lock().send(()).unwrap();
            gate.lock().recv_timeout(PATIENCE).unwrap();
            return Ok(Action::RequeueAfter(secs(1)));
        }
        Ok(Action::Done)
    })
    .clock(clock.clone())
    .start();
    h.enqueue_with_priority("k".to_string(), 2);
    expect_within(&entered, "first reconcile");
    h.enqueue_after_with_priority("k".to_string(), secs(30), 8); // raised while it runs
    release.send(()).unwrap();
    wait_for("k waits", || matches!(h.inspect(&"k".to_string()).state, KeyStatus::Waiting { .. }));
    clock.advance(secs(1));
    assert!(h.wait_idle(PATIENCE));
    assert_eq!(*seen.lock(), vec![("k".to_string(), 2), ("k".to_string(), 8)]);
    assert!(h.stop_with_drain(PATIENCE));
}

#[test]
fn context_defaults() {
    let ctx = Context::detached(3);
    assert_eq!((ctx.attempt(), ctx.priority(), ctx.fencing_token(), ctx.is_cancelled()), (3, 0, None, false));
}
