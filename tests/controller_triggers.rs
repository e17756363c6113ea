//! Consul-style triggers and watches.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use crossbeam_channel::unbounded;
use parking_lot::Mutex;
use reconq::*;

type Res = Result<Action, ReconcileError>;

fn recording() -> (ControllerHandle<u32>, Arc<Mutex<Vec<u32>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let h = Controller::new("triggers", move |k: &u32, _: &Context| -> Res {
        s.lock().push(*k);
        Ok(Action::Done)
    })
    .start();
    (h, seen)
}

/// Waits until every trigger/watch thread has finished and the controller
/// is idle: anything they were going to enqueue has run.
fn settle(h: &ControllerHandle<u32>) {
    wait_for("background threads", || h.background_threads() == 0);
    assert!(h.wait_idle(PATIENCE));
}

#[test]
fn a_trigger_enqueues_its_key_when_it_returns() {
    let (h, seen) = recording();
    let (tx, rx) = unbounded::<()>();
    h.add_trigger(1, move |_stop: &StopSignal| rx.recv().unwrap());
    assert_eq!(h.background_threads(), 1);
    assert!(h.wait_idle(PATIENCE));
    assert!(seen.lock().is_empty());
    tx.send(()).unwrap();
    settle(&h);
    assert_eq!(*seen.lock(), [1]);
    h.stop();
}

/// Adds a trigger for `key` that only waits for its stop signal; once it
/// returns, the slot returned holds whether the signal came.
fn trigger_awaiting_stop(h: &ControllerHandle<u32>, key: u32) -> Arc<Mutex<Option<bool>>> {
    let saw_stop = Arc::new(Mutex::new(None));
    let s = saw_stop.clone();
    h.add_trigger(key, move |stop: &StopSignal| {
        *s.lock() = Some(stop.wait_timeout(PATIENCE));
    });
    saw_stop
}

#[test]
fn remove_trigger_signals_it_and_nothing_is_enqueued() {
    let (h, seen) = recording();
    let saw_stop = trigger_awaiting_stop(&h, 1);
    assert!(h.remove_trigger(&1));
    assert!(!h.remove_trigger(&1));
    settle(&h);
    assert_eq!(*saw_stop.lock(), Some(true));
    assert!(seen.lock().is_empty());
    h.stop();
}

#[test]
fn a_second_trigger_for_a_key_replaces_the_first() {
    let (h, seen) = recording();
    let first_stopped = trigger_awaiting_stop(&h, 7);
    let (tx, rx) = unbounded::<()>();
    h.add_trigger(7, move |_stop: &StopSignal| rx.recv().unwrap());
    wait_for("first trigger stopped", || first_stopped.lock().is_some());
    assert_eq!(*first_stopped.lock(), Some(true));
    tx.send(()).unwrap();
    settle(&h);
    assert_eq!(*seen.lock(), [7], "only the replacement enqueued");
    h.stop();
}

#[test]
fn failed_or_panicking_triggers_do_not_enqueue() {
    let (h, seen) = recording();
    h.add_trigger(1, |_: &StopSignal| -> Result<(), String> { Err("nope".into()) });
    h.add_trigger(2, |_: &StopSignal| false);
    h.add_trigger(3, |_: &StopSignal| -> () { panic!("trigger bug") });
    h.add_trigger(4, |_: &StopSignal| -> Result<u8, String> { Ok(1) });
    settle(&h);
    assert_eq!(*seen.lock(), [4]);
    h.stop();
}

#[test]
fn stop_signals_every_trigger_and_waits_for_them() {
    let (h, seen) = recording();
    let stopped = Arc::new(Mutex::new(Vec::new()));
    for k in 0..3 {
        let s = stopped.clone();
        h.add_trigger(k, move |stop: &StopSignal| {
            s.lock().push(stop.wait_timeout(PATIENCE));
        });
    }
    let report = h.stop_with_drain_report(PATIENCE);
    assert_eq!(
        report,
        StopReport {
            finished: true,
            unfinished: vec![],
            detached_threads: 0,
            unfinished_caches: vec![],
            dropped: vec![],
            store_error: None
        }
    );
    assert_eq!(*stopped.lock(), [true, true, true]);
    assert!(seen.lock().is_empty());
    h.add_trigger(9, |_: &StopSignal| ());
    assert_eq!(h.background_threads(), 0, "ignored once stopped");
}

#[test]
fn watch_enqueues_what_transform_returns() {
    let (h, seen) = recording();
    h.watch(vec![1u32, 2, 3], |e| vec![e, e + 10]);
    h.watch(vec!["5", "x", "6"], |e: &str| e.parse::<u32>().ok());
    settle(&h);
    let mut got = seen.lock().clone();
    got.sort();
    assert_eq!(got, [1, 2, 3, 5, 6, 11, 12, 13]);
    h.stop();
}

#[test]
fn watch_accepts_a_channel_receiver() {
    let (h, seen) = recording();
    let (tx, rx) = unbounded::<u32>();
    h.watch(rx, std::iter::once);
    tx.send(4).unwrap();
    tx.send(5).unwrap();
    drop(tx);
    settle(&h);
    assert_eq!(*seen.lock(), [4, 5]);
    h.stop();
}

#[test]
fn watch_channel_is_interrupted_by_stop() {
    let (h, seen) = recording();
    let (tx, rx) = unbounded::<u32>();
    h.watch_channel(rx, |e| [e]);
    tx.send(1).unwrap();
    wait_for("event handled", || !seen.lock().is_empty());
    let report = h.stop_with_drain_report(PATIENCE);
    assert_eq!(report.detached_threads, 0, "the watch ended though its sender lives");
    assert!(h.join_timeout(Duration::ZERO));
    drop(tx);
}

#[test]
fn a_watch_blocked_forever_is_detached_at_the_deadline() {
    let (h, _seen) = recording();
    let (tx, rx) = unbounded::<u32>();
    h.watch(rx, |e| [e]);
    let report = h.stop_with_drain_report(Duration::from_millis(100));
    assert!(report.finished, "the workers finished");
    assert_eq!(report.detached_threads, 1);
    assert!(!h.join_timeout(Duration::ZERO));
    drop(tx); // the iterator ends; the detached thread exits
    assert!(h.join_timeout(PATIENCE));
}
