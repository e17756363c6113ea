//! The state table's unit tests (`state.rs`), against no threads and no
//! clock but the stamps each call is given.

use super::*;
use crate::queue::delay_heap::COMPACT_SLACK;
use std::time::Duration;

const P0: Place = Place { prio: 0, group: 0 };

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A fresh clock reading per call (each test call is its own operation).
fn n() -> &'static mut Now {
    Box::leak(Box::new(Now::new()))
}

#[test]
fn a_slot_stays_40_bytes() {
    // Entries are read on every hand-out and finish: dependencies'
    // fields must not grow them (see `retry_priority`).
    assert!(std::mem::size_of::<Slot>() <= 40, "{}", std::mem::size_of::<Slot>());
}

#[test]
fn dirty_key_returns_only_after_done() {
    let mut q = QueueState::new(Recorder::off(), ReadySet::new());
    assert_eq!(q.add("a", P0, n()), Added::Ready);
    assert_eq!(q.take(n()).map(|t| t.0), Some("a"));
    assert_eq!(q.add("a", P0, n()), Added::Unchanged);
    assert_eq!(q.take(n()).map(|t| t.0), None, "a is processing: not handed out twice");
    let t0 = Instant::now();
    assert_eq!(q.done(&"a", || t0, n()), Finished::Requeued);
    assert_eq!(q.take(n()).map(|t| t.0), Some("a"));
    assert_eq!(q.done(&"a", || t0, n()), Finished::Removed);
    assert_eq!(q.done(&"a", || t0, n()), Finished::NotProcessing);
    assert_eq!(q.len(), 0);
}

#[test]
fn delayed_while_processing_waits_after_done() {
    let mut q = QueueState::new(Recorder::off(), ReadySet::new());
    let t0 = Instant::now();
    q.add("a", P0, n());
    q.take(n()).map(|t| t.0);
    assert_eq!(q.add_at("a", t0 + ms(10), t0, n(), P0), Added::Scheduled(t0 + ms(10)));
    assert_eq!(q.done(&"a", || t0, n()), Finished::Waiting(t0 + ms(10)));
    assert_eq!(q.delayed_len(), 1);
    assert_eq!(q.promote_due(t0 + ms(10), n()), 1);
    assert_eq!(q.take(n()).map(|t| t.0), Some("a"));
}

#[test]
fn stale_heap_entries_are_compacted() {
    let mut q = QueueState::new(Recorder::off(), ReadySet::new());
    let t0 = Instant::now();
    for i in 0..10_000u64 {
        // Each earlier due time leaves the previous entry stale.
        q.add_at("a", t0 + Duration::from_secs(1_000_000 - i), t0, n(), P0);
    }
    assert!(q.delays.len() <= 2 * q.timers + COMPACT_SLACK + 1);
    assert_eq!(q.next_due(), Some(t0 + Duration::from_secs(1_000_000 - 9_999)));
}

