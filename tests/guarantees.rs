//! One test (or a few) per guarantee G1–G7 of the spec (§1); G8 lives in
//! `tests/idle_cpu.rs` because it measures the whole process's CPU time.
//! Each test fails if its guarantee breaks.

mod common;

use std::thread;

use common::{expect_within, fake_queue, fake_queue_with, get_timeout_on_fake_clock, ms, secs, spawn_with_result};
use reconq::{Clock, ExponentialBackoff, GetError, KeyState, QueueCounts, WorkQueue};

// ---- G1 dedup -------------------------------------------------------------

#[test]
fn g1_a_key_added_many_times_while_ready_is_handed_out_once() {
    let q = WorkQueue::new();
    for _ in 0..10 {
        q.add("k");
    }
    assert_eq!(q.len(), 1);
    assert_eq!(q.try_get(), Some("k"));
    q.done(&"k");
    assert_eq!(q.try_get(), None);
}

#[test]
fn g1_a_key_added_many_times_while_delayed_is_handed_out_once() {
    let (q, clock) = fake_queue();
    for d in [30, 10, 20, 10] {
        q.add_after("k", ms(d));
    }
    q.add_rate_limited("k");
    assert_eq!(q.counts(), QueueCounts { ready: 0, processing: 0, delayed: 1 });
    clock.advance(secs(2000));
    assert_eq!(q.try_get(), Some("k"));
    q.done(&"k");
    clock.advance(secs(2000));
    assert_eq!(q.try_get(), None);
}

// ---- G2 exclusivity ---------------------------------------------------------

#[test]
fn g2_a_processing_key_is_not_handed_out_again_before_done() {
    let (q, clock) = fake_queue();
    q.add(1);
    assert_eq!(q.get(), Some(1));
    q.add(1);
    q.add_after(1, ms(5));
    clock.advance(ms(10));
    assert_eq!(q.len(), 0, "dirty, not ready");
    assert_eq!(q.try_get(), None);
    assert_eq!(q.key_state(&1), KeyState::Processing { again: Some(None) });
    // A concurrent getter gives up (on the fake clock) without the key.
    let got = get_timeout_on_fake_clock(&q, &clock);
    assert_eq!(got, Err(GetError::Timeout));
    q.done(&1);
    assert_eq!(q.len(), 1, "ready again once done");
    assert_eq!(q.try_get(), Some(1));
}

#[test]
fn g2_a_getter_blocked_on_a_dirty_key_is_released_by_done() {
    let q = WorkQueue::new();
    q.add(7);
    assert_eq!(q.get(), Some(7));
    q.add(7);
    let q2 = q.clone();
    let rx = spawn_with_result(move || q2.get());
    assert!(rx.recv_timeout(ms(50)).is_err(), "handed out while processing");
    q.done(&7);
    assert_eq!(expect_within(&rx, "the dirty key after done"), Some(7));
}

// ---- G3 no lost update ------------------------------------------------------

#[test]
fn g3_adds_while_processing_collapse_into_exactly_one_later_hand_out() {
    let q = WorkQueue::new();
    q.add("k");
    assert_eq!(q.get(), Some("k"));
    for _ in 0..5 {
        q.add("k");
    }
    q.done(&"k");
    assert_eq!(q.try_get(), Some("k"));
    q.done(&"k");
    assert_eq!(q.try_get(), None, "collapsed into one");
    assert_eq!(q.counts(), QueueCounts::default());
}

#[test]
fn g3_done_and_get_hands_the_dirty_key_back() {
    let q = WorkQueue::new();
    q.add("k");
    let k = q.get().unwrap();
    q.add("k");
    assert_eq!(q.done_and_get(&k), Some("k"));
}

// ---- G4 order ---------------------------------------------------------------

#[test]
fn g4_ready_keys_come_out_in_the_order_they_became_ready() {
    let q = WorkQueue::new();
    let order = [17, 3, 42, 0, 8, 99, 5];
    for k in order {
        q.add(k);
    }
    q.add(3); // a duplicate keeps its place
    let out: Vec<_> = order.iter().map(|_| q.try_get().unwrap()).collect();
    assert_eq!(out, order);
}

#[test]
fn g4_a_requeued_key_joins_the_back_of_the_line() {
    let q = WorkQueue::new();
    q.add("a");
    assert_eq!(q.get(), Some("a"));
    q.add("a");
    q.add("b");
    q.done(&"a");
    q.add("c");
    assert_eq!([q.try_get(), q.try_get(), q.try_get()], [Some("b"), Some("a"), Some("c")]);
}

/// Regression: `done` re-queued a dirty key ahead of a delayed key whose due
/// time had already passed, because due keys were only promoted lazily.
#[test]
fn g4_a_key_due_before_a_requeue_is_handed_out_first() {
    let (q, clock) = fake_queue();
    q.add("dirty");
    assert_eq!(q.get(), Some("dirty"));
    q.add("dirty");
    q.add_after("delayed", ms(10));
    clock.advance(ms(10)); // "delayed" is ready from now on
    q.done(&"dirty"); // "dirty" is ready from now on
    assert_eq!(q.try_get(), Some("delayed"));
    assert_eq!(q.try_get(), Some("dirty"));
}

#[test]
fn g4_delayed_keys_join_the_line_at_their_due_time() {
    let (q, clock) = fake_queue();
    q.add_after("late", ms(20));
    q.add_after("early", ms(10));
    clock.advance(ms(15));
    q.add("now");
    clock.advance(ms(10));
    assert_eq!([q.try_get(), q.try_get(), q.try_get()], [Some("early"), Some("now"), Some("late")]);
}

