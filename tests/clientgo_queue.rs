//! Ports of client-go's `queue_test.go` (research notes §5) to reconq's
//! `WorkQueue`. Sleeps in the Go producers/consumers are replaced by yields:
//! they only shuffle interleavings, and the assertions do not depend on them.

mod common;

use std::collections::HashMap;
use std::thread;

use common::{expect_within, fake_queue, get_timeout_on_fake_clock, ms, secs, spawn_with_result, wait_for};
use reconq::{GetError, KeyState, QueueCounts, WorkQueue};

#[derive(Clone, Copy, Debug)]
enum Shutdown {
    Plain,
    Drain,
}

impl Shutdown {
    fn run<K: Eq + std::hash::Hash + Clone + Send + 'static>(self, q: &WorkQueue<K>) {
        match self {
            Shutdown::Plain => q.shut_down(),
            Shutdown::Drain => q.shut_down_with_drain(),
        }
    }
}

/// Two tests of `case`, one per way of shutting down: `$plain` with
/// `shut_down`, `$drain` with `shut_down_with_drain`.
macro_rules! test_each_shutdown {
    ($case:ident: $plain:ident, $drain:ident) => {
        #[test]
        fn $plain() {
            $case(Shutdown::Plain);
        }

        #[test]
        fn $drain() {
            $case(Shutdown::Drain);
        }
    };
}

const AFTER_SHUTDOWN: i64 = -1;