#[test]
fn metrics_count_adds_like_client_go() {
    let mut q = QueueState::new(Recorder::on(), ReadySet::new());
    let t0 = Instant::now();
    let snap = |q: &QueueState<&str>| {
        let s = q.metrics_snapshot().expect("named");
        (
            s.adds,
            s.depth.iter().map(|(_, keys)| keys).sum::<usize>(),
            s.queue_duration.count(),
            s.work_duration.count(),
            s.retries,
        )
    };
    q.add("a", P0, n());
    q.add("a", P0, n()); // deduplicated
    assert_eq!(snap(&q), (1, 1, 0, 0, 0));
    assert_eq!(q.take(n()).map(|t| t.0), Some("a"));
    assert_eq!(snap(&q), (1, 0, 1, 0, 0));
    q.add("a", P0, n()); // dirty while processing: an add, and depth
    q.add("a", P0, n()); // deduplicated
    assert_eq!(snap(&q), (2, 1, 1, 0, 0));
    assert!(q.metrics_snapshot().unwrap().longest_seconds >= 0.0);
    assert_eq!(q.done(&"a", || t0, n()), Finished::Requeued);
    assert_eq!(snap(&q), (2, 1, 1, 1, 0), "requeued by done: still the same add");
    assert_eq!(q.take(n()).map(|t| t.0), Some("a"));
    q.count_retry();
    q.add_at("a", t0 + ms(10), t0, n(), P0); // waits after done: not an add yet
    assert_eq!(q.done(&"a", || t0, n()), Finished::Waiting(t0 + ms(10)));
    assert_eq!(snap(&q), (2, 0, 2, 2, 1));
    assert_eq!(q.promote_due(t0 + ms(10), n()), 1);
    assert_eq!(snap(&q), (3, 1, 2, 2, 1), "promotion is an add");
    q.add_at("b", t0 + ms(20), t0, n(), P0);
    q.add("b", P0, n()); // a plain add of a delayed key makes it ready: an add
    assert_eq!(snap(&q), (4, 2, 2, 2, 1));
    q.shut_down(false);
    q.count_retry();
    assert_eq!(snap(&q).4, 1, "no retries counted after shutdown");
}

#[test]
fn unfinished_work_follows_processing_keys() {
    let mut q = QueueState::new(Recorder::on(), ReadySet::new());
    let t0 = Instant::now();
    for key in ["a", "b", "c"] {
        q.add(key, P0, n());
    }
    q.take(n()).map(|t| t.0);
    q.take(n()).map(|t| t.0);
    std::thread::sleep(ms(5));
    let s = q.metrics_snapshot().unwrap();
    assert!(s.longest_seconds >= 0.004 && s.unfinished_seconds >= 2.0 * 0.004, "{}", s.unfinished_seconds);
    assert!(s.unfinished_seconds >= s.longest_seconds);
    q.done(&"a", || t0, n());
    q.done(&"b", || t0, n());
    let s = q.metrics_snapshot().unwrap();
    assert_eq!((s.longest_seconds, s.unfinished_seconds, s.work_duration.count()), (0.0, 0.0, 2));
    q.take(n()).map(|t| t.0);
    assert_eq!(q.recorder.starts_len(), 2, "freed start slots are reused");
}

#[test]
fn depth_counts_keys_by_the_priority_they_wait_or_come_back_with() {
    let mut q = QueueState::new(Recorder::on(), ReadySet::new());
    let t0 = Instant::now();
    let prio = |p| Place { prio: p, group: 0 };
    let depth = |q: &QueueState<&str>| q.metrics_snapshot().unwrap().depth;
    q.add("a", prio(1), n());
    q.add("b", P0, n());
    q.add("c", prio(-2), n());
    assert_eq!(depth(&q), [(1, 1), (0, 1), (-2, 1)]);
    assert_eq!(q.take(n()).map(|t| t.0), Some("a"));
    q.add("a", prio(-2), n()); // dirty while processing: back at -2
    assert_eq!(depth(&q), [(0, 1), (-2, 2)]);
    q.add("a", prio(4), n()); // raised while dirty
    assert_eq!(depth(&q), [(4, 1), (0, 1), (-2, 1)]);
    assert_eq!(q.done(&"a", || t0, n()), Finished::Requeued);
    assert_eq!(depth(&q), [(4, 1), (0, 1), (-2, 1)], "the same key, now ready");
    assert_eq!(q.take(n()).map(|t| t.0), Some("a"));
    q.add_at("a", t0 + ms(10), t0, n(), P0); // waits after done: not in the depth
    assert_eq!(depth(&q), [(0, 1), (-2, 1)]);
    assert_eq!(q.promote_due(t0 + ms(10), n()), 0, "due while processing: marked to come back");
    assert_eq!(depth(&q), [(0, 2), (-2, 1)]);
    q.shut_down(false);
    q.discard_ready();
    assert_eq!(depth(&q), []);
}

