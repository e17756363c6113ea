//! Ports of client-go's `delaying_queue_test.go` (research notes §5) on a
//! `FakeClock`, plus the places where reconq deliberately differs (spec G5).

mod common;

use common::{expect_within, fake_queue, ms, secs, spawn_with_result};
use reconq::{Clock, KeyState, QueueCounts};

// TestSimpleQueue
#[test]
fn simple_delayed_key_fires_once() {
    let (q, clock) = fake_queue();
    q.add_after("foo", ms(50));
    assert_eq!(q.len(), 0);
    clock.advance(ms(60));
    assert_eq!(q.len(), 1);
    assert_eq!(q.get(), Some("foo"));
    q.done(&"foo");
    // Well past anything (client-go's 10 s heartbeat): no spurious re-add.
    clock.advance(secs(10));
    assert_eq!(q.len(), 0);
    assert_eq!(q.counts(), QueueCounts::default());
}

// TestDeduping: the earliest due time wins, later ones are merged away.
#[test]
fn deduping_earliest_due_time_wins() {
    let (q, clock) = fake_queue();
    q.add_after("foo", ms(50));
    q.add_after("foo", ms(70));
    assert_eq!(q.len(), 0);
    clock.advance(ms(60));
    assert_eq!(q.len(), 1);
    assert_eq!(q.get(), Some("foo"));
    q.done(&"foo");
    clock.advance(ms(20));
    assert_eq!(q.len(), 0, "the 70 ms entry was merged into the 50 ms one");

    q.add_after("foo", ms(50));
    q.add_after("foo", ms(30));
    assert_eq!(q.len(), 0);
    clock.advance(ms(40));
    assert_eq!(q.len(), 1, "the earlier (30 ms) time won");
    assert_eq!(q.get(), Some("foo"));
    q.done(&"foo");
    clock.advance(ms(20));
    assert_eq!(q.len(), 0, "the 50 ms entry was merged away");
    assert_eq!(q.counts(), QueueCounts::default());
}

// TestAddTwoFireEarly (keys are never marked done; len counts ready keys).
#[test]
fn add_two_fire_early() {
    let (q, clock) = fake_queue();
    q.add_after("foo", secs(1));
    q.add_after("bar", ms(50));
    clock.advance(ms(60));
    assert_eq!(q.len(), 1);
    assert_eq!(q.get(), Some("bar"));

    q.add_after("baz", secs(2));
    clock.advance(secs(1));
    assert_eq!(q.len(), 1);
    assert_eq!(q.get(), Some("foo"));

    clock.advance(secs(2));
    assert_eq!(q.len(), 1);
    assert_eq!(q.get(), Some("baz"));
}

// TestCopyShifting: keys become ready in due-time order, not insertion order.
#[test]
fn copy_shifting_ready_in_due_order() {
    let (q, clock) = fake_queue();
    q.add_after("foo", secs(1));
    q.add_after("bar", ms(500));
    q.add_after("baz", ms(250));
    clock.advance(secs(2));
    assert_eq!(q.len(), 3);
    assert_eq!([q.get(), q.get(), q.get()], [Some("baz"), Some("bar"), Some("foo")]);
}

// reconq differs from client-go here (spec G5): client-go heaps have no tie
// break; reconq hands out keys with equal due times first-in first-out.
#[test]
fn equal_due_times_are_fifo() {
    let (q, clock) = fake_queue();
    let due = clock.now() + ms(100);
    for k in [3, 1, 4, 0, 2] {
        q.add_at(k, due);
    }
    clock.advance(ms(100));
    let order: Vec<_> = (0..5).map(|_| q.try_get().unwrap()).collect();
    assert_eq!(order, [3, 1, 4, 0, 2]);
}

// reconq differs from client-go here (spec G5): a plain add of a delayed key
// makes it ready now and cancels the delayed entry; client-go would hand the
// key out a second time when the old due time comes.
#[test]
fn plain_add_cancels_the_delay() {
    let (q, clock) = fake_queue();
    q.add_after("foo", ms(50));
    q.add("foo");
    assert_eq!(q.key_state(&"foo"), KeyState::Ready);
    assert_eq!(q.counts(), QueueCounts { ready: 1, processing: 0, delayed: 0 });
    assert_eq!(q.get(), Some("foo"));
    q.done(&"foo");
    clock.advance(ms(60));
    assert_eq!(q.len(), 0, "no second run at the old due time");
    assert_eq!(q.try_get(), None);
}

#[test]
fn add_after_zero_is_ready_at_once() {
    let (q, _clock) = fake_queue();
    q.add_after("foo", ms(0));
    assert_eq!(q.len(), 1);
    let due = q.clock().now();
    q.add_at("bar", due);
    assert_eq!(q.len(), 2, "a due time of now is ready now");
}

#[test]
fn add_after_while_ready_does_not_delay() {
    let (q, _clock) = fake_queue();
    q.add("foo");
    q.add_after("foo", secs(10));
    assert_eq!(q.key_state(&"foo"), KeyState::Ready);
    assert_eq!(q.try_get(), Some("foo"));
}

#[test]
fn add_after_while_processing_waits_after_done() {
    let (q, clock) = fake_queue();
    q.add("foo");
    assert_eq!(q.get(), Some("foo"));
    let due = clock.now() + ms(30);
    q.add_after("foo", ms(30));
    assert_eq!(q.key_state(&"foo"), KeyState::Processing { again: Some(Some(due)) });
    q.done(&"foo");
    assert_eq!(q.key_state(&"foo"), KeyState::Waiting { due });
    assert_eq!(q.try_get(), None);
    clock.advance(ms(30));
    assert_eq!(q.try_get(), Some("foo"));
}

#[test]
fn a_blocked_getter_wakes_when_the_fake_clock_reaches_the_due_time() {
    let (q, clock) = fake_queue();
    q.add_after("foo", secs(5));
    let q2 = q.clone();
    let rx = spawn_with_result(move || q2.get());
    assert!(rx.recv_timeout(ms(20)).is_err(), "handed out before its due time");
    clock.advance(secs(5));
    assert_eq!(expect_within(&rx, "the delayed key"), Some("foo"));
}

#[test]
fn delayed_keys_are_dropped_at_shutdown() {
    let (q, clock) = fake_queue();
    q.add("ready");
    q.add_after("later", ms(10));
    q.shut_down();
    assert_eq!(q.counts(), QueueCounts { ready: 1, processing: 0, delayed: 0 });
    clock.advance(secs(1));
    assert_eq!(q.get(), Some("ready"));
    assert_eq!(q.get(), None);
    assert_eq!(q.key_state(&"later"), KeyState::Absent);
}