/// TestBasic: 50 producers add 0..50 each, 10 consumers get/done until the
/// queue is shut down; the key added after shutdown never comes out and the
/// queue ends empty.
fn basic(shutdown: Shutdown) {
    let q = WorkQueue::<i64>::new();
    let producers: Vec<_> = (0..50)
        .map(|_| {
            let q = q.clone();
            thread::spawn(move || {
                for i in 0..50 {
                    q.add(i);
                    thread::yield_now();
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..10)
        .map(|_| {
            let q = q.clone();
            thread::spawn(move || {
                let mut seen = 0u32;
                while let Some(k) = q.get() {
                    assert_ne!(k, AFTER_SHUTDOWN, "a key added after shutdown was handed out");
                    seen += 1;
                    thread::yield_now();
                    q.done(&k);
                }
                seen
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    shutdown.run(&q);
    q.add(AFTER_SHUTDOWN);
    let handed_out: u32 = consumers.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(handed_out >= 50, "every key 0..50 was handed out at least once, got {handed_out}");
    assert_eq!(q.len(), 0);
    assert_eq!(q.key_state(&AFTER_SHUTDOWN), KeyState::Absent);
}

test_each_shutdown!(basic: basic_many_producers_consumers_shut_down, basic_many_producers_consumers_shut_down_with_drain);

/// TestAddWhileProcessing: consumers re-add the key they hold (before done)
/// until they have seen it twice; everything finishes and the queue empties.
fn add_while_processing(shutdown: Shutdown) {
    let q = WorkQueue::<i64>::new();
    let producers: Vec<_> = (0..50)
        .map(|i| {
            let q = q.clone();
            thread::spawn(move || q.add(i))
        })
        .collect();
    let consumers: Vec<_> = (0..10)
        .map(|_| {
            let q = q.clone();
            thread::spawn(move || {
                let mut counters = HashMap::<i64, u32>::new();
                while let Some(k) = q.get() {
                    let c = counters.entry(k).or_default();
                    *c += 1;
                    if *c < 2 {
                        q.add(k);
                    }
                    q.done(&k);
                }
            })
        })
        .collect();
    for p in producers {
        p.join().unwrap();
    }
    shutdown.run(&q);
    for c in consumers {
        c.join().unwrap();
    }
    assert_eq!(q.len(), 0);
}

test_each_shutdown!(add_while_processing: add_while_processing_shut_down, add_while_processing_shut_down_with_drain);

// TestLen
#[test]
fn len_counts_distinct_ready_keys() {
    let q = WorkQueue::new();
    q.add("foo");
    assert_eq!(q.len(), 1);
    q.add("bar");
    assert_eq!(q.len(), 2);
    q.add("foo");
    assert_eq!(q.len(), 2, "a duplicate does not grow the queue");
}

// TestReinsert
#[test]
fn reinsert_during_processing_hands_out_again_after_done() {
    let q = WorkQueue::new();
    q.add("foo");
    assert_eq!(q.get(), Some("foo"));
    q.add("foo");
    assert_eq!(q.len(), 0, "a processing key is not ready");
    q.done(&"foo");
    assert_eq!(q.get(), Some("foo"));
    q.done(&"foo");
    assert_eq!(q.len(), 0);
    assert_eq!(q.counts(), QueueCounts::default());
}

// TestCollapse. reconq has no pluggable queue, so instead of "bar was
// touched" we check the duplicate left bar's place in line unchanged.
#[test]
fn collapse_duplicate_adds_into_one() {
    let q = WorkQueue::new();
    q.add("bar");
    q.add("baz");
    q.add("bar");
    assert_eq!(q.len(), 2);
    assert_eq!(q.get(), Some("bar"));
    q.done(&"bar");
    assert_eq!(q.get(), Some("baz"));
    q.done(&"baz");
    assert_eq!(q.len(), 0);
    assert_eq!(q.try_get(), None);
}

// TestCollapseWhileProcessing: a second getter stays blocked until done.
// On a fake clock, `get_timeout` can only end by timeout once we advance the
// clock past its deadline: it must report Timeout, not hand out foo.
#[test]
fn collapse_while_processing_second_getter_blocks_until_done() {
    let (q, clock) = fake_queue();
    q.add("foo");
    assert_eq!(q.get(), Some("foo"));
    q.add("foo");
    q.add("foo");
    assert_eq!(q.key_state(&"foo"), KeyState::Processing { again: Some(None) });

    let blocked = get_timeout_on_fake_clock(&q, &clock);
    assert_eq!(blocked, Err(GetError::Timeout), "foo must not be handed out while processing");

    // Now a plain getter, released by done.
    let q2 = q.clone();
    let rx = spawn_with_result(move || {
        let k = q2.get();
        if let Some(k) = k {
            q2.done(&k);
        }
        k
    });
    assert!(rx.recv_timeout(ms(50)).is_err(), "the getter returned before done");
    q.done(&"foo");
    assert_eq!(expect_within(&rx, "the getter after done"), Some("foo"));
    assert_eq!(q.len(), 0);
    assert_eq!(q.counts(), QueueCounts::default());
}

/// Starts `shut_down_with_drain` on a thread; the receiver fires when it
/// returns. Waits until the queue reports shutting down.
fn start_drain<K: Eq + std::hash::Hash + Clone + Send + 'static>(q: &WorkQueue<K>) -> std::sync::mpsc::Receiver<()> {
    let q2 = q.clone();
    let rx = spawn_with_result(move || q2.shut_down_with_drain());
    wait_for("the drain to start", || q.is_shutting_down());
    rx
}

// TestQueueDrainageUsingShutDownWithDrain
#[test]
fn drain_waits_for_every_done() {
    let q = WorkQueue::new();
    q.add("foo");
    q.add("bar");
    let foo = q.get().unwrap();
    let bar = q.get().unwrap();
    let drained = start_drain(&q);
    assert_eq!(q.get(), None, "nothing ready once shut down");
    // A second, timed drain proves deterministically that it is still pending.
    assert!(!q.shut_down_with_drain_timeout(ms(10)));
    q.done(&foo);
    assert!(!q.shut_down_with_drain_timeout(ms(10)), "bar is still processing");
    q.done(&bar);
    expect_within(&drained, "the drain after both done");
    assert!(q.shut_down_with_drain_timeout(ms(0)));
}

// TestNoQueueDrainageUsingShutDown
#[test]
fn plain_shut_down_does_not_wait_for_processing_keys() {
    let q = WorkQueue::new();
    q.add("foo");
    q.add("bar");
    q.get().unwrap();
    q.get().unwrap();
    let q2 = q.clone();
    expect_within(&spawn_with_result(move || q2.shut_down()), "shut_down returning with keys in flight");
    assert_eq!(q.counts().processing, 2);
}

// TestForceQueueShutdownUsingShutDown
#[test]
fn shut_down_releases_a_pending_drain() {
    let q = WorkQueue::new();
    q.add("foo");
    q.add("bar");
    q.get().unwrap();
    q.get().unwrap();
    let drained = start_drain(&q);
    assert_eq!(q.get(), None);
    q.shut_down();
    expect_within(&drained, "the drain after shut_down");
    assert_eq!(q.counts().processing, 2, "released without any done");
}

// TestQueueDrainageUsingShutDownWithDrainWithDirtyItem
#[test]
fn drain_hands_out_a_dirty_key_again_and_waits_for_it() {
    let q = WorkQueue::new();
    q.add("foo");
    let foo = q.get().unwrap();
    q.add("foo");
    let drained = start_drain(&q);
    assert_eq!(q.get(), None, "foo is processing, nothing is ready");

    q.done(&foo);
    assert_eq!(q.get(), Some("foo"), "the dirty key is handed out again during the drain");
    assert!(!q.shut_down_with_drain_timeout(ms(10)), "the drain waits for the re-handed key");
    q.done(&"foo");
    assert_eq!(q.get(), None);
    expect_within(&drained, "the drain after the dirty key is done");
}

/// A drain started while a dirty key is processing also waits for the key to
/// be taken again (guarantees §3: "the drain waits for them too"), not only for the
/// processing set to empty as client-go does.
#[test]
fn drain_is_pending_while_a_requeued_key_is_not_yet_taken() {
    let q = WorkQueue::new();
    q.add(1);
    q.get().unwrap();
    q.add(1);
    let drained = start_drain(&q);
    q.done(&1);
    assert_eq!(q.counts(), QueueCounts { ready: 1, processing: 0, delayed: 0 });
    assert!(!q.shut_down_with_drain_timeout(ms(10)));
    assert_eq!(q.get(), Some(1));
    q.done(&1);
    expect_within(&drained, "drain");
}

#[test]
fn add_after_shut_down_is_ignored() {
    let (q, clock) = fake_queue();
    q.shut_down();
    q.add("a");
    q.add_after("b", ms(10));
    q.add_rate_limited("c");
    clock.advance(secs(1));
    assert_eq!(q.counts(), QueueCounts::default());
    for k in ["a", "b", "c"] {
        assert_eq!(q.key_state(&k), KeyState::Absent);
    }
    assert_eq!(q.get(), None);
}

#[test]
fn add_of_a_processing_key_after_shut_down_does_not_requeue_it() {
    let q = WorkQueue::new();
    q.add("a");
    q.get().unwrap();
    q.shut_down();
    q.add("a");
    q.done(&"a");
    assert_eq!(q.get(), None);
}