// ---- G5 delay ---------------------------------------------------------------

#[test]
fn g5_a_delayed_key_is_not_ready_a_nanosecond_early() {
    let (q, clock) = fake_queue();
    q.add_after("k", ms(100));
    clock.advance(ms(100) - std::time::Duration::from_nanos(1));
    assert_eq!(q.try_get(), None);
    clock.advance(std::time::Duration::from_nanos(1));
    assert_eq!(q.try_get(), Some("k"));
}

#[test]
fn g5_zero_delay_is_now_and_earliest_due_time_wins() {
    let (q, clock) = fake_queue();
    q.add_after("zero", ms(0));
    assert_eq!(q.len(), 1);
    let t0 = clock.now();
    q.add_after("k", ms(50));
    q.add_after("k", ms(20));
    q.add_after("k", ms(40));
    assert_eq!(q.key_state(&"k"), KeyState::Waiting { due: t0 + ms(20) });
}

#[test]
fn g5_add_after_does_not_delay_a_ready_key() {
    let (q, _clock) = fake_queue();
    q.add("k");
    q.add_after("k", secs(60));
    assert_eq!(q.try_get(), Some("k"));
}

#[test]
fn g5_plain_add_cancels_the_delay_so_it_runs_once() {
    let (q, clock) = fake_queue();
    q.add_after("k", ms(10));
    q.add("k");
    assert_eq!(q.counts(), QueueCounts { ready: 1, processing: 0, delayed: 0 });
    assert_eq!(q.try_get(), Some("k"));
    q.done(&"k");
    clock.advance(ms(20));
    assert_eq!(q.try_get(), None);
}

/// Regression: `key_state` reported a key whose due time had passed as
/// still waiting until some other call happened to promote it.
#[test]
fn g5_key_state_reports_a_due_key_as_ready() {
    let (q, clock) = fake_queue();
    q.add_after("k", ms(10));
    clock.advance(ms(10));
    assert_eq!(q.key_state(&"k"), KeyState::Ready);
}

// ---- G6 rate limit ----------------------------------------------------------

#[test]
fn g6_add_rate_limited_waits_what_the_limiter_says_and_forget_resets() {
    let (q, clock) = fake_queue_with(ExponentialBackoff::new(ms(10), secs(1)));
    let mut expected = ms(10);
    for n in 1..=4 {
        let now = clock.now();
        q.add_rate_limited("k");
        assert_eq!(q.key_state(&"k"), KeyState::Waiting { due: now + expected });
        assert_eq!(q.num_requeues(&"k"), n);
        clock.advance(expected);
        assert_eq!(q.try_get(), Some("k"));
        q.done(&"k");
        expected *= 2;
    }
    q.forget(&"k");
    assert_eq!(q.num_requeues(&"k"), 0);
    let now = clock.now();
    q.add_rate_limited("k");
    assert_eq!(q.key_state(&"k"), KeyState::Waiting { due: now + ms(10) });
}

// ---- G7 shutdown ------------------------------------------------------------

#[test]
fn g7_getters_blocked_in_get_return_none_after_shut_down() {
    let q = WorkQueue::<u32>::new();
    let getters: Vec<_> = (0..4)
        .map(|_| {
            let q = q.clone();
            spawn_with_result(move || q.get())
        })
        .collect();
    q.shut_down();
    for rx in &getters {
        assert_eq!(expect_within(rx, "a blocked getter after shut_down"), None);
    }
}

#[test]
fn g7_ready_keys_are_still_handed_out_after_shut_down() {
    let q = WorkQueue::new();
    q.add(1);
    q.add(2);
    q.shut_down();
    assert!(q.is_shutting_down());
    q.add(3);
    assert_eq!(q.get(), Some(1));
    assert_eq!(q.get(), Some(2));
    assert_eq!(q.get(), None);
    assert_eq!(q.get_timeout(secs(1)), Err(GetError::ShutDown));
}

#[test]
fn g7_delayed_keys_not_yet_due_are_dropped_at_shut_down() {
    let (q, clock) = fake_queue();
    q.add_after("later", ms(10));
    q.add("busy");
    assert_eq!(q.get(), Some("busy"));
    q.add_after("busy", ms(10)); // would wait after done
    q.shut_down();
    clock.advance(secs(1));
    q.done(&"busy");
    assert_eq!(q.counts(), QueueCounts::default());
    assert_eq!(q.get(), None);
}

/// Regression: a key whose due time had passed before `shut_down` was
/// dropped as "delayed" instead of being handed out as ready.
#[test]
fn g7_a_key_already_due_at_shut_down_is_still_handed_out() {
    let (q, clock) = fake_queue();
    q.add_after("due", ms(10));
    clock.advance(ms(10));
    q.shut_down();
    assert_eq!(q.get(), Some("due"));
    assert_eq!(q.get(), None);
}

#[test]
fn g7_drain_blocks_until_every_handed_out_key_is_done() {
    let q = WorkQueue::new();
    q.add(1);
    q.add(2);
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let k = q.get().unwrap();
            let q = q.clone();
            // Each worker finishes its key only when told to.
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let h = thread::spawn(move || {
                rx.recv().unwrap();
                q.done(&k);
            });
            (tx, h)
        })
        .collect();
    assert!(!q.shut_down_with_drain_timeout(ms(20)), "two keys still processing");
    for (tx, h) in workers {
        tx.send(()).unwrap();
        h.join().unwrap();
    }
    assert!(q.shut_down_with_drain_timeout(secs(10)));
    assert_eq!(q.counts(), QueueCounts::default());
}