#[test]
fn discarded_keys_stay_counted_as_adds() {
    let mut q = QueueState::new(Recorder::on(), ReadySet::new());
    let t0 = Instant::now();
    for key in ["a", "b", "c"] {
        q.add(key, P0, n());
    }
    q.take(n()).map(|t| t.0);
    q.add("a", P0, n()); // dirty while processing
    let adds = |q: &QueueState<&str>| q.metrics_snapshot().unwrap().adds;
    assert_eq!(adds(&q), 4);
    q.shut_down(false);
    q.discard_ready();
    assert_eq!(q.metrics_snapshot().unwrap().depth, []);
    assert_eq!(adds(&q), 4, "dropped keys were still added");
    assert_eq!(q.done(&"a", || t0, n()), Finished::Removed);
    assert_eq!(adds(&q), 4);
}

#[test]
fn compaction_keeps_order_priorities_stale_entries_and_timers() {
    let mut q = QueueState::new(Recorder::on(), ReadySet::new());
    let t0 = Instant::now();
    let prio = |p| Place { prio: p, group: 0 };
    // 200 keys; every tenth raised (leaving a stale entry behind), two
    // waiting for a due time, and one processing and dirty.
    for k in 0..200u32 {
        q.add(k, P0, n());
    }
    for k in (0..200u32).step_by(10) {
        q.add(k, prio(1), n());
    }
    q.add_at(1000, t0 + ms(50), t0, n(), P0);
    q.add_at(1001, t0 + ms(60), t0, n(), P0);
    let mut taken = Vec::new();
    // Take the raised keys, then most of the rest: done frees entries
    // until the slab is sparse and compacts (more than once).
    for _ in 0..190 {
        let (k, _) = q.take(n()).unwrap();
        taken.push(k);
        if k != 11 {
            assert_eq!(q.done(&k, || t0, n()), Finished::Removed);
        }
    }
    assert!(q.entries.len() < 20, "{} entries", q.entries.len());
    q.add(11, prio(2), n()); // dirty while processing
    q.add(199, prio(3), n()); // raises a ready key after compaction
    let raised: Vec<u32> = (0..200).step_by(10).collect();
    assert_eq!(taken[..20], raised[..], "raised keys first, in FIFO order");
    assert_eq!(q.done(&11, || t0, n()), Finished::Requeued);
    let rest: Vec<u32> = std::iter::from_fn(|| q.take(n()).map(|t| t.0)).collect();
    let mut expected = vec![199, 11];
    expected.extend((0..200u32).filter(|k| k % 10 != 0 && !taken.contains(k) && *k != 199));
    assert_eq!(rest, expected);
    assert_eq!(q.key_state(&1000), KeyState::Waiting { due: t0 + ms(50) });
    assert_eq!(q.next_due(), Some(t0 + ms(50)));
    assert_eq!(q.promote_due(t0 + ms(60), n()), 2);
    assert_eq!(std::iter::from_fn(|| q.take(n()).map(|t| t.0)).collect::<Vec<_>>(), vec![1000, 1001]);
}

#[test]
fn an_immediate_stop_drops_every_ready_key_once() {
    let mut q = QueueState::new(Recorder::off(), ReadySet::new());
    for k in 0..300u32 {
        q.add(k, P0, n());
    }
    let (processing, _) = q.take(n()).unwrap();
    q.shut_down(false);
    q.discard_ready();
    let mut dropped = q.take_dropped();
    dropped.sort_unstable();
    assert_eq!(dropped, (1..300).collect::<Vec<u32>>());
    assert_eq!(q.key_state(&processing), KeyState::Processing { again: None });
    assert_eq!(q.done(&processing, Instant::now, n()), Finished::Removed);
    assert!(q.is_idle() && q.entries.len() == 0);
}

#[test]
fn unnamed_queue_records_nothing() {
    let mut q = QueueState::new(Recorder::off(), ReadySet::new());
    q.add("a", P0, n());
    assert!(q.metrics_snapshot().is_none());
}
